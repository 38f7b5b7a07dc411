//! The node's one typed configuration: flags, environment and config file, validated.
//!
//! Precedence at start: built-in defaults < `--config FILE` < environment variables and
//! flags. After start, live fields change only through an applied config document
//! (the `configure` action or a changed config file; see `live.rs`). Parsing happens here,
//! at the edge; nothing later reads the environment or parses strings.
//!
//! Owns: [`Config`] and its validation, the defaults of every setting, and the plain
//! settings types the layers it configures read ([`Credentials`] for `auth`,
//! [`TlsFiles`] for `wire::tls`). Imports of the crate only `store` (its config
//! type); must not import `auth`, `persist/`, `cluster/`, `wire/`, `flight/` or
//! `server.rs`. Its only I/O is reading the environment and files (config,
//! topology, tokens).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use crds::node_config::{
    ClientAuth, EvictionPolicy, LocationMode, NodeConfigError, NodeDocument, Topology, TtlMode,
};
use crds::quantity::{format_bytes, parse_bytes, parse_duration};

use crate::store::StoreConfig;

/// Default Flight listen address: loopback, so a first run exposes nothing.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
/// Default metrics listen address.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9095";
const DEFAULT_MAX_ENTRIES: u64 = 100_000;
const DEFAULT_MEMORY_BUDGET: u64 = 256 << 20;
const DEFAULT_MAX_ENTRY_SIZE: u64 = 64 << 20;
const DEFAULT_TTL: Duration = Duration::from_secs(3600);
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// Most client tokens a node accepts at once (a token file of more is refused).
pub const MAX_CLIENT_TOKENS: usize = 16;

