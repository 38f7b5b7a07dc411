//! Ring measurements for `docs/benchmarks.md`: balance, keys moved on a membership change
//! and lookup cost of the rendezvous ring, next to a 50-vnode consistent-hash ring (the
//! groupcache default) over the same keys.
//!
//! Run: `cargo run --release -p cache-node --example ring_bench`

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Instant;

use cache_node::routing::ring::{MemberState, Ring, RingMember, key_hash};

const KEYS: usize = 1_000_000;
const VNODES: usize = 50;

/// A classic consistent-hash ring: `VNODES` points per member on a 64-bit circle.
struct VnodeRing {
    points: Vec<(u64, usize)>,
    ids: Vec<String>,
}

impl VnodeRing {
    fn new(ids: &[String]) -> Self {
        let mut points: Vec<(u64, usize)> = ids
            .iter()
            .enumerate()
            .flat_map(|(index, id)| {
                (0..VNODES).map(move |v| (key_hash(format!("{v}{id}").as_bytes()), index))
            })
            .collect();
        points.sort_unstable();
        Self {
            points,
            ids: ids.to_vec(),
        }
    }

    fn owner(&self, key: &[u8]) -> &str {
        let hash = key_hash(key);
        let at = self.points.partition_point(|&(point, _)| point < hash);
        let (_, index) = self.points[at % self.points.len()];
        &self.ids[index]
    }
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("analytics-hot-{i}")).collect()
}

fn rendezvous(n: usize) -> Ring {
    Ring::new(
        1,
        ids(n)
            .into_iter()
            .map(|id| RingMember::new(id, MemberState::Active))
            .collect(),
    )
}

fn keys() -> Vec<Vec<u8>> {
    (0..KEYS)
        .map(|i| format!("Pdashboards/{}/query-{i}", i % 977).into_bytes())
        .collect()
}

fn max_over_mean<'a>(owners: impl Iterator<Item = &'a str>, n: usize) -> f64 {
    let mut load: HashMap<&str, usize> = HashMap::new();
    for owner in owners {
        *load.entry(owner).or_default() += 1;
    }
    let max = load.values().copied().max().unwrap_or(0);
    max as f64 / (KEYS as f64 / n as f64)
}

fn moved<'a>(before: impl Iterator<Item = &'a str>, after: impl Iterator<Item = &'a str>) -> f64 {
    let changed = before.zip(after).filter(|(a, b)| a != b).count();
    changed as f64 / KEYS as f64
}

fn main() {
    let keys = keys();
    println!("keys: {KEYS}");
    println!("\nmax/mean keys per member");
    println!("| members | rendezvous | 50-vnode ring |");
    println!("|---|---|---|");
    for n in [3, 8, 16, 64] {
        let ring = rendezvous(n);
        let vnodes = VnodeRing::new(&ids(n));
        let r = max_over_mean(keys.iter().map(|k| ring.owner(k).unwrap().as_str()), n);
        let v = max_over_mean(keys.iter().map(|k| vnodes.owner(k)), n);
        println!("| {n} | {r:.3} | {v:.3} |");
    }

    println!("\nkeys moved (ideal 1/9 = 0.1111)");
    println!("| change | rendezvous | 50-vnode ring |");
    println!("|---|---|---|");
    let (r8, r9) = (rendezvous(8), rendezvous(9));
    let (v8, v9) = (VnodeRing::new(&ids(8)), VnodeRing::new(&ids(9)));
    let r8_owners: Vec<&str> = keys.iter().map(|k| r8.owner(k).unwrap().as_str()).collect();
    let r9_owners: Vec<&str> = keys.iter().map(|k| r9.owner(k).unwrap().as_str()).collect();
    let v8_owners: Vec<&str> = keys.iter().map(|k| v8.owner(k)).collect();
    let v9_owners: Vec<&str> = keys.iter().map(|k| v9.owner(k)).collect();
    let up_r = moved(r8_owners.iter().copied(), r9_owners.iter().copied());
    let up_v = moved(v8_owners.iter().copied(), v9_owners.iter().copied());
    println!(
        "| 8 → 9 | {up_r:.4} ({:.3}× ideal) | {up_v:.4} ({:.3}× ideal) |",
        up_r * 9.0,
        up_v * 9.0
    );
    let down_r = moved(r9_owners.iter().copied(), r8_owners.iter().copied());
    let down_v = moved(v9_owners.iter().copied(), v8_owners.iter().copied());
    println!(
        "| 9 → 8 | {down_r:.4} ({:.3}× ideal) | {down_v:.4} ({:.3}× ideal) |",
        down_r * 9.0,
        down_v * 9.0
    );

    println!("\nlookup cost (ns per owner(), 1M keys of ~30 bytes)");
    println!("| members | rendezvous | 50-vnode ring |");
    println!("|---|---|---|");
    for n in [3, 8, 64] {
        let ring = rendezvous(n);
        let vnodes = VnodeRing::new(&ids(n));
        let best = |f: &dyn Fn(&[u8]) -> usize| {
            (0..3)
                .map(|_| {
                    let started = Instant::now();
                    let mut sink = 0usize;
                    for key in &keys {
                        sink = sink.wrapping_add(f(black_box(key)));
                    }
                    black_box(sink);
                    started.elapsed().as_nanos() as f64 / KEYS as f64
                })
                .fold(f64::MAX, f64::min)
        };
        let r = best(&|k| ring.owner(k).map_or(0, String::len));
        let v = best(&|k| vnodes.owner(k).len());
        println!("| {n} | {r:.0} | {v:.0} |");
    }
}
