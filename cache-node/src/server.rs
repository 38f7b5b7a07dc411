//! Starts and stops a node: the Flight server, gRPC health, `/metrics`, the expiry sweep
//! and the config-file watcher.
//!
//! Shutdown is graceful: health turns NOT_SERVING, the listener stops accepting, and
//! in-flight streams get `shutdown_grace` to finish before the server is dropped.
//!
//! Owns: wiring. The only place the layers are stacked:
//! `AuthLayer(DoGetRelay(IntakeLayer(FlightServiceServer)))`.
//!
//! It may import every layer; no module of the library imports it (only `main.rs`).

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;

use crate::auth::{Auth, AuthLayer};
use crate::cluster::exit::{EXIT_SERVING_LIMIT, ExitHandoff, serving_at_most};
use crate::cluster::peers::{Peers, message_limit};
use crate::config::{
    Advertised, Config, DEFAULT_RELOAD_DEADLINE, Persistence, TlsFiles, read_config_file,
};
use crate::flight::FlightCacheService;
use crate::live::LiveConfig;
use crate::metrics::Metrics;
use crate::metrics::collector::StoreCollector;
use crate::persist::{DiskSettings, DiskTier, ReloadReport};
use crate::readiness;
use crate::routing::members::RoutingTable;
use crate::store::{Clock, Store, SystemClock};
use crate::wire::accept::BoundedIncoming;
use crate::wire::intake::IntakeLayer;
use crate::wire::limits::RequestLimitLayer;
use crate::wire::relay::{DoGetRelay, RelayNode};
use crate::wire::slow::SlowCallLog;
use crate::wire::tls::{self, TlsError};
use crds::chain;
use crds::node_config::ClientAuth;
use crds::node_config::NodeDocument;

/// How often expired entries are purged.
const EXPIRY_SWEEP: Duration = Duration::from_secs(1);
/// How often the config file is checked for changes.
const CONFIG_POLL: Duration = Duration::from_secs(2);

