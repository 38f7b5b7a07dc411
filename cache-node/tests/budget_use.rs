//! Budget use with large entries (issue 15): a put charges a message's received bytes
//! once — the wire layer's reservation made when its gRPC prefix arrived covers them
//! while the put decodes them and, for a large message received into its final
//! allocation, becomes the entry's charge — so a put evicts only for what the store
//! will hold. A real node on 127.0.0.1:0, driven by the arrow-flight
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

/// Fills a node with a 32 MiB budget with 30 entries of `rows` rows, sent in 2 MiB
/// messages or as one message each; the node's stats and one entry's weight after.
async fn fill(rows: usize, one_message: bool) -> (cache_node::store::StoreStats, u64) {
    let node = start_node(&["--memory-budget", "32MiB", "--max-entries", "40"]).await;
    let mut client = client(&node).await;
    let mut weight = 0;
    for i in 0..30 {
        let batch = sample_batch(rows, i);
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
    (stats, weight)
}

#[tokio::test]
async fn a_full_node_holds_its_budget_but_one_entry_and_one_frame() {
    let budget = 32 * MIB;
    // Entries of about budget / 9 (the 3.7 MB), / 12 and / 16.
    for rows in [ROWS_OF_3_7_MB, 86_000, 64_000] {
        for one_message in [false, true] {
            let (stats, weight) = fill(rows, one_message).await;
            // A put's bytes are charged once, from the prefix of each message (its
            // length and the HTTP/2 frame in transit, at most 1 MiB) to its commit: a
            // large message's body is received into the allocation the entry keeps, and
            // its reservation becomes the entry's charge. So the last put evicted only
            // for one entry and one frame, and after it the store holds at least
            // budget - one entry - 1 MiB.
            let floor = budget - weight - IN_TRANSIT;
            let used_share = stats.used_bytes as f64 / budget as f64;
            println!(
                "30 puts of {weight} bytes ({}), budget {budget}: {} entries held, {} bytes \
                 ({:.1}% of the budget), at least {floor} expected, {} fit",
                if one_message {
                    "one message each"
                } else {
                    "2 MiB messages"
                },
                stats.entries,
                stats.used_bytes,
                used_share * 100.0,
                budget / weight
            );
            assert_eq!(stats.reserved_bytes, 0);
            assert!(stats.used_bytes >= floor, "{} bytes held", stats.used_bytes);
            if weight <= budget / 12 {
                // The rule, where an entry and a frame are at most 1/10 of it.
                assert!(
                    used_share >= 0.9,
                    "{:.1}% of the budget",
                    used_share * 100.0
                );
            }
        }
    }
}
