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
//! The CA file (`ca.crt`) is what nodes verify each other against (`cluster::peers`)
//! and, with client authentication required, what every connecting client's certificate
//! must chain to ([`ReloadingClientVerifier`], re-read with the other files).
//! Must not import `flight/` or the store.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use parking_lot::RwLock;
use prometheus_client::metrics::counter::Counter;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::accept::BoundedConnection;
use crate::config::TlsFiles;

/// How often the certificate files are re-read.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(5);
/// How long a client may take to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; further accepted connections wait for a place.
pub const MAX_PENDING_HANDSHAKES: usize = 256;
/// How long a connection may take to send its first byte (a TLS client's ClientHello
/// follows the connect at once): a silent one gives its handshake place back after this,
/// not after [`HANDSHAKE_TIMEOUT`]. Filling every place then takes 256 silent connections
/// a second instead of 26.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(1);

/// The PEM bytes of a certificate chain and its key, as loaded.
#[derive(Clone, PartialEq, Eq)]
pub struct CertPem {
    /// The chain, leaf first.
    pub cert: Bytes,
    /// The private key.
    pub key: Bytes,
}

impl std::fmt::Debug for CertPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertPem")
            .field("cert", &self.cert.len())
            .field("key", &"<redacted>")
            .finish()
    }
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
pub fn load_certified_key(files: &TlsFiles) -> Result<(CertifiedKey, CertPem), TlsError> {
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
    Ok((
        certified,
        CertPem {
            cert: Bytes::from(cert_pem),
            key: Bytes::from(key_pem),
        },
    ))
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

/// Verifies client certificates against the CA last loaded; replaced when `ca.crt`
/// changes, so a rotated CA admits clients of the new one without a restart.
#[derive(Debug)]
pub struct ReloadingClientVerifier {
    current: RwLock<Arc<dyn ClientCertVerifier>>,
}

impl ReloadingClientVerifier {
    /// Requires certificates signed by `ca_pem` (one or more PEM certificates).
    ///
    /// # Errors
    /// [`TlsError::Pem`] when no certificate of `ca_pem` can be a trust anchor.
    pub fn new(ca_pem: &[u8], path: &Path) -> Result<Self, TlsError> {
        Ok(Self {
            current: RwLock::new(client_verifier(ca_pem, path)?),
        })
    }

    /// Verifies new handshakes against `ca_pem` from now on.
    ///
    /// # Errors
    /// [`TlsError::Pem`] as [`ReloadingClientVerifier::new`]; the previous CA stays.
    pub fn replace(&self, ca_pem: &[u8], path: &Path) -> Result<(), TlsError> {
        *self.current.write() = client_verifier(ca_pem, path)?;
        Ok(())
    }

    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        Arc::clone(&self.current.read())
    }
}

fn client_verifier(ca_pem: &[u8], path: &Path) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem).filter_map(Result::ok) {
        // A certificate that cannot be an anchor is skipped; none at all is an error.
        let _ = roots.add(cert);
    }
    let bad = |what: String| TlsError::Pem {
        path: path.to_owned(),
        what,
    };
    if roots.is_empty() {
        return Err(bad("no CERTIFICATE usable as a trust anchor".into()));
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|err| bad(err.to_string()))
}

impl ClientCertVerifier for ReloadingClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints are optional (RFC 8446 4.2.4); clients send their one certificate.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}

/// The server side: a rustls config answering with `cert`, offering HTTP/2 only (gRPC
/// clients require ALPN `h2`), and requiring client certificates that `clients` accepts
/// when it is given.
///
/// # Errors
/// [`TlsError::Unusable`] if rustls refuses the protocol versions (it does not for its
/// own defaults).
pub fn acceptor(
    cert: Arc<ReloadingCert>,
    clients: Option<Arc<ReloadingClientVerifier>>,
    files: &TlsFiles,
) -> Result<TlsAcceptor, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|reason| TlsError::Unusable {
            cert: files.cert.clone(),
            key: files.key.clone(),
            reason: reason.to_string(),
        })?;
    let builder = match clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// What [`watch_files`] updates when the files change.
pub struct Reloadable {
    /// The server certificate.
    pub cert: Arc<ReloadingCert>,
    /// The client certificate verifier, when clients must present certificates.
    pub clients: Option<Arc<ReloadingClientVerifier>>,
    /// Called with the new CA when `ca.crt` changes (the peer channels reconnect with it).
    pub on_ca_change: Box<dyn Fn(Bytes) + Send + Sync>,
    /// Called with the new certificate and key when they change (peer channels that
    /// present them reconnect).
    pub on_cert_change: Box<dyn Fn(CertPem) + Send + Sync>,
    /// Reloads that worked.
    pub reloaded: Counter,
    /// Reloads of files that did not parse (the previous material stays in use).
    pub failed: Counter,
}

/// Re-reads `files` every [`RELOAD_INTERVAL`] and applies what changed; `seen` and
/// `seen_ca` are the bytes loaded at start.
pub async fn watch_files(
    files: TlsFiles,
    reload: Reloadable,
    mut seen: CertPem,
    mut seen_ca: Bytes,
) {
    let mut tick = tokio::time::interval(RELOAD_INTERVAL);
    tick.tick().await;
    loop {
        tick.tick().await;
        let changed = match (read(&files.cert), read(&files.key)) {
            (Ok(cert), Ok(key)) => cert != seen.cert || key != seen.key,
            _ => true,
        };
        if changed {
            match load_certified_key(&files) {
                Ok((certified, pem)) if pem != seen => {
                    reload.cert.replace(certified);
                    (reload.on_cert_change)(pem.clone());
                    seen = pem;
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
                if let Some(clients) = &reload.clients
                    && let Err(err) = clients.replace(&ca, &files.ca)
                {
                    reload.failed.inc();
                    tracing::warn!(error = %err, "the rotated CA cannot verify clients; clients are verified against the previous CA");
                    continue;
                }
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
/// (at most [`MAX_PENDING_HANDSHAKES`] at once, each within [`HANDSHAKE_TIMEOUT`], its
/// first byte within [`FIRST_BYTE_TIMEOUT`]); failed ones are closed and counted in
/// `failed`.
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
                if !connection.first_byte_within(FIRST_BYTE_TIMEOUT).await {
                    failed.inc();
                    tracing::debug!("no TLS ClientHello within the first-byte timeout");
                    return None;
                }
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
