//! The `CacheCluster` resource (`flightcache.dev/v1alpha1`): what a user applies.
//!
//! A cluster has one or more pools; a pool is one StatefulSet of cache nodes with one
//! configuration. This module holds the root and cluster-wide types; [`pool`] the pool,
//! [`status`] what the operator reports, [`defaults`] every default, [`rules`] the CEL
//! rules the API server enforces, [`validate`] the same checks in Rust, and
//! [`change_class`] how a change of each field rolls out. Every doc comment here is
//! `kubectl explain` text and a paragraph of `docs/crd-reference.md`. Pure; no I/O.

pub mod change_class;
pub mod defaults;
pub mod pool;
pub mod rules;
pub mod status;
pub mod validate;

use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use self::change_class::ChangeClass;
pub use self::pool::{PersistenceSpec, PoolSpec, SchedulingSpec, SpreadSpec, WhenUnsatisfiable};
pub use self::status::{CacheClusterStatus, NodeStatus, PoolStatus, PoolUsage};
pub use self::validate::{FieldError, InvalidSpec};
pub use crate::node_config::ClientAuth;

/// The API group of every FlightCache resource.
pub const GROUP: &str = "flightcache.dev";
/// The served and stored version of `CacheCluster`.
pub const VERSION: &str = "v1alpha1";

/// Desired state of a FlightCache cluster: its pools of cache nodes and the settings
/// they share.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "flightcache.dev",
    version = "v1alpha1",
    kind = "CacheCluster",
    namespaced,
    shortname = "cc",
    category = "flightcache",
    status = "CacheClusterStatus",
    derive = "PartialEq",
    doc = "A FlightCache cluster: pools of Arrow Flight cache nodes that hold query results (Arrow record batches) under keys. The operator runs one StatefulSet per pool and keeps its nodes sharded, configured and healthy; TTL, eviction and entry caps change live, without restarts.",
    printcolumn(
        name = "Pools",
        type_ = "string",
        json_path = ".status.poolNames",
        description = "Names of the pools."
    ),
    printcolumn(
        name = "Shards",
        type_ = "string",
        json_path = ".status.shardsReady",
        description = "Ready and desired cache nodes over all pools, as ready/desired."
    ),
    printcolumn(
        name = "Config",
        type_ = "integer",
        json_path = ".status.configGeneration",
        description = "Newest node configuration generation the operator has written."
    ),
    printcolumn(
        name = "Up-To-Date",
        type_ = "integer",
        json_path = ".status.updatedShards",
        description = "Cache nodes running the newest configuration generation."
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether every shard of every pool is ready."
    ),
    printcolumn(
        name = "Hit-Ratio",
        type_ = "string",
        json_path = ".status.hitRatio",
        description = "Share of lookups that found their entry since the operator's previous sample (samples at least 30 s apart), over every pool."
    ),
    printcolumn(
        name = "Memory",
        type_ = "string",
        json_path = ".status.memoryUsed",
        description = "Arrow bytes held over the byte budget, over every pool's nodes."
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "Why the cluster is (not) ready.",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    validation = Rule::new(rules::CLUSTER_NAME).message(rules::CLUSTER_NAME_MSG),
    validation = Rule::new(rules::NAME_LENGTH).message(rules::NAME_LENGTH_MSG).field_path(".spec.pools"),
)]
#[x_kube(validation = Rule::new(rules::PORTS_DIFFER).message(rules::PORTS_DIFFER_MSG).field_path(".port"))]
#[serde(rename_all = "camelCase")]
pub struct CacheClusterSpec {
    /// Pools of cache nodes. Each pool is one StatefulSet `<cluster>-<pool>` whose nodes
    /// share one configuration, and one client Service with the same name. Pools are
    /// keyed by name (server-side apply merges them by name). Between 1 and 16 pools;
    /// names must be unique, and none may be another's followed by `-nodes` (pool P's
    /// headless Service is `<cluster>-P-nodes`). Adding a pool creates its nodes; removing one deletes
    /// its nodes and the entries they hold.
    #[x_kube(
        validation = Rule::new(rules::POOLS_NOT_EMPTY).message(rules::POOLS_NOT_EMPTY_MSG),
        validation = Rule::new(rules::POOLS_UNIQUE).message(rules::POOLS_UNIQUE_MSG),
        validation = Rule::new(rules::POOL_OBJECTS_DISTINCT).message(rules::POOL_OBJECTS_DISTINCT_MSG),
        merge_strategy = ListMerge::Map(vec!["name".into()])
    )]
    #[schemars(length(max = 16))]
    pub pools: Vec<PoolSpec>,

    /// Container image of the cache nodes (`flightcache-node`). When unset the operator
    /// uses the image of its own release. A pool may override it.
    /// Change: restart with handoff (node by node; each node's hot set is handed off).
    #[x_kube(validation = Rule::new(rules::IMAGE).message(rules::IMAGE_MSG))]
    #[schemars(length(max = 512))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// Arrow Flight (gRPC) port of every node and of each pool's client Service. Clients
    /// connect to `grpc+tls://<cluster>-<pool>.<namespace>.svc:<port>` (`grpc://` with
    /// `tls.disabled`). Between 1 and 65535;
    /// must differ from `monitoring.metricsPort`.
    /// Change: restart with handoff.
    #[x_kube(validation = Rule::new(rules::PORT).message(rules::PORT_MSG))]
    #[serde(default = "defaults::port")]
    pub port: i32,

    /// Client authentication, on by default: every Flight call (`Handshake` included) must
    /// carry `authorization: Bearer <token>` with a token from the Secret `auth.secretName`
    /// names, or, when it names none (or `auth` is unset), from the Secret
    /// `<cluster>-client-token` (key `token`) that the operator generates and owns;
    /// `status.clientTokenSecret` names the Secret in use. `auth.disabled: true` serves
    /// clients without a token. Either way the admin actions (configure, stats, topology,
    /// clear, rebalance, held) need the cluster's admin token (peers may also clear and ask
    /// held) and nodes call each other with a peer token, both in the operator-owned
    /// Secret `<cluster>-internal`.
    /// Change: restart with handoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,

    /// TLS for the Flight port, on by default. Nodes serve gRPC over TLS with the
    /// certificate in the Secret `secretName` names, or (unset, or `tls: {}`) one the
    /// operator issues, verify each other against its `ca.crt`, and clients use
    /// `grpc+tls://` trusting that CA (`status.caSecret` names the Secret holding the
    /// operator's). A certificate rotated in the Secret (cert-manager renewing it, or the
    /// operator) is served within about a minute, without a restart or a failed call.
    /// `tls: {disabled: true}` serves plaintext. A cluster an earlier operator served in
    /// plaintext (its status shows `grpc://` endpoints) stays plaintext while `tls` is
    /// unset, with a Warning: set `tls: {}` to move it to TLS, or `disabled: true`.
    /// Change: restart with handoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,

    /// Metrics settings of the cache nodes.
    #[serde(default)]
    pub monitoring: MonitoringSpec,

    /// Who may reach the nodes. The operator keeps one NetworkPolicy per pool
    /// (`<cluster>-<pool>`) admitting the pool's own nodes, the operator, `clients` on the
    /// Flight port and `metricsScrapers` on the metrics port, and nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicySpec>,
}

