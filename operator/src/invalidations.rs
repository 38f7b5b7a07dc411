//! The CacheInvalidation controller: runs each CacheInvalidation once on every node of
//! its cluster's targeted pools (`invalidate-local` with the cluster's admin token),
//! calls again the nodes that were down until they answer or the deadline passes,
//! reports per pool what was removed in the status, with events on start and finish,
//! and deletes the resource `ttlSecondsAfterFinished` after it finished.
//!
//! A pass: read the CacheCluster (missing or invalid: wait, the deadline bounds it) →
//! observe its pods (only those its own StatefulSets control get the admin token) →
//! call the nodes not yet done, concurrently → fold the answers into the status
//! (`invalidation_plan`) → write it when it changed.
//!
//! Owns: the order of that pass, its events and error policy. Imports the steps it wires
//! (`observe`, `validate`, `context`, `invalidation_plan`); no step imports it.

use std::sync::Arc;
use std::time::Duration;

use crds::CacheCluster;
use crds::cacheinvalidation::{
    self, CacheInvalidation, CacheInvalidationStatus, InvalidationPhase,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::build::names;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::invalidation_plan::{self, Blocked, CallResult, NodeTarget, PoolTarget};
use crate::observe;
use crate::rollout;
use crate::validate::{self, ValidatedCluster};
use crate::warnings::Warning;

/// How soon to look again while nodes are pending (each pass calls them again).
const PENDING_REQUEUE: Duration = Duration::from_secs(3);
/// Retry delay after a failed pass (the API server unreachable, say).
const ERROR_REQUEUE: Duration = Duration::from_secs(5);
/// The field manager of the status writes.
const FIELD_MANAGER: &str = "flightcache-operator";

/// One pass over `inv`.
///
/// # Errors
/// Reading the cluster or its pods, or writing the status or the deletion, failed.
#[tracing::instrument(skip_all, fields(cacheinvalidation = %inv.name_any(), namespace = ?inv.namespace()))]
pub async fn reconcile(inv: Arc<CacheInvalidation>, ctx: Arc<Context>) -> Result<Action> {
    ctx.still_leading()?;
    let namespace = inv.namespace().unwrap_or_default();
    let now = crate::clock::now();
    let now_seconds = now.0.as_second();
    if let Some(left) =
        invalidation_plan::seconds_until_deletion(&inv.spec, inv.status.as_ref(), now_seconds)
    {
        if left > 0 {
            return Ok(Action::requeue(Duration::from_secs(left.unsigned_abs())));
        }
        delete(&ctx, &namespace, &inv.name_any()).await?;
        return Ok(Action::await_change());
    }
    let created = inv
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now_seconds, |t| t.0.as_second());
    let deadline_passed = now_seconds >= created.saturating_add(inv.spec.active_deadline_seconds);
    let previous = inv.status.as_ref();
    let generation = inv.metadata.generation;
    let status = match targets(&ctx, &inv, &namespace).await? {
        Err(blocked) => {
            invalidation_plan::blocked(previous, generation, &blocked, &now, deadline_passed)
        }
        Ok((cluster, targets)) => {
            let admin = ctx.node_admin(&cluster).await?.admin;
            let request = inv.spec.request();
            let calls = invalidation_plan::calls(previous, &targets);
            ctx.still_leading()?;
            let results = futures::future::join_all(calls.into_iter().map(|(pool, node)| {
                let (admin, request, ctx) = (&admin, &request, &ctx);
                async move {
                    let outcome = match &node.address {
                        Ok(ip) => admin.invalidate_local(ip, request).await.map_err(|err| {
                            ctx.metrics
                                .node_call_failed(crds::admin::AdminAction::InvalidateLocal);
                            crate::chain(&err)
                        }),
                        Err(why) => Err(why.clone()),
                    };
                    CallResult {
                        pool: pool.to_owned(),
                        pod: node.pod.clone(),
                        outcome,
                    }
                }
            }))
            .await;
            invalidation_plan::advance(
                previous,
                generation,
                &targets,
                &results,
                &now,
                deadline_passed,
            )
        }
    };
    if previous != Some(&status) {
        ctx.still_leading()?;
        write_status(&ctx.client, &inv, &status).await?;
        publish_transition(&ctx, &inv, previous, &status).await;
    }
    Ok(match status.phase {
        Some(phase) if phase.finished() => {
            let left =
                invalidation_plan::seconds_until_deletion(&inv.spec, Some(&status), now_seconds)
                    .unwrap_or(0);
            Action::requeue(Duration::from_secs(left.unsigned_abs().max(1)))
        }
        _ => Action::requeue(PENDING_REQUEUE),
    })
}

