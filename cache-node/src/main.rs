//! `flightcache-node`: parse the configuration, start the node, stop it on SIGTERM/Ctrl-C.
//!
//! Owns: the process entry point and signal handling; imports only `config`,
//! `telemetry` and `server` of the library, and sets the global allocator.

/// jemalloc, configured at build time (`.cargo/config.toml`): see ADR 0009 and
/// `cache_node::allocator`.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = cache_node::config::Config::load()?;
    cache_node::telemetry::init(config.log_format);
    cache_node::server::run(config, shutdown_signal()).await?;
    Ok(())
}

/// Resolves on SIGTERM (Kubernetes) or Ctrl-C (a terminal).
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
