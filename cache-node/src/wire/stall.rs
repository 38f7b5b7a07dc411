//! Answers whose readers stopped reading: found and let go.
//!
//! HTTP/2 takes an answer's next frame only when the client's window has room, so a DoGet
//! that is never read would pin its entry's bytes (and every replaced version of it) for
//! as long as its connection lives; a client that grants no window at all pins even the
//! smallest answer. A ListFlights answer likewise holds its infos (up to 16 MiB) until
//! they are sent. Every stored-frames answer and every listing is registered here when it
//! begins; one sweeper per node looks at the answers still open a few times per stall
//! limit and lets go of what is left of each whose reader has taken nothing for the limit.
//! An answer that ends or is dropped leaves the register at the next sweep. The cost per
//! answer is one push under a lock; no task or timer per answer.
//!
//! No network I/O. Must not import the Flight service (`flight/`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::Stream;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;

/// The items of one answer not yet taken (a DoGet's frames, a listing's infos), and how
/// far its reader got.
pub struct Answer<T = Bytes> {
    /// `None` once a stalled reader's items were let go.
    frames: Mutex<Option<std::vec::IntoIter<T>>>,
    started: Instant,
    /// When the reader last took a frame, in milliseconds since `started`.
    last_taken_ms: AtomicU64,
    /// Set once every frame was taken.
    done: AtomicBool,
}

/// What the reader of an answer gets next.
pub enum Next<T = Bytes> {
    /// A frame (an item).
    Frame(T),
    /// Every frame was taken.
    End,
    /// The reader stalled past the limit and the frames were let go.
    LetGo,
}

impl<T> Answer<T> {
    fn new(frames: Vec<T>) -> Self {
        Self {
            frames: Mutex::new(Some(frames.into_iter())),
            started: Instant::now(),
            last_taken_ms: AtomicU64::new(0),
            done: AtomicBool::new(false),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Takes the next frame for the reader (HTTP/2 had room for it).
    pub fn take(&self) -> Next<T> {
        let next = self.frames.lock().as_mut().map(Iterator::next);
        match next {
            None => Next::LetGo,
            Some(Some(frame)) => {
                self.last_taken_ms.store(self.now_ms(), Ordering::Relaxed);
                Next::Frame(frame)
            }
            Some(None) => {
                self.done.store(true, Ordering::Relaxed);
                Next::End
            }
        }
    }

    /// Whether nothing is left to take (every frame taken, or let go).
    pub fn is_empty(&self) -> bool {
        self.frames
            .lock()
            .as_ref()
            .is_none_or(|frames| frames.len() == 0)
    }

    /// Lets go of the frames if the reader has taken none for `max_stall`; whether it did.
    fn let_go_if_stalled(&self, max_stall: Duration) -> bool {
        let since = self
            .now_ms()
            .saturating_sub(self.last_taken_ms.load(Ordering::Relaxed));
        if u128::from(since) < max_stall.as_millis() {
            return false;
        }
        // An answer whose frames were all taken is only waiting for its trailers.
        let mut frames = self.frames.lock();
        if frames.as_ref().is_some_and(|frames| frames.len() > 0) {
            *frames = None;
            return true;
        }
        false
    }
}

/// An open answer, as the sweeper sees it whatever its items are.
trait Open: Send + Sync {
    /// Whether every item was taken.
    fn ended(&self) -> bool;
    /// See [`Answer::let_go_if_stalled`].
    fn let_go_if_stalled(&self, max_stall: Duration) -> bool;
}

impl<T: Send> Open for Answer<T> {
    fn ended(&self) -> bool {
        self.done.load(Ordering::Relaxed)
    }

    fn let_go_if_stalled(&self, max_stall: Duration) -> bool {
        Answer::let_go_if_stalled(self, max_stall)
    }
}

/// The answers open on a node, and the sweeper that ends stalled ones.
#[derive(Clone)]
pub struct StallWatch {
    shared: Arc<Shared>,
}

struct Shared {
    open: Mutex<Vec<Weak<dyn Open>>>,
    max_stall: Duration,
    stalled_reads: Counter,
}

impl std::fmt::Debug for StallWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StallWatch")
            .field("max_stall", &self.shared.max_stall)
            .finish_non_exhaustive()
    }
}

impl StallWatch {
    /// Starts the sweeper (on the current tokio runtime); it ends when the last clone of
    /// the watch is dropped. `stalled_reads` counts the answers let go.
    pub fn start(max_stall: Duration, stalled_reads: Counter) -> Self {
        let shared = Arc::new(Shared {
            open: Mutex::new(Vec::new()),
            max_stall,
            stalled_reads,
        });
        tokio::spawn(sweep(Arc::downgrade(&shared)));
        Self { shared }
    }

    /// The longest a reader may take no frame.
    pub fn max_stall(&self) -> Duration {
        self.shared.max_stall
    }

