//! What a [`Store`](super::Store) and its puts share: the state behind the store's one
//! lock ([`Shared`], with the clock and the key hasher), and the budget reservations of
//! put bytes still arriving ([`IntakeReservation`], [`IntakeCover`]).
//!
//! Owns: taking the lock (removed entries are dropped after it is released) and giving
//! intake reservations back. Below the store's face (`mod.rs`) and `put.rs`, which both
//! use it; imports only `state` and `clock`. No I/O.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::clock::Clock;
use super::config::StoreConfig;
use super::state::Inner;

/// Budget held for bytes of a put still arriving; released on drop.
pub struct IntakeReservation {
    pub(super) shared: Arc<Shared>,
    pub(super) bytes: u64,
}

impl IntakeReservation {
    /// The bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Gives back what is held above `bytes` (a reservation never grows).
    pub fn shrink_to(&mut self, bytes: u64) {
        let released = self.bytes.saturating_sub(bytes);
        if released > 0 {
            self.bytes -= released;
            self.shared
                .with_inner(|inner| inner.release_intake(released));
        }
    }
}

impl std::fmt::Debug for IntakeReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntakeReservation")
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl Drop for IntakeReservation {
    fn drop(&mut self) {
        let bytes = self.bytes;
        self.shared.with_inner(|inner| inner.release_intake(bytes));
    }
}

/// Whether every message of one DoPut so far had its bytes reserved as it arrived
/// ([`Store::reserve_intake`](super::Store::reserve_intake), by the wire layer). While that holds, the put need not
/// reserve a message's received bytes a second time while it decodes them: the intake
/// reservation still covers them (it is released only when the next message is read).
/// One per request, shared by the wire layer (which sets it) and the put.
///
/// It also carries the bodies of large messages that the wire layer received straight
/// into their own exactly sized allocation (`wire::intake`), each with its intake
/// reservation: the put reads the message, takes its body back
/// ([`take_body`](Self::take_body)) and, once the body is sealed as it is, turns that
/// reservation into the entry's charge ([`claim`](Self::claim),
/// [`PendingPut::reserve_replacing`](super::PendingPut::reserve_replacing)) so the bytes are counted once. At most the messages
/// the gRPC decoder has read ahead of the put wait here (it reads a message only when
/// the put asks for the next one), and the bytes of every one are reserved.
#[derive(Debug, Default)]
pub struct IntakeCover {
    uncovered: std::sync::atomic::AtomicBool,
    /// Bodies received but not yet read by the put, in message order.
    diverted: Mutex<std::collections::VecDeque<DivertedBody>>,
    /// The reservation of the body of the message the put reads now, until the put
    /// claims it or reads the next message; with the body's address and length.
    reading: Mutex<Option<(usize, usize, IntakeReservation)>>,
}

/// A message body the wire layer received into its own allocation.
#[derive(Debug)]
struct DivertedBody {
    /// The message's place in the request stream (0 for the first).
    sequence: u64,
    body: Bytes,
    reservation: Option<IntakeReservation>,
}

impl IntakeCover {
    /// Keeps the body of message `sequence` (received into its own allocation, with the
    /// intake reservation that covers it) until the put reads the message.
    pub fn divert(&self, sequence: u64, body: Bytes, reservation: Option<IntakeReservation>) {
        self.diverted.lock().push_back(DivertedBody {
            sequence,
            body,
            reservation,
        });
    }

    /// The body of message `sequence`, if the wire layer received it apart; called once
    /// per message as the put reads it, in order. The reservation of the message read
    /// before is given back unless the put claimed it.
    pub fn take_body(&self, sequence: u64) -> Option<Bytes> {
        let mut reading = self.reading.lock();
        *reading = None;
        let mut diverted = self.diverted.lock();
        // Bodies of messages the reader never saw (none, in order) are dropped.
        while diverted.front().is_some_and(|d| d.sequence < sequence) {
            diverted.pop_front();
        }
        if diverted.front().is_none_or(|d| d.sequence != sequence) {
            return None;
        }
        let taken = diverted.pop_front()?;
        if let Some(reservation) = taken.reservation {
            *reading = Some((taken.body.as_ptr() as usize, taken.body.len(), reservation));
        }
        Some(taken.body)
    }

    /// The intake reservation of `body` if it is the diverted body of the message read
    /// last (the caller then owns it).
    pub fn claim(&self, body: &[u8]) -> Option<IntakeReservation> {
        let mut reading = self.reading.lock();
        match &*reading {
            Some((address, len, _)) if *address == body.as_ptr() as usize && *len == body.len() => {
                reading.take().map(|(_, _, reservation)| reservation)
            }
            _ => None,
        }
    }

    /// A message of the request passed without a reservation (no room beside others).
    pub fn note_uncovered(&self) {
        self.uncovered
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether every message so far was reserved on arrival.
    pub fn all_covered(&self) -> bool {
        !self.uncovered.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// State shared by a [`Store`](super::Store) and its [`PendingPut`](super::PendingPut)s.
pub(crate) struct Shared {
    inner: Mutex<Inner>,
    pub(super) clock: Arc<dyn Clock>,
    hasher: RandomState,
}

impl Shared {
    /// The shared state of an empty store with `config` (validated by the caller).
    pub(super) fn new(config: StoreConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: Mutex::new(Inner::new(config)),
            clock,
            hasher: RandomState::new(),
        }
    }

    /// Runs `operation` under the lock, then drops removed entries after unlocking,
    /// so freeing Arrow memory never delays other callers.
    pub(crate) fn with_inner<R>(&self, operation: impl FnOnce(&mut Inner) -> R) -> R {
        let (result, removed) = {
            let mut inner = self.inner.lock();
            #[cfg(test)]
            lock_scope::HELD.set(true);
            let result = operation(&mut inner);
            #[cfg(test)]
            lock_scope::HELD.set(false);
            (result, std::mem::take(&mut inner.graveyard))
        };
        drop(removed);
        result
    }

    pub(super) fn key_hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }
}

/// The lock-scope rule, checked in tests: an entry's memory is never freed while the
/// store's lock is held (freeing megabytes of Arrow buffers would make every reader
/// wait). `Entry`'s drop counts violations per thread; `check_invariants` asserts that
/// the calling thread made none.
#[cfg(test)]
pub(crate) mod lock_scope {
    use std::cell::Cell;

    thread_local! {
        /// Whether this thread is inside `Shared::with_inner`.
        pub(crate) static HELD: Cell<bool> = const { Cell::new(false) };
        /// Entries this thread dropped while inside it.
        static FREED_UNDER_LOCK: Cell<u64> = const { Cell::new(0) };
    }

    /// Called when an entry is dropped.
    pub(crate) fn entry_dropped() {
        if HELD.get() {
            FREED_UNDER_LOCK.set(FREED_UNDER_LOCK.get() + 1);
        }
    }

    /// Entries this thread freed under the lock so far; resets the count.
    pub(crate) fn take_freed_under_lock() -> u64 {
        FREED_UNDER_LOCK.replace(0)
    }
}
