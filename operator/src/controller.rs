//! The reconcile loop: observe (Kubernetes objects, then node reports) → validate →
//! plan → node loss (pods on lost Kubernetes nodes) → build → apply → execute (node
//! calls) → status. Each step is a module; this one wires them and publishes events on
//! transitions.
//!
//! Level-triggered and idempotent: desired state comes from the current object only,
//! and a second pass over an unchanged object changes nothing.
//!
//! Owns: [`Context`], the order of a pass, the events of what apply changed and of
//! failures (each gated on a transition), and the error policy. It may import every
//! step; no step imports it except `execute` (for [`Context`]: client, metrics,
//! events).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crds::cachecluster::{CacheCluster, CacheClusterStatus};
use crds::conditions::{self, reasons};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{Controller, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::build::{self, PoolLayout, names};
use crate::error::{Error, Result};
use crate::metrics::{Metrics, PoolFigures, PoolLabels};
use crate::nodeloss;
use crate::nodes::{NodeAdmin, NodeTls};
use crate::observe::{self, Observed};
use crate::plan::{self, PoolObservation, PoolPlan};
use crate::status::{self, Outcome};
use crate::validate::{self, Defaults, ValidatedCluster};
use crate::{apply, execute, secrets};

/// How soon to look again while a pool changes (each pass takes one step).
const ROLLOUT_REQUEUE: Duration = Duration::from_secs(2);
/// Periodic resync when nothing is in flight (owned objects also wake us). Shortened
/// while the Nodes' heartbeat Leases can be read, to look again when the stalest one
/// would turn lost (`nodeloss::next_check`): nothing the operator watches changes when a
/// node goes silent.
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
    /// The clusters whose ServiceMonitor was unavailable on their last pass.
    monitors_unavailable: UnavailableMonitors,
    /// What reading Nodes (for ring zones) has warned about already.
    pub node_read_warnings: observe::NodeReadWarnings,
    /// With leader election: this replica's term, checked before each write of a pass.
    pub term: Option<Arc<crate::leader::Term>>,
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
            monitors_unavailable: UnavailableMonitors::default(),
            node_read_warnings: observe::NodeReadWarnings::default(),
            term: None,
        }
    }

    /// This context, acting only within `term` (leader election).
    #[must_use]
    pub fn with_term(mut self, term: Arc<crate::leader::Term>) -> Self {
        self.term = Some(term);
        self
    }

    /// Fails unless this replica may still write: without leader election always, with it
    /// while its term lasts ([`crate::leader::Term`]). Asked before each write of a pass,
    /// so a leader frozen or cut off mid-pass does not finish it on stale reads once a
    /// standby may have taken over.
    fn still_leading(&self) -> Result<()> {
        match &self.term {
            Some(term) if !term.holds() => Err(Error::NotLeading),
            _ => Ok(()),
        }
    }

    pub(crate) async fn publish(
        &self,
        cc: &CacheCluster,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(bounded_note(note)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, &cc.object_ref(&())).await {
            tracing::warn!(error = %err, reason, "failed to publish event");
        }
    }
}

/// The most an `events.k8s.io/v1` Event's note may hold; the API server refuses a
/// longer one (and the event is lost).
const EVENT_NOTE_MAX_BYTES: usize = 1024;

/// `note` cut to [`EVENT_NOTE_MAX_BYTES`] at a character boundary, ending in `…` when
/// cut (an invalid spec over many pools, a long error chain).
fn bounded_note(mut note: String) -> String {
    if note.len() <= EVENT_NOTE_MAX_BYTES {
        return note;
    }
    const ELLIPSIS: &str = "…";
    let mut end = EVENT_NOTE_MAX_BYTES - ELLIPSIS.len();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note.truncate(end);
    note.push_str(ELLIPSIS);
    note
}

