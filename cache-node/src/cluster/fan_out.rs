//! The pool fan-out: ListFlights over every non-draining member, and `invalidate-prefix`,
//! `invalidate-tag` and `clear` on every other member.
//!
//! ListFlights merges this node's entries with those of every non-draining member (asked
//! with the forwarded header so they answer locally), once per key and sorted by key,
//! within [`MAX_LISTED_FLIGHTS`] and [`MAX_LISTED_BYTES`]: at most
//! [`LISTING_CALLS_AT_ONCE`] members' answers are held at a time, each cut to the same
//! bounds, and the merge is cut to them after each, so a listing of a large pool holds
//! (1 + that many) answers' worth at most, not one per member.
//! `invalidate-prefix`, `invalidate-tag` and `clear` add up the `removed` counts of every
//! other member.
//! Neither fans out a request that was itself forwarded.
//!
//! Owns: who is asked and how the answers merge. Must not import `flight/` or `wire/`
//! (see the `cluster` module docs). Does network I/O through `forward.rs`.

use std::collections::BTreeMap;

use arrow_flight::{Action, Criteria, FlightInfo};
use bytes::Bytes;
use crds::admin;
use futures::StreamExt as _;
use prost::Message as _;
use tonic::metadata::MetadataMap;

use super::{Cluster, forward};
use crate::error::{Error, Result};
use crate::key::CacheKey;
use crate::routing::ring::MemberState;

/// Most FlightInfos one ListFlights answers: the first by key (of the node, and of the
/// pool after merging; each member lists at most as many, so the merge is exact). A
/// listing of a whole large pool would be built in memory on every node it touches;
/// a prefix in the criteria narrows it.
pub const MAX_LISTED_FLIGHTS: usize = 10_000;

/// Most bytes of FlightInfos (as encoded) one ListFlights answers, the first by key:
/// 10,000 infos of large schemas or long keys would otherwise make an answer of
/// gigabytes (a key may be 1 MiB, and it is in both the descriptor and the ticket).
pub const MAX_LISTED_BYTES: usize = 16 << 20;

/// Members asked at once for their listing: their answers are held until merged.
pub const LISTING_CALLS_AT_ONCE: usize = 4;

/// Cuts `merged` (sorted by key) to the listing bounds: what is cut is past the bounds
/// for good, since later answers can only add keys before it.
fn cut_to_listing_bounds(merged: &mut BTreeMap<Bytes, (FlightInfo, bool)>) {
    let mut bytes = 0usize;
    let cut = merged
        .iter()
        .enumerate()
        .find_map(|(index, (key, (info, _)))| {
            bytes = bytes.saturating_add(info.encoded_len());
            (index >= MAX_LISTED_FLIGHTS || bytes > MAX_LISTED_BYTES).then(|| key.clone())
        });
    if let Some(cut) = cut {
        merged.split_off(&cut);
    }
}

