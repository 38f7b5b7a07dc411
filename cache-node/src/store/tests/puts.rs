//! Two-phase puts: reservations, failures, drops and invalidation races.

use super::*;

fn empty_batch_schema() -> arrow_schema::SchemaRef {
    batch(0, 0).schema()
}

#[test]
fn reserving_past_max_entry_bytes_fails_releases_everything_and_stores_nothing() {
    let (store, _) = store_with(config());
    let mut pending = store.begin_put(key("big"));
    pending.reserve(60_000).unwrap();
    assert_eq!(store.stats().reserved_bytes, 60_000);
    let error = pending.reserve(50_000).unwrap_err();
    assert_eq!(
        error,
        Error::EntryTooLarge {
            size: 110_000,
            max: 100_000
        }
    );
    assert_eq!(pending.reserved_bytes(), 0);
    assert_eq!(
        store.stats().reserved_bytes,
        0,
        "released at once, not at drop"
    );
    assert_eq!(
        pending.reserve(1).unwrap_err(),
        error,
        "the put stays failed"
    );
    let data = batch(0, 1);
    assert_eq!(
        pending.commit(data.schema(), vec![data], None).unwrap_err(),
        error
    );
    let stats = store.stats();
    assert_eq!(
        (stats.entries, stats.used_bytes, stats.reserved_bytes),
        (0, 0, 0)
    );
    assert_eq!(stats.rejected_puts, 1);
    assert_eq!(stats.in_flight_puts, 0);
    store.check_invariants();
}

#[test]
fn reservations_of_other_puts_are_never_evicted() {
    let (store, _) = store_with(StoreConfig {
        budget_bytes: 200_000,
        max_entry_bytes: 150_000,
        ..config()
    });
    put(&store, "keep", 10).unwrap();
    let mut first = store.begin_put(key("first"));
    first.reserve(150_000).unwrap();
    let mut second = store.begin_put(key("second"));
    let used = store.stats().used_bytes;
    let error = second.reserve(100_000).unwrap_err();
    assert_eq!(
        error,
        Error::OverBudget {
            needed: 100_000,
            available: 50_000 - used
        }
    );
    assert_eq!(
        keys(&store),
        ["keep"],
        "nothing evicted for a put that cannot fit"
    );
    assert_eq!(store.stats().evictions, RemovalCounts::default());
    assert_eq!(first.reserved_bytes(), 150_000);
    store.check_invariants();
}

#[test]
fn reservations_evict_stored_entries_when_needed() {
    let one = weight_of("a", &[batch(0, 1)]);
    let (store, _) = store_with(StoreConfig {
        budget_bytes: 3 * one,
        max_entry_bytes: 3 * one,
        ..config()
    });
    for name in ["a", "b", "c"] {
        put(&store, name, 1).unwrap();
    }
    let mut pending = store.begin_put(key("d"));
    pending.reserve(one + 1).unwrap();
    assert_eq!(keys(&store), ["c"], "two LRU entries made room");
    assert_eq!(store.stats().evictions.size, 2);
    store.check_invariants();
    drop(pending);
    assert_eq!(store.stats().reserved_bytes, 0);
}

#[test]
fn commit_heavier_than_its_reservation_evicts_the_difference() {
    let one = weight_of("a", &[batch(0, 1)]);
    let (store, _) = store_with(StoreConfig {
        budget_bytes: 2 * one,
        max_entry_bytes: one,
        ..config()
    });
    put(&store, "a", 1).unwrap();
    put(&store, "b", 1).unwrap();
    let data = batch(0, 1);
    let outcome = store
        .begin_put(key("c"))
        .commit(data.schema(), vec![data], None)
        .unwrap();
    assert_eq!(outcome.evicted, 1);
    assert_eq!(keys(&store), ["b", "c"]);
    store.check_invariants();
}

#[test]
fn commit_over_max_entry_bytes_fails_and_keeps_the_old_entry() {
    let (store, _) = store_with(StoreConfig {
        max_entry_bytes: 10_000,
        ..config()
    });
    put(&store, "k", 1).unwrap();
    let data = batch(0, 5_000);
    let weight = weight_of("k", std::slice::from_ref(&data));
    let error = store
        .begin_put(key("k"))
        .commit(data.schema(), vec![data], None)
        .unwrap_err();
    assert_eq!(
        error,
        Error::EntryTooLarge {
            size: weight,
            max: 10_000
        }
    );
    assert_eq!(
        store.get(b"k").unwrap().total_rows(),
        1,
        "old entry untouched"
    );
    let stats = store.stats();
    assert_eq!((stats.rejected_puts, stats.evictions.replaced), (1, 0));
    store.check_invariants();
}

