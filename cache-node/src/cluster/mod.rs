//! The cluster layer: what a node does with its peers.
//!
//! - [`peers`]: one pooled channel per peer (TLS, peer credential, peer health).
//! - [`forward`]: calls to peers over those channels (the forwarding headers, relayed
//!   DoGet/DoPut/GetFlightInfo/GetSchema/DoAction/ListFlights).
//! - `replica`: a key's copies: the owner's replica write, reads that go from copy to
//!   copy (and to previous holders and the next candidate), read repair, fallback
//!   writes, invalidating every copy.
//! - [`rebalance`] and [`exit`]: handing entries to their owners after a ring change and
//!   at an unplanned stop.
//! - [`lease`]: fill leases (miss coalescing) on the key's owner.
//! - [`fan_out`]: ListFlights, `invalidate-prefix` and `clear` over every member.
//!
//! Owns: the decisions about peers and the calls to them, made as a Flight *client*.
//! Answers are typed (entries, counts, the admin contract's answers in `crds::admin`) or
//! the node's [`Error`], which `error.rs` maps to a gRPC status in one place. Must not
//! import the Flight server side (`arrow_flight::flight_service_server`, the
//! `FlightService` trait, `tonic::server`), the Flight adapter (`flight/`) nor the wire
//! layer (`wire/`): both sit above it (checked by `scripts/check-layers`). Does network
//! I/O.

pub mod exit;
pub mod fan_out;
pub mod forward;
pub mod lease;
pub mod peers;
pub mod rebalance;
mod replica;

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::{Action, FlightData, PutResult};
use bytes::Bytes;
use tonic::metadata::MetadataMap;

use crate::error::{Error, Result};
use crate::key::CacheKey;
use crate::metrics::Metrics;
use crate::routing::members::{Peer, Route, RoutingTable};
use crate::store::{Entry, Store};
use crate::streams::{FlightStream, UploadRest};
use forward::WriteKind;
use lease::LeaseOutcome;

/// Most read repairs a node sends at once; past that, a repair is skipped.
pub const REPAIRS_AT_ONCE: usize = 8;

/// The node's side of the cluster: its store, the ring it routes by, the pooled channels
/// to its peers, its fill leases and the read repairs in flight. Cheap to clone (shared
/// handles).
#[derive(Debug, Clone)]
pub struct Cluster {
    store: Arc<Store>,
    /// The store's budget, for the copies relayed puts keep (`forward::ReplayBudget`).
    replay_budget: forward::ReplayBudget,
    metrics: Arc<Metrics>,
    routing: Arc<RoutingTable>,
    peers: peers::Peers,
    leases: Arc<lease::Leases>,
    /// Read repairs in flight (see `replica.rs`).
    repairs: Arc<tokio::sync::Semaphore>,
    /// When this node started serving, and when its last whole rebalance started: the
    /// operator compares them across a pool's nodes to find a peer that restarted since a
    /// node last handed out its copies (`stats`: `uptimeMs`, `lastRebalanceMsAgo`).
    started: Instant,
    last_rebalance: Arc<parking_lot::Mutex<Option<Instant>>>,
    /// Set when a copy of a key this node does not hold under its ring (a stopping
    /// peer's exit handoff, a put while its owner was unreachable) is stored here, cleared
    /// when a whole rebalance starts: while set, `stats` says so (`holdsStrays`, and no
    /// whole rebalance), so the operator asks for one (`note_if_not_held_here`).
    holds_copies_not_its_own: Arc<std::sync::atomic::AtomicBool>,
    /// Whether the last whole rebalance left a move or a copy unsent: while set, `stats`
    /// says so (`owesHandover`) and the operator asks again. A handoff that failed once
    /// (an owner's breaker still open just after a partition healed) was never asked for
    /// again: the ring had not changed since, and the owner had not restarted (a CI run's
    /// node-partition: 219 of 1,111 sampled keys kept one copy for good).
    owes_handover: Arc<std::sync::atomic::AtomicBool>,
    /// The ring version of the last whole rebalance that sent everything (0: none): a
    /// ring installed since that asked this node to hand off
    /// ([`RoutingTable::handoff_asked_at`]) is owed until one runs on it. The operator
    /// asks in the pass that publishes the ring, but that call may not come: a CI run's
    /// node-partition ended the pass at another node's failed sends, and the node that
    /// was never asked kept 215 keys' only copies.
    rebalanced_through: Arc<std::sync::atomic::AtomicU64>,
    /// Set once the node begins to stop (see [`Cluster::begin_stopping`]).
    stopping: Arc<std::sync::atomic::AtomicBool>,
    /// Rebalance sends that failed because the owner could not take them then (see
    /// `rebalance.rs`).
    rebalance_deferred: Arc<std::sync::atomic::AtomicU64>,
}

