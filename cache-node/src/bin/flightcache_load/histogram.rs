//! Latencies in microseconds for p50/p99/max: an HdrHistogram with two significant
//! digits (under 1 % error at any magnitude). Pure.
//!
//! Owns: the latency histogram. A leaf: imports no other module of the load generator
//! and nothing of `cache_node`.

use std::time::Duration;

/// Significant decimal digits kept: 2 means a recorded value is off by under 1 %.
const SIGNIFICANT_DIGITS: u8 = 2;
/// Values at or above 2^40 µs (~12 days) count as that.
const HIGHEST_MICROS: u64 = 1 << 40;

/// Latencies recorded in microseconds.
#[derive(Debug, Clone)]
pub(crate) struct Histogram {
    /// `None` only if HdrHistogram refused the configuration (it accepts 2 digits).
    counts: Option<hdrhistogram::Histogram<u64>>,
    /// The exact largest value (HdrHistogram reports the top of its bucket).
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: hdrhistogram::Histogram::new_with_bounds(1, HIGHEST_MICROS, SIGNIFICANT_DIGITS)
                .ok(),
            max: 0,
        }
    }
}

impl Histogram {
    pub(crate) fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        if let Some(counts) = &mut self.counts {
            counts.saturating_record(micros);
        }
        self.max = self.max.max(micros);
    }

    fn recorded(&self) -> Option<&hdrhistogram::Histogram<u64>> {
        self.counts.as_ref().filter(|counts| !counts.is_empty())
    }

    /// The value (µs) at quantile `q` in `[0, 1]`; `None` when empty.
    pub(crate) fn quantile(&self, q: f64) -> Option<u64> {
        self.recorded()
            .map(|counts| counts.value_at_quantile(q).min(self.max))
    }

    /// The largest value recorded (µs); `None` when empty.
    pub(crate) fn max(&self) -> Option<u64> {
        self.recorded().map(|_| self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_magnitude_is_within_one_percent() {
        for v in [
            1,
            255,
            256,
            257,
            511,
            512,
            1000,
            123_456,
            9_999_999,
            1 << 39,
        ] {
            let mut h = Histogram::default();
            h.record(Duration::from_micros(1));
            h.record(Duration::from_micros(v));
            h.record(Duration::from_micros(v.saturating_mul(4)));
            let p50 = h.quantile(0.5).unwrap();
            let err = p50.abs_diff(v) as f64 / v as f64;
            assert!(err < 0.01, "{v}: p50 {p50}, error {err}");
        }
    }

    #[test]
    fn quantiles_of_a_known_distribution() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), None);
        assert_eq!(h.max(), None);
        for ms in 1..=100 {
            h.record(Duration::from_millis(ms));
        }
        let p50 = h.quantile(0.5).unwrap() as f64;
        let p99 = h.quantile(0.99).unwrap() as f64;
        assert!((50_000.0..50_500.0).contains(&p50), "{p50}");
        assert!((99_000.0..100_000.1).contains(&p99), "{p99}");
        assert_eq!(h.max(), Some(100_000));
        h.record(Duration::from_secs(2));
        assert_eq!(h.max(), Some(2_000_000));
        assert_eq!(h.quantile(1.0), Some(2_000_000));
    }
}
