//! The disk tier behind `spec.pools[].persistence`: every entry the node holds is
//! written behind to its volume, and a starting node reloads them before it reports
//! ready (ADR 0010).
//!
//! * **Mirror of memory.** The store reports each change to this tier as a
//!   [`Journal`] (under its lock, so in order); a file exists for an entry the store
//!   holds, and goes when the entry goes (invalidate, replace, eviction, expiry, clear,
//!   migration). The disk therefore holds at most the memory budget, which the CRD
//!   keeps at or below the volume size, and evicts by the store's own policy.
//! * **Write-behind.** A put is acknowledged once it is in memory; the journal only
//!   records "write key K" in a queue holding one pending operation per key (a newer
//!   write or a removal replaces an older one) and one writer thread does the I/O: a
//!   temporary file, `fsync`, `rename`, then one `fsync` per changed shard directory
//!   per batch. A hit never waits for the disk. The queue holds at most
//!   [`MAX_QUEUED_OPS`] keys; past it an operation is dropped and the writer later
//!   reconciles every shard against the store, so a stale file is never left behind.
//! * **Files.** `<root>/<shard>/<name>`: `name` is the first 128 bits of the key's
//!   HMAC-SHA256 under the volume's own secret (`<root>/name-key`, 32 random bytes made
//!   when the volume is first used, readable by the node alone) in hex, `shard` its first
//!   32 bits' remainder by the shard count (16 by default). Keyed, so no client can craft
//!   a key whose file replaces another key's (the ring hash, which named the files
//!   before, is public and 64 bits); the key inside each file is checked against its
//!   name at reload and sweep. Files named by the ring hash (before) are read once at
//!   reload and written again under their new names. Format in [`format`].
//! * **The access clock is the file's mtime.** A write sets it to the entry's last
//!   access; a hit sets it again at most once per `read_debounce`. Reload order
//!   (newest access first) and sliding-TTL expiry across restarts read it; nothing
//!   else records accesses (no manifest to drift from the files).
//! * **Sweep.** Every `sweep_interval` the writer reconciles one shard (a cursor kept
//!   in `<root>/sweep-cursor`): a file whose key the store no longer holds, or holds
//!   as another write, is removed; so is a temporary file left by a crash. The work
//!   per pass is one shard's files, never the whole volume.
//! * **Crash safety.** A crash loses the writes still queued, never a whole file: a
//!   file is either the old one or the new one (rename), and a torn or damaged file
//!   fails its checksum and is removed on reload, never served.
//!
//! Owns the volume's files. Imports the store (as its journal), the ring hash, its
//! instruments (`metrics::DiskMetrics`) and the put assembly it shares with the Flight
//! adapter (`assembly::Assembly`, with arrow-flight's `FlightData`: a reload replays a
//! file's messages the way a DoPut stores them); must not import tonic, `flight/`,
//! `wire/` or `cluster/` (no network I/O).

pub mod format;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use arrow_flight::FlightData;
use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use crate::assembly::Assembly;
use crate::config::{DEFAULT_DISK_READ_DEBOUNCE, DEFAULT_DISK_SHARDS, MAX_DISK_SHARDS};
use crate::key::CacheKey;
use crate::metrics::{DiskMetrics, ReloadLabels};
use crate::routing::ring::key_hash;
use crate::store::{Entry, Journal, JournalSettings, Lifetime, Store, TtlMode};

mod names;
use names::FileNames;

/// Most keys with a pending disk operation. One per key, so this is reached only when
/// the disk falls far behind; see the module docs.
pub const MAX_QUEUED_OPS: usize = 262_144;
/// Default interval between sweeps of one shard.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(10);
/// Prefix of a file being written (renamed when complete).
const TEMP_PREFIX: &str = ".tmp-";
/// The file holding the next shard to sweep.
const CURSOR_FILE: &str = "sweep-cursor";

/// Reads the wall clock (injected so tests can move it).
pub type WallClock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The system's wall clock.
pub fn system_wall_clock() -> WallClock {
    Arc::new(SystemTime::now)
}

/// Where and how the tier keeps its files.
#[derive(Clone)]
pub struct DiskSettings {
    /// The volume's mount point (or any directory the node owns).
    pub root: PathBuf,
    /// Shard subdirectories (1..=256).
    pub shards: u32,
    /// A hit updates the file's mtime only if the last update is at least this old.
    pub read_debounce: Duration,
    /// One shard is reconciled per interval.
    pub sweep_interval: Duration,
    /// The wall clock (file times are wall times).
    pub wall: WallClock,
}

