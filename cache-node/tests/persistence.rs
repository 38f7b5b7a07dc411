//! The disk tier (issue 13): write-behind, reload, the mtime access clock, damaged files,
//! the sweep, and a node process killed with SIGKILL during a write storm.

#![allow(missing_docs, clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use arrow_array::{ArrayRef, DictionaryArray, RecordBatch, StringArray, types::Int32Type};
use bytes::Bytes;
use cache_node::key::CacheKey;
use cache_node::metrics::DiskMetrics;
use cache_node::persist::{DiskSettings, DiskTier, ReloadReport, WallClock};
use cache_node::store::{EvictionPolicy, ManualClock, Store, StoreConfig, TtlMode, batch_weight};

const MINUTE: Duration = Duration::from_secs(60);

/// A wall clock the test moves, starting at a fixed date.
#[derive(Clone)]
struct TestWall {
    offset_ms: Arc<AtomicU64>,
}

impl TestWall {
    fn new() -> Self {
        Self {
            offset_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn clock(&self) -> WallClock {
        let offset = Arc::clone(&self.offset_ms);
        Arc::new(move || {
            SystemTime::UNIX_EPOCH
                + Duration::from_secs(1_800_000_000)
                + Duration::from_millis(offset.load(Ordering::Relaxed))
        })
    }

    fn advance(&self, by: Duration) {
        self.offset_ms
            .fetch_add(by.as_millis() as u64, Ordering::Relaxed);
    }
}

/// One node's memory and disk over a directory; its store clock and the wall move
/// together through [`Node::advance`].
struct Node {
    store: Store,
    disk: DiskTier,
    clock: Arc<ManualClock>,
    wall: TestWall,
}

fn config(ttl: Duration, mode: TtlMode) -> StoreConfig {
    StoreConfig {
        max_entries: 1_000,
        budget_bytes: 64 << 20,
        max_entry_bytes: 8 << 20,
        ttl,
        ttl_mode: mode,
        eviction: EvictionPolicy::Lru,
    }
}

fn open(dir: &Path, config: StoreConfig, wall: &TestWall) -> Node {
    let clock = Arc::new(ManualClock::new());
    // A store clock far from zero, as in production, so ages can be subtracted.
    clock.advance(Duration::from_secs(10 * 24 * 3600));
    let store = Store::new(config, clock.clone()).unwrap();
    let settings = DiskSettings {
        read_debounce: Duration::from_secs(1),
        sweep_interval: Duration::from_millis(20),
        wall: wall.clock(),
        ..DiskSettings::new(dir.to_path_buf())
    };
    let disk = DiskTier::open(settings, store.clone(), DiskMetrics::default()).unwrap();
    Node {
        store,
        disk,
        clock,
        wall: wall.clone(),
    }
}

impl Node {
    fn advance(&self, by: Duration) {
        self.clock.advance(by);
        self.wall.advance(by);
    }

    fn put(&self, key: &str, batch: &RecordBatch) {
        let mut put = self.store.begin_put(store_key(key));
        put.reserve(batch_weight(batch)).unwrap();
        put.commit(batch.schema(), vec![batch.clone()], None)
            .unwrap();
    }

    fn flush(&self) {
        assert!(self.disk.flush(Duration::from_secs(10)), "the queue drains");
    }

    /// Flushes and stops the writer, as a node does at SIGTERM.
    fn stop(self) {
        self.flush();
        self.disk.close();
    }
}

fn store_key(key: &str) -> Bytes {
    CacheKey::Path(key.to_owned()).to_store_bytes()
}

fn batch(rows: usize, seed: i64) -> RecordBatch {
    common::sample_batch(rows, seed)
}

/// Every file the tier holds (not the sweep cursor).
fn entry_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for shard in fs::read_dir(dir).unwrap().flatten() {
        if shard.path().is_dir() {
            files.extend(
                fs::read_dir(shard.path())
                    .unwrap()
                    .flatten()
                    .map(|f| f.path()),
            );
        }
    }
    files.sort();
    files
}

/// The stored IPC bytes of an entry, as a DoGet sends them.
fn wire_bytes(store: &Store, key: &str) -> Vec<(Bytes, Bytes)> {
    let entry = store.peek(&store_key(key)).expect("entry present");
    entry
        .wire_messages()
        .iter()
        .map(|message| (message.ipc_header(), message.body().clone()))
        .collect()
}

fn reload(node: &Node) -> ReloadReport {
    node.disk.reload()
}

#[test]
fn a_restarted_node_reloads_every_entry_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let wall = TestWall::new();
    let before = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    // Plain columns, several batches, and a dictionary column (stored hydrated).
    let keys: Vec<String> = (0..40).map(|i| format!("sales/{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        before.put(key, &batch(100 + i * 37, i as i64));
    }
    let values: ArrayRef = Arc::new(StringArray::from(vec!["north", "south"]));
    let dictionary: ArrayRef =
        Arc::new(DictionaryArray::<Int32Type>::try_new(vec![0, 1, 1, 0].into(), values).unwrap());
    let dict_batch = RecordBatch::try_from_iter([("region", dictionary)]).unwrap();
    before.put("regions", &dict_batch);
    let mut expected: Vec<_> = keys
        .iter()
        .map(|key| wire_bytes(&before.store, key))
        .collect();
    expected.push(wire_bytes(&before.store, "regions"));
    before.stop();
    assert_eq!(entry_files(dir.path()).len(), 41, "one file per entry");

    wall.advance(Duration::from_secs(5));
    let after = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    let report = reload(&after);
    assert_eq!(report.loaded, 41, "{report:?}");
    assert_eq!(
        (report.corrupt, report.expired, report.over_budget),
        (0, 0, 0)
    );
    let mut found: Vec<_> = keys
        .iter()
        .map(|key| wire_bytes(&after.store, key))
        .collect();
    found.push(wire_bytes(&after.store, "regions"));
    assert!(
        found == expected,
        "every reloaded entry's stored frames are byte-identical"
    );
    let reloaded = after.store.get(&store_key("sales/7")).unwrap();
    assert_eq!(reloaded.batches()[0], batch(100 + 7 * 37, 7));
    // The reload wrote nothing back: the files were already there.
    after.flush();
    assert_eq!(entry_files(dir.path()).len(), 41);
}

#[test]
fn tags_survive_a_restart_and_a_tag_invalidation_then_removes_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let wall = TestWall::new();
    let before = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    for i in 0..6 {
        let tags: cache_node::store::Tags = if i % 2 == 0 {
            vec![Arc::<str>::from("sales.orders"), Arc::from("tenant:acme")].into()
        } else {
            cache_node::store::Tags::default()
        };
        let data = batch(10, i);
        let mut put = before.store.begin_put(store_key(&format!("t/{i}")));
        put.reserve(batch_weight(&data)).unwrap();
        let lifetime = cache_node::store::Lifetime {
            tags,
            ..Default::default()
        };
        put.commit_with(data.schema(), vec![data], lifetime)
            .unwrap();
    }
    before.stop();

