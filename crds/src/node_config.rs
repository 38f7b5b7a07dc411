//! The node configuration file: what the operator writes and `flightcache-node` reads.
//!
//! The file is JSON (`--config FILE`), every field optional; a field left out keeps the
//! value from the command line, the environment or the built-in default. The same
//! document is the body of the node's `configure` action, where only the live fields
//! (`generation`, `maxEntries`, `memoryBudget`, `maxEntrySize`, `ttl`, `ttlMode`,
//! `eviction`) may be set.
//!
//! ```json
//! {
//!   "generation": 3,
//!   "listen": "0.0.0.0:50051",
//!   "metricsListen": "0.0.0.0:9090",
//!   "maxEntries": 100000,
//!   "memoryBudget": "1536MiB",
//!   "maxEntrySize": "256MiB",
//!   "ttl": "1h",
//!   "ttlMode": "sliding",
//!   "eviction": "tinylfu",
//!   "authTokenFile": "/etc/flightcache/auth/token",
//!   "shutdownGrace": "20s"
//! }
//! ```
//!
//! A node config *file* (and a `configure` body) may also carry the routing ring as a
//! `topology` object; [`NodeDocument`] reads both. The topology's `version` only moves
//! forward on a node; member `id`s are stable identities (pod names), `address` is where
//! peers and clients reach the member (`host:port`), `state` is `active` (default),
//! `joining` or `draining`, and the optional `zone` is where the member runs (its
//! Kubernetes Node's `topology.kubernetes.io/zone`; left out when unknown):
//!
//! ```json
//! {
//!   "generation": 3,
//!   "topology": {
//!     "version": 7,
//!     "replicas": 2,
//!     "members": [
//!       {"id": "analytics-hot-0", "address": "analytics-hot-0.analytics-hot.ns.svc:50051",
//!        "zone": "zone-a"},
//!       {"id": "analytics-hot-1", "address": "analytics-hot-1.analytics-hot.ns.svc:50051",
//!        "zone": "zone-b"},
//!       {"id": "analytics-hot-2", "address": "analytics-hot-2.analytics-hot.ns.svc:50051",
//!        "state": "draining"}
//!     ]
//!   }
//! }
//! ```
//!
//! Compatibility: every type here denies unknown fields, so a node refuses a document
//! with a field it does not know. `zone` is newer than the rest of the topology: a ring
//! without zones is written exactly as before (the field is left out when unknown), and
//! the operator publishes zones only once every node of a pool says it reads them
//! (`readsZones` in its `stats` answer), so nodes of an older image never see one.
//!
//! Pure: parsing and validation only, no I/O.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::quantity::{self, QuantityError};

/// How an entry's time-to-live is anchored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TtlMode {
    /// The entry expires `ttl` after it was written, however often it is read.
    Absolute,
    /// The entry expires `ttl` after it was last written or read (re-warmed on read).
    Sliding,
}

impl TtlMode {
    /// The lower-case name used in flags, files and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Absolute => "absolute",
            Self::Sliding => "sliding",
        }
    }
}

/// Which entry makes room when a cap is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EvictionPolicy {
    /// Least recently used first.
    Lru,
    /// W-TinyLFU: a small recency window plus frequency-based admission, which keeps a
    /// hot set through scans of one-off keys.
    Tinylfu,
}

impl EvictionPolicy {
    /// The lower-case name used in flags, files and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::Tinylfu => "tinylfu",
        }
    }
}

impl std::str::FromStr for TtlMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "absolute" => Ok(Self::Absolute),
            "sliding" => Ok(Self::Sliding),
            other => Err(format!(
                "'{other}' is not a TTL mode: use absolute or sliding"
            )),
        }
    }
}

impl std::str::FromStr for EvictionPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "lru" => Ok(Self::Lru),
            "tinylfu" => Ok(Self::Tinylfu),
            other => Err(format!(
                "'{other}' is not an eviction policy: use lru or tinylfu"
            )),
        }
    }
}

/// Whether the Flight port asks clients for a TLS certificate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// No client certificate is asked for (tokens still authenticate every call).
    #[default]
    None,
    /// Every connection must present a certificate signed by the TLS CA, else the
    /// handshake fails; tokens still decide what a call may do.
    Required,
}

impl ClientAuth {
    /// The lower-case name used in flags, files and the CRD.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Required => "required",
        }
    }
}

