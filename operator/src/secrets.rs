//! The Secrets the operator generates for a cluster: the internal Secret
//! (`<cluster>-internal`: the admin token the operator calls nodes with, and the peer
//! token nodes call each other with), and the client token Secret
//! (`<cluster>-client-token`) when `spec.auth` names none.
//!
//! Each is created once with random tokens (32 bytes from the OS, hex) and owned by the
//! CacheCluster, so it goes with it; it is never overwritten, because the running nodes
//! read their tokens at start. The uid of each Secret the operator creates is recorded in
//! the cluster's `status.generatedSecrets` (under its own field manager), and a Secret of
//! that name is used only when its uid is recorded there: anyone who may create Secrets
//! can write an ownerReference naming the cluster, only the operator its status. A Secret
//! made by someone else is refused, never adopted: its tokens were chosen by them.
//! Clusters an earlier operator ran (pools in status, nothing recorded) have their
//! existing Secrets recorded once, as that operator already used them. The operator reads
//! only these Secrets and the files of the TLS Secret, which it copies into the nodes'
//! `<cluster>-node-tls` and moves in phases (`tls_rollout`); of a Secret
//! `spec.auth.secretName` names it reads only the labels.
//!
//! Secrets a spec names (`spec.auth.secretName`, `spec.tls.secretName`) are mounted into
//! the nodes only when they carry the label [`SECRET_USE_LABEL`]`=<cluster>`: whoever may
//! create a CacheCluster cannot otherwise have any Secret of the namespace mounted into the
//! nodes (and their images, see `--allowed-images`).
//!
//! Owns: creating and reading the generated Secrets and the checks of the user's
//! Secrets (label, keys, the certificate through `certs`). Must not import `plan`,
//! `execute` or `nodes`: it hands the tokens and TLS material to `controller`, which
//! builds the node client.

use std::collections::BTreeMap;

use bytes::Bytes;
use crds::cachecluster::status::GeneratedSecret;
use crds::cachecluster::{CacheCluster, ClientAuth};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::build::names;
use crate::error::{Error, Result, SecretError};
use crate::issuer;
use crate::tls_rollout::{self, NextCopy, TlsFiles};
use crate::validate::ValidatedCluster;

/// The label (value: the CacheCluster's name) a Secret named in a spec must carry.
pub const SECRET_USE_LABEL: &str = "flightcache.dev/cluster";

/// Whether `labels` let `cluster`'s nodes mount the Secret.
fn check_labelled(
    labels: Option<&BTreeMap<String, String>>,
    cluster: &str,
) -> Result<(), SecretError> {
    match labels.and_then(|labels| labels.get(SECRET_USE_LABEL)) {
        Some(value) if value == cluster => Ok(()),
        _ => Err(SecretError::NotLabelled {
            label: SECRET_USE_LABEL,
            cluster: cluster.to_owned(),
        }),
    }
}

/// What the operator needs to call the cluster's nodes.
pub struct ClusterTokens {
    /// The admin token, for the operator's calls to nodes.
    pub admin: String,
    /// The CA (PEM) of the cluster's TLS Secret, when its nodes serve TLS.
    pub tls_ca: Option<Bytes>,
    /// The Secret's certificate and key (PEM), which the operator presents to nodes that
    /// require client certificates (`spec.tls.clientAuth: required`).
    pub tls_identity: Option<(Bytes, Bytes)>,
    /// How long until the certificate the operator issued for the cluster is due for
    /// renewal, when it issues one: the next pass comes no later.
    pub certificate_renewal_in: Option<std::time::Duration>,
    /// The cluster's TLS Secret and the copy the nodes mount, when they serve TLS.
    pub node_tls: Option<NodeTlsCopy>,
}

/// The TLS files the cluster's Secret holds (`spec.tls`'s, or the one the operator
/// issues) and the nodes' copy of them (`<cluster>-node-tls`), which moves towards them
/// in phases ([`tls_rollout`]).
pub struct NodeTlsCopy {
    /// The cluster's Secret's files, checked (`certs`).
    pub wanted: TlsFiles,
    /// The copy's files as read this pass.
    pub copy: TlsFiles,
    /// The copy as read, replaced only if nobody changed it since.
    secret: Secret,
}

