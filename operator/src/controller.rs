//! The reconcile loop: observe (Kubernetes objects, then node reports) → validate →
//! plan → node loss (pods on lost Kubernetes nodes) → build → apply → execute (node
//! calls) → status. Each step is a module; this one wires them and publishes events on
//! transitions.
//!
//! Level-triggered and idempotent: desired state comes from the current object only,
//! and a second pass over an unchanged object changes nothing.
//!
//! Owns: the order of a pass, the events of what apply changed and of failures (each
//! gated on a transition), and the error policy. It may import every step; no step
//! imports it (the state they share, [`Context`], is `context`'s).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crds::cachecluster::{CacheCluster, CacheClusterStatus};
use crds::conditions::{self, reasons};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::build::{self, PoolLayout, names};
use crate::context::{Context, NodeAccess};
use crate::error::{Error, Result};
use crate::metrics::{Metrics, PoolFigures, PoolLabels};
use crate::nodeloss;
use crate::nodes::NodeAdmin;
use crate::observe::{self, Observed};
use crate::plan::{self, PoolObservation, PoolPlan};
use crate::secrets;
use crate::status::{self, Outcome};
use crate::tls_rollout::NextCopy;
use crate::validate::{self, ValidatedCluster};
use crate::warnings::Warning;
use crate::{apply, execute};

/// How soon to look again while a pool changes (each pass takes one step).
const ROLLOUT_REQUEUE: Duration = Duration::from_secs(2);
/// The next pass while the nodes' TLS copy moves: the nodes re-read their TLS files every
/// 5 s once the kubelet has updated them.
const TLS_STEP_REQUEUE: Duration = Duration::from_secs(5);
/// Periodic resync when nothing is in flight (owned objects also wake us). Shortened
/// while the Nodes' heartbeat Leases can be read, to look again when the stalest one
/// would turn lost (`nodeloss::next_check`): nothing the operator watches changes when a
/// node goes silent.
const IDLE_REQUEUE: Duration = Duration::from_secs(300);
/// Retry delay after a transient failure.
const ERROR_REQUEUE: Duration = Duration::from_secs(10);

/// One reconcile pass of `cc`: the pipeline, each stage a function below.
///
/// # Errors
/// The step that failed; an invalid spec is reported in status first.
#[tracing::instrument(skip_all, fields(cachecluster = %cc.name_any(), namespace = ?cc.namespace(), generation = ?cc.metadata.generation))]
pub async fn reconcile(cc: Arc<CacheCluster>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_started();
    ctx.still_leading()?;
    let observed = observe_children(&ctx, &cc).await?;
    let cluster = validate_spec(&ctx, &cc).await?;
    let access = node_admin_or_degraded(&ctx, &cc, &cluster).await?;
    let (admin, renewal_in) = (&access.admin, access.renewal_in);
    let (plans, tls_reports) = plan_pools(&ctx, &cc, &cluster, &observed, admin).await;
    let tls_moving =
        advance_node_tls(&ctx, &cc, &cluster, access.node_tls.as_ref(), &tls_reports).await?;
    let node_loss = act_on_node_loss(&ctx, &cc, &observed).await?;
    apply_children(&ctx, &cc, &cluster, &observed, &plans).await?;
    ctx.still_leading()?;
    execute::run_steps(&ctx, &cc, &cluster, admin, &plans).await?;
    record_pool_metrics(&ctx.metrics, &cluster, &plans);
    publish_status(&ctx, &cc, &cluster, &plans).await?;
    let next = next_pass_in(&plans, &node_loss, &observed);
    // A phase of the nodes' TLS waits for the nodes to load the one before.
    let next = if tls_moving {
        next.min(TLS_STEP_REQUEUE)
    } else {
        next
    };
    // An issued certificate is renewed on the pass after it is due.
    Ok(Action::requeue(
        renewal_in.map_or(next, |due| next.min(due)),
    ))
}

/// The cluster's children and pods as they are, owned by `cc`.
async fn observe_children(ctx: &Context, cc: &CacheCluster) -> Result<Observed> {
    let namespace = cc.namespace().unwrap_or_default();
    let owner_uid = cc.metadata.uid.clone().unwrap_or_default();
    observe::observe(
        &ctx.client,
        &namespace,
        &cc.name_any(),
        &owner_uid,
        &ctx.node_read_warnings,
    )
    .await
}

