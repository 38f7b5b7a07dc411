//! Property test: random sequences of puts (with tags), reads, invalidations (of keys,
//! prefixes and tags), clock moves and reconfigurations never exceed the caps, never
//! corrupt the store's bookkeeping (its tag index included), and an invalidation always
//! beats a put that began before it, even when the put's tags arrive after it.

use proptest::prelude::*;

use super::*;

/// Sixteen keys in four prefix groups: `0/0` .. `3/3`.
fn key_name(key: u8) -> String {
    format!("{}/{}", (key / 4) % 4, key % 4)
}

#[derive(Debug, Clone)]
enum Op {
    Begin {
        key: u8,
    },
    Reserve {
        put: usize,
        bytes: u64,
    },
    Commit {
        put: usize,
        rows: usize,
        ttl_secs: Option<u64>,
        /// Which of the three tags `t0`..`t2` the entry carries (bits).
        tags: u8,
    },
    Abandon {
        put: usize,
    },
    Get {
        key: u8,
    },
    Invalidate {
        key: u8,
    },
    InvalidatePrefix {
        group: u8,
    },
    InvalidateTag {
        tag: u8,
    },
    Clear,
    Purge,
    Advance {
        secs: u64,
    },
    Reconfigure(StoreConfig),
}

fn config_strategy() -> impl Strategy<Value = StoreConfig> {
    (
        1..=20u64,
        2_000..=40_000u64,
        1..=100u64,
        1..=60u64,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(max_entries, budget_bytes, entry_percent, ttl_secs, sliding, tinylfu)| StoreConfig {
                max_entries,
                budget_bytes,
                max_entry_bytes: (budget_bytes * entry_percent / 100).max(1),
                ttl: Duration::from_secs(ttl_secs),
                ttl_mode: if sliding {
                    TtlMode::Sliding
                } else {
                    TtlMode::Absolute
                },
                eviction: if tinylfu {
                    EvictionPolicy::Tinylfu
                } else {
                    EvictionPolicy::Lru
                },
            },
        )
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..16u8).prop_map(|key| Op::Begin { key }),
        3 => (any::<usize>(), 0..5_000u64).prop_map(|(put, bytes)| Op::Reserve { put, bytes }),
        3 => (any::<usize>(), 0..300usize, proptest::option::of(1..30u64), 0..8u8)
            .prop_map(|(put, rows, ttl_secs, tags)| Op::Commit { put, rows, ttl_secs, tags }),
        1 => any::<usize>().prop_map(|put| Op::Abandon { put }),
        4 => (0..16u8).prop_map(|key| Op::Get { key }),
        1 => (0..16u8).prop_map(|key| Op::Invalidate { key }),
        1 => (0..4u8).prop_map(|group| Op::InvalidatePrefix { group }),
        1 => (0..3u8).prop_map(|tag| Op::InvalidateTag { tag }),
        1 => Just(Op::Clear),
        1 => Just(Op::Purge),
        2 => (0..20u64).prop_map(|secs| Op::Advance { secs }),
        1 => config_strategy().prop_map(Op::Reconfigure),
    ]
}

/// A put in flight, whether the model says an invalidation has covered its key, and the
/// tags invalidated since it began (bits).
struct InFlight {
    pending: PendingPut,
    name: String,
    invalidated: bool,
    tags_invalidated: u8,
}

fn tag_list(bits: u8) -> Tags {
    (0..3u8)
        .filter(|tag| bits & (1 << tag) != 0)
        .map(|tag| Arc::<str>::from(format!("t{tag}")))
        .collect()
}

fn pick(puts: &[InFlight], index: usize) -> Option<usize> {
    (!puts.is_empty()).then(|| index % puts.len())
}

fn check_caps(store: &Store) {
    store.check_invariants();
    let stats = store.stats();
    assert!(
        stats.used_bytes + stats.reserved_bytes <= stats.budget_bytes,
        "{stats:?}"
    );
    assert!(stats.entries <= stats.max_entries, "{stats:?}");
}

