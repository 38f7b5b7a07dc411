//! The control plane without a cluster: the pure half of each reconcile pass run against
//! simulated pods and nodes that carry out what the pass decided, pass by pass, on the
//! simulation's own clock.
//!
//! A pass here is what [`crate::controller::reconcile`] computes between its I/O: the
//! pool observations (the template hash, the ring parsed back from the published
//! ConfigMap, the pods and what each Ready node reports), `validate`, `plan` for every
//! pool, the desired objects of `build`, and the status of `status`. The simulated
//! cluster then does what the API server, the StatefulSet controller, the kubelet and
//! the nodes would: it stores the ConfigMaps and the status, creates and deletes pods to
//! match the StatefulSet's replicas (Ready after a [`Startup`] delay), and carries out
//! the node calls (a pushed ring or config is what the node then reports, with how long
//! it has served and when it last rebalanced; a rebalance empties a leaving node; an
//! eviction recreates the pod).
//!
//! `benches/control_plane.rs` times it and the limit tests drive it (issue 15): a
//! `CacheCluster` at the CRD's limits ([`maximal_cluster`]), the bytes of what a pass
//! writes ([`object_bytes`], [`configmap_data_bytes`], [`stored_cluster_bytes`]) and the
//! keys a ring change moves ([`moved_fraction`]).
//!
//! Owns: the simulated cluster. Pure like `plan`: no kube client, tokio, network or
//! file I/O; imports `validate`, `plan`, `ring`, `build` and the pure functions of
//! `status`.

use std::collections::BTreeMap;

use crds::cachecluster::{
    CacheCluster, CacheClusterSpec, CacheClusterStatus, InvalidSpec, PoolSpec,
};
use crds::node_config::{MemberState, NodeDocument, Topology};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::build::{self, DesiredPool, PoolLayout, names};
use crate::plan::{self, NodeReport, NodeView, Phase, PoolObservation, PoolPlan};
use crate::ring;
use crate::status::{self, Outcome};
use crate::validate::{self, Defaults, ValidatedCluster, ValidatedPool};

/// Seconds between two passes while a pool changes: the controller's requeue during a
/// rollout (a pod turning Ready also wakes it; two seconds is the slowest it looks).
pub const PASS_SECONDS: u64 = 2;

/// etcd's default `--max-request-bytes`: the largest object the API server can store.
pub const ETCD_REQUEST_LIMIT_BYTES: usize = 3 << 19;

/// The API server's limit on a ConfigMap's data (keys and values together).
pub const CONFIGMAP_DATA_LIMIT_BYTES: usize = 1 << 20;

/// The simulation's clock at its start (2026-11-26 00:00 UTC), in Unix seconds.
const EPOCH_SECONDS: i64 = 1_795_651_200;

/// Entries a node holds when the simulation starts it.
const ENTRIES: u64 = 1_000;

/// How long a pod takes from its creation to Ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Startup {
    /// Every pod is Ready this many seconds after it is created.
    Fixed(u64),
    /// Pods are Ready between `first` and `first + spread` seconds after they are
    /// created, each at a fixed pseudo-random point of that window (pulls, scheduling,
    /// nodes added by an autoscaler).
    Spread {
        /// The fastest pod's start.
        first: u64,
        /// The window over which the others follow.
        spread: u64,
    },
}

impl Startup {
    fn seconds(self, pool: usize, ordinal: i32) -> u64 {
        match self {
            Self::Fixed(seconds) => seconds,
            Self::Spread { first, spread } => {
                let seed = (pool as u64) << 32 | u64::from(ordinal.unsigned_abs());
                first + splitmix64(seed) % (spread + 1)
            }
        }
    }
}

/// One round of the SplitMix64 generator: a fixed, well-spread function of `x`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One simulated pod and the node in it.
#[derive(Debug, Clone)]
struct SimNode {
    created_at: u64,
    ready_at: u64,
    /// The template hash the pod was created from.
    template: String,
    generation: u64,
    ring_version: u64,
    entries: u64,
    budget_bytes: u64,
    /// When its last whole rebalance began.
    rebalanced_at: Option<u64>,
}

