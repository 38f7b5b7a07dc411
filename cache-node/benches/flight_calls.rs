//! Flight calls measured with a Rust client, for the two targets the Python client cannot
//! judge because pyarrow's own client is the ceiling (docs/benchmarks.md):
//!
//! Every client has its own HTTP/2 connection and its own thread with a single-threaded
//! tokio runtime, so its calls never wait for another client's work in this process.
//!
//! - `tiny`: N clients call `DoAction("ping")` in a loop (draining the result stream)
//!   and the program reports calls/s, p50/p99 of a call and the CPU the client process
//!   spent, which shows whether the client is the bottleneck. Both the node and the
//!   reference pyarrow server answer `ping`.
//! - `hits`: one reader reads an entry with `DoGet(ticket)` in a loop, one call at a
//!   time, and reports the exact latency percentiles of those hits (all samples are kept
//!   and sorted), idle (`--putters 0`) or while P putters store R×C tables (shaped like
//!   flight_bench.py's `make_table`) under distinct keys `PREFIX/<putter>/<seq>`
//!   continuously. The measurement starts once every putter has finished one put, so it
//!   is taken under load. A put refused with RESOURCE_EXHAUSTED (or failing otherwise) is
//!   counted and the putter carries on; a failed hit stops the program with exit code 1.
//!
//! Each command prints one JSON line on stdout. `cache-node/bench/flight_bench.py` (part
//! `rust`, run by `cache-node/bench/run`) builds this benchmark with
//! `cargo bench --no-run`, starts the servers, stores the entry the reader hits and runs
//! the binary against the node and the pyarrow server. Bad arguments exit with code 2,
//! a failed run with code 1.
//!
//! ```text
//! cargo bench -p cache-node --bench flight_calls -- tiny --target 127.0.0.1:PORT \
//!     --clients 4 --seconds 5 [--warmup-seconds 0.5]
//! cargo bench -p cache-node --bench flight_calls -- hits --target 127.0.0.1:PORT \
//!     --ticket-hex HEX --seconds 5 [--warmup-seconds 0.5] [--putters 4 --put-rows 50000 \
//!     --put-cols 8 --put-path-prefix bench/rust-storm]
//! ```
//!
//! The node's ticket for a path key is `b"FCT" 0x01 b"P"` followed by the key
//! (`cache_node::ticket`); the pyarrow server's ticket is the key itself.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use arrow_array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightData, FlightDescriptor, Ticket};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest the reader waits for every putter to finish its first put.
const FIRST_PUT_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest one put may take; a put that takes longer counts as failed.
const PUT_TIMEOUT: Duration = Duration::from_secs(60);
/// Linux reports process CPU times in /proc in USER_HZ ticks, 100 per second.
const USER_HZ: f64 = 100.0;

/// Flight calls with a Rust client: tiny-call rate and hit latency under puts.
#[derive(Debug, Parser)]
#[command(name = "flight_calls")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// N clients call DoAction("ping") in a loop; prints calls/s and latency.
    Tiny {
        /// Server address, host:port (an IP address).
        #[arg(long, value_parser = parse_target)]
        target: SocketAddr,
        /// Concurrent clients, each on its own connection.
        #[arg(long, default_value_t = 1, value_parser = parse_count)]
        clients: usize,
        /// Measuring time.
        #[arg(long, value_parser = parse_seconds)]
        seconds: Duration,
        /// Calls before the measurement, not counted.
        #[arg(long, default_value = "0.5", value_parser = parse_warmup)]
        warmup_seconds: Duration,
    },
    /// One reader hits an entry sequentially while putters store large tables.
    Hits {
        /// Server address, host:port (an IP address).
        #[arg(long, value_parser = parse_target)]
        target: SocketAddr,
        /// The DoGet ticket, hex-encoded.
        #[arg(long, value_parser = parse_hex)]
        ticket_hex: Bytes,
        /// Measuring time.
        #[arg(long, value_parser = parse_seconds)]
        seconds: Duration,
        /// Hits before the measurement, not counted.
        #[arg(long, default_value = "0.5", value_parser = parse_warmup)]
        warmup_seconds: Duration,
        /// Concurrent putters, each on its own connection (0: idle).
        #[arg(long, default_value_t = 0)]
        putters: usize,
        /// Rows of each put table.
        #[arg(long, default_value_t = 50_000, value_parser = parse_count)]
        put_rows: usize,
        /// Columns of each put table (int64, float64, timestamp[us], utf8, repeating).
        #[arg(long, default_value_t = 8, value_parser = parse_count)]
        put_cols: usize,
        /// Path prefix of the put keys: PREFIX/<putter>/<seq>.
        #[arg(long, default_value = "bench/rust-storm")]
        put_path_prefix: String,
        /// Where the putters send their puts (default: the target). Another server
        /// process here is the control: the same CPU load on the machine, none of it in
        /// the process serving the hits.
        #[arg(long, value_parser = parse_target)]
        put_target: Option<SocketAddr>,
        /// Nice value of the putter threads (0: the reader's priority). On a machine whose
        /// cores the clients share with the server, 19 stands in for putters on other
        /// machines: their CPU no longer delays the reader or the server.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..=19))]
        putter_nice: i32,
    },
}

