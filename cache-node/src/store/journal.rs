//! What the store tells a write-behind tier (the disk tier, `persist/`) about its
//! entries, in the order the changes happen.
//!
//! The store calls a [`Journal`] under its lock, so the order of the calls is the order
//! of the changes: a removal reported after a put of the same key really came after it.
//! An implementation must only record and return: no I/O, no blocking, no call back
//! into the store. No I/O here either.
//!
//! Owns: the [`Journal`] trait and its settings, not the disk: must not import
//! `persist/` (which implements the trait) nor, like all of `store/`, any gRPC or
//! Flight crate.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::entry::Entry;

/// Receives every change of the store's contents (see the module docs).
pub trait Journal: Send + Sync + fmt::Debug {
    /// `entry` is now stored under `key` (a put, a handover, a replacement), last read
    /// or written at `last_access` on the store clock.
    fn stored(&self, key: &Bytes, entry: &Arc<Entry>, last_access: Duration);

    /// `key` no longer holds an entry, whatever the cause (invalidate, clear, eviction,
    /// expiry, replacement, migration).
    fn removed(&self, key: &Bytes);

    /// `key` was read at `now` (store clock). Reported at most once per entry per
    /// [`JournalSettings::read_debounce`], and only for reads that hit.
    fn read(&self, key: &Bytes, now: Duration);
}

/// A journal and how often reads are reported to it.
#[derive(Debug, Clone)]
pub struct JournalSettings {
    /// The journal.
    pub journal: Arc<dyn Journal>,
    /// A hit is reported only if the entry's last reported access is at least this old.
    pub read_debounce: Duration,
}
