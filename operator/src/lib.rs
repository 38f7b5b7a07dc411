//! FlightCache operator: reconciles `CacheCluster` resources into pools of Arrow Flight
//! cache nodes (ConfigMap, headless and client Services, PDB, StatefulSet per pool).
//!
//! - [`validate`]: CacheCluster → validated model; `build`: pure object builders.
//! - `observe`, `apply`: read-only I/O and server-side apply.
//! - `plan`: the pure per-pass planner (ring states, live config, resizes, restarts
//!   with handoff, scaling); `ring`: the published ring; `nodes`: calls to nodes;
//!   `nodeloss`: when a Kubernetes node is lost and what to do with its pods (pure);
//!   `tls_rollout`: the phases in which the nodes' copy of the TLS Secret moves (pure).
//! - `rollout`: pod readiness and template readers; `status`: conditions and pool
//!   figures.
//! - `execute`: the node calls of a plan; [`controller`]: the pipeline of a pass;
//!   [`invalidations`]: the CacheInvalidation controller, `invalidation_plan` its pure
//!   bookkeeping;
//!   [`context`]: what every pass shares; [`leader`]: Lease election; [`metrics`]:
//!   Prometheus; `clock`: the wall clock.
//! - [`simulate`]: the pure half of each pass driven against simulated pods and nodes,
//!   for the control-plane bench and the tests at the CRD's limits.
//!
//! Layering (checked by `scripts/check-layers`, no circle): `validate`, `plan`,
//! `nodeloss`, `ring`, `rollout`, `status`, `simulate`, `invalidation_plan`, `tls_rollout` and `build/` are pure (no kube
//! client, tokio, network, file I/O or clock, and no module that has them); the I/O is in
//! `observe`, `apply`, `execute`, `nodes`, `secrets`, `leader`, `metrics` and `clock`;
//! `controller` and `invalidations` wire them.

pub(crate) mod apply;
pub(crate) mod build;
pub(crate) mod certs;
pub(crate) mod clock;
pub mod config;
pub mod context;
pub mod controller;
pub mod error;
mod execute;
pub(crate) mod invalidation_plan;
pub mod invalidations;
pub(crate) mod issuer;
pub mod leader;
pub mod metrics;
pub(crate) mod nodeloss;
pub(crate) mod nodes;
pub(crate) mod observe;
pub(crate) mod plan;
pub(crate) mod ring;
pub(crate) mod rollout;
pub(crate) mod secrets;
pub mod simulate;
pub(crate) mod status;
pub mod telemetry;
pub(crate) mod tls_rollout;
pub(crate) mod usage;
pub mod validate;
pub(crate) mod warnings;

use std::sync::Arc;

use tokio::sync::watch;

use crate::config::Config;
use crate::context::Context;
use crate::metrics::Metrics;
use crate::validate::Defaults;

pub(crate) use crds::chain;

/// Runs the operator: metrics server, optional leader election, controller.
///
/// # Errors
/// No Kubernetes client config, the metrics address taken, or the CRD missing.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await?;
    let metrics = Arc::new(Metrics::default());
    let listener = tokio::net::TcpListener::bind(config.metrics_listen).await?;
    tokio::spawn(metrics::serve(listener, Arc::clone(&metrics)));
    if config.leader_election {
        let (leading_tx, mut leading) = watch::channel(false);
        let lease = leader::LeaseConfig {
            namespace: config.lease_namespace.clone(),
            name: config.lease_name.clone(),
            identity: config.identity.clone(),
            lease_duration: config.lease_duration,
            renew_every: config.lease_duration / 3,
        };
        let term = Arc::new(leader::Term::default());
        let election = tokio::spawn(leader::run_with_term(
            client.clone(),
            lease.clone(),
            leading_tx,
            Arc::clone(&term),
        ));
        tracing::info!(identity = %config.identity, "waiting for leadership");
        // A standby is ready once it has taken part in one election round: it can take over
        // when the leader stops renewing. Were readiness to wait for leadership, a second
        // replica would never be Ready, and a rolling update of one replica would never
        // replace the old pod (its new pod waits for the Lease the old one holds).
        leading.changed().await?;
        metrics
            .ready
            .store(true, std::sync::atomic::Ordering::Relaxed);
        leading.wait_for(|leading| *leading).await?;
        metrics.set_leader(true);
        let lost = async move {
            let _ = leading.wait_for(|leading| !*leading).await;
        };
        let release_client = client.clone();
        let ctx = Arc::new(
            Context::new(
                client,
                defaults(&config),
                Arc::clone(&metrics),
                &config.identity,
            )
            .with_term(Arc::clone(&term)),
        );
        tokio::select! {
            result = run_controllers(ctx, &config.watch_namespace) => {
                // The controllers end on SIGTERM: stop renewing, then hand the Lease over
                // so the standby takes it at its next try rather than after the lease.
                election.abort();
                leader::release(release_client, &lease).await;
                result
            }
            () = lost => {
                metrics.set_leader(false);
                anyhow::bail!("lost the leader lease; exiting so a restart rejoins the election")
            }
        }
    } else {
        let ctx = Arc::new(Context::new(
            client,
            defaults(&config),
            Arc::clone(&metrics),
            &config.identity,
        ));
        run_controllers(ctx, &config.watch_namespace).await
    }
}

/// Runs the CacheCluster and the CacheInvalidation controllers until SIGTERM/Ctrl-C. An
/// operator whose CacheInvalidation CRD is missing (a Helm upgrade does not update
/// CRDs) keeps running its clusters and says what to apply.
async fn run_controllers(ctx: Arc<Context>, namespaces: &[String]) -> anyhow::Result<()> {
    let invalidations = async {
        if let Err(err) = invalidations::run_all(Arc::clone(&ctx), namespaces).await {
            tracing::error!(
                error = %err,
                "CacheInvalidations are not run: kubectl apply --server-side -f charts/flightcache/crds/"
            );
        }
    };
    let (clusters, ()) = tokio::join!(
        controller::run_all(Arc::clone(&ctx), namespaces),
        invalidations
    );
    clusters
}

fn defaults(config: &Config) -> Defaults {
    Defaults {
        node_image: config.node_image.clone(),
        image_pull_policy: config.node_image_pull_policy.clone(),
        cluster_domain: config.cluster_domain.clone(),
        operator_namespace: config.lease_namespace.clone(),
        allowed_images: if config.allowed_images.is_empty() {
            vec![repository_of(&config.node_image).to_owned()]
        } else {
            config.allowed_images.clone()
        },
        issued_certificate_lifetime: config.issued_certificate_lifetime,
    }
}

/// The repository of an image reference (`repo[:tag][@digest]`; a registry's port is
/// part of the repository).
fn repository_of(image: &str) -> &str {
    let without_digest = image.split('@').next().unwrap_or(image);
    match without_digest.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => repository,
        _ => without_digest,
    }
}

#[cfg(test)]
mod tests {
    use super::repository_of;

    #[test]
    fn the_repository_of_an_image_reference() {
        assert_eq!(repository_of("flightcache/node:0.1.0"), "flightcache/node");
        assert_eq!(
            repository_of("registry.local:5000/fc/node:1"),
            "registry.local:5000/fc/node"
        );
        assert_eq!(
            repository_of("registry.local:5000/fc/node"),
            "registry.local:5000/fc/node"
        );
        assert_eq!(repository_of("fc/node@sha256:abc"), "fc/node");
    }
}
