//! When a node reports ready: once the DNS name its peers dial resolves to it.
//!
//! In a pool, peers forward to a member by its headless-Service name and the operator
//! adds a member to the ring when its pod turns Ready. The name's record follows the pod
//! through the EndpointSlice controller and the cluster DNS, a path that can lag the
//! kubelet's readiness by seconds on a busy control plane; a restarted pod's name keeps
//! resolving to its old IP while the DNS cache holds it. A node that reported ready
//! before its name worked had peers fail its keys with `dns error` or `tcp connect
//! error`. So readiness waits for the name: resolved by the same resolver the peers use,
//! to this pod's IP.
//!
//! `--advertised-lookup` says where the name is asked: the system resolver (default),
//! or the cluster DNS directly ([`dns`]) — in a pod the hosts file holds the pod's own
//! name, which makes the system resolver's answer come before any peer can resolve it.
//!
//! Owns: the wait. Must not import the Flight service or the store.

pub mod dns;

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::{Advertised, AdvertisedLookup};

/// Pause between lookups while the name does not resolve to this node.
pub const LOOKUP_INTERVAL: Duration = Duration::from_millis(250);
/// Longest one lookup may take before it counts as failed.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a node still waiting says so in its log.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Why the advertised name does not lead here yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotYet {
    /// The lookup failed (no record yet, or the resolver is unreachable).
    Unresolved(String),
    /// The name resolves, but not to this pod's IP (a stale record of an earlier pod).
    Elsewhere(Vec<IpAddr>),
}

impl std::fmt::Display for NotYet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unresolved(reason) => write!(f, "does not resolve: {reason}"),
            Self::Elsewhere(ips) => write!(f, "resolves to {ips:?}, not to this pod"),
        }
    }
}

/// Whether `resolved` (the addresses a lookup of the advertised name returned) leads to
/// this node.
pub fn check(advertised: &Advertised, resolved: io::Result<Vec<IpAddr>>) -> Result<(), NotYet> {
    let ips = resolved.map_err(|err| NotYet::Unresolved(err.to_string()))?;
    if ips.is_empty() {
        return Err(NotYet::Unresolved("no address".into()));
    }
    match advertised.ip {
        Some(ip) if !ips.contains(&ip) => Err(NotYet::Elsewhere(ips)),
        _ => Ok(()),
    }
}

/// Resolves `host` with the system resolver (the hosts file, then DNS).
pub async fn system_lookup(host: String) -> io::Result<Vec<IpAddr>> {
    let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
    Ok(addrs.map(|addr| addr.ip()).collect())
}

/// Resolves the advertised name the way `advertised.lookup` says.
pub async fn lookup(advertised: &Advertised) -> io::Result<Vec<IpAddr>> {
    let family = dns::Family::of(advertised.ip);
    match advertised.lookup {
        AdvertisedLookup::System => system_lookup(advertised.host.clone()).await,
        AdvertisedLookup::Dns => {
            let servers = dns::system_nameservers()?;
            dns::lookup(&advertised.host, family, &servers).await
        }
        AdvertisedLookup::Nameserver(server) => {
            dns::lookup(&advertised.host, family, &[server]).await
        }
    }
}

/// Waits until `lookup` of the advertised name leads to this node, or until `stop`
/// turns true. Returns whether the name resolved (false: stopped first).
pub async fn wait_until_resolvable<F, Fut>(
    advertised: &Advertised,
    lookup: F,
    mut stop: watch::Receiver<bool>,
) -> bool
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = io::Result<Vec<IpAddr>>>,
{
    let started = Instant::now();
    let mut last_warning = started;
    loop {
        let resolved =
            match tokio::time::timeout(LOOKUP_TIMEOUT, lookup(advertised.host.clone())).await {
                Ok(resolved) => resolved,
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no answer within {LOOKUP_TIMEOUT:?}"),
                )),
            };
        match check(advertised, resolved) {
            Ok(()) => {
                tracing::info!(
                    host = %advertised.host,
                    waited_ms = started.elapsed().as_millis(),
                    "advertised name resolves to this node: ready"
                );
                return true;
            }
            Err(not_yet) if last_warning.elapsed() >= WARN_EVERY => {
                last_warning = Instant::now();
                tracing::warn!(
                    host = %advertised.host,
                    waited_s = started.elapsed().as_secs(),
                    "not ready: the advertised name {not_yet}"
                );
            }
            Err(not_yet) => {
                tracing::debug!(host = %advertised.host, "advertised name {not_yet}");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(LOOKUP_INTERVAL) => {}
            _ = stop.wait_for(|stop| *stop) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn advertised(ip: Option<&str>) -> Advertised {
        Advertised {
            host: "c-hot-1.c-hot-nodes.ns.svc.cluster.local".into(),
            ip: ip.map(|ip| ip.parse().unwrap()),
            lookup: AdvertisedLookup::Dns,
        }
    }

    fn ips(list: &[&str]) -> io::Result<Vec<IpAddr>> {
        Ok(list.iter().map(|ip| ip.parse().unwrap()).collect())
    }

    #[test]
    fn a_name_that_does_not_resolve_is_not_ready() {
        let nx = io::Error::new(io::ErrorKind::NotFound, "no record");
        assert!(matches!(
            check(&advertised(Some("10.0.0.7")), Err(nx)),
            Err(NotYet::Unresolved(_))
        ));
        assert!(matches!(
            check(&advertised(None), ips(&[])),
            Err(NotYet::Unresolved(_))
        ));
    }

    #[test]
    fn a_stale_record_of_an_earlier_pod_is_not_ready() {
        let result = check(&advertised(Some("10.0.0.7")), ips(&["10.0.0.3"]));
        assert_eq!(
            result,
            Err(NotYet::Elsewhere(vec!["10.0.0.3".parse().unwrap()]))
        );
    }

    #[test]
    fn the_pods_own_ip_among_the_answers_is_ready() {
        assert_eq!(
            check(
                &advertised(Some("10.0.0.7")),
                ips(&["10.0.0.3", "10.0.0.7"])
            ),
            Ok(())
        );
        assert_eq!(check(&advertised(None), ips(&["10.0.0.3"])), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_at_the_first_answer_that_leads_here() {
        // Answers in order: no record, the old pod's IP, a lookup that hangs, this pod.
        let calls = Arc::new(AtomicUsize::new(0));
        let lookup = {
            let calls = Arc::clone(&calls);
            move |_host: String| {
                let call = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    match call {
                        0 => Err(io::Error::new(io::ErrorKind::NotFound, "NXDOMAIN")),
                        1 => ips(&["10.0.0.3"]),
                        2 => std::future::pending().await,
                        _ => ips(&["10.0.0.7"]),
                    }
                }
            }
        };
        let (_stop_tx, stop) = watch::channel(false);
        let started = tokio::time::Instant::now();
        assert!(wait_until_resolvable(&advertised(Some("10.0.0.7")), lookup, stop).await);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        // Three pauses and one lookup timed out.
        assert_eq!(started.elapsed(), LOOKUP_INTERVAL * 3 + LOOKUP_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_wait_without_ready() {
        let (stop_tx, stop) = watch::channel(false);
        let never = |_host: String| async { ips(&["10.0.0.3"]) };
        let wait = tokio::spawn(async move {
            wait_until_resolvable(&advertised(Some("10.0.0.7")), never, stop).await
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        stop_tx.send(true).unwrap();
        assert!(!wait.await.unwrap());
    }
}
