//! The `rebalance` action: hand every entry this node holds but no longer owns to the
//! key's owners under the current ring, then remove it here.
//!
//! For each live entry the key's first `replicas` owners are computed (a draining node
//! owns nothing). If this node is one of them the entry is kept. Otherwise it is sent to
//! each of them as a DoPut marked `x-flightcache-write: migration` (stored there only if
//! the key is absent, so a newer write is never overwritten), carrying its lifetime in
//! the `x-flightcache-entry-*` headers (see `forward.rs`), and removed here (cause
//! `migrated`) once every owner has it. A failed or timed-out send keeps the entry here
//! and counts it as failed: a handover never loses data. Hottest entries go first
//! (most hits, then most recently used) with bounded concurrency, so the hot set lands
//! first if a receiver's budget is tight.
//!
//! With `replicas: 2`, for an entry the node keeps it also asks the key's other owner
//! whether it holds a copy and sends one where it does not (an owner that restarted empty,
//! or `replicas` raised from 1), counted in `copied` / `copyFailed`.
//!
//! Body (optional JSON): `{"dryRun": bool, "limit": N}`. Result:
//! `{"moved", "movedBytes", "failed", "kept", "copied", "copyFailed", "ringVersion"}`.
//! Does network I/O.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tonic::metadata::MetadataMap;

use super::FlightCacheService;
use super::forward::{self, WriteKind};
use crate::error::{Error, Result};
use crate::key::CacheKey;
use crate::routing::members::Peer;
use crate::store::HandoffEntry;

/// Entries sent at once.
pub const CONCURRENCY: usize = 4;
/// How long handing one entry to all its owners may take before it counts as failed.
pub const ENTRY_DEADLINE: Duration = Duration::from_secs(30);

/// The `rebalance` action's body and answer (the node-admin contract's types).
use crds::admin::{RebalanceAnswer as RebalanceReport, RebalanceRequest};

impl FlightCacheService {
    /// Runs `rebalance` with `body`.
    ///
    /// # Errors
    /// [`Error::BadActionBody`] for a body that is not the documented JSON.
    pub(super) async fn rebalance(&self, body: &Bytes, metadata: &MetadataMap) -> Result<Bytes> {
        let request = RebalanceRequest::from_body(body).map_err(|err| Error::BadActionBody {
            action: "rebalance",
            reason: format!("{err}; send JSON like {{\"dryRun\": true, \"limit\": 100}}"),
        })?;
        let report = if request.dry_run {
            self.run_rebalance(&request, metadata).await
        } else {
            let _running = RebalanceGauges::start(&self.metrics);
            let report = self.run_rebalance(&request, metadata).await;
            self.metrics
                .rebalance_finished(report.failed == 0 && report.copy_failed == 0);
            report
        };
        tracing::info!(
            moved = report.moved,
            moved_bytes = report.moved_bytes,
            failed = report.failed,
            kept = report.kept,
            ring_version = report.ring_version,
            dry_run = request.dry_run,
            "rebalance finished"
        );
        Ok(Bytes::from(crds::admin::encode(&report)))
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
        }
        let mut checks = futures::stream::iter(fills)
            .map(|(entry, peers)| self.fill_copies(entry, peers, request.dry_run, metadata))
            .buffered(CONCURRENCY);
        while let Some((copied, failed)) = checks.next().await {
            report.copied += u64::from(copied);
            report.copy_failed += u64::from(failed);
        }
        if request.dry_run {
            return report;
        }
        self.metrics
            .rebalance_pending_entries
            .set(i64::try_from(plan.len()).unwrap_or(i64::MAX));
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
        report
    }

    /// For an entry this node keeps: asks each other owner whether it holds the key (a
    /// forwarded GetFlightInfo) and sends it a copy where it does not (unless `dry_run`).
    /// Returns (a copy was sent or would be, a check or send failed).
    async fn fill_copies(
        &self,
        handoff: HandoffEntry,
        peers: Vec<Peer>,
        dry_run: bool,
        metadata: &MetadataMap,
    ) -> (bool, bool) {
        let Ok(key) = CacheKey::try_from_store_bytes(&handoff.key) else {
            return (false, true);
        };
        let lifetime = self.carried(&handoff.entry, Some(handoff.last_access));
        if lifetime.remaining.is_some_and(|left| left.is_zero()) {
            return (false, false);
        }
        let sender = self.sender();
        // What the peer itself holds: not a read that would find the key elsewhere (its
        // previous holder during a ring change may be this very node).
        let probe_sender = self.sender().asking_what_is_held();
        let (mut copied, mut failed) = (false, false);
        for peer in &peers {
            let probe = forward::get_flight_info(
                &self.peers,
                peer,
                &probe_sender,
                key.to_descriptor(),
                metadata,
            )
            .await;
            match probe {
                Ok(_) => continue,
                Err(Error::Forwarded(status)) if status.code() == tonic::Code::NotFound => {}
                Err(err) => {
                    tracing::warn!(%key, owner = %peer.id, error = %err, "cannot check a copy");
                    failed = true;
                    continue;
                }
            }
            if dry_run {
                copied = true;
                continue;
            }
            let sent = tokio::time::timeout(
                ENTRY_DEADLINE,
                forward::send_entry(
                    &self.peers,
                    peer,
                    &sender,
                    &key,
                    &handoff.entry,
                    WriteKind::Migration,
                    &lifetime,
                    metadata,
                ),
            )
            .await;
            match sent {
                Ok(Ok(_)) => copied = true,
                Ok(Err(err)) => {
                    tracing::warn!(%key, owner = %peer.id, error = %err, "copy not sent");
                    failed = true;
                }
                Err(_) => failed = true,
            }
        }
        (copied, failed)
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
                "invalidate",
                super::ticket::CacheTicket::new(key.clone()).encode(),
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