fn parse_target(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("'{text}' is not an address like 127.0.0.1:50051"))
}

fn parse_count(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("'{text}' is not a whole number ≥ 1")),
    }
}

fn parse_duration(text: &str, allow_zero: bool) -> Result<Duration, String> {
    let bad = || format!("'{text}' is not a number of seconds (e.g. 1.5)");
    let seconds: f64 = text.parse().map_err(|_| bad())?;
    if !seconds.is_finite() || seconds < 0.0 || (!allow_zero && seconds == 0.0) {
        return Err(bad());
    }
    if seconds > 86_400.0 {
        return Err(format!("'{text}' seconds is more than a day"));
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| bad())
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    parse_duration(text, false)
}

fn parse_warmup(text: &str) -> Result<Duration, String> {
    parse_duration(text, true)
}

fn parse_hex(text: &str) -> Result<Bytes, String> {
    let digits = text.as_bytes();
    if digits.is_empty() || !digits.len().is_multiple_of(2) {
        return Err("the ticket must be a non-empty, even number of hex digits".into());
    }
    let nibble = |digit: u8| match digit {
        b'0'..=b'9' => Ok(digit - b'0'),
        b'a'..=b'f' => Ok(digit - b'a' + 10),
        b'A'..=b'F' => Ok(digit - b'A' + 10),
        _ => Err(format!("'{}' is not a hex digit", char::from(digit))),
    };
    digits
        .chunks_exact(2)
        .map(|pair| Ok((nibble(pair[0])? << 4) | nibble(pair[1])?))
        .collect::<Result<Vec<u8>, String>>()
        .map(Bytes::from)
}

/// A failed run (exit code 1).
#[derive(Debug)]
struct Failure(String);

impl Failure {
    fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

fn main() -> ExitCode {
    // `cargo bench` appends `--bench`; it means nothing here.
    let args = std::env::args_os().filter(|arg| arg != "--bench");
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            let code = if err.use_stderr() { 2 } else { 0 };
            // Nothing more to do if even the usage cannot be printed.
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Command::Tiny {
            target,
            clients,
            seconds,
            warmup_seconds,
        } => run_tiny(target, clients, seconds, warmup_seconds),
        Command::Hits {
            target,
            ticket_hex,
            seconds,
            warmup_seconds,
            putters,
            put_rows,
            put_cols,
            put_path_prefix,
            put_target,
            putter_nice,
        } => run_hits(&HitsPlan {
            putter_nice,
            target,
            put_target: put_target.unwrap_or(target),
            ticket: ticket_hex,
            seconds,
            warmup: warmup_seconds,
            putters,
            put_rows,
            put_cols,
            prefix: put_path_prefix,
        }),
    };
    match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(Failure(message)) => {
            eprintln!("flight_calls: {message}");
            ExitCode::from(1)
        }
    }
}

// ----------------------------------------------------------------------------- helpers

