//! The node's Prometheus registry and its instruments: per-RPC counts and latencies,
//! the peer, rebalance, TLS and disk-tier counters the hot paths bump.
//!
//! Names follow Prometheus conventions with the `flightcache_node_` prefix; labels are
//! bounded (method, gRPC code, cause, result), never keys. The registry is built here
//! and passed in; there are no global statics. `/metrics` is served by `server.rs`.
//! What is read at scrape time (the store's statistics, the config generation, the
//! ring version, RSS, the cgroup limit) is the [`collector`]'s, registered here as the
//! collector `server.rs` hands to [`Metrics::new`].
//!
//! Owns: the node's metric families and instruments. Sits low, imported by whoever
//! records: imports nothing of the crate (its child [`collector`] sits high).

pub mod collector;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use tonic::Code;

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

/// Labels of `grpc_server_retried_calls_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RetriedLabels {
    grpc_method: &'static str,
    client: &'static str,
}

/// Labels of `doget_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// Labels of `forwarded_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ForwardedLabels {
    peer: String,
    grpc_method: &'static str,
}

/// Labels of `peer_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerErrorLabels {
    peer: String,
    reason: &'static str,
}

/// Labels of `rebalances_total` and `build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

/// Labels of `rebalances_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// Labels of `invalidations_total` and `invalidated_entries_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// What an invalidation named (`invalidations_total{kind}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidationKind {
    /// `invalidate`: one key.
    Key,
    /// `invalidate-prefix`.
    Prefix,
    /// `invalidate-tag`.
    Tag,
    /// `clear`.
    Clear,
    /// `invalidate-local`: a `CacheInvalidation` the operator runs on every node (each
    /// node counts its own call and what it removed).
    Resource,
}

impl InvalidationKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Key => "key",
            Self::Prefix => "prefix",
            Self::Tag => "tag",
            Self::Clear => "clear",
            Self::Resource => "resource",
        }
    }
}

/// Why a call to a peer failed (`peer_errors_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerError {
    /// No connection (connect failure, bad address, connection lost before an answer).
    Unreachable,
    /// No answer within the call deadline.
    Timeout,
    /// The peer's answer stream broke off midway.
    Broken,
    /// The peer answered UNAVAILABLE (draining, ring disagreement).
    Refused,
}

impl PeerError {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unreachable => "unreachable",
            Self::Timeout => "timeout",
            Self::Broken => "broken",
            Self::Refused => "refused",
        }
    }
}

/// How a DoGet on this node ended (`doget_seconds{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoGetOutcome {
    /// Served from this node's store.
    LocalHit,
    /// Relayed from the owner (or second copy), which had the entry.
    ForwardedHit,
    /// NOT_FOUND, here or from the owner through a relay.
    Miss,
    /// Any other status.
    Error,
}

impl DoGetOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LocalHit => "local_hit",
            Self::ForwardedHit => "forwarded_hit",
            Self::Miss => "miss",
            Self::Error => "error",
        }
    }
}