/// The spec, validated; an invalid one is reported (status and a Warning event) and
/// ends the pass.
async fn validate_spec(ctx: &Context, cc: &CacheCluster) -> Result<ValidatedCluster> {
    match validate::validate(cc, &ctx.defaults) {
        Ok(cluster) => Ok(cluster),
        Err(invalid) => {
            let message = invalid.to_string();
            let outcome = Outcome::InvalidSpec(message.clone());
            let event = (Warning::InvalidSpec, message);
            report_failure(ctx, cc, &outcome, event, Publish::Always).await?;
            Err(Error::InvalidSpec(invalid))
        }
    }
}

/// The client for the cluster's nodes. A generated Secret that cannot be made or used
/// (say, one of that name not owned by this cluster) blocks every node call: Degraded,
/// with the reason.
async fn node_admin_or_degraded(
    ctx: &Context,
    cc: &CacheCluster,
    cluster: &ValidatedCluster,
) -> Result<NodeAccess> {
    match ctx.node_admin(cluster).await {
        Ok(admin) => Ok(admin),
        Err(err) => {
            let message = crate::chain(&err);
            let outcome = Outcome::ApplyFailed(message.clone());
            let event = (Warning::SecretFailed, message);
            report_failure(ctx, cc, &outcome, event, Publish::WhenNew).await?;
            Err(err)
        }
    }
}

/// What each pool's nodes report, and each pool's plan for this pass.
async fn plan_pools(
    ctx: &Context,
    cc: &CacheCluster,
    cluster: &ValidatedCluster,
    observed: &Observed,
    admin: &NodeAdmin,
) -> (Vec<(PoolPlan, PoolObservation)>, observe::TlsReports) {
    let resize_supported = ctx.resize_supported.load(Ordering::Relaxed);
    let (observations, tls_reports) = observe::observe_pools(
        cluster,
        observed,
        admin,
        cc.status.as_ref(),
        resize_supported,
    )
    .await;
    let plans = cluster
        .pools
        .iter()
        .zip(observations)
        .map(|(pool, observation)| (plan::plan_pool(cluster, pool, &observation), observation))
        .collect();
    (plans, tls_reports)
}

/// The nodes' copy of the TLS Secret moved one phase on when they are ready for it
/// (`tls_rollout`); each phase written is said in a `RotatingCertificates` event.
/// Returns whether the copy is still on its way.
async fn advance_node_tls(
    ctx: &Context,
    cc: &CacheCluster,
    cluster: &ValidatedCluster,
    node_tls: Option<&secrets::NodeTlsCopy>,
    reports: &observe::TlsReports,
) -> Result<bool> {
    let Some(node_tls) = node_tls else {
        return Ok(false);
    };
    ctx.still_leading()?;
    Ok(
        match secrets::advance_node_tls(&ctx.client, cluster, node_tls, reports).await? {
            NextCopy::Settled => false,
            NextCopy::Write(_, note) => {
                ctx.inform(cc, "RotatingCertificates", note).await;
                true
            }
            NextCopy::Wait(note) => {
                tracing::info!(%note, "the nodes' TLS copy waits");
                true
            }
        },
    )
}

/// Pods on lost Kubernetes nodes leave the Services (and, past the bound, the node)
/// before anything slower runs; the plans already took them out of the ring.
async fn act_on_node_loss(
    ctx: &Context,
    cc: &CacheCluster,
    observed: &Observed,
) -> Result<nodeloss::NodeLossPlan> {
    let node_loss = nodeloss::plan_node_loss(&observed.pods, &observed.node_health);
    if node_loss.any() {
        ctx.still_leading()?;
        let namespace = cc.namespace().unwrap_or_default();
        execute::run_node_loss(ctx, cc, &namespace, &node_loss).await;
    }
    Ok(node_loss)
}