impl std::fmt::Debug for ClusterTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTokens")
            .field("admin", &"<redacted>")
            .field("tls_ca", &self.tls_ca.as_ref().map(Bytes::len))
            .field(
                "tls_identity",
                &self.tls_identity.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// The field manager of `status.generatedSecrets`: the pass's own status writes leave
/// the field alone, so a record is never lost to a pass that read the status before it.
const RECORD_FIELD_MANAGER: &str = "flightcache-operator-secrets";

/// Which generated Secrets the operator made for a cluster: the records of its status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provenance {
    /// Name → uid of each Secret the operator created.
    recorded: BTreeMap<String, String>,
    /// The cluster ran under an operator that kept no records: its existing Secrets are
    /// the ones that operator made and used, and are recorded as they are found.
    from_before_records: bool,
    /// Records made in this pass, to be written.
    new: Vec<GeneratedSecret>,
}

impl Provenance {
    /// The records of `cluster`'s status.
    pub fn of(cluster: &ValidatedCluster) -> Self {
        let recorded: BTreeMap<String, String> = cluster
            .recorded_secrets
            .iter()
            .map(|secret| (secret.name.clone(), secret.uid.clone()))
            .collect();
        // Only an operator without records reaches the end of a pass (pools in status)
        // with nothing recorded: this one records the internal Secret before any pool.
        let from_before_records = recorded.is_empty() && cluster.pools_in_status;
        Self {
            recorded,
            from_before_records,
            new: Vec::new(),
        }
    }

    /// Whether `secret` (owned by the cluster) may be used; a Secret from before records
    /// is recorded now.
    fn admit(&mut self, name: &str, uid: &str) -> Result<(), SecretError> {
        match self.recorded.get(name) {
            Some(recorded) if recorded == uid => Ok(()),
            None if self.from_before_records => {
                self.record(name, uid);
                Ok(())
            }
            _ => Err(SecretError::NotCreatedByOperator {
                uid: uid.to_owned(),
            }),
        }
    }

    fn record(&mut self, name: &str, uid: &str) {
        self.recorded.insert(name.to_owned(), uid.to_owned());
        self.new.push(GeneratedSecret {
            name: name.to_owned(),
            uid: uid.to_owned(),
        });
    }
}

/// Makes sure the cluster's generated Secrets exist and returns the admin token.
///
/// # Errors
/// [`Error::Secret`] when a Secret cannot be read, created or recorded, belongs to
/// someone else, was not made by the operator, or lacks a key.
pub async fn ensure(client: &Client, cluster: &ValidatedCluster) -> Result<ClusterTokens> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &cluster.namespace);
    let mut provenance = Provenance::of(cluster);
    let internal = names::internal_secret(&cluster.name);
    let internal_tokens = ensure_secret(
        &api,
        cluster,
        &mut provenance,
        &internal,
        &[names::ADMIN_TOKEN_KEY, names::PEER_TOKEN_KEY],
    )
    .await;
    let generated_client_token = match cluster.client_token.as_ref() {
        Some(token) if token.generated && internal_tokens.is_ok() => ensure_secret(
            &api,
            cluster,
            &mut provenance,
            &token.secret,
            &[names::GENERATED_TOKEN_KEY],
        )
        .await
        .map(drop),
        _ => Ok(()),
    };
    let issued_tls = match cluster.tls_issued {
        Some(lifetime) if internal_tokens.is_ok() && generated_client_token.is_ok() => {
            ensure_issued_tls(&api, cluster, &mut provenance, lifetime)
                .await
                .map(Some)
        }
        _ => Ok(None),
    };
    let node_tls = match &cluster.tls_secret {
        Some(secret) if issued_tls.is_ok() && generated_client_token.is_ok() => {
            Some(ensure_node_tls(&api, cluster, &mut provenance, secret).await)
        }
        _ => None,
    };
    // What was created is recorded even when another Secret failed: an unrecorded
    // Secret of the operator's own would be refused on the next pass.
    if !provenance.new.is_empty() {
        record(client, cluster, &provenance).await?;
    }
    let mut tokens = internal_tokens?;
    generated_client_token?;
    let certificate_renewal_in = issued_tls?;
    let node_tls = node_tls.transpose()?;
    match cluster.client_token.as_ref() {
        Some(token) if token.generated => {}
        Some(token) => {
            let failed = |source: SecretError| Error::Secret {
                secret: token.secret.clone(),
                source,
            };
            let meta = api
                .get_metadata(&token.secret)
                .await
                .map_err(|err| failed(SecretError::Get(err)))?;
            check_labelled(meta.metadata.labels.as_ref(), &cluster.name).map_err(failed)?;
        }
        None => {}
    }
    let admin = tokens
        .remove(names::ADMIN_TOKEN_KEY)
        .ok_or_else(|| Error::Secret {
            secret: internal,
            source: SecretError::MissingKey(names::ADMIN_TOKEN_KEY),
        })?;
    // Nodes serve the copy's certificate, signed by a CA of the cluster's Secret or of the
    // copy; each node trusts the CA of the copy's certificate (the copy serves it only
    // once every node does), so the operator presents that one.
    let (tls_ca, tls_identity) = match &node_tls {
        Some(tls) => {
            let identity = (cluster.tls_client_auth == ClientAuth::Required)
                .then(|| (tls.copy.cert.clone(), tls.copy.key.clone()));
            (
                Some(tls_rollout::trusted_while_moving(
                    &tls.wanted,
                    Some(&tls.copy),
                )),
                identity,
            )
        }
        None => (None, None),
    };
    Ok(ClusterTokens {
        admin,
        tls_ca,
        tls_identity,
        certificate_renewal_in,
        node_tls,
    })
}