/// One reconcile pass of `cc`.
///
/// # Errors
/// The step that failed; an invalid spec is reported in status first.
#[tracing::instrument(skip_all, fields(cachecluster = %cc.name_any(), namespace = ?cc.namespace(), generation = ?cc.metadata.generation))]
pub async fn reconcile(cc: Arc<CacheCluster>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_started();
    ctx.still_leading()?;
    let namespace = cc.namespace().unwrap_or_default();
    let name = cc.name_any();
    let owner_uid = cc.metadata.uid.clone().unwrap_or_default();
    let observed = observe::observe(
        &ctx.client,
        &namespace,
        &name,
        &owner_uid,
        &ctx.node_read_warnings,
    )
    .await?;
    let cluster = match validate::validate(&cc, &ctx.defaults) {
        Ok(cluster) => cluster,
        Err(invalid) => {
            let message = invalid.to_string();
            let status = status::compute(
                cc.status.as_ref(),
                cc.metadata.generation,
                &Outcome::InvalidSpec(message.clone()),
                &crate::now(),
            );
            status::apply_status(&ctx.client, &cc, &status).await?;
            ctx.publish(&cc, EventType::Warning, "InvalidSpec", message)
                .await;
            return Err(Error::InvalidSpec(invalid));
        }
    };
    let admin = match node_admin(&ctx, &cluster).await {
        Ok(admin) => admin,
        Err(err) => {
            // A generated Secret that cannot be made or used (say, one of that name not
            // owned by this cluster) blocks every node call: Degraded, with the reason.
            let message = crate::chain(&err);
            let status = status::compute(
                cc.status.as_ref(),
                cc.metadata.generation,
                &Outcome::ApplyFailed(message.clone()),
                &crate::now(),
            );
            status::apply_status(&ctx.client, &cc, &status).await?;
            // Once per failure, not on every retry while it lasts.
            if degraded_is_new(cc.status.as_ref(), reasons::APPLY_FAILED, &message) {
                ctx.publish(&cc, EventType::Warning, "SecretFailed", message)
                    .await;
            }
            return Err(err);
        }
    };
    let observations = observe::observe_pools(
        &cluster,
        &observed,
        &admin,
        cc.status.as_ref(),
        ctx.resize_supported.load(Ordering::Relaxed),
    )
    .await;
    let plans: Vec<(PoolPlan, PoolObservation)> = cluster
        .pools
        .iter()
        .zip(observations)
        .map(|(pool, observation)| (plan::plan_pool(&cluster, pool, &observation), observation))
        .collect();
    // Pods on lost Kubernetes nodes leave the Services (and, past the bound, the node)
    // before anything slower runs; the plans above already took them out of the ring.
    let node_loss = nodeloss::plan_node_loss(&observed.pods, &observed.node_health);
    if node_loss.any() {
        ctx.still_leading()?;
        execute::run_node_loss(&ctx, &cc, &namespace, &node_loss).await;
    }
    let layouts: Vec<PoolLayout> = plans.iter().map(|(plan, _)| plan.layout.clone()).collect();
    let desired = build::desired_resources(&cluster, &layouts);
    ctx.still_leading()?;
    let applied = match apply::apply_cluster(&ctx.client, &cluster, &desired).await {
        Ok(applied) => applied,
        Err(failed) => return Err(report_apply_failure(&ctx, &cc, failed).await?),
    };
    report_applied(&ctx, &cc, &cluster, &observed, &applied).await;
    ctx.still_leading()?;
    execute::run_steps(&ctx, &cc, &cluster, &admin, &plans).await?;
    record_pool_metrics(&ctx.metrics, &cluster, &plans);
    let progressing = plans.iter().any(|(plan, _)| plan.progressing());
    let mut status = status::compute(
        cc.status.as_ref(),
        cc.metadata.generation,
        &Outcome::Reconciled {
            pools: status::pool_statuses(&cluster, &plans, cc.status.as_ref()),
            phases: plans.iter().map(|(plan, _)| plan.phase.clone()).collect(),
        },
        &crate::now(),
    );
    status.client_token_secret = cluster
        .client_token
        .as_ref()
        .map(|token| format!("{}/{}", token.secret, token.key));
    if cc.status.as_ref() != Some(&status) {
        ctx.still_leading()?;
        status::apply_status(&ctx.client, &cc, &status).await?;
    }
    Ok(Action::requeue(if progressing || node_loss.any() {
        ROLLOUT_REQUEUE
    } else {
        nodeloss::next_check(observed.node_health.values()).map_or(IDLE_REQUEUE, |seconds| {
            IDLE_REQUEUE.min(Duration::from_secs(seconds))
        })
    }))
}

