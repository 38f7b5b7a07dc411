//! One pool of a `CacheCluster`: a StatefulSet of cache nodes with one configuration.
//!
//! Doc comments are `kubectl explain` text. The CEL rules come from [`super::rules`];
//! `Rule`, `Reason` and `ListMerge` in the `x_kube` attributes are in scope through
//! the `KubeSchema` derive. Pure types; no I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{defaults, rules};
use crate::node_config::{EvictionPolicy, LocationMode, TtlMode};

/// One pool of cache nodes. Keys are spread over the pool's nodes by rendezvous
/// hashing; a client may call any node, which forwards to the owner of the key.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(
    validation = Rule::new(rules::REPLICAS_LE_SHARDS).message(rules::REPLICAS_LE_SHARDS_MSG).field_path(".replicas"),
    validation = Rule::new(rules::SIZE_COVERS_MEMORY).message(rules::SIZE_COVERS_MEMORY_MSG).field_path(".persistence.size"),
    validation = Rule::new(rules::NO_RESOURCES_MEMORY_LIMIT).message(rules::NO_RESOURCES_MEMORY_LIMIT_MSG).field_path(".resources.limits"),
    validation = Rule::new(rules::PERSISTENCE_KEPT).message(rules::PERSISTENCE_KEPT_MSG).reason(Reason::FieldValueForbidden).field_path(".persistence"),
    validation = Rule::new(rules::PERSISTENCE_NOT_ADDED).message(rules::PERSISTENCE_NOT_ADDED_MSG).reason(Reason::FieldValueForbidden).field_path(".persistence"),
)]
#[serde(rename_all = "camelCase")]
pub struct PoolSpec {
    /// Name of the pool, unique in the cluster: a DNS label (lower-case letters, digits
    /// and '-', starting with a letter). The pool's StatefulSet and client Service are
    /// named `<cluster>-<pool>`, its nodes `<cluster>-<pool>-0` … `-<shards-1>`. Renaming
    /// a pool is removing it and adding another.
    #[x_kube(validation = Rule::new(rules::POOL_NAME).message(rules::POOL_NAME_MSG))]
    #[schemars(length(max = 50))]
    pub name: String,

    /// Number of cache nodes (StatefulSet replicas, members of the pool's hash ring),
    /// between 1 and 256.
    /// Change: ring change (nodes are added or drained one at a time and the keys that
    /// move to another owner are migrated, not dropped).
    #[x_kube(validation = Rule::new(rules::SHARDS).message(rules::SHARDS_MSG))]
    #[serde(default = "defaults::shards")]
    pub shards: i32,

    /// Most entries one node holds, at least 1; when reached, the eviction policy
    /// picks the victim.
    /// Change: live (pushed to running nodes; a lower cap evicts down to it at once).
    #[x_kube(validation = Rule::new(rules::MAX_ENTRIES).message(rules::MAX_ENTRIES_MSG))]
    #[serde(default = "defaults::max_entries")]
    pub max_entries: i64,

