//! Per-pool series: rollout phase, nodes by state, desired shards, the config generation
//! and ring version the operator wants, and entries moved by the rebalances it ran.
//!
//! Labels `namespace`, `cachecluster`, `pool` (bounded by the pools that exist); the
//! series of a pool or cluster that is gone are removed. No I/O.
//!
//! Owns: the per-pool families and their labels. Reads `plan` and `validate` types; no
//! I/O, no kube.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::plan::{Phase, PoolObservation, PoolPlan};
use crate::validate::{ValidatedCluster, ValidatedPool};

/// One pool of one CacheCluster.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(crate) struct PoolLabels {
    pub(crate) namespace: String,
    pub(crate) cachecluster: String,
    pub(crate) pool: String,
}

impl PoolLabels {
    /// The labels of `pool` in `cluster`.
    pub(crate) fn of(cluster: &ValidatedCluster, pool: &str) -> Self {
        Self {
            namespace: cluster.namespace.clone(),
            cachecluster: cluster.name.clone(),
            pool: pool.to_owned(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    #[prometheus(flatten)]
    pool: PoolLabels,
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    #[prometheus(flatten)]
    pool: PoolLabels,
    state: &'static str,
}

/// The `state` label values of `pool_nodes`.
const NODE_STATES: [&str; 3] = ["ready", "not_ready", "missing"];

/// What one pass found for a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PoolFigures {
    /// The planner's phase name ([`Phase::as_str`]).
    pub(crate) phase: &'static str,
    /// Desired shards.
    pub(crate) shards: i64,
    /// Pods of the pool (ordinal below `shards`) that are Ready.
    pub(crate) ready: i64,
    /// Pods of the pool that exist but are not Ready.
    pub(crate) not_ready: i64,
    /// Desired shards without a pod.
    pub(crate) missing: i64,
    /// The config generation the operator wants nodes to run.
    pub(crate) config_generation: i64,
    /// The ring version it published.
    pub(crate) ring_version: i64,
}

impl PoolFigures {
    /// The figures of `pool` from its plan and observation. Pods past the desired shards
    /// (draining in a scale-in) are not counted, so the node states sum to `shards`.
    pub(crate) fn compute(
        pool: &ValidatedPool,
        generation: i64,
        plan: &PoolPlan,
        observation: &PoolObservation,
    ) -> Self {
        let in_pool = || observation.nodes.iter().filter(|n| n.ordinal < pool.shards);
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let ready = count(in_pool().filter(|n| n.serving()).count());
        let existing = count(in_pool().count());
        let shards = i64::from(pool.shards);
        Self {
            phase: plan.phase.as_str(),
            shards,
            ready,
            not_ready: existing - ready,
            missing: (shards - existing).max(0),
            config_generation: generation,
            ring_version: i64::try_from(plan.layout.topology.version).unwrap_or(i64::MAX),
        }
    }
}

/// The per-pool series.
#[derive(Debug)]
pub(crate) struct PoolMetrics {
    phase: Family<PhaseLabels, Gauge>,
    nodes: Family<StateLabels, Gauge>,
    shards: Family<PoolLabels, Gauge>,
    config_generation: Family<PoolLabels, Gauge>,
    ring_version: Family<PoolLabels, Gauge>,
    rebalanced_entries: Family<PoolLabels, Counter>,
    /// Pools with series, per (namespace, cachecluster).
    known: Mutex<BTreeMap<(String, String), BTreeSet<String>>>,
}

impl PoolMetrics {
    /// Registers the series in `registry` (prefixed by it).
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            phase: Family::default(),
            nodes: Family::default(),
            shards: Family::default(),
            config_generation: Family::default(),
            ring_version: Family::default(),
            rebalanced_entries: Family::default(),
            known: Mutex::new(BTreeMap::new()),
        };
        registry.register(
            "pool_rollout_phase",
            "1 for the pool's current rollout phase, 0 for every other phase",
            metrics.phase.clone(),
        );
        registry.register(
            "pool_nodes",
            "Nodes of the pool by state (ready, not_ready, missing); they sum to the desired shards",
            metrics.nodes.clone(),
        );
        registry.register(
            "pool_shards",
            "Desired shards of the pool",
            metrics.shards.clone(),
        );
        registry.register(
            "pool_config_generation",
            "The config generation the operator wants the pool's nodes to run",
            metrics.config_generation.clone(),
        );
        registry.register(
            "pool_ring_version",
            "The ring version the operator published for the pool",
            metrics.ring_version.clone(),
        );
        registry.register(
            "rebalanced_entries",
            "Entries moved to their owners by the rebalances the operator ran",
            metrics.rebalanced_entries.clone(),
        );
        metrics
    }

