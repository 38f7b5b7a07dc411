//! The `CacheInvalidation` resource (`flightcache.dev/v1alpha1`): a one-shot request to
//! remove entries from a CacheCluster, by key, key prefix or tag, on every node of some
//! or all of its pools. A pipeline step or a CronJob applies one after it rewrote a
//! table; the operator runs it once on every node (retrying nodes that are down until
//! the deadline), reports per pool what was removed and when, and deletes the resource
//! a while after it finished.
//!
//! Every doc comment here is `kubectl explain` text. The selectors' rules are those of
//! [`crate::invalidation`], which the node checks again. Pure; no I/O.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The spec may not change once created.
pub const IMMUTABLE: &str = "self == oldSelf";
/// Message of [`IMMUTABLE`].
pub const IMMUTABLE_MSG: &str = "spec is immutable: a CacheInvalidation runs once; create a new one (a new name, or delete this one first) to invalidate again";
/// At least one selector.
pub const SOME_SELECTOR: &str = "has(self.keys) || has(self.prefixes) || has(self.tags)";
/// Message of [`SOME_SELECTOR`].
pub const SOME_SELECTOR_MSG: &str =
    "name what to remove: at least one of spec.keys, spec.prefixes or spec.tags";
/// A CacheCluster name.
pub const CLUSTER_NAME: &str = "self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')";
/// Message of [`CLUSTER_NAME`].
pub const CLUSTER_NAME_MSG: &str =
    "spec.cluster must be the name of a CacheCluster in this namespace (a DNS label)";
/// Pool names, each once.
pub const POOL_NAMES: &str =
    "size(self) >= 1 && self.all(p, p.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$'))";
/// Message of [`POOL_NAMES`].
pub const POOL_NAMES_MSG: &str = "spec.pools must list 1 to 16 pool names (DNS labels) of the cluster; leave it unset for every pool";
/// Keys and prefixes: non-empty.
pub const NON_EMPTY_ITEMS: &str = "size(self) >= 1 && self.all(k, size(k) >= 1)";
/// Message of [`NON_EMPTY_ITEMS`] on keys.
pub const KEYS_MSG: &str = "spec.keys must list 1 to 64 path keys (e.g. 'reports/daily'), none empty, each at most 1024 bytes";
/// Message of [`NON_EMPTY_ITEMS`] on prefixes.
pub const PREFIXES_MSG: &str = "spec.prefixes must list 1 to 16 key prefixes (e.g. 'reports/'), none empty, each at most 1024 bytes; a pool is emptied by deleting and recreating it, not by an empty prefix";
/// Tags: printable ASCII.
pub const TAGS: &str = "size(self) >= 1 && self.all(t, t.matches('^[ -~]+$'))";
/// Message of [`TAGS`].
pub const TAGS_MSG: &str = "spec.tags must list 1 to 64 tags, each 1 to 128 bytes of printable ASCII (the tags puts gave their entries)";
/// The deadline's range.
pub const DEADLINE: &str = "self >= 10 && self <= 86400";
/// Message of [`DEADLINE`].
pub const DEADLINE_MSG: &str = "spec.activeDeadlineSeconds must be between 10 and 86400 (a day)";
/// The clean-up delay's range.
pub const TTL: &str = "self >= 0 && self <= 2592000";
/// Message of [`TTL`].
pub const TTL_MSG: &str = "spec.ttlSecondsAfterFinished must be between 0 and 2592000 (30 days)";

/// Condition type: every node of every targeted pool ran the invalidation.
pub const COMPLETE: &str = "Complete";
/// Condition type: the deadline passed with nodes that had not run it.
pub const FAILED: &str = "Failed";

/// Condition reasons of a CacheInvalidation.
pub mod reasons {
    /// `Complete=True`: every node ran it.
    pub const INVALIDATED: &str = "Invalidated";
    /// `Complete=False`: some nodes have not run it yet (down, starting, or not asked yet).
    pub const NODES_PENDING: &str = "NodesPending";
    /// `Complete=False`: `spec.cluster` names no CacheCluster (yet).
    pub const CLUSTER_NOT_FOUND: &str = "ClusterNotFound";
    /// `Complete=False`: the CacheCluster's spec is invalid (see its status).
    pub const CLUSTER_INVALID: &str = "ClusterInvalid";
    /// `Complete=False`: `spec.pools` names a pool the cluster does not have.
    pub const POOL_NOT_FOUND: &str = "PoolNotFound";
    /// `Complete=False`, `Failed=True`: `activeDeadlineSeconds` passed first.
    pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
    /// `Failed=False`: nothing has failed for good.
    pub const AS_EXPECTED: &str = "AsExpected";
}

/// A request to remove entries from a CacheCluster's nodes: the entries under `keys`,
/// those whose key starts with one of `prefixes`, and those a put tagged with one of
/// `tags`. Immutable once created.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[allow(
    clippy::duplicated_attributes,
    reason = "each printcolumn(...) names its own type_; the lint reads two columns of one type as one attribute given twice"
)]
#[kube(
    group = "flightcache.dev",
    version = "v1alpha1",
    kind = "CacheInvalidation",
    namespaced,
    shortname = "cinv",
    category = "flightcache",
    status = "CacheInvalidationStatus",
    derive = "PartialEq",
    doc = "A one-shot invalidation of a FlightCache cluster: the operator removes the entries it names (by key, key prefix or tag) on every node of the cluster's pools, retrying nodes that are down until its deadline, reports per pool what was removed and when, and deletes it ttlSecondsAfterFinished after it finished. Apply one from a pipeline step or a CronJob when the data behind cached results changed.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".spec.cluster",
        description = "The CacheCluster it invalidates."
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Running, Complete or Failed."
    ),
    printcolumn(
        name = "Removed",
        type_ = "integer",
        json_path = ".status.removed",
        description = "Entries removed over every pool, copies included."
    ),
    printcolumn(
        name = "Pending",
        type_ = "integer",
        json_path = ".status.pendingNodes",
        description = "Nodes that have not run it yet."
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new(IMMUTABLE).message(IMMUTABLE_MSG),
    validation = Rule::new(SOME_SELECTOR).message(SOME_SELECTOR_MSG)
)]
#[serde(rename_all = "camelCase")]
pub struct CacheInvalidationSpec {
    /// Name of the CacheCluster, in this namespace, whose entries to remove. Whoever may
    /// create CacheInvalidations in a namespace may invalidate every cluster of it (RBAC
    /// is per namespace: docs/keeping-results-fresh.md).
    #[x_kube(validation = Rule::new(CLUSTER_NAME).message(CLUSTER_NAME_MSG))]
    #[schemars(length(max = 63))]
    pub cluster: String,

