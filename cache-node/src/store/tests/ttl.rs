//! Expiry: absolute and sliding TTL, per-entry overrides, purge and live TTL changes.

use super::*;

#[test]
fn absolute_ttl_expires_at_insert_plus_ttl_whatever_the_reads() {
    let (store, clock) = store_with(config());
    put(&store, "a", 1).unwrap();
    clock.advance(30 * SECOND);
    assert!(store.get(b"a").is_some());
    clock.advance(29 * SECOND);
    let entry = store.get(b"a").unwrap();
    assert_eq!(entry.expires_at(), 60 * SECOND, "reads do not extend");
    clock.advance(SECOND);
    assert!(store.get(b"a").is_none());
    let stats = store.stats();
    assert_eq!((stats.hits, stats.misses, stats.entries), (2, 1, 0));
    assert_eq!(stats.evictions.expired, 1);
    store.check_invariants();
}

#[test]
fn sliding_ttl_extends_the_deadline_on_every_hit() {
    let (store, clock) = store_with(StoreConfig {
        ttl_mode: TtlMode::Sliding,
        ..config()
    });
    put(&store, "a", 1).unwrap();
    clock.advance(50 * SECOND);
    assert_eq!(store.get(b"a").unwrap().expires_at(), 110 * SECOND);
    clock.advance(50 * SECOND);
    assert_eq!(store.get(b"a").unwrap().expires_at(), 160 * SECOND);
    clock.advance(60 * SECOND);
    assert!(store.get(b"a").is_none());
    assert_eq!(store.stats().evictions.expired, 1);
    store.check_invariants();
}

#[test]
fn per_entry_override_replaces_the_store_ttl() {
    let (store, clock) = store_with(config());
    let outcome = put_with_ttl(&store, "short", 1, Some(5 * SECOND)).unwrap();
    assert_eq!(outcome.expires_at, 5 * SECOND);
    put_with_ttl(&store, "long", 1, Some(600 * SECOND)).unwrap();
    put(&store, "default", 1).unwrap();
    assert_eq!(
        store.peek(b"long").unwrap().ttl_override(),
        Some(600 * SECOND)
    );
    clock.advance(5 * SECOND);
    assert!(store.get(b"short").is_none());
    clock.advance(60 * SECOND);
    assert!(store.get(b"default").is_none());
    assert!(store.get(b"long").is_some());
}

#[test]
fn per_entry_override_slides_in_sliding_mode() {
    let (store, clock) = store_with(StoreConfig {
        ttl_mode: TtlMode::Sliding,
        ..config()
    });
    put_with_ttl(&store, "a", 1, Some(5 * SECOND)).unwrap();
    clock.advance(4 * SECOND);
    assert_eq!(store.get(b"a").unwrap().expires_at(), 9 * SECOND);
    clock.advance(5 * SECOND);
    assert!(store.get(b"a").is_none());
}

#[test]
fn purge_removes_exactly_the_expired_entries() {
    let (store, clock) = store_with(config());
    put_with_ttl(&store, "a", 1, Some(10 * SECOND)).unwrap();
    put_with_ttl(&store, "b", 1, Some(20 * SECOND)).unwrap();
    put(&store, "c", 1).unwrap();
    assert_eq!(store.purge_expired(), 0);
    clock.advance(15 * SECOND);
    assert_eq!(store.purge_expired(), 1);
    assert_eq!(keys(&store), ["b", "c"]);
    assert_eq!(store.stats().entries, 2);
    clock.advance(45 * SECOND);
    assert_eq!(store.purge_expired(), 2);
    let stats = store.stats();
    assert_eq!(
        (stats.entries, stats.used_bytes, stats.evictions.expired),
        (0, 0, 3)
    );
    store.check_invariants();
}

#[test]
fn ttl_change_applies_to_stored_entries_without_an_override() {
    let (store, clock) = store_with(config());
    put(&store, "old", 1).unwrap();
    put_with_ttl(&store, "pinned", 1, Some(100 * SECOND)).unwrap();
    clock.advance(20 * SECOND);
    put(&store, "young", 1).unwrap();

    let outcome = store
        .reconfigure(StoreConfig {
            ttl: 10 * SECOND,
            ..config()
        })
        .unwrap();
    assert_eq!(
        outcome.rescheduled_entries, 2,
        "the override keeps its deadline"
    );
    assert_eq!(store.peek(b"young").unwrap().expires_at(), 30 * SECOND);
    assert_eq!(store.peek(b"pinned").unwrap().expires_at(), 100 * SECOND);
    // "old" is past its new deadline (0 + 10 s): gone at the next purge or access.
    assert!(store.peek(b"old").is_none());
    assert_eq!(store.stats().entries, 3);
    assert_eq!(store.purge_expired(), 1);
    assert_eq!(keys(&store), ["pinned", "young"]);

    store
        .reconfigure(StoreConfig {
            ttl: 120 * SECOND,
            ..config()
        })
        .unwrap();
    assert_eq!(store.peek(b"young").unwrap().expires_at(), 140 * SECOND);
    store.check_invariants();
}

