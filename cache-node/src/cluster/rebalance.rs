//! The `rebalance` action: hand every entry this node holds but no longer owns to the
//! key's owners under the current ring, then remove it here.
//!
//! For each live entry the key's first `replicas` owners are computed (a draining node
//! owns nothing). If this node is one of them the entry is kept. Otherwise it is sent to
//! each of them that does not hold the key yet (asked in `held` batches, see below) as a DoPut marked `x-flightcache-write: migration` (stored there only if
//! the key is absent, so a newer write is never overwritten), carrying its lifetime in
//! the `x-flightcache-entry-*` headers (see `forward.rs`), and removed here (cause
//! `migrated`) once every owner has it. A failed or timed-out send keeps the entry here
//! and counts it as failed: a handover never loses data. Hottest entries go first
//! (most hits, then most recently used) with bounded concurrency, so the hot set lands
//! first if a receiver's budget is tight.
//!
//! With `replicas: 2`, for the entries the node keeps it also asks each key's other owner
//! whether it holds a copy and sends one where it does not (an owner that restarted empty,
//! or `replicas` raised from 1), counted in `copied` / `copyFailed`. It asks in batches —
//! one `held` action per 1,024 keys and owner, after the moves — not one call per key:
//! 13,500 kept entries took 13,500 probes before every move of a restart with two copies.
//! A peer that does not offer `held` yet (an older image mid-rollout) is asked per key.
//!
//! Body (optional JSON): `{"dryRun": bool, "limit": N}`. Result:
//! `{"moved", "movedBytes", "failed", "kept", "copied", "copyFailed", "ringVersion"}`
//! (`crds::admin::RebalanceRequest` / `RebalanceAnswer`; the Flight adapter decodes and
//! encodes them).
//!
//! Owns: the handover plan and its sends. Must not import `flight/` or `wire/` (see the
//! `cluster` module docs). Does network I/O.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use tonic::metadata::MetadataMap;

use super::Cluster;
use super::forward::{self, WriteKind};
use crate::error::{Error, Result};
use crate::key::CacheKey;
use crate::routing::members::Peer;
use crate::store::HandoffEntry;
use crds::admin::{AdminAction, HeldAnswer, HeldRequest};

/// Entries sent at once.
pub const CONCURRENCY: usize = 4;
/// How long handing one entry to all its owners may take before it counts as failed.
pub const ENTRY_DEADLINE: Duration = Duration::from_secs(30);

/// The `rebalance` action's body and answer (the node-admin contract's types).
use crds::admin::{RebalanceAnswer as RebalanceReport, RebalanceRequest};

impl Cluster {
    /// Runs `rebalance` as `request` asks (see the module docs).
    pub async fn rebalance(
        &self,
        request: RebalanceRequest,
        metadata: &MetadataMap,
    ) -> RebalanceReport {
        let report = if request.dry_run {
            self.run_rebalance(&request, metadata).await
        } else {
            let deferred_before = self.deferred_sends();
            let previous = if request.limit.is_none() {
                // Everything held is considered, so any peer that was up by now is sent
                // what it lacks: the operator reads this to see which nodes owe a
                // restarted peer its copies. Copies of keys it does not hold stored from
                // now on may come after the store is listed and set the flag again.
                self.holds_copies_not_its_own
                    .store(false, std::sync::atomic::Ordering::Release);
                self.last_rebalance
                    .lock()
                    .replace(std::time::Instant::now())
            } else {
                *self.last_rebalance.lock()
            };
            let _running = RebalanceGauges::start(&self.metrics);
            let report = self.run_rebalance(&request, metadata).await;
            if self.deferred_sends() != deferred_before {
                // An owner could not take an entry then: it was stopping (the old process
                // of a pod whose replacement is already Ready) or could not be reached (a
                // restarted pod's name still leading to its old address). What it did not
                // take is still here, so this pass does not count as whole and the
                // operator asks again.
                *self.last_rebalance.lock() = previous;
            }
            let sent_all = report.failed == 0 && report.copy_failed == 0;
            if request.limit.is_none() {
                self.owes_handover
                    .store(!sent_all, std::sync::atomic::Ordering::Release);
                if sent_all {
                    // The ring it ran on (a ring installed meanwhile is still owed).
                    self.rebalanced_through
                        .fetch_max(report.ring_version, std::sync::atomic::Ordering::AcqRel);
                }
            }
            self.metrics.rebalance_finished(sent_all);
            report
        };
        tracing::info!(
            moved = report.moved,
            moved_bytes = report.moved_bytes,
            failed = report.failed,
            kept = report.kept,
            copied = report.copied,
            copy_failed = report.copy_failed,
            ring_version = report.ring_version,
            dry_run = request.dry_run,
            "rebalance finished"
        );
        report
    }

