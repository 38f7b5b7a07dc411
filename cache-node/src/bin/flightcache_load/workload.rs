//! The synthetic hot set: key names, the deterministic batch stored under each key and its
//! verification, a seeded random generator and the key chooser (skewed, uniform or in
//! rounds). Pure; no I/O.
//!
//! Owns: the key names, the data and its check. Imports of `cache_node` only keys and
//! tickets (the wire format a put's descriptor and a get's ticket carry); no calls.

use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_flight::FlightDescriptor;
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use cache_node::key::CacheKey;
use cache_node::ticket::CacheTicket;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

/// The key set and the shape of each key's value.
#[derive(Debug, Clone)]
pub(crate) struct Workload {
    prefix: String,
    rows: usize,
    schema: SchemaRef,
}

impl Workload {
    /// Keys are `<prefix>/<index>`; each value has `rows` rows.
    pub(crate) fn new(prefix: &str, rows: usize) -> Self {
        let schema = Arc::new(Schema::new(vec![
            Field::new("key_id", DataType::Int64, false),
            Field::new("row", DataType::Int64, false),
            Field::new("value", DataType::Float64, false),
            Field::new("label", DataType::Utf8, false),
        ]));
        Self {
            prefix: prefix.to_owned(),
            rows,
            schema,
        }
    }

    /// The key name of `index`.
    pub(crate) fn key(&self, index: u64) -> String {
        format!("{}/{index}", self.prefix)
    }

    /// The path descriptor of `index` (one segment; the node joins segments by `/`).
    pub(crate) fn descriptor(&self, index: u64) -> FlightDescriptor {
        FlightDescriptor::new_path(vec![self.key(index)])
    }

    /// The DoGet ticket of `index`, in the node's documented ticket format.
    pub(crate) fn ticket(&self, index: u64) -> Bytes {
        CacheTicket::new(CacheKey::Path(self.key(index))).encode()
    }

    /// The schema of every value.
    pub(crate) fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// The value stored under `index`: every byte is a function of the index, so a reader
    /// can tell a right answer from a wrong one (another key's value, a stale or garbled one).
    ///
    /// # Errors
    /// An [`ArrowError`] if the batch cannot be assembled (it always can).
    pub(crate) fn batch(&self, index: u64) -> Result<RecordBatch, ArrowError> {
        let rows = self.rows as u64;
        let key_id = i64::try_from(index).unwrap_or(i64::MAX);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values((0..rows).map(|_| key_id))),
            Arc::new(Int64Array::from_iter_values(
                (0..rows).map(|r| i64::try_from(r).unwrap_or(i64::MAX)),
            )),
            Arc::new(Float64Array::from_iter_values((0..rows).map(|r| {
                let bits = mix64(index.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ r) >> 11;
                bits as f64 / (1u64 << 53) as f64
            }))),
            Arc::new(StringArray::from_iter_values(
                (0..rows).map(|r| format!("{}/{index}#{r}", self.prefix)),
            )),
        ];
        RecordBatch::try_new(self.schema(), columns)
    }

    /// Checks that `got` (the batches of one DoGet) is exactly the value of `index`.
    ///
    /// # Errors
    /// A description of the first difference found.
    pub(crate) fn verify(&self, index: u64, got: &[RecordBatch]) -> Result<(), String> {
        let expected = self.batch(index).map_err(|err| err.to_string())?;
        let total: usize = got.iter().map(RecordBatch::num_rows).sum();
        if total != expected.num_rows() {
            return Err(format!(
                "{}: {total} rows, expected {}",
                self.key(index),
                expected.num_rows()
            ));
        }
        let mut offset = 0;
        for batch in got {
            if batch.schema().fields() != expected.schema().fields() {
                return Err(format!(
                    "{}: schema {:?}, expected {:?}",
                    self.key(index),
                    batch.schema().fields(),
                    expected.schema().fields()
                ));
            }
            let want = expected.slice(offset, batch.num_rows());
            for (column, (a, b)) in want.columns().iter().zip(batch.columns()).enumerate() {
                if a.as_ref() != b.as_ref() {
                    return Err(format!(
                        "{}: column {} differs in rows {offset}..{}",
                        self.key(index),
                        expected.schema().field(column).name(),
                        offset + batch.num_rows()
                    ));
                }
            }
            offset += batch.num_rows();
        }
        Ok(())
    }
}

