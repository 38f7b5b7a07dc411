//! Server-side apply of the desired children, and deletion of the ones no longer wanted.
//!
//! One field manager; order per pool: ConfigMap, Services, PDB, StatefulSet last, so
//! a pod never starts against a missing config.
//!
//! Owns: every server-side apply with the one field manager (the children, the
//! ServiceMonitor, the CacheCluster's status), deletion of orphans, and what it reports
//! ([`Applied`], [`ApplyFailed`]). Must not import `plan`, `execute`, `nodes` or
//! `status`: no node calls; the objects come from `build`, the status from `status`.

use std::collections::BTreeSet;

use crds::cachecluster::{CacheCluster, CacheClusterStatus};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::build::{DesiredPool, names};
use crate::error::{Error, Result};
use crate::validate::ValidatedCluster;

pub use crate::build::names::FIELD_MANAGER;

/// What the apply step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Applied {
    /// The cluster's ServiceMonitor.
    pub(crate) service_monitor: ServiceMonitorOutcome,
    /// Pools whose objects were deleted because they left the spec.
    pub(crate) removed_pools: BTreeSet<String>,
}

/// A failed apply step.
#[derive(Debug)]
pub(crate) struct ApplyFailed {
    /// The pools' own objects failed (reported in status); otherwise the ServiceMonitor
    /// or the deletion of removed pools did.
    pub(crate) children: bool,
    /// The error.
    pub(crate) error: Error,
}

/// The apply step: every pool's objects (server-side apply), the ServiceMonitor, and
/// the deletion of pools that left the spec.
///
/// # Errors
/// [`ApplyFailed`] with the first error.
pub(crate) async fn apply_cluster(
    client: &Client,
    cluster: &ValidatedCluster,
    desired: &[DesiredPool],
) -> std::result::Result<Applied, ApplyFailed> {
    let namespace = &cluster.namespace;
    apply_all(client, namespace, desired)
        .await
        .map_err(|error| ApplyFailed {
            children: true,
            error,
        })?;
    let other = |error| ApplyFailed {
        children: false,
        error,
    };
    let service_monitor = reconcile_service_monitor(client, cluster)
        .await
        .map_err(other)?;
    let wanted: BTreeSet<String> = cluster.pools.iter().map(|p| p.name.clone()).collect();
    let removed_pools = delete_removed_pools(client, namespace, &cluster.name, &wanted)
        .await
        .map_err(other)?;
    Ok(Applied {
        service_monitor,
        removed_pools,
    })
}

/// Applies every pool's objects in order.
///
/// # Errors
/// [`Error::Apply`] naming the first object that failed.
pub async fn apply_all(client: &Client, namespace: &str, desired: &[DesiredPool]) -> Result<()> {
    for pool in desired {
        apply(client, namespace, &pool.configmap).await?;
        apply(client, namespace, &pool.headless_service).await?;
        apply(client, namespace, &pool.client_service).await?;
        apply(client, namespace, &pool.pdb).await?;
        match &pool.network_policy {
            Some(policy) => {
                apply(client, namespace, policy).await?;
            }
            None => {
                delete_network_policy(
                    client,
                    namespace,
                    &pool.statefulset.name_any(),
                    pool.statefulset.owner_references(),
                )
                .await?;
            }
        }
        apply(client, namespace, &pool.statefulset).await?;
        tracing::debug!(pool = %pool.pool, "applied the pool's objects");
    }
    Ok(())
}

async fn apply<K>(client: &Client, namespace: &str, object: &K) -> Result<K>
where
    K: Resource<Scope = NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let name = object.name_any();
    refuse_if_not_ours(&api, kind_of::<K>(), object.owner_references(), &name).await?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(object))
        .await
        .map_err(|source| Error::Apply {
            kind: kind_of::<K>(),
            name,
            source,
        })
}

