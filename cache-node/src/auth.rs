//! Authentication: one tower layer ([`AuthLayer`]) in front of every Flight call, and
//! the Handshake credential check that hands the token out.
//!
//! With a token configured, every Flight call but Handshake (and the two methods a node
//! does not offer, PollFlightInfo and DoExchange, which answer UNIMPLEMENTED) must carry
//! `authorization: Bearer <token>`; the layer refuses anything else with UNAUTHENTICATED
//! before any request body is read, and records the refusal in the RPC metrics.
//! Handshake accepts `authorization: Basic base64(user:token)` (any user name, which is
//! what `pyarrow.flight.FlightClient.authenticate_basic_token` sends), a Bearer header,
//! or the token as the first HandshakeRequest payload, and answers with the Bearer
//! header ([`Auth::handshake`], called by the Flight service). This layer is where a
//! separate admin credential (issue 12) would be checked. Must not import `flight/`,
//! `wire/` or the store. Pure apart from reading request headers.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use base64::Engine as _;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::{BoxFuture, Service};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::{Code, Status};

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// The gRPC path prefix of the Flight service.
const FLIGHT_PREFIX: &str = "/arrow.flight.protocol.FlightService/";

/// The Flight methods that need a bearer token (every offered method but Handshake).
const AUTHENTICATED_METHODS: [&str; 7] = [
    "ListFlights",
    "GetFlightInfo",
    "GetSchema",
    "DoGet",
    "DoPut",
    "DoAction",
    "ListActions",
];

/// The Flight method `path` names, if it needs a bearer token.
fn authenticated_method(path: &str) -> Option<&'static str> {
    let method = path.strip_prefix(FLIGHT_PREFIX)?;
    AUTHENTICATED_METHODS
        .into_iter()
        .find(|candidate| *candidate == method)
}

/// The Flight server `S` behind the bearer-token check.
#[derive(Debug, Clone)]
pub struct AuthLayer<S> {
    inner: S,
    auth: Auth,
    metrics: Arc<Metrics>,
}

impl<S> AuthLayer<S> {
    /// Wraps `inner`; refusals are recorded in `metrics`.
    pub fn new(inner: S, auth: Auth, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            auth,
            metrics,
        }
    }
}

impl<S: NamedService> NamedService for AuthLayer<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for AuthLayer<S>
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
        if let Some(method) = authenticated_method(request.uri().path()) {
            let metadata = MetadataMap::from_headers(request.headers().clone());
            if let Err(err) = self.auth.check(&metadata) {
                self.metrics.rpc(method).finish(Code::Unauthenticated);
                let status = Status::from(err);
                return Box::pin(async move { Ok(status.into_http()) });
            }
        }
        Box::pin(self.inner.call(request))
    }
}

const MISSING: &str = "this node requires a bearer token: send 'authorization: Bearer <token>', \
                       or call Handshake with basic auth (any user, the token as password)";

/// The configured token, if auth is on.
#[derive(Debug, Clone)]
pub struct Auth {
    token: Option<String>,
}

impl Auth {
    /// Auth with `token`, or none.
    pub fn new(token: Option<String>) -> Self {
        Self { token }
    }

    /// Checks a call's Bearer header.
    ///
    /// # Errors
    /// [`Error::Unauthenticated`] when the token is missing or wrong.
    pub fn check(&self, metadata: &MetadataMap) -> Result<()> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        match bearer(metadata) {
            Some(presented) if constant_time_eq(presented.as_bytes(), token.as_bytes()) => Ok(()),
            Some(_) => Err(Error::Unauthenticated(
                "the bearer token is not valid".into(),
            )),
            None => Err(Error::Unauthenticated(MISSING.into())),
        }
    }

    /// Checks Handshake credentials and returns the header value to send back.
    ///
    /// # Errors
    /// [`Error::Unauthenticated`] when no credential matches.
    pub fn handshake(&self, metadata: &MetadataMap, payload: &[u8]) -> Result<Option<String>> {
        let Some(token) = &self.token else {
            return Ok(None);
        };
        let header = metadata.get("authorization").and_then(|v| v.to_str().ok());
        let presented: Option<Vec<u8>> = match header {
            Some(value) => match (value.strip_prefix("Basic "), value.strip_prefix("Bearer ")) {
                (Some(encoded), _) => basic_password(encoded),
                (_, Some(token)) => Some(token.as_bytes().to_vec()),
                _ => None,
            },
            None if !payload.is_empty() => Some(payload.to_vec()),
            None => None,
        };
        match presented {
            Some(secret) if constant_time_eq(&secret, token.as_bytes()) => {
                Ok(Some(format!("Bearer {token}")))
            }
            Some(_) => Err(Error::Unauthenticated("the token is not valid".into())),
            None => Err(Error::Unauthenticated(MISSING.into())),
        }
    }
}

fn bearer(metadata: &MetadataMap) -> Option<&str> {
    metadata
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

fn basic_password(encoded: &str) -> Option<Vec<u8>> {
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    Some(decoded[colon + 1..].to_vec())
}

/// Compares without an early exit, so timing does not reveal the matching prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_header(value: &str) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        metadata.insert("authorization", value.parse().unwrap());
        metadata
    }

    #[test]
    fn every_offered_method_but_handshake_needs_the_token() {
        for method in [
            "ListFlights",
            "GetFlightInfo",
            "GetSchema",
            "DoGet",
            "DoPut",
            "DoAction",
            "ListActions",
        ] {
            let path = format!("{FLIGHT_PREFIX}{method}");
            assert_eq!(authenticated_method(&path), Some(method));
        }
        for path in [
            "/arrow.flight.protocol.FlightService/Handshake",
            "/arrow.flight.protocol.FlightService/PollFlightInfo",
            "/arrow.flight.protocol.FlightService/DoExchange",
            "/grpc.health.v1.Health/Check",
        ] {
            assert_eq!(authenticated_method(path), None, "{path}");
        }
    }

    #[test]
    fn without_a_token_everything_passes() {
        let auth = Auth::new(None);
        assert!(auth.check(&MetadataMap::new()).is_ok());
        assert_eq!(auth.handshake(&MetadataMap::new(), b"").unwrap(), None);
    }

    #[test]
    fn bearer_tokens_are_checked() {
        let auth = Auth::new(Some("s3cret".into()));
        assert!(auth.check(&with_header("Bearer s3cret")).is_ok());
        assert!(auth.check(&with_header("Bearer s3cre7")).is_err());
        let err = auth.check(&MetadataMap::new()).unwrap_err();
        assert!(err.to_string().contains("requires a bearer token"));
    }

    #[test]
    fn handshake_accepts_basic_bearer_and_payload() {
        let auth = Auth::new(Some("s3cret".into()));
        let basic = base64::engine::general_purpose::STANDARD.encode("anyone:s3cret");
        let expected = Some("Bearer s3cret".to_owned());
        assert_eq!(
            auth.handshake(&with_header(&format!("Basic {basic}")), b"")
                .unwrap(),
            expected
        );
        assert_eq!(
            auth.handshake(&with_header("Bearer s3cret"), b"").unwrap(),
            expected
        );
        assert_eq!(
            auth.handshake(&MetadataMap::new(), b"s3cret").unwrap(),
            expected
        );
        let wrong = base64::engine::general_purpose::STANDARD.encode("anyone:guess");
        assert!(
            auth.handshake(&with_header(&format!("Basic {wrong}")), b"")
                .is_err()
        );
        assert!(auth.handshake(&MetadataMap::new(), b"").is_err());
    }
}
