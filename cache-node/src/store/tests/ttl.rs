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