/// Fails with [`Error::NotOurs`] when `name` exists and none of its owners is one of
/// `ours` (the CacheCluster the object is built for): the apply is forced (one field
/// manager), so without this check a cluster whose object names collide with another's
/// would take that cluster's objects over. One metadata GET per object.
///
/// # Errors
/// [`Error::NotOurs`], or [`Error::Apply`] when the object cannot be read.
async fn refuse_if_not_ours<K>(
    api: &Api<K>,
    kind: &'static str,
    ours: &[OwnerReference],
    name: &str,
) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let existing = api
        .get_metadata_opt(name)
        .await
        .map_err(|source| Error::Apply {
            kind,
            name: name.to_owned(),
            source,
        })?;
    let Some(existing) = existing else {
        return Ok(());
    };
    match not_ours(existing.owner_references(), ours) {
        None => Ok(()),
        Some(owner) => Err(Error::NotOurs {
            kind,
            name: name.to_owned(),
            owner,
        }),
    }
}

/// Who owns an object whose owners are `theirs`, when none of them is one of `ours`.
fn not_ours(theirs: &[OwnerReference], ours: &[OwnerReference]) -> Option<String> {
    if theirs.iter().any(|t| ours.iter().any(|o| o.uid == t.uid)) {
        return None;
    }
    let controller = theirs
        .iter()
        .find(|t| t.controller == Some(true))
        .or(theirs.first());
    Some(match controller {
        Some(owner) => format!("{} {} (uid {})", owner.kind, owner.name, owner.uid),
        None => "no controller (created by someone else)".to_owned(),
    })
}

/// What became of the cluster's ServiceMonitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceMonitorOutcome {
    /// Applied (`spec.monitoring.serviceMonitor: true`).
    Applied,
    /// Wanted, but the `monitoring.coreos.com` CRDs are not installed.
    Unavailable,
    /// Not wanted; deleted if it existed.
    Absent,
}

/// Applies the cluster's ServiceMonitor when the spec asks for one, and deletes it when
/// it does not. A cluster without the prometheus-operator CRDs answers 404 for the
/// resource: reported as [`ServiceMonitorOutcome::Unavailable`], not an error, so the
/// cache keeps being reconciled.
///
/// # Errors
/// [`Error::Apply`] or [`Error::Delete`] for any other API error.
pub async fn reconcile_service_monitor(
    client: &Client,
    cluster: &crate::validate::ValidatedCluster,
) -> Result<ServiceMonitorOutcome> {
    use crate::build::servicemonitor::{build_service_monitor, service_monitor_resource};
    use kube::api::DynamicObject;

    let resource = service_monitor_resource();
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &cluster.namespace, &resource);
    let name = names::service_monitor(&cluster.name);
    if cluster.service_monitor {
        let monitor = build_service_monitor(cluster);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        return match api.patch(&name, &params, &Patch::Apply(&monitor)).await {
            Ok(_) => Ok(ServiceMonitorOutcome::Applied),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                Ok(ServiceMonitorOutcome::Unavailable)
            }
            Err(source) => Err(Error::Apply {
                kind: "ServiceMonitor",
                name,
                source,
            }),
        };
    }
    // Another's ServiceMonitor of that name (or one that cannot be read) is left alone.
    if refuse_if_not_ours(
        &api,
        "ServiceMonitor",
        std::slice::from_ref(&cluster.owner),
        &name,
    )
    .await
    .is_err()
    {
        return Ok(ServiceMonitorOutcome::Absent);
    }
    match api.delete(&name, &DeleteParams::background()).await {
        Ok(_) => Ok(ServiceMonitorOutcome::Absent),
        // No such object, or no such resource in this cluster.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(ServiceMonitorOutcome::Absent),
        Err(source) => Err(Error::Delete {
            kind: "ServiceMonitor",
            name,
            source,
        }),
    }
}

/// Deletes the pool's NetworkPolicy (named like its StatefulSet) when the spec turns them
/// off; absent is fine, and one that is not this cluster's (`ours`) is left alone.
async fn delete_network_policy(
    client: &Client,
    namespace: &str,
    name: &str,
    ours: &[OwnerReference],
) -> Result<()> {
    let api: Api<NetworkPolicy> = Api::namespaced(client.clone(), namespace);
    if refuse_if_not_ours(&api, "NetworkPolicy", ours, name)
        .await
        .is_err()
    {
        return Ok(());
    }
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(Error::Delete {
            kind: "NetworkPolicy",
            name: name.to_owned(),
            source,
        }),
    }
}

