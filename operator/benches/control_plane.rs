//! The control plane at the CRD's limits (issue 15, item 7; docs/benchmarks.md "Control
//! plane at the CRD's limits"), without a cluster: the operator's pure planner and
//! builders driven by `operator::simulate` for a `CacheCluster` of 16 pools × 256 shards
//! with the longest names the schema admits.
//!
//! 1. time of one reconcile pass's pure half (observe from what was read, validate,
//!    plan every pool, build every child, compute the status), settled and in the
//!    middle of a scale-out, min/median/max over N passes, also with every apply body
//!    and the status patch encoded as JSON;
//! 2. bytes of each pool's ring ConfigMap (the API server's 1 MiB limit);
//! 3. bytes of the status, and of the whole object etcd stores with it (etcd's 1.5 MiB
//!    request limit), settled and at their largest during a scale-out;
//! 4. the node's rendezvous lookup (`cache-node/src/routing/ring.rs`) at 64 and 256
//!    members;
//! 5. a scale-out 64 → 256 of every pool, pass by pass under the planner's rules, for
//!    three ways the new pods turn Ready: keys moved (measured with the node's ring over
//!    sampled keys, and the expectation) against the ideal 1 − 64/256, and the passes
//!    until every pool is settled.
//!
//! `cargo bench -p operator --bench control_plane [-- --quick]`
//!
//! The keys moved and the lookup cost are measured with the node's own ring
//! (`cache_node::routing::ring`, the node crate being a dev-dependency of the operator;
//! the operator itself does not depend on it).

#![allow(
    missing_docs,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::print_stdout,
    clippy::cast_precision_loss
)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use crds::node_config::{MemberState, Topology};
use operator::simulate::{
    self, CONFIGMAP_DATA_LIMIT_BYTES, ETCD_REQUEST_LIMIT_BYTES, MAX_POOLS, MAX_SHARDS, Pass,
    SimCluster, Startup,
};

use cache_node::routing::ring::{MemberState as NodeState, Ring, RingMember};

/// Passes until a scale-out must have settled (an hour of simulated time).
const MAX_PASSES: usize = 1_800;

struct Timing {
    min: Duration,
    median: Duration,
    max: Duration,
}

fn time(n: usize, mut f: impl FnMut()) -> Timing {
    f();
    let mut samples: Vec<Duration> = (0..n)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .collect();
    samples.sort();
    Timing {
        min: samples[0],
        median: samples[samples.len() / 2],
        max: samples[samples.len() - 1],
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn kib(bytes: usize) -> String {
    format!("{:.1} KiB", bytes as f64 / 1024.0)
}

fn share(bytes: usize, limit: usize) -> String {
    format!("{:.0}%", bytes as f64 * 100.0 / limit as f64)
}

fn keys(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("Pdashboards/{}/query-{i}", i % 977).into_bytes())
        .collect()
}

/// The node's ring for a published topology.
fn node_ring(topology: &Topology) -> Ring {
    Ring::new(
        topology.version,
        topology
            .members
            .iter()
            .map(|m| {
                let state = match m.state {
                    MemberState::Active => NodeState::Active,
                    MemberState::Joining => NodeState::Joining,
                    MemberState::Draining => NodeState::Draining,
                };
                RingMember::new(m.id.clone(), state)
            })
            .collect(),
    )
}

fn owners(topology: &Topology, keys: &[Vec<u8>]) -> Vec<u32> {
    let ring = node_ring(topology);
    let index: std::collections::HashMap<&str, u32> = topology
        .members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.id.as_str(), u32::try_from(i).unwrap()))
        .collect();
    keys.iter()
        .map(|k| ring.owner(k).map_or(u32::MAX, |id| index[id.as_str()]))
        .collect()
}

/// What a scale-out did, pass by pass.
struct ScaleOut {
    passes: Option<usize>,
    ring_passes: Option<usize>,
    seconds: u64,
    ring_changes: usize,
    key_moving_changes: usize,
    measured: f64,
    expected: f64,
    largest_status: usize,
    largest_stored: usize,
    largest_configmap: usize,
    largest_note: usize,
}