/// The cluster and the nodes of each targeted pool, or why there are none to call.
async fn targets(
    ctx: &Context,
    inv: &CacheInvalidation,
    namespace: &str,
) -> Result<Result<(ValidatedCluster, Vec<PoolTarget>), Blocked>> {
    let clusters: Api<CacheCluster> = Api::namespaced(ctx.client.clone(), namespace);
    let name = &inv.spec.cluster;
    let observe_failed = |source| Error::Observe {
        kind: "CacheCluster",
        cluster: name.clone(),
        source,
    };
    let Some(cc) = clusters.get_opt(name).await.map_err(observe_failed)? else {
        return Ok(Err(Blocked {
            reason: cacheinvalidation::reasons::CLUSTER_NOT_FOUND,
            message: format!("no CacheCluster {name} in namespace {namespace}"),
        }));
    };
    let cluster = match validate::validate(&cc, &ctx.defaults) {
        Ok(cluster) => cluster,
        Err(invalid) => {
            return Ok(Err(Blocked {
                reason: cacheinvalidation::reasons::CLUSTER_INVALID,
                message: format!("CacheCluster {name} has an invalid spec: {invalid}"),
            }));
        }
    };
    let pool_names: Vec<String> = cluster.pools.iter().map(|pool| pool.name.clone()).collect();
    let wanted = match invalidation_plan::target_pools(&inv.spec, &pool_names) {
        Ok(wanted) => wanted,
        Err(blocked) => return Ok(Err(blocked)),
    };
    let owner_uid = cc.metadata.uid.clone().unwrap_or_default();
    let observed = observe::observe(
        &ctx.client,
        namespace,
        name,
        &owner_uid,
        &ctx.node_read_warnings,
    )
    .await?;
    let targets = cluster
        .pools
        .iter()
        .filter(|pool| wanted.contains(&pool.name))
        .map(|pool| {
            let statefulset = names::pool_object(name, &pool.name);
            let pods: Vec<&Pod> = observed
                .pods
                .iter()
                .filter(|pod| controlled_by(pod, &statefulset))
                .collect();
            let existing: Vec<String> = pods.iter().map(|pod| pod.name_any()).collect();
            let nodes = invalidation_plan::pool_node_names(&statefulset, pool.shards, &existing)
                .into_iter()
                .map(|pod_name| {
                    let pod = pods.iter().find(|pod| pod.name_any() == pod_name);
                    NodeTarget {
                        address: address_of(pod.copied()),
                        pod: pod_name,
                    }
                })
                .collect();
            PoolTarget {
                pool: pool.name.clone(),
                nodes,
            }
        })
        .collect();
    Ok(Ok((cluster, targets)))
}

/// Whether the StatefulSet `statefulset` controls `pod` (the pods observed are already
/// those of the cluster's own StatefulSets).
fn controlled_by(pod: &Pod, statefulset: &str) -> bool {
    pod.owner_references()
        .iter()
        .any(|o| o.kind == "StatefulSet" && o.name == statefulset && o.controller == Some(true))
}

/// Where to call a node, or why it cannot be called now.
fn address_of(pod: Option<&Pod>) -> Result<String, String> {
    let pod = pod.ok_or_else(|| "no pod: it is being created".to_owned())?;
    let ip = pod
        .status
        .as_ref()
        .and_then(|status| status.pod_ip.clone())
        .filter(|ip| !ip.is_empty())
        .ok_or_else(|| "the pod has no IP yet".to_owned())?;
    // A terminating node still holds entries (it hands them off): it is called too.
    if !rollout::containers_up(pod) && pod.metadata.deletion_timestamp.is_none() {
        return Err("the node's container is not up".to_owned());
    }
    Ok(ip)
}

