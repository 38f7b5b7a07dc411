//! The reconcile loop: observe → validate → build → apply → rollout step → status.
//!
//! Level-triggered and idempotent: desired state comes from the current object only,
//! and a second pass over an unchanged object changes nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crds::cachecluster::{CacheCluster, PoolStatus};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, EvictParams, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{Controller, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::build::{self, names};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::observe::{self, Observed};
use crate::status::{self, Outcome};
use crate::validate::{self, Defaults, ValidatedCluster};
use crate::{apply, rollout};

/// How soon to look again while a rollout step is in flight.
const ROLLOUT_REQUEUE: Duration = Duration::from_secs(5);
/// Periodic resync when nothing is in flight (owned objects also wake us).
const IDLE_REQUEUE: Duration = Duration::from_secs(300);
/// Retry delay after a transient failure.
const ERROR_REQUEUE: Duration = Duration::from_secs(10);

/// Shared state of every reconcile.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Operator-wide defaults.
    pub defaults: Defaults,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Event recorder.
    pub recorder: Recorder,
}

impl Context {
    /// A context publishing events as `identity`.
    pub fn new(client: Client, defaults: Defaults, metrics: Arc<Metrics>, identity: &str) -> Self {
        let reporter = Reporter {
            controller: "flightcache-operator".into(),
            instance: Some(identity.to_owned()),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            defaults,
            metrics,
        }
    }

    async fn publish(&self, cc: &CacheCluster, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, &cc.object_ref(&())).await {
            tracing::warn!(error = %err, reason, "failed to publish event");
        }
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// One reconcile pass of `cc`.
///
/// # Errors
/// The step that failed; an invalid spec is reported in status first.
#[tracing::instrument(skip_all, fields(cachecluster = %cc.name_any(), namespace = ?cc.namespace(), generation = ?cc.metadata.generation))]
pub async fn reconcile(cc: Arc<CacheCluster>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_started();
    let namespace = cc.namespace().unwrap_or_default();
    let name = cc.name_any();
    let observed = observe::observe(&ctx.client, &namespace, &name).await?;
    let cluster = match validate::validate(&cc, &ctx.defaults) {
        Ok(cluster) => cluster,
        Err(invalid) => {
            let message = invalid.to_string();
            let status = status::compute(
                cc.status.as_ref(),
                cc.metadata.generation,
                &Outcome::InvalidSpec(message.clone()),
                &now(),
            );
            status::apply_status(&ctx.client, &cc, &status).await?;
            ctx.publish(&cc, EventType::Warning, "InvalidSpec", message)
                .await;
            return Err(Error::InvalidSpec(invalid));
        }
    };
    let desired = build::desired_resources(&cluster);
    let applied = match apply::apply_all(&ctx.client, &namespace, &desired).await {
        Ok(applied) => applied,
        Err(err) => {
            let message = crate::chain(&err);
            let status = status::compute(
                cc.status.as_ref(),
                cc.metadata.generation,
                &Outcome::ApplyFailed(message.clone()),
                &now(),
            );
            status::apply_status(&ctx.client, &cc, &status).await?;
            ctx.publish(&cc, EventType::Warning, "ApplyFailed", message)
                .await;
            return Err(err);
        }
    };
    report_pool_changes(&ctx, &cc, &cluster, &observed).await;
    let wanted: BTreeSet<String> = cluster.pools.iter().map(|p| p.name.clone()).collect();
    for pool in apply::delete_removed_pools(&ctx.client, &namespace, &name, &wanted).await? {
        ctx.publish(
            &cc,
            EventType::Normal,
            "PoolRemoved",
            format!("removed pool {pool} and its nodes"),
        )
        .await;
    }
    let (pools, rolling_out) = advance_rollouts(&ctx, &cc, &cluster, &applied, &observed).await?;
    let status = status::compute(
        cc.status.as_ref(),
        cc.metadata.generation,
        &Outcome::Reconciled { pools, rolling_out },
        &now(),
    );
    if cc.status.as_ref() != Some(&status) {
        status::apply_status(&ctx.client, &cc, &status).await?;
    }
    Ok(Action::requeue(if rolling_out {
        ROLLOUT_REQUEUE
    } else {
        IDLE_REQUEUE
    }))
}

async fn report_pool_changes(
    ctx: &Context,
    cc: &CacheCluster,
    cluster: &ValidatedCluster,
    observed: &Observed,
) {
    for pool in &cluster.pools {
        match observed.statefulset(&cluster.name, &pool.name) {
            None => {
                let note = format!("created pool {} with {} nodes", pool.name, pool.shards);
                ctx.publish(cc, EventType::Normal, "PoolCreated", note)
                    .await;
            }
            Some(sts) => {
                let before = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
                if before != pool.shards {
                    let note = format!(
                        "scaled pool {} from {before} to {} nodes",
                        pool.name, pool.shards
                    );
                    ctx.publish(cc, EventType::Normal, "PoolScaled", note).await;
                }
            }
        }
    }
}

/// Per pool: counts for status and, when the template changed and every node is
/// Ready, one node restarted through the Eviction API (so the PDB is respected).
async fn advance_rollouts(
    ctx: &Context,
    cc: &CacheCluster,
    cluster: &ValidatedCluster,
    applied: &[StatefulSet],
    observed: &Observed,
) -> Result<(Vec<PoolStatus>, bool)> {
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &cluster.namespace);
    let mut pools = Vec::with_capacity(cluster.pools.len());
    let mut rolling_out = false;
    for (pool, sts) in cluster.pools.iter().zip(applied) {
        let pods: Vec<&Pod> = observed
            .pods_of(&pool.name)
            .into_iter()
            .filter(|pod| ordinal_below(&pod.name_any(), pool.shards))
            .collect();
        let ready = pods.iter().filter(|pod| rollout::is_ready(pod)).count();
        let updated = rollout::count_updated(sts, &pods);
        if let Some(pod) = rollout::plan_restart(sts, &pods) {
            match pods_api.evict(&pod, &EvictParams::default()).await {
                Ok(_) => {
                    ctx.publish(
                        cc,
                        EventType::Normal,
                        "RestartingNode",
                        format!("restarting {pod} to apply the new pod template"),
                    )
                    .await;
                }
                // 429: the PDB does not allow it right now; try again shortly.
                Err(kube::Error::Api(status)) if status.code == 429 || status.code == 404 => {}
                Err(source) => return Err(Error::Rollout { name: pod, source }),
            }
            rolling_out = true;
        } else if updated < pods.len() {
            rolling_out = true;
        }
        pools.push(PoolStatus {
            name: pool.name.clone(),
            shards: pool.shards,
            ready_shards: i32::try_from(ready).unwrap_or(i32::MAX),
            config_generation: cluster.generation,
            updated_shards: i32::try_from(updated).unwrap_or(i32::MAX),
            ring_version: 0,
            endpoint: Some(names::client_endpoint(
                &cluster.name,
                &pool.name,
                &cluster.namespace,
                cluster.port,
            )),
        });
    }
    Ok((pools, rolling_out))
}