/// The cluster's TLS Secret `secret` (checked, [`read_tls`]) and the nodes' copy of it,
/// made from it when absent (and recorded like every Secret the operator makes).
async fn ensure_node_tls(
    api: &Api<Secret>,
    cluster: &ValidatedCluster,
    provenance: &mut Provenance,
    secret: &str,
) -> Result<NodeTlsCopy> {
    let material = read_tls(api, secret, cluster).await?;
    let wanted = TlsFiles {
        ca: material.ca,
        cert: material.cert,
        key: material.key,
    };
    let name = names::node_tls_secret(&cluster.name);
    let copy_secret = get_or_create(api, cluster, provenance, &name, || {
        Ok(owned_secret(
            cluster,
            &name,
            "kubernetes.io/tls",
            tls_data(&wanted),
        ))
    })
    .await?;
    let file = |key: &'static str| {
        copy_secret
            .data
            .as_ref()
            .and_then(|data| data.get(key))
            .map(|value| Bytes::from(value.0.clone()))
            .ok_or(Error::Secret {
                secret: name.clone(),
                source: SecretError::MissingKey(key),
            })
    };
    let copy = TlsFiles {
        ca: file(names::TLS_CA_KEY)?,
        cert: file(names::TLS_CERT_KEY)?,
        key: file(names::TLS_KEY_KEY)?,
    };
    Ok(NodeTlsCopy {
        wanted,
        copy,
        secret: copy_secret,
    })
}

/// The data of a TLS Secret holding `files`.
fn tls_data(files: &TlsFiles) -> BTreeMap<String, ByteString> {
    BTreeMap::from([
        (names::TLS_CA_KEY.to_owned(), ByteString(files.ca.to_vec())),
        (
            names::TLS_CERT_KEY.to_owned(),
            ByteString(files.cert.to_vec()),
        ),
        (
            names::TLS_KEY_KEY.to_owned(),
            ByteString(files.key.to_vec()),
        ),
    ])
}