    /// Pools to run it on (by `spec.pools[].name` of the cluster). Unset: every pool of
    /// the cluster, the cluster-wide form.
    #[x_kube(validation = Rule::new(POOL_NAMES).message(POOL_NAMES_MSG), merge_strategy = ListMerge::Set)]
    #[schemars(length(max = 16), inner(length(max = 63)))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pools: Option<Vec<String>>,

    /// Path keys to remove (as a Flight client names them, e.g. `reports/daily`), with
    /// their copies. At most 64, each 1 to 1024 bytes.
    #[x_kube(validation = Rule::new(NON_EMPTY_ITEMS).message(KEYS_MSG))]
    #[schemars(length(max = 64), inner(length(max = 1024)))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,

    /// Key prefixes: every path key starting with one is removed (`reports/` removes
    /// `reports/daily`). At most 16, each 1 to 1024 bytes.
    #[x_kube(validation = Rule::new(NON_EMPTY_ITEMS).message(PREFIXES_MSG))]
    #[schemars(length(max = 16), inner(length(max = 1024)))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefixes: Option<Vec<String>>,

    /// Tags: every entry a put tagged with one of them is removed (e.g. the table a
    /// query engine's results were computed from, `sales.orders`). At most 64, each 1 to
    /// 128 bytes of printable ASCII; compared byte for byte.
    #[x_kube(validation = Rule::new(TAGS).message(TAGS_MSG))]
    #[schemars(length(max = 64), inner(length(max = 128)))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,

    /// Seconds after creation by which every node must have run it; past them, nodes
    /// that have not are given up and it is `Failed` (they may still hold what it names).
    /// Between 10 and 86400.
    #[x_kube(validation = Rule::new(DEADLINE).message(DEADLINE_MSG))]
    #[serde(default = "default_active_deadline_seconds")]
    pub active_deadline_seconds: i64,

    /// Seconds after it finished (`Complete` or `Failed`) at which the operator deletes
    /// it. 0 deletes it at once. Between 0 and 2592000.
    #[x_kube(validation = Rule::new(TTL).message(TTL_MSG))]
    #[serde(default = "default_ttl_seconds_after_finished")]
    pub ttl_seconds_after_finished: i64,
}

/// Default of `spec.activeDeadlineSeconds`: ten minutes.
pub fn default_active_deadline_seconds() -> i64 {
    600
}

/// Default of `spec.ttlSecondsAfterFinished`: an hour.
pub fn default_ttl_seconds_after_finished() -> i64 {
    3600
}

/// Where a CacheInvalidation is.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidationPhase {
    /// Some nodes have not run it yet.
    Running,
    /// Every node of every targeted pool ran it.
    Complete,
    /// The deadline passed first.
    Failed,
}

impl InvalidationPhase {
    /// Whether nothing more will be done (but the deletion after the TTL).
    pub fn finished(self) -> bool {
        matches!(self, Self::Complete | Self::Failed)
    }
}

/// Observed state of a CacheInvalidation, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CacheInvalidationStatus {
    /// Running, Complete or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<InvalidationPhase>,

    /// `Complete` (every node ran it) and `Failed` (the deadline passed first), with a
    /// reason and a message naming what is pending. Keyed by type.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// When the operator first acted on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When it finished (Complete or Failed); the TTL counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// Entries removed over every pool, copies included (a key with two copies counts
    /// twice).
    #[serde(default)]
    pub removed: i64,

    /// Nodes, over every pool, that have not run it yet.
    #[serde(default)]
    pub pending_nodes: i32,

    /// Per pool: what was removed, which nodes ran it and which have not. Keyed by name.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<InvalidationPoolStatus>,
}

/// One pool's part of a CacheInvalidation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct InvalidationPoolStatus {
    /// The pool (`spec.pools[].name` of the cluster).
    pub name: String,

    /// Entries its nodes removed, copies included.
    #[serde(default)]
    pub removed: i64,

    /// The nodes (pod names) that ran it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub done_nodes: Vec<String>,

    /// The nodes that have not, with how often they were tried and why the last try
    /// failed. A node is tried again every few seconds until the deadline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_nodes: Vec<PendingNode>,

    /// When its last node ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
}

/// A node that has not run the invalidation yet.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PendingNode {
    /// The pod.
    pub name: String,
    /// Calls made to it so far.
    #[serde(default)]
    pub attempts: i32,
    /// Why it has not run it: the pod is not running, or the last call's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl CacheInvalidationSpec {
    /// The selectors as the node's `invalidate-local` request.
    pub fn request(&self) -> crate::admin::InvalidateLocalRequest {
        crate::admin::InvalidateLocalRequest {
            keys: self.keys.clone().unwrap_or_default(),
            prefixes: self.prefixes.clone().unwrap_or_default(),
            tags: self.tags.clone().unwrap_or_default(),
        }
    }
}