/// The desired children, built from the plans' layouts and applied; what changed is
/// published, a failure reported.
async fn apply_children(
    ctx: &Context,
    cc: &CacheCluster,
    cluster: &ValidatedCluster,
    observed: &Observed,
    plans: &[(PoolPlan, PoolObservation)],
) -> Result<()> {
    let layouts: Vec<PoolLayout> = plans.iter().map(|(plan, _)| plan.layout.clone()).collect();
    let desired = build::desired_resources(cluster, &layouts);
    ctx.still_leading()?;
    match apply::apply_cluster(&ctx.client, cluster, &desired).await {
        Ok(applied) => {
            report_applied(ctx, cc, cluster, observed, &applied).await;
            Ok(())
        }
        Err(failed) => Err(report_apply_failure(ctx, cc, failed).await?),
    }
}

/// The status of a pass that reached the end, written when it differs.
async fn publish_status(
    ctx: &Context,
    cc: &CacheCluster,
    cluster: &ValidatedCluster,
    plans: &[(PoolPlan, PoolObservation)],
) -> Result<()> {
    let now = crate::clock::now();
    let outcome = Outcome::Reconciled {
        pools: status::pool_statuses(cluster, plans, cc.status.as_ref(), &now),
        phases: plans.iter().map(|(plan, _)| plan.phase.clone()).collect(),
    };
    let mut status = status::compute(cc.status.as_ref(), cc.metadata.generation, &outcome, &now);
    status.client_token_secret = cluster
        .client_token
        .as_ref()
        .map(|token| format!("{}/{}", token.secret, token.key));
    status.ca_secret = cluster
        .tls_issued
        .map(|_| crate::build::names::issued_ca_secret(&cluster.name));
    if cc.status.as_ref() != Some(&status) {
        ctx.still_leading()?;
        apply::apply_status(&ctx.client, cc, &status).await?;
    }
    Ok(())
}

/// When to look again: soon while a pool changes or a node is lost, else at the idle
/// resync or when the stalest Node heartbeat would turn lost, whichever comes first.
fn next_pass_in(
    plans: &[(PoolPlan, PoolObservation)],
    node_loss: &nodeloss::NodeLossPlan,
    observed: &Observed,
) -> Duration {
    let progressing = plans.iter().any(|(plan, _)| plan.progressing());
    if progressing || node_loss.any() {
        return ROLLOUT_REQUEUE;
    }
    nodeloss::next_check(observed.node_health.values()).map_or(IDLE_REQUEUE, |seconds| {
        IDLE_REQUEUE.min(Duration::from_secs(seconds))
    })
}

/// Whether a failure's Warning event goes out on every pass or once per failure.
enum Publish {
    Always,
    /// Once per failure, not on every retry while it lasts ([`degraded_is_new`]).
    WhenNew,
}

/// A failed pass reported: its status (`Degraded`) written, and its Warning event
/// (reason, note) published as `publish` says.
async fn report_failure(
    ctx: &Context,
    cc: &CacheCluster,
    outcome: &Outcome,
    (warning, message): (Warning, String),
    publish: Publish,
) -> Result<()> {
    let status = status::compute(
        cc.status.as_ref(),
        cc.metadata.generation,
        outcome,
        &crate::clock::now(),
    );
    apply::apply_status(&ctx.client, cc, &status).await?;
    let degraded_reason = match outcome {
        Outcome::InvalidSpec(_) => reasons::INVALID_SPEC,
        _ => reasons::APPLY_FAILED,
    };
    let news = match publish {
        Publish::Always => true,
        Publish::WhenNew => degraded_is_new(cc.status.as_ref(), degraded_reason, &message),
    };
    if news {
        ctx.warn(cc, warning, &message).await;
    }
    Ok(())
}

/// Reports a failed apply (in status when the pools' own objects failed) and returns
/// the error that ends the pass.
async fn report_apply_failure(
    ctx: &Context,
    cc: &CacheCluster,
    failed: apply::ApplyFailed,
) -> Result<Error> {
    if failed.children {
        let message = crate::chain(&failed.error);
        let outcome = Outcome::ApplyFailed(message.clone());
        let event = (Warning::ApplyFailed, message);
        report_failure(ctx, cc, &outcome, event, Publish::WhenNew).await?;
    }
    Ok(failed.error)
}

