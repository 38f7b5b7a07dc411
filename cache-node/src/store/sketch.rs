//! Count-min sketch of recent key frequencies, the "TinyLFU" half of W-TinyLFU.
//!
//! Four rows of 4-bit saturating counters (16 per `u64` word). A key's frequency is
//! the minimum of its four counters, which over-estimates only on hash collisions.
//! Rows hold about four counters per cache entry, and after `2.5 x width` increments
//! (ten per entry, as in Caffeine) every counter is halved, so old popularity fades
//! and the sketch tracks the recent past. Input is a 64-bit key hash
//! computed by the caller; pure data structure, no I/O.
//!
//! Owns: the frequency counters. Pure; imports nothing outside the store.

/// Number of independent counter rows (hash functions).
const ROWS: usize = 4;

/// Counters packed into one `u64` word.
const COUNTERS_PER_WORD: usize = 16;

/// Largest value a 4-bit counter holds.
const MAX_COUNT: u64 = 15;

/// Fewest counters per row, so tiny caches still get a useful sketch.
const MIN_WIDTH: u64 = 64;

/// Most counters per row; caps the sketch at 4 MiB however large `max_entries` is.
const MAX_WIDTH: u64 = 1 << 21;

/// Counters per row for each cache entry, keeping collisions rare.
const COUNTERS_PER_ENTRY: u64 = 4;

/// Odd multipliers that derive one index per row from a single key hash.
const ROW_SEEDS: [u64; ROWS] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x85EB_CA77_C2B2_AE63,
];

/// Mask keeping the low three bits of every nibble after a right shift (halving).
const HALVE_MASK: u64 = 0x7777_7777_7777_7777;

/// A count-min sketch with 4-bit counters and periodic aging.
#[derive(Debug, Clone)]
pub(crate) struct FrequencySketch {
    /// `ROWS` rows of `width / COUNTERS_PER_WORD` words, stored row after row.
    words: Vec<u64>,
    /// Counters per row; a power of two.
    width: u64,
    /// Increments since the last halving.
    additions: u64,
    /// Increments that trigger a halving.
    sample_size: u64,
}

impl FrequencySketch {
    /// Creates a sketch sized for a cache of `max_entries` entries.
    pub(crate) fn for_capacity(max_entries: u64) -> Self {
        let width = width_for(max_entries);
        let words_per_row = usize::try_from(width).unwrap_or(usize::MAX) / COUNTERS_PER_WORD;
        Self {
            words: vec![0; words_per_row.saturating_mul(ROWS)],
            width,
            additions: 0,
            // About 2.5 increments per counter between halvings.
            sample_size: width.saturating_mul(5) / 2,
        }
    }

    /// Resizes for a new capacity. A different width starts from empty counters,
    /// since counts cannot be re-hashed; an unchanged width keeps them.
    pub(crate) fn resize_for(&mut self, max_entries: u64) {
        if width_for(max_entries) != self.width {
            *self = Self::for_capacity(max_entries);
        }
    }

    /// Records one occurrence of the key with hash `key_hash`.
    pub(crate) fn increment(&mut self, key_hash: u64) {
        let mut incremented = false;
        for row in 0..ROWS {
            let (word, shift) = self.position(row, key_hash);
            if let Some(slot) = self.words.get_mut(word) {
                let count = (*slot >> shift) & MAX_COUNT;
                if count < MAX_COUNT {
                    *slot += 1 << shift;
                    incremented = true;
                }
            }
        }
        if incremented {
            self.additions += 1;
            if self.additions >= self.sample_size {
                self.halve();
            }
        }
    }

    /// Returns the estimated recent frequency of the key, from 0 to 15.
    pub(crate) fn frequency(&self, key_hash: u64) -> u8 {
        let estimate = (0..ROWS)
            .map(|row| {
                let (word, shift) = self.position(row, key_hash);
                self.words
                    .get(word)
                    .map_or(0, |slot| (slot >> shift) & MAX_COUNT)
            })
            .min()
            .unwrap_or(0);
        u8::try_from(estimate).unwrap_or(u8::MAX)
    }

    /// Counters per row.
    #[cfg(test)]
    pub(crate) fn width(&self) -> u64 {
        self.width
    }

    /// Halves every counter so that past popularity decays.
    fn halve(&mut self) {
        for word in &mut self.words {
            *word = (*word >> 1) & HALVE_MASK;
        }
        self.additions /= 2;
    }