impl std::fmt::Debug for DiskSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskSettings")
            .field("root", &self.root)
            .field("shards", &self.shards)
            .field("read_debounce", &self.read_debounce)
            .field("sweep_interval", &self.sweep_interval)
            .finish_non_exhaustive()
    }
}

impl DiskSettings {
    /// Defaults for `root`.
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            shards: DEFAULT_DISK_SHARDS,
            read_debounce: DEFAULT_DISK_READ_DEBOUNCE,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            wall: system_wall_clock(),
        }
    }
}

/// One pending operation of a key; a newer one replaces an older one.
#[derive(Debug)]
enum Op {
    Write {
        entry: Arc<Entry>,
        last_access: Duration,
    },
    Touch {
        at: Duration,
    },
    Remove,
}

#[derive(Debug, Default)]
struct Queue {
    ops: HashMap<Bytes, Op>,
    /// The writer is applying a batch.
    busy: bool,
    /// An operation was dropped: reconcile every shard.
    resync: bool,
    closed: bool,
}

struct Shared {
    settings: DiskSettings,
    /// Where each key's file lives.
    names: FileNames,
    store: Store,
    queue: Mutex<Queue>,
    work: Condvar,
    idle: Condvar,
    /// No sweep while the reload still reads the files.
    reloading: AtomicBool,
    /// The reload filled the budget: the files after it are not loaded.
    budget_reached: AtomicBool,
    metrics: DiskMetrics,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The disk tier of one node. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DiskTier {
    shared: Arc<Shared>,
}

/// What a reload found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Entries loaded into memory.
    pub loaded: u64,
    /// Bytes of their files.
    pub loaded_bytes: u64,
    /// Files whose entry expired while the node was down (removed).
    pub expired: u64,
    /// Files that were torn, damaged, foreign or unreadable (removed, never served).
    pub corrupt: u64,
    /// Files that did not fit the memory budget or entry cap (removed).
    pub over_budget: u64,
    /// Files whose key was written again since the node started (the newer copy kept).
    pub superseded: u64,
    /// How long it took.
    pub elapsed: Duration,
}

/// A file of the tier, as listed.
#[derive(Debug)]
struct Listed {
    path: PathBuf,
    modified: SystemTime,
    len: u64,
    /// The file's inode: a file the writer has replaced since (a put during the
    /// reload) is a new inode and is not removed by the reload.
    inode: u64,
}

fn shard_name(shard: u32) -> String {
    format!("{shard:02x}")
}

impl DiskTier {
    /// Opens (creating) the tier's directories, becomes `store`'s journal and starts
    /// the writer thread. Call [`reload`](Self::reload) next.
    ///
    /// # Errors
    /// The I/O error if the directories cannot be created, or an invalid shard count.
    pub fn open(settings: DiskSettings, store: Store, metrics: DiskMetrics) -> io::Result<Self> {
        if settings.shards == 0 || settings.shards > MAX_DISK_SHARDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the shard count must be between 1 and {MAX_DISK_SHARDS}"),
            ));
        }
        for shard in 0..settings.shards {
            fs::create_dir_all(settings.root.join(shard_name(shard)))?;
        }
        let names = FileNames::open(&settings.root, settings.shards)?;
        let read_debounce = settings.read_debounce;
        let shared = Arc::new(Shared {
            settings,
            names,
            store: store.clone(),
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
            reloading: AtomicBool::new(true),
            budget_reached: AtomicBool::new(false),
            metrics,
        });
        store.set_journal(JournalSettings {
            journal: Arc::clone(&shared) as Arc<dyn Journal>,
            read_debounce,
        });
        let writer = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("flightcache-disk".into())
            .spawn(move || writer.run_writer())?;
        Ok(Self { shared })
    }

    /// The directory files live under.
    pub fn root(&self) -> &Path {
        &self.shared.settings.root
    }

    /// Where `key`'s file lives.
    pub fn path_of(&self, key: &[u8]) -> PathBuf {
        self.shared.path_of(key)
    }

    /// Loads the entries on the volume into the store, newest access first, up to the
    /// store's byte budget and entry cap; removes what it does not load (expired,
    /// damaged, over budget). Blocking: run it on a blocking thread. Puts that arrive
    /// meanwhile win over the files of the same keys.
    pub fn reload(&self) -> ReloadReport {
        let report = self.shared.reload();
        self.shared.reloading.store(false, Ordering::Release);
        report
    }

    /// Waits until every queued operation is on disk, at most `timeout`. Returns whether
    /// the queue drained.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut queue = self.shared.queue.lock();
        while !queue.ops.is_empty() || queue.busy || queue.resync {
            if self
                .shared
                .idle
                .wait_until(&mut queue, deadline)
                .timed_out()
            {
                return queue.ops.is_empty() && !queue.busy;
            }
        }
        true
    }

    /// Stops the writer once the queue is drained (the queue no longer accepts work).
    pub fn close(&self) {
        self.shared.queue.lock().closed = true;
        self.shared.work.notify_all();
    }

    /// Keys with a pending operation.
    pub fn backlog(&self) -> usize {
        self.shared.queue.lock().ops.len()
    }
}

