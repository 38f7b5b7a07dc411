//! The command line of `flightcache-load` (clap derive; every flag also an environment
//! variable) and its validation into [`Settings`]. No I/O.
//!
//! Owns: the flags and [`Settings`]. A leaf: imports no other module of the load
//! generator and nothing of `cache_node`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// Load generator for FlightCache: warms a hot set of keys, then runs cache-aside readers
/// (skewed DoGets, verified contents, refill on miss) against a node or a pool and reports
/// hit ratio, errors and latency per interval and per phase, with a JSON summary.
#[derive(Debug, Parser)]
#[command(name = "flightcache-load", version)]
pub(crate) struct Cli {
    /// `host:port` of a node or of the pool's Service (e.g.
    /// `analytics-hot.ns.svc.cluster.local:50051`).
    #[arg(long, env = "FLIGHTCACHE_LOAD_TARGET")]
    pub(crate) target: String,

    /// Bearer token for a cluster with auth.
    #[arg(long, env = "FLIGHTCACHE_LOAD_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,

    /// Number of keys in the hot set (`<prefix>/0` .. `<prefix>/<keys-1>`).
    #[arg(long, env = "FLIGHTCACHE_LOAD_KEYS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(crate) keys: u64,

    /// Rows of each key's value (a 4-column batch: int64, int64, float64, utf8).
    #[arg(long, env = "FLIGHTCACHE_LOAD_ROWS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) rows: u64,

    /// Concurrent workers (each with its own connection, unless --ring).
    #[arg(long, env = "FLIGHTCACHE_LOAD_CONCURRENCY", default_value_t = 16,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub(crate) concurrency: u64,

    /// At most this many reads per second, all workers together (each worker paced at
    /// its share, a miss's refill inside its read's slot). Without it each worker reads
    /// again as soon as its answer comes: a closed loop that takes whatever the machine
    /// gives. The warm phase is never paced.
    #[arg(long, env = "FLIGHTCACHE_LOAD_RATE",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) rate: Option<u64>,

    /// How long the run phase lasts (after the warm phase), e.g. `60s`, `5m`.
    #[arg(long, env = "FLIGHTCACHE_LOAD_DURATION", default_value = "60s",
          value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,

    /// Route each key to its owner with the ring-aware client instead of sending every
    /// call to the target (which forwards).
    #[arg(long, env = "FLIGHTCACHE_LOAD_RING")]
    pub(crate) ring: bool,

    /// Length of a reporting interval (one stdout line and one `intervals` entry each).
    #[arg(long, env = "FLIGHTCACHE_LOAD_REPORT_EVERY", default_value = "1s",
          value_parser = parse_positive_duration)]
    pub(crate) report_every: Duration,

    /// Write the JSON summary here (rewritten after every interval with `"finished":
    /// false`, atomically); without it the summary is printed as the last stdout line.
    #[arg(long, env = "FLIGHTCACHE_LOAD_OUT")]
    pub(crate) out: Option<PathBuf>,

    /// A file whose content (first line, trimmed) labels the current phase, re-read every
    /// 100 ms; intervals and per-phase figures carry the label. Missing or empty: the label
    /// stays as it was (initially `run`).
    #[arg(long, env = "FLIGHTCACHE_LOAD_PHASE_FILE")]
    pub(crate) phase_file: Option<PathBuf>,

    /// Skip the warm phase (the keys are already in the cache).
    #[arg(long, env = "FLIGHTCACHE_LOAD_NO_WARM")]
    pub(crate) no_warm: bool,

    /// Key prefix: keys are `<prefix>/<i>`.
    #[arg(long, env = "FLIGHTCACHE_LOAD_PREFIX", default_value = "load",
          value_parser = parse_prefix)]
    pub(crate) prefix: String,

    /// Zipf exponent of the key popularity (key 0 hottest); 0 picks keys uniformly.
    #[arg(long, env = "FLIGHTCACHE_LOAD_ZIPF", default_value_t = 1.0,
          value_parser = parse_zipf)]
    pub(crate) zipf: f64,

    /// Read the keys in rounds: the workers together read every key once per round, each
    /// round in a new random order (a uniform load in which a lost key is read again
    /// within one round). Only with `--zipf 0`. Each interval line then ends with
    /// `round=N`, the rounds completed.
    #[arg(long, env = "FLIGHTCACHE_LOAD_ROUNDS")]
    pub(crate) rounds: bool,

    /// Seed of the key choice (runs with the same seed pick the same key sequences).
    #[arg(long, env = "FLIGHTCACHE_LOAD_SEED", default_value_t = 1)]
    pub(crate) seed: u64,

    /// Client deadline of each call; a call without an answer by then counts as
    /// `DEADLINE_EXCEEDED`.
    #[arg(long, env = "FLIGHTCACHE_LOAD_TIMEOUT", default_value = "5s",
          value_parser = parse_positive_duration)]
    pub(crate) timeout: Duration,

    /// How long to keep trying to reach the target at start before giving up (exit 1).
    #[arg(long, env = "FLIGHTCACHE_LOAD_CONNECT_TIMEOUT", default_value = "10s",
          value_parser = humantime::parse_duration)]
    pub(crate) connect_timeout: Duration,

    /// Speak TLS to the target, trusting the CA certificate(s) in this PEM file (the
    /// `ca.crt` of the cluster's TLS Secret). Not with --ring.
    #[arg(long, env = "FLIGHTCACHE_LOAD_TLS_CA")]
    pub(crate) tls_ca: Option<std::path::PathBuf>,

    /// Present this client certificate chain (PEM) to nodes that require client
    /// certificates (`spec.tls.clientAuth: required`); with --tls-client-key and --tls-ca.
    #[arg(long, env = "FLIGHTCACHE_LOAD_TLS_CLIENT_CERT", requires_all = ["tls_client_key", "tls_ca"])]
    pub(crate) tls_client_cert: Option<std::path::PathBuf>,

    /// The private key (PEM) of --tls-client-cert.
    #[arg(
        long,
        env = "FLIGHTCACHE_LOAD_TLS_CLIENT_KEY",
        requires = "tls_client_cert"
    )]
    pub(crate) tls_client_key: Option<std::path::PathBuf>,
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|err| err.to_string())?;
    if duration.is_zero() {
        return Err("must be longer than 0s".into());
    }
    Ok(duration)
}