impl std::str::FromStr for ClientAuth {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "none" => Ok(Self::None),
            "required" => Ok(Self::Required),
            other => Err(format!(
                "'{other}' is not a client authentication mode: use none or required"
            )),
        }
    }
}

/// The node configuration document. See the module docs for an example.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    /// Configuration generation; a node never goes back to an older one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Flight listen address (restart to change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Prometheus `/metrics` listen address (restart to change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
    /// Maximum number of entries the node holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<u64>,
    /// Byte budget for cached Arrow data, e.g. `512MiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget: Option<String>,
    /// Largest single entry accepted, e.g. `64MiB`; at most `memoryBudget`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entry_size: Option<String>,
    /// Default time-to-live of an entry, e.g. `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// `absolute` or `sliding`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_mode: Option<TtlMode>,
    /// `lru` or `tinylfu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<EvictionPolicy>,
    /// File holding the bearer token(s) clients must present, one per line (restart to
    /// change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_token_file: Option<String>,
    /// File holding the admin token (the operator's), needed for the admin actions
    /// (restart to change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_token_file: Option<String>,
    /// File holding the peer token the pool's nodes present to each other (restart to
    /// change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_token_file: Option<String>,
    /// TLS certificate chain (PEM) of the Flight port; with `tlsKeyFile` and `tlsCaFile`.
    /// The files are re-read when they change (the paths: restart to change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<String>,
    /// Private key (PEM) of `tlsCertFile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<String>,
    /// CA certificate(s) (PEM) the pool's nodes verify each other against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca_file: Option<String>,
    /// `required`: every connection presents a certificate signed by `tlsCaFile` (peers
    /// present their own `tlsCertFile`); `none` (default): no client certificate (restart
    /// to change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_client_auth: Option<ClientAuth>,
    /// How long in-flight streams may run after SIGTERM, e.g. `20s` (restart to change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_grace: Option<String>,
    /// Which address GetFlightInfo endpoints carry: `direct` (the owner's address from
    /// the topology, for clients inside the cluster) or `proxy` (no location: the client
    /// reuses the address it dialled and the node forwards). Default `direct`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location_mode: Option<LocationMode>,
    /// Most client and peer connections open at once; further ones are closed as they
    /// are accepted. Default 10000 (restart to change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u64>,
}

/// Where GetFlightInfo sends a client for the data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LocationMode {
    /// The owner's stable address (a pod DNS name): one hop for clients that can reach pods.
    #[default]
    Direct,
    /// No location: the client calls DoGet on the address it already uses (a Service,
    /// a load balancer, a port-forward) and that node forwards to the owner.
    Proxy,
}

impl LocationMode {
    /// The name used in config documents and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Proxy => "proxy",
        }
    }
}

impl std::str::FromStr for LocationMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "direct" => Ok(Self::Direct),
            "proxy" => Ok(Self::Proxy),
            other => Err(format!(
                "'{other}' is not a location mode: use direct or proxy"
            )),
        }
    }
}

/// The routing state of a ring member, as published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Owns keys.
    #[default]
    Active,
    /// Known to the ring, owns no keys yet (warming up, receiving handed-off entries).
    Joining,
    /// Leaving: owns no keys; its keys go to their next choice.
    Draining,
}

impl MemberState {
    /// True if members in this state own keys (only active ones do).
    pub fn owns_keys(self) -> bool {
        matches!(self, Self::Active)
    }

    /// The lower-case name used in topology documents, status and answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Joining => "joining",
            Self::Draining => "draining",
        }
    }
}

/// One member of a pool's ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TopologyMember {
    /// Stable identity (the StatefulSet pod name, e.g. `analytics-hot-2`); keys hash to ids.
    pub id: String,
    /// Where peers reach the member's Flight port: `host:port` (a pod DNS name or an IP).
    pub address: String,
    /// `active` (default), `joining` or `draining`.
    #[serde(default)]
    pub state: MemberState,
    /// The zone the member runs in (its Kubernetes Node's `topology.kubernetes.io/zone`
    /// label), when known: a label value of 1 to 63 letters, digits, '-', '_' or '.'.
    /// A key's copies go to members of different zones where the ring has them (see
    /// the node's `routing/ring.rs`); members without a zone count as one zone of their
    /// own. Left out when unknown, so a ring without zones reads as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// Longest zone name: a Kubernetes label value has at most 63 characters.
pub const MAX_ZONE_LEN: usize = 63;