impl Journal for Shared {
    fn stored(&self, key: &Bytes, entry: &Arc<Entry>, last_access: Duration) {
        self.enqueue(
            key,
            Op::Write {
                entry: Arc::clone(entry),
                last_access,
            },
        );
    }

    fn removed(&self, key: &Bytes) {
        self.enqueue(key, Op::Remove);
    }

    fn read(&self, key: &Bytes, now: Duration) {
        let mut queue = self.queue.lock();
        let room = queue.ops.len() < MAX_QUEUED_OPS;
        match queue.ops.get_mut(key) {
            Some(Op::Write { last_access, .. }) => *last_access = now,
            Some(Op::Touch { at }) => *at = now,
            Some(Op::Remove) => {}
            None if room => {
                queue.ops.insert(key.clone(), Op::Touch { at: now });
                self.work.notify_one();
            }
            // A lost access-time update only makes the entry look older on reload.
            None => {
                self.metrics.dropped.inc();
            }
        }
        self.metrics.backlog.set(queue.ops.len() as i64);
    }
}

impl Shared {
    fn path_of(&self, key: &[u8]) -> PathBuf {
        let (shard, name) = self.names.of(key);
        self.settings.root.join(shard_name(shard)).join(name)
    }

    /// Where the ring hash used to put `key`'s file (read once at reload, then renamed).
    fn legacy_path_of(&self, key: &[u8]) -> PathBuf {
        let hash = key_hash(key);
        let shard = u32::try_from(hash % u64::from(self.settings.shards)).unwrap_or(0);
        self.settings
            .root
            .join(shard_name(shard))
            .join(format!("{hash:016x}"))
    }

    fn enqueue(&self, key: &Bytes, op: Op) {
        let mut queue = self.queue.lock();
        if queue.closed {
            return;
        }
        if queue.ops.len() >= MAX_QUEUED_OPS && !queue.ops.contains_key(key) {
            // The file of this key may now be stale or orphaned: reconcile every shard.
            queue.resync = true;
            self.metrics.dropped.inc();
        } else {
            queue.ops.insert(key.clone(), op);
        }
        self.metrics.backlog.set(queue.ops.len() as i64);
        self.work.notify_one();
    }

    /// The wall time of a store-clock instant.
    fn wall_of(&self, at: Duration) -> SystemTime {
        let now = self.store.now();
        let wall = (self.settings.wall)();
        wall.checked_sub(now.saturating_sub(at)).unwrap_or(wall)
    }

