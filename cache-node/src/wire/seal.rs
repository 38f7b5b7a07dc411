//! Sealing: an entry's Arrow IPC messages encoded once, when the entry is put, into the
//! gRPC frames a DoGet sends (the store keeps them opaque, `store::sealed`).
//!
//! Sealing a batch encodes it as Flight IPC messages (dictionaries hydrated, messages
//! kept under the Flight size cap) into one exactly sized body allocation per message,
//! then decodes the batch back from that body without copying. The stored batch and the
//! stored message share that memory, so an entry holds its Arrow data once, compact (a
//! slice never pins its parent, no network receive buffer stays alive), and a read
//! sends the stored bytes as they are: no IPC encoding and no copy into a message
//! buffer per read (docs/benchmarks.md).
//!
//! A message's gRPC frame is `head ++ body`: `head` holds the 5-byte gRPC prefix and
//! the protobuf `FlightData` fields up to the body (`data_header`, then the key and
//! length of `data_body`); `body` is the IPC body itself. Pure CPU work, no I/O. Owns the
//! protobuf field numbers and the gRPC prefix; must not import the store's internals.

use std::collections::HashMap;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_buffer::Buffer;
use arrow_flight::FlightData;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_ipc::convert::try_schema_from_flatbuffer_bytes;
use arrow_ipc::writer::IpcWriteOptions;
use arrow_ipc::{MessageHeader, MetadataVersion, reader, root_as_message};
use arrow_schema::{ArrowError, Schema, SchemaRef};
use bytes::{BufMut, Bytes, BytesMut};
use futures::{FutureExt, StreamExt};

use crate::store::{
    CommitOutcome, Lifetime, PendingPut, SealedBatch, SealedEntry, SealedSchema, WireMessage,
};

/// gRPC's default limit on a received message (tonic, grpc-go, grpc-java clients).
pub const GRPC_DEFAULT_MESSAGE_LIMIT: usize = 4 << 20;

/// Largest IPC message (header and body) the node stores and sends; a batch above it
/// is split into several. Just below gRPC's default 4 MiB message limit, so any client
/// reads every message unconfigured, and as large as that allows: a result in fewer
/// messages reads faster (the pyarrow client pays about a millisecond per extra message
/// of a stream, see docs/benchmarks.md).
pub const MAX_MESSAGE_BODY_BYTES: usize = GRPC_DEFAULT_MESSAGE_LIMIT - (64 << 10);

/// Alignment of each buffer inside an IPC body: enough for every Arrow native type
/// (`i128`, `i256` read at 16), so decoding from the body never copies, with at most
/// 15 bytes of padding per buffer.
const BODY_ALIGNMENT: usize = 16;

/// Protobuf field numbers of `arrow.flight.protocol.FlightData`.
const DATA_HEADER_FIELD: u64 = 2;
const DATA_BODY_FIELD: u64 = 1000;

/// Runs one arrow-ipc decode of client bytes, turning a panic inside arrow into the
/// client's error. The checks above catch the malformed shapes known to panic, but
/// arrow-ipc's reader is not panic-free on hostile input (apache/arrow-rs#7124): a
/// header that declares an offsets buffer whose length is not a whole number of offsets
/// trips an assertion in arrow-data's validation. A put must end in INVALID_ARGUMENT,
/// never in a reset stream. Nothing outlives a caught panic: the put that sent the
/// message is abandoned with its partial state.
fn decode_untrusted<T>(
    what: &str,
    decode: impl FnOnce() -> Result<T, ArrowError>,
) -> Result<T, ArrowError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode)).unwrap_or_else(|panic| {
        let reason = panic
            .downcast_ref::<&str>()
            .map(|reason| (*reason).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "malformed buffers".to_owned());
        Err(ArrowError::IpcError(format!(
            "the {what} does not decode: {reason}"
        )))
    })
}

/// Checks, before arrow slices anything, that every buffer a record batch (or the data of
/// a dictionary batch) declares lies inside its `body_len`-byte body. arrow-ipc slices
/// the body with the declared offsets and lengths as they are, and panics on a body
/// shorter than its header says (an untrusted DoPut could reset the stream that way).
fn check_buffers_within_body(
    header: &arrow_ipc::RecordBatch<'_>,
    body_len: usize,
) -> Result<(), ArrowError> {
    let Some(buffers) = header.buffers() else {
        return Ok(());
    };
    for (index, buffer) in buffers.iter().enumerate() {
        let (offset, length) = (buffer.offset(), buffer.length());
        let end = offset.checked_add(length);
        let inside = offset >= 0
            && length >= 0
            && end.is_some_and(|end| usize::try_from(end).is_ok_and(|end| end <= body_len));
        if !inside {
            return Err(ArrowError::IpcError(format!(
                "buffer {index} of the message (offset {offset}, length {length}) lies outside \
                 its {body_len}-byte body"
            )));
        }
    }
    Ok(())
}

