//! The disk tier against the persistence spike's figures, side by side in one run
//! (issue 13, docs/benchmarks.md "Disk tier"):
//!
//! 1. recording an access per read: touching the file's mtime on every read, the node's
//!    debounced touch (through the store's journal), SQLite UPSERT in autocommit and in
//!    batches of 1,000;
//! 2. finding what expired among 10k..200k entries: a full scan of the files' mtimes,
//!    one shard of 16 (what the node's sweep does per pass, by mtime and by reading the
//!    headers as the node's reconcile does), an SQLite index;
//! 3. the node's own figures: write-behind throughput, reload time and rate for 1 GiB of
//!    entries, and the hit ratio right after the restart.
//!
//! `cargo bench -p cache-node --bench disk_tier [-- --quick] [-- --drop-caches]`;
//! `--drop-caches` (root) empties the page cache before the reload, so it reads from the
//! device as after a machine restart.

#![allow(
    missing_docs,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::print_stdout,
    clippy::cast_precision_loss
)]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use bytes::Bytes;
use cache_node::key::CacheKey;
use cache_node::metrics::DiskMetrics;
use cache_node::persist::{DiskSettings, DiskTier};
use cache_node::store::{EvictionPolicy, Store, StoreConfig, SystemClock, TtlMode, batch_weight};

const SHARDS: u64 = 16;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(duration: Duration) -> String {
    format!("{:.1}", duration.as_secs_f64() * 1e3)
}

fn us(duration: Duration) -> String {
    format!("{:.2}", duration.as_secs_f64() * 1e6)
}

/// `n` small files in 16 shard directories, a tenth of them with an mtime an hour old.
fn make_files(root: &Path, n: u64) -> Vec<PathBuf> {
    let now = SystemTime::now();
    let mut paths = Vec::with_capacity(n as usize);
    for shard in 0..SHARDS {
        fs::create_dir_all(root.join(format!("{shard:02x}"))).unwrap();
    }
    for i in 0..n {
        let path = root
            .join(format!("{:02x}", i % SHARDS))
            .join(format!("{i:016x}"));
        let file = fs::File::create(&path).unwrap();
        // Header-sized content: what the reconcile pass reads.
        fs::write(&path, [0u8; 96]).unwrap();
        let when = if i % 10 == 0 {
            now - Duration::from_secs(3600)
        } else {
            now
        };
        file.set_modified(when).unwrap();
        paths.push(path);
    }
    paths
}

/// Expired files (mtime older than `cutoff`) in the given shard directories, by stat.
fn scan_mtimes(root: &Path, shards: &[u64], cutoff: SystemTime) -> usize {
    let mut expired = 0;
    for shard in shards {
        for item in fs::read_dir(root.join(format!("{shard:02x}")))
            .unwrap()
            .flatten()
        {
            if item.metadata().unwrap().modified().unwrap() < cutoff {
                expired += 1;
            }
        }
    }
    expired
}

/// Reads the first 64 bytes of every file of one shard (the node's reconcile pass reads
/// each file's header to learn its key).
fn read_headers(root: &Path, shard: u64) -> usize {
    use std::io::Read as _;
    let mut read = 0;
    let mut buffer = [0u8; 64];
    for item in fs::read_dir(root.join(format!("{shard:02x}")))
        .unwrap()
        .flatten()
    {
        let mut file = fs::File::open(item.path()).unwrap();
        file.read_exact(&mut buffer).unwrap();
        read += 1;
    }
    read
}

fn sqlite_table(path: &Path, n: u64) -> rusqlite::Connection {
    let db = rusqlite::Connection::open(path).unwrap();
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
         CREATE TABLE IF NOT EXISTS access(key INTEGER PRIMARY KEY, last_access INTEGER NOT NULL);
         CREATE INDEX IF NOT EXISTS by_access ON access(last_access);",
    )
    .unwrap();
    let now = 10_000_000i64;
    let tx = db.unchecked_transaction().unwrap();
    {
        let mut insert = tx
            .prepare("INSERT OR REPLACE INTO access(key, last_access) VALUES (?1, ?2)")
            .unwrap();
        for i in 0..n {
            let at = if i % 10 == 0 { now - 3600 } else { now };
            insert.execute((i as i64, at)).unwrap();
        }
    }
    tx.commit().unwrap();
    db
}