/// Whether `zone` is a non-empty Kubernetes label value: at most [`MAX_ZONE_LEN`]
/// letters, digits, '-', '_' or '.', starting and ending with a letter or digit.
pub fn is_zone_name(zone: &str) -> bool {
    let bytes = zone.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= MAX_ZONE_LEN
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// The routing ring of a pool: members and a version that only moves forward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Topology {
    /// Ring version, at least 1; a node never goes back to an older one.
    pub version: u64,
    /// Copies of each key: 1, or 2 (written to a key's first two choices, read from the
    /// first and then the second). Default 1.
    #[serde(default = "one_replica", skip_serializing_if = "is_one_replica")]
    pub replicas: u8,
    /// The members, in any order (ownership does not depend on the order).
    pub members: Vec<TopologyMember>,
}

fn one_replica() -> u8 {
    1
}

// serde's skip_serializing_if hands the field by reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_one_replica(replicas: &u8) -> bool {
    *replicas == 1
}

/// Most members a topology may list: a pool has at most 256 shards, and a ring change
/// lists the leaving and the joining members together. A forged ring cannot make a
/// node hash every key over 10,000 members.
pub const MAX_RING_MEMBERS: usize = 512;

impl Topology {
    /// Parses a topology JSON document (the `--topology` file) and validates it.
    ///
    /// # Errors
    /// [`NodeConfigError::Topology`] naming what is wrong.
    pub fn from_json(text: &str) -> Result<Self, NodeConfigError> {
        let topology: Self =
            serde_json::from_str(text).map_err(|err| NodeConfigError::Topology(err.to_string()))?;
        topology.validate()?;
        Ok(topology)
    }

    /// Checks the version, ids and addresses.
    ///
    /// # Errors
    /// [`NodeConfigError::Topology`] naming the first problem.
    pub fn validate(&self) -> Result<(), NodeConfigError> {
        let bad = |reason: String| Err(NodeConfigError::Topology(reason));
        if self.version == 0 {
            return bad("version must be at least 1".into());
        }
        if !(1..=2).contains(&self.replicas) {
            return bad(format!("replicas must be 1 or 2, not {}", self.replicas));
        }
        if self.members.len() > MAX_RING_MEMBERS {
            return bad(format!(
                "{} members; a ring has at most {MAX_RING_MEMBERS} (a pool at most 256 shards)",
                self.members.len()
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for member in &self.members {
            if member.id.is_empty() || member.id.chars().any(|c| c.is_control() || c == ' ') {
                return bad(format!(
                    "member id '{}' must be non-empty without spaces or control characters",
                    member.id
                ));
            }
            if !seen.insert(member.id.as_str()) {
                return bad(format!("member id '{}' appears twice", member.id));
            }
            let valid_port = member
                .address
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !valid_port || member.address.contains('/') || member.address.contains(' ') {
                return bad(format!(
                    "member '{}': address '{}' is not host:port (e.g. 10.244.0.7:50051)",
                    member.id, member.address
                ));
            }
            if let Some(zone) = &member.zone
                && !is_zone_name(zone)
            {
                return bad(format!(
                    "member '{}': zone '{}' is not a label value (1 to {MAX_ZONE_LEN} letters, \
                     digits, '-', '_' or '.', starting and ending with a letter or digit)",
                    member.id,
                    zone.chars()
                        .take(MAX_ZONE_LEN + 1)
                        .collect::<String>()
                        .escape_debug()
                ));
            }
        }
        Ok(())
    }

    /// The members active in this ring that were not in `previous` (new, or joining or
    /// draining there): each is owed its keys by the others.
    pub fn entering_since<'a>(&'a self, previous: &Topology) -> Vec<&'a str> {
        self.members
            .iter()
            .filter(|m| m.state == MemberState::Active)
            .filter(|m| {
                !previous
                    .members
                    .iter()
                    .any(|old| old.id == m.id && old.state == MemberState::Active)
            })
            .map(|m| m.id.as_str())
            .collect()
    }

    /// Whether keys' second copies move between `previous` and this ring with nobody
    /// entering: the number of copies changed, or, with two, a member of both rings sits
    /// in another zone (a key's first owner stays; its second choice may not).
    pub fn copies_moved_since(&self, previous: &Topology) -> bool {
        previous.replicas != self.replicas
            || (self.replicas > 1
                && previous.members.iter().any(|old| {
                    self.members
                        .iter()
                        .any(|new| new.id == old.id && new.zone != old.zone)
                }))
    }

    /// Whether going from `previous` to this ring asks `member` to hand off (rebalance):
    /// a member entered and `member` is not one of them (it holds keys the newcomer now
    /// owns, or copies it lacks), or copies moved. The operator asks exactly these nodes
    /// in the pass that publishes the ring; a node that installs such a ring says it owes
    /// a handover (`owesHandover`) until a whole rebalance on it sends everything, so a
    /// rebalance the pass did not get to is asked for again.
    pub fn asks_handoff_of(&self, previous: &Topology, member: &str) -> bool {
        let entering = self.entering_since(previous);
        (!entering.is_empty() && !entering.contains(&member)) || self.copies_moved_since(previous)
    }
}

/// A whole node config document: the [`NodeConfig`] fields plus an optional `topology`.
///
/// This is what the node reads from its config file and from a `configure` body. The
/// fields sit side by side in one JSON object (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDocument {
    /// Every field but `topology`.
    pub config: NodeConfig,
    /// The routing ring, if the document carries one.
    pub topology: Option<Topology>,
}

