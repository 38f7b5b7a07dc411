//! The store's live settings ([`StoreConfig`]) and the small enums around them:
//! TTL mode, eviction policy and removal cause.
//!
//! Settings arrive already parsed into domain types; [`StoreConfig::validate`] checks
//! the cross-field rules. Pure, no I/O.
//!
//! Owns: the settings and their validation. Like all of `store/`, imports nothing
//! outside the store and no gRPC or Flight crate.

use std::time::Duration;

use super::error::{Error, Result};

/// Settings of a [`Store`](super::Store); all of them can change live through
/// [`Store::reconfigure`](super::Store::reconfigure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Most entries held at once. At least 1.
    pub max_entries: u64,
    /// Bytes that stored entries plus in-flight reservations may use. Above 0.
    pub budget_bytes: u64,
    /// Largest single entry, as weighed by the `weight` module (Arrow buffers, key
    /// and fixed overhead). Above 0 and at most `budget_bytes`.
    pub max_entry_bytes: u64,
    /// Time to live of an entry without a per-entry override. Above 0.
    pub ttl: Duration,
    /// Whether the TTL counts from insertion or from the last read.
    pub ttl_mode: TtlMode,
    /// How victims are chosen when a cap needs room.
    pub eviction: EvictionPolicy,
}

impl StoreConfig {
    /// Checks the cross-field rules.
    ///
    /// # Errors
    ///
    /// Returns [`Error::InvalidConfig`] naming the first field that breaks a rule:
    /// `max_entries >= 1`, `budget_bytes > 0`,
    /// `0 < max_entry_bytes <= budget_bytes`, `ttl > 0`.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, rule| Err(Error::InvalidConfig { field, rule });
        if self.max_entries == 0 {
            return invalid("max_entries", "must be at least 1");
        }
        if self.budget_bytes == 0 {
            return invalid("budget_bytes", "must be greater than 0");
        }
        if self.max_entry_bytes == 0 {
            return invalid("max_entry_bytes", "must be greater than 0");
        }
        if self.max_entry_bytes > self.budget_bytes {
            return invalid("max_entry_bytes", "must not exceed budget_bytes");
        }
        if self.ttl.is_zero() {
            return invalid("ttl", "must be greater than 0");
        }
        Ok(())
    }
}

// The TTL mode and eviction policy are the contract's own types (`crds::node_config`):
// one definition from the CRD to the store, no conversions between look-alikes.
pub use crds::node_config::{EvictionPolicy, TtlMode};

/// Why an entry left the store; also the `cause` label of the evictions metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RemovalCause {
    /// Its time to live ran out.
    Expired,
    /// A cap (bytes or entries) needed room.
    Size,
    /// An invalidation or clear removed it.
    Explicit,
    /// A newer put for the same key replaced it.
    Replaced,
    /// It was handed to the key's owners (the `rebalance` action) and removed here.
    Migrated,
}

impl RemovalCause {
    /// Every cause, in a stable order (for metric registration).
    pub const ALL: [RemovalCause; 5] = [
        RemovalCause::Expired,
        RemovalCause::Size,
        RemovalCause::Explicit,
        RemovalCause::Replaced,
        RemovalCause::Migrated,
    ];

    /// The metric label: `"expired"`, `"size"`, `"explicit"`, `"replaced"` or `"migrated"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RemovalCause::Expired => "expired",
            RemovalCause::Size => "size",
            RemovalCause::Explicit => "explicit",
            RemovalCause::Replaced => "replaced",
            RemovalCause::Migrated => "migrated",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> StoreConfig {
        StoreConfig {
            max_entries: 10,
            budget_bytes: 1000,
            max_entry_bytes: 500,
            ttl: Duration::from_secs(60),
            ttl_mode: TtlMode::Absolute,
            eviction: EvictionPolicy::Lru,
        }
    }

    fn rejected_field(config: StoreConfig) -> &'static str {
        match config.validate() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("expected an invalid config, got {other:?}"),
        }
    }

    #[test]
    fn validate_accepts_a_sane_config_and_equal_entry_and_budget_bytes() {
        assert_eq!(valid().validate(), Ok(()));
        let config = StoreConfig {
            max_entry_bytes: 1000,
            ..valid()
        };
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn validate_names_the_offending_field() {
        let cases = [
            (
                StoreConfig {
                    max_entries: 0,
                    ..valid()
                },
                "max_entries",
            ),
            (
                StoreConfig {
                    budget_bytes: 0,
                    ..valid()
                },
                "budget_bytes",
            ),
            (
                StoreConfig {
                    max_entry_bytes: 0,
                    ..valid()
                },
                "max_entry_bytes",
            ),
            (
                StoreConfig {
                    max_entry_bytes: 1001,
                    ..valid()
                },
                "max_entry_bytes",
            ),
            (
                StoreConfig {
                    ttl: Duration::ZERO,
                    ..valid()
                },
                "ttl",
            ),
        ];
        for (config, field) in cases {
            assert_eq!(rejected_field(config), field);
        }
    }

    #[test]
    fn invalid_config_message_names_field_and_rule() {
        let err = StoreConfig {
            ttl: Duration::ZERO,
            ..valid()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid store config: ttl must be greater than 0"
        );
    }

    #[test]
    fn removal_cause_labels_are_stable() {
        let labels: Vec<_> = RemovalCause::ALL
            .iter()
            .map(|cause| cause.as_str())
            .collect();
        assert_eq!(
            labels,
            ["expired", "size", "explicit", "replaced", "migrated"]
        );
    }
}