/// The client for the cluster's nodes, with the admin token of the cluster's internal
/// Secret (created on the first pass).
async fn node_admin(ctx: &Context, cluster: &ValidatedCluster) -> Result<NodeAdmin> {
    let tokens = secrets::ensure(&ctx.client, cluster).await?;
    // Every node serves the cluster's one certificate, valid for each pool's Service
    // name (docs/security.md): the first pool's is the name nodes are verified by.
    let identity = tokens.tls_identity;
    let tls = tokens.tls_ca.map(|ca| NodeTls {
        ca,
        identity,
        domain: cluster.pools.first().map_or_else(String::new, |pool| {
            format!(
                "{}.{}.svc",
                names::pool_object(&cluster.name, &pool.name),
                cluster.namespace
            )
        }),
    });
    Ok(NodeAdmin::new(
        i32::from(cluster.port),
        Some(tokens.admin),
        tls,
    ))
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
        let status = status::compute(
            cc.status.as_ref(),
            cc.metadata.generation,
            &Outcome::ApplyFailed(message.clone()),
            &crate::now(),
        );
        status::apply_status(&ctx.client, cc, &status).await?;
        // Once per failure, not on every retry while it lasts.
        if degraded_is_new(cc.status.as_ref(), reasons::APPLY_FAILED, &message) {
            ctx.publish(cc, EventType::Warning, "ApplyFailed", message)
                .await;
        }
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
        .became_unavailable(&namespace, &cluster.name, unavailable)
    {
        ctx.publish(
            cc,
            EventType::Warning,
            "ServiceMonitorUnavailable",
            "spec.monitoring.serviceMonitor is on, but this cluster has no monitoring.coreos.com \
             ServiceMonitor resource (install the prometheus-operator CRDs); the nodes' metrics \
             port is still served"
                .into(),
        )
        .await;
    }
    for pool in &cluster.pools {
        match observed.statefulset(&cluster.name, &pool.name) {
            None => {
                let note = format!("created pool {} with {} nodes", pool.name, pool.shards);
                ctx.publish(cc, EventType::Normal, "PoolCreated", note)
                    .await;
            }
            Some(sts) => {
                let before = scaled_from(cc.status.as_ref(), &pool.name, sts);
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
    for pool in &applied.removed_pools {
        ctx.publish(
            cc,
            EventType::Normal,
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

/// The clusters (namespace, name) whose ServiceMonitor was unavailable on their last
/// pass, so `ServiceMonitorUnavailable` is published when that starts, not on every pass
/// while it lasts. Kept in memory: a restarted operator reports it once more.
#[derive(Debug, Default)]
struct UnavailableMonitors(Mutex<BTreeSet<(String, String)>>);

impl UnavailableMonitors {
    /// Records whether the ServiceMonitor of `namespace/name` is unavailable on this
    /// pass; true when it just became so (it was not on the cluster's last pass).
    fn became_unavailable(&self, namespace: &str, name: &str, unavailable: bool) -> bool {
        let mut set = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (namespace.to_owned(), name.to_owned());
        if unavailable {
            set.insert(key)
        } else {
            set.remove(&key);
            false
        }
    }

    /// Forgets a deleted cluster.
    fn forget(&self, namespace: &str, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(namespace.to_owned(), name.to_owned()));
    }
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
    if namespaces.is_empty() {
        return run(ctx, None).await;
    }
    let controllers = namespaces
        .iter()
        .map(|namespace| run(Arc::clone(&ctx), Some(namespace.as_str())));
    for result in futures::future::join_all(controllers).await {
        result?;
    }
    Ok(())
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

    #[test]
    fn an_event_note_is_cut_to_what_the_api_server_takes() {
        assert_eq!(bounded_note("short".into()), "short");
        let exact = "x".repeat(EVENT_NOTE_MAX_BYTES);
        assert_eq!(bounded_note(exact.clone()), exact);
        // An invalid spec over every pool says more than 1 KiB; multi-byte characters are
        // never split.
        let long = "spec.pools[15].memoryLimit must be between 64Mi and 1Ti — ".repeat(40);
        let cut = bounded_note(long.clone());
        assert!(cut.len() <= EVENT_NOTE_MAX_BYTES, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(long.starts_with(cut.trim_end_matches('…')));
    }

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

    #[test]
    fn service_monitor_unavailable_is_published_when_it_starts_not_on_every_pass() {
        let memory = UnavailableMonitors::default();
        // The transition: first pass without the ServiceMonitor resource.
        assert!(memory.became_unavailable("ns", "demo", true));
        // The repeat: later passes while it lasts.
        assert!(!memory.became_unavailable("ns", "demo", true));
        assert!(!memory.became_unavailable("ns", "demo", true));
        // Another cluster has its own transition.
        assert!(memory.became_unavailable("ns", "other", true));
        // Available again (or turned off), then unavailable: a new transition.
        assert!(!memory.became_unavailable("ns", "demo", false));
        assert!(memory.became_unavailable("ns", "demo", true));
        // A deleted cluster is forgotten: a new one of that name starts afresh.
        memory.forget("ns", "demo");
        assert!(memory.became_unavailable("ns", "demo", true));
    }
}