/// Builds the gRPC frame of a stored message and turns it back into `FlightData`.
impl WireMessage {
    pub(crate) fn new(message: &FlightData) -> Self {
        let header_len = message.data_header.len();
        let body_len = message.data_body.len();
        let header_field = field_len(DATA_HEADER_FIELD, header_len);
        let body_field = if body_len > 0 {
            field_len(DATA_BODY_FIELD, body_len)
        } else {
            0
        };
        let body_prefix = body_field - body_len;
        let mut head = BytesMut::with_capacity(5 + header_field + body_prefix);
        head.put_u8(0); // not compressed
        // A message is at most a few MiB (MAX_MESSAGE_BODY_BYTES), far below u32::MAX.
        head.put_u32(u32::try_from(header_field + body_field).unwrap_or(u32::MAX));
        put_varint(&mut head, DATA_HEADER_FIELD << 3 | 2);
        put_varint(&mut head, header_len as u64);
        let header_start = head.len();
        head.extend_from_slice(&message.data_header);
        let header = header_start..head.len();
        if body_len > 0 {
            put_varint(&mut head, DATA_BODY_FIELD << 3 | 2);
            put_varint(&mut head, body_len as u64);
        }
        Self {
            head: head.freeze(),
            header,
            body: message.data_body.clone(),
        }
    }

    /// The message as `FlightData`, sharing its bytes.
    pub fn to_flight_data(&self) -> FlightData {
        FlightData {
            data_header: self.ipc_header(),
            data_body: self.body.clone(),
            ..FlightData::default()
        }
    }
}

impl SealedSchema {
    /// Prepares the schema of an entry whose batches arrive with `input`.
    ///
    /// # Errors
    /// The Arrow error if the schema cannot be encoded.
    pub fn new(input: SchemaRef) -> Result<Self, ArrowError> {
        let encoder = encoder(&input, futures::stream::empty().boxed());
        let schema = encoder
            .known_schema()
            .ok_or_else(|| ArrowError::IpcError("the encoder lost the schema".into()))?;
        let messages = drain(encoder)?;
        let first = messages
            .first()
            .ok_or_else(|| ArrowError::IpcError("no schema message was encoded".into()))?;
        Ok(Self {
            schema,
            message: WireMessage::new(first),
            input,
        })
    }

    /// Encodes `batch` (of the input schema) into one message per part of at most
    /// [`MAX_MESSAGE_BODY_BYTES`] and
    /// decodes each part back from its message.
    ///
    /// # Errors
    /// The Arrow error if the batch does not match the schema or cannot be encoded.
    pub fn seal(&self, batch: &RecordBatch) -> Result<Vec<SealedBatch>, ArrowError> {
        // Split by the bytes the rows use. (The encoder's own split counts whole
        // allocations, which for a slice, or a batch decoded from a network buffer, is
        // the parent's size and would cut it into needless pieces.)
        let used: usize = batch
            .columns()
            .iter()
            .map(|column| column.to_data().get_slice_memory_size())
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .sum();
        let parts = used
            .div_ceil(MAX_MESSAGE_BODY_BYTES)
            .clamp(1, batch.num_rows().max(1));
        let rows_per_part = batch.num_rows().div_ceil(parts).max(1);
        // Parts still to encode as (offset, rows), the next one last.
        let mut pending = Vec::with_capacity(parts);
        let mut offset = batch.num_rows();
        while offset > 0 {
            let start = (offset - 1) / rows_per_part * rows_per_part;
            pending.push((start, offset - start));
            offset = start;
        }
        if pending.is_empty() {
            pending.push((0, 0));
        }
        let mut sealed = Vec::with_capacity(parts);
        while let Some((offset, rows)) = pending.pop() {
            let source = futures::stream::iter([Ok(batch.slice(offset, rows))]).boxed();
            let messages = drain(encoder(&self.input, source))?;
            // The first message is the schema again (the encoder repeats it per stream).
            let message = messages.into_iter().nth(1).ok_or_else(|| {
                ArrowError::IpcError("the encoder produced no batch message".into())
            })?;
            let size = message.data_header.len() + message.data_body.len();
            if size > MAX_MESSAGE_BODY_BYTES && rows > 1 {
                // The estimate was short (padding, a wide header): halve the part.
                let half = rows / 2;
                pending.push((offset + half, rows - half));
                pending.push((offset, half));
                continue;
            }
            sealed.push(self.decode(message)?);
        }
        Ok(sealed)
    }

