//! Integration tests against a real kube-apiserver (`e2e/cluster up`, or `up
//! --control-plane-only`; KUBECONFIG points at it). Ignored by plain `cargo test`;
//! `scripts/test` runs them with `--ignored` on the full cluster.
//!
//! Each test works in its own labelled namespace and deletes it at the end. They assert
//! on objects, owner references, server-side-apply idempotence, status and leader
//! election, never wait for running nodes (with `--control-plane-only` pods stay
//! Pending); `e2e/tests/operator` covers running nodes.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic, missing_docs)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crds::cachecluster::{CacheCluster, CacheClusterSpec, PoolSpec, TlsSpec};
use crds::cacheinvalidation::{
    CacheInvalidation, CacheInvalidationSpec, CacheInvalidationStatus, InvalidationPhase,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, CustomResourceExt, ResourceExt};
use operator::context::Context;
use operator::controller::reconcile;
use operator::metrics::Metrics;
use operator::validate::Defaults;

async fn client() -> Client {
    Client::try_default()
        .await
        .expect("KUBECONFIG must point at the test API server")
}

async fn install_crd(client: &Client) {
    apply_crd(client, &crds::generate::crd().unwrap()).await;
}

/// Applies `crd` and waits until it is Established.
async fn apply_crd(client: &Client, crd: &CustomResourceDefinition) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        &crd.name_any(),
        &PatchParams::apply("flightcache-tests").force(),
        &Patch::Apply(crd),
    )
    .await
    .unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(crds, &crd.name_any(), conditions::is_crd_established()),
    )
    .await
    .expect("CRD established in time")
    .unwrap();
}

/// A fresh namespace, deleted when the guard drops.
struct TestNamespace {
    client: Client,
    name: String,
}

impl TestNamespace {
    async fn new(client: &Client, prefix: &str) -> Self {
        let name = format!("{prefix}-{}", std::process::id() % 100_000 + rand_suffix());
        let api: Api<Namespace> = Api::all(client.clone());
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.clone());
        ns.metadata.labels = Some(BTreeMap::from([(
            "flightcache.dev/test".into(),
            "true".into(),
        )]));
        api.create(&PostParams::default(), &ns).await.unwrap();
        Self {
            client: client.clone(),
            name,
        }
    }
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() % 10_000)
        .unwrap_or(0)
}

impl TestNamespace {
    /// Deletes the namespace and everything in it. (Not a Drop: the client's connection
    /// is driven by the test's runtime, which a Drop cannot await.)
    async fn delete(self) {
        let api: Api<Namespace> = Api::all(self.client);
        let _ = api.delete(&self.name, &DeleteParams::background()).await;
    }
}

fn context(client: &Client) -> Arc<Context> {
    let defaults = Defaults {
        node_image: "flightcache-node:e2e".into(),
        image_pull_policy: "Never".into(),
        cluster_domain: "cluster.local".into(),
        operator_namespace: "flightcache-system".into(),
        allowed_images: vec!["flightcache-node".into()],
        issued_certificate_lifetime: Duration::from_secs(90 * 24 * 3600),
    };
    Arc::new(Context::new(
        client.clone(),
        defaults,
        Arc::new(Metrics::default()),
        "integration-test",
    ))
}

async fn create_cluster(client: &Client, namespace: &str, pools: &[(&str, i32)]) -> CacheCluster {
    let api: Api<CacheCluster> = Api::namespaced(client.clone(), namespace);
    let spec = CacheClusterSpec::with_pools(
        pools
            .iter()
            .map(|(name, shards)| PoolSpec {
                shards: *shards,
                ..PoolSpec::new(*name)
            })
            .collect(),
    );
    api.create(&PostParams::default(), &CacheCluster::new("demo", spec))
        .await
        .unwrap()
}

async fn published_ring(client: &Client, namespace: &str) -> crds::node_config::Topology {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get("demo-hot")
        .await
        .unwrap();
    crds::node_config::NodeDocument::from_json(&cm.data.unwrap()["node.json"])
        .unwrap()
        .topology
        .unwrap()
}

async fn fetch(client: &Client, namespace: &str) -> CacheCluster {
    Api::<CacheCluster>::namespaced(client.clone(), namespace)
        .get("demo")
        .await
        .unwrap()
}

/// What identifies a write of ours to each child: the resourceVersion of Services and
/// ConfigMaps, the generation of StatefulSets and PDBs (controllers write their status,
/// which moves the resourceVersion; the generation moves only with the spec we write).
async fn resource_versions(client: &Client, namespace: &str) -> BTreeMap<String, String> {
    let mut versions = BTreeMap::new();
    versions.extend(versions_of::<StatefulSet>(client, namespace, "sts", true).await);
    versions.extend(versions_of::<Service>(client, namespace, "svc", false).await);
    versions.extend(versions_of::<ConfigMap>(client, namespace, "cm", false).await);
    versions.extend(versions_of::<PodDisruptionBudget>(client, namespace, "pdb", true).await);
    versions
}

async fn versions_of<K>(
    client: &Client,
    namespace: &str,
    prefix: &str,
    by_generation: bool,
) -> Vec<(String, String)>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let params = ListParams::default().labels("app.kubernetes.io/instance=demo");
    let list = Api::<K>::namespaced(client.clone(), namespace)
        .list(&params)
        .await
        .unwrap();
    list.items
        .into_iter()
        .map(|object| {
            let version = if by_generation {
                object.meta().generation.unwrap().to_string()
            } else {
                object.resource_version().unwrap()
            };
            (format!("{prefix}/{}", object.name_any()), version)
        })
        .collect()
}

fn condition(cc: &CacheCluster, type_: &str) -> (String, String) {
    let c = cc
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {:?}", cc.status));
    (c.status.clone(), c.reason.clone())
}