    /// Sets the series of `pool` to `figures`.
    pub(crate) fn record(&self, pool: &PoolLabels, figures: &PoolFigures) {
        self.remember(pool);
        for phase in Phase::NAMES {
            let labels = PhaseLabels {
                pool: pool.clone(),
                phase,
            };
            self.phase
                .get_or_create(&labels)
                .set(i64::from(phase == figures.phase));
        }
        for (state, value) in
            NODE_STATES
                .into_iter()
                .zip([figures.ready, figures.not_ready, figures.missing])
        {
            let labels = StateLabels {
                pool: pool.clone(),
                state,
            };
            self.nodes.get_or_create(&labels).set(value);
        }
        self.shards.get_or_create(pool).set(figures.shards);
        self.config_generation
            .get_or_create(pool)
            .set(figures.config_generation);
        self.ring_version
            .get_or_create(pool)
            .set(figures.ring_version);
        // Exported at 0 from the first pass, so rate() sees the first rebalance.
        self.rebalanced_entries.get_or_create(pool).inc_by(0);
    }

    /// Counts entries a rebalance in `pool` moved.
    pub(crate) fn rebalanced(&self, pool: &PoolLabels, entries: u64) {
        self.remember(pool);
        self.rebalanced_entries.get_or_create(pool).inc_by(entries);
    }

    /// Removes the series of the pools of a cluster that are not in `pools`.
    pub(crate) fn retain_pools(
        &self,
        namespace: &str,
        cachecluster: &str,
        pools: &BTreeSet<String>,
    ) {
        let gone: Vec<String> = {
            let mut known = self
                .known
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            let Some(recorded) = known.get_mut(&(namespace.to_owned(), cachecluster.to_owned()))
            else {
                return;
            };
            let gone = recorded.difference(pools).cloned().collect();
            recorded.retain(|pool| pools.contains(pool));
            gone
        };
        for pool in gone {
            self.remove(&PoolLabels {
                namespace: namespace.to_owned(),
                cachecluster: cachecluster.to_owned(),
                pool,
            });
        }
    }

    /// Removes every series of a cluster (it was deleted).
    pub(crate) fn forget_cluster(&self, namespace: &str, cachecluster: &str) {
        self.retain_pools(namespace, cachecluster, &BTreeSet::new());
        let mut known = self
            .known
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        known.remove(&(namespace.to_owned(), cachecluster.to_owned()));
    }

    fn remember(&self, pool: &PoolLabels) {
        let mut known = self
            .known
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        known
            .entry((pool.namespace.clone(), pool.cachecluster.clone()))
            .or_default()
            .insert(pool.pool.clone());
    }

    fn remove(&self, pool: &PoolLabels) {
        for phase in Phase::NAMES {
            self.phase.remove(&PhaseLabels {
                pool: pool.clone(),
                phase,
            });
        }
        for state in NODE_STATES {
            self.nodes.remove(&StateLabels {
                pool: pool.clone(),
                state,
            });
        }
        self.shards.remove(pool);
        self.config_generation.remove(pool);
        self.ring_version.remove(pool);
        self.rebalanced_entries.remove(pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).expect("encodes");
        out
    }