    /// Default time-to-live of an entry, as whole h, m, s or ms, largest unit first
    /// (`30s`, `15m`, `1h`, `1h30m`); greater than 0 and at most `720h` (30 days). A
    /// writer may set a per-entry TTL that overrides it.
    /// Change: live (entries already stored get anchor + new TTL, so a shorter TTL
    /// expires old entries at once and a longer one extends them).
    #[x_kube(
        validation = Rule::new(rules::TTL_FORMAT).message(rules::TTL_FORMAT_MSG),
        validation = Rule::new(rules::TTL_RANGE).message(rules::TTL_RANGE_MSG)
    )]
    #[schemars(length(max = 40))]
    #[serde(default = "defaults::ttl")]
    pub ttl: String,

    /// What anchors the TTL: `absolute` (the entry expires `ttl` after it was written)
    /// or `sliding` (`ttl` after it was last written or read, so hot entries stay warm).
    /// Change: live.
    #[serde(default = "defaults::ttl_mode")]
    pub ttl_mode: TtlMode,

    /// Memory limit of each node's container, a whole number of bytes with an optional
    /// unit (`Ki`, `Mi`, `Gi`, `Ti`, `k`, `M`, `G`, `T`), between `64Mi` and `1Ti`. The
    /// node's byte budget for cached Arrow data is derived from it, leaving headroom for
    /// in-flight requests, and is never exceeded. The memory request equals the limit
    /// unless `resources.requests.memory` says otherwise.
    /// Change: resize (in-place pod resize where the cluster supports it, the budget
    /// lowered before the limit and raised after it; otherwise restart with handoff).
    #[x_kube(
        validation = Rule::new(rules::BYTES_FORMAT).message(rules::MEMORY_FORMAT_MSG),
        validation = Rule::new(rules::MEMORY_RANGE).message(rules::MEMORY_RANGE_MSG)
    )]
    #[schemars(length(max = 20))]
    #[serde(default = "defaults::memory_limit")]
    pub memory_limit: String,

    /// Which entry makes room when a cap is reached: `lru` (least recently used) or
    /// `tinylfu` (W-TinyLFU: frequency-based admission that keeps the hot set through
    /// scans of one-off keys).
    /// Change: live (every entry is kept; the new policy decides from then on).
    #[serde(default = "defaults::eviction")]
    pub eviction: EvictionPolicy,

    /// Where GetFlightInfo sends clients for the data: `direct` (the owning node's stable
    /// pod DNS name, one hop, for clients inside the cluster) or `proxy` (no location:
    /// the client calls DoGet on the address it dialled, e.g. a load balancer, and that
    /// node forwards to the owner).
    /// Change: live.
    #[serde(default)]
    pub location_mode: LocationMode,

    /// Copies of each key: 1, or 2 to keep serving a key while its owner restarts or
    /// fails. At most `shards`.
    /// Change: ring change (the second copies are filled or dropped by migration).
    #[x_kube(validation = Rule::new(rules::REPLICAS).message(rules::REPLICAS_MSG))]
    #[serde(default = "defaults::replicas")]
    pub replicas: i32,

    /// Container image of this pool's nodes, overriding `spec.image`.
    /// Change: restart with handoff.
    #[x_kube(validation = Rule::new(rules::IMAGE).message(rules::POOL_IMAGE_MSG))]
    #[schemars(length(max = 512))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// A PersistentVolumeClaim per node for its disk tier: every entry a node holds is
    /// written behind to it (a put is acknowledged before it is on disk), and a
    /// restarted node reloads its entries, newest access first, before it reports
    /// ready, instead of starting cold. A node the operator had taken out of the ring
    /// (unready over 10 s while other nodes served its keys) drops them when it
    /// returns, since they may be stale. Unset:
    /// memory only (a restarting node's entries are handed off to its peers). Set when
    /// the pool is created: it can be neither added to an existing pool nor removed.
    /// When the CacheCluster is deleted or the pool shrinks, the claims of the nodes that
    /// go are deleted with them (what they held may be stale by the time a node of that
    /// name returns).
    /// Change: fixed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence: Option<PersistenceSpec>,

    /// CPU and other resources of each node's container (requests and limits as in a
    /// Pod). The memory limit is `memoryLimit` and may not be set here; the memory
    /// request defaults to `memoryLimit`.
    /// Change: restart with handoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Where this pool's nodes may run.
    /// Change: restart with handoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<SchedulingSpec>,
}

/// Disk tier of a pool's nodes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = Rule::new(rules::STORAGE_CLASS_IMMUTABLE).message(rules::STORAGE_CLASS_IMMUTABLE_MSG).reason(Reason::FieldValueForbidden).field_path(".storageClassName"))]
#[serde(rename_all = "camelCase")]
pub struct PersistenceSpec {
    /// Size of each node's volume, a whole number of bytes with an optional unit (`Ki`,
    /// `Mi`, `Gi`, `Ti`, `k`, `M`, `G`, `T`); at least `memoryLimit`, so leave room for
    /// the memory limit to grow. It cannot change once the pool exists (the same
    /// quantity in other units can be written): to grow the volumes, expand the claims
    /// `data-<cluster>-<pool>-<n>` where their StorageClass allows it.
    /// Change: fixed.
    #[x_kube(
        validation = Rule::new(rules::BYTES_FORMAT).message(rules::SIZE_FORMAT_MSG),
        validation = Rule::new(rules::SIZE_FIXED).message(rules::SIZE_FIXED_MSG).reason(Reason::FieldValueForbidden)
    )]
    #[schemars(length(max = 20))]
    pub size: String,

    /// StorageClass of the volumes; unset uses the cluster's default class. Immutable:
    /// existing volumes cannot move to another class without losing their data.
    /// Change: fixed.
    #[x_kube(validation = Rule::new(rules::DNS_SUBDOMAIN).message(rules::STORAGE_CLASS_MSG))]
    #[schemars(length(max = 253))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

