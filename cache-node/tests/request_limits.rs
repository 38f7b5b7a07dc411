//! Request bounds against a real node process (issue 12): a request of any method but
//! DoPut is refused past its size limit before it is buffered, an unauthenticated one
//! before its body is read at all, and the node's RSS (read from /proc, the node runs as
//! its own process) shows it; each connection is told the node's stream cap.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow_flight::FlightDescriptor;
use arrow_flight::flight_service_client::FlightServiceClient;
use bytes::Bytes;
use tonic::Code;
use tonic::codegen::http;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

const TOKEN: &str = "limits-test-token";

struct NodeProcess {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl NodeProcess {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, TOKEN).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_flightcache-node"))
            .args(["--listen", &addr, "--metrics-listen", "127.0.0.1:0"])
            .arg("--auth-token-file")
            .arg(&token_file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "the node did not listen on {addr}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self {
            child,
            addr,
            _dir: dir,
        }
    }

    fn resident_bytes(&self) -> u64 {
        common::resident_bytes(&self.child.id().to_string())
    }

    async fn client(&self) -> FlightServiceClient<Channel> {
        let channel = Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        FlightServiceClient::new(channel)
            .max_encoding_message_size(usize::MAX)
            .max_decoding_message_size(usize::MAX)
    }
}

fn big_descriptor(bytes: usize) -> FlightDescriptor {
    FlightDescriptor::new_cmd(Bytes::from(vec![b'x'; bytes]))
}

#[tokio::test]
async fn oversized_requests_are_refused_before_they_are_buffered() {
    let node = NodeProcess::start().await;
    let mut client = node.client().await;
    // Warm the node (allocator arenas, the connection) so the figures below are growth.
    let _ = client.get_flight_info(big_descriptor(10)).await;
    let baseline = node.resident_bytes();

    // 60 MiB without a token: UNAUTHENTICATED from the headers, the body never read.
    let err = client
        .get_flight_info(big_descriptor(60 << 20))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let unauthenticated = node.resident_bytes().saturating_sub(baseline);

    // 60 MiB with the token: RESOURCE_EXHAUSTED at the 1 MiB request limit.
    let mut request = tonic::Request::new(big_descriptor(60 << 20));
    request.metadata_mut().insert(
        "authorization",
        MetadataValue::try_from(format!("Bearer {TOKEN}")).unwrap(),
    );
    let err = client.get_flight_info(request).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("at most 1048576 bytes"),
        "{}",
        err.message()
    );
    let authenticated = node.resident_bytes().saturating_sub(baseline);

    // Budget: the HTTP/2 windows the client may fill before the node stops reading
    // (4 MiB per stream, 8 MiB per connection) plus 8 MiB of allocator slack; the body
    // itself is 60 MiB.
    let budget: u64 = (8 << 20) + (8 << 20);
    println!(
        "60 MiB GetFlightInfo: RSS grew {unauthenticated} bytes without a token, \
         {authenticated} with one (budget {budget})"
    );
    assert!(unauthenticated < budget, "{unauthenticated} >= {budget}");
    assert!(authenticated < budget, "{authenticated} >= {budget}");

    // A Handshake, read before authentication, is bounded at 64 KiB.
    let handshake = arrow_flight::HandshakeRequest {
        protocol_version: 0,
        payload: Bytes::from(vec![b'x'; 1 << 20]),
    };
    let err = client
        .handshake(futures::stream::iter([handshake]))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
}

#[tokio::test]
async fn each_connection_is_told_the_stream_cap_and_a_silent_handshake_ends() {
    let node = NodeProcess::start().await;
    let tcp = tokio::net::TcpStream::connect(&node.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(connection);
    let request = |method: &str| {
        http::Request::builder()
            .method("POST")
            .uri(format!(
                "http://{}/arrow.flight.protocol.FlightService/{method}",
                node.addr
            ))
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
    };
    // One answered call first: the node's SETTINGS frame (its stream cap) precedes the
    // answer on the connection, so the client knows the cap once it has the answer.
    let mut client = client.ready().await.unwrap();
    let (response, _send) = client.send_request(request("GetFlightInfo"), true).unwrap();
    let refused = response.await.unwrap();
    assert_eq!(
        refused.headers()["grpc-status"],
        "16",
        "UNAUTHENTICATED without a token"
    );
    // The node advertises its cap in its SETTINGS (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS);
    // HTTP/2 clients hold further calls back, and the node's h2 refuses streams past it
    // (REFUSED_STREAM), so one connection cannot open 100,000 as the adversarial run did.
    assert_eq!(
        client.current_max_send_streams(),
        256,
        "the node's advertised cap"
    );

    // A Handshake that never sends its first message ends with DEADLINE_EXCEEDED after
    // 10 s (it runs before authentication and must not hold its stream forever).
    let started = Instant::now();
    let mut client = client.ready().await.unwrap();
    let (response, _open_send_side) = client.send_request(request("Handshake"), false).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(20), response)
        .await
        .expect("an answer within 20 s")
        .unwrap();
    let waited = started.elapsed();
    let code = answer
        .headers()
        .get("grpc-status")
        .map(|value| value.to_str().unwrap().to_owned());
    println!("a silent Handshake was answered after {waited:?}");
    assert_eq!(code.as_deref(), Some("4"), "DEADLINE_EXCEEDED");
    assert!(waited >= Duration::from_secs(9), "{waited:?}");
    driver.abort();
}
