//! Arrow-exact memory weight of cached batches.
//!
//! Weight is what the store charges against its byte budget. It counts every
//! distinct Arrow allocation reachable from the batches exactly once (buffers, null
//! bitmaps, child data, dictionary values), at its full capacity, because that is the
//! memory the entry keeps alive. Two consequences:
//!
//! * A zero-copy slice pins its parent: a one-row slice of a 47 MiB batch weighs
//!   47 MiB (sealing copies it into its own IPC body, `wire::seal`).
//! * Buffers shared between columns or batches (the same array used twice, or IPC
//!   decoding that slices many columns out of one receive buffer) are counted once.
//!
//! Stored batches are sealed (`wire::seal`): each is a view into one exactly sized IPC
//! body, so its weight is that body. The Flight layer reserves [`batch_weight`] of each
//! sealed batch as it arrives; the store computes the entry's weight at commit.
//! Pure CPU work, no I/O.
//!
//! Owns: the weight rules. Pure; imports arrow's buffer and data types and nothing
//! outside the store.

use std::collections::HashSet;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_data::ArrayData;

/// Fixed bytes charged once per entry: the entry header, its index and expiry
/// bookkeeping, and the schema, which are not Arrow buffers.
pub const ENTRY_OVERHEAD_BYTES: u64 = 256;

/// Fixed bytes charged per record batch: the batch header and its column handles.
pub const BATCH_OVERHEAD_BYTES: u64 = 128;

/// Fixed bytes charged per tag of an entry, beside the tag's own bytes: its place in the
/// store's tag index (a reference-counted string and a set slot holding the key).
pub const TAG_OVERHEAD_BYTES: u64 = 64;

/// What an entry's tags cost: each tag's bytes plus [`TAG_OVERHEAD_BYTES`].
pub fn tags_weight(tags: &[std::sync::Arc<str>]) -> u64 {
    tags.iter()
        .map(|tag| u64::try_from(tag.len()).unwrap_or(u64::MAX) + TAG_OVERHEAD_BYTES)
        .fold(0, u64::saturating_add)
}

/// Identity of an allocation: start of the underlying allocation and its capacity.
///
/// Slices of one allocation share both, so they collapse to one key.
type AllocationKey = (usize, usize);

/// Returns the weight of an entry made of `batches`: [`ENTRY_OVERHEAD_BYTES`], plus
/// [`BATCH_OVERHEAD_BYTES`] per batch, plus the capacity of every distinct buffer
/// reachable from any column of any batch, each counted once.
pub fn entry_weight(batches: &[RecordBatch]) -> u64 {
    let mut seen = HashSet::new();
    let buffers: u64 = batches
        .iter()
        .map(|batch| BATCH_OVERHEAD_BYTES.saturating_add(distinct_buffer_bytes(batch, &mut seen)))
        .fold(0, u64::saturating_add);
    ENTRY_OVERHEAD_BYTES.saturating_add(buffers)
}

/// Returns the weight of one batch on its own: [`BATCH_OVERHEAD_BYTES`] plus the
/// capacity of every distinct buffer it references.
///
/// Used by the Flight layer to grow a put's reservation as batches arrive. The sum of
/// `batch_weight` over an entry's batches is never below its [`entry_weight`] minus
/// [`ENTRY_OVERHEAD_BYTES`] (sharing across batches can only lower the latter).
pub fn batch_weight(batch: &RecordBatch) -> u64 {
    let mut seen = HashSet::new();
    BATCH_OVERHEAD_BYTES.saturating_add(distinct_buffer_bytes(batch, &mut seen))
}

/// Sums the capacities of the buffers of `batch` not already in `seen`.
fn distinct_buffer_bytes(batch: &RecordBatch, seen: &mut HashSet<AllocationKey>) -> u64 {
    batch
        .columns()
        .iter()
        .map(|column| array_data_bytes(&column.to_data(), seen))
        .fold(0, u64::saturating_add)
}

/// Walks `data` recursively (buffers, null bitmap, children, dictionary values).
fn array_data_bytes(data: &ArrayData, seen: &mut HashSet<AllocationKey>) -> u64 {
    let own = data
        .buffers()
        .iter()
        .chain(data.nulls().map(|nulls| nulls.buffer()))
        .map(|buffer| buffer_bytes(buffer, seen))
        .fold(0, u64::saturating_add);
    // Dictionary values are the child data of a dictionary array.
    data.child_data()
        .iter()
        .map(|child| array_data_bytes(child, seen))
        .fold(own, u64::saturating_add)
}

/// Returns the buffer's allocation capacity the first time its allocation is seen.
fn buffer_bytes(buffer: &Buffer, seen: &mut HashSet<AllocationKey>) -> u64 {
    let key = (buffer.data_ptr().as_ptr().addr(), buffer.capacity());
    if seen.insert(key) {
        u64::try_from(buffer.capacity()).unwrap_or(u64::MAX)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array};
    use arrow_buffer::ScalarBuffer;

    use super::*;

    fn batch_of(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    #[test]
    fn a_slice_pins_its_parent() {
        // About 47 MiB of i64 values, sliced down to one row.
        let rows = 6_200_000_i64;
        let big = batch_of(vec![("v", Arc::new(Int64Array::from_iter_values(0..rows)))]);
        let one_row = big.slice(1234, 1);

        let naive = batch_weight(&one_row);
        assert!(
            naive >= 47 * 1024 * 1024,
            "naive weight {naive} should pin the parent"
        );
    }

    #[test]
    fn same_array_in_two_columns_counts_once() {
        let shared: ArrayRef = Arc::new(Int64Array::from_iter_values(0..10_000));
        let once = batch_of(vec![("a", shared.clone())]);
        let twice = batch_of(vec![("a", shared.clone()), ("b", shared)]);
        assert_eq!(batch_weight(&twice), batch_weight(&once));
        assert_eq!(
            entry_weight(&[once.clone(), once.clone()]),
            entry_weight(&[once]) + BATCH_OVERHEAD_BYTES
        );
    }

    #[test]
    fn columns_sliced_from_one_receive_buffer_are_not_over_counted() {
        // IPC decoding hands out per-column views into a single message buffer.
        let rows = 1_000;
        let columns = 3;
        let receive = Buffer::from_vec((0..(rows * columns) as i64).collect::<Vec<_>>());
        let capacity = receive.capacity() as u64;
        let arrays: Vec<(String, ArrayRef)> = (0..columns)
            .map(|column| {
                let values = ScalarBuffer::<i64>::new(receive.clone(), column * rows, rows);
                let array: ArrayRef = Arc::new(Int64Array::new(values, None));
                (format!("c{column}"), array)
            })
            .collect();
        let batch = RecordBatch::try_from_iter(arrays).unwrap();
        assert_eq!(batch_weight(&batch), BATCH_OVERHEAD_BYTES + capacity);
        assert_eq!(
            entry_weight(std::slice::from_ref(&batch)),
            ENTRY_OVERHEAD_BYTES + BATCH_OVERHEAD_BYTES + capacity
        );
    }
}
