//! How a change of each `CacheCluster` spec field reaches the running nodes.
//!
//! Every spec field belongs to one class; the operator picks its rollout from it and
//! `docs/crd-reference.md` lists it. A unit test keeps this table and the schema in
//! step, so a new field cannot ship without a decision. Pure; no I/O.

/// How a change of a spec field rolls out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChangeClass {
    /// Pushed to running nodes (the `configure` action) and written to the ConfigMap;
    /// no restart, no pod template change.
    Live,
    /// The container's memory limit changes in place where the cluster supports pod
    /// resize (the node's byte budget lowered before the limit, raised after it);
    /// otherwise as [`ChangeClass::RestartWithHandoff`].
    Resize,
    /// The pod template changes: nodes restart one at a time under the operator's
    /// control, each node's hot set handed off to its peers or reloaded from its disk
    /// tier.
    RestartWithHandoff,
    /// The pool's hash ring changes: nodes join or leave one at a time and the keys that
    /// change owner are migrated, not dropped.
    RingChange,
    /// Set when the pool is created; the API server refuses a change to an existing
    /// pool (a StatefulSet's volume claim templates cannot change).
    Fixed,
}

impl ChangeClass {
    /// The name used in docs and in the field descriptions (`Change: <name>`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Resize => "resize",
            Self::RestartWithHandoff => "restart with handoff",
            Self::RingChange => "ring change",
            Self::Fixed => "fixed",
        }
    }

    /// Every class, in the order the docs list them.
    pub const ALL: [Self; 5] = [
        Self::Live,
        Self::Resize,
        Self::RestartWithHandoff,
        Self::RingChange,
        Self::Fixed,
    ];
}

/// The change class of every spec field that has one, by path (`[]` marks a list item).
///
/// Fields without a class: `spec.pools` itself (adding a pool creates its nodes,
/// removing one deletes them), `spec.pools[].name` (the pool's key: a new name is a new
/// pool), and `spec.monitoring` and `spec.networkPolicy` (groups of fields).
pub const SPEC_FIELDS: &[(&str, ChangeClass)] = &[
    ("spec.image", ChangeClass::RestartWithHandoff),
    ("spec.port", ChangeClass::RestartWithHandoff),
    ("spec.auth", ChangeClass::RestartWithHandoff),
    ("spec.auth.secretName", ChangeClass::RestartWithHandoff),
    ("spec.auth.key", ChangeClass::RestartWithHandoff),
    ("spec.auth.disabled", ChangeClass::RestartWithHandoff),
    ("spec.tls", ChangeClass::RestartWithHandoff),
    ("spec.tls.secretName", ChangeClass::RestartWithHandoff),
    ("spec.tls.clientAuth", ChangeClass::RestartWithHandoff),
    ("spec.tls.disabled", ChangeClass::RestartWithHandoff),
    (
        "spec.monitoring.metricsPort",
        ChangeClass::RestartWithHandoff,
    ),
    ("spec.monitoring.serviceMonitor", ChangeClass::Live),
    ("spec.networkPolicy.disabled", ChangeClass::Live),
    ("spec.networkPolicy.clients", ChangeClass::Live),
    ("spec.networkPolicy.metricsScrapers", ChangeClass::Live),
    ("spec.pools[].shards", ChangeClass::RingChange),
    ("spec.pools[].maxEntries", ChangeClass::Live),
    ("spec.pools[].ttl", ChangeClass::Live),
    ("spec.pools[].ttlMode", ChangeClass::Live),
    ("spec.pools[].memoryLimit", ChangeClass::Resize),
    ("spec.pools[].eviction", ChangeClass::Live),
    ("spec.pools[].locationMode", ChangeClass::Live),
    ("spec.pools[].replicas", ChangeClass::RingChange),
    ("spec.pools[].image", ChangeClass::RestartWithHandoff),
    ("spec.pools[].persistence", ChangeClass::Fixed),
    ("spec.pools[].persistence.size", ChangeClass::Fixed),
    (
        "spec.pools[].persistence.storageClassName",
        ChangeClass::Fixed,
    ),
    ("spec.pools[].resources", ChangeClass::RestartWithHandoff),
    ("spec.pools[].scheduling", ChangeClass::RestartWithHandoff),
    (
        "spec.pools[].scheduling.nodeSelector",
        ChangeClass::RestartWithHandoff,
    ),
    (
        "spec.pools[].scheduling.affinity",
        ChangeClass::RestartWithHandoff,
    ),
    (
        "spec.pools[].scheduling.tolerations",
        ChangeClass::RestartWithHandoff,
    ),
    (
        "spec.pools[].scheduling.topologySpreadConstraints",
        ChangeClass::RestartWithHandoff,
    ),
    (
        "spec.pools[].scheduling.spread",
        ChangeClass::RestartWithHandoff,
    ),
    (
        "spec.pools[].scheduling.spread.topologyKeys",
        ChangeClass::RestartWithHandoff,
    ),
    (
        "spec.pools[].scheduling.spread.whenUnsatisfiable",
        ChangeClass::RestartWithHandoff,
    ),
    (
        "spec.pools[].scheduling.priorityClassName",
        ChangeClass::RestartWithHandoff,
    ),
];

/// The change class of the field at `path` (e.g. `spec.pools[].ttl`), or of its nearest
/// ancestor that has one (fields inside embedded Kubernetes types such as
/// `spec.pools[].resources.requests` take the class of the embedding field).
pub fn of(path: &str) -> Option<ChangeClass> {
    let mut candidate = path;
    loop {
        if let Some((_, class)) = SPEC_FIELDS.iter().find(|(field, _)| *field == candidate) {
            return Some(*class);
        }
        let (parent, _) = candidate.rsplit_once('.')?;
        candidate = parent;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_fields_are_exactly_the_node_config_live_fields() {
        use crate::node_config::LiveField;
        let live: Vec<String> = SPEC_FIELDS
            .iter()
            .filter(|(path, class)| *class == ChangeClass::Live && path.starts_with("spec.pools"))
            .map(|(path, _)| (*path).to_owned())
            .collect();
        // Every live node field a pool spells the same is live in the spec; the
        // generation is the object's, and the byte budget and entry size follow the
        // memory limit, which resizes.
        let expected: Vec<String> = LiveField::ALL
            .into_iter()
            .filter(|field| *field != LiveField::Generation && !field.follows_memory())
            .map(|field| format!("spec.pools[].{}", field.name()))
            .collect();
        assert_eq!(live, expected);
        assert_eq!(of("spec.pools[].memoryLimit"), Some(ChangeClass::Resize));
    }

    #[test]
    fn nested_fields_take_the_class_of_their_nearest_classified_ancestor() {
        assert_eq!(of("spec.pools[].ttl"), Some(ChangeClass::Live));
        assert_eq!(of("spec.pools[].memoryLimit"), Some(ChangeClass::Resize));
        assert_eq!(of("spec.pools[].shards"), Some(ChangeClass::RingChange));
        assert_eq!(
            of("spec.pools[].resources.requests"),
            Some(ChangeClass::RestartWithHandoff)
        );
        assert_eq!(of("spec.pools[].name"), None);
        assert_eq!(of("spec.pools"), None);
    }
}