/// Deletes the children of pools that are no longer in the spec; returns their pool
/// names.
///
/// # Errors
/// [`Error::Observe`] or [`Error::Delete`].
pub async fn delete_removed_pools(
    client: &Client,
    namespace: &str,
    cluster: &str,
    wanted: &BTreeSet<String>,
) -> Result<BTreeSet<String>> {
    let mut removed = BTreeSet::new();
    removed.extend(delete_unwanted::<StatefulSet>(client, namespace, cluster, wanted).await?);
    removed
        .extend(delete_unwanted::<PodDisruptionBudget>(client, namespace, cluster, wanted).await?);
    removed.extend(delete_unwanted::<Service>(client, namespace, cluster, wanted).await?);
    removed.extend(delete_unwanted::<ConfigMap>(client, namespace, cluster, wanted).await?);
    removed.extend(delete_unwanted::<NetworkPolicy>(client, namespace, cluster, wanted).await?);
    Ok(removed)
}

async fn delete_unwanted<K>(
    client: &Client,
    namespace: &str,
    cluster: &str,
    wanted: &BTreeSet<String>,
) -> Result<Vec<String>>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let selector = names::selector_string(&names::cluster_selector(cluster));
    let existing = api
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| Error::Observe {
            kind: kind_of::<K>(),
            cluster: cluster.to_owned(),
            source,
        })?;
    let mut removed = Vec::new();
    for object in existing.items {
        let Some(pool) = object.labels().get(names::POOL_LABEL).cloned() else {
            continue;
        };
        if wanted.contains(&pool) {
            continue;
        }
        let name = object.name_any();
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => removed.push(pool),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => {
                return Err(Error::Delete {
                    kind: kind_of::<K>(),
                    name,
                    source,
                });
            }
        }
    }
    Ok(removed)
}

/// The kind of `K` as a static string, for error messages.
pub(crate) fn kind_of<K: Resource>() -> &'static str
where
    K::DynamicType: Default,
{
    match K::kind(&K::DynamicType::default()).as_ref() {
        "ConfigMap" => "ConfigMap",
        "Service" => "Service",
        "PodDisruptionBudget" => "PodDisruptionBudget",
        "NetworkPolicy" => "NetworkPolicy",
        "StatefulSet" => "StatefulSet",
        "Pod" => "Pod",
        _ => "object",
    }
}

/// Writes `status` to the object's `/status` subresource.
///
/// # Errors
/// [`Error::Status`].
pub async fn apply_status(
    client: &Client,
    cc: &CacheCluster,
    status: &CacheClusterStatus,
) -> Result<()> {
    let api: Api<CacheCluster> =
        Api::namespaced(client.clone(), &cc.namespace().unwrap_or_default());
    // `generatedSecrets` is written by `secrets` under its own field manager: a pass
    // that read the status before a record was made must not take it out.
    let status = CacheClusterStatus {
        generated_secrets: Vec::new(),
        ..status.clone()
    };
    let patch = json!({
        "apiVersion": "flightcache.dev/v1alpha1",
        "kind": "CacheCluster",
        "status": status,
    });
    api.patch_status(
        &cc.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
    .map_err(|source| Error::Status {
        name: cc.name_any(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(kind: &str, name: &str, uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "flightcache.dev/v1alpha1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: Some(true),
        }
    }

    #[test]
    fn an_object_is_ours_only_when_one_of_its_owners_is_this_cluster() {
        let ours = [owner("CacheCluster", "a", "uid-a", true)];
        assert_eq!(not_ours(&ours, &ours), None);
        // Another cluster's, named like it: the controller is named.
        let theirs = [
            owner("Deployment", "x", "uid-x", false),
            owner("CacheCluster", "a-b", "uid-ab", true),
        ];
        assert_eq!(
            not_ours(&theirs, &ours).as_deref(),
            Some("CacheCluster a-b (uid uid-ab)")
        );
        // The same name, recreated: another uid is another cluster.
        let earlier = [owner("CacheCluster", "a", "uid-old", true)];
        assert!(not_ours(&earlier, &ours).is_some());
        // Someone's own object, with no owner at all.
        assert_eq!(
            not_ours(&[], &ours).as_deref(),
            Some("no controller (created by someone else)")
        );
    }
}
