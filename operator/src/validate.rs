//! From a `CacheCluster` to the validated model the builders take.
//!
//! Runs the same rules the API server enforces (`crds::cachecluster::validate`), refuses
//! what this operator cannot act on (with a message naming the field), and derives
//! every value the builders need: the node byte budget from the memory limit, the
//! image, the ports. Pure; no I/O.
//!
//! Owns: [`ValidatedCluster`] and [`Defaults`]. Must not import kube's client, tokio or
//! any I/O (checked by `scripts/check-layers`); imports `build::names` only.

use std::time::Duration;

use crds::cachecluster::{AuthSpec, CacheCluster, FieldError, InvalidSpec, PoolSpec, TlsSpec};

use crate::build::names::{self, GENERATED_TOKEN_KEY};
use crds::node_config::{EvictionPolicy, LocationMode, TtlMode};
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;

use crds::cachecluster::{PersistenceSpec, SchedulingSpec};

/// Memory a node process needs beyond its cache: code, gRPC buffers of in-flight
/// requests, the allocator's slack.
pub const NODE_BASE_BYTES: u64 = 48 << 20;
/// Share of the rest the node may fill with cached Arrow data; the remainder absorbs
/// in-flight puts' message buffers and DoGet encode buffers.
pub const BUDGET_PERCENT: u64 = 80;
/// Largest single entry a pool accepts, whatever its budget.
pub const MAX_ENTRY_CAP_BYTES: u64 = 256 << 20;

/// The node byte budget for a container memory limit: 80% of (limit − 48 MiB).
pub fn compute_budget_bytes(memory_limit_bytes: u64) -> u64 {
    memory_limit_bytes.saturating_sub(NODE_BASE_BYTES) / 100 * BUDGET_PERCENT
}

/// The max entry size for a budget: a quarter of it, at most 256 MiB.
pub fn compute_max_entry_bytes(budget_bytes: u64) -> u64 {
    (budget_bytes / 4).clamp(1, MAX_ENTRY_CAP_BYTES)
}

/// Operator-wide settings validation needs.
#[derive(Debug, Clone)]
pub struct Defaults {
    /// Node image when the spec names none.
    pub node_image: String,
    /// Image pull policy of node containers.
    pub image_pull_policy: String,
    /// DNS domain of the Kubernetes cluster (`cluster.local`).
    pub cluster_domain: String,
    /// The operator's own namespace (its pods are admitted by the pools'
    /// NetworkPolicies).
    pub operator_namespace: String,
    /// Image repositories node pods may run (`--allowed-images`); empty: any.
    pub allowed_images: Vec<String>,
    /// Lifetime of the serving certificates the operator issues.
    pub issued_certificate_lifetime: std::time::Duration,
}

/// Message of an image outside `--allowed-images`.
pub const IMAGE_NOT_ALLOWED_MSG: &str = "the image is not one this operator runs: its repository must be one of the operator's --allowed-images (the chart's allowedImages, by default its node image repository)";

/// Whether `image` (`repo[:tag][@digest]`) is from one of the `allowed` repositories.
pub fn image_allowed(image: &str, allowed: &[String]) -> bool {
    allowed.is_empty()
        || allowed.iter().any(|repository| {
            image.strip_prefix(repository.as_str()).is_some_and(|rest| {
                rest.is_empty() || rest.starts_with(':') || rest.starts_with('@')
            })
        })
}

/// A cluster the operator can act on.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedCluster {
    /// CacheCluster name.
    pub name: String,
    /// Namespace of the cluster and its children.
    pub namespace: String,
    /// The controller owner reference every child carries.
    pub owner: OwnerReference,
    /// `metadata.generation`, used as the node config generation.
    pub generation: i64,
    /// Flight port.
    pub port: u16,
    /// Metrics port.
    pub metrics_port: u16,
    /// Whether a prometheus-operator ServiceMonitor scrapes the nodes.
    pub service_monitor: bool,
    /// Where the clients' token is; none when `spec.auth.disabled`.
    pub client_token: Option<ClientToken>,
    /// The TLS Secret (`tls.crt`, `tls.key`, `ca.crt`), when the Flight port serves TLS.
    pub tls_secret: Option<String>,
    /// The lifetime of the certificate the operator issues into `tls_secret`, when
    /// `spec.tls` names no Secret; none: the Secret is the user's.
    pub tls_issued: Option<std::time::Duration>,
    /// Whether nodes require client certificates (only with `tls_secret`).
    pub tls_client_auth: crds::cachecluster::ClientAuth,
    /// `spec.tls` is unset and an earlier operator served the cluster in plaintext: it
    /// stays plaintext (with a Warning) rather than breaking its clients.
    pub plaintext_kept: bool,
    /// Who may reach the nodes; none when `spec.networkPolicy.disabled`.
    pub network_policy: Option<ValidatedNetworkPolicy>,
    /// Image pull policy of node containers.
    pub image_pull_policy: String,
    /// DNS domain of the Kubernetes cluster.
    pub cluster_domain: String,
    /// Pools in spec order.
    pub pools: Vec<ValidatedPool>,
    /// The Secrets the operator recorded creating (`status.generatedSecrets`).
    pub recorded_secrets: Vec<crds::cachecluster::status::GeneratedSecret>,
    /// Whether an earlier pass reached the end (pools in status).
    pub pools_in_status: bool,
}

