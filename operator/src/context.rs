//! What every reconcile pass shares: the API client, the operator's defaults, metrics,
//! the event recorder and the leader's term; the events it publishes (notes cut to
//! what the API server takes); and the client for a cluster's nodes (its admin token and
//! TLS from the cluster's Secrets).
//!
//! Owns: [`Context`], event publishing, making the node client and running a controller
//! per watched namespace. Imported by
//! `controller`, `invalidations` and `execute`; imports none of them.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};

use crate::build::names;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::nodes::{NodeAdmin, NodeTls};
use crate::observe;
use crate::secrets;
use crate::validate::Defaults;
use crate::validate::ValidatedCluster;
use crate::warnings::{self, EVENT_NOTE_MAX_BYTES, Warning};

/// What a pass needs to call a cluster's nodes, and to move their TLS.
pub(crate) struct NodeAccess {
    /// The client for the cluster's nodes.
    pub admin: NodeAdmin,
    /// How long until the certificate the operator issued is due for renewal.
    pub renewal_in: Option<std::time::Duration>,
    /// The cluster's TLS Secret and the nodes' copy of it, when they serve TLS.
    pub node_tls: Option<secrets::NodeTlsCopy>,
}

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
    pub(crate) monitors_unavailable: Ongoing,
    /// The clusters kept in plaintext (`ValidatedCluster::plaintext_kept`) on their last
    /// pass.
    pub(crate) plaintext_kept: Ongoing,
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
            monitors_unavailable: Ongoing::default(),
            plaintext_kept: Ongoing::default(),
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
    pub(crate) fn still_leading(&self) -> Result<()> {
        match &self.term {
            Some(term) if !term.holds() => Err(Error::NotLeading),
            _ => Ok(()),
        }
    }

    /// The client for `cluster`'s nodes, with the admin token of the cluster's internal
    /// Secret (created on the cluster's first pass), over TLS when the cluster serves it;
    /// and how long until the certificate the operator issues for it is due for renewal.
    ///
    /// # Errors
    /// The Secret cannot be made or used (`secrets::ensure`).
    pub(crate) async fn node_admin(&self, cluster: &ValidatedCluster) -> Result<NodeAccess> {
        let tokens = secrets::ensure(&self.client, cluster).await?;
        let renewal_in = tokens.certificate_renewal_in;
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
        Ok(NodeAccess {
            admin: NodeAdmin::new(i32::from(cluster.port), Some(tokens.admin), tls),
            renewal_in,
            node_tls: tokens.node_tls,
        })
    }

    /// Publishes a Normal event about `object` (a CacheCluster or a CacheInvalidation).
    pub(crate) async fn inform<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        reason: &str,
        note: String,
    ) {
        self.publish(object, EventType::Normal, reason, note).await;
    }

    /// Publishes a Warning event about `object`: what happened, then what to do
    /// ([`Warning::note`]).
    pub(crate) async fn warn<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        warning: Warning,
        what_happened: &str,
    ) {
        let note = warning.note(what_happened);
        self.publish(object, EventType::Warning, warning.reason(), note)
            .await;
    }

    async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
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
        if let Err(err) = self.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::warn!(error = %err, reason, "failed to publish event");
        }
    }
}

/// `note` cut to [`EVENT_NOTE_MAX_BYTES`] (an invalid spec over many pools, a long
/// error chain).
fn bounded_note(note: String) -> String {
    warnings::bounded(note, EVENT_NOTE_MAX_BYTES)
}

/// The clusters (namespace, name) for which a lasting state held on their last pass
/// (a ServiceMonitor unavailable, plaintext kept), so its Warning is published when it
/// starts, not on every pass while it lasts. Kept in memory: a restarted operator
/// reports it once more.
#[derive(Debug, Default)]
pub(crate) struct Ongoing(Mutex<BTreeSet<(String, String)>>);

impl Ongoing {
    /// Records whether the state holds for `namespace/name` on this pass; true when it
    /// just began (it did not on the cluster's last pass).
    pub(crate) fn began(&self, namespace: &str, name: &str, holds: bool) -> bool {
        let mut set = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (namespace.to_owned(), name.to_owned());
        if holds {
            set.insert(key)
        } else {
            set.remove(&key);
            false
        }
    }

    /// Forgets a deleted cluster.
    pub(crate) fn forget(&self, namespace: &str, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(namespace.to_owned(), name.to_owned()));
    }
}

/// Runs `run` for each of `namespaces` (once with `None`, all namespaces, when empty) and
/// waits for every run: with a list, every watch and call stays inside those namespaces,
/// so namespaced RoleBindings are all the operator needs.
///
/// # Errors
/// The first run that failed.
pub(crate) async fn for_each_namespace<F, Fut>(namespaces: &[String], run: F) -> anyhow::Result<()>
where
    F: Fn(Option<String>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    if namespaces.is_empty() {
        return run(None).await;
    }
    let runs = namespaces
        .iter()
        .map(|namespace| run(Some(namespace.clone())));
    for result in futures::future::join_all(runs).await {
        result?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn a_lasting_warning_is_published_when_it_starts_not_on_every_pass() {
        let memory = Ongoing::default();
        // The transition: first pass without the ServiceMonitor resource.
        assert!(memory.began("ns", "demo", true));
        // The repeat: later passes while it lasts.
        assert!(!memory.began("ns", "demo", true));
        assert!(!memory.began("ns", "demo", true));
        // Another cluster has its own transition.
        assert!(memory.began("ns", "other", true));
        // Available again (or turned off), then unavailable: a new transition.
        assert!(!memory.began("ns", "demo", false));
        assert!(memory.began("ns", "demo", true));
        // A deleted cluster is forgotten: a new one of that name starts afresh.
        memory.forget("ns", "demo");
        assert!(memory.began("ns", "demo", true));
    }
}
