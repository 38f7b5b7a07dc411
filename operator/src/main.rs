//! `flightcache-operator`: parse flags, start logging, run the operator.
//!
//! Owns: the process entry point; imports only `config`, `telemetry` and `run` of the
//! library.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = operator::config::Config::parse();
    operator::telemetry::init(config.log_format);
    operator::run(config).await
}
