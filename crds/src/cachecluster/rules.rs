//! The CEL validation rules of the `CacheCluster` schema and their messages.
//!
//! Each rule is a pair of constants: the CEL expression the API server evaluates
//! (`x-kubernetes-validations`) and the message it returns, which names the field and
//! the allowed range. The schema attributes in [`super`] and the pure checks in
//! [`super::validate`] use the same messages, so the operator reports exactly what
//! `kubectl apply` would have said. Rules that parse a value first check its format,
//! so a malformed value fails with the format message only, never with a CEL
//! evaluation error. Pure constants; no I/O.

// ---- the resource as a whole (rules on the root, where `metadata.name` is visible)

/// `metadata.name` is a DNS label.
pub const CLUSTER_NAME: &str = "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')";
/// Message of [`CLUSTER_NAME`].
pub const CLUSTER_NAME_MSG: &str = "metadata.name must be a DNS label (lower-case letters, digits and '-', starting with a letter and ending with a letter or digit): it prefixes the pools' Service and StatefulSet names";

/// `metadata.name` and each pool name fit in a StatefulSet name.
pub const NAME_LENGTH: &str =
    "self.spec.pools.all(p, size(self.metadata.name) + size(p.name) <= 51)";
/// Message of [`NAME_LENGTH`].
pub const NAME_LENGTH_MSG: &str = "metadata.name and spec.pools[].name together may have at most 51 characters, so that the StatefulSet <cluster>-<pool> (at most 52) and its Services stay valid names";

// ---- spec

/// The Flight port and the metrics port differ.
pub const PORTS_DIFFER: &str = "!has(self.monitoring) || self.port != self.monitoring.metricsPort";
/// Message of [`PORTS_DIFFER`].
pub const PORTS_DIFFER_MSG: &str = "spec.port and spec.monitoring.metricsPort must differ";

/// A TCP port number.
pub const PORT: &str = "self >= 1 && self <= 65535";
/// Message of [`PORT`] on `spec.port`.
pub const PORT_MSG: &str = "spec.port must be between 1 and 65535";
/// Message of [`PORT`] on `spec.monitoring.metricsPort`.
pub const METRICS_PORT_MSG: &str = "spec.monitoring.metricsPort must be between 1 and 65535";

/// A container image reference: non-empty, no whitespace.
pub const IMAGE: &str = "self.matches('^\\\\S+$')";
/// Message of [`IMAGE`] on `spec.image`.
pub const IMAGE_MSG: &str =
    "spec.image must be a container image reference (non-empty, no whitespace)";
/// Message of [`IMAGE`] on `spec.pools[].image`.
pub const POOL_IMAGE_MSG: &str =
    "spec.pools[].image must be a container image reference (non-empty, no whitespace)";

/// A Secret or StorageClass name: a DNS-1123 subdomain.
pub const DNS_SUBDOMAIN: &str =
    "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')";
/// Message of [`DNS_SUBDOMAIN`] on `spec.auth.secretName`.
pub const AUTH_SECRET_MSG: &str = "spec.auth.secretName must be a Secret name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit";
/// Message of [`DNS_SUBDOMAIN`] on `spec.tls.secretName`.
pub const TLS_SECRET_MSG: &str = "spec.tls.secretName must be a Secret name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit";
/// Message of [`DNS_SUBDOMAIN`] on `spec.pools[].scheduling.priorityClassName`.
pub const PRIORITY_CLASS_MSG: &str = "spec.pools[].scheduling.priorityClassName must be a PriorityClass name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit";
/// Message of [`DNS_SUBDOMAIN`] on `spec.pools[].persistence.storageClassName`.
pub const STORAGE_CLASS_MSG: &str = "spec.pools[].persistence.storageClassName must be a StorageClass name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit";

/// A key of a Secret's data.
pub const SECRET_KEY: &str = "self.matches('^[-._a-zA-Z0-9]+$')";
/// `spec.auth.disabled` and a Secret name exclude each other.
pub const AUTH_DISABLED_ALONE: &str =
    "!has(self.disabled) || !self.disabled || !has(self.secretName)";
