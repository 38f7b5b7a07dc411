//! The scrape-time collector of the node's metrics: the store's counters and gauges,
//! the live config's generation, the ring version, the process's RSS
//! (`/proc/self/status`) and the container's cgroup memory limit (`crate::cgroup`),
//! read when Prometheus scrapes, not recorded on any hot path.
//!
//! Owns: the series read at scrape time, through the public getters of the store, the
//! routing table, the live config and `cgroup`. Sits high: it reads the parts, and
//! nothing but `server.rs` (which hands it to [`super::Metrics::new`]) imports it. The
//! instruments the hot paths bump are in the parent module, `metrics`, which sits low.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use crate::live::LiveConfig;
use crate::routing::members::RoutingTable;
use crate::store::{RemovalCause, Store};

/// Reads the store's statistics, the live config's generation and the ring version at
/// scrape time; given to [`Metrics::new`](super::Metrics::new).
#[derive(Debug)]
pub struct StoreCollector {
    routing: Arc<RoutingTable>,
    store: Arc<Store>,
    live: Arc<LiveConfig>,
}

impl StoreCollector {
    /// A collector reading `store`, `live` and `routing` at each scrape.
    pub fn new(store: Arc<Store>, live: Arc<LiveConfig>, routing: Arc<RoutingTable>) -> Self {
        Self {
            routing,
            store,
            live,
        }
    }
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
            "memory_allocator_cache",
            "Freed memory the allocator keeps resident for reuse; room for puts counts it",
            Some(&Unit::Bytes),
            stats.allocator_bytes,
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
        if let Some(rss) = resident_memory_bytes() {
            gauge(
                &mut encoder,
                "process_resident_memory",
                "Resident memory (RSS) of the node process",
                Some(&Unit::Bytes),
                rss,
            )?;
        }
        if let Some(limit) = crate::cgroup::memory_limit_bytes() {
            gauge(
                &mut encoder,
                "memory_limit",
                "The container's cgroup memory limit (absent without a limit)",
                Some(&Unit::Bytes),
                limit,
            )?;
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

/// The process's resident set size, from `VmRSS` in `/proc/self/status` (kB there, so
/// no page size is needed); `None` where it cannot be read (not Linux).
fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