impl NodeDocument {
    /// Parses a JSON document; the topology, if any, is validated.
    ///
    /// # Errors
    /// [`NodeConfigError::Syntax`] or [`NodeConfigError::Topology`].
    pub fn from_json(text: &str) -> Result<Self, NodeConfigError> {
        let mut value: serde_json::Value =
            serde_json::from_str(text).map_err(NodeConfigError::Syntax)?;
        let topology = match value.as_object_mut().and_then(|o| o.remove("topology")) {
            None | Some(serde_json::Value::Null) => None,
            Some(raw) => {
                let topology: Topology = crate::json_object_value(raw)
                    .map_err(|err| NodeConfigError::Topology(err.to_string()))?;
                topology.validate()?;
                Some(topology)
            }
        };
        let config = crate::json_object_value(value).map_err(NodeConfigError::Syntax)?;
        Ok(Self { config, topology })
    }

    /// Serialises the document as pretty JSON.
    pub fn to_json(&self) -> String {
        let mut value = serde_json::to_value(&self.config).unwrap_or_default();
        if let (Some(topology), Some(object)) = (&self.topology, value.as_object_mut()) {
            object.insert(
                "topology".into(),
                serde_json::to_value(topology).unwrap_or_default(),
            );
        }
        serde_json::to_string_pretty(&value).unwrap_or_default()
    }
}

/// A node configuration document that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NodeConfigError {
    /// Not JSON, or not the shape of [`NodeConfig`] (unknown or mistyped field).
    #[error("node config is not valid: {0}")]
    Syntax(#[source] serde_json::Error),
    /// A field holds a value that cannot be parsed.
    #[error("node config field '{field}' is invalid")]
    Field {
        /// The camelCase field name as written in the file.
        field: &'static str,
        /// What was wrong with it.
        #[source]
        source: QuantityError,
    },
    /// The `topology` object is malformed or inconsistent.
    #[error("node config field 'topology' is invalid: {0}")]
    Topology(String),
    /// A field may not be changed while the node runs.
    #[error("node config field '{field}' cannot change without a restart")]
    NotLive {
        /// The camelCase field name.
        field: String,
    },
}

impl NodeConfig {
    /// Parses a JSON document.
    ///
    /// # Errors
    /// [`NodeConfigError::Syntax`] naming the offending field or position.
    pub fn from_json(text: &str) -> Result<Self, NodeConfigError> {
        crate::from_json_object(text.as_bytes()).map_err(NodeConfigError::Syntax)
    }