/// Command line of `flightcache-node`. Every flag can also be set by its environment
/// variable or by the same-named field of the config file.
#[derive(Debug, Parser)]
#[command(
    name = "flightcache-node",
    version,
    about = "Arrow Flight result cache node"
)]
pub struct Cli {
    /// Flight (gRPC) listen address.
    #[arg(long, env = "FLIGHTCACHE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Prometheus /metrics listen address.
    #[arg(long, env = "FLIGHTCACHE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Maximum number of cached entries [default: 100000].
    #[arg(long, env = "FLIGHTCACHE_MAX_ENTRIES")]
    pub max_entries: Option<u64>,
    /// Byte budget for cached Arrow data, e.g. 512MiB, 2Gi [default: 256MiB].
    #[arg(long, env = "FLIGHTCACHE_MEMORY_BUDGET", value_parser = parse_bytes)]
    pub memory_budget: Option<u64>,
    /// Largest single entry, e.g. 64MiB [default: 64MiB, at most the budget].
    #[arg(long, env = "FLIGHTCACHE_MAX_ENTRY_SIZE", value_parser = parse_bytes)]
    pub max_entry_size: Option<u64>,
    /// Default time-to-live of an entry, e.g. 30s, 15m, 1h [default: 1h].
    #[arg(long, env = "FLIGHTCACHE_TTL", value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// absolute (expire ttl after the write) or sliding (re-warmed on read) [default: absolute].
    #[arg(long, env = "FLIGHTCACHE_TTL_MODE")]
    pub ttl_mode: Option<TtlMode>,
    /// Eviction policy: lru or tinylfu [default: tinylfu].
    #[arg(long, env = "FLIGHTCACHE_EVICTION")]
    pub eviction: Option<EvictionPolicy>,
    /// JSON node config file; re-read when it changes (live fields only).
    #[arg(long, env = "FLIGHTCACHE_CONFIG")]
    pub config: Option<PathBuf>,
    /// File with the bearer token(s) clients must present, one per line (several while a
    /// token is rotated); no file means clients need none.
    #[arg(long, env = "FLIGHTCACHE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// File with the admin token (the operator's): needed for configure, stats, topology,
    /// clear and rebalance; no file means every client may run them.
    #[arg(long, env = "FLIGHTCACHE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// File with the peer token the pool's nodes present to each other; the internal
    /// x-flightcache-* headers are honoured only with it. No file: honoured from anyone.
    #[arg(long, env = "FLIGHTCACHE_PEER_TOKEN_FILE")]
    pub peer_token_file: Option<PathBuf>,
    /// TLS certificate chain (PEM) the Flight port serves; with --tls-key-file and
    /// --tls-ca-file. Re-read when it changes. No file: plaintext.
    #[arg(long, env = "FLIGHTCACHE_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert-file.
    #[arg(long, env = "FLIGHTCACHE_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// CA certificate(s) (PEM) peers' certificates are verified against.
    #[arg(long, env = "FLIGHTCACHE_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificates: `required` (every connection presents one signed by
    /// --tls-ca-file, else its handshake fails; peers present their own certificate) or
    /// `none` [default: none]. Only with TLS.
    #[arg(long, env = "FLIGHTCACHE_TLS_CLIENT_AUTH")]
    pub tls_client_auth: Option<ClientAuth>,
    /// How long in-flight streams may finish after SIGTERM [default: 20s].
    #[arg(long, env = "FLIGHTCACHE_SHUTDOWN_GRACE", value_parser = parse_duration)]
    pub shutdown_grace: Option<Duration>,
    /// Longest a ring member stopping on SIGTERM spends copying its entries to the nodes
    /// that hold its keys while it is away, before it stops serving; 0s: no handoff
    /// [default: 5s].
    #[arg(long, env = "FLIGHTCACHE_EXIT_HANDOFF_BUDGET", value_parser = parse_duration)]
    pub exit_handoff_budget: Option<Duration>,
    /// This node's stable member id in the ring (in a pod: the pod name).
    #[arg(long, env = "FLIGHTCACHE_MEMBER_ID")]
    pub member_id: Option<String>,
    /// JSON topology file (ring members, addresses, states, version) for local
    /// multi-node mode; overrides the config file's `topology`.
    #[arg(long, env = "FLIGHTCACHE_TOPOLOGY")]
    pub topology: Option<PathBuf>,
    /// Log format: text or json [default: text].
    #[arg(long, env = "FLIGHTCACHE_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
    /// GetFlightInfo endpoint locations: direct (the owner's address from the topology)
    /// or proxy (no location: clients redeem the ticket where they asked) [default: direct].
    #[arg(long, env = "FLIGHTCACHE_LOCATION_MODE")]
    pub location_mode: Option<LocationMode>,
    /// Most Flight connections open at once; further ones are closed as they are
    /// accepted [default: as many as fit in a quarter of the memory outside the cache
    /// budget at 64 KiB each, from 256 to 10000; 10000 without a container memory limit].
    #[arg(long, env = "FLIGHTCACHE_MAX_CONNECTIONS")]
    pub max_connections: Option<u64>,
    /// Most Flight connections one client address may hold open at once; further ones
    /// from it are closed as they are accepted [default: a quarter of
    /// --max-connections, rounded up].
    #[arg(long, env = "FLIGHTCACHE_MAX_CONNECTIONS_PER_SOURCE")]
    pub max_connections_per_source: Option<u64>,
    /// Longest a call's handler may run (a DoPut's whole upload, a DoAction such as
    /// rebalance; not the sending of a DoGet's answer) before it ends with an error; a
    /// client's shorter grpc-timeout wins [default: 300s].
    #[arg(long, env = "FLIGHTCACHE_MAX_CALL_DURATION", value_parser = parse_duration)]
    pub max_call_duration: Option<Duration>,
    /// How often the node pings each client connection over HTTP/2, idle or not
    /// [default: 30s].
    #[arg(long, env = "FLIGHTCACHE_HTTP2_KEEPALIVE_INTERVAL", value_parser = parse_duration)]
    pub http2_keepalive_interval: Option<Duration>,
    /// How long the node waits for a ping's answer before it closes the connection (a
    /// client that stopped reading, a peer that vanished) [default: 10s].
    #[arg(long, env = "FLIGHTCACHE_HTTP2_KEEPALIVE_TIMEOUT", value_parser = parse_duration)]
    pub http2_keepalive_timeout: Option<Duration>,
    /// How long a DoGet answer may go without the client taking a frame before the node
    /// ends it (DEADLINE_EXCEEDED) and lets go of the entry's bytes [default: 30s].
    #[arg(long, env = "FLIGHTCACHE_MAX_READ_STALL", value_parser = parse_duration)]
    pub max_read_stall: Option<Duration>,
    /// The DNS name peers reach this node by (in a pod:
    /// `<pod>.<pool>-nodes.<namespace>.svc.<domain>`). The node reports ready only once
    /// the name resolves (to `--pod-ip`, when given), so no peer is sent to it before
    /// its name works.
    #[arg(long, env = "FLIGHTCACHE_ADVERTISED_HOST")]
    pub advertised_host: Option<String>,
    /// This pod's IP, which `--advertised-host` must resolve to before the node reports
    /// ready (a restarted pod's name resolves to its old IP for a few seconds).
    #[arg(long, env = "FLIGHTCACHE_POD_IP")]
    pub pod_ip: Option<IpAddr>,
    /// How the readiness check resolves `--advertised-host`: `system` uses the system
    /// resolver (in a pod the kubelet puts the pod's own name in /etc/hosts, so this
    /// passes as soon as the name is in that file); `dns` asks the nameservers of
    /// /etc/resolv.conf directly, as a peer's lookup ends up doing (ready only once the
    /// cluster DNS has the record; see docs/cache-node.md for why it is not the default
    /// yet); `IP:PORT` asks that nameserver [default: system].
    #[arg(long, env = "FLIGHTCACHE_ADVERTISED_LOOKUP", value_parser = parse_advertised_lookup)]
    pub advertised_lookup: Option<AdvertisedLookup>,
    /// Directory of the disk tier (the pod's persistence volume): every entry held is
    /// written behind to it and reloaded from it at start. None: memory only.
    #[arg(long, env = "FLIGHTCACHE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Longest the reload from --data-dir may hold readiness back; past it the node
    /// reports ready and keeps loading [default: 60s].
    #[arg(long, env = "FLIGHTCACHE_RELOAD_DEADLINE", value_parser = parse_duration)]
    pub reload_deadline: Option<Duration>,
    /// Shard subdirectories of --data-dir, 16..=256 [default: 16]. Fixed for a volume's
    /// life: files of another shard count are not found (and are swept).
    #[arg(long, env = "FLIGHTCACHE_DISK_SHARDS")]
    pub disk_shards: Option<u32>,
    /// A hit updates its file's access time (mtime) at most this often [default: 30s].
    #[arg(long, env = "FLIGHTCACHE_DISK_READ_DEBOUNCE", value_parser = parse_duration)]
    pub disk_read_debounce: Option<Duration>,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (in cluster).
    Json,
}

