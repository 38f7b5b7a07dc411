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

/// How long this replica may still act as the leader, by its own monotonic clock: until
/// its last successful renewal plus the lease's duration, less `TERM_MARGIN`. A leader
/// that was frozen (its host hung, its process stopped) or cut off from the API server
/// past that point is no longer the leader — a standby may have taken the Lease — though
/// no election round has told it yet: after a thaw, the reconcile may run before the
/// renewal that would find out. The reconcile asks [`Term::holds`] before each write.
#[derive(Debug, Default)]
pub struct Term {
    valid_until: std::sync::Mutex<Option<std::time::Instant>>,
}

/// Taken off the lease's duration: the other replicas compare the Lease's renew time with
/// their own wall clocks, which may run ahead of ours by this much.
pub const TERM_MARGIN: Duration = Duration::from_secs(2);

impl Term {
    /// Records a renewal that succeeded at `at`, for a lease of `lease_duration`.
    pub fn renewed(&self, at: std::time::Instant, lease_duration: Duration) {
        *self.until() = Some(at + lease_duration.saturating_sub(TERM_MARGIN));
    }

    /// Ends the term at once (the Lease is lost or given up).
    pub fn end(&self) {
        *self.until() = None;
    }

    /// Whether this replica still holds the Lease as of `now`.
    pub fn holds_at(&self, now: std::time::Instant) -> bool {
        self.until().is_some_and(|until| now < until)
    }

    /// The end of the term (a poisoned lock still holds a valid instant: it is only ever
    /// overwritten whole).
    fn until(&self) -> std::sync::MutexGuard<'_, Option<std::time::Instant>> {
        self.valid_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether this replica still holds the Lease now.
    pub fn holds(&self) -> bool {
        self.holds_at(std::time::Instant::now())
    }
}

/// Runs the election forever, publishing `true` while this replica leads.
pub async fn run(client: Client, config: LeaseConfig, leading: watch::Sender<bool>) {
    run_with_term(client, config, leading, std::sync::Arc::default()).await;
}

/// [`run`], keeping `term` up to date: renewed on each round that holds the Lease (as of
/// the round's start), ended on each that does not.
pub async fn run_with_term(
    client: Client,
    config: LeaseConfig,
    leading: watch::Sender<bool>,
    term: std::sync::Arc<Term>,
) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut tick = tokio::time::interval(config.renew_every);
    loop {
        tick.tick().await;
        let started = std::time::Instant::now();
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
        if is_leader {
            term.renewed(started, config.lease_duration);
        } else {
            term.end();
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_term_ends_a_lease_less_the_margin_after_its_last_renewal() {
        let term = Term::default();
        let start = std::time::Instant::now();
        assert!(!term.holds_at(start), "no term before the first renewal");
        term.renewed(start, Duration::from_secs(15));
        assert!(term.holds_at(start + Duration::from_secs(12)));
        // A replica frozen past its lease (less the margin) no longer leads, whatever its
        // election loop has not yet found out.
        assert!(!term.holds_at(start + Duration::from_secs(13)));
        term.renewed(start + Duration::from_secs(5), Duration::from_secs(15));
        assert!(term.holds_at(start + Duration::from_secs(17)));
        term.end();
        assert!(!term.holds_at(start + Duration::from_secs(6)));
    }
}
