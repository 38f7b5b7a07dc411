//! The run: connect, warm the hot set, run the cache-aside workers for the duration while
//! closing one interval per `--report-every` (a stdout line each, the summary file
//! rewritten), follow the phase file, stop on the deadline or SIGTERM/SIGINT, and write
//! the final summary. Does network and file I/O.
//!
//! Owns: the run's timeline and its output files. Imports `cli`, `record`, `target` and
//! `workload`; calls the cache only through `target`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::cli::{self, Cli};
use crate::record::{CallError, Outcome, Recorder, Report};
use crate::target::{Caller, Got, Target, TargetTls};
use crate::workload::{KeyChooser, Rng, Workload};

/// How often the phase file is re-read.
const PHASE_POLL: Duration = Duration::from_millis(100);
/// Pause of a worker after a failed call, so a dead target is not hammered in a tight loop.
const ERROR_PAUSE: Duration = Duration::from_millis(20);
/// Version of the summary's layout.
const SCHEMA_VERSION: u64 = 1;

/// The summary file (and the summary printed without `--out`).
#[derive(Debug, Clone, Serialize)]
struct Summary {
    tool: &'static str,
    schema_version: u64,
    started_at: String,
    config: RunConfig,
    finished: bool,
    /// Absent until the warm phase ends; null with `--no-warm`.
    #[serde(skip_serializing_if = "Option::is_none")]
    warm: Option<Option<Warm>>,
    /// `duration` or `signal`, once finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    stopped_by: Option<&'static str>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    report: Option<Report>,
}

/// The run's settings, as given.
#[derive(Debug, Clone, Serialize)]
struct RunConfig {
    target: String,
    mode: &'static str,
    keys: u64,
    rows: usize,
    concurrency: u64,
    /// `--rate`: reads per second, all workers together; null for a closed loop.
    rate_per_s: Option<u64>,
    duration_s: f64,
    report_every_s: f64,
    zipf_s: f64,
    /// Every key once per round (`--rounds`).
    rounds: bool,
    seed: u64,
    prefix: String,
    timeout_s: f64,
    warm: bool,
    phase_file: Option<String>,
}

/// What the warm phase put.
#[derive(Debug, Clone, Serialize)]
struct Warm {
    keys: u64,
    puts: u64,
    errors: u64,
    errors_by_code: std::collections::BTreeMap<&'static str, u64>,
    seconds: f64,
    error_samples: Vec<String>,
}

/// Why a run could not be done.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    /// A flag value clap cannot check alone.
    #[error("{0}")]
    Usage(String),
    /// The target did not answer at start.
    #[error("cannot reach {target}: {code}: {message}")]
    Connect {
        target: String,
        code: &'static str,
        message: String,
    },
    /// The summary could not be written.
    #[error("cannot write the summary to {}", path.display())]
    WriteSummary {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl LoadError {
    /// The process exit code: 2 for usage errors (as clap), 1 otherwise.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => 2,
            Self::Connect { .. } | Self::WriteSummary { .. } => 1,
        }
    }
}

/// Everything the workers share.
struct Shared {
    workload: Workload,
    chooser: KeyChooser,
    recorder: Recorder,
    timeout: Duration,
    seed: u64,
}

