//! DoAction and ListActions: the node's admin actions.
//!
//! | type | body | result (JSON unless noted) |
//! |---|---|---|
//! | `ping` | empty | the bytes `pong` |
//! | `invalidate` | a path key (`reports/daily`) or a ticket (`FCT\x01…`, any key kind) | `{"removed": true}` |
//! | `invalidate-prefix` | a non-empty path prefix (`reports/`) | `{"removed": 12}` |
//! | `clear` | empty | `{"removed": 40}` |
//! | `stats` | empty | store counters, limits and the running config generation |
//! | `configure` | a node config document with live fields only and/or a `topology` (see `crds::node_config`) | `{"generation": 4, "evicted": 0, "expired": 0, "ringVersion": 7}` |
//! | `topology` | empty | `{"memberId": "p-0", "version": 7, "replicas": 1, "members": [...]}` (version 0 and no members without a topology) |
//! | `lease` | a path key or a ticket | `{"lease": "granted", "leaseMs": 10000}`, `"hit"`, `"filled"` or `"timeout"` (see `lease.rs`) |
//! | `rebalance` | empty, or `{"dryRun": false, "limit": 1000}` | `{"moved": 120, "movedBytes": 3145728, "failed": 0, "kept": 240, "copied": 0, "copyFailed": 0, "ringVersion": 8}` (see `rebalance.rs`) |
//!
//! With a topology, `invalidate` runs on the key's owner and `invalidate-prefix` / `clear`
//! on every member (the Flight adapter forwards them; see `flight::forward`).

use bytes::Bytes;
use crds::admin;
use crds::node_config::NodeDocument;
use crds::quantity::format_duration;
use serde_json::json;

use crate::error::{Error, Result};
use crate::flight::ticket::CacheTicket;
use crate::key::CacheKey;
use crate::live::{LiveConfig, apply_document};
use crate::routing::members::RoutingTable;
use crate::routing::ring::MemberState;
use crate::store::{RemovalCause, Store};
use crds::chain;

/// An action this node offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAction {
    /// Liveness check.
    Ping,
    /// Remove one key.
    Invalidate,
    /// Remove every path key with a prefix.
    InvalidatePrefix,
    /// Remove everything.
    Clear,
    /// Counters and limits as JSON.
    Stats,
    /// Apply a live config document.
    Configure,
    /// The ring this node routes by.
    Topology,
    /// A fill lease for a missing key (miss coalescing).
    Lease,
    /// Hand entries this node no longer owns to their owners.
    Rebalance,
}

impl NodeAction {
    /// Every action, in ListActions order.
    pub const ALL: [Self; 9] = [
        Self::Ping,
        Self::Invalidate,
        Self::InvalidatePrefix,
        Self::Clear,
        Self::Stats,
        Self::Configure,
        Self::Topology,
        Self::Lease,
        Self::Rebalance,
    ];

    /// The action type string.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ping => "ping",
            Self::Invalidate => "invalidate",
            Self::InvalidatePrefix => "invalidate-prefix",
            Self::Clear => "clear",
            Self::Stats => "stats",
            Self::Configure => "configure",
            Self::Topology => "topology",
            Self::Lease => "lease",
            Self::Rebalance => "rebalance",
        }
    }

    /// ListActions description.
    pub fn description(self) -> &'static str {
        match self {
            Self::Ping => "Answer 'pong'.",
            Self::Invalidate => {
                "Remove one entry. Body: a path key like 'reports/daily', or a ticket."
            }
            Self::InvalidatePrefix => {
                "Remove every path entry starting with the body, e.g. 'reports/'."
            }
            Self::Clear => "Remove every entry.",
            Self::Stats => "Return counters, limits and the config generation as JSON.",
            Self::Configure => {
                "Apply a node config JSON document with live fields (generation, maxEntries, \
                 memoryBudget, maxEntrySize, ttl, ttlMode, eviction, locationMode) and/or a ring topology."
            }
            Self::Topology => "Return this node's member id and the ring it routes by as JSON.",
            Self::Lease => {
                "Miss coalescing. Body: a key. The first caller gets a fill lease (run the query, \
                 DoPut); later callers wait for that DoPut ('filled') or time out."
            }
            Self::Rebalance => {
                "Hand every entry this node no longer owns under its ring to the key's owners, \
                 hottest first, then remove it here. Body: optional JSON {\"dryRun\": bool, \
                 \"limit\": N}. Result: {\"moved\", \"movedBytes\", \"failed\", \"kept\", \
                 \"copied\", \"copyFailed\", \"ringVersion\"}."
            }
        }
    }

    /// Looks up an action type.
    ///
    /// # Errors
    /// [`Error::UnknownAction`].
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|action| action.name() == name)
            .ok_or_else(|| Error::UnknownAction(name.to_owned()))
    }
}

