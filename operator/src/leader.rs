//! Leader election with a `coordination.k8s.io/v1` Lease, so two operator replicas can
//! run and only one reconciles.
//!
//! The holder renews every `renew_every`; a candidate takes the Lease when it is free
//! or its holder has not renewed for `lease_duration`. Updates carry the Lease's
//! resourceVersion, so two candidates cannot both win a race (the API server rejects
//! the stale write with 409).
//!
//! Owns: the Lease loop. Must not import any module of the reconcile; it talks to the
//! API server about its Lease only.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a holder's claim lasts without renewal.
    pub lease_duration: Duration,
    /// How often the holder renews and candidates retry.
    pub renew_every: Duration,
}

/// Runs the election forever, publishing `true` while this replica leads.
pub async fn run(client: Client, config: LeaseConfig, leading: watch::Sender<bool>) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut tick = tokio::time::interval(config.renew_every);
    loop {
        tick.tick().await;
        let now = Timestamp::now();
        let result = try_acquire_or_renew(&api, &config, now).await;
        let is_leader = match result {
            Ok(held) => held,
            Err(err) => {
                // Conservative: a replica that cannot renew stops leading.
                tracing::warn!(error = %err, lease = %config.name, "lease update failed");
                false
            }
        };
        if *leading.borrow() != is_leader {
            tracing::info!(leading = is_leader, identity = %config.identity, "leadership changed");
        }
        let _ = leading.send(is_leader);
    }
}

async fn try_acquire_or_renew(
    api: &Api<Lease>,
    config: &LeaseConfig,
    now: Timestamp,
) -> Result<bool, kube::Error> {
    let duration_secs = i32::try_from(config.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let existing = api.get_opt(&config.name).await?;
    let Some(mut lease) = existing else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.identity.clone()),
                lease_duration_seconds: Some(duration_secs),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(err) => Err(err),
        };
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let expired = spec
        .renew_time
        .as_ref()
        .map(|t| t.0)
        .and_then(|renewed| renewed.checked_add(config.lease_duration).ok())
        .is_none_or(|deadline| deadline < now);
    if holder != config.identity && !holder.is_empty() && !expired {
        return Ok(false);
    }
    if holder != config.identity {
        spec.holder_identity = Some(config.identity.clone());
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(duration_secs);
    api.replace(&config.name, &PostParams::default(), &lease)
        .await?;
    Ok(true)
}

/// Gives the Lease up when this replica holds it, so a standby takes over at its next try
/// (within `renew_every`) instead of waiting out `lease_duration`: called on a graceful
/// shutdown (a rolling update, a drain). Conditional on the resourceVersion read, like
/// every write here. Errors are logged: the Lease then simply expires.
pub async fn release(client: Client, config: &LeaseConfig) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let result = async {
        let Some(mut lease) = api.get_opt(&config.name).await? else {
            return Ok(false);
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(false);
        };
        if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
            return Ok(false);
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        api.replace(&config.name, &PostParams::default(), &lease)
            .await
            .map(|_| true)
    }
    .await;
    match result {
        Ok(true) => tracing::info!(lease = %config.name, "leader lease released"),
        Ok(false) => {}
        Err(err) => {
            tracing::warn!(error = %err, lease = %config.name, "could not release the leader lease; it expires on its own")
        }
    }
}