    let after = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    assert_eq!(reload(&after).loaded, 6);
    let reloaded = after.store.peek(&store_key("t/2")).unwrap();
    let tags: Vec<&str> = reloaded.tags().iter().map(|tag| &**tag).collect();
    assert_eq!(tags, ["sales.orders", "tenant:acme"]);
    assert!(
        after
            .store
            .peek(&store_key("t/1"))
            .unwrap()
            .tags()
            .is_empty()
    );
    assert_eq!(after.store.invalidate_tags(&[Arc::from("tenant:acme")]), 3);
    after.flush();
    assert_eq!(
        entry_files(dir.path()).len(),
        3,
        "the tagged entries' files are gone"
    );
}

#[test]
fn invalidate_replace_eviction_and_clear_remove_or_rewrite_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let wall = TestWall::new();
    let mut small = config(MINUTE * 60, TtlMode::Absolute);
    small.max_entries = 3;
    let node = open(dir.path(), small.clone(), &wall);
    for i in 0..3 {
        node.put(&format!("k{i}"), &batch(10, i));
    }
    node.flush();
    assert_eq!(entry_files(dir.path()).len(), 3);
    assert!(node.store.invalidate(&store_key("k0")));
    node.flush();
    assert!(
        !node.disk.path_of(&store_key("k0")).exists(),
        "invalidate removes the file"
    );
    node.put("k1", &batch(20, 100)); // replace
    node.put("k3", &batch(10, 3));
    node.put("k4", &batch(10, 4)); // evicts the least recently used (k2)
    node.flush();
    assert!(
        !node.disk.path_of(&store_key("k2")).exists(),
        "eviction removes the file"
    );
    assert_eq!(entry_files(dir.path()).len(), 3);
    node.stop();

    let again = open(dir.path(), small.clone(), &wall);
    assert_eq!(reload(&again).loaded, 3);
    let replaced = again.store.get(&store_key("k1")).unwrap();
    assert_eq!(
        replaced.batches()[0],
        batch(20, 100),
        "the replacement, not the first write"
    );
    assert_eq!(again.store.clear(), 3);
    again.stop();
    assert!(
        entry_files(dir.path()).is_empty(),
        "clear removes every file"
    );
}

