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

use crate::auth::{Auth, AuthLayer};
use crate::cluster::exit::{EXIT_SERVING_LIMIT, ExitHandoff, serving_at_most};
use crate::cluster::peers::Peers;
use crate::config::{Config, DEFAULT_RELOAD_DEADLINE, read_config_file};
use crate::flight::FlightCacheService;
use crate::live::LiveConfig;
use crate::metrics::Metrics;
use crate::metrics::collector::StoreCollector;
use crate::persist::{DiskSettings, DiskTier};
use crate::readiness;
use crate::routing::members::RoutingTable;
use crate::store::{Clock, Store, SystemClock};
use crate::wire::accept::BoundedIncoming;
use crate::wire::intake::IntakeLayer;
use crate::wire::limits::RequestLimitLayer;
use crate::wire::relay::{DoGetRelay, RelayNode};
use crate::wire::tls::{self, TlsError};
use crds::chain;
use crds::node_config::ClientAuth;
use crds::node_config::NodeDocument;

/// How often expired entries are purged.
const EXPIRY_SWEEP: Duration = Duration::from_secs(1);
/// How often the config file is checked for changes.
const CONFIG_POLL: Duration = Duration::from_secs(2);

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
    files: crate::config::TlsFiles,
    cert: Arc<tls::ReloadingCert>,
    clients: Option<Arc<tls::ReloadingClientVerifier>>,
    acceptor: tokio_rustls::TlsAcceptor,
    seen: tls::CertPem,
    ca: bytes::Bytes,
}

