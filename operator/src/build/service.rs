//! The pool's two Services: headless (stable per-node DNS names for routing) and client
//! (`c-p`, the Flight endpoint users dial). Pure.
//!
//! Owns: the two Services. Pure like all of `build/` (checked by
//! `scripts/check-layers`): imports `validate` and `names` only.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::names;
use crate::validate::{ValidatedCluster, ValidatedPool};

fn ports(cluster: &ValidatedCluster) -> Vec<ServicePort> {
    vec![
        ServicePort {
            name: Some("flight".into()),
            port: i32::from(cluster.port),
            target_port: Some(IntOrString::String("flight".into())),
            app_protocol: Some("kubernetes.io/h2c".into()),
            ..ServicePort::default()
        },
        ServicePort {
            name: Some("metrics".into()),
            port: i32::from(cluster.metrics_port),
            target_port: Some(IntOrString::String("metrics".into())),
            ..ServicePort::default()
        },
    ]
}

/// `metadata` with the Service's role label (see [`names::SERVICE_ROLE_LABEL`]).
fn with_role(
    mut metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    role: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(names::SERVICE_ROLE_LABEL.to_owned(), role.to_owned());
    metadata
}

/// The headless Service `c-p-nodes`; it publishes not-ready nodes too, so peers can
/// reach a node that is still warming up.
pub fn build_headless_service(cluster: &ValidatedCluster, pool: &ValidatedPool) -> Service {
    Service {
        metadata: with_role(
            super::meta::owned_metadata(
                cluster,
                pool,
                names::headless_service(&cluster.name, &pool.name),
            ),
            "nodes",
        ),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(names::pool_selector(&cluster.name, &pool.name)),
            ports: Some(ports(cluster)),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The client Service `c-p` (ClusterIP over ready nodes).
pub fn build_client_service(cluster: &ValidatedCluster, pool: &ValidatedPool) -> Service {
    Service {
        metadata: with_role(
            super::meta::owned_metadata(
                cluster,
                pool,
                names::pool_object(&cluster.name, &pool.name),
            ),
            "client",
        ),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(names::pool_selector(&cluster.name, &pool.name)),
            ports: Some(ports(cluster)),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::fixtures::validated;

    #[test]
    fn headless_and_client_services_select_the_pool() {
        let cluster = validated(&[("hot", 3)]);
        let headless = build_headless_service(&cluster, &cluster.pools[0]);
        let client = build_client_service(&cluster, &cluster.pools[0]);
        crate::build::golden::assert_golden("service-headless-hot.json", &headless);
        crate::build::golden::assert_golden("service-client-hot.json", &client);
        assert_eq!(headless.metadata.name.as_deref(), Some("demo-hot-nodes"));
        assert_eq!(client.metadata.name.as_deref(), Some("demo-hot"));
        let headless_spec = headless.spec.unwrap();
        assert_eq!(headless_spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(headless_spec.publish_not_ready_addresses, Some(true));
        let client_spec = client.spec.unwrap();
        assert_eq!(
            client_spec.selector,
            Some(names::pool_selector("demo", "hot"))
        );
        assert_eq!(client_spec.ports.unwrap()[0].port, 50051);
    }
}
