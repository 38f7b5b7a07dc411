//! Entry tags: the index, `invalidate_tags`, its race with puts in flight and with
//! handovers of older copies, and what tags cost against the budget.

use super::*;

fn tags(list: &[&str]) -> Tags {
    list.iter().map(|tag| Arc::<str>::from(*tag)).collect()
}

fn names(list: &[&str]) -> Vec<Arc<str>> {
    list.iter().map(|tag| Arc::<str>::from(*tag)).collect()
}

fn put_tagged(store: &Store, name: &str, rows: usize, with: &[&str]) -> Result<CommitOutcome> {
    let data = batch(0, rows);
    let mut pending = store.begin_put(key(name));
    pending.reserve(batch_weight(&data))?;
    let lifetime = Lifetime {
        tags: tags(with),
        ..Lifetime::default()
    };
    pending.commit_with(data.schema(), vec![data], lifetime)
}

#[test]
fn invalidating_a_tag_removes_exactly_the_entries_carrying_it() {
    let (store, _clock) = store_with(config());
    put_tagged(&store, "daily", 10, &["sales.orders", "tenant:a"]).unwrap();
    put_tagged(&store, "weekly", 10, &["sales.orders"]).unwrap();
    put_tagged(&store, "users", 10, &["crm.users", "tenant:a"]).unwrap();
    put(&store, "untagged", 10).unwrap();
    assert_eq!(
        &**store.peek(b"daily").unwrap().tags(),
        &*tags(&["sales.orders", "tenant:a"])
    );

    assert_eq!(store.invalidate_tags(&names(&["sales.orders"])), 2);
    assert_eq!(keys(&store), ["untagged", "users"]);
    // Several tags at once: an entry carrying two of them counts once.
    put_tagged(&store, "daily", 10, &["sales.orders", "tenant:a"]).unwrap();
    assert_eq!(
        store.invalidate_tags(&names(&["tenant:a", "sales.orders", "nobody"])),
        2
    );
    assert_eq!(keys(&store), ["untagged"]);
    assert_eq!(store.stats().evictions.explicit, 4);
    store.check_invariants();
}

#[test]
fn the_index_follows_replacement_eviction_expiry_and_other_invalidations() {
    let (store, clock) = store_with(StoreConfig {
        max_entries: 2,
        ..config()
    });
    put_tagged(&store, "a", 10, &["t1"]).unwrap();
    // Replaced by a put with other tags: the old tags no longer reach it.
    put_tagged(&store, "a", 10, &["t2"]).unwrap();
    assert_eq!(store.invalidate_tags(&names(&["t1"])), 0);
    assert!(store.peek(b"a").is_some());
    // Evicted by the entry cap (LRU: "a"), invalidated by key, expired: gone from the
    // index too.
    put_tagged(&store, "b", 10, &["t2"]).unwrap();
    put_tagged(&store, "c", 10, &["t2"]).unwrap();
    assert_eq!(keys(&store), ["b", "c"]);
    store.check_invariants();
    assert!(store.invalidate(b"b"));
    store.check_invariants();
    clock.advance(61 * SECOND);
    assert_eq!(store.purge_expired(), 1);
    assert_eq!(store.stats().entries, 0);
    store.check_invariants();
    assert_eq!(store.invalidate_tags(&names(&["t2"])), 0);
    store.check_invariants();
}

#[test]
fn a_tag_invalidated_while_a_put_streams_refuses_its_commit_whenever_its_tags_arrived() {
    let (store, clock) = store_with(config());
    let data = batch(0, 10);
    let mut pending = store.begin_put(key("streaming"));
    pending.reserve(batch_weight(&data)).unwrap();
    clock.advance(SECOND);
    // The tags travel with the first batch (pyarrow's write_with_metadata), so the store
    // learns them at commit, after the invalidation.
    assert_eq!(store.invalidate_tags(&names(&["sales.orders"])), 0);
    clock.advance(SECOND);
    let lifetime = Lifetime {
        tags: tags(&["sales.orders"]),
        ..Lifetime::default()
    };
    assert_eq!(
        pending
            .commit_with(data.schema(), vec![data.clone()], lifetime.clone())
            .unwrap_err(),
        Error::InvalidatedDuringPut
    );
    assert!(store.peek(b"streaming").is_none());
    assert_eq!(store.stats().discarded_puts, 1);
    assert_eq!(store.stats().reserved_bytes, 0);
    // A put begun after the invalidation is stored; so is one with other tags.
    let mut later = store.begin_put(key("streaming"));
    later.reserve(batch_weight(&data)).unwrap();
    later
        .commit_with(data.schema(), vec![data], lifetime)
        .unwrap();
    put_tagged(&store, "other", 10, &["crm.users"]).unwrap();
    assert_eq!(keys(&store), ["other", "streaming"]);
    store.check_invariants();
}

#[test]
fn a_handover_of_a_copy_written_before_its_tag_was_invalidated_keeps_nothing() {
    let (store, clock) = store_with(config());
    clock.advance(100 * SECOND);
    store.invalidate_tags(&names(&["sales.orders"]));
    clock.advance(5 * SECOND);
    let handover = |age: Duration| {
        let data = batch(0, 10);
        let mut pending = store.begin_put(key("moved"));
        pending.reserve(batch_weight(&data)).unwrap();
        let lifetime = Lifetime {
            age,
            if_absent: true,
            tags: tags(&["sales.orders"]),
            ..Lifetime::default()
        };
        pending
            .commit_with(data.schema(), vec![data], lifetime)
            .unwrap()
    };
    // Written 10 s ago, before the invalidation 5 s ago: stale, not stored.
    assert!(handover(10 * SECOND).kept_existing);
    assert!(store.peek(b"moved").is_none());
    // Written 1 s ago, after it: stored.
    assert!(!handover(SECOND).kept_existing);
    assert!(store.peek(b"moved").is_some());
    // The invalidation is forgotten after the tombstone window.
    store.invalidate(b"moved");
    clock.advance(state::TOMBSTONE_WINDOW);
    store.purge_expired();
    let data = batch(0, 10);
    let mut pending = store.begin_put(key("old"));
    pending.reserve(batch_weight(&data)).unwrap();
    let outcome = pending
        .commit_with(
            data.schema(),
            vec![data],
            Lifetime {
                age: 700 * SECOND,
                if_absent: true,
                tags: tags(&["sales.orders"]),
                ..Lifetime::default()
            },
        )
        .unwrap();
    assert!(!outcome.kept_existing);
    store.check_invariants();
}

#[test]
fn tags_are_charged_to_the_budget() {
    let (store, _clock) = store_with(config());
    let plain = put(&store, "plain", 10).unwrap().weight_bytes;
    let tagged = put_tagged(&store, "tagge", 10, &["sales.orders", "t"])
        .unwrap()
        .weight_bytes;
    assert_eq!(
        tagged - plain,
        "sales.orders".len() as u64 + 1 + 2 * weight::TAG_OVERHEAD_BYTES
    );
    assert_eq!(store.stats().used_bytes, plain + tagged);
}