    /// Registers an answer of `frames` (or any items).
    pub fn watch<T: Send + 'static>(&self, frames: Vec<T>) -> Arc<Answer<T>> {
        let answer = Arc::new(Answer::new(frames));
        let open: Weak<dyn Open> = Arc::downgrade(&answer) as Weak<dyn Open>;
        self.shared.open.lock().push(open);
        answer
    }

    /// `items` as a registered answer's stream: the items as the reader takes them, then
    /// its end; `let_go` as its last item instead when the reader took nothing for the
    /// stall limit and the rest was let go.
    pub fn stream<T: Send + 'static, E: Send + 'static>(
        &self,
        items: Vec<T>,
        let_go: E,
    ) -> impl Stream<Item = Result<T, E>> + Send + 'static {
        let answer = self.watch(items);
        futures::stream::unfold((answer, Some(let_go)), |(answer, let_go)| async move {
            match answer.take() {
                Next::Frame(item) => Some((Ok(item), (answer, let_go))),
                Next::End => None,
                Next::LetGo => let_go.map(|err| (Err(err), (answer, None))),
            }
        })
    }

    /// Answers registered and not yet swept out (for tests).
    #[cfg(test)]
    fn registered(&self) -> usize {
        self.shared.open.lock().len()
    }
}

/// How often the open answers are looked at: a quarter of the stall limit, at most once a
/// second, so an answer is let go within 1.25 limits.
fn sweep_period(max_stall: Duration) -> Duration {
    (max_stall / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

async fn sweep(shared: Weak<Shared>) {
    let Some(period) = shared
        .upgrade()
        .map(|shared| sweep_period(shared.max_stall))
    else {
        return;
    };
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        // Swept outside the lock, so answers beginning meanwhile are not held up.
        let mut open = std::mem::take(&mut *shared.open.lock());
        open.retain(|answer| {
            let Some(answer) = answer.upgrade() else {
                return false;
            };
            if answer.ended() {
                return false;
            }
            if answer.let_go_if_stalled(shared.max_stall) {
                shared.stalled_reads.inc();
                tracing::debug!(
                    max_stall = ?shared.max_stall,
                    "an answer (DoGet, ListFlights) was not read: what is left of it is let go"
                );
                return false;
            }
            true
        });
        shared.open.lock().append(&mut open);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(count: usize) -> Vec<Bytes> {
        (0..count).map(|i| Bytes::from(vec![i as u8; 16])).collect()
    }

    #[test]
    fn an_answer_whose_reader_took_nothing_for_the_limit_is_let_go_once() {
        let fresh = Answer::new(frames(3));
        assert!(
            !fresh.let_go_if_stalled(Duration::from_secs(2)),
            "within the limit"
        );
        let aged = Answer {
            started: Instant::now() - Duration::from_secs(3),
            ..Answer::new(frames(3))
        };
        assert!(aged.let_go_if_stalled(Duration::from_secs(2)));
        assert!(matches!(aged.take(), Next::LetGo));
        assert!(aged.is_empty());
        assert!(
            !aged.let_go_if_stalled(Duration::from_secs(2)),
            "let go once"
        );
    }

    #[tokio::test]
    async fn a_listing_read_to_its_end_ends_and_an_unread_one_ends_with_the_let_go_error() {
        use futures::StreamExt;
        let stalled = Counter::default();
        let watch = StallWatch::start(Duration::from_millis(200), stalled.clone());
        let read: Vec<_> = watch.stream(vec![1, 2, 3], "let go").collect().await;
        assert_eq!(read, vec![Ok(1), Ok(2), Ok(3)]);
        let mut unread = Box::pin(watch.stream(vec![1, 2, 3], "let go"));
        assert_eq!(unread.next().await, Some(Ok(1)));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            unread.next().await,
            Some(Err("let go")),
            "the rest was let go"
        );
        assert_eq!(unread.next().await, None);
        assert_eq!(stalled.get(), 1);
        assert_eq!(watch.registered(), 0);
    }

    #[tokio::test]
    async fn a_reader_that_reads_keeps_its_answer_and_finished_answers_leave_the_register() {
        let stalled = Counter::default();
        let watch = StallWatch::start(Duration::from_millis(500), stalled.clone());
        let read = watch.watch(frames(3));
        let unread = watch.watch(frames(3));
        let dropped = watch.watch(frames(3));
        drop(dropped);
        for _ in 0..3 {
            assert!(matches!(read.take(), Next::Frame(_)));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(matches!(read.take(), Next::End));
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        assert!(
            matches!(unread.take(), Next::LetGo),
            "the unread one was let go"
        );
        assert_eq!(stalled.get(), 1);
        assert_eq!(
            watch.registered(),
            0,
            "ended, dropped and let-go answers swept out"
        );
    }
}