#[test]
fn entries_whose_ttl_passed_while_the_node_was_down_are_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let wall = TestWall::new();
    let node = open(dir.path(), config(MINUTE, TtlMode::Absolute), &wall);
    node.put("short", &batch(10, 1));
    node.advance(Duration::from_secs(30));
    node.put("later", &batch(10, 2));
    node.stop();

    wall.advance(Duration::from_secs(45)); // "short" is 75 s old, "later" 45 s
    let after = open(dir.path(), config(MINUTE, TtlMode::Absolute), &wall);
    let report = reload(&after);
    assert_eq!((report.loaded, report.expired), (1, 1), "{report:?}");
    assert!(after.store.get(&store_key("short")).is_none());
    let later = after.store.peek(&store_key("later")).unwrap();
    // Its age came along: 15 s of its minute are left, not a whole new minute.
    assert_eq!(
        later.expires_at() - after.store.now(),
        Duration::from_secs(15)
    );
    assert_eq!(
        entry_files(dir.path()).len(),
        1,
        "the expired file is removed"
    );
}

#[test]
fn sliding_ttl_survives_a_restart_through_the_file_mtime() {
    let dir = tempfile::tempdir().unwrap();
    let wall = TestWall::new();
    let node = open(dir.path(), config(MINUTE, TtlMode::Sliding), &wall);
    node.put("read", &batch(10, 1));
    node.put("unread", &batch(10, 2));
    node.advance(Duration::from_secs(50));
    assert!(
        node.store.get(&store_key("read")).is_some(),
        "a hit at 50 s"
    );
    node.stop();

    wall.advance(Duration::from_secs(30)); // 80 s after the writes, 30 s after the hit
    let after = open(dir.path(), config(MINUTE, TtlMode::Sliding), &wall);
    let report = reload(&after);
    assert_eq!((report.loaded, report.expired), (1, 1), "{report:?}");
    let read = after
        .store
        .peek(&store_key("read"))
        .expect("the read entry lives on");
    assert_eq!(
        read.expires_at() - after.store.now(),
        Duration::from_secs(30)
    );
    assert!(after.store.peek(&store_key("unread")).is_none());
}

#[test]
fn hits_update_the_access_time_at_most_once_per_debounce() {
    let dir = tempfile::tempdir().unwrap();
    let wall = TestWall::new();
    let node = open(dir.path(), config(MINUTE * 60, TtlMode::Sliding), &wall);
    node.put("hot", &batch(10, 1));
    node.flush();
    let path = node.disk.path_of(&store_key("hot"));
    let written = fs::metadata(&path).unwrap().modified().unwrap();
    // Hits within the debounce (1 s in these tests) leave the file alone.
    node.advance(Duration::from_millis(400));
    node.store.get(&store_key("hot")).unwrap();
    node.flush();
    assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), written);
    node.advance(Duration::from_millis(700));
    node.store.get(&store_key("hot")).unwrap();
    node.flush();
    let touched = fs::metadata(&path).unwrap().modified().unwrap();
    assert_eq!(
        touched.duration_since(written).unwrap(),
        Duration::from_millis(1100)
    );
}

