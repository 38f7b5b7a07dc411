//! The operator's reconcile error: one variant per pipeline step, each with a metric
//! and event category.

use crds::cachecluster::InvalidSpec;

/// Result with the operator's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why the auth token could not be read from its Secret.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The Secret cannot be read.
    #[error("the Secret cannot be read")]
    Get(#[source] kube::Error),
    /// The Secret has no such key.
    #[error("the key is missing")]
    MissingKey,
    /// The token is not text.
    #[error("the token is not UTF-8")]
    NotUtf8(#[source] std::string::FromUtf8Error),
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
    /// The auth Secret named in the spec cannot be read, so nodes cannot be called.
    #[error("cannot read the auth token from Secret {secret} key {key}")]
    AuthSecret {
        /// Secret name.
        secret: String,
        /// Key in the Secret.
        key: String,
        /// Why.
        #[source]
        source: TokenError,
    },
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
            Self::Apply { .. } => "apply",
            Self::Delete { .. } => "delete",
            Self::Rollout { .. } => "rollout",
            Self::AuthSecret { .. } => "auth_secret",
            Self::Status { .. } => "status",
        }
    }
}