/// What became of a put forwarded to its owner.
pub enum ForwardedPut {
    /// The owner, or the key's next candidate when the owner could not be reached,
    /// answered: its PutResult stream, passed on.
    Relayed(FlightStream<PutResult>),
    /// The owner could not be reached and this node is the key's next candidate: the
    /// caller stores the upload here as a fallback copy ([`WriteKind::Fallback`]).
    StoreHere(Box<Upload>),
}

/// A client's DoPut upload, untouched but for its first message.
pub struct Upload {
    /// The first message (already read to find the key).
    pub first: FlightData,
    /// The rest of the upload (see [`UploadRest`]).
    pub rest: UploadRest,
}

impl Cluster {
    /// The cluster side of a node serving `store`, routing by `routing` and calling its
    /// peers over `peers` (shared with the DoGet relay).
    pub fn new(
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        routing: Arc<RoutingTable>,
        peers: peers::Peers,
    ) -> Self {
        let budget = Arc::clone(&store);
        Self {
            store,
            replay_budget: forward::ReplayBudget::new(move |bytes| {
                budget
                    .reserve_intake(bytes)
                    .map(|held| Box::new(held) as Box<dyn Send + Sync>)
            }),
            metrics,
            routing,
            peers,
            leases: Arc::new(lease::Leases::default()),
            repairs: Arc::new(tokio::sync::Semaphore::new(REPAIRS_AT_ONCE)),
            started: Instant::now(),
            last_rebalance: Arc::new(parking_lot::Mutex::new(None)),
            holds_copies_not_its_own: Arc::default(),
            owes_handover: Arc::default(),
            rebalanced_through: Arc::default(),
            stopping: Arc::default(),
            rebalance_deferred: Arc::default(),
        }
    }