/// Moves the nodes' copy of the TLS Secret one phase on when the nodes' reports
/// (`reports`: each node that answered, with the TLS it says it uses) allow
/// ([`tls_rollout::next_copy`]). Returns what happened (`Write`: the note of the phase
/// written) or what it waits for; `None` when the copy matches.
///
/// # Errors
/// [`Error::Secret`] when the copy cannot be replaced (changed since it was read: the
/// next pass reads it again).
pub async fn advance_node_tls(
    client: &Client,
    cluster: &ValidatedCluster,
    tls: &NodeTlsCopy,
    reports: &[(String, Option<crds::admin::TlsInUse>)],
) -> Result<NextCopy> {
    let next = tls_rollout::next_copy(&tls.wanted, Some(&tls.copy), reports);
    if let NextCopy::Write(files, note) = &next {
        let api: Api<Secret> = Api::namespaced(client.clone(), &cluster.namespace);
        let name = names::node_tls_secret(&cluster.name);
        replace_data(&api, &name, tls.secret.clone(), tls_data(files)).await?;
        tracing::info!(secret = %name, %note, "moved the nodes' TLS copy on");
    }
    Ok(next)
}

/// The names the cluster's certificate is called by: each pool's Service name, and its
/// first node's name (nodes call each other by name; a wildcard covers the rest).
fn served_names(cluster: &ValidatedCluster) -> Vec<String> {
    cluster
        .pools
        .iter()
        .flat_map(|pool| {
            let object = names::pool_object(&cluster.name, &pool.name);
            [
                format!("{object}.{}.svc", cluster.namespace),
                format!(
                    "{object}-0.{}.{}.svc.{}",
                    names::headless_service(&cluster.name, &pool.name),
                    cluster.namespace,
                    cluster.cluster_domain
                ),
            ]
        })
        .collect()
}

/// The three PEM files of a cluster's TLS Secret.
struct TlsMaterial {
    ca: Bytes,
    cert: Bytes,
    key: Bytes,
}

/// The TLS Secret `spec.tls` names (the operator verifies nodes against its `ca.crt`),
/// after checking that it has the three keys nodes mount and that its certificate is
/// signed by that CA, valid now, for every name in `served_names` and, with
/// `clientAuth: required`, for client authentication.
async fn read_tls(
    api: &Api<Secret>,
    name: &str,
    cluster: &ValidatedCluster,
) -> Result<TlsMaterial> {
    let failed = |source: SecretError| Error::Secret {
        secret: name.to_owned(),
        source,
    };
    let secret = api
        .get(name)
        .await
        .map_err(|err| failed(SecretError::Get(err)))?;
    check_labelled(secret.metadata.labels.as_ref(), &cluster.name).map_err(failed)?;
    let data = secret.data.unwrap_or_default();
    for key in [names::TLS_CERT_KEY, names::TLS_KEY_KEY] {
        if !data.contains_key(key) {
            return Err(failed(SecretError::MissingKey(key)));
        }
    }
    let ca = data
        .get(names::TLS_CA_KEY)
        .map(|ca| Bytes::from(ca.0.clone()))
        .ok_or_else(|| failed(SecretError::MissingKey(names::TLS_CA_KEY)))?;
    let file = |key: &str| {
        data.get(key)
            .map(|value| Bytes::from(value.0.clone()))
            .unwrap_or_default()
    };
    let (cert, key) = (file(names::TLS_CERT_KEY), file(names::TLS_KEY_KEY));
    crate::certs::check_certificate(
        &cert,
        &ca,
        &served_names(cluster),
        rustls_pki_types::UnixTime::now(),
        cluster.tls_client_auth == ClientAuth::Required,
    )
    .map_err(|problem| failed(SecretError::Certificate(problem)))?;
    Ok(TlsMaterial { ca, cert, key })
}

/// The tokens under `keys` of Secret `name`, created with fresh ones if it is absent.
async fn ensure_secret(
    api: &Api<Secret>,
    cluster: &ValidatedCluster,
    provenance: &mut Provenance,
    name: &str,
    keys: &[&'static str],
) -> Result<BTreeMap<&'static str, String>> {
    let secret = get_or_create(api, cluster, provenance, name, || {
        generated_secret(cluster, name, keys)
    })
    .await?;
    tokens_of(&secret, cluster, keys).map_err(|source| Error::Secret {
        secret: name.to_owned(),
        source,
    })
}

