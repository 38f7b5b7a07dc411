//! Prometheus metrics of the node: per-RPC counts and latencies, plus the store's
//! counters and gauges read at scrape time.
//!
//! Names follow Prometheus conventions with the `flightcache_node_` prefix; labels are
//! bounded (method, gRPC code, cause, result), never keys. The registry is built here
//! and passed in; there are no global statics. `/metrics` is served by `server.rs`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use tonic::Code;

use crate::live::LiveConfig;
use crate::routing::members::RoutingTable;
use crate::store::{RemovalCause, Store};

/// Labels of `grpc_server_handled_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandledLabels {
    grpc_method: &'static str,
    grpc_code: &'static str,
}

/// Labels of `grpc_server_handling_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    grpc_method: &'static str,
}

/// The node's metrics registry and the RPC instruments.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    handled: Family<HandledLabels, Counter>,
    handling_seconds: Family<MethodLabels, Histogram>,
    /// Replica writes (to a key's second choice) that failed; the write still succeeded
    /// on the owner.
    pub replica_write_failures: Counter,
    /// Entries handed to their owners by `rebalance` and removed here.
    pub migrated_out_entries: Counter,
    /// Bytes (entry weights) handed out by `rebalance`.
    pub migrated_out_bytes: Counter,
    /// Entries received from another node's `rebalance`.
    pub migrated_in_entries: Counter,
    /// Bytes (entry weights) received from another node's `rebalance`.
    pub migrated_in_bytes: Counter,
}

impl Metrics {
    /// Builds the registry with the RPC instruments and the store collector.
    pub fn new(store: Arc<Store>, live: Arc<LiveConfig>, routing: Arc<RoutingTable>) -> Self {
        let mut registry = Registry::with_prefix("flightcache_node");
        let handled = Family::<HandledLabels, Counter>::default();
        registry.register(
            "grpc_server_handled",
            "Flight RPCs completed, by method and gRPC status code",
            handled.clone(),
        );
        let handling_seconds = Family::<MethodLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0,
            ])
        });
        registry.register_with_unit(
            "grpc_server_handling",
            "Flight RPC latency from request to the end of the response stream",
            Unit::Seconds,
            handling_seconds.clone(),
        );
        registry.register_collector(Box::new(StoreCollector {
            store,
            live,
            routing,
        }));
        let replica_write_failures = Counter::default();
        registry.register(
            "replica_write_failures",
            "Writes whose copy to the key's second choice failed (stored on the owner only)",
            replica_write_failures.clone(),
        );
        let migrated_out_entries = Counter::default();
        registry.register(
            "migrated_out_entries",
            "Entries handed to their owners by rebalance and removed here",
            migrated_out_entries.clone(),
        );
        let migrated_out_bytes = Counter::default();
        registry.register_with_unit(
            "migrated_out",
            "Entry bytes handed to their owners by rebalance",
            Unit::Bytes,
            migrated_out_bytes.clone(),
        );
        let migrated_in_entries = Counter::default();
        registry.register(
            "migrated_in_entries",
            "Entries received from another node's rebalance",
            migrated_in_entries.clone(),
        );
        let migrated_in_bytes = Counter::default();
        registry.register_with_unit(
            "migrated_in",
            "Entry bytes received from another node's rebalance",
            Unit::Bytes,
            migrated_in_bytes.clone(),
        );
        Self {
            registry,
            handled,
            handling_seconds,
            replica_write_failures,
            migrated_out_entries,
            migrated_out_bytes,
            migrated_in_entries,
            migrated_in_bytes,
        }
    }

    /// Starts timing one RPC; call [`RpcTimer::finish`] with its outcome.
    pub fn rpc(self: &Arc<Self>, method: &'static str) -> RpcTimer {
        RpcTimer {
            metrics: Arc::clone(self),
            method,
            started: Instant::now(),
            finished: false,
        }
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
            let _ = writeln!(out, "# metrics encoding failed");
        }
        out
    }
}

/// Times one RPC; records it with its gRPC code when finished, or as CANCELLED when
/// dropped unfinished (the client went away mid-stream).
#[derive(Debug)]
pub struct RpcTimer {
    metrics: Arc<Metrics>,
    method: &'static str,
    started: Instant,
    finished: bool,
}

impl RpcTimer {
    /// Records the RPC with `code`.
    pub fn finish(mut self, code: Code) {
        self.record(code);
    }

    /// Drops the timer without recording anything (another path records the RPC).
    pub fn discard(mut self) {
        self.finished = true;
    }

    fn record(&mut self, code: Code) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.metrics
            .handled
            .get_or_create(&HandledLabels {
                grpc_method: self.method,
                grpc_code: code_name(code),
            })
            .inc();
        self.metrics
            .handling_seconds
            .get_or_create(&MethodLabels {
                grpc_method: self.method,
            })
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for RpcTimer {
    fn drop(&mut self) {
        self.record(Code::Cancelled);
    }
}

/// The canonical upper-case name of a gRPC code, as grpc-go labels it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// Reads the store's statistics at scrape time.
#[derive(Debug)]
struct StoreCollector {
    routing: Arc<RoutingTable>,
    store: Arc<Store>,
    live: Arc<LiveConfig>,
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: u64,
) -> std::fmt::Result {
    let metric = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
    let metric_encoder = encoder.encode_descriptor(name, help, unit, metric.metric_type())?;
    metric.encode(metric_encoder)
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> std::fmt::Result {
    let metric = ConstCounter::new(value);
    let metric_encoder = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(metric_encoder)
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let stats = self.store.stats();
        gauge(
            &mut encoder,
            "entries",
            "Entries cached now",
            None,
            stats.entries,
        )?;
        gauge(
            &mut encoder,
            "max_entries",
            "Entry cap",
            None,
            stats.max_entries,
        )?;
        gauge(
            &mut encoder,
            "memory_used",
            "Arrow bytes held by cached entries",
            Some(&Unit::Bytes),
            stats.used_bytes,
        )?;
        gauge(
            &mut encoder,
            "memory_reserved",
            "Bytes reserved by puts in flight",
            Some(&Unit::Bytes),
            stats.reserved_bytes,
        )?;
        gauge(
            &mut encoder,
            "memory_budget",
            "Byte budget for cached data",
            Some(&Unit::Bytes),
            stats.budget_bytes,
        )?;
        gauge(
            &mut encoder,
            "config_generation",
            "Configuration generation the node runs",
            None,
            self.live.generation(),
        )?;
        gauge(
            &mut encoder,
            "ring_version",
            "Routing ring version the node routes by (0 without a topology)",
            None,
            self.routing.version(),
        )?;
        counter(&mut encoder, "inserts", "Entries stored", stats.inserts)?;
        counter(
            &mut encoder,
            "puts_rejected",
            "Puts refused (too large, over budget, invalidated)",
            stats.rejected_puts,
        )?;
        {
            let metric_encoder = encoder.encode_descriptor(
                "lookups",
                "Cache lookups by DoGet, by result",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            let mut metric_encoder = metric_encoder;
            for (result, value) in [("hit", stats.hits), ("miss", stats.misses)] {
                let labels = [("result", result)];
                ConstCounter::new(value).encode(metric_encoder.encode_family(&labels)?)?;
            }
        }
        let mut metric_encoder = encoder.encode_descriptor(
            "evictions",
            "Entries removed, by cause (expired, size, explicit, replaced, migrated)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for cause in RemovalCause::ALL {
            let labels = [("cause", cause.as_str())];
            ConstCounter::new(stats.evictions.get(cause))
                .encode(metric_encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
