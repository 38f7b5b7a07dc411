//! The cluster's prometheus-operator `ServiceMonitor` (`spec.monitoring.serviceMonitor`):
//! one per CacheCluster, scraping the `metrics` port of every pool's headless Service,
//! so each node is scraped once (the client Services front the same pods). Pure.
//!
//! Every node series gets `cachecluster` and `pool` from the Service's labels
//! (prometheus-operator adds `namespace`, `pod`, `service`, `endpoint` itself), the
//! labels the dashboards and alert rules select on (docs/metrics.md). The interval is
//! 30s: the CRD has no interval field.
//!
//! Built as a dynamic object: the `monitoring.coreos.com` types are not part of
//! Kubernetes, and the operator must run where they are not installed.
//!
//! Owns: the ServiceMonitor object and its API resource. Pure like all of `build/`
//! (checked by `scripts/check-layers`): kube's object types only, no client; imports
//! `validate` and `names`. Applying it is `apply`'s.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ObjectMeta};
use serde_json::json;

use super::names;
use crate::validate::ValidatedCluster;

/// The `monitoring.coreos.com/v1` `ServiceMonitor` resource.
pub fn service_monitor_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
        "servicemonitors",
    )
}

/// How often each node is scraped.
const SCRAPE_INTERVAL: &str = "30s";

/// A relabeling that copies the scraped Service's label `service_label` into
/// `target_label` (Prometheus exposes it as `__meta_kubernetes_service_label_<name>`,
/// every character outside `[a-zA-Z0-9_]` replaced by `_`).
fn relabel(service_label: &str, target_label: &str) -> serde_json::Value {
    let meta: String = service_label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    json!({
        "sourceLabels": [format!("__meta_kubernetes_service_label_{meta}")],
        "targetLabel": target_label,
        "action": "replace",
    })
}

/// The ServiceMonitor `<cluster>-nodes` for `cluster`.
pub fn build_service_monitor(cluster: &ValidatedCluster) -> DynamicObject {
    let mut selector = names::cluster_selector(&cluster.name);
    selector.insert(names::SERVICE_ROLE_LABEL.to_owned(), "nodes".to_owned());
    let mut labels = names::cluster_selector(&cluster.name);
    labels.insert(
        "app.kubernetes.io/managed-by".to_owned(),
        names::MANAGED_BY.to_owned(),
    );
    let mut monitor = DynamicObject::new(
        &names::service_monitor(&cluster.name),
        &service_monitor_resource(),
    )
    .within(&cluster.namespace);
    monitor.metadata = ObjectMeta {
        labels: Some(labels),
        owner_references: Some(vec![cluster.owner.clone()]),
        ..monitor.metadata
    };
    monitor.data = json!({
        "spec": {
            "selector": { "matchLabels": selector },
            "namespaceSelector": { "matchNames": [cluster.namespace] },
            "endpoints": [{
                "port": "metrics",
                "path": "/metrics",
                "interval": SCRAPE_INTERVAL,
                "relabelings": [
                    relabel(names::INSTANCE_LABEL, "cachecluster"),
                    relabel(names::POOL_LABEL, "pool"),
                ],
            }],
        }
    });
    monitor
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::fixtures::validated;

    #[test]
    fn it_scrapes_the_metrics_port_of_the_headless_services_only() {
        let cluster = validated(&[("hot", 3), ("cold", 1)]);
        let monitor = build_service_monitor(&cluster);
        let value = serde_json::to_value(&monitor).unwrap();
        assert_eq!(value["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(value["kind"], "ServiceMonitor");
        assert_eq!(value["metadata"]["name"], "demo-nodes");
        assert_eq!(value["metadata"]["namespace"], "cache");
        assert_eq!(
            value["metadata"]["ownerReferences"][0]["name"],
            cluster.owner.name
        );
        let selector = &value["spec"]["selector"]["matchLabels"];
        assert_eq!(selector[names::SERVICE_ROLE_LABEL], "nodes");
        assert_eq!(selector[names::INSTANCE_LABEL], "demo");
        assert_eq!(value["spec"]["endpoints"][0]["port"], "metrics");
        assert_eq!(value["spec"]["endpoints"][0]["interval"], "30s");
        // Every node series carries its cluster and pool (docs/metrics.md).
        assert_eq!(
            value["spec"]["endpoints"][0]["relabelings"],
            json!([
                {
                    "sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_instance"],
                    "targetLabel": "cachecluster",
                    "action": "replace",
                },
                {
                    "sourceLabels": ["__meta_kubernetes_service_label_flightcache_dev_pool"],
                    "targetLabel": "pool",
                    "action": "replace",
                },
            ])
        );
        assert!(value["spec"].get("targetLabels").is_none());
        assert_eq!(value["spec"]["namespaceSelector"]["matchNames"][0], "cache");
        // The headless Services carry the label it selects; the client Services do not.
        for pool in &cluster.pools {
            let headless = super::super::service::build_headless_service(&cluster, pool);
            let client = super::super::service::build_client_service(&cluster, pool);
            let role = |s: &k8s_openapi::api::core::v1::Service| {
                s.metadata.labels.as_ref().unwrap()[names::SERVICE_ROLE_LABEL].clone()
            };
            assert_eq!(role(&headless), "nodes");
            assert_eq!(role(&client), "client");
        }
    }
}