/// The pools' NetworkPolicy, every default resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedNetworkPolicy {
    /// The operator's namespace.
    pub operator_namespace: String,
    /// Who may call the Flight port besides the pool's nodes and the operator.
    pub clients: Vec<NetworkPolicyPeer>,
    /// Who may scrape the metrics port; none: anyone.
    pub metrics_scrapers: Option<Vec<NetworkPolicyPeer>>,
}

/// The Secret holding the clients' token(s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientToken {
    /// Secret name.
    pub secret: String,
    /// Key in the Secret.
    pub key: String,
    /// Whether the operator generates and owns the Secret (no `spec.auth.secretName`).
    pub generated: bool,
}

/// One pool, every value derived.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedPool {
    /// Pool name.
    pub name: String,
    /// Number of nodes.
    pub shards: i32,
    /// Copies per key.
    pub replicas: i32,
    /// Node image.
    pub image: String,
    /// Whether `image` is the operator's own node image (`--node-image`, released with
    /// it), which reads ring zones; another image is trusted to only once a node running
    /// it says so (`ring::zones_readable`).
    pub image_reads_zones: bool,
    /// Entry cap per node.
    pub max_entries: u64,
    /// Default TTL.
    pub ttl: Duration,
    /// TTL mode.
    pub ttl_mode: TtlMode,
    /// Eviction policy.
    pub eviction: EvictionPolicy,
    /// What GetFlightInfo locations point at.
    pub location_mode: LocationMode,
    /// Container memory limit as written (a Kubernetes quantity).
    pub memory_limit: String,
    /// Container memory limit in bytes.
    pub memory_limit_bytes: u64,
    /// Node byte budget ([`compute_budget_bytes`]).
    pub budget_bytes: u64,
    /// Node max entry size ([`compute_max_entry_bytes`]).
    pub max_entry_bytes: u64,
    /// Other container resources.
    pub resources: Option<ResourceRequirements>,
    /// Scheduling overrides.
    pub scheduling: Option<SchedulingSpec>,
    /// Disk tier volumes.
    pub persistence: Option<PersistenceSpec>,
}