/// Client certificates need a CA clients get certificates from: a Secret's, not the
/// operator's own.
pub const CLIENT_AUTH_NEEDS_SECRET: &str =
    "!has(self.clientAuth) || self.clientAuth != 'required' || has(self.secretName)";
/// `spec.tls.disabled` excludes every other TLS setting.
pub const TLS_DISABLED_ALONE: &str =
    "!has(self.disabled) || !self.disabled || (!has(self.secretName) && !has(self.clientAuth))";
/// Message of [`TLS_DISABLED_ALONE`].
pub const TLS_DISABLED_ALONE_MSG: &str = "spec.tls.disabled: true serves the Flight port in plaintext, so spec.tls.secretName and spec.tls.clientAuth must be unset";
/// Message of [`CLIENT_AUTH_NEEDS_SECRET`].
pub const CLIENT_AUTH_NEEDS_SECRET_MSG: &str = "spec.tls.clientAuth: required needs spec.tls.secretName: clients present certificates of that Secret's CA (the CA the operator issues when no Secret is named signs no client certificates)";
/// Message of [`AUTH_DISABLED_ALONE`].
pub const AUTH_DISABLED_ALONE_MSG: &str = "spec.auth.disabled: true serves clients without a token, so spec.auth.secretName must be unset";
/// Message of [`SECRET_KEY`] on `spec.auth.key`.
pub const AUTH_KEY_MSG: &str =
    "spec.auth.key must be a Secret key: letters, digits, '-', '_' and '.'";

// ---- spec.pools

/// At least one pool.
pub const POOLS_NOT_EMPTY: &str = "size(self) >= 1";
/// Message of [`POOLS_NOT_EMPTY`].
pub const POOLS_NOT_EMPTY_MSG: &str = "spec.pools must list at least 1 pool (and at most 16)";

/// Pool names are unique.
pub const POOLS_UNIQUE: &str = "self.all(p, self.exists_one(q, q.name == p.name))";
/// Message of [`POOLS_UNIQUE`].
pub const POOLS_UNIQUE_MSG: &str = "spec.pools[].name must be unique within the cluster";

/// No pool is named after another's headless Service (`<pool>-nodes`).
pub const POOL_OBJECTS_DISTINCT: &str = "self.all(p, !self.exists(q, p.name == q.name + '-nodes'))";
/// Message of [`POOL_OBJECTS_DISTINCT`].
pub const POOL_OBJECTS_DISTINCT_MSG: &str = "spec.pools[].name must not be another pool's name followed by '-nodes': pool P's headless Service <cluster>-P-nodes would be pool P-nodes's client Service (rename one of the two)";

/// The pool name is a DNS label.
pub const POOL_NAME: &str = "self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')";
/// Message of [`POOL_NAME`].
pub const POOL_NAME_MSG: &str = "spec.pools[].name must be a DNS label: lower-case letters, digits and '-', starting with a letter and ending with a letter or digit";

/// Shards per pool.
pub const SHARDS: &str = "self >= 1 && self <= 256";
/// Message of [`SHARDS`].
pub const SHARDS_MSG: &str = "spec.pools[].shards must be between 1 and 256";

/// Entry cap per node.
pub const MAX_ENTRIES: &str = "self >= 1";
/// Message of [`MAX_ENTRIES`].
pub const MAX_ENTRIES_MSG: &str = "spec.pools[].maxEntries must be at least 1";

/// A duration both Go (`duration()` in CEL) and the node (humantime) read the same way:
/// whole h, m, s, ms units, largest first, at least one.
pub const TTL_FORMAT: &str = "size(self) > 0 && self.matches('^([0-9]{1,4}h)?([0-9]{1,6}m)?([0-9]{1,8}s)?([0-9]{1,10}ms)?$')";
/// Message of [`TTL_FORMAT`].
pub const TTL_FORMAT_MSG: &str = "spec.pools[].ttl must be a duration in whole h, m, s or ms, largest unit first, e.g. 30s, 15m, 1h or 1h30m";