/// Events for what the apply step changed. They fire on transitions only: the
/// ServiceMonitor becoming unavailable, a pool created, its desired size changed since
/// the last status, a pool removed.
async fn report_applied(
    ctx: &Context,
    cc: &CacheCluster,
    cluster: &ValidatedCluster,
    observed: &Observed,
    applied: &apply::Applied,
) {
    let unavailable = applied.service_monitor == apply::ServiceMonitorOutcome::Unavailable;
    let namespace = cc.namespace().unwrap_or_default();
    if ctx
        .monitors_unavailable
        .began(&namespace, &cluster.name, unavailable)
    {
        ctx.warn(
            cc,
            Warning::ServiceMonitorUnavailable,
            "spec.monitoring.serviceMonitor is on, but this cluster has no monitoring.coreos.com \
             ServiceMonitor resource",
        )
        .await;
    }
    if ctx
        .plaintext_kept
        .began(&namespace, &cluster.name, cluster.plaintext_kept)
    {
        ctx.warn(
            cc,
            Warning::PlaintextKept,
            "spec.tls is unset, which now means TLS, but an earlier operator served this \
             cluster in plaintext (status shows grpc:// endpoints); it stays plaintext so its \
             clients keep working",
        )
        .await;
    }
    for pool in &cluster.pools {
        match observed.statefulset(&cluster.name, &pool.name) {
            None => {
                let note = format!("created pool {} with {} nodes", pool.name, pool.shards);
                ctx.inform(cc, "PoolCreated", note).await;
            }
            Some(sts) => {
                let before = scaled_from(cc.status.as_ref(), &pool.name, sts);
                if before != pool.shards {
                    let note = format!(
                        "scaled pool {} from {before} to {} nodes",
                        pool.name, pool.shards
                    );
                    ctx.inform(cc, "PoolScaled", note).await;
                }
            }
        }
    }
    for pool in &applied.removed_pools {
        ctx.inform(
            cc,
            "PoolRemoved",
            format!("removed pool {pool} and its nodes"),
        )
        .await;
    }
}

/// Whether a failed pass's `Degraded=True` (`reason`, `message`) is news: the status the
/// pass started from does not already say exactly that. A failure that repeats on every
/// retry is published once, and again when its reason or message changes.
fn degraded_is_new(previous: Option<&CacheClusterStatus>, reason: &str, message: &str) -> bool {
    !previous.is_some_and(|status| {
        status.conditions.iter().any(|c| {
            c.type_ == conditions::DEGRADED
                && c.status == "True"
                && c.reason == reason
                && c.message == message
        })
    })
}

/// The pool size a scale starts from: the desired shards the last status recorded (so a
/// scale-in that drains over many passes is reported once), else the StatefulSet's.
fn scaled_from(previous: Option<&CacheClusterStatus>, pool: &str, sts: &StatefulSet) -> i32 {
    previous
        .and_then(|status| status.pools.iter().find(|p| p.name == pool))
        .map(|p| p.shards)
        .or_else(|| sts.spec.as_ref().and_then(|s| s.replicas))
        .unwrap_or(0)
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
            .record(&PoolLabels::of(cluster, &pool.name), &figures);
    }
    let wanted: BTreeSet<String> = cluster.pools.iter().map(|p| p.name.clone()).collect();
    metrics
        .pools
        .retain_pools(&cluster.namespace, &cluster.name, &wanted);
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