/// One simulated pool: its StatefulSet's replicas, its published ConfigMap, its pods.
#[derive(Debug, Clone, Default)]
struct SimPool {
    replicas: Option<i32>,
    configmap: Option<ConfigMap>,
    nodes: BTreeMap<i32, SimNode>,
}

/// A `CacheCluster` and everything the operator would find in the cluster for it.
#[derive(Debug, Clone)]
pub struct SimCluster {
    cc: CacheCluster,
    defaults: Defaults,
    pools: BTreeMap<String, SimPool>,
    status: Option<CacheClusterStatus>,
    now: u64,
    startup: Startup,
}

impl SimCluster {
    /// `cc` just created: no children yet. New pods are Ready per `startup`.
    ///
    /// # Errors
    /// The spec is invalid.
    pub fn new(
        cc: CacheCluster,
        defaults: Defaults,
        startup: Startup,
    ) -> Result<Self, InvalidSpec> {
        validate::validate(&cc, &defaults)?;
        Ok(Self {
            cc,
            defaults,
            pools: BTreeMap::new(),
            status: None,
            now: 0,
            startup,
        })
    }

    /// `cc` with every pool running and settled: every node Ready for a minute and
    /// routing by the published ring, the status written.
    ///
    /// # Errors
    /// The spec is invalid.
    pub fn running(cc: CacheCluster, defaults: Defaults) -> Result<Self, InvalidSpec> {
        let mut sim = Self::new(cc, defaults, Startup::Fixed(0))?;
        sim.settle(16)?;
        sim.now += 60;
        // The next pass sees the status of the one before (as a watch event would).
        sim.step()?;
        Ok(sim)
    }

    /// Seconds since the simulation started.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// The `CacheCluster` as it is now.
    pub fn cluster(&self) -> &CacheCluster {
        &self.cc
    }

    /// The status last written.
    pub fn status(&self) -> Option<&CacheClusterStatus> {
        self.status.as_ref()
    }

    /// Sets how long pods created from now on take to turn Ready.
    pub fn set_startup(&mut self, startup: Startup) {
        self.startup = startup;
    }

    /// Edits the spec (as `kubectl apply` would): the generation moves on.
    ///
    /// # Errors
    /// The new spec is invalid; nothing changes then.
    pub fn edit(&mut self, edit: impl FnOnce(&mut CacheClusterSpec)) -> Result<(), InvalidSpec> {
        let mut cc = self.cc.clone();
        edit(&mut cc.spec);
        cc.metadata.generation = Some(cc.metadata.generation.unwrap_or(0) + 1);
        validate::validate(&cc, &self.defaults)?;
        self.cc = cc;
        Ok(())
    }

    /// The pure half of one reconcile pass over the cluster as it is now.
    ///
    /// # Errors
    /// The spec is invalid (it cannot be: [`Self::edit`] refuses such a spec).
    pub fn pass(&self) -> Result<Pass, InvalidSpec> {
        let cluster = validate::validate(&self.cc, &self.defaults)?;
        let plans: Vec<(PoolPlan, PoolObservation)> = cluster
            .pools
            .iter()
            .map(|pool| {
                let observation = self.observe(&cluster, pool);
                (plan::plan_pool(&cluster, pool, &observation), observation)
            })
            .collect();
        let layouts: Vec<PoolLayout> = plans.iter().map(|(plan, _)| plan.layout.clone()).collect();
        let desired = build::desired_resources(&cluster, &layouts);
        let mut status = status::compute(
            self.status.as_ref(),
            self.cc.metadata.generation,
            &Outcome::Reconciled {
                pools: status::pool_statuses(&cluster, &plans, self.status.as_ref(), &self.time()),
                phases: plans.iter().map(|(plan, _)| plan.phase.clone()).collect(),
            },
            &self.time(),
        );
        status.client_token_secret = cluster
            .client_token
            .as_ref()
            .map(|token| format!("{}/{}", token.secret, token.key));
        Ok(Pass {
            cluster,
            plans,
            desired,
            status,
        })
    }

