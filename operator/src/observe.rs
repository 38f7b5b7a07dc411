//! Observe, the first step of a pass: read-only I/O. Owns the reading of a cluster's
//! children as they are now (StatefulSets, pods, pool ConfigMaps), of the zone and
//! health of the Nodes its pods run on (the Node and its heartbeat Lease), of what each
//! Ready node reports, turned into the planner's [`PoolObservation`]s, and of what a
//! force delete on a lost node needs (the pods' claims and volumes, the other nodes'
//! Leases). Writes nothing: no server-side apply, no status, no events, no
//! node configure/rebalance calls (those are `apply`, `status` and `execute`); it does
//! not import `controller`.
//!
//! Nodes are cluster-scoped: the chart grants reading them with a ClusterRole even when
//! the operator's other rights are namespaced. Zones are an improvement, never a
//! condition: a Node that cannot be read (no permission, gone, an API error) leaves its
//! pods' zone unknown and the pass goes on; the first such failure, and the first Node
//! without a zone label, are logged once per process. Node health is the same: a Node or
//! Lease that cannot be read says nothing (not lost), logged once (`nodeloss`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};

use crds::cachecluster::CacheClusterStatus;
use crds::node_config::{NodeDocument, Topology};
use futures::future::join_all;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};

use crate::build::{self, names};
use crate::error::{Error, Result};
use crate::nodeloss::{self, NodeHealth, ObservedClaim};
use crate::nodes::NodeAdmin;
use crate::plan::{NodeReport, NodeView, PoolObservation};
use crate::validate::ValidatedCluster;
use crate::{ring, rollout};

/// The observed children of one CacheCluster.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// StatefulSets labelled with the cluster.
    pub statefulsets: Vec<StatefulSet>,
    /// Node pods labelled with the cluster.
    pub pods: Vec<Pod>,
    /// Pool ConfigMaps labelled with the cluster.
    pub configmaps: Vec<ConfigMap>,
    /// The Nodes the pods run on that could be read, by name: their zone label (`None`:
    /// none, or empty).
    pub node_zones: BTreeMap<String, Option<String>>,
    /// The health of the Nodes the pods run on, by name (from the Node and its Lease;
    /// what could not be read is unknown).
    pub node_health: BTreeMap<String, NodeHealth>,
}

/// The Node label naming the zone a node is in (set by cloud providers, or by hand).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// What reading Nodes has warned about already: each warning is logged once per
/// operator process, not on every pass (a cluster without the permission, or without
/// zones, would otherwise log every two seconds during a rollout).
#[derive(Debug, Default)]
pub struct NodeReadWarnings {
    unreadable: AtomicBool,
    unlabelled: AtomicBool,
    lease_unreadable: AtomicBool,
}

impl NodeReadWarnings {
    /// True the first time only.
    fn first(flag: &AtomicBool) -> bool {
        !flag.swap(true, Ordering::Relaxed)
    }
}

impl Observed {
    /// The StatefulSet of `pool`, if it exists.
    pub fn statefulset(&self, cluster: &str, pool: &str) -> Option<&StatefulSet> {
        let name = names::pool_object(cluster, pool);
        self.statefulsets.iter().find(|sts| sts.name_any() == name)
    }

    /// The ring last published for `pool` (from its ConfigMap), if readable.
    pub fn published_ring(&self, cluster: &str, pool: &str) -> Option<Topology> {
        let name = names::pool_object(cluster, pool);
        let text = self
            .configmaps
            .iter()
            .find(|cm| cm.name_any() == name)?
            .data
            .as_ref()?
            .get(names::NODE_CONFIG_KEY)?;
        NodeDocument::from_json(text).ok()?.topology
    }

    /// The pods of `pool`.
    pub fn pods_of(&self, pool: &str) -> Vec<&Pod> {
        self.pods
            .iter()
            .filter(|pod| pod.labels().get(names::POOL_LABEL).map(String::as_str) == Some(pool))
            .collect()
    }

    /// Seconds since the last heartbeat of the Node `pod` runs on, when that Node is lost.
    pub fn node_lost_seconds(&self, pod: &Pod) -> Option<u64> {
        self.node_health
            .get(nodeloss::node_of(pod)?)?
            .lost_seconds()
    }

    /// Where `pod` runs: its Node's zone when the pod is scheduled and its Node was read.
    pub fn zone_of(&self, pod: &Pod) -> ring::PodZone {
        pod.spec
            .as_ref()
            .and_then(|spec| spec.node_name.as_ref())
            .and_then(|node| self.node_zones.get(node))
            .map_or(ring::PodZone::Unknown, |zone| {
                ring::PodZone::Known(zone.clone())
            })
    }
}