    /// Keeps a received batch message as it came, when it can be served as it is: an
    /// uncompressed record batch of a schema without dictionaries, within the message
    /// size cap. The batch is decoded (and validated) from a body in an exactly sized
    /// allocation: the received one when it is that already (the wire layer received a
    /// large body apart, `wire::intake`), else a copy, so nothing points into a receive
    /// buffer and no encoding is needed. `Err(message)`: the message needs
    /// [`seal`](Self::seal).
    ///
    /// # Errors
    /// The Arrow error if the message does not decode against the schema.
    pub fn adopt(
        &self,
        message: FlightData,
    ) -> Result<std::result::Result<SealedBatch, FlightData>, ArrowError> {
        if self.schema.fields() != self.input.fields()
            || message.data_header.len() + message.data_body.len() > MAX_MESSAGE_BODY_BYTES
        {
            return Ok(Err(message));
        }
        let Ok(ipc) = root_as_message(&message.data_header) else {
            return Ok(Err(message));
        };
        let plain = ipc
            .header_as_record_batch()
            .is_some_and(|header| header.compression().is_none());
        if !plain {
            return Ok(Err(message));
        }
        self.decode(message).map(Ok)
    }

    fn decode(&self, mut message: FlightData) -> Result<SealedBatch, ArrowError> {
        // Taken, not cloned: a second reference would make `exact` copy the body.
        let body = exact(std::mem::take(&mut message.data_body));
        let message = FlightData {
            data_body: body.clone(),
            ..message
        };
        let ipc = root_as_message(&message.data_header)
            .map_err(|err| ArrowError::IpcError(format!("unreadable IPC header: {err}")))?;
        let header = ipc
            .header_as_record_batch()
            .ok_or_else(|| ArrowError::IpcError("the message is not a record batch".into()))?;
        check_buffers_within_body(&header, body.len())?;
        let batch = decode_untrusted("record batch", || {
            reader::read_record_batch(
                &Buffer::from(body),
                header,
                self.schema.clone(),
                &HashMap::new(),
                None,
                &ipc.version(),
            )
        })?;
        Ok(SealedBatch {
            batch,
            message: WireMessage::new(&message),
        })
    }
}

/// What one received IPC message contributed to an entry being put.
#[derive(Debug)]
pub enum Received {
    /// A schema message (the first sets the entry's schema; later ones must match it).
    Schema(Schema),
    /// A dictionary batch, kept for the record batches that refer to it.
    Dictionary,
    /// A record batch, sealed (one or more parts).
    Batches(Vec<SealedBatch>),
}

/// Why [`Intake::receive`] refused a message.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    /// The message is not valid Arrow IPC for the entry.
    #[error(transparent)]
    Arrow(#[from] ArrowError),
    /// Hydrating the entry's dictionary columns would exceed the intake's limit.
    #[error("its dictionary columns expand to {size} bytes once hydrated")]
    HydratesTooLarge {
        /// Bytes of the hydrated batches so far, this one included.
        size: u64,
    },
}

/// Bytes the dictionary columns of `batch` take once hydrated (every key replaced by
/// its value), computed from the keys without hydrating. A small message can carry a
/// large value and many keys to it: sealing would allocate keys × value bytes.
fn hydrated_dictionary_bytes(batch: &RecordBatch) -> u64 {
    batch
        .columns()
        .iter()
        .map(|column| hydrated_bytes(column.as_ref()))
        .fold(0, u64::saturating_add)
}