#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn reconcile_creates_owned_children_and_a_second_pass_changes_nothing() {
    let client = client().await;
    install_crd(&client).await;
    let ns = TestNamespace::new(&client, "fc-reconcile").await;
    let created = create_cluster(&client, &ns.name, &[("hot", 3), ("cold", 1)]).await;
    let ctx = context(&client);

    reconcile(Arc::new(created.clone()), Arc::clone(&ctx))
        .await
        .unwrap();
    let versions = resource_versions(&client, &ns.name).await;
    assert_eq!(versions.len(), 10, "5 objects per pool: {versions:?}");
    let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
        .get("demo-hot")
        .await
        .unwrap();
    let owner = &sts.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("CacheCluster", "demo", Some(true))
    );
    assert_eq!(owner.uid, created.uid().unwrap());
    assert_eq!(sts.spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(
        sts.spec
            .as_ref()
            .unwrap()
            .update_strategy
            .as_ref()
            .unwrap()
            .type_
            .as_deref(),
        Some("OnDelete")
    );
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .get("demo-hot")
        .await
        .unwrap();
    let document =
        crds::node_config::NodeDocument::from_json(&cm.data.unwrap()["node.json"]).unwrap();
    assert_eq!(document.config.ttl.as_deref(), Some("1h"));
    // The ring: every pod by its stable DNS name, all active in a new pool.
    let ring = document.topology.unwrap();
    assert_eq!(ring.version, 1);
    let addresses: Vec<String> = ring.members.iter().map(|m| m.address.clone()).collect();
    assert_eq!(
        addresses,
        (0..3)
            .map(|i| format!(
                "demo-hot-{i}.demo-hot-nodes.{}.svc.cluster.local:50051",
                ns.name
            ))
            .collect::<Vec<_>>()
    );
    let headless = Api::<Service>::namespaced(client.clone(), &ns.name)
        .get("demo-hot-nodes")
        .await
        .unwrap();
    assert_eq!(headless.spec.unwrap().cluster_ip.as_deref(), Some("None"));

    let cc = fetch(&client, &ns.name).await;
    assert_eq!(
        cc.status.as_ref().unwrap().observed_generation,
        cc.metadata.generation
    );
    assert_eq!(condition(&cc, "Ready").0, "False");
    assert_eq!(
        condition(&cc, "Progressing"),
        ("True".into(), "Creating".into())
    );
    assert_eq!(
        condition(&cc, "Degraded"),
        ("False".into(), "AsExpected".into())
    );
    let pools = &cc.status.as_ref().unwrap().pools;
    // TLS by default: no spec.tls, and the operator issued the certificate.
    assert_eq!(
        pools[0].endpoint.as_deref(),
        Some(format!("grpc+tls://demo-hot.{}.svc:50051", ns.name).as_str())
    );
    assert_eq!(
        cc.status.as_ref().unwrap().ca_secret.as_deref(),
        Some("demo-ca")
    );

    // Server-side apply is idempotent: a second pass writes no child. (Its status may
    // differ: the StatefulSet controller has created the Pending pods meanwhile; and on a
    // cluster whose nodes carry zones, a ConfigMap may change once: the ring gains each
    // member's zone when the scheduler has placed its pod. The still-world check below
    // covers the ConfigMaps too.)
    reconcile(Arc::new(cc), Arc::clone(&ctx)).await.unwrap();
    let not_configmaps = |versions: BTreeMap<String, String>| {
        versions
            .into_iter()
            .filter(|(object, _)| !object.starts_with("cm/"))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        not_configmaps(resource_versions(&client, &ns.name).await),
        not_configmaps(versions.clone())
    );
    // Once the world stands still, a pass writes nothing at all, status included. The
    // StatefulSet controller, scheduler and kubelet move the pods on their own time, so
    // a pass is judged only when the pods and StatefulSets it reads were the same before
    // the pass that brought the status up to date and after the pass under test.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut moved = 0;
    loop {
        let world_before = world_versions(&client, &ns.name).await;
        let current = fetch(&client, &ns.name).await;
        reconcile(Arc::new(current), Arc::clone(&ctx))
            .await
            .unwrap();
        let settled = fetch(&client, &ns.name).await;
        let settled_version = settled.resource_version();
        let children_settled = resource_versions(&client, &ns.name).await;
        reconcile(Arc::new(settled), Arc::clone(&ctx))
            .await
            .unwrap();
        let children_after = resource_versions(&client, &ns.name).await;
        assert_eq!(
            not_configmaps(children_after.clone()),
            not_configmaps(versions.clone())
        );
        let status_version = fetch(&client, &ns.name).await.resource_version();
        if world_versions(&client, &ns.name).await == world_before {
            assert_eq!(
                children_after, children_settled,
                "a pass over an unchanged world rewrote a child ({moved} earlier tries saw pods move)"
            );
            assert_eq!(
                status_version, settled_version,
                "status unchanged by a pass over an unchanged world ({moved} earlier tries saw pods move)"
            );
            break;
        }
        moved += 1;
        assert!(
            std::time::Instant::now() < deadline,
            "the pods never stood still for two passes in 60 s ({moved} tries)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ns.delete().await;
}

/// Every pod and StatefulSet of the cluster by resource version (status included):
/// what a pass reads besides its own children's specs.
async fn world_versions(client: &Client, namespace: &str) -> BTreeMap<String, String> {
    let mut versions = BTreeMap::new();
    versions.extend(versions_of::<StatefulSet>(client, namespace, "sts", false).await);
    versions.extend(versions_of::<Pod>(client, namespace, "pod", false).await);
    versions
}

#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn scaling_and_removing_pools_follow_the_spec() {
    let client = client().await;
    install_crd(&client).await;
    let ns = TestNamespace::new(&client, "fc-scale").await;
    create_cluster(&client, &ns.name, &[("hot", 3), ("cold", 1)]).await;
    let ctx = context(&client);
    let api: Api<CacheCluster> = Api::namespaced(client.clone(), &ns.name);
    reconcile(Arc::new(fetch(&client, &ns.name).await), Arc::clone(&ctx))
        .await
        .unwrap();

    for shards in [5, 2] {
        let patch = serde_json::json!({"spec": {"pools": [{"name": "hot", "shards": shards}, {"name": "cold", "shards": 1}]}});
        api.patch("demo", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        reconcile(Arc::new(fetch(&client, &ns.name).await), Arc::clone(&ctx))
            .await
            .unwrap();
        let sts_api = Api::<StatefulSet>::namespaced(client.clone(), &ns.name);
        let hot_replicas = || async {
            sts_api
                .get("demo-hot")
                .await
                .unwrap()
                .spec
                .unwrap()
                .replicas
        };
        let replicas = hot_replicas().await;
        if shards < 5 {
            // Scale-in: the first pass publishes the leaving nodes as draining and keeps
            // them; the StatefulSet shrinks on the next pass, once nothing is left to
            // hand off (these pods never start: there is no kubelet).
            assert_eq!(replicas, Some(5));
            let ring = published_ring(&client, &ns.name).await;
            let draining: Vec<&str> = ring
                .members
                .iter()
                .filter(|m| m.state == crds::node_config::MemberState::Draining)
                .map(|m| m.id.as_str())
                .collect();
            assert_eq!(draining, ["demo-hot-2", "demo-hot-3", "demo-hot-4"]);
            // A pass whose ring is the one published shrinks it. On a cluster with
            // kubelets (CI runs these tests on the e2e cluster) the pods get scheduled
            // meanwhile, and a newly placed pod brings its Node's zone into the ring, so
            // a pass may publish a new ring first: the likely cause of a CI run whose
            // second pass did not shrink (not reproduced here in 8 runs). So: passes
            // until the ring holds still, within 5 s.
            for _ in 0..10 {
                reconcile(Arc::new(fetch(&client, &ns.name).await), Arc::clone(&ctx))
                    .await
                    .unwrap();
                if hot_replicas().await == Some(shards) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        let sts = sts_api.get("demo-hot").await.unwrap();
        assert_eq!(sts.spec.unwrap().replicas, Some(shards));
        let status = fetch(&client, &ns.name).await.status.unwrap();
        assert_eq!(status.pools[0].shards, shards);
        assert_eq!(
            status.shards_ready.as_deref(),
            Some(format!("0/{}", shards + 1).as_str())
        );
    }

    let patch = serde_json::json!({"spec": {"pools": [{"name": "hot", "shards": 2}]}});
    api.patch("demo", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    reconcile(Arc::new(fetch(&client, &ns.name).await), Arc::clone(&ctx))
        .await
        .unwrap();
    let versions = resource_versions(&client, &ns.name).await;
    assert!(
        versions.keys().all(|k| !k.contains("cold")),
        "cold pool objects remain: {versions:?}"
    );
    assert_eq!(versions.len(), 5);
    ns.delete().await;
}

/// A new namespace (named from `prefix`) with a CacheCluster `demo` of one pool `hot`
/// whose `spec.tls` names the Secret `certs` (which does not exist yet).
async fn tls_cluster_named_demo(client: &Client, prefix: &str) -> TestNamespace {
    install_crd(client).await;
    let ns = TestNamespace::new(client, prefix).await;
    let api: Api<CacheCluster> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = CacheClusterSpec::with_pools(vec![PoolSpec::new("hot")]);
    spec.tls = Some(TlsSpec {
        secret_name: Some("certs".into()),
        ..Default::default()
    });
    api.create(&PostParams::default(), &CacheCluster::new("demo", spec))
        .await
        .unwrap();
    ns
}

#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn a_tls_secret_that_does_not_exist_is_reported_as_degraded() {
    let client = client().await;
    let ns = tls_cluster_named_demo(&client, "fc-invalid").await;
    let err = reconcile(Arc::new(fetch(&client, &ns.name).await), context(&client))
        .await
        .unwrap_err();
    assert_eq!(err.category(), "secret");
    let cc = fetch(&client, &ns.name).await;
    assert_eq!(
        condition(&cc, "Degraded"),
        ("True".into(), "ApplyFailed".into())
    );
    let message = &cc
        .status
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .unwrap()
        .message
        .clone();
    assert!(message.contains("Secret certs"), "{message}");
    assert!(
        resource_versions(&client, &ns.name).await.is_empty(),
        "no pool object is created while the nodes could not be called"
    );
    ns.delete().await;
}

/// A self-signed CA named `name`, as cert-manager's CA issuer would hold it.
fn test_ca(name: &str) -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap()
}

/// A TLS Secret `name` in the cert-manager shape, labelled for cluster `demo`: a leaf
/// for `sans`, valid from `days.0` to `days.1` days from now, signed by `signer`, with
/// `ca` as its `ca.crt`.
fn tls_secret(
    name: &str,
    signer: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    sans: &[String],
    days: (i64, i64),
) -> Secret {
    let mut params = rcgen::CertificateParams::new(sans.to_vec()).unwrap();
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now + time::Duration::days(days.0);
    params.not_after = now + time::Duration::days(days.1);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, signer).unwrap();
    let mut secret = Secret::default();
    secret.metadata.name = Some(name.into());
    secret.metadata.labels = Some(BTreeMap::from([(
        "flightcache.dev/cluster".into(),
        "demo".into(),
    )]));
    secret.type_ = Some("kubernetes.io/tls".into());
    secret.data = Some(BTreeMap::from([
        ("tls.crt".into(), ByteString(cert.pem().into_bytes())),
        (
            "tls.key".into(),
            ByteString(key.serialize_pem().into_bytes()),
        ),
        ("ca.crt".into(), ByteString(ca.pem().into_bytes())),
    ]));
    secret
}

/// The Degraded condition's (status, reason, message).
fn degraded(cc: &CacheCluster) -> (String, String, String) {
    let c = cc
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Degraded"))
        .unwrap_or_else(|| panic!("no Degraded condition in {:?}", cc.status));
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

/// An expired certificate, one without the names the pool is called by, and one signed
/// by another CA than the Secret's `ca.crt`: each reported as Degraded with the problem
/// in the message, and nothing that would serve it is created (no StatefulSet, Service,
/// ConfigMap or PDB, so no pod). The same cluster with a good certificate in the same
/// Secret then reconciles (Degraded False, StatefulSet created): what refused the bad
/// ones was the certificate, not the setup.
#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn an_expired_misnamed_or_foreign_certificate_is_reported_as_degraded_and_nothing_serves_it()
{
    let client = client().await;
    let ns = tls_cluster_named_demo(&client, "fc-badcert").await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let node_name = format!("demo-hot-0.demo-hot-nodes.{}.svc.cluster.local", ns.name);
    let good_names = vec![
        format!("demo-hot.{}.svc", ns.name),
        format!("*.demo-hot-nodes.{}.svc.cluster.local", ns.name),
    ];
    let ca = test_ca("flightcache test CA");
    // Another name: a CA with the same name and another key is refused too, as
    // InvalidSignatureForPublicKey (webpki picks the issuer by name, then checks the key).
    let foreign_ca = test_ca("someone else's CA");
    let cases = [
        (
            "expired",
            tls_secret("certs", &ca, &ca, &good_names, (-30, -1)),
            "cannot use Secret certs: tls.crt expired".to_owned(),
        ),
        (
            "wrong SANs (the Service name only)",
            tls_secret("certs", &ca, &ca, &good_names[..1], (-1, 30)),
            format!(
                "cannot use Secret certs: tls.crt is not valid for {node_name}, a name clients or nodes call it by"
            ),
        ),
        (
            "signed by a foreign CA",
            tls_secret("certs", &foreign_ca, &ca, &good_names, (-1, 30)),
            "cannot use Secret certs: tls.crt does not verify against ca.crt: UnknownIssuer"
                .to_owned(),
        ),
    ];
    for (case, secret, problem) in cases {
        secrets
            .patch(
                "certs",
                &PatchParams::apply("flightcache-tests").force(),
                &Patch::Apply(&secret),
            )
            .await
            .unwrap();
        let err = reconcile(Arc::new(fetch(&client, &ns.name).await), context(&client))
            .await
            .expect_err(case);
        assert_eq!(err.category(), "secret", "{case}");
        let (status, reason, message) = degraded(&fetch(&client, &ns.name).await);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "ApplyFailed"),
            "{case}"
        );
        assert_eq!(message, problem, "{case}");
        assert!(
            resource_versions(&client, &ns.name).await.is_empty(),
            "{case}: no pool object may be created for a certificate that cannot be served"
        );
        let pods = Api::<Pod>::namespaced(client.clone(), &ns.name)
            .list(&ListParams::default())
            .await
            .unwrap();
        assert!(pods.items.is_empty(), "{case}: pods {:?}", pods.items);
    }
    // The control: a good certificate in the same Secret, and the same cluster reconciles.
    secrets
        .patch(
            "certs",
            &PatchParams::apply("flightcache-tests").force(),
            &Patch::Apply(&tls_secret("certs", &ca, &ca, &good_names, (-1, 30))),
        )
        .await
        .unwrap();
    reconcile(Arc::new(fetch(&client, &ns.name).await), context(&client))
        .await
        .unwrap();
    let (status, reason, _) = degraded(&fetch(&client, &ns.name).await);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "AsExpected"));
    Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
        .get("demo-hot")
        .await
        .expect("with a good certificate the pool's StatefulSet is created");
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn deleting_the_cluster_leaves_children_to_the_garbage_collector() {
    let client = client().await;
    install_crd(&client).await;
    let ns = TestNamespace::new(&client, "fc-delete").await;
    create_cluster(&client, &ns.name, &[("hot", 1)]).await;
    reconcile(Arc::new(fetch(&client, &ns.name).await), context(&client))
        .await
        .unwrap();
    let api: Api<CacheCluster> = Api::namespaced(client.clone(), &ns.name);
    api.delete("demo", &DeleteParams::foreground())
        .await
        .unwrap();
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    let gone = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if sts.get_opt("demo-hot").await.unwrap().is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "the garbage collector removes owned children");
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn two_replicas_elect_one_leader_and_the_other_takes_over_when_it_stops() {
    use k8s_openapi::api::coordination::v1::Lease;
    use operator::leader::{LeaseConfig, run};
    use tokio::sync::watch;

    let client = client().await;
    let ns = TestNamespace::new(&client, "fc-lease").await;
    let config = |identity: &str| LeaseConfig {
        namespace: ns.name.clone(),
        name: "flightcache-operator".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
        renew_every: Duration::from_millis(500),
    };
    let (first_tx, first) = watch::channel(false);
    let (second_tx, mut second) = watch::channel(false);
    let first_replica = tokio::spawn(run(client.clone(), config("replica-a"), first_tx));
    let mut first_leads = first.clone();
    tokio::time::timeout(
        Duration::from_secs(10),
        first_leads.wait_for(|leads| *leads),
    )
    .await
    .expect("the first replica takes the free Lease")
    .unwrap();
    let second_replica = tokio::spawn(run(client.clone(), config("replica-b"), second_tx));
    // For longer than the Lease lasts, the holder keeps renewing and the other waits.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(*first.borrow(), "the holder lost the Lease while renewing");
        assert!(!*second.borrow(), "two replicas led at once");
    }
    // The holder stops (its pod is gone): the other takes over once the Lease expires.
    first_replica.abort();
    tokio::time::timeout(Duration::from_secs(10), second.wait_for(|leads| *leads))
        .await
        .expect("the second replica takes over an expired Lease")
        .unwrap();
    let lease = Api::<Lease>::namespaced(client.clone(), &ns.name)
        .get("flightcache-operator")
        .await
        .unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-b"));
    assert_eq!(spec.lease_transitions, Some(1));
    second_replica.abort();
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn a_leader_that_shuts_down_hands_the_lease_over_before_it_expires() {
    use operator::leader::{LeaseConfig, release, run};
    use tokio::sync::watch;

    let client = client().await;
    let ns = TestNamespace::new(&client, "fc-release").await;
    // A Lease far longer than the test waits: only a release lets the other take over.
    let config = |identity: &str| LeaseConfig {
        namespace: ns.name.clone(),
        name: "flightcache-operator".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(120),
        renew_every: Duration::from_millis(500),
    };
    let (first_tx, mut first) = watch::channel(false);
    let (second_tx, mut second) = watch::channel(false);
    let first_replica = tokio::spawn(run(client.clone(), config("replica-a"), first_tx));
    tokio::time::timeout(Duration::from_secs(10), first.wait_for(|leads| *leads))
        .await
        .expect("the first replica takes the free Lease")
        .unwrap();
    let second_replica = tokio::spawn(run(client.clone(), config("replica-b"), second_tx));
    // A replica that does not hold the Lease releases nothing.
    release(client.clone(), &config("replica-b")).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!*second.borrow(), "a standby's release handed it the Lease");
    // The holder shuts down: it stops renewing and releases; the other leads at its next try.
    first_replica.abort();
    let released = std::time::Instant::now();
    release(client.clone(), &config("replica-a")).await;
    tokio::time::timeout(Duration::from_secs(5), second.wait_for(|leads| *leads))
        .await
        .expect("the standby takes a released Lease at its next try, not after 120 s")
        .unwrap();
    println!(
        "released Lease taken over in {} ms",
        released.elapsed().as_millis()
    );
    second_replica.abort();
    ns.delete().await;
}

