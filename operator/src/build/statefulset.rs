//! The pool's StatefulSet: one pod per shard, `OnDelete` so the operator decides which
//! node restarts and when. Pure.
//!
//! Only restart-class settings (image, ports, auth, resources, scheduling, persistence)
//! are in the pod template; live settings (TTL, eviction, entry caps) reach nodes
//! through the ConfigMap and the `configure` action, so changing them never restarts a
//! pod. The template's hash is the `flightcache.dev/config-hash` annotation.
//!
//! Owns: the StatefulSet and its template hash. Pure like all of `build/` (checked by
//! `scripts/check-layers`): imports `validate`, `names`, `placement` (default spread and
//! tolerations) and `ring` (member addresses).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, ContainerResizePolicy, EnvVar,
    EnvVarSource, GRPCAction, HTTPGetAction, KeyToPath, Lifecycle, LifecycleHandler,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodReadinessGate,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    SecretVolumeSource, SecurityContext, SleepAction, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{names, placement};
use crate::ring;
use crate::validate::{ValidatedCluster, ValidatedPool};

/// UID the node runs as (the distroless `nonroot` convention).
pub const NODE_UID: i64 = 65532;
/// Seconds a stopping node gets: the preStop pause plus the node's 20 s drain.
pub const TERMINATION_GRACE_SECONDS: i64 = 30;
/// Where a node's disk-tier volume is mounted.
pub const DATA_DIR: &str = "/var/lib/flightcache";
/// Name of the cache node's container in the pod.
pub const NODE_CONTAINER: &str = "node";

/// The node's command line: its config file, JSON logs, and with `persistence` the disk
/// tier on the pool's volume (written behind, reloaded before the node reports ready).
fn node_args(pool: &ValidatedPool) -> Vec<String> {
    let mut args = vec![
        "--config".into(),
        format!("{}/{}", names::NODE_CONFIG_DIR, names::NODE_CONFIG_KEY),
        "--log-format".into(),
        "json".into(),
    ];
    if pool.persistence.is_some() {
        args.extend(["--data-dir".into(), DATA_DIR.into()]);
    }
    args
}

/// The template hash of `pool`'s pods (the `flightcache.dev/config-hash` annotation a
/// pod carries when it runs the current template).
pub fn template_hash(cluster: &ValidatedCluster, pool: &ValidatedPool) -> String {
    compute_template_hash(&build_pod_template(cluster, pool))
}

/// The StatefulSet `c-p`.
///
/// `replicas` is `shards`, or more while the highest nodes hand their keys off before a
/// scale-in.
pub fn build_statefulset(
    cluster: &ValidatedCluster,
    pool: &ValidatedPool,
    replicas: i32,
) -> StatefulSet {
    let mut template = build_pod_template(cluster, pool);
    let hash = compute_template_hash(&template);
    template
        .metadata
        .get_or_insert_with(ObjectMeta::default)
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(names::CONFIG_HASH_ANNOTATION.to_owned(), hash);
    StatefulSet {
        metadata: super::meta::owned_metadata(
            cluster,
            pool,
            names::pool_object(&cluster.name, &pool.name),
        ),
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(names::headless_service(&cluster.name, &pool.name)),
            pod_management_policy: Some("Parallel".into()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                rolling_update: None,
            }),
            selector: LabelSelector {
                match_labels: Some(names::pool_selector(&cluster.name, &pool.name)),
                ..LabelSelector::default()
            },
            template,
            volume_claim_templates: pool.persistence.as_ref().map(|persistence| {
                vec![PersistentVolumeClaim {
                    metadata: ObjectMeta {
                        name: Some("data".into()),
                        labels: Some(names::pool_labels(&cluster.name, &pool.name)),
                        ..ObjectMeta::default()
                    },
                    spec: Some(PersistentVolumeClaimSpec {
                        access_modes: Some(vec!["ReadWriteOnce".into()]),
                        storage_class_name: persistence.storage_class_name.clone(),
                        resources: Some(VolumeResourceRequirements {
                            requests: Some(BTreeMap::from([(
                                "storage".to_owned(),
                                Quantity(persistence.size.clone()),
                            )])),
                            limits: None,
                        }),
                        ..PersistentVolumeClaimSpec::default()
                    }),
                    status: None,
                }]
            }),
            // A node's claim goes with it: when the pool or the CacheCluster is deleted,
            // and when the pool shrinks. What a node held is cache, handed off when it
            // left; kept, it would be reloaded by the next node of that name however
            // stale it had become (and the claims would outlive the CacheCluster).
            persistent_volume_claim_retention_policy: pool.persistence.as_ref().map(|_| {
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some("Delete".into()),
                    when_scaled: Some("Delete".into()),
                }
            }),
            ..StatefulSetSpec::default()
        }),
        status: None,
    }
}