    /// One pass, carried out, then [`PASS_SECONDS`] later.
    ///
    /// # Errors
    /// As [`Self::pass`].
    pub fn step(&mut self) -> Result<Pass, InvalidSpec> {
        let pass = self.pass()?;
        self.carry_out(&pass);
        self.now += PASS_SECONDS;
        Ok(pass)
    }

    /// Steps until a pass finds every pool settled, at most `max_passes` passes; the
    /// passes taken, or `None` when it did not settle.
    ///
    /// # Errors
    /// As [`Self::pass`].
    pub fn settle(&mut self, max_passes: usize) -> Result<Option<usize>, InvalidSpec> {
        for passes in 1..=max_passes {
            if self.step()?.settled() {
                return Ok(Some(passes));
            }
        }
        Ok(None)
    }

    fn time(&self) -> Time {
        let seconds = EPOCH_SECONDS + i64::try_from(self.now).unwrap_or(0);
        Time(
            k8s_openapi::jiff::Timestamp::from_second(seconds)
                .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        )
    }

    /// What `observe::observe_pools` would find for `pool`.
    fn observe(&self, cluster: &ValidatedCluster, pool: &ValidatedPool) -> PoolObservation {
        let template_hash = build::statefulset::template_hash(cluster, pool);
        let Some(sim) = self.pools.get(&pool.name) else {
            return PoolObservation::default();
        };
        let object = names::pool_object(&cluster.name, &pool.name);
        let nodes = sim
            .nodes
            .iter()
            .map(|(&ordinal, node)| {
                let ready = self.now >= node.ready_at;
                NodeView {
                    name: format!("{object}-{ordinal}"),
                    ordinal,
                    ready,
                    current_template: node.template == template_hash,
                    ip: Some(pod_ip(ordinal)),
                    report: ready.then(|| NodeReport {
                        generation: node.generation,
                        ring_version: node.ring_version,
                        entries: node.entries,
                        budget_bytes: node.budget_bytes,
                        uptime_ms: Some((self.now - node.ready_at) * 1000),
                        last_rebalance_ms_ago: node.rebalanced_at.map(|at| (self.now - at) * 1000),
                        holds_strays: false,
                        reads_zones: true,
                        ..NodeReport::default()
                    }),
                    ready_seconds: if ready { self.now - node.ready_at } else { 0 },
                    unready_seconds: if ready { 0 } else { self.now - node.created_at },
                    memory_limit: Some(pool.memory_limit_bytes),
                    memory_applied: Some(pool.memory_limit_bytes),
                    // The simulated cluster has no zones.
                    zone: crate::ring::PodZone::Known(None),
                    image: Some(pool.image.clone()),
                    host: None,
                    node_lost_seconds: None,
                    // Gates are the kubelet's and the operator's; a simulated pod is Ready
                    // when it starts answering.
                    gate: crate::rollout::Gate::Ungated,
                }
            })
            .collect();
        let previous = sim
            .configmap
            .as_ref()
            .and_then(|cm| cm.data.as_ref()?.get(names::NODE_CONFIG_KEY))
            .and_then(|text| NodeDocument::from_json(text).ok()?.topology);
        let seen_ring_version = self
            .status
            .as_ref()
            .and_then(|s| s.pools.iter().find(|p| p.name == pool.name))
            .map_or(0, |p| u64::try_from(p.ring_version).unwrap_or(0));
        PoolObservation {
            statefulset_replicas: sim.replicas,
            nodes,
            previous,
            seen_ring_version,
        }
    }

