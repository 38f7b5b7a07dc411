//! The operator's calls to running cache nodes: Flight `DoAction` on a pod's IP.
//!
//! The operator reads what each node runs (`stats`: config generation, ring version,
//! entry count, byte budget) and pushes changes (`configure`: live config fields and the
//! ring; `rebalance`: hand entries to their owners; `invalidate-local`: a
//! CacheInvalidation's part on one node). Every call has a deadline, so a
//! hung node delays a reconcile by seconds, never blocks it.
//!
//! Owns: the node client ([`NodeAdmin`]: channels, TLS, the admin token) and the typed
//! answers it reads (`crds::admin`). Must not import kube or any reconcile step: it
//! knows a pod IP, not Kubernetes objects.

use std::time::Duration;

use arrow_flight::{Action, FlightClient};
use bytes::Bytes;
use crds::admin::{
    self, AdminAction, AnswerError, ConfigureAnswer, InvalidateLocalRequest, RebalanceAnswer,
    RemovedAnswer, StatsAnswer,
};
use crds::node_config::NodeDocument;
use futures::StreamExt;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// How long the operator waits to connect to a node.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Deadline of `stats`, `topology` and `configure`.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of `rebalance` (it streams a node's entries to its peers).
const REBALANCE_TIMEOUT: Duration = Duration::from_secs(120);

/// A failed call to a node.
#[derive(Debug, thiserror::Error)]
pub enum NodeCallError {
    /// The address cannot be dialled.
    #[error("node {address}: bad address")]
    BadAddress {
        /// `ip:port`.
        address: String,
    },
    /// The node did not answer in time.
    #[error("node {address}: {action} timed out after {timeout:?}")]
    Timeout {
        /// `ip:port`.
        address: String,
        /// The action.
        action: AdminAction,
        /// The deadline.
        timeout: Duration,
    },
    /// The call failed (connection refused, a gRPC status from the node).
    #[error("node {address}: {action} failed")]
    Flight {
        /// `ip:port`.
        address: String,
        /// The action.
        action: AdminAction,
        /// The Flight error, with the node's status message.
        #[source]
        source: arrow_flight::error::FlightError,
    },
    /// The answer is not the JSON the action documents.
    #[error("node {address}: unexpected answer")]
    Answer {
        /// `ip:port`.
        address: String,
        /// The action and what could not be read.
        #[source]
        source: AnswerError,
    },
}

