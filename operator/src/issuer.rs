//! The CA and serving certificate the operator issues for a cluster whose `spec.tls`
//! names no Secret (docs/security.md, "TLS").
//!
//! A CA per cluster (ECDSA P-256, valid [`CA_LIFETIME`]) signs one serving certificate
//! for every name the pools are called by: each pool's Service (short, namespaced and
//! full names) and its nodes (`*.<cluster>-<pool>-nodes.<namespace>.svc.<domain>`), for
//! server and client authentication (nodes present it to each other). It is renewed when
//! a third of its lifetime is left, or as soon as it lacks a name (a pool added) or no
//! longer verifies against the CA. The CA is rebuilt for each signing from its key and
//! its fixed subject, so what it signs verifies against the `ca.crt` made at first.
//!
//! Owns: building the PEMs. Pure (apart from the operating system's randomness for new
//! keys); `secrets` stores them.

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::UnixTime;
use time::OffsetDateTime;

/// How long an issued CA is valid: long enough that no cluster meets its end in a
/// normal life; replacing it is a CA rotation.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How long an issued serving certificate is valid by default: the default of
/// `--issued-certificate-lifetime` (2160h), which the tests use.
#[cfg(test)]
pub const DEFAULT_CERT_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);

/// Issued certificates start this much before they are made, so a node whose clock is
/// a little behind the operator's accepts them at once.
const BACKDATED: Duration = Duration::from_secs(5 * 60);

/// A certificate and its private key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("cert_pem", &self.cert_pem.len())
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Why a certificate could not be issued.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// The stored CA key does not parse.
    #[error("the CA key (ca.key) does not parse: {0}")]
    CaKey(rcgen::Error),
    /// rcgen refused the parameters or could not sign.
    #[error("the certificate cannot be made: {0}")]
    Make(rcgen::Error),
}

/// The CA's fixed subject and uses: what every signing rebuilds the issuer from.
fn ca_params(namespace: &str, cluster: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(
        DnType::CommonName,
        format!("flightcache {namespace}/{cluster} CA"),
    );
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// A new CA for `cluster`, valid from (a little before) `now` for [`CA_LIFETIME`].
///
/// # Errors
/// [`IssueError::Make`].
pub fn new_ca(namespace: &str, cluster: &str, now: OffsetDateTime) -> Result<Issued, IssueError> {
    let key = KeyPair::generate().map_err(IssueError::Make)?;
    let mut params = ca_params(namespace, cluster);
    params.not_before = now - BACKDATED;
    params.not_after = now + CA_LIFETIME;
    let cert = params.self_signed(&key).map_err(IssueError::Make)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A serving certificate for `names`, valid from (a little before) `now` for
/// `lifetime`, signed by the CA whose key is `ca_key_pem`.
///
/// # Errors
/// [`IssueError::CaKey`] for a CA key that does not parse, [`IssueError::Make`].
pub fn issue(
    ca_key_pem: &str,
    namespace: &str,
    cluster: &str,
    names: &[String],
    now: OffsetDateTime,
    lifetime: Duration,
) -> Result<Issued, IssueError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(IssueError::CaKey)?;
    let issuer = Issuer::new(ca_params(namespace, cluster), ca_key);
    let mut params = CertificateParams::new(names.to_vec()).map_err(IssueError::Make)?;
    let mut subject = DistinguishedName::new();
    subject.push(
        DnType::CommonName,
        names.first().map_or("flightcache", String::as_str),
    );
    params.distinguished_name = subject;
    params.not_before = now - BACKDATED;
    params.not_after = now + lifetime;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate().map_err(IssueError::Make)?;
    let cert = params.signed_by(&key, &issuer).map_err(IssueError::Make)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Why an issued certificate must be replaced, if it must: it no longer verifies
/// against `ca_pem`, lacks one of `names` (checked through `checked_names`), or has less
/// than a third of `lifetime` left at `now`.
pub fn renewal_reason(
    cert_pem: &[u8],
    ca_pem: &[u8],
    checked_names: &[String],
    now: UnixTime,
    lifetime: Duration,
) -> Option<String> {
    let horizon = UnixTime::since_unix_epoch(Duration::from_secs(now.as_secs()) + lifetime / 3);
    crate::certs::check_certificate(cert_pem, ca_pem, checked_names, horizon, true)
        .err()
        .map(|problem| problem.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec![
            "c-hot".into(),
            "c-hot.ns.svc".into(),
            "c-hot.ns.svc.cluster.local".into(),
            "*.c-hot-nodes.ns.svc.cluster.local".into(),
        ]
    }

    fn checked() -> Vec<String> {
        vec![
            "c-hot.ns.svc".into(),
            "c-hot-0.c-hot-nodes.ns.svc.cluster.local".into(),
        ]
    }

    fn unix(at: OffsetDateTime) -> UnixTime {
        UnixTime::since_unix_epoch(Duration::from_secs(at.unix_timestamp().unsigned_abs()))
    }

    #[test]
    fn an_issued_certificate_serves_every_name_and_verifies_against_the_ca_made_before() {
        let now = OffsetDateTime::now_utc();
        let ca = new_ca("ns", "c", now).unwrap();
        let day = Duration::from_secs(24 * 3600);
        let leaf = issue(&ca.key_pem, "ns", "c", &names(), now, 90 * day).unwrap();
        assert!(
            crate::certs::check_certificate(
                leaf.cert_pem.as_bytes(),
                ca.cert_pem.as_bytes(),
                &checked(),
                unix(now),
                true,
            )
            .is_ok()
        );
        // Fresh: no renewal. Past two thirds of its life: renewed.
        let renew = |at: OffsetDateTime| {
            renewal_reason(
                leaf.cert_pem.as_bytes(),
                ca.cert_pem.as_bytes(),
                &checked(),
                unix(at),
                90 * day,
            )
        };
        assert_eq!(renew(now), None);
        assert_eq!(renew(now + 59 * day), None);
        assert!(renew(now + 61 * day).unwrap().contains("expired"));
        // A pool added: its names are missing, so it is renewed at once.
        let mut more = checked();
        more.push("c-cold.ns.svc".into());
        let reason = renewal_reason(
            leaf.cert_pem.as_bytes(),
            ca.cert_pem.as_bytes(),
            &more,
            unix(now),
            90 * day,
        )
        .unwrap();
        assert!(reason.contains("c-cold.ns.svc"), "{reason}");
        // Another cluster's CA does not verify it.
        let other = new_ca("ns", "other", now).unwrap();
        assert!(
            renewal_reason(
                leaf.cert_pem.as_bytes(),
                other.cert_pem.as_bytes(),
                &checked(),
                unix(now),
                90 * day,
            )
            .is_some()
        );
    }

    #[test]
    fn a_damaged_ca_key_is_an_error_not_a_panic() {
        let err = issue(
            "not a key",
            "ns",
            "c",
            &names(),
            OffsetDateTime::now_utc(),
            DEFAULT_CERT_LIFETIME,
        )
        .unwrap_err();
        assert!(err.to_string().contains("ca.key"), "{err}");
    }

    #[test]
    fn the_key_is_never_printed() {
        let ca = new_ca("ns", "c", OffsetDateTime::now_utc()).unwrap();
        assert!(!format!("{ca:?}").contains("PRIVATE"));
    }
}