/// Checks `cc` and derives the model.
///
/// # Errors
/// [`InvalidSpec`] listing each field that breaks a rule or that this operator cannot
/// act on.
pub fn validate(cc: &CacheCluster, defaults: &Defaults) -> Result<ValidatedCluster, InvalidSpec> {
    crds::cachecluster::validate::validate(cc)?;
    let mut errors = Vec::new();
    let name = cc.metadata.name.clone().unwrap_or_default();
    let namespace = cc.metadata.namespace.clone().unwrap_or_default();
    let Some(owner) = cc.controller_owner_ref(&()) else {
        errors.push(FieldError {
            field: "metadata.uid".into(),
            message: "the object has no uid yet; it must be read from the API server",
        });
        return Err(InvalidSpec { errors });
    };
    let port = port_of(cc.spec.port, "spec.port", &mut errors);
    let metrics_port = port_of(
        cc.spec.monitoring.metrics_port,
        "spec.monitoring.metricsPort",
        &mut errors,
    );
    let cluster_image = cc
        .spec
        .image
        .clone()
        .unwrap_or_else(|| defaults.node_image.clone());
    let mut pools = Vec::new();
    for (index, pool) in cc.spec.pools.iter().enumerate() {
        match validate_pool(pool, &cluster_image, &defaults.node_image) {
            // A CacheCluster's author picks what runs beside its Secrets: only images the
            // operator's installer allowed.
            Ok(valid) if !image_allowed(&valid.image, &defaults.allowed_images) => {
                errors.push(FieldError {
                    field: if pool.image.is_some() {
                        format!("spec.pools[{index}].image")
                    } else {
                        "spec.image".to_owned()
                    },
                    message: IMAGE_NOT_ALLOWED_MSG,
                });
            }
            Ok(valid) => pools.push(valid),
            Err(error) => errors.push(error),
        }
    }
    if !errors.is_empty() {
        return Err(InvalidSpec { errors });
    }
    let client_token = client_token(&name, cc.spec.auth.clone().unwrap_or_default());
    let (tls, plaintext_kept) = served_tls(cc);
    let tls_secret = tls.as_ref().map(|tls| {
        tls.secret_name
            .clone()
            .unwrap_or_else(|| names::issued_tls_secret(&name))
    });
    Ok(ValidatedCluster {
        name,
        namespace,
        owner,
        generation: cc.metadata.generation.unwrap_or(0),
        port,
        metrics_port,
        service_monitor: cc.spec.monitoring.service_monitor,
        client_token,
        tls_secret,
        tls_issued: tls
            .as_ref()
            .filter(|tls| tls.secret_name.is_none())
            .map(|_| defaults.issued_certificate_lifetime),
        tls_client_auth: tls.as_ref().map(|tls| tls.client_auth).unwrap_or_default(),
        plaintext_kept,
        network_policy: network_policy(
            cc.spec.network_policy.clone().unwrap_or_default(),
            defaults,
        ),
        image_pull_policy: defaults.image_pull_policy.clone(),
        cluster_domain: defaults.cluster_domain.clone(),
        pools,
        recorded_secrets: cc
            .status
            .as_ref()
            .map(|status| status.generated_secrets.clone())
            .unwrap_or_default(),
        pools_in_status: cc
            .status
            .as_ref()
            .is_some_and(|status| !status.pools.is_empty()),
    })
}

/// The TLS the Flight port serves, none for plaintext, and whether plaintext is kept
/// only because an earlier operator served it so. TLS is on unless `spec.tls.disabled`;
/// an unset `spec.tls` means a certificate the operator issues, except for a cluster whose
/// status shows a `grpc://` endpoint: an operator from before TLS by default served it
/// in plaintext, and turning TLS on under its clients (which dial `grpc://`, trusting no
/// CA) would fail every call they make. It stays plaintext until `spec.tls` says which.
fn served_tls(cc: &CacheCluster) -> (Option<TlsSpec>, bool) {
    match &cc.spec.tls {
        Some(tls) if tls.disabled => (None, false),
        Some(tls) => (Some(tls.clone()), false),
        None if served_plaintext(cc) => (None, true),
        None => (Some(TlsSpec::default()), false),
    }
}

/// Whether the status says a pool's endpoint is plaintext (`grpc://`).
fn served_plaintext(cc: &CacheCluster) -> bool {
    cc.status.as_ref().is_some_and(|status| {
        status.pools.iter().any(|pool| {
            pool.endpoint
                .as_deref()
                .is_some_and(|endpoint| endpoint.starts_with(names::PLAINTEXT_SCHEME))
        })
    })
}

/// On unless disabled; clients default to every pod of the cluster's namespace.
fn network_policy(
    spec: crds::cachecluster::NetworkPolicySpec,
    defaults: &Defaults,
) -> Option<ValidatedNetworkPolicy> {
    if spec.disabled {
        return None;
    }
    Some(ValidatedNetworkPolicy {
        operator_namespace: defaults.operator_namespace.clone(),
        clients: spec.clients.unwrap_or_else(|| {
            vec![NetworkPolicyPeer {
                pod_selector: Some(Default::default()),
                ..NetworkPolicyPeer::default()
            }]
        }),
        metrics_scrapers: spec.metrics_scrapers,
    })
}

/// Auth is on unless disabled: the named Secret, else the generated one.
fn client_token(cluster: &str, auth: AuthSpec) -> Option<ClientToken> {
    if auth.disabled {
        return None;
    }
    Some(match auth.secret_name {
        Some(secret) => ClientToken {
            secret,
            key: auth.key,
            generated: false,
        },
        None => ClientToken {
            secret: names::client_token_secret(cluster),
            key: GENERATED_TOKEN_KEY.to_owned(),
            generated: true,
        },
    })
}