    async fn run_rebalance(
        &self,
        request: &RebalanceRequest,
        metadata: &MetadataMap,
    ) -> RebalanceReport {
        let entries = self.store.handoff_list();
        let Some(membership) = self.routing.current() else {
            return RebalanceReport {
                kept: entries.len() as u64,
                ..RebalanceReport::default()
            };
        };
        let mut report = RebalanceReport {
            ring_version: membership.ring().version(),
            ..RebalanceReport::default()
        };
        let self_id = self.routing.self_id();
        let limit = request.limit.unwrap_or(u64::MAX);
        let mut plan: Vec<(HandoffEntry, Vec<Peer>)> = Vec::new();
        let mut fills: Vec<(HandoffEntry, Vec<Peer>)> = Vec::new();
        for entry in entries {
            let owners = membership.owners(&entry.key);
            let is_self = |id: &&String| Some(id.as_str()) == self_id;
            if owners.iter().any(&is_self) {
                report.kept += 1;
                let others: Vec<Peer> = owners
                    .iter()
                    .filter(|id| !is_self(id))
                    .filter_map(|id| membership.peer(id))
                    .collect();
                if !others.is_empty() {
                    fills.push((entry, others));
                }
                continue;
            }
            let peers: Vec<Peer> = owners.iter().filter_map(|id| membership.peer(id)).collect();
            if peers.is_empty() {
                report.failed += 1;
            } else if plan.len() as u64 >= limit {
                report.kept += 1;
            } else {
                plan.push((entry, peers));
            }
        }
        // Moves first (they are what a ring change needs); copies within what is left of
        // the limit.
        fills.truncate(
            usize::try_from(limit.saturating_sub(plan.len() as u64)).unwrap_or(usize::MAX),
        );
        if request.dry_run {
            report.moved = plan.len() as u64;
            report.moved_bytes = plan.iter().map(|(e, _)| e.entry.weight_bytes()).sum();
            (report.copied, report.copy_failed) = self.fill_copies(fills, true, metadata).await;
            return report;
        }
        self.metrics
            .rebalance_pending_entries
            .set(i64::try_from(plan.len()).unwrap_or(i64::MAX));
        // Each entry goes only to the owners that lack it (with two copies, a drained
        // node's entry is already on one of its two new owners); one an owner could not
        // be asked about is sent to it anyway. An entry every owner holds is removed here.
        let (lacking, _) = self.lacking(&plan, metadata).await;
        let plan: Vec<(HandoffEntry, Vec<Peer>)> = plan
            .into_iter()
            .zip(lacking)
            .map(|((entry, _), lacking)| (entry, lacking))
            .collect();
        // `buffered` starts the sends in plan order (hottest first).
        let mut sends = futures::stream::iter(plan)
            .map(|(entry, peers)| self.hand_over(entry, peers, metadata))
            .buffered(CONCURRENCY);
        while let Some(outcome) = sends.next().await {
            self.metrics.rebalance_pending_entries.dec();
            match outcome {
                Handover::Moved(bytes) => {
                    report.moved += 1;
                    report.moved_bytes += bytes;
                }
                Handover::Failed => report.failed += 1,
                Handover::Vanished => report.kept += 1,
            }
        }
        drop(sends);
        (report.copied, report.copy_failed) = self.fill_copies(fills, false, metadata).await;
        report
    }

