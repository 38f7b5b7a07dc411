//! Accepting connections: at most `max_connections` open at once, and accept errors
//! that mean the process is out of file descriptors back off instead of spinning (with
//! descriptors exhausted the accept loop used to retry at once and hold a core at 95–99%
//! until connections closed). One client address holds at most its share of the places
//! (`with_per_source_limit`), so one source cannot take them all from the operator, the
//! peers and the kubelet's probe. The Flight port's connections live as long as their
//! clients keep them once they have carried an authenticated call (before that, for
//! [`crate::connection::UNAUTHENTICATED_CONNECTION_LIMIT`]); the metrics port's end after a
//! fixed lifetime, so a client that sends nothing holds its place for a bounded time.
//! Must not import `flight/` or the store.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

use crate::connection::ConnectionInfo;

/// How long accepting pauses after the process ran out of file descriptors (or socket
/// buffers): connections that close meanwhile free some.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The Flight listener as a stream of connections, bounded.
pub struct BoundedIncoming {
    listener: TcpListener,
    permits: Arc<Semaphore>,
    keepalive: Duration,
    backoff: Option<Pin<Box<Sleep>>>,
    refused: Counter,
    /// How long each connection may live; none: as long as its client keeps it.
    lifetime: Option<Duration>,
    /// Places one client address may hold, and where refusals past it count.
    per_source: Option<(usize, Counter)>,
    /// Connections open per client address (only with `per_source`).
    sources: Arc<Mutex<HashMap<IpAddr, usize>>>,
    /// How long a connection may stay open without an authenticated call, and where
    /// the ones closed for it count.
    unauthenticated: Option<(Duration, Counter)>,
}

impl BoundedIncoming {
    /// Accepts on `listener`, at most `max_connections` open at once, with TCP keepalive
    /// `keepalive` and `TCP_NODELAY` on every connection; connections closed over the
    /// limit count in `refused`.
    pub fn new(
        listener: TcpListener,
        max_connections: usize,
        keepalive: Duration,
        refused: Counter,
    ) -> Self {
        Self {
            listener,
            permits: Arc::new(Semaphore::new(max_connections.min(Semaphore::MAX_PERMITS))),
            keepalive,
            backoff: None,
            refused,
            lifetime: None,
            per_source: None,
            sources: Arc::default(),
            unauthenticated: None,
        }
    }

    /// At most `limit` of these connections from one client address at once; further
    /// ones from it are closed as they are accepted and counted in `refused`.
    #[must_use]
    pub fn with_per_source_limit(mut self, limit: usize, refused: Counter) -> Self {
        self.per_source = Some((limit.max(1), refused));
        self
    }

    /// These connections each ended `limit` after it was accepted unless a call on it
    /// has been authenticated by then ([`ConnectionInfo::mark_authenticated`]); the ones
    /// ended count in `closed`.
    #[must_use]
    pub fn closing_unauthenticated_after(mut self, limit: Duration, closed: Counter) -> Self {
        self.unauthenticated = Some((limit, closed));
        self
    }

    /// A place for one more connection from `ip`, if it has fewer than its share open
    /// (always, without a per-source limit).
    fn source_place(&self, ip: IpAddr) -> Option<Option<SourcePlace>> {
        let Some((limit, refused)) = &self.per_source else {
            return Some(None);
        };
        let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        let open = sources.entry(ip).or_insert(0);
        if *open >= *limit {
            refused.inc();
            return None;
        }
        *open += 1;
        Some(Some(SourcePlace {
            sources: Arc::clone(&self.sources),
            ip,
        }))
    }

    /// These connections, each ended `lifetime` after it was accepted: reads then see
    /// the end of the stream, and the server closes the connection.
    #[must_use]
    pub fn with_lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = Some(lifetime);
        self
    }

    fn configure(&self, stream: &TcpStream) {
        // Best effort: a socket that refuses an option still works.
        let _ = stream.set_nodelay(true);
        let keepalive = socket2::TcpKeepalive::new().with_time(self.keepalive);
        let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive);
    }
}

/// Whether an accept error means the process or the system is out of descriptors or
/// socket memory (EMFILE, ENFILE, ENOBUFS, ENOMEM): retrying at once cannot succeed.
fn out_of_resources(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(24 | 23 | 105 | 12))
}

impl futures::Stream for BoundedIncoming {
    type Item = Result<BoundedConnection, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(backoff) = self.backoff.as_mut() {
                if backoff.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.backoff = None;
            }
            match self.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok((stream, peer))) => {
                    let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
                        // Over the limit: closed at once (the client sees a reset and
                        // may retry), the open connections keep their streams.
                        self.refused.inc();
                        drop(stream);
                        continue;
                    };
                    // Its address has its share open: closed the same way (counted by
                    // `source_place`).
                    let Some(source_place) = self.source_place(peer.ip().to_canonical()) else {
                        drop(stream);
                        continue;
                    };
                    self.configure(&stream);
                    let ends = self
                        .lifetime
                        .map(|lifetime| Box::pin(tokio::time::sleep(lifetime)));
                    let unauthenticated =
                        self.unauthenticated
                            .as_ref()
                            .map(|(limit, closed)| UnauthenticatedLimit {
                                ends: Box::pin(tokio::time::sleep(*limit)),
                                closed: closed.clone(),
                            });
                    return Poll::Ready(Some(Ok(BoundedConnection {
                        info: ConnectionInfo::new(Some(peer)),
                        stream,
                        _permit: permit,
                        _source_place: source_place,
                        ends,
                        unauthenticated,
                        ended: false,
                    })));
                }
                Poll::Ready(Err(err)) if out_of_resources(&err) => {
                    tracing::warn!(error = %err, backoff = ?ACCEPT_BACKOFF, "accept failed: out of resources, pausing");
                    self.backoff = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
                }
                // A connection that failed before it was accepted (reset, aborted): the
                // next one may work.
                Poll::Ready(Err(err)) => tracing::debug!(error = %err, "accept failed"),
            }
        }
    }
}

