//! `flightcache-load`: a load generator for FlightCache that proves configuration changes
//! happen without downtime and without losing the hot set. It warms a hot set of keys,
//! runs cache-aside readers against a node or a pool (verified hits, refill on miss) and
//! reports hit ratio, errors by gRPC code and latency per interval and per phase (the phase
//! file labels e.g. `ttl-change`, `restart`, `scale-out`), with a JSON summary for
//! scripts. See `docs/load-test.md`.
//!
//! Owns: the binary's entry point and its modules. It uses the node's library as a
//! client only (`client`, `key`, `ticket`, the Flight message-size limit); must not
//! import the node's server side (`server`, `store`, `cluster`, `wire`).

#[path = "flightcache_load/cli.rs"]
mod cli;
#[path = "flightcache_load/histogram.rs"]
mod histogram;
#[path = "flightcache_load/record.rs"]
mod record;
#[path = "flightcache_load/run.rs"]
mod run;
#[path = "flightcache_load/target.rs"]
mod target;
#[path = "flightcache_load/workload.rs"]
mod workload;

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match run::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("flightcache-load: {}", crds::chain(&err));
            ExitCode::from(err.exit_code())
        }
    }
}
