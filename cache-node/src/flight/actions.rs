//! DoAction and ListActions: the node's admin actions run against its own store, live
//! config and ring. Each action's name, rights and description are one row of
//! `crds::admin::ACTIONS`; its body and answer are documented in `crds::admin` and in
//! docs/cache-node.md ("Actions"). The Flight service's `do_action` dispatches with one
//! exhaustive match.
//!
//! Owns: parsing an action's name and body and running the local ones against the
//! store, the live config and the routing table, with their typed answers
//! (`crds::admin`). Must not import `wire/` or `cluster/`: the actions that call peers
//! (lease, rebalance, the fan-out of invalidate-prefix and clear) are handed to the
//! cluster layer by the Flight service (`flight/mod.rs`).

use bytes::Bytes;
use crds::admin;
use crds::node_config::NodeDocument;

use crate::error::{Error, Result};
use crate::key::CacheKey;
use crate::live::{LiveConfig, apply_document};
use crate::routing::members::RoutingTable;
use crate::store::{RemovalCause, Store};
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

/// `ping`: the bytes `pong`.
pub fn ping() -> Bytes {
    Bytes::from_static(admin::PONG)
}

/// `configure`: applies a document of live fields and/or a ring.
///
/// # Errors
/// [`Error::BadActionBody`] for a body that is not a live-only node config document;
/// configure errors.
pub fn configure(
    body: &Bytes,
    live: &LiveConfig,
    routing: &RoutingTable,
    store: &Store,
) -> Result<Bytes> {
    let bad_body = |reason: String| Error::BadActionBody {
        action: NodeAction::Configure.as_str(),
        reason,
    };
    let text =
        std::str::from_utf8(body).map_err(|_| bad_body("the body must be UTF-8 JSON".into()))?;
    let doc = NodeDocument::from_json(text).map_err(|err| bad_body(chain(&err)))?;
    doc.config
        .ensure_live_only()
        .map_err(|err| bad_body(err.to_string()))?;
    let applied = apply_document(&doc, live, routing, store)?;
    Ok(Bytes::from(admin::encode(&applied)))
}

/// `held`: which of a batch of keys this node's store holds.
///
/// # Errors
/// [`Error::BadActionBody`] for a body that is not a held request.
pub fn held(body: &Bytes, store: &Store) -> Result<Bytes> {
    let keys = admin::HeldRequest::decode(body).map_err(|err| Error::BadActionBody {
        action: NodeAction::Held.as_str(),
        reason: err.to_string(),
    })?;
    let held = keys
        .into_iter()
        .map(|key| store.peek(key).is_some())
        .collect();
    Ok(Bytes::from(admin::encode(&admin::HeldAnswer { held })))
}

/// `topology`: this node's member id and the ring it routes by.
pub fn topology(routing: &RoutingTable) -> Bytes {
    let current = routing.current();
    let answer = admin::TopologyAnswer {
        member_id: routing.self_id().map(str::to_owned),
        version: routing.version(),
        replicas: current.as_ref().map_or(1, |m| m.replicas() as u64),
        members: current
            .map(|m| m.topology().members.clone())
            .unwrap_or_default(),
    };
    Bytes::from(admin::encode(&answer))
}

/// Runs `invalidate-prefix`, `invalidate-tag` or `clear` on this node's store alone; the
/// entries removed.
///
/// # Errors
/// [`Error::BadActionBody`] for a prefix that is empty or not UTF-8, or a tag request
/// that is not the documented JSON or names tags that break the rules (`crds::tags`).
pub fn remove_here(action: NodeAction, body: &Bytes, store: &Store) -> Result<u64> {
    let bad_body = |reason: &str| Error::BadActionBody {
        action: action.as_str(),
        reason: reason.to_owned(),
    };
    match action {
        NodeAction::Clear => return Ok(store.clear()),
        NodeAction::InvalidateTag => {
            let request = admin::InvalidateTagRequest::decode(body).map_err(|r| bad_body(&r))?;
            let tags = crate::tags::invalidation_tags(request.tags)
                .map_err(|e| bad_body(&e.to_string()))?;
            return Ok(store.invalidate_tags(&tags));
        }
        _ => {}
    }
    let prefix = std::str::from_utf8(body).map_err(|_| bad_body("the prefix must be UTF-8"))?;
    if prefix.is_empty() {
        return Err(bad_body(
            "the prefix is empty; use the 'clear' action to remove everything",
        ));
    }
    Ok(store.invalidate_prefix(&CacheKey::path_prefix_store_bytes(prefix)))
}

/// `invalidate-local`: removes, from this node's store alone, every entry under one of the
/// request's path keys or prefixes or carrying one of its tags; the entries removed. The
/// operator asks each node of a pool itself (a `CacheInvalidation`), so nothing is fanned
/// out or forwarded.
///
/// # Errors
/// [`Error::BadActionBody`] for a body that is not the documented JSON or whose selectors
/// break a rule (`crds::invalidation`).
pub fn invalidate_local(body: &Bytes, store: &Store) -> Result<u64> {
    let bad_body = |reason: String| Error::BadActionBody {
        action: NodeAction::InvalidateLocal.as_str(),
        reason,
    };
    let request = admin::InvalidateLocalRequest::decode(body).map_err(bad_body)?;
    let mut removed = 0;
    for key in request.keys {
        removed += u64::from(store.invalidate(&CacheKey::Path(key).to_store_bytes()));
    }
    for prefix in &request.prefixes {
        removed += store.invalidate_prefix(&CacheKey::path_prefix_store_bytes(prefix));
    }
    if !request.tags.is_empty() {
        let tags = crate::tags::invalidation_tags(request.tags)
            .map_err(|err| bad_body(err.to_string()))?;
        removed += store.invalidate_tags(&tags);
    }
    Ok(removed)
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
        .and_then(|m| m.ring().member(routing.self_id()?).map(|m| m.state()));
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
        ttl_mode: config.ttl_mode,
        eviction: config.eviction,
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
        owes_handover: false,
        // This binary reads ring members' zones (routing/ring.rs): the operator may
        // publish them to it.
        reads_zones: true,
        tls: None,
        peers_skipped: 0,
    }
}
