//! Execute: the node calls and pod operations of each pool's plan (ring and config
//! pushes, rebalances, evictions, in-place resizes), in order, with their events; and
//! what the node-loss plan says about pods on lost Kubernetes nodes (mark NotReady,
//! force-delete with their node-local claims).
//!
//! A failed node call ends that pool's pass, but for a rebalance: the pass's other
//! rebalances still run, and nothing after them; the next pass plans again from what the
//! nodes then report. A failed node-loss write is logged and tried again next pass.
//!
//! Owns: the order of a plan's node calls and pod operations, with their events and
//! metrics. Imports `context` for [`Context`], and `observe` for the reads a
//! force delete needs first (claims, volumes, the other nodes' Leases); must not decide
//! what to do (that is `plan` and `nodeloss`), write children (`apply`) or the status
//! (`status`).

use std::sync::atomic::Ordering;

use crds::admin::AdminAction;
use crds::cachecluster::CacheCluster;
use crds::node_config::{NodeConfig, NodeDocument, Topology};
use futures::future::join_all;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams, Preconditions};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::metrics::PoolLabels;
use crate::nodeloss::{self, LostNode, NodeLossPlan};
use crate::nodes::NodeAdmin;
use crate::plan::{PoolObservation, PoolPlan, Step};
use crate::validate::{ValidatedCluster, ValidatedPool};
use crate::warnings::Warning;
use crate::{build, observe, rollout};

/// Runs the node calls of each pool's plan, in order; a failed call ends that pool's
/// pass once the pass's other rebalances have run ([`PassProgress`]; the next pass plans
/// again from what the nodes then report).
pub(crate) async fn run_steps(
    ctx: &Context,
    cc: &CacheCluster,
    cluster: &ValidatedCluster,
    admin: &NodeAdmin,
    plans: &[(PoolPlan, PoolObservation)],
) -> Result<()> {
    let pods = Api::namespaced(ctx.client.clone(), &cluster.namespace);
    for (pool, (plan, observation)) in cluster.pools.iter().zip(plans) {
        let run = PoolRun {
            ctx,
            cc,
            cluster,
            pool,
            admin,
            pods: &pods,
            topology: &plan.layout.topology,
        };
        run.announce_ring_change(observation).await;
        let mut pass = PassProgress::default();
        for step in &plan.steps {
            if !pass.runs(step) {
                break;
            }
            pass.after(run.step(step).await?);
        }
    }
    Ok(())
}

/// What a step's outcome means for the rest of its pool's pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Continue,
    /// The step failed or cannot be taken now: the next pass plans again.
    EndPass,
    /// A rebalance did not send everything: the pass's other rebalances still run (each
    /// node's handoff is its own; one owner unreachable from one node must not keep the
    /// others from sending theirs), nothing after them does.
    HandoffsOnly,
}

/// Which of a pool's steps still run, given the outcomes so far.
#[derive(Debug, Default)]
struct PassProgress {
    ended: bool,
    handoffs_only: bool,
}

impl PassProgress {
    /// Whether `step` runs now.
    fn runs(&self, step: &Step) -> bool {
        !self.ended && (!self.handoffs_only || matches!(step, Step::Rebalance(..)))
    }

    fn after(&mut self, next: Next) {
        match next {
            Next::Continue => {}
            Next::EndPass => self.ended = true,
            Next::HandoffsOnly => self.handoffs_only = true,
        }
    }
}

/// One pool's pass: what its steps need.
struct PoolRun<'a> {
    ctx: &'a Context,
    cc: &'a CacheCluster,
    cluster: &'a ValidatedCluster,
    pool: &'a ValidatedPool,
    admin: &'a NodeAdmin,
    pods: &'a Api<Pod>,
    topology: &'a Topology,
}