/// Where a pool's nodes may run. Each field but `spread` is passed to the pod template as
/// is; the operator adds default spread constraints and tolerations where the user gives
/// none (`docs/operator.md`, "Placement").
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new(rules::SPREAD_OR_CONSTRAINTS).message(rules::SPREAD_OR_CONSTRAINTS_MSG).field_path(".spread"))]
#[serde(rename_all = "camelCase")]
pub struct SchedulingSpec {
    /// Node labels a node must carry to run this pool's pods (`nodeSelector` of a Pod).
    /// Change: restart with handoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Node affinity, pod affinity and anti-affinity (`affinity` of a Pod). Unset: none;
    /// the pods are spread over zones and nodes by `spread` instead.
    /// Change: restart with handoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// Taints this pool's pods tolerate (`tolerations` of a Pod). The operator adds
    /// `node.kubernetes.io/not-ready` and `node.kubernetes.io/unreachable` (NoExecute)
    /// for 30 s, instead of the API server's 300 s, unless a toleration here names
    /// those keys (or tolerates every key): the pods of a lost node are replaced sooner,
    /// and a cache loses nothing it cannot re-warm by it.
    /// Change: restart with handoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,

    /// How this pool's pods spread over zones or nodes (`topologySpreadConstraints` of a
    /// Pod). When set, these constraints replace the operator's default spread
    /// entirely (`[]`: no constraints at all); `spread` must then be unset.
    /// Change: restart with handoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,

    /// The operator's default spread of this pool's pods, used unless
    /// `topologySpreadConstraints` is set: one topology spread constraint per label key
    /// in `topologyKeys`, `maxSkew: 1` over the pool's own pods, counting only nodes whose
    /// taints the pods tolerate. Unset: spread over zones, then over the nodes within
    /// them, without ever leaving a pod unscheduled for it (`ScheduleAnyway`), so a
    /// cluster of one node or one zone still runs every pod of the pool. With
    /// `replicas: 2` a pool spread over two zones or more keeps a key's two copies in
    /// different zones.
    /// Change: restart with handoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<SpreadSpec>,

    /// PriorityClass of this pool's pods.
    /// Change: restart with handoff.
    #[x_kube(validation = Rule::new(rules::DNS_SUBDOMAIN).message(rules::PRIORITY_CLASS_MSG))]
    #[schemars(length(max = 253))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

/// The operator's default spread of a pool's pods: what each of its topology spread
/// constraints spreads over and how strictly.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SpreadSpec {
    /// Node labels to spread the pool's pods over, one constraint each (`topologyKey`):
    /// pods are spread evenly over the values of each label (at most one pod more on
    /// one value than on another). Default `topology.kubernetes.io/zone` and
    /// `kubernetes.io/hostname`: over zones, and over the nodes within them. At most 8
    /// distinct label keys; `[]` spreads nothing.
    /// Change: restart with handoff.
    #[x_kube(
        validation = Rule::new(rules::SPREAD_KEYS).message(rules::SPREAD_KEYS_MSG),
        merge_strategy = ListMerge::Set
    )]
    #[schemars(length(max = 8), inner(length(max = 317)))]
    #[serde(default = "defaults::spread_topology_keys")]
    pub topology_keys: Vec<String>,

    /// What the scheduler does with a pod that cannot be placed within the spread:
    /// `ScheduleAnyway` (default: place it where it unbalances least, so every pod runs
    /// even on one node or in one zone) or `DoNotSchedule` (leave it Pending until it
    /// can be placed evenly, e.g. while the zone short of the pool's pods has no room;
    /// the other cache nodes serve its keys meanwhile). Nodes whose taints the pods do
    /// not tolerate (lost, cordoned) do not count, so the pods of a lost zone still
    /// move to the others.
    /// Change: restart with handoff.
    #[serde(default)]
    pub when_unsatisfiable: WhenUnsatisfiable,
}

impl Default for SpreadSpec {
    /// The spread an unset `scheduling.spread` means.
    fn default() -> Self {
        Self {
            topology_keys: defaults::spread_topology_keys(),
            when_unsatisfiable: WhenUnsatisfiable::default(),
        }
    }
}

/// What the scheduler does with a pod it cannot place within a spread constraint (the
/// Pod field `topologySpreadConstraints[].whenUnsatisfiable`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum WhenUnsatisfiable {
    /// Schedule it where the skew grows least. The default: a cluster of one node or one
    /// zone still runs every pod.
    #[default]
    ScheduleAnyway,
    /// Leave it Pending until it can be placed within the skew.
    DoNotSchedule,
}

impl WhenUnsatisfiable {
    /// The value as Kubernetes spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ScheduleAnyway => "ScheduleAnyway",
            Self::DoNotSchedule => "DoNotSchedule",
        }
    }
}

impl PoolSpec {
    /// A pool with this name and every other field at its default.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            shards: defaults::shards(),
            max_entries: defaults::max_entries(),
            ttl: defaults::ttl(),
            ttl_mode: defaults::ttl_mode(),
            memory_limit: defaults::memory_limit(),
            eviction: defaults::eviction(),
            location_mode: LocationMode::default(),
            replicas: defaults::replicas(),
            image: None,
            persistence: None,
            resources: None,
            scheduling: None,
        }
    }
}