/// A stand-in for the prometheus-operator `ServiceMonitor` CRD (any spec accepted).
async fn install_service_monitor_crd(client: &Client) {
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "servicemonitors.monitoring.coreos.com" },
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {
                "kind": "ServiceMonitor", "plural": "servicemonitors",
                "singular": "servicemonitor", "listKind": "ServiceMonitorList"
            },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": true
                } }
            }]
        }
    }))
    .unwrap();
    apply_crd(client, &crd).await;
}

#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn the_service_monitor_follows_the_monitoring_toggle() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

    let client = client().await;
    install_crd(&client).await;
    install_service_monitor_crd(&client).await;
    let ns = TestNamespace::new(&client, "fc-monitor").await;
    let mut spec = CacheClusterSpec::with_pools(vec![PoolSpec {
        shards: 2,
        ..PoolSpec::new("hot")
    }]);
    spec.monitoring.service_monitor = true;
    let clusters: Api<CacheCluster> = Api::namespaced(client.clone(), &ns.name);
    let created = clusters
        .create(&PostParams::default(), &CacheCluster::new("demo", spec))
        .await
        .unwrap();
    let ctx = context(&client);
    reconcile(Arc::new(created.clone()), Arc::clone(&ctx))
        .await
        .unwrap();

    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
        "servicemonitors",
    );
    let monitors: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &resource);
    let monitor = monitors.get("demo-nodes").await.unwrap();
    assert_eq!(monitor.owner_references()[0].uid, created.uid().unwrap());
    let spec = &monitor.data["spec"];
    assert_eq!(spec["endpoints"][0]["port"], "metrics");
    // Its selector picks exactly the pool's headless Service, whose endpoints are the
    // nodes (the client Service fronts the same pods and would scrape them twice).
    let selector: BTreeMap<String, String> =
        serde_json::from_value(spec["selector"]["matchLabels"].clone()).unwrap();
    let selector = selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let selected = Api::<Service>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap();
    let names: Vec<String> = selected.items.iter().map(ResourceExt::name_any).collect();
    assert_eq!(names, ["demo-hot-nodes"]);

    // Turned off: the ServiceMonitor goes.
    clusters
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"monitoring": {"serviceMonitor": false}}})),
        )
        .await
        .unwrap();
    reconcile(Arc::new(fetch(&client, &ns.name).await), Arc::clone(&ctx))
        .await
        .unwrap();
    let gone = monitors.get_opt("demo-nodes").await.unwrap();
    assert!(gone.is_none(), "{gone:?}");
    ns.delete().await;
}

