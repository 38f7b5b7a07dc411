//! What the nodes mount for TLS, moved towards the cluster's certificate in phases so
//! that no node ever serves a certificate a peer does not trust yet.
//!
//! Nodes mount `<cluster>-node-tls` ([`crate::build::names::node_tls_secret`]), a copy the
//! operator keeps of the cluster's TLS Secret (the one `spec.tls` names, or the one it
//! issues). The kubelet updates each pod's copy of a Secret on its own sync, up to a
//! minute or two apart: had the nodes mounted the cluster's Secret itself, a new CA and a
//! certificate it signed would reach one node before another, and the first would serve a
//! certificate the second cannot verify yet (peer calls failing with `UnknownIssuer` for
//! as long as the skew). The copy moves in three steps instead, each begun once every
//! node that reports says it uses the previous one (`stats`, `tls`):
//!
//! 1. **Trust**: the new CA certificates are added to the copy's `ca.crt` (the old ones
//!    kept); the certificate stays.
//! 2. **Serve**: once every node trusts them, the new certificate and key.
//! 3. **Drop**: once every node serves it, the CAs the cluster's Secret no longer has
//!    are removed from `ca.crt`.
//!
//! A certificate renewed by the same CA needs no first step, and the third has nothing
//! to drop: it is served as soon as the copy is written. Nodes that do not answer (not
//! started, on a lost node) are not waited for: a pod that starts mounts the copy as it
//! is then. A node that answers without saying what it uses (an image from before this)
//! is waited for, so a rotation goes on once the rollout to the new image is done.
//!
//! Pure: the caller reads the Secrets and the nodes' reports and writes the copy.

use bytes::Bytes;
use crds::admin::TlsInUse;

/// The three PEM files of a TLS Secret in cert-manager's shape.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificates peers and clients are verified against (`ca.crt`).
    pub ca: Bytes,
    /// The certificate chain served (`tls.crt`).
    pub cert: Bytes,
    /// Its key (`tls.key`).
    pub key: Bytes,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &fingerprints(&self.ca))
            .field("cert", &fingerprints(&self.cert).into_iter().next())
            .field("key", &"<redacted>")
            .finish()
    }
}

/// What to do with the nodes' copy this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextCopy {
    /// It matches the cluster's Secret: nothing to do.
    Settled,
    /// Write these files (the note says which step, for the log and the event).
    Write(TlsFiles, String),
    /// A step waits for the nodes (the note says for what).
    Wait(String),
}

/// The SHA-256 fingerprint (lowercase hex) of each certificate in `pem`, in order, as
/// the nodes report them (the contract's one definition).
pub fn fingerprints(pem: &[u8]) -> Vec<String> {
    crds::admin::certificate_fingerprints(pem)
}

/// The PEM certificates of `pem` whose fingerprint is not in `known`, each block as it
/// was written, concatenated.
fn certificates_not_in(pem: &[u8], known: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in certificate_blocks(pem) {
        let fingerprint = fingerprints(block).into_iter().next();
        if fingerprint.is_some_and(|hex| !known.contains(&hex)) {
            out.extend_from_slice(block);
            out.push(b'\n');
        }
    }
    out
}

/// Each `CERTIFICATE` block of `pem`, from its BEGIN line to the end of its END line.
fn certificate_blocks(pem: &[u8]) -> Vec<&[u8]> {
    const BEGIN: &[u8] = b"-----BEGIN CERTIFICATE-----";
    const END: &[u8] = b"-----END CERTIFICATE-----";
    let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
    let mut blocks = Vec::new();
    let mut rest = pem;
    while let Some(start) = find(rest, BEGIN) {
        let Some(end) = find(&rest[start..], END) else {
            break;
        };
        let stop = start + end + END.len();
        blocks.push(&rest[start..stop]);
        rest = &rest[stop..];
    }
    blocks
}

/// `pem` ending with a newline, so certificates appended after it start on their own line.
fn with_final_newline(pem: &[u8]) -> Vec<u8> {
    let mut out = pem.to_vec();
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out
}

