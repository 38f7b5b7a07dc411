//! The pool fan-out: ListFlights over every non-draining member, and `invalidate-prefix`,
//! `invalidate-tag` and `clear` on every other member.
//!
//! ListFlights merges this node's entries with those of every non-draining member (asked
//! with the forwarded header so they answer locally), once per key and sorted by key.
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
        let calls = membership
            .topology()
            .members
            .iter()
            .filter(|member| Some(member.id.as_str()) != self_id && listing(&member.id))
            .filter_map(|member| membership.peer(&member.id))
            .map(|peer| {
                let (sender, criteria) = (&sender, criteria.clone());
                async move {
                    let infos =
                        forward::list_flights(&self.peers, &peer, sender, criteria, metadata)
                            .await?;
                    Ok::<_, Error>((peer.id, infos))
                }
            });
        let remote = futures::future::try_join_all(calls).await?;
        let mut merged: BTreeMap<Bytes, (FlightInfo, bool)> = BTreeMap::new();
        let mut add = |store_key: Bytes, info: FlightInfo, from: Option<&str>| {
            let from_owner = membership.ring().owner(&store_key).map(String::as_str) == from;
            match merged.get(&store_key) {
                Some((_, true)) => {}
                Some(_) if !from_owner => {}
                _ => {
                    merged.insert(store_key, (info, from_owner));
                }
            }
        };
        // A draining node's entries are not served any more (reads go to the owners).
        if self_id.is_none_or(listing) {
            for (store_key, info) in list_local()? {
                add(store_key, info, self_id);
            }
        }
        for (member, infos) in remote {
            for info in infos {
                let Some(descriptor) = info.flight_descriptor.as_ref() else {
                    continue;
                };
                let store_key = CacheKey::from_descriptor(descriptor)?.to_store_bytes();
                add(store_key, info, Some(&member));
            }
        }
        Ok(merged
            .into_values()
            .take(MAX_LISTED_FLIGHTS)
            .map(|(info, _)| info)
            .collect())
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
