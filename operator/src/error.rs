//! The operator's reconcile error: one variant per pipeline step, each with a metric
//! and event category.
//!
//! Owns: [`Error`] and [`SecretError`]. Imports `certs` only (a certificate problem is
//! a Secret error); must not import kube's client or any reconcile step.

use crds::cachecluster::InvalidSpec;

/// Result with the operator's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a generated Secret (the internal one, or the client token) cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The Secret cannot be read.
    #[error("the Secret cannot be read")]
    Get(#[source] kube::Error),
    /// The Secret cannot be created.
    #[error("the Secret cannot be created")]
    Create(#[source] kube::Error),
    /// A Secret of that name exists and is not this cluster's: it is neither used nor
    /// overwritten.
    #[error(
        "a Secret of that name exists and is not owned by this CacheCluster; delete or rename it"
    )]
    NotOwned,
    /// A Secret of that name is owned by this cluster but was not made by the operator
    /// (its uid is not the one the cluster's status records): its tokens may be someone
    /// else's choice, so it is not used.
    #[error(
        "a Secret of that name exists, but the operator did not create it (its uid {uid} is not \
         in status.generatedSecrets); delete it and the operator creates a new one"
    )]
    NotCreatedByOperator {
        /// The Secret's uid.
        uid: String,
    },
    /// What the operator created could not be recorded in the cluster's status.
    #[error("the new Secret cannot be recorded in the CacheCluster's status")]
    Record(#[source] kube::Error),
    /// The Secret lacks a key.
    #[error("the key {0} is missing")]
    MissingKey(&'static str),
    /// A token is not text.
    #[error("a token is not UTF-8")]
    NotUtf8(#[source] std::string::FromUtf8Error),
    /// A Secret the spec names lacks the label that lets this cluster's nodes mount it.
    #[error(
        "the Secret lacks the label {label}={cluster}: whoever manages the Secret adds it to let \
         this CacheCluster's nodes mount it"
    )]
    NotLabelled {
        /// The label key.
        label: &'static str,
        /// The cluster.
        cluster: String,
    },
    /// The TLS Secret's certificate cannot be served (expired, wrong names, not signed by
    /// its CA).
    #[error(transparent)]
    Certificate(#[from] crate::certs::CertProblem),
    /// A certificate the operator issues could not be made.
    #[error("the certificate cannot be issued: {0}")]
    Issue(String),
    /// The Secret cannot be updated (a renewed certificate).
    #[error("the Secret cannot be updated")]
    Update(#[source] kube::Error),
    /// The operating system gave no random bytes for a new token.
    #[error("no random bytes for a token: {0}")]
    Random(String),
}

/// What a reconcile can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec breaks a rule; the user must edit the object.
    #[error("the spec is invalid")]
    InvalidSpec(#[source] InvalidSpec),
    /// Reading current state failed.
    #[error("failed to list {kind} of cluster {cluster}")]
    Observe {
        /// Kind listed.
        kind: &'static str,
        /// The CacheCluster.
        cluster: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Server-side apply of a child failed.
    #[error("failed to apply {kind} {name}")]
    Apply {
        /// Kind applied.
        kind: &'static str,
        /// Object name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// An object the cluster would write already exists and is not its own: another
    /// CacheCluster's (their names collide: cluster `a-b` pool `c` and cluster `a` pool
    /// `b-c` both make `a-b-c`) or someone else's. It is left as it is.
    #[error(
        "{kind} {name} exists and belongs to {owner}, not to this CacheCluster: it is left as it is (object names are <cluster>-<pool>; rename this cluster or pool, or delete that object if it is stale)"
    )]
    NotOurs {
        /// Kind of the object.
        kind: &'static str,
        /// Its name.
        name: String,
        /// Its controller (`CacheCluster a (uid …)`), or that it has none.
        owner: String,
    },
    /// Deleting a child we no longer want failed.
    #[error("failed to delete {kind} {name}")]
    Delete {
        /// Kind deleted.
        kind: &'static str,
        /// Object name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Restarting a node for a rollout failed.
    #[error("failed to evict pod {name} for a rollout")]
    Rollout {
        /// Pod name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// A Secret the operator generates and owns cannot be used.
    #[error("cannot use Secret {secret}")]
    Secret {
        /// Secret name.
        secret: String,
        /// Why.
        #[source]
        source: SecretError,
    },
    /// This replica's leader term ran out mid-pass (it was frozen or cut off from the API
    /// server for longer than the lease): it stops writing; the election decides who goes on.
    #[error("no longer the leader: the lease ran out before this pass could write")]
    NotLeading,
    /// Writing status failed.
    #[error("failed to write status of {name}")]
    Status {
        /// The CacheCluster.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// Bounded label for metrics and event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            Self::InvalidSpec(_) => "invalid_spec",
            Self::Observe { .. } => "observe",
            Self::Apply { .. } | Self::NotOurs { .. } => "apply",
            Self::Delete { .. } => "delete",
            Self::Rollout { .. } => "rollout",
            Self::Secret { .. } => "secret",
            Self::Status { .. } => "status",
            Self::NotLeading => "not_leading",
        }
    }
}
