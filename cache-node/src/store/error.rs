//! The store's error and result types.
//!
//! Owns: [`Error`] (the store's refusals; the node maps them to its own error in
//! `crate::assembly::store_error`). Imports nothing; every module of the store may use
//! it. No I/O.

/// Errors of the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A [`StoreConfig`](super::StoreConfig) field breaks a rule.
    #[error("invalid store config: {field} {rule}")]
    InvalidConfig {
        /// The offending field.
        field: &'static str,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// The put's total size exceeds `max_entry_bytes`.
    #[error("entry of {size} bytes exceeds the limit of {max} bytes per entry")]
    EntryTooLarge {
        /// The put's size so far (reservation) or its exact weight (commit).
        size: u64,
        /// The configured `max_entry_bytes`.
        max: u64,
    },
    /// The bytes cannot fit in the budget even after evicting every stored entry,
    /// because other puts hold the rest as reservations.
    #[error("store budget exhausted: {needed} bytes needed, {available} free")]
    OverBudget {
        /// Bytes asked for.
        needed: u64,
        /// Bytes free before any eviction.
        available: u64,
    },
    /// An invalidation covering the key happened while the put was in flight; the
    /// data was discarded.
    #[error("put discarded: its key was invalidated while it was being written")]
    InvalidatedDuringPut,
    /// The batches could not be encoded into their stored IPC form (a batch that does
    /// not match the schema).
    #[error("the batches cannot be stored: {0}")]
    Unencodable(String),
}

/// The store's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