/// A single-threaded runtime: every client runs on a thread of its own, so its calls and
/// its connection's I/O share one thread and no call pays a cross-thread wake-up.
fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| Failure::new(format!("cannot start a tokio runtime: {err}")))
}

/// A client on its own, eagerly connected HTTP/2 connection.
async fn connect(target: SocketAddr) -> Result<FlightServiceClient<Channel>, Failure> {
    let endpoint = Endpoint::from_shared(format!("http://{target}"))
        .map_err(|err| Failure::new(format!("bad target {target}: {err}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    let channel = endpoint
        .connect()
        .await
        .map_err(|err| Failure::new(format!("cannot connect to {target}: {}", chain(&err))))?;
    Ok(FlightServiceClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX))
}

fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn status_text(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

/// Percentile `q` (0..100) of sorted nanosecond samples, nearest rank, in µs.
fn percentile_us(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let rank = (q / 100.0 * sorted.len() as f64).ceil() as usize;
    let index = rank.saturating_sub(1).min(sorted.len() - 1);
    #[allow(clippy::cast_precision_loss)]
    let us = sorted[index] as f64 / 1_000.0;
    us
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// CPU seconds (user + system, all threads) this process has used, from /proc/self/stat;
/// None where that file cannot be read.
fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // Fields 3.. follow; utime and stime are fields 14 and 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    #[allow(clippy::cast_precision_loss)]
    let seconds = (utime + stime) as f64 / USER_HZ;
    Some(seconds)
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

// -------------------------------------------------------------------------------- tiny

/// One DoAction("ping"), its result stream drained.
async fn ping(client: &mut FlightServiceClient<Channel>) -> Result<(), tonic::Status> {
    let action = Action {
        r#type: "ping".into(),
        body: Bytes::new(),
    };
    let mut results = client.do_action(action).await?.into_inner();
    while results.message().await?.is_some() {}
    Ok(())
}

/// One tiny-call client: connects and pings once (reporting on `ready`), waits for the
/// measuring window, then pings in a loop until it ends. Its samples (ns, calls started
/// inside the window) and when its last call ended.
fn tiny_client(
    target: SocketAddr,
    ready: &mpsc::Sender<Result<(), Failure>>,
    window: &mpsc::Receiver<(Instant, Instant)>,
) -> Result<(Vec<u64>, Instant), Failure> {
    let connected = runtime().and_then(|runtime| {
        let client = runtime.block_on(async {
            let mut client = connect(target).await?;
            ping(&mut client).await.map_err(ping_failed)?;
            Ok::<_, Failure>(client)
        })?;
        Ok((runtime, client))
    });
    let (runtime, mut client) = match connected {
        Ok(connected) => {
            // The main thread outlives every client; a closed channel is caught below.
            let _ = ready.send(Ok(()));
            connected
        }
        Err(err) => {
            let message = err.0.clone();
            let _ = ready.send(Err(err));
            return Err(Failure(message));
        }
    };
    let (start, end) = window
        .recv()
        .map_err(|_| Failure::new("cancelled before the measurement"))?;
    runtime.block_on(async {
        let mut samples = Vec::new();
        loop {
            let began = Instant::now();
            if began >= end {
                break;
            }
            ping(&mut client).await.map_err(ping_failed)?;
            if began >= start {
                samples.push(nanos(began.elapsed()));
            }
        }
        Ok((samples, Instant::now()))
    })
}

fn ping_failed(status: tonic::Status) -> Failure {
    Failure::new(format!("ping failed: {}", status_text(&status)))
}

fn run_tiny(
    target: SocketAddr,
    clients: usize,
    seconds: Duration,
    warmup: Duration,
) -> Result<String, Failure> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (mut samples, cpu, elapsed) = std::thread::scope(|scope| {
        let mut windows = Vec::with_capacity(clients);
        let mut threads = Vec::with_capacity(clients);
        for _ in 0..clients {
            let (window_tx, window_rx) = mpsc::channel();
            let ready = ready_tx.clone();
            windows.push(window_tx);
            threads.push(scope.spawn(move || tiny_client(target, &ready, &window_rx)));
        }
        for _ in 0..clients {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                // Dropping `windows` on return releases the other clients.
                Ok(Err(err)) => return Err(err),
                Err(_) => return Err(Failure::new("a client thread ended unexpectedly")),
            }
        }
        let start = Instant::now() + warmup;
        let end = start + seconds;
        for window in &windows {
            window
                .send((start, end))
                .map_err(|_| Failure::new("a client thread ended unexpectedly"))?;
        }
        std::thread::sleep(start.saturating_duration_since(Instant::now()));
        let cpu_start = process_cpu_seconds();
        let mut samples = Vec::new();
        let mut finished = start;
        for thread in threads {
            let (mut more, done) = thread
                .join()
                .unwrap_or_else(|_| Err(Failure::new("a client thread panicked")))?;
            samples.append(&mut more);
            finished = finished.max(done);
        }
        let cpu = match (cpu_start, process_cpu_seconds()) {
            (Some(before), Some(after)) => Some(round(after - before, 3)),
            _ => None,
        };
        Ok((samples, cpu, finished.duration_since(start).as_secs_f64()))
    })?;
    samples.sort_unstable();
    #[allow(clippy::cast_precision_loss)]
    let calls = samples.len() as f64;
    let per_call_us = cpu.map(|cpu| {
        if calls > 0.0 {
            round(cpu / calls * 1e6, 2)
        } else {
            0.0
        }
    });
    Ok(serde_json::json!({
        "mode": "tiny",
        "clients": clients,
        "calls": samples.len(),
        "seconds": round(elapsed, 3),
        "calls_per_s": round(if elapsed > 0.0 { calls / elapsed } else { 0.0 }, 1),
        "p50_us": round(percentile_us(&samples, 50.0), 1),
        "p99_us": round(percentile_us(&samples, 99.0), 1),
        "client_cpu_s": cpu,
        "client_cpu_us_per_call": per_call_us,
    })
    .to_string())
}

// -------------------------------------------------------------------------------- hits

struct HitsPlan {
    target: SocketAddr,
    put_target: SocketAddr,
    putter_nice: i32,
    ticket: Bytes,
    seconds: Duration,
    warmup: Duration,
    putters: usize,
    put_rows: usize,
    put_cols: usize,
    prefix: String,
}

/// What the putters share with the reader.
#[derive(Default)]
struct PutState {
    /// Putters that have finished (or failed) their first put.
    started: AtomicUsize,
    stop: AtomicBool,
    ok: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// A putter that could not start (no connection, no table): the run fails.
    fatal: Mutex<Option<String>>,
}

impl PutState {
    fn counts(&self) -> (u64, u64) {
        (
            self.ok.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }
}
/// splitmix64: a small, seeded pseudo-random sequence.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

/// A table shaped like flight_bench.py's `make_table`: columns cycle int64 ids,
/// float64 amounts, timestamp[us] and 8-character utf8 labels.
#[allow(clippy::cast_precision_loss)]
fn make_batch(rows: usize, cols: usize, seed: u64) -> Result<RecordBatch, Failure> {
    let mut rng = SplitMix(seed);
    let mut columns: Vec<(String, ArrayRef)> = Vec::with_capacity(cols);
    for c in 0..cols {
        let column: (String, ArrayRef) = match c % 4 {
            0 => (
                format!("id_{c}"),
                Arc::new(Int64Array::from_iter_values(
                    (0..rows).map(|_| i64::try_from(rng.below(1 << 40)).unwrap_or(0)),
                )),
            ),
            1 => (
                format!("amount_{c}"),
                Arc::new(Float64Array::from_iter_values((0..rows).map(|_| {
                    (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 2000.0 - 1000.0
                }))),
            ),
            2 => {
                let base: i64 = 1_700_000_000_000_000;
                (
                    format!("ts_{c}"),
                    Arc::new(TimestampMicrosecondArray::from_iter_values((0..rows).map(
                        |_| base + i64::try_from(rng.below(86_400_000_000 * 365)).unwrap_or(0),
                    ))),
                )
            }
            _ => (
                format!("label_{c}"),
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|_| format!("k{:07}", rng.below(10_000_000))),
                )),
            ),
        };
        columns.push(column);
    }
    RecordBatch::try_from_iter(columns)
        .map_err(|err| Failure::new(format!("cannot build the put table: {err}")))
}

/// The put table's Flight messages, encoded once (schema first, no descriptor yet).
async fn encode(batch: RecordBatch) -> Result<Vec<FlightData>, Failure> {
    FlightDataEncoderBuilder::new()
        .with_max_flight_data_size(cache_node::flight::MAX_FLIGHT_DATA_BYTES)
        .build(futures::stream::iter([Ok(batch)]))
        .try_collect()
        .await
        .map_err(|err| Failure::new(format!("cannot encode the put table: {err}")))
}

async fn put_once(
    client: &mut FlightServiceClient<Channel>,
    messages: &[FlightData],
    path: Vec<String>,
) -> Result<(), tonic::Status> {
    let mut messages = messages.to_vec();
    if let Some(first) = messages.first_mut() {
        first.flight_descriptor = Some(FlightDescriptor::new_path(path));
    }
    let mut answers = client
        .do_put(futures::stream::iter(messages))
        .await?
        .into_inner();
    while answers.message().await?.is_some() {}
    Ok(())
}

/// One putter on its own thread and connection: builds and encodes its table once, then
/// stores it under `PREFIX/<id>/<seq>` until told to stop.
fn putter(plan: &HitsPlan, id: usize, state: &PutState) {
    if plan.putter_nice > 0 {
        let thread = Some(rustix::thread::gettid());
        if let Err(err) = rustix::process::setpriority_process(thread, plan.putter_nice) {
            state
                .fatal
                .lock()
                .get_or_insert(format!("putter {id}: setpriority: {err}"));
            return;
        }
    }
    let prepared = runtime().and_then(|runtime| {
        let seed = 100 + u64::try_from(id).unwrap_or(0);
        let (client, messages) = runtime.block_on(async {
            let messages = encode(make_batch(plan.put_rows, plan.put_cols, seed)?).await?;
            Ok::<_, Failure>((connect(plan.put_target).await?, messages))
        })?;
        Ok((runtime, client, messages))
    });
    let (runtime, mut client, messages) = match prepared {
        Ok(prepared) => prepared,
        Err(Failure(message)) => {
            state
                .fatal
                .lock()
                .get_or_insert(format!("putter {id}: {message}"));
            return;
        }
    };
    runtime.block_on(async {
        let mut seq: u64 = 0;
        while !state.stop.load(Ordering::Relaxed) {
            seq += 1;
            let path = vec![plan.prefix.clone(), id.to_string(), seq.to_string()];
            let put = tokio::time::timeout(PUT_TIMEOUT, put_once(&mut client, &messages, path));
            let failed = match put.await {
                Ok(Ok(())) => None,
                Ok(Err(status)) => Some((status.code(), status_text(&status))),
                Err(_) => Some((
                    Code::DeadlineExceeded,
                    format!("no answer within {} s", PUT_TIMEOUT.as_secs()),
                )),
            };
            match failed {
                None => {
                    state.ok.fetch_add(1, Ordering::Relaxed);
                }
                Some((code, text)) => {
                    state.errors.fetch_add(1, Ordering::Relaxed);
                    state
                        .first_error
                        .lock()
                        .get_or_insert_with(|| text.chars().take(300).collect());
                    if code != Code::ResourceExhausted {
                        // Not a refusal: do not spin on a broken connection.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            if seq == 1 {
                state.started.fetch_add(1, Ordering::Release);
            }
        }
    });
}

/// One DoGet, the whole stream decoded; the rows it held.
async fn hit(client: &mut FlightServiceClient<Channel>, ticket: &Bytes) -> Result<usize, String> {
    let ticket = Ticket {
        ticket: ticket.clone(),
    };
    let stream = client
        .do_get(ticket)
        .await
        .map_err(|status| status_text(&status))?
        .into_inner()
        .map_err(FlightError::from);
    let mut batches = FlightRecordBatchStream::new_from_flight_data(stream);
    let mut rows = 0;
    while let Some(batch) = batches.next().await {
        rows += batch
            .map_err(|err| match err {
                FlightError::Tonic(status) => status_text(&status),
                other => other.to_string(),
            })?
            .num_rows();
    }
    Ok(rows)
}

struct ReaderOutcome {
    samples: Vec<u64>,
    rows: usize,
    elapsed: Duration,
    /// Puts done and failed (counters) when the measurement started and ended.
    puts_at_start: (u64, u64),
    puts_at_end: (u64, u64),
}

/// Hits until the warm-up is over and every putter has finished a put, then measures.
fn reader(plan: &HitsPlan, state: &PutState) -> Result<ReaderOutcome, Failure> {
    runtime()?.block_on(async {
        let mut client = connect(plan.target).await?;
        let failed = |message: String| Failure::new(format!("hit failed: {message}"));
        let warm_until = Instant::now() + plan.warmup;
        let give_up = Instant::now() + FIRST_PUT_TIMEOUT;
        let mut rows = hit(&mut client, &plan.ticket).await.map_err(failed)?;
        while Instant::now() < warm_until || state.started.load(Ordering::Acquire) < plan.putters {
            if let Some(message) = state.fatal.lock().clone() {
                return Err(Failure(message));
            }
            if Instant::now() > give_up {
                return Err(Failure::new(format!(
                    "the putters did not all finish a first put within {} s",
                    FIRST_PUT_TIMEOUT.as_secs()
                )));
            }
            rows = hit(&mut client, &plan.ticket).await.map_err(failed)?;
        }
        let puts_at_start = state.counts();
        let start = Instant::now();
        let end = start + plan.seconds;
        let mut samples = Vec::new();
        loop {
            let began = Instant::now();
            if began >= end {
                break;
            }
            rows = hit(&mut client, &plan.ticket).await.map_err(failed)?;
            samples.push(nanos(began.elapsed()));
        }
        Ok(ReaderOutcome {
            samples,
            rows,
            elapsed: start.elapsed(),
            puts_at_start,
            puts_at_end: state.counts(),
        })
    })
}

fn run_hits(plan: &HitsPlan) -> Result<String, Failure> {
    let state = PutState::default();
    // Every client on a thread of its own (see `runtime`): a hit never queues behind a
    // putter's work in this process.
    let outcome = std::thread::scope(|scope| {
        for id in 0..plan.putters {
            let state = &state;
            scope.spawn(move || putter(plan, id, state));
        }
        let outcome = scope
            .spawn(|| reader(plan, &state))
            .join()
            .unwrap_or_else(|_| Err(Failure::new("the reader thread panicked")));
        // The putters finish the put they are in (bounded by PUT_TIMEOUT) and end.
        state.stop.store(true, Ordering::Relaxed);
        outcome
    })?;

    let mut samples = outcome.samples;
    samples.sort_unstable();
    let (ok_start, errors_start) = outcome.puts_at_start;
    let (ok_end, errors_end) = outcome.puts_at_end;
    let p = |q| round(percentile_us(&samples, q), 1);
    #[allow(clippy::cast_precision_loss)]
    let max_us = samples
        .last()
        .map_or(0.0, |&ns| round(ns as f64 / 1_000.0, 1));
    let first_error = state.first_error.lock().clone().unwrap_or_default();
    Ok(serde_json::json!({
        "mode": "hits",
        "putters": plan.putters,
        "puts_elsewhere": plan.put_target != plan.target,
        "putter_nice": plan.putter_nice,
        "hits": samples.len(),
        "rows": outcome.rows,
        "seconds": round(outcome.elapsed.as_secs_f64(), 3),
        "p50_us": p(50.0),
        "p95_us": p(95.0),
        "p99_us": p(99.0),
        "p999_us": p(99.9),
        "max_us": max_us,
        "puts": ok_end - ok_start,
        "put_errors": errors_end - errors_start,
        "put_error_first": first_error,
        "hit_errors": 0,
    })
    .to_string())
}
