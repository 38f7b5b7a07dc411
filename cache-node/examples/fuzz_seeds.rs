//! Writes the seed inputs of the fuzz targets (`cache-node/fuzz`, run by `scripts/fuzz`)
//! with the node's own writers: a ticket and descriptors, the IPC messages of a batch
//! with a dictionary column, a DoPut body framed as gRPC, an entry file written by
//! `persist::format::encode`, and the documented admin JSON bodies.
//!
//! Run: `cargo run -p cache-node --example fuzz_seeds` (writes under
//! `cache-node/fuzz/corpus/`; the corpus is kept in the repository).

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, DictionaryArray, Int64Array, RecordBatch, StringArray};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::{FlightData, FlightDescriptor, Ticket};
use bytes::Bytes;
use cache_node::key::CacheKey;
use cache_node::persist::format;
use cache_node::store::{EvictionPolicy, Lifetime, Store, StoreConfig, SystemClock, TtlMode};
use cache_node::ticket::CacheTicket;
use futures::StreamExt;
use prost::Message;

fn write(target: &str, name: &str, bytes: &[u8]) {
    // At run time (cargo run sets it), not env!: a reused build writes into this clone.
    let dir = Path::new(
        &std::env::var_os("CARGO_MANIFEST_DIR")
            .expect("run it as `cargo run -p cache-node --example fuzz_seeds`"),
    )
    .join("fuzz/corpus")
    .join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// A batch of an integer, a string and a dictionary column.
fn batch() -> RecordBatch {
    let n: ArrayRef = Arc::new(Int64Array::from_iter_values(0..8));
    let s: ArrayRef = Arc::new(StringArray::from_iter_values(
        ["a", "bb", "", "dddd", "e", "ff", "g", "hh"].iter(),
    ));
    let d: ArrayRef = Arc::new(
        ["x", "y", "x", "z", "y", "x", "x", "z"]
            .into_iter()
            .collect::<DictionaryArray<Int32Type>>(),
    );
    RecordBatch::try_from_iter([("n", n), ("s", s), ("d", d)]).unwrap()
}

/// The batch as a client's Flight encoder sends it, dictionaries kept as dictionaries.
fn messages(batch: &RecordBatch) -> Vec<FlightData> {
    let stream = FlightDataEncoderBuilder::new()
        .with_dictionary_handling(arrow_flight::encode::DictionaryHandling::Resend)
        .build(futures::stream::iter([Ok(batch.clone())]));
    futures::executor::block_on(stream.map(|m| m.unwrap()).collect())
}

fn main() {
    // Tickets and descriptors.
    let path = CacheKey::Path("reports/daily".into());
    let command = CacheKey::Command(Bytes::from_static(b"SELECT * FROM orders"));
    write("ticket", "path-ticket", &CacheTicket::new(path).encode());
    write(
        "ticket",
        "command-ticket",
        &CacheTicket::new(command.clone()).encode(),
    );
    let ticket = Ticket::new(CacheTicket::new(command).encode());
    write("ticket", "ticket-proto", &ticket.encode_to_vec());
    let descriptor = FlightDescriptor::new_path(vec!["reports".into(), "daily".into()]);
    write("ticket", "path-descriptor", &descriptor.encode_to_vec());
    let descriptor = FlightDescriptor::new_cmd("SELECT 1");
    write("ticket", "command-descriptor", &descriptor.encode_to_vec());

    // IPC messages: the seal target's length-prefixed form.
    let batch = batch();
    let sent = messages(&batch);
    let mut seal = Vec::new();
    for message in &sent {
        seal.extend_from_slice(
            &u16::try_from(message.data_header.len())
                .unwrap()
                .to_le_bytes(),
        );
        seal.extend_from_slice(
            &u16::try_from(message.data_body.len())
                .unwrap()
                .to_le_bytes(),
        );
        seal.extend_from_slice(&message.data_header);
        seal.extend_from_slice(&message.data_body);
    }
    write("seal", "dictionary-batch", &seal);

    // A DoPut body: the descriptor on the first message, each message gRPC-framed; cut
    // into frames of 7 and of 256 bytes.
    let mut body = Vec::new();
    for (index, message) in sent.iter().enumerate() {
        let mut message = message.clone();
        if index == 0 {
            message.flight_descriptor = Some(FlightDescriptor::new_path(vec!["k".into()]));
            message.app_metadata = Bytes::from_static(br#"{"ttl":"5m","tags":["sales.orders"]}"#);
        }
        let encoded = message.encode_to_vec();
        body.push(0);
        body.extend_from_slice(&u32::try_from(encoded.len()).unwrap().to_be_bytes());
        body.extend_from_slice(&encoded);
    }
    write("intake", "do-put-cut-7", &[&[6u8][..], &body].concat());
    write("intake", "do-put-cut-256", &[&[255u8][..], &body].concat());

    // An entry file, by the format's own writer; the flag byte asks for no fix-up.
    let config = StoreConfig {
        max_entries: 10,
        budget_bytes: 1 << 20,
        max_entry_bytes: 1 << 20,
        ttl: Duration::from_secs(60),
        ttl_mode: TtlMode::Absolute,
        eviction: EvictionPolicy::Lru,
    };
    let store = Store::new(config, Arc::new(SystemClock::new())).unwrap();
    let key = CacheKey::Path("reports/daily".into()).to_store_bytes();
    let mut put = store.begin_put(key.clone());
    put.reserve(cache_node::store::batch_weight(&batch))
        .unwrap();
    let lifetime = Lifetime {
        ttl_override: Some(Duration::from_secs(90)),
        tags: ["sales.orders", "eu"]
            .iter()
            .map(|t| Arc::<str>::from(*t))
            .collect(),
        ..Lifetime::default()
    };
    put.commit_with(batch.schema(), vec![batch], lifetime)
        .unwrap();
    let entry = store.peek(&key).unwrap();
    let file = format::encode(
        &key,
        &entry,
        UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    );
    let file: Vec<u8> = file.parts.concat();
    format::decode(Bytes::from(file.clone())).unwrap();
    write("disk_format", "entry-file", &[&[0u8][..], &file].concat());

    // Admin JSON: the documented bodies.
    let admin = [
        (
            "configure-live",
            r#"{"generation":3,"maxEntries":100000,"memoryBudget":"48MiB","maxEntrySize":"4MiB","ttl":"1h","ttlMode":"sliding","eviction":"tinylfu"}"#,
        ),
        (
            "configure-topology",
            r#"{"generation":4,"topology":{"version":7,"replicas":2,"members":[{"id":"node-0","address":"node-0.svc:50051","zone":"zone-a"},{"id":"node-1","address":"node-1.svc:50051","state":"draining"}]}}"#,
        ),
        (
            "config-file",
            r#"{"generation":3,"listen":"0.0.0.0:50051","metricsListen":"0.0.0.0:9090","memoryBudget":"1536MiB","authTokenFile":"/etc/flightcache/auth/token","shutdownGrace":"20s"}"#,
        ),
        ("rebalance", r#"{"dryRun":true,"limit":5}"#),
        ("invalidate-tag", r#"{"tags":["sales.orders"]}"#),
        (
            "invalidate-local",
            r#"{"keys":["reports/daily"],"prefixes":["reports/"],"tags":["sales.orders"]}"#,
        ),
    ];
    for (name, json) in admin {
        write("admin_json", name, json.as_bytes());
    }
}
