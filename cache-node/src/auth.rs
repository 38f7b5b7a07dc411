//! Authentication and the three kinds of caller: one tower layer ([`AuthLayer`]) in front
//! of every Flight call, the rights of each [`Caller`], and the Handshake credential check.
//!
//! A node knows up to three credentials ([`Credentials`]): the clients' tokens (several,
//! so a token can be rotated), the admin token (the operator's) and the peer token (the
//! pool's nodes, to each other). The layer identifies the caller from
//! `authorization: Bearer <token>` before any request body is read, refuses an unknown
//! token or a missing one (when clients need a token) with UNAUTHENTICATED, refuses the
//! internal `x-flightcache-*` headers from anyone but a peer with PERMISSION_DENIED, and
//! hands the [`Caller`] to the service in the request's extensions, where admin actions
//! are checked ([`Auth::authorize_action`]). Refusals are recorded in the RPC metrics.
//!
//! A node started without an admin token lets every client administer it, and one without
//! a peer token honours the internal headers from every client: the mode of a node run by
//! hand or in tests. The operator always configures both.
//!
//! Handshake accepts `authorization: Basic base64(user:token)` (any user name, which is
//! what `pyarrow.flight.FlightClient.authenticate_basic_token` sends), a Bearer header,
//! or the token as the first HandshakeRequest payload, and answers with the Bearer
//! header ([`Auth::handshake`], called by the Flight service). Must not import `flight/`,
//! `wire/` or the store. Pure apart from reading request headers.

use std::convert::Infallible;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};

use base64::Engine as _;
use crds::admin::AdminAction;
use subtle::ConstantTimeEq as _;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::{BoxFuture, Service};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;

use crate::config::Credentials;
use crate::connection::ConnectionInfo;
use crate::error::{Error, Result};
use crate::headers::{INTERNAL_HEADER_PREFIX, PREVIOUS_ATTEMPTS_HEADER};
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

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        if let Some(method) = authenticated_method(request.uri().path()) {
            let metadata = MetadataMap::from_headers(request.headers().clone());
            match self.auth.admit(&metadata) {
                Ok(caller) => {
                    // The connection carried an authenticated call: it may stay open
                    // (`wire/accept` ends one that has not within its limit).
                    if let Some(connection) = ConnectionInfo::of(request.extensions()) {
                        connection.mark_authenticated();
                    }
                    // A relayed call keeps its client's headers: counted where it arrived.
                    if caller != Caller::Peer && is_a_retry(&metadata) {
                        let agent = request
                            .headers()
                            .get(http::header::USER_AGENT)
                            .and_then(|value| value.to_str().ok());
                        self.metrics
                            .retried_call(method, crate::metrics::client_library(agent));
                    }
                    request.extensions_mut().insert(caller);
                }
                Err(err) => {
                    let status = Status::from(err);
                    self.metrics.rpc(method).finish(status.code());
                    return Box::pin(async move { Ok(status.into_http()) });
                }
            }
        }
        Box::pin(self.inner.call(request))
    }
}

/// Whether the call says it is a retry: `grpc-previous-rpc-attempts` holds a count of
/// at least 1 (gRFC A6). Anything else (absent, not a number) is a first try.
fn is_a_retry(metadata: &MetadataMap) -> bool {
    metadata
        .get(PREVIOUS_ATTEMPTS_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u32>().ok())
        .is_some_and(|attempts| attempts >= 1)
}

const MISSING: &str = "this node requires a bearer token: send 'authorization: Bearer <token>', \
                       or call Handshake with basic auth (any user, the token as password)";

/// Who a call comes from, as its credential says. The [`AuthLayer`] puts it into every
/// authenticated request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A client: a client token, or no token where clients need none.
    Client,
    /// Another node of the pool (the peer token).
    Peer,
    /// The operator (the admin token).
    Admin,
}

impl Caller {
    /// The name used in refusals.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Peer => "peer",
            Self::Admin => "admin",
        }
    }
}