    /// Applies what `pass` decided: ConfigMaps, then StatefulSets (pods created and
    /// deleted), then each plan's node calls; then the status.
    fn carry_out(&mut self, pass: &Pass) {
        let cluster = &pass.cluster;
        let generation = u64::try_from(cluster.generation).unwrap_or(0);
        self.pools
            .retain(|name, _| cluster.pools.iter().any(|p| &p.name == name));
        for (index, ((pool, (plan, _)), desired)) in cluster
            .pools
            .iter()
            .zip(&pass.plans)
            .zip(&pass.desired)
            .enumerate()
        {
            let template = build::statefulset::template_hash(cluster, pool);
            let version = plan.layout.topology.version;
            let (now, startup) = (self.now, self.startup);
            let new_node = |ordinal: i32| SimNode {
                created_at: now,
                ready_at: now + startup.seconds(index, ordinal),
                template: template.clone(),
                generation,
                ring_version: version,
                entries: 0,
                budget_bytes: pool.budget_bytes,
                rebalanced_at: None,
            };
            let sim = self.pools.entry(pool.name.clone()).or_default();
            sim.configmap = Some(desired.configmap.clone());
            let replicas = plan.layout.replicas;
            sim.replicas = Some(replicas);
            sim.nodes.retain(|&ordinal, _| ordinal < replicas);
            for ordinal in 0..replicas {
                sim.nodes
                    .entry(ordinal)
                    .or_insert_with(|| new_node(ordinal));
            }
            for step in &plan.steps {
                let leaving = |name: &str| {
                    ring::ordinal_of(name).is_some_and(|o| {
                        o >= pool.shards
                            || ring::state_of(&plan.layout.topology, cluster, pool, o)
                                == Some(MemberState::Draining)
                    })
                };
                let done = StepDone {
                    version,
                    generation,
                    budget_bytes: pool.budget_bytes,
                    now,
                };
                carry_out_step(&mut sim.nodes, step, &done, &leaving, &new_node);
            }
        }
        self.status = Some(pass.status.clone());
    }
}

/// What a simulated step leaves on the nodes it names.
struct StepDone {
    version: u64,
    generation: u64,
    budget_bytes: u64,
    now: u64,
}

/// `step` carried out on the simulated `nodes`: a pushed ring or config reaches the
/// node, a rebalance leaves a node in the key space with about as much as it had (it
/// sends and receives) and one `leaving` with nothing, an evicted pod is a `new_node`.
fn carry_out_step(
    nodes: &mut BTreeMap<i32, SimNode>,
    step: &plan::Step,
    done: &StepDone,
    leaving: &dyn Fn(&str) -> bool,
    new_node: &dyn Fn(i32) -> SimNode,
) {
    match step {
        plan::Step::PushRing(targets) => {
            for (name, _) in targets {
                if let Some(node) = node_mut(nodes, name) {
                    node.ring_version = node.ring_version.max(done.version);
                }
            }
        }
        plan::Step::Rebalance(name, _) => {
            let leaves = leaving(name);
            if let Some(node) = node_mut(nodes, name) {
                node.entries = if leaves { 0 } else { ENTRIES };
                node.rebalanced_at = Some(done.now);
            }
        }
        plan::Step::Evict(name) => {
            if let Some(ordinal) = ring::ordinal_of(name) {
                nodes.insert(ordinal, new_node(ordinal));
            }
        }
        plan::Step::PushConfig(name, _) => {
            if let Some(node) = node_mut(nodes, name) {
                node.generation = done.generation;
            }
        }
        plan::Step::PushBudget(name, _) => {
            if let Some(node) = node_mut(nodes, name) {
                node.generation = done.generation;
                node.budget_bytes = done.budget_bytes;
            }
        }
        // Memory limits and readiness gates are not simulated: every pod already has the
        // pool's limit and no gate.
        plan::Step::Resize(_) | plan::Step::HoldOut(_) | plan::Step::Admit(_) => {}
    }
}

/// The pod named `name` among `nodes`.
fn node_mut<'a>(nodes: &'a mut BTreeMap<i32, SimNode>, name: &str) -> Option<&'a mut SimNode> {
    nodes.get_mut(&ring::ordinal_of(name)?)
}

