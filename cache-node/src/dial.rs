//! Outgoing channels whose whole connect is bounded, TLS handshake included, and whose
//! queued calls all fail together when a connect finds the peer silent.
//!
//! tonic bounds the TCP connect of a channel made by `Endpoint::connect_lazy` and nothing
//! after it: a TLS handshake with a process that is frozen (SIGSTOP, a hung VM; its kernel
//! still accepts the connection) waits for a ServerHello that never comes, and every call
//! queued on the channel waits with it until its own deadline. HTTP/2 keepalive cannot
//! help before the handshake is done; in plaintext it does (the client starts HTTP/2 at
//! once and its pings go unanswered), so this is what TLS lost. A channel from
//! [`lazy_channel`] uses tonic's own connector under its connect-with-connector path,
//! which bounds the connector's whole future (TCP, then TLS) by the endpoint's connect
//! timeout: the connection fails, the queued calls get `UNAVAILABLE`, and callers fail
//! over as they do in plaintext.
//!
//! A failed connect hands its error to **one** queued call: tonic's channel then starts
//! the next connect for the next queued call, so with a silent peer the k-th queued call
//! failed after k connect timeouts (2 s, 4 s, 6 s: a relayed read queued third on a peer's
//! channel outlived its client's 5 s deadline, the changes e2e's node-frozen over TLS).
//! [`SilentPeerGuard`] remembers a connect attempt that got nothing from the peer for half
//! the connect timeout — a TCP connect that timed out, a TLS handshake or an HTTP/2
//! connection with no byte back — and fails the channel's next connects at once for
//! [`SILENT_PEER_SKIPPED_FOR`], so every queued call fails with the first. A peer that
//! answered a byte is never marked; a refused connect fails at once anyway.
//! Must not import anything of the crate.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::codegen::Service;
use tonic::codegen::http::Uri;
use tonic::transport::{Channel, Endpoint};

/// How long a channel's connects fail at once after an attempt found its peer silent:
/// long enough for the calls queued behind that attempt to be drained with its error,
/// short enough that a peer that is back is tried again within a second (the peers'
/// breaker skips a peer that could not be reached for as long, `routing::health`).
pub const SILENT_PEER_SKIPPED_FOR: Duration = Duration::from_secs(1);

/// The connect timeout assumed for an endpoint without one (tonic's default is none).
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A lazily connected channel to `endpoint` (its TLS settings, if any, applied as tonic
/// applies them) whose connect, TLS handshake included, ends within the endpoint's
/// connect timeout, and whose queued calls fail together when the peer is silent.
pub fn lazy_channel(endpoint: &Endpoint) -> Channel {
    let connect_timeout = endpoint.get_connect_timeout();
    let mut http = HttpConnector::new();
    // The URI may be https: TLS is layered on this connector's stream by tonic.
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(connect_timeout);
    let silent_after = connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT) / 2;
    endpoint.connect_with_connector_lazy(SilentPeerGuard::new(http, silent_after))
}

/// A TCP connector that remembers, per channel, when a connection attempt got nothing
/// from its peer for `silent_after`, and then refuses new attempts for
/// [`SILENT_PEER_SKIPPED_FOR`] (see the module docs).
#[derive(Debug, Clone)]
struct SilentPeerGuard {
    http: HttpConnector,
    silent_after: Duration,
    /// Until when new connects fail at once.
    skip_until: Arc<Mutex<Option<Instant>>>,
}

impl SilentPeerGuard {
    /// Guards `http`'s connects; an attempt that hears nothing for `silent_after` marks
    /// the peer silent.
    fn new(http: HttpConnector, silent_after: Duration) -> Self {
        Self {
            http,
            silent_after,
            skip_until: Arc::default(),
        }
    }

    fn skipping(&self) -> bool {
        let until = *self
            .skip_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        until.is_some_and(|until| Instant::now() < until)
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Service<Uri> for SilentPeerGuard {
    type Response = TokioIo<Watched>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        if self.skipping() {
            let message = format!(
                "{uri}: the last connection got no answer from the peer; \
                 not connecting again for up to {SILENT_PEER_SKIPPED_FOR:?}"
            );
            return Box::pin(async move { Err(io::Error::other(message).into()) });
        }
        // Marks the peer silent when dropped without having heard from it: here if the
        // connect fails or is cut off by the timeout, else with the connection.
        let attempt = Attempt {
            opened: Instant::now(),
            heard: false,
            silent_after: self.silent_after,
            skip_until: self.skip_until.clone(),
        };
        let connect = self.http.call(uri);
        Box::pin(async move {
            let stream = connect.await?.into_inner();
            Ok(TokioIo::new(Watched { stream, attempt }))
        })
    }
}

/// One connection attempt: marks the peer silent when dropped if it lasted
/// `silent_after` without a byte from the peer.
#[derive(Debug)]
struct Attempt {
    opened: Instant,
    heard: bool,
    silent_after: Duration,
    skip_until: Arc<Mutex<Option<Instant>>>,
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.heard && self.opened.elapsed() >= self.silent_after {
            let mut until = self
                .skip_until
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *until = Some(Instant::now() + SILENT_PEER_SKIPPED_FOR);
        }
    }
}

/// A connected stream that notes the first byte it reads from the peer.
#[derive(Debug)]
struct Watched {
    stream: TcpStream,
    attempt: Attempt,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.attempt.heard = true;
        }
        read
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