fn scale_out(from: i32, startup: Startup, keys: &[Vec<u8>]) -> ScaleOut {
    let mut sim =
        SimCluster::running(simulate::maximal_cluster(from), simulate::defaults()).unwrap();
    let first = sim.pass().unwrap().rings()[0].clone();
    sim.set_startup(startup);
    sim.edit(|spec| {
        for pool in &mut spec.pools {
            pool.shards = MAX_SHARDS;
        }
    })
    .unwrap();
    let started = sim.now();
    let mut rings = vec![first];
    let (mut passes, mut ring_passes) = (None, None);
    let (mut largest_status, mut largest_stored) = (0, 0);
    let (mut largest_configmap, mut largest_note) = (0, 0);
    for pass in 1..=MAX_PASSES {
        let done: Pass = sim.step().unwrap();
        let ring = done.rings()[0];
        if ring.version != rings.last().unwrap().version {
            rings.push(ring.clone());
        }
        let all_active = done.rings().iter().all(|ring| {
            ring.members.len() == MAX_SHARDS as usize
                && ring.members.iter().all(|m| m.state == MemberState::Active)
        });
        if all_active && ring_passes.is_none() {
            ring_passes = Some(pass);
        }
        largest_status = largest_status.max(simulate::object_bytes(done.status()));
        largest_stored =
            largest_stored.max(simulate::stored_cluster_bytes(sim.cluster(), done.status()));
        for cm in done.configmaps() {
            largest_configmap = largest_configmap.max(simulate::configmap_data_bytes(cm));
        }
        for note in done.ring_change_notes() {
            largest_note = largest_note.max(note.len());
        }
        if done.settled() {
            passes = Some(pass);
            break;
        }
    }
    let mut measured = 0.0;
    let mut expected = 0.0;
    let mut key_moving_changes = 0;
    let mut before = owners(&rings[0], keys);
    let mut before_ids: Vec<&str> = rings[0].members.iter().map(|m| m.id.as_str()).collect();
    for pair in rings.windows(2) {
        let moved = simulate::moved_fraction(&pair[0], &pair[1]);
        expected += moved;
        if moved > 0.0 {
            key_moving_changes += 1;
        }
        let after = owners(&pair[1], keys);
        let after_ids: Vec<&str> = pair[1].members.iter().map(|m| m.id.as_str()).collect();
        let changed = before
            .iter()
            .zip(&after)
            .filter(|(a, b)| before_ids.get(**a as usize) != after_ids.get(**b as usize))
            .count();
        measured += changed as f64 / keys.len() as f64;
        before = after;
        before_ids = after_ids;
    }
    ScaleOut {
        passes,
        ring_passes,
        seconds: sim.now() - started,
        ring_changes: rings.len() - 1,
        key_moving_changes,
        measured,
        expected,
        largest_status,
        largest_stored,
        largest_configmap,
        largest_note,
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 20 } else { 200 };
    let key_count = if quick { 20_000 } else { 200_000 };
    let lookups = if quick { 100_000 } else { 1_000_000 };

    let cc = simulate::maximal_cluster(MAX_SHARDS);
    println!(
        "CacheCluster at the CRD's limits: {MAX_POOLS} pools x {MAX_SHARDS} shards, \
         cluster name {} chars, namespace {} chars, pool names {} chars; {n} passes per timing\n",
        cc.metadata.name.as_deref().unwrap_or_default().len(),
        cc.metadata.namespace.as_deref().unwrap_or_default().len(),
        cc.spec.pools[0].name.len(),
    );
    let settled = SimCluster::running(cc, simulate::defaults()).unwrap();
    let pass = settled.pass().unwrap();
    assert!(pass.settled());

    // Mid scale-out: every pool 64 -> 256, pods turning Ready over a minute, 30 s in.
    let mut scaling =
        SimCluster::running(simulate::maximal_cluster(64), simulate::defaults()).unwrap();
    scaling.set_startup(Startup::Spread {
        first: 10,
        spread: 60,
    });
    scaling
        .edit(|spec| spec.pools.iter_mut().for_each(|p| p.shards = MAX_SHARDS))
        .unwrap();
    for _ in 0..15 {
        scaling.step().unwrap();
    }

    let t_settled = time(n, || drop(black_box(settled.pass().unwrap())));
    let t_encoded = time(n, || {
        let pass = settled.pass().unwrap();
        black_box(pass.encoded_bytes());
    });
    let t_scaling = time(n, || drop(black_box(scaling.pass().unwrap())));

    let configmaps: Vec<usize> = pass
        .configmaps()
        .iter()
        .map(|cm| simulate::configmap_data_bytes(cm))
        .collect();
    let configmap_objects: Vec<usize> = pass
        .configmaps()
        .iter()
        .map(simulate::object_bytes)
        .collect();
    let status = simulate::object_bytes(pass.status());
    let stored = simulate::stored_cluster_bytes(settled.cluster(), pass.status());

    let lookup_keys = keys(lookups);
    let lookup = |members: i32| {
        let topology = pass.rings()[0];
        let mut subset = topology.clone();
        subset.members.truncate(usize::try_from(members).unwrap());
        let ring = node_ring(&subset);
        (0..3)
            .map(|_| {
                let started = Instant::now();
                let mut sink = 0usize;
                for key in &lookup_keys {
                    sink = sink.wrapping_add(ring.owner(black_box(key)).map_or(0, String::len));
                }
                black_box(sink);
                started.elapsed().as_nanos() as f64 / lookups as f64
            })
            .fold(f64::MAX, f64::min)
    };
    let (lookup_64, lookup_256) = (lookup(64), lookup(MAX_SHARDS));

    let sample = keys(key_count);
    let scenarios = [
        ("all Ready 20 s after creation", Startup::Fixed(20)),
        (
            "Ready over 30 s (10-40 s)",
            Startup::Spread {
                first: 10,
                spread: 30,
            },
        ),
        (
            "Ready over 2 min (10-130 s)",
            Startup::Spread {
                first: 10,
                spread: 120,
            },
        ),
    ];
    let outs: Vec<(&str, ScaleOut)> = scenarios
        .iter()
        .map(|(name, startup)| (*name, scale_out(64, *startup, &sample)))
        .collect();
    let worst = |f: fn(&ScaleOut) -> usize| outs.iter().map(|(_, o)| f(o)).max().unwrap_or(0);
    // Every pool 1 -> 256 at once: the most nodes changing, the longest phases.
    let from_one = scale_out(1, Startup::Fixed(4), &sample[..1000]);

    println!("| measure | figure | limit |");
    println!("|---|---|---|");
    for (what, t) in [
        (
            "reconcile pass, pure half, settled (min / median / max ms)",
            &t_settled,
        ),
        (
            "the same + JSON of every apply body and the status patch",
            &t_encoded,
        ),
        (
            "reconcile pass, pure half, mid scale-out 64 → 256",
            &t_scaling,
        ),
    ] {
        println!(
            "| {what} | {} / {} / {} | – |",
            ms(t.min),
            ms(t.median),
            ms(t.max)
        );
    }
    let max_cm = configmaps.iter().copied().max().unwrap_or(0);
    println!(
        "| ring ConfigMap data of one pool, 256 members (largest of {MAX_POOLS}) | {} ({}) | 1 MiB |",
        kib(max_cm),
        share(max_cm, CONFIGMAP_DATA_LIMIT_BYTES)
    );
    println!(
        "| ring ConfigMap data, largest during the scale-outs | {} ({}) | 1 MiB |",
        kib(worst(|o| o.largest_configmap)),
        share(worst(|o| o.largest_configmap), CONFIGMAP_DATA_LIMIT_BYTES)
    );
    println!(
        "| ConfigMaps of all {MAX_POOLS} pools (one object per pool), data / objects | {} / {} | 1 MiB each |",
        kib(configmaps.iter().sum()),
        kib(configmap_objects.iter().sum())
    );
    println!(
        "| status JSON, settled, {} nodes ({} listed) | {} | – |",
        MAX_POOLS * usize::try_from(MAX_SHARDS).unwrap(),
        pass.status()
            .pools
            .iter()
            .map(|p| p.nodes.len())
            .sum::<usize>(),
        kib(status)
    );
    println!(
        "| stored CacheCluster (spec, status, managed fields), settled | {} ({}) | 1.5 MiB |",
        kib(stored),
        share(stored, ETCD_REQUEST_LIMIT_BYTES)
    );
    println!(
        "| status JSON, largest during the scale-outs | {} | – |",
        kib(worst(|o| o.largest_status))
    );
    println!(
        "| stored CacheCluster, largest during the scale-outs | {} ({}) | 1.5 MiB |",
        kib(worst(|o| o.largest_stored)),
        share(worst(|o| o.largest_stored), ETCD_REQUEST_LIMIT_BYTES)
    );
    println!(
        "| status JSON / stored CacheCluster, largest while every pool scales out 1 → 256 | {} / {} ({}) | 1.5 MiB |",
        kib(from_one.largest_status),
        kib(from_one.largest_stored),
        share(from_one.largest_stored, ETCD_REQUEST_LIMIT_BYTES)
    );
    println!(
        "| `RingChanged` event note, longest | {} bytes | 1,024 bytes |",
        worst(|o| o.largest_note).max(from_one.largest_note)
    );
    println!(
        "| node ring lookup `owner()`, 64 / 256 members (ns, best of 3 × {lookups} keys) | {lookup_64:.0} / {lookup_256:.0} | – |"
    );

    println!(
        "\nScale-out of every pool 64 → 256 (ideal: 1 − 64/256 = 0.750 of the keys move); \
         keys moved measured with the node's ring over {key_count} keys of pool 0, one pass every {} s\n",
        simulate::PASS_SECONDS
    );
    println!(
        "| new pods turn Ready | passes until every member is active | passes until settled | simulated time | ring versions (moving keys) | keys moved, measured | expected | × ideal |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, o) in &outs {
        println!(
            "| {name} | {} | {} | {} s | {} ({}) | {:.3} | {:.3} | {:.2} |",
            o.ring_passes
                .map_or_else(|| format!("> {MAX_PASSES}"), |p| p.to_string()),
            o.passes
                .map_or_else(|| format!("> {MAX_PASSES}"), |p| p.to_string()),
            o.seconds,
            o.ring_changes,
            o.key_moving_changes,
            o.measured,
            o.expected,
            o.measured / 0.75
        );
    }
}