/// Lists the StatefulSets, pods and ConfigMaps of the cluster named `cluster` (uid
/// `owner_uid`) in `namespace`, and reads the zone and health of the Nodes its pods run on.
/// Labels alone do not make an object the cluster's (anyone who may create a pod in the
/// namespace may label it so, and the operator sends each node pod its admin token): only
/// what [`owned_children`] keeps is observed.
///
/// # Errors
/// [`Error::Observe`] when a list call fails (reading Nodes never fails the pass).
pub async fn observe(
    client: &Client,
    namespace: &str,
    cluster: &str,
    owner_uid: &str,
    warnings: &NodeReadWarnings,
) -> Result<Observed> {
    let selector = names::selector_string(&names::cluster_selector(cluster));
    let params = ListParams::default().labels(&selector);
    let statefulsets = list::<StatefulSet>(client, namespace, cluster, &params).await?;
    let pods = list::<Pod>(client, namespace, cluster, &params).await?;
    let configmaps = list::<ConfigMap>(client, namespace, cluster, &params).await?;
    let (statefulsets, pods, configmaps) =
        owned_children(owner_uid, statefulsets, pods, configmaps);
    let (node_zones, node_health) = observe_nodes(client, &pods, warnings).await;
    Ok(Observed {
        statefulsets,
        pods,
        configmaps,
        node_zones,
        node_health,
    })
}

/// Of the labelled objects, the cluster's own: the StatefulSets and ConfigMaps the
/// CacheCluster `owner_uid` owns, and the pods one of those StatefulSets controls.
fn owned_children(
    owner_uid: &str,
    statefulsets: Vec<StatefulSet>,
    pods: Vec<Pod>,
    configmaps: Vec<ConfigMap>,
) -> (Vec<StatefulSet>, Vec<Pod>, Vec<ConfigMap>) {
    let owned_by = |owners: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
                    uid: &str,
                    kind: &str| {
        owners
            .iter()
            .any(|o| o.uid == uid && o.kind == kind && o.controller == Some(true))
    };
    let statefulsets: Vec<StatefulSet> = statefulsets
        .into_iter()
        .filter(|sts| owned_by(sts.owner_references(), owner_uid, "CacheCluster"))
        .collect();
    let pods = pods
        .into_iter()
        .filter(|pod| {
            statefulsets.iter().any(|sts| {
                sts.metadata
                    .uid
                    .as_deref()
                    .is_some_and(|uid| owned_by(pod.owner_references(), uid, "StatefulSet"))
            })
        })
        .collect();
    let configmaps = configmaps
        .into_iter()
        .filter(|cm| owned_by(cm.owner_references(), owner_uid, "CacheCluster"))
        .collect();
    (statefulsets, pods, configmaps)
}

/// The zone label and the health of each Node `pods` run on: one `get` of the Node and
/// one of its heartbeat Lease per Node, all at once. A Node that cannot be read is left
/// out of the zones (its pods' zone is unknown this pass, and the ring keeps what it
/// published for them); what cannot be read of a Node or its Lease is unknown in its
/// health, which then never says lost on that account.
async fn observe_nodes(
    client: &Client,
    pods: &[Pod],
    warnings: &NodeReadWarnings,
) -> (
    BTreeMap<String, Option<String>>,
    BTreeMap<String, NodeHealth>,
) {
    let names: BTreeSet<&str> = pods.iter().filter_map(nodeloss::node_of).collect();
    let api: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), nodeloss::NODE_LEASE_NAMESPACE);
    let (reads, lease_reads) = futures::join!(
        join_all(names.iter().map(|name| api.get_opt(name))),
        join_all(names.iter().map(|name| leases.get_opt(name))),
    );
    let now = crate::clock::now();
    let mut zones = BTreeMap::new();
    let mut health = BTreeMap::new();
    for ((name, read), lease_read) in names.into_iter().zip(reads).zip(lease_reads) {
        let lease = match lease_read {
            Ok(lease) => lease,
            Err(err) => {
                if NodeReadWarnings::first(&warnings.lease_unreadable) {
                    tracing::warn!(node = name, namespace = nodeloss::NODE_LEASE_NAMESPACE, error = %crate::chain(&err), "cannot read the heartbeat Lease of the node a pod runs on: a lost node is found only once the node controller marks it (the chart grants get on leases in kube-node-lease; logged once)");
                } else {
                    tracing::debug!(node = name, error = %crate::chain(&err), "cannot read node lease");
                }
                None
            }
        };
        let node = match &read {
            Ok(node) => node.as_ref(),
            Err(_) => None,
        };
        health.insert(
            name.to_owned(),
            nodeloss::node_health(node, lease.as_ref(), &now),
        );
        match read {
            Ok(Some(node)) => {
                let zone = node
                    .labels()
                    .get(ZONE_LABEL)
                    .filter(|zone| !zone.is_empty())
                    .cloned();
                if zone.is_none() && NodeReadWarnings::first(&warnings.unlabelled) {
                    tracing::info!(
                        node = name,
                        label = ZONE_LABEL,
                        "node has no zone label: ring members on it get no zone (logged once)"
                    );
                }
                zones.insert(name.to_owned(), zone);
            }
            // Gone (a lost machine the cluster deleted): unknown until the pod moves.
            Ok(None) => {}
            Err(err) => {
                if NodeReadWarnings::first(&warnings.unreadable) {
                    tracing::warn!(node = name, error = %crate::chain(&err), "cannot read the node a pod runs on: ring members keep the zones published before, or get none (the chart grants get on nodes; logged once)");
                } else {
                    tracing::debug!(node = name, error = %crate::chain(&err), "cannot read node");
                }
            }
        }
    }
    (zones, health)
}