#[test]
fn damaged_truncated_and_foreign_files_are_skipped_counted_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let wall = TestWall::new();
    let node = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    for i in 0..6 {
        node.put(&format!("k{i}"), &batch(200, i));
    }
    node.stop();
    let file = |i: usize| node_path(dir.path(), &format!("k{i}"));
    // k0: torn (truncated mid-body); k1: a flipped byte in a body; k2: garbage.
    let torn = fs::read(file(0)).unwrap();
    fs::write(file(0), &torn[..torn.len() / 2]).unwrap();
    let mut flipped = fs::read(file(1)).unwrap();
    let at = flipped.len() - 10;
    flipped[at] ^= 0x40;
    fs::write(file(1), flipped).unwrap();
    fs::write(file(2), b"not an entry at all").unwrap();
    // k3's bytes under another key's name: a file that does not hold what it names.
    let misplaced = node_path(dir.path(), "elsewhere");
    fs::copy(file(3), &misplaced).unwrap();
    // A crashed write's temporary file.
    let temp = file(4).with_file_name(".tmp-0000000000000000");
    fs::write(&temp, b"partial").unwrap();

    let after = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    let report = reload(&after);
    assert_eq!(report.corrupt, 4, "{report:?}");
    assert_eq!(report.loaded, 3, "k3, k4, k5");
    for i in 0..3 {
        assert!(after.store.get(&store_key(&format!("k{i}"))).is_none());
        assert!(!file(i).exists(), "a damaged file is removed");
    }
    assert!(!misplaced.exists());
    // The crashed write's temporary file goes with the next sweep of its shard.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while temp.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !temp.exists(),
        "the sweep removes a crashed write's temporary file"
    );
    for i in 3..6 {
        let entry = after.store.get(&store_key(&format!("k{i}"))).unwrap();
        assert_eq!(entry.batches()[0], batch(200, i as i64));
    }
}

/// Where the tier keeps `key` under `dir` (same rule as `DiskTier::path_of`).
fn node_path(dir: &Path, key: &str) -> std::path::PathBuf {
    let wall = TestWall::new();
    let store = Store::new(
        config(MINUTE, TtlMode::Absolute),
        Arc::new(ManualClock::new()),
    )
    .unwrap();
    let settings = DiskSettings {
        wall: wall.clock(),
        ..DiskSettings::new(dir.to_path_buf())
    };
    let probe = DiskTier::open(settings, store, DiskMetrics::default()).unwrap();
    let path = probe.path_of(&store_key(key));
    probe.close();
    path
}

#[test]
fn files_are_named_by_a_secret_of_the_volume_and_files_named_by_the_ring_hash_are_renamed() {
    use cache_node::routing::ring::key_hash;
    let dir = tempfile::tempdir().unwrap();
    let wall = TestWall::new();
    let node = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    for i in 0..8 {
        node.put(&format!("k{i}"), &batch(100, i));
    }
    node.stop();
    // The names are not the public ring hash: a client cannot aim a key at another's
    // file by its hash.
    let shards = DiskSettings::new(dir.path().to_path_buf()).shards;
    let legacy_of = |key: &str| {
        let hash = key_hash(&store_key(key));
        dir.path()
            .join(format!("{:02x}", hash % u64::from(shards)))
            .join(format!("{hash:016x}"))
    };
    for i in 0..8 {
        let keyed = node_path(dir.path(), &format!("k{i}"));
        assert!(keyed.exists());
        assert_ne!(keyed, legacy_of(&format!("k{i}")));
    }
    // A volume from before the keyed names: each file under its ring-hash name.
    for i in 0..8 {
        let key = format!("k{i}");
        fs::rename(node_path(dir.path(), &key), legacy_of(&key)).unwrap();
    }
    let after = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    let report = reload(&after);
    assert_eq!(report.loaded, 8, "{report:?}");
    assert_eq!(report.corrupt, 0, "{report:?}");
    after.flush();
    for i in 0..8 {
        let key = format!("k{i}");
        assert_eq!(
            after.store.get(&store_key(&key)).unwrap().batches()[0],
            batch(100, i as i64)
        );
        assert!(
            node_path(dir.path(), &key).exists(),
            "{key} written under its keyed name"
        );
        assert!(!legacy_of(&key).exists(), "{key}'s old file removed");
    }
    after.stop();
    // And the renamed volume reloads as it is.
    let again = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    let report = reload(&again);
    assert_eq!((report.loaded, report.corrupt), (8, 0), "{report:?}");
    assert_eq!(entry_files(dir.path()).len(), 8);
}

