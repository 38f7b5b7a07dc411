//! Copies of a key on its first `replicas` ring choices: the owner's replica write after
//! a put, reads that fall back from the owner to the second choice, and invalidation of
//! every copy.
//!
//! With `replicas: 2` a key lives on its owner and its second choice (active members
//! only, so draining ones are skipped). A put is forwarded to the owner as with one copy;
//! the owner commits, then sends the stored entry to the second choice as a DoPut marked
//! `x-flightcache-write: replica` (stored there without forwarding or replicating again)
//! and only then answers. If the second choice cannot store it the write still succeeds
//! on the owner: the failure is logged and counted in
//! `flightcache_node_replica_write_failures_total`. Reads try the owner and, when it is
//! unreachable or misses, the second choice, so a key survives its owner's restart; a
//! read no copy can answer is a miss (NOT_FOUND), never UNAVAILABLE.
//!
//! Owns: which copy a read or write goes to next. Must not import `flight/` or `wire/`
//! (see the `cluster` module docs). Does network I/O through `forward.rs`.

use std::future::Future;
use std::sync::Arc;

use tonic::metadata::MetadataMap;

use super::forward::{self, WriteKind};
use super::{Cluster, ForwardedPut, Upload};
use crate::error::{Error, Result};
use crate::key::CacheKey;
use crate::routing::members::{Peer, Route};
use crate::store::{Entry, Lifetime};

impl Cluster {
    /// The lifetime `entry` carries to another node: its per-entry TTL, age, idle time,
    /// the time left until its deadline here, and its tags.
    pub(super) fn carried(
        &self,
        entry: &Entry,
        last_access: Option<std::time::Duration>,
    ) -> Lifetime {
        let now = self.store.now();
        Lifetime {
            ttl_override: entry.ttl_override(),
            age: now.saturating_sub(entry.created_at()),
            idle: last_access.map_or_else(Default::default, |at| now.saturating_sub(at)),
            remaining: Some(entry.expires_at().saturating_sub(now)),
            if_absent: false,
            journaled: false,
            tags: crate::store::Tags::clone(entry.tags()),
        }
    }

    /// How to ask a key's previous holder or next candidate: for what it holds, and for a
    /// copy of a hit when this node owns the key and `missed_here`.
    fn holder_sender(&self, missed_here: bool) -> forward::Sender {
        let sender = self.sender().asking_previous_holder();
        if missed_here {
            sender.asking_for_a_copy()
        } else {
            sender
        }
    }

    /// A read for what this node holds that hit, from one of the key's owners that missed
    /// it ([`forward::wants_a_copy`]): sends that owner a copy of the entry (a migration,
    /// stored there only if absent), in the background, at most
    /// [`super::REPAIRS_AT_ONCE`] at a time — past that a repair is skipped (the next read of
    /// the key asks again). Best effort: a failed copy only leaves the owner missing it.
    pub fn send_a_copy_back(&self, key: &CacheKey, metadata: &MetadataMap) {
        let Some(asker) = forward::forwarded_by(metadata) else {
            return;
        };
        let Some(membership) = self.routing.current() else {
            return;
        };
        let store_key = key.to_store_bytes();
        if !membership
            .owners(&store_key)
            .iter()
            .any(|id| **id == asker.member)
        {
            return;
        }
        let (Some(peer), Some(entry)) =
            (membership.peer(&asker.member), self.store.peek(&store_key))
        else {
            return;
        };
        let Ok(permit) = Arc::clone(&self.repairs).try_acquire_owned() else {
            return;
        };
        let lifetime = self.carried(&entry, None);
        let (peers, sender, key, metrics) = (
            self.peers.clone(),
            self.sender(),
            key.clone(),
            Arc::clone(&self.metrics),
        );
        tokio::spawn(async move {
            let _permit = permit;
            let sent = tokio::time::timeout(
                super::rebalance::ENTRY_DEADLINE,
                forward::send_entry(
                    &peers,
                    &peer,
                    &sender,
                    &key,
                    &entry,
                    WriteKind::Migration,
                    &lifetime,
                    &MetadataMap::new(),
                ),
            )
            .await;
            match sent {
                Ok(Ok(_)) => {
                    metrics.repairs.inc();
                }
                Ok(Err(err)) => {
                    tracing::debug!(%key, owner = %peer.id, error = %err, "read repair not sent");
                }
                Err(_) => tracing::debug!(%key, owner = %peer.id, "read repair timed out"),
            }
        });
    }

