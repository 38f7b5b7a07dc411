//! Live reconfiguration: applying a node config document to the running store.
//!
//! A document comes from the `configure` action or from a changed config file. It
//! changes only the fields it names. Generations only move forward: a document with a
//! generation older than the running one is refused; one without a generation gets the
//! running generation + 1. Restart-only fields (`listen`, …) are refused by the action
//! and ignored (with a warning) in a re-read file.
//!
//! What a TTL change means for stored entries is the store's rule: entries without a
//! per-entry TTL take the new TTL from their anchor (write time when absolute, last
//! access when sliding), so a shorter TTL expires old entries at once and a longer one
//! extends them. Nothing else is dropped unless it no longer fits the new caps.
//!
//! Owns: the running configuration and its generation. Must not import `flight/` or
//! `wire/`.

use crds::chain;
use parking_lot::Mutex;
use serde::Serialize;

use crds::node_config::{LocationMode, NodeConfig, NodeDocument};
use crds::quantity::format_bytes;

use crate::config::validate_store;
use crate::error::{Error, Result};
use crate::routing::members::{Installed, RoutingTable};
use crate::routing::ring::MemberState;
use crate::store::{Store, StoreConfig};

/// Refuses a `budget` the pod's memory `limit` (if any) cannot hold with the node's
/// baseline on top.
///
/// # Errors
/// [`Error::ConfigRejected`] saying the largest budget that fits.
pub fn budget_fits(budget: u64, limit: Option<u64>) -> Result<()> {
    let Some(limit) = limit else {
        return Ok(());
    };
    let ceiling = limit.saturating_sub(NODE_BASELINE_BYTES);
    if budget <= ceiling {
        return Ok(());
    }
    Err(Error::ConfigRejected(format!(
        "memoryBudget {} is more than this pod can hold: its memory limit is {}, so the budget \
         may be at most {} (the limit less {} for the node itself)",
        format_bytes(budget),
        format_bytes(limit),
        format_bytes(ceiling),
        format_bytes(NODE_BASELINE_BYTES)
    )))
}

/// Memory a node uses besides its budget (runtime, connections, transient copies), kept
/// free below the cgroup limit when a `configure` sets the budget.
pub const NODE_BASELINE_BYTES: u64 = 32 << 20;

/// The running configuration generation and store settings.
#[derive(Debug)]
pub struct LiveConfig {
    state: Mutex<LiveState>,
}

#[derive(Debug, Clone)]
struct LiveState {
    generation: u64,
    store: StoreConfig,
    location_mode: LocationMode,
}

/// What applying a document did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Applied {
    /// The generation now running.
    pub generation: u64,
    /// Entries evicted to fit new, smaller caps.
    pub evicted: u64,
    /// Entries expired at once because of a shorter TTL.
    pub expired: u64,
}

impl LiveConfig {
    /// The configuration the node started with.
    pub fn new(generation: u64, store: StoreConfig, location_mode: LocationMode) -> Self {
        Self {
            state: Mutex::new(LiveState {
                generation,
                store,
                location_mode,
            }),
        }
    }

    /// Which location GetFlightInfo endpoints carry now.
    pub fn location_mode(&self) -> LocationMode {
        self.state.lock().location_mode
    }

    /// The generation running now.
    pub fn generation(&self) -> u64 {
        self.state.lock().generation
    }

    /// The store settings running now.
    pub fn store_config(&self) -> StoreConfig {
        self.state.lock().store.clone()
    }