fn sweep_table(quick: bool) {
    println!("\n### Finding expired entries (10% expired), median of 5, ms\n");
    println!(
        "| entries | full scan (stat every file) | one shard of 16 (stat) | one shard of 16 (read headers, the node's reconcile) | SQLite index (WAL) |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let sizes: &[u64] = if quick {
        &[10_000]
    } else {
        &[10_000, 50_000, 100_000, 200_000]
    };
    for &n in sizes {
        let dir = tempfile::tempdir().unwrap();
        make_files(dir.path(), n);
        let cutoff = SystemTime::now() - Duration::from_secs(1800);
        let all: Vec<u64> = (0..SHARDS).collect();
        let time = |run: &mut dyn FnMut() -> usize| {
            run(); // warm the dentry and inode caches, as a running node has them
            median(
                (0..5)
                    .map(|_| {
                        let started = Instant::now();
                        std::hint::black_box(run());
                        started.elapsed()
                    })
                    .collect(),
            )
        };
        let full = time(&mut || scan_mtimes(dir.path(), &all, cutoff));
        let shard = time(&mut || scan_mtimes(dir.path(), &[3], cutoff));
        let headers = time(&mut || read_headers(dir.path(), 3));
        let db = sqlite_table(&dir.path().join("access.db"), n);
        let mut query = db
            .prepare("SELECT key FROM access WHERE last_access < ?1")
            .unwrap();
        let indexed = time(&mut || {
            query
                .query_map([10_000_000i64 - 1800], |row| row.get::<_, i64>(0))
                .unwrap()
                .count()
        });
        println!(
            "| {n} | {} | {} | {} | {} |",
            ms(full),
            ms(shard),
            ms(headers),
            ms(indexed)
        );
    }
}

fn small_batch(seed: i64) -> RecordBatch {
    let column: ArrayRef = Arc::new(Int64Array::from_iter_values(seed..seed + 16));
    RecordBatch::try_from_iter([("n", column)]).unwrap()
}

/// The store key of the k-th benchmark entry (a path key, as clients write them).
fn key(k: u64) -> Bytes {
    CacheKey::Path(format!("bench/{k}")).to_store_bytes()
}

fn put(store: &Store, key: Bytes, batch: &RecordBatch) {
    let mut pending = store.begin_put(key);
    pending.reserve(batch_weight(batch)).unwrap();
    pending
        .commit(batch.schema(), vec![batch.clone()], None)
        .unwrap();
}

fn store(budget: u64, max_entry: u64) -> Store {
    Store::new(
        StoreConfig {
            max_entries: 1_000_000,
            budget_bytes: budget,
            max_entry_bytes: max_entry,
            ttl: Duration::from_secs(3600),
            ttl_mode: TtlMode::Sliding,
            eviction: EvictionPolicy::Tinylfu,
        },
        Arc::new(SystemClock::new()),
    )
    .unwrap()
}

fn access_table(quick: bool) {
    let keys: u64 = 10_000;
    let reads: u64 = if quick { 20_000 } else { 100_000 };
    println!("\n### Recording an access per read ({reads} reads over {keys} keys), µs per read\n");
    println!("| method | µs per read | note |");
    println!("|---|---:|---|");
    let pick = |i: u64| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) % keys;

    // Touch the file's mtime on every read.
    let dir = tempfile::tempdir().unwrap();
    let paths = make_files(dir.path(), keys);
    let started = Instant::now();
    for i in 0..reads {
        let file = fs::File::options()
            .write(true)
            .open(&paths[pick(i) as usize])
            .unwrap();
        file.set_modified(SystemTime::now()).unwrap();
    }
    let touch = started.elapsed() / reads as u32;
    println!(
        "| touch the mtime on every read | {} | open + futimens |",
        us(touch)
    );

    // The node: hits through the store with the disk tier as its journal (30 s debounce).
    let node_dir = tempfile::tempdir().unwrap();
    let memory = store(1 << 30, 1 << 20);
    let disk = DiskTier::open(
        DiskSettings::new(node_dir.path().to_path_buf()),
        memory.clone(),
        DiskMetrics::default(),
    )
    .unwrap();
    disk.reload();
    let batch = small_batch(0);
    for k in 0..keys {
        put(&memory, key(k), &batch);
    }
    assert!(disk.flush(Duration::from_secs(120)));
    let plain = store(1 << 30, 1 << 20);
    for k in 0..keys {
        put(&plain, key(k), &batch);
    }
    let names: Vec<Bytes> = (0..keys).map(key).collect();
    let time_reads = |store: &Store| {
        let started = Instant::now();
        for i in 0..reads {
            std::hint::black_box(store.get(&names[pick(i) as usize]));
        }
        started.elapsed()
    };
    let without = time_reads(&plain) / reads as u32;
    let with_reads = time_reads(&memory);
    // Each key's first hit after its write is within the debounce, so none is touched;
    // a read every 30 s per key would be.
    assert!(disk.flush(Duration::from_secs(120)));
    let with = with_reads / reads as u32;
    println!(
        "| the node: store hit + debounced touch (30 s) | {} | {} without a disk tier; at most one mtime update per key per 30 s on the writer thread, never on the read |",
        us(with),
        us(without)
    );
    disk.close();

    // SQLite, one UPSERT per read in its own transaction, then batched.
    let db = sqlite_table(&dir.path().join("access.db"), keys);
    let upsert = "INSERT INTO access(key, last_access) VALUES (?1, ?2) \
                  ON CONFLICT(key) DO UPDATE SET last_access = excluded.last_access";
    let mut statement = db.prepare(upsert).unwrap();
    let autocommit_reads = reads.min(20_000);
    let started = Instant::now();
    for i in 0..autocommit_reads {
        statement
            .execute((pick(i) as i64, 10_000_001 + i as i64))
            .unwrap();
    }
    let autocommit = started.elapsed() / autocommit_reads as u32;
    drop(statement);
    println!(
        "| SQLite UPSERT, autocommit | {} | WAL, synchronous=NORMAL |",
        us(autocommit)
    );
    let started = Instant::now();
    for chunk in 0..reads / 1_000 {
        let tx = db.unchecked_transaction().unwrap();
        {
            let mut statement = tx.prepare_cached(upsert).unwrap();
            for i in chunk * 1_000..(chunk + 1) * 1_000 {
                statement
                    .execute((pick(i) as i64, 20_000_000 + i as i64))
                    .unwrap();
            }
        }
        tx.commit().unwrap();
    }
    let batched = started.elapsed() / reads as u32;
    println!(
        "| SQLite UPSERT, batches of 1,000 | {} | one transaction per batch |",
        us(batched)
    );
}