fn hydrated_bytes(array: &dyn Array) -> u64 {
    let Some(dictionary) = array.as_any_dictionary_opt() else {
        return 0;
    };
    let values = dictionary.values();
    let value_bytes: Box<dyn Fn(usize) -> u64> =
        if let Some(strings) = values.as_string_opt::<i32>() {
            Box::new(move |i| strings.value_length(i).unsigned_abs().into())
        } else if let Some(strings) = values.as_string_opt::<i64>() {
            Box::new(move |i| strings.value_length(i).unsigned_abs())
        } else if let Some(bytes) = values.as_binary_opt::<i32>() {
            Box::new(move |i| bytes.value_length(i).unsigned_abs().into())
        } else if let Some(bytes) = values.as_binary_opt::<i64>() {
            Box::new(move |i| bytes.value_length(i).unsigned_abs())
        } else if let Some(strings) = values.as_string_view_opt() {
            Box::new(move |i| strings.value(i).len() as u64)
        } else if let Some(bytes) = values.as_binary_view_opt() {
            Box::new(move |i| bytes.value(i).len() as u64)
        } else {
            // Fixed-width values, or nested ones: their average size.
            let each = values
                .data_type()
                .primitive_width()
                .map(|width| width as u64)
                .unwrap_or_else(|| {
                    (values.get_array_memory_size() as u64).div_ceil(values.len().max(1) as u64)
                });
            Box::new(move |_| each)
        };
    // Plus an offset per row for the hydrated column.
    let per_row_overhead = 8;
    dictionary
        .normalized_keys()
        .into_iter()
        .filter(|key| *key < values.len())
        .map(|key| value_bytes(key) + per_row_overhead)
        .fold(0, u64::saturating_add)
}

/// Turns the IPC messages of a DoPut into sealed batches, one message at a time.
///
/// A plain record batch is adopted as it came (one copy, no encoding); anything else
/// (dictionaries, compression, an oversized message) is decoded without copying from
/// its receive buffer and sealed. Either way the receive buffer can be dropped as soon
/// as [`receive`](Self::receive) returns.
#[derive(Debug)]
pub struct Intake {
    schema: Option<SealedSchema>,
    dictionaries: HashMap<i64, ArrayRef>,
    /// Most bytes the hydrated dictionary columns of the whole put may take.
    hydration_limit: u64,
    /// Bytes hydrated so far.
    hydrated: u64,
}

impl Intake {
    /// An intake for one put, whose dictionary columns may expand to at most
    /// `hydration_limit` bytes in all (the entry size limit: more could never be stored).
    pub fn new(hydration_limit: u64) -> Self {
        Self {
            schema: None,
            dictionaries: HashMap::new(),
            hydration_limit,
            hydrated: 0,
        }
    }

    /// The entry's schema, once a schema message has been accepted.
    pub fn schema(&self) -> Option<&SealedSchema> {
        self.schema.as_ref()
    }

    /// Sets the entry's schema (after the first [`Received::Schema`]).
    pub fn set_schema(&mut self, schema: SealedSchema) {
        self.schema = Some(schema);
    }

    /// The entry's schema, consumed at the end of the put.
    pub fn into_schema(self) -> Option<SealedSchema> {
        self.schema
    }

    /// Reads one IPC message.
    ///
    /// # Errors
    /// The Arrow error for an unreadable message, a batch or dictionary before the
    /// schema, or a batch that does not decode against the schema;
    /// [`IntakeError::HydratesTooLarge`] before hydrating dictionaries past the limit.
    pub fn receive(&mut self, message: FlightData) -> Result<Received, IntakeError> {
        let ipc = root_as_message(&message.data_header)
            .map_err(|err| ArrowError::IpcError(format!("unreadable IPC message header: {err}")))?;
        let before_schema =
            |kind: &str| ArrowError::IpcError(format!("a {kind} came before the schema"));
        match ipc.header_type() {
            MessageHeader::Schema => {
                let schema = try_schema_from_flatbuffer_bytes(&message.data_header)?;
                Ok(Received::Schema(schema))
            }
            MessageHeader::DictionaryBatch => {
                let schema = self
                    .schema
                    .as_ref()
                    .ok_or_else(|| before_schema("dictionary batch"))?;
                let dictionary = ipc.header_as_dictionary_batch().ok_or_else(|| {
                    ArrowError::IpcError("unreadable dictionary batch header".into())
                })?;
                let data = dictionary.data().ok_or_else(|| {
                    ArrowError::IpcError("a dictionary batch without data".into())
                })?;
                check_buffers_within_body(&data, message.data_body.len())?;
                let dictionaries = &mut self.dictionaries;
                decode_untrusted("dictionary batch", || {
                    reader::read_dictionary(
                        &Buffer::from(message.data_body.clone()),
                        dictionary,
                        &schema.input,
                        dictionaries,
                        &ipc.version(),
                    )
                })?;
                Ok(Received::Dictionary)
            }
            MessageHeader::RecordBatch => {
                let schema = self
                    .schema
                    .as_ref()
                    .ok_or_else(|| before_schema("record batch"))?;
                let message = match schema.adopt(message)? {
                    Ok(adopted) => return Ok(Received::Batches(vec![adopted])),
                    Err(message) => message,
                };
                let ipc = root_as_message(&message.data_header).map_err(|err| {
                    ArrowError::IpcError(format!("unreadable IPC message header: {err}"))
                })?;
                let header = ipc
                    .header_as_record_batch()
                    .ok_or_else(|| ArrowError::IpcError("unreadable record batch header".into()))?;
                check_buffers_within_body(&header, message.data_body.len())?;
                let batch = decode_untrusted("record batch", || {
                    reader::read_record_batch(
                        &Buffer::from(message.data_body.clone()),
                        header,
                        schema.input.clone(),
                        &self.dictionaries,
                        None,
                        &ipc.version(),
                    )
                })?;
                let expanded = hydrated_dictionary_bytes(&batch);
                if expanded > 0 {
                    let size = self.hydrated.saturating_add(expanded);
                    if size > self.hydration_limit {
                        return Err(IntakeError::HydratesTooLarge { size });
                    }
                    self.hydrated = size;
                }
                Ok(Received::Batches(schema.seal(&batch)?))
            }
            other => Err(ArrowError::IpcError(format!(
                "unsupported IPC message type {other:?} in a put"
            ))
            .into()),
        }
    }
}

