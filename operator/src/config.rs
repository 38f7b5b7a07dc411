//! The operator's one typed configuration (flags and environment).
//!
//! Owns: [`Config`]. A leaf: must not import any other module of the operator; no I/O
//! beyond flags and the environment.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;

/// Command line of `flightcache-operator`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "flightcache-operator",
    version,
    about = "FlightCache Kubernetes operator"
)]
pub struct Config {
    /// Address of /metrics, /healthz and /readyz.
    #[arg(
        long,
        env = "FLIGHTCACHE_OPERATOR_METRICS_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_listen: SocketAddr,
    /// Cache node image used when a CacheCluster names none.
    #[arg(long, env = "FLIGHTCACHE_NODE_IMAGE", default_value = concat!("flightcache/node:", env!("CARGO_PKG_VERSION")))]
    pub node_image: String,
    /// imagePullPolicy of node containers.
    #[arg(
        long,
        env = "FLIGHTCACHE_NODE_IMAGE_PULL_POLICY",
        default_value = "IfNotPresent"
    )]
    pub node_image_pull_policy: String,
    /// DNS domain of the Kubernetes cluster: ring members are addressed by their stable
    /// pod names, `<pod>.<headless service>.<namespace>.svc.<domain>`.
    #[arg(
        long,
        env = "FLIGHTCACHE_CLUSTER_DOMAIN",
        default_value = "cluster.local"
    )]
    pub cluster_domain: String,
    /// Image repositories node pods may run, comma-separated (e.g. `flightcache/node`); a
    /// CacheCluster naming another image is refused as invalid. Default: the repository of
    /// --node-image.
    #[arg(long, env = "FLIGHTCACHE_ALLOWED_IMAGES", value_delimiter = ',')]
    pub allowed_images: Vec<String>,
    /// Watch only these namespaces, comma-separated (default: all namespaces). With a
    /// list, the operator needs rights in those namespaces only (the chart's default).
    #[arg(long, env = "FLIGHTCACHE_WATCH_NAMESPACE", value_delimiter = ',')]
    pub watch_namespace: Vec<String>,
    /// How long the serving certificates the operator issues (clusters whose `spec.tls`
    /// names no Secret) are valid; each is renewed when a third of it is left. At least
    /// 10m.
    #[arg(long, env = "FLIGHTCACHE_ISSUED_CERTIFICATE_LIFETIME", value_parser = parse_certificate_lifetime, default_value = "2160h")]
    pub issued_certificate_lifetime: Duration,
    /// Elect a leader with a Lease so several replicas can run.
    #[arg(long, env = "FLIGHTCACHE_LEADER_ELECTION", default_value_t = false, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Namespace of the leader Lease (the operator's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Name of the leader Lease.
    #[arg(
        long,
        env = "FLIGHTCACHE_LEASE_NAME",
        default_value = "flightcache-operator"
    )]
    pub lease_name: String,
    /// This replica's identity in the Lease (its pod name).
    #[arg(long, env = "POD_NAME", default_value = "flightcache-operator")]
    pub identity: String,
    /// How long a leader's claim lasts without renewal.
    #[arg(long, env = "FLIGHTCACHE_LEASE_DURATION", value_parser = crds::quantity::parse_duration, default_value = "15s")]
    pub lease_duration: Duration,
    /// Log format: text or json.
    #[arg(long, env = "FLIGHTCACHE_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn the_charts_arguments_parse() {
        let config = Config::try_parse_from([
            "flightcache-operator",
            "--metrics-listen=0.0.0.0:8080",
            "--node-image=flightcache/node:0.1.0",
            "--node-image-pull-policy=Never",
            "--log-format=json",
            "--leader-election=true",
            "--watch-namespace=cache,bi",
        ])
        .unwrap();
        assert!(config.leader_election);
        assert_eq!(config.watch_namespace, ["cache", "bi"]);
        assert!(
            !Config::try_parse_from(["flightcache-operator"])
                .unwrap()
                .leader_election
        );
    }

    #[test]
    fn an_issued_certificate_lifetime_leaves_room_for_the_kubelets_sync() {
        assert_eq!(
            parse_certificate_lifetime("2160h").unwrap(),
            Duration::from_secs(90 * 24 * 3600)
        );
        assert_eq!(
            parse_certificate_lifetime("10m").unwrap(),
            MIN_CERT_LIFETIME
        );
        let err = parse_certificate_lifetime("9m").unwrap_err();
        assert!(err.contains("shorter than 600s"), "{err}");
        assert!(parse_certificate_lifetime("soon").is_err());
    }
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Shortest serving certificate lifetime the operator accepts: renewal comes at two
/// thirds of it, and the kubelet's sync of a Secret volume (about a minute by default)
/// and the nodes' 5 s re-read must fit well inside the last third.
pub const MIN_CERT_LIFETIME: Duration = Duration::from_secs(10 * 60);

/// A serving certificate lifetime: a duration of at least [`MIN_CERT_LIFETIME`].
fn parse_certificate_lifetime(text: &str) -> Result<Duration, String> {
    let lifetime = crds::quantity::parse_duration(text).map_err(|err| err.to_string())?;
    if lifetime < MIN_CERT_LIFETIME {
        return Err(format!(
            "{text} is shorter than {}s: renewal comes when a third is left, and the \
             kubelet's sync of the Secret must fit in that third",
            MIN_CERT_LIFETIME.as_secs()
        ));
    }
    Ok(lifetime)
}
