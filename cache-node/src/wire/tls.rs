//! TLS for the Flight port, with certificates that rotate without a restart.
//!
//! The node serves TLS when it is given a certificate and key (PEM files; in a pod, the
//! `tls.crt` and `tls.key` of a cert-manager-shaped Secret). [`ReloadingCert`] answers
//! every handshake with the certificate last loaded, and [`watch_files`] re-reads the
//! files every [`RELOAD_INTERVAL`]: the kubelet replaces a Secret volume's files
//! atomically when the Secret changes, so a rotated certificate is served to new
//! connections within the interval, open connections keep theirs, and no call fails. A
//! file that does not parse (half written, a key that does not match) keeps the previous
//! certificate and is counted as a failed reload.
//!
//! [`TlsIncoming`] runs each connection's handshake as its own task, bounded by
//! [`HANDSHAKE_TIMEOUT`], so one slow or silent client never holds up accepting others.
//! The CA file (`ca.crt`) is what nodes verify each other against (`flight::forward`).
//! Must not import `flight/` or the store.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use parking_lot::RwLock;
use prometheus_client::metrics::counter::Counter;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::accept::BoundedConnection;

/// How often the certificate files are re-read.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(5);
/// How long a client may take to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; further accepted connections wait for a place.
pub const MAX_PENDING_HANDSHAKES: usize = 256;

/// Where the node's TLS material is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA (PEM) peers' certificates are verified against.
    pub ca: PathBuf,
}

/// Why TLS material cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A file holds no usable PEM item of the kind expected.
    #[error("{path}: {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is missing or wrong.
        what: String,
    },
    /// rustls refuses the certificate or key (unsupported key type, key not matching
    /// the certificate).
    #[error("the certificate {cert} and key {key} cannot be used: {reason}")]
    Unusable {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        reason: String,
    },
}

/// The crypto provider every TLS config of the node uses (ring, named explicitly so two
/// providers in the dependency tree cannot make the default ambiguous).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The certificate chain and key of `files`, checked to belong together.
///
/// # Errors
/// [`TlsError`] naming the file and what is wrong with it.
pub fn load_certified_key(files: &TlsFiles) -> Result<(CertifiedKey, Bytes), TlsError> {
    let cert_pem = read(&files.cert)?;
    let key_pem = read(&files.key)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| TlsError::Pem {
            path: files.cert.clone(),
            what: err.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Pem {
            path: files.cert.clone(),
            what: "no CERTIFICATE in the file".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|err| TlsError::Pem {
        path: files.key.clone(),
        what: format!("no usable PRIVATE KEY: {err}"),
    })?;
    let unusable = |reason: rustls::Error| TlsError::Unusable {
        cert: files.cert.clone(),
        key: files.key.clone(),
        reason: reason.to_string(),
    };
    let certified = CertifiedKey::from_der(chain, key, &provider()).map_err(unusable)?;
    let mut seen = cert_pem;
    seen.extend_from_slice(&key_pem);
    Ok((certified, Bytes::from(seen)))
}

/// Reads the CA file: the PEM certificates peers are verified against.
///
/// # Errors
/// [`TlsError`] when it cannot be read or holds no certificate.
pub fn load_ca(path: &Path) -> Result<Bytes, TlsError> {
    let pem = read(path)?;
    let count = CertificateDer::pem_slice_iter(&pem)
        .filter(Result::is_ok)
        .count();
    if count == 0 {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            what: "no CERTIFICATE in the file".into(),
        });
    }
    Ok(Bytes::from(pem))
}

/// The certificate handshakes are answered with; replaced when the files change.
#[derive(Debug)]
pub struct ReloadingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadingCert {
    /// Serving `certified` until [`ReloadingCert::replace`].
    pub fn new(certified: CertifiedKey) -> Self {
        Self {
            current: RwLock::new(Arc::new(certified)),
        }
    }

    /// Serves `certified` to new handshakes from now on.
    pub fn replace(&self, certified: CertifiedKey) {
        *self.current.write() = Arc::new(certified);
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.current.read()))
    }
}