/// The taint that keeps every scheduled pod off the test's fake Nodes (they are also
/// unschedulable): no other test's pod may land on a node no kubelet runs.
const FAKE_NODE_TAINT: &str = "flightcache.dev/fake-node";

/// A Node object no kubelet runs, with its heartbeat Lease last renewed `silent_for`
/// seconds ago (created, or moved back if it exists).
async fn stale_node(client: &Client, name: &str, silent_for: i64) {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    let nodes: Api<Node> = Api::all(client.clone());
    if nodes.get_opt(name).await.unwrap().is_none() {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.metadata.labels = Some(BTreeMap::from([
            ("kubernetes.io/hostname".into(), name.into()),
            ("flightcache.dev/test".into(), "true".into()),
        ]));
        node.spec = Some(NodeSpec {
            unschedulable: Some(true),
            taints: Some(vec![Taint {
                key: FAKE_NODE_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            }]),
            ..NodeSpec::default()
        });
        node.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        });
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renewed = Timestamp::now() - SignedDuration::from_secs(silent_for);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.into()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(renewed)),
            ..LeaseSpec::default()
        }),
    };
    leases
        .patch(
            name,
            &PatchParams::apply("flightcache-tests").force(),
            &Patch::Apply(&lease),
        )
        .await
        .unwrap();
}

