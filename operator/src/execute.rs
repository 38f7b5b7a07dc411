//! Execute: the node calls and pod operations of each pool's plan (ring and config
//! pushes, rebalances, evictions, in-place resizes), in order, with their events.
//!
//! A failed node call ends that pool's pass; the next pass plans again from what the
//! nodes then report.
//!
//! Owns: the order of a plan's node calls and pod operations, with their events and
//! metrics. Imports `controller` only for [`Context`]; must not decide what to do (that
//! is `plan`), write children (`apply`) or the status (`status`).

use std::sync::atomic::Ordering;

use crds::admin::AdminAction;
use crds::cachecluster::CacheCluster;
use crds::node_config::{NodeConfig, NodeDocument};
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams, Patch, PatchParams};
use kube::runtime::events::EventType;

use crate::build;
use crate::controller::Context;
use crate::error::{Error, Result};
use crate::metrics::PoolLabels;
use crate::nodes::NodeAdmin;
use crate::plan::{PoolObservation, PoolPlan, Step};
use crate::rollout;
use crate::validate::ValidatedCluster;

/// Runs the node calls of each pool's plan, in order; a failed call ends that pool's
/// pass (the next pass plans again from what the nodes then report).
pub(crate) async fn run_steps(
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
                crate::ring::ring_changed_note(&pool.name, topology),
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
                            .rebalanced(&PoolLabels::of(cluster, &pool.name), moved.moved);
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