/// How often the clients' token file is re-read. The kubelet replaces a Secret volume's
/// files on its sync (about a minute by default); a rotation is in use within this much
/// of it, on open connections too.
pub const TOKEN_RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// Failure to start or run the node.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("flight server failed")]
    Serve(#[source] tonic::transport::Error),
    /// The starting topology was refused.
    #[error("topology refused")]
    Topology(#[source] crate::routing::members::RoutingError),
    /// The store configuration was refused.
    #[error("store configuration refused")]
    Store(#[source] crate::store::Error),
    /// The TLS certificate, key or CA cannot be used.
    #[error("TLS cannot be set up")]
    Tls(#[source] TlsError),
    /// The disk tier's directory cannot be used.
    #[error("the data directory cannot be used")]
    Disk(#[source] std::io::Error),
}

/// A running node; stop it with [`RunningNode::shutdown`].
#[derive(Debug)]
pub struct RunningNode {
    /// The bound Flight address (useful with port 0).
    pub flight_addr: SocketAddr,
    /// The bound metrics address.
    pub metrics_addr: SocketAddr,
    /// The node's store, for in-process inspection (tests, benchmarks).
    pub store: Arc<Store>,
    /// The disk tier, with `--data-dir`.
    pub disk: Option<DiskTier>,
    /// The Flight service, for the exit handoff.
    service: FlightCacheService,
    exit_handoff_budget: Duration,
    stop: watch::Sender<bool>,
    flight: JoinHandle<Result<(), ServerError>>,
    background: Vec<JoinHandle<()>>,
}

impl RunningNode {
    /// The first half of a stop, while the node still serves: from now on it takes no
    /// copies and stores no put itself (`Cluster::begin_stopping`), and its entries go to
    /// where their keys are read while it is away (the exit handoff, `cluster::exit`).
    /// [`RunningNode::shutdown`] begins with it; a test calls it alone to see the node
    /// between its SIGTERM and its end.
    pub async fn begin_stopping(&self) -> ExitHandoff {
        self.service.cluster().begin_stopping();
        if self.exit_handoff_budget.is_zero() {
            return ExitHandoff::default();
        }
        self.service
            .cluster()
            .hand_off_at_exit(self.exit_handoff_budget)
            .await
    }

    /// Stops the node gracefully and waits for it.
    ///
    /// # Errors
    /// [`ServerError::Serve`] if the server failed while running.
    pub async fn shutdown(self) -> Result<(), ServerError> {
        // With two copies of every key the other copy answers while this node is away:
        // it stops taking calls first (GOAWAY; the calls in flight finish) and hands off
        // meanwhile, so a force delete's SIGKILL 2 s after the SIGTERM finds no call in
        // flight (measured: 6-7 failed calls per force delete with two copies when the
        // handoff of ~13,600 entries ran first). With one copy its keys are only here
        // until copied: it serves through the handoff, for at most EXIT_SERVING_LIMIT.
        let copies_elsewhere = self
            .service
            .cluster()
            .routing()
            .current()
            .is_some_and(|membership| membership.replicas() >= 2);
        let serving_limit = if copies_elsewhere {
            Duration::ZERO
        } else {
            EXIT_SERVING_LIMIT
        };
        serving_at_most(self.begin_stopping(), serving_limit, || {
            let _ = self.stop.send(true);
        })
        .await;
        let _ = self.stop.send(true);
        let result = match self.flight.await {
            Ok(result) => result,
            Err(join_error) => {
                tracing::error!(error = %join_error, "flight server task failed");
                Ok(())
            }
        };
        for task in self.background {
            task.abort();
        }
        if let Some(disk) = self.disk {
            // Writes still queued reach the disk before the process ends.
            let flushed = tokio::task::spawn_blocking(move || {
                let drained = disk.flush(DISK_FLUSH_AT_STOP);
                disk.close();
                drained
            })
            .await
            .unwrap_or(false);
            if !flushed {
                tracing::warn!(limit = ?DISK_FLUSH_AT_STOP, "disk tier writes still queued at stop are lost");
            }
        }
        result
    }
}

/// Longest a stopping node waits for its queued disk writes.
pub const DISK_FLUSH_AT_STOP: Duration = Duration::from_secs(10);

/// Most streams (calls) one client connection may have open at once; further calls wait
/// on the client side (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`).
pub const MAX_CONCURRENT_STREAMS: u32 = 256;

/// TCP keepalive on accepted connections (finds peers that vanished without a FIN).
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// Most bytes of a request's headers (the token, the internal headers, grpc-timeout).
pub const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;

/// The TLS state of a node whose Flight port serves TLS.
struct ServedTls {
    files: TlsFiles,
    cert: Arc<tls::ReloadingCert>,
    clients: Option<Arc<tls::ReloadingClientVerifier>>,
    acceptor: tokio_rustls::TlsAcceptor,
    seen: tls::CertPem,
    ca: bytes::Bytes,
}

impl ServedTls {
    /// The certificate and the CA, read now: a node that cannot serve what it was told
    /// to does not start. A background task re-reads them ([`watch_tls`]).
    fn load(files: TlsFiles) -> Result<Self, ServerError> {
        let (certified, seen) = tls::load_certified_key(&files).map_err(ServerError::Tls)?;
        let ca = tls::load_ca(&files.ca).map_err(ServerError::Tls)?;
        let cert = Arc::new(tls::ReloadingCert::new(certified));
        let clients = match files.client_auth {
            ClientAuth::Required => Some(Arc::new(
                tls::ReloadingClientVerifier::new(&ca, &files.ca).map_err(ServerError::Tls)?,
            )),
            ClientAuth::None => None,
        };
        let acceptor =
            tls::acceptor(Arc::clone(&cert), clients.clone(), &files).map_err(ServerError::Tls)?;
        Ok(Self {
            files,
            cert,
            clients,
            acceptor,
            seen,
            ca,
        })
    }
}

/// The parts of a node every layer shares: its ring, store, live config and metrics.
struct Core {
    routing: Arc<RoutingTable>,
    store: Arc<Store>,
    live: Arc<LiveConfig>,
    metrics: Arc<Metrics>,
}

/// The Flight service with its layers, outermost first: the slow-call log, auth,
/// request limits, the DoGet relay, the put intake.
type LayeredFlight = SlowCallLog<
    AuthLayer<RequestLimitLayer<DoGetRelay<IntakeLayer<FlightServiceServer<FlightCacheService>>>>>,
>;

/// Binds the listeners and starts every task of a node, its store reading time from
/// `clock` (the system clock in production, a manual one in tests).
///
/// # Errors
/// [`ServerError::Bind`] when an address is taken, [`ServerError::Store`] for a store
/// configuration the store refuses.
pub async fn start(config: Config, clock: Arc<dyn Clock>) -> Result<RunningNode, ServerError> {
    let max_entry_bytes = config.store.max_entry_bytes;
    let generation = config.generation;
    let core = Core::assemble(&config, clock)?;
    let disk = open_disk(config.persistence.as_ref(), &core)?;
    let auth = auth_from(config.credentials);
    let rotated_tokens = config.client_token_file.map(|path| (path, auth.clone()));
    let tls = config.tls.map(ServedTls::load).transpose()?;
    let peers = peers_for(&core.metrics, &auth, tls.as_ref(), max_entry_bytes);
    // DoGet answers (the relay's) and listings (the service's) whose client stops reading.
    let stalled_readers = crate::wire::stall::StallWatch::start(
        config.max_read_stall,
        core.metrics.stalled_reads.clone(),
    );
    let service = FlightCacheService::new(
        Arc::clone(&core.store),
        Arc::clone(&core.live),
        Arc::clone(&core.metrics),
        auth.clone(),
        Arc::clone(&core.routing),
        peers.clone(),
        stalled_readers.clone(),
    );
    let flight_service = layered(
        &service,
        &core,
        &peers,
        auth,
        max_entry_bytes,
        stalled_readers,
    );

    let (flight_listener, flight_addr) = bind(config.listen).await?;
    let (metrics_listener, metrics_addr) = bind(config.metrics_listen).await?;
    let (stop, stop_rx) = watch::channel(false);
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let reload = reload_from_disk(disk.as_ref(), config.persistence.as_ref());
    let (ready_rx, readiness) =
        report_readiness(&health_reporter, config.advertised, reload, stop_rx.clone()).await;
    let flight = tokio::spawn(serve_flight(FlightServing {
        listener: flight_listener,
        acceptor: tls.as_ref().map(|tls| tls.acceptor.clone()),
        settings: ConnectionSettings {
            max_connections: config.max_connections,
            max_connections_per_source: config.max_connections_per_source,
            max_call_duration: config.max_call_duration,
            http2_keepalive_interval: config.http2_keepalive_interval,
            http2_keepalive_timeout: config.http2_keepalive_timeout,
            shutdown_grace: config.shutdown_grace,
        },
        health: (health_reporter, health_service),
        flight_service,
        stop: stop_rx.clone(),
        metrics: Arc::clone(&core.metrics),
    }));

    let mut background: Vec<JoinHandle<()>> = readiness.into_iter().collect();
    let metrics = Arc::clone(&core.metrics);
    background.push(tokio::spawn(serve_metrics(
        metrics_listener,
        metrics,
        ready_rx,
        stop_rx,
    )));
    background.push(tokio::spawn(sweep_expired(Arc::clone(&core.store))));
    let kept = crate::allocator::hold_kept_bytes(Arc::clone(&core.store));
    background.push(tokio::spawn(kept));
    if let Some(tls) = tls {
        background.push(watch_tls(tls, &peers, &core.metrics));
    }
    if let Some((path, auth)) = rotated_tokens {
        background.push(tokio::spawn(watch_client_tokens(
            path,
            auth,
            Arc::clone(&core.metrics),
        )));
    }
    if let Some(path) = config.config_file {
        background.push(watch_config(path, &core).await);
    }
    tracing::info!(%flight_addr, %metrics_addr, generation, "flightcache node serving");
    Ok(RunningNode {
        flight_addr,
        metrics_addr,
        store: core.store,
        disk,
        service,
        exit_handoff_budget: config.exit_handoff_budget,
        stop,
        flight,
        background,
    })
}

impl Core {
    /// The ring, store, live config and metrics of `config`.
    fn assemble(config: &Config, clock: Arc<dyn Clock>) -> Result<Self, ServerError> {
        let topology = config.topology.clone();
        let routing =
            RoutingTable::new(config.member_id.clone(), topology).map_err(ServerError::Topology)?;
        let routing = Arc::new(routing);
        let store = Store::new(config.store.clone(), clock).map_err(ServerError::Store)?;
        let store = Arc::new(store);
        let live = LiveConfig::new(
            config.generation,
            config.store.clone(),
            config.location_mode,
        );
        let live = Arc::new(live);
        let metrics = Arc::new(Metrics::new(Box::new(StoreCollector::new(
            Arc::clone(&store),
            Arc::clone(&live),
            Arc::clone(&routing),
        ))));
        Ok(Self {
            routing,
            store,
            live,
            metrics,
        })
    }
}

/// The disk tier over the store, with `--data-dir`.
fn open_disk(
    persistence: Option<&Persistence>,
    core: &Core,
) -> Result<Option<DiskTier>, ServerError> {
    let Some(persistence) = persistence else {
        return Ok(None);
    };
    let settings = DiskSettings {
        shards: persistence.shards,
        read_debounce: persistence.read_debounce,
        ..DiskSettings::new(persistence.data_dir.clone())
    };
    DiskTier::open(settings, (*core.store).clone(), core.metrics.disk.clone())
        .map(Some)
        .map_err(ServerError::Disk)
}

/// The node's credentials, with a warning when any client may run the admin actions.
fn auth_from(credentials: crate::config::Credentials) -> Auth {
    if credentials.admin.is_none() {
        tracing::warn!(
            "no admin token: every client may run configure, stats, topology, clear and rebalance"
        );
    }
    Auth::new(credentials)
}

/// One pool of peer channels for the Flight service and the DoGet relay: the node's
/// peer token, the CA it verifies peers by, for peers that require client certificates
/// its own certificate, and the message limit of its own Flight port.
fn peers_for(
    metrics: &Arc<Metrics>,
    auth: &Auth,
    tls: Option<&ServedTls>,
    max_entry_bytes: u64,
) -> Peers {
    let identity = tls
        .filter(|tls| tls.clients.is_some())
        .map(|tls| (tls.seen.cert.clone(), tls.seen.key.clone()));
    Peers::with_metrics(Arc::clone(metrics))
        .limiting_messages(message_limit(max_entry_bytes))
        .presenting(auth.peer_authorization().as_deref())
        .verifying(tls.map(|tls| tls.ca.clone()))
        .serving(tls.map(|tls| tls.seen.cert.clone()))
        .presenting_certificate(identity)
}

/// The Flight service inside its layers.
fn layered(
    service: &FlightCacheService,
    core: &Core,
    peers: &Peers,
    auth: Auth,
    max_entry_bytes: u64,
    stalled_readers: crate::wire::stall::StallWatch,
) -> LayeredFlight {
    // Messages up to the largest entry (or 64 MiB) are accepted, so clients that send a
    // big batch as one message work; anything larger is refused by the max entry size.
    let decode_limit = message_limit(max_entry_bytes);
    let flight_service = FlightServiceServer::new(service.clone())
        .max_decoding_message_size(decode_limit)
        .max_encoding_message_size(decode_limit);
    let relay_node = RelayNode {
        store: Arc::clone(&core.store),
        metrics: Arc::clone(&core.metrics),
        routing: Arc::clone(&core.routing),
        peers: peers.clone(),
        stalled_readers,
    };
    // Forwarded DoGets are relayed at the HTTP/2 level, without re-encoding.
    let flight_service = IntakeLayer::new(flight_service, Arc::clone(&core.store));
    let flight_service = DoGetRelay::new(flight_service, relay_node);
    // Request bodies of every method but DoPut are small; bounded before they are read.
    let flight_service = RequestLimitLayer::new(flight_service);
    // No call reaches the relay, the intake or the service unauthenticated.
    let flight_service = AuthLayer::new(flight_service, auth, Arc::clone(&core.metrics));
    // Outermost: a call's whole time on the node, authentication included.
    SlowCallLog::new(flight_service)
}

/// The disk tier's reload, started now, with the longest it may hold readiness back.
fn reload_from_disk(
    disk: Option<&DiskTier>,
    persistence: Option<&Persistence>,
) -> Option<(JoinHandle<ReloadReport>, Duration)> {
    let disk = disk?.clone();
    let deadline = persistence.map_or(DEFAULT_RELOAD_DEADLINE, |p| p.reload_deadline);
    Some((tokio::task::spawn_blocking(move || disk.reload()), deadline))
}

/// Liveness is the health service's overall status ("" — serving while the process
/// runs); readiness is the Flight service's. It is ready at once, or, with an advertised
/// name or a disk tier, once the name resolves here and the reload is done (or past its
/// deadline: the reload then goes on in the background). Returns the readiness the
/// metrics port reports and the task that waits, if any.
async fn report_readiness(
    reporter: &HealthReporter,
    advertised: Option<Advertised>,
    reload: Option<(JoinHandle<ReloadReport>, Duration)>,
    stopping: watch::Receiver<bool>,
) -> (watch::Receiver<bool>, Option<JoinHandle<()>>) {
    let (ready, ready_rx) = watch::channel(false);
    if advertised.is_none() && reload.is_none() {
        reporter
            .set_serving::<FlightServiceServer<FlightCacheService>>()
            .await;
        let _ = ready.send(true);
        return (ready_rx, None);
    }
    reporter
        .set_not_serving::<FlightServiceServer<FlightCacheService>>()
        .await;
    let reporter = reporter.clone();
    let waiting = tokio::spawn(async move {
        if let Some(advertised) = advertised {
            let lookup = |_host: String| {
                let advertised = advertised.clone();
                async move { readiness::lookup(&advertised).await }
            };
            let resolved =
                readiness::wait_until_resolvable(&advertised, lookup, stopping.clone()).await;
            if !resolved {
                return;
            }
        }
        if let Some((mut reload, deadline)) = reload
            && tokio::time::timeout(deadline, &mut reload).await.is_err()
        {
            tracing::warn!(
                ?deadline,
                "the reload from disk passed its deadline: ready, still loading"
            );
        }
        if !*stopping.borrow() {
            reporter
                .set_serving::<FlightServiceServer<FlightCacheService>>()
                .await;
            let _ = ready.send(true);
        }
    });
    (ready_rx, Some(waiting))
}

/// The connection and call bounds of the Flight port.
struct ConnectionSettings {
    max_connections: usize,
    max_connections_per_source: usize,
    max_call_duration: Duration,
    http2_keepalive_interval: Duration,
    http2_keepalive_timeout: Duration,
    shutdown_grace: Duration,
}

/// What the Flight port's server task needs; `H` is the gRPC health service.
struct FlightServing<H> {
    listener: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    settings: ConnectionSettings,
    health: (HealthReporter, HealthServer<H>),
    flight_service: LayeredFlight,
    stop: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
}

/// Serves the Flight port (health beside Flight) until a stop is asked, then gives the
/// calls in flight `shutdown_grace` to finish.
async fn serve_flight<H: Health>(serving: FlightServing<H>) -> Result<(), ServerError> {
    let FlightServing {
        listener,
        acceptor,
        settings,
        health: (health_reporter, health_service),
        flight_service,
        stop,
        metrics,
    } = serving;
    let shutdown_grace = settings.shutdown_grace;
    let mut flight_stop = stop.clone();
    let mut grace_stop = stop;
    let shutdown_requested = async move {
        let _ = flight_stop.wait_for(|stop| *stop).await;
        health_reporter
            .set_not_serving::<FlightServiceServer<FlightCacheService>>()
            .await;
        tracing::info!(grace = ?shutdown_grace, "shutting down: draining in-flight streams");
    };
    // Every connection gets TCP_NODELAY (Nagle's algorithm would hold small answers
    // back ~40 ms waiting for an ACK) and keepalive; past `max_connections` new ones
    // are closed, and accepting pauses while descriptors are exhausted.
    // One client address holds at most its share, and a connection that carries no
    // authenticated call in time is closed (`connection.rs`).
    let incoming = BoundedIncoming::new(
        listener,
        settings.max_connections,
        TCP_KEEPALIVE,
        metrics.connections_refused.clone(),
    )
    .with_per_source_limit(
        settings.max_connections_per_source,
        metrics.connections_refused_per_source.clone(),
    )
    .closing_unauthenticated_after(
        crate::connection::UNAUTHENTICATED_CONNECTION_LIMIT,
        metrics.unauthenticated_connections_closed.clone(),
    );
    // Health answers without authentication: behind the request limits too (a small
    // Check, no Watch).
    let router = flight_server(&settings)
        .add_service(SlowCallLog::new(RequestLimitLayer::new(health_service)))
        .add_service(flight_service);
    let serve: Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>> =
        match acceptor {
            Some(acceptor) => {
                let failures = metrics.tls_handshake_failures.clone();
                Box::pin(router.serve_with_incoming_shutdown(
                    tls::tls_incoming(incoming, acceptor, failures),
                    shutdown_requested,
                ))
            }
            None => Box::pin(router.serve_with_incoming_shutdown(incoming, shutdown_requested)),
        };
    tokio::pin!(serve);
    tokio::select! {
        result = &mut serve => return result.map_err(ServerError::Serve),
        _ = grace_stop.wait_for(|stop| *stop) => {}
    }
    match tokio::time::timeout(shutdown_grace, serve).await {
        Ok(result) => result.map_err(ServerError::Serve),
        Err(_) => {
            tracing::warn!("grace period over: closing streams still open");
            Ok(())
        }
    }
}

/// The HTTP/2 server of the Flight port with its bounds.
///
/// Larger HTTP/2 windows and frames let a multi-megabyte put arrive without a
/// window-update round trip every 64 KiB. A stream's window is one frame: the bytes
/// HTTP/2 buffers ahead of a put that is busy with its last message are at most what the
/// intake reservation allows for in transit (`wire::intake`), so the budget covers them;
/// a 4 MiB window let up to 4 MiB per put sit there uncounted (the put storm's RSS went
/// above budget + base). The stream cap bounds what one connection can hold open (one
/// connection opening 100,000 streams used to cost ~437 MiB); keepalive pings find dead
/// peers; the header list bound keeps a request's metadata small.
fn flight_server(settings: &ConnectionSettings) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .timeout(settings.max_call_duration)
        .initial_stream_window_size(crate::wire::intake::MAX_INCOMING_FRAME_BYTES as u32)
        .initial_connection_window_size(8 << 20)
        .max_frame_size(crate::wire::intake::MAX_INCOMING_FRAME_BYTES as u32)
        .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS))
        .http2_keepalive_interval(Some(settings.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(settings.http2_keepalive_timeout))
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
}

/// Re-reads the certificate and CA as they rotate, handing the new ones to the peers.
fn watch_tls(tls: ServedTls, peers: &Peers, metrics: &Metrics) -> JoinHandle<()> {
    let ServedTls {
        files,
        cert,
        clients,
        seen,
        ca,
        ..
    } = tls;
    let ca_peers = peers.clone();
    let cert_peers = peers.clone();
    tokio::spawn(tls::watch_files(
        files,
        tls::Reloadable {
            cert,
            clients,
            on_ca_change: Box::new(move |ca| ca_peers.rotate_ca(ca)),
            on_cert_change: Box::new(move |pem| cert_peers.rotate_identity(pem.cert, pem.key)),
            reloaded: metrics.tls_reloads.clone(),
            failed: metrics.tls_reload_failures.clone(),
        },
        seen,
        ca,
    ))
}

/// Re-reads the clients' token file every [`TOKEN_RELOAD_INTERVAL`] and puts a changed
/// set of tokens in use: the second token of a rotation is accepted once it is in the
/// file, the first refused once it is gone. A file that cannot be used keeps the previous
/// tokens and is counted.
async fn watch_client_tokens(path: PathBuf, auth: Auth, metrics: Arc<Metrics>) {
    // No baseline: the file may have changed since the config read it, before this task
    // first ran. The first read applies whatever is there (the same tokens: no change).
    let mut seen: Option<Vec<u8>> = None;
    let mut tick = tokio::time::interval(TOKEN_RELOAD_INTERVAL);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Ok(bytes) = tokio::fs::read(&path).await else {
            // Between the kubelet's swap of the volume's files: read again next time.
            metrics.token_reload_failures.inc();
            continue;
        };
        if seen.as_deref() == Some(bytes.as_slice()) {
            continue;
        }
        let applied = crate::config::read_tokens(&path, true)
            .map_err(|err| err.to_string())
            .and_then(|tokens| {
                auth.replace_client_tokens(&tokens)
                    .map(|changed| (changed, tokens.len()))
                    .map_err(|err| err.to_string())
            });
        match applied {
            Ok((changed, count)) => {
                seen = Some(bytes);
                if changed {
                    metrics.token_reloads.inc();
                    tracing::info!(tokens = count, file = %path.display(), "client tokens rotated");
                }
            }
            Err(err) => {
                metrics.token_reload_failures.inc();
                tracing::warn!(error = %err, "the client token file changed but cannot be used; the previous tokens stay in use");
            }
        }
    }
}

/// Applies changes of the config file as they come.
async fn watch_config(path: PathBuf, core: &Core) -> JoinHandle<()> {
    // Read the baseline now, not in the task, so a change made right after start is
    // not mistaken for the baseline.
    let baseline = tokio::fs::read(&path).await.ok();
    tokio::spawn(watch_config_file(
        path,
        baseline,
        Arc::clone(&core.store),
        Arc::clone(&core.live),
        Arc::clone(&core.routing),
    ))
}

/// Runs a node until `shutdown` resolves, then stops it gracefully.
///
/// # Errors
/// See [`start`] and [`RunningNode::shutdown`].
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
    let node = start(config, Arc::new(SystemClock::new())).await?;
    shutdown.await;
    node.shutdown().await
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let bind_error = |source| ServerError::Bind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    Ok((listener, bound))
}