/// Secret `name`, made by `make` and recorded when it is absent; when present, only if
/// this cluster owns it and the operator recorded creating it.
async fn get_or_create(
    api: &Api<Secret>,
    cluster: &ValidatedCluster,
    provenance: &mut Provenance,
    name: &str,
    make: impl FnOnce() -> Result<Secret, SecretError>,
) -> Result<Secret> {
    let failed = |source: SecretError| Error::Secret {
        secret: name.to_owned(),
        source,
    };
    let existing = api
        .get_opt(name)
        .await
        .map_err(|err| failed(SecretError::Get(err)))?;
    let secret = match existing {
        Some(secret) => secret,
        None => match api
            .create(&PostParams::default(), &make().map_err(failed)?)
            .await
        {
            Ok(created) => {
                tracing::info!(secret = name, "created the cluster's generated Secret");
                provenance.record(name, &created.uid().unwrap_or_default());
                created
            }
            // Created meanwhile (a previous leader's pass): use it if it is recorded.
            Err(kube::Error::Api(status)) if status.code == 409 => api
                .get(name)
                .await
                .map_err(|err| failed(SecretError::Get(err)))?,
            Err(err) => return Err(failed(SecretError::Create(err))),
        },
    };
    check_owned(&secret, cluster).map_err(failed)?;
    provenance
        .admit(name, &secret.uid().unwrap_or_default())
        .map_err(failed)?;
    Ok(secret)
}

/// Whether this cluster is among `secret`'s owners (by uid).
fn check_owned(secret: &Secret, cluster: &ValidatedCluster) -> Result<(), SecretError> {
    secret
        .owner_references()
        .iter()
        .any(|owner| owner.uid == cluster.owner.uid)
        .then_some(())
        .ok_or(SecretError::NotOwned)
}

