//! What a pool's nodes hold and serve, for `kubectl get cc` (the Hit-Ratio and Memory
//! columns) and `status.pools[].usage`.
//!
//! Sampled from the `stats` every pass already asks for, but written at most every
//! [`SAMPLE_EVERY_SECONDS`]: the status is written only when it changes, so a sample per
//! pass would write the object on every pass of a busy cluster.
//!
//! Owns: the sampling rule and the column texts. Pure: no kube client, no node calls, no
//! clock (the time is passed in).

use crds::cachecluster::PoolUsage;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::plan::NodeView;

/// The least time between two samples of a pool's usage.
pub const SAMPLE_EVERY_SECONDS: i64 = 30;

/// The pool's usage now: `previous` while it is younger than [`SAMPLE_EVERY_SECONDS`]
/// or while a running node of the pool did not answer (its counters would be missing
/// from the sums, and the next window would count them as new); else a new sample from
/// `nodes`, whose hit ratio covers the lookups since `previous`.
pub fn sample(nodes: &[NodeView], previous: Option<&PoolUsage>, now: &Time) -> Option<PoolUsage> {
    if let Some(previous) = previous {
        let age = now.0.as_second() - previous.sampled_at.0.as_second();
        if (0..SAMPLE_EVERY_SECONDS).contains(&age) {
            return Some(previous.clone());
        }
    }
    let running: Vec<&NodeView> = nodes.iter().filter(|n| n.ip.is_some()).collect();
    if running.is_empty() || running.iter().any(|n| n.report.is_none()) {
        return previous.cloned();
    }
    let reports = running.iter().filter_map(|n| n.report);
    let mut usage = PoolUsage {
        sampled_at: now.clone(),
        entries: 0,
        used_bytes: 0,
        budget_bytes: 0,
        hits: 0,
        misses: 0,
        hit_ratio: None,
        window_hits: 0,
        window_lookups: 0,
    };
    for report in reports {
        usage.entries = usage.entries.saturating_add(report.entries);
        usage.used_bytes = usage.used_bytes.saturating_add(report.used_bytes);
        usage.budget_bytes = usage.budget_bytes.saturating_add(report.budget_bytes);
        usage.hits = usage.hits.saturating_add(report.hits);
        usage.misses = usage.misses.saturating_add(report.misses);
    }
    // The counters grow while the same nodes run; a smaller sum means a node started
    // again (or left), and its lookups since it started are the window then.
    let (hits, misses) = match previous {
        Some(p) if usage.hits >= p.hits && usage.misses >= p.misses => {
            (usage.hits - p.hits, usage.misses - p.misses)
        }
        _ => (usage.hits, usage.misses),
    };
    usage.window_hits = hits;
    usage.window_lookups = hits.saturating_add(misses);
    usage.hit_ratio = Some(ratio_text(hits, usage.window_lookups));
    Some(usage)
}

/// `hits` over `lookups` as a percentage with one decimal (`93.1%`), or `idle`.
pub fn ratio_text(hits: u64, lookups: u64) -> String {
    if lookups == 0 {
        return "idle".into();
    }
    // Per mille, rounded down so that 99.96% is not shown as a perfect 100.0%.
    let per_mille = u128::from(hits) * 1000 / u128::from(lookups);
    format!("{}.{}%", per_mille / 10, per_mille % 10)
}

/// The cluster's Hit-Ratio column: the pools' windows added up (`None` until a pool has
/// a sample).
pub fn cluster_hit_ratio(pools: &[Option<&PoolUsage>]) -> Option<String> {
    let sampled: Vec<&PoolUsage> = pools.iter().flatten().copied().collect();
    if sampled.is_empty() {
        return None;
    }
    let lookups: u64 = sampled.iter().map(|u| u.window_lookups).sum();
    let hits: u64 = sampled.iter().map(|u| u.window_hits).sum();
    Some(ratio_text(hits, lookups))
}

/// The cluster's Memory column: bytes held over the budgets, in binary units
/// (`1.2Gi/3.0Gi`); `None` until a pool has a sample.
pub fn cluster_memory(pools: &[Option<&PoolUsage>]) -> Option<String> {
    let sampled: Vec<&PoolUsage> = pools.iter().flatten().copied().collect();
    if sampled.is_empty() {
        return None;
    }
    let used: u64 = sampled.iter().map(|u| u.used_bytes).sum();
    let budget: u64 = sampled.iter().map(|u| u.budget_bytes).sum();
    Some(format!("{}/{}", binary_size(used), binary_size(budget)))
}

