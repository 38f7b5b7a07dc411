//! Sending entries a node holds to other nodes, as handovers: what the exit handoff and
//! `rebalance` (its moves and its copies) share.
//!
//! Each item is one entry and the peers that should have it. Small entries (at most
//! [`forward::MIGRATION_BATCH_ENTRY_MAX_BYTES`]) go to each peer in migration batches
//! ([`forward::send_batch`]): one DoPut per peer and up to `batch_entries` entries, where
//! one DoPut per entry spent most of a small handover on its stream, headers and
//! authentication (an exit handoff of 6,853 entries of ~5 KB under load: 1,661 ms one by
//! one, 592 ms in batches of 64). A larger entry goes to its peers one DoPut each
//! ([`forward::send_entry`]). Calls start in item order (the callers list their entries
//! hottest first), `calls_at_once` at a time and at most `kib_in_flight` KiB of entries
//! in them; a call larger than that goes alone.
//!
//! An item is answered once every one of its peers has answered: held by all of them,
//! or the first refusal or failed call.
//!
//! Owns: grouping entries into calls and tallying the answers per entry. Must not import
//! `flight/` or `wire/` (see the `cluster` module docs). Does network I/O.

use std::collections::HashMap;

use futures::{Stream, StreamExt};
use tonic::metadata::MetadataMap;

use super::Cluster;
use super::forward::{self, WriteKind};
use crate::error::Error;
use crate::key::CacheKey;
use crate::routing::members::Peer;
use crate::store::{Entry, Lifetime};

/// One entry to hand over and the peers that should have it.
pub struct Item {
    /// The caller's index for the entry (answers name it).
    pub index: usize,
    /// Its key.
    pub key: CacheKey,
    /// The entry as stored.
    pub entry: std::sync::Arc<Entry>,
    /// The lifetime it carries (age, idle time, deadline, TTL override).
    pub lifetime: Lifetime,
    /// Where it goes.
    pub peers: Vec<Peer>,
}

/// How a handover's calls are sized and paced.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Small entries per batch call to one peer.
    pub batch_entries: usize,
    /// Calls at once.
    pub calls_at_once: usize,
    /// KiB of entries in the calls under way.
    pub kib_in_flight: u32,
}

/// How one item's handover ended.
#[derive(Debug)]
pub enum Sent {
    /// Every peer holds the key now (stored, or a live entry was already there).
    Held,
    /// A peer answered the entry but did not store it (no room, a bad entry, an
    /// invalidation since it was written).
    Refused {
        /// The peer.
        peer: String,
        /// Why, as it said.
        reason: String,
    },
    /// A call failed as a whole (a peer unreachable, stopping, too slow).
    Failed {
        /// The peer.
        peer: String,
        /// The peer could not take it then (unreachable, stopping, its ring mid-update:
        /// UNAVAILABLE), rather than refusing it: worth asking again soon.
        deferred: bool,
        /// The error, in words.
        reason: String,
    },
}

/// One call: a batch of small entries to one peer, or one large entry to all of its
/// peers (`to` none). Items by their place in the list given to [`Cluster::hand_over_all`].
struct Call {
    to: Option<Peer>,
    items: Vec<usize>,
    kib: u32,
}

/// Per item still waiting: how many of its peers have not answered, and the first
/// answer that was not "held".
struct Waiting {
    left: usize,
    outcome: Option<Sent>,
}

