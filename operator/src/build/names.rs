//! Object names and labels: the one place that knows how children are named.
//!
//! For cluster `c` and pool `p`: StatefulSet, client Service, ConfigMap and PDB are
//! `c-p`; the headless Service giving nodes stable DNS names is `c-p-nodes`; node `i`
//! is `c-p-i`, reachable as `c-p-i.c-p-nodes.<namespace>.svc`. Pure.
//!
//! Owns: every child's name and label. A leaf: must not import any other module of the
//! operator; pure.

use std::collections::BTreeMap;

/// `app.kubernetes.io/name` of every node object.
pub const APP_NAME: &str = "flightcache-node";
/// `app.kubernetes.io/managed-by` of every child.
pub const MANAGED_BY: &str = "flightcache-operator";
/// Label naming the pool of a child.
pub const POOL_LABEL: &str = "flightcache.dev/pool";
/// Label telling a pool's two Services apart: `nodes` (headless, one endpoint per node,
/// what the ServiceMonitor selects) or `client`.
pub const SERVICE_ROLE_LABEL: &str = "flightcache.dev/service";
/// Label naming the cluster of a child (also `app.kubernetes.io/instance`).
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Pod-template annotation with the hash of restart-class settings.
pub const CONFIG_HASH_ANNOTATION: &str = "flightcache.dev/config-hash";
/// Annotation with the config generation a ConfigMap or pod template carries.
pub const CONFIG_GENERATION_ANNOTATION: &str = "flightcache.dev/config-generation";
/// Key of the node config document in the pool's ConfigMap.
pub const NODE_CONFIG_KEY: &str = "node.json";
/// Where the node config is mounted in a node container.
pub const NODE_CONFIG_DIR: &str = "/etc/flightcache";

/// Key of the token in the client token Secret the operator generates.
pub const GENERATED_TOKEN_KEY: &str = "token";
/// Key of the admin token in the cluster's internal Secret.
pub const ADMIN_TOKEN_KEY: &str = "admin-token";
/// Key of the peer token in the cluster's internal Secret.
pub const PEER_TOKEN_KEY: &str = "peer-token";

/// Keys of the TLS Secret (cert-manager's shape), mounted as files of the same names.
pub const TLS_CERT_KEY: &str = "tls.crt";
/// See [`TLS_CERT_KEY`].
pub const TLS_KEY_KEY: &str = "tls.key";
/// See [`TLS_CERT_KEY`].
pub const TLS_CA_KEY: &str = "ca.crt";
/// Path of the node's readiness endpoint on its metrics port (used when the Flight port
/// speaks TLS, which the kubelet's gRPC probes cannot).
pub const READYZ_PATH: &str = "/readyz";
/// The node's liveness path on its metrics port (TLS clusters' liveness probe).
pub const LIVEZ_PATH: &str = "/livez";
/// The gRPC health service name a node reports ready under (the Flight service's).
pub const FLIGHT_HEALTH_SERVICE: &str = "arrow.flight.protocol.FlightService";
/// The readiness gate of every node pod: a pod condition only the operator writes, `True`
/// once the node runs the pool's current ring, `False` while the operator holds the node
/// out of the key space (unready too long, or its Kubernetes node lost). The kubelet
/// counts a pod Ready only while it is `True`, so a node that comes back from a freeze or
/// a network partition takes no client call before it has the ring that tells it it was
/// out — and so dropped what it held, which may have been overwritten or invalidated
/// meanwhile (docs/failure-model.md, "Network partition").
pub const IN_RING_CONDITION: &str = "flightcache.dev/in-ring";

/// Name of the client token Secret the operator generates when `spec.auth` names none.
pub fn client_token_secret(cluster: &str) -> String {
    format!("{cluster}-client-token")
}

/// Name of the cluster's internal Secret: the admin and peer tokens, generated and owned
/// by the operator, mounted by every node.
pub fn internal_secret(cluster: &str) -> String {
    format!("{cluster}-internal")
}

/// Name of the Secret nodes mount when the operator issues the cluster's certificate
/// (`tls.crt`, `tls.key`, `ca.crt`, as cert-manager writes them).
pub fn issued_tls_secret(cluster: &str) -> String {
    format!("{cluster}-tls")
}

/// Name of the Secret the nodes mount for TLS: the operator's copy of the cluster's TLS
/// Secret, moved towards it in phases (`tls_rollout`).
pub fn node_tls_secret(cluster: &str) -> String {
    format!("{cluster}-node-tls")
}

/// Name of the Secret holding the CA clients trust when the operator issues the
/// cluster's certificate (`ca.crt` only): the one `status.caSecret` names.
pub fn issued_ca_secret(cluster: &str) -> String {
    format!("{cluster}-ca")
}

/// Name of the Secret holding the issued CA's certificate and key (`ca.crt`,
/// `ca.key`): read by the operator only, never mounted.
pub fn issuer_secret(cluster: &str) -> String {
    format!("{cluster}-ca-key")
}

/// Key of the issued CA's private key in [`issuer_secret`].
pub const CA_KEY_KEY: &str = "ca.key";

/// Name of the StatefulSet, client Service, ConfigMap and PDB of a pool.
pub fn pool_object(cluster: &str, pool: &str) -> String {
    format!("{cluster}-{pool}")
}

/// Name of the cluster's ServiceMonitor (one for all pools).
pub fn service_monitor(cluster: &str) -> String {
    format!("{cluster}-nodes")
}

/// Name of the pool's headless Service.
pub fn headless_service(cluster: &str, pool: &str) -> String {
    format!("{cluster}-{pool}-nodes")
}

/// The scheme of a plaintext endpoint (`status.pools[].endpoint`).
pub const PLAINTEXT_SCHEME: &str = "grpc://";
/// The scheme of a TLS endpoint.
pub const TLS_SCHEME: &str = "grpc+tls://";

/// The client endpoint users dial (`grpc+tls://` when the nodes serve TLS).
pub fn client_endpoint(cluster: &str, pool: &str, namespace: &str, port: u16, tls: bool) -> String {
    let scheme = if tls { TLS_SCHEME } else { PLAINTEXT_SCHEME };
    format!("{scheme}{cluster}-{pool}.{namespace}.svc:{port}")
}

/// Labels selecting every child of a cluster.
pub fn cluster_selector(cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), APP_NAME.to_owned()),
        (INSTANCE_LABEL.to_owned(), cluster.to_owned()),
    ])
}

/// Labels selecting the pods of one pool (the StatefulSet, Service and PDB selector).
pub fn pool_selector(cluster: &str, pool: &str) -> BTreeMap<String, String> {
    let mut labels = cluster_selector(cluster);
    labels.insert(POOL_LABEL.to_owned(), pool.to_owned());
    labels
}

/// Full recommended labels of a pool's objects.
pub fn pool_labels(cluster: &str, pool: &str) -> BTreeMap<String, String> {
    let mut labels = pool_selector(cluster, pool);
    labels.insert(
        "app.kubernetes.io/component".to_owned(),
        "cache-node".to_owned(),
    );
    labels.insert(
        "app.kubernetes.io/managed-by".to_owned(),
        MANAGED_BY.to_owned(),
    );
    labels
}

/// A selector string for list calls.
pub fn selector_string(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The field manager of every server-side apply and status patch the operator makes.
pub const FIELD_MANAGER: &str = "flightcache-operator";