    /// Serialises the document as pretty JSON, the way the operator writes it.
    pub fn to_json(&self) -> String {
        // Serialising a struct of strings, numbers and enums cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// `memoryBudget` in bytes, if set.
    ///
    /// # Errors
    /// [`NodeConfigError::Field`] naming `memoryBudget`.
    pub fn memory_budget_bytes(&self) -> Result<Option<u64>, NodeConfigError> {
        parse_field(
            "memoryBudget",
            self.memory_budget.as_deref(),
            quantity::parse_bytes,
        )
    }

    /// `maxEntrySize` in bytes, if set.
    ///
    /// # Errors
    /// [`NodeConfigError::Field`] naming `maxEntrySize`.
    pub fn max_entry_size_bytes(&self) -> Result<Option<u64>, NodeConfigError> {
        parse_field(
            "maxEntrySize",
            self.max_entry_size.as_deref(),
            quantity::parse_bytes,
        )
    }

    /// `ttl` as a duration, if set.
    ///
    /// # Errors
    /// [`NodeConfigError::Field`] naming `ttl`.
    pub fn ttl_duration(&self) -> Result<Option<Duration>, NodeConfigError> {
        parse_field("ttl", self.ttl.as_deref(), quantity::parse_duration)
    }

    /// `shutdownGrace` as a duration, if set.
    ///
    /// # Errors
    /// [`NodeConfigError::Field`] naming `shutdownGrace`.
    pub fn shutdown_grace_duration(&self) -> Result<Option<Duration>, NodeConfigError> {
        parse_field(
            "shutdownGrace",
            self.shutdown_grace.as_deref(),
            quantity::parse_duration,
        )
    }

    /// Refuses fields that only take effect at start, for the `configure` action: any
    /// field set that is not a [`LiveField`].
    ///
    /// # Errors
    /// [`NodeConfigError::NotLive`] naming the first such field.
    pub fn ensure_live_only(&self) -> Result<(), NodeConfigError> {
        let set = match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(fields)) => fields,
            _ => return Ok(()),
        };
        match set.keys().find(|name| {
            !LiveField::ALL
                .iter()
                .any(|live| live.name() == name.as_str())
        }) {
            Some(field) => Err(NodeConfigError::NotLive {
                field: field.clone(),
            }),
            None => Ok(()),
        }
    }

    /// This document's live fields that `wanted` selects; every other field unset.
    #[must_use]
    pub fn live_part(&self, wanted: impl Fn(LiveField) -> bool) -> Self {
        let mut live = Self::default();
        for field in LiveField::ALL.into_iter().filter(|field| wanted(*field)) {
            match field {
                LiveField::Generation => live.generation = self.generation,
                LiveField::MaxEntries => live.max_entries = self.max_entries,
                LiveField::MemoryBudget => live.memory_budget.clone_from(&self.memory_budget),
                LiveField::MaxEntrySize => live.max_entry_size.clone_from(&self.max_entry_size),
                LiveField::Ttl => live.ttl.clone_from(&self.ttl),
                LiveField::TtlMode => live.ttl_mode = self.ttl_mode,
                LiveField::Eviction => live.eviction = self.eviction,
                LiveField::LocationMode => live.location_mode = self.location_mode,
            }
        }
        live
    }
}

/// A field of the node config document that a running node takes without a restart (the
/// `configure` action): the one list the node's live-only check, the operator's live
/// push and the spec's change classes (a test in `cachecluster::change_class`) follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LiveField {
    /// `generation`.
    Generation,
    /// `maxEntries`.
    MaxEntries,
    /// `memoryBudget`: follows the pool's memory limit.
    MemoryBudget,
    /// `maxEntrySize`: follows the pool's memory limit.
    MaxEntrySize,
    /// `ttl`.
    Ttl,
    /// `ttlMode`.
    TtlMode,
    /// `eviction`.
    Eviction,
    /// `locationMode`.
    LocationMode,
}

impl LiveField {
    /// Every live field.
    pub const ALL: [Self; 8] = [
        Self::Generation,
        Self::MaxEntries,
        Self::MemoryBudget,
        Self::MaxEntrySize,
        Self::Ttl,
        Self::TtlMode,
        Self::Eviction,
        Self::LocationMode,
    ];

    /// The field's name in the document (camelCase).
    pub fn name(self) -> &'static str {
        match self {
            Self::Generation => "generation",
            Self::MaxEntries => "maxEntries",
            Self::MemoryBudget => "memoryBudget",
            Self::MaxEntrySize => "maxEntrySize",
            Self::Ttl => "ttl",
            Self::TtlMode => "ttlMode",
            Self::Eviction => "eviction",
            Self::LocationMode => "locationMode",
        }
    }

    /// Whether the field follows the pool's memory limit: pushed only with a memory
    /// change (the byte budget lowered before the container's limit, raised after it),
    /// never with a plain config change.
    pub fn follows_memory(self) -> bool {
        matches!(self, Self::MemoryBudget | Self::MaxEntrySize)
    }
}