/// The TLS each node that reported says it uses, by pod name (`None`: it did not say).
pub(crate) type TlsReports = Vec<(String, Option<crds::admin::TlsInUse>)>;

/// Per pool: its pods as the plan sees them, with what each Ready node reports
/// (`stats`), and the ring last published; and, over every pool, the TLS each node that
/// reported uses.
pub(crate) async fn observe_pools(
    cluster: &ValidatedCluster,
    observed: &Observed,
    admin: &NodeAdmin,
    previous: Option<&CacheClusterStatus>,
    resize_supported: bool,
) -> (Vec<PoolObservation>, TlsReports) {
    let mut observations = Vec::with_capacity(cluster.pools.len());
    let mut tls_reports = TlsReports::new();
    for pool in &cluster.pools {
        let sts = observed.statefulset(&cluster.name, &pool.name);
        let template_hash = build::statefulset::template_hash(cluster, pool);
        let resize_unsupported = !resize_supported;
        let pods = observed.pods_of(&pool.name);
        let reports = join_all(pods.iter().map(|pod| async {
            let ip = pod_ip(pod)?;
            // Nothing on a lost node answers: asking would only cost the connect timeout.
            // A node whose containers are up is asked whatever its gate says: up behind a
            // closed gate it waits for the current ring; just admitted, its kubelet has not
            // marked it Ready yet, and without its report the planner read it as not
            // running the ring and closed its gate again, pass after pass (a CI run's
            // scale-out: open and closed every 0.3 s for a minute).
            let answers = rollout::is_ready(pod) || rollout::containers_up(pod);
            if !answers || observed.node_lost_seconds(pod).is_some() {
                return None;
            }
            match admin.stats(&ip).await {
                Ok(stats) => Some((NodeReport::from(&stats), stats.tls)),
                Err(err) => {
                    tracing::warn!(pod = %pod.name_any(), error = %crate::chain(&err), "node did not report");
                    None
                }
            }
        }))
        .await;
        let nodes = pods
            .iter()
            .zip(reports)
            .filter_map(|(pod, answer)| {
                let name = pod.name_any();
                let report = answer.map(|(report, tls)| {
                    tls_reports.push((name.clone(), tls));
                    report
                });
                let (memory_limit, memory_applied) = rollout::memory_limits(pod);
                // A memory change that cannot happen in place restarts the node instead.
                let memory_stuck = memory_limit != Some(pool.memory_limit_bytes)
                    && (resize_unsupported || rollout::resize_infeasible(pod));
                Some(NodeView {
                    zone: observed.zone_of(pod),
                    image: node_image(pod),
                    ordinal: ring::ordinal_of(&name)?,
                    ready: rollout::is_ready(pod),
                    current_template: rollout::template_hash_of(pod)
                        == Some(template_hash.as_str())
                        && !memory_stuck,
                    ip: pod_ip(pod),
                    report,
                    ready_seconds: rollout::ready_seconds(pod, &crate::clock::now()),
                    unready_seconds: rollout::unready_seconds(pod, &crate::clock::now()),
                    memory_limit,
                    memory_applied,
                    host: nodeloss::node_of(pod).map(str::to_owned),
                    node_lost_seconds: observed.node_lost_seconds(pod),
                    gate: rollout::gate(pod),
                    name,
                })
            })
            .collect();
        let seen_ring_version = previous
            .and_then(|s| s.pools.iter().find(|p| p.name == pool.name))
            .map_or(0, |p| u64::try_from(p.ring_version).unwrap_or(0));
        let observation = PoolObservation {
            statefulset_replicas: sts.and_then(|s| s.spec.as_ref()).and_then(|s| s.replicas),
            nodes,
            previous: observed.published_ring(&cluster.name, &pool.name),
            seen_ring_version,
        };
        observations.push(observation);
    }
    (observations, tls_reports)
}