/// A pod IP for `ordinal` (the simulation gives every pod one).
fn pod_ip(ordinal: i32) -> String {
    format!("10.1.{}.{}", ordinal / 256, ordinal % 256)
}

/// What one pass decided: each pool's plan, the objects it applies, the status it
/// writes.
#[derive(Debug, Clone)]
pub struct Pass {
    cluster: ValidatedCluster,
    plans: Vec<(PoolPlan, PoolObservation)>,
    desired: Vec<DesiredPool>,
    status: CacheClusterStatus,
}

impl Pass {
    /// Whether every pool is settled (nothing changing, nothing starting).
    pub fn settled(&self) -> bool {
        self.plans
            .iter()
            .all(|(plan, _)| plan.phase == Phase::Settled)
    }

    /// Each pool's phase name, in spec order.
    pub fn phases(&self) -> Vec<&'static str> {
        self.plans
            .iter()
            .map(|(plan, _)| plan.phase.as_str())
            .collect()
    }

    /// Each pool's ring as this pass publishes it, in spec order.
    pub fn rings(&self) -> Vec<&Topology> {
        self.plans
            .iter()
            .map(|(plan, _)| &plan.layout.topology)
            .collect()
    }

    /// Each pool's ConfigMap as this pass applies it, in spec order.
    pub fn configmaps(&self) -> Vec<&ConfigMap> {
        self.desired.iter().map(|pool| &pool.configmap).collect()
    }

    /// The `RingChanged` event notes of this pass (one per pool whose ring changed).
    pub fn ring_change_notes(&self) -> Vec<String> {
        self.cluster
            .pools
            .iter()
            .zip(&self.plans)
            .filter(|(_, (plan, observation))| {
                observation
                    .previous
                    .as_ref()
                    .is_some_and(|p| p.version != plan.layout.topology.version)
            })
            .map(|(pool, (plan, _))| ring::ring_changed_note(&pool.name, &plan.layout.topology))
            .collect()
    }

    /// The status this pass writes.
    pub fn status(&self) -> &CacheClusterStatus {
        &self.status
    }

    /// The JSON bodies the pass sends: every child applied and the status patch, in
    /// bytes (what encoding them costs is part of a pass).
    pub fn encoded_bytes(&self) -> usize {
        let children: usize = self
            .desired
            .iter()
            .map(|pool| {
                object_bytes(&pool.configmap)
                    + object_bytes(&pool.headless_service)
                    + object_bytes(&pool.client_service)
                    + object_bytes(&pool.pdb)
                    + pool.network_policy.as_ref().map_or(0, object_bytes)
                    + object_bytes(&pool.statefulset)
            })
            .sum();
        children + object_bytes(&self.status)
    }
}

/// The fraction of keys whose owner differs between two rings of one pool, expected
/// for rendezvous hashing with one copy per key: a key's owner over the active members
/// of both is equally likely to be any of them, and the key stays exactly when that
/// member is active in both.
pub fn moved_fraction(before: &Topology, after: &Topology) -> f64 {
    let active = |t: &Topology| -> std::collections::BTreeSet<String> {
        t.members
            .iter()
            .filter(|m| m.state == MemberState::Active)
            .map(|m| m.id.clone())
            .collect()
    };
    let (a, b) = (active(before), active(after));
    let union = a.union(&b).count();
    if union == 0 {
        return 0.0;
    }
    let kept = a.intersection(&b).count();
    1.0 - kept as f64 / union as f64
}

/// Bytes of `value` as compact JSON (what an apply sends, what etcd stores of it).
pub fn object_bytes(value: &impl Serialize) -> usize {
    serde_json::to_vec(value).map_or(0, |bytes| bytes.len())
}

/// Bytes of a ConfigMap's data as the API server counts them against its 1 MiB limit
/// (keys and values).
pub fn configmap_data_bytes(configmap: &ConfigMap) -> usize {
    configmap
        .data
        .iter()
        .flatten()
        .map(|(key, value)| key.len() + value.len())
        .sum()
}

