//! A log-linear latency histogram in microseconds (exact below 256 µs, then 128 buckets per
//! power of two: under 1 % error) for p50/p99/max. Pure.

use std::time::Duration;

const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
/// Values at or above 2^MAX_EXP µs (~12 days) land in the last bucket.
const MAX_EXP: u32 = 40;
const BUCKETS: usize = (2 * SUB + (MAX_EXP as u64 - SUB_BITS as u64 - 1) * SUB) as usize;

/// Latencies recorded in microseconds.
#[derive(Debug, Clone)]
pub(crate) struct Histogram {
    counts: Vec<u64>,
    count: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            count: 0,
            max: 0,
        }
    }
}

fn index(micros: u64) -> usize {
    let v = micros.min((1 << MAX_EXP) - 1);
    if v < 2 * SUB {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let shift = msb - SUB_BITS;
    let top = v >> shift;
    (2 * SUB + u64::from(msb - SUB_BITS - 1) * SUB + (top - SUB)) as usize
}

/// The largest value that falls in bucket `i`.
fn upper_bound(i: usize) -> u64 {
    let i = i as u64;
    if i < 2 * SUB {
        return i;
    }
    let octave = (i - 2 * SUB) / SUB; // 0 for values in [256, 512)
    let top = (i - 2 * SUB) % SUB + SUB;
    let shift = octave + 1;
    ((top + 1) << shift) - 1
}

impl Histogram {
    pub(crate) fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        if let Some(slot) = self.counts.get_mut(index(micros)) {
            *slot += 1;
        }
        self.count += 1;
        self.max = self.max.max(micros);
    }

    /// The value (µs) at quantile `q` in `[0, 1]`; `None` when empty.
    pub(crate) fn quantile(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(upper_bound(i).min(self.max));
            }
        }
        Some(self.max)
    }

    /// The largest value recorded (µs); `None` when empty.
    pub(crate) fn max(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_bounded() {
        let mut last = 0;
        for v in [
            0,
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
            let i = index(v);
            assert!(i >= last && i < BUCKETS, "{v} -> {i}");
            assert!(upper_bound(i) >= v, "{v} -> {i} -> {}", upper_bound(i));
            let err = (upper_bound(i) - v) as f64 / v.max(1) as f64;
            assert!(err < 0.01, "{v}: {err}");
            last = i;
        }
        for i in 0..BUCKETS - 1 {
            assert_eq!(index(upper_bound(i)), i);
            assert_eq!(index(upper_bound(i) + 1), i + 1);
        }
    }

    #[test]
    fn quantiles_of_a_known_distribution() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), None);
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