/// `bytes` in the largest binary unit that keeps one digit before the point
/// (`512Ki`, `1.2Gi`, `0` for nothing).
pub fn binary_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["", "Ki", "Mi", "Gi", "Ti", "Pi"];
    let mut unit = 0;
    let mut scaled = bytes as f64;
    while scaled >= 1024.0 && unit + 1 < UNITS.len() {
        scaled /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}")
    } else if scaled >= 100.0 {
        format!("{scaled:.0}{}", UNITS[unit])
    } else {
        format!("{scaled:.1}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::NodeReport;
    use crate::ring::PodZone;
    use crate::rollout::Gate;

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap())
    }

    fn node(ordinal: i32, report: Option<NodeReport>) -> NodeView {
        NodeView {
            name: format!("demo-hot-{ordinal}"),
            ordinal,
            ready: true,
            current_template: true,
            ip: Some(format!("10.0.0.{ordinal}")),
            report,
            ready_seconds: 60,
            unready_seconds: 0,
            memory_limit: None,
            memory_applied: None,
            zone: PodZone::Unknown,
            image: None,
            host: None,
            node_lost_seconds: None,
            gate: Gate::Ungated,
        }
    }

    fn report(hits: u64, misses: u64, used_bytes: u64) -> Option<NodeReport> {
        Some(NodeReport {
            entries: 10,
            used_bytes,
            budget_bytes: 1 << 30,
            hits,
            misses,
            ..NodeReport::default()
        })
    }

    #[test]
    fn the_first_sample_covers_the_lookups_since_the_nodes_started() {
        let nodes = [
            node(0, report(90, 10, 1 << 20)),
            node(1, report(60, 40, 3 << 20)),
        ];
        let usage = sample(&nodes, None, &at(100)).unwrap();
        assert_eq!((usage.hits, usage.misses), (150, 50));
        assert_eq!((usage.window_hits, usage.window_lookups), (150, 200));
        assert_eq!(usage.hit_ratio.as_deref(), Some("75.0%"));
        assert_eq!((usage.entries, usage.used_bytes), (20, 4 << 20));
        assert_eq!(usage.budget_bytes, 2 << 30);
        assert_eq!(usage.sampled_at, at(100));
    }

    #[test]
    fn a_later_sample_covers_only_the_lookups_since_the_previous_one() {
        let first = sample(&[node(0, report(100, 100, 0))], None, &at(100)).unwrap();
        // Held for SAMPLE_EVERY_SECONDS: the same sample, whatever the nodes say now.
        let held = sample(&[node(0, report(190, 110, 0))], Some(&first), &at(129)).unwrap();
        assert_eq!(held, first);
        let next = sample(&[node(0, report(190, 110, 0))], Some(&first), &at(130)).unwrap();
        assert_eq!((next.window_hits, next.window_lookups), (90, 100));
        assert_eq!(next.hit_ratio.as_deref(), Some("90.0%"));
        let idle = sample(&[node(0, report(190, 110, 0))], Some(&next), &at(160)).unwrap();
        assert_eq!(idle.hit_ratio.as_deref(), Some("idle"));
    }

    #[test]
    fn a_restarted_node_starts_the_window_again_instead_of_going_negative() {
        let first = sample(&[node(0, report(1000, 0, 0))], None, &at(0)).unwrap();
        let after = sample(&[node(0, report(3, 1, 0))], Some(&first), &at(60)).unwrap();
        assert_eq!((after.window_hits, after.window_lookups), (3, 4));
        assert_eq!(after.hit_ratio.as_deref(), Some("75.0%"));
    }

    #[test]
    fn a_running_node_without_an_answer_keeps_the_previous_sample() {
        let first = sample(&[node(0, report(5, 5, 0))], None, &at(0)).unwrap();
        let silent = [node(0, report(50, 5, 0)), node(1, None)];
        assert_eq!(sample(&silent, Some(&first), &at(60)), Some(first));
        assert_eq!(sample(&silent, None, &at(60)), None);
        // A pod without an address yet is not running: it is not waited for.
        let mut starting = node(1, None);
        starting.ip = None;
        let sampled = sample(&[node(0, report(50, 5, 0)), starting], None, &at(60));
        assert_eq!(sampled.map(|u| u.window_lookups), Some(55));
    }

    #[test]
    fn the_columns_add_the_pools_up() {
        let a = sample(&[node(0, report(99, 1, 1536 << 20))], None, &at(0)).unwrap();
        let b = sample(&[node(0, report(1, 99, 512 << 20))], None, &at(0)).unwrap();
        let both = [Some(&a), Some(&b), None];
        assert_eq!(cluster_hit_ratio(&both).as_deref(), Some("50.0%"));
        assert_eq!(cluster_memory(&both).as_deref(), Some("2.0Gi/2.0Gi"));
        assert_eq!(cluster_hit_ratio(&[None]), None);
        assert_eq!(cluster_memory(&[]), None);
    }

    #[test]
    fn ratios_round_down_and_sizes_read_as_binary_units() {
        assert_eq!(ratio_text(9_999, 10_000), "99.9%");
        assert_eq!(ratio_text(10, 10), "100.0%");
        assert_eq!(ratio_text(0, 3), "0.0%");
        assert_eq!(ratio_text(u64::MAX, u64::MAX), "100.0%");
        assert_eq!(binary_size(0), "0");
        assert_eq!(binary_size(1023), "1023");
        assert_eq!(binary_size(512 << 10), "512Ki");
        assert_eq!(binary_size(1288 << 20), "1.3Gi");
        assert_eq!(binary_size(3 << 30), "3.0Gi");
    }
}