    fn labels(cluster: &str, pool: &str) -> PoolLabels {
        PoolLabels {
            namespace: "shop".into(),
            cachecluster: cluster.into(),
            pool: pool.into(),
        }
    }

    fn figures(phase: &'static str) -> PoolFigures {
        PoolFigures {
            phase,
            shards: 3,
            ready: 1,
            not_ready: 1,
            missing: 1,
            config_generation: 4,
            ring_version: 7,
        }
    }

    #[test]
    fn every_phase_is_exported_and_only_the_current_one_is_1() {
        let mut registry = Registry::with_prefix("flightcache_operator");
        let metrics = PoolMetrics::register(&mut registry);
        metrics.record(&labels("analytics", "hot"), &figures("scaling_in"));
        let text = encode(&registry);
        for phase in Phase::NAMES {
            let value = if phase == "scaling_in" { 1 } else { 0 };
            let line = format!(
                "flightcache_operator_pool_rollout_phase{{namespace=\"shop\",cachecluster=\"analytics\",pool=\"hot\",phase=\"{phase}\"}} {value}"
            );
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
        for line in [
            r#"flightcache_operator_pool_nodes{namespace="shop",cachecluster="analytics",pool="hot",state="ready"} 1"#,
            r#"flightcache_operator_pool_nodes{namespace="shop",cachecluster="analytics",pool="hot",state="not_ready"} 1"#,
            r#"flightcache_operator_pool_nodes{namespace="shop",cachecluster="analytics",pool="hot",state="missing"} 1"#,
            r#"flightcache_operator_pool_shards{namespace="shop",cachecluster="analytics",pool="hot"} 3"#,
            r#"flightcache_operator_pool_config_generation{namespace="shop",cachecluster="analytics",pool="hot"} 4"#,
            r#"flightcache_operator_pool_ring_version{namespace="shop",cachecluster="analytics",pool="hot"} 7"#,
            r#"flightcache_operator_rebalanced_entries_total{namespace="shop",cachecluster="analytics",pool="hot"} 0"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn a_phase_change_moves_the_1() {
        let mut registry = Registry::default();
        let metrics = PoolMetrics::register(&mut registry);
        let hot = labels("analytics", "hot");
        metrics.record(&hot, &figures("configuring"));
        metrics.record(&hot, &figures("settled"));
        let text = encode(&registry);
        assert!(text.contains(r#"phase="settled"} 1"#), "{text}");
        assert!(text.contains(r#"phase="configuring"} 0"#), "{text}");
    }

    #[test]
    fn rebalanced_entries_add_up() {
        let mut registry = Registry::default();
        let metrics = PoolMetrics::register(&mut registry);
        let hot = labels("analytics", "hot");
        metrics.rebalanced(&hot, 120);
        metrics.rebalanced(&hot, 5);
        assert!(encode(&registry).contains(
            r#"rebalanced_entries_total{namespace="shop",cachecluster="analytics",pool="hot"} 125"#
        ));
    }

    #[test]
    fn series_of_a_removed_pool_or_cluster_go_away() {
        let mut registry = Registry::default();
        let metrics = PoolMetrics::register(&mut registry);
        metrics.record(&labels("analytics", "hot"), &figures("settled"));
        metrics.record(&labels("analytics", "cold"), &figures("settled"));
        metrics.record(&labels("reports", "hot"), &figures("settled"));
        metrics.rebalanced(&labels("analytics", "cold"), 3);

        metrics.retain_pools("shop", "analytics", &BTreeSet::from(["hot".to_owned()]));
        let text = encode(&registry);
        assert!(!text.contains(r#"pool="cold""#), "{text}");
        assert!(
            text.contains(r#"cachecluster="analytics",pool="hot""#),
            "{text}"
        );

        metrics.forget_cluster("shop", "analytics");
        let text = encode(&registry);
        assert!(!text.contains(r#"cachecluster="analytics""#), "{text}");
        assert!(
            text.contains(r#"cachecluster="reports",pool="hot""#),
            "{text}"
        );
    }
}