/// The TTL range (checked only when the format is right).
pub const TTL_RANGE: &str = "!(size(self) > 0 && self.matches('^([0-9]{1,4}h)?([0-9]{1,6}m)?([0-9]{1,8}s)?([0-9]{1,10}ms)?$')) || (duration(self) > duration('0s') && duration(self) <= duration('720h'))";
/// Message of [`TTL_RANGE`].
pub const TTL_RANGE_MSG: &str =
    "spec.pools[].ttl must be greater than 0s and at most 720h (30 days)";

/// A byte quantity both Kubernetes and the node (`quantity::parse_bytes`) read.
pub const BYTES_FORMAT: &str = "self.matches('^[0-9]{1,15}(Ki|Mi|Gi|Ti|k|M|G|T)?$')";
/// Message of [`BYTES_FORMAT`] on `spec.pools[].memoryLimit`.
pub const MEMORY_FORMAT_MSG: &str = "spec.pools[].memoryLimit must be a whole number of bytes with an optional unit Ki, Mi, Gi, Ti, k, M, G or T, e.g. 512Mi or 2Gi";
/// Message of [`BYTES_FORMAT`] on `spec.pools[].persistence.size`.
pub const SIZE_FORMAT_MSG: &str = "spec.pools[].persistence.size must be a whole number of bytes with an optional unit Ki, Mi, Gi, Ti, k, M, G or T, e.g. 1Gi or 20Gi";

/// The memory limit range (checked only when the format is right).
pub const MEMORY_RANGE: &str = "!self.matches('^[0-9]{1,15}(Ki|Mi|Gi|Ti|k|M|G|T)?$') || (quantity(self).compareTo(quantity('64Mi')) >= 0 && quantity(self).compareTo(quantity('1Ti')) <= 0)";
/// Message of [`MEMORY_RANGE`].
pub const MEMORY_RANGE_MSG: &str = "spec.pools[].memoryLimit must be between 64Mi and 1Ti";
/// Smallest memory limit, in bytes (64Mi).
pub const MEMORY_MIN_BYTES: u64 = 64 << 20;
/// Largest memory limit, in bytes (1Ti).
pub const MEMORY_MAX_BYTES: u64 = 1 << 40;

/// Copies of each key.
pub const REPLICAS: &str = "self >= 1 && self <= 2";
/// Message of [`REPLICAS`].
pub const REPLICAS_MSG: &str = "spec.pools[].replicas must be 1 or 2";

/// Replicas at most shards (cross-field, on the pool).
pub const REPLICAS_LE_SHARDS: &str = "self.replicas <= self.shards";
/// Message of [`REPLICAS_LE_SHARDS`].
pub const REPLICAS_LE_SHARDS_MSG: &str = "spec.pools[].replicas must be at most spec.pools[].shards: a key cannot have more copies than the pool has nodes";

/// The memory limit belongs to `memoryLimit`, not `resources` (cross-field, on the pool).
pub const NO_RESOURCES_MEMORY_LIMIT: &str =
    "!has(self.resources) || !has(self.resources.limits) || !('memory' in self.resources.limits)";
/// Message of [`NO_RESOURCES_MEMORY_LIMIT`].
pub const NO_RESOURCES_MEMORY_LIMIT_MSG: &str = "spec.pools[].resources.limits.memory must not be set: the memory limit is spec.pools[].memoryLimit";