    /// How long this node has served.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Whether the node holds a copy, stored since its last whole rebalance began, of a
    /// key it does not hold under its ring (see `note_if_not_held_here`): the
    /// operator asks such a node for a rebalance whatever its peers' ages.
    pub fn holds_strays(&self) -> bool {
        self.holds_copies_not_its_own
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether the last whole rebalance left a move or a copy unsent, or a ring installed
    /// since asked this node to hand off (see the fields).
    pub fn owes_handover(&self) -> bool {
        self.owes_handover
            .load(std::sync::atomic::Ordering::Acquire)
            || self.routing.handoff_asked_at()
                > self
                    .rebalanced_through
                    .load(std::sync::atomic::Ordering::Acquire)
    }

    /// How long ago its last whole rebalance (not a dry run, no limit) started; `None`
    /// before the first, and while the node holds a copy stored since then of a key it does
    /// not hold under its ring (it owes that key's holder a handover just as it owes a
    /// restarted peer its copies).
    pub fn last_rebalance_ago(&self) -> Option<Duration> {
        if self.holds_strays() {
            return None;
        }
        self.last_rebalance.lock().map(|at| at.elapsed())
    }

    /// Marks the node as stopping (its SIGTERM arrived): from now on it takes no copies
    /// of entries and answers no `held` question ([`Error::Stopping`]), and it stores no
    /// client put itself but on the key's holder while it is away
    /// ([`Cluster::put_while_stopping`]). Whatever it stored after its exit handoff began
    /// would end with the process: a rebalance a peer ran at that moment (the operator
    /// asks for one once the pod's replacement is Ready, which for a deleted pod can be
    /// before the old process ends) moved entries back onto it and removed them there.
    pub fn begin_stopping(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Refuses a handover from a peer that routed by an older ring than this node's
    /// ([`Error::HandoffByOutdatedRing`]).
    ///
    /// # Errors
    /// As above; a handover without a sender is not a peer's and is let through (the
    /// auth layer keeps the internal headers to peers).
    pub fn refuse_outdated_handoff(&self, metadata: &MetadataMap) -> Result<()> {
        let Some(sender) = forward::forwarded_by(metadata) else {
            return Ok(());
        };
        let ours = self.routing.version();
        if sender.ring_version < ours {
            self.metrics.outdated_handoffs_refused.inc();
            return Err(Error::HandoffByOutdatedRing {
                from: sender.member,
                theirs: sender.ring_version,
                ours,
            });
        }
        Ok(())
    }

    /// Whether the node has begun to stop.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The ring this node routes by.
    pub fn routing(&self) -> &Arc<RoutingTable> {
        &self.routing
    }

    /// The pooled channels to peers.
    pub fn peers(&self) -> &peers::Peers {
        &self.peers
    }

    /// Where `key` is served, given the request's forwarding headers.
    ///
    /// # Errors
    /// [`Error::Routing`] when the ring cannot route the key.
    pub fn route(&self, key: &CacheKey, metadata: &MetadataMap) -> Result<Route> {
        let forwarded = forward::forwarded_by(metadata);
        Ok(self
            .routing
            .route(&key.to_store_bytes(), forwarded.as_ref())?)
    }

    /// The sender of the requests this node forwards now.
    pub fn sender(&self) -> forward::Sender {
        forward::Sender::of(&self.routing)
    }

    /// The `lease` action on the key's owner: grants the fill lease on `key`, or waits
    /// for its holder's put (see [`lease`]).
    pub async fn lease(&self, key: &CacheKey) -> LeaseOutcome {
        self.leases
            .acquire(&key.to_store_bytes(), &self.store)
            .await
    }

    /// A DoGet miss on the key's owner from a caller that asked to coalesce
    /// ([`crate::headers::COALESCE_HEADER`]): the first such miss takes the key's fill lease and
    /// is answered NOT_FOUND saying so (it computes and puts the value, as on any miss);
    /// the ones that come while the lease is held wait for that put and are answered
    /// with the entry. A holder that never puts costs the waiters the lease's wait, then
    /// a miss.
    ///
    /// # Errors
    /// [`Error::MissWithLease`] for the caller granted the lease, [`Error::UnknownKey`]
    /// when the wait ends without the entry.
    pub async fn coalesce_miss(&self, key: &CacheKey) -> Result<Arc<Entry>> {
        let store_key = key.to_store_bytes();
        let miss = || Error::UnknownKey {
            key: key.to_string(),
        };
        match self.leases.acquire(&store_key, &self.store).await {
            LeaseOutcome::Hit | LeaseOutcome::Filled => {
                let entry = self.store.get(&store_key).ok_or_else(miss)?;
                self.metrics.coalesced_reads.inc();
                Ok(entry)
            }
            LeaseOutcome::Granted { lease_ms } => Err(Error::MissWithLease {
                key: key.to_string(),
                lease_ms,
            }),
            LeaseOutcome::Timeout => Err(miss()),
        }
    }

    /// A put of `key` here finished, stored or refused: its fill lease ends and the
    /// waiters wake.
    pub fn put_finished(&self, key: &CacheKey) {
        self.leases.release(&key.to_store_bytes());
    }

    /// After a put of `key` was stored here: a client's own put (`copy` none) goes to
    /// the key's other copies; a handover that stored (not `kept_existing`) `bytes` is
    /// counted as migrated in.
    pub async fn stored(
        &self,
        key: &CacheKey,
        copy: Option<WriteKind>,
        kept_existing: bool,
        bytes: u64,
        metadata: &MetadataMap,
    ) {
        match copy {
            None => self.replicate(key, metadata).await,
            Some(WriteKind::Migration) if !kept_existing => {
                self.metrics.migrated_in_entries.inc();
                self.metrics.migrated_in_bytes.inc_by(bytes);
                self.note_if_not_held_here(key);
            }
            Some(WriteKind::Fallback) if !kept_existing => self.note_if_not_held_here(key),
            Some(_) => {}
        }
    }

    /// Remembers that this node stored a copy of `key` whose holders under its ring do
    /// not include it: a stopping peer's exit handoff (which goes on after the pod's
    /// replacement is Ready and the operator asked this node to rebalance, so an entry
    /// landing after that pass listed the store would stay here, off its holders, for
    /// good) or a put whose owner could not be reached. Until its next whole rebalance
    /// the node reports none (`last_rebalance_ago`), so the operator asks for one.
    fn note_if_not_held_here(&self, key: &CacheKey) {
        let held_here = self.routing.current().is_some_and(|membership| {
            let self_id = self.routing.self_id();
            membership
                .owners(&key.to_store_bytes())
                .iter()
                .any(|id| Some(id.as_str()) == self_id)
        });
        if !held_here {
            self.holds_copies_not_its_own
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Relays a put of `key` to its owner `peer`; when the owner cannot be reached, to
    /// the key's next candidate (see `put_on_next_candidate`).
    ///
    /// # Errors
    /// The owner's or the candidate's answer, or the owner's unreachability.
    pub async fn forward_put(
        &self,
        key: &CacheKey,
        peer: &Peer,
        first: FlightData,
        input: UploadRest,
        metadata: &MetadataMap,
    ) -> Result<ForwardedPut> {
        let relayed = forward::do_put(
            &self.peers,
            &self.replay_budget,
            peer,
            &self.sender().routed_to(peer),
            first,
            input,
            metadata,
            None,
        )
        .await;
        match relayed {
            Ok(answer) => Ok(ForwardedPut::Relayed(answer)),
            Err(forward::PutFailure::Failed(err)) => Err(err),
            Err(forward::PutFailure::Undelivered(undelivered)) => {
                self.put_on_next_candidate(key, peer, *undelivered, metadata)
                    .await
            }
        }
    }

    /// Relays `action` to `peer` and returns the body of its answer, as the peer wrote it.
    ///
    /// # Errors
    /// [`Error::OwnerUnreachable`] or the peer's status.
    pub async fn forward_action(
        &self,
        peer: &Peer,
        action: Action,
        metadata: &MetadataMap,
    ) -> Result<Bytes> {
        forward::do_action(
            &self.peers,
            peer,
            &self.sender().routed_to(peer),
            action,
            metadata,
        )
        .await
    }
}