async fn delete_stale_node(client: &Client, name: &str) {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Node;
    let _ = Api::<Node>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await;
    let _ = Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .delete(name, &DeleteParams::default())
        .await;
}

fn ready_condition(pod: &Pod) -> (String, Option<String>) {
    let c = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .unwrap_or_else(|| panic!("no Ready condition in {:?}", pod.status));
    (c.status.clone(), c.reason.clone())
}

#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn a_pod_on_a_lost_node_is_marked_not_ready_then_force_deleted() {
    let client = client().await;
    install_crd(&client).await;
    let ns = TestNamespace::new(&client, "fc-nodeloss").await;
    let lost = format!("fc-lost-{}", ns.name);
    let alive = format!("fc-alive-{}", ns.name);
    // Some node is heard from (the operator force-deletes only then), one is silent 25 s:
    // lost, not yet due for a force delete.
    stale_node(&client, &alive, 0).await;
    stale_node(&client, &lost, 25).await;

    // A pod of the cluster bound to the silent node, Ready as its kubelet last said. Its
    // pool is not in the spec, so no StatefulSet adopts it.
    let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), &ns.name);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while sa.get_opt("default").await.unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "no default ServiceAccount"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "demo-ghost-0", "labels": {
            "app.kubernetes.io/name": "flightcache-node",
            "app.kubernetes.io/instance": "demo",
            "flightcache.dev/pool": "ghost",
        }},
        "spec": {
            "nodeName": lost,
            "automountServiceAccountToken": false,
            "containers": [{"name": "node", "image": "flightcache-node:e2e"}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let ready = serde_json::json!({"status": {"conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
    ]}});
    pods.patch_status(
        "demo-ghost-0",
        &PatchParams::default(),
        &Patch::Strategic(&ready),
    )
    .await
    .unwrap();

    let created = create_cluster(&client, &ns.name, &[("hot", 1)]).await;
    let ctx = context(&client);
    reconcile(Arc::new(created), Arc::clone(&ctx))
        .await
        .unwrap();
    let marked = pods.get("demo-ghost-0").await.unwrap();
    assert_eq!(
        ready_condition(&marked),
        ("False".into(), Some("NodeLost".into()))
    );
    assert!(marked.metadata.deletion_timestamp.is_none());

    // Silent a minute and tainted by the node controller: force-deleted.
    stale_node(&client, &alive, 0).await;
    stale_node(&client, &lost, 60).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let taint = serde_json::json!({"spec": {"taints": [
        {"key": FAKE_NODE_TAINT, "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
    ]}});
    nodes
        .patch(&lost, &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .unwrap();
    reconcile(Arc::new(fetch(&client, &ns.name).await), Arc::clone(&ctx))
        .await
        .unwrap();
    assert!(
        pods.get_opt("demo-ghost-0").await.unwrap().is_none(),
        "the pod on the lost node is gone"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), &ns.name);
    let notes: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("NodeLost"))
        .filter_map(|e| e.note)
        .collect();
    assert!(
        notes.iter().any(|n| n.contains("marked NotReady")),
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.contains("force-deleted demo-ghost-0")),
        "{notes:?}"
    );

    delete_stale_node(&client, &lost).await;
    delete_stale_node(&client, &alive).await;
    ns.delete().await;
}

