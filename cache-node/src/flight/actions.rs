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
//! | `lease` | a path key or a ticket | `{"lease": "granted", "leaseMs": 10000}`, `"hit"`, `"filled"` or `"timeout"` (see `cluster/lease.rs`) |
//! | `rebalance` | empty, or `{"dryRun": false, "limit": 1000}` | `{"moved": 120, "movedBytes": 3145728, "failed": 0, "kept": 240, "copied": 0, "copyFailed": 0, "ringVersion": 8}` (see `cluster/rebalance.rs`) |
//! | `held` | up to 1,024 keys' store bytes, each after its length (u32, big-endian; `crds::admin::HeldRequest`) | `{"held": [true, false]}`: which of them this node's store holds (a peer's batched copy check, see `cluster/rebalance.rs`; admin or peer credential) |
//!
//! With a topology, `invalidate` runs on the key's owner and `invalidate-prefix` / `clear`
//! on every member (the cluster layer forwards them; see `cluster::forward`, `cluster::fan_out`).
//!
//! Owns: parsing an action's name and body and running the local ones against the
//! store, the live config and the routing table, with their typed answers
//! (`crds::admin`). Must not import `wire/` or `cluster/`: the actions that call peers
//! (lease, rebalance, the fan-out of invalidate-prefix and clear) are handed to the
//! cluster layer by the Flight service (`flight/mod.rs`).

use bytes::Bytes;
use crds::admin;
use crds::node_config::{self, NodeDocument};

use crate::error::{Error, Result};
use crate::key::CacheKey;
use crate::live::{LiveConfig, apply_document};
use crate::routing::members::RoutingTable;
use crate::routing::ring::MemberState;
use crate::store::{EvictionPolicy, RemovalCause, Store, TtlMode};
use crate::ticket::CacheTicket;
use crds::chain;

/// An action this node offers: the contract's action type (`crds::admin`), so the node,
/// the operator and the load generator name actions the same way.
pub use crds::admin::AdminAction as NodeAction;

/// Looks up an action type.
///
/// # Errors
/// [`Error::UnknownAction`].
pub fn parse(name: &str) -> Result<NodeAction> {
    name.parse()
        .map_err(|admin::UnknownAction(name)| Error::UnknownAction(name))
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
        action: action.as_str(),
        reason: reason.to_owned(),
    };
    match action {
        NodeAction::Ping => Ok(Bytes::from_static(b"pong")),
        NodeAction::Invalidate => {
            let key = key_from_body(action, body)?;
            let removed = store.invalidate(&key.to_store_bytes());
            Ok(Bytes::from(admin::encode(&admin::InvalidateAnswer {
                removed,
            })))
        }
        NodeAction::InvalidatePrefix | NodeAction::Clear => {
            let removed = remove_here(action, body, store)?;
            Ok(Bytes::from(admin::encode(&admin::RemovedAnswer {
                removed,
            })))
        }
        NodeAction::Stats => Ok(Bytes::from(admin::encode(&node_stats(
            store, live, routing,
        )))),
        NodeAction::Configure => {
            let text =
                std::str::from_utf8(body).map_err(|_| bad_body("the body must be UTF-8 JSON"))?;
            let doc = NodeDocument::from_json(text).map_err(|err| bad_body(&chain(&err)))?;
            doc.config
                .ensure_live_only()
                .map_err(|err| bad_body(&err.to_string()))?;
            let applied = apply_document(&doc, live, routing, store)?;
            Ok(Bytes::from(admin::encode(&applied)))
        }
        NodeAction::Lease => {
            // Leases wait for a DoPut, so the cluster layer runs them (async).
            Err(Error::Unimplemented(
                "the lease action outside the Flight service",
            ))
        }
        NodeAction::Rebalance => {
            // Rebalance sends entries to other nodes, so the cluster layer runs it.
            Err(Error::Unimplemented(
                "the rebalance action outside the Flight service",
            ))
        }
        NodeAction::Held => {
            let keys =
                admin::HeldRequest::decode(body).map_err(|err| bad_body(&err.to_string()))?;
            let held = keys
                .into_iter()
                .map(|key| store.peek(key).is_some())
                .collect();
            Ok(Bytes::from(admin::encode(&admin::HeldAnswer { held })))
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
            Ok(Bytes::from(admin::encode(&answer)))
        }
    }
}

/// Runs `invalidate-prefix` or `clear` on this node's store alone; the entries removed.
///
/// # Errors
/// [`Error::BadActionBody`] for a prefix that is empty or not UTF-8.
pub fn remove_here(action: NodeAction, body: &Bytes, store: &Store) -> Result<u64> {
    let bad_body = |reason: &str| Error::BadActionBody {
        action: action.as_str(),
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
        action: action.as_str(),
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

/// The `stats` answer of this node's store, config and ring (without the cluster
/// layer's `uptimeMs` and `lastRebalanceMsAgo`, which the Flight service adds).
pub fn node_stats(store: &Store, live: &LiveConfig, routing: &RoutingTable) -> admin::StatsAnswer {
    let current = routing.current();
    // This node's state in the ring (null without a topology or when not a member) and
    // the copies per key it writes.
    let member_state = current
        .as_ref()
        .and_then(|m| m.ring().member(routing.self_id()?).map(|m| m.state()))
        .map(|state| match state {
            MemberState::Active => node_config::MemberState::Active,
            MemberState::Joining => node_config::MemberState::Joining,
            MemberState::Draining => node_config::MemberState::Draining,
        });
    admin::StatsAnswer {
        ring_version: routing.version(),
        member_id: routing.self_id().map(str::to_owned),
        member_state,
        replicas: current.map_or(1, |m| m.replicas() as u64),
        ..stats_answer(store, live)
    }
}

/// The `stats` answer of this node's store and config (without ring fields).
pub fn stats_answer(store: &Store, live: &LiveConfig) -> admin::StatsAnswer {
    let stats = store.stats();
    let config = live.store_config();
    let evictions = |cause| stats.evictions.get(cause);
    admin::StatsAnswer {
        generation: live.generation(),
        location_mode: live.location_mode(),
        entries: stats.entries,
        used_bytes: stats.used_bytes,
        reserved_bytes: stats.reserved_bytes,
        budget_bytes: stats.budget_bytes,
        max_entries: stats.max_entries,
        max_entry_bytes: config.max_entry_bytes,
        ttl: config.ttl,
        ttl_mode: match config.ttl_mode {
            TtlMode::Absolute => node_config::TtlMode::Absolute,
            TtlMode::Sliding => node_config::TtlMode::Sliding,
        },
        eviction: match config.eviction {
            EvictionPolicy::Lru => node_config::EvictionPolicy::Lru,
            EvictionPolicy::TinyLfu => node_config::EvictionPolicy::Tinylfu,
        },
        hits: stats.hits,
        misses: stats.misses,
        inserts: stats.inserts,
        rejected_puts: stats.rejected_puts,
        evictions: admin::EvictionCounts {
            expired: evictions(RemovalCause::Expired),
            size: evictions(RemovalCause::Size),
            explicit: evictions(RemovalCause::Explicit),
            replaced: evictions(RemovalCause::Replaced),
            migrated: evictions(RemovalCause::Migrated),
        },
        ring_version: 0,
        member_id: None,
        member_state: None,
        replicas: 1,
        uptime_ms: None,
        last_rebalance_ms_ago: None,
        holds_strays: false,
        // This binary reads ring members' zones (routing/ring.rs): the operator may
        // publish them to it.
        reads_zones: true,
    }
}
