//! The exit handoff: a node stopping on a SIGTERM the operator did not plan (a deleted
//! pod, an eviction, a node drain) copies the entries it holds to where their keys go
//! while it is away, before it stops serving.
//!
//! The operator's planned restarts drain a node first (`rebalance` moves its entries and
//! removes them here), so at their SIGTERM little is left. An unplanned one finds the
//! node active with its hot set: without a handoff its keys would be misses until it is
//! back and re-warmed. Each entry, hottest first, goes to the key's holders under the
//! ring with this node draining (its next ring choice) as a handover (`handover.rs`:
//! small entries in migration batches, larger ones as DoPuts marked
//! `x-flightcache-write: migration`; kept only where the key is absent, so a newer
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
use super::handover::{Item, Pace, Sent};
use super::{Cluster, ForwardedPut, Upload};
use crate::error::Result;
use crate::key::CacheKey;
use crate::routing::members::Peer;
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
    /// node has left the ring, within `budget` (`handover.rs`: small entries in batches
    /// of [`EXIT_BATCH_ENTRIES`] per holder). Nothing to do for a node that is not a ring
    /// member or is the ring's only active member. An entry counts as sent once every
    /// holder has it; an expired one as sent at once (nothing to keep).
    pub async fn hand_off_at_exit(&self, budget: Duration) -> ExitHandoff {
        let started = Instant::now();
        self.begin_stopping();
        let Some(leaving) = self.routing.without_self() else {
            return ExitHandoff::default();
        };
        let entries = self.store.handoff_list();
        let total = entries.len() as u64;
        let mut report = ExitHandoff::default();
        let mut items = Vec::with_capacity(entries.len());
        for (index, handoff) in entries.into_iter().enumerate() {
            let lifetime = self.carried(&handoff.entry, Some(handoff.last_access));
            if lifetime.remaining.is_some_and(|left| left.is_zero()) {
                report.sent += 1;
                continue;
            }
            let key = CacheKey::try_from_store_bytes(&handoff.key);
            let peers: Option<Vec<Peer>> = leaving
                .owners(&handoff.key)
                .into_iter()
                .map(|id| leaving.peer(id))
                .collect();
            match (key, peers) {
                (Ok(key), Some(peers)) if !peers.is_empty() => items.push(Item {
                    index,
                    key,
                    entry: handoff.entry,
                    lifetime,
                    peers,
                }),
                _ => report.failed += 1,
            }
        }
        let metadata = MetadataMap::new();
        let pace = Pace {
            batch_entries: EXIT_BATCH_ENTRIES,
            calls_at_once: EXIT_CALLS_AT_ONCE,
            kib_in_flight: EXIT_KIB_IN_FLIGHT,
        };
        let sends = self.hand_over_all(items, pace, WriteKind::Migration, &metadata);
        tokio::pin!(sends);
        let deadline = tokio::time::sleep(budget);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                done = sends.next() => match done {
                    Some((_, Sent::Held)) => report.sent += 1,
                    Some((_, Sent::Refused { peer, reason } | Sent::Failed { peer, reason, .. })) => {
                        tracing::debug!(holder = %peer, %reason, "exit handoff of an entry failed");
                        report.failed += 1;
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
        match forward::do_put(&self.peers, &holder, &sender, first, rest, metadata, kind).await {
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
