//! Budget use with large entries (issue 15): a put charges a message's received bytes
//! once — the wire layer's reservation made when its gRPC prefix arrived covers them
//! while the put decodes them — so a node keeps more large entries than when the put
//! charged them a second time. A real node on 127.0.0.1:0, driven by the arrow-flight
//! client. (In-process, on the system allocator: jemalloc's kept pages, which the
//! binary also counts, are measured in docs/benchmarks.md.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use arrow_array::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use common::*;
use futures::TryStreamExt;

const MIB: u64 = 1 << 20;

/// Rows of [`sample_batch`] whose entry weighs about 3.7 MB (the entries).
const ROWS_OF_3_7_MB: usize = 119_700;

/// Bytes the wire layer reserves beside a message for the HTTP/2 frame in transit
/// (`wire::intake::in_transit`: at most one 1 MiB frame).
const IN_TRANSIT: u64 = MIB;

/// Puts `batch` under `key` as one FlightData message (schema first), as a client that
/// does not split batches (pyarrow, a Rust client without a size cap) sends it.
async fn put_one_message(
    client: &mut arrow_flight::FlightClient,
    key: &str,
    batch: RecordBatch,
) -> Result<Vec<arrow_flight::PutResult>, arrow_flight::error::FlightError> {
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(batch.schema())
        .with_flight_descriptor(Some(path(key)))
        .with_max_flight_data_size(usize::MAX)
        .build(futures::stream::iter([Ok(batch)]));
    client.do_put(stream).await?.try_collect().await
}

fn summary_bytes(results: &[arrow_flight::PutResult]) -> u64 {
    let summary: serde_json::Value = serde_json::from_slice(&results[0].app_metadata).unwrap();
    summary["bytes"].as_u64().unwrap()
}

#[tokio::test]
async fn a_full_node_charges_each_received_message_once() {
    let budget = 32 * MIB;
    for one_message in [false, true] {
        let node = start_node(&["--memory-budget", "32MiB", "--max-entries", "40"]).await;
        let mut client = client(&node).await;
        let mut weight = 0;
        for i in 0..30 {
            let batch = sample_batch(ROWS_OF_3_7_MB, i);
            let key = format!("big/{i}");
            let results = if one_message {
                put_one_message(&mut client, &key, batch).await
            } else {
                put(&mut client, path(&key), vec![batch], None).await
            };
            weight = summary_bytes(&results.unwrap());
        }
        let stats = node.store.stats();
        node.shutdown().await.unwrap();
        // At the last put's peak the store held its entries, the put's sealed bytes (at
        // most one entry) and one received message with its frame in transit (at most
        // one entry plus 1 MiB); evicting whole entries can free up to one entry more
        // than needed. So afterwards it holds at least budget - 2 entries - 1 MiB. A put
        // charging each message twice (before) needs room for one entry more.
        let floor = (budget - 2 * weight - IN_TRANSIT).div_ceil(weight);
        println!(
            "30 puts of {weight} bytes ({}), budget {budget}: {} entries held ({:.1}% of the \
             budget), at least {floor} expected, {} fit",
            if one_message {
                "one message each"
            } else {
                "2 MiB messages"
            },
            stats.entries,
            stats.used_bytes as f64 * 100.0 / budget as f64,
            budget / weight
        );
        assert!((3_600_000..3_800_000).contains(&weight), "{weight}");
        assert_eq!(stats.reserved_bytes, 0);
        assert!(stats.entries >= floor, "{} entries", stats.entries);
    }
}