/// Bytes of the `CacheCluster` object as etcd stores it with `status`: metadata
/// including the managed fields of the spec's applier (`kubectl`, server-side) and of
/// the operator's status apply, the spec, the status. Server-side apply records every
/// field an applier set, every list item by its key, so the managed fields grow with the
/// status about as fast as the status itself. A model of what the API server writes:
/// for the maximal cluster's statuses it came within one byte of what etcd held
/// (kube-apiserver 1.34.4, etcd 3.6.16; docs/benchmarks.md).
pub fn stored_cluster_bytes(cc: &CacheCluster, status: &CacheClusterStatus) -> usize {
    let spec = serde_json::to_value(&cc.spec).unwrap_or_default();
    let status_value = serde_json::to_value(status).unwrap_or_default();
    let managed = |manager: &str, subresource: Option<&str>, field: &str, value: &Value| {
        let mut entry = serde_json::json!({
            "apiVersion": "flightcache.dev/v1alpha1",
            "fieldsType": "FieldsV1",
            "fieldsV1": { format!("f:{field}"): fields_v1(field, value) },
            "manager": manager,
            "operation": "Apply",
            "time": "2026-11-26T00:00:00Z",
        });
        if let (Some(subresource), Some(object)) = (subresource, entry.as_object_mut()) {
            object.insert("subresource".into(), subresource.into());
        }
        entry
    };
    let object = serde_json::json!({
        "apiVersion": "flightcache.dev/v1alpha1",
        "kind": "CacheCluster",
        "metadata": {
            "creationTimestamp": "2026-11-26T00:00:00Z",
            "generation": cc.metadata.generation,
            "managedFields": [
                managed("kubectl", None, "spec", &spec),
                managed(crate::build::names::FIELD_MANAGER, Some("status"), "status", &status_value),
            ],
            "name": cc.metadata.name,
            "namespace": cc.metadata.namespace,
            "uid": cc.metadata.uid,
        },
        "spec": spec,
        "status": status_value,
    });
    object_bytes(&object)
}

/// The list-map key of the lists of a `CacheCluster` (`x-kubernetes-list-map-keys`);
/// other lists are atomic.
fn list_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        "pools" | "nodes" => Some("name"),
        _ => None,
    }
}

/// The `fieldsV1` set of `value` (at field `field`), as server-side apply records it:
/// a struct's fields as `f:<name>`, a list-map's items as `k:{<key>}` owning themselves
/// (`.`), leaves (scalars, atomic lists) as `{}`.
fn fields_v1(field: &str, value: &Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(name, child)| (format!("f:{name}"), fields_v1(name, child)))
                .collect(),
        ),
        Value::Array(items) => match list_key(field) {
            Some(key) => Value::Object(
                items
                    .iter()
                    .map(|item| {
                        let id = item.get(key).cloned().unwrap_or_default();
                        let mut set = match fields_v1("", item) {
                            Value::Object(set) => set,
                            _ => Map::new(),
                        };
                        set.insert(".".into(), Value::Object(Map::new()));
                        (
                            format!("k:{}", serde_json::json!({ key: id })),
                            Value::Object(set),
                        )
                    })
                    .collect(),
            ),
            None => Value::Object(Map::new()),
        },
        _ => Value::Object(Map::new()),
    }
}

/// Operator defaults as a release runs them (`cluster.local`, the chart's image).
pub fn defaults() -> Defaults {
    Defaults {
        node_image: "ghcr.io/flightcache/flightcache-node:0.1.0".into(),
        image_pull_policy: "IfNotPresent".into(),
        cluster_domain: "cluster.local".into(),
        operator_namespace: "flightcache-system".into(),
        allowed_images: vec!["ghcr.io/flightcache/flightcache-node".into()],
        issued_certificate_lifetime: std::time::Duration::from_secs(90 * 24 * 3600),
    }
}