/// Two CacheClusters whose object names collide (cluster `a-b` pool `c`, cluster `a` pool
/// `b-c`: both `a-b-c`): the second is Degraded with a message naming the object and its
/// owner, and the first's objects are left as they were (the apply is forced, so without
/// the ownership check the second would have taken them over).
#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn a_cluster_whose_object_names_collide_with_anothers_is_degraded_and_takes_nothing_over() {
    let client = client().await;
    install_crd(&client).await;
    let ns = TestNamespace::new(&client, "fc-collide").await;
    let api: Api<CacheCluster> = Api::namespaced(client.clone(), &ns.name);
    for (cluster, pool) in [("a-b", "c"), ("a", "b-c")] {
        let spec = CacheClusterSpec::with_pools(vec![PoolSpec::new(pool)]);
        api.create(&PostParams::default(), &CacheCluster::new(cluster, spec))
            .await
            .unwrap();
    }
    let first = Arc::new(api.get("a-b").await.unwrap());
    reconcile(Arc::clone(&first), context(&client))
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    let before = (
        configmaps.get("a-b-c").await.unwrap(),
        services.get("a-b-c").await.unwrap(),
    );

    let err = reconcile(Arc::new(api.get("a").await.unwrap()), context(&client))
        .await
        .unwrap_err();
    assert_eq!(err.category(), "apply", "{err}");
    let second = api.get("a").await.unwrap();
    let (status, reason, message) = degraded(&second);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "ApplyFailed"));
    assert!(
        message.contains("ConfigMap a-b-c exists and belongs to CacheCluster a-b (uid "),
        "{message}"
    );
    let after = (
        configmaps.get("a-b-c").await.unwrap(),
        services.get("a-b-c").await.unwrap(),
    );
    assert_eq!(after.0.resource_version(), before.0.resource_version());
    assert_eq!(after.1.resource_version(), before.1.resource_version());
    assert_eq!(
        after.0.owner_references()[0].uid,
        first.uid().unwrap(),
        "still the first cluster's"
    );
    // The first cluster goes on reconciling its own objects.
    reconcile(Arc::new(api.get("a-b").await.unwrap()), context(&client))
        .await
        .unwrap();
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn a_generated_secret_made_by_someone_else_is_refused_even_with_a_forged_owner() {
    let client = client().await;
    install_crd(&client).await;
    let ns = TestNamespace::new(&client, "fc-forged").await;
    let api: Api<CacheCluster> = Api::namespaced(client.clone(), &ns.name);
    let spec = CacheClusterSpec::with_pools(vec![PoolSpec::new("hot")]);
    let cc = api
        .create(&PostParams::default(), &CacheCluster::new("demo", spec))
        .await
        .unwrap();
    // Before the operator's first pass, someone who may create Secrets makes the
    // cluster's internal Secret with tokens of their choosing, "owned" by the cluster.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let forged = Secret {
        metadata: ObjectMeta {
            name: Some("demo-internal".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "flightcache.dev/v1alpha1".into(),
                kind: "CacheCluster".into(),
                name: "demo".into(),
                uid: cc.uid().unwrap(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([
            ("admin-token".to_owned(), "chosen-admin".to_owned()),
            ("peer-token".to_owned(), "chosen-peer".to_owned()),
        ])),
        ..Secret::default()
    };
    let forged = secrets
        .create(&PostParams::default(), &forged)
        .await
        .unwrap();
    let err = reconcile(Arc::new(api.get("demo").await.unwrap()), context(&client))
        .await
        .unwrap_err();
    assert_eq!(err.category(), "secret", "{err}");
    let (status, reason, message) = degraded(&api.get("demo").await.unwrap());
    assert_eq!((status.as_str(), reason.as_str()), ("True", "ApplyFailed"));
    assert!(
        message.contains("the operator did not create it")
            && message.contains(&forged.uid().unwrap()),
        "{message}"
    );
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    assert!(statefulsets.get_opt("demo-hot").await.unwrap().is_none());
    // A second pass (the failed one wrote observedGeneration) still refuses it.
    assert!(
        reconcile(Arc::new(api.get("demo").await.unwrap()), context(&client))
            .await
            .is_err()
    );

    // Deleted, the operator makes its own, records its uid and reconciles.
    secrets
        .delete("demo-internal", &Default::default())
        .await
        .unwrap();
    reconcile(Arc::new(api.get("demo").await.unwrap()), context(&client))
        .await
        .unwrap();
    let made = secrets.get("demo-internal").await.unwrap();
    let cc = api.get("demo").await.unwrap();
    let recorded = &cc.status.as_ref().unwrap().generated_secrets;
    assert!(
        recorded.iter().any(
            |secret| secret.name == "demo-internal" && Some(&secret.uid) == made.uid().as_ref()
        ),
        "{recorded:?}"
    );
    assert!(
        recorded
            .iter()
            .any(|secret| secret.name == "demo-client-token"),
        "{recorded:?}"
    );
    assert_ne!(
        made.data.unwrap()["admin-token"].0,
        b"chosen-admin".to_vec()
    );
    assert!(statefulsets.get_opt("demo-hot").await.unwrap().is_some());
    // The pass's own status write keeps the records; the next pass uses the Secrets.
    reconcile(Arc::new(api.get("demo").await.unwrap()), context(&client))
        .await
        .unwrap();
    assert_eq!(
        &api.get("demo")
            .await
            .unwrap()
            .status
            .unwrap()
            .generated_secrets,
        recorded
    );
    ns.delete().await;
}

/// Whether `cert_pem` chains to `ca_pem` and serves `name` now.
fn serves(cert_pem: &[u8], ca_pem: &[u8], name: &str) -> bool {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
    let leaf = CertificateDer::from_pem_slice(cert_pem).unwrap();
    let ca = CertificateDer::from_pem_slice(ca_pem).unwrap();
    let anchors = [webpki::anchor_from_trusted_cert(&ca).unwrap()];
    let cert = webpki::EndEntityCert::try_from(&leaf).unwrap();
    cert.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        &anchors,
        &[],
        UnixTime::now(),
        webpki::KeyUsage::server_auth(),
        None,
        None,
    )
    .is_ok()
        && cert
            .verify_is_valid_for_subject_name(&ServerName::try_from(name).unwrap())
            .is_ok()
}