/// The next state of the nodes' copy (`copy`, `None` before it exists) on the way to
/// `wanted` (the cluster's Secret), given what each node that answered reports
/// (`reports`: its name, and its TLS in use if it says).
pub fn next_copy(
    wanted: &TlsFiles,
    copy: Option<&TlsFiles>,
    reports: &[(String, Option<TlsInUse>)],
) -> NextCopy {
    let Some(copy) = copy else {
        return NextCopy::Write(wanted.clone(), "the nodes' copy made".into());
    };
    let wanted_cas = fingerprints(&wanted.ca);
    let copy_cas = fingerprints(&copy.ca);
    let new_cas = certificates_not_in(&wanted.ca, &copy_cas);
    if !new_cas.is_empty() {
        let mut ca = with_final_newline(&copy.ca);
        ca.extend_from_slice(&new_cas);
        let files = TlsFiles {
            ca: Bytes::from(ca),
            ..copy.clone()
        };
        let added = fingerprints(&new_cas).len();
        return NextCopy::Write(
            files,
            format!(
                "step 1 of a CA rotation: the nodes trust {added} new CA certificate(s) beside the old"
            ),
        );
    }
    if copy.cert != wanted.cert || copy.key != wanted.key {
        let behind = names_where(reports, |tls| {
            wanted_cas.iter().all(|ca| tls.trusted_sha256.contains(ca))
        });
        if !behind.is_empty() {
            return NextCopy::Wait(format!(
                "waiting for {} to trust the new CA before serving the new certificate",
                behind.join(", ")
            ));
        }
        let files = TlsFiles {
            cert: wanted.cert.clone(),
            key: wanted.key.clone(),
            ..copy.clone()
        };
        return NextCopy::Write(files, "the nodes serve the new certificate".into());
    }
    if !same_set(&copy_cas, &wanted_cas) {
        let served = fingerprints(&wanted.cert)
            .into_iter()
            .next()
            .unwrap_or_default();
        let behind = names_where(reports, |tls| tls.served_sha256 == served);
        if !behind.is_empty() {
            return NextCopy::Wait(format!(
                "waiting for {} to serve the new certificate before dropping the old CA",
                behind.join(", ")
            ));
        }
        let files = TlsFiles {
            ca: wanted.ca.clone(),
            ..copy.clone()
        };
        return NextCopy::Write(
            files,
            "last step of a CA rotation: the CAs the cluster's Secret no longer has dropped".into(),
        );
    }
    NextCopy::Settled
}

/// Whether `a` and `b` hold the same fingerprints, in any order.
fn same_set(a: &[String], b: &[String]) -> bool {
    let sorted = |list: &[String]| {
        let mut list = list.to_vec();
        list.sort();
        list.dedup();
        list
    };
    sorted(a) == sorted(b)
}

/// The names of the nodes whose report does not satisfy `done` (one without a TLS report
/// never does).
fn names_where(
    reports: &[(String, Option<TlsInUse>)],
    done: impl Fn(&TlsInUse) -> bool,
) -> Vec<String> {
    reports
        .iter()
        .filter(|(_, tls)| !tls.as_ref().is_some_and(&done))
        .map(|(name, _)| name.clone())
        .collect()
}

/// The CA certificates to verify nodes against while the copy moves: those of `wanted`
/// and of `copy`, each once (a node serves a certificate signed by one of them).
pub fn trusted_while_moving(wanted: &TlsFiles, copy: Option<&TlsFiles>) -> Bytes {
    match copy {
        Some(copy) => ca_union(&copy.ca, &wanted.ca),
        None => wanted.ca.clone(),
    }
}

