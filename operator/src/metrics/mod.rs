//! The operator's own Prometheus metrics and its health endpoints.
//!
//! `flightcache_operator_reconciles_total`, `..._reconcile_errors_total{category}`,
//! `..._reconcile_duration_seconds`, `..._leader` (1 while this replica leads),
//! `..._node_call_failures_total{action}`, `..._invalidations_total{phase}` (finished
//! CacheInvalidations), and the per-pool series of [`pools`].
//! Served with `/healthz` and `/readyz` on the metrics address.
//!
//! Owns: the registry, the operator's families and the server of `/metrics`, `/healthz`
//! and `/readyz`. Must not import the reconcile steps (`pools` reads the `plan` and
//! `validate` types).

mod pools;

pub(crate) use pools::{PoolFigures, PoolLabels};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::http::StatusCode;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;

/// Labels of the error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    category: &'static str,
}

/// Labels of the finished-invalidation counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

/// Labels of the node call failure counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: &'static str,
}

/// The operator's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Counter,
    errors: Family<ErrorLabels, Counter>,
    duration: Histogram,
    leader: Gauge,
    node_call_failures: Family<ActionLabels, Counter>,
    invalidations: Family<PhaseLabels, Counter>,
    /// Per-pool series.
    pub(crate) pools: pools::PoolMetrics,
    /// True once the controller runs (for `/readyz`).
    pub ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("flightcache_operator");
        let reconciles = Counter::default();
        registry.register("reconciles", "Reconcile passes", reconciles.clone());
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Failed reconcile passes, by error category",
            errors.clone(),
        );
        let duration = Histogram::new([
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ]);
        registry.register_with_unit(
            "reconcile_duration",
            "Reconcile duration",
            Unit::Seconds,
            duration.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        let node_call_failures = Family::<ActionLabels, Counter>::default();
        registry.register(
            "node_call_failures",
            "Failed calls to cache nodes (ring and config pushes, rebalances), by action",
            node_call_failures.clone(),
        );
        let invalidations = Family::<PhaseLabels, Counter>::default();
        registry.register(
            "invalidations",
            "CacheInvalidations that finished, by phase (Complete, Failed)",
            invalidations.clone(),
        );
        let pools = pools::PoolMetrics::register(&mut registry);
        Self {
            registry,
            reconciles,
            errors,
            duration,
            leader,
            node_call_failures,
            invalidations,
            pools,
            ready: AtomicBool::new(false),
        }
    }
}

impl Metrics {
    /// Starts timing a reconcile; the guard records on drop.
    pub fn reconcile_started(self: &Arc<Self>) -> ReconcileTimer {
        self.reconciles.inc();
        ReconcileTimer {
            metrics: Arc::clone(self),
            started: Instant::now(),
        }
    }

    /// Counts a failed reconcile.
    pub fn reconcile_failed(&self, category: &'static str) {
        self.errors.get_or_create(&ErrorLabels { category }).inc();
    }

    /// Counts a failed call to a node.
    pub fn node_call_failed(&self, action: crds::admin::AdminAction) {
        self.node_call_failures
            .get_or_create(&ActionLabels {
                action: action.as_str(),
            })
            .inc();
    }

    /// Counts a CacheInvalidation that finished (`Complete` or `Failed`).
    pub fn invalidation_finished(&self, phase: &'static str) {
        self.invalidations
            .get_or_create(&PhaseLabels { phase })
            .inc();
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out = "# metrics encoding failed\n".into();
        }
        out
    }
}

/// Records a reconcile's duration when dropped (early returns included).
#[derive(Debug)]
pub struct ReconcileTimer {
    metrics: Arc<Metrics>,
    started: Instant,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.metrics
            .duration
            .observe(self.started.elapsed().as_secs_f64());
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` until the process ends.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let scrape = Arc::clone(&metrics);
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = Arc::clone(&scrape);
                async move { metrics.encode() }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let metrics = Arc::clone(&metrics);
                async move {
                    if metrics.ready.load(Ordering::Relaxed) {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "starting")
                    }
                }
            }),
        );
    axum::serve(listener, app).await
}