impl PoolRun<'_> {
    /// A `RingChanged` event when the ring to push differs from the one last published.
    async fn announce_ring_change(&self, observation: &PoolObservation) {
        let previous = observation.previous.as_ref();
        if previous.is_some_and(|p| p.version != self.topology.version) {
            let note = crate::ring::ring_changed_note(&self.pool.name, self.topology);
            self.event("RingChanged", note).await;
        }
    }

    async fn step(&self, step: &Step) -> Result<Next> {
        Ok(match step {
            Step::HoldOut(names) => self.set_gates(names, false).await,
            Step::Admit(names) => self.set_gates(names, true).await,
            Step::PushRing(targets) => self.push_ring(targets).await,
            Step::Rebalance(name, ip) => self.rebalance(name, ip).await,
            Step::Evict(name) => self.evict(name).await?,
            Step::Resize(name) => self.resize(name).await?,
            Step::PushConfig(name, ip) => self.push_config(name, ip, false).await,
            Step::PushBudget(name, ip) => self.push_config(name, ip, true).await,
        })
    }

    async fn event(&self, reason: &str, note: String) {
        self.ctx.inform(self.cc, reason, note).await;
    }

    /// A gate write never ends the pass ([`set_gates`]).
    async fn set_gates(&self, names: &[String], open: bool) -> Next {
        set_gates(self.ctx, self.cc, self.pods, names, open).await;
        Next::Continue
    }

    /// The ring to `targets` at once; any failure ends the pass.
    async fn push_ring(&self, targets: &[(String, String)]) -> Next {
        let doc = NodeDocument {
            config: NodeConfig::default(),
            topology: Some(self.topology.clone()),
        };
        let calls = targets.iter().map(|(_, ip)| self.admin.configure(ip, &doc));
        let results = join_all(calls).await;
        let mut next = Next::Continue;
        for ((name, _), result) in targets.iter().zip(results) {
            if let Err(err) = result {
                tracing::warn!(pod = %name, error = %crate::chain(&err), "ring push failed");
                self.ctx.metrics.node_call_failed(AdminAction::Configure);
                next = Next::EndPass;
            }
        }
        next
    }

    /// A node hands off what it does not own; a move that failed for some entries, or a
    /// call that failed, leaves only the pass's other rebalances to run (nothing is
    /// restarted or shrunk on an incomplete handoff).
    async fn rebalance(&self, name: &str, ip: &str) -> Next {
        let moved = match self.admin.rebalance(ip).await {
            Ok(moved) => moved,
            Err(err) => {
                tracing::warn!(pod = %name, error = %crate::chain(&err), "rebalance failed");
                self.ctx.metrics.node_call_failed(AdminAction::Rebalance);
                return Next::HandoffsOnly;
            }
        };
        let labels = PoolLabels::of(self.cluster, &self.pool.name);
        self.ctx.metrics.pools.rebalanced(&labels, moved.moved);
        tracing::info!(pod = %name, moved = moved.moved, bytes = moved.moved_bytes, failed = moved.failed, kept = moved.kept, copied = moved.copied, copy_failed = moved.copy_failed, "rebalanced");
        if moved.moved > 0 || moved.failed > 0 || moved.copy_failed > 0 {
            // Unsent moves or copies are asked for again: the node reports them
            // (`owesHandover`) until a whole rebalance sends everything.
            let note = format!(
                "{name} handed {} entries ({} bytes) to their owners; {} failed; {} copies sent to owners lacking them, {} failed",
                moved.moved, moved.moved_bytes, moved.failed, moved.copied, moved.copy_failed
            );
            self.event("HandedOff", note).await;
        }
        if moved.failed > 0 {
            Next::HandoffsOnly
        } else {
            Next::Continue
        }
    }

    /// A restart through the Eviction API, so the PDB is respected.
    async fn evict(&self, name: &str) -> Result<Next> {
        match self.pods.evict(name, &EvictParams::default()).await {
            Ok(_) => {
                let note = format!("restarting {name} to apply the new pod template");
                self.event("RestartingNode", note).await;
                Ok(Next::Continue)
            }
            // 429: the PDB does not allow it right now; try again shortly.
            Err(kube::Error::Api(status)) if status.code == 429 || status.code == 404 => {
                Ok(Next::EndPass)
            }
            Err(source) => Err(Error::Rollout {
                name: name.to_owned(),
                source,
            }),
        }
    }

    /// The node container's memory resized in place (`pods/resize`).
    async fn resize(&self, name: &str) -> Result<Next> {
        let (limit, request) = build::statefulset::memory_quantities(self.pool);
        let patch = serde_json::json!({"spec": {"containers": [{
            "name": rollout::NODE_CONTAINER,
            "resources": {"limits": {"memory": limit}, "requests": {"memory": request}},
        }]}});
        let params = PatchParams::default();
        let resized = self
            .pods
            .patch_subresource("resize", name, &params, &Patch::Strategic(&patch))
            .await;
        match resized {
            Ok(_) => {
                let note = format!("resizing {name} in place to memory limit {limit}");
                self.event("ResizingNode", note).await;
                Ok(Next::Continue)
            }
            // No resize subresource (a cluster older than 1.33): restart instead.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 405 => {
                tracing::warn!(pod = %name, "pod resize is not available; memory changes restart nodes with handoff");
                self.ctx.resize_supported.store(false, Ordering::Relaxed);
                Ok(Next::EndPass)
            }
            Err(source) => Err(Error::Rollout {
                name: name.to_owned(),
                source,
            }),
        }
    }

    /// The live config to one node; with `budget`, also the byte budget and entry size
    /// that fit the pool's memory limit.
    async fn push_config(&self, name: &str, ip: &str, budget: bool) -> Next {
        let config = if budget {
            build::configmap::compute_budget_config(self.cluster, self.pool)
        } else {
            build::configmap::compute_live_config(self.cluster, self.pool)
        };
        let doc = NodeDocument {
            config,
            topology: None,
        };
        match self.admin.configure(ip, &doc).await {
            Ok(applied) => {
                tracing::info!(pod = %name, generation = applied.generation, "pushed live config");
                let note = format!("{name} runs config generation {}", applied.generation);
                self.event("NodeConfigured", note).await;
                Next::Continue
            }
            Err(err) => {
                tracing::warn!(pod = %name, error = %crate::chain(&err), "config push failed");
                self.ctx.metrics.node_call_failed(AdminAction::Configure);
                Next::EndPass
            }
        }
    }
}