#[test]
fn a_smaller_budget_reloads_the_most_recently_used_entries_first() {
    let dir = tempfile::tempdir().unwrap();
    let wall = TestWall::new();
    let node = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    for i in 0..10 {
        node.put(&format!("k{i}"), &batch(2_000, i));
        node.advance(Duration::from_secs(1));
    }
    // Read the oldest three last: they are now the most recently used.
    for i in 0..3 {
        node.advance(Duration::from_secs(2));
        node.store.get(&store_key(&format!("k{i}"))).unwrap();
    }
    let one = node.store.peek(&store_key("k0")).unwrap().weight_bytes();
    node.stop();

    let mut tight = config(MINUTE * 60, TtlMode::Absolute);
    // Four entries, plus room for the fifth's received and sealed bytes at once is
    // not there: the reload stops at four.
    tight.budget_bytes = one * 5 + one / 2;
    tight.max_entry_bytes = one * 2;
    let after = open(dir.path(), tight, &wall);
    let report = reload(&after);
    assert_eq!((report.loaded, report.over_budget), (4, 6), "{report:?}");
    for key in ["k0", "k1", "k2", "k9"] {
        assert!(
            after.store.peek(&store_key(key)).is_some(),
            "{key} is among the newest"
        );
    }
    assert_eq!(
        entry_files(dir.path()).len(),
        4,
        "what did not fit is removed"
    );
    // The recency order follows the access times: the next eviction takes k9, the
    // least recently used of the four, not one loaded later.
    after.put("new1", &batch(2_000, 98));
    after.put("new2", &batch(2_000, 99));
    assert_eq!(after.store.stats().evictions.size, 1);
    assert!(after.store.peek(&store_key("k9")).is_none());
    for key in ["k0", "k1", "k2"] {
        assert!(after.store.peek(&store_key(key)).is_some(), "{key} stays");
    }
}

#[test]
fn a_live_ttl_change_applies_to_reloaded_entries() {
    let dir = tempfile::tempdir().unwrap();
    let wall = TestWall::new();
    let node = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    node.put("k", &batch(10, 1));
    node.stop();
    wall.advance(Duration::from_secs(20));
    let after = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    assert_eq!(reload(&after).loaded, 1);
    after
        .store
        .reconfigure(config(MINUTE, TtlMode::Absolute))
        .unwrap();
    let entry = after.store.peek(&store_key("k")).unwrap();
    assert_eq!(
        entry.expires_at() - after.store.now(),
        Duration::from_secs(40)
    );
}

#[test]
fn a_put_that_arrives_during_the_reload_wins_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let wall = TestWall::new();
    let node = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    node.put("k", &batch(10, 1));
    node.stop();
    let after = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    after.put("k", &batch(10, 2)); // e.g. handed back by a peer before the reload
    let report = reload(&after);
    assert_eq!((report.loaded, report.superseded), (0, 1), "{report:?}");
    assert_eq!(
        after.store.get(&store_key("k")).unwrap().batches()[0],
        batch(10, 2)
    );
    after.stop();
    let again = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    reload(&again);
    assert_eq!(
        again.store.get(&store_key("k")).unwrap().batches()[0],
        batch(10, 2),
        "the newer write is the one on disk"
    );
}