fn parse_zipf(text: &str) -> Result<f64, String> {
    let s: f64 = text
        .parse()
        .map_err(|_| format!("'{text}' is not a number"))?;
    if !s.is_finite() || !(0.0..=10.0).contains(&s) {
        return Err("must be between 0 (uniform) and 10".into());
    }
    Ok(s)
}

fn parse_prefix(text: &str) -> Result<String, String> {
    if text.is_empty() || text.starts_with('/') || text.ends_with('/') {
        return Err("must be non-empty and neither start nor end with '/'".into());
    }
    Ok(text.to_owned())
}

/// Checks that `--rounds` comes with uniform picks (`--zipf 0`).
pub(crate) fn check_key_choice(zipf: f64, rounds: bool) -> Result<(), String> {
    if rounds && zipf != 0.0 {
        return Err("--rounds reads every key once per round: it needs --zipf 0".into());
    }
    Ok(())
}

/// Checks `host:port` (the shape, not that it resolves).
pub(crate) fn check_target(target: &str) -> Result<(), String> {
    let valid = target
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if valid && !target.contains("://") {
        Ok(())
    } else {
        Err(format!(
            "--target '{target}' is not host:port (e.g. 127.0.0.1:50051, without grpc://)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_command_line() {
        let cli = Cli::try_parse_from(["flightcache-load", "--target", "127.0.0.1:50051"]).unwrap();
        assert_eq!(cli.keys, 2000);
        assert_eq!(cli.rows, 100);
        assert_eq!(cli.concurrency, 16);
        assert_eq!(cli.duration, Duration::from_secs(60));
        assert_eq!(cli.report_every, Duration::from_secs(1));
        assert!(!cli.ring && !cli.no_warm);
        assert_eq!(cli.zipf, 1.0);
        assert!(!cli.rounds);
        assert_eq!(cli.rate, None);
    }

    #[test]
    fn invalid_flags_are_refused_naming_the_flag() {
        let cases: [(&[&str], &str); 7] = [
            (&["--concurrency", "0"], "--concurrency"),
            (&["--keys=0"], "--keys"),
            (&["--duration", "soon"], "--duration"),
            (&["--report-every", "0s"], "--report-every"),
            (&["--zipf=-1"], "--zipf"),
            (&["--rate", "0"], "--rate"),
            (&["--rate", "fast"], "--rate"),
        ];
        for (args, flag) in cases {
            let mut argv = vec!["flightcache-load", "--target", "h:1"];
            argv.extend_from_slice(args);
            let err = Cli::try_parse_from(argv).unwrap_err().to_string();
            assert!(err.contains(flag), "{args:?}: {err}");
        }
    }

    #[test]
    fn rounds_need_uniform_picks() {
        assert!(check_key_choice(0.0, true).is_ok());
        assert!(check_key_choice(1.0, false).is_ok());
        let err = check_key_choice(1.0, true).unwrap_err();
        assert!(
            err.contains("--rounds") && err.contains("--zipf 0"),
            "{err}"
        );
        let cli = Cli::try_parse_from(["flightcache-load", "--target", "h:1", "--rounds"]).unwrap();
        assert!(cli.rounds);
    }

    #[test]
    fn targets_are_host_and_port() {
        assert!(check_target("analytics-hot.ns.svc.cluster.local:50051").is_ok());
        assert!(check_target("127.0.0.1:1").is_ok());
        for bad in ["grpc://h:1", "h", ":50051", "h:0", "h:port"] {
            assert!(check_target(bad).is_err(), "{bad}");
        }
    }
}
