//! Every Warning event the operator publishes, each with what the reader should do.
//!
//! A Warning reaches whoever runs `kubectl describe` or watches events, often not the
//! person who wrote the spec; one that says only what went wrong leaves them to find the
//! fix. Events go out through `Context::warn`, which takes a [`Warning`], so no Warning
//! is published without its action.
//!
//! Owns: the Warning reasons and their actions, and the bound on an event's note. A leaf:
//! imports nothing of the crate.

/// The most an `events.k8s.io/v1` Event's note may hold; the API server refuses a
/// longer one (and the event is lost).
pub const EVENT_NOTE_MAX_BYTES: usize = 1024;

/// `text` cut to `max` bytes at a character boundary, ending in `…` when cut.
pub fn bounded(mut text: String, max: usize) -> String {
    const ELLIPSIS: &str = "…";
    if text.len() <= max {
        return text;
    }
    let mut end = max.saturating_sub(ELLIPSIS.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(ELLIPSIS);
    text
}

/// A Warning event's kind: its reason and what to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warning {
    /// The CacheCluster's spec cannot be carried out.
    InvalidSpec,
    /// A generated Secret could not be made or read.
    SecretFailed,
    /// An object of the CacheCluster could not be applied.
    ApplyFailed,
    /// The ServiceMonitor was asked for, and the cluster has no such resource.
    ServiceMonitorUnavailable,
    /// Nodes left the key space while unreachable and are kept off the Service.
    HeldOut,
    /// A Kubernetes node running pods of the pool stopped sending heartbeats.
    NodeLost,
    /// A CacheInvalidation reached its deadline with nodes still to call.
    DeadlineExceeded,
    /// A CacheInvalidation could not reach some nodes yet and calls them again.
    NodesPending,
    /// A cluster an earlier operator served in plaintext stays so while `spec.tls` is
    /// unset.
    PlaintextKept,
}

impl Warning {
    /// Every Warning, for the tests (each documented in docs/operator.md).
    #[cfg(test)]
    pub const ALL: [Self; 9] = [
        Self::InvalidSpec,
        Self::SecretFailed,
        Self::ApplyFailed,
        Self::ServiceMonitorUnavailable,
        Self::HeldOut,
        Self::NodeLost,
        Self::DeadlineExceeded,
        Self::NodesPending,
        Self::PlaintextKept,
    ];

    /// The event's reason (CamelCase, as `kubectl get events` shows it).
    pub const fn reason(self) -> &'static str {
        match self {
            Self::InvalidSpec => "InvalidSpec",
            Self::SecretFailed => "SecretFailed",
            Self::ApplyFailed => "ApplyFailed",
            Self::ServiceMonitorUnavailable => "ServiceMonitorUnavailable",
            Self::HeldOut => "HeldOut",
            Self::NodeLost => "NodeLost",
            Self::DeadlineExceeded => "DeadlineExceeded",
            Self::NodesPending => "NodesPending",
            Self::PlaintextKept => "PlaintextKept",
        }
    }

    /// What the reader should do, as one sentence.
    pub const fn what_to_do(self) -> &'static str {
        match self {
            Self::InvalidSpec => {
                "fix the fields the message names in the CacheCluster's spec and apply it again \
                 (`kubectl explain cachecluster.spec.<field>` describes each); nothing changes \
                 until then."
            }
            Self::SecretFailed => {
                "if a Secret of that name exists and is not this CacheCluster's, rename or \
                 delete it (or name your own Secret in spec.auth); the operator tries again on \
                 its own."
            }
            Self::ApplyFailed => {
                "if the object belongs to another owner, rename this CacheCluster or remove that \
                 object; if the API server refused the write (RBAC, an admission policy), grant \
                 the chart's RBAC or fix the policy; the operator tries again on its own."
            }
            Self::ServiceMonitorUnavailable => {
                "install the prometheus-operator CRDs (monitoring.coreos.com/v1), or set \
                 spec.monitoring.serviceMonitor to false; the nodes' metrics port is served \
                 either way."
            }
            Self::HeldOut => {
                "nothing while the nodes come back: each is let in once it runs the current \
                 ring; if one stays out, check its network to the operator and its log \
                 (`kubectl logs <pod>`)."
            }
            Self::NodeLost => {
                "nothing while the operator moves the pods; check the Kubernetes node \
                 (`kubectl describe node <node>`) if it does not come back."
            }
            Self::DeadlineExceeded => {
                "check that the pending nodes' pods run (`kubectl get pods`), then create a new \
                 CacheInvalidation with the same selectors: a node that did not answer may \
                 still hold the entries."
            }
            Self::NodesPending => {
                "nothing yet: the operator calls the pending nodes again every 3 s until \
                 activeDeadlineSeconds; check their pods if they stay pending."
            }
            Self::PlaintextKept => {
                "set spec.tls: {} to serve TLS with a certificate the operator issues (clients \
                 then dial grpc+tls:// and trust the ca.crt of the Secret status.caSecret \
                 names), or spec.tls: {disabled: true} to keep plaintext and silence this."
            }
        }
    }

    /// The event's note: what happened, then what to do, within
    /// [`EVENT_NOTE_MAX_BYTES`] (what happened is cut, never the action).
    pub fn note(self, what_happened: &str) -> String {
        let action = format!(". What to do: {}", self.what_to_do());
        let room = EVENT_NOTE_MAX_BYTES.saturating_sub(action.len());
        format!("{}{action}", bounded(what_happened.to_owned(), room))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_warning_has_its_own_reason_and_an_action() {
        let mut reasons: Vec<&str> = Warning::ALL.iter().map(|w| w.reason()).collect();
        reasons.sort_unstable();
        reasons.dedup();
        assert_eq!(reasons.len(), Warning::ALL.len(), "a reason given twice");
        for warning in Warning::ALL {
            let action = warning.what_to_do();
            assert!(action.ends_with('.'), "{warning:?}: {action}");
            assert!(action.len() > 40, "{warning:?} says too little: {action}");
        }
    }

    #[test]
    fn docs_operator_lists_every_warning_with_its_action() {
        // Read at run time, not included: a test binary a fresh clone reuses checks that
        // clone's docs (scripts/source-mtimes).
        let path = std::path::Path::new(
            &std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR"),
        )
        .join("../docs/operator.md");
        let docs = std::fs::read_to_string(&path).expect("docs/operator.md");
        let docs = docs.as_str();
        for warning in Warning::ALL {
            let row = format!("| `{}` |", warning.reason());
            let line = docs
                .lines()
                .find(|l| l.starts_with(&row))
                .unwrap_or_else(|| panic!("docs/operator.md has no row {row}"));
            assert!(
                line.ends_with(&format!("| {} |", warning.what_to_do())),
                "docs/operator.md's row for {} does not end with its action: {line}",
                warning.reason()
            );
        }
    }

    #[test]
    fn a_long_note_keeps_its_action_and_fits_an_event() {
        let long = "pool p: field x is wrong; ".repeat(100);
        let note = Warning::InvalidSpec.note(&long);
        assert!(note.len() <= EVENT_NOTE_MAX_BYTES, "{} bytes", note.len());
        assert!(note.ends_with(Warning::InvalidSpec.what_to_do()), "{note}");
        assert!(note.contains("…. What to do:"), "{note}");
    }

    #[test]
    fn a_note_says_what_happened_then_what_to_do() {
        let note = Warning::HeldOut.note("demo-hot-1 left the key space");
        assert!(
            note.starts_with("demo-hot-1 left the key space. What to do: nothing while"),
            "{note}"
        );
    }
}