/// How the operator verifies nodes that serve TLS.
#[derive(Clone)]
pub struct NodeTls {
    /// The CA (PEM) of the cluster's TLS Secret.
    pub ca: Bytes,
    /// The name the nodes' certificate is verified for (nodes are called by pod IP).
    pub domain: String,
    /// The certificate and key (PEM) presented to nodes that require client
    /// certificates.
    pub identity: Option<(Bytes, Bytes)>,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls")
            .field("ca", &self.ca.len())
            .field("domain", &self.domain)
            .field("identity", &self.identity.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Calls nodes of one cluster (same port, token and TLS for every node).
#[derive(Clone)]
pub struct NodeAdmin {
    port: i32,
    token: Option<String>,
    tls: Option<NodeTls>,
}

impl std::fmt::Debug for NodeAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeAdmin")
            .field("port", &self.port)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl NodeAdmin {
    /// Calls nodes on `port`, with the admin token, over TLS when `tls` is given.
    pub fn new(port: i32, token: Option<String>, tls: Option<NodeTls>) -> Self {
        Self { port, token, tls }
    }

    /// What the node at `ip` runs and holds (one `stats` call): config generation, ring
    /// version, entry count, byte budget, uptime, whether it reads ring zones.
    ///
    /// # Errors
    /// [`NodeCallError`] naming the node and the action.
    pub async fn stats(&self, ip: &str) -> Result<StatsAnswer, NodeCallError> {
        self.call_json(ip, AdminAction::Stats, Bytes::new(), CALL_TIMEOUT)
            .await
    }

    /// Pushes `doc` (live config fields and/or a ring) to the node at `ip`.
    ///
    /// # Errors
    /// [`NodeCallError`]; a refused document comes back as the node's gRPC status.
    pub async fn configure(
        &self,
        ip: &str,
        doc: &NodeDocument,
    ) -> Result<ConfigureAnswer, NodeCallError> {
        let body = Bytes::from(doc.to_json());
        self.call_json(ip, AdminAction::Configure, body, CALL_TIMEOUT)
            .await
    }

    /// Asks the node at `ip` to hand every entry it does not own under its current ring
    /// to the owners.
    ///
    /// # Errors
    /// [`NodeCallError`].
    pub async fn rebalance(&self, ip: &str) -> Result<RebalanceAnswer, NodeCallError> {
        self.call_json(ip, AdminAction::Rebalance, Bytes::new(), REBALANCE_TIMEOUT)
            .await
    }

    /// Removes, on the node at `ip` alone, the entries `request` selects; the entries
    /// removed.
    ///
    /// # Errors
    /// [`NodeCallError`]; a refused request comes back as the node's gRPC status.
    pub async fn invalidate_local(
        &self,
        ip: &str,
        request: &InvalidateLocalRequest,
    ) -> Result<u64, NodeCallError> {
        let body = Bytes::from(admin::encode(request));
        let answer: RemovedAnswer = self
            .call_json(ip, AdminAction::InvalidateLocal, body, CALL_TIMEOUT)
            .await?;
        Ok(answer.removed)
    }

    fn address(&self, ip: &str) -> String {
        if ip.contains(':') {
            format!("[{ip}]:{}", self.port)
        } else {
            format!("{ip}:{}", self.port)
        }
    }

    async fn call_json<T: serde::de::DeserializeOwned>(
        &self,
        ip: &str,
        action: AdminAction,
        body: Bytes,
        timeout: Duration,
    ) -> Result<T, NodeCallError> {
        let address = self.address(ip);
        let answer = self.call(&address, action, body, timeout).await?;
        admin::decode(action, &answer).map_err(|source| NodeCallError::Answer { address, source })
    }

    async fn call(
        &self,
        address: &str,
        action: AdminAction,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, NodeCallError> {
        let flight = |source| NodeCallError::Flight {
            address: address.to_owned(),
            action,
            source,
        };
        let bad_address = || NodeCallError::BadAddress {
            address: address.to_owned(),
        };
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint =
            Endpoint::from_shared(format!("{scheme}://{address}")).map_err(|_| bad_address())?;
        if let Some(tls) = &self.tls {
            let mut config = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&tls.ca))
                .domain_name(&tls.domain);
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            endpoint = endpoint.tls_config(config).map_err(|_| bad_address())?;
        }
        let channel = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(timeout)
            .connect_lazy();
        let mut client = FlightClient::new(channel);
        if let Some(token) = &self.token {
            client
                .add_header("authorization", &format!("Bearer {token}"))
                .map_err(flight)?;
        }
        let call = async {
            let mut results = client
                .do_action(Action::new(action.as_str(), body))
                .await
                .map_err(flight)?;
            match results.next().await {
                Some(result) => result.map_err(flight),
                None => Ok(Bytes::new()),
            }
        };
        tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| NodeCallError::Timeout {
                address: address.to_owned(),
                action,
                timeout,
            })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_pod_addresses_are_bracketed() {
        let admin = NodeAdmin::new(50051, None, None);
        assert_eq!(admin.address("10.244.0.7"), "10.244.0.7:50051");
        assert_eq!(admin.address("fd00::7"), "[fd00::7]:50051");
    }

    #[test]
    fn the_token_never_appears_in_debug_output() {
        let admin = NodeAdmin::new(50051, Some("s3cret".into()), None);
        assert!(!format!("{admin:?}").contains("s3cret"));
    }
}
