//! Behaviour tests of the store through its public API, on a [`ManualClock`].

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use bytes::Bytes;

use super::*;

mod caps;
mod properties;
mod puts;
mod tags;
mod ttl;

const SECOND: Duration = Duration::from_secs(1);

/// A roomy config: 100 entries, 1 MB budget, 100 kB per entry, 60 s absolute TTL, LRU.
fn config() -> StoreConfig {
    StoreConfig {
        max_entries: 100,
        budget_bytes: 1_000_000,
        max_entry_bytes: 100_000,
        ttl: 60 * SECOND,
        ttl_mode: TtlMode::Absolute,
        eviction: EvictionPolicy::Lru,
    }
}

fn store_with(config: StoreConfig) -> (Store, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new());
    let store = Store::new(config, clock.clone()).unwrap();
    (store, clock)
}

fn key(name: &str) -> Bytes {
    Bytes::copy_from_slice(name.as_bytes())
}

/// A batch of `rows` i64 values starting at `first`.
fn batch(first: i64, rows: usize) -> RecordBatch {
    let values: ArrayRef = Arc::new(Int64Array::from_iter_values(first..first + rows as i64));
    RecordBatch::try_from_iter([("v", values)]).unwrap()
}

/// The weight the store charges for `key` holding `batches` (one schema, at least one
/// batch): the stored form's weight plus the key.
fn weight_of(name: &str, batches: &[RecordBatch]) -> u64 {
    let sealed = SealedEntry::seal(batches[0].schema(), batches).unwrap();
    sealed.weight() + name.len() as u64
}

/// Puts one batch of `rows` rows the way the Flight layer will: reserve per batch,
/// then commit.
fn put(store: &Store, name: &str, rows: usize) -> Result<CommitOutcome> {
    put_with_ttl(store, name, rows, None)
}

fn put_with_ttl(
    store: &Store,
    name: &str,
    rows: usize,
    ttl: Option<Duration>,
) -> Result<CommitOutcome> {
    let data = batch(0, rows);
    let mut pending = store.begin_put(key(name));
    pending.reserve(batch_weight(&data))?;
    pending.commit(data.schema(), vec![data], ttl)
}

fn keys(store: &Store) -> Vec<String> {
    store
        .list(b"", usize::MAX)
        .into_iter()
        .map(|(key, _)| String::from_utf8(key.to_vec()).unwrap())
        .collect()
}

#[test]
fn get_returns_the_committed_entry_without_copying() {
    let (store, clock) = store_with(config());
    clock.advance(5 * SECOND);
    let first = batch(0, 10);
    let second = batch(10, 5);
    let mut pending = store.begin_put(key("q"));
    pending.reserve(batch_weight(&first)).unwrap();
    pending.reserve(batch_weight(&second)).unwrap();
    let outcome = pending
        .commit(first.schema(), vec![first.clone(), second.clone()], None)
        .unwrap();
    let expected_weight = weight_of("q", &[first.clone(), second]);
    assert_eq!(outcome.weight_bytes, expected_weight);
    assert!(!outcome.replaced);
    assert_eq!(outcome.expires_at, 65 * SECOND);

    let entry = store.get(b"q").unwrap();
    assert_eq!(entry.total_rows(), 15);
    assert_eq!(entry.batches().len(), 2);
    assert_eq!(entry.schema(), &first.schema());
    assert_eq!(entry.weight_bytes(), expected_weight);
    assert_eq!(entry.created_at(), 5 * SECOND);
    assert_eq!(entry.expires_at(), 65 * SECOND);
    assert_eq!(entry.ttl_override(), None);
    assert_eq!(entry.hits(), 1);
    assert_eq!(entry.batches()[0], first);
    // The stored batch is a view into its stored IPC body, and every read shares both.
    let stored = entry.batches()[0].column(0).to_data().buffers()[0].data_ptr();
    let body = entry.wire_messages()[1].body().as_ptr_range();
    assert!(
        body.contains(&stored.as_ptr().cast_const()),
        "the batch lives in its body"
    );
    let again = store.get(b"q").unwrap();
    assert!(Arc::ptr_eq(&entry, &again), "reads share the entry");

    let stats = store.stats();
    assert_eq!(
        (stats.entries, stats.used_bytes, stats.reserved_bytes),
        (1, expected_weight, 0)
    );
    assert_eq!((stats.hits, stats.misses, stats.inserts), (2, 0, 1));
    store.check_invariants();
}