fn ordinal_below(pod_name: &str, shards: i32) -> bool {
    pod_name
        .rsplit('-')
        .next()
        .and_then(|n| n.parse::<i32>().ok())
        .is_some_and(|ordinal| ordinal < shards)
}

/// Invalid specs wait for the user to edit the object; everything else retries.
pub fn error_policy(_cc: Arc<CacheCluster>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_failed(err.category());
    match err {
        Error::InvalidSpec(_) => Action::await_change(),
        other => {
            tracing::warn!(error = %crate::chain(other), category = other.category(), "reconcile failed");
            Action::requeue(ERROR_REQUEUE)
        }
    }
}

/// An API over one namespace, or over all of them.
fn scoped_api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the controller until SIGTERM/Ctrl-C.
///
/// # Errors
/// When the CacheCluster CRD is not installed.
pub async fn run(ctx: Arc<Context>, watch_namespace: Option<&str>) -> anyhow::Result<()> {
    let client = ctx.client.clone();
    let clusters: Api<CacheCluster> = scoped_api(&client, watch_namespace);
    let statefulsets: Api<StatefulSet> = scoped_api(&client, watch_namespace);
    let services: Api<Service> = scoped_api(&client, watch_namespace);
    let configmaps: Api<ConfigMap> = scoped_api(&client, watch_namespace);
    let pdbs: Api<PodDisruptionBudget> = scoped_api(&client, watch_namespace);
    if let Err(err) = clusters.list(&ListParams::default().limit(1)).await {
        anyhow::bail!(
            "cannot list CacheClusters ({err}); is the CRD installed (charts/flightcache/crds) and may this service account list them?"
        );
    }
    let owned =
        watcher::Config::default().labels(&format!("app.kubernetes.io/name={}", names::APP_NAME));
    ctx.metrics.ready.store(true, Ordering::Relaxed);
    tracing::info!(namespace = ?watch_namespace, "controller running");
    Controller::new(clusters, watcher::Config::default())
        .owns(statefulsets, owned.clone())
        .owns(services, owned.clone())
        .owns(configmaps, owned.clone())
        .owns(pdbs, owned)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(cachecluster = %object.name, "reconciled"),
                Err(err) => tracing::debug!(error = %err, "reconcile did not complete"),
            }
        })
        .await;
    tracing::info!("controller stopped");
    Ok(())
}