#[test]
fn the_sweep_removes_files_the_store_no_longer_holds() {
    let wall = TestWall::new();
    let elsewhere = tempfile::tempdir().unwrap();
    let other = open(
        elsewhere.path(),
        config(MINUTE * 60, TtlMode::Absolute),
        &wall,
    );
    for i in 0..20 {
        other.put(&format!("k{i}"), &batch(10, i));
    }
    other.stop();

    let dir = tempfile::tempdir().unwrap();
    let node = open(dir.path(), config(MINUTE * 60, TtlMode::Absolute), &wall);
    assert_eq!(reload(&node).loaded, 0);
    let mut keep = Vec::new();
    for i in 0..5 {
        node.put(&format!("fresh{i}"), &batch(10, i));
        keep.push(node.disk.path_of(&store_key(&format!("fresh{i}"))));
    }
    node.flush();
    // Files this node's store does not hold (as if their removals had been lost), and a
    // crashed write's temporary file.
    for file in entry_files(elsewhere.path()) {
        let relative = file.strip_prefix(elsewhere.path()).unwrap();
        fs::copy(&file, dir.path().join(relative)).unwrap();
    }
    fs::write(keep[0].with_file_name(".tmp-00000000000000ff"), b"partial").unwrap();
    // One shard per sweep interval (20 ms here): every shard within a second.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while entry_files(dir.path()).len() > 5 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut left = entry_files(dir.path());
    left.sort();
    keep.sort();
    assert_eq!(left, keep, "only the held entries' files stay");
    let cursor = fs::read_to_string(dir.path().join("sweep-cursor")).unwrap();
    assert!(
        cursor.trim().parse::<u32>().unwrap() < 16,
        "the cursor names a shard: {cursor}"
    );
}