/// The server side: a rustls config answering with `cert`, offering HTTP/2 only (gRPC
/// clients require ALPN `h2`).
///
/// # Errors
/// [`TlsError::Unusable`] if rustls refuses the protocol versions (it does not for its
/// own defaults).
pub fn acceptor(cert: Arc<ReloadingCert>, files: &TlsFiles) -> Result<TlsAcceptor, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|reason| TlsError::Unusable {
            cert: files.cert.clone(),
            key: files.key.clone(),
            reason: reason.to_string(),
        })?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// What [`watch_files`] updates when the files change.
pub struct Reloadable {
    /// The server certificate.
    pub cert: Arc<ReloadingCert>,
    /// Called with the new CA when `ca.crt` changes (the peer channels reconnect with it).
    pub on_ca_change: Box<dyn Fn(Bytes) + Send + Sync>,
    /// Reloads that worked.
    pub reloaded: Counter,
    /// Reloads of files that did not parse (the previous material stays in use).
    pub failed: Counter,
}

/// Re-reads `files` every [`RELOAD_INTERVAL`] and applies what changed; `seen` and
/// `seen_ca` are the bytes loaded at start.
pub async fn watch_files(files: TlsFiles, reload: Reloadable, mut seen: Bytes, mut seen_ca: Bytes) {
    let mut tick = tokio::time::interval(RELOAD_INTERVAL);
    tick.tick().await;
    loop {
        tick.tick().await;
        let changed = match (read(&files.cert), read(&files.key)) {
            (Ok(mut now), Ok(key)) => {
                now.extend_from_slice(&key);
                now != seen
            }
            _ => true,
        };
        if changed {
            match load_certified_key(&files) {
                Ok((certified, bytes)) if bytes != seen => {
                    reload.cert.replace(certified);
                    seen = bytes;
                    reload.reloaded.inc();
                    tracing::info!(cert = %files.cert.display(), "serving the rotated TLS certificate");
                }
                Ok(_) => {}
                Err(err) => {
                    // Between the kubelet's writes, or a bad Secret: keep serving the
                    // previous certificate and say so once per interval.
                    reload.failed.inc();
                    tracing::warn!(error = %err, "the TLS files changed but cannot be used; serving the previous certificate");
                }
            }
        }
        match load_ca(&files.ca) {
            Ok(ca) if ca != seen_ca => {
                (reload.on_ca_change)(ca.clone());
                seen_ca = ca;
                reload.reloaded.inc();
                tracing::info!(ca = %files.ca.display(), "verifying peers against the rotated CA");
            }
            Ok(_) => {}
            Err(err) => {
                reload.failed.inc();
                tracing::warn!(error = %err, "the CA file cannot be used; peers are verified against the previous CA");
            }
        }
    }
}

/// Accepted connections after their TLS handshake. Each handshake runs as its own task
/// (at most [`MAX_PENDING_HANDSHAKES`] at once, each within [`HANDSHAKE_TIMEOUT`]);
/// failed ones are closed and counted in `failed`.
pub fn tls_incoming<S>(
    tcp: S,
    acceptor: TlsAcceptor,
    failed: Counter,
) -> impl Stream<Item = Result<TlsStream<BoundedConnection>, io::Error>>
where
    S: Stream<Item = Result<BoundedConnection, io::Error>> + Send + 'static,
{
    tcp.filter_map(|accepted| async move { accepted.ok() })
        .map(move |connection| {
            let acceptor = acceptor.clone();
            let failed = failed.clone();
            async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(connection)).await {
                    Ok(Ok(stream)) => Some(Ok(stream)),
                    Ok(Err(err)) => {
                        failed.inc();
                        tracing::debug!(error = %err, "TLS handshake failed");
                        None
                    }
                    Err(_) => {
                        failed.inc();
                        tracing::debug!("TLS handshake timed out");
                        None
                    }
                }
            }
        })
        .buffer_unordered(MAX_PENDING_HANDSHAKES)
        .filter_map(futures::future::ready)
}