/// A Secret of `cluster` named `name` holding `data`, owned by it.
fn owned_secret(
    cluster: &ValidatedCluster,
    name: &str,
    type_: &str,
    data: BTreeMap<String, ByteString>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(cluster.namespace.clone()),
            labels: Some(names::cluster_selector(&cluster.name)),
            owner_references: Some(vec![cluster.owner.clone()]),
            ..ObjectMeta::default()
        },
        type_: Some(type_.into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The value of `key` in `secret`, as text.
fn text_of(secret: &Secret, key: &'static str) -> Result<String, SecretError> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .ok_or(SecretError::MissingKey(key))?;
    String::from_utf8(bytes.0.clone()).map_err(SecretError::NotUtf8)
}

/// The names the issued certificate is made for: each pool's Service by its short,
/// namespaced and full names, and its nodes by a wildcard of the full name they call
/// each other by.
fn issued_names(cluster: &ValidatedCluster) -> Vec<String> {
    let (namespace, domain) = (&cluster.namespace, &cluster.cluster_domain);
    cluster
        .pools
        .iter()
        .flat_map(|pool| {
            let object = names::pool_object(&cluster.name, &pool.name);
            let nodes = names::headless_service(&cluster.name, &pool.name);
            [
                object.clone(),
                format!("{object}.{namespace}"),
                format!("{object}.{namespace}.svc"),
                format!("{object}.{namespace}.svc.{domain}"),
                format!("*.{nodes}.{namespace}.svc.{domain}"),
            ]
        })
        .collect()
}

/// The CA and serving certificate the operator issues when `spec.tls` names no Secret:
/// the CA in `<cluster>-ca-key` (made once), its certificate for clients in
/// `<cluster>-ca`, and the serving certificate nodes mount in `<cluster>-tls`, issued
/// again when a third of `lifetime` is left, a name is missing or the CA changed.
/// Returns how long until the serving certificate is due for renewal.
async fn ensure_issued_tls(
    api: &Api<Secret>,
    cluster: &ValidatedCluster,
    provenance: &mut Provenance,
    lifetime: std::time::Duration,
) -> Result<std::time::Duration> {
    let now = time::OffsetDateTime::now_utc();
    let issuer_name = names::issuer_secret(&cluster.name);
    let failed = |name: &str, source: SecretError| Error::Secret {
        secret: name.to_owned(),
        source,
    };
    let issuer_secret = get_or_create(api, cluster, provenance, &issuer_name, || {
        let ca = issuer::new_ca(&cluster.namespace, &cluster.name, now)
            .map_err(|err| SecretError::Issue(err.to_string()))?;
        Ok(owned_secret(
            cluster,
            &issuer_name,
            "Opaque",
            BTreeMap::from([
                (
                    names::TLS_CA_KEY.to_owned(),
                    ByteString(ca.cert_pem.into_bytes()),
                ),
                (
                    names::CA_KEY_KEY.to_owned(),
                    ByteString(ca.key_pem.into_bytes()),
                ),
            ]),
        ))
    })
    .await?;
    let ca_cert =
        text_of(&issuer_secret, names::TLS_CA_KEY).map_err(|e| failed(&issuer_name, e))?;
    let ca_key = text_of(&issuer_secret, names::CA_KEY_KEY).map_err(|e| failed(&issuer_name, e))?;

    // The CA for clients: its certificate, and while a new CA rolls out to the nodes
    // (`tls_rollout`) the old one too, so a client that reads it then trusts whichever
    // certificate a node serves.
    let clients_name = names::issued_ca_secret(&cluster.name);
    let copy_ca = api
        .get_opt(&names::node_tls_secret(&cluster.name))
        .await
        .map_err(|err| {
            failed(
                &names::node_tls_secret(&cluster.name),
                SecretError::Get(err),
            )
        })?
        .and_then(|copy| copy.data?.remove(names::TLS_CA_KEY))
        .map(|ca| ca.0);
    let for_clients = match copy_ca {
        Some(copy_ca) => tls_rollout::ca_union(ca_cert.as_bytes(), &copy_ca).to_vec(),
        None => ca_cert.clone().into_bytes(),
    };
    let clients_data = BTreeMap::from([(names::TLS_CA_KEY.to_owned(), ByteString(for_clients))]);
    let clients = get_or_create(api, cluster, provenance, &clients_name, || {
        Ok(owned_secret(
            cluster,
            &clients_name,
            "Opaque",
            clients_data.clone(),
        ))
    })
    .await?;
    if clients.data.as_ref() != Some(&clients_data) {
        replace_data(api, &clients_name, clients, clients_data).await?;
    }

    // The serving certificate, labelled like a Secret a user names for the cluster.
    let tls_name = names::issued_tls_secret(&cluster.name);
    let issue = || -> Result<BTreeMap<String, ByteString>, SecretError> {
        let leaf = issuer::issue(
            &ca_key,
            &cluster.namespace,
            &cluster.name,
            &issued_names(cluster),
            now,
            lifetime,
        )
        .map_err(|err| SecretError::Issue(err.to_string()))?;
        Ok(BTreeMap::from([
            (
                names::TLS_CERT_KEY.to_owned(),
                ByteString(leaf.cert_pem.into_bytes()),
            ),
            (
                names::TLS_KEY_KEY.to_owned(),
                ByteString(leaf.key_pem.into_bytes()),
            ),
            (
                names::TLS_CA_KEY.to_owned(),
                ByteString(ca_cert.clone().into_bytes()),
            ),
        ]))
    };
    let renew_after = now.unix_timestamp() + renewal_delay(lifetime);
    let serving = get_or_create(api, cluster, provenance, &tls_name, || {
        let mut secret = owned_secret(cluster, &tls_name, "kubernetes.io/tls", issue()?);
        secret
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(SECRET_USE_LABEL.to_owned(), cluster.name.clone());
        secret.metadata.annotations = Some(renew_after_annotation(renew_after));
        Ok(secret)
    })
    .await?;
    // When the next pass must look at it: the annotation written with it (the check
    // below decides from the certificate itself).
    let due = serving
        .annotations()
        .get(RENEW_AFTER_ANNOTATION)
        .and_then(|value| value.parse::<i64>().ok());
    let held = |key| {
        serving
            .data
            .as_ref()
            .and_then(|data| data.get(key))
            .map(|value| value.0.clone())
            .unwrap_or_default()
    };
    let reason = if held(names::TLS_CA_KEY) != ca_cert.as_bytes() {
        Some("the CA changed".to_owned())
    } else {
        issuer::renewal_reason(
            &held(names::TLS_CERT_KEY),
            ca_cert.as_bytes(),
            &served_names(cluster),
            rustls_pki_types::UnixTime::now(),
            lifetime,
        )
    };
    let due = if let Some(reason) = reason {
        let data = issue().map_err(|e| failed(&tls_name, e))?;
        let mut serving = serving;
        serving
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(renew_after_annotation(renew_after));
        replace_data(api, &tls_name, serving, data).await?;
        tracing::info!(secret = %tls_name, %reason, "issued the cluster's serving certificate again");
        renew_after
    } else {
        due.unwrap_or(renew_after)
    };
    let left = due.saturating_sub(now.unix_timestamp()).max(1);
    Ok(std::time::Duration::from_secs(left.unsigned_abs()))
}

/// Annotation of `<cluster>-tls`: when (Unix seconds) its certificate is due for
/// renewal, for the operator's next pass and for whoever looks.
const RENEW_AFTER_ANNOTATION: &str = "flightcache.dev/renew-after-unix-seconds";

fn renew_after_annotation(at: i64) -> BTreeMap<String, String> {
    BTreeMap::from([(RENEW_AFTER_ANNOTATION.to_owned(), at.to_string())])
}

/// Seconds from issuing to renewal: two thirds of the lifetime.
fn renewal_delay(lifetime: std::time::Duration) -> i64 {
    i64::try_from((lifetime * 2 / 3).as_secs()).unwrap_or(i64::MAX)
}

/// Replaces `secret`'s data with `data`, if nobody changed it since it was read.
async fn replace_data(
    api: &Api<Secret>,
    name: &str,
    mut secret: Secret,
    data: BTreeMap<String, ByteString>,
) -> Result<()> {
    secret.data = Some(data);
    secret.string_data = None;
    api.replace(name, &PostParams::default(), &secret)
        .await
        .map(drop)
        .map_err(|err| Error::Secret {
            secret: name.to_owned(),
            source: SecretError::Update(err),
        })
}

/// Writes the Secrets created (or found from before records) in this pass to the
/// cluster's `status.generatedSecrets`, with every earlier record.
async fn record(
    client: &Client,
    cluster: &ValidatedCluster,
    provenance: &Provenance,
) -> Result<()> {
    let api: Api<CacheCluster> = Api::namespaced(client.clone(), &cluster.namespace);
    let secrets: Vec<GeneratedSecret> = provenance
        .recorded
        .iter()
        .map(|(name, uid)| GeneratedSecret {
            name: name.clone(),
            uid: uid.clone(),
        })
        .collect();
    let patch = json!({
        "apiVersion": "flightcache.dev/v1alpha1",
        "kind": "CacheCluster",
        "status": { "generatedSecrets": secrets },
    });
    api.patch_status(
        &cluster.name,
        &PatchParams::apply(RECORD_FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(drop)
    .map_err(|err| Error::Secret {
        secret: provenance
            .new
            .first()
            .map_or_else(String::new, |secret| secret.name.clone()),
        source: SecretError::Record(err),
    })
}

/// The tokens of `secret`, if this cluster owns it and it has every key.
fn tokens_of(
    secret: &Secret,
    cluster: &ValidatedCluster,
    keys: &[&'static str],
) -> Result<BTreeMap<&'static str, String>, SecretError> {
    check_owned(secret, cluster)?;
    let data = secret.data.clone().unwrap_or_default();
    keys.iter()
        .map(|&key| {
            let bytes = data.get(key).ok_or(SecretError::MissingKey(key))?;
            let token = String::from_utf8(bytes.0.clone()).map_err(SecretError::NotUtf8)?;
            Ok((key, token.trim().to_owned()))
        })
        .collect()
}

/// A new Secret `name` of `cluster` with a random token under each of `keys`.
fn generated_secret(
    cluster: &ValidatedCluster,
    name: &str,
    keys: &[&'static str],
) -> Result<Secret, SecretError> {
    let data = keys
        .iter()
        .map(|&key| Ok((key.to_owned(), ByteString(random_token()?.into_bytes()))))
        .collect::<Result<BTreeMap<_, _>, SecretError>>()?;
    Ok(owned_secret(cluster, name, "Opaque", data))
}

/// 32 random bytes from the operating system, as 64 hex digits.
fn random_token() -> Result<String, SecretError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|err| SecretError::Random(err.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::fixtures::validated;

    #[test]
    fn a_generated_secret_is_owned_by_its_cluster_and_read_back() {
        let cluster = validated(&[("hot", 2)]);
        let keys = [names::ADMIN_TOKEN_KEY, names::PEER_TOKEN_KEY];
        let secret = generated_secret(&cluster, "c-internal", &keys).unwrap();
        assert_eq!(
            secret.metadata.owner_references,
            Some(vec![cluster.owner.clone()])
        );
        let tokens = tokens_of(&secret, &cluster, &keys).unwrap();
        assert_ne!(
            tokens[names::ADMIN_TOKEN_KEY],
            tokens[names::PEER_TOKEN_KEY]
        );
        assert_eq!(tokens[names::ADMIN_TOKEN_KEY].len(), 64);
    }

    #[test]
    fn a_named_secret_needs_the_clusters_label() {
        let labelled = BTreeMap::from([(SECRET_USE_LABEL.to_owned(), "demo".to_owned())]);
        assert!(check_labelled(Some(&labelled), "demo").is_ok());
        let err = check_labelled(Some(&labelled), "other").unwrap_err();
        assert_eq!(
            err.to_string(),
            "the Secret lacks the label flightcache.dev/cluster=other: whoever manages the \
             Secret adds it to let this CacheCluster's nodes mount it"
        );
        assert!(check_labelled(None, "demo").is_err());
    }

    #[test]
    fn a_secret_of_someone_else_is_refused_and_a_missing_key_named() {
        let cluster = validated(&[("hot", 2)]);
        let keys = [names::ADMIN_TOKEN_KEY, names::PEER_TOKEN_KEY];
        let mut foreign = generated_secret(&cluster, "c-internal", &keys).unwrap();
        foreign.metadata.owner_references = None;
        assert!(matches!(
            tokens_of(&foreign, &cluster, &keys),
            Err(SecretError::NotOwned)
        ));
        let short = generated_secret(&cluster, "c-internal", &keys[..1]).unwrap();
        let err = tokens_of(&short, &cluster, &keys).unwrap_err();
        assert_eq!(err.to_string(), "the key peer-token is missing");
    }

    #[test]
    fn only_a_secret_whose_uid_the_status_records_is_used() {
        let mut cluster = validated(&[("hot", 2)]);
        // A new cluster: nothing recorded, nothing adopted.
        let mut fresh = Provenance::of(&cluster);
        let err = fresh.admit("c-internal", "uid-forged").unwrap_err();
        assert!(
            err.to_string()
                .contains("its uid uid-forged is not in status.generatedSecrets"),
            "{err}"
        );
        fresh.record("c-internal", "uid-made");
        assert!(fresh.admit("c-internal", "uid-made").is_ok());
        assert!(fresh.admit("c-internal", "uid-other").is_err());
        // Recorded in status: the same uid passes, another (deleted and re-made by
        // someone else) does not, and neither does an unrecorded name.
        cluster.recorded_secrets = vec![GeneratedSecret {
            name: "c-internal".into(),
            uid: "uid-made".into(),
        }];
        cluster.pools_in_status = true;
        let mut recorded = Provenance::of(&cluster);
        assert!(recorded.admit("c-internal", "uid-made").is_ok());
        assert!(recorded.admit("c-internal", "uid-other").is_err());
        assert!(recorded.admit("c-client-token", "uid-x").is_err());
        assert!(recorded.new.is_empty());
        // A cluster an operator without records ran: its Secrets are recorded as found.
        cluster.recorded_secrets.clear();
        let mut earlier = Provenance::of(&cluster);
        assert!(earlier.admit("c-internal", "uid-old").is_ok());
        assert_eq!(earlier.new.len(), 1);
        // ... but not while no pass of it reached the end (a new cluster's first pass
        // may have failed and still written observedGeneration).
        cluster.pools_in_status = false;
        assert!(
            Provenance::of(&cluster)
                .admit("c-internal", "uid-old")
                .is_err()
        );
    }

    #[test]
    fn tokens_are_64_hex_digits_and_differ() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
