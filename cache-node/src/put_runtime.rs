//! Where the CPU work of a put runs: a tokio runtime of its own, whose threads run at a
//! lower OS priority (nice [`PUT_THREAD_NICE`]) than the runtime that serves hits.
//!
//! Sealing a large put message is copying and checking: the seal copies the body into an
//! exactly sized allocation and validates it, and the pages fault in. On the serving
//! runtime that work held its workers for milliseconds at a time, and a hit arriving
//! meanwhile queued behind it: with four clients putting 3.6 MB tables, a 12 kB hit's p50
//! went from 96 µs to 1.2–1.3 ms, while the same puts sent to *another* process on the
//! same 2 cores left it at 69–71 µs (docs/benchmarks.md, "Hits never wait on puts"). The
//! DoPut ingestion hands each large message's sealing to a put thread
//! (`flight::put::OFFLOADED_MESSAGE_BYTES`), and when the cores are busy the kernel runs a
//! waiting hit first. A put still gets every cycle a hit does not need, so an idle node
//! ingests at full speed. Small messages are sealed where they arrive: a hand-over costs
//! two thread wake-ups, more than sealing them (ADR 0010).
//!
//! One runtime per process, built on first use, never dropped (a runtime must not be
//! dropped from async code). If it cannot be built, the work runs where it is awaited,
//! as before. Owns no Flight or store logic: it runs futures.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::task::JoinHandle;

/// Nice value of the put threads. 10 gives a runnable hit thread (nice 0) about nine
/// tenths of a contended core while a put thread waits; puts are never starved, only
/// run second.
pub const PUT_THREAD_NICE: i32 = 10;

/// Name of the put threads (`top -H`, `perf`).
const THREAD_NAME: &str = "flightcache-put";

static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();

fn build() -> std::io::Result<Runtime> {
    // As many threads as the process may use cores (cgroup quota included), so a node
    // with nothing else to do ingests as fast as it did on the serving runtime.
    let threads = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
    Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(THREAD_NAME)
        .on_thread_start(lower_this_threads_priority)
        .enable_all()
        .build()
}

/// Lowers the calling thread's scheduling priority by [`PUT_THREAD_NICE`] (to at most
/// 19, the lowest). Raising a nice value needs no privilege; if the kernel refuses
/// anyway, the thread keeps the process's priority and hits merely lose the advantage
/// described above.
fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    {
        let thread = Some(rustix::thread::gettid());
        let current = rustix::process::getpriority_process(thread).unwrap_or(0);
        let lower = (current + PUT_THREAD_NICE).min(19);
        if let Err(err) = rustix::process::setpriority_process(thread, lower) {
            tracing::debug!(error = %err, "a put thread keeps the process's priority");
        }
    }
}

fn handle() -> Option<Handle> {
    RUNTIME
        .get_or_init(|| match build() {
            Ok(runtime) => Some(runtime),
            Err(err) => {
                tracing::warn!(error = %err, "no put runtime; puts run on the serving runtime");
                None
            }
        })
        .as_ref()
        .map(|runtime| runtime.handle().clone())
}

/// A put's work ended without an answer: it panicked (the put stores nothing).
#[derive(Debug, thiserror::Error)]
#[error("the put's work ended without an answer: {0}")]
pub struct Lost(String);

/// Runs `work` on the put runtime and waits for its output. Dropping the returned
/// future (the client went away, the call was cancelled) aborts the work, as dropping
/// `work` itself would.
pub async fn run<F>(work: F) -> Result<F::Output, Lost>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let Some(handle) = handle() else {
        return Ok(work.await);
    };
    let mut task = AbortOnDrop(handle.spawn(work));
    match (&mut task.0).await {
        Ok(output) => Ok(output),
        Err(err) => Err(Lost(err.to_string())),
    }
}

/// Aborts the spawned work when the caller stops waiting for it.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_a_put_thread_at_the_lower_priority() {
        let (name, nice) = run(async {
            let name = std::thread::current().name().map(str::to_owned);
            let nice = rustix::process::getpriority_process(Some(rustix::thread::gettid()));
            (name, nice.ok())
        })
        .await
        .unwrap();
        assert_eq!(name.as_deref(), Some(THREAD_NAME));
        let here = rustix::process::getpriority_process(None).unwrap();
        assert_eq!(nice, Some((here + PUT_THREAD_NICE).min(19)));
    }

    #[tokio::test]
    async fn a_panic_in_the_work_is_an_error_not_a_panic_of_the_caller() {
        let lost = run(async { panic!("boom") }).await.unwrap_err();
        assert!(lost.to_string().contains("boom") || lost.to_string().contains("panic"));
    }

    #[tokio::test]
    async fn dropping_the_caller_aborts_the_work() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let waiting = run(async move {
            // Never completes unless aborted (the sender is dropped only by the abort).
            let _keep = tx;
            std::future::pending::<()>().await;
        });
        let timed_out = tokio::time::timeout(std::time::Duration::from_millis(50), waiting).await;
        assert!(timed_out.is_err());
        // The work was aborted: its `tx` dropped, so `rx` ends.
        tokio::time::timeout(std::time::Duration::from_secs(5), rx)
            .await
            .expect("the work was aborted")
            .unwrap_err();
    }
}