fn run(initial: StoreConfig, ops: Vec<Op>) {
    let (store, clock) = store_with(initial);
    let mut puts: Vec<InFlight> = Vec::new();
    for op in ops {
        match op {
            Op::Begin { key } => {
                let name = key_name(key);
                let pending = store.begin_put(Bytes::from(name.clone()));
                puts.push(InFlight {
                    pending,
                    name,
                    invalidated: false,
                    tags_invalidated: 0,
                });
            }
            Op::Reserve { put, bytes } => {
                if let Some(index) = pick(&puts, put) {
                    let result = puts[index].pending.reserve(bytes);
                    if puts[index].invalidated {
                        assert!(result.is_err(), "reserve after invalidation must fail");
                    }
                }
            }
            Op::Commit {
                put,
                rows,
                ttl_secs,
                tags,
            } => {
                if let Some(index) = pick(&puts, put) {
                    let InFlight {
                        pending,
                        name,
                        invalidated,
                        tags_invalidated,
                    } = puts.swap_remove(index);
                    let data = batch(0, rows);
                    let lifetime = Lifetime {
                        ttl_override: ttl_secs.map(Duration::from_secs),
                        tags: tag_list(tags),
                        ..Lifetime::default()
                    };
                    match pending.commit_with(data.schema(), vec![data], lifetime) {
                        Ok(_) => {
                            assert!(!invalidated, "a put outlived an invalidation of its key");
                            assert_eq!(
                                tags & tags_invalidated,
                                0,
                                "a put outlived an invalidation of one of its tags"
                            );
                            let entry = store
                                .peek(name.as_bytes())
                                .expect("committed entry visible");
                            assert_eq!(entry.total_rows(), rows as u64);
                        }
                        Err(Error::InvalidConfig { .. }) => panic!("commit cannot fail on config"),
                        Err(_) => {}
                    }
                }
            }
            Op::Abandon { put } => {
                if let Some(index) = pick(&puts, put) {
                    puts.swap_remove(index);
                }
            }
            Op::Get { key } => {
                store.get(key_name(key).as_bytes());
            }
            Op::Invalidate { key } => {
                let name = key_name(key);
                store.invalidate(name.as_bytes());
                assert!(store.peek(name.as_bytes()).is_none());
                puts.iter_mut()
                    .filter(|put| put.name == name)
                    .for_each(|put| put.invalidated = true);
            }
            Op::InvalidatePrefix { group } => {
                let prefix = format!("{group}/");
                store.invalidate_prefix(prefix.as_bytes());
                assert!(store.list(prefix.as_bytes(), usize::MAX).is_empty());
                puts.iter_mut()
                    .filter(|put| put.name.starts_with(&prefix))
                    .for_each(|put| put.invalidated = true);
            }
            Op::InvalidateTag { tag } => {
                let name: Arc<str> = Arc::from(format!("t{tag}"));
                store.invalidate_tags(std::slice::from_ref(&name));
                assert!(
                    store
                        .list(b"", usize::MAX)
                        .iter()
                        .all(|(_, entry)| !entry.tags().contains(&name))
                );
                puts.iter_mut()
                    .for_each(|put| put.tags_invalidated |= 1 << tag);
            }
            Op::Clear => {
                store.clear();
                assert_eq!(store.stats().entries, 0);
                puts.iter_mut().for_each(|put| put.invalidated = true);
            }
            Op::Purge => {
                store.purge_expired();
                let now = clock.now();
                assert!(
                    store
                        .list(b"", usize::MAX)
                        .iter()
                        .all(|(_, entry)| entry.expires_at() > now)
                );
            }
            Op::Advance { secs } => clock.advance(Duration::from_secs(secs)),
            Op::Reconfigure(config) => {
                store.reconfigure(config.clone()).unwrap();
                assert_eq!(store.config(), config);
            }
        }
        check_caps(&store);
    }
    drop(puts);
    let stats = store.stats();
    assert_eq!((stats.reserved_bytes, stats.in_flight_puts), (0, 0));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn random_operations_keep_caps_and_bookkeeping(
        initial in config_strategy(),
        ops in proptest::collection::vec(op_strategy(), 1..120),
    ) {
        run(initial, ops);
    }
}