async fn write_status(
    client: &Client,
    inv: &CacheInvalidation,
    status: &CacheInvalidationStatus,
) -> Result<()> {
    let api: Api<CacheInvalidation> =
        Api::namespaced(client.clone(), &inv.namespace().unwrap_or_default());
    let patch = json!({
        "apiVersion": "flightcache.dev/v1alpha1",
        "kind": "CacheInvalidation",
        "status": status,
    });
    api.patch_status(
        &inv.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
    .map_err(|source| Error::Status {
        name: inv.name_any(),
        source,
    })
}

async fn delete(ctx: &Context, namespace: &str, name: &str) -> Result<()> {
    ctx.still_leading()?;
    let api: Api<CacheInvalidation> = Api::namespaced(ctx.client.clone(), namespace);
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            tracing::info!(
                cacheinvalidation = name,
                "deleted after ttlSecondsAfterFinished"
            );
            Ok(())
        }
        Err(kube::Error::Api(response)) if response.code == 404 => Ok(()),
        Err(source) => Err(Error::Delete {
            kind: "CacheInvalidation",
            name: name.to_owned(),
            source,
        }),
    }
}

/// Events for what changed: started, a node call failing where none had, finished.
async fn publish_transition(
    ctx: &Context,
    inv: &CacheInvalidation,
    previous: Option<&CacheInvalidationStatus>,
    status: &CacheInvalidationStatus,
) {
    let message = |status: &CacheInvalidationStatus| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == cacheinvalidation::COMPLETE)
            .map(|c| c.message.clone())
            .unwrap_or_default()
    };
    if previous.and_then(|s| s.start_time.as_ref()).is_none() {
        let pools: Vec<&str> = status.pools.iter().map(|p| p.name.as_str()).collect();
        let note = if pools.is_empty() {
            format!("started: {}", message(status))
        } else {
            format!(
                "started on pools {} of CacheCluster {}",
                pools.join(", "),
                inv.spec.cluster
            )
        };
        ctx.inform(inv, "Started", note).await;
    }
    let failing = |s: &CacheInvalidationStatus| {
        s.pools
            .iter()
            .any(|p| p.pending_nodes.iter().any(|n| n.attempts > 0))
    };
    let was_failing = previous.is_some_and(failing);
    let finished_before = previous
        .and_then(|s| s.phase)
        .is_some_and(InvalidationPhase::finished);
    match status.phase {
        Some(InvalidationPhase::Complete) if !finished_before => {
            ctx.metrics.invalidation_finished("Complete");
            let note = format!(
                "removed {} entries: {}",
                status.removed,
                invalidation_plan::removed_per_pool(&status.pools)
            );
            ctx.inform(inv, "Invalidated", note).await;
        }
        Some(InvalidationPhase::Failed) if !finished_before => {
            ctx.metrics.invalidation_finished("Failed");
            let note = format!("deadline passed: {}", message(status));
            ctx.warn(inv, Warning::DeadlineExceeded, &note).await;
        }
        Some(InvalidationPhase::Running) if failing(status) && !was_failing => {
            let note = format!("retrying: {}", message(status));
            ctx.warn(inv, Warning::NodesPending, &note).await;
        }
        _ => {}
    }
}

/// Every failure retries: the deadline, not the error, ends an invalidation.
pub fn error_policy(_inv: Arc<CacheInvalidation>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_failed(err.category());
    tracing::warn!(error = %crate::chain(err), category = err.category(), "CacheInvalidation pass failed");
    Action::requeue(ERROR_REQUEUE)
}

/// Runs a controller for each of `namespaces` (all namespaces when empty) until
/// SIGTERM/Ctrl-C.
///
/// # Errors
/// The first controller that cannot start.
pub async fn run_all(ctx: Arc<Context>, namespaces: &[String]) -> anyhow::Result<()> {
    crate::context::for_each_namespace(namespaces, |namespace| {
        let ctx = Arc::clone(&ctx);
        async move { run(ctx, namespace.as_deref()).await }
    })
    .await
}

/// Runs the controller over one namespace, or all, until SIGTERM/Ctrl-C.
///
/// # Errors
/// When the CacheInvalidation CRD is not installed or may not be listed.
pub async fn run(ctx: Arc<Context>, watch_namespace: Option<&str>) -> anyhow::Result<()> {
    let api: Api<CacheInvalidation> = match watch_namespace {
        Some(namespace) => Api::namespaced(ctx.client.clone(), namespace),
        None => Api::all(ctx.client.clone()),
    };
    if let Err(err) = api.list(&ListParams::default().limit(1)).await {
        anyhow::bail!(
            "cannot list CacheInvalidations ({err}); is the CRD installed (charts/flightcache/crds) and may this service account list them?"
        );
    }
    tracing::info!(namespace = ?watch_namespace, "CacheInvalidation controller running");
    Controller::new(api, watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "CacheInvalidation pass did not complete");
            }
        })
        .await;
    tracing::info!("CacheInvalidation controller stopped");
    Ok(())
}