/// Runs the load described by `cli`.
///
/// # Errors
/// [`LoadError`] for a bad target, a target that cannot be reached at start, or a summary
/// that cannot be written. Call failures during the run are counted, never returned.
pub(crate) async fn run(cli: Cli) -> Result<(), LoadError> {
    let Cli {
        target: address,
        token,
        keys,
        rows,
        concurrency,
        rate,
        duration,
        ring,
        report_every,
        out,
        phase_file,
        no_warm,
        prefix,
        zipf,
        rounds,
        seed,
        timeout,
        connect_timeout,
        tls_ca,
        tls_client_cert,
        tls_client_key,
    } = cli;
    cli::check_target(&address).map_err(LoadError::Usage)?;
    cli::check_key_choice(zipf, rounds).map_err(LoadError::Usage)?;
    if ring && tls_ca.is_some() {
        return Err(LoadError::Usage(
            "--tls-ca works with a direct target, not with --ring".into(),
        ));
    }
    let read = |flag: &str, path: std::path::PathBuf| {
        std::fs::read(&path)
            .map_err(|err| LoadError::Usage(format!("{flag} {}: {err}", path.display())))
    };
    let identity = match (tls_client_cert, tls_client_key) {
        (Some(cert), Some(key)) => Some((
            read("--tls-client-cert", cert)?,
            read("--tls-client-key", key)?,
        )),
        _ => None,
    };
    let tls = tls_ca
        .map(|path| read("--tls-ca", path))
        .transpose()?
        .map(|ca| TargetTls { ca, identity });
    let rows = usize::try_from(rows).map_err(|err| LoadError::Usage(err.to_string()))?;
    let started_at = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
    let config = RunConfig {
        target: address.clone(),
        mode: if ring { "ring" } else { "direct" },
        keys,
        rows,
        concurrency,
        rate_per_s: rate,
        duration_s: duration.as_secs_f64(),
        report_every_s: report_every.as_secs_f64(),
        zipf_s: zipf,
        rounds,
        seed,
        prefix: prefix.clone(),
        timeout_s: timeout.as_secs_f64(),
        warm: !no_warm,
        phase_file: phase_file.as_ref().map(|p| p.display().to_string()),
    };
    let mut summary = Summary {
        tool: "flightcache-load",
        schema_version: SCHEMA_VERSION,
        started_at,
        config,
        finished: false,
        warm: None,
        stopped_by: None,
        report: None,
    };
    if let Some(path) = &out {
        // Fails early on an unwritable path, and the e2e script sees the run has started.
        write_atomically(path, &summary)?;
    }

    let target = Target::connect(&address, token, tls, ring, connect_timeout)
        .await
        .map_err(|CallError { code, message }| LoadError::Connect {
            target: address.clone(),
            code,
            message,
        })?;
    println!(
        "connected to {address} ({}); {keys} keys of {rows} rows, {concurrency} workers{}, {}",
        if ring { "ring-aware client" } else { "direct" },
        rate.map_or_else(String::new, |rate| format!(" at {rate} reads/s")),
        humantime::format_duration(duration)
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let signalled = Arc::new(AtomicBool::new(false));
    tokio::spawn(stop_on_signal(Arc::clone(&stop_tx), Arc::clone(&signalled)));

    let shared = Arc::new(Shared {
        workload: Workload::new(&prefix, rows),
        chooser: if rounds {
            KeyChooser::in_rounds(keys, seed)
        } else {
            KeyChooser::new(keys, zipf)
        },
        recorder: Recorder::new(std::time::Instant::now()),
        timeout,
        seed,
    });
    let mut callers = Vec::new();
    for _ in 0..concurrency {
        callers.push(
            target
                .caller()
                .map_err(|err| LoadError::Usage(err.message))?,
        );
    }

    if !no_warm {
        let (warm, callers_back) = warm(&shared, keys, concurrency, callers, &stop_rx).await;
        callers = callers_back;
        summary.warm = Some(Some(warm));
    } else {
        summary.warm = Some(None);
    }

    // Run phase.
    if let Some(path) = &phase_file {
        if let Some(label) = read_phase(path) {
            shared.recorder.set_phase(&label, std::time::Instant::now());
        }
        tokio::spawn(watch_phase(
            path.clone(),
            Arc::clone(&shared),
            stop_rx.clone(),
        ));
    }
    let run_start = Instant::now();
    let end = run_start + duration;
    // Each worker's share of --rate: one read every `concurrency / rate` seconds, the
    // workers' first reads spread over one such period so they do not start in step.
    let period = rate.map(|rate| Duration::from_secs_f64(concurrency as f64 / rate as f64));
    let mut workers = JoinSet::new();
    for (id, caller) in callers.into_iter().enumerate() {
        let pace = period.map(|period| {
            let first = run_start + period.mul_f64(id as f64 / concurrency as f64);
            let mut ticks = tokio::time::interval_at(first, period);
            // After a slow answer the next read waits a whole period: a paced load
            // never bursts to catch up.
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks
        });
        workers.spawn(worker(
            id as u64,
            caller,
            pace,
            Arc::clone(&shared),
            stop_rx.clone(),
        ));
    }
    let mut last_close = run_start;
    let mut next = run_start + report_every;
    let mut stop_wait = stop_rx.clone();
    loop {
        if *stop_wait.borrow() {
            break;
        }
        let wake = next.min(end);
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            _ = stop_wait.wait_for(|stop| *stop) => break,
        }
        let now = Instant::now();
        if now >= end {
            break;
        }
        if now >= next {
            close_interval(&shared, run_start, last_close, now);
            last_close = now;
            next += report_every;
            if let Some(path) = &out {
                let partial = Summary {
                    report: Some(report(&shared, run_start, now, report_every)),
                    ..summary.clone()
                };
                if let Err(err) = write_atomically(path, &partial) {
                    eprintln!("flightcache-load: {err}");
                }
            }
        }
    }
    let stopped = Instant::now().min(end.max(last_close));
    stop_tx.send_replace(true);
    while workers.join_next().await.is_some() {}
    if stopped > last_close {
        close_interval(&shared, run_start, last_close, stopped);
    }

    let by_signal = signalled.load(Ordering::SeqCst);
    summary.finished = true;
    summary.stopped_by = Some(if by_signal { "signal" } else { "duration" });
    summary.report = Some(report(&shared, run_start, stopped, report_every));
    let total = shared.recorder.total();
    let run_s = stopped.saturating_duration_since(run_start).as_secs_f64();
    println!("total   {:>7.1}s {}", run_s, total.line(run_s));
    match &out {
        Some(path) => {
            write_atomically(path, &summary)?;
            println!("summary written to {}", path.display());
        }
        // Plain structs with string keys: serialising cannot fail.
        None => println!("{}", serde_json::to_string(&summary).unwrap_or_default()),
    }
    Ok(())
}

