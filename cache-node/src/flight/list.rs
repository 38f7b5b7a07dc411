//! ListFlights over the pool: this node's entries plus, with a topology, those of every
//! non-draining member (asked with the forwarded header so they answer locally), merged
//! once per key and sorted by key. Does network I/O through `forward.rs`.

use std::collections::BTreeMap;

use arrow_flight::{Criteria, FlightInfo};
use bytes::Bytes;
use crds::node_config::LocationMode;
use tonic::metadata::MetadataMap;

use super::{FlightCacheService, forward};
use crate::error::Error;
use crate::key::CacheKey;
use crate::routing::ring::MemberState;

/// Most FlightInfos one ListFlights answers: the first by key (of the node, and of the
/// pool after merging; each member lists at most as many, so the merge is exact). A
/// listing of a whole large pool would be built in memory on every node it touches;
/// a prefix in the criteria narrows it.
pub const MAX_LISTED_FLIGHTS: usize = 10_000;

impl FlightCacheService {
    /// This node's live entries under `prefix` as FlightInfos, sorted by key.
    pub(super) fn list_local(&self, prefix: &[u8]) -> Result<Vec<(Bytes, FlightInfo)>, Error> {
        let mut infos = Vec::new();
        for (store_key, entry) in self.store.list(prefix, MAX_LISTED_FLIGHTS) {
            let key = CacheKey::try_from_store_bytes(&store_key)?;
            infos.push((store_key, self.flight_info(&key, &entry)?));
        }
        Ok(infos)
    }

    /// ListFlights over the pool: with a topology (and unless the request is itself a
    /// fan-out) every non-draining member lists its own entries; the lists are merged,
    /// deduplicated by key (a key's copies: the owner's FlightInfo is kept) and sorted by
    /// key. A member that cannot be reached fails the whole call (UNAVAILABLE naming it)
    /// rather than answering with a silently partial list.
    pub(super) async fn list_pool(
        &self,
        prefix: &[u8],
        criteria: &Criteria,
        metadata: &MetadataMap,
    ) -> Result<Vec<FlightInfo>, Error> {
        let membership = match self.routing.current() {
            Some(membership) if forward::forwarded_by(metadata).is_none() => membership,
            _ => {
                return Ok(self
                    .list_local(prefix)?
                    .into_iter()
                    .map(|(_, info)| info)
                    .collect());
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
            for (store_key, info) in self.list_local(prefix)? {
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
        let proxy = self.live.location_mode() == LocationMode::Proxy;
        Ok(merged
            .into_values()
            .take(MAX_LISTED_FLIGHTS)
            .map(|(mut info, _)| {
                if proxy {
                    for endpoint in &mut info.endpoint {
                        endpoint.location.clear();
                    }
                }
                info
            })
            .collect())
    }
}