/// The pools' NetworkPolicies.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Leave the pools without a NetworkPolicy (the operator deletes the ones it made).
    /// Change: live (no node restarts).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,

    /// Who may call the Flight port, as NetworkPolicy peers (`podSelector`,
    /// `namespaceSelector`, `ipBlock`). Unset: every pod of the cluster's namespace.
    /// Change: live (no node restarts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<Vec<NetworkPolicyPeer>>,

    /// Who may scrape the metrics port, as NetworkPolicy peers. Unset: any pod of any
    /// namespace (the series name no keys).
    /// Change: live (no node restarts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_scrapers: Option<Vec<NetworkPolicyPeer>>,
}

/// Client token authentication.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = Rule::new(rules::AUTH_DISABLED_ALONE).message(rules::AUTH_DISABLED_ALONE_MSG))]
#[serde(rename_all = "camelCase")]
pub struct AuthSpec {
    /// Name of a Secret in the cluster's namespace whose key `key` holds the token(s)
    /// clients must present, one per line (two while a token is rotated: nodes re-read
    /// it, so a token added is accepted and one removed refused within about a minute,
    /// without a restart); it must carry the label `flightcache.dev/cluster: <cluster>`
    /// (nodes mount only Secrets labelled for their cluster). Unset: the operator generates the Secret `<cluster>-client-token`.
    /// Change: restart with handoff.
    #[x_kube(validation = Rule::new(rules::DNS_SUBDOMAIN).message(rules::AUTH_SECRET_MSG))]
    #[schemars(length(max = 253))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,

    /// Key of the token in the Secret's data.
    /// Change: restart with handoff.
    #[x_kube(validation = Rule::new(rules::SECRET_KEY).message(rules::AUTH_KEY_MSG))]
    #[schemars(length(max = 253))]
    #[serde(default = "defaults::auth_key")]
    pub key: String,