/// Most connections the metrics port holds open at once (Prometheus, the kubelet's
/// probes when the Flight port speaks TLS, a person with curl); further ones are closed
/// as they are accepted.
pub const MAX_METRICS_CONNECTIONS: usize = 64;

/// How long a metrics-port connection lives: a scraper reconnects, and one that sends
/// nothing holds its place no longer than this.
pub const METRICS_CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

async fn serve_metrics(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let incoming = BoundedIncoming::new(
        listener,
        MAX_METRICS_CONNECTIONS,
        TCP_KEEPALIVE,
        metrics.metrics_connections_refused.clone(),
    )
    .with_lifetime(METRICS_CONNECTION_LIFETIME);
    // For the kubelet when the Flight port speaks TLS (its gRPC probes do not), the
    // gRPC health statuses over HTTP: /livez while the process runs, /readyz once the
    // advertised name leads here and until shutdown begins.
    let stopping = stop.clone();
    let app = axum::Router::new()
        .route("/livez", get(|| async { "alive" }))
        .route(
            "/readyz",
            get(move || {
                let answer = if *stopping.borrow() {
                    (axum::http::StatusCode::SERVICE_UNAVAILABLE, "shutting down")
                } else if *ready.borrow() {
                    (axum::http::StatusCode::OK, "serving")
                } else {
                    (
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        "waiting for the advertised name to resolve to this node",
                    )
                };
                async move { answer }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let metrics = Arc::clone(&metrics);
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        metrics.encode(),
                    )
                }
            }),
        );
    let serve = axum::serve(incoming, app).with_graceful_shutdown(async move {
        let _ = stop.wait_for(|stop| *stop).await;
    });
    if let Err(err) = serve.await {
        tracing::error!(error = %err, "metrics server failed");
    }
}