impl SealedEntry {
    /// Seals `batches` of `schema` (for callers holding whole batches, e.g. tests and
    /// fills; a DoPut seals each batch as it arrives).
    ///
    /// # Errors
    /// The Arrow error if a batch does not match the schema or cannot be encoded.
    pub fn seal(schema: SchemaRef, batches: &[RecordBatch]) -> Result<Self, ArrowError> {
        let schema = SealedSchema::new(schema)?;
        let mut sealed = Vec::with_capacity(batches.len());
        for batch in batches {
            sealed.extend(schema.seal(batch)?);
        }
        Ok(Self {
            schema,
            batches: sealed,
        })
    }
}

/// Puts of whole batches: sealed here, then installed by the store.
impl PendingPut {
    /// Installs the entry: seals and weighs `batches` exactly, adjusts the reservation to that
    /// weight (evicting if it exceeds the reservation), makes room under the entry
    /// cap, and replaces any entry under the same key (cause `Replaced`), all at once.
    ///
    /// `ttl_override` replaces the store TTL for this entry; the TTL mode still
    /// applies. The entry's weight also counts the key bytes.
    ///
    /// # Errors
    ///
    /// [`crate::store::Error::InvalidatedDuringPut`](super::crate::store::Error::InvalidatedDuringPut),
    /// [`Error::EntryTooLarge`](super::Error::EntryTooLarge) or
    /// [`Error::OverBudget`](super::Error::OverBudget) as for
    /// [`reserve`](Self::reserve), or the error an earlier `reserve` failed with. On
    /// error nothing is stored, nothing is replaced and the reservation is released.
    pub fn commit(
        self,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        ttl_override: Option<Duration>,
    ) -> crate::store::Result<CommitOutcome> {
        let lifetime = Lifetime {
            ttl_override,
            ..Lifetime::default()
        };
        self.commit_with(schema, batches, lifetime)
    }

    /// [`commit`](Self::commit) with a full [`Lifetime`]: an entry handed over from
    /// another node keeps its age, idle time and deadline, and may ask to be installed
    /// only where the key is absent ([`CommitOutcome::kept_existing`]).
    ///
    /// # Errors
    ///
    /// As [`commit`](Self::commit).
    pub fn commit_with(
        self,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        lifetime: Lifetime,
    ) -> crate::store::Result<CommitOutcome> {
        let sealed = SealedEntry::seal(schema, &batches)
            .map_err(|err| crate::store::Error::Unencodable(err.to_string()))?;
        drop(batches);
        self.commit_sealed(sealed, lifetime)
    }
}

fn encoder(
    schema: &SchemaRef,
    source: futures::stream::BoxStream<'static, arrow_flight::error::Result<RecordBatch>>,
) -> arrow_flight::encode::FlightDataEncoder {
    let options =
        IpcWriteOptions::try_new(BODY_ALIGNMENT, false, MetadataVersion::V5).unwrap_or_default();
    FlightDataEncoderBuilder::new()
        .with_schema(schema.clone())
        .with_options(options)
        // `seal` has split the batch already.
        .with_max_flight_data_size(usize::MAX)
        .build(source)
}

/// Runs an encoder over an in-memory source (it never waits) to the end.
fn drain(encoder: arrow_flight::encode::FlightDataEncoder) -> Result<Vec<FlightData>, ArrowError> {
    let messages = encoder
        .collect::<Vec<_>>()
        .now_or_never()
        .ok_or_else(|| ArrowError::IpcError("the IPC encoder did not finish".into()))?;
    messages
        .into_iter()
        .map(|message| message.map_err(|err| ArrowError::IpcError(err.to_string())))
        .collect()
}