fn parse_field<T>(
    field: &'static str,
    value: Option<&str>,
    parse: fn(&str) -> Result<T, QuantityError>,
) -> Result<Option<T>, NodeConfigError> {
    value
        .map(parse)
        .transpose()
        .map_err(|source| NodeConfigError::Field { field, source })
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    fn ring(version: u64, replicas: u8, members: &[(&str, MemberState, Option<&str>)]) -> Topology {
        Topology {
            version,
            replicas,
            members: members
                .iter()
                .map(|&(id, state, zone)| TopologyMember {
                    id: id.to_owned(),
                    address: format!("{id}:50051"),
                    state,
                    zone: zone.map(str::to_owned),
                })
                .collect(),
        }
    }

    #[test]
    fn a_ring_asks_the_others_to_hand_off_when_a_member_enters_or_copies_move() {
        use MemberState::{Active, Draining, Joining};
        let zoned = |z: &'static str| Some(z);
        let whole = ring(
            1,
            2,
            &[
                ("n-0", Active, zoned("a")),
                ("n-1", Active, zoned("b")),
                ("n-2", Active, zoned("c")),
            ],
        );
        // n-2 cut off: out of the key space. Nobody enters, nobody is asked.
        let out = ring(
            2,
            2,
            &[
                ("n-0", Active, zoned("a")),
                ("n-1", Active, zoned("b")),
                ("n-2", Joining, zoned("c")),
            ],
        );
        assert!(out.entering_since(&whole).is_empty());
        assert!(
            ["n-0", "n-1", "n-2"]
                .iter()
                .all(|m| !out.asks_handoff_of(&whole, m))
        );
        // Back in: n-2 enters; the two others owe it its keys and copies, it owes nothing.
        let back = ring(
            3,
            2,
            &whole
                .members
                .iter()
                .map(|m| (m.id.as_str(), m.state, m.zone.as_deref()))
                .collect::<Vec<_>>(),
        );
        assert_eq!(back.entering_since(&out), ["n-2"]);
        assert!(back.asks_handoff_of(&out, "n-0"));
        assert!(back.asks_handoff_of(&out, "n-1"));
        assert!(!back.asks_handoff_of(&out, "n-2"));
        // A new member (scale-out straight to active) enters too.
        let grown = ring(
            4,
            2,
            &[
                ("n-0", Active, None),
                ("n-1", Active, None),
                ("n-2", Active, None),
                ("n-3", Active, None),
            ],
        );
        let three = ring(
            3,
            2,
            &[
                ("n-0", Active, None),
                ("n-1", Active, None),
                ("n-2", Active, None),
            ],
        );
        assert_eq!(grown.entering_since(&three), ["n-3"]);
        // A member draining enters nobody; its own handoff is the operator's step.
        let draining = ring(
            4,
            2,
            &[
                ("n-0", Active, None),
                ("n-1", Active, None),
                ("n-2", Draining, None),
            ],
        );
        assert!(!draining.asks_handoff_of(&three, "n-0"));
        // Copies move: replicas changed, or a member moved zone with two copies.
        let one_copy = ring(
            4,
            1,
            &[
                ("n-0", Active, None),
                ("n-1", Active, None),
                ("n-2", Active, None),
            ],
        );
        assert!(one_copy.asks_handoff_of(&three, "n-2"));
        let moved = ring(
            4,
            2,
            &[
                ("n-0", Active, zoned("a")),
                ("n-1", Active, zoned("c")),
                ("n-2", Active, zoned("c")),
            ],
        );
        assert!(moved.copies_moved_since(&whole));
        assert!(moved.asks_handoff_of(&whole, "n-0"));
        let moved_one_copy = ring(
            5,
            1,
            &moved
                .members
                .iter()
                .map(|m| (m.id.as_str(), m.state, m.zone.as_deref()))
                .collect::<Vec<_>>(),
        );
        let whole_one_copy = ring(
            1,
            1,
            &whole
                .members
                .iter()
                .map(|m| (m.id.as_str(), m.state, m.zone.as_deref()))
                .collect::<Vec<_>>(),
        );
        assert!(
            !moved_one_copy.copies_moved_since(&whole_one_copy),
            "one copy: zones move nothing"
        );
        // Members that come or go are not zone moves.
        assert!(!grown.copies_moved_since(&three));
    }

    #[test]
    fn the_documented_example_parses() {
        let doc = r#"{"generation": 3, "listen": "0.0.0.0:50051", "maxEntries": 100000,
            "memoryBudget": "1536MiB", "maxEntrySize": "256MiB", "ttl": "1h",
            "ttlMode": "sliding", "eviction": "tinylfu", "shutdownGrace": "20s"}"#;
        let config = NodeConfig::from_json(doc).unwrap();
        assert_eq!(config.generation, Some(3));
        assert_eq!(config.memory_budget_bytes().unwrap(), Some(1536 << 20));
        assert_eq!(
            config.ttl_duration().unwrap(),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(config.ttl_mode, Some(TtlMode::Sliding));
        assert_eq!(config.eviction, Some(EvictionPolicy::Tinylfu));
        assert_eq!(NodeConfig::from_json(&config.to_json()).unwrap(), config);
    }

    #[test]
    fn unknown_and_mistyped_fields_are_named() {
        let err = NodeConfig::from_json(r#"{"maxEntires": 5}"#).unwrap_err();
        assert!(err.source().unwrap().to_string().contains("maxEntires"));
        let err = NodeConfig::from_json(r#"{"eviction": "random"}"#).unwrap_err();
        assert!(err.source().unwrap().to_string().contains("random"));
    }

    #[test]
    fn bad_values_name_their_field() {
        let config = NodeConfig::from_json(r#"{"memoryBudget": "lots", "ttl": "soon"}"#).unwrap();
        let err = config.memory_budget_bytes().unwrap_err();
        assert_eq!(
            err.to_string(),
            "node config field 'memoryBudget' is invalid"
        );
        assert!(err.source().unwrap().to_string().contains("lots"));
        assert!(
            config
                .ttl_duration()
                .unwrap_err()
                .to_string()
                .contains("'ttl'")
        );
    }

    #[test]
    fn a_document_carries_an_optional_topology() {
        let text = r#"{"ttl": "5m", "topology": {"version": 2, "members": [
            {"id": "p-0", "address": "10.0.0.1:50051"},
            {"id": "p-1", "address": "p-1.p.ns.svc:50051", "state": "draining"}]}}"#;
        let doc = NodeDocument::from_json(text).unwrap();
        assert_eq!(doc.config.ttl.as_deref(), Some("5m"));
        let topology = doc.topology.clone().unwrap();
        assert_eq!(topology.version, 2);
        assert_eq!(topology.members[0].state, MemberState::Active);
        assert_eq!(topology.members[1].state, MemberState::Draining);
        assert_eq!(NodeDocument::from_json(&doc.to_json()).unwrap(), doc);
        let plain = NodeDocument::from_json(r#"{"ttl": "5m"}"#).unwrap();
        assert_eq!(plain.topology, None);
        assert!(NodeDocument::from_json(r#"{"tll": "5m"}"#).is_err());
    }

    #[test]
    fn a_member_zone_is_optional_and_left_out_when_unknown() {
        let text = r#"{"version": 3, "replicas": 2, "members": [
            {"id": "p-0", "address": "p-0.p:50051", "zone": "zone-a"},
            {"id": "p-1", "address": "p-1.p:50051"}]}"#;
        let topology = Topology::from_json(text).unwrap();
        assert_eq!(topology.members[0].zone.as_deref(), Some("zone-a"));
        assert_eq!(topology.members[1].zone, None);
        let written = serde_json::to_value(&topology).unwrap();
        assert_eq!(written["members"][0]["zone"], "zone-a");
        // A ring without zones is written as before zones existed: a node that predates
        // them (deny_unknown_fields) still reads it.
        assert!(written["members"][1].get("zone").is_none(), "{written}");
        assert_eq!(Topology::from_json(&written.to_string()).unwrap(), topology);
    }

    #[test]
    fn zones_are_label_values() {
        for good in ["zone-a", "us-east-1a", "Z", "eu_west.3"] {
            assert!(is_zone_name(good), "{good}");
        }
        let long = "z".repeat(MAX_ZONE_LEN + 1);
        for bad in ["", "-a", "a-", "zone a", "zone/a", long.as_str()] {
            assert!(!is_zone_name(bad), "{bad}");
            let text = format!(
                r#"{{"version": 1, "members": [{{"id": "a", "address": "h:1", "zone": {}}}]}}"#,
                serde_json::to_string(bad).unwrap()
            );
            let err = Topology::from_json(&text).unwrap_err().to_string();
            assert!(err.contains("is not a label value"), "{bad}: {err}");
        }
    }

    #[test]
    fn bad_topologies_say_what_is_wrong() {
        let cases = [
            (r#"{"version": 0, "members": []}"#, "at least 1"),
            (
                r#"{"version": 1, "members": [{"id": "a", "address": "h:1"}, {"id": "a", "address": "h:2"}]}"#,
                "appears twice",
            ),
            (
                r#"{"version": 1, "members": [{"id": "a", "address": "nohost"}]}"#,
                "not host:port",
            ),
            (
                r#"{"version": 1, "members": [{"id": "", "address": "h:1"}]}"#,
                "non-empty",
            ),
            (
                r#"{"version": 1, "members": [{"id": "a", "address": "h:1", "state": "gone"}]}"#,
                "gone",
            ),
        ];
        for (text, expected) in cases {
            let err = Topology::from_json(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
            assert!(err.contains("'topology'"), "{err}");
        }
    }

    #[test]
    fn restart_only_fields_are_refused_for_live_changes() {
        let config = NodeConfig::from_json(r#"{"ttl": "5m", "listen": "0.0.0.0:1"}"#).unwrap();
        assert!(matches!(
            config.ensure_live_only(),
            Err(NodeConfigError::NotLive { field }) if field == "listen"
        ));
        let live = NodeConfig::from_json(r#"{"ttl": "5m", "maxEntries": 9}"#).unwrap();
        assert!(live.ensure_live_only().is_ok());
    }

    /// A document with every field set, so each field's name shows in its JSON.
    fn every_field_set() -> NodeConfig {
        NodeConfig::from_json(
            r#"{"generation": 3, "listen": "0.0.0.0:1", "metricsListen": "0.0.0.0:2",
                "maxEntries": 9, "memoryBudget": "64MiB", "maxEntrySize": "1MiB", "ttl": "5m",
                "ttlMode": "sliding", "eviction": "lru", "authTokenFile": "/a",
                "adminTokenFile": "/b", "peerTokenFile": "/c", "tlsCertFile": "/d",
                "tlsKeyFile": "/e", "tlsCaFile": "/f", "tlsClientAuth": "required",
                "shutdownGrace": "20s", "locationMode": "proxy", "maxConnections": 5}"#,
        )
        .unwrap()
    }

    #[test]
    fn the_live_part_holds_exactly_the_live_fields_and_passes_the_live_only_check() {
        let full = every_field_set();
        let Ok(serde_json::Value::Object(all)) = serde_json::to_value(&full) else {
            panic!("a document is an object");
        };
        assert_eq!(all.len(), 19, "every field of the document is set");
        let live = full.live_part(|_| true);
        let Ok(serde_json::Value::Object(kept)) = serde_json::to_value(&live) else {
            panic!("a document is an object");
        };
        let names: Vec<&str> = LiveField::ALL.iter().map(|f| f.name()).collect();
        let mut kept_names: Vec<&str> = kept.keys().map(String::as_str).collect();
        kept_names.sort_unstable();
        let mut expected = names.clone();
        expected.sort_unstable();
        assert_eq!(kept_names, expected);
        for (name, value) in &kept {
            assert_eq!(all.get(name), Some(value), "{name} copied as it was");
        }
        assert!(live.ensure_live_only().is_ok());
        // Every other field is refused live, named.
        for name in all.keys().filter(|name| !names.contains(&name.as_str())) {
            let mut one = live.clone();
            let mut value = serde_json::to_value(&one).unwrap();
            value[name.as_str()] = all[name].clone();
            one = serde_json::from_value(value).unwrap();
            assert!(
                matches!(one.ensure_live_only(), Err(NodeConfigError::NotLive { ref field }) if field == name),
                "{name}"
            );
        }
        let without_memory = full.live_part(|field| !field.follows_memory());
        assert_eq!(without_memory.memory_budget, None);
        assert_eq!(without_memory.max_entry_size, None);
        assert_eq!(without_memory.ttl, full.ttl);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Any text as a `configure` body or config file: a document or an error, never
        /// a panic; and only a JSON object is ever accepted.
        #[test]
        fn any_text_is_a_document_or_an_error(
            text in r#"[\[\]{}",:0-9a-zA-Z .-]{0,80}"#,
        ) {
            if NodeDocument::from_json(&text).is_ok() {
                let value: serde_json::Value = serde_json::from_str(&text).unwrap();
                proptest::prop_assert!(value.is_object(), "{text}");
            }
            let _ = NodeConfig::from_json(&text);
        }
    }
}