impl Cluster {
    /// Hands every item over (see the module docs). Yields `(index, Sent)` per item as
    /// soon as all of its peers answered; an item without peers is `Held` at once. Stops
    /// where the caller stops reading (the exit handoff's budget).
    pub(super) fn hand_over_all<'a>(
        &'a self,
        items: Vec<Item>,
        pace: Pace,
        kind: WriteKind,
        metadata: &'a MetadataMap,
    ) -> impl Stream<Item = (usize, Sent)> + 'a {
        let calls = plan_calls(
            items
                .iter()
                .map(|item| (item.entry.weight_bytes(), item.peers.as_slice())),
            pace,
        );
        let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(
            pace.kib_in_flight.max(1) as usize
        ));
        let items = std::sync::Arc::new(items);
        let mut waiting: HashMap<usize, Waiting> = items
            .iter()
            .enumerate()
            .map(|(at, item)| {
                let left = if item.entry.weight_bytes() > forward::MIGRATION_BATCH_ENTRY_MAX_BYTES {
                    1
                } else {
                    item.peers.len()
                };
                (
                    at,
                    Waiting {
                        left,
                        outcome: None,
                    },
                )
            })
            .collect();
        let without_peers: Vec<(usize, Sent)> = items
            .iter()
            .enumerate()
            .filter(|(_, item)| item.peers.is_empty())
            .map(|(at, item)| {
                waiting.remove(&at);
                (item.index, Sent::Held)
            })
            .collect();
        let answers = {
            let items = std::sync::Arc::clone(&items);
            futures::stream::iter(calls)
                .map(move |call| {
                    let (items, in_flight) = (
                        std::sync::Arc::clone(&items),
                        std::sync::Arc::clone(&in_flight),
                    );
                    async move {
                        let kib = call.kib.clamp(1, pace.kib_in_flight.max(1));
                        // The semaphore is never closed; a failure would only skip the bound.
                        let _bytes = in_flight.acquire_many(kib).await;
                        self.send_call(call, &items, kind, metadata).await
                    }
                })
                .buffer_unordered(pace.calls_at_once.max(1))
        };
        let done = answers.flat_map(move |answers| {
            let mut finished = Vec::new();
            for (at, sent) in answers {
                let Some(state) = waiting.get_mut(&at) else {
                    continue;
                };
                state.left = state.left.saturating_sub(1);
                if !matches!(sent, Sent::Held) && state.outcome.is_none() {
                    state.outcome = Some(sent);
                }
                if state.left == 0
                    && let Some(state) = waiting.remove(&at)
                {
                    finished.push((items[at].index, state.outcome.unwrap_or(Sent::Held)));
                }
            }
            futures::stream::iter(finished)
        });
        futures::stream::iter(without_peers).chain(done)
    }

    /// Sends one call; answers per item (its place in `items`), one per peer reached
    /// (a large entry: one for all of its peers).
    async fn send_call(
        &self,
        call: Call,
        items: &[Item],
        kind: WriteKind,
        metadata: &MetadataMap,
    ) -> Vec<(usize, Sent)> {
        let sender = self.sender();
        let Some(peer) = call.to else {
            let mut answers = Vec::new();
            for at in call.items {
                let Some(item) = items.get(at) else { continue };
                let mut outcome = Sent::Held;
                for peer in &item.peers {
                    let sent = forward::send_entry(
                        &self.peers,
                        peer,
                        &sender,
                        &item.key,
                        &item.entry,
                        kind,
                        &item.lifetime,
                        metadata,
                    )
                    .await;
                    if let Err(error) = sent {
                        outcome = Sent::Failed {
                            peer: peer.id.clone(),
                            deferred: is_deferred(&error),
                            reason: error.to_string(),
                        };
                        break;
                    }
                }
                answers.push((at, outcome));
            }
            return answers;
        };
        let batch: Vec<forward::BatchEntry<'_>> = call
            .items
            .iter()
            .filter_map(|&at| {
                let item = items.get(at)?;
                Some(forward::BatchEntry {
                    key: &item.key,
                    entry: &item.entry,
                    lifetime: item.lifetime,
                })
            })
            .collect();
        match forward::send_batch(&self.peers, &peer, &sender, &batch, metadata).await {
            Ok(answers) => call
                .items
                .iter()
                .zip(answers)
                .map(|(&at, answer)| {
                    let sent = match answer {
                        Ok(()) => Sent::Held,
                        Err(reason) => Sent::Refused {
                            peer: peer.id.clone(),
                            reason,
                        },
                    };
                    (at, sent)
                })
                .collect(),
            Err(error) => {
                tracing::debug!(peer = %peer.id, entries = call.items.len(), %error, "handover batch failed");
                let (deferred, reason) = (is_deferred(&error), error.to_string());
                call.items
                    .iter()
                    .map(|&at| {
                        let sent = Sent::Failed {
                            peer: peer.id.clone(),
                            deferred,
                            reason: reason.clone(),
                        };
                        (at, sent)
                    })
                    .collect()
            }
        }
    }
}

