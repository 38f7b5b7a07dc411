//! Checks of the TLS Secret's certificate before nodes serve it: signed by the Secret's
//! `ca.crt`, valid now, for server use, and for every name clients and nodes call it by
//! (each pool's Service name and its nodes' names). A problem is reported as Degraded
//! with the reason, instead of showing up later as failed handshakes. Pure.
//!
//! Owns the certificate rules and [`CertProblem`] (webpki's reason kept as its source;
//! the full text is built with `crate::chain`). Must not import kube, tokio or
//! `secrets` (which reads the Secret and calls this): no I/O.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use webpki::{EndEntityCert, KeyUsage};

/// What is wrong with the TLS Secret's certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertProblem {
    /// A key holds no PEM certificate.
    #[error("{0} holds no PEM certificate")]
    NoCertificate(&'static str),
    /// The certificate's validity ended.
    #[error("tls.crt expired")]
    Expired,
    /// The certificate's validity has not begun.
    #[error("tls.crt is not valid yet")]
    NotValidYet,
    /// Not signed by the Secret's CA (or not a server certificate); the source is
    /// webpki's reason (e.g. `UnknownIssuer`).
    #[error("tls.crt does not verify against ca.crt")]
    Untrusted(#[source] webpki::Error),
    /// Not valid for a name it is called by.
    #[error("tls.crt is not valid for {0}, a name clients or nodes call it by")]
    WrongName(String),
    /// With `clientAuth: required`, nodes and the operator present this certificate as
    /// clients, and it does not allow that.
    #[error(
        "tls.crt cannot authenticate a client (spec.tls.clientAuth: required): its extended key usage must list clientAuth"
    )]
    NotForClients(#[source] webpki::Error),
}