/// A configuration that cannot start the node; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The config file has a bad field.
    #[error("config file {path} is invalid")]
    File {
        /// The file.
        path: PathBuf,
        /// Which field and why.
        #[source]
        source: NodeConfigError,
    },
    /// A field holds an unusable value.
    #[error("{field}: {reason}")]
    Invalid {
        /// Flag / field name.
        field: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// The topology file could not be used.
    #[error("topology file {path}")]
    Topology {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: NodeConfigError,
    },
    /// The auth token file could not be used.
    #[error("auth-token-file {path}: {reason}")]
    AuthToken {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// The validated configuration `server::run` starts from.
#[derive(Debug, Clone)]
pub struct Config {
    /// Flight listen address.
    pub listen: SocketAddr,
    /// Metrics listen address.
    pub metrics_listen: SocketAddr,
    /// Store limits and policies.
    pub store: StoreConfig,
    /// Config generation the node starts at (0 without a file generation).
    pub generation: u64,
    /// The config file to watch, if any.
    pub config_file: Option<PathBuf>,
    /// The client, admin and peer tokens.
    pub credentials: Credentials,
    /// The clients' token file, re-read as it changes (a rotation), if clients need a
    /// token.
    pub client_token_file: Option<PathBuf>,
    /// TLS material, if the Flight port serves TLS.
    pub tls: Option<TlsFiles>,
    /// Grace period for in-flight streams at shutdown.
    pub shutdown_grace: Duration,
    /// Longest the exit handoff at SIGTERM may take (zero: none).
    pub exit_handoff_budget: Duration,
    /// This node's member id in the ring, if it is a member.
    pub member_id: Option<String>,
    /// The ring to start with; none means this node owns every key.
    pub topology: Option<Topology>,
    /// Log format.
    pub log_format: LogFormat,
    /// Which location GetFlightInfo endpoints carry (live).
    pub location_mode: LocationMode,
    /// Most Flight connections open at once.
    pub max_connections: usize,
    /// Most Flight connections one client address may hold open at once.
    pub max_connections_per_source: usize,
    /// Longest a call's handler may run.
    pub max_call_duration: Duration,
    /// Longest a DoGet answer may go unread.
    pub max_read_stall: Duration,
    /// How often each connection is pinged.
    pub http2_keepalive_interval: Duration,
    /// How long a ping may go unanswered before the connection is closed.
    pub http2_keepalive_timeout: Duration,
    /// The name peers resolve this node by, and the IP it must resolve to, before the
    /// node reports ready.
    pub advertised: Option<Advertised>,
    /// The disk tier, if the node has a data directory.
    pub persistence: Option<Persistence>,
}

/// The disk tier's settings (`--data-dir` and the flags beside it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persistence {
    /// The directory.
    pub data_dir: PathBuf,
    /// Longest the reload holds readiness back.
    pub reload_deadline: Duration,
    /// Shard subdirectories.
    pub shards: u32,
    /// Least time between two access-time updates of one file.
    pub read_debounce: Duration,
}

/// Default of `--reload-deadline`: a volume of a few GiB reloads well within it, and
/// the pod's liveness allows a minute.
pub const DEFAULT_RELOAD_DEADLINE: Duration = Duration::from_secs(60);
/// Default shard count of the disk tier: subdirectories from the first entry.
pub const DEFAULT_DISK_SHARDS: u32 = 16;
/// Most shards of the disk tier (a shard is a two-hex-digit directory).
pub const MAX_DISK_SHARDS: u32 = 256;
/// Default debounce of the disk tier's access-time updates on hits.
pub const DEFAULT_DISK_READ_DEBOUNCE: Duration = Duration::from_secs(30);
/// Default of `--exit-handoff-budget`: longest the exit handoff may take.
pub const EXIT_HANDOFF_BUDGET: Duration = Duration::from_secs(5);

fn pick_persistence(
    data_dir: Option<PathBuf>,
    reload_deadline: Option<Duration>,
    shards: Option<u32>,
    read_debounce: Option<Duration>,
) -> Result<Option<Persistence>, ConfigError> {
    let Some(data_dir) = data_dir else {
        if shards.is_some() || reload_deadline.is_some() || read_debounce.is_some() {
            return Err(ConfigError::Invalid {
                field: "data-dir",
                reason: "--reload-deadline, --disk-shards and --disk-read-debounce need \
                         --data-dir"
                    .into(),
            });
        }
        return Ok(None);
    };
    let shards = shards.unwrap_or(DEFAULT_DISK_SHARDS);
    if !(DEFAULT_DISK_SHARDS..=MAX_DISK_SHARDS).contains(&shards) {
        return Err(ConfigError::Invalid {
            field: "disk-shards",
            reason: format!(
                "must be between {} and {}",
                DEFAULT_DISK_SHARDS, MAX_DISK_SHARDS
            ),
        });
    }
    Ok(Some(Persistence {
        data_dir,
        reload_deadline: positive_duration(
            "reload-deadline",
            reload_deadline,
            DEFAULT_RELOAD_DEADLINE,
        )?,
        shards,
        read_debounce: read_debounce.unwrap_or(DEFAULT_DISK_READ_DEBOUNCE),
    }))
}

/// The credentials a node accepts.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// Tokens clients may present; empty: clients need none.
    pub client: Vec<String>,
    /// The admin token; none: every client may administer the node.
    pub admin: Option<String>,
    /// The peer token, which this node also presents to its peers; none: internal
    /// headers are honoured from every client, and forwarded calls carry the caller's
    /// own `authorization`.
    pub peer: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("client", &format_args!("{} token(s)", self.client.len()))
            .field("admin", &self.admin.as_ref().map(|_| "<redacted>"))
            .field("peer", &self.peer.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Where the node's TLS material is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA (PEM) peers' certificates are verified against.
    pub ca: PathBuf,
    /// Whether connecting clients must present a certificate signed by `ca`.
    pub client_auth: ClientAuth,
}

/// The DNS name peers reach a node by, checked before the node reports ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertised {
    /// Host name (no port).
    pub host: String,
    /// The IP the name must resolve to; any address will do without one.
    pub ip: Option<IpAddr>,
    /// Where the name is looked up.
    pub lookup: AdvertisedLookup,
}