#[test]
fn switching_to_sliding_anchors_deadlines_on_the_last_access() {
    let (store, clock) = store_with(config());
    put(&store, "read", 1).unwrap();
    put(&store, "unread", 1).unwrap();
    clock.advance(50 * SECOND);
    assert!(store.get(b"read").is_some());
    store
        .reconfigure(StoreConfig {
            ttl_mode: TtlMode::Sliding,
            ..config()
        })
        .unwrap();
    assert_eq!(store.peek(b"read").unwrap().expires_at(), 110 * SECOND);
    assert_eq!(store.peek(b"unread").unwrap().expires_at(), 60 * SECOND);
    clock.advance(30 * SECOND);
    assert_eq!(keys(&store), ["read"]);
}

#[test]
fn expired_entries_make_room_before_live_ones() {
    let entry = weight_of("a", &[batch(0, 1)]);
    let (store, clock) = store_with(StoreConfig {
        budget_bytes: 3 * entry,
        max_entry_bytes: entry,
        ..config()
    });
    put(&store, "b", 1).unwrap();
    put_with_ttl(&store, "a", 1, Some(SECOND)).unwrap();
    put(&store, "c", 1).unwrap();
    clock.advance(2 * SECOND);
    put(&store, "d", 1).unwrap();
    assert_eq!(keys(&store), ["b", "c", "d"]);
    let evictions = store.stats().evictions;
    assert_eq!((evictions.expired, evictions.size), (1, 0));
    store.check_invariants();
}

/// Commits `name` with a handover lifetime.
fn put_handed_over(store: &Store, name: &str, lifetime: Lifetime) -> CommitOutcome {
    let data = batch(7, 3);
    let mut pending = store.begin_put(key(name));
    pending.reserve(batch_weight(&data)).unwrap();
    pending
        .commit_with(data.schema(), vec![data], lifetime)
        .unwrap()
}

#[test]
fn a_handed_over_entry_keeps_its_age_override_and_never_outlives_the_sender() {
    let (store, clock) = store_with(config());
    clock.advance(1000 * SECOND);
    // 50 s old under the 60 s store TTL: 10 s left, as at the sender.
    let outcome = put_handed_over(
        &store,
        "aged",
        Lifetime {
            age: 50 * SECOND,
            idle: 20 * SECOND,
            remaining: Some(10 * SECOND),
            ..Lifetime::default()
        },
    );
    assert_eq!(outcome.expires_at, clock.now() + 10 * SECOND);
    let entry = store.peek(b"aged").unwrap();
    assert_eq!(entry.created_at(), clock.now() - 50 * SECOND);
    // A per-entry TTL is kept as such; the sender's deadline caps it.
    put_handed_over(
        &store,
        "override",
        Lifetime {
            ttl_override: Some(3600 * SECOND),
            age: 10 * SECOND,
            remaining: Some(5 * SECOND),
            ..Lifetime::default()
        },
    );
    let entry = store.peek(b"override").unwrap();
    assert_eq!(entry.ttl_override(), Some(3600 * SECOND));
    assert_eq!(entry.expires_at(), clock.now() + 5 * SECOND);
    clock.advance(10 * SECOND);
    assert!(store.get(b"aged").is_none());
    assert!(store.get(b"override").is_none());
}

#[test]
fn an_if_absent_handover_never_overwrites_a_live_entry() {
    let (store, _clock) = store_with(config());
    put(&store, "fresh", 10).unwrap();
    let outcome = put_handed_over(
        &store,
        "fresh",
        Lifetime {
            if_absent: true,
            ..Lifetime::default()
        },
    );
    assert!(outcome.kept_existing);
    assert_eq!(store.get(b"fresh").unwrap().total_rows(), 10);
    let outcome = put_handed_over(
        &store,
        "absent",
        Lifetime {
            if_absent: true,
            ..Lifetime::default()
        },
    );
    assert!(!outcome.kept_existing);
    assert_eq!(store.get(b"absent").unwrap().total_rows(), 3);
}

