//! `flightcache-operator`: parse flags, start logging, run the operator.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = operator::config::Config::parse();
    operator::telemetry::init(config.log_format);
    operator::run(config).await
}
