//! The exit handoff: a node stopping on a SIGTERM the operator did not plan (a deleted
//! pod, an eviction, a node drain) copies the entries it holds to where their keys go
//! while it is away, before it stops serving.
//!
//! The operator's planned restarts drain a node first (`rebalance` moves its entries and
//! removes them here), so at their SIGTERM little is left. An unplanned one finds the
//! node active with its hot set: without a handoff its keys would be misses until it is
//! back and re-warmed. Each entry, hottest first, goes to the key's holders under the
//! ring with this node draining (its next ring choice), as a DoPut marked
//! `x-flightcache-write: migration` (kept only where the key is absent, so a newer
//! write is never overwritten). Entries are copied, not moved: with `persistence` the
//! node's own files stay for its restart. While the node is away its peers read its keys
//! from there (`read_copies` asks the next candidate when no copy can be reached), and
//! once it is back it asks there on a miss for the move window (`previous_holders`).
//!
//! Bounded: at most [`crate::config::EXIT_HANDOFF_BUDGET`] in all (inside the pod's termination grace,
//! before the serving grace and the disk flush), [`EXIT_CALLS_AT_ONCE`] calls and
//! [`EXIT_KIB_IN_FLIGHT`] KiB of entries at once;
//! what is not sent by then is counted and logged, never waited for.
//!
//! Owns: the exit copies. Must not import `flight/` or `wire/` (see the `cluster` module
//! docs); `server.rs` runs it at shutdown. Does network I/O.

use std::time::{Duration, Instant};

use arrow_flight::FlightData;
use futures::StreamExt;
use tonic::metadata::MetadataMap;

use super::forward::{self, PutFailure, WriteKind};
use super::{Cluster, ForwardedPut, Upload};
use crate::error::Result;
use crate::key::CacheKey;
use crate::routing::members::{Membership, Peer};
use crate::store::{HandoffEntry, Lifetime};
use crate::streams::UploadRest;

/// Longest a node serves through its exit handoff with one copy of each key. Past it,
/// it stops taking calls (GOAWAY; the calls in flight finish) and goes on copying: a
/// force-deleted pod is SIGKILLed 2 s after its SIGTERM (the kubelet's minimum grace),
/// and a call in flight then fails, while a key read before its copy lands only misses.
pub const EXIT_SERVING_LIMIT: Duration = Duration::from_millis(1500);

/// Calls of the exit handoff at once: batches of small entries (see
/// [`EXIT_BATCH_ENTRIES`]) or single large entries.
pub const EXIT_CALLS_AT_ONCE: usize = 8;

/// Small entries per batch call to one holder at exit. Measured under the changes e2e's
/// load (6,853 entries of ~5 KB to two holders) with one DoPut per entry, 64 at once:
/// 1.19–1.66 s, at the edge of a force delete's SIGKILL 2 s after the SIGTERM.
pub const EXIT_BATCH_ENTRIES: usize = 64;

/// Bytes of entries (KiB) being sent at once at exit: large entries go a few at a time,
/// so the receivers' budgets are not asked for many large entries at once. A call larger
/// than this goes alone.
pub const EXIT_KIB_IN_FLIGHT: u32 = 16 * 1024;

/// Runs `handoff` while the node serves for at most `serving_limit`: past it (at once for
/// a zero limit) `stop_serving` is called and the handoff goes on to its end.
pub async fn serving_at_most<F: std::future::Future>(
    handoff: F,
    serving_limit: Duration,
    stop_serving: impl FnOnce(),
) -> F::Output {
    tokio::pin!(handoff);
    tokio::select! {
        biased;
        done = &mut handoff => done,
        () = tokio::time::sleep(serving_limit) => {
            stop_serving();
            handoff.await
        }
    }
}

/// One call of the exit handoff: a batch of small entries to one holder (`to`), or one
/// large entry to each of its holders (`to` none). Entries by their index in the
/// handoff list, with the lifetime they carry.
struct ExitCall {
    to: Option<Peer>,
    entries: Vec<(usize, Lifetime)>,
    kib: u32,
}

