//! Read-only I/O: the children of a cluster as they are now.

use crds::node_config::{NodeDocument, Topology};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};

use crate::build::names;
use crate::error::{Error, Result};

/// The observed children of one CacheCluster.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// StatefulSets labelled with the cluster.
    pub statefulsets: Vec<StatefulSet>,
    /// Node pods labelled with the cluster.
    pub pods: Vec<Pod>,
    /// Pool ConfigMaps labelled with the cluster.
    pub configmaps: Vec<ConfigMap>,
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
}

/// Lists the StatefulSets and pods of the cluster named `cluster` in `namespace`.
///
/// # Errors
/// [`Error::Observe`] when a list call fails.
pub async fn observe(client: &Client, namespace: &str, cluster: &str) -> Result<Observed> {
    let selector = names::selector_string(&names::cluster_selector(cluster));
    let params = ListParams::default().labels(&selector);
    let statefulsets = list::<StatefulSet>(client, namespace, cluster, &params).await?;
    let pods = list::<Pod>(client, namespace, cluster, &params).await?;
    let configmaps = list::<ConfigMap>(client, namespace, cluster, &params).await?;
    Ok(Observed {
        statefulsets,
        pods,
        configmaps,
    })
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
