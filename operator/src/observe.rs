//! Observe, the first step of a pass: read-only I/O. Owns the reading of a cluster's
//! children as they are now (StatefulSets, pods, pool ConfigMaps), of the zone of the
//! Nodes its pods run on, and of what each Ready node reports, turned into the planner's
//! [`PoolObservation`]s. Writes nothing: no server-side apply, no status, no events, no
//! node configure/rebalance calls (those are `apply`, `status` and `execute`); it does
//! not import `controller`.
//!
//! Nodes are cluster-scoped: the chart grants reading them with a ClusterRole even when
//! the operator's other rights are namespaced. Zones are an improvement, never a
//! condition: a Node that cannot be read (no permission, gone, an API error) leaves its
//! pods' zone unknown and the pass goes on; the first such failure, and the first Node
//! without a zone label, are logged once per process.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};

use crds::cachecluster::CacheClusterStatus;
use crds::node_config::{NodeDocument, Topology};
use futures::future::join_all;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};

use crate::build::{self, names};
use crate::error::{Error, Result};
use crate::nodes::NodeAdmin;
use crate::plan::{NodeView, PoolObservation};
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

/// Lists the StatefulSets, pods and ConfigMaps of the cluster named `cluster` in
/// `namespace`, and reads the zone of the Nodes its pods run on.
///
/// # Errors
/// [`Error::Observe`] when a list call fails (reading Nodes never fails the pass).
pub async fn observe(
    client: &Client,
    namespace: &str,
    cluster: &str,
    warnings: &NodeReadWarnings,
) -> Result<Observed> {
    let selector = names::selector_string(&names::cluster_selector(cluster));
    let params = ListParams::default().labels(&selector);
    let statefulsets = list::<StatefulSet>(client, namespace, cluster, &params).await?;
    let pods = list::<Pod>(client, namespace, cluster, &params).await?;
    let configmaps = list::<ConfigMap>(client, namespace, cluster, &params).await?;
    let node_zones = observe_node_zones(client, &pods, warnings).await;
    Ok(Observed {
        statefulsets,
        pods,
        configmaps,
        node_zones,
    })
}

/// The zone label of each Node `pods` run on that can be read (metadata only, one `get`
/// per Node, at once). A Node that cannot be read is left out: its pods' zone is unknown
/// this pass, and the ring keeps what it published for them.
async fn observe_node_zones(
    client: &Client,
    pods: &[Pod],
    warnings: &NodeReadWarnings,
) -> BTreeMap<String, Option<String>> {
    let names: BTreeSet<&str> = pods
        .iter()
        .filter_map(|pod| pod.spec.as_ref()?.node_name.as_deref())
        .filter(|name| !name.is_empty())
        .collect();
    let api: Api<Node> = Api::all(client.clone());
    let reads = join_all(names.iter().map(|name| api.get_metadata_opt(name))).await;
    let mut zones = BTreeMap::new();
    for (name, read) in names.into_iter().zip(reads) {
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
    zones
}

/// Per pool: its pods as the plan sees them, with what each Ready node reports
/// (`stats`), and the ring last published.
pub(crate) async fn observe_pools(
    cluster: &ValidatedCluster,
    observed: &Observed,
    admin: &NodeAdmin,
    previous: Option<&CacheClusterStatus>,
    resize_supported: bool,
) -> Vec<PoolObservation> {
    let mut observations = Vec::with_capacity(cluster.pools.len());
    for pool in &cluster.pools {
        let sts = observed.statefulset(&cluster.name, &pool.name);
        let template_hash = build::statefulset::template_hash(cluster, pool);
        let resize_unsupported = !resize_supported;
        let pods = observed.pods_of(&pool.name);
        let reports = join_all(pods.iter().map(|pod| async {
            let ip = pod_ip(pod)?;
            if !rollout::is_ready(pod) {
                return None;
            }
            match admin.report(&ip).await {
                Ok(report) => Some(report),
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
            .filter_map(|(pod, report)| {
                let name = pod.name_any();
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
                    ready_seconds: rollout::ready_seconds(pod, &crate::now()),
                    unready_seconds: rollout::unready_seconds(pod, &crate::now()),
                    memory_limit,
                    memory_applied,
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
    observations
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