/// About 1 MiB of Int64 values.
fn mib_batch(seed: i64) -> RecordBatch {
    let column: ArrayRef = Arc::new(Int64Array::from_iter_values(seed..seed + 131_072));
    RecordBatch::try_from_iter([("n", column)]).unwrap()
}

fn node_table(quick: bool, drop_caches: bool) {
    let entries: u64 = if quick { 64 } else { 1_024 };
    println!("\n### The node's disk tier ({entries} entries of 1 MiB)\n");
    let dir = tempfile::tempdir().unwrap();
    let budget = (entries + 64) << 20;
    let memory = store(budget, 4 << 20);
    let disk = DiskTier::open(
        DiskSettings::new(dir.path().to_path_buf()),
        memory.clone(),
        DiskMetrics::default(),
    )
    .unwrap();
    disk.reload();
    let batches: Vec<RecordBatch> = (0..8).map(|i| mib_batch(i * 1_000_000)).collect();
    let started = Instant::now();
    for k in 0..entries {
        put(&memory, key(k), &batches[(k % 8) as usize]);
    }
    let acknowledged = started.elapsed();
    assert!(disk.flush(Duration::from_secs(600)));
    let on_disk = started.elapsed();
    let bytes: u64 = fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|shard| shard.path().is_dir())
        .flat_map(|shard| fs::read_dir(shard.path()).unwrap().flatten())
        .map(|file| file.metadata().unwrap().len())
        .sum();
    disk.close();
    drop(memory);
    let mb = bytes as f64 / 1e6;
    println!("| figure | value |");
    println!("|---|---:|");
    println!(
        "| puts acknowledged (in memory) | {} ms, {:.0} MB/s |",
        ms(acknowledged),
        mb / acknowledged.as_secs_f64()
    );
    println!(
        "| write-behind: all on disk (fsync + rename per file) | {} ms, {:.0} MB/s |",
        ms(on_disk),
        mb / on_disk.as_secs_f64()
    );

    if drop_caches {
        let _ = std::process::Command::new("sync").status();
        fs::write("/proc/sys/vm/drop_caches", "3").expect("--drop-caches needs root");
    }
    let restarted = store(budget, 4 << 20);
    let disk = DiskTier::open(
        DiskSettings::new(dir.path().to_path_buf()),
        restarted.clone(),
        DiskMetrics::default(),
    )
    .unwrap();
    let report = disk.reload();
    println!(
        "| reload of {:.0} MB ({}) | {} ms, {:.0} MB/s, {} entries |",
        mb,
        if drop_caches {
            "page cache dropped first"
        } else {
            "files in the page cache"
        },
        ms(report.elapsed),
        mb / report.elapsed.as_secs_f64(),
        report.loaded
    );
    assert_eq!(
        (report.corrupt, report.expired, report.over_budget),
        (0, 0, 0),
        "{report:?}"
    );
    let hits = (0..entries)
        .filter(|&k| restarted.get(&key(k)).is_some())
        .count();
    println!(
        "| hit ratio right after the restart | {:.4} ({hits} of {entries}) |",
        hits as f64 / entries as f64
    );
    disk.close();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|arg| arg == "--quick");
    let drop_caches = args.iter().any(|arg| arg == "--drop-caches");
    println!(
        "## Disk tier benchmark{}",
        if quick { " (quick)" } else { "" }
    );
    access_table(quick);
    sweep_table(quick);
    node_table(quick, drop_caches);
}