/// Where the readiness check looks the advertised name up (`--advertised-lookup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdvertisedLookup {
    /// The nameservers of /etc/resolv.conf, asked directly (not the hosts file).
    Dns,
    /// The system resolver (getaddrinfo: the hosts file, then DNS).
    System,
    /// This nameserver.
    Nameserver(std::net::SocketAddr),
}

fn parse_advertised_lookup(value: &str) -> Result<AdvertisedLookup, String> {
    match value {
        "dns" => Ok(AdvertisedLookup::Dns),
        "system" => Ok(AdvertisedLookup::System),
        other => other
            .parse()
            .map(AdvertisedLookup::Nameserver)
            .map_err(|_| format!("{other:?} is not `dns`, `system` or a nameserver's IP:PORT")),
    }
}

/// Default of `--http2-keepalive-interval`.
pub const DEFAULT_HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// Default of `--http2-keepalive-timeout`.
pub const DEFAULT_HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default of `--max-read-stall`.
pub const DEFAULT_MAX_READ_STALL: Duration = Duration::from_secs(30);

/// Default of `--max-call-duration`: above the operator's rebalance deadline (120 s) and
/// a large upload on a slow link, far below "forever".
pub const DEFAULT_MAX_CALL_DURATION: Duration = Duration::from_secs(300);

/// Most connections a node allows by default (and its default without a container
/// memory limit): far above what a pool's clients and peers open, far below the file
/// descriptors a pod gets.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// Fewest connections a node sized to its memory allows by default: the operator, the
/// peers, the kubelet's probes and a couple of hundred client connections.
pub const MIN_DEFAULT_MAX_CONNECTIONS: usize = 256;

/// What one open connection may cost the node while idle, TLS included: ~22 KiB in
/// plaintext and ~31 KiB over TLS measured (`request_limits.rs`), rounded up.
pub const CONNECTION_BYTES: u64 = 64 << 10;

/// The default connection cap lets idle connections take at most this share (1/N) of the
/// memory outside the cache budget; the rest absorbs in-flight messages and the node's
/// own code and buffers.
const CONNECTIONS_MEMORY_DIVISOR: u64 = 4;

/// The default `--max-connections` of a node in a container limited to
/// `memory_limit_bytes` with a cache budget of `budget_bytes`: as many idle connections
/// as fit in a quarter of the memory outside the budget at [`CONNECTION_BYTES`] each,
/// from [`MIN_DEFAULT_MAX_CONNECTIONS`] to [`DEFAULT_MAX_CONNECTIONS`]. A 499 MiB pod with
/// the operator's budget (80% of the limit less 48 MiB) gets 552; 2 GiB, 1,792; 16 GiB
/// and more, 10,000. Without a limit, [`DEFAULT_MAX_CONNECTIONS`].
pub fn default_max_connections(memory_limit_bytes: Option<u64>, budget_bytes: u64) -> usize {
    let Some(limit) = memory_limit_bytes else {
        return DEFAULT_MAX_CONNECTIONS;
    };
    let fitting =
        limit.saturating_sub(budget_bytes) / CONNECTIONS_MEMORY_DIVISOR / CONNECTION_BYTES;
    usize::try_from(fitting)
        .unwrap_or(usize::MAX)
        .clamp(MIN_DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS)
}

/// `--max-connections-per-source`: at least 1 and at most `max_connections`; by default a
/// quarter of it, so one client address cannot take every place from the operator, the
/// peers and the kubelet's probe.
fn pick_max_connections_per_source(
    value: Option<u64>,
    max_connections: usize,
) -> Result<usize, ConfigError> {
    match value {
        None => Ok(max_connections.div_ceil(4)),
        Some(0) => Err(ConfigError::Invalid {
            field: "max-connections-per-source",
            reason: "must be at least 1".into(),
        }),
        Some(n) => Ok(usize::try_from(n)
            .unwrap_or(usize::MAX)
            .min(max_connections)),
    }
}

fn pick_max_connections(value: Option<u64>, default: usize) -> Result<usize, ConfigError> {
    match value {
        None => Ok(default),
        Some(0) => Err(ConfigError::Invalid {
            field: "max-connections (maxConnections)",
            reason: "must be at least 1".into(),
        }),
        Some(n) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
    }
}

