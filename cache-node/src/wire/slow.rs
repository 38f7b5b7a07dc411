//! Calls that take long to be answered are logged: a get or put answers in milliseconds,
//! so one whose answer began only after [`SLOW_CALL`], or that ended without an answer
//! after it (its client gave up), says where a client's time went (the method, the
//! client's address, how long, the status when the answer carried one in its headers).
//! Timed up to the answer's headers: a stream that then sends for long is a big answer,
//! not a stalled call. Must not import `flight/` or the store.

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;

use crate::connection::ConnectionInfo;

/// An answer that begins later than this after its request arrived is logged.
pub const SLOW_CALL: Duration = Duration::from_secs(1);

/// The server `S`, its slow answers logged.
#[derive(Debug, Clone)]
pub struct SlowCallLog<S> {
    inner: S,
}

impl<S> SlowCallLog<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S: NamedService> NamedService for SlowCallLog<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for SlowCallLog<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let mut watch = CallWatch {
            arrived: Instant::now(),
            // A reference-counted clone: no copy of the path on every call.
            uri: request.uri().clone(),
            // Plain or under TLS (the TLS connections' address used to be missed).
            client: ConnectionInfo::of(request.extensions()).and_then(ConnectionInfo::remote_addr),
            status: None,
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            watch.answered(
                response
                    .headers()
                    .get("grpc-status")
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or("in trailers"),
            );
            Ok(response)
        })
    }
}

/// One call on its way to an answer; dropped once the answer began, or when the call
/// ended without one (the client cancelled, its deadline passed, its connection closed:
/// the server drops the call's future), and logged then if that took [`SLOW_CALL`].
struct CallWatch {
    arrived: Instant,
    uri: http::Uri,
    client: Option<std::net::SocketAddr>,
    /// The answer's status, once its headers are out.
    status: Option<String>,
}

impl CallWatch {
    /// The answer's headers are out, with `status`.
    fn answered(&mut self, status: &str) {
        self.status = Some(status.to_owned());
    }
}

impl Drop for CallWatch {
    fn drop(&mut self) {
        let took = self.arrived.elapsed();
        if took < SLOW_CALL {
            return;
        }
        let took_ms = took.as_millis() as u64;
        match &self.status {
            Some(status) => tracing::warn!(
                method = %self.uri.path(),
                client = ?self.client,
                took_ms,
                status = %status,
                "slow call: its answer began after {took_ms} ms"
            ),
            None => tracing::warn!(
                method = %self.uri.path(),
                client = ?self.client,
                took_ms,
                "slow call: ended without an answer after {took_ms} ms (cancelled by the \
                 client or its connection closed)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An inner service answering after `delay`.
    #[derive(Clone)]
    struct AnswersAfter(Duration);

    impl Service<http::Request<Body>> for AnswersAfter {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = BoxFuture<Self::Response, Infallible>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<Body>) -> Self::Future {
            let delay = self.0;
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                Ok(http::Response::new(Body::empty()))
            })
        }
    }

    /// What the layer logged, captured.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Logs of this thread captured until the guard is dropped.
    fn capture_logs() -> (Captured, tracing::subscriber::DefaultGuard) {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        (captured, tracing::subscriber::set_default(subscriber))
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_dropped_without_an_answer_is_logged_once_it_was_slow() {
        for (waited, logged) in [(Duration::from_millis(10), false), (SLOW_CALL * 2, true)] {
            let (captured, _guard) = capture_logs();
            let mut layer = SlowCallLog::new(AnswersAfter(Duration::from_secs(3600)));
            let request = http::Request::builder()
                .uri("/arrow.flight.protocol.FlightService/DoPut")
                .body(Body::empty())
                .unwrap();
            // The client gives up after `waited`: the call's future is dropped.
            let answered = tokio::time::timeout(waited, layer.call(request)).await;
            assert!(answered.is_err());
            let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
            assert_eq!(
                log.contains("ended without an answer"),
                logged,
                "{waited:?}: {log}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_answer_passes_through_unchanged_and_only_a_slow_one_is_logged() {
        for (delay, logged) in [
            (Duration::ZERO, false),
            (SLOW_CALL - Duration::from_millis(1), false),
            (SLOW_CALL * 3, true),
        ] {
            let (captured, _guard) = capture_logs();
            let mut layer = SlowCallLog::new(AnswersAfter(delay));
            let request = http::Request::builder()
                .uri("/arrow.flight.protocol.FlightService/DoGet")
                .body(Body::empty())
                .unwrap();
            let started = tokio::time::Instant::now();
            let response = layer.call(request).await.unwrap();
            assert_eq!(response.status(), http::StatusCode::OK);
            assert_eq!(started.elapsed(), delay, "the layer adds no wait");
            let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
            assert_eq!(log.contains("slow call"), logged, "{delay:?}: {log}");
            if logged {
                assert!(log.contains("FlightService/DoGet"), "{log}");
                assert!(log.contains("took_ms=3000"), "{log}");
            }
        }
    }
}