    /// For the entries this node keeps: asks each other owner which of them it holds (in
    /// `held` batches) and sends a copy where it does not (unless `dry_run`). Returns
    /// (entries a copy was sent for or would be, entries whose check or send failed).
    async fn fill_copies(
        &self,
        mut fills: Vec<(HandoffEntry, Vec<Peer>)>,
        dry_run: bool,
        metadata: &MetadataMap,
    ) -> (u64, u64) {
        // Entries that expired meanwhile are not worth a copy.
        fills.retain(|(handoff, _)| {
            let lifetime = self.carried(&handoff.entry, Some(handoff.last_access));
            !lifetime.remaining.is_some_and(|left| left.is_zero())
        });
        let (lacking, mut failed) = self.lacking(&fills, metadata).await;
        let mut copied = vec![false; fills.len()];
        let missing: Vec<(usize, Peer)> = lacking
            .into_iter()
            .enumerate()
            .filter(|(index, _)| !failed[*index])
            .flat_map(|(index, peers)| peers.into_iter().map(move |peer| (index, peer)))
            .collect();
        if dry_run {
            for (index, _) in missing {
                copied[index] = true;
            }
        } else {
            let copies = missing
                .into_iter()
                .map(|(index, peer)| (index, fills[index].0.clone(), peer));
            let mut sends = futures::stream::iter(copies.collect::<Vec<_>>())
                .map(|(index, handoff, peer)| self.send_copy(index, handoff, peer, metadata))
                .buffer_unordered(CONCURRENCY);
            while let Some((index, sent)) = sends.next().await {
                if sent {
                    copied[index] = true;
                } else {
                    failed[index] = true;
                }
            }
        }
        let count = |flags: &[bool]| flags.iter().filter(|&&flag| flag).count() as u64;
        (count(&copied), count(&failed))
    }

    /// For each of `items` (an entry and the peers that should hold it), the peers that do
    /// not hold its key, asked in `held` batches per peer; and whether a peer of the item
    /// could not be asked (it is then counted among those that lack it).
    async fn lacking(
        &self,
        items: &[(HandoffEntry, Vec<Peer>)],
        metadata: &MetadataMap,
    ) -> (Vec<Vec<Peer>>, Vec<bool>) {
        let mut lacking: Vec<Vec<Peer>> = vec![Vec::new(); items.len()];
        let mut unchecked = vec![false; items.len()];
        let mut by_peer: HashMap<&str, (&Peer, Vec<usize>)> = HashMap::new();
        for (index, (_, peers)) in items.iter().enumerate() {
            for peer in peers {
                by_peer
                    .entry(peer.id.as_str())
                    .or_insert_with(|| (peer, Vec::new()))
                    .1
                    .push(index);
            }
        }
        for (peer, indices) in by_peer.into_values() {
            for batch in held_batches(items, &indices) {
                match self.held_on(peer, items, batch, metadata).await {
                    Ok(held) => {
                        for (&index, held) in batch.iter().zip(held) {
                            if !held {
                                lacking[index].push(peer.clone());
                            }
                        }
                    }
                    Err(err) => {
                        self.note_if_deferred(&err);
                        tracing::warn!(owner = %peer.id, keys = batch.len(), error = %err, "cannot check which entries a peer holds");
                        for &index in batch {
                            lacking[index].push(peer.clone());
                            unchecked[index] = true;
                        }
                    }
                }
            }
        }
        (lacking, unchecked)
    }