impl Config {
    /// Parses flags and environment, reads the config file, validates.
    ///
    /// # Errors
    /// clap exits itself on bad flags; otherwise [`ConfigError`] naming the field.
    pub fn load() -> Result<Self, ConfigError> {
        Self::from_cli_within(Cli::parse(), crate::cgroup::memory_limit_bytes())
    }

    /// Builds the configuration from parsed flags, as for a process without a container
    /// memory limit (tests call this directly).
    ///
    /// # Errors
    /// [`ConfigError`] naming the field.
    pub fn from_cli(cli: Cli) -> Result<Self, ConfigError> {
        Self::from_cli_within(cli, None)
    }

    /// Builds the configuration from parsed flags for a process in a container limited
    /// to `memory_limit_bytes` (the defaults sized to memory follow it).
    ///
    /// # Errors
    /// [`ConfigError`] naming the field.
    pub fn from_cli_within(cli: Cli, memory_limit_bytes: Option<u64>) -> Result<Self, ConfigError> {
        let Cli {
            listen,
            metrics_listen,
            max_entries,
            memory_budget,
            max_entry_size,
            ttl,
            ttl_mode,
            eviction,
            config,
            auth_token_file,
            admin_token_file,
            peer_token_file,
            tls_cert_file,
            tls_key_file,
            tls_ca_file,
            tls_client_auth,
            shutdown_grace,
            exit_handoff_budget,
            member_id,
            topology,
            log_format,
            location_mode,
            max_connections,
            max_connections_per_source,
            max_call_duration,
            max_read_stall,
            http2_keepalive_interval,
            http2_keepalive_timeout,
            advertised_host,
            pod_ip,
            advertised_lookup,
            data_dir,
            reload_deadline,
            disk_shards,
            disk_read_debounce,
        } = cli;
        let NodeDocument {
            config: file,
            topology: file_topology,
        } = match &config {
            Some(path) => read_config_file(path)?,
            None => NodeDocument::default(),
        };
        let topology = match topology {
            Some(path) => Some(read_topology_file(&path)?),
            None => file_topology,
        };
        if member_id.as_deref().is_some_and(|id| id.trim().is_empty()) {
            return Err(ConfigError::Invalid {
                field: "member-id",
                reason: "must not be empty".into(),
            });
        }
        let config_path = config.clone().unwrap_or_default();
        let file_err = |source| ConfigError::File {
            path: config_path.clone(),
            source,
        };
        let listen = pick_addr("listen", listen, file.listen.as_deref(), DEFAULT_LISTEN)?;
        let metrics_listen = pick_addr(
            "metrics-listen",
            metrics_listen,
            file.metrics_listen.as_deref(),
            DEFAULT_METRICS_LISTEN,
        )?;
        let budget_bytes = memory_budget
            .or(file.memory_budget_bytes().map_err(file_err)?)
            .unwrap_or(DEFAULT_MEMORY_BUDGET);
        let max_entry_bytes = max_entry_size
            .or(file.max_entry_size_bytes().map_err(file_err)?)
            .unwrap_or(DEFAULT_MAX_ENTRY_SIZE.min(budget_bytes));
        let store = StoreConfig {
            max_entries: max_entries
                .or(file.max_entries)
                .unwrap_or(DEFAULT_MAX_ENTRIES),
            budget_bytes,
            max_entry_bytes,
            ttl: ttl
                .or(file.ttl_duration().map_err(file_err)?)
                .unwrap_or(DEFAULT_TTL),
            ttl_mode: ttl_mode.or(file.ttl_mode).unwrap_or(TtlMode::Absolute),
            eviction: eviction
                .or(file.eviction)
                .unwrap_or(EvictionPolicy::Tinylfu),
        };
        validate_store(&store)?;
        // A flag wins over the config file's field.
        let path = |flag: Option<PathBuf>, field: &Option<String>| {
            flag.or(field.as_ref().map(PathBuf::from))
        };
        let client_token_file = path(auth_token_file, &file.auth_token_file);
        let client_tokens = client_token_file
            .as_deref()
            .map(|path| read_tokens(path, true))
            .transpose()?
            .unwrap_or_default();
        let single = |path: Option<PathBuf>| -> Result<Option<String>, ConfigError> {
            Ok(path
                .map(|path| read_tokens(&path, false))
                .transpose()?
                .and_then(|tokens| tokens.into_iter().next()))
        };
        let credentials = Credentials {
            client: client_tokens,
            admin: single(path(admin_token_file, &file.admin_token_file))?,
            peer: single(path(peer_token_file, &file.peer_token_file))?,
        };
        let tls = match (
            path(tls_cert_file, &file.tls_cert_file),
            path(tls_key_file, &file.tls_key_file),
            path(tls_ca_file, &file.tls_ca_file),
        ) {
            (Some(cert), Some(key), Some(ca)) => Some(TlsFiles {
                cert,
                key,
                ca,
                client_auth: tls_client_auth.or(file.tls_client_auth).unwrap_or_default(),
            }),
            (None, None, None) => {
                if tls_client_auth.or(file.tls_client_auth) == Some(ClientAuth::Required) {
                    return Err(ConfigError::Invalid {
                        field: "tls-client-auth",
                        reason: "client certificates need TLS: give --tls-cert-file, \
                                 --tls-key-file and --tls-ca-file"
                            .into(),
                    });
                }
                None
            }
            _ => {
                return Err(ConfigError::Invalid {
                    field: "tls-cert-file",
                    reason: "TLS needs all three of --tls-cert-file, --tls-key-file and \
                             --tls-ca-file"
                        .into(),
                });
            }
        };
        // One token with two meanings would give a client the rights of the other.
        let shared_with_clients = |token: &Option<String>| {
            token
                .as_ref()
                .is_some_and(|token| credentials.client.contains(token))
        };
        if shared_with_clients(&credentials.admin)
            || shared_with_clients(&credentials.peer)
            || (credentials.admin.is_some() && credentials.admin == credentials.peer)
        {
            return Err(ConfigError::Invalid {
                field: "admin-token-file",
                reason: "the client, admin and peer tokens must all differ".into(),
            });
        }
        let max_connections = pick_max_connections(
            max_connections.or(file.max_connections),
            default_max_connections(memory_limit_bytes, store.budget_bytes),
        )?;
        Ok(Self {
            listen,
            metrics_listen,
            store,
            generation: file.generation.unwrap_or(0),
            config_file: config,
            credentials,
            client_token_file,
            tls,
            shutdown_grace: shutdown_grace
                .or(file.shutdown_grace_duration().map_err(file_err)?)
                .unwrap_or(DEFAULT_SHUTDOWN_GRACE),
            exit_handoff_budget: exit_handoff_budget.unwrap_or(EXIT_HANDOFF_BUDGET),
            member_id,
            topology,
            log_format,
            location_mode: location_mode.or(file.location_mode).unwrap_or_default(),
            max_connections,
            max_connections_per_source: pick_max_connections_per_source(
                max_connections_per_source,
                max_connections,
            )?,
            max_call_duration: positive_duration(
                "max-call-duration",
                max_call_duration,
                DEFAULT_MAX_CALL_DURATION,
            )?,
            max_read_stall: positive_duration(
                "max-read-stall",
                max_read_stall,
                DEFAULT_MAX_READ_STALL,
            )?,
            http2_keepalive_interval: positive_duration(
                "http2-keepalive-interval",
                http2_keepalive_interval,
                DEFAULT_HTTP2_KEEPALIVE_INTERVAL,
            )?,
            http2_keepalive_timeout: positive_duration(
                "http2-keepalive-timeout",
                http2_keepalive_timeout,
                DEFAULT_HTTP2_KEEPALIVE_TIMEOUT,
            )?,
            advertised: pick_advertised(advertised_host, pod_ip, advertised_lookup)?,
            persistence: pick_persistence(
                data_dir,
                reload_deadline,
                disk_shards,
                disk_read_debounce,
            )?,
        })
    }
}