#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn a_cluster_an_earlier_operator_served_in_plaintext_stays_so_until_spec_tls_says_which() {
    let client = client().await;
    install_crd(&client).await;
    let ns = TestNamespace::new(&client, "fc-kept").await;
    let api: Api<CacheCluster> = Api::namespaced(client.clone(), &ns.name);
    let spec = CacheClusterSpec::with_pools(vec![PoolSpec::new("hot")]);
    api.create(&PostParams::default(), &CacheCluster::new("demo", spec))
        .await
        .unwrap();
    // What an operator from before TLS by default left: a plaintext endpoint in status.
    let plaintext = format!("grpc://demo-hot.{}.svc:50051", ns.name);
    api.patch_status(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({
            "status": {"pools": [{"name": "hot", "shards": 3, "endpoint": plaintext}]}
        })),
    )
    .await
    .unwrap();
    let ctx = context(&client);
    for _ in 0..2 {
        reconcile(Arc::new(fetch(&client, &ns.name).await), Arc::clone(&ctx))
            .await
            .unwrap();
    }
    let cc = fetch(&client, &ns.name).await;
    let status = cc.status.as_ref().unwrap();
    assert_eq!(
        status.pools[0].endpoint.as_deref(),
        Some(plaintext.as_str())
    );
    assert_eq!(status.ca_secret, None);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    for name in ["demo-ca-key", "demo-ca", "demo-tls"] {
        assert!(secrets.get_opt(name).await.unwrap().is_none(), "{name}");
    }
    let mounts_tls = |sts: StatefulSet| {
        sts.spec
            .and_then(|spec| spec.template.spec)
            .and_then(|pod| pod.volumes)
            .unwrap_or_default()
            .iter()
            .any(|v| v.name == "tls")
    };
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), &ns.name);
    assert!(!mounts_tls(statefulsets.get("demo-hot").await.unwrap()));
    // Said once, with what to do.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap();
    let kept: Vec<_> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("PlaintextKept"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(
        kept[0]
            .note
            .as_deref()
            .is_some_and(|note| note.contains("spec.tls: {disabled: true}")),
        "{kept:?}"
    );

    // spec.tls: {} moves it to TLS: the certificate issued, the endpoint grpc+tls://.
    api.patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"tls": {}}})),
    )
    .await
    .unwrap();
    reconcile(Arc::new(fetch(&client, &ns.name).await), Arc::clone(&ctx))
        .await
        .unwrap();
    let cc = fetch(&client, &ns.name).await;
    let status = cc.status.as_ref().unwrap();
    assert_eq!(
        status.pools[0].endpoint.as_deref(),
        Some(format!("grpc+tls://demo-hot.{}.svc:50051", ns.name).as_str())
    );
    assert_eq!(status.ca_secret.as_deref(), Some("demo-ca"));
    assert!(secrets.get_opt("demo-tls").await.unwrap().is_some());
    assert!(mounts_tls(statefulsets.get("demo-hot").await.unwrap()));
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn without_a_secret_the_operator_issues_the_certificate_and_issues_it_again_for_a_new_pool() {
    let client = client().await;
    install_crd(&client).await;
    let ns = TestNamespace::new(&client, "fc-issued").await;
    let api: Api<CacheCluster> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = CacheClusterSpec::with_pools(vec![PoolSpec::new("hot")]);
    spec.tls = Some(TlsSpec::default());
    api.create(&PostParams::default(), &CacheCluster::new("demo", spec))
        .await
        .unwrap();
    reconcile(Arc::new(fetch(&client, &ns.name).await), context(&client))
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let data = |secret: &Secret, key: &str| secret.data.as_ref().unwrap()[key].0.clone();
    let issuer = secrets.get("demo-ca-key").await.unwrap();
    let for_clients = secrets.get("demo-ca").await.unwrap();
    let serving = secrets.get("demo-tls").await.unwrap();
    let ca = data(&issuer, "ca.crt");
    assert!(String::from_utf8_lossy(&data(&issuer, "ca.key")).contains("PRIVATE KEY"));
    // Clients get the CA's certificate and nothing else.
    assert_eq!(
        for_clients
            .data
            .as_ref()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["ca.crt"]
    );
    assert_eq!(data(&for_clients, "ca.crt"), ca);
    assert_eq!(serving.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(data(&serving, "ca.crt"), ca);
    let cert = data(&serving, "tls.crt");
    for name in [
        format!("demo-hot.{}.svc", ns.name),
        format!("demo-hot.{}.svc.cluster.local", ns.name),
        "demo-hot".to_owned(),
        format!("demo-hot-2.demo-hot-nodes.{}.svc.cluster.local", ns.name),
    ] {
        assert!(serves(&cert, &ca, &name), "{name}");
    }
    assert!(!serves(&cert, &ca, &format!("demo-cold.{}.svc", ns.name)));
    let cc = fetch(&client, &ns.name).await;
    let status = cc.status.as_ref().unwrap();
    assert_eq!(status.ca_secret.as_deref(), Some("demo-ca"));
    for name in [
        "demo-internal",
        "demo-client-token",
        "demo-ca-key",
        "demo-ca",
        "demo-tls",
        "demo-node-tls",
    ] {
        assert!(
            status.generated_secrets.iter().any(|s| s.name == name),
            "{name} not recorded: {:?}",
            status.generated_secrets
        );
    }
    // The nodes mount the operator's copy of the serving Secret (moved in phases) and
    // serve TLS.
    let copy = secrets.get("demo-node-tls").await.unwrap();
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        assert_eq!(data(&copy, key), data(&serving, key), "{key}");
    }
    let statefulset = Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
        .get("demo-hot")
        .await
        .unwrap();
    let volumes = statefulset
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .volumes
        .unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref())
                == Some("demo-node-tls")),
        "{volumes:?}"
    );
    assert!(
        status.pools[0]
            .endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("grpc+tls://")),
        "{:?}",
        status.pools[0].endpoint
    );

    // A second pass issues nothing.
    let versions = |list: &[&Secret]| -> Vec<String> {
        list.iter().map(|s| s.resource_version().unwrap()).collect()
    };
    let before = versions(&[&issuer, &for_clients, &serving]);
    reconcile(Arc::new(fetch(&client, &ns.name).await), context(&client))
        .await
        .unwrap();
    let again = [
        secrets.get("demo-ca-key").await.unwrap(),
        secrets.get("demo-ca").await.unwrap(),
        secrets.get("demo-tls").await.unwrap(),
    ];
    assert_eq!(versions(&[&again[0], &again[1], &again[2]]), before);

    // A pool added: the certificate is issued again by the same CA, for its names too.
    let mut cc = fetch(&client, &ns.name).await;
    cc.spec.pools.push(PoolSpec::new("cold"));
    api.replace("demo", &PostParams::default(), &cc)
        .await
        .unwrap();
    reconcile(Arc::new(fetch(&client, &ns.name).await), context(&client))
        .await
        .unwrap();
    let renewed = secrets.get("demo-tls").await.unwrap();
    assert_ne!(renewed.resource_version(), serving.resource_version());
    assert_eq!(
        secrets.get("demo-ca-key").await.unwrap().resource_version(),
        issuer.resource_version(),
        "the CA stays"
    );
    let cert = data(&renewed, "tls.crt");
    assert!(serves(&cert, &ca, &format!("demo-cold.{}.svc", ns.name)));
    assert!(serves(&cert, &ca, &format!("demo-hot.{}.svc", ns.name)));
    // Renewed by the same CA, the certificate reaches the nodes' copy in the same pass
    // (no node reports here, so none is waited for).
    let copy = secrets.get("demo-node-tls").await.unwrap();
    assert_eq!(data(&copy, "tls.crt"), cert);
    assert_eq!(data(&copy, "ca.crt"), ca);

    // A new CA (the issuer Secret replaced by its owner's hand: deleted, made again) is
    // trusted by the nodes' copy beside the old before its certificate is served; with no
    // node to wait for, every step follows on the next passes.
    secrets
        .delete("demo-ca-key", &Default::default())
        .await
        .unwrap();
    reconcile(Arc::new(fetch(&client, &ns.name).await), context(&client))
        .await
        .unwrap();
    let new_ca = data(&secrets.get("demo-ca-key").await.unwrap(), "ca.crt");
    assert_ne!(new_ca, ca);
    let copy = secrets.get("demo-node-tls").await.unwrap();
    let trusted = String::from_utf8_lossy(&data(&copy, "ca.crt")).into_owned();
    assert!(
        trusted.contains(String::from_utf8_lossy(&ca).trim())
            && trusted.contains(String::from_utf8_lossy(&new_ca).trim()),
        "step 1: both CAs trusted"
    );
    assert_eq!(
        data(&copy, "tls.crt"),
        cert,
        "step 1: the old certificate still served"
    );
    for _ in 0..2 {
        reconcile(Arc::new(fetch(&client, &ns.name).await), context(&client))
            .await
            .unwrap();
    }
    let copy = secrets.get("demo-node-tls").await.unwrap();
    let serving = secrets.get("demo-tls").await.unwrap();
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        assert_eq!(
            data(&copy, key),
            data(&serving, key),
            "{key} after the last step"
        );
    }
    assert_eq!(data(&copy, "ca.crt"), new_ca);
    ns.delete().await;
}