fn report(shared: &Shared, run_start: Instant, now: Instant, report_every: Duration) -> Report {
    let run_s = now.saturating_duration_since(run_start).as_secs_f64();
    shared
        .recorder
        .report(run_s, report_every.as_secs_f64(), now.into_std())
}

fn close_interval(shared: &Shared, run_start: Instant, from: Instant, to: Instant) {
    let end_s = to.saturating_duration_since(run_start).as_secs_f64();
    let seconds = to.saturating_duration_since(from).as_secs_f64();
    let interval = shared.recorder.close_interval(end_s, seconds);
    let round = shared
        .chooser
        .rounds_completed()
        .zip(shared.chooser.rounds_whole())
        .map_or_else(String::new, |(completed, whole)| {
            format!(" round={completed} whole={whole}")
        });
    println!(
        "{:>7.1}s {:<12} {}{round}",
        end_s,
        interval.phase,
        interval.counters.line(seconds)
    );
}

/// Puts every key once, `concurrency` puts at a time; returns the warm figures and the
/// callers for the run phase.
async fn warm(
    shared: &Arc<Shared>,
    keys: u64,
    concurrency: u64,
    callers: Vec<Caller>,
    stop: &watch::Receiver<bool>,
) -> (Warm, Vec<Caller>) {
    let recorder = Arc::new(Recorder::new(std::time::Instant::now()));
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for (id, mut caller) in callers.into_iter().enumerate() {
        let shared = Arc::clone(shared);
        let recorder = Arc::clone(&recorder);
        let mut stop = stop.clone();
        tasks.spawn(async move {
            let mut index = id as u64;
            while index < keys {
                let began = std::time::Instant::now();
                let put = tokio::select! {
                    biased;
                    _ = stop.wait_for(|stop| *stop) => break,
                    put = caller.put(&shared.workload, index, shared.timeout) => put,
                };
                recorder.record_retried("put", &caller.take_retried());
                let outcome = match put {
                    Ok(()) => Outcome::PutOk,
                    Err(err) => Outcome::PutError(err),
                };
                recorder.record("put", &outcome, began.elapsed());
                index += concurrency;
            }
            caller
        });
    }
    let mut callers = Vec::new();
    while let Some(done) = tasks.join_next().await {
        if let Ok(caller) = done {
            callers.push(caller);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let total = recorder.total();
    let samples = recorder
        .report(seconds, seconds, std::time::Instant::now())
        .error_samples;
    println!(
        "warm: {} of {keys} keys put in {seconds:.2}s ({:.0}/s), {} errors",
        total.puts - total.errors,
        total.puts as f64 / seconds.max(1e-9),
        total.errors
    );
    let warm = Warm {
        keys,
        puts: total.puts,
        errors: total.errors,
        errors_by_code: total.errors_by_code,
        seconds: (seconds * 1e3).round() / 1e3,
        error_samples: samples,
    };
    (warm, callers)
}

/// One cache-aside reader: pick a key, DoGet, verify a hit, refill a miss; with `pace`
/// (`--rate`), each read waits for its tick.
async fn worker(
    id: u64,
    mut caller: Caller,
    mut pace: Option<tokio::time::Interval>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let mut rng = Rng::new(shared.seed, id);
    let workload = &shared.workload;
    loop {
        if let Some(ticks) = pace.as_mut() {
            tokio::select! {
                biased;
                _ = stop.wait_for(|stop| *stop) => return,
                _ = ticks.tick() => {}
            }
        }
        // Held to the end of the iteration: the call and its refill.
        let call = shared.chooser.pick_call(&mut rng);
        let index = call.index;
        let began = std::time::Instant::now();
        let got = tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => return,
            got = caller.get(workload, index, shared.timeout) => got,
        };
        let latency = began.elapsed();
        shared
            .recorder
            .record_retried("get", &caller.take_retried());
        match got {
            Ok(Got::Batches(batches)) => {
                let outcome = match workload.verify(index, &batches) {
                    Ok(()) => Outcome::Hit,
                    Err(what) => Outcome::Corrupt(what),
                };
                shared.recorder.record("get", &outcome, latency);
            }
            Ok(Got::NotFound) => {
                shared.recorder.record("get", &Outcome::Miss, latency);
                let began = std::time::Instant::now();
                let put = tokio::select! {
                    biased;
                    _ = stop.wait_for(|stop| *stop) => return,
                    put = caller.put(workload, index, shared.timeout) => put,
                };
                shared
                    .recorder
                    .record_retried("put", &caller.take_retried());
                let failed = put.is_err();
                let outcome = match put {
                    Ok(()) => Outcome::PutOk,
                    Err(err) => Outcome::PutError(err),
                };
                shared.recorder.record("put", &outcome, began.elapsed());
                if failed {
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
            Err(err) => {
                shared
                    .recorder
                    .record("get", &Outcome::GetError(err), latency);
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
    }
}

/// Re-reads the phase file every [`PHASE_POLL`] until the run stops.
async fn watch_phase(path: PathBuf, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(PHASE_POLL) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        if let Some(label) = read_phase(&path) {
            shared.recorder.set_phase(&label, std::time::Instant::now());
        }
    }
}

/// The phase label in `path`: its first line, trimmed; `None` if missing or empty.
fn read_phase(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let label = text.lines().next()?.trim();
    (!label.is_empty()).then(|| label.to_owned())
}

/// Sets `stop` on SIGTERM or SIGINT.
async fn stop_on_signal(stop: Arc<watch::Sender<bool>>, signalled: Arc<AtomicBool>) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    eprintln!("flightcache-load: signal received, stopping and writing the summary");
    signalled.store(true, Ordering::SeqCst);
    stop.send_replace(true);
}

/// Writes `value` as pretty JSON to `path` through a temporary file and a rename, so a
/// reader never sees half a summary.
fn write_atomically(path: &Path, value: &impl Serialize) -> Result<(), LoadError> {
    let error = |source| LoadError::WriteSummary {
        path: path.to_owned(),
        source,
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let mut file = std::fs::File::create(&tmp).map_err(error)?;
    let text = serde_json::to_vec_pretty(value).map_err(|err| error(err.into()))?;
    file.write_all(&text).map_err(error)?;
    file.write_all(b"\n").map_err(error)?;
    file.sync_all().map_err(error)?;
    std::fs::rename(&tmp, path).map_err(error)
}