#[test]
fn the_handoff_list_is_hottest_first_and_removal_spares_newer_puts() {
    let (store, clock) = store_with(config());
    for name in ["cold", "warm", "hot"] {
        put(&store, name, 1).unwrap();
        clock.advance(SECOND);
    }
    for _ in 0..3 {
        store.get(b"hot").unwrap();
    }
    store.get(b"warm").unwrap();
    clock.advance(SECOND);
    store.get(b"cold").unwrap();
    let order: Vec<_> = store
        .handoff_list()
        .into_iter()
        .map(|e| String::from_utf8(e.key.to_vec()).unwrap())
        .collect();
    // hot (3 hits); warm and cold tie on hits, cold was used last.
    assert_eq!(order, ["hot", "cold", "warm"]);
    let listed = store.handoff_list();
    let hot = listed.iter().find(|e| &e.key[..] == b"hot").unwrap();
    put(&store, "hot", 2).unwrap();
    assert!(
        !store.remove_migrated(b"hot", &hot.entry),
        "a newer put stays"
    );
    let cold = listed.iter().find(|e| &e.key[..] == b"cold").unwrap();
    assert!(store.remove_migrated(b"cold", &cold.entry));
    assert_eq!(store.stats().evictions.migrated, 1);
    assert!(store.get(b"cold").is_none());
}

#[test]
fn a_handover_of_a_copy_older_than_an_invalidation_is_refused() {
    let (store, clock) = store_with(config());
    clock.advance(100 * SECOND);
    let handover = |age| Lifetime {
        age,
        if_absent: true,
        ..Lifetime::default()
    };
    store.invalidate(b"gone");
    assert_eq!(store.invalidate_prefix(b"dir/"), 0);
    clock.advance(5 * SECOND);
    // Written 10 s ago, before the invalidations 5 s ago: stale.
    assert!(put_handed_over(&store, "gone", handover(10 * SECOND)).kept_existing);
    assert!(put_handed_over(&store, "dir/x", handover(10 * SECOND)).kept_existing);
    assert!(store.peek(b"gone").is_none() && store.peek(b"dir/x").is_none());
    // Written 1 s ago, after them: stored. Other keys are unaffected.
    assert!(!put_handed_over(&store, "gone", handover(SECOND)).kept_existing);
    assert!(!put_handed_over(&store, "other", handover(10 * SECOND)).kept_existing);
    // A clear covers everything; the memory of it ends after the window.
    store.clear();
    clock.advance(SECOND);
    assert!(put_handed_over(&store, "other", handover(2 * SECOND)).kept_existing);
    clock.advance(state::TOMBSTONE_WINDOW);
    store.purge_expired();
    assert!(!put_handed_over(&store, "other", handover(state::TOMBSTONE_WINDOW)).kept_existing);
    // A client's put is never refused by an invalidation.
    store.invalidate(b"fresh");
    put(&store, "fresh", 1).unwrap();
    assert!(store.peek(b"fresh").is_some());
}

#[test]
fn dropping_every_entry_refuses_no_later_handover_of_an_older_copy() {
    // A node published out of the key space drops what it held, but the copies its peers
    // hand back when it returns were written before the drop: they must be stored.
    let (store, clock) = store_with(config());
    put(&store, "a", 1).unwrap();
    put(&store, "b", 1).unwrap();
    let data = batch(0, 2);
    let mut in_flight = store.begin_put(key("in-flight"));
    in_flight.reserve(batch_weight(&data)).unwrap();
    clock.advance(10 * SECOND);
    assert_eq!(store.drop_all(), 2);
    assert_eq!(store.stats().entries, 0);
    assert_eq!(store.stats().evictions.explicit, 2);
    clock.advance(SECOND);
    let written_before_the_drop = Lifetime {
        age: 5 * SECOND,
        if_absent: true,
        ..Lifetime::default()
    };
    assert!(!put_handed_over(&store, "a", written_before_the_drop).kept_existing);
    assert_eq!(store.get(b"a").unwrap().total_rows(), 3);
    // A put in flight through the drop still commits.
    in_flight.commit(data.schema(), vec![data], None).unwrap();
    assert!(store.peek(b"in-flight").is_some());
    store.check_invariants();
}
