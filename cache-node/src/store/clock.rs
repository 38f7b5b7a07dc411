//! Time source for the store: a [`Clock`] trait, the real [`SystemClock`] and a
//! test [`ManualClock`].
//!
//! The store never reads the wall clock itself; every timestamp it records (insert
//! time, last access, expiry deadline) is a [`Duration`] since the clock's own epoch.
//! Tests drive a [`ManualClock`] forward instead of sleeping. No I/O.
//!
//! Owns: the time source the store reads. Like all of `store/`, imports nothing outside
//! the store and no gRPC or Flight crate.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A monotonic time source measured from an arbitrary, fixed epoch.
///
/// Implementations must never go backwards; the store relies on this to keep its
/// expiry index ordered.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Returns the time elapsed since this clock's epoch.
    fn now(&self) -> Duration;
}

/// The production clock: a monotonic [`Instant`] taken when the clock was built, read
/// as [`SystemClock::START`] plus the time elapsed since.
///
/// The offset lets an entry handed over from another node keep its age: its insert time
/// (`now - age`) is representable even when the entry is older than this process.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    epoch: Instant,
}

impl SystemClock {
    /// What the clock reads when it is built: ten years, longer than any TTL or entry age.
    pub const START: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

    /// Creates a clock that reads [`SystemClock::START`] at the moment of this call.
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        Self::START + self.epoch.elapsed()
    }
}

/// A clock that only moves when told to, for deterministic tests.
///
/// Starts at zero. Time is kept in whole nanoseconds in an atomic, so it can be
/// shared across threads behind an `Arc` and advanced while the store is in use.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_nanos: AtomicU64,
}

impl ManualClock {
    /// Creates a clock that reads zero until advanced.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `step` (saturating at about 584 years).
    pub fn advance(&self, step: Duration) {
        let step_nanos = duration_to_nanos(step);
        // fetch_update never fails here because the closure always returns Some.
        let _ = self
            .now_nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                Some(now.saturating_add(step_nanos))
            });
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_nanos.load(Ordering::Acquire))
    }
}

/// Converts a duration to whole nanoseconds, saturating at `u64::MAX`.
pub(crate) fn duration_to_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_starts_at_zero_and_only_moves_when_advanced() {
        let clock = ManualClock::new();
        assert_eq!(clock.now(), Duration::ZERO);
        clock.advance(Duration::from_millis(1500));
        assert_eq!(clock.now(), Duration::from_millis(1500));
        clock.advance(Duration::from_secs(2));
        assert_eq!(clock.now(), Duration::from_millis(3500));
    }

    #[test]
    fn manual_clock_saturates_instead_of_wrapping() {
        let clock = ManualClock::new();
        clock.advance(Duration::MAX);
        clock.advance(Duration::from_secs(1));
        assert_eq!(clock.now(), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn system_clock_is_monotonic() {
        let clock = SystemClock::new();
        let first = clock.now();
        let second = clock.now();
        assert!(second >= first);
    }
}
