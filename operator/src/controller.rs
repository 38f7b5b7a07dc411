//! The reconcile loop: observe → validate → build → apply → rollout step → status.
//!
//! Level-triggered and idempotent: desired state comes from the current object only,
//! and a second pass over an unchanged object changes nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crds::admin::AdminAction;
use crds::cachecluster::{CacheCluster, CacheClusterStatus, NodeStatus, PoolStatus};
use crds::node_config::{MemberState, NodeConfig, NodeDocument, Topology};
use futures::StreamExt;
use futures::future::join_all;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{Controller, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::build::{self, PoolLayout, names};
use crate::error::{Error, Result};
use crate::metrics::{Metrics, PoolFigures, PoolLabels};
use crate::nodes::NodeAdmin;
use crate::observe::{self, Observed};
use crate::plan::{self, NodeView, Phase, PoolObservation, PoolPlan, Step};
use crate::status::{self, Outcome};
use crate::validate::{self, Defaults, ValidatedCluster};
use crate::{apply, ring, rollout};

/// How soon to look again while a pool changes (each pass takes one step).
const ROLLOUT_REQUEUE: Duration = Duration::from_secs(2);
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
    /// False once the API server refused a pod resize: memory changes then restart.
    pub resize_supported: std::sync::atomic::AtomicBool,
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
            resize_supported: std::sync::atomic::AtomicBool::new(true),
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
    let token = match &cluster.auth {
        Some((secret, key)) => {
            Some(observe::read_token(&ctx.client, &namespace, secret, key).await?)
        }
        None => None,
    };
    let admin = NodeAdmin::new(i32::from(cluster.port), token);
    let plans = plan_pools(
        &cluster,
        &observed,
        &admin,
        cc.status.as_ref(),
        ctx.resize_supported.load(Ordering::Relaxed),
    )
    .await;
    let layouts: Vec<PoolLayout> = plans.iter().map(|(plan, _)| plan.layout.clone()).collect();
    let desired = build::desired_resources(&cluster, &layouts);
    if let Err(err) = apply::apply_all(&ctx.client, &namespace, &desired).await {
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
    if apply::reconcile_service_monitor(&ctx.client, &cluster).await?
        == apply::ServiceMonitorOutcome::Unavailable
    {
        ctx.publish(
            &cc,
            EventType::Warning,
            "ServiceMonitorUnavailable",
            "spec.monitoring.serviceMonitor is on, but this cluster has no monitoring.coreos.com \
             ServiceMonitor resource (install the prometheus-operator CRDs); the nodes' metrics \
             port is still served"
                .into(),
        )
        .await;
    }
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
    run_steps(&ctx, &cc, &cluster, &admin, &plans).await?;
    record_pool_metrics(&ctx.metrics, &cluster, &plans);
    let pools = pool_statuses(&cluster, &plans, cc.status.as_ref());
    let rolling_out = plans.iter().any(|(plan, _)| plan.rolling_out());
    let progressing = plans.iter().any(|(plan, _)| plan.progressing());
    let status = status::compute(
        cc.status.as_ref(),
        cc.metadata.generation,
        &Outcome::Reconciled { pools, rolling_out },
        &now(),
    );
    if cc.status.as_ref() != Some(&status) {
        status::apply_status(&ctx.client, &cc, &status).await?;
    }
    Ok(Action::requeue(if progressing {
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

/// Per pool: what each node runs, and the plan of this pass (ring, StatefulSet size,
/// node calls).
async fn plan_pools(
    cluster: &ValidatedCluster,
    observed: &Observed,
    admin: &NodeAdmin,
    previous: Option<&CacheClusterStatus>,
    resize_supported: bool,
) -> Vec<(PoolPlan, PoolObservation)> {
    let mut plans = Vec::with_capacity(cluster.pools.len());
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
                    ordinal: ring::ordinal_of(&name)?,
                    ready: rollout::is_ready(pod),
                    current_template: rollout::template_hash_of(pod)
                        == Some(template_hash.as_str())
                        && !memory_stuck,
                    ip: pod_ip(pod),
                    report,
                    ready_seconds: rollout::ready_seconds(pod, &now()),
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
        plans.push((plan::plan_pool(cluster, pool, &observation), observation));
    }
    plans
}

fn pod_ip(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .pod_ip
        .clone()
        .filter(|ip| !ip.is_empty())
}

/// Runs the node calls of each pool's plan, in order; a failed call ends that pool's
/// pass (the next pass plans again from what the nodes then report).
async fn run_steps(
    ctx: &Context,
    cc: &CacheCluster,
    cluster: &ValidatedCluster,
    admin: &NodeAdmin,
    plans: &[(PoolPlan, PoolObservation)],
) -> Result<()> {
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &cluster.namespace);
    for (pool, (plan, observation)) in cluster.pools.iter().zip(plans) {
        let topology = &plan.layout.topology;
        if observation
            .previous
            .as_ref()
            .is_some_and(|p| p.version != topology.version)
        {
            ctx.publish(
                cc,
                EventType::Normal,
                "RingChanged",
                format!(
                    "pool {}: ring version {} ({})",
                    pool.name,
                    topology.version,
                    describe_ring(topology)
                ),
            )
            .await;
        }
        'steps: for step in &plan.steps {
            match step {
                Step::PushRing(targets) => {
                    let doc = NodeDocument {
                        config: NodeConfig::default(),
                        topology: Some(topology.clone()),
                    };
                    let results =
                        join_all(targets.iter().map(|(_, ip)| admin.configure(ip, &doc))).await;
                    let mut failed = false;
                    for ((name, _), result) in targets.iter().zip(results) {
                        if let Err(err) = result {
                            tracing::warn!(pod = %name, error = %crate::chain(&err), "ring push failed");
                            ctx.metrics.node_call_failed(AdminAction::Configure);
                            failed = true;
                        }
                    }
                    if failed {
                        break 'steps;
                    }
                }
                Step::Rebalance(name, ip) => match admin.rebalance(ip).await {
                    Ok(moved) => {
                        ctx.metrics
                            .pools
                            .rebalanced(&pool_labels(cluster, &pool.name), moved.moved);
                        tracing::info!(pod = %name, moved = moved.moved, bytes = moved.moved_bytes, failed = moved.failed, kept = moved.kept, "rebalanced");
                        if moved.moved > 0 || moved.failed > 0 {
                            ctx.publish(
                                cc,
                                EventType::Normal,
                                "HandedOff",
                                format!(
                                    "{name} handed {} entries ({} bytes) to their owners; {} failed",
                                    moved.moved, moved.moved_bytes, moved.failed
                                ),
                            )
                            .await;
                        }
                        if moved.failed > 0 {
                            break 'steps;
                        }
                    }
                    Err(err) => {
                        tracing::warn!(pod = %name, error = %crate::chain(&err), "rebalance failed");
                        ctx.metrics.node_call_failed(AdminAction::Rebalance);
                        break 'steps;
                    }
                },
                Step::Evict(name) => match pods_api.evict(name, &EvictParams::default()).await {
                    Ok(_) => {
                        ctx.publish(
                            cc,
                            EventType::Normal,
                            "RestartingNode",
                            format!("restarting {name} to apply the new pod template"),
                        )
                        .await;
                    }
                    // 429: the PDB does not allow it right now; try again shortly.
                    Err(kube::Error::Api(status)) if status.code == 429 || status.code == 404 => {
                        break 'steps;
                    }
                    Err(source) => {
                        return Err(Error::Rollout {
                            name: name.clone(),
                            source,
                        });
                    }
                },
                Step::Resize(name) => {
                    let (limit, request) = build::statefulset::memory_quantities(pool);
                    let patch = serde_json::json!({"spec": {"containers": [{
                        "name": rollout::NODE_CONTAINER,
                        "resources": {"limits": {"memory": limit}, "requests": {"memory": request}},
                    }]}});
                    match pods_api
                        .patch_subresource(
                            "resize",
                            name,
                            &PatchParams::default(),
                            &Patch::Strategic(&patch),
                        )
                        .await
                    {
                        Ok(_) => {
                            ctx.publish(
                                cc,
                                EventType::Normal,
                                "ResizingNode",
                                format!("resizing {name} in place to memory limit {limit}"),
                            )
                            .await;
                        }
                        // No resize subresource (a cluster older than 1.33): restart instead.
                        Err(kube::Error::Api(status))
                            if status.code == 404 || status.code == 405 =>
                        {
                            tracing::warn!(pod = %name, "pod resize is not available; memory changes restart nodes with handoff");
                            ctx.resize_supported.store(false, Ordering::Relaxed);
                            break 'steps;
                        }
                        Err(source) => {
                            return Err(Error::Rollout {
                                name: name.clone(),
                                source,
                            });
                        }
                    }
                }
                Step::PushConfig(name, ip) | Step::PushBudget(name, ip) => {
                    let mut config = build::configmap::compute_live_config(cluster, pool);
                    if matches!(step, Step::PushBudget(..)) {
                        let full = build::configmap::compute_node_config(cluster, pool);
                        config.memory_budget = full.memory_budget;
                        config.max_entry_size = full.max_entry_size;
                    }
                    let doc = NodeDocument {
                        config,
                        topology: None,
                    };
                    match admin.configure(ip, &doc).await {
                        Ok(applied) => {
                            tracing::info!(pod = %name, generation = applied.generation, "pushed live config");
                            ctx.publish(
                                cc,
                                EventType::Normal,
                                "NodeConfigured",
                                format!("{name} runs config generation {}", applied.generation),
                            )
                            .await;
                        }
                        Err(err) => {
                            tracing::warn!(pod = %name, error = %crate::chain(&err), "config push failed");
                            ctx.metrics.node_call_failed(AdminAction::Configure);
                            break 'steps;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Sets the per-pool series of `cluster` and drops those of its removed pools.
fn record_pool_metrics(
    metrics: &Metrics,
    cluster: &ValidatedCluster,
    plans: &[(PoolPlan, PoolObservation)],
) {
    for (pool, (plan, observation)) in cluster.pools.iter().zip(plans) {
        let figures = PoolFigures::compute(pool, cluster.generation, plan, observation);
        metrics
            .pools
            .record(&pool_labels(cluster, &pool.name), &figures);
    }
    let wanted: BTreeSet<String> = cluster.pools.iter().map(|p| p.name.clone()).collect();
    metrics
        .pools
        .retain_pools(&cluster.namespace, &cluster.name, &wanted);
}

fn pool_labels(cluster: &ValidatedCluster, pool: &str) -> PoolLabels {
    PoolLabels {
        namespace: cluster.namespace.clone(),
        cachecluster: cluster.name.clone(),
        pool: pool.to_owned(),
    }
}

fn describe_ring(topology: &Topology) -> String {
    topology
        .members
        .iter()
        .map(|m| match m.state {
            MemberState::Active => m.id.clone(),
            MemberState::Joining => format!("{} joining", m.id),
            MemberState::Draining => format!("{} draining", m.id),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The status of each pool from its plan and what its nodes reported.
fn pool_statuses(
    cluster: &ValidatedCluster,
    plans: &[(PoolPlan, PoolObservation)],
    previous: Option<&CacheClusterStatus>,
) -> Vec<PoolStatus> {
    let target = cluster.generation;
    cluster
        .pools
        .iter()
        .zip(plans)
        .map(|(pool, (plan, observation))| {
            let in_pool = |n: &&NodeView| n.ordinal < pool.shards;
            let at_target = |n: &NodeView| {
                n.report
                    .is_some_and(|r| i64::try_from(r.generation).unwrap_or(0) >= target)
            };
            let nodes_in_pool = || observation.nodes.iter().filter(in_pool);
            let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
            PoolStatus {
                name: pool.name.clone(),
                shards: pool.shards,
                ready_shards: count(nodes_in_pool().filter(|n| n.ready).count()),
                config_generation: target,
                updated_shards: count(
                    nodes_in_pool()
                        .filter(|n| n.ready && n.current_template && at_target(n))
                        .count(),
                ),
                configured_shards: count(nodes_in_pool().filter(|n| at_target(n)).count()),
                ring_version: i64::try_from(plan.layout.topology.version).unwrap_or(i64::MAX),
                endpoint: Some(names::client_endpoint(
                    &cluster.name,
                    &pool.name,
                    &cluster.namespace,
                    cluster.port,
                )),
                phase: Some(describe_phase(&plan.phase)),
                memory_resize: {
                    let resizing = observation
                        .nodes
                        .iter()
                        .any(|n| n.memory_limit.is_some_and(|l| l != pool.memory_limit_bytes));
                    if resizing {
                        // Nodes whose memory cannot change in place are marked outdated.
                        let restarting = observation.nodes.iter().any(|n| {
                            n.memory_limit.is_some_and(|l| l != pool.memory_limit_bytes)
                                && !n.current_template
                        });
                        Some(
                            if restarting {
                                "RestartWithHandoff"
                            } else {
                                "InPlace"
                            }
                            .into(),
                        )
                    } else {
                        previous
                            .and_then(|s| s.pools.iter().find(|p| p.name == pool.name))
                            .and_then(|p| p.memory_resize.clone())
                    }
                },
                nodes: observation
                    .nodes
                    .iter()
                    .map(|n| NodeStatus {
                        name: n.name.clone(),
                        ready: n.ready,
                        state: plan
                            .layout
                            .topology
                            .members
                            .iter()
                            .find(|m| m.id == n.name)
                            .map(|m| {
                                match m.state {
                                    MemberState::Active => "active",
                                    MemberState::Joining => "joining",
                                    MemberState::Draining => "draining",
                                }
                                .to_owned()
                            }),
                        config_generation: n
                            .report
                            .map(|r| i64::try_from(r.generation).unwrap_or(0)),
                        ring_version: n.report.map(|r| i64::try_from(r.ring_version).unwrap_or(0)),
                        entries: n.report.map(|r| i64::try_from(r.entries).unwrap_or(0)),
                        current_template: n.current_template,
                    })
                    .collect(),
            }
        })
        .collect()
}

fn describe_phase(phase: &Phase) -> String {
    match phase {
        Phase::Settled => "Settled".into(),
        Phase::WaitingForNodes => "WaitingForNodes".into(),
        Phase::Configuring => "Configuring".into(),
        Phase::Resizing(node) => format!("Resizing {node}"),
        Phase::Restarting(node) => format!("Restarting {node}"),
        Phase::ScalingOut(nodes) => format!("ScalingOut {}", nodes.join(",")),
        Phase::ScalingIn(nodes) => format!("ScalingIn {}", nodes.join(",")),
    }
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
    let metrics = Arc::clone(&ctx.metrics);
    tracing::info!(namespace = ?watch_namespace, "controller running");
    Controller::new(clusters, watcher::Config::default())
        .owns(statefulsets, owned.clone())
        .owns(services, owned.clone())
        .owns(configmaps, owned.clone())
        .owns(pdbs, owned)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            let metrics = Arc::clone(&metrics);
            async move {
                match result {
                    Ok((object, _)) => tracing::debug!(cachecluster = %object.name, "reconciled"),
                    // A deleted CacheCluster: its per-pool series go with it.
                    Err(kube::runtime::controller::Error::ObjectNotFound(object)) => {
                        metrics.pools.forget_cluster(
                            object.namespace.as_deref().unwrap_or_default(),
                            &object.name,
                        );
                    }
                    Err(err) => tracing::debug!(error = %err, "reconcile did not complete"),
                }
            }
        })
        .await;
    tracing::info!("controller stopped");
    Ok(())
}