    fn run_writer(self: Arc<Self>) {
        let mut next_sweep = Instant::now() + self.settings.sweep_interval;
        loop {
            let (ops, resync) = {
                let mut queue = self.queue.lock();
                loop {
                    if !queue.ops.is_empty() || queue.resync {
                        break;
                    }
                    if queue.closed {
                        self.idle.notify_all();
                        return;
                    }
                    if Instant::now() >= next_sweep {
                        break;
                    }
                    let _ = self.work.wait_until(&mut queue, next_sweep);
                }
                queue.busy = true;
                let ops = std::mem::take(&mut queue.ops);
                self.metrics.backlog.set(0);
                (ops, std::mem::take(&mut queue.resync))
            };
            let mut changed_shards = HashSet::new();
            for (key, op) in ops {
                let path = self.path_of(&key);
                if let Some(dir) = path.parent() {
                    changed_shards.insert(dir.to_path_buf());
                }
                let result = match op {
                    Op::Write { entry, last_access } => {
                        self.write(&key, &entry, last_access, &path)
                    }
                    Op::Touch { at } => self.touch(&path, at),
                    Op::Remove => self.remove(&path),
                };
                if let Err(err) = result {
                    self.metrics.errors.inc();
                    tracing::warn!(path = %path.display(), error = %err, "disk tier operation failed");
                }
            }
            for dir in changed_shards {
                if let Err(err) = fs::File::open(&dir).and_then(|dir| dir.sync_all()) {
                    self.metrics.errors.inc();
                    tracing::warn!(dir = %dir.display(), error = %err, "cannot sync a shard directory");
                }
            }
            let reloading = self.reloading.load(Ordering::Acquire);
            if resync && !reloading {
                for shard in 0..self.settings.shards {
                    self.reconcile_shard(shard);
                }
            } else if resync {
                // Reconcile once the reload is done.
                self.queue.lock().resync = true;
            }
            if Instant::now() >= next_sweep {
                if !reloading {
                    self.sweep_next_shard();
                }
                next_sweep = Instant::now() + self.settings.sweep_interval;
            }
            let mut queue = self.queue.lock();
            queue.busy = false;
            if queue.ops.is_empty() {
                self.idle.notify_all();
            }
        }
    }

