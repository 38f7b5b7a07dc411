//! The node's allocator and the freed memory it keeps (ADR 0009).
//!
//! The binary runs on jemalloc (`main.rs`), which keeps pages freed by one put for about
//! a second (`dirty_decay_ms` in `.cargo/config.toml`) and hands them to the next,
//! instead of returning every large buffer to the OS and faulting fresh pages in for
//! the next one: with glibc's fixed mmap threshold (ADR 0005) those page faults were
//! most of a large put's time (docs/benchmarks.md, "Puts"). Kept pages are resident, so
//! the budget counts them: every [`SAMPLE_EVERY`] the bytes jemalloc keeps are read from
//! its statistics and recorded in the store ([`Store::hold_for_allocator`]). They evict
//! nothing by themselves (an eviction would only add the entry's pages to them); room
//! made for a put counts them, so the put evicts for what it cannot take from them.
//!
//! Owns: reading jemalloc's statistics (safe `tikv-jemalloc-ctl` calls only). Must not
//! import the Flight or wire layers.

use std::sync::Arc;
use std::time::Duration;

use tikv_jemalloc_ctl::{epoch, stats};

use crate::store::Store;

/// How often the kept bytes are read: short next to the allocator's decay time (about a
/// second), so the budget follows them closely; a read costs a few microseconds.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(2);

/// Bytes the allocator keeps resident without handing them out: freed pages kept for
/// reuse. `None` when the statistics cannot be read (a build without them).
pub fn kept_bytes() -> Option<u64> {
    epoch::advance().ok()?;
    let resident = stats::resident::read().ok()?;
    let active = stats::active::read().ok()?;
    let metadata = stats::metadata::read().ok()?;
    let kept = resident.saturating_sub(active).saturating_sub(metadata);
    u64::try_from(kept).ok()
}

/// Holds the allocator's kept bytes in `store`'s budget, read every [`SAMPLE_EVERY`],
/// until the task is aborted. The store (and its lock) is told only when the figure
/// changed, so an idle node does not take the lock 500 times a second.
pub async fn hold_kept_bytes(store: Arc<Store>) {
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut held = 0;
    loop {
        ticks.tick().await;
        if let Some(kept) = kept_bytes().filter(|kept| *kept != held) {
            store.hold_for_allocator(kept);
            held = kept;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_bytes_are_read_from_the_allocator() {
        // Tests run on the system allocator; jemalloc is linked all the same and its
        // statistics answer.
        assert!(kept_bytes().is_some());
    }
}