/// The CA certificates of `first`, then those of `then` it does not have.
pub fn ca_union(first: &[u8], then: &[u8]) -> Bytes {
    let missing = certificates_not_in(then, &fingerprints(first));
    if missing.is_empty() {
        return Bytes::copy_from_slice(first);
    }
    let mut ca = with_final_newline(first);
    ca.extend_from_slice(&missing);
    Bytes::from(ca)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Ca {
        cert: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    }

    fn ca(name: &str) -> Ca {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        Ca { cert }
    }

    fn leaf(by: &Ca, name: &str) -> (Bytes, Bytes) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        let cert = params.signed_by(&key, &by.cert).unwrap();
        (
            Bytes::from(cert.pem().into_bytes()),
            Bytes::from(key.serialize_pem().into_bytes()),
        )
    }

    fn files(ca_pem: String, (cert, key): (Bytes, Bytes)) -> TlsFiles {
        TlsFiles {
            ca: Bytes::from(ca_pem.into_bytes()),
            cert,
            key,
        }
    }

    /// What a node reports when it has loaded `files`.
    fn using(name: &str, files: &TlsFiles) -> (String, Option<TlsInUse>) {
        (
            name.to_owned(),
            Some(TlsInUse {
                served_sha256: fingerprints(&files.cert).remove(0),
                trusted_sha256: fingerprints(&files.ca),
            }),
        )
    }

    fn written(next: NextCopy) -> TlsFiles {
        match next {
            NextCopy::Write(files, _) => files,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    #[test]
    fn a_new_ca_is_trusted_everywhere_before_its_certificate_is_served_and_the_old_dropped_last() {
        let (old_ca, new_ca) = (ca("old"), ca("new"));
        let old = files(old_ca.cert.pem(), leaf(&old_ca, "node"));
        let new = files(new_ca.cert.pem(), leaf(&new_ca, "node"));
        let nodes = ["n-0", "n-1"];
        let all_using = |files: &TlsFiles| nodes.map(|n| using(n, files)).to_vec();

        // Step 1: both CAs trusted, the old certificate still served.
        let step1 = written(next_copy(&new, Some(&old), &all_using(&old)));
        assert_eq!(
            fingerprints(&step1.ca),
            [fingerprints(&old.ca), fingerprints(&new.ca)].concat()
        );
        assert_eq!(step1.cert, old.cert);
        assert_eq!(step1.key, old.key);
        // The step is not repeated while the nodes catch up, and step 2 waits for them.
        let one_behind = vec![using("n-0", &step1), using("n-1", &old)];
        assert_eq!(
            next_copy(&new, Some(&step1), &one_behind),
            NextCopy::Wait(
                "waiting for n-1 to trust the new CA before serving the new certificate".into()
            )
        );
        // Step 2: every node trusts the new CA; the new certificate is served.
        let step2 = written(next_copy(&new, Some(&step1), &all_using(&step1)));
        assert_eq!(step2.ca, step1.ca, "both CAs still trusted");
        assert_eq!((&step2.cert, &step2.key), (&new.cert, &new.key));
        // Step 3 waits until every node serves it, then drops the old CA.
        let one_behind = vec![using("n-0", &step2), using("n-1", &step1)];
        assert!(matches!(
            next_copy(&new, Some(&step2), &one_behind),
            NextCopy::Wait(note) if note.contains("n-1") && note.contains("dropping the old CA")
        ));
        let step3 = written(next_copy(&new, Some(&step2), &all_using(&step2)));
        assert_eq!(step3, new);
        assert_eq!(
            next_copy(&new, Some(&step3), &all_using(&step3)),
            NextCopy::Settled
        );
    }

    #[test]
    fn a_secret_that_keeps_the_old_ca_beside_the_new_needs_no_last_step() {
        // Clients keep certificates of the old CA, so the Secret's ca.crt lists both: once
        // the copy trusts both (in its own order) and serves the new certificate, it is
        // where the Secret is.
        let (old_ca, new_ca) = (ca("old"), ca("new"));
        let old = files(old_ca.cert.pem(), leaf(&old_ca, "node"));
        let both = format!("{}{}", new_ca.cert.pem(), old_ca.cert.pem());
        let new = files(both, leaf(&new_ca, "node"));
        let step1 = written(next_copy(&new, Some(&old), &[using("n-0", &old)]));
        let step2 = written(next_copy(&new, Some(&step1), &[using("n-0", &step1)]));
        assert_eq!(step2.cert, new.cert);
        assert_eq!(
            next_copy(&new, Some(&step2), &[using("n-0", &step2)]),
            NextCopy::Settled
        );
    }

    #[test]
    fn a_certificate_renewed_by_the_same_ca_is_served_at_once() {
        let the_ca = ca("one");
        let old = files(the_ca.cert.pem(), leaf(&the_ca, "node"));
        let renewed = files(the_ca.cert.pem(), leaf(&the_ca, "node"));
        let reports = vec![using("n-0", &old)];
        assert_eq!(written(next_copy(&renewed, Some(&old), &reports)), renewed);
    }

    #[test]
    fn the_copy_is_made_from_the_clusters_secret_and_silent_nodes_are_not_waited_for() {
        let the_ca = ca("one");
        let wanted = files(the_ca.cert.pem(), leaf(&the_ca, "node"));
        assert_eq!(written(next_copy(&wanted, None, &[])), wanted);
        // A node from before TLS reports is waited for; one that does not answer is not
        // in the reports at all.
        let (old_ca, new_ca) = (ca("old"), ca("new"));
        let old = files(old_ca.cert.pem(), leaf(&old_ca, "node"));
        let new = files(new_ca.cert.pem(), leaf(&new_ca, "node"));
        let step1 = written(next_copy(&new, Some(&old), &[]));
        assert!(matches!(
            next_copy(&new, Some(&step1), &[("n-0".into(), None)]),
            NextCopy::Wait(note) if note.contains("n-0")
        ));
        assert!(matches!(
            next_copy(&new, Some(&step1), &[]),
            NextCopy::Write(..)
        ));
    }

    #[test]
    fn the_operator_trusts_both_cas_while_the_copy_moves() {
        let (old_ca, new_ca) = (ca("old"), ca("new"));
        let old = files(old_ca.cert.pem(), leaf(&old_ca, "node"));
        let new = files(new_ca.cert.pem(), leaf(&new_ca, "node"));
        assert_eq!(
            fingerprints(&trusted_while_moving(&new, Some(&old))),
            [fingerprints(&old.ca), fingerprints(&new.ca)].concat()
        );
        assert_eq!(trusted_while_moving(&new, None), new.ca);
        assert_eq!(
            fingerprints(&trusted_while_moving(&new, Some(&new))),
            fingerprints(&new.ca),
            "each CA once"
        );
    }

    #[test]
    fn certificates_are_added_as_written_and_only_once() {
        let (one, two) = (ca("one"), ca("two"));
        let bundle = format!("{}\r\n{}", one.cert.pem(), two.cert.pem());
        let blocks = certificate_blocks(bundle.as_bytes());
        assert_eq!(blocks.len(), 2);
        let known = fingerprints(one.cert.pem().as_bytes());
        let added = certificates_not_in(bundle.as_bytes(), &known);
        assert_eq!(
            fingerprints(&added),
            fingerprints(two.cert.pem().as_bytes())
        );
        assert!(
            certificates_not_in(bundle.as_bytes(), &fingerprints(bundle.as_bytes())).is_empty()
        );
    }
}