/// Checks `cert_pem` (the chain, leaf first) against `ca_pem` at `now`, for `names`,
/// and, when `as_client`, for client authentication too.
///
/// # Errors
/// The first [`CertProblem`] found.
pub fn check_certificate(
    cert_pem: &[u8],
    ca_pem: &[u8],
    names: &[String],
    now: UnixTime,
    as_client: bool,
) -> Result<(), CertProblem> {
    let chain: Vec<CertificateDer<'_>> = CertificateDer::pem_slice_iter(cert_pem)
        .filter_map(Result::ok)
        .collect();
    let (leaf, intermediates) = chain
        .split_first()
        .ok_or(CertProblem::NoCertificate("tls.crt"))?;
    let cas: Vec<CertificateDer<'_>> = CertificateDer::pem_slice_iter(ca_pem)
        .filter_map(Result::ok)
        .collect();
    let anchors: Vec<_> = cas
        .iter()
        .filter_map(|ca| webpki::anchor_from_trusted_cert(ca).ok())
        .collect();
    if anchors.is_empty() {
        return Err(CertProblem::NoCertificate("ca.crt"));
    }
    let cert = EndEntityCert::try_from(leaf).map_err(CertProblem::Untrusted)?;
    cert.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        &anchors,
        intermediates,
        now,
        KeyUsage::server_auth(),
        None,
        None,
    )
    .map_err(|err| match err {
        webpki::Error::CertExpired { .. } => CertProblem::Expired,
        webpki::Error::CertNotValidYet { .. } => CertProblem::NotValidYet,
        other => CertProblem::Untrusted(other),
    })?;
    if as_client {
        cert.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &anchors,
            intermediates,
            now,
            KeyUsage::client_auth(),
            None,
            None,
        )
        .map_err(CertProblem::NotForClients)?;
    }
    for name in names {
        let server_name = ServerName::try_from(name.as_str())
            .map_err(|_| CertProblem::WrongName(name.clone()))?;
        cert.verify_is_valid_for_subject_name(&server_name)
            .map_err(|_| CertProblem::WrongName(name.clone()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa,
        KeyPair,
    };

    fn ca() -> CertifiedIssuer<'static, KeyPair> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    }

    fn leaf(ca: &CertifiedIssuer<'static, KeyPair>, names: &[&str], days: (i64, i64)) -> String {
        leaf_for(ca, names, days, &[])
    }

    fn leaf_for(
        ca: &CertifiedIssuer<'static, KeyPair>,
        names: &[&str],
        days: (i64, i64),
        usages: &[ExtendedKeyUsagePurpose],
    ) -> String {
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now + time::Duration::days(days.0);
        params.not_after = now + time::Duration::days(days.1);
        params.extended_key_usages = usages.to_vec();
        params
            .signed_by(&KeyPair::generate().unwrap(), ca)
            .unwrap()
            .pem()
    }

    fn names() -> Vec<String> {
        vec![
            "demo-hot.cache.svc".into(),
            "demo-hot-0.demo-hot-nodes.cache.svc.cluster.local".into(),
        ]
    }

    #[test]
    fn a_certificate_for_the_pools_names_signed_by_the_ca_passes() {
        let ca = ca();
        let cert = leaf(
            &ca,
            &[
                "demo-hot.cache.svc",
                "*.demo-hot-nodes.cache.svc.cluster.local",
            ],
            (-1, 30),
        );
        let ok = check_certificate(
            cert.as_bytes(),
            ca.pem().as_bytes(),
            &names(),
            UnixTime::now(),
            false,
        );
        assert_eq!(ok, Ok(()));
    }

    #[test]
    fn expired_wrong_names_and_a_foreign_ca_are_named() {
        let ca = ca();
        let good_names = [
            "demo-hot.cache.svc",
            "*.demo-hot-nodes.cache.svc.cluster.local",
        ];
        let expired = leaf(&ca, &good_names, (-30, -1));
        assert_eq!(
            check_certificate(
                expired.as_bytes(),
                ca.pem().as_bytes(),
                &names(),
                UnixTime::now(),
                false
            ),
            Err(CertProblem::Expired)
        );
        let only_service = leaf(&ca, &["demo-hot.cache.svc"], (-1, 30));
        let err = check_certificate(
            only_service.as_bytes(),
            ca.pem().as_bytes(),
            &names(),
            UnixTime::now(),
            false,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "tls.crt is not valid for demo-hot-0.demo-hot-nodes.cache.svc.cluster.local, a name clients or nodes call it by"
        );
        let other_ca = self::ca();
        let foreign = leaf(&other_ca, &good_names, (-1, 30));
        assert!(matches!(
            check_certificate(
                foreign.as_bytes(),
                ca.pem().as_bytes(),
                &names(),
                UnixTime::now(),
                false
            ),
            Err(CertProblem::Untrusted(_))
        ));
        // webpki's reason is kept as the source; the full text reads as before.
        let untrusted = check_certificate(
            foreign.as_bytes(),
            ca.pem().as_bytes(),
            &names(),
            UnixTime::now(),
            false,
        )
        .unwrap_err();
        let CertProblem::Untrusted(reason) = &untrusted else {
            panic!("{untrusted:?}");
        };
        assert_eq!(
            crate::chain(&untrusted),
            format!("tls.crt does not verify against ca.crt: {reason:?}")
        );
        assert_eq!(
            check_certificate(
                b"not pem",
                ca.pem().as_bytes(),
                &names(),
                UnixTime::now(),
                false
            ),
            Err(CertProblem::NoCertificate("tls.crt"))
        );
    }

    #[test]
    fn with_client_auth_the_certificate_must_allow_client_authentication() {
        let ca = ca();
        let good_names = [
            "demo-hot.cache.svc",
            "*.demo-hot-nodes.cache.svc.cluster.local",
        ];
        let check = |cert: &str, as_client| {
            check_certificate(
                cert.as_bytes(),
                ca.pem().as_bytes(),
                &names(),
                UnixTime::now(),
                as_client,
            )
        };
        let server_only = leaf_for(
            &ca,
            &good_names,
            (-1, 30),
            &[ExtendedKeyUsagePurpose::ServerAuth],
        );
        assert_eq!(check(&server_only, false), Ok(()));
        let err = check(&server_only, true).unwrap_err();
        assert!(matches!(err, CertProblem::NotForClients(_)), "{err}");
        assert!(err.to_string().contains("spec.tls.clientAuth: required"));
        let both = leaf_for(
            &ca,
            &good_names,
            (-1, 30),
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        assert_eq!(check(&both, true), Ok(()));
        // No extended key usage at all: any use is allowed.
        assert_eq!(check(&leaf(&ca, &good_names, (-1, 30)), true), Ok(()));
    }
}