/// Per entry of the handoff list: how many holders have still to answer, and whether
/// one refused.
#[derive(Default)]
struct Tally {
    waiting: std::collections::HashMap<usize, (usize, bool)>,
}

impl Tally {
    fn expect(&mut self, index: usize, holders: usize) {
        self.waiting.insert(index, (holders, true));
    }

    /// A holder's answer for entry `index` (for an entry sent alone, all of them): the
    /// entry is sent once every holder has it, failed once every holder answered and
    /// one did not take it.
    fn record(&mut self, index: usize, held: bool, report: &mut ExitHandoff) {
        let Some((left, all_held)) = self.waiting.get_mut(&index) else {
            return;
        };
        *all_held &= held;
        *left = left.saturating_sub(1);
        if *left > 0 {
            return;
        }
        if *all_held {
            report.sent += 1;
        } else {
            report.failed += 1;
        }
        self.waiting.remove(&index);
    }
}

/// What the exit handoff did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExitHandoff {
    /// Entries copied to their next holders.
    pub sent: u64,
    /// Entries whose copy failed (a holder unreachable or refusing).
    pub failed: u64,
    /// Entries not sent before the budget ran out.
    pub unsent: u64,
    /// How long it took.
    pub elapsed: Duration,
}

impl Cluster {
    /// Copies every entry this node holds, hottest first, to its key's holders once this
    /// node has left the ring, within `budget`. Nothing to do for a node that is not a
    /// ring member or is the ring's only active member. Small entries go in migration
    /// batches ([`forward::send_batch`], [`EXIT_BATCH_ENTRIES`] to a holder per call),
    /// larger ones one DoPut each; an entry counts as sent once every holder has it.
    pub async fn hand_off_at_exit(&self, budget: Duration) -> ExitHandoff {
        let started = Instant::now();
        self.begin_stopping();
        let Some(leaving) = self.routing.without_self() else {
            return ExitHandoff::default();
        };
        let entries = self.store.handoff_list();
        let total = entries.len() as u64;
        let mut report = ExitHandoff::default();
        let (calls, mut tally) = self.exit_calls(&entries, &leaving, &mut report);
        let metadata = MetadataMap::new();
        let in_flight = tokio::sync::Semaphore::new(EXIT_KIB_IN_FLIGHT as usize);
        let sends = futures::stream::iter(calls)
            .map(|call| {
                let kib = call.kib.clamp(1, EXIT_KIB_IN_FLIGHT);
                let (in_flight, leaving, metadata, entries) =
                    (&in_flight, &leaving, &metadata, &entries);
                async move {
                    // The semaphore is never closed; a failure would only skip the bound.
                    let _bytes = in_flight.acquire_many(kib).await;
                    self.send_exit_call(call, entries, leaving, metadata).await
                }
            })
            .buffer_unordered(EXIT_CALLS_AT_ONCE);
        tokio::pin!(sends);
        let deadline = tokio::time::sleep(budget);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                done = sends.next() => match done {
                    Some(outcomes) => {
                        for (index, held) in outcomes {
                            tally.record(index, held, &mut report);
                        }
                    }
                    None => break,
                },
                () = &mut deadline => break,
            }
        }
        report.unsent = total - report.sent - report.failed;
        report.elapsed = started.elapsed();
        tracing::info!(
            sent = report.sent,
            failed = report.failed,
            unsent = report.unsent,
            elapsed_ms = report.elapsed.as_millis(),
            "exit handoff: entries copied to the nodes that hold their keys while this one is away"
        );
        report
    }

    /// The calls of an exit handoff, in the order of `entries` (hottest first): each
    /// holder's small entries in batches, each large entry on its own. Entries with
    /// nothing to send (expired: nothing to keep) are counted as sent, those that cannot
    /// be sent (a bad key, a holder without an address) as failed, in `report`.
    fn exit_calls(
        &self,
        entries: &[HandoffEntry],
        leaving: &Membership,
        report: &mut ExitHandoff,
    ) -> (Vec<ExitCall>, Tally) {
        let mut calls = Vec::new();
        let mut tally = Tally::default();
        let mut open: Vec<(Peer, ExitCall)> = Vec::new();
        for (index, handoff) in entries.iter().enumerate() {
            let lifetime = self.carried(&handoff.entry, Some(handoff.last_access));
            let expired = lifetime.remaining.is_some_and(|left| left.is_zero());
            let valid_key = CacheKey::try_from_store_bytes(&handoff.key).is_ok();
            let holders: Option<Vec<Peer>> = leaving
                .owners(&handoff.key)
                .into_iter()
                .map(|id| leaving.peer(id))
                .collect();
            let kib = u32::try_from(handoff.entry.weight_bytes().div_ceil(1024))
                .unwrap_or(EXIT_KIB_IN_FLIGHT);
            match holders {
                _ if expired => report.sent += 1,
                Some(holders) if valid_key && !holders.is_empty() => {
                    if handoff.entry.weight_bytes() > forward::MIGRATION_BATCH_ENTRY_MAX_BYTES {
                        tally.expect(index, 1);
                        calls.push(ExitCall {
                            to: None,
                            entries: vec![(index, lifetime.clone())],
                            kib,
                        });
                        continue;
                    }
                    tally.expect(index, holders.len());
                    for holder in holders {
                        let slot = match open.iter().position(|(peer, _)| *peer == holder) {
                            Some(slot) => slot,
                            None => {
                                let call = ExitCall {
                                    to: Some(holder.clone()),
                                    entries: Vec::new(),
                                    kib: 0,
                                };
                                open.push((holder, call));
                                open.len() - 1
                            }
                        };
                        let call = &mut open[slot].1;
                        call.entries.push((index, lifetime.clone()));
                        call.kib = call.kib.saturating_add(kib);
                        if call.entries.len() == EXIT_BATCH_ENTRIES {
                            calls.push(open.swap_remove(slot).1);
                        }
                    }
                }
                _ => report.failed += 1,
            }
        }
        calls.extend(open.into_iter().map(|(_, call)| call));
        (calls, tally)
    }

    /// Sends one call of the exit handoff; returns, per entry index, whether the holder
    /// (or, for a large entry sent alone, every holder) has it now.
    async fn send_exit_call(
        &self,
        call: ExitCall,
        entries: &[HandoffEntry],
        leaving: &Membership,
        metadata: &MetadataMap,
    ) -> Vec<(usize, bool)> {
        let Some(peer) = call.to else {
            let mut done = Vec::new();
            for (index, _) in call.entries {
                let held = match entries.get(index) {
                    Some(handoff) => self.copy_to_next_holders(handoff, leaving, metadata).await,
                    None => false,
                };
                done.push((index, held));
            }
            return done;
        };
        let keys: Vec<(usize, CacheKey, Lifetime)> = call
            .entries
            .into_iter()
            .filter_map(|(index, lifetime)| {
                let key = CacheKey::try_from_store_bytes(&entries.get(index)?.key).ok()?;
                Some((index, key, lifetime))
            })
            .collect();
        let batch: Vec<forward::BatchEntry<'_>> = keys
            .iter()
            .filter_map(|(index, key, lifetime)| {
                Some(forward::BatchEntry {
                    key,
                    entry: &entries.get(*index)?.entry,
                    lifetime: lifetime.clone(),
                })
            })
            .collect();
        let sender = self.sender();
        match forward::send_batch(&self.peers, &peer, &sender, &batch, metadata).await {
            Ok(held) => keys
                .iter()
                .zip(held)
                .map(|((index, _, _), held)| (*index, held))
                .collect(),
            Err(err) => {
                tracing::debug!(holder = %peer.id, entries = keys.len(), error = %err, "exit handoff batch failed");
                keys.iter().map(|(index, _, _)| (*index, false)).collect()
            }
        }
    }

    /// A client's put of a key this stopping node owns: sent on to the key's holder while
    /// this node is away (its stand-in, `Membership::stand_in`: the next ring choice with
    /// one copy, the other copy with two — where the exit handoff copies its entries
    /// too, and where its peers look while it is away) as a fallback write, so it
    /// outlives this process; the next rebalance after the node is back hands it over.
    /// Stored here ([`ForwardedPut::StoreHere`]) only when there is no such holder (the
    /// ring's only active member) or it could not be reached before any of the upload
    /// was sent.
    ///
    /// # Errors
    /// The holder's refusal, or a failure once part of the upload was sent.
    pub async fn put_while_stopping(
        &self,
        key: &CacheKey,
        first: FlightData,
        rest: UploadRest,
        metadata: &MetadataMap,
    ) -> Result<ForwardedPut> {
        let holder = self.routing.current().and_then(|current| {
            let me = self.routing.self_id()?;
            current.ring().member(me)?;
            let id = current.stand_in(&key.to_store_bytes(), me)?;
            current.peer(id)
        });
        let Some(holder) = holder else {
            return Ok(ForwardedPut::StoreHere(Box::new(Upload { first, rest })));
        };
        let kind = Some(WriteKind::Fallback);
        let sender = self.sender();
        match forward::do_put(
            &self.peers,
            &self.replay_budget,
            &holder,
            &sender,
            first,
            rest,
            metadata,
            kind,
        )
        .await
        {
            Ok(answer) => {
                self.metrics.fallback_writes.inc();
                Ok(ForwardedPut::Relayed(answer))
            }
            Err(PutFailure::Failed(err)) => Err(err),
            Err(PutFailure::Undelivered(undelivered)) => {
                let forward::Undelivered { first, rest, .. } = *undelivered;
                Ok(ForwardedPut::StoreHere(Box::new(Upload { first, rest })))
            }
        }
    }

    /// Sends one entry to its key's holders under `leaving`. Returns whether every one
    /// has it (an expired entry counts as done: nothing to keep).
    async fn copy_to_next_holders(
        &self,
        handoff: &HandoffEntry,
        leaving: &Membership,
        metadata: &MetadataMap,
    ) -> bool {
        let Ok(key) = CacheKey::try_from_store_bytes(&handoff.key) else {
            return false;
        };
        let lifetime = self.carried(&handoff.entry, Some(handoff.last_access));
        if lifetime.remaining.is_some_and(|left| left.is_zero()) {
            return true;
        }
        let sender = self.sender();
        let mut all = true;
        for id in leaving.owners(&handoff.key) {
            let Some(peer) = leaving.peer(id) else {
                all = false;
                continue;
            };
            let sent = forward::send_entry(
                &self.peers,
                &peer,
                &sender,
                &key,
                &handoff.entry,
                WriteKind::Migration,
                &lifetime,
                metadata,
            )
            .await;
            if let Err(err) = sent {
                tracing::debug!(%key, holder = %peer.id, error = %err, "exit handoff of an entry failed");
                all = false;
            }
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_handoff_longer_than_the_serving_limit_stops_serving_at_the_limit_and_goes_on() {
        let began = tokio::time::Instant::now();
        let stopped_at = std::cell::Cell::new(None);
        let copied = serving_at_most(
            async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                "copied"
            },
            EXIT_SERVING_LIMIT,
            || stopped_at.set(Some(began.elapsed())),
        )
        .await;
        assert_eq!(copied, "copied");
        assert_eq!(stopped_at.get(), Some(EXIT_SERVING_LIMIT));
        assert_eq!(began.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_handoff_within_the_limit_serves_throughout_and_a_zero_limit_stops_at_once() {
        let stopped = std::cell::Cell::new(false);
        serving_at_most(
            tokio::time::sleep(Duration::from_secs(1)),
            EXIT_SERVING_LIMIT,
            || stopped.set(true),
        )
        .await;
        assert!(!stopped.get(), "a 1 s handoff ends before the 1.5 s limit");
        let began = tokio::time::Instant::now();
        let stopped_at = std::cell::Cell::new(None);
        serving_at_most(
            tokio::time::sleep(Duration::from_secs(1)),
            Duration::ZERO,
            || stopped_at.set(Some(began.elapsed())),
        )
        .await;
        assert_eq!(stopped_at.get(), Some(Duration::ZERO));
    }
}