/// A node process on loopback ports with `--data-dir dir`.
struct NodeProcess {
    child: std::process::Child,
    flight: std::net::SocketAddr,
    metrics: std::net::SocketAddr,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl NodeProcess {
    /// Starts the node binary and waits until `/readyz` answers 200 (the reload done).
    async fn start(dir: &Path) -> Self {
        let flight: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let metrics: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_flightcache-node"))
            .args([
                "--listen",
                &flight.to_string(),
                "--metrics-listen",
                &metrics.to_string(),
            ])
            .args([
                "--data-dir",
                dir.to_str().unwrap(),
                "--memory-budget",
                "128MiB",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "the node reports ready within 30 s"
            );
            if tokio::net::TcpStream::connect(metrics).await.is_ok()
                && common::http_get(metrics, "/readyz")
                    .await
                    .starts_with("HTTP/1.1 200")
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            child,
            flight,
            metrics,
        }
    }

    async fn client(&self) -> arrow_flight::FlightClient {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", self.flight))
            .unwrap()
            .connect()
            .await
            .unwrap();
        arrow_flight::FlightClient::new(channel)
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The batch written as version `version` of key `k`: its first id is its seed, so a
/// reader can tell which write it got and check every byte of it.
fn versioned(k: usize, version: usize) -> RecordBatch {
    batch(500 + k, (k * 1_000_000 + version) as i64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_during_a_write_storm_restarts_with_intact_entries_only() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path()).await;
    const KEYS: usize = 100;
    let stop = std::time::Instant::now() + Duration::from_millis(1_500);
    let mut writers = Vec::new();
    for worker in 0..4 {
        let mut client = node.client().await;
        writers.push(tokio::spawn(async move {
            let mut version = 0;
            while std::time::Instant::now() < stop {
                for k in (worker..KEYS).step_by(4) {
                    let key = format!("storm/{k}");
                    common::put(
                        &mut client,
                        common::path(&key),
                        vec![versioned(k, version)],
                        None,
                    )
                    .await
                    .unwrap();
                }
                version += 1;
            }
            version
        }));
    }
    let mut versions = Vec::new();
    for writer in writers {
        versions.push(writer.await.unwrap());
    }
    // SIGKILL: nothing is flushed, whatever is queued is lost.
    let mut node = node;
    node.child.kill().unwrap();
    node.child.wait().unwrap();
    drop(node);

    let restarted = NodeProcess::start(dir.path()).await;
    let mut client = restarted.client().await;
    let mut present = 0;
    for k in 0..KEYS {
        match common::get(&mut client, common::path_ticket(&format!("storm/{k}"))).await {
            Ok(batches) => {
                present += 1;
                assert_eq!(batches.len(), 1, "storm/{k}");
                let ids = batches[0]
                    .column(0)
                    .as_any()
                    .downcast_ref::<arrow_array::Int64Array>()
                    .unwrap();
                let seed = ids.value(0) as usize;
                let (key, version) = (seed / 1_000_000, seed % 1_000_000);
                assert_eq!(key, k, "storm/{k} holds its own data");
                assert!(version < versions[k % 4], "a version that was written");
                assert_eq!(
                    batches[0],
                    versioned(k, version),
                    "storm/{k} v{version} is intact"
                );
            }
            Err(err) => assert_eq!(common::status(err).code(), tonic::Code::NotFound),
        }
    }
    let metrics = common::scrape(restarted.metrics).await;
    let corrupt = metrics
        .lines()
        .find(|line| {
            line.starts_with("flightcache_node_disk_reload_entries_total{outcome=\"corrupt\"}")
        })
        .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .unwrap_or(0.0);
    eprintln!("after SIGKILL: {present} of {KEYS} keys back, {corrupt} damaged files");
    assert_eq!(corrupt, 0.0, "a kill leaves whole files or none (rename)");
    assert!(
        present >= KEYS / 2,
        "most keys were on disk before the kill: {present}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_with_sigterm_comes_back_with_every_entry() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path()).await;
    let mut client = node.client().await;
    for k in 0..50 {
        common::put(
            &mut client,
            common::path(&format!("warm/{k}")),
            vec![versioned(k, 1)],
            None,
        )
        .await
        .unwrap();
    }
    let mut node = node;
    // SIGTERM: the node flushes its queue before it exits.
    let pid = node.child.id().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    node.child.wait().unwrap();
    drop(node);

    let restarted = NodeProcess::start(dir.path()).await;
    let mut client = restarted.client().await;
    for k in 0..50 {
        let batches = common::get(&mut client, common::path_ticket(&format!("warm/{k}")))
            .await
            .unwrap_or_else(|err| panic!("warm/{k} is back after a restart: {err}"));
        assert_eq!(batches, vec![versioned(k, 1)]);
    }
    let metrics = common::scrape(restarted.metrics).await;
    assert!(
        metrics.contains("flightcache_node_disk_reload_entries_total{outcome=\"loaded\"} 50"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_reload_deadline_a_node_is_ready_and_keeps_loading() {
    const ENTRIES: u64 = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let wall = TestWall::new();
    let mut roomy = config(MINUTE * 60, TtlMode::Absolute);
    roomy.max_entries = ENTRIES;
    let writer = open(dir.path(), roomy, &wall);
    for i in 0..ENTRIES {
        writer.put(&format!("k{i}"), &batch(20, i as i64));
    }
    writer.stop();

    // A deadline far shorter than loading 3,000 files takes: the node goes Ready with
    // part of its entries and loads the rest in the background.
    let data_dir = dir.path().to_str().unwrap();
    let node = common::start_node(&["--data-dir", data_dir, "--reload-deadline", "1ms"]).await;
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while !common::http_get(node.metrics_addr, "/readyz")
        .await
        .starts_with("HTTP/1.1 200")
    {
        assert!(std::time::Instant::now() < give_up, "ready within 60 s");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let at_ready = node.store.stats().entries;
    assert!(
        at_ready < ENTRIES,
        "ready before the reload ended ({at_ready} of {ENTRIES} loaded)"
    );
    while node.store.stats().entries < ENTRIES {
        assert!(
            std::time::Instant::now() < give_up,
            "the reload goes on to the end ({} of {ENTRIES})",
            node.store.stats().entries
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node.shutdown().await.unwrap();
}
