//! The node configuration file: what the operator writes and `flightcache-node` reads.
//!
//! The file is JSON (`--config FILE`), every field optional; a field left out keeps the
//! value from the command line, the environment or the built-in default. The same
//! document is the body of the node's `configure` action, where only the live fields
//! (`generation`, `maxEntries`, `memoryBudget`, `maxEntrySize`, `ttl`, `ttlMode`,
//! `eviction`) may be set.
//!
//! ```json
//! {
//!   "generation": 3,
//!   "listen": "0.0.0.0:50051",
//!   "metricsListen": "0.0.0.0:9090",
//!   "maxEntries": 100000,
//!   "memoryBudget": "1536MiB",
//!   "maxEntrySize": "256MiB",
//!   "ttl": "1h",
//!   "ttlMode": "sliding",
//!   "eviction": "tinylfu",
//!   "authTokenFile": "/etc/flightcache/auth/token",
//!   "shutdownGrace": "20s"
//! }
//! ```
//!
//! Pure: parsing and validation only, no I/O.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::quantity::{self, QuantityError};

/// How an entry's time-to-live is anchored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TtlMode {
    /// The entry expires `ttl` after it was written, however often it is read.
    Absolute,
    /// The entry expires `ttl` after it was last written or read (re-warmed on read).
    Sliding,
}

impl TtlMode {
    /// The lower-case name used in flags, files and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Absolute => "absolute",
            Self::Sliding => "sliding",
        }
    }
}

/// Which entry makes room when a cap is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EvictionPolicy {
    /// Least recently used first.
    Lru,
    /// W-TinyLFU: a small recency window plus frequency-based admission, which keeps a
    /// hot set through scans of one-off keys.
    Tinylfu,
}

impl EvictionPolicy {
    /// The lower-case name used in flags, files and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::Tinylfu => "tinylfu",
        }
    }
}

impl std::str::FromStr for TtlMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "absolute" => Ok(Self::Absolute),
            "sliding" => Ok(Self::Sliding),
            other => Err(format!(
                "'{other}' is not a TTL mode: use absolute or sliding"
            )),
        }
    }
}

impl std::str::FromStr for EvictionPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "lru" => Ok(Self::Lru),
            "tinylfu" => Ok(Self::Tinylfu),
            other => Err(format!(
                "'{other}' is not an eviction policy: use lru or tinylfu"
            )),
        }
    }
}

/// The node configuration document. See the module docs for an example.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    /// Configuration generation; a node never goes back to an older one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Flight listen address (restart to change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Prometheus `/metrics` listen address (restart to change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
    /// Maximum number of entries the node holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<u64>,
    /// Byte budget for cached Arrow data, e.g. `512MiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget: Option<String>,
    /// Largest single entry accepted, e.g. `64MiB`; at most `memoryBudget`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entry_size: Option<String>,
    /// Default time-to-live of an entry, e.g. `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// `absolute` or `sliding`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_mode: Option<TtlMode>,
    /// `lru` or `tinylfu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<EvictionPolicy>,
    /// File holding the bearer token clients must present (restart to change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_token_file: Option<String>,
    /// How long in-flight streams may run after SIGTERM, e.g. `20s` (restart to change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_grace: Option<String>,
}

/// A node configuration document that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NodeConfigError {
    /// Not JSON, or not the shape of [`NodeConfig`] (unknown or mistyped field).
    #[error("node config is not valid: {0}")]
    Syntax(#[source] serde_json::Error),
    /// A field holds a value that cannot be parsed.
    #[error("node config field '{field}' is invalid")]
    Field {
        /// The camelCase field name as written in the file.
        field: &'static str,
        /// What was wrong with it.
        #[source]
        source: QuantityError,
    },
    /// A field may not be changed while the node runs.
    #[error("node config field '{field}' cannot change without a restart")]
    NotLive {
        /// The camelCase field name.
        field: &'static str,
    },
}

impl NodeConfig {
    /// Parses a JSON document.
    ///
    /// # Errors
    /// [`NodeConfigError::Syntax`] naming the offending field or position.
    pub fn from_json(text: &str) -> Result<Self, NodeConfigError> {
        serde_json::from_str(text).map_err(NodeConfigError::Syntax)
    }

