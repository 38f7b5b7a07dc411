//! Miss coalescing: fill leases, so N clients that miss one key at once run one backend
//! query instead of N.
//!
//! A client that misses calls the `lease` action with the key. The first caller gets
//! `{"lease": "granted", "leaseMs": 10000}`: it runs the query and DoPuts the result.
//! Callers that arrive while the lease is held wait (up to [`DEFAULT_WAIT`]) for that DoPut
//! and get `{"lease": "filled"}` (then DoGet), or `{"lease": "timeout"}` if it does not
//! come in time. When the entry is already there the answer is `{"lease": "hit"}`. A lease
//! ends when its holder's DoPut finishes (stored or refused) or after [`DEFAULT_LEASE`];
//! after that the next caller is granted a new one, so a holder that died does not block
//! the key. Leases live on the key's owner (the action is forwarded like `invalidate`).
//!
//! Plain reads coalesce too: a DoGet that carries [`COALESCE_HEADER`] and misses on the
//! key's owner takes the lease itself (answered NOT_FOUND with
//! `flightcache-lease: granted`: the caller computes and puts the value, as any
//! cache-aside client does on a miss), and DoGets of the key with the header that come
//! while the lease is held wait for that put and are answered with the entry. A client
//! opts in with the header because it promises to fill what it misses.
//!
//! Owns: the lease table (its headers are named in `crate::headers`; the DoGet relay
//! passes [`COALESCE_HEADER`] on).
//! Must not import `flight/` or `wire/`. In memory only; async waiting with tokio, no
//! other I/O.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;
// Tokio's clock, so the tests can pause time instead of sleeping.
use tokio::time::Instant;

use crate::headers::COALESCE_HEADER;
use crate::store::Store;

/// Whether a request asked to coalesce its miss ([`COALESCE_HEADER`]).
pub fn coalescing(metadata: &tonic::metadata::MetadataMap) -> bool {
    metadata
        .get(COALESCE_HEADER)
        .is_some_and(|value| matches!(value.as_bytes(), b"1" | b"true"))
}

/// How long a lease holder has to DoPut the entry.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
/// How long a caller waits for the holder's DoPut.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// The answer to a `lease` call (the node-admin contract's type).
pub use crds::admin::LeaseAnswer as LeaseOutcome;

#[derive(Debug)]
struct Held {
    until: Instant,
    filled: Arc<Notify>,
}

/// Most leases a node holds at once. A client that leases keys it never fills cannot
/// grow the table without bound: expired leases are swept when it is full (at most once
/// per [`SWEEP_INTERVAL`]), and past the cap a caller is granted without a recorded
/// lease (it computes the value, as without coalescing).
pub const MAX_HELD_LEASES: usize = 65_536;

/// Least time between two sweeps of a full lease table.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The fill leases of one node.
#[derive(Debug)]
pub struct Leases {
    held: Mutex<Table>,
    lease: Duration,
    wait: Duration,
    max_held: usize,
}

#[derive(Debug, Default)]
struct Table {
    leases: HashMap<Bytes, Held>,
    last_sweep: Option<Instant>,
}

impl Default for Leases {
    fn default() -> Self {
        Self::new(DEFAULT_LEASE, DEFAULT_WAIT)
    }
}

impl Leases {
    /// Leases lasting `lease`, callers waiting up to `wait`.
    pub fn new(lease: Duration, wait: Duration) -> Self {
        Self::with_max_held(lease, wait, MAX_HELD_LEASES)
    }

    /// As [`new`](Self::new), holding at most `max_held` leases.
    pub fn with_max_held(lease: Duration, wait: Duration, max_held: usize) -> Self {
        Self {
            held: Mutex::new(Table::default()),
            lease,
            wait,
            max_held,
        }
    }

    /// How many leases are recorded (expired ones included until swept).
    pub fn held(&self) -> usize {
        self.held.lock().leases.len()
    }

    /// Grants the lease on `key` (store bytes), or waits for the holder's DoPut.
    pub async fn acquire(&self, key: &Bytes, store: &Store) -> LeaseOutcome {
        let deadline = Instant::now() + self.wait;
        let mut waited = false;
        loop {
            if store.peek(key).is_some() {
                return if waited {
                    LeaseOutcome::Filled
                } else {
                    LeaseOutcome::Hit
                };
            }
            let now = Instant::now();
            let (filled, until) = {
                let mut table = self.held.lock();
                match table.leases.get(key) {
                    Some(lease) if lease.until > now => (Arc::clone(&lease.filled), lease.until),
                    _ => {
                        if table.room_for(key, now, self.max_held) {
                            table.leases.insert(
                                key.clone(),
                                Held {
                                    until: now + self.lease,
                                    filled: Arc::new(Notify::new()),
                                },
                            );
                        }
                        return LeaseOutcome::Granted {
                            lease_ms: u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX),
                        };
                    }
                }
            };
            if now >= deadline {
                return LeaseOutcome::Timeout;
            }
            // Register before re-checking the store, so a DoPut that lands in between
            // still wakes this caller.
            let notified = filled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            waited = true;
            if store.peek(key).is_some() {
                return LeaseOutcome::Filled;
            }
            let wake = until.min(deadline);
            let _ = tokio::time::timeout_at(wake, notified).await;
        }
    }

    /// Ends the lease on `key` (its DoPut finished, stored or not) and wakes the waiters.
    pub fn release(&self, key: &Bytes) {
        let lease = self.held.lock().leases.remove(key);
        if let Some(lease) = lease {
            lease.filled.notify_waiters();
        }
    }
}