/// Runs a controller for each of `namespaces` (all namespaces when empty) until
/// SIGTERM/Ctrl-C: with a list, every watch and call stays inside those namespaces, so
/// namespaced RoleBindings are all the operator needs.
///
/// # Errors
/// The first controller that cannot start (the CRD not installed, no rights in a
/// namespace).
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
    let events_ctx = Arc::clone(&ctx);
    tracing::info!(namespace = ?watch_namespace, "controller running");
    Controller::new(clusters, watcher::Config::default())
        .owns(statefulsets, owned.clone())
        .owns(services, owned.clone())
        .owns(configmaps, owned.clone())
        .owns(pdbs, owned)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            let ctx = Arc::clone(&events_ctx);
            async move {
                match result {
                    Ok((object, _)) => tracing::debug!(cachecluster = %object.name, "reconciled"),
                    // A deleted CacheCluster: its per-pool series and event memory go
                    // with it.
                    Err(kube::runtime::controller::Error::ObjectNotFound(object)) => {
                        let namespace = object.namespace.as_deref().unwrap_or_default();
                        ctx.metrics.pools.forget_cluster(namespace, &object.name);
                        ctx.monitors_unavailable.forget(namespace, &object.name);
                        ctx.plaintext_kept.forget(namespace, &object.name);
                    }
                    Err(err) => tracing::debug!(error = %err, "reconcile did not complete"),
                }
            }
        })
        .await;
    tracing::info!("controller stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use crds::cachecluster::PoolStatus;
    use k8s_openapi::api::apps::v1::StatefulSetSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn statefulset(replicas: i32) -> StatefulSet {
        StatefulSet {
            spec: Some(StatefulSetSpec {
                replicas: Some(replicas),
                ..StatefulSetSpec::default()
            }),
            ..StatefulSet::default()
        }
    }

    fn status_with(pool: &str, shards: i32) -> CacheClusterStatus {
        CacheClusterStatus {
            pools: vec![PoolStatus {
                name: pool.into(),
                shards,
                ready_shards: shards,
                config_generation: 1,
                updated_shards: shards,
                configured_shards: shards,
                ring_version: 1,
                endpoint: None,
                phase: None,
                memory_resize: None,
                message: None,
                usage: None,
                nodes: Vec::new(),
            }],
            ..CacheClusterStatus::default()
        }
    }

    #[test]
    fn a_scale_in_that_drains_over_many_passes_is_reported_once() {
        // Pass 1: the spec went from 5 to 3 shards; the status still says 5.
        let before = status_with("hot", 5);
        assert_eq!(scaled_from(Some(&before), "hot", &statefulset(5)), 5);
        // Later passes: the status says 3 while the StatefulSet keeps 5 pods draining.
        let after = status_with("hot", 3);
        assert_eq!(scaled_from(Some(&after), "hot", &statefulset(5)), 3);
    }

    #[test]
    fn without_a_recorded_pool_the_statefulset_size_counts() {
        assert_eq!(scaled_from(None, "hot", &statefulset(4)), 4);
        assert_eq!(
            scaled_from(Some(&status_with("cold", 2)), "hot", &statefulset(4)),
            4
        );
    }

    /// The status a failed pass leaves: Degraded with `message`, as `status::compute`
    /// writes it.
    fn degraded(message: &str) -> CacheClusterStatus {
        status::compute(
            None,
            Some(1),
            &Outcome::ApplyFailed(message.into()),
            &Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        )
    }

    #[test]
    fn apply_failed_is_published_when_the_failure_starts_not_on_its_retries() {
        let message = "cannot apply StatefulSet demo-hot: forbidden";
        // The transition: the last status was healthy (or there was none).
        assert!(degraded_is_new(None, reasons::APPLY_FAILED, message));
        assert!(degraded_is_new(
            Some(&status_with("hot", 3)),
            reasons::APPLY_FAILED,
            message
        ));
        // The retry: the status already says exactly this.
        assert!(!degraded_is_new(
            Some(&degraded(message)),
            reasons::APPLY_FAILED,
            message
        ));
        // A different failure is news again.
        assert!(degraded_is_new(
            Some(&degraded(message)),
            reasons::APPLY_FAILED,
            "cannot apply Service demo-hot: forbidden"
        ));
    }

    #[test]
    fn secret_failed_is_published_when_the_failure_starts_not_on_its_retries() {
        let message = "Secret demo-internal exists but is not owned by this cluster";
        assert!(degraded_is_new(None, reasons::APPLY_FAILED, message));
        assert!(!degraded_is_new(
            Some(&degraded(message)),
            reasons::APPLY_FAILED,
            message
        ));
        // After an apply failure, the Secret failure is a change of message: news.
        assert!(degraded_is_new(
            Some(&degraded("cannot apply StatefulSet demo-hot: forbidden")),
            reasons::APPLY_FAILED,
            message
        ));
    }
}