fn port_of(value: i32, field: &str, errors: &mut Vec<FieldError>) -> u16 {
    u16::try_from(value)
        .ok()
        .filter(|p| *p > 0)
        .unwrap_or_else(|| {
            errors.push(FieldError {
                field: field.to_owned(),
                message: "must be between 1 and 65535",
            });
            0
        })
}

fn validate_pool(
    pool: &PoolSpec,
    cluster_image: &str,
    operator_node_image: &str,
) -> Result<ValidatedPool, FieldError> {
    let memory_limit_bytes = pool.memory_limit_bytes()?;
    let ttl = pool.ttl_duration()?;
    let budget_bytes = compute_budget_bytes(memory_limit_bytes);
    let image = pool
        .image
        .clone()
        .unwrap_or_else(|| cluster_image.to_owned());
    Ok(ValidatedPool {
        name: pool.name.clone(),
        shards: pool.shards,
        replicas: pool.replicas,
        image_reads_zones: image == operator_node_image,
        image,
        max_entries: u64::try_from(pool.max_entries).unwrap_or(1).max(1),
        ttl,
        ttl_mode: pool.ttl_mode,
        eviction: pool.eviction,
        location_mode: pool.location_mode,
        memory_limit: pool.memory_limit.clone(),
        memory_limit_bytes,
        budget_bytes,
        max_entry_bytes: compute_max_entry_bytes(budget_bytes),
        resources: pool.resources.clone(),
        scheduling: pool.scheduling.clone(),
        persistence: pool.persistence.clone(),
    })
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Test fixtures: `CacheCluster`s built like a user would write them.

    use crds::cachecluster::{CacheCluster, CacheClusterSpec, PoolSpec};

    use super::{Defaults, ValidatedCluster, validate};

    /// A cluster `demo` in namespace `cache` with the given pools (name, shards).
    pub fn cluster(pools: &[(&str, i32)]) -> CacheCluster {
        let pools = pools
            .iter()
            .map(|(name, shards)| PoolSpec {
                shards: *shards,
                ..PoolSpec::new(*name)
            })
            .collect();
        let mut cc = CacheCluster::new("demo", CacheClusterSpec::with_pools(pools));
        cc.metadata.namespace = Some("cache".into());
        cc.metadata.uid = Some("0b6c2a6e-1111-4222-8333-444455556666".into());
        cc.metadata.generation = Some(3);
        cc
    }

    pub fn defaults() -> Defaults {
        Defaults {
            node_image: "flightcache/node:test".into(),
            image_pull_policy: "IfNotPresent".into(),
            cluster_domain: "cluster.local".into(),
            operator_namespace: "flightcache-system".into(),
            allowed_images: vec!["flightcache/node".into()],
            issued_certificate_lifetime: crate::issuer::DEFAULT_CERT_LIFETIME,
        }
    }

    pub fn validated(pools: &[(&str, i32)]) -> ValidatedCluster {
        validate(&cluster(pools), &defaults()).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn budget_leaves_headroom_below_the_memory_limit() {
        assert_eq!(
            compute_budget_bytes(2 << 30),
            ((2u64 << 30) - (48 << 20)) / 100 * 80
        );
        assert!(compute_budget_bytes(64 << 20) > 0);
        assert!(compute_budget_bytes(64 << 20) < 64 << 20);
        assert_eq!(
            compute_max_entry_bytes(compute_budget_bytes(8 << 30)),
            256 << 20
        );
    }

    #[test]
    fn only_allowed_image_repositories_run() {
        let allowed = vec!["flightcache/node".to_owned()];
        for image in [
            "flightcache/node",
            "flightcache/node:1.2",
            "flightcache/node@sha256:ab",
        ] {
            assert!(image_allowed(image, &allowed), "{image}");
        }
        for image in [
            "flightcache/node-evil:1",
            "evil/flightcache/node:1",
            "busybox",
        ] {
            assert!(!image_allowed(image, &allowed), "{image}");
        }
        assert!(image_allowed("anything:1", &[]));
        let mut cc = cluster(&[("hot", 1), ("cold", 1)]);
        cc.spec.pools[1].image = Some("attacker/exfiltrate:1".into());
        let err = validate(&cc, &defaults()).unwrap_err();
        assert_eq!(err.errors.len(), 1);
        assert_eq!(err.errors[0].field, "spec.pools[1].image");
        assert_eq!(err.errors[0].message, IMAGE_NOT_ALLOWED_MSG);
    }

    #[test]
    fn client_auth_is_on_unless_disabled() {
        let mut cc = cluster(&[("hot", 1)]);
        let generated = validate(&cc, &defaults()).unwrap().client_token;
        assert_eq!(
            generated,
            Some(ClientToken {
                secret: "demo-client-token".into(),
                key: "token".into(),
                generated: true,
            })
        );
        cc.spec.auth = Some(AuthSpec {
            secret_name: Some("mine".into()),
            key: "k".into(),
            disabled: false,
        });
        let named = validate(&cc, &defaults()).unwrap().client_token.unwrap();
        assert_eq!((named.secret.as_str(), named.key.as_str()), ("mine", "k"));
        assert!(!named.generated);
        cc.spec.auth = Some(AuthSpec {
            disabled: true,
            ..AuthSpec::default()
        });
        assert_eq!(validate(&cc, &defaults()).unwrap().client_token, None);
    }

    #[test]
    fn a_default_pool_gets_derived_values() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        assert_eq!(
            (pool.shards, pool.image.as_str()),
            (3, "flightcache/node:test")
        );
        assert_eq!(
            pool.budget_bytes,
            compute_budget_bytes(pool.memory_limit_bytes)
        );
        assert_eq!(cluster.owner.kind, "CacheCluster");
        assert_eq!(cluster.owner.controller, Some(true));
    }

    /// `cc` as an earlier operator left it: status with each pool's endpoint of `scheme`.
    fn served_as(mut cc: CacheCluster, scheme: &str) -> CacheCluster {
        let pools = cc
            .spec
            .pools
            .iter()
            .map(|pool| crds::cachecluster::PoolStatus {
                name: pool.name.clone(),
                endpoint: Some(format!("{scheme}demo-{}.cache.svc:50051", pool.name)),
                ..Default::default()
            })
            .collect();
        cc.status = Some(crds::cachecluster::CacheClusterStatus {
            pools,
            ..Default::default()
        });
        cc
    }

    #[test]
    fn tls_is_issued_unless_disabled_and_a_cluster_served_in_plaintext_stays_so_while_unset() {
        let tls = |cc: &CacheCluster| {
            let v = validate(cc, &defaults()).unwrap();
            (v.tls_secret, v.tls_issued.is_some(), v.plaintext_kept)
        };
        let issued = (Some("demo-tls".to_owned()), true, false);
        let plaintext = (None, false, false);
        // Unset: the operator issues it, for a new cluster and one already on TLS.
        assert_eq!(tls(&cluster(&[("hot", 3)])), issued);
        assert_eq!(
            tls(&served_as(cluster(&[("hot", 3)]), names::TLS_SCHEME)),
            issued
        );
        // Unset on a cluster an earlier operator served in plaintext: kept, and said so.
        assert_eq!(
            tls(&served_as(cluster(&[("hot", 3)]), names::PLAINTEXT_SCHEME)),
            (None, false, true)
        );
        // Explicit either way wins over what was served.
        let mut opted_in = served_as(cluster(&[("hot", 3)]), names::PLAINTEXT_SCHEME);
        opted_in.spec.tls = Some(TlsSpec::default());
        assert_eq!(tls(&opted_in), issued);
        let mut opted_out = cluster(&[("hot", 3)]);
        opted_out.spec.tls = Some(TlsSpec {
            disabled: true,
            ..Default::default()
        });
        assert_eq!(tls(&opted_out), plaintext);
        assert_eq!(
            tls(&served_as(opted_out, names::PLAINTEXT_SCHEME)),
            plaintext
        );
    }

    #[test]
    fn invalid_fields_are_named_and_tls_is_taken() {
        let mut cc = cluster(&[("hot", 3)]);
        cc.spec.tls = Some(crds::cachecluster::TlsSpec {
            secret_name: Some("certs".into()),
            ..Default::default()
        });
        assert_eq!(
            validate(&cc, &defaults()).unwrap().tls_secret.as_deref(),
            Some("certs")
        );
        let mut cc = cluster(&[("hot", 3)]);
        cc.spec.pools[0].shards = 0;
        let err = validate(&cc, &defaults()).unwrap_err();
        assert!(err.to_string().contains("shards"), "{err}");
    }
}