fn pick_advertised(
    host: Option<String>,
    ip: Option<IpAddr>,
    lookup: Option<AdvertisedLookup>,
) -> Result<Option<Advertised>, ConfigError> {
    let Some(host) = host else {
        return match (ip, lookup) {
            (Some(_), _) => Err(ConfigError::Invalid {
                field: "pod-ip",
                reason: "is only used with --advertised-host".into(),
            }),
            (None, Some(_)) => Err(ConfigError::Invalid {
                field: "advertised-lookup",
                reason: "is only used with --advertised-host".into(),
            }),
            (None, None) => Ok(None),
        };
    };
    let host = host.trim().to_owned();
    // A DNS name: what a peer dials, so no port, scheme or path.
    let valid = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|label| !label.is_empty() && label.len() <= 63)
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !valid {
        return Err(ConfigError::Invalid {
            field: "advertised-host",
            reason: format!("{host:?} is not a DNS name (letters, digits, '-' and '.')"),
        });
    }
    Ok(Some(Advertised {
        host,
        ip,
        lookup: lookup.unwrap_or(AdvertisedLookup::System),
    }))
}

/// Reads and parses a node config file (config fields and an optional topology).
///
/// # Errors
/// [`ConfigError::ReadFile`] or [`ConfigError::File`].
pub fn read_config_file(path: &std::path::Path) -> Result<NodeDocument, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    NodeDocument::from_json(&text).map_err(|source| ConfigError::File {
        path: path.to_owned(),
        source,
    })
}

/// Reads and validates a topology file.
///
/// # Errors
/// [`ConfigError::ReadFile`] or [`ConfigError::Topology`].
pub fn read_topology_file(path: &std::path::Path) -> Result<Topology, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    Topology::from_json(&text).map_err(|source| ConfigError::Topology {
        path: path.to_owned(),
        source,
    })
}

/// The longest TTL of a pool or of one entry (the CRD's bound on `ttl`): an entry that
/// outlives its writers' intent pins its bytes, and an absurd TTL is a typo.
pub const MAX_TTL: Duration = Duration::from_secs(720 * 3600);