#[test]
fn get_of_a_missing_key_counts_a_miss() {
    let (store, _) = store_with(config());
    assert!(store.get(b"nope").is_none());
    assert_eq!(store.stats().misses, 1);
}

#[test]
fn peek_has_no_side_effects() {
    let (store, clock) = store_with(StoreConfig {
        ttl_mode: TtlMode::Sliding,
        ..config()
    });
    put(&store, "a", 1).unwrap();
    put(&store, "b", 1).unwrap();
    clock.advance(30 * SECOND);
    let entry = store.peek(b"a").unwrap();
    assert_eq!(entry.hits(), 0);
    assert_eq!(entry.expires_at(), 60 * SECOND, "no sliding refresh");
    let stats = store.stats();
    assert_eq!((stats.hits, stats.misses), (0, 0));
    // Recency untouched: "a" is still the LRU victim.
    store
        .reconfigure(StoreConfig {
            max_entries: 1,
            ..store.config()
        })
        .unwrap();
    assert_eq!(keys(&store), ["b"]);
    clock.advance(31 * SECOND);
    assert!(store.peek(b"b").is_none(), "expired entries are invisible");
    assert_eq!(store.stats().entries, 1, "peek does not remove");
}

#[test]
fn commit_replacing_a_key_counts_replaced() {
    let (store, _) = store_with(config());
    put(&store, "k", 1).unwrap();
    let outcome = put(&store, "k", 20).unwrap();
    assert!(outcome.replaced);
    assert_eq!(store.get(b"k").unwrap().total_rows(), 20);
    let stats = store.stats();
    assert_eq!(stats.evictions.replaced, 1);
    assert_eq!(stats.entries, 1);
    assert_eq!(stats.used_bytes, weight_of("k", &[batch(0, 20)]));
    store.check_invariants();
}

#[test]
fn invalidate_removes_one_key_and_counts_explicit() {
    let (store, _) = store_with(config());
    put(&store, "a", 1).unwrap();
    put(&store, "ab", 1).unwrap();
    assert!(store.invalidate(b"a"));
    assert!(!store.invalidate(b"a"));
    assert_eq!(keys(&store), ["ab"]);
    assert_eq!(store.stats().evictions.explicit, 1);
    store.check_invariants();
}

#[test]
fn invalidate_prefix_removes_matching_keys_only() {
    let (store, _) = store_with(config());
    for name in ["t/1", "t/2", "t/22", "u/1", "t", "s"] {
        put(&store, name, 1).unwrap();
    }
    assert_eq!(store.invalidate_prefix(b"t/"), 3);
    assert_eq!(keys(&store), ["s", "t", "u/1"]);
    assert_eq!(store.invalidate_prefix(b"zz"), 0);
    assert_eq!(store.stats().evictions.explicit, 3);
    assert_eq!(store.clear(), 3);
    assert!(keys(&store).is_empty());
    assert_eq!(store.stats().evictions.explicit, 6);
    assert_eq!(store.stats().used_bytes, 0);
    store.check_invariants();
}

#[test]
fn list_is_sorted_by_key_filtered_by_prefix_and_skips_expired() {
    let (store, clock) = store_with(config());
    put_with_ttl(&store, "p/c", 1, None).unwrap();
    put_with_ttl(&store, "p/a", 1, Some(SECOND)).unwrap();
    put_with_ttl(&store, "p/b", 1, None).unwrap();
    put_with_ttl(&store, "q/a", 1, None).unwrap();
    let listed: Vec<Bytes> = store
        .list(b"p/", usize::MAX)
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(listed, [key("p/a"), key("p/b"), key("p/c")]);
    clock.advance(SECOND);
    let listed: Vec<Bytes> = store
        .list(b"p/", usize::MAX)
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(listed, [key("p/b"), key("p/c")]);
    let first: Vec<Bytes> = store.list(b"", 2).into_iter().map(|(key, _)| key).collect();
    assert_eq!(
        first,
        [key("p/b"), key("p/c")],
        "a limit keeps the first keys"
    );
    assert_eq!(store.stats().hits, 0, "listing is not a read");
}

#[test]
fn invalidating_an_expired_entry_counts_it_as_expired() {
    let (store, clock) = store_with(config());
    put(&store, "a", 1).unwrap();
    clock.advance(60 * SECOND);
    assert!(!store.invalidate(b"a"));
    let evictions = store.stats().evictions;
    assert_eq!((evictions.expired, evictions.explicit), (1, 0));
}

