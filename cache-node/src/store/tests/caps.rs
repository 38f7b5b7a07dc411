//! Caps and eviction: byte budget, entry count, live reconfiguration, LRU order and
//! TinyLFU scan resistance.

use super::*;

/// A store holding exactly `entries` one-row entries with one-letter keys.
fn store_for(entries: u64, eviction: EvictionPolicy) -> (Store, Arc<ManualClock>) {
    let one = weight_of("a", &[batch(0, 1)]);
    store_with(StoreConfig {
        budget_bytes: entries * one,
        max_entry_bytes: one,
        eviction,
        ..config()
    })
}

#[test]
fn lru_evicts_the_least_recently_read_entry_first() {
    let (store, _) = store_for(3, EvictionPolicy::Lru);
    for name in ["a", "b", "c"] {
        put(&store, name, 1).unwrap();
    }
    assert!(store.get(b"a").is_some());
    put(&store, "d", 1).unwrap();
    assert_eq!(keys(&store), ["a", "c", "d"]);
    assert!(store.get(b"c").is_some());
    put(&store, "e", 1).unwrap();
    assert_eq!(
        keys(&store),
        ["c", "d", "e"],
        "a was read before c and d were written"
    );
    assert_eq!(store.stats().evictions.size, 2);
    store.check_invariants();
}

#[test]
fn the_entry_cap_evicts_by_policy_with_cause_size() {
    let (store, _) = store_with(StoreConfig {
        max_entries: 2,
        ..config()
    });
    put(&store, "a", 1).unwrap();
    put(&store, "b", 1).unwrap();
    let outcome = put(&store, "c", 1).unwrap();
    assert_eq!(outcome.evicted, 1);
    assert_eq!(keys(&store), ["b", "c"]);
    let stats = store.stats();
    assert_eq!((stats.entries, stats.evictions.size), (2, 1));
    store.check_invariants();
}

#[test]
fn replacing_a_key_at_the_entry_cap_evicts_nothing_else() {
    let (store, _) = store_with(StoreConfig {
        max_entries: 2,
        ..config()
    });
    put(&store, "a", 1).unwrap();
    put(&store, "b", 1).unwrap();
    let outcome = put(&store, "a", 2).unwrap();
    assert_eq!((outcome.evicted, outcome.replaced), (0, true));
    assert_eq!(keys(&store), ["a", "b"]);
}

#[test]
fn reconfigure_shrink_evicts_down_to_the_new_caps_and_keeps_the_rest() {
    let (store, _) = store_with(config());
    for i in 0..10 {
        put(&store, &format!("k{i}"), 100).unwrap();
    }
    let used = store.stats().used_bytes;
    let per_entry = used / 10;
    let outcome = store
        .reconfigure(StoreConfig {
            max_entries: 8,
            budget_bytes: 6 * per_entry,
            max_entry_bytes: per_entry,
            ..config()
        })
        .unwrap();
    assert_eq!(outcome.evicted_entries, 4);
    assert_eq!(keys(&store), ["k4", "k5", "k6", "k7", "k8", "k9"]);
    assert_eq!(store.stats().evictions.size, 4);
    store.check_invariants();

    let outcome = store.reconfigure(config()).unwrap();
    assert_eq!(
        outcome,
        ReconfigureOutcome::default(),
        "growing drops nothing"
    );
    assert_eq!(store.stats().entries, 6);
    let outcome = store
        .reconfigure(StoreConfig {
            max_entries: 2,
            ..config()
        })
        .unwrap();
    assert_eq!(outcome.evicted_entries, 4);
    assert_eq!(keys(&store), ["k8", "k9"]);
    store.check_invariants();
}

#[test]
fn reconfigure_removes_expired_entries_before_evicting_live_ones() {
    let (store, clock) = store_with(config());
    put_with_ttl(&store, "old", 1, Some(SECOND)).unwrap();
    put(&store, "live", 1).unwrap();
    clock.advance(SECOND);
    let outcome = store
        .reconfigure(StoreConfig {
            max_entries: 1,
            ..config()
        })
        .unwrap();
    assert_eq!((outcome.expired_entries, outcome.evicted_entries), (1, 0));
    assert_eq!(keys(&store), ["live"]);
}