/// The same bytes in an allocation of exactly their length (the encoder's buffer may
/// have grown past it), so what the entry is charged is what it holds.
fn exact(bytes: Bytes) -> Bytes {
    match bytes.try_into_mut() {
        // Uniquely owned up to the end of its allocation: kept as it is. (Every
        // producer here hands out such bytes from the allocation's start: a body the
        // wire layer received apart, an encoder's output.)
        Ok(unique) if unique.capacity() == unique.len() => unique.freeze(),
        Ok(unique) => Bytes::copy_from_slice(&unique),
        // A slice of a shared buffer (a gRPC receive buffer): copied out.
        Err(shared) => Bytes::copy_from_slice(&shared),
    }
}

/// Encoded length of a length-delimited protobuf field.
fn field_len(field: u64, len: usize) -> usize {
    varint_len(field << 3 | 2) + varint_len(len as u64) + len
}

fn varint_len(mut value: u64) -> usize {
    let mut len = 1;
    while value >= 0x80 {
        value >>= 7;
        len += 1;
    }
    len
}

fn put_varint(buf: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        buf.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    buf.put_u8(value as u8);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, DictionaryArray, Int64Array, StringArray, types::Int32Type};
    use arrow_schema::{DataType, Field, Schema};
    use bytes::Buf;

    use super::*;
    use crate::store::batch_weight;

    fn table(rows: i64) -> RecordBatch {
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows));
        let names: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..rows).map(|i| format!("name-{i}")),
        ));
        RecordBatch::try_from_iter([("id", ids), ("name", names)]).unwrap()
    }

    /// Decodes a gRPC frame with the arrow-flight (prost) types, as a client does.
    fn decode_frame(message: &WireMessage) -> FlightData {
        let mut frame = BytesMut::new();
        frame.extend_from_slice(message.head());
        frame.extend_from_slice(message.body());
        let mut frame = frame.freeze();
        assert_eq!(frame.get_u8(), 0);
        let len = frame.get_u32() as usize;
        assert_eq!(frame.remaining(), len);
        <FlightData as prost::Message>::decode(frame).unwrap()
    }

    #[test]
    fn a_sealed_batch_round_trips_and_its_frame_is_valid_flight_data() {
        let sealed_schema = SealedSchema::new(table(1).schema()).unwrap();
        let batch = table(1_000);
        let sealed = sealed_schema.seal(&batch).unwrap();
        assert_eq!(sealed.len(), 1);
        assert_eq!(sealed[0].batch, batch);
        let decoded = decode_frame(&sealed[0].message);
        assert_eq!(decoded.data_body, sealed[0].message.body());
        assert_eq!(decoded, sealed[0].message.to_flight_data());
        let schema = decode_frame(&sealed_schema.message);
        assert!(schema.data_body.is_empty());
        let read = arrow_flight::utils::flight_data_to_batches(&[schema, decoded]).unwrap();
        assert_eq!(read, vec![batch]);
    }

    #[test]
    fn the_batch_shares_its_body_so_the_weight_is_the_body() {
        let sealed_schema = SealedSchema::new(table(1).schema()).unwrap();
        let parent = table(100_000);
        let slice = parent.slice(10, 5);
        let sealed = sealed_schema.seal(&slice).unwrap();
        assert_eq!(sealed.len(), 1);
        let body = sealed[0].message.body().len() as u64;
        assert_eq!(
            batch_weight(&sealed[0].batch),
            crate::store::BATCH_OVERHEAD_BYTES + body
        );
        // Five rows of two columns: well under a kilobyte, not the parent's megabytes.
        assert!(body < 1_024, "{body}");
        assert_eq!(sealed[0].batch, slice);
    }

    #[test]
    fn a_batch_over_the_message_cap_is_split() {
        let sealed_schema = SealedSchema::new(table(1).schema()).unwrap();
        let batch = table(700_000);
        let sealed = sealed_schema.seal(&batch).unwrap();
        assert!(sealed.len() > 1, "{}", sealed.len());
        for part in &sealed {
            let frame = part.message.head().len() + part.message.body().len();
            assert!(frame - 5 <= GRPC_DEFAULT_MESSAGE_LIMIT, "{frame}");
        }
        let rows: usize = sealed.iter().map(|part| part.batch.num_rows()).sum();
        assert_eq!(rows, 700_000);
        let parts: Vec<_> = sealed.iter().map(|part| part.batch.clone()).collect();
        let joined = arrow_select::concat::concat_batches(&batch.schema(), &parts).unwrap();
        assert_eq!(joined, batch);
    }

    #[test]
    fn dictionary_columns_are_stored_hydrated() {
        let dictionary: DictionaryArray<Int32Type> = vec!["a", "b", "a"].into_iter().collect();
        let schema = Arc::new(Schema::new(vec![Field::new(
            "tag",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            false,
        )]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(dictionary) as ArrayRef]).unwrap();
        let sealed_schema = SealedSchema::new(schema).unwrap();
        assert_eq!(sealed_schema.schema.field(0).data_type(), &DataType::Utf8);
        let sealed = sealed_schema.seal(&batch).unwrap();
        let tags = sealed[0]
            .batch
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(tags.iter().flatten().collect::<Vec<_>>(), ["a", "b", "a"]);
    }

    /// The messages a client would send for `batch` (schema, then the batch).
    fn client_messages(batch: &RecordBatch) -> Vec<FlightData> {
        let source = futures::stream::iter([Ok(batch.clone())]).boxed();
        drain(
            FlightDataEncoderBuilder::new()
                .with_schema(batch.schema())
                .build(source),
        )
        .unwrap()
    }

    #[test]
    fn a_plain_client_message_is_kept_as_it_came_in_its_own_allocation() {
        let batch = table(1_000);
        let sealed_schema = SealedSchema::new(batch.schema()).unwrap();
        let received = &client_messages(&batch)[1];
        // The receiver still holds the body (as a gRPC receive buffer would): copied.
        let adopted = sealed_schema.adopt(received.clone()).unwrap().unwrap();
        assert_eq!(adopted.batch, batch);
        assert_eq!(adopted.message.body(), &received.data_body);
        assert_ne!(adopted.message.body().as_ptr(), received.data_body.as_ptr());
        assert_eq!(
            batch_weight(&adopted.batch),
            crate::store::BATCH_OVERHEAD_BYTES + adopted.message.body().len() as u64
        );
        assert_eq!(
            decode_frame(&adopted.message),
            adopted.message.to_flight_data()
        );
    }

    #[test]
    fn a_body_received_apart_in_its_own_exact_allocation_is_kept_without_a_copy() {
        let batch = table(1_000);
        let sealed_schema = SealedSchema::new(batch.schema()).unwrap();
        let mut received = client_messages(&batch).swap_remove(1);
        // As `wire::intake` hands it over: uniquely owned, exactly sized.
        received.data_body = Bytes::from(received.data_body.to_vec().into_boxed_slice());
        let address = received.data_body.as_ptr();
        let adopted = sealed_schema.adopt(received).unwrap().unwrap();
        assert_eq!(adopted.batch, batch);
        assert_eq!(
            adopted.message.body().as_ptr(),
            address,
            "the same allocation"
        );
        assert_eq!(
            batch_weight(&adopted.batch),
            crate::store::BATCH_OVERHEAD_BYTES + adopted.message.body().len() as u64
        );
        // A uniquely owned body with spare capacity is copied into an exact one.
        let mut roomy = Vec::with_capacity(2 * adopted.message.body().len());
        roomy.extend_from_slice(adopted.message.body());
        let roomy = Bytes::from(roomy);
        let (address, len) = (roomy.as_ptr(), roomy.len());
        let kept = exact(roomy);
        assert_ne!(kept.as_ptr(), address);
        assert_eq!(kept.len(), len);
        assert_eq!(kept.try_into_mut().unwrap().capacity(), len);
    }

    #[test]
    fn messages_that_cannot_be_served_as_they_are_are_not_adopted() {
        let dictionary: DictionaryArray<Int32Type> = vec!["a", "b"].into_iter().collect();
        let with_dictionary =
            RecordBatch::try_from_iter([("tag", Arc::new(dictionary) as ArrayRef)]).unwrap();
        let sealed_schema = SealedSchema::new(with_dictionary.schema()).unwrap();
        let messages = client_messages(&with_dictionary);
        let last = messages.last().unwrap();
        assert!(sealed_schema.adopt(last.clone()).unwrap().is_err());
        // The schema message is not a batch.
        let plain = SealedSchema::new(table(1).schema()).unwrap();
        let schema_message = &client_messages(&table(1))[0];
        assert!(plain.adopt(schema_message.clone()).unwrap().is_err());
    }

    #[test]
    fn a_batch_of_another_schema_is_refused() {
        let sealed_schema = SealedSchema::new(table(1).schema()).unwrap();
        let other: ArrayRef = Arc::new(Int64Array::from(vec![1]));
        let other = RecordBatch::try_from_iter([("x", other)]).unwrap();
        assert!(sealed_schema.seal(&other).is_err());
    }

    mod fuzz {
        use proptest::prelude::*;

        use super::*;

        /// A put's messages (schema, dictionary, batch) for a batch with a plain, a string
        /// and a dictionary column: the shapes the intake decodes.
        fn valid_messages() -> Vec<FlightData> {
            let dictionary: DictionaryArray<Int32Type> =
                vec!["red", "green", "red", "blue"].into_iter().collect();
            let batch = RecordBatch::try_from_iter([
                (
                    "id",
                    Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as ArrayRef,
                ),
                (
                    "name",
                    Arc::new(StringArray::from(vec!["a", "bb", "ccc", "dddd"])) as ArrayRef,
                ),
                ("tag", Arc::new(dictionary) as ArrayRef),
            ])
            .unwrap();
            let source = futures::stream::iter([Ok(batch)]).boxed();
            drain(
                FlightDataEncoderBuilder::new()
                    .with_dictionary_handling(arrow_flight::encode::DictionaryHandling::Resend)
                    .build(source),
            )
            .unwrap()
        }

        #[derive(Debug, Clone)]
        enum Mutation {
            Truncate(usize),
            SetByte(usize, u8),
            Append(Vec<u8>),
        }

        fn mutation() -> impl Strategy<Value = Mutation> {
            prop_oneof![
                any::<usize>().prop_map(Mutation::Truncate),
                (any::<usize>(), any::<u8>()).prop_map(|(at, value)| Mutation::SetByte(at, value)),
                proptest::collection::vec(any::<u8>(), 1..64).prop_map(Mutation::Append),
            ]
        }

        fn mutate(bytes: &Bytes, mutation: &Mutation) -> Bytes {
            let mut bytes = bytes.to_vec();
            match mutation {
                Mutation::Truncate(at) => bytes.truncate(at % (bytes.len() + 1)),
                Mutation::SetByte(at, value) if !bytes.is_empty() => {
                    let at = at % bytes.len();
                    bytes[at] = *value;
                }
                Mutation::SetByte(..) => {}
                Mutation::Append(tail) => bytes.extend_from_slice(tail),
            }
            Bytes::from(bytes)
        }

        /// The case CI's fuzzing found: one byte of the dictionary batch's header set to
        /// 25 declares an offsets buffer that is not a whole number of offsets, on which
        /// arrow-data's validation asserts. The put is refused with a message instead.
        #[test]
        fn a_dictionary_with_a_partial_offset_is_refused_not_a_panic() {
            let mut messages = valid_messages();
            let header = &messages[1].data_header;
            messages[1].data_header =
                mutate(header, &Mutation::SetByte(11_398_600_218_501_468_648, 25));
            let mut intake = Intake::new(1 << 20);
            let Ok(Received::Schema(schema)) = intake.receive(messages[0].clone()) else {
                panic!("the schema message is valid");
            };
            intake.set_schema(SealedSchema::new(Arc::new(schema)).unwrap());
            let refused = intake.receive(messages[1].clone()).unwrap_err().to_string();
            assert!(
                refused.contains("dictionary batch does not decode"),
                "{refused}"
            );
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Whatever a client does to the header or the body of any message, the schema
            /// included, the intake answers Ok or an error: it never panics, and never
            /// hydrates past its limit.
            #[test]
            fn mutated_put_messages_never_panic_the_intake(
                target in 0usize..3,
                in_header in any::<bool>(),
                mutations in proptest::collection::vec(mutation(), 1..4),
            ) {
                let mut messages = valid_messages();
                prop_assert_eq!(messages.len(), 3);
                let target = &mut messages[target];
                for mutation in &mutations {
                    if in_header {
                        target.data_header = mutate(&target.data_header, mutation);
                    } else {
                        target.data_body = mutate(&target.data_body, mutation);
                    }
                }
                let mut intake = Intake::new(1 << 20);
                for message in &messages {
                    match intake.receive(message.clone()) {
                        Ok(Received::Schema(schema)) if intake.schema().is_none() => {
                            // As the put does: a schema that cannot be sealed ends it.
                            let Ok(sealed) = SealedSchema::new(Arc::new(schema)) else {
                                break;
                            };
                            intake.set_schema(sealed);
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            }
        }
    }
}