/// The volume holds the whole memory limit (cross-field, on the pool).
pub const SIZE_COVERS_MEMORY: &str = "!has(self.persistence) || !self.persistence.size.matches('^[0-9]{1,15}(Ki|Mi|Gi|Ti|k|M|G|T)?$') || !self.memoryLimit.matches('^[0-9]{1,15}(Ki|Mi|Gi|Ti|k|M|G|T)?$') || quantity(self.persistence.size).compareTo(quantity(self.memoryLimit)) >= 0";
/// Message of [`SIZE_COVERS_MEMORY`].
pub const SIZE_COVERS_MEMORY_MSG: &str = "spec.pools[].persistence.size must be at least spec.pools[].memoryLimit, so a node's whole hot set fits on its volume";

/// Label keys a pool spreads over: each a qualified name (an optional DNS-subdomain
/// prefix of at most 253 characters and '/', then a name of at most 63 characters), as
/// a Pod's `topologySpreadConstraints[].topologyKey` must be. The second pattern bounds
/// the prefix; the list's length and item length are bounded by the schema.
pub const SPREAD_KEYS: &str = "self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') && k.matches('^([^/]{1,253}/)?[^/]+$'))";
/// Message of [`SPREAD_KEYS`].
pub const SPREAD_KEYS_MSG: &str = "spec.pools[].scheduling.spread.topologyKeys must be at most 8 distinct node label keys, each an optional DNS-subdomain prefix (at most 253 characters) and '/', then a name of 1 to 63 letters, digits, '-', '_' or '.' starting and ending with a letter or digit, e.g. topology.kubernetes.io/zone";

/// The default spread and explicit constraints exclude each other (on `scheduling`).
pub const SPREAD_OR_CONSTRAINTS: &str = "!has(self.spread) || !has(self.topologySpreadConstraints)";
/// Message of [`SPREAD_OR_CONSTRAINTS`].
pub const SPREAD_OR_CONSTRAINTS_MSG: &str = "spec.pools[].scheduling.spread must be unset when spec.pools[].scheduling.topologySpreadConstraints is set: explicit constraints replace the default spread entirely";

// ---- immutability (transition rules: the API server checks them on update only)

/// Persistence, once on, stays on (transition, on the pool).
pub const PERSISTENCE_KEPT: &str = "has(self.persistence) || !has(oldSelf.persistence)";
/// Message of [`PERSISTENCE_KEPT`].
pub const PERSISTENCE_KEPT_MSG: &str = "spec.pools[].persistence cannot be removed from an existing pool: its volumes hold the pool's warm-restart data (create a new pool instead)";

/// Persistence is not added to an existing pool (transition, on the pool).
pub const PERSISTENCE_NOT_ADDED: &str = "has(oldSelf.persistence) || !has(self.persistence)";
/// Message of [`PERSISTENCE_NOT_ADDED`].
pub const PERSISTENCE_NOT_ADDED_MSG: &str = "spec.pools[].persistence cannot be added to an existing pool: a StatefulSet's volume claim templates are fixed when it is created (add a new pool with persistence, move the clients to it, then remove this one)";

/// The storage class never changes (transition, on `persistence`).
pub const STORAGE_CLASS_IMMUTABLE: &str = "has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)";
/// Message of [`STORAGE_CLASS_IMMUTABLE`].
pub const STORAGE_CLASS_IMMUTABLE_MSG: &str = "spec.pools[].persistence.storageClassName is immutable: existing volumes cannot move to another storage class without losing their data";

/// The volume size never changes (transition, on `persistence.size`); the same quantity in
/// other units is no change.
pub const SIZE_FIXED: &str = "!self.matches('^[0-9]{1,15}(Ki|Mi|Gi|Ti|k|M|G|T)?$') || !oldSelf.matches('^[0-9]{1,15}(Ki|Mi|Gi|Ti|k|M|G|T)?$') || quantity(self).compareTo(quantity(oldSelf)) == 0";
/// Message of [`SIZE_FIXED`].
pub const SIZE_FIXED_MSG: &str = "spec.pools[].persistence.size cannot change once the pool exists: a StatefulSet's volume claim templates are fixed when it is created (to grow the volumes, expand the claims data-<cluster>-<pool>-<n> where their StorageClass allows it; for another size, add a new pool)";