/// The configured credentials and the rights that follow from them.
///
/// The admin and peer tokens are fixed for the node's life (the operator generates them
/// once). The clients' tokens are replaced when their file changes
/// ([`Auth::replace_client_tokens`]): a token taken out of the file is refused from the
/// next call on, on open connections too, since every call is checked.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    credentials: Arc<Credentials>,
    /// The admin and peer tokens' digests, computed once: a presented token is compared
    /// with them.
    known: Arc<KnownDigests>,
    /// The clients' tokens' digests, as last read; empty: clients need no token.
    clients: Arc<RwLock<Vec<TokenDigest>>>,
}

/// A token's SHA-256. Tokens are compared by digest, each byte of the two digests
/// whatever the others: the time taken tells neither where a presented token differs
/// from a configured one nor how long the configured one is.
type TokenDigest = [u8; 32];

fn token_digest(token: &[u8]) -> TokenDigest {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token).as_ref());
    out
}

/// The digests of the admin and peer tokens.
#[derive(Debug, Default)]
struct KnownDigests {
    admin: Option<TokenDigest>,
    peer: Option<TokenDigest>,
}

impl KnownDigests {
    fn of(credentials: &Credentials) -> Self {
        let digest = |token: &String| token_digest(token.as_bytes());
        Self {
            admin: credentials.admin.as_ref().map(digest),
            peer: credentials.peer.as_ref().map(digest),
        }
    }
}

fn client_digests(tokens: &[String]) -> Vec<TokenDigest> {
    tokens
        .iter()
        .map(|token| token_digest(token.as_bytes()))
        .collect()
}

/// Why a new set of client tokens was not put in use (the previous one stays).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenRotationError {
    /// No token: clients would need none, which only starting without a token file
    /// may decide.
    #[error("the client token file holds no token; the previous tokens stay in use")]
    Empty,
    /// A client token equal to the admin's or the peers' would give clients their rights.
    #[error("a client token equals the admin or peer token; the previous tokens stay in use")]
    SharedWithInternal,
}

impl Auth {
    /// Auth with `credentials`.
    pub fn new(credentials: Credentials) -> Self {
        Self {
            known: Arc::new(KnownDigests::of(&credentials)),
            clients: Arc::new(RwLock::new(client_digests(&credentials.client))),
            credentials: Arc::new(credentials),
        }
    }

    /// Replaces the clients' tokens with `tokens` (a rotation: the file now lists the new
    /// token beside the old one, or the new one alone). Returns whether they changed.
    ///
    /// # Errors
    /// [`TokenRotationError`] when `tokens` would open the node to every client or give
    /// clients the admin's or peers' rights; the previous tokens stay in use.
    pub fn replace_client_tokens(&self, tokens: &[String]) -> Result<bool, TokenRotationError> {
        if tokens.is_empty() {
            return Err(TokenRotationError::Empty);
        }
        let internal = [&self.credentials.admin, &self.credentials.peer];
        if tokens
            .iter()
            .any(|token| internal.iter().any(|known| known.as_ref() == Some(token)))
        {
            return Err(TokenRotationError::SharedWithInternal);
        }
        let fresh = client_digests(tokens);
        let mut clients = self.clients.write().unwrap_or_else(PoisonError::into_inner);
        if *clients == fresh {
            return Ok(false);
        }
        *clients = fresh;
        Ok(true)
    }

    /// Auth with one client token, or none (no admin or peer token).
    pub fn client_token(token: Option<String>) -> Self {
        Self::new(Credentials {
            client: token.into_iter().collect(),
            ..Credentials::default()
        })
    }

