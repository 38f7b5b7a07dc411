//! Shared helpers of the component tests: a node on 127.0.0.1:0 and a Flight client.

#![allow(
    dead_code,
    missing_docs,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic
)]

use std::sync::Arc;

use arrow_array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::{Action, FlightClient, FlightDescriptor, PutResult, Ticket};
use bytes::Bytes;
use cache_node::config::{Cli, Config};
use cache_node::server::{self, RunningNode};
use cache_node::store::{Clock, SystemClock};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use tonic::transport::Channel;

/// Starts a node on loopback with the given extra flags.
pub async fn start_node(flags: &[&str]) -> RunningNode {
    start_node_with_clock(flags, Arc::new(SystemClock::new())).await
}

/// Starts a node on loopback whose store reads time from `clock`.
pub async fn start_node_with_clock(flags: &[&str], clock: Arc<dyn Clock>) -> RunningNode {
    server::start(loopback_config(flags), clock)
        .await
        .expect("node starts")
}

/// The configuration of a node on loopback ports with the given extra flags.
pub fn loopback_config(flags: &[&str]) -> Config {
    let mut args = vec![
        "flightcache-node",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--shutdown-grace",
        "5s",
    ];
    args.extend_from_slice(flags);
    Config::from_cli(Cli::try_parse_from(args).expect("flags parse")).expect("config")
}

pub async fn channel(node: &RunningNode) -> Channel {
    Channel::from_shared(format!("http://{}", node.flight_addr))
        .expect("uri")
        .connect()
        .await
        .expect("connects")
}

pub async fn client(node: &RunningNode) -> FlightClient {
    FlightClient::new(channel(node).await)
}

/// A BI-shaped batch: int64, float64, timestamp and short utf8 columns.
pub fn sample_batch(rows: usize, seed: i64) -> RecordBatch {
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(
        (0..rows as i64).map(|i| i + seed),
    ));
    let amounts: ArrayRef = Arc::new(Float64Array::from_iter_values(
        (0..rows).map(|i| i as f64 * 0.5),
    ));
    let times: ArrayRef = Arc::new(TimestampMicrosecondArray::from_iter_values(
        (0..rows as i64).map(|i| 1_700_000_000_000_000 + i),
    ));
    let names: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..rows).map(|i| format!("r{}", i % 97)),
    ));
    RecordBatch::try_from_iter([
        ("id", ids),
        ("amount", amounts),
        ("at", times),
        ("name", names),
    ])
    .expect("batch")
}

pub fn path(key: &str) -> FlightDescriptor {
    FlightDescriptor::new_path(key.split('/').map(str::to_owned).collect())
}

/// The ticket a client builds from a path key (documented wire format).
pub fn path_ticket(key: &str) -> Ticket {
    Ticket::new(Bytes::from(
        [b"FCT\x01P".as_slice(), key.as_bytes()].concat(),
    ))
}

pub async fn put(
    client: &mut FlightClient,
    descriptor: FlightDescriptor,
    batches: Vec<RecordBatch>,
    app_metadata: Option<&str>,
) -> Result<Vec<PutResult>, FlightError> {
    let schema = batches.first().expect("one batch").schema();
    let mut builder = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .with_flight_descriptor(Some(descriptor));
    if let Some(metadata) = app_metadata {
        builder = builder.with_metadata(Bytes::from(metadata.to_owned()));
    }
    let stream = builder.build(futures::stream::iter(batches.into_iter().map(Ok)));
    client.do_put(stream).await?.try_collect().await
}

pub async fn get(
    client: &mut FlightClient,
    ticket: Ticket,
) -> Result<Vec<RecordBatch>, FlightError> {
    client.do_get(ticket).await?.try_collect().await
}

pub async fn action(
    client: &mut FlightClient,
    kind: &str,
    body: &[u8],
) -> Result<Bytes, FlightError> {
    let mut results = client
        .do_action(Action::new(kind, Bytes::copy_from_slice(body)))
        .await?;
    let first = results.next().await.expect("one result")?;
    Ok(first)
}

pub async fn stats(client: &mut FlightClient) -> serde_json::Value {
    serde_json::from_slice(&action(client, "stats", b"").await.expect("stats")).expect("json")
}

/// The gRPC status of a failed call.
pub fn status(err: FlightError) -> tonic::Status {
    match err {
        FlightError::Tonic(status) => *status,
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

/// The metrics endpoint's text exposition.
pub async fn scrape(addr: std::net::SocketAddr) -> String {
    let response = http_get(addr, "/metrics").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// The whole HTTP/1.1 response (status line, headers, body) to `GET path` on `addr`.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

/// Resident set size of a process, from its `/proc/<pid>/status` (`self` for this one).
pub fn resident_bytes(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}