    /// Which of the entries at `batch` (indices into `fills`) `peer` holds, in order: one
    /// `held` call, or a probe per key when the peer does not offer `held`.
    ///
    /// # Errors
    /// The peer could not be asked, or answered something else than one flag per key.
    async fn held_on(
        &self,
        peer: &Peer,
        fills: &[(HandoffEntry, Vec<Peer>)],
        batch: &[usize],
        metadata: &MetadataMap,
    ) -> Result<Vec<bool>> {
        let request = HeldRequest {
            keys: batch
                .iter()
                .map(|&index| fills[index].0.key.to_vec())
                .collect(),
        };
        let action = arrow_flight::Action::new(AdminAction::Held.as_str(), request.encode());
        let answer = forward::do_action(&self.peers, peer, &self.sender(), action, metadata).await;
        let body = match answer {
            Ok(body) => body,
            Err(Error::Forwarded(status)) if status.code() == tonic::Code::Unimplemented => {
                let mut held = Vec::with_capacity(batch.len());
                for &index in batch {
                    held.push(self.probe_held(peer, &fills[index].0, metadata).await?);
                }
                return Ok(held);
            }
            Err(err) => return Err(err),
        };
        let answer: HeldAnswer =
            crds::admin::decode(AdminAction::Held, &body).map_err(|source| {
                Error::BadPeerAnswer {
                    peer: peer.id.to_string(),
                    source,
                }
            })?;
        if answer.held.len() != batch.len() {
            return Err(Error::HeldCountMismatch {
                peer: peer.id.to_string(),
                flags: answer.held.len(),
                keys: batch.len(),
            });
        }
        Ok(answer.held)
    }