/// Most pools a `CacheCluster` may have (`spec.pools`, `maxItems`).
pub const MAX_POOLS: usize = 16;
/// Most shards a pool may have (`spec.pools[].shards`).
pub const MAX_SHARDS: i32 = 256;

/// A `CacheCluster` at the CRD's limits: [`MAX_POOLS`] pools of `shards` nodes each, and
/// the longest names the schema admits (a 63-character namespace; cluster and pool
/// names of 51 characters together), so every member id, address and node name is as
/// long as it can be.
pub fn maximal_cluster(shards: i32) -> CacheCluster {
    // 24 + 27 = 51 characters: the longest `<cluster>-<pool>` the schema allows.
    let cluster_name = format!("analytics-{}", "c".repeat(14));
    let pools = (0..MAX_POOLS)
        .map(|i| PoolSpec {
            shards,
            ..PoolSpec::new(format!("pool-{i:02}-{}", "p".repeat(19)))
        })
        .collect();
    let mut cc = CacheCluster::new(&cluster_name, CacheClusterSpec::with_pools(pools));
    cc.metadata.namespace = Some(format!("team-{}", "n".repeat(58)));
    cc.metadata.uid = Some("0b6c2a6e-1111-4222-8333-444455556666".into());
    cc.metadata.generation = Some(1);
    cc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maximal_cluster_is_valid_and_at_every_limit() {
        let cc = maximal_cluster(MAX_SHARDS);
        let cluster = validate::validate(&cc, &defaults()).unwrap();
        assert_eq!(cluster.pools.len(), MAX_POOLS);
        assert!(cluster.pools.iter().all(|p| p.shards == MAX_SHARDS));
        let name = cc.metadata.name.as_deref().unwrap();
        assert!(
            cc.spec
                .pools
                .iter()
                .all(|p| name.len() + p.name.len() == 51)
        );
        assert_eq!(cc.metadata.namespace.as_deref().unwrap().len(), 63);
        // One more of either is refused.
        let mut more = maximal_cluster(MAX_SHARDS);
        more.spec.pools[0].shards = MAX_SHARDS + 1;
        assert!(validate::validate(&more, &defaults()).is_err());
        let mut more = maximal_cluster(MAX_SHARDS);
        more.spec.pools.push(PoolSpec::new("one-more"));
        assert!(validate::validate(&more, &defaults()).is_err());
    }

    #[test]
    fn the_ring_configmap_of_a_maximal_cluster_fits_a_configmap() {
        let sim = SimCluster::running(maximal_cluster(MAX_SHARDS), defaults()).unwrap();
        let pass = sim.pass().unwrap();
        assert!(pass.settled());
        assert_eq!(pass.configmaps().len(), MAX_POOLS, "one ConfigMap per pool");
        for (cm, ring) in pass.configmaps().into_iter().zip(pass.rings()) {
            assert_eq!(ring.members.len(), 256);
            // 256 members with the longest ids and addresses: under a tenth of the limit.
            let bytes = configmap_data_bytes(cm);
            assert!(bytes < CONFIGMAP_DATA_LIMIT_BYTES / 10, "{bytes} bytes");
            assert!(object_bytes(cm) < ETCD_REQUEST_LIMIT_BYTES / 10);
            // As published, the nodes read it back whole.
            let text = &cm.data.as_ref().unwrap()[names::NODE_CONFIG_KEY];
            let document = NodeDocument::from_json(text).unwrap();
            assert_eq!(document.topology.as_ref(), Some(ring));
        }
    }

    #[test]
    fn the_status_of_a_maximal_cluster_fits_etcd_while_every_pool_scales_out_and_settled() {
        // Every pool 1 → 256 at once: the most nodes changing, the longest phases.
        let mut sim = SimCluster::running(maximal_cluster(1), defaults()).unwrap();
        sim.set_startup(Startup::Fixed(4));
        sim.edit(|spec| spec.pools.iter_mut().for_each(|p| p.shards = MAX_SHARDS))
            .unwrap();
        let mut largest = 0;
        let mut settled = false;
        for _ in 0..20 {
            let pass = sim.step().unwrap();
            largest = largest.max(stored_cluster_bytes(sim.cluster(), pass.status()));
            if pass.settled() {
                settled = true;
                break;
            }
        }
        assert!(settled);
        // At most two thirds of etcd's limit: the rest is for the spec (16 pools'
        // scheduling and resources) and whatever else users put in metadata.
        assert!(
            largest < ETCD_REQUEST_LIMIT_BYTES * 2 / 3,
            "{largest} bytes stored"
        );
        let status = sim.status().unwrap();
        assert_eq!(status.shards_ready.as_deref(), Some("4096/4096"));
        let listed: usize = status.pools.iter().map(|p| p.nodes.len()).sum();
        assert_eq!(listed, status::MAX_LISTED_NODES);
        assert!(
            status
                .pools
                .iter()
                .all(|p| p.ready_shards == 256 && p.nodes.len() == 128)
        );
    }

    /// Scales pool 0 (longest names) from 64 to 256 nodes; the passes until settled and
    /// the share of keys moved over every ring it published (one copy per key).
    fn scale_out_64_to_256(startup: Startup) -> (Option<usize>, f64) {
        let mut cc = maximal_cluster(64);
        cc.spec.pools.truncate(1);
        let mut sim = SimCluster::running(cc, defaults()).unwrap();
        let mut ring = sim.pass().unwrap().rings()[0].clone();
        sim.set_startup(startup);
        sim.edit(|spec| spec.pools[0].shards = MAX_SHARDS).unwrap();
        let mut moved = 0.0;
        for passes in 1..=200 {
            let pass = sim.step().unwrap();
            moved += moved_fraction(&ring, pass.rings()[0]);
            ring = pass.rings()[0].clone();
            if pass.settled() {
                assert_eq!(ring.members.len(), 256);
                assert!(ring.members.iter().all(|m| m.state == MemberState::Active));
                return (Some(passes), moved);
            }
        }
        (None, moved)
    }

    const IDEAL: f64 = 1.0 - 64.0 / 256.0;

    #[test]
    fn scale_out_64_to_256_with_pods_ready_together_moves_the_ideal_share() {
        let (passes, moved) = scale_out_64_to_256(Startup::Fixed(20));
        // One ring switch, once the new pods are Ready; the 64 old nodes then take the
        // new generation one per pass (the live-config rule), 2 s apart.
        assert!(passes.is_some_and(|p| p <= 70), "{passes:?} passes");
        assert!((moved - IDEAL).abs() < 1e-9, "moved {moved}");
    }

    #[test]
    fn scale_out_64_to_256_with_pods_ready_over_30_s_settles_and_bounds_the_moves() {
        let (passes, moved) = scale_out_64_to_256(Startup::Spread {
            first: 10,
            spread: 30,
        });
        assert!(passes.is_some_and(|p| p <= 70), "{passes:?} passes");
        // Pods enter the ring as each has been Ready 5 s, so a key can move more than
        // once on the way (64 → 80 → … → 256): at most 1.8 times the ideal share.
        assert!(moved >= IDEAL, "moved {moved}");
        assert!(
            moved <= 1.8 * IDEAL,
            "moved {moved} = {:.2} x ideal",
            moved / IDEAL
        );
    }

    #[test]
    fn moved_fraction_is_the_share_of_the_new_members() {
        let cc = maximal_cluster(256);
        let cluster = validate::validate(&cc, &defaults()).unwrap();
        let pool = &cluster.pools[0];
        let ring = |n| {
            ring::plan_topology(
                &cluster,
                pool,
                &ring::all_active(n),
                &ring::no_zones(),
                None,
                0,
            )
        };
        assert!((moved_fraction(&ring(64), &ring(256)) - 0.75).abs() < 1e-12);
        assert!((moved_fraction(&ring(3), &ring(3))).abs() < 1e-12);
    }
}