#[test]
fn dropping_a_pending_put_releases_its_reservation() {
    let (store, _) = store_with(config());
    let mut pending = store.begin_put(key("a"));
    pending.reserve(1_000).unwrap();
    pending.reserve(2_000).unwrap();
    assert_eq!(pending.reserved_bytes(), 3_000);
    let stats = store.stats();
    assert_eq!((stats.reserved_bytes, stats.in_flight_puts), (3_000, 1));
    drop(pending);
    let stats = store.stats();
    assert_eq!(
        (stats.reserved_bytes, stats.in_flight_puts, stats.entries),
        (0, 0, 0)
    );
}

#[test]
fn an_empty_result_stores_its_schema() {
    let (store, _) = store_with(config());
    let schema = empty_batch_schema();
    store
        .begin_put(key("empty"))
        .commit(schema.clone(), vec![], None)
        .unwrap();
    let entry = store.get(b"empty").unwrap();
    assert_eq!(entry.schema(), &schema);
    assert_eq!(entry.total_rows(), 0);
    // The entry overhead, the schema message it serves and the key.
    let schema_message = entry.wire_messages()[0].head_bytes();
    assert_eq!(entry.wire_messages().len(), 1);
    assert_eq!(
        entry.weight_bytes(),
        weight::ENTRY_OVERHEAD_BYTES + schema_message + 5
    );
}

/// Starts a put of `name`, reserves for one row, lets `invalidate` run, then commits.
fn put_racing(store: &Store, name: &str, invalidate: impl FnOnce(&Store)) -> Result<CommitOutcome> {
    let data = batch(0, 1);
    let mut pending = store.begin_put(key(name));
    pending.reserve(batch_weight(&data)).unwrap();
    invalidate(store);
    pending.commit(data.schema(), vec![data], None)
}

#[test]
fn an_invalidation_during_a_put_wins() {
    let (store, _) = store_with(config());
    put(&store, "t/k", 1).unwrap();
    let exact = put_racing(&store, "t/k", |store| {
        store.invalidate(b"t/k");
    });
    assert_eq!(exact.unwrap_err(), Error::InvalidatedDuringPut);
    let missing_key = put_racing(&store, "t/new", |store| {
        store.invalidate(b"t/new");
    });
    assert_eq!(
        missing_key.unwrap_err(),
        Error::InvalidatedDuringPut,
        "even with nothing stored"
    );
    let prefix = put_racing(&store, "t/k", |store| {
        store.invalidate_prefix(b"t/");
    });
    assert_eq!(prefix.unwrap_err(), Error::InvalidatedDuringPut);
    let cleared = put_racing(&store, "u", |store| {
        store.clear();
    });
    assert_eq!(cleared.unwrap_err(), Error::InvalidatedDuringPut);
    assert!(keys(&store).is_empty());
    let stats = store.stats();
    assert_eq!(
        (
            stats.discarded_puts,
            stats.reserved_bytes,
            stats.in_flight_puts
        ),
        (4, 0, 0)
    );
    store.check_invariants();
}

#[test]
fn invalidations_of_other_keys_or_before_the_put_do_not_interfere() {
    let (store, _) = store_with(config());
    let other_key = put_racing(&store, "a/1", |store| {
        store.invalidate(b"a/2");
        store.invalidate(b"a/1/longer");
        store.invalidate_prefix(b"b");
    });
    assert!(other_key.is_ok());
    store.invalidate(b"c");
    assert!(
        put(&store, "c", 1).is_ok(),
        "a put begun after the invalidation succeeds"
    );
    assert_eq!(keys(&store), ["a/1", "c"]);
}

#[test]
fn reserve_after_an_invalidation_fails_fast_and_releases() {
    let (store, _) = store_with(config());
    let mut pending = store.begin_put(key("k"));
    pending.reserve(500).unwrap();
    store.invalidate(b"k");
    assert_eq!(
        pending.reserve(500).unwrap_err(),
        Error::InvalidatedDuringPut
    );
    assert_eq!(store.stats().reserved_bytes, 0);
    let data = batch(0, 1);
    assert_eq!(
        pending.commit(data.schema(), vec![data], None).unwrap_err(),
        Error::InvalidatedDuringPut
    );
    assert_eq!(store.stats().discarded_puts, 1, "counted once");
}