/// Binds the listeners and starts every task of a node, its store reading time from
/// `clock` (the system clock in production, a manual one in tests).
///
/// # Errors
/// [`ServerError::Bind`] when an address is taken, [`ServerError::Store`] for a store
/// configuration the store refuses.
pub async fn start(config: Config, clock: Arc<dyn Clock>) -> Result<RunningNode, ServerError> {
    let Config {
        listen,
        metrics_listen,
        store: store_config,
        generation,
        config_file,
        credentials,
        tls,
        shutdown_grace,
        exit_handoff_budget,
        member_id,
        topology,
        log_format: _,
        location_mode,
        max_connections,
        max_call_duration,
        max_read_stall,
        http2_keepalive_interval,
        http2_keepalive_timeout,
        advertised,
        persistence,
    } = config;
    let routing = Arc::new(RoutingTable::new(member_id, topology).map_err(ServerError::Topology)?);
    let max_entry_bytes = store_config.max_entry_bytes;
    let store = Arc::new(Store::new(store_config.clone(), clock).map_err(ServerError::Store)?);
    let live = Arc::new(LiveConfig::new(generation, store_config, location_mode));
    let metrics = Arc::new(Metrics::new(Box::new(StoreCollector::new(
        Arc::clone(&store),
        Arc::clone(&live),
        Arc::clone(&routing),
    ))));
    let disk = match &persistence {
        Some(persistence) => {
            let settings = DiskSettings {
                shards: persistence.shards,
                read_debounce: persistence.read_debounce,
                ..DiskSettings::new(persistence.data_dir.clone())
            };
            Some(
                DiskTier::open(settings, (*store).clone(), metrics.disk.clone())
                    .map_err(ServerError::Disk)?,
            )
        }
        None => None,
    };
    if credentials.admin.is_none() {
        tracing::warn!(
            "no admin token: every client may run configure, stats, topology, clear and rebalance"
        );
    }
    let auth = Auth::new(credentials);
    // One pool of peer channels for the Flight service and the DoGet relay.
    // TLS: the certificate and the CA are read now (a node that cannot serve what it
    // was told to does not start), then re-read by a background task.
    let tls = match tls {
        Some(files) => {
            let (certified, seen) = tls::load_certified_key(&files).map_err(ServerError::Tls)?;
            let ca = tls::load_ca(&files.ca).map_err(ServerError::Tls)?;
            let cert = Arc::new(tls::ReloadingCert::new(certified));
            let clients = match files.client_auth {
                ClientAuth::Required => Some(Arc::new(
                    tls::ReloadingClientVerifier::new(&ca, &files.ca).map_err(ServerError::Tls)?,
                )),
                ClientAuth::None => None,
            };
            let acceptor = tls::acceptor(Arc::clone(&cert), clients.clone(), &files)
                .map_err(ServerError::Tls)?;
            Some(ServedTls {
                files,
                cert,
                clients,
                acceptor,
                seen,
                ca,
            })
        }
        None => None,
    };
    // Peers that require client certificates are shown this node's own.
    let peer_identity = tls
        .as_ref()
        .filter(|tls| tls.clients.is_some())
        .map(|tls| (tls.seen.cert.clone(), tls.seen.key.clone()));
    let peers = Peers::with_metrics(Arc::clone(&metrics))
        .presenting(auth.peer_authorization().as_deref())
        .verifying(tls.as_ref().map(|tls| tls.ca.clone()))
        .presenting_certificate(peer_identity);
    let peers_for_tls = peers.clone();
    let relay_node = RelayNode {
        store: Arc::clone(&store),
        metrics: Arc::clone(&metrics),
        routing: Arc::clone(&routing),
        peers: peers.clone(),
        stalled_readers: crate::wire::stall::StallWatch::start(
            max_read_stall,
            metrics.stalled_reads.clone(),
        ),
    };
    let service = FlightCacheService::new(
        Arc::clone(&store),
        Arc::clone(&live),
        Arc::clone(&metrics),
        auth.clone(),
        Arc::clone(&routing),
        peers,
    );
    let exit_service = service.clone();

    let (flight_listener, flight_addr) = bind(listen).await?;
    let (metrics_listener, metrics_addr) = bind(metrics_listen).await?;

    let (stop, stop_rx) = watch::channel(false);
    // Liveness is the health service's overall status ("" — serving while the process
    // runs); readiness is the Flight service's, which waits for the advertised name.
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let (ready, ready_rx) = watch::channel(false);
    let mut background = Vec::new();
    // Ready once the advertised name resolves here and the disk tier has reloaded (or
    // its deadline passed: the reload then goes on in the background).
    let reload = disk.clone().map(|disk| {
        let deadline = persistence
            .as_ref()
            .map_or(DEFAULT_RELOAD_DEADLINE, |persistence| {
                persistence.reload_deadline
            });
        (tokio::task::spawn_blocking(move || disk.reload()), deadline)
    });
    if advertised.is_none() && reload.is_none() {
        health_reporter
            .set_serving::<FlightServiceServer<FlightCacheService>>()
            .await;
        let _ = ready.send(true);
    } else {
        health_reporter
            .set_not_serving::<FlightServiceServer<FlightCacheService>>()
            .await;
        let reporter = health_reporter.clone();
        let stopping = stop_rx.clone();
        background.push(tokio::spawn(async move {
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
        }));
    }
    // Messages up to the largest entry (or 64 MiB) are accepted, so clients that send a
    // big batch as one message work; anything larger is refused by the max entry size.
    let decode_limit = usize::try_from(max_entry_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(1 << 20)
        .max(64 << 20);
    let flight_service = FlightServiceServer::new(service.clone())
        .max_decoding_message_size(decode_limit)
        .max_encoding_message_size(decode_limit);
    // Forwarded DoGets are relayed at the HTTP/2 level, without re-encoding.
    let flight_service = IntakeLayer::new(flight_service, Arc::clone(&store));
    let flight_service = DoGetRelay::new(flight_service, relay_node);
    // Request bodies of every method but DoPut are small; bounded before they are read.
    let flight_service = RequestLimitLayer::new(flight_service);
    // Outermost: no call reaches the relay, the intake or the service unauthenticated.
    let flight_service = AuthLayer::new(flight_service, auth, Arc::clone(&metrics));

    let mut flight_stop = stop_rx.clone();
    let mut grace_stop = stop_rx.clone();
    let connections_refused = metrics.connections_refused.clone();
    let handshake_failures = metrics.tls_handshake_failures.clone();
    let acceptor = tls.as_ref().map(|tls| tls.acceptor.clone());
    let flight = tokio::spawn(async move {
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
        let incoming = BoundedIncoming::new(
            flight_listener,
            max_connections,
            TCP_KEEPALIVE,
            connections_refused,
        );
        // Larger HTTP/2 windows and frames let a multi-megabyte put arrive without a
        // window-update round trip every 64 KiB. A stream's window is one frame: the
        // bytes HTTP/2 buffers ahead of a put that is busy with its last message are at
        // most what the intake reservation allows for in transit (`wire::intake`), so
        // the budget covers them; a 4 MiB window let up to 4 MiB per put sit there
        // uncounted (the put storm's RSS went above budget + base). The stream cap bounds what one
        // connection can hold open (one connection opening 100,000 streams used to cost
        // ~437 MiB); keepalive pings find dead peers; the header list bound keeps a
        // request's metadata small.
        let router = tonic::transport::Server::builder()
            .timeout(max_call_duration)
            .initial_stream_window_size(crate::wire::intake::MAX_INCOMING_FRAME_BYTES as u32)
            .initial_connection_window_size(8 << 20)
            .max_frame_size(crate::wire::intake::MAX_INCOMING_FRAME_BYTES as u32)
            .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS))
            .http2_keepalive_interval(Some(http2_keepalive_interval))
            .http2_keepalive_timeout(Some(http2_keepalive_timeout))
            .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
            .add_service(health_service)
            .add_service(flight_service);
        let serve: Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>> =
            match acceptor {
                Some(acceptor) => Box::pin(router.serve_with_incoming_shutdown(
                    tls::tls_incoming(incoming, acceptor, handshake_failures),
                    shutdown_requested,
                )),
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
    });

    background.push(tokio::spawn(serve_metrics(
        metrics_listener,
        Arc::clone(&metrics),
        ready_rx,
        stop_rx.clone(),
    )));
    background.push(tokio::spawn(sweep_expired(Arc::clone(&store))));
    background.push(tokio::spawn(crate::allocator::hold_kept_bytes(Arc::clone(
        &store,
    ))));
    if let Some(ServedTls {
        files,
        cert,
        clients,
        seen,
        ca,
        ..
    }) = tls
    {
        let ca_peers = peers_for_tls.clone();
        let cert_peers = peers_for_tls.clone();
        background.push(tokio::spawn(tls::watch_files(
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
        )));
    }
    if let Some(path) = config_file {
        // Read the baseline now, not in the task, so a change made right after start is
        // not mistaken for the baseline.
        let baseline = tokio::fs::read(&path).await.ok();
        background.push(tokio::spawn(watch_config_file(
            path,
            baseline,
            Arc::clone(&store),
            Arc::clone(&live),
            Arc::clone(&routing),
        )));
    }
    tracing::info!(%flight_addr, %metrics_addr, generation, "flightcache node serving");
    Ok(RunningNode {
        flight_addr,
        metrics_addr,
        store,
        disk,
        service: exit_service,
        exit_handoff_budget,
        stop,
        flight,
        background,
    })
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

async fn serve_metrics(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
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
    let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
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