/// Runs `action` with `body` and returns the result body.
///
/// # Errors
/// [`Error::BadActionBody`] for a body the action cannot use; configure errors.
pub fn run(
    action: NodeAction,
    body: &Bytes,
    store: &Store,
    live: &LiveConfig,
    routing: &RoutingTable,
) -> Result<Bytes> {
    let bad_body = |reason: &str| Error::BadActionBody {
        action: action.name(),
        reason: reason.to_owned(),
    };
    let result = match action {
        NodeAction::Ping => return Ok(Bytes::from_static(b"pong")),
        NodeAction::Invalidate => {
            let key = key_from_body(action, body)?;
            let removed = store.invalidate(&key.to_store_bytes());
            return Ok(Bytes::from(admin::encode(&admin::InvalidateAnswer {
                removed,
            })));
        }
        NodeAction::InvalidatePrefix | NodeAction::Clear => {
            let removed = remove_here(action, body, store)?;
            return Ok(Bytes::from(admin::encode(&admin::RemovedAnswer {
                removed,
            })));
        }
        NodeAction::Stats => {
            let mut stats = stats_json(store, live);
            stats["ringVersion"] = routing.version().into();
            stats["memberId"] = routing.self_id().into();
            let current = routing.current();
            // This node's state in the ring (null without a topology or when not a member)
            // and the copies per key it writes.
            stats["memberState"] = current
                .as_ref()
                .and_then(|m| m.ring().member(routing.self_id()?).map(|m| m.state()))
                .map(|state| match state {
                    MemberState::Active => "active",
                    MemberState::Joining => "joining",
                    MemberState::Draining => "draining",
                })
                .into();
            stats["replicas"] = current.map_or(1, |m| m.replicas()).into();
            stats
        }
        NodeAction::Configure => {
            let text =
                std::str::from_utf8(body).map_err(|_| bad_body("the body must be UTF-8 JSON"))?;
            let doc = NodeDocument::from_json(text).map_err(|err| bad_body(&chain(&err)))?;
            doc.config
                .ensure_live_only()
                .map_err(|err| bad_body(&err.to_string()))?;
            let applied = apply_document(&doc, live, routing, store)?;
            return Ok(Bytes::from(admin::encode(&applied)));
        }
        NodeAction::Lease => {
            // Leases wait for a DoPut, so the Flight adapter runs them (async).
            return Err(Error::Unimplemented(
                "the lease action outside the Flight service",
            ));
        }
        NodeAction::Rebalance => {
            // Rebalance sends entries to other nodes, so the Flight adapter runs it.
            return Err(Error::Unimplemented(
                "the rebalance action outside the Flight service",
            ));
        }
        NodeAction::Topology => {
            let current = routing.current();
            let answer = admin::TopologyAnswer {
                member_id: routing.self_id().map(str::to_owned),
                version: routing.version(),
                replicas: current.as_ref().map_or(1, |m| m.replicas() as u64),
                members: current
                    .map(|m| m.topology().members.clone())
                    .unwrap_or_default(),
            };
            return Ok(Bytes::from(admin::encode(&answer)));
        }
    };
    Ok(Bytes::from(result.to_string()))
}

/// Runs `invalidate-prefix` or `clear` on this node's store alone; the entries removed.
///
/// # Errors
/// [`Error::BadActionBody`] for a prefix that is empty or not UTF-8.
pub fn remove_here(action: NodeAction, body: &Bytes, store: &Store) -> Result<u64> {
    let bad_body = |reason: &str| Error::BadActionBody {
        action: action.name(),
        reason: reason.to_owned(),
    };
    if action == NodeAction::Clear {
        return Ok(store.clear());
    }
    let prefix = std::str::from_utf8(body).map_err(|_| bad_body("the prefix must be UTF-8"))?;
    if prefix.is_empty() {
        return Err(bad_body(
            "the prefix is empty; use the 'clear' action to remove everything",
        ));
    }
    Ok(store.invalidate_prefix(&CacheKey::path_prefix_store_bytes(prefix)))
}

/// The key an `invalidate` or `lease` body names: a path key or a ticket.
///
/// # Errors
/// [`Error::BadActionBody`] or [`Error::BadTicket`].
pub fn key_from_body(action: NodeAction, body: &Bytes) -> Result<CacheKey> {
    let bad_body = |reason: &str| Error::BadActionBody {
        action: action.name(),
        reason: reason.to_owned(),
    };
    if CacheTicket::looks_like_ticket(body) {
        return Ok(CacheTicket::try_decode(body)?.key);
    }
    let path = std::str::from_utf8(body)
        .map_err(|_| bad_body("a path key must be UTF-8; send a ticket for command keys"))?;
    if path.is_empty() {
        return Err(bad_body("name the key to remove, e.g. 'reports/daily'"));
    }
    Ok(CacheKey::Path(path.to_owned()))
}

/// The `stats` document.
pub fn stats_json(store: &Store, live: &LiveConfig) -> serde_json::Value {
    let stats = store.stats();
    let config = live.store_config();
    let evictions: serde_json::Map<String, serde_json::Value> = RemovalCause::ALL
        .into_iter()
        .map(|cause| (cause.as_str().to_owned(), stats.evictions.get(cause).into()))
        .collect();
    json!({
        "generation": live.generation(),
        "locationMode": live.location_mode().as_str(),
        "entries": stats.entries,
        "usedBytes": stats.used_bytes,
        "reservedBytes": stats.reserved_bytes,
        "budgetBytes": stats.budget_bytes,
        "maxEntries": stats.max_entries,
        "maxEntryBytes": config.max_entry_bytes,
        "ttl": format_duration(config.ttl),
        "ttlMode": format!("{:?}", config.ttl_mode).to_lowercase(),
        "eviction": format!("{:?}", config.eviction).to_lowercase(),
        "hits": stats.hits,
        "misses": stats.misses,
        "inserts": stats.inserts,
        "rejectedPuts": stats.rejected_puts,
        "evictions": evictions,
    })
}