/// A stable hash of the pod template (FNV-1a over its JSON), so any restart-class
/// change, and only such a change, gives a new value.
///
/// The memory limit and request are left out: they change in place (pod resize), so a
/// memory change alone never marks a pod for restart.
pub fn compute_template_hash(template: &PodTemplateSpec) -> String {
    let mut template = template.clone();
    if let Some(spec) = template.spec.as_mut() {
        for container in &mut spec.containers {
            if let Some(resources) = container.resources.as_mut() {
                for quantities in [resources.limits.as_mut(), resources.requests.as_mut()]
                    .into_iter()
                    .flatten()
                {
                    quantities.remove("memory");
                }
            }
        }
    }
    let json = serde_json::to_vec(&template).unwrap_or_default();
    let hash = json.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

fn build_pod_template(cluster: &ValidatedCluster, pool: &ValidatedPool) -> PodTemplateSpec {
    let scheduling = pool.scheduling.clone().unwrap_or_default();
    let mut volumes = vec![Volume {
        name: "config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: names::pool_object(&cluster.name, &pool.name),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: "config".into(),
        mount_path: names::NODE_CONFIG_DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }];
    // The clients' token(s) at auth/token, the admin and peer tokens under internal/.
    // (volume and folder, Secret, [(key, file)])
    type SecretMount<'a> = (&'a str, String, Vec<(&'a str, &'a str)>);
    let mut secrets: Vec<SecretMount> = vec![(
        "internal",
        names::internal_secret(&cluster.name),
        vec![
            (names::ADMIN_TOKEN_KEY, names::ADMIN_TOKEN_KEY),
            (names::PEER_TOKEN_KEY, names::PEER_TOKEN_KEY),
        ],
    )];
    if cluster.tls_secret.is_some() {
        // The operator's copy of the cluster's TLS Secret, which it moves in phases so
        // that no node serves a certificate a peer does not trust yet (`tls_rollout`).
        // Whole files of the Secret's keys: the kubelet replaces them when the Secret
        // changes (no subPath), and the node re-reads them.
        secrets.push((
            "tls",
            names::node_tls_secret(&cluster.name),
            vec![
                (names::TLS_CERT_KEY, names::TLS_CERT_KEY),
                (names::TLS_KEY_KEY, names::TLS_KEY_KEY),
                (names::TLS_CA_KEY, names::TLS_CA_KEY),
            ],
        ));
    }
    if let Some(token) = &cluster.client_token {
        secrets.push((
            "auth",
            token.secret.clone(),
            vec![(token.key.as_str(), "token")],
        ));
    }
    for (volume, secret, items) in secrets {
        volumes.push(Volume {
            name: volume.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret),
                items: Some(
                    items
                        .into_iter()
                        .map(|(key, path)| KeyToPath {
                            key: key.into(),
                            path: path.into(),
                            mode: None,
                        })
                        .collect(),
                ),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: volume.into(),
            mount_path: format!("{}/{volume}", names::NODE_CONFIG_DIR),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    if pool.persistence.is_some() {
        mounts.push(VolumeMount {
            name: "data".into(),
            mount_path: DATA_DIR.into(),
            ..VolumeMount::default()
        });
    }
    // The gRPC health service on the Flight port: liveness asks for the process (""),
    // readiness for the Flight service, which serves once the node's DNS name resolves
    // to it. Over TLS, which the kubelet's gRPC probes do not speak, the same two on the
    // metrics port: /livez and /readyz.
    let probe = |ready: bool, period: i32, failures: i32, timeout: i32| Probe {
        grpc: cluster.tls_secret.is_none().then(|| GRPCAction {
            port: i32::from(cluster.port),
            service: ready.then(|| names::FLIGHT_HEALTH_SERVICE.into()),
        }),
        http_get: cluster.tls_secret.is_some().then(|| HTTPGetAction {
            path: Some(
                if ready {
                    names::READYZ_PATH
                } else {
                    names::LIVEZ_PATH
                }
                .into(),
            ),
            port: IntOrString::String("metrics".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(timeout),
        ..Probe::default()
    };
    let container = Container {
        name: NODE_CONTAINER.into(),
        image: Some(pool.image.clone()),
        image_pull_policy: Some(cluster.image_pull_policy.clone()),
        args: Some(node_args(pool)),
        ports: Some(vec![
            ContainerPort {
                name: Some("flight".into()),
                container_port: i32::from(cluster.port),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("metrics".into()),
                container_port: i32::from(cluster.metrics_port),
                ..ContainerPort::default()
            },
        ]),
        env: Some(node_env(cluster, pool)),
        resources: Some(compute_resources(pool)),
        // Memory changes in place (Kubernetes pod resize): no restart, the hot set stays.
        resize_policy: Some(vec![
            ContainerResizePolicy {
                resource_name: "memory".into(),
                restart_policy: "NotRequired".into(),
            },
            ContainerResizePolicy {
                resource_name: "cpu".into(),
                restart_policy: "NotRequired".into(),
            },
        ]),
        // Readiness is quick: a node that stops answering (hung) leaves the client
        // Service's endpoints within 2-3 s, so clients whose connection to it was ended
        // by their keepalive (~2 s) reconnect to a live node on their next try.
        readiness_probe: Some(probe(true, 1, 2, 1)),
        // Liveness is patient: a node unready for 10 s is already out of the ring (plan.rs),
        // so a hung node is only restarted after a minute, giving a stall time to pass.
        liveness_probe: Some(probe(false, 10, 6, 2)),
        lifecycle: Some(Lifecycle {
            // Give endpoint removal a moment to reach clients before the node drains.
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction { seconds: 3 }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(NODE_UID),
            run_as_group: Some(NODE_UID),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(mounts),
        ..Container::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(names::pool_labels(&cluster.name, &pool.name)),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container],
            volumes: Some(volumes),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                fs_group: Some(NODE_UID),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..PodSecurityContext::default()
            }),
            // Placement (placement.rs): the user's affinity as given; spread over zones
            // and nodes and a short stay on a lost node unless the user says otherwise.
            affinity: scheduling.affinity,
            node_selector: scheduling.node_selector,
            tolerations: Some(placement::build_tolerations(pool)),
            topology_spread_constraints: placement::build_spread_constraints(cluster, pool),
            priority_class_name: scheduling.priority_class_name,
            readiness_gates: Some(vec![PodReadinessGate {
                condition_type: names::IN_RING_CONDITION.into(),
            }]),
            ..PodSpec::default()
        }),
    }
}

/// The node's environment: its ring member id (the pod name, stable across restarts),
/// the DNS name peers dial and the pod IP it must resolve to before the node reports
/// ready, and the allocator settings.
fn node_env(cluster: &ValidatedCluster, pool: &ValidatedPool) -> Vec<EnvVar> {
    let from_field = |name: &str, field_path: &str| EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.into(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
    };
    let mut env = vec![
        from_field("FLIGHTCACHE_MEMBER_ID", "metadata.name"),
        from_field("FLIGHTCACHE_POD_IP", "status.podIP"),
        EnvVar {
            // The kubelet expands $(VAR) of variables defined above.
            name: "FLIGHTCACHE_ADVERTISED_HOST".into(),
            value: Some(ring::member_host(cluster, pool, "$(FLIGHTCACHE_MEMBER_ID)")),
            value_from: None,
        },
    ];
    env.extend(node_malloc_env());
    env
}

/// glibc allocator settings of every node: few arenas, and large buffers (Arrow columns)
/// in their own mappings that return to the OS when an entry is evicted. Without them
/// the RSS of a full node drifts well above the bytes it holds (docs/benchmarks.md).
pub fn node_malloc_env() -> Vec<EnvVar> {
    vec![
        EnvVar {
            name: "MALLOC_ARENA_MAX".into(),
            value: Some("2".into()),
            value_from: None,
        },
        EnvVar {
            name: "MALLOC_MMAP_THRESHOLD_".into(),
            value: Some("131072".into()),
            value_from: None,
        },
    ]
}

/// The node container's memory limit and request as written in the pod spec.
pub fn memory_quantities(pool: &ValidatedPool) -> (String, String) {
    let resources = compute_resources(pool);
    let get = |q: Option<&BTreeMap<String, Quantity>>| {
        q.and_then(|q| q.get("memory"))
            .map_or_else(|| pool.memory_limit.clone(), |q| q.0.clone())
    };
    (
        get(resources.limits.as_ref()),
        get(resources.requests.as_ref()),
    )
}

/// Container resources: memory limit = `memoryLimit`; memory request = the user's
/// request or the limit (Guaranteed memory); other resources as the user gave them.
fn compute_resources(pool: &ValidatedPool) -> ResourceRequirements {
    let user = pool.resources.clone().unwrap_or_default();
    let mut limits = user.limits.unwrap_or_default();
    limits.insert("memory".into(), Quantity(pool.memory_limit.clone()));
    let mut requests = user.requests.unwrap_or_default();
    requests
        .entry("memory".into())
        .or_insert_with(|| Quantity(pool.memory_limit.clone()));
    ResourceRequirements {
        limits: Some(limits),
        requests: Some(requests),
        claims: user.claims,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::fixtures::{cluster, defaults, validated};
    use crate::validate::validate;

    #[test]
    fn statefulset_matches_the_golden_file() {
        let cluster = validated(&[("hot", 3)]);
        let sts = build_statefulset(&cluster, &cluster.pools[0], cluster.pools[0].shards);
        crate::build::golden::assert_golden("statefulset-hot.json", &sts);
    }

    #[test]
    fn restart_class_changes_move_the_hash_and_live_changes_do_not() {
        let hash = |cc: &crds::cachecluster::CacheCluster| {
            let valid = validate(cc, &defaults()).unwrap();
            let sts = build_statefulset(&valid, &valid.pools[0], valid.pools[0].shards);
            sts.spec
                .unwrap()
                .template
                .metadata
                .unwrap()
                .annotations
                .unwrap()[names::CONFIG_HASH_ANNOTATION]
                .clone()
        };
        let base = cluster(&[("hot", 3)]);
        let mut live = base.clone();
        live.spec.pools[0].ttl = "5m".into();
        live.spec.pools[0].max_entries = 7;
        live.spec.pools[0].eviction = crds::node_config::EvictionPolicy::Lru;
        live.spec.pools[0].shards = 5;
        assert_eq!(
            hash(&base),
            hash(&live),
            "live and ring fields leave the template alone"
        );
        let mut image = base.clone();
        image.spec.image = Some("flightcache/node:next".into());
        assert_ne!(hash(&base), hash(&image));
        let mut memory = base.clone();
        memory.spec.pools[0].memory_limit = "1Gi".into();
        assert_eq!(
            hash(&base),
            hash(&memory),
            "memory is resized in place, not by a restart"
        );
        let mut cpu = base.clone();
        cpu.spec.pools[0].resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".to_owned(), Quantity("2".into()))])),
            ..Default::default()
        });
        assert_ne!(hash(&base), hash(&cpu));
        let mut strict = base.clone();
        strict.spec.pools[0].scheduling = Some(crds::cachecluster::SchedulingSpec {
            spread: Some(crds::cachecluster::SpreadSpec {
                when_unsatisfiable: crds::cachecluster::WhenUnsatisfiable::DoNotSchedule,
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_ne!(
            hash(&base),
            hash(&strict),
            "placement is in the pod template"
        );
        let mut spelled_out = base.clone();
        spelled_out.spec.pools[0].scheduling = Some(crds::cachecluster::SchedulingSpec {
            spread: Some(crds::cachecluster::SpreadSpec::default()),
            ..Default::default()
        });
        assert_eq!(
            hash(&base),
            hash(&spelled_out),
            "the default spread written out is the default"
        );
    }

    #[test]
    fn readiness_waits_for_the_name_peers_dial_and_liveness_does_not() {
        // Plaintext: the kubelet's gRPC probe (with TLS, /readyz on the metrics port).
        let mut cc = cluster(&[("hot", 3)]);
        cc.spec.tls = Some(crds::cachecluster::TlsSpec {
            disabled: true,
            ..Default::default()
        });
        let valid = validate(&cc, &defaults()).unwrap();
        let sts = build_statefulset(&valid, &valid.pools[0], 3);
        let pod = sts.spec.unwrap().template.spec.unwrap();
        let container = &pod.containers[0];
        let env = container.env.as_ref().unwrap();
        let value = |name: &str| env.iter().find(|e| e.name == name).unwrap().clone();
        // The advertised name is the ring's address of this pod, without the port.
        let ring_address = crate::ring::member_address(&valid, &valid.pools[0], 0);
        let advertised = value("FLIGHTCACHE_ADVERTISED_HOST").value.unwrap();
        assert_eq!(
            format!(
                "{}:{}",
                advertised.replace("$(FLIGHTCACHE_MEMBER_ID)", "demo-hot-0"),
                valid.port
            ),
            ring_address
        );
        let pod_ip = value("FLIGHTCACHE_POD_IP")
            .value_from
            .unwrap()
            .field_ref
            .unwrap();
        assert_eq!(pod_ip.field_path, "status.podIP");
        // $(VAR) expands only variables defined before it.
        let position = |name: &str| env.iter().position(|e| e.name == name).unwrap();
        assert!(position("FLIGHTCACHE_MEMBER_ID") < position("FLIGHTCACHE_ADVERTISED_HOST"));
        let ready = container
            .readiness_probe
            .as_ref()
            .unwrap()
            .grpc
            .as_ref()
            .unwrap();
        assert_eq!(
            ready.service.as_deref(),
            Some("arrow.flight.protocol.FlightService")
        );
        let live = container
            .liveness_probe
            .as_ref()
            .unwrap()
            .grpc
            .as_ref()
            .unwrap();
        assert_eq!(live.service, None, "liveness must not wait for DNS");
        // A hung node is unready, out of the client Service, within 3 s (failures x
        // period, the last probe waiting out its timeout): clients' keepalive ends their
        // connections to it in ~2 s, and their next try must not land on it again.
        let readiness = container.readiness_probe.as_ref().unwrap();
        let unready_within = readiness.failure_threshold.unwrap()
            * readiness.period_seconds.unwrap()
            + readiness.timeout_seconds.unwrap();
        assert!(unready_within <= 3, "{readiness:?}");
        // Liveness stays patient: a minute before a stalled node is restarted.
        let liveness = container.liveness_probe.as_ref().unwrap();
        assert_eq!(
            liveness.failure_threshold.unwrap() * liveness.period_seconds.unwrap(),
            60
        );
    }

    #[test]
    fn a_tls_cluster_mounts_its_secret_and_probes_readyz_on_the_metrics_port() {
        let mut cc = cluster(&[("hot", 3)]);
        cc.spec.tls = Some(crds::cachecluster::TlsSpec {
            secret_name: Some("certs".into()),
            ..Default::default()
        });
        let valid = validate(&cc, &defaults()).unwrap();
        let sts = build_statefulset(&valid, &valid.pools[0], 3);
        let pod = sts.spec.unwrap().template.spec.unwrap();
        let tls = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "tls")
            .unwrap()
            .secret
            .unwrap();
        // The operator's copy of Secret `certs`, moved in phases (`tls_rollout`).
        assert_eq!(tls.secret_name.as_deref(), Some("demo-node-tls"));
        let files: Vec<String> = tls.items.unwrap().into_iter().map(|i| i.path).collect();
        assert_eq!(files, ["tls.crt", "tls.key", "ca.crt"]);
        let container = &pod.containers[0];
        let mount = container
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == "tls")
            .unwrap();
        assert_eq!(mount.mount_path, "/etc/flightcache/tls");
        assert!(
            mount.sub_path.is_none(),
            "a subPath mount would never be updated"
        );
        for (probe, path) in [
            (&container.readiness_probe, "/readyz"),
            (&container.liveness_probe, "/livez"),
        ] {
            let probe = probe.as_ref().unwrap();
            assert!(probe.grpc.is_none(), "the kubelet's gRPC probe has no TLS");
            let http = probe.http_get.as_ref().unwrap();
            assert_eq!(http.path.as_deref(), Some(path));
            assert_eq!(http.port, IntOrString::String("metrics".into()));
        }
        let doc = crate::build::configmap::compute_node_config(&valid, &valid.pools[0]);
        assert_eq!(
            doc.tls_cert_file.as_deref(),
            Some("/etc/flightcache/tls/tls.crt")
        );
        assert_eq!(
            doc.tls_ca_file.as_deref(),
            Some("/etc/flightcache/tls/ca.crt")
        );
    }

    #[test]
    fn a_pool_with_persistence_claims_a_volume_and_runs_its_disk_tier_on_it() {
        let mut cc = cluster(&[("hot", 3)]);
        cc.spec.pools[0].persistence = Some(crds::cachecluster::PersistenceSpec {
            size: "4Gi".into(),
            storage_class_name: Some("local-path".into()),
        });
        let valid = validate(&cc, &defaults()).unwrap();
        let sts = build_statefulset(&valid, &valid.pools[0], 3).spec.unwrap();
        let claims = sts.volume_claim_templates.unwrap();
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].metadata.name.as_deref(), Some("data"));
        let claim = claims[0].spec.as_ref().unwrap();
        assert_eq!(claim.storage_class_name.as_deref(), Some("local-path"));
        let retention = sts
            .persistent_volume_claim_retention_policy
            .as_ref()
            .unwrap();
        assert_eq!(
            (
                retention.when_deleted.as_deref(),
                retention.when_scaled.as_deref()
            ),
            (Some("Delete"), Some("Delete")),
            "a node's claim goes with it"
        );
        let container = &sts.template.spec.unwrap().containers[0];
        let mount = container
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == "data")
            .unwrap();
        assert_eq!(mount.mount_path, DATA_DIR);
        let args = container.args.as_ref().unwrap();
        let at = args.iter().position(|a| a == "--data-dir").unwrap();
        assert_eq!(
            args[at + 1],
            DATA_DIR,
            "the node writes behind to the mounted volume"
        );

        let plain = validated(&[("hot", 3)]);
        let sts = build_statefulset(&plain, &plain.pools[0], 3).spec.unwrap();
        assert!(sts.volume_claim_templates.is_none());
        assert!(sts.persistent_volume_claim_retention_policy.is_none());
        let container = &sts.template.spec.unwrap().containers[0];
        assert!(
            !container
                .args
                .as_ref()
                .unwrap()
                .iter()
                .any(|a| a == "--data-dir")
        );
    }

    #[test]
    fn pods_run_restricted() {
        let cluster = validated(&[("hot", 3)]);
        let sts = build_statefulset(&cluster, &cluster.pools[0], cluster.pools[0].shards);
        let spec = sts.spec.unwrap();
        assert_eq!(
            spec.update_strategy.unwrap().type_.as_deref(),
            Some("OnDelete")
        );
        let pod = spec.template.spec.unwrap();
        let security = pod.containers[0].security_context.clone().unwrap();
        assert_eq!(security.run_as_non_root, Some(true));
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert_eq!(
            security.capabilities.unwrap().drop,
            Some(vec!["ALL".to_owned()])
        );
        let limits = pod.containers[0].resources.clone().unwrap().limits.unwrap();
        assert_eq!(
            limits["memory"],
            Quantity(cluster.pools[0].memory_limit.clone())
        );
    }
}