/// Checks the store limits with messages that name the flag / field.
///
/// # Errors
/// [`ConfigError::Invalid`].
pub fn validate_store(store: &StoreConfig) -> Result<(), ConfigError> {
    if store.max_entries == 0 {
        return Err(ConfigError::Invalid {
            field: "max-entries (maxEntries)",
            reason: "must be at least 1".into(),
        });
    }
    if store.budget_bytes < (1 << 20) {
        return Err(ConfigError::Invalid {
            field: "memory-budget (memoryBudget)",
            reason: format!(
                "{} is too small; the budget must be at least 1MiB",
                format_bytes(store.budget_bytes)
            ),
        });
    }
    if store.max_entry_bytes == 0 || store.max_entry_bytes > store.budget_bytes {
        return Err(ConfigError::Invalid {
            field: "max-entry-size (maxEntrySize)",
            reason: format!(
                "{} must be more than 0 and at most the memory budget ({})",
                format_bytes(store.max_entry_bytes),
                format_bytes(store.budget_bytes)
            ),
        });
    }
    if store.ttl.is_zero() || store.ttl > MAX_TTL {
        return Err(ConfigError::Invalid {
            field: "ttl",
            reason: format!(
                "must be longer than 0s and at most {}h (30 days, as the CRD allows)",
                MAX_TTL.as_secs() / 3600
            ),
        });
    }
    Ok(())
}

fn pick_addr(
    field: &'static str,
    flag: Option<SocketAddr>,
    file: Option<&str>,
    default: &str,
) -> Result<SocketAddr, ConfigError> {
    if let Some(addr) = flag {
        return Ok(addr);
    }
    let text = file.unwrap_or(default);
    text.parse().map_err(|_| ConfigError::Invalid {
        field,
        reason: format!("'{text}' is not a socket address such as 127.0.0.1:50051"),
    })
}

/// `value`, or `default` when unset; zero is refused.
fn positive_duration(
    field: &'static str,
    value: Option<Duration>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match value {
        Some(duration) if duration.is_zero() => Err(ConfigError::Invalid {
            field,
            reason: "must be longer than 0s".into(),
        }),
        Some(duration) => Ok(duration),
        None => Ok(default),
    }
}