/// Whether `err` says the peer could not take an entry then (unreachable, stopping, its
/// ring mid-update: UNAVAILABLE), not that it refused it.
pub(super) fn is_deferred(err: &Error) -> bool {
    match err {
        Error::OwnerUnreachable { .. } => true,
        Error::Forwarded(status) => status.code() == tonic::Code::Unavailable,
        _ => false,
    }
}

/// The calls for items of these weights (bytes) and peers, in item order: each peer's
/// small entries in batches of `pace.batch_entries` (a batch is sent once full or at
/// `pace.kib_in_flight`, or at the end), each large entry on its own.
fn plan_calls<'p>(items: impl IntoIterator<Item = (u64, &'p [Peer])>, pace: Pace) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut open: Vec<Call> = Vec::new();
    for (at, (weight, peers)) in items.into_iter().enumerate() {
        if peers.is_empty() {
            continue;
        }
        let kib = u32::try_from(weight.div_ceil(1024)).unwrap_or(u32::MAX);
        if weight > forward::MIGRATION_BATCH_ENTRY_MAX_BYTES {
            calls.push(Call {
                to: None,
                items: vec![at],
                kib,
            });
            continue;
        }
        for peer in peers {
            let slot = match open.iter().position(|call| call.to.as_ref() == Some(peer)) {
                Some(slot) => slot,
                None => {
                    open.push(Call {
                        to: Some(peer.clone()),
                        items: Vec::new(),
                        kib: 0,
                    });
                    open.len() - 1
                }
            };
            let call = &mut open[slot];
            call.items.push(at);
            call.kib = call.kib.saturating_add(kib);
            if call.items.len() >= pace.batch_entries.max(1) || call.kib >= pace.kib_in_flight {
                calls.push(open.remove(slot));
            }
        }
    }
    calls.extend(open);
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(ids: &[&str]) -> Vec<Peer> {
        ids.iter()
            .map(|id| Peer {
                id: (*id).into(),
                address: format!("{id}:50051"),
            })
            .collect()
    }

    fn shape(calls: &[Call]) -> Vec<(Option<String>, Vec<usize>)> {
        calls
            .iter()
            .map(|call| (call.to.as_ref().map(|p| p.id.clone()), call.items.clone()))
            .collect()
    }

    #[test]
    fn small_entries_go_in_batches_per_peer_in_order_and_large_ones_alone() {
        let pace = Pace {
            batch_entries: 2,
            calls_at_once: 4,
            kib_in_flight: 16 * 1024,
        };
        let (a, ab, b, none) = (peers(&["a"]), peers(&["a", "b"]), peers(&["b"]), peers(&[]));
        let items = [
            (5_000, a.as_slice()),
            (5_000, ab.as_slice()),
            (forward::MIGRATION_BATCH_ENTRY_MAX_BYTES + 1, b.as_slice()),
            (5_000, a.as_slice()),
            (5_000, none.as_slice()),
        ];
        assert_eq!(
            shape(&plan_calls(items, pace)),
            vec![
                // a's batch is full at its second entry; the large entry goes alone (to
                // each of its peers, in one call); the rest at the end, in the order
                // their batches opened; an entry without peers makes no call.
                (Some("a".into()), vec![0, 1]),
                (None, vec![2]),
                (Some("b".into()), vec![1]),
                (Some("a".into()), vec![3]),
            ]
        );
    }

    #[test]
    fn a_batch_closes_once_its_bytes_reach_the_bound() {
        let pace = Pace {
            batch_entries: 64,
            calls_at_once: 4,
            kib_in_flight: 8,
        };
        let a = peers(&["a"]);
        let items = [
            (5_000, a.as_slice()),
            (5_000, a.as_slice()),
            (5_000, a.as_slice()),
        ];
        assert_eq!(
            shape(&plan_calls(items, pace)),
            vec![(Some("a".into()), vec![0, 1]), (Some("a".into()), vec![2])],
            "two entries of 5 KiB reach 8 KiB"
        );
    }
}
