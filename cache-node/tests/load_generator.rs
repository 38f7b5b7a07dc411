//! `flightcache-load` against real `flightcache-node` processes on loopback: a warm run is
//! all verified hits, a `clear` mid-run shows up as misses that are refilled (per phase),
//! SIGTERM still writes the summary, a node SIGKILLed and restarted under the load costs
//! tries (counted as `retried`) and no failed call, the ring-aware mode spreads keys over
//! three nodes, TLS with a client certificate works (and without one the node refuses),
//! and bad flags or an unreachable target fail at start.

#![allow(missing_docs, clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use arrow_flight::{Action, FlightClient};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use tonic::transport::Channel;

/// A node process on 127.0.0.1 with an OS-chosen port; killed on drop.
struct Node {
    child: Child,
    addr: String,
}

impl Node {
    fn start(extra: &[&str]) -> Self {
        Self::start_on("127.0.0.1:0", extra)
    }

    /// A node listening for Flight on `listen`.
    fn start_on(listen: &str, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flightcache-node"))
            .args(["--listen", listen, "--metrics-listen", "127.0.0.1:0"])
            .args(["--log-format", "json", "--shutdown-grace", "1s"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node starts");
        // The node logs to stdout; read it on a thread so a node that never says where
        // it listens fails the test instead of hanging it.
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in lines.map_while(Result::ok) {
                let Ok(event) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if event["message"] == "flightcache node serving"
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(event["flight_addr"].as_str().unwrap_or("").to_owned());
                }
            }
        });
        let Ok(addr) = rx.recv_timeout(Duration::from_secs(30)) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the node did not log its address within 30 s");
        };
        Self { child, addr }
    }

    async fn client(&self) -> FlightClient {
        let channel = Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        FlightClient::new(channel)
    }

    async fn action(&self, kind: &str, body: &str) -> Value {
        let mut client = self.client().await;
        let mut answers = client
            .do_action(Action::new(kind.to_owned(), Bytes::from(body.to_owned())))
            .await
            .unwrap();
        let first = answers.next().await.expect("one answer").unwrap();
        serde_json::from_slice(&first).unwrap_or(Value::Null)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn load(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flightcache-load"));
    command.args(args);
    command
}

/// Runs the load to completion; returns its output and the summary in `out`.
async fn run_load(args: Vec<String>, out: &Path) -> (Output, Value) {
    finish(spawn_load(&args), out).await
}

/// Starts the load in the background, its output captured.
fn spawn_load(args: &[String]) -> Child {
    load(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Starts a long load in the background (ended by [`stop_load`] once the test has seen
/// its phases: on a busy machine a fixed-length run could end before the test got to
/// them), in phase `steady` of the phase file `phase_file`.
fn start_phased_load(target: &str, out: &Path, phase_file: &Path) -> Child {
    std::fs::write(phase_file, "steady\n").unwrap();
    let phase_file = phase_file.to_str().unwrap();
    spawn_load(&args(
        target,
        out,
        &["--duration", "120s", "--phase-file", phase_file],
    ))
}

/// Ends a background load with SIGTERM; returns its output and the summary in `out`.
async fn stop_load(child: Child, out: &Path) -> (Output, Value) {
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    finish(child, out).await
}

async fn finish(child: Child, out: &Path) -> (Output, Value) {
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "load failed: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let summary: Value = serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap();
    (output, summary)
}

/// Waits (at most 30 s) until the run's summary in `out` (rewritten every interval)
/// satisfies `ready`; `what` names the wait in the failure.
async fn wait_for_summary(out: &Path, what: &str, ready: impl Fn(&Value) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read(out).unwrap_or_default();
        let partial: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
        if ready(&partial) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the summary reports `count` intervals of `phase`.
async fn wait_for_intervals(out: &Path, phase: &str, count: usize) {
    wait_for_summary(
        out,
        &format!("{count} intervals of phase {phase}"),
        |summary| {
            summary["intervals"]
                .as_array()
                .map_or(0, |i| i.iter().filter(|i| i["phase"] == phase).count())
                >= count
        },
    )
    .await;
}

/// Waits until the summary counts a miss in `phase`.
async fn wait_for_misses(out: &Path, phase: &str) {
    wait_for_summary(out, &format!("a miss in phase {phase}"), |summary| {
        summary["phases"].as_array().is_some_and(|phases| {
            phases
                .iter()
                .any(|p| p["phase"] == phase && p["misses"].as_u64() > Some(0))
        })
    })
    .await;
}

/// Waits until an interval of `phase` had reads and no miss.
async fn wait_for_recovery(out: &Path, phase: &str) {
    wait_for_summary(
        out,
        &format!("an interval of phase {phase} without misses"),
        |summary| {
            summary["intervals"].as_array().is_some_and(|intervals| {
                intervals.iter().any(|i| {
                    i["phase"] == phase && i["gets"].as_u64() > Some(0) && i["misses"] == 0
                })
            })
        },
    )
    .await;
}

fn args(target: &str, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--target",
        target,
        "--keys",
        "200",
        "--rows",
        "20",
        "--concurrency",
        "4",
        "--report-every",
        "250ms",
        "--out",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.push(out.display().to_string());
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

fn phase<'a>(summary: &'a Value, label: &str) -> &'a Value {
    summary["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["phase"] == label)
        .unwrap_or_else(|| panic!("no phase {label} in {}", summary["phases"]))
}

#[tokio::test]
async fn a_warm_run_is_all_verified_hits() {
    let node = Node::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("summary.json");
    let (output, summary) = run_load(args(&node.addr, &out, &["--duration", "3s"]), &out).await;

    assert_eq!(summary["finished"], true);
    assert_eq!(summary["stopped_by"], "duration");
    assert_eq!(summary["warm"]["puts"], 200);
    assert_eq!(summary["warm"]["errors"], 0);
    let totals = &summary["totals"];
    assert!(totals["gets"].as_u64().unwrap() > 0, "{totals}");
    assert!(totals["hit_ratio"].as_f64().unwrap() > 0.9, "{totals}");
    assert_eq!(totals["errors"], 0, "{}", summary["error_samples"]);
    assert_eq!(totals["corrupt"], 0, "{}", summary["corrupt_samples"]);
    assert!(totals["p99_ms"].as_f64().unwrap() >= totals["p50_ms"].as_f64().unwrap());
    assert_eq!(summary["max_consecutive_error_intervals"], 0);
    let intervals = summary["intervals"].as_array().unwrap();
    // Every 250 ms of the 3 s run is in exactly one interval. (How many intervals that
    // takes depends on the reporter being scheduled on time: fewer, longer ones when a
    // busy machine delays it, as on a CI machine running the other tests beside it.)
    let covered: f64 = intervals
        .iter()
        .map(|i| i["seconds"].as_f64().unwrap())
        .sum();
    let run = totals["seconds"].as_f64().unwrap();
    assert!(
        (covered - run).abs() < 0.05,
        "intervals cover {covered} s of {run} s"
    );
    assert!((2.9..3.2).contains(&run), "{run}");
    assert!((3..=13).contains(&intervals.len()), "{}", intervals.len());
    // Every get of the run is in exactly one interval. (An interval may hold none: a
    // machine busy enough to stall the node for a 250 ms window gives one, which is an
    // observation the report must keep, not a fault of the generator.)
    let interval_gets: u64 = intervals.iter().map(|i| i["gets"].as_u64().unwrap()).sum();
    assert_eq!(
        interval_gets,
        totals["gets"].as_u64().unwrap(),
        "{intervals:?}"
    );
    // One stdout line per interval, plus the connect, warm and total lines.
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        stdout.lines().filter(|l| l.contains("ops/s=")).count(),
        intervals.len() + 1,
        "{stdout}"
    );
}

#[tokio::test]
async fn a_paced_run_reads_at_most_its_rate() {
    let node = Node::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("summary.json");
    let (output, summary) = run_load(
        args(&node.addr, &out, &["--duration", "2s", "--rate", "40"]),
        &out,
    )
    .await;

    assert_eq!(summary["config"]["rate_per_s"], 40, "{summary}");
    let totals = &summary["totals"];
    let gets = totals["gets"].as_u64().unwrap();
    let run = totals["seconds"].as_f64().unwrap();
    // 4 workers, each one read per 100 ms from its first tick: at most 40 per second of
    // the run plus one first read per worker. A closed loop on a local node reads
    // thousands in the same time.
    let most = (40.0 * run).floor() as u64 + 4;
    assert!(
        gets > 0 && gets <= most,
        "{gets} gets in {run} s, at most {most}"
    );
    assert_eq!(totals["errors"], 0, "{}", summary["error_samples"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("4 workers at 40 reads/s"), "{stdout}");
}

#[tokio::test]
async fn a_clear_mid_run_gives_misses_that_are_refilled_and_the_hit_ratio_recovers() {
    let node = Node::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("summary.json");
    let phase_file = dir.path().join("phase");
    let child = start_phased_load(&node.addr, &out, &phase_file);
    wait_for_intervals(&out, "steady", 2).await;
    std::fs::write(&phase_file, "clear\n").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cleared = node.action("clear", "").await;
    assert!(cleared["removed"].as_u64().unwrap() > 100, "{cleared}");
    wait_for_intervals(&out, "clear", 1).await;
    std::fs::write(&phase_file, "after\n").unwrap();
    // Recovery: every key missed once and was put back, so a whole interval hits. How
    // long the refill takes depends on the machine, so the test waits for it (at most
    // 30 s) rather than bounding the hit ratio of a fixed window.
    wait_for_recovery(&out, "after").await;
    let (_, summary) = stop_load(child, &out).await;

    let totals = &summary["totals"];
    assert_eq!(totals["errors"], 0, "{}", summary["error_samples"]);
    assert_eq!(totals["corrupt"], 0, "{}", summary["corrupt_samples"]);
    let steady = phase(&summary, "steady");
    assert_eq!(steady["misses"], 0, "{steady}");
    assert_eq!(steady["hit_ratio"], 1.0, "{steady}");
    let clear = phase(&summary, "clear");
    let misses = clear["misses"].as_u64().unwrap();
    assert!(misses > 0, "{clear}");
    // Every miss is refilled (a refill cut off by the end of the run is not counted).
    let (puts, all_misses) = (
        totals["puts"].as_u64().unwrap(),
        totals["misses"].as_u64().unwrap(),
    );
    assert!(puts <= all_misses && puts + 4 >= all_misses, "{totals}");
    let after = phase(&summary, "after");
    // After the clear each worker misses a key at most once (its own refill lands before
    // it reads again): at most 200 keys x 4 workers misses, against thousands if refills
    // did not stick.
    let refills = clear["misses"].as_u64().unwrap() + after["misses"].as_u64().unwrap();
    assert!(refills <= 200 * 4, "{clear} {after}");
    // The last interval with reads: one cut short by the end of the run may have none
    // (no ratio) when the machine is busy.
    let last = summary["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|interval| interval["hit_ratio"].is_f64())
        .unwrap();
    assert!(last["hit_ratio"].as_f64().unwrap() > 0.95, "{last}");
    // The interval with the most misses (the clear) has a lower hit ratio than the last.
    let intervals = summary["intervals"].as_array().unwrap();
    let worst = intervals
        .iter()
        .max_by_key(|i| i["misses"].as_u64().unwrap())
        .unwrap();
    assert!(worst["misses"].as_u64().unwrap() > 0, "{worst}");
    assert!(
        worst["hit_ratio"].as_f64().unwrap() < last["hit_ratio"].as_f64().unwrap(),
        "{worst} vs {last}"
    );
}

#[tokio::test]
async fn in_rounds_a_clear_costs_each_key_one_miss_within_a_round() {
    let node = Node::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("summary.json");
    let phase_file = dir.path().join("phase");
    std::fs::write(&phase_file, "steady\n").unwrap();
    let phase_path = phase_file.to_str().unwrap();
    // One worker: each refill lands before the next read, so a key misses exactly once.
    let mut argv = args(
        &node.addr,
        &out,
        &[
            "--zipf",
            "0",
            "--rounds",
            "--duration",
            "120s",
            "--phase-file",
            phase_path,
        ],
    );
    let workers = argv.iter().position(|a| a == "--concurrency").unwrap() + 1;
    argv[workers] = "1".into();
    let child = spawn_load(&argv);
    wait_for_intervals(&out, "steady", 2).await;
    std::fs::write(&phase_file, "clear\n").unwrap();
    wait_for_intervals(&out, "clear", 1).await;
    let cleared = node.action("clear", "").await;
    assert_eq!(cleared["removed"], 200, "{cleared}");
    // The reads of phase `clear` once the summary has been rewritten after the clear (it
    // is rewritten every interval), then two rounds more: every key is read after it.
    let gets = |summary: &Value| {
        summary["phases"].as_array().map_or(0, |phases| {
            phases
                .iter()
                .filter(|p| p["phase"] == "clear")
                .map(|p| p["gets"].as_u64().unwrap_or(0))
                .sum::<u64>()
        })
    };
    let intervals = |summary: &Value| summary["intervals"].as_array().map_or(0, Vec::len);
    let read = || serde_json::from_slice::<Value>(&std::fs::read(&out).unwrap()).unwrap();
    let seen = intervals(&read());
    wait_for_summary(&out, "an interval after the clear", |s| intervals(s) > seen).await;
    let at_clear = gets(&read());
    wait_for_summary(&out, "two rounds after the clear", |s| {
        gets(s) >= at_clear + 400
    })
    .await;
    let (output, summary) = stop_load(child, &out).await;

    let totals = &summary["totals"];
    assert_eq!(totals["errors"], 0, "{}", summary["error_samples"]);
    assert_eq!(totals["corrupt"], 0, "{}", summary["corrupt_samples"]);
    assert_eq!(phase(&summary, "steady")["misses"], 0);
    // Every key was read after the clear, missed once and refilled.
    let clear = phase(&summary, "clear");
    assert_eq!(clear["misses"], 200, "{clear}");
    assert_eq!(clear["puts"], 200, "{clear}");
    assert_eq!(summary["config"]["rounds"], true);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let field = |line: &str, name: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(name)?.parse().ok())
    };
    let rounds: Vec<(u64, u64)> = stdout
        .lines()
        .filter_map(|line| Some((field(line, "round=")?, field(line, "whole=")?)))
        .collect();
    assert!(
        rounds.windows(2).all(|w| w[0] <= w[1])
            && rounds.iter().all(|(picked, whole)| whole <= picked)
            && rounds.last().is_some_and(|&(_, whole)| whole >= 3),
        "interval lines end with the rounds all picked and the rounds whole: {stdout}"
    );
}

#[tokio::test]
async fn a_node_killed_and_restarted_under_load_costs_tries_not_failed_calls() {
    // A fixed port, so the restarted node listens where the killed one did.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let node = Node::start_on(&listen, &[]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("summary.json");
    let phase_file = dir.path().join("phase");
    let child = start_phased_load(&listen, &out, &phase_file);
    wait_for_intervals(&out, "steady", 2).await;
    std::fs::write(&phase_file, "crash\n").unwrap();
    // SIGKILL with calls in flight (4 workers calling back to back), then a new process
    // on the same port: its connections are reset and refused until it listens.
    drop(node);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let node = Node::start_on(&listen, &[]);
    // The new node is empty: the keys miss and are refilled.
    wait_for_misses(&out, "crash").await;
    std::fs::write(&phase_file, "after\n").unwrap();
    wait_for_recovery(&out, "after").await;
    let (_, summary) = stop_load(child, &out).await;
    drop(node);

    let totals = &summary["totals"];
    assert_eq!(totals["errors"], 0, "{}", summary["error_samples"]);
    assert_eq!(totals["corrupt"], 0, "{}", summary["corrupt_samples"]);
    assert_eq!(phase(&summary, "steady")["retried"], 0, "{summary}");
    let crash = phase(&summary, "crash");
    // Each worker's call in flight lost its connection, and its next tries were refused
    // until the new process listened.
    let retried = crash["retried"].as_u64().unwrap();
    println!("a kill and restart under 4 workers: {retried} tries again, 0 failed calls; {crash}");
    assert!(retried >= 1, "{crash}");
    assert!(crash["misses"].as_u64().unwrap() > 0, "{crash}");
    assert!(
        !summary["retry_samples"].as_array().unwrap().is_empty(),
        "{summary}"
    );
}

#[tokio::test]
async fn sigterm_ends_the_run_cleanly_with_a_summary() {
    let node = Node::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("summary.json");
    let load_args = args(&node.addr, &out, &["--duration", "60s", "--no-warm"]);
    let child = spawn_load(&load_args);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, summary) = tokio::time::timeout(Duration::from_secs(15), stop_load(child, &out))
        .await
        .expect("the load stopped soon after SIGTERM");
    assert_eq!(summary["finished"], true);
    assert_eq!(summary["stopped_by"], "signal");
    assert_eq!(summary["warm"], Value::Null);
    let totals = &summary["totals"];
    assert!(totals["seconds"].as_f64().unwrap() < 10.0, "{totals}");
    // Without warming, the first reads miss and are refilled.
    assert!(totals["misses"].as_u64().unwrap() > 0, "{totals}");
    assert_eq!(totals["errors"], 0, "{}", summary["error_samples"]);
}

#[tokio::test]
async fn the_ring_aware_mode_sends_each_key_to_its_owner() {
    let nodes: Vec<Node> = (0..3)
        .map(|i| Node::start(&["--member-id", &format!("local-{i}")]))
        .collect();
    let members: Vec<Value> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| serde_json::json!({"id": format!("local-{i}"), "address": n.addr}))
        .collect();
    let topology = serde_json::json!({"topology": {"version": 1, "members": members}});
    for node in &nodes {
        node.action("configure", &topology.to_string()).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("summary.json");
    let (_, summary) = run_load(
        args(&nodes[1].addr, &out, &["--duration", "2s", "--ring"]),
        &out,
    )
    .await;
    assert_eq!(summary["config"]["mode"], "ring");
    let totals = &summary["totals"];
    assert!(totals["hit_ratio"].as_f64().unwrap() > 0.9, "{totals}");
    assert_eq!(totals["errors"], 0, "{}", summary["error_samples"]);
    assert_eq!(totals["corrupt"], 0, "{}", summary["corrupt_samples"]);
    let mut entries = 0;
    for node in &nodes {
        let stats = node.action("stats", "").await;
        let here = stats["entries"].as_u64().unwrap();
        assert!(here > 20, "{stats}");
        entries += here;
    }
    assert_eq!(entries, 200);
}

#[test]
fn bad_flags_and_an_unreachable_target_fail_at_start() {
    let output = load(&["--target", "127.0.0.1:1", "--concurrency", "0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--concurrency"));

    // Rounds read every key equally often: not with a skew.
    let output = load(&["--target", "127.0.0.1:1", "--rounds", "--zipf", "1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--zipf 0"));

    let output = load(&["--target", "grpc://127.0.0.1:1"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("host:port"));

    // A port nobody listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let target = format!("127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let output = load(&["--target", &target, "--connect-timeout", "1s"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot reach") && stderr.contains("UNAVAILABLE"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// A CA, a certificate for localhost signed by it and a client certificate, written to
/// `dir` as `ca.crt`, `tls.crt`/`tls.key` and `client.crt`/`client.key`.
fn write_pki(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    for (stem, name) in [("tls", "localhost"), ("client", "load-client")] {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        std::fs::write(dir.join(format!("{stem}.crt")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{stem}.key")), key.serialize_pem()).unwrap();
    }
}

#[tokio::test]
async fn over_tls_with_a_client_certificate_every_call_works_and_without_one_none() {
    let dir = tempfile::tempdir().unwrap();
    write_pki(dir.path());
    let file = |name: &str| dir.path().join(name).display().to_string();
    let node = Node::start(&[
        "--tls-cert-file",
        &file("tls.crt"),
        "--tls-key-file",
        &file("tls.key"),
        "--tls-ca-file",
        &file("ca.crt"),
        "--tls-client-auth",
        "required",
    ]);
    let port = node.addr.rsplit_once(':').unwrap().1;
    let target = format!("localhost:{port}");
    let out = dir.path().join("summary.json");
    let tls = [
        "--tls-ca",
        &file("ca.crt"),
        "--tls-client-cert",
        &file("client.crt"),
        "--tls-client-key",
        &file("client.key"),
        "--duration",
        "2s",
    ];
    let (_, summary) = run_load(args(&target, &out, &tls), &out).await;
    let totals = &summary["totals"];
    assert_eq!(summary["warm"]["errors"], 0, "{}", summary["error_samples"]);
    assert!(totals["gets"].as_u64().unwrap() > 0, "{totals}");
    assert_eq!(totals["errors"], 0, "{}", summary["error_samples"]);
    assert_eq!(totals["corrupt"], 0);

    // The CA alone, no client certificate: the node refuses the connection.
    let output = load(&[
        "--target",
        &target,
        "--tls-ca",
        &file("ca.crt"),
        "--connect-timeout",
        "1s",
    ])
    .output()
    .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot reach"), "{stderr}");
    // A key without its certificate is a usage error.
    let output = load(&["--target", &target, "--tls-client-key", &file("client.key")])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}