/// The StatefulSet claims `claims` of a pod on a lost node in `namespace`, each with the
/// PersistentVolume bound to it (`None` when unbound; a claim that no longer exists is
/// left out).
///
/// # Errors
/// The first failed read: the pod is then not force-deleted this pass (deleting it while
/// its node-local claim stays would leave its replacement Pending for good).
pub(crate) async fn observe_claims(
    client: &Client,
    namespace: &str,
    claims: &[String],
) -> Result<Vec<ObservedClaim>, kube::Error> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let mut observed = Vec::with_capacity(claims.len());
    for name in claims {
        let Some(claim) = pvcs.get_opt(name).await? else {
            continue;
        };
        let volume_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|v| !v.is_empty());
        let volume = match volume_name {
            Some(volume) => pvs.get_opt(volume).await?,
            None => None,
        };
        observed.push(ObservedClaim {
            name: name.clone(),
            uid: claim.uid(),
            volume,
        });
    }
    Ok(observed)
}

/// Every node's heartbeat Lease (for [`nodeloss::others_alive`], read only when a force
/// delete is due).
///
/// # Errors
/// The list failed (no permission, an API error): no force delete this pass.
pub(crate) async fn observe_node_leases(client: &Client) -> Result<Vec<Lease>, kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), nodeloss::NODE_LEASE_NAMESPACE);
    Ok(leases.list(&ListParams::default()).await?.items)
}

/// The image of the pod's node container (the one the StatefulSet names `node`).
fn node_image(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|container| container.name == build::statefulset::NODE_CONTAINER)?
        .image
        .clone()
}

fn pod_ip(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .pod_ip
        .clone()
        .filter(|ip| !ip.is_empty())
}

async fn list<K>(
    client: &Client,
    namespace: &str,
    cluster: &str,
    params: &ListParams,
) -> Result<Vec<K>>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    api.list(params)
        .await
        .map(|list| list.items)
        .map_err(|source| Error::Observe {
            kind: crate::apply::kind_of::<K>(),
            cluster: cluster.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    use super::*;

    fn meta(name: &str, uid: &str, owner: Option<(&str, &str)>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            uid: Some(uid.into()),
            owner_references: owner.map(|(kind, uid)| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: kind.into(),
                    name: "owner".into(),
                    uid: uid.into(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]
            }),
            ..ObjectMeta::default()
        }
    }

    fn sts(name: &str, uid: &str, owner: Option<(&str, &str)>) -> StatefulSet {
        StatefulSet {
            metadata: meta(name, uid, owner),
            ..StatefulSet::default()
        }
    }

    fn pod(name: &str, owner: Option<(&str, &str)>) -> Pod {
        Pod {
            metadata: meta(name, &format!("uid-{name}"), owner),
            ..Pod::default()
        }
    }

    #[test]
    fn labels_alone_do_not_make_a_pod_or_statefulset_the_clusters() {
        let names = |pods: &[Pod]| pods.iter().map(ResourceExt::name_any).collect::<Vec<_>>();
        let (statefulsets, pods, configmaps) = owned_children(
            "cc-uid",
            vec![
                sts("demo-hot", "sts-uid", Some(("CacheCluster", "cc-uid"))),
                // Labelled like the cluster's, but someone else's.
                sts("demo-fake", "fake-sts-uid", None),
                sts(
                    "demo-other",
                    "other-sts-uid",
                    Some(("CacheCluster", "other-cc")),
                ),
            ],
            vec![
                pod("demo-hot-0", Some(("StatefulSet", "sts-uid"))),
                // A pod someone labelled as a node: it would be sent the admin token.
                pod("impostor", None),
                pod("demo-fake-0", Some(("StatefulSet", "fake-sts-uid"))),
                pod("demo-other-0", Some(("StatefulSet", "other-sts-uid"))),
            ],
            vec![
                ConfigMap {
                    metadata: meta("demo-hot", "cm-uid", Some(("CacheCluster", "cc-uid"))),
                    ..ConfigMap::default()
                },
                ConfigMap {
                    metadata: meta("demo-forged", "cm2-uid", None),
                    ..ConfigMap::default()
                },
            ],
        );
        assert_eq!(
            statefulsets
                .iter()
                .map(ResourceExt::name_any)
                .collect::<Vec<_>>(),
            ["demo-hot"]
        );
        assert_eq!(names(&pods), ["demo-hot-0"]);
        assert_eq!(
            configmaps
                .iter()
                .map(ResourceExt::name_any)
                .collect::<Vec<_>>(),
            ["demo-hot"]
        );
    }
}