    /// After this node committed `key` as its owner: sends the entry to the key's other
    /// copies. Failures are logged and counted, never returned (the write stands here).
    pub(super) async fn replicate(&self, key: &CacheKey, metadata: &MetadataMap) {
        let store_key = key.to_store_bytes();
        let Ok(choices) = self.routing.choices(&store_key, None) else {
            return;
        };
        if choices.len() < 2 || choices[0] != Route::Local {
            return;
        }
        let Some(entry) = self.store.peek(&store_key) else {
            return;
        };
        let lifetime = self.carried(&entry, None);
        let sender = self.sender();
        for choice in &choices[1..] {
            let Route::Forward(peer) = choice else {
                continue;
            };
            let sent = forward::send_entry(
                &self.peers,
                peer,
                &sender,
                key,
                &entry,
                WriteKind::Replica,
                &lifetime,
                metadata,
            )
            .await;
            if let Err(err) = sent {
                self.metrics.replica_write_failures.inc();
                tracing::warn!(
                    replica = %peer.id,
                    address = %peer.address,
                    error = %err,
                    "replica write failed; the entry is stored on the owner only"
                );
            }
        }
    }

    /// Runs a read on the key's copies in order (the owner first): `local` here, `remote`
    /// on a peer (called with the sender to present). A miss or an unreachable copy moves
    /// on to the next one. When every copy missed, and the ring changed less than the
    /// move window ago, the key's previous holders are asked for what they hold
    /// (copy-then-switch: a key on the move stays readable until it has arrived). When
    /// every copy fails, the read is a miss: a copy that missed says so, and copies that
    /// could not be reached (a node down, restarting, not yet resolvable) are answered as
    /// a miss too, [`Error::CopiesUnreachable`] — for a cache a missing node costs
    /// misses, never errors; the client computes the result as for any miss.
    ///
    /// A read that is itself a previous-holder read ([`crate::headers::READ_HEADER`]) is
    /// answered from this node's store alone.
    ///
    /// # Errors
    /// The first copy's error that is neither a miss nor unreachable, else NOT_FOUND.
    pub async fn read_copies<T, Fut>(
        &self,
        key: &CacheKey,
        metadata: &MetadataMap,
        local: impl Fn() -> Result<T>,
        remote: impl Fn(Peer, forward::Sender) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = Result<T>>,
    {
        if forward::is_held_read(metadata) {
            return local();
        }
        let forwarded = forward::forwarded_by(metadata);
        let store_key = key.to_store_bytes();
        let choices = self.routing.choices(&store_key, forwarded.as_ref())?;
        let mut first_error = None;
        let mut miss = None;
        // This node owns a copy and missed it: whoever answers the read with a hit also
        // sends it a copy (read repair), so a node back empty from a restart refills with
        // the keys read, not only with what a rebalance hands it.
        let mut missed_here = false;
        let tried = choices.clone();
        for choice in choices {
            let here = choice == Route::Local;
            let result = match choice {
                Route::Local => local(),
                Route::Forward(peer) if missed_here => {
                    remote(peer, self.sender().asking_for_a_copy()).await
                }
                Route::Forward(peer) => {
                    let sender = self.sender().routed_to(&peer);
                    remote(peer, sender).await
                }
            };
            match result {
                Ok(value) => return Ok(value),
                Err(err) if is_miss(&err) => {
                    missed_here |= here;
                    miss.get_or_insert(err);
                }
                Err(err) if is_unreachable(&err) => {
                    first_error.get_or_insert(err);
                }
                Err(err) => return Err(err),
            }
        }
        // A read forwarded here (this node owns a copy) that missed: the key's other copies
        // are asked for what they hold, and for a copy of a hit — so a node back empty
        // refills with its keys read through any node, not only through itself.
        if forwarded.is_some() && missed_here {
            let others = self.routing.choices(&store_key, None).unwrap_or_default();
            for choice in others {
                if let Route::Forward(peer) = choice
                    && let Ok(value) = remote(peer, self.sender().asking_for_a_copy()).await
                {
                    return Ok(value);
                }
            }
        }
        // No copy answered and one could not be reached: a write made meanwhile went to
        // the key's next candidate (see `put_on_next_candidate`).
        if first_error.is_some()
            && let Some(next) = self.routing.next_candidate(&store_key)
            && !tried.contains(&next)
        {
            let result = match &next {
                Route::Local => local(),
                Route::Forward(peer) => remote(peer.clone(), self.holder_sender(missed_here)).await,
            };
            if let Ok(value) = result {
                return Ok(value);
            }
        }
        for peer in self.routing.previous_holders(&store_key) {
            // Whatever a previous holder answers but a hit leaves the read a miss.
            if let Ok(value) = remote(peer, self.holder_sender(missed_here)).await {
                self.metrics.previous_holder_hits.inc();
                return Ok(value);
            }
        }
        Err(match (miss, first_error) {
            (Some(miss), _) => miss,
            (None, Some(unreachable)) => {
                self.metrics.unreachable_misses.inc();
                Error::CopiesUnreachable {
                    key: key.to_string(),
                    reason: unreachable.to_string(),
                }
            }
            (None, None) => Error::Routing(crate::routing::members::RoutingError::NoOwner {
                version: self.routing.version(),
            }),
        })
    }

    /// Stores a put whose owner `owner` could not be reached on the key's next candidate
    /// (its second ring choice: here — [`ForwardedPut::StoreHere`], the caller stores it —
    /// or a peer that stores it as a fallback copy without forwarding it). A cache that loses a write costs a miss later, but a write refused
    /// with UNAVAILABLE is an error now; the entry comes back to the owner with the next
    /// rebalance after the owner returns, and reads look on the next candidate while the
    /// owner cannot be reached.
    ///
    /// # Errors
    /// The owner's unreachability when there is no other candidate (or it cannot be
    /// reached either), or the candidate's refusal.
    pub(super) async fn put_on_next_candidate(
        &self,
        key: &CacheKey,
        owner: &Peer,
        undelivered: forward::Undelivered,
        metadata: &MetadataMap,
    ) -> Result<ForwardedPut> {
        let forward::Undelivered { first, rest, error } = undelivered;
        let kind = Some(WriteKind::Fallback);
        match self.routing.next_candidate(&key.to_store_bytes()) {
            Some(Route::Local) => {
                self.metrics.fallback_writes.inc();
                tracing::debug!(owner = %owner.id, %key, "owner unreachable: the put is stored here");
                Ok(ForwardedPut::StoreHere(Box::new(Upload { first, rest })))
            }
            Some(Route::Forward(next)) if next != *owner => {
                let sender = self.sender();
                let relayed = forward::do_put(
                    &self.peers,
                    &self.replay_budget,
                    &next,
                    &sender,
                    first,
                    rest,
                    metadata,
                    kind,
                )
                .await;
                match relayed {
                    Ok(answer) => {
                        self.metrics.fallback_writes.inc();
                        Ok(ForwardedPut::Relayed(answer))
                    }
                    Err(forward::PutFailure::Failed(err)) => Err(err),
                    Err(forward::PutFailure::Undelivered(_)) => Err(error),
                }
            }
            _ => Err(error),
        }
    }

    /// Removes `key` from every copy. Returns whether any copy held it.
    ///
    /// # Errors
    /// A copy that could not be reached (the others are removed first), so a caller never
    /// believes a key gone while a copy may still serve it.
    pub async fn invalidate_copies(
        &self,
        key: &CacheKey,
        action: &arrow_flight::Action,
        metadata: &MetadataMap,
    ) -> Result<bool> {
        let forwarded = forward::forwarded_by(metadata);
        let choices = self
            .routing
            .choices(&key.to_store_bytes(), forwarded.as_ref())?;
        let mut removed = false;
        let mut failure = None;
        for choice in choices {
            match choice {
                Route::Local => removed |= self.store.invalidate(&key.to_store_bytes()),
                Route::Forward(peer) => {
                    let sender = self.sender().routed_to(&peer);
                    match forward::do_action(&self.peers, &peer, &sender, action.clone(), metadata)
                        .await
                    {
                        Ok(body) => {
                            // An answer that is not the contract's counts as nothing removed.
                            let answer = crds::admin::decode::<crds::admin::InvalidateAnswer>(
                                crds::admin::AdminAction::Invalidate,
                                &body,
                            );
                            removed |= answer.is_ok_and(|answer| answer.removed);
                        }
                        Err(err) => {
                            failure.get_or_insert(err);
                        }
                    }
                }
            }
        }
        match failure {
            Some(err) => Err(err),
            None => Ok(removed),
        }
    }
}

fn is_miss(err: &Error) -> bool {
    match err {
        Error::UnknownKey { .. } => true,
        Error::Forwarded(status) => status.code() == tonic::Code::NotFound,
        _ => false,
    }
}

fn is_unreachable(err: &Error) -> bool {
    match err {
        Error::OwnerUnreachable { .. } => true,
        // A copy whose ring disagrees (it is mid-update) is as good as unreachable.
        Error::Forwarded(status) => status.code() == tonic::Code::Unavailable,
        _ => false,
    }
}
