//! Component tests: a real node on 127.0.0.1:0, driven by the arrow-flight client.

mod common;

use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_flight::{Criteria, FlightData, FlightDescriptor, Ticket};
use arrow_schema::{DataType, Field, Schema};
use bytes::Bytes;
use cache_node::store::ManualClock;
use common::*;
use futures::{StreamExt, TryStreamExt};
use tonic::Code;

#[tokio::test]
async fn put_then_get_with_a_key_derived_ticket_round_trips() {
    let node = start_node(&[]).await;
    let mut client = client(&node).await;
    let batches = vec![sample_batch(200, 0), sample_batch(1827, 1000)];
    let results = put(&mut client, path("reports/daily"), batches.clone(), None)
        .await
        .unwrap();
    let summary: serde_json::Value = serde_json::from_slice(&results[0].app_metadata).unwrap();
    assert_eq!(summary["rows"], 2027);
    assert_eq!(summary["batches"], 2);

    let got = get(&mut client, path_ticket("reports/daily"))
        .await
        .unwrap();
    assert_eq!(got, batches);

    // GetFlightInfo hands out the very same ticket, plus schema and counts.
    let info = client.get_flight_info(path("reports/daily")).await.unwrap();
    assert_eq!(
        info.endpoint[0].ticket.as_ref().unwrap(),
        &path_ticket("reports/daily")
    );
    assert_eq!(info.total_records, 2027);
    assert!(info.total_bytes > 0);
    assert_eq!(
        info.clone().try_decode_schema().unwrap(),
        *batches[0].schema()
    );
    let schema = client.get_schema(path("reports/daily")).await.unwrap();
    assert_eq!(schema, *batches[0].schema());
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn command_keys_are_opaque_bytes() {
    let node = start_node(&[]).await;
    let mut client = client(&node).await;
    let sql = "SELECT region, sum(amount) FROM sales GROUP BY region";
    let batch = sample_batch(10, 0);
    put(
        &mut client,
        FlightDescriptor::new_cmd(sql.to_owned()),
        vec![batch.clone()],
        None,
    )
    .await
    .unwrap();
    let info = client
        .get_flight_info(FlightDescriptor::new_cmd(sql.to_owned()))
        .await
        .unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    assert_eq!(
        &ticket.ticket[..],
        [b"FCT\x01C".as_slice(), sql.as_bytes()].concat().as_slice()
    );
    assert_eq!(get(&mut client, ticket).await.unwrap(), vec![batch]);
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn batches_larger_than_the_grpc_message_limit_work_both_ways() {
    let node = start_node(&["--memory-budget", "256MiB", "--max-entry-size", "128MiB"]).await;
    let mut client = client(&node).await;
    // ~12 MiB in one batch: three times gRPC's default 4 MiB message limit.
    let big = sample_batch(400_000, 0);
    assert!(big.get_array_memory_size() > 8 << 20);
    put(&mut client, path("big"), vec![big.clone()], None)
        .await
        .unwrap();
    let got = get(&mut client, path_ticket("big")).await.unwrap();
    let rows: usize = got.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, 400_000);
    let joined = arrow_select::concat::concat_batches(&big.schema(), &got).unwrap();
    assert_eq!(joined, big);
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn list_flights_filters_by_path_prefix() {
    let node = start_node(&[]).await;
    let mut client = client(&node).await;
    for key in ["reports/a", "reports/b", "dash/c"] {
        put(&mut client, path(key), vec![sample_batch(3, 0)], None)
            .await
            .unwrap();
    }
    let listed = |infos: Vec<arrow_flight::FlightInfo>| -> Vec<String> {
        infos
            .into_iter()
            .map(|i| i.flight_descriptor.unwrap().path.join("/"))
            .collect()
    };
    let reports: Vec<_> = client
        .list_flights(Bytes::from("reports/"))
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(listed(reports), ["reports/a", "reports/b"]);
    let all: Vec<_> = client
        .list_flights(Bytes::new())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(listed(all), ["dash/c", "reports/a", "reports/b"]);
    let none = client
        .inner_mut()
        .list_flights(Criteria {
            expression: Bytes::from_static(b"\xff"),
        })
        .await;
    assert_eq!(none.unwrap_err().code(), Code::InvalidArgument);
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn every_action_does_what_it_says() {
    let node = start_node(&[]).await;
    let mut client = client(&node).await;
    let types: Vec<_> = client
        .list_actions()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let names: Vec<_> = types.iter().map(|t| t.r#type.as_str()).collect();
    assert_eq!(
        names,
        [
            "ping",
            "invalidate",
            "invalidate-prefix",
            "invalidate-tag",
            "clear",
            "stats",
            "configure",
            "topology",
            "lease",
            "rebalance",
            "held",
            "invalidate-local"
        ]
    );

    assert_eq!(
        &action(&mut client, "ping", b"").await.unwrap()[..],
        b"pong"
    );
    for key in ["t/1", "t/2", "u/1"] {
        put(&mut client, path(key), vec![sample_batch(5, 0)], None)
            .await
            .unwrap();
    }
    put(
        &mut client,
        FlightDescriptor::new_cmd("SELECT 1"),
        vec![sample_batch(1, 0)],
        None,
    )
    .await
    .unwrap();
    assert_eq!(stats(&mut client).await["entries"], 4);

    let removed: serde_json::Value =
        serde_json::from_slice(&action(&mut client, "invalidate", b"t/1").await.unwrap()).unwrap();
    assert_eq!(removed["removed"], true);
    let removed: serde_json::Value = serde_json::from_slice(
        &action(&mut client, "invalidate", b"FCT\x01CSELECT 1")
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(removed["removed"], true);
    let err = status(get(&mut client, path_ticket("t/1")).await.unwrap_err());
    assert_eq!(err.code(), Code::NotFound);
    assert!(
        err.message().contains("path 't/1' is not cached"),
        "{}",
        err.message()
    );

    let removed: serde_json::Value = serde_json::from_slice(
        &action(&mut client, "invalidate-prefix", b"t/")
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(removed["removed"], 1);
    let removed: serde_json::Value =
        serde_json::from_slice(&action(&mut client, "clear", b"").await.unwrap()).unwrap();
    assert_eq!(removed["removed"], 1);

    let counters = stats(&mut client).await;
    assert_eq!(counters["entries"], 0);
    assert_eq!(counters["evictions"]["explicit"], 4);
    assert_eq!(counters["misses"], 1);

    let err = status(action(&mut client, "reboot", b"").await.unwrap_err());
    assert_eq!(err.code(), Code::Unimplemented);
    assert!(err.message().contains("unknown action 'reboot'"));
    let err = status(
        action(&mut client, "invalidate-prefix", b"")
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("use the 'clear' action"));
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn configure_changes_limits_live_and_generations_only_move_forward() {
    let node = start_node(&["--max-entries", "10"]).await;
    let mut client = client(&node).await;
    for i in 0..6 {
        put(
            &mut client,
            path(&format!("k/{i}")),
            vec![sample_batch(5, i)],
            None,
        )
        .await
        .unwrap();
    }
    let applied: serde_json::Value = serde_json::from_slice(
        &action(
            &mut client,
            "configure",
            br#"{"generation": 5, "maxEntries": 4, "ttl": "2h", "eviction": "lru"}"#,
        )
        .await
        .unwrap(),
    )
    .unwrap();
    assert_eq!(applied["generation"], 5);
    assert_eq!(applied["evicted"], 2);
    let counters = stats(&mut client).await;
    assert_eq!(counters["generation"], 5);
    assert_eq!(counters["entries"], 4);
    assert_eq!(counters["maxEntries"], 4);
    assert_eq!(counters["ttl"], "2h");
    assert_eq!(counters["eviction"], "lru");

    let err = status(
        action(
            &mut client,
            "configure",
            br#"{"generation": 4, "ttl": "1m"}"#,
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message()
            .contains("older than the running generation 5")
    );
    let err = status(
        action(&mut client, "configure", br#"{"listen": "0.0.0.0:1"}"#)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .contains("'listen' cannot change without a restart"),
        "{}",
        err.message()
    );
    let err = status(
        action(&mut client, "configure", br#"{"ttl": "forever"}"#)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("ttl"), "{}", err.message());
    let err = status(
        action(&mut client, "configure", br#"{"maxEntrySize": "1TiB"}"#)
            .await
            .unwrap_err(),
    );
    assert!(
        err.message().contains("max-entry-size"),
        "{}",
        err.message()
    );
    assert_eq!(
        stats(&mut client).await["generation"],
        5,
        "refused documents change nothing"
    );
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn malformed_foreign_and_unknown_tickets_get_clear_errors() {
    let node = start_node(&[]).await;
    let mut client = client(&node).await;
    let cases: [(&[u8], Code, &str); 4] = [
        (
            b"garbage",
            Code::InvalidArgument,
            "not a FlightCache ticket",
        ),
        (b"FCT\x09Pk", Code::InvalidArgument, "version 9"),
        (b"FCT\x01Qk", Code::InvalidArgument, "unknown key kind"),
        (b"FCT\x01Pnever/stored", Code::NotFound, "is not cached"),
    ];
    for (bytes, code, text) in cases {
        let err = status(
            get(&mut client, Ticket::new(Bytes::copy_from_slice(bytes)))
                .await
                .unwrap_err(),
        );
        assert_eq!(err.code(), code, "{bytes:?}");
        assert!(err.message().contains(text), "{bytes:?}: {}", err.message());
    }
    let err = status(client.get_flight_info(path("nope")).await.unwrap_err());
    assert_eq!(err.code(), Code::NotFound);
    let err = status(
        client
            .get_flight_info(FlightDescriptor::new_path(vec![]))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = client
        .inner_mut()
        .do_exchange(futures::stream::empty::<FlightData>())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    // The node keeps serving.
    assert_eq!(
        &action(&mut client, "ping", b"").await.unwrap()[..],
        b"pong"
    );
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn garbage_app_metadata_is_refused_and_nothing_is_stored() {
    let clock = Arc::new(ManualClock::new());
    let node = start_node_with_clock(&[], clock.clone()).await;
    let mut client = client(&node).await;
    for metadata in ["not json", r#"{"tll": "30s"}"#, r#"{"ttl": "soon"}"#] {
        let err = status(
            put(
                &mut client,
                path("m"),
                vec![sample_batch(5, 0)],
                Some(metadata),
            )
            .await
            .unwrap_err(),
        );
        assert_eq!(err.code(), Code::InvalidArgument, "{metadata}");
        assert!(err.message().contains("app_metadata"), "{}", err.message());
    }
    assert_eq!(stats(&mut client).await["entries"], 0);
    put(
        &mut client,
        path("m"),
        vec![sample_batch(5, 0)],
        Some(r#"{"ttl": "1s"}"#),
    )
    .await
    .unwrap();
    // The per-entry TTL applies: served just before it runs out, gone after.
    clock.advance(Duration::from_millis(999));
    get(&mut client, path_ticket("m")).await.unwrap();
    clock.advance(Duration::from_millis(2));
    match get(&mut client, path_ticket("m")).await {
        Err(arrow_flight::error::FlightError::Tonic(s)) if s.code() == Code::NotFound => {}
        other => panic!("per-entry ttl did not expire the entry: {other:?}"),
    }
    assert_eq!(stats(&mut client).await["evictions"]["expired"], 1);
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_schema_change_mid_stream_is_refused_and_nothing_is_stored() {
    let node = start_node(&[]).await;
    let mut client = client(&node).await;
    let first = sample_batch(10, 0);
    let other_schema =
        std::sync::Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
    let other = RecordBatch::try_new(
        other_schema,
        vec![std::sync::Arc::new(arrow_array::Int64Array::from(vec![
            1, 2,
        ]))],
    )
    .unwrap();
    // Encode each batch as its own IPC stream and splice them: schema, batch, schema', batch'.
    let mut messages: Vec<FlightData> = Vec::new();
    for (index, batch) in [first, other].into_iter().enumerate() {
        let descriptor = (index == 0).then(|| path("mixed"));
        let encoded: Vec<FlightData> = arrow_flight::encode::FlightDataEncoderBuilder::new()
            .with_flight_descriptor(descriptor)
            .build(futures::stream::iter([Ok(batch)]))
            .try_collect()
            .await
            .unwrap();
        messages.extend(encoded);
    }
    let err = client
        .do_put(futures::stream::iter(messages.into_iter().map(Ok)))
        .await;
    let err = match err {
        Ok(results) => results.try_collect::<Vec<_>>().await.unwrap_err(),
        Err(err) => err,
    };
    let err = status(err);
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("different schema"),
        "{}",
        err.message()
    );
    assert_eq!(stats(&mut client).await["entries"], 0);
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn puts_without_a_schema_or_descriptor_are_refused_but_empty_results_are_cached() {
    let node = start_node(&[]).await;
    let mut client = client(&node).await;
    // No messages at all.
    let err = client
        .inner_mut()
        .do_put(futures::stream::empty::<FlightData>())
        .await;
    let message = match err {
        Err(status) => status,
        Ok(response) => response.into_inner().next().await.unwrap().unwrap_err(),
    };
    assert_eq!(message.code(), Code::InvalidArgument);
    assert!(
        message.message().contains("stream is empty"),
        "{}",
        message.message()
    );
    // A descriptor but no schema.
    let only_descriptor = FlightData::new().with_descriptor(path("bare"));
    let err = status(
        match client
            .do_put(futures::stream::iter([Ok(only_descriptor)]))
            .await
        {
            Ok(results) => results.try_collect::<Vec<_>>().await.unwrap_err(),
            Err(err) => err,
        },
    );
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("no schema"), "{}", err.message());
    // A schema without a descriptor.
    let no_descriptor: Vec<FlightData> = arrow_flight::encode::FlightDataEncoderBuilder::new()
        .build(futures::stream::iter([Ok(sample_batch(2, 0))]))
        .try_collect()
        .await
        .unwrap();
    let err = status(
        match client
            .do_put(futures::stream::iter(no_descriptor.into_iter().map(Ok)))
            .await
        {
            Ok(results) => results.try_collect::<Vec<_>>().await.unwrap_err(),
            Err(err) => err,
        },
    );
    assert!(
        err.message().contains("no FlightDescriptor"),
        "{}",
        err.message()
    );
    // A schema and zero batches is an empty query result: cached with its schema.
    let empty: Vec<FlightData> = arrow_flight::encode::FlightDataEncoderBuilder::new()
        .with_schema(sample_batch(1, 0).schema())
        .with_flight_descriptor(Some(path("empty")))
        .build(futures::stream::empty())
        .try_collect()
        .await
        .unwrap();
    client
        .do_put(futures::stream::iter(empty.into_iter().map(Ok)))
        .await
        .unwrap()
        .try_collect::<Vec<_>>()
        .await
        .unwrap();
    let info = client.get_flight_info(path("empty")).await.unwrap();
    assert_eq!(info.total_records, 0);
    assert_eq!(
        info.try_decode_schema().unwrap(),
        *sample_batch(1, 0).schema()
    );
    assert_eq!(stats(&mut client).await["entries"], 1);
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_oversized_put_is_refused_before_it_is_buffered_and_stores_nothing() {
    let node = start_node(&["--memory-budget", "64MiB", "--max-entry-size", "4MiB"]).await;
    let mut client = client(&node).await;
    put(&mut client, path("keep"), vec![sample_batch(100, 0)], None)
        .await
        .unwrap();
    // 40 batches of ~1.3 MiB: refused once the bytes pass 4 MiB, long before the end.
    let batches: Vec<_> = (0..40).map(|i| sample_batch(40_000, i)).collect();
    let err = status(
        put(&mut client, path("huge"), batches, None)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message().contains("max entry size") && err.message().contains("nothing was stored"),
        "{}",
        err.message()
    );
    let counters = stats(&mut client).await;
    assert_eq!(counters["entries"], 1);
    assert_eq!(
        counters["reservedBytes"], 0,
        "the refused put released its reservation"
    );
    assert!(counters["rejectedPuts"].as_u64().unwrap() >= 1);
    assert_eq!(
        status(get(&mut client, path_ticket("huge")).await.unwrap_err()).code(),
        Code::NotFound
    );
    assert_eq!(
        get(&mut client, path_ticket("keep")).await.unwrap().len(),
        1
    );
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn concurrent_puts_and_invalidates_never_leave_a_half_written_entry() {
    let node = start_node(&[]).await;
    let channel = channel(&node).await;
    let batches: Vec<_> = (0..8).map(|i| sample_batch(5_000, i)).collect();
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let mut client = arrow_flight::FlightClient::new(channel.clone());
            let batches = batches.clone();
            tokio::spawn(async move {
                for _ in 0..15 {
                    match put(&mut client, path("contended"), batches.clone(), None).await {
                        Ok(_) => {}
                        Err(err) => assert_eq!(status(err).code(), Code::Aborted),
                    }
                }
            })
        })
        .collect();
    let mut invalidator = arrow_flight::FlightClient::new(channel.clone());
    let mut reader = arrow_flight::FlightClient::new(channel.clone());
    for _ in 0..60 {
        action(&mut invalidator, "invalidate", b"contended")
            .await
            .unwrap();
        match get(&mut reader, path_ticket("contended")).await {
            Ok(got) => assert_eq!(got.iter().map(RecordBatch::num_rows).sum::<usize>(), 40_000),
            Err(err) => assert_eq!(status(err).code(), Code::NotFound),
        }
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let counters = stats(&mut reader).await;
    assert_eq!(counters["reservedBytes"], 0);
    assert!(counters["entries"].as_u64().unwrap() <= 1);
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn auth_requires_the_bearer_token_handed_out_by_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let node = start_node(&["--auth-token-file", token_file.to_str().unwrap()]).await;
    let mut client = client(&node).await;
    let err = status(action(&mut client, "ping", b"").await.unwrap_err());
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("bearer token"));
    let err = status(
        client
            .handshake(Bytes::from_static(b"guess"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), Code::Unauthenticated);
    let token = client
        .handshake(Bytes::from_static(b"s3cret"))
        .await
        .unwrap();
    assert_eq!(&token[..], b"s3cret");
    client.add_header("authorization", "Bearer s3cret").unwrap();
    assert_eq!(
        &action(&mut client, "ping", b"").await.unwrap()[..],
        b"pong"
    );
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn metrics_count_lookups_rpcs_and_bytes() {
    let node = start_node(&[]).await;
    let mut client = client(&node).await;
    put(&mut client, path("m/1"), vec![sample_batch(100, 0)], None)
        .await
        .unwrap();
    get(&mut client, path_ticket("m/1")).await.unwrap();
    get(&mut client, path_ticket("m/1")).await.unwrap();
    let _ = get(&mut client, path_ticket("m/2")).await;
    let body = scrape(node.metrics_addr).await;
    for expected in [
        "flightcache_node_lookups_total{result=\"hit\"} 2",
        "flightcache_node_lookups_total{result=\"miss\"} 1",
        "flightcache_node_entries 1",
        "flightcache_node_grpc_server_handled_total{grpc_method=\"DoGet\",grpc_code=\"OK\"} 2",
        "flightcache_node_grpc_server_handled_total{grpc_method=\"DoGet\",grpc_code=\"NotFound\"} 1",
        "flightcache_node_grpc_server_handled_total{grpc_method=\"DoPut\",grpc_code=\"OK\"} 1",
        "flightcache_node_grpc_server_handling_seconds_count{grpc_method=\"DoGet\"} 3",
        "flightcache_node_memory_budget_bytes 268435456",
        "flightcache_node_config_generation 0",
        "flightcache_node_evictions_total{cause=\"size\"} 0",
    ] {
        assert!(body.contains(expected), "missing {expected:?} in:\n{body}");
    }
    let used = body
        .lines()
        .find(|l| l.starts_with("flightcache_node_memory_used_bytes "))
        .unwrap();
    assert!(used.split(' ').nth(1).unwrap().parse::<u64>().unwrap() > 0);
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn health_reports_serving_and_shutdown_lets_an_open_stream_finish() {
    let node = start_node(&["--max-entry-size", "64MiB"]).await;
    let channel = channel(&node).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let reply = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "arrow.flight.protocol.FlightService".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        reply.into_inner().status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    let mut client = arrow_flight::FlightClient::new(channel.clone());
    let batches: Vec<_> = (0..20).map(|i| sample_batch(50_000, i)).collect();
    put(&mut client, path("stream"), batches, None)
        .await
        .unwrap();
    let mut stream = client.do_get(path_ticket("stream")).await.unwrap();
    let first = stream.next().await.unwrap().unwrap();
    let addr = node.flight_addr;
    let stopping = tokio::spawn(node.shutdown());
    let mut rows = first.num_rows();
    while let Some(batch) = stream.next().await {
        rows += batch.unwrap().num_rows();
    }
    assert_eq!(
        rows, 1_000_000,
        "the in-flight stream finished after SIGTERM-equivalent"
    );
    stopping.await.unwrap().unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no new connections after shutdown"
    );
}

#[tokio::test]
async fn a_put_that_stalls_ends_at_the_call_deadline_and_frees_its_reservation() {
    use arrow_flight::encode::FlightDataEncoderBuilder;
    use arrow_flight::flight_service_client::FlightServiceClient;
    let node = start_node(&["--max-call-duration", "1s"]).await;
    let batch = sample_batch(5000, 1);
    let messages: Vec<FlightData> = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(path("stalled/1")))
        .build(futures::stream::iter([Ok(batch)]))
        .try_collect()
        .await
        .unwrap();
    // The schema and one batch, then nothing: the client neither sends more nor ends.
    let (sender, receiver) = tokio::sync::mpsc::channel(8);
    for message in messages {
        sender.send(message).await.unwrap();
    }
    let mut raw = FlightServiceClient::new(channel(&node).await);
    let started = std::time::Instant::now();
    let status = match raw
        .do_put(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
    {
        Err(status) => status,
        Ok(response) => response.into_inner().message().await.unwrap_err(),
    };
    let waited = started.elapsed();
    println!(
        "a stalled put ended after {waited:?} (limit 1 s): {:?} {}",
        status.code(),
        status.message()
    );
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_ne!(status.code(), Code::Ok);
    let mut client = client(&node).await;
    let counters = stats(&mut client).await;
    assert_eq!(counters["reservedBytes"], 0);
    assert_eq!(counters["entries"], 0);
    drop(sender);
    node.shutdown().await.unwrap();
}
