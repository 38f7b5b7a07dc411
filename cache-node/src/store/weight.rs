//! Arrow-exact memory weight of cached batches, and compaction of batches into
//! freshly allocated, right-sized buffers.
//!
//! Weight is what the store charges against its byte budget. It counts every
//! distinct Arrow allocation reachable from the batches exactly once (buffers, null
//! bitmaps, child data, dictionary values), at its full capacity, because that is the
//! memory the entry keeps alive. Two consequences:
//!
//! * A zero-copy slice pins its parent: a one-row slice of a 47 MiB batch weighs
//!   47 MiB until it is compacted.
//! * Buffers shared between columns or batches (the same array used twice, or IPC
//!   decoding that slices many columns out of one receive buffer) are counted once.
//!
//! Stored batches are sealed (`store::wire`): each is a view into one exactly sized IPC
//! body, so its weight is that body. The Flight layer reserves [`batch_weight`] of each
//! sealed batch as it arrives; the store computes the entry's weight at commit.
//! [`compact_batch`] is the copy-based alternative for callers that keep batches
//! without a stored IPC form.
//! Pure CPU work, no I/O.

use std::collections::HashSet;

use arrow_array::{
    Array, ArrayRef, BinaryViewArray, RecordBatch, RecordBatchOptions, StringViewArray, make_array,
};
use arrow_buffer::Buffer;
use arrow_data::ArrayData;
use arrow_data::transform::MutableArrayData;
use arrow_schema::{ArrowError, DataType};

/// Fixed bytes charged once per entry: the entry header, its index and expiry
/// bookkeeping, and the schema, which are not Arrow buffers.
pub const ENTRY_OVERHEAD_BYTES: u64 = 256;

/// Fixed bytes charged per record batch: the batch header and its column handles.
pub const BATCH_OVERHEAD_BYTES: u64 = 128;

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