    /// Serialises the document as pretty JSON, the way the operator writes it.
    pub fn to_json(&self) -> String {
        // Serialising a struct of strings, numbers and enums cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// `memoryBudget` in bytes, if set.
    ///
    /// # Errors
    /// [`NodeConfigError::Field`] naming `memoryBudget`.
    pub fn memory_budget_bytes(&self) -> Result<Option<u64>, NodeConfigError> {
        parse_field(
            "memoryBudget",
            self.memory_budget.as_deref(),
            quantity::parse_bytes,
        )
    }

    /// `maxEntrySize` in bytes, if set.
    ///
    /// # Errors
    /// [`NodeConfigError::Field`] naming `maxEntrySize`.
    pub fn max_entry_size_bytes(&self) -> Result<Option<u64>, NodeConfigError> {
        parse_field(
            "maxEntrySize",
            self.max_entry_size.as_deref(),
            quantity::parse_bytes,
        )
    }

    /// `ttl` as a duration, if set.
    ///
    /// # Errors
    /// [`NodeConfigError::Field`] naming `ttl`.
    pub fn ttl_duration(&self) -> Result<Option<Duration>, NodeConfigError> {
        parse_field("ttl", self.ttl.as_deref(), quantity::parse_duration)
    }

    /// `shutdownGrace` as a duration, if set.
    ///
    /// # Errors
    /// [`NodeConfigError::Field`] naming `shutdownGrace`.
    pub fn shutdown_grace_duration(&self) -> Result<Option<Duration>, NodeConfigError> {
        parse_field(
            "shutdownGrace",
            self.shutdown_grace.as_deref(),
            quantity::parse_duration,
        )
    }

    /// Refuses fields that only take effect at start, for the `configure` action.
    ///
    /// # Errors
    /// [`NodeConfigError::NotLive`] naming the first such field.
    pub fn ensure_live_only(&self) -> Result<(), NodeConfigError> {
        let restart_only = [
            ("listen", self.listen.is_some()),
            ("metricsListen", self.metrics_listen.is_some()),
            ("authTokenFile", self.auth_token_file.is_some()),
            ("shutdownGrace", self.shutdown_grace.is_some()),
        ];
        match restart_only.into_iter().find(|(_, set)| *set) {
            Some((field, _)) => Err(NodeConfigError::NotLive { field }),
            None => Ok(()),
        }
    }
}

fn parse_field<T>(
    field: &'static str,
    value: Option<&str>,
    parse: fn(&str) -> Result<T, QuantityError>,
) -> Result<Option<T>, NodeConfigError> {
    value
        .map(parse)
        .transpose()
        .map_err(|source| NodeConfigError::Field { field, source })
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let doc = r#"{"generation": 3, "listen": "0.0.0.0:50051", "maxEntries": 100000,
            "memoryBudget": "1536MiB", "maxEntrySize": "256MiB", "ttl": "1h",
            "ttlMode": "sliding", "eviction": "tinylfu", "shutdownGrace": "20s"}"#;
        let config = NodeConfig::from_json(doc).unwrap();
        assert_eq!(config.generation, Some(3));
        assert_eq!(config.memory_budget_bytes().unwrap(), Some(1536 << 20));
        assert_eq!(
            config.ttl_duration().unwrap(),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(config.ttl_mode, Some(TtlMode::Sliding));
        assert_eq!(config.eviction, Some(EvictionPolicy::Tinylfu));
        assert_eq!(NodeConfig::from_json(&config.to_json()).unwrap(), config);
    }

    #[test]
    fn unknown_and_mistyped_fields_are_named() {
        let err = NodeConfig::from_json(r#"{"maxEntires": 5}"#).unwrap_err();
        assert!(err.source().unwrap().to_string().contains("maxEntires"));
        let err = NodeConfig::from_json(r#"{"eviction": "random"}"#).unwrap_err();
        assert!(err.source().unwrap().to_string().contains("random"));
    }

    #[test]
    fn bad_values_name_their_field() {
        let config = NodeConfig::from_json(r#"{"memoryBudget": "lots", "ttl": "soon"}"#).unwrap();
        let err = config.memory_budget_bytes().unwrap_err();
        assert_eq!(
            err.to_string(),
            "node config field 'memoryBudget' is invalid"
        );
        assert!(err.source().unwrap().to_string().contains("lots"));
        assert!(
            config
                .ttl_duration()
                .unwrap_err()
                .to_string()
                .contains("'ttl'")
        );
    }

    #[test]
    fn restart_only_fields_are_refused_for_live_changes() {
        let config = NodeConfig::from_json(r#"{"ttl": "5m", "listen": "0.0.0.0:1"}"#).unwrap();
        assert!(matches!(
            config.ensure_live_only(),
            Err(NodeConfigError::NotLive { field: "listen" })
        ));
        let live = NodeConfig::from_json(r#"{"ttl": "5m", "maxEntries": 9}"#).unwrap();
        assert!(live.ensure_live_only().is_ok());
    }
}
