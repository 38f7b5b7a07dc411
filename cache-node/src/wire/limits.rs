//! Request size limits per Flight method: one tower layer ([`RequestLimitLayer`]) that
//! bounds the bytes a request body may carry, counted as HTTP/2 data arrives, so an
//! oversized request is refused before it is buffered.
//!
//! DoPut is bounded by the entry size limit in the intake (`wire::intake`, the put path);
//! every other method carries small messages (a descriptor, a ticket, an action body,
//! credentials) and gets [`MAX_UNARY_REQUEST_BYTES`]; Handshake, which runs before
//! authentication, gets [`MAX_HANDSHAKE_REQUEST_BYTES`]. Without it a request of any
//! method was decoded up to the 64 MiB message limit. The gRPC health service, which
//! answers without authentication, is behind the same layer: `Check` gets
//! [`MAX_HEALTH_REQUEST_BYTES`] and `Watch` (a stream that never ends) is refused.
//! Must not import `flight/` or the store.

use std::convert::Infallible;
use std::task::{Context, Poll};

use http_body_util::{BodyExt, LengthLimitError, Limited};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;

/// Most bytes (gRPC framing included) of a request to any Flight method but DoPut and
/// Handshake: descriptors, tickets and action bodies are small.
pub const MAX_UNARY_REQUEST_BYTES: usize = 1 << 20;

/// Most bytes of a Handshake request (a token and a protocol version), which is read
/// before the caller is authenticated.
pub const MAX_HANDSHAKE_REQUEST_BYTES: usize = 64 << 10;

/// Most bytes of a `grpc.health.v1.Health/Check` request (a service name), which is
/// served without authentication (the kubelet's probe has no credential).
pub const MAX_HEALTH_REQUEST_BYTES: usize = 1 << 10;

const FLIGHT_PREFIX: &str = "/arrow.flight.protocol.FlightService/";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
/// Health's streaming method: a stream that never ends, open to anyone. Not served:
/// probes and load balancers poll `Check`.
const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";

/// The request body limit of the gRPC method at `path`, if it has one.
pub fn request_limit(path: &str) -> Option<(&str, usize)> {
    if path == HEALTH_CHECK {
        return Some(("Check", MAX_HEALTH_REQUEST_BYTES));
    }
    let method = path.strip_prefix(FLIGHT_PREFIX)?;
    match method {
        // Bounded by the entry size limit while it is read (wire::intake).
        "DoPut" => None,
        "Handshake" => Some((method, MAX_HANDSHAKE_REQUEST_BYTES)),
        _ => Some((method, MAX_UNARY_REQUEST_BYTES)),
    }
}

/// The Flight server `S` behind per-method request size limits.
#[derive(Debug, Clone)]
pub struct RequestLimitLayer<S> {
    inner: S,
}

impl<S> RequestLimitLayer<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S: NamedService> NamedService for RequestLimitLayer<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for RequestLimitLayer<S>
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
        if request.uri().path() == HEALTH_WATCH {
            let status = Status::unimplemented(
                "grpc.health.v1.Health/Watch is not served (an endless stream open to anyone): poll Check",
            );
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let Some((method, limit)) = request_limit(request.uri().path()) else {
            return Box::pin(self.inner.call(request));
        };
        let method = method.to_owned();
        let request = request.map(|body| {
            Body::new(Limited::new(body, limit).map_err(move |err| {
                if err.is::<LengthLimitError>() {
                    // tonic answers a body error that is a Status with that status.
                    let status = Status::resource_exhausted(format!(
                        "a {method} request may carry at most {limit} bytes"
                    ));
                    Box::new(status) as Box<dyn std::error::Error + Send + Sync>
                } else {
                    err
                }
            }))
        });
        Box::pin(self.inner.call(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_but_doput_has_a_small_limit() {
        assert_eq!(
            request_limit("/arrow.flight.protocol.FlightService/DoPut"),
            None
        );
        assert_eq!(
            request_limit("/arrow.flight.protocol.FlightService/Handshake"),
            Some(("Handshake", MAX_HANDSHAKE_REQUEST_BYTES))
        );
        for method in [
            "GetFlightInfo",
            "GetSchema",
            "DoGet",
            "DoAction",
            "ListFlights",
        ] {
            assert_eq!(
                request_limit(&format!("/arrow.flight.protocol.FlightService/{method}")),
                Some((method, MAX_UNARY_REQUEST_BYTES))
            );
        }
        assert_eq!(
            request_limit("/grpc.health.v1.Health/Check"),
            Some(("Check", MAX_HEALTH_REQUEST_BYTES))
        );
    }
}