impl Cluster {
    /// ListFlights over the pool: with a topology (and unless the request is itself a
    /// fan-out) every non-draining member lists its own entries; the lists are merged with
    /// this node's (`list_local`: its entries as FlightInfos under their store keys),
    /// deduplicated by key (a key's copies: the owner's FlightInfo is kept) and sorted by
    /// key. A member that cannot be reached fails the whole call (UNAVAILABLE naming it)
    /// rather than answering with a silently partial list.
    ///
    /// # Errors
    /// A member's failure, or `list_local`'s.
    pub async fn list_pool(
        &self,
        criteria: &Criteria,
        metadata: &MetadataMap,
        list_local: impl Fn() -> Result<Vec<(Bytes, FlightInfo)>>,
    ) -> Result<Vec<FlightInfo>> {
        let membership = match self.routing.current() {
            Some(membership) if forward::forwarded_by(metadata).is_none() => membership,
            _ => {
                return Ok(list_local()?.into_iter().map(|(_, info)| info).collect());
            }
        };
        let self_id = self.routing.self_id();
        let listing = |id: &str| {
            membership
                .ring()
                .member(id)
                .is_some_and(|member| member.state() != MemberState::Draining)
        };
        let sender = self.sender();
        // Collected first: a stream over the borrowing iterator would not be `Send`.
        let peers: Vec<_> = membership
            .topology()
            .members
            .iter()
            .filter(|member| Some(member.id.as_str()) != self_id && listing(&member.id))
            .filter_map(|member| membership.peer(&member.id))
            .collect();
        let calls = peers.into_iter().map(|peer| {
            let (sender, criteria) = (&sender, criteria.clone());
            async move {
                let infos = forward::list_flights(
                    &self.peers,
                    &peer,
                    sender,
                    criteria,
                    metadata,
                    (MAX_LISTED_FLIGHTS, MAX_LISTED_BYTES),
                )
                .await?;
                Ok::<_, Error>((peer.id, infos))
            }
        });
        type Merged = BTreeMap<Bytes, (FlightInfo, bool)>;
        let add = |merged: &mut Merged, store_key: Bytes, info: FlightInfo, from: Option<&str>| {
            let from_owner = membership.ring().owner(&store_key).map(String::as_str) == from;
            match merged.get(&store_key) {
                Some((_, true)) => {}
                Some(_) if !from_owner => {}
                _ => {
                    merged.insert(store_key, (info, from_owner));
                }
            }
        };
        let mut merged = Merged::new();
        // A draining node's entries are not served any more (reads go to the owners).
        if self_id.is_none_or(listing) {
            for (store_key, info) in list_local()? {
                add(&mut merged, store_key, info, self_id);
            }
        }
        // Each answer merged as it comes and let go; the first failure ends the call.
        let mut answers = futures::stream::iter(calls).buffer_unordered(LISTING_CALLS_AT_ONCE);
        while let Some(answer) = answers.next().await {
            let (member, infos) = answer?;
            for info in infos {
                let Some(descriptor) = info.flight_descriptor.as_ref() else {
                    continue;
                };
                let store_key = CacheKey::from_descriptor(descriptor)?.to_store_bytes();
                add(&mut merged, store_key, info, Some(&member));
            }
            cut_to_listing_bounds(&mut merged);
        }
        cut_to_listing_bounds(&mut merged);
        Ok(merged.into_values().map(|(info, _)| info).collect())
    }

    /// Runs `invalidate-prefix`, `invalidate-tag` or `clear` (`action`) on every other
    /// member and adds up their `removed` counts. Not done for a request that was itself forwarded.
    ///
    /// # Errors
    /// A member that could not be reached or answered something else than the contract's
    /// [`admin::RemovedAnswer`].
    pub async fn remove_elsewhere(&self, action: &Action, metadata: &MetadataMap) -> Result<u64> {
        if forward::forwarded_by(metadata).is_some() {
            return Ok(0);
        }
        let Some(membership) = self.routing.current() else {
            return Ok(0);
        };
        let sender = self.sender();
        let peers: Vec<_> = membership
            .topology()
            .members
            .iter()
            .filter(|member| Some(member.id.as_str()) != self.routing.self_id())
            .filter_map(|member| membership.peer(&member.id))
            .collect();
        let sender = &sender;
        let calls = peers.iter().map(|peer| async move {
            let body =
                forward::do_action(&self.peers, peer, sender, action.clone(), metadata).await?;
            // Every member answers these actions with the same typed body.
            admin::decode::<admin::RemovedAnswer>(admin::AdminAction::Clear, &body)
                .map(|answer| answer.removed)
                .map_err(|source| Error::BadPeerAnswer {
                    peer: peer.id.to_string(),
                    source,
                })
        });
        let mut removed = 0;
        for answer in futures::future::join_all(calls).await {
            removed += answer?;
        }
        Ok(removed)
    }
}