#[test]
fn lowering_max_entry_bytes_evicts_heavier_entries_and_fails_larger_puts() {
    let (store, _) = store_with(config());
    put(&store, "small", 1).unwrap();
    put(&store, "large", 5_000).unwrap();
    let mut pending = store.begin_put(key("streaming"));
    pending.reserve(20_000).unwrap();
    let outcome = store
        .reconfigure(StoreConfig {
            max_entry_bytes: 10_000,
            ..config()
        })
        .unwrap();
    assert_eq!((outcome.evicted_entries, outcome.aborted_puts), (1, 1));
    assert_eq!(keys(&store), ["small"]);
    assert_eq!(
        pending.reserve(1).unwrap_err(),
        Error::EntryTooLarge {
            size: 20_000,
            max: 10_000
        }
    );
    assert_eq!(store.stats().reserved_bytes, 0);
    store.check_invariants();
}

#[test]
fn a_budget_below_the_reservations_fails_the_newest_puts() {
    let (store, _) = store_with(config());
    put(&store, "stored", 1).unwrap();
    let mut older = store.begin_put(key("older"));
    older.reserve(60_000).unwrap();
    let mut newer = store.begin_put(key("newer"));
    newer.reserve(50_000).unwrap();
    let outcome = store
        .reconfigure(StoreConfig {
            budget_bytes: 100_000,
            max_entry_bytes: 100_000,
            ..config()
        })
        .unwrap();
    assert_eq!((outcome.evicted_entries, outcome.aborted_puts), (1, 1));
    assert!(matches!(newer.reserve(1), Err(Error::OverBudget { .. })));
    assert_eq!(older.reserved_bytes(), 60_000);
    let stats = store.stats();
    assert_eq!((stats.used_bytes, stats.reserved_bytes), (0, 60_000));
    store.check_invariants();
}

#[test]
fn reconfigure_rejects_an_invalid_config_and_changes_nothing() {
    let (store, _) = store_with(config());
    put(&store, "a", 1).unwrap();
    let invalid = StoreConfig {
        max_entries: 0,
        ..config()
    };
    let error = store.reconfigure(invalid).unwrap_err();
    assert!(matches!(
        error,
        Error::InvalidConfig {
            field: "max_entries",
            ..
        }
    ));
    assert_eq!(store.config(), config());
    assert_eq!(keys(&store), ["a"]);
}

#[test]
fn store_new_rejects_an_invalid_config() {
    let invalid = StoreConfig {
        budget_bytes: 10,
        ..config()
    };
    let error = Store::new(invalid, Arc::new(ManualClock::new())).unwrap_err();
    assert!(matches!(
        error,
        Error::InvalidConfig {
            field: "max_entry_bytes",
            ..
        }
    ));
}

#[test]
fn switching_policy_live_keeps_every_entry() {
    let (store, _) = store_with(config());
    for i in 0..10 {
        put(&store, &format!("k{i}"), 1).unwrap();
    }
    for policy in [
        EvictionPolicy::Tinylfu,
        EvictionPolicy::Lru,
        EvictionPolicy::Tinylfu,
    ] {
        let outcome = store
            .reconfigure(StoreConfig {
                eviction: policy,
                ..config()
            })
            .unwrap();
        assert_eq!(outcome, ReconfigureOutcome::default());
        put(&store, &format!("{policy:?}"), 1).unwrap();
        store.check_invariants();
    }
    assert_eq!(store.stats().entries, 12);
}

/// Reads the hot keys through a cache of 100 entries while 2000 one-hit keys stream
/// past, re-reading the hot set every 250 scan keys; returns hot-set hits out of 160.
fn hot_hits_under_scan(eviction: EvictionPolicy) -> u64 {
    let (store, _) = store_with(StoreConfig {
        max_entries: 100,
        eviction,
        ..config()
    });
    let read_through = |name: &str| {
        let hit = store.get(name.as_bytes()).is_some();
        if !hit {
            put(&store, name, 1).unwrap();
        }
        hit
    };
    let hot: Vec<String> = (0..20).map(|i| format!("hot/{i}")).collect();
    for _ in 0..5 {
        for name in &hot {
            read_through(name);
        }
    }
    let mut hot_hits = 0;
    for i in 0..2000 {
        read_through(&format!("scan/{i}"));
        if i % 250 == 249 {
            hot_hits += hot.iter().filter(|name| read_through(name)).count() as u64;
        }
        assert!(store.stats().entries <= 100);
    }
    store.check_invariants();
    hot_hits
}

#[test]
fn tinylfu_keeps_a_hot_set_through_a_scan_that_flushes_lru() {
    let lru = hot_hits_under_scan(EvictionPolicy::Lru);
    let tinylfu = hot_hits_under_scan(EvictionPolicy::Tinylfu);
    assert_eq!(lru, 0, "LRU loses the hot set to the scan");
    assert!(
        tinylfu >= 150,
        "TinyLFU kept only {tinylfu} of 160 hot reads"
    );
}
