//! Accepting Flight connections: at most `max_connections` open at once, and accept
//! errors that mean the process is out of file descriptors back off instead of
//! spinning (with descriptors exhausted the accept loop used to retry at once and hold a
//! core at 95–99% until connections closed). Must not import `flight/` or the store.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

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
        }
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
                Poll::Ready(Ok((stream, _peer))) => {
                    let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
                        // Over the limit: closed at once (the client sees a reset and
                        // may retry), the open connections keep their streams.
                        self.refused.inc();
                        drop(stream);
                        continue;
                    };
                    self.configure(&stream);
                    return Poll::Ready(Some(Ok(BoundedConnection {
                        stream,
                        _permit: permit,
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

/// An accepted connection; it holds its place under the limit until it closes.
pub struct BoundedConnection {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl Connected for BoundedConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for BoundedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
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
    use super::*;

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