#[test]
fn concurrent_puts_of_one_key_leave_the_last_commit() {
    let (store, _) = store_with(config());
    let first = store.begin_put(key("k"));
    let second = store.begin_put(key("k"));
    let one = batch(0, 1);
    let two = batch(0, 2);
    second.commit(two.schema(), vec![two], None).unwrap();
    let outcome = first.commit(one.schema(), vec![one], None).unwrap();
    assert!(outcome.replaced);
    assert_eq!(store.get(b"k").unwrap().total_rows(), 1);
    assert_eq!(store.stats().evictions.replaced, 1);
}

/// A store with a 20,000-byte budget holding three entries `a`, `b`, `c` of 500 rows.
fn three_entries_in_20_000_bytes() -> Store {
    let (store, _) = store_with(StoreConfig {
        budget_bytes: 20_000,
        max_entry_bytes: 20_000,
        ..config()
    });
    for name in ["a", "b", "c"] {
        put(&store, name, 500).unwrap();
    }
    store
}

#[test]
fn intake_reservations_make_room_first_and_are_released_on_drop() {
    let store = three_entries_in_20_000_bytes();
    let used = store.stats().used_bytes;
    assert!(used > 10_000, "{used}");
    // Bytes of a put still arriving: room is made now, by evicting, before they land.
    let intake = store.reserve_intake(12_000).unwrap();
    let stats = store.stats();
    assert_eq!(stats.reserved_bytes, 12_000);
    assert!(stats.used_bytes + stats.reserved_bytes <= stats.budget_bytes);
    assert!(stats.entries < 3);
    store.check_invariants();
    // A put's own transient bytes count too; together they may not pass the budget.
    let mut pending = store.begin_put(key("d"));
    assert!(pending.reserve_transient(9_000).is_err());
    assert!(
        store.reserve_intake(9_000).is_none(),
        "no room left beside the others"
    );
    drop(intake);
    assert_eq!(store.stats().reserved_bytes, 0);
    assert!(
        store.reserve_intake(20_001).is_none(),
        "more than the whole budget"
    );
    store.check_invariants();
}

#[test]
fn room_for_a_put_counts_the_memory_the_allocator_keeps() {
    let store = three_entries_in_20_000_bytes();
    let used = store.stats().used_bytes;
    let per_entry = used / 3;
    // Kept pages evict nothing by themselves: evicting only adds to them.
    let kept = 20_000 - used;
    store.hold_for_allocator(kept);
    let stats = store.stats();
    assert_eq!((stats.entries, stats.allocator_bytes), (3, kept));
    assert_eq!(stats.reserved_bytes, 0, "not a put's reservation");
    store.check_invariants();
    // A reservation makes room beside them: the least valuable entry goes.
    let intake = store.reserve_intake(per_entry).unwrap();
    assert_eq!(keys(&store), ["b", "c"]);
    assert_eq!(store.stats().evictions.size, 1);
    drop(intake);
    // Once the allocator has returned them, the room is there again without evicting.
    store.hold_for_allocator(0);
    let intake = store.reserve_intake(2 * per_entry).unwrap();
    assert_eq!(store.stats().entries, 2);
    drop(intake);
    store.check_invariants();
}

#[test]
fn kept_pages_never_make_an_empty_store_refuse_what_fits_its_budget() {
    let (store, _) = store_with(StoreConfig {
        budget_bytes: 20_000,
        max_entry_bytes: 20_000,
        ..config()
    });
    put(&store, "a", 500).unwrap();
    // More kept than the budget leaves: the put evicts what it can, then takes its
    // memory from the kept pages (it reuses them instead of adding to them).
    store.hold_for_allocator(19_000);
    let mut pending = store.begin_put(key("b"));
    pending.reserve(12_000).unwrap();
    let stats = store.stats();
    assert_eq!((stats.entries, stats.reserved_bytes), (0, 12_000));
    // What even an empty store could not hold is still refused.
    assert!(store.reserve_intake(9_000).is_none());
    drop(pending);
    store.check_invariants();
}