    /// Whether `peer` holds `handoff`'s key, asked with a forwarded GetFlightInfo that
    /// reads only its own store (not a read that would find the key elsewhere: its
    /// previous holder during a ring change may be this very node).
    async fn probe_held(
        &self,
        peer: &Peer,
        handoff: &HandoffEntry,
        metadata: &MetadataMap,
    ) -> Result<bool> {
        let key = CacheKey::try_from_store_bytes(&handoff.key)?;
        let probe_sender = self.sender().asking_what_is_held();
        let probe = forward::get_flight_info(
            &self.peers,
            peer,
            &probe_sender,
            key.to_descriptor(),
            metadata,
        )
        .await;
        match probe {
            Ok(_) => Ok(true),
            Err(Error::Forwarded(status)) if status.code() == tonic::Code::NotFound => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Sends `peer` a copy of an entry it does not hold: (`index`, whether the peer
    /// stored it in time).
    async fn send_copy(
        &self,
        index: usize,
        handoff: HandoffEntry,
        peer: Peer,
        metadata: &MetadataMap,
    ) -> (usize, bool) {
        let Ok(key) = CacheKey::try_from_store_bytes(&handoff.key) else {
            return (index, false);
        };
        let lifetime = self.carried(&handoff.entry, Some(handoff.last_access));
        let sent = tokio::time::timeout(
            ENTRY_DEADLINE,
            forward::send_entry(
                &self.peers,
                &peer,
                &self.sender(),
                &key,
                &handoff.entry,
                WriteKind::Migration,
                &lifetime,
                metadata,
            ),
        )
        .await;
        let stored = match sent {
            Ok(Ok(_)) => true,
            Ok(Err(err)) => {
                self.note_if_deferred(&err);
                tracing::warn!(%key, owner = %peer.id, error = %err, "copy not sent");
                false
            }
            Err(_) => false,
        };
        (index, stored)
    }

    /// Sends one entry to every owner, then removes it here.
    async fn hand_over(
        &self,
        handoff: HandoffEntry,
        peers: Vec<Peer>,
        metadata: &MetadataMap,
    ) -> Handover {
        let Ok(key) = CacheKey::try_from_store_bytes(&handoff.key) else {
            return Handover::Failed;
        };
        let lifetime = self.carried(&handoff.entry, Some(handoff.last_access));
        if lifetime.remaining.is_some_and(|left| left.is_zero()) {
            // Expired meanwhile: nothing worth sending; the expiry sweep removes it.
            return Handover::Vanished;
        }
        let sender = self.sender();
        let send_all = async {
            for peer in &peers {
                forward::send_entry(
                    &self.peers,
                    peer,
                    &sender,
                    &key,
                    &handoff.entry,
                    WriteKind::Migration,
                    &lifetime,
                    metadata,
                )
                .await
                .map_err(|err| (peer, err))?;
            }
            Ok::<(), (&Peer, Error)>(())
        };
        match tokio::time::timeout(ENTRY_DEADLINE, send_all).await {
            Ok(Ok(())) => {}
            Ok(Err((peer, err))) => {
                self.note_if_deferred(&err);
                tracing::warn!(%key, owner = %peer.id, error = %err, "handover failed; entry kept here");
                return Handover::Failed;
            }
            Err(_) => {
                tracing::warn!(%key, deadline = ?ENTRY_DEADLINE, "handover timed out; entry kept here");
                return Handover::Failed;
            }
        }
        let weight = handoff.entry.weight_bytes();
        if !self.store.remove_migrated(&handoff.key, &handoff.entry) {
            // The entry was invalidated (or replaced, or expired) here while it was being
            // sent: undo the copies so the handover cannot bring invalidated data back.
            // Best effort; at worst a key the owners could have served becomes a miss.
            let undo = arrow_flight::Action::new(
                AdminAction::Invalidate.as_str(),
                crate::ticket::CacheTicket::new(key.clone()).encode(),
            );
            for peer in &peers {
                let undone =
                    forward::do_action(&self.peers, peer, &sender, undo.clone(), metadata).await;
                if let Err(err) = undone {
                    tracing::warn!(%key, owner = %peer.id, error = %err, "could not undo the handover of an entry invalidated meanwhile");
                }
            }
            return Handover::Vanished;
        }
        self.metrics.migrated_out_entries.inc();
        self.metrics.migrated_out_bytes.inc_by(weight);
        Handover::Moved(weight)
    }
}

impl Cluster {
    /// Rebalance sends deferred so far: an owner that could not take an entry then.
    fn deferred_sends(&self) -> u64 {
        self.rebalance_deferred
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts `err` if it says the owner could not take the entry then (unreachable,
    /// stopping, its ring mid-update: UNAVAILABLE), not that it refused it.
    fn note_if_deferred(&self, err: &Error) {
        let deferred = match err {
            Error::OwnerUnreachable { .. } => true,
            Error::Forwarded(status) => status.code() == tonic::Code::Unavailable,
            _ => false,
        };
        if deferred {
            self.rebalance_deferred
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// `indices` (into `fills`) in `held` batches: at most [`HeldRequest::MAX_KEYS`] keys and
/// about [`HeldRequest::MAX_BODY_BYTES`] of them each.
fn held_batches<'a>(fills: &[(HandoffEntry, Vec<Peer>)], indices: &'a [usize]) -> Vec<&'a [usize]> {
    let mut batches = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (at, &index) in indices.iter().enumerate() {
        let count = at - start;
        if count == HeldRequest::MAX_KEYS || (count > 0 && bytes >= HeldRequest::MAX_BODY_BYTES) {
            batches.push(&indices[start..at]);
            (start, bytes) = (at, 0);
        }
        bytes += fills[index].0.key.len() + 4;
    }
    if start < indices.len() {
        batches.push(&indices[start..]);
    }
    batches
}

/// What handing one entry over did.
enum Handover {
    /// Every owner has it; removed here. Its weight.
    Moved(u64),
    /// Kept here: an owner could not store it in time.
    Failed,
    /// It expired, or was invalidated while being sent (the copies are then undone):
    /// counted as kept, i.e. not moved by this call.
    Vanished,
}

/// `rebalance_in_progress` is 1 while it lives; both rebalance gauges go back to 0 when
/// it is dropped, however the rebalance ended.
struct RebalanceGauges<'a>(&'a crate::metrics::Metrics);

impl<'a> RebalanceGauges<'a> {
    fn start(metrics: &'a crate::metrics::Metrics) -> Self {
        metrics.rebalance_in_progress.set(1);
        Self(metrics)
    }
}

impl Drop for RebalanceGauges<'_> {
    fn drop(&mut self) {
        self.0.rebalance_in_progress.set(0);
        self.0.rebalance_pending_entries.set(0);
    }
}