/// The buckets of every latency histogram (seconds).
const LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// The node's metrics registry and the RPC instruments.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    handled: Family<HandledLabels, Counter>,
    handling_seconds: Family<MethodLabels, Histogram>,
    retried_calls: Family<RetriedLabels, Counter>,
    doget_seconds: Family<OutcomeLabels, Histogram>,
    forwarded: Family<ForwardedLabels, Counter>,
    peer_errors: Family<PeerErrorLabels, Counter>,
    rebalances: Family<ResultLabels, Counter>,
    invalidations: Family<KindLabels, Counter>,
    invalidated_entries: Family<KindLabels, Counter>,
    /// 1 while this node runs a `rebalance`, else 0.
    pub rebalance_in_progress: Gauge,
    /// Entries the running `rebalance` still has to hand over.
    pub rebalance_pending_entries: Gauge,
    /// Replica writes (to a key's second choice) that failed; the write still succeeded
    /// on the owner.
    pub replica_write_failures: Counter,
    /// Reads answered as a miss because no copy of the key could be reached.
    pub unreachable_misses: Counter,
    /// Reads missed by the key's holders under the current ring and answered by a
    /// previous holder during a ring change (copy-then-switch).
    pub previous_holder_hits: Counter,
    /// Copies this node sent to an owner that missed a key it read here (read repair).
    pub repairs: Counter,
    /// Puts whose owner could not be reached, stored on the key's next candidate.
    pub fallback_writes: Counter,
    /// Coalescing DoGet misses answered with the entry another caller's put stored
    /// while they waited.
    pub coalesced_reads: Counter,
    /// Connections closed on accept because `max_connections` were open.
    pub connections_refused: Counter,
    /// Metrics-port connections closed on accept because its limit were open.
    pub metrics_connections_refused: Counter,
    /// Connections closed on accept because their client address had its share open.
    pub connections_refused_per_source: Counter,
    /// Connections closed because they carried no authenticated call within their limit.
    pub unauthenticated_connections_closed: Counter,
    /// Local-hit and listing answers whose reader took nothing for `--max-read-stall`:
    /// what was left of them was let go.
    pub stalled_reads: Counter,
    /// TLS handshakes that failed or timed out.
    pub tls_handshake_failures: Counter,
    /// Certificate or CA files re-read and applied.
    pub tls_reloads: Counter,
    /// Certificate or CA files that changed but could not be used.
    pub tls_reload_failures: Counter,
    /// Client token files re-read and put in use (a rotation).
    pub token_reloads: Counter,
    /// Client token files that changed but could not be used.
    pub token_reload_failures: Counter,
    /// Entries handed to their owners by `rebalance` and removed here.
    pub migrated_out_entries: Counter,
    /// Bytes (entry weights) handed out by `rebalance`.
    pub migrated_out_bytes: Counter,
    /// Entries received from another node's `rebalance`.
    pub migrated_in_entries: Counter,
    /// Bytes (entry weights) received from another node's `rebalance`.
    pub migrated_in_bytes: Counter,
    /// Handovers refused because the sender routed by an older ring than this node.
    pub outdated_handoffs_refused: Counter,
    /// The disk tier's instruments (zero without `--data-dir`).
    pub disk: DiskMetrics,
}