#[test]
fn readers_keep_their_entry_after_it_is_removed() {
    let (store, _) = store_with(config());
    put(&store, "a", 3).unwrap();
    let entry = store.get(b"a").unwrap();
    store.clear();
    assert_eq!(entry.total_rows(), 3);
    assert_eq!(entry.batches()[0].num_rows(), 3);
}

#[test]
fn concurrent_puts_and_reads_keep_the_caps() {
    let (store, _) = store_with(StoreConfig {
        max_entries: 20,
        budget_bytes: 20_000,
        max_entry_bytes: 5_000,
        ..config()
    });
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..300 {
                    let name = format!("w{worker}/{}", i % 37);
                    match i % 5 {
                        0 => {
                            store.invalidate_prefix(format!("w{}/", (worker + 1) % 4).as_bytes());
                        }
                        1 | 2 => {
                            store.get(name.as_bytes());
                        }
                        _ => {
                            let _ = put(&store, &name, i % 200);
                        }
                    }
                    let stats = store.stats();
                    assert!(stats.used_bytes + stats.reserved_bytes <= stats.budget_bytes);
                    assert!(stats.entries <= stats.max_entries);
                }
                // Every removal this thread caused freed its entry after unlocking.
                assert_eq!(lock_scope::take_freed_under_lock(), 0);
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    store.check_invariants();
    assert_eq!(store.stats().reserved_bytes, 0);
}

#[test]
fn entries_are_freed_after_the_lock_is_released_on_every_removal_path() {
    let (store, clock) = store_with(StoreConfig {
        max_entries: 4,
        budget_bytes: 20_000,
        max_entry_bytes: 20_000,
        ..config()
    });
    let removed = |store: &Store, name: &str| {
        let weak = Arc::downgrade(&store.peek(name.as_bytes()).unwrap());
        move || weak.upgrade().is_none()
    };
    put(&store, "a", 50).unwrap();
    let replaced = removed(&store, "a");
    put(&store, "a", 60).unwrap();
    assert!(replaced());
    for name in ["b", "c", "d"] {
        put(&store, name, 50).unwrap();
    }
    let evicted_for_the_cap = removed(&store, "a");
    put(&store, "e", 50).unwrap();
    assert!(evicted_for_the_cap());
    let evicted_for_bytes = removed(&store, "b");
    put(&store, "f", 1_000).unwrap();
    assert!(evicted_for_bytes());
    let invalidated = removed(&store, "f");
    assert!(store.invalidate(b"f"));
    assert!(invalidated());
    put(&store, "p/1", 10).unwrap();
    let by_prefix = removed(&store, "p/1");
    assert_eq!(store.invalidate_prefix(b"p/"), 1);
    assert!(by_prefix());
    put(&store, "h", 10).unwrap();
    let for_an_intake = removed(&store, "h");
    let intake = store.reserve_intake(20_000);
    assert!(intake.is_some() && for_an_intake());
    drop(intake);
    put(&store, "i", 10).unwrap();
    let expired = removed(&store, "i");
    clock.advance(61 * SECOND);
    assert_eq!(store.purge_expired(), 1);
    assert!(expired());
    put(&store, "j", 10).unwrap();
    let shrunk = removed(&store, "j");
    store
        .reconfigure(StoreConfig {
            max_entries: 1,
            ..store.config()
        })
        .unwrap();
    put(&store, "k", 10).unwrap();
    assert!(shrunk());
    let cleared = removed(&store, "k");
    store.clear();
    assert!(cleared());
    // check_invariants fails if any of those entries was freed under the lock.
    store.check_invariants();
}

#[test]
fn the_lock_scope_check_sees_an_entry_freed_under_the_lock() {
    let (store, _) = store_with(config());
    put(&store, "a", 10).unwrap();
    let entry = store.peek(b"a").unwrap();
    store.clear();
    // The last reference, dropped inside the lock: what the rule forbids.
    store.shared.with_inner(move |_| drop(entry));
    assert_eq!(lock_scope::take_freed_under_lock(), 1);
    store.check_invariants();
}

#[test]
fn store_handles_cross_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Store>();
    assert_send_sync::<PendingPut>();
    assert_send_sync::<Entry>();
}