/// Deep-copies every column of `batch` into new buffers sized for its used length.
///
/// The result shares no memory with the input, so slices stop pinning their parents
/// and views into a larger network receive buffer are released once the input is
/// dropped. Dictionary values are compacted too, and view arrays (`Utf8View`,
/// `BinaryView`) are garbage-collected so only referenced bytes are kept.
///
/// # Errors
///
/// Returns the Arrow error if a column cannot be copied (for example an offset
/// overflow) or the rebuilt batch fails validation.
pub fn compact_batch(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let columns = batch
        .columns()
        .iter()
        .map(|column| compact_array(column.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(batch.schema(), columns, &options)
}

/// Deep-copies one array into right-sized buffers; see [`compact_batch`].
///
/// # Errors
///
/// Returns the Arrow error if the array cannot be copied or rebuilt.
pub fn compact_array(array: &dyn Array) -> Result<ArrayRef, ArrowError> {
    Ok(make_array(compact_array_data(&array.to_data())?))
}

fn compact_array_data(data: &ArrayData) -> Result<ArrayData, ArrowError> {
    let len = data.len();
    let mut copy = MutableArrayData::try_new(vec![data], false, len)?;
    copy.try_extend(0, 0, len)?;
    let frozen = copy.freeze();
    if needs_second_pass(frozen.data_type()) {
        compact_retained_children(frozen)
    } else {
        Ok(frozen)
    }
}

/// Whether `MutableArrayData` may have kept references to the source's memory
/// somewhere in this type: it reuses dictionary values and view data buffers as-is.
fn needs_second_pass(data_type: &DataType) -> bool {
    match data_type {
        DataType::Dictionary(_, _) | DataType::Utf8View | DataType::BinaryView => true,
        DataType::List(field)
        | DataType::LargeList(field)
        | DataType::ListView(field)
        | DataType::LargeListView(field)
        | DataType::FixedSizeList(field, _)
        | DataType::Map(field, _) => needs_second_pass(field.data_type()),
        DataType::Struct(fields) => fields
            .iter()
            .any(|field| needs_second_pass(field.data_type())),
        DataType::Union(fields, _) => fields
            .iter()
            .any(|(_, field)| needs_second_pass(field.data_type())),
        DataType::RunEndEncoded(_, values) => needs_second_pass(values.data_type()),
        _ => false,
    }
}

/// Replaces memory that `MutableArrayData` carried over from the source with
/// compacted copies: dictionary values, view data buffers, and the same inside
/// nested children.
fn compact_retained_children(data: ArrayData) -> Result<ArrayData, ArrowError> {
    match data.data_type() {
        DataType::Utf8View => Ok(StringViewArray::from(data).gc().into_data()),
        DataType::BinaryView => Ok(BinaryViewArray::from(data).gc().into_data()),
        DataType::Dictionary(_, _) => {
            let values = data
                .child_data()
                .iter()
                .map(compact_array_data)
                .collect::<Result<Vec<_>, _>>()?;
            data.into_builder().child_data(values).build()
        }
        _ => {
            let children = data
                .child_data()
                .iter()
                .map(|child| {
                    if needs_second_pass(child.data_type()) {
                        compact_retained_children(child.clone())
                    } else {
                        Ok(child.clone())
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            data.into_builder().child_data(children).build()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{Int32Builder, ListBuilder};
    use arrow_array::types::Int32Type;
    use arrow_array::{DictionaryArray, Int64Array, StringArray, StructArray};
    use arrow_buffer::ScalarBuffer;
    use arrow_schema::{Field, Schema};

    use super::*;

    fn batch_of(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    #[test]
    fn slice_pins_its_parent_until_compacted() {
        // About 47 MiB of i64 values, sliced down to one row.
        let rows = 6_200_000_i64;
        let big = batch_of(vec![("v", Arc::new(Int64Array::from_iter_values(0..rows)))]);
        let one_row = big.slice(1234, 1);

        let naive = batch_weight(&one_row);
        assert!(
            naive >= 47 * 1024 * 1024,
            "naive weight {naive} should pin the parent"
        );

        let compacted = compact_batch(&one_row).unwrap();
        assert_eq!(compacted, one_row);
        let weight = batch_weight(&compacted);
        assert!(
            weight <= BATCH_OVERHEAD_BYTES + 128,
            "compacted weight {weight}"
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

    #[test]
    fn strings_with_nulls_round_trip_compaction() {
        let strings: StringArray = (0..1000)
            .map(|i| (i % 7 != 0).then(|| format!("value-{i}")))
            .collect();
        let batch = batch_of(vec![("s", Arc::new(strings))]);
        let slice = batch.slice(100, 50);
        let compacted = compact_batch(&slice).unwrap();
        assert_eq!(compacted, slice);
        assert!(batch_weight(&compacted) < batch_weight(&slice));
    }

    #[test]
    fn lists_round_trip_compaction() {
        let mut builder = ListBuilder::new(Int32Builder::new());
        for row in 0..500 {
            if row % 11 == 0 {
                builder.append_null();
            } else {
                builder.values().append_slice(&[row, row + 1, row + 2]);
                builder.append(true);
            }
        }
        let batch = batch_of(vec![("l", Arc::new(builder.finish()))]);
        let slice = batch.slice(37, 120);
        let compacted = compact_batch(&slice).unwrap();
        assert_eq!(compacted, slice);
        assert!(batch_weight(&compacted) < batch_weight(&slice));
    }

    #[test]
    fn structs_round_trip_compaction() {
        let numbers: ArrayRef = Arc::new(Int64Array::from_iter(
            (0..300).map(|i| (i % 3 != 0).then_some(i)),
        ));
        let names: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..300).map(|i| format!("n{i}")),
        ));
        let structs = StructArray::from(vec![
            (
                Arc::new(Field::new("number", arrow_schema::DataType::Int64, true)),
                numbers,
            ),
            (
                Arc::new(Field::new("name", arrow_schema::DataType::Utf8, false)),
                names,
            ),
        ]);
        let batch = batch_of(vec![("st", Arc::new(structs))]);
        let slice = batch.slice(10, 20);
        let compacted = compact_batch(&slice).unwrap();
        assert_eq!(compacted, slice);
        assert!(batch_weight(&compacted) < batch_weight(&slice));
    }

    #[test]
    fn dictionaries_round_trip_compaction_with_fresh_values() {
        let dictionary: DictionaryArray<Int32Type> = (0..2000)
            .map(|i| (i % 5 != 0).then(|| ["red", "green", "blue"][i % 3]))
            .collect();
        let batch = batch_of(vec![("d", Arc::new(dictionary))]);
        let slice = batch.slice(500, 10);
        let compacted = compact_batch(&slice).unwrap();
        assert_eq!(compacted, slice);

        let values_ptr =
            |batch: &RecordBatch| batch.column(0).to_data().child_data()[0].buffers()[0].data_ptr();
        assert_ne!(
            values_ptr(&compacted),
            values_ptr(&slice),
            "dictionary values must be copied"
        );
    }

    #[test]
    fn views_release_unreferenced_data_buffers() {
        let long = |i: usize| format!("a string long enough not to be inlined #{i:08}");
        let views = StringViewArray::from_iter_values((0..20_000).map(long));
        let batch = batch_of(vec![("v", Arc::new(views))]);
        let slice = batch.slice(7, 2);
        let compacted = compact_batch(&slice).unwrap();
        assert_eq!(compacted, slice);
        assert!(
            batch_weight(&compacted) < 1024,
            "weight {}",
            batch_weight(&compacted)
        );
    }

    #[test]
    fn compaction_keeps_the_schema_and_row_count_of_column_less_batches() {
        let schema = Arc::new(Schema::empty());
        let options = RecordBatchOptions::new().with_row_count(Some(5));
        let batch = RecordBatch::try_new_with_options(schema, vec![], &options).unwrap();
        let compacted = compact_batch(&batch).unwrap();
        assert_eq!(compacted.num_rows(), 5);
        assert_eq!(batch_weight(&compacted), BATCH_OVERHEAD_BYTES);
    }
}