impl Metrics {
    /// Builds the registry with the instruments and `scrape`, the collector of what is
    /// read at scrape time ([`collector::StoreCollector`]).
    pub fn new(scrape: Box<dyn Collector>) -> Self {
        let mut registry = Registry::with_prefix("flightcache_node");
        let handled = Family::<HandledLabels, Counter>::default();
        registry.register(
            "grpc_server_handled",
            "Flight RPCs completed, by method and gRPC status code",
            handled.clone(),
        );
        let handling_seconds = Family::<MethodLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(LATENCY_BUCKETS)
        });
        registry.register_with_unit(
            "grpc_server_handling",
            "Flight RPC latency from request to the end of the response stream",
            Unit::Seconds,
            handling_seconds.clone(),
        );
        let retried_calls = Family::<RetriedLabels, Counter>::default();
        registry.register(
            "grpc_server_retried_calls",
            "Flight RPCs that arrived as a client's retry of an earlier try (they carry \
             grpc-previous-rpc-attempts, gRFC A6), by method and client library (from its \
             user-agent: grpc-core, grpc-java, grpc-go, tonic, other)",
            retried_calls.clone(),
        );
        let doget_seconds = Family::<OutcomeLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(LATENCY_BUCKETS)
        });
        registry.register_with_unit(
            "doget",
            "DoGet latency on the node the client called, by outcome (local_hit, \
             forwarded_hit, miss, error)",
            Unit::Seconds,
            doget_seconds.clone(),
        );
        let forwarded = Family::<ForwardedLabels, Counter>::default();
        registry.register(
            "forwarded",
            "Calls this node relayed to a peer, by peer and method",
            forwarded.clone(),
        );
        let peer_errors = Family::<PeerErrorLabels, Counter>::default();
        registry.register(
            "peer_errors",
            "Failed calls to a peer, by peer and reason (unreachable, timeout, broken, refused)",
            peer_errors.clone(),
        );
        let invalidations = Family::<KindLabels, Counter>::default();
        registry.register(
            "invalidations",
            "Invalidations clients asked of this node (not the fan-out calls it made or got), \
             by kind (key, prefix, tag, clear)",
            invalidations.clone(),
        );
        let invalidated_entries = Family::<KindLabels, Counter>::default();
        registry.register(
            "invalidated_entries",
            "Entries those invalidations removed on every member of the pool, copies \
             included, by kind",
            invalidated_entries.clone(),
        );
        let rebalances = Family::<ResultLabels, Counter>::default();
        registry.register(
            "rebalances",
            "Rebalances this node ran, by result (ok, failed)",
            rebalances.clone(),
        );
        let rebalance_in_progress = Gauge::default();
        registry.register(
            "rebalance_in_progress",
            "1 while this node runs a rebalance",
            rebalance_in_progress.clone(),
        );
        let rebalance_pending_entries = Gauge::default();
        registry.register(
            "rebalance_pending_entries",
            "Entries the running rebalance still has to hand over",
            rebalance_pending_entries.clone(),
        );
        let build_info = Family::<VersionLabels, Gauge>::default();
        build_info
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register("build_info", "The node's version; always 1", build_info);
        registry.register_collector(scrape);
        let replica_write_failures = Counter::default();
        registry.register(
            "replica_write_failures",
            "Writes whose copy to the key's second choice failed (stored on the owner only)",
            replica_write_failures.clone(),
        );
        let unreachable_misses = Counter::default();
        registry.register(
            "unreachable_misses",
            "Reads answered as a miss (NOT_FOUND) because no copy of the key could be reached",
            unreachable_misses.clone(),
        );
        let previous_holder_hits = Counter::default();
        registry.register(
            "previous_holder_hits",
            "Reads the key's current holders missed, answered by its holder under the previous ring during a move",
            previous_holder_hits.clone(),
        );
        let repairs = Counter::default();
        registry.register(
            "read_repairs",
            "Copies sent to one of a key's owners that missed it and read it from this node (read repair)",
            repairs.clone(),
        );
        let fallback_writes = Counter::default();
        registry.register(
            "fallback_writes",
            "Puts whose owner could not be reached, stored on the key's next ring candidate instead",
            fallback_writes.clone(),
        );
        let coalesced_reads = Counter::default();
        registry.register(
            "coalesced_reads",
            "Coalescing DoGet misses answered with the entry the fill-lease holder's put stored while they waited",
            coalesced_reads.clone(),
        );
        let connections_refused = Counter::default();
        registry.register(
            "connections_refused",
            "Flight connections closed on accept because the node's connection limit was reached",
            connections_refused.clone(),
        );
        let connections_refused_per_source = Counter::default();
        registry.register(
            "connections_refused_per_source",
            "Flight connections closed on accept because their client address already had its share of the connection limit open",
            connections_refused_per_source.clone(),
        );
        let unauthenticated_connections_closed = Counter::default();
        registry.register(
            "unauthenticated_connections_closed",
            "Flight connections closed because they carried no authenticated call within 20 s of their acceptance",
            unauthenticated_connections_closed.clone(),
        );
        let metrics_connections_refused = Counter::default();
        registry.register(
            "metrics_connections_refused",
            "Metrics-port connections closed on accept because its connection limit was reached",
            metrics_connections_refused.clone(),
        );
        let stalled_reads = Counter::default();
        registry.register(
            "stalled_reads",
            "DoGet and ListFlights answers whose reader took nothing for --max-read-stall; the node let go of their bytes",
            stalled_reads.clone(),
        );
        let tls_handshake_failures = Counter::default();
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes on the Flight port that failed or timed out",
            tls_handshake_failures.clone(),
        );
        let tls_reloads = Counter::default();
        registry.register(
            "tls_reloads",
            "Rotated TLS certificates or CAs read from their files and put in use",
            tls_reloads.clone(),
        );
        let tls_reload_failures = Counter::default();
        registry.register(
            "tls_reload_failures",
            "Changed TLS files that could not be used (the previous certificate stays in use)",
            tls_reload_failures.clone(),
        );
        let token_reloads = Counter::default();
        registry.register(
            "token_reloads",
            "Rotated client token files read and put in use",
            token_reloads.clone(),
        );
        let token_reload_failures = Counter::default();
        registry.register(
            "token_reload_failures",
            "Changed client token files that could not be used (the previous tokens stay in use)",
            token_reload_failures.clone(),
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
        let outdated_handoffs_refused = Counter::default();
        registry.register(
            "outdated_handoffs_refused",
            "Handovers (rebalance, exit handoff) refused because the sender routed by an older ring than this node",
            outdated_handoffs_refused.clone(),
        );
        let disk = DiskMetrics::default();
        register_disk(&mut registry, &disk);
        Self {
            registry,
            disk,
            handled,
            handling_seconds,
            retried_calls,
            doget_seconds,
            forwarded,
            peer_errors,
            rebalances,
            invalidations,
            invalidated_entries,
            rebalance_in_progress,
            rebalance_pending_entries,
            replica_write_failures,
            unreachable_misses,
            previous_holder_hits,
            repairs,
            fallback_writes,
            coalesced_reads,
            connections_refused,
            metrics_connections_refused,
            connections_refused_per_source,
            unauthenticated_connections_closed,
            stalled_reads,
            tls_handshake_failures,
            tls_reloads,
            tls_reload_failures,
            token_reloads,
            token_reload_failures,
            migrated_out_entries,
            migrated_out_bytes,
            migrated_in_entries,
            migrated_in_bytes,
            outdated_handoffs_refused,
        }
    }

    /// Starts timing one RPC; call [`RpcTimer::finish`] with its outcome.
    pub fn rpc(self: &Arc<Self>, method: &'static str) -> RpcTimer {
        RpcTimer {
            metrics: Arc::clone(self),
            method,
            started: Instant::now(),
            finished: false,
            forwarded: false,
        }
    }

    /// Counts a `method` call that a client sent again after an earlier try; `client` is
    /// its library ([`client_library`]).
    pub fn retried_call(&self, method: &'static str, client: &'static str) {
        self.retried_calls
            .get_or_create(&RetriedLabels {
                grpc_method: method,
                client,
            })
            .inc();
    }

    /// Counts a `method` call relayed to `peer` (a member id).
    pub fn forwarded(&self, peer: &str, method: &'static str) {
        self.forwarded
            .get_or_create(&ForwardedLabels {
                peer: peer.to_owned(),
                grpc_method: method,
            })
            .inc();
    }

    /// Counts a failed call to `peer` (a member id).
    pub fn peer_error(&self, peer: &str, reason: PeerError) {
        self.peer_errors
            .get_or_create(&PeerErrorLabels {
                peer: peer.to_owned(),
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Counts an invalidation a client asked of this node and the entries it removed
    /// across the pool.
    pub fn invalidated(&self, kind: InvalidationKind, removed: u64) {
        let labels = KindLabels {
            kind: kind.as_str(),
        };
        self.invalidations.get_or_create(&labels).inc();
        self.invalidated_entries
            .get_or_create(&labels)
            .inc_by(removed);
    }

    /// Counts a finished rebalance.
    pub fn rebalance_finished(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.rebalances
            .get_or_create(&ResultLabels { result })
            .inc();
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
    forwarded: bool,
}

impl RpcTimer {
    /// Records the RPC with `code`.
    pub fn finish(mut self, code: Code) {
        self.record(code);
    }

    /// Marks the answer as relayed from a peer (a DoGet's `forwarded_hit` when OK).
    pub fn set_forwarded(&mut self) {
        self.forwarded = true;
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
        let elapsed = self.started.elapsed().as_secs_f64();
        self.metrics
            .handling_seconds
            .get_or_create(&MethodLabels {
                grpc_method: self.method,
            })
            .observe(elapsed);
        if self.method == "DoGet" {
            let outcome = match code {
                Code::Ok if self.forwarded => DoGetOutcome::ForwardedHit,
                Code::Ok => DoGetOutcome::LocalHit,
                Code::NotFound => DoGetOutcome::Miss,
                _ => DoGetOutcome::Error,
            };
            self.metrics
                .doget_seconds
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.as_str(),
                })
                .observe(elapsed);
        }
    }
}

impl Drop for RpcTimer {
    fn drop(&mut self) {
        self.record(Code::Cancelled);
    }
}

/// The gRPC library a call's `user-agent` names, as a bounded label: `grpc-core` (C++,
/// Python, Ruby, C# over C-core: pyarrow), `grpc-java`, `grpc-go`, `tonic`, or `other`.
pub fn client_library(user_agent: Option<&str>) -> &'static str {
    let agent = user_agent.unwrap_or_default();
    // gRPC-core's wrapped languages put their own name first (`grpc-python/1.60 grpc-c/…`).
    if agent.contains("grpc-c/") || agent.starts_with("grpc-c++/") {
        "grpc-core"
    } else if agent.contains("grpc-java") {
        "grpc-java"
    } else if agent.contains("grpc-go/") {
        "grpc-go"
    } else if agent.starts_with("tonic/") {
        "tonic"
    } else {
        "other"
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

/// Labels of `disk_reload_entries_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// loaded, expired, corrupt, over_budget, superseded.
    pub outcome: &'static str,
}

/// The disk tier's instruments (`persist`; zero without persistence).
#[derive(Debug, Clone, Default)]
pub struct DiskMetrics {
    /// Entry files written.
    pub writes: Counter,
    /// Bytes of entry files written.
    pub written_bytes: Counter,
    /// Entry files removed because their entry left memory.
    pub removes: Counter,
    /// Access times updated on hits.
    pub touches: Counter,
    /// Disk operations that failed (the entry stays in memory; its file is gone or old
    /// and is reconciled by the sweep).
    pub errors: Counter,
    /// Operations dropped because the queue was full.
    pub dropped: Counter,
    /// Keys with a pending disk operation (the write-behind backlog).
    pub backlog: Gauge,
    /// Files removed by sweeps (entries no longer in memory, crashed temporary files).
    pub swept: Counter,
    /// Files seen by the reload, by outcome.
    pub reload_entries: Family<ReloadLabels, Counter>,
    /// Bytes of entry files loaded by the reload.
    pub reload_bytes: Counter,
    /// How long the last reload took (0 until it ends).
    pub reload_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
}

/// Registers the disk tier's series (`flightcache_node_disk_*`).
fn register_disk(registry: &mut Registry, disk: &DiskMetrics) {
    registry.register(
        "disk_writes",
        "Entry files written to the disk tier (temporary file, fsync, rename)",
        disk.writes.clone(),
    );
    registry.register_with_unit(
        "disk_written",
        "Bytes of entry files written to the disk tier",
        Unit::Bytes,
        disk.written_bytes.clone(),
    );
    registry.register(
        "disk_removes",
        "Entry files removed because their entry left memory (invalidate, replace, eviction, expiry, clear, migration)",
        disk.removes.clone(),
    );
    registry.register(
        "disk_touches",
        "Access times (file mtimes) updated by hits, at most once per entry per --disk-read-debounce",
        disk.touches.clone(),
    );
    registry.register(
        "disk_errors",
        "Disk tier operations that failed (the entry stays in memory; the sweep reconciles its file)",
        disk.errors.clone(),
    );
    registry.register(
        "disk_dropped_operations",
        "Disk tier operations dropped because the write-behind queue was full",
        disk.dropped.clone(),
    );
    registry.register(
        "disk_backlog_keys",
        "Keys with a disk operation not yet done (the write-behind backlog)",
        disk.backlog.clone(),
    );
    registry.register(
        "disk_swept_files",
        "Files removed by the disk tier's sweep (entries no longer held, crashed temporary files)",
        disk.swept.clone(),
    );
    registry.register(
        "disk_reload_entries",
        "Entry files seen by the reload at start, by outcome (loaded, expired, corrupt, over_budget, superseded)",
        disk.reload_entries.clone(),
    );
    registry.register_with_unit(
        "disk_reload",
        "Bytes of entry files loaded into memory by the reload at start",
        Unit::Bytes,
        disk.reload_bytes.clone(),
    );
    registry.register_with_unit(
        "disk_reload_duration",
        "How long the reload from the disk tier took at start (0 until it ends)",
        Unit::Seconds,
        disk.reload_seconds.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_library_is_named_from_its_user_agent_within_a_bounded_set() {
        for (agent, library) in [
            (
                Some("grpc-c++/1.73.1 grpc-c/50.0.0 (linux; chttp2)"),
                "grpc-core",
            ),
            (
                Some("grpc-python/1.60.0 grpc-c/37.0.0 (linux; chttp2)"),
                "grpc-core",
            ),
            (Some("grpc-java-netty/1.68.1"), "grpc-java"),
            (Some("grpc-go/1.70.0"), "grpc-go"),
            (Some("tonic/0.14.2"), "tonic"),
            (Some("curl/8.5.0"), "other"),
            (None, "other"),
        ] {
            assert_eq!(client_library(agent), library, "{agent:?}");
        }
    }
}