    /// Serve clients without a token (the admin and peer credentials stay on). Only
    /// for pools that a NetworkPolicy or the network itself keeps private.
    /// Change: restart with handoff.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
}

impl Default for AuthSpec {
    /// A generated token (what an unset `spec.auth` means).
    fn default() -> Self {
        Self {
            secret_name: None,
            key: defaults::auth_key(),
            disabled: false,
        }
    }
}

/// TLS for the Flight port: with a certificate the operator issues, or one from a Secret.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[x_kube(
    validation = Rule::new(rules::CLIENT_AUTH_NEEDS_SECRET).message(rules::CLIENT_AUTH_NEEDS_SECRET_MSG),
    validation = Rule::new(rules::TLS_DISABLED_ALONE).message(rules::TLS_DISABLED_ALONE_MSG)
)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// Name of a Secret in the cluster's namespace in cert-manager's shape: `tls.crt`,
    /// `tls.key` and `ca.crt` (the CA that signed it), labelled
    /// `flightcache.dev/cluster: <cluster>`. Its certificate must be valid for
    /// the pools' Service names (`<cluster>-<pool>.<namespace>.svc`, and with
    /// `.cluster.local` for clients using the full name) and, since nodes call each other
    /// by name, for `*.<cluster>-<pool>-nodes.<namespace>.svc.cluster.local`. A missing
    /// Secret or key, or a certificate that is expired, not signed by `ca.crt` or lacks a
    /// name is reported as Degraded with the reason. Unset: the operator issues a CA
    /// and a certificate for every name itself (renewed when a third of its lifetime is
    /// left, or when a pool is added), and clients trust the CA in the Secret
    /// `status.caSecret` names (key `ca.crt`).
    /// Change: restart with handoff.
    #[x_kube(validation = Rule::new(rules::DNS_SUBDOMAIN).message(rules::TLS_SECRET_MSG))]
    #[schemars(length(max = 253))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// Client certificate authentication. `required`: every connection to a node must
    /// present a certificate signed by the Secret's `ca.crt`, or its TLS handshake fails
    /// before any call is read; nodes present their own certificate to each other and the
    /// operator presents the Secret's, so `tls.crt` must allow client authentication (an
    /// extended key usage, if it has one, must list `clientAuth`: cert-manager `usages:
    /// [server auth, client auth]`). Tokens still decide what each call may do. `none`
    /// (default): no client certificate is asked for. `required` needs `secretName`
    /// (clients need certificates of a CA someone issues them from).
    /// Change: restart with handoff.
    #[serde(default, skip_serializing_if = "is_default_client_auth")]
    pub client_auth: ClientAuth,

    /// Serve the Flight port in plaintext: tokens, the admin's included, cross the pod
    /// network in clear. Only for pools the network itself keeps private.
    /// Change: restart with handoff.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
}

// serde's skip_serializing_if hands the field by reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_default_client_auth(client_auth: &ClientAuth) -> bool {
    *client_auth == ClientAuth::None
}

/// Metrics settings of the cache nodes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MonitoringSpec {
    /// Port of every node's Prometheus `/metrics` endpoint (named `metrics` on the pods
    /// and Services). Between 1 and 65535; must differ from `port`.
    /// Change: restart with handoff.
    #[x_kube(validation = Rule::new(rules::PORT).message(rules::METRICS_PORT_MSG))]
    #[serde(default = "defaults::metrics_port")]
    pub metrics_port: i32,

    /// Create a prometheus-operator `ServiceMonitor` `<cluster>-nodes` that scrapes every
    /// node's metrics port once, through the pools' headless Services (needs the
    /// `monitoring.coreos.com` CRDs; without them the operator records a
    /// `ServiceMonitorUnavailable` event and carries on). Turning it off deletes it.
    /// Change: live (no node restarts).
    #[serde(default = "defaults::service_monitor")]
    pub service_monitor: bool,
}

impl Default for MonitoringSpec {
    /// Every monitoring field at its default.
    fn default() -> Self {
        Self {
            metrics_port: defaults::metrics_port(),
            service_monitor: defaults::service_monitor(),
        }
    }
}

impl CacheClusterSpec {
    /// A spec with these pools and every other field at its default.
    pub fn with_pools(pools: Vec<PoolSpec>) -> Self {
        Self {
            pools,
            image: None,
            port: defaults::port(),
            auth: None,
            tls: None,
            monitoring: MonitoringSpec::default(),
            network_policy: None,
        }
    }
}
