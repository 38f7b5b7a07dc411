//! The stored form of an entry: its batches, each beside the bytes of the message a
//! DoGet sends for it, held as opaque frames.
//!
//! The store keeps these and weighs them; it never builds or reads the frame bytes.
//! Sealing (encoding IPC, building each message's gRPC frame head) is the wire layer's
//! job (`wire::seal`). Must not import tonic or arrow-flight. No I/O.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use bytes::Bytes;

/// One stored IPC message as an opaque frame: `head ++ body`, built by `wire::seal`.
#[derive(Debug, Clone)]
pub struct WireMessage {
    pub(crate) head: Bytes,
    /// Where the IPC `data_header` lies inside `head`.
    pub(crate) header: std::ops::Range<usize>,
    pub(crate) body: Bytes,
}

impl WireMessage {
    /// The gRPC frame's bytes up to the body.
    pub fn head(&self) -> &Bytes {
        &self.head
    }

    /// The IPC body (the Arrow buffers), shared with the decoded batch.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// Bytes held beside the body: the frame head, which holds the IPC header.
    pub fn head_bytes(&self) -> u64 {
        self.head.len() as u64
    }

    /// The IPC `data_header` bytes inside the head, shared.
    pub fn ipc_header(&self) -> Bytes {
        self.head.slice(self.header.clone())
    }
}

/// A batch decoded from its own stored message: the two share the body's memory.
#[derive(Debug, Clone)]
pub struct SealedBatch {
    /// The batch, its buffers slices of `message.body()`.
    pub batch: RecordBatch,
    /// The IPC message it was decoded from.
    pub message: WireMessage,
}

/// The schema an entry is stored and served with, and its IPC schema message.
#[derive(Debug, Clone)]
pub struct SealedSchema {
    /// The schema clients receive: dictionary columns hydrated to their value type.
    pub schema: SchemaRef,
    /// The IPC schema message, the first message of a DoGet.
    pub message: WireMessage,
    pub(crate) input: SchemaRef,
}

impl SealedSchema {
    /// The schema the batches arrive with (before dictionaries are hydrated).
    pub fn input(&self) -> &SchemaRef {
        &self.input
    }
}

/// An entry's data, sealed: the schema message and every batch with its message.
#[derive(Debug, Clone)]
pub struct SealedEntry {
    /// The stored schema and its message.
    pub schema: SealedSchema,
    /// The batches in put order.
    pub batches: Vec<SealedBatch>,
}

impl SealedEntry {
    /// Bytes the entry holds besides its key: the distinct Arrow allocations (the
    /// bodies, see [`entry_weight`](super::weight::entry_weight)) plus every frame head.
    pub fn weight(&self) -> u64 {
        let batches: Vec<RecordBatch> = self.batches.iter().map(|b| b.batch.clone()).collect();
        self.batches
            .iter()
            .map(|batch| batch.message.head_bytes())
            .fold(
                super::weight::entry_weight(&batches)
                    .saturating_add(self.schema.message.head_bytes()),
                u64::saturating_add,
            )
    }
}