/// One open connection of a client address, given back when the connection closes.
struct SourcePlace {
    sources: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl Drop for SourcePlace {
    fn drop(&mut self) {
        let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = sources.get_mut(&self.ip) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                sources.remove(&self.ip);
            }
        }
    }
}

/// When a connection that has carried no authenticated call ends.
struct UnauthenticatedLimit {
    ends: Pin<Box<Sleep>>,
    closed: Counter,
}

/// An accepted connection; it holds its place under the limits until it closes.
pub struct BoundedConnection {
    info: ConnectionInfo,
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    _source_place: Option<SourcePlace>,
    /// When its lifetime ends, if it has one.
    ends: Option<Pin<Box<Sleep>>>,
    /// Until a call on it is authenticated, when it ends.
    unauthenticated: Option<UnauthenticatedLimit>,
    /// It was ended for carrying no authenticated call: reads see the end of the stream.
    ended: bool,
}

impl BoundedConnection {
    /// Whether the client sends its first byte within `within` (a TLS client starts with
    /// its ClientHello; a silent connection should not hold a handshake place long).
    pub async fn first_byte_within(&self, within: Duration) -> bool {
        // A peek, not readiness alone: a new socket can report itself readable with
        // nothing to read.
        let mut first = [0u8; 1];
        matches!(
            tokio::time::timeout(within, self.stream.peek(&mut first)).await,
            Ok(Ok(1))
        )
    }
}

/// The metrics port's listener for axum: the bounded connections, each with its peer's
/// address.
impl axum::serve::Listener for BoundedIncoming {
    type Io = BoundedConnection;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        use futures::StreamExt as _;
        loop {
            // The stream never ends and logs its own errors; an error item is retried.
            if let Some(Ok(connection)) = self.next().await
                && let Ok(peer) = connection.stream.peer_addr()
            {
                return (connection, peer);
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

impl Connected for BoundedConnection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl BoundedConnection {
    /// Whether the connection is over its unauthenticated limit now (counted once); once
    /// a call on it is authenticated the limit is dropped.
    fn unauthenticated_limit_reached(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(limit) = self.unauthenticated.as_mut() else {
            return self.ended;
        };
        if self.info.is_authenticated() {
            self.unauthenticated = None;
            return false;
        }
        if limit.ends.as_mut().poll(cx).is_pending() {
            return false;
        }
        limit.closed.inc();
        tracing::debug!(client = ?self.info.remote_addr(), "connection closed: no authenticated call within its limit");
        self.unauthenticated = None;
        self.ended = true;
        true
    }
}

impl AsyncRead for BoundedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(ends) = self.ends.as_mut()
            && ends.as_mut().poll(cx).is_ready()
        {
            // Its lifetime is over: the end of the stream (nothing read).
            return Poll::Ready(Ok(()));
        }
        if self.unauthenticated_limit_reached(cx) {
            // No authenticated call in time: the end of the stream, and the server
            // closes the connection.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for BoundedConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
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
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[tokio::test]
    async fn a_silent_connection_has_no_first_byte_and_a_speaking_one_has() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming =
            BoundedIncoming::new(listener, 4, Duration::from_secs(60), Counter::default());
        let mut client = TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(!accepted.first_byte_within(Duration::from_millis(200)).await);
        client.write_all(b"x").await.unwrap();
        assert!(accepted.first_byte_within(Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn a_connection_with_a_lifetime_reads_the_end_once_it_is_over() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let lifetime = Duration::from_millis(200);
        let mut incoming =
            BoundedIncoming::new(listener, 4, Duration::from_secs(60), Counter::default())
                .with_lifetime(lifetime);
        let mut client = TcpStream::connect(addr).await.unwrap();
        let mut accepted = incoming.next().await.unwrap().unwrap();
        // Within its lifetime the connection reads what the client sends.
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        accepted.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        // A client that then sends nothing: the pending read ends with the lifetime.
        let started = tokio::time::Instant::now();
        let read = tokio::time::timeout(Duration::from_secs(5), accepted.read(&mut buf))
            .await
            .expect("the read ends with the lifetime")
            .unwrap();
        assert_eq!(read, 0, "the end of the stream");
        assert!(started.elapsed() < lifetime + Duration::from_millis(500));
    }

    #[test]
    fn descriptor_exhaustion_backs_off_and_other_errors_do_not() {
        for errno in [24, 23, 105, 12] {
            assert!(
                out_of_resources(&io::Error::from_raw_os_error(errno)),
                "{errno}"
            );
        }
        // ECONNABORTED: that connection is gone, the next accept may work.
        assert!(!out_of_resources(&io::Error::from_raw_os_error(103)));
    }
}