/// Opens (`open`) or closes the readiness gate of pods `names`, with an event when a node
/// is held out. A failed write is logged and planned again next pass; it never ends the
/// pass (a closed gate only keeps clients away from a node the ring already left).
async fn set_gates(
    ctx: &Context,
    cc: &CacheCluster,
    pods: &Api<Pod>,
    names: &[String],
    open: bool,
) {
    let patch = rollout::gate_patch(open, &crate::clock::now());
    let done = patch_pod_statuses(pods, names, &patch, "set the pod's readiness gate").await;
    if done.is_empty() {
        return;
    }
    if open {
        tracing::info!(pods = ?done, "readiness gate opened: the nodes run the current ring");
    } else {
        tracing::warn!(pods = ?done, "readiness gate closed: the nodes left the key space while unreachable");
        let what = format!(
            "{} left the key space while unreachable: kept off the client Service until each runs the current ring (and so has dropped what it held)",
            done.join(", ")
        );
        ctx.warn(cc, Warning::HeldOut, &what).await;
    }
}

/// Applies the status patch `patch` (a strategic merge) to each of pods `names`, as the
/// operator's field manager; returns the pods written. A pod gone (404) is skipped; any
/// other failure is logged ("cannot {what}") and tried again on a later pass.
async fn patch_pod_statuses(
    pods: &Api<Pod>,
    names: &[String],
    patch: &serde_json::Value,
    what: &str,
) -> Vec<String> {
    let params = PatchParams {
        field_manager: Some(crate::build::names::FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let mut done = Vec::new();
    for name in names {
        match pods
            .patch_status(name, &params, &Patch::Strategic(patch))
            .await
        {
            Ok(_) => done.push(name.clone()),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => {
                tracing::warn!(pod = %name, error = %crate::chain(&err), "cannot {what} (the chart grants patch on pods/status)");
            }
        }
    }
    done
}

/// Acts on the cluster's pods on lost Kubernetes nodes as `plan` says: patches the
/// `Ready` condition of those still Ready to `False` (`pods/status`, a strategic merge
/// that merges `conditions` by type), then force-deletes the pods of the node whose turn
/// it is, each node with a `NodeLost` Warning event. Never fails the pass: a write that
/// fails is logged and planned again on the next one (the ring change matters more).
pub(crate) async fn run_node_loss(
    ctx: &Context,
    cc: &CacheCluster,
    namespace: &str,
    plan: &NodeLossPlan,
) {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let now = crate::clock::now();
    for lost in &plan.lost {
        let patch = nodeloss::not_ready_patch(&lost.node, lost.lost_seconds, &now);
        let marked = patch_pod_statuses(
            &pods,
            &lost.mark_not_ready,
            &patch,
            "mark a pod on a lost node NotReady",
        )
        .await;
        if !marked.is_empty() {
            tracing::warn!(node = %lost.node, lost_seconds = lost.lost_seconds, pods = ?marked, "node lost: pods marked NotReady");
            let what = nodeloss::marked_note(lost, &marked);
            ctx.warn(cc, Warning::NodeLost, &what).await;
        }
    }
    if let Some(lost) = plan.force_deleting() {
        force_delete(ctx, cc, namespace, lost).await;
    }
}

/// Force-deletes (grace period 0, on the UID observed) the pods of lost node `lost`,
/// each after its claims whose volume is pinned to that node, once the API server is
/// seen to hear from some other node.
async fn force_delete(ctx: &Context, cc: &CacheCluster, namespace: &str, lost: &LostNode) {
    let leases = match observe::observe_node_leases(&ctx.client).await {
        Ok(leases) => leases,
        Err(err) => {
            tracing::warn!(node = %lost.node, error = %crate::chain(&err), "cannot list node Leases: the pods of a lost node are not force-deleted (the chart grants list on leases in kube-node-lease)");
            return;
        }
    };
    if !nodeloss::others_alive(&leases, &lost.node, &crate::clock::now()) {
        tracing::warn!(node = %lost.node, "no node renews its Lease: the control plane may be cut off from the nodes; the pods of the lost node are not force-deleted");
        return;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let on_uid = |uid: &Option<String>| {
        Some(Preconditions {
            uid: uid.clone(),
            resource_version: None,
        })
    };
    let mut deleted = Vec::new();
    let mut deleted_claims = Vec::new();
    'pods: for pod in &lost.force_delete {
        let claims = match observe::observe_claims(&ctx.client, namespace, &pod.claims).await {
            Ok(claims) => claims,
            Err(err) => {
                tracing::warn!(pod = %pod.name, error = %crate::chain(&err), "cannot read the claims of a pod on a lost node: not force-deleted this pass");
                continue;
            }
        };
        for claim in nodeloss::node_local_claims(&claims, &lost.node, lost.hostname.as_deref()) {
            let params = DeleteParams {
                preconditions: on_uid(&claim.uid),
                ..DeleteParams::background()
            };
            match pvcs.delete(&claim.name, &params).await {
                Ok(_) => deleted_claims.push(claim.name.clone()),
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => {
                    tracing::warn!(claim = %claim.name, error = %crate::chain(&err), "cannot delete the node-local claim of a pod on a lost node: the pod is not force-deleted this pass");
                    continue 'pods;
                }
            }
        }
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: on_uid(&pod.uid),
            ..DeleteParams::background()
        };
        match pods.delete(&pod.name, &params).await {
            Ok(_) => deleted.push(pod.name.clone()),
            // Gone already, or a replacement of that name (another UID): nothing to do.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(err) => {
                tracing::warn!(pod = %pod.name, error = %crate::chain(&err), "cannot force-delete a pod on a lost node (the chart grants delete on pods)");
            }
        }
    }
    if !deleted.is_empty() {
        tracing::warn!(node = %lost.node, lost_seconds = lost.lost_seconds, pods = ?deleted, claims = ?deleted_claims, "node lost: pods force-deleted");
        let what = nodeloss::force_deleted_note(lost, &deleted, &deleted_claims);
        ctx.warn(cc, Warning::NodeLost, &what).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(outcomes: &[(Step, Next)]) -> Vec<Step> {
        let mut pass = PassProgress::default();
        let mut ran = Vec::new();
        for (step, next) in outcomes {
            if !pass.runs(step) {
                break;
            }
            ran.push(step.clone());
            pass.after(*next);
        }
        ran
    }

    fn rebalance(n: u8) -> Step {
        Step::Rebalance(format!("demo-hot-{n}"), format!("10.0.0.{n}"))
    }

    /// A CI run's node-partition: node 0's sends to the returning node failed, the pass
    /// ended, node 1 was never asked, and 215 keys kept one copy.
    #[test]
    fn a_failed_handoff_leaves_the_other_nodes_handoffs_to_run_and_nothing_after() {
        let evict = Step::Evict("demo-hot-2".into());
        let steps = [
            (rebalance(0), Next::HandoffsOnly),
            (rebalance(1), Next::Continue),
            (rebalance(2), Next::Continue),
            (evict.clone(), Next::Continue),
        ];
        assert_eq!(ran(&steps), [rebalance(0), rebalance(1), rebalance(2)]);
        // All sent: the restart goes on.
        let sent = [
            (rebalance(0), Next::Continue),
            (rebalance(1), Next::Continue),
            (evict.clone(), Next::Continue),
        ];
        assert_eq!(ran(&sent).last(), Some(&evict));
        // Any other failure ends the pass at once.
        let push = Step::PushRing(vec![("demo-hot-0".into(), "10.0.0.0".into())]);
        let ended = [
            (push.clone(), Next::EndPass),
            (rebalance(0), Next::Continue),
        ];
        assert_eq!(ran(&ended), [push]);
    }
}