    /// Word index and bit shift of the key's counter in `row`.
    fn position(&self, row: usize, key_hash: u64) -> (usize, u32) {
        let seed = ROW_SEEDS[row % ROWS];
        let mixed = (key_hash ^ (key_hash >> 29)).wrapping_mul(seed);
        let counter = (mixed >> 32 ^ mixed) & (self.width - 1);
        let words_per_row = self.width / COUNTERS_PER_WORD as u64;
        let word = row as u64 * words_per_row + counter / COUNTERS_PER_WORD as u64;
        let shift = (counter % COUNTERS_PER_WORD as u64) * 4;
        (
            usize::try_from(word).unwrap_or(usize::MAX),
            u32::try_from(shift).unwrap_or(0),
        )
    }
}

/// Row width for a capacity: four counters per entry rounded up to a power of two,
/// within `MIN_WIDTH..=MAX_WIDTH`.
fn width_for(max_entries: u64) -> u64 {
    max_entries
        .saturating_mul(COUNTERS_PER_ENTRY)
        .clamp(MIN_WIDTH, MAX_WIDTH)
        .checked_next_power_of_two()
        .unwrap_or(MAX_WIDTH)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(i: u64) -> u64 {
        i.wrapping_mul(0x2545_F491_4F6C_DD1D).rotate_left(17)
    }

    #[test]
    fn unseen_keys_have_zero_frequency() {
        let sketch = FrequencySketch::for_capacity(1000);
        assert_eq!(sketch.frequency(hash(1)), 0);
    }

    #[test]
    fn frequency_counts_increments_and_saturates_at_fifteen() {
        let mut sketch = FrequencySketch::for_capacity(1000);
        for expected in 1..=15 {
            sketch.increment(hash(7));
            assert_eq!(sketch.frequency(hash(7)), expected);
        }
        sketch.increment(hash(7));
        assert_eq!(sketch.frequency(hash(7)), 15);
    }

    #[test]
    fn hot_keys_outrank_cold_keys_among_many() {
        let mut sketch = FrequencySketch::for_capacity(512);
        for round in 0..10 {
            for hot in 0..20 {
                sketch.increment(hash(hot));
            }
            for cold in 0..50 {
                sketch.increment(hash(1000 + round * 50 + cold));
            }
        }
        let coldest_hot = (0..20).map(|k| sketch.frequency(hash(k))).min().unwrap();
        assert!(coldest_hot >= 9, "hot key estimate {coldest_hot}");
        let cold = sketch.frequency(hash(1000));
        assert!(cold < coldest_hot, "cold {cold} vs hot {coldest_hot}");
    }

    #[test]
    fn halving_divides_every_counter_by_two() {
        let mut sketch = FrequencySketch::for_capacity(1000);
        for _ in 0..9 {
            sketch.increment(hash(1));
        }
        sketch.increment(hash(2));
        sketch.halve();
        assert_eq!(sketch.frequency(hash(1)), 4);
        assert_eq!(sketch.frequency(hash(2)), 0);
    }

    #[test]
    fn a_full_sample_of_increments_triggers_halving() {
        let mut sketch = FrequencySketch::for_capacity(64);
        let mut previous = 0;
        let mut key = 0;
        loop {
            sketch.increment(hash(key));
            key += 1;
            if sketch.additions < previous {
                break;
            }
            previous = sketch.additions;
            assert!(key < 100_000, "sketch never aged");
        }
        assert_eq!(previous + 1, sketch.sample_size);
        assert_eq!(sketch.additions, sketch.sample_size / 2);
    }

    #[test]
    fn width_follows_capacity_within_bounds_and_resize_resets_counts() {
        assert_eq!(FrequencySketch::for_capacity(1).width(), MIN_WIDTH);
        assert_eq!(FrequencySketch::for_capacity(1000).width(), 4096);
        assert_eq!(FrequencySketch::for_capacity(u64::MAX).width(), MAX_WIDTH);

        let mut sketch = FrequencySketch::for_capacity(1000);
        sketch.increment(hash(3));
        sketch.resize_for(1000);
        assert_eq!(sketch.frequency(hash(3)), 1, "same width keeps counts");
        sketch.resize_for(100_000);
        assert_eq!(sketch.width(), 524_288);
        assert_eq!(sketch.frequency(hash(3)), 0);
    }
}