impl Table {
    /// Whether a lease on `key` can be recorded: the key is already there (expired), or
    /// the table has room, after sweeping expired leases if it is full and the last
    /// sweep is older than [`SWEEP_INTERVAL`].
    fn room_for(&mut self, key: &Bytes, now: Instant, max_held: usize) -> bool {
        if self.leases.len() < max_held || self.leases.contains_key(key) {
            return true;
        }
        if self
            .last_sweep
            .is_none_or(|last| now >= last + SWEEP_INTERVAL)
        {
            self.last_sweep = Some(now);
            self.leases.retain(|_, lease| lease.until > now);
        }
        self.leases.len() < max_held
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, RecordBatch};

    use super::*;
    use crate::store::{EvictionPolicy, StoreConfig, SystemClock, TtlMode};

    fn store() -> Arc<Store> {
        let config = StoreConfig {
            max_entries: 100,
            budget_bytes: 16 << 20,
            max_entry_bytes: 1 << 20,
            ttl: Duration::from_secs(60),
            ttl_mode: TtlMode::Absolute,
            eviction: EvictionPolicy::Lru,
        };
        Arc::new(Store::new(config, Arc::new(SystemClock::new())).unwrap())
    }

    fn fill(store: &Store, key: &Bytes) {
        let batch =
            RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![1])) as _)]).unwrap();
        let mut pending = store.begin_put(key.clone());
        pending.reserve(crate::store::batch_weight(&batch)).unwrap();
        pending.commit(batch.schema(), vec![batch], None).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_misses_get_one_lease_and_wait_for_its_put() {
        let store = store();
        let leases = Arc::new(Leases::default());
        let key = Bytes::from_static(b"Pq");
        let callers: Vec<_> = (0..8)
            .map(|_| {
                let (leases, store, key) = (Arc::clone(&leases), Arc::clone(&store), key.clone());
                tokio::spawn(async move { leases.acquire(&key, &store).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        fill(&store, &key);
        leases.release(&key);
        let mut outcomes = Vec::new();
        for caller in callers {
            outcomes.push(caller.await.unwrap());
        }
        let granted = outcomes
            .iter()
            .filter(|o| matches!(o, LeaseOutcome::Granted { .. }))
            .count();
        assert_eq!(granted, 1, "{outcomes:?}");
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| **o == LeaseOutcome::Filled)
                .count(),
            7
        );
        assert_eq!(leases.acquire(&key, &store).await, LeaseOutcome::Hit);
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_lease_passes_to_the_next_caller_and_waiting_times_out() {
        let store = store();
        let leases = Leases::new(Duration::from_millis(50), Duration::from_millis(20));
        let key = Bytes::from_static(b"Pq");
        assert!(matches!(
            leases.acquire(&key, &store).await,
            LeaseOutcome::Granted { lease_ms: 50 }
        ));
        assert_eq!(leases.acquire(&key, &store).await, LeaseOutcome::Timeout);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(matches!(
            leases.acquire(&key, &store).await,
            LeaseOutcome::Granted { .. }
        ));
        assert_eq!(
            serde_json::to_string(&LeaseOutcome::Granted { lease_ms: 5 }).unwrap(),
            r#"{"lease":"granted","leaseMs":5}"#
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_lease_table_is_bounded_and_expired_leases_are_swept() {
        let store = store();
        let leases = Leases::with_max_held(Duration::from_secs(10), Duration::from_secs(1), 3);
        for i in 0..3 {
            let key = Bytes::from(format!("k{i}"));
            assert!(matches!(
                leases.acquire(&key, &store).await,
                LeaseOutcome::Granted { .. }
            ));
        }
        assert_eq!(leases.held(), 3);
        // Full with live leases: the caller is granted, nothing is recorded, so a second
        // caller for that key is granted too instead of waiting.
        let extra = Bytes::from_static(b"extra");
        assert!(matches!(
            leases.acquire(&extra, &store).await,
            LeaseOutcome::Granted { .. }
        ));
        assert!(matches!(
            leases.acquire(&extra, &store).await,
            LeaseOutcome::Granted { .. }
        ));
        assert_eq!(leases.held(), 3);
        // Once the leases expired, the next new key sweeps them and is recorded.
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(matches!(
            leases.acquire(&extra, &store).await,
            LeaseOutcome::Granted { .. }
        ));
        assert_eq!(leases.held(), 1);
        assert_eq!(
            leases.acquire(&extra, &store).await,
            LeaseOutcome::Timeout,
            "the recorded lease makes the next caller wait"
        );
    }
}