    /// Applies `doc` to `store`.
    ///
    /// # Errors
    /// [`Error::StaleGeneration`] for an older generation, [`Error::ConfigRejected`] for a
    /// bad value or a cap combination that is not allowed; the running config is then
    /// unchanged.
    pub fn apply(&self, doc: &NodeConfig, store: &Store) -> Result<Applied> {
        let rejected = |err: &dyn std::fmt::Display| Error::ConfigRejected(err.to_string());
        let mut state = self.state.lock();
        let generation = match doc.generation {
            Some(requested) if requested < state.generation => {
                return Err(Error::StaleGeneration {
                    requested,
                    running: state.generation,
                });
            }
            Some(requested) => requested,
            None => state.generation + 1,
        };
        let mut next = state.store.clone();
        if let Some(max_entries) = doc.max_entries {
            next.max_entries = max_entries;
        }
        let budget = doc
            .memory_budget_bytes()
            .map_err(|e| rejected(&chain(&e)))?;
        if let Some(budget) = budget {
            // A budget the pod cannot hold would get it OOM-killed: at most the cgroup
            // limit less the node's own baseline (the operator asks for 80% of the limit
            // less 48 MiB).
            budget_fits(budget, crate::cgroup::memory_limit_bytes())?;
            next.budget_bytes = budget;
        }
        if let Some(max_entry) = doc
            .max_entry_size_bytes()
            .map_err(|e| rejected(&chain(&e)))?
        {
            next.max_entry_bytes = max_entry;
        } else if budget.is_some() && next.max_entry_bytes > next.budget_bytes {
            // A smaller budget without an explicit entry size caps the entry size with it.
            next.max_entry_bytes = next.budget_bytes;
        }
        if let Some(ttl) = doc.ttl_duration().map_err(|e| rejected(&chain(&e)))? {
            next.ttl = ttl;
        }
        if let Some(mode) = doc.ttl_mode {
            next.ttl_mode = mode;
        }
        if let Some(policy) = doc.eviction {
            next.eviction = policy;
        }
        validate_store(&next).map_err(|e| rejected(&e))?;
        let outcome = store.reconfigure(next.clone()).map_err(|e| rejected(&e))?;
        tracing::info!(
            generation,
            max_entries = next.max_entries,
            budget = %format_bytes(next.budget_bytes),
            ttl = ?next.ttl,
            ttl_mode = ?next.ttl_mode,
            eviction = ?next.eviction,
            evicted = outcome.evicted_entries,
            expired = outcome.expired_entries,
            "applied node config"
        );
        state.generation = generation;
        state.store = next;
        if let Some(mode) = doc.location_mode {
            if mode != state.location_mode {
                tracing::info!(location_mode = mode.as_str(), "location mode changed");
            }
            state.location_mode = mode;
        }
        Ok(Applied {
            generation,
            evicted: outcome.evicted_entries,
            expired: outcome.expired_entries,
        })
    }
}

/// What applying a whole document (config fields and topology) did: the `configure`
/// answer of the node-admin contract.
pub use crds::admin::ConfigureAnswer as DocumentApplied;

/// Applies a `configure` document: its config fields (if any) and its topology (if any),
/// all or nothing as far as validation goes (the topology is checked before the config
/// changes, and installed after). A document with only a topology leaves the config
/// generation alone.
///
/// # Errors
/// As [`LiveConfig::apply`], plus [`Error::Routing`] for a topology the ring refuses.
pub fn apply_document(
    doc: &NodeDocument,
    live: &LiveConfig,
    routing: &RoutingTable,
    store: &Store,
) -> Result<DocumentApplied> {
    if let Some(topology) = &doc.topology {
        routing.check(topology)?;
    }
    let applied = if doc.config == NodeConfig::default() && doc.topology.is_some() {
        Applied {
            generation: live.generation(),
            evicted: 0,
            expired: 0,
        }
    } else {
        live.apply(&doc.config, store)?
    };
    if let Some(topology) = &doc.topology {
        let installed = routing.install(topology)?;
        drop_entries_if_joining(installed, routing, store);
    }
    Ok(DocumentApplied {
        generation: applied.generation,
        evicted: applied.evicted,
        expired: applied.expired,
        ring_version: routing.version(),
    })
}

/// After a new ring: a node published `joining` owns no key, so it holds none. The
/// operator publishes a member joining when it is new (empty anyway) or when it was out
/// of the ring (unready too long: crashed, frozen, cut off). Entries such a node kept
/// may have been rewritten or invalidated on their owners meanwhile; served again once
/// it is active they could be stale, so they go now (the owners hand back what was
/// written while it was out). A miss is the price, never a stale read. Dropped, not
/// invalidated ([`Store::drop_all`]): the copies its peers hand back were written while
/// it was out, before this drop, and an invalidation would refuse them — the peers,
/// told "kept", removed theirs, and every key the node owned missed a second time.
pub fn drop_entries_if_joining(installed: Installed, routing: &RoutingTable, store: &Store) {
    if !matches!(installed, Installed::Applied { .. })
        || routing.self_state() != Some(MemberState::Joining)
    {
        return;
    }
    let dropped = store.drop_all();
    if dropped > 0 {
        tracing::warn!(
            dropped,
            ring_version = routing.version(),
            "published joining (out of the key space): dropped the entries held, which may be stale"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_must_fit_the_pods_memory_limit() {
        assert!(
            budget_fits(u64::MAX, None).is_ok(),
            "no cgroup limit: no ceiling"
        );
        assert!(budget_fits(96 << 20, Some(128 << 20)).is_ok());
        let err = budget_fits(100 << 20, Some(128 << 20)).unwrap_err();
        assert!(err.to_string().contains("may be at most 96MiB"), "{err}");
        // The operator's budget (80% of the limit less 48 MiB) always fits.
        for limit in [64u64 << 20, 192 << 20, 2 << 30, 1 << 40] {
            let operator_budget = (limit - (48 << 20)) / 100 * 80;
            assert!(budget_fits(operator_budget, Some(limit)).is_ok(), "{limit}");
        }
    }
}
