//! What the targets share: the panic policy and a small store.
// Each target uses a part of it.
#![allow(dead_code)]

use std::sync::{Arc, Once};
use std::time::Duration;

use cache_node::store::{EvictionPolicy, Store, StoreConfig, SystemClock, TtlMode};

/// libfuzzer-sys's panic hook aborts on every panic, even one the node catches: arrow-ipc's
/// reader panics on some hostile bodies, and `wire::seal` turns exactly those into the
/// client's error with `catch_unwind` (docs/security.md, "Untrusted input"). So a panic
/// raised inside an arrow crate unwinds quietly here: if the node catches it, it is no
/// finding; if it escapes, libfuzzer-sys's own `catch_unwind` around the target still
/// aborts. Any other panic is reported and aborts at once.
pub fn arrow_panics_unwind() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let abort_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_arrow = info
                .location()
                .is_some_and(|at| at.file().contains("/arrow-"));
            if !in_arrow {
                abort_hook(info);
            }
        }));
    });
}

/// A store of `budget` bytes, entries up to `max_entry` bytes.
pub fn store(budget: u64, max_entry: u64) -> Arc<Store> {
    let config = StoreConfig {
        max_entries: 1_000,
        budget_bytes: budget,
        max_entry_bytes: max_entry,
        ttl: Duration::from_secs(60),
        ttl_mode: TtlMode::Absolute,
        eviction: EvictionPolicy::Lru,
    };
    match Store::new(config, Arc::new(SystemClock::new())) {
        Ok(store) => Arc::new(store),
        Err(err) => panic!("the fuzz store's config is valid: {err}"),
    }
}