/// Reads a token file: one token per line (blank lines ignored), several only where
/// `several` (the clients', so a token can be rotated).
///
/// # Errors
/// [`ConfigError::AuthToken`] for a file that cannot be read, holds no token, too many,
/// or a token that is not printable ASCII.
pub fn read_tokens(path: &std::path::Path, several: bool) -> Result<Vec<String>, ConfigError> {
    let failed = |reason: &str| ConfigError::AuthToken {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    let text = std::fs::read_to_string(path).map_err(|err| failed(&err.to_string()))?;
    let tokens: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect();
    if tokens.is_empty() {
        return Err(failed("the file is empty"));
    }
    if tokens.len() > MAX_CLIENT_TOKENS || (!several && tokens.len() > 1) {
        let most = if several { MAX_CLIENT_TOKENS } else { 1 };
        return Err(failed(&format!(
            "the file holds {} tokens, at most {most} are accepted",
            tokens.len()
        )));
    }
    if tokens
        .iter()
        .any(|token| !token.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(failed("a token must be printable ASCII without spaces"));
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn the_default_connection_cap_follows_the_memory_outside_the_budget() {
        // The operator's budget: 80% of the limit less 48 MiB.
        let operator_budget = |limit: u64| (limit - (48 << 20)) / 100 * 80;
        let cap = |limit: u64| default_max_connections(Some(limit), operator_budget(limit));
        assert_eq!(cap(499 << 20), 552);
        assert_eq!(cap(2 << 30), 1_792);
        assert_eq!(cap(16 << 30), DEFAULT_MAX_CONNECTIONS);
        assert_eq!(cap(64 << 20), MIN_DEFAULT_MAX_CONNECTIONS);
        // What the cap lets idle connections take stays within a quarter of what is
        // outside the budget (above the floor).
        for limit in [499u64 << 20, 1 << 30, 2 << 30, 8 << 30] {
            let outside = limit - operator_budget(limit);
            assert!(
                cap(limit) as u64 * CONNECTION_BYTES <= outside / 4,
                "{limit}"
            );
        }
        assert_eq!(
            default_max_connections(None, 1 << 30),
            DEFAULT_MAX_CONNECTIONS
        );
        // A flag or the config file wins over the default.
        let config = Config::from_cli_within(
            cli(&["--max-connections", "9000"]).unwrap(),
            Some(499 << 20),
        )
        .unwrap();
        assert_eq!(config.max_connections, 9000);
        let config = Config::from_cli_within(
            cli(&["--memory-budget", "256MiB"]).unwrap(),
            Some(512 << 20),
        )
        .unwrap();
        assert_eq!(config.max_connections, 1024);
        assert_eq!(config.max_connections_per_source, 256);
    }

    fn cli(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("flightcache-node").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_serve_on_loopback() {
        let config = Config::from_cli(cli(&[]).unwrap()).unwrap();
        assert_eq!(config.listen, DEFAULT_LISTEN.parse().unwrap());
        assert!(config.listen.ip().is_loopback() && config.metrics_listen.ip().is_loopback());
        assert_eq!(config.store.budget_bytes, 256 << 20);
        assert_eq!(config.store.max_entry_bytes, 64 << 20);
        assert_eq!(config.credentials, Credentials::default());
    }

    #[test]
    fn token_files_give_the_three_credentials_and_refuse_a_shared_token() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.to_str().unwrap().to_owned()
        };
        let clients = write("clients", "old-token\n\nnew-token\n");
        let admin = write("admin", "admin-token\n");
        let peer = write("peer", "peer-token");
        let flags = |admin: &str| {
            Config::from_cli(
                cli(&[
                    "--auth-token-file",
                    &clients,
                    "--admin-token-file",
                    admin,
                    "--peer-token-file",
                    &peer,
                ])
                .unwrap(),
            )
        };
        let config = flags(&admin).unwrap();
        assert_eq!(
            config.credentials,
            Credentials {
                client: vec!["old-token".into(), "new-token".into()],
                admin: Some("admin-token".into()),
                peer: Some("peer-token".into()),
            }
        );
        let shared = write("shared", "new-token");
        let err = flags(&shared).unwrap_err().to_string();
        assert!(err.contains("must all differ"), "{err}");
        let two = write("two", "a\nb");
        let err = flags(&two).unwrap_err().to_string();
        assert!(err.contains("at most 1"), "{err}");
    }

    #[test]
    fn flags_parse_units_and_name_bad_values() {
        let config = Config::from_cli(
            cli(&[
                "--memory-budget",
                "512MiB",
                "--ttl",
                "15m",
                "--ttl-mode",
                "sliding",
                "--eviction",
                "lru",
            ])
            .unwrap(),
        )
        .unwrap();
        assert_eq!(config.store.budget_bytes, 512 << 20);
        assert_eq!(config.store.ttl, Duration::from_secs(900));
        assert_eq!(config.store.ttl_mode, TtlMode::Sliding);
        assert_eq!(config.store.eviction, EvictionPolicy::Lru);
        let err = cli(&["--memory-budget", "lots"]).unwrap_err().to_string();
        assert!(
            err.contains("--memory-budget") && err.contains("not a byte size"),
            "{err}"
        );
        let err = cli(&["--eviction", "random"]).unwrap_err().to_string();
        assert!(
            err.contains("--eviction") && err.contains("lru or tinylfu"),
            "{err}"
        );
    }

    #[test]
    fn cross_field_rules_name_the_field() {
        let err = Config::from_cli(
            cli(&["--memory-budget", "8MiB", "--max-entry-size", "16MiB"]).unwrap(),
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("max-entry-size"), "{err}");
        let err = Config::from_cli(cli(&["--max-entries", "0"]).unwrap()).unwrap_err();
        assert!(err.to_string().starts_with("max-entries"), "{err}");
        let err = Config::from_cli(cli(&["--ttl", "0s"]).unwrap()).unwrap_err();
        assert!(err.to_string().starts_with("ttl"), "{err}");
    }

    #[test]
    fn flags_override_the_file_and_the_file_overrides_defaults() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        write!(
            file,
            r#"{{"generation": 7, "ttl": "2h", "maxEntries": 42, "memoryBudget": "128MiB"}}"#
        )
        .unwrap();
        let path = file.path().to_str().unwrap();
        let config =
            Config::from_cli(cli(&["--config", path, "--max-entries", "9"]).unwrap()).unwrap();
        assert_eq!(config.generation, 7);
        assert_eq!(config.store.ttl, Duration::from_secs(7200));
        assert_eq!(config.store.max_entries, 9);
        assert_eq!(config.store.budget_bytes, 128 << 20);
    }

    #[test]
    fn a_bad_config_file_names_the_field() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        write!(file, r#"{{"memoryBudget": "12 parsecs"}}"#).unwrap();
        let path = file.path().to_str().unwrap();
        let err = Config::from_cli(cli(&["--config", path]).unwrap()).unwrap_err();
        let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(chain.contains("memoryBudget"), "{chain}");
    }

    #[test]
    fn the_topology_comes_from_its_flag_or_the_config_file() {
        let mut config_file = tempfile::NamedTempFile::new().unwrap();
        write!(
            config_file,
            r#"{{"topology": {{"version": 3, "members": [{{"id": "a-0", "address": "10.0.0.1:50051"}}]}}}}"#
        )
        .unwrap();
        let config_path = config_file.path().to_str().unwrap();
        let config =
            Config::from_cli(cli(&["--config", config_path, "--member-id", "a-0"]).unwrap())
                .unwrap();
        assert_eq!(config.topology.as_ref().unwrap().version, 3);
        assert_eq!(config.member_id.as_deref(), Some("a-0"));

        let mut topology_file = tempfile::NamedTempFile::new().unwrap();
        write!(
            topology_file,
            r#"{{"version": 9, "members": [{{"id": "b-0", "address": "127.0.0.1:1"}}]}}"#
        )
        .unwrap();
        let topology_path = topology_file.path().to_str().unwrap();
        let config =
            Config::from_cli(cli(&["--config", config_path, "--topology", topology_path]).unwrap())
                .unwrap();
        assert_eq!(config.topology.unwrap().version, 9);

        let mut bad = tempfile::NamedTempFile::new().unwrap();
        write!(
            bad,
            r#"{{"version": 1, "members": [{{"id": "x", "address": "x"}}]}}"#
        )
        .unwrap();
        let err = Config::from_cli(cli(&["--topology", bad.path().to_str().unwrap()]).unwrap())
            .unwrap_err();
        let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(
            chain.contains("topology") && chain.contains("host:port"),
            "{chain}"
        );
    }
}
