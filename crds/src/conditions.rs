//! Condition types and reasons of `CacheCluster.status.conditions`.
//!
//! Conditions have the `metav1.Condition` shape. Types and reasons are constants so the
//! operator, its tests and the docs agree on every spelling; reasons are CamelCase, as
//! Kubernetes requires. Pure constants; no I/O.

/// Every shard of every pool is ready to serve.
pub const READY: &str = "Ready";
/// A rollout, resize or ring change is under way.
pub const PROGRESSING: &str = "Progressing";
/// The spec cannot be carried out, or nodes fail.
pub const DEGRADED: &str = "Degraded";

/// Every condition type, in the order the operator writes them.
pub const TYPES: [&str; 3] = [READY, PROGRESSING, DEGRADED];

/// Condition reasons.
pub mod reasons {
    /// `Ready=True`: every shard of every pool is ready.
    pub const ALL_SHARDS_READY: &str = "AllShardsReady";
    /// `Ready=False`: some shards are not ready (starting, restarting or failing); also
    /// `Progressing=True` while they come up outside a rollout.
    pub const SHARDS_NOT_READY: &str = "ShardsNotReady";
    /// `Progressing=True`: nodes are being created for a new cluster or pool.
    pub const CREATING: &str = "Creating";
    /// `Progressing=True`: a live configuration change is being pushed to the nodes.
    pub const CONFIGURING: &str = "Configuring";
    /// `Progressing=True`: nodes restart one at a time with handoff (pod template change).
    pub const ROLLING_OUT: &str = "RollingOut";
    /// `Progressing=True`: memory limits are being resized in place.
    pub const RESIZING: &str = "Resizing";
    /// `Progressing=True`: the hash ring changes and keys migrate (shards or replicas).
    pub const REBALANCING: &str = "Rebalancing";
    /// `Progressing=False`: every node runs the current spec.
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    /// `Degraded=True` (and `Progressing=False`): the spec breaks a rule the API server
    /// could not check (e.g. an object stored under an older CRD); the message names
    /// the field.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// `Degraded=True`: a child object could not be applied.
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// `Degraded=False`: nothing is wrong.
    pub const AS_EXPECTED: &str = "AsExpected";

    /// Every reason, for docs and tests.
    pub const ALL: [&str; 11] = [
        ALL_SHARDS_READY,
        SHARDS_NOT_READY,
        CREATING,
        CONFIGURING,
        ROLLING_OUT,
        RESIZING,
        REBALANCING,
        ROLLOUT_COMPLETE,
        INVALID_SPEC,
        APPLY_FAILED,
        AS_EXPECTED,
    ];
}

/// One documented (type, status, reason) combination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasonDoc {
    /// Condition type.
    pub condition: &'static str,
    /// `True` or `False`.
    pub status: &'static str,
    /// The reason.
    pub reason: &'static str,
    /// What it means, for `docs/crd-reference.md`.
    pub meaning: &'static str,
}

/// Every (condition, status, reason) the operator writes.
pub const CATALOG: [ReasonDoc; 13] = [
    doc(
        READY,
        "True",
        reasons::ALL_SHARDS_READY,
        "every shard of every pool is ready",
    ),
    doc(
        READY,
        "False",
        reasons::SHARDS_NOT_READY,
        "some shards are not ready (starting, restarting or failing)",
    ),
    doc(
        PROGRESSING,
        "True",
        reasons::CREATING,
        "nodes are being created for a new cluster or pool",
    ),
    doc(
        PROGRESSING,
        "True",
        reasons::SHARDS_NOT_READY,
        "some nodes are starting or restarting outside a rollout (e.g. a node was killed)",
    ),
    doc(
        PROGRESSING,
        "True",
        reasons::CONFIGURING,
        "a live configuration change is being pushed to the nodes",
    ),
    doc(
        PROGRESSING,
        "True",
        reasons::ROLLING_OUT,
        "nodes restart one at a time with handoff (pod template change)",
    ),
    doc(
        PROGRESSING,
        "True",
        reasons::RESIZING,
        "memory limits are being resized in place",
    ),
    doc(
        PROGRESSING,
        "True",
        reasons::REBALANCING,
        "the hash ring changes and keys migrate (shards or replicas)",
    ),
    doc(
        PROGRESSING,
        "False",
        reasons::ROLLOUT_COMPLETE,
        "every node runs the current spec",
    ),
    doc(
        PROGRESSING,
        "False",
        reasons::INVALID_SPEC,
        "nothing changes until the spec is fixed (see Degraded)",
    ),
    doc(
        DEGRADED,
        "True",
        reasons::INVALID_SPEC,
        "the spec breaks a rule the API server did not check (e.g. stored under an older CRD); the message names the field",
    ),
    doc(
        DEGRADED,
        "True",
        reasons::APPLY_FAILED,
        "a child object could not be applied",
    ),
    doc(DEGRADED, "False", reasons::AS_EXPECTED, "nothing is wrong"),
];

const fn doc(
    condition: &'static str,
    status: &'static str,
    reason: &'static str,
    meaning: &'static str,
) -> ReasonDoc {
    ReasonDoc {
        condition,
        status,
        reason,
        meaning,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// metav1.Condition: `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, at most 1024.
    fn is_valid_reason(reason: &str) -> bool {
        let mut chars = reason.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && reason.chars().all(|c| c.is_ascii_alphanumeric())
    }

    #[test]
    fn types_and_reasons_are_camel_case_and_distinct() {
        for name in TYPES.iter().chain(reasons::ALL.iter()) {
            assert!(is_valid_reason(name), "{name}");
            assert!(name.starts_with(|c: char| c.is_ascii_uppercase()), "{name}");
        }
        let mut all: Vec<_> = reasons::ALL.to_vec();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), reasons::ALL.len());
    }

    #[test]
    fn the_catalog_documents_every_reason_under_a_known_type() {
        for reason in reasons::ALL {
            assert!(
                CATALOG.iter().any(|entry| entry.reason == reason),
                "{reason} undocumented"
            );
        }
        for entry in CATALOG {
            assert!(reasons::ALL.contains(&entry.reason), "{}", entry.reason);
            assert!(TYPES.contains(&entry.condition));
            assert!(matches!(entry.status, "True" | "False"));
        }
        let mut combinations: Vec<_> = CATALOG
            .iter()
            .map(|entry| (entry.condition, entry.status, entry.reason))
            .collect();
        combinations.sort_unstable();
        combinations.dedup();
        assert_eq!(combinations.len(), CATALOG.len());
    }
}