async fn sweep_expired(store: Arc<Store>) {
    let mut tick = tokio::time::interval(EXPIRY_SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let expired = store.purge_expired();
        if expired > 0 {
            tracing::debug!(expired, "purged expired entries");
        }
    }
}

/// Re-reads the config file when its content changes and applies its live fields. A
/// bad file is logged and ignored; the running config stays.
async fn watch_config_file(
    path: PathBuf,
    mut last: Option<Vec<u8>>,
    store: Arc<Store>,
    live: Arc<LiveConfig>,
    routing: Arc<RoutingTable>,
) {
    let mut tick = tokio::time::interval(CONFIG_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let current = tokio::fs::read(&path).await.ok();
        if current.is_none() || current == last {
            continue;
        }
        last = current;
        let NodeDocument {
            config: doc,
            topology,
        } = match read_config_file(&path) {
            Ok(doc) => doc,
            Err(err) => {
                tracing::error!(error = %chain(&err), "config file changed but is invalid; keeping the running config");
                continue;
            }
        };
        // listen, metricsListen, authTokenFile and shutdownGrace are read at start only.
        // In a memory-limited container the byte budget must follow the container's
        // limit, which the operator changes in step with it through `configure` (limit
        // raised before the budget, budget lowered before the limit); the file can show
        // the new budget before the limit has moved, so there it is read at start only.
        let (memory_budget, max_entry_size) = if crate::cgroup::memory_limit_bytes().is_some() {
            (None, None)
        } else {
            (doc.memory_budget.clone(), doc.max_entry_size.clone())
        };
        let live_fields = crds::node_config::NodeConfig {
            listen: None,
            metrics_listen: None,
            auth_token_file: None,
            admin_token_file: None,
            peer_token_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_file: None,
            shutdown_grace: None,
            memory_budget,
            max_entry_size,
            ..doc
        };
        match live.apply(&live_fields, &store) {
            Ok(applied) => tracing::info!(
                generation = applied.generation,
                "applied changed config file"
            ),
            Err(err) => {
                tracing::error!(error = %err, "config file change refused; keeping the running config")
            }
        }
        // The ring is applied on its own: an older ring in the file (a node that already
        // got a newer one through `configure`) must not block config changes.
        if let Some(topology) = topology {
            match routing.install(&topology) {
                Ok(installed) => {
                    tracing::debug!(?installed, "config file topology");
                    crate::live::drop_entries_if_joining(installed, &routing, &store);
                }
                Err(err) => {
                    tracing::warn!(error = %crds::chain(&err), "config file topology not applied; keeping the running ring")
                }
            }
        }
    }
}