    /// Whether clients need a token.
    pub fn clients_need_a_token(&self) -> bool {
        !self
            .clients
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// The `authorization` value this node presents to its peers (the peer token), if
    /// it has one.
    pub fn peer_authorization(&self) -> Option<String> {
        self.credentials
            .peer
            .as_ref()
            .map(|token| format!("Bearer {token}"))
    }

    /// Who presented `token`, if it is one of the configured credentials. Every
    /// configured token is compared, so the time taken does not say which one matched.
    fn caller_of(&self, token: &[u8]) -> Option<Caller> {
        let presented = token_digest(token);
        let matches = |known: &TokenDigest| bool::from(presented.ct_eq(known));
        let admin = self.known.admin.as_ref().is_some_and(matches);
        let peer = self.known.peer.as_ref().is_some_and(matches);
        let client = self
            .clients
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .fold(false, |found, known| matches(known) | found);
        if admin {
            Some(Caller::Admin)
        } else if peer {
            Some(Caller::Peer)
        } else if client {
            Some(Caller::Client)
        } else {
            None
        }
    }

    /// Identifies a call's caller from its Bearer header.
    ///
    /// # Errors
    /// [`Error::Unauthenticated`] when the token is missing (and clients need one) or
    /// matches no credential.
    pub fn identify(&self, metadata: &MetadataMap) -> Result<Caller> {
        match bearer(metadata) {
            Some(presented) => match self.caller_of(presented.as_bytes()) {
                Some(caller) => Ok(caller),
                // Clients need no token: an unknown one is a client's, not a secret.
                None if !self.clients_need_a_token() => Ok(Caller::Client),
                None => Err(Error::Unauthenticated(
                    "the bearer token is not valid".into(),
                )),
            },
            None if !self.clients_need_a_token() => Ok(Caller::Client),
            None => Err(Error::Unauthenticated(MISSING.into())),
        }
    }

    /// Identifies the caller and checks that only a peer sends internal headers.
    ///
    /// # Errors
    /// [`Error::Unauthenticated`] as [`Auth::identify`]; [`Error::PermissionDenied`]
    /// for an internal header from a caller that is not a peer.
    pub fn admit(&self, metadata: &MetadataMap) -> Result<Caller> {
        let caller = self.identify(metadata)?;
        if caller != Caller::Peer
            && self.credentials.peer.is_some()
            && let Some(name) = metadata.keys().find_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(name) => name
                    .as_str()
                    .starts_with(INTERNAL_HEADER_PREFIX)
                    .then(|| name.as_str().to_owned()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
        {
            return Err(Error::PermissionDenied(format!(
                "the header '{name}' is accepted only from the pool's nodes, not from a {}",
                caller.as_str()
            )));
        }
        Ok(caller)
    }

    /// Checks that `caller` may run `action` ([`AdminAction::needs_admin`]).
    ///
    /// # Errors
    /// [`Error::PermissionDenied`] naming the action and the credential it needs.
    pub fn authorize_action(&self, caller: Caller, action: AdminAction) -> Result<()> {
        let allowed = !action.needs_admin()
            || caller == Caller::Admin
            || self.credentials.admin.is_none()
            // `clear` runs on every member: the node that got the call sends it on with
            // the peer credential. `held` is a peer's copy check during a rebalance.
            || (caller == Caller::Peer && matches!(action, AdminAction::Clear | AdminAction::Held));
        if allowed {
            Ok(())
        } else {
            Err(Error::PermissionDenied(format!(
                "the '{action}' action needs the cluster's admin credential; a {} may not run it",
                caller.as_str()
            )))
        }
    }

    /// Checks Handshake credentials and returns the header value to send back.
    ///
    /// # Errors
    /// [`Error::Unauthenticated`] when clients need a token and no credential matches.
    pub fn handshake(&self, metadata: &MetadataMap, payload: &[u8]) -> Result<Option<String>> {
        let header = metadata
            .get(crate::headers::AUTHORIZATION_HEADER)
            .and_then(|v| v.to_str().ok());
        let presented: Option<Vec<u8>> = match header {
            Some(value) => match (value.strip_prefix("Basic "), value.strip_prefix("Bearer ")) {
                (Some(encoded), _) => basic_password(encoded),
                (_, Some(token)) => Some(token.as_bytes().to_vec()),
                _ => None,
            },
            None if !payload.is_empty() => Some(payload.to_vec()),
            None => None,
        };
        let known = presented
            .as_deref()
            .filter(|secret| self.caller_of(secret).is_some())
            .and_then(|secret| std::str::from_utf8(secret).ok());
        match (known, presented.is_some()) {
            (Some(token), _) => Ok(Some(format!("Bearer {token}"))),
            _ if !self.clients_need_a_token() => Ok(None),
            (None, true) => Err(Error::Unauthenticated("the token is not valid".into())),
            (None, false) => Err(Error::Unauthenticated(MISSING.into())),
        }
    }
}

fn bearer(metadata: &MetadataMap) -> Option<&str> {
    metadata
        .get(crate::headers::AUTHORIZATION_HEADER)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn with_header(value: &str) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        metadata.insert("authorization", value.parse().unwrap());
        metadata
    }

    #[test]
    fn a_retry_is_a_call_that_counts_one_earlier_try_or_more() {
        let with = |value: &str| {
            let mut metadata = MetadataMap::new();
            metadata.insert(PREVIOUS_ATTEMPTS_HEADER, value.parse().unwrap());
            metadata
        };
        assert!(is_a_retry(&with("1")));
        assert!(is_a_retry(&with("4")));
        for first_try in ["0", "-1", "many", "", "99999999999"] {
            assert!(!is_a_retry(&with(first_try)), "{first_try:?}");
        }
        assert!(!is_a_retry(&MetadataMap::new()));
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

    fn three_credentials() -> Auth {
        Auth::new(Credentials {
            client: vec!["client-old".into(), "client-new".into()],
            admin: Some("admin-token".into()),
            peer: Some("peer-token".into()),
        })
    }

    #[test]
    fn without_a_token_everything_passes() {
        let auth = Auth::default();
        assert_eq!(auth.identify(&MetadataMap::new()).unwrap(), Caller::Client);
        assert_eq!(auth.handshake(&MetadataMap::new(), b"").unwrap(), None);
        // No admin token: a client may administer; no peer token: internal headers pass.
        for action in AdminAction::ALL {
            assert!(auth.authorize_action(Caller::Client, action).is_ok());
        }
        let mut forwarded = MetadataMap::new();
        forwarded.insert("x-flightcache-forwarded", "p-1".parse().unwrap());
        assert_eq!(auth.admit(&forwarded).unwrap(), Caller::Client);
    }

    #[test]
    fn bearer_tokens_are_checked() {
        let auth = Auth::client_token(Some("s3cret".into()));
        assert!(auth.identify(&with_header("Bearer s3cret")).is_ok());
        assert!(auth.identify(&with_header("Bearer s3cre7")).is_err());
        let err = auth.identify(&MetadataMap::new()).unwrap_err();
        assert!(err.to_string().contains("requires a bearer token"));
    }

    #[test]
    fn each_credential_names_its_caller_and_every_client_token_is_accepted() {
        let auth = three_credentials();
        let caller = |token: &str| auth.identify(&with_header(&format!("Bearer {token}")));
        assert_eq!(caller("client-old").unwrap(), Caller::Client);
        assert_eq!(caller("client-new").unwrap(), Caller::Client);
        assert_eq!(caller("admin-token").unwrap(), Caller::Admin);
        assert_eq!(caller("peer-token").unwrap(), Caller::Peer);
        assert!(caller("guess").is_err());
        assert!(auth.identify(&MetadataMap::new()).is_err());
    }

    #[test]
    fn a_token_matches_only_whole_whatever_its_length() {
        let auth = three_credentials();
        let caller = |token: &str| auth.identify(&with_header(&format!("Bearer {token}")));
        // Prefixes, extensions and same-length near misses of configured tokens.
        for near in [
            "admin-toke",
            "admin-token-",
            "admin-tokem",
            "peer-tokens",
            "client-ol",
            "x",
        ] {
            assert!(caller(near).is_err(), "{near:?} was accepted");
        }
        // Compared by digest: one configured token's digest is every other's length.
        assert_eq!(token_digest(b"a").len(), token_digest(&[7u8; 4096]).len());
        assert_ne!(token_digest(b"admin-token"), token_digest(b"admin-toke"));
    }

    #[test]
    fn rotated_client_tokens_replace_the_old_ones_from_the_next_call() {
        let auth = three_credentials();
        let caller = |token: &str| auth.identify(&with_header(&format!("Bearer {token}")));
        // The file lists the next token beside the current one, then the next alone.
        assert!(
            auth.replace_client_tokens(&["client-new".into(), "client-next".into()])
                .unwrap()
        );
        assert_eq!(caller("client-next").unwrap(), Caller::Client);
        assert!(caller("client-old").is_err());
        assert!(
            !auth
                .replace_client_tokens(&["client-new".into(), "client-next".into()])
                .unwrap()
        );
        assert!(auth.replace_client_tokens(&["client-next".into()]).unwrap());
        let refused = caller("client-new").unwrap_err();
        assert_eq!(Status::from(refused).code(), tonic::Code::Unauthenticated);
        // A clone (each layer and service holds one) sees the rotation too.
        let clone = auth.clone();
        assert!(clone.identify(&with_header("Bearer client-new")).is_err());
        // Neither an empty file nor an internal token is put in use.
        assert_eq!(
            auth.replace_client_tokens(&[]),
            Err(TokenRotationError::Empty)
        );
        assert_eq!(
            auth.replace_client_tokens(&["admin-token".into()]),
            Err(TokenRotationError::SharedWithInternal)
        );
        assert_eq!(caller("client-next").unwrap(), Caller::Client);
        assert_eq!(caller("admin-token").unwrap(), Caller::Admin);
        assert!(auth.clients_need_a_token());
    }

    #[test]
    fn admin_actions_need_the_admin_credential() {
        let auth = three_credentials();
        for action in AdminAction::ALL {
            assert!(auth.authorize_action(Caller::Admin, action).is_ok());
            let client = auth.authorize_action(Caller::Client, action);
            assert_eq!(client.is_ok(), !action.needs_admin(), "{action}");
        }
        let err = auth
            .authorize_action(Caller::Client, AdminAction::Configure)
            .unwrap_err();
        assert_eq!(Status::from(err).code(), tonic::Code::PermissionDenied);
        // A peer sends `clear` on to the other members, nothing else of the admin's.
        assert!(
            auth.authorize_action(Caller::Peer, AdminAction::Clear)
                .is_ok()
        );
        assert!(
            auth.authorize_action(Caller::Peer, AdminAction::Configure)
                .is_err()
        );
    }

    #[test]
    fn internal_headers_are_honoured_only_from_peers() {
        let auth = three_credentials();
        for (token, allowed) in [
            ("client-new", false),
            ("admin-token", false),
            ("peer-token", true),
        ] {
            let mut metadata = with_header(&format!("Bearer {token}"));
            metadata.insert(
                "x-flightcache-ring-version",
                "18446744073709551615".parse().unwrap(),
            );
            let result = auth.admit(&metadata);
            assert_eq!(result.is_ok(), allowed, "{token}");
            if let Err(err) = result {
                assert!(err.to_string().contains("x-flightcache-ring-version"));
            }
        }
    }

    #[test]
    fn handshake_accepts_basic_bearer_and_payload() {
        let auth = Auth::client_token(Some("s3cret".into()));
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

    #[test]
    fn credentials_never_appear_in_debug_output() {
        let printed = format!("{:?}", three_credentials());
        for token in ["client-old", "admin-token", "peer-token"] {
            assert!(!printed.contains(token), "{printed}");
        }
    }
}