    fn write(
        &self,
        key: &Bytes,
        entry: &Entry,
        last_access: Duration,
        path: &Path,
    ) -> io::Result<()> {
        let encoded = format::encode(key, entry, self.wall_of(entry.created_at()));
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or_default();
        let temp = path.with_file_name(format!("{TEMP_PREFIX}{name}"));
        let written = (|| {
            let mut file = fs::File::create(&temp)?;
            for part in &encoded.parts {
                file.write_all(part)?;
            }
            file.set_modified(self.wall_of(last_access))?;
            file.sync_data()?;
            fs::rename(&temp, path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temp);
        }
        written?;
        self.metrics.writes.inc();
        self.metrics.written_bytes.inc_by(encoded.len);
        Ok(())
    }

    fn touch(&self, path: &Path, at: Duration) -> io::Result<()> {
        match fs::File::options().write(true).open(path) {
            Ok(file) => {
                file.set_modified(self.wall_of(at))?;
                self.metrics.touches.inc();
                Ok(())
            }
            // Not written yet or already gone: nothing to date.
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(err),
        }
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        match fs::remove_file(path) {
            Ok(()) => {
                self.metrics.removes.inc();
                Ok(())
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// Reconciles the shard the cursor names and moves the cursor on.
    fn sweep_next_shard(&self) {
        let cursor_path = self.settings.root.join(CURSOR_FILE);
        let shard = fs::read_to_string(&cursor_path)
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok())
            .filter(|shard| *shard < self.settings.shards)
            .unwrap_or(0);
        self.reconcile_shard(shard);
        let next = (shard + 1) % self.settings.shards;
        let temp = self
            .settings
            .root
            .join(format!("{TEMP_PREFIX}{CURSOR_FILE}"));
        let saved =
            fs::write(&temp, next.to_string()).and_then(|()| fs::rename(&temp, &cursor_path));
        if let Err(err) = saved {
            self.metrics.errors.inc();
            tracing::warn!(error = %err, "cannot save the sweep cursor");
        }
    }

    /// Removes every file of `shard` that is not the store's current entry of its key,
    /// and every temporary file left by a crash. Runs on the writer thread, so no write
    /// of the same key races it.
    fn reconcile_shard(&self, shard: u32) {
        let dir = self.settings.root.join(shard_name(shard));
        let Ok(listing) = fs::read_dir(&dir) else {
            return;
        };
        for item in listing.flatten() {
            let path = item.path();
            let name = item.file_name().to_string_lossy().into_owned();
            let keep = names::is_entry_name(&name) && self.is_current(&path);
            if !keep && fs::remove_file(&path).is_ok() {
                self.metrics.swept.inc();
            }
        }
    }

    /// Whether the file at `path` holds the entry the store holds under its key, and
    /// is where that key's file belongs.
    fn is_current(&self, path: &Path) -> bool {
        let Ok(head) = read_head(path) else {
            return false;
        };
        if self.path_of(&head.key) != path {
            return false;
        }
        let Some(entry) = self.store.peek(&head.key) else {
            return false;
        };
        // The same write: creation times agree to the millisecond.
        let created = self.wall_of(entry.created_at());
        let apart = created
            .duration_since(head.created)
            .or_else(|err| Ok::<_, ()>(err.duration()))
            .unwrap_or(Duration::MAX);
        apart < Duration::from_millis(2)
    }

    fn list_files(&self, report: &mut ReloadReport) -> Vec<Listed> {
        let mut files = Vec::new();
        for shard in 0..self.settings.shards {
            let Ok(listing) = fs::read_dir(self.settings.root.join(shard_name(shard))) else {
                continue;
            };
            for item in listing.flatten() {
                let path = item.path();
                let name = item.file_name().to_string_lossy().into_owned();
                let metadata = item.metadata();
                match metadata {
                    Ok(metadata)
                        if metadata.is_file()
                            && (names::is_entry_name(&name) || names::is_legacy_name(&name)) =>
                    {
                        files.push(Listed {
                            modified: metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                            len: metadata.len(),
                            inode: std::os::unix::fs::MetadataExt::ino(&metadata),
                            path,
                        });
                    }
                    Ok(metadata) if metadata.is_dir() => {}
                    // A temporary file: a crashed write's, or one the writer is writing
                    // right now (puts go on during the reload). The sweep, which runs on
                    // the writer's thread, removes those left by a crash.
                    _ if name.starts_with(TEMP_PREFIX) => {}
                    _ => {
                        report.corrupt += 1;
                        let _ = fs::remove_file(&path);
                    }
                }
            }
        }
        files
    }

    fn reload(&self) -> ReloadReport {
        let started = Instant::now();
        let mut report = ReloadReport::default();
        let mut files = self.list_files(&mut report);
        files.sort_by_key(|file| std::cmp::Reverse(file.modified));
        let config = self.store.config();
        let mut loaded_keys = Vec::new();
        for listed in files {
            let outcome = self.reload_one(&listed, &config);
            let label = match &outcome {
                Reloaded::Loaded { key, .. } => {
                    report.loaded += 1;
                    report.loaded_bytes += listed.len;
                    self.metrics.reload_bytes.inc_by(listed.len);
                    loaded_keys.push(key.clone());
                    "loaded"
                }
                Reloaded::Superseded => {
                    report.superseded += 1;
                    "superseded"
                }
                Reloaded::Expired => {
                    report.expired += 1;
                    "expired"
                }
                Reloaded::OverBudget => {
                    report.over_budget += 1;
                    "over_budget"
                }
                Reloaded::Corrupt(reason) => {
                    report.corrupt += 1;
                    tracing::warn!(path = %listed.path.display(), %reason, "skipping a damaged entry file");
                    "corrupt"
                }
            };
            self.metrics
                .reload_entries
                .get_or_create(&ReloadLabels { outcome: label })
                .inc();
            let unchanged = fs::metadata(&listed.path)
                .is_ok_and(|now| std::os::unix::fs::MetadataExt::ino(&now) == listed.inode);
            let kept = matches!(
                outcome,
                Reloaded::Loaded { legacy: false, .. } | Reloaded::Superseded
            );
            if !kept && unchanged {
                let _ = fs::remove_file(&listed.path);
            }
        }
        // Loaded newest first; the store's recency order must say the same.
        loaded_keys.reverse();
        self.store.touch_in_order(&loaded_keys);
        report.elapsed = started.elapsed();
        self.metrics
            .reload_seconds
            .set(report.elapsed.as_secs_f64());
        tracing::info!(?report, "disk tier reloaded");
        report
    }

    fn reload_one(&self, listed: &Listed, config: &crate::store::StoreConfig) -> Reloaded {
        if self.budget_reached.load(Ordering::Acquire) {
            return Reloaded::OverBudget;
        }
        let stats = self.store.stats();
        // A put holds a message's received bytes and its sealed copy at once: room for
        // twice the file, so loading never evicts what was loaded before.
        if stats.entries >= config.max_entries
            || stats
                .used_bytes
                .saturating_add(stats.reserved_bytes)
                .saturating_add(stats.allocator_bytes)
                .saturating_add(listed.len.saturating_mul(2))
                > config.budget_bytes
        {
            return Reloaded::OverBudget;
        }
        let file = match read_file(&listed.path, config.max_entry_bytes) {
            Ok(file) => file,
            Err(err) => return Reloaded::Corrupt(err.to_string()),
        };
        let decoded = match format::decode(file) {
            Ok(decoded) => decoded,
            Err(err) => return Reloaded::Corrupt(err.to_string()),
        };
        let head = decoded.head;
        // A file named by the ring hash (before the keyed names): loaded, and written
        // again under its keyed name (not `journaled`), its old file removed.
        let legacy = self.path_of(&head.key) != listed.path;
        if legacy && self.legacy_path_of(&head.key) != listed.path {
            return Reloaded::Corrupt("the file's name does not match its key".into());
        }
        let key = match CacheKey::try_from_store_bytes(&head.key) {
            Ok(key) => key,
            Err(err) => return Reloaded::Corrupt(err.to_string()),
        };
        let now = (self.settings.wall)();
        let ttl = head.ttl_override.unwrap_or(config.ttl);
        let anchor = match config.ttl_mode {
            TtlMode::Absolute => head.created,
            TtlMode::Sliding => listed.modified.max(head.created),
        };
        if anchor + ttl <= now {
            return Reloaded::Expired;
        }
        let since = |then: SystemTime| now.duration_since(then).unwrap_or_default();
        let tags = match crate::tags::entry_tags(decoded.tags) {
            Ok(tags) => tags,
            Err(err) => return Reloaded::Corrupt(format!("its tags: {err}")),
        };
        let lifetime = Lifetime {
            ttl_override: head.ttl_override,
            age: since(head.created),
            idle: since(listed.modified.max(head.created)),
            remaining: None,
            if_absent: true,
            journaled: !legacy,
            tags,
        };
        let mut assembly = Assembly::new(
            self.store.begin_put(head.key.clone()),
            config.max_entry_bytes,
        );
        for message in decoded.messages {
            let message = FlightData {
                data_header: message.header,
                data_body: message.body,
                ..FlightData::default()
            };
            if let Err(err) = assembly.accept(message, &key) {
                return Reloaded::Corrupt(assembly.fail(err).to_string());
            }
        }
        match assembly.commit(lifetime, &key) {
            Ok((outcome, _, _)) if outcome.kept_existing => Reloaded::Superseded,
            Ok((outcome, _, _)) if outcome.evicted > 0 => {
                // The budget is reached (the entry weighs more than its file): stop here.
                self.budget_reached.store(true, Ordering::Release);
                Reloaded::Loaded {
                    key: head.key,
                    legacy,
                }
            }
            Ok(_) => Reloaded::Loaded {
                key: head.key,
                legacy,
            },
            Err(crate::error::Error::OverBudget { .. }) => Reloaded::OverBudget,
            Err(err) => Reloaded::Corrupt(err.to_string()),
        }
    }
}

/// What became of one file on reload.
enum Reloaded {
    /// In the store; `legacy`: from a file named by the ring hash, queued to be written
    /// under its keyed name.
    Loaded {
        key: Bytes,
        legacy: bool,
    },
    Superseded,
    Expired,
    OverBudget,
    Corrupt(String),
}

/// Reads a whole entry file, refusing one larger than an entry could be.
fn read_file(path: &Path, max_entry_bytes: u64) -> io::Result<Bytes> {
    let mut file = fs::File::open(path)?;
    let len = file.metadata()?.len();
    // The key, headers and framing come on top of the entry's weight.
    let limit = max_entry_bytes.saturating_add(2 << 20);
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{len} bytes, more than an entry may hold ({limit})"),
        ));
    }
    let mut buffer = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.read_to_end(&mut buffer)?;
    Ok(Bytes::from(buffer))
}

/// Reads the header and key of an entry file.
fn read_head(path: &Path) -> Result<format::Head, Box<dyn std::error::Error>> {
    let mut file = fs::File::open(path)?;
    let mut fixed = vec![0u8; format::FIXED_HEADER_BYTES];
    file.read_exact(&mut fixed)?;
    let key_len = u32::from_le_bytes([fixed[12], fixed[13], fixed[14], fixed[15]]);
    if key_len > format::MAX_KEY_BYTES {
        return Err(format::FormatError::Bounds {
            field: "key length",
            value: key_len.into(),
        }
        .into());
    }
    let mut key = vec![0u8; key_len as usize];
    file.read_exact(&mut key)?;
    fixed.extend_from_slice(&key);
    Ok(format::decode_head(&fixed)?)
}