fn invalidation(
    name: &str,
    cluster: &str,
    pools: Option<&[&str]>,
    deadline: i64,
    ttl: i64,
) -> CacheInvalidation {
    CacheInvalidation::new(
        name,
        CacheInvalidationSpec {
            cluster: cluster.into(),
            pools: pools.map(|p| p.iter().map(|s| (*s).to_owned()).collect()),
            keys: None,
            prefixes: None,
            tags: Some(vec!["sales.orders".into()]),
            active_deadline_seconds: deadline,
            ttl_seconds_after_finished: ttl,
        },
    )
}

/// The status after one pass of the CacheInvalidation controller over `name`.
async fn invalidation_pass(
    ctx: &Arc<Context>,
    api: &Api<CacheInvalidation>,
    name: &str,
) -> Option<CacheInvalidationStatus> {
    if let Some(inv) = api.get_opt(name).await.unwrap() {
        operator::invalidations::reconcile(Arc::new(inv), Arc::clone(ctx))
            .await
            .unwrap();
    }
    api.get_opt(name).await.unwrap().and_then(|inv| inv.status)
}

#[tokio::test]
#[ignore = "needs a real API server: e2e/cluster up --control-plane-only"]
async fn a_cache_invalidation_says_which_nodes_are_pending_fails_at_its_deadline_and_goes_after_its_ttl()
 {
    let client = client().await;
    install_crd(&client).await;
    apply_crd(&client, &CacheInvalidation::crd()).await;
    let ns = TestNamespace::new(&client, "fc-inv").await;
    // A cluster whose nodes never run here: the cluster controller does not run in this
    // test, so there is no StatefulSet and no pod to call.
    create_cluster(&client, &ns.name, &[("hot", 2), ("batch", 1)]).await;
    let ctx = context(&client);
    let api: Api<CacheInvalidation> = Api::namespaced(client.clone(), &ns.name);
    let pp = PostParams::default();
    api.create(&pp, &invalidation("orders", "demo", None, 10, 0))
        .await
        .unwrap();
    api.create(
        &pp,
        &invalidation("no-such-pool", "demo", Some(&["cold"]), 600, 0),
    )
    .await
    .unwrap();
    api.create(&pp, &invalidation("no-such-cluster", "gone", None, 600, 0))
        .await
        .unwrap();

    let condition = |status: &CacheInvalidationStatus, type_: &str| {
        let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    };
    // Every node of both pools (the cluster-wide form) is pending, each saying why.
    let running = invalidation_pass(&ctx, &api, "orders").await.unwrap();
    assert_eq!(running.phase, Some(InvalidationPhase::Running));
    assert_eq!(running.pending_nodes, 3);
    let pools: Vec<(&str, Vec<&str>)> = running
        .pools
        .iter()
        .map(|p| {
            (
                p.name.as_str(),
                p.pending_nodes.iter().map(|n| n.name.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(
        pools,
        [
            ("hot", vec!["demo-hot-0", "demo-hot-1"]),
            ("batch", vec!["demo-batch-0"])
        ]
    );
    let reason = running.pools[0].pending_nodes[0].reason.as_deref();
    assert_eq!(reason, Some("no pod: it is being created"));
    let (status, reason, message) = condition(&running, "Complete");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NodesPending")
    );
    assert!(
        message.starts_with("3 nodes not done: demo-hot-0 (no pod"),
        "{message}"
    );
    // The API server's printer columns read the status.
    let listed = api.get("orders").await.unwrap();
    assert_eq!(listed.status.as_ref().map(|s| s.removed), Some(0));

    let (status, reason, message) = condition(
        &invalidation_pass(&ctx, &api, "no-such-pool").await.unwrap(),
        "Complete",
    );
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "PoolNotFound")
    );
    assert_eq!(
        message,
        "CacheCluster demo has no pool cold; its pools are hot, batch"
    );
    let (_, reason, message) = condition(
        &invalidation_pass(&ctx, &api, "no-such-cluster")
            .await
            .unwrap(),
        "Complete",
    );
    assert_eq!(reason, "ClusterNotFound");
    assert_eq!(
        message,
        format!("no CacheCluster gone in namespace {}", ns.name)
    );

    // Past its 10 s deadline it is Failed, naming the nodes left.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let failed = invalidation_pass(&ctx, &api, "orders").await.unwrap();
    assert_eq!(failed.phase, Some(InvalidationPhase::Failed));
    assert!(failed.completion_time.is_some());
    let (status, reason, _) = condition(&failed, "Failed");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "DeadlineExceeded")
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), &ns.name);
    let reasons: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("orders"))
        .filter_map(|e| e.reason)
        .collect();
    assert!(reasons.contains(&"Started".to_owned()), "{reasons:?}");
    assert!(
        reasons.contains(&"DeadlineExceeded".to_owned()),
        "{reasons:?}"
    );
    // ttlSecondsAfterFinished 0: the next pass deletes it.
    assert_eq!(invalidation_pass(&ctx, &api, "orders").await, None);
    assert!(api.get_opt("orders").await.unwrap().is_none());
    ns.delete().await;
}