/// The murmur3 64-bit finaliser: a good bit mixer.
fn mix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The key-choice generator of one worker: Xoshiro256++ (a specified algorithm, so a seed
/// replays the same sequence on every platform and rand version).
#[derive(Debug, Clone)]
pub(crate) struct Rng(Xoshiro256PlusPlus);

impl Rng {
    /// A generator for `stream` (e.g. the worker number) of the run seeded with `seed`.
    pub(crate) fn new(seed: u64, stream: u64) -> Self {
        Self(Xoshiro256PlusPlus::seed_from_u64(
            seed ^ mix64(stream.wrapping_add(0x632b_e59b_d9b4_e019)),
        ))
    }
}

/// Picks key indexes: Zipf with exponent `s` over `0..keys` (index 0 the hottest),
/// uniform when `s` is 0, or in rounds ([`KeyChooser::in_rounds`]).
#[derive(Debug)]
pub(crate) struct KeyChooser {
    keys: u64,
    /// Cumulative probabilities by rank; empty for uniform.
    cdf: Vec<f64>,
    /// Set in rounds: the order shared by every worker.
    rounds: Option<parking_lot::Mutex<Rounds>>,
}

/// Every key once per round, each round in a new random order.
#[derive(Debug)]
struct Rounds {
    order: Vec<u64>,
    next: usize,
    /// Rounds every key of which has been picked (the round now read is this index).
    completed: u64,
    /// Calls not ended yet, by the round of their key (see [`InFlight`]).
    in_flight: std::collections::BTreeMap<u64, usize>,
    rng: Rng,
}

impl Rounds {
    /// The next key and the round it belongs to.
    fn next_key(&mut self) -> (u64, u64) {
        if self.next == self.order.len() {
            self.shuffle();
            self.next = 0;
            self.completed += 1;
        }
        let key = self.order[self.next];
        self.next += 1;
        (key, self.completed)
    }

    /// Rounds every call of which has ended: all picked, none still in flight.
    fn whole(&self) -> u64 {
        self.in_flight
            .keys()
            .next()
            .map_or(self.completed, |&oldest| oldest.min(self.completed))
    }

    /// Fisher-Yates.
    fn shuffle(&mut self) {
        for i in (1..self.order.len()).rev() {
            let j = self.rng.0.random_range(0..=i);
            self.order.swap(i, j);
        }
    }
}

impl KeyChooser {
    pub(crate) fn new(keys: u64, s: f64) -> Self {
        if s == 0.0 {
            return Self {
                keys,
                cdf: Vec::new(),
                rounds: None,
            };
        }
        let mut cdf = Vec::with_capacity(usize::try_from(keys).unwrap_or(0));
        let mut sum = 0.0;
        for rank in 1..=keys {
            sum += 1.0 / (rank as f64).powf(s);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Self {
            keys,
            cdf,
            rounds: None,
        }
    }

    /// Uniform over `0..keys`, but in rounds: the workers together read every key once per
    /// round, each round in a new order drawn from `seed`. A key lost in a fault is read
    /// again within one round, where uniform picks leave a tail (at 1,500 reads/s over
    /// 20,000 keys, 5% of the lost keys are still unread after 40 s).
    pub(crate) fn in_rounds(keys: u64, seed: u64) -> Self {
        let mut rounds = Rounds {
            order: (0..keys).collect(),
            next: 0,
            completed: 0,
            in_flight: std::collections::BTreeMap::new(),
            rng: Rng::new(seed, u64::MAX),
        };
        rounds.shuffle();
        Self {
            keys,
            cdf: Vec::new(),
            rounds: Some(parking_lot::Mutex::new(rounds)),
        }
    }

    /// The rounds every key of which has been picked; `None` unless in rounds.
    pub(crate) fn rounds_completed(&self) -> Option<u64> {
        self.rounds.as_ref().map(|rounds| rounds.lock().completed)
    }

    /// The rounds every call of which has ended, its refill included (each picked
    /// through [`KeyChooser::pick_call`]); `None` unless in rounds. What a test waits for
    /// when it needs every key read again since some moment, with nothing still on the
    /// way.
    pub(crate) fn rounds_whole(&self) -> Option<u64> {
        self.rounds.as_ref().map(|rounds| rounds.lock().whole())
    }

    /// A key for one call, counted in flight in its round until the returned guard drops.
    pub(crate) fn pick_call(&self, rng: &mut Rng) -> InFlight<'_> {
        let Some(rounds) = &self.rounds else {
            return InFlight {
                index: self.pick(rng),
                round: None,
            };
        };
        let mut state = rounds.lock();
        let (index, round) = state.next_key();
        *state.in_flight.entry(round).or_default() += 1;
        InFlight {
            index,
            round: Some((rounds, round)),
        }
    }

    pub(crate) fn pick(&self, rng: &mut Rng) -> u64 {
        if let Some(rounds) = &self.rounds {
            return rounds.lock().next_key().0;
        }
        if self.cdf.is_empty() {
            return rng.0.random_range(0..self.keys);
        }
        let u: f64 = rng.0.random();
        let rank = self.cdf.partition_point(|&c| c < u) as u64;
        rank.min(self.keys - 1)
    }
}

/// A call's key, counted in flight in its round (in rounds) until dropped.
pub(crate) struct InFlight<'a> {
    /// The key index.
    pub(crate) index: u64,
    round: Option<(&'a parking_lot::Mutex<Rounds>, u64)>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let Some((rounds, round)) = self.round else {
            return;
        };
        let mut state = rounds.lock();
        if let std::collections::btree_map::Entry::Occupied(mut calls) =
            state.in_flight.entry(round)
        {
            *calls.get_mut() -= 1;
            if *calls.get() == 0 {
                calls.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_verifies_against_its_own_key_only() {
        let workload = Workload::new("load", 50);
        let value = workload.batch(7).unwrap();
        assert_eq!(value.num_rows(), 50);
        assert!(workload.verify(7, std::slice::from_ref(&value)).is_ok());
        let other = workload
            .verify(8, std::slice::from_ref(&value))
            .unwrap_err();
        assert!(other.contains("load/8"), "{other}");
        // Split across several batches is still the same value.
        let parts = vec![value.slice(0, 20), value.slice(20, 30)];
        assert!(workload.verify(7, &parts).is_ok());
        // A short answer is caught.
        assert!(workload.verify(7, &[value.slice(0, 49)]).is_err());
    }

    #[test]
    fn one_changed_value_is_corrupt() {
        let workload = Workload::new("load", 10);
        let value = workload.batch(3).unwrap();
        let mut labels: Vec<String> = (0..10).map(|r| format!("load/3#{r}")).collect();
        labels[4] = "load/3#5".into();
        let mut columns = value.columns().to_vec();
        columns[3] = Arc::new(StringArray::from(labels));
        let garbled = RecordBatch::try_new(value.schema(), columns).unwrap();
        let err = workload.verify(3, &[garbled]).unwrap_err();
        assert!(err.contains("label"), "{err}");
    }

    #[test]
    fn tickets_follow_the_documented_format() {
        let workload = Workload::new("load", 1);
        assert_eq!(workload.ticket(12).as_ref(), b"FCT\x01Pload/12");
    }

    #[test]
    fn zipf_prefers_low_ranks_and_is_reproducible() {
        let chooser = KeyChooser::new(1000, 1.0);
        let mut rng = Rng::new(1, 0);
        let picks: Vec<u64> = (0..20_000).map(|_| chooser.pick(&mut rng)).collect();
        assert!(picks.iter().all(|&k| k < 1000));
        let top10 = picks.iter().filter(|&&k| k < 10).count() as f64 / picks.len() as f64;
        // H(10)/H(1000) ≈ 2.93 / 7.49 ≈ 0.39.
        assert!((0.35..0.43).contains(&top10), "{top10}");
        let mut again = Rng::new(1, 0);
        let replay: Vec<u64> = (0..20_000).map(|_| chooser.pick(&mut again)).collect();
        assert_eq!(picks, replay);
        let uniform = KeyChooser::new(10, 0.0);
        let mut rng = Rng::new(2, 0);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[uniform.pick(&mut rng) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }

    #[test]
    fn rounds_read_every_key_once_per_round_in_a_new_order() {
        let chooser = KeyChooser::in_rounds(100, 7);
        let mut rng = Rng::new(1, 0);
        assert_eq!(chooser.rounds_completed(), Some(0));
        let first: Vec<u64> = (0..100).map(|_| chooser.pick(&mut rng)).collect();
        let second: Vec<u64> = (0..100).map(|_| chooser.pick(&mut rng)).collect();
        assert_eq!(chooser.rounds_completed(), Some(1));
        for round in [&first, &second] {
            let mut sorted = round.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        }
        assert_ne!(first, second, "each round in a new order");
        assert_ne!(first, (0..100).collect::<Vec<_>>(), "shuffled");
        chooser.pick(&mut rng);
        assert_eq!(chooser.rounds_completed(), Some(2));
        assert_eq!(KeyChooser::new(10, 0.0).rounds_completed(), None);
    }

    #[test]
    fn a_round_is_whole_once_every_call_of_it_has_ended() {
        let chooser = KeyChooser::in_rounds(4, 7);
        let mut rng = Rng::new(1, 0);
        let slow = chooser.pick_call(&mut rng);
        let quick: Vec<_> = (0..3).map(|_| chooser.pick_call(&mut rng)).collect();
        drop(quick);
        assert_eq!(chooser.rounds_whole(), Some(0), "no round all picked yet");
        // The next round begins while the first one's slow call is still on its way.
        let next = chooser.pick_call(&mut rng);
        assert_eq!(chooser.rounds_completed(), Some(1));
        assert_eq!(
            chooser.rounds_whole(),
            Some(0),
            "a call of round 0 is in flight"
        );
        drop(slow);
        assert_eq!(chooser.rounds_whole(), Some(1));
        drop(next);
        assert_eq!(chooser.rounds_whole(), Some(1), "round 1 is not all picked");
        let uniform = KeyChooser::new(10, 0.0);
        assert!(uniform.pick_call(&mut rng).index < 10);
        assert_eq!(uniform.rounds_whole(), None);
    }
}
