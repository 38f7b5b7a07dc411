use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;
use crate::cachecluster::{AuthSpec, SchedulingSpec, defaults};

fn spec(pools: Vec<PoolSpec>) -> CacheClusterSpec {
    CacheClusterSpec::with_pools(pools)
}

/// The messages of every error, for compact assertions.
fn messages(result: Result<(), InvalidSpec>) -> Vec<(String, &'static str)> {
    result
        .err()
        .map(|invalid| {
            invalid
                .errors
                .into_iter()
                .map(|e| (e.field, e.message))
                .collect()
        })
        .unwrap_or_default()
}

fn one_error(cluster: &str, spec: &CacheClusterSpec) -> (String, &'static str) {
    let errors = messages(validate_spec(cluster, spec));
    assert_eq!(errors.len(), 1, "{errors:?}");
    errors.into_iter().next().unwrap()
}

#[test]
fn a_default_pool_is_valid() {
    assert_eq!(
        validate_spec("results", &spec(vec![PoolSpec::new("default")])),
        Ok(())
    );
}

#[test]
fn defaults_are_the_documented_values() {
    let pool = PoolSpec::new("p");
    assert_eq!(pool.shards, 3);
    assert_eq!(pool.max_entries, 100_000);
    assert_eq!(pool.ttl_duration(), Ok(Duration::from_secs(3600)));
    assert_eq!(pool.ttl_mode, crate::node_config::TtlMode::Absolute);
    assert_eq!(pool.memory_limit_bytes(), Ok(512 << 20));
    assert_eq!(pool.eviction, crate::node_config::EvictionPolicy::Tinylfu);
    assert_eq!(pool.replicas, 1);
    let spec = spec(vec![pool]);
    assert_eq!(spec.port, 50051);
    assert_eq!(spec.monitoring.metrics_port, 9090);
    assert!(!spec.monitoring.service_monitor);
    assert_eq!(defaults::auth_key(), "token");
}

#[test]
fn serde_fills_the_same_defaults_as_the_constructors() {
    let parsed: CacheClusterSpec =
        serde_json::from_str(r#"{"pools": [{"name": "default"}], "auth": {"secretName": "s"}}"#)
            .unwrap();
    let mut expected = spec(vec![PoolSpec::new("default")]);
    expected.auth = Some(AuthSpec {
        secret_name: Some("s".into()),
        key: "token".into(),
        disabled: false,
    });
    assert_eq!(parsed, expected);
}

/// A way to break a pool, and the field and message that should report it.
type Case = (fn(&mut PoolSpec), &'static str, &'static str);

#[test]
fn numeric_bounds_name_the_field() {
    let cases: [Case; 7] = [
        (|p| p.shards = 0, "spec.pools[0].shards", rules::SHARDS_MSG),
        (
            |p| p.shards = 257,
            "spec.pools[0].shards",
            rules::SHARDS_MSG,
        ),
        (
            |p| p.max_entries = 0,
            "spec.pools[0].maxEntries",
            rules::MAX_ENTRIES_MSG,
        ),
        (
            |p| {
                p.replicas = 3;
                p.shards = 5;
            },
            "spec.pools[0].replicas",
            rules::REPLICAS_MSG,
        ),
        (
            |p| {
                p.replicas = 2;
                p.shards = 1;
            },
            "spec.pools[0].replicas",
            rules::REPLICAS_LE_SHARDS_MSG,
        ),
        (
            |p| p.memory_limit = "32Mi".into(),
            "spec.pools[0].memoryLimit",
            rules::MEMORY_RANGE_MSG,
        ),
        (
            |p| p.ttl = "721h".into(),
            "spec.pools[0].ttl",
            rules::TTL_RANGE_MSG,
        ),
    ];
    for (break_it, field, message) in cases {
        let mut pool = PoolSpec::new("p");
        break_it(&mut pool);
        let errors = messages(validate_spec("c", &spec(vec![pool])));
        // shards 0 also breaks replicas <= shards, as it does in the API server.
        assert!(errors.contains(&(field.to_owned(), message)), "{errors:?}");
        assert!(errors.len() <= 2, "{errors:?}");
    }
}

#[test]
fn shard_and_replica_bounds_are_inclusive() {
    for (shards, replicas) in [(1, 1), (256, 2), (2, 2)] {
        let mut pool = PoolSpec::new("p");
        pool.shards = shards;
        pool.replicas = replicas;
        assert_eq!(validate_spec("c", &spec(vec![pool])), Ok(()));
    }
}

#[test]
fn ttl_format_is_what_go_and_humantime_both_read() {
    for (text, secs) in [
        ("30s", 30),
        ("15m", 900),
        ("1h", 3600),
        ("1h30m", 5400),
        ("2h45m10s", 9910),
        ("720h", 720 * 3600),
        ("90m", 5400),
    ] {
        assert_eq!(parse_ttl(text), Some(Duration::from_secs(secs)), "{text}");
        // The node reads the same value.
        assert_eq!(
            quantity::parse_duration(text),
            Ok(Duration::from_secs(secs)),
            "{text}"
        );
    }
    assert_eq!(parse_ttl("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(
        quantity::parse_duration("250ms"),
        Ok(Duration::from_millis(250))
    );
    for bad in [
        "", "soon", "1.5h", "1d", "2days", "1h 30m", "30m1h", "1h1h", "-1h", "h", "12345h", "1H",
        " 1h",
    ] {
        assert_eq!(parse_ttl(bad), None, "{bad:?}");
    }
}

#[test]
fn ttl_must_be_positive_and_at_most_30_days() {
    for (ttl, message) in [
        ("0s", rules::TTL_RANGE_MSG),
        ("0h0m", rules::TTL_RANGE_MSG),
        ("720h1s", rules::TTL_RANGE_MSG),
        ("2days", rules::TTL_FORMAT_MSG),
        ("", rules::TTL_FORMAT_MSG),
    ] {
        let mut pool = PoolSpec::new("p");
        pool.ttl = ttl.into();
        assert_eq!(
            pool.ttl_duration().map_err(|e| e.message),
            Err(message),
            "{ttl}"
        );
    }
    let mut pool = PoolSpec::new("p");
    pool.ttl = "1ms".into();
    assert_eq!(pool.ttl_duration(), Ok(Duration::from_millis(1)));
}

#[test]
fn memory_limit_accepts_kubernetes_quantities_the_node_can_read() {
    for (text, bytes) in [
        ("64Mi", 64u64 << 20),
        ("512Mi", 512 << 20),
        ("2Gi", 2 << 30),
        ("1Ti", 1 << 40),
        ("100M", 100_000_000),
        ("1G", 1_000_000_000),
        ("67108864", 64 << 20),
        ("70000k", 70_000_000),
    ] {
        let mut pool = PoolSpec::new("p");
        pool.memory_limit = text.into();
        assert_eq!(pool.memory_limit_bytes(), Ok(bytes), "{text}");
        assert_eq!(quantity::parse_bytes(text), Ok(bytes), "{text}");
    }
    for (text, message) in [
        ("lots", rules::MEMORY_FORMAT_MSG),
        ("1.5Gi", rules::MEMORY_FORMAT_MSG),
        ("512MiB", rules::MEMORY_FORMAT_MSG),
        ("2K", rules::MEMORY_FORMAT_MSG),
        ("-1Gi", rules::MEMORY_FORMAT_MSG),
        ("", rules::MEMORY_FORMAT_MSG),
        ("63Mi", rules::MEMORY_RANGE_MSG),
        ("2Ti", rules::MEMORY_RANGE_MSG),
        ("999999999999999T", rules::MEMORY_RANGE_MSG),
    ] {
        let mut pool = PoolSpec::new("p");
        pool.memory_limit = text.into();
        assert_eq!(
            pool.memory_limit_bytes().map_err(|e| e.message),
            Err(message),
            "{text}"
        );
    }
}

#[test]
fn pools_must_exist_be_unique_and_be_dns_labels() {
    assert_eq!(
        one_error("c", &spec(vec![])),
        ("spec.pools".to_owned(), rules::POOLS_NOT_EMPTY_MSG)
    );
    assert_eq!(
        one_error("c", &spec(vec![PoolSpec::new("a"), PoolSpec::new("a")])),
        ("spec.pools".to_owned(), rules::POOLS_UNIQUE_MSG)
    );
    // Pool `a`'s headless Service `<cluster>-a-nodes` is pool `a-nodes`'s client Service.
    assert_eq!(
        one_error(
            "c",
            &spec(vec![PoolSpec::new("a-nodes"), PoolSpec::new("a")])
        ),
        ("spec.pools".to_owned(), rules::POOL_OBJECTS_DISTINCT_MSG)
    );
    assert_eq!(
        validate_spec(
            "c",
            &spec(vec![PoolSpec::new("nodes"), PoolSpec::new("a-nodes-b")])
        ),
        Ok(()),
        "only a whole pool name followed by -nodes collides"
    );
    let many = (0..17).map(|i| PoolSpec::new(format!("p{i}"))).collect();
    assert_eq!(
        one_error("c", &spec(many)),
        ("spec.pools".to_owned(), rules::POOLS_NOT_EMPTY_MSG)
    );
    for bad in ["Hot", "1hot", "hot-", "hot_pool", "", "hot.pool"] {
        assert_eq!(
            one_error("c", &spec(vec![PoolSpec::new(bad)])),
            ("spec.pools[0].name".to_owned(), rules::POOL_NAME_MSG),
            "{bad:?}"
        );
    }
}

#[test]
fn cluster_and_pool_names_fit_a_statefulset_name() {
    let cluster = "c".repeat(30);
    assert_eq!(
        validate_spec(&cluster, &spec(vec![PoolSpec::new("p".repeat(21))])),
        Ok(())
    );
    assert_eq!(
        one_error(&cluster, &spec(vec![PoolSpec::new("p".repeat(22))])),
        ("spec.pools".to_owned(), rules::NAME_LENGTH_MSG)
    );
    assert_eq!(
        one_error("1cache", &spec(vec![PoolSpec::new("p")])),
        ("metadata.name".to_owned(), rules::CLUSTER_NAME_MSG)
    );
}

#[test]
fn cluster_wide_fields_are_checked() {
    let mut s = spec(vec![PoolSpec::new("p")]);
    s.port = 9090;
    assert_eq!(
        one_error("c", &s),
        ("spec.port".to_owned(), rules::PORTS_DIFFER_MSG)
    );
    s.port = 70_000;
    assert_eq!(
        one_error("c", &s),
        ("spec.port".to_owned(), rules::PORT_MSG)
    );
    s.port = 50051;
    s.image = Some("has space".into());
    assert_eq!(
        one_error("c", &s),
        ("spec.image".to_owned(), rules::IMAGE_MSG)
    );
    s.image = None;
    s.auth = Some(AuthSpec {
        secret_name: Some("Bad_Name".into()),
        key: "bad key".into(),
        disabled: true,
    });
    assert_eq!(
        messages(validate_spec("c", &s)),
        [
            ("spec.auth.secretName".to_owned(), rules::AUTH_SECRET_MSG),
            ("spec.auth".to_owned(), rules::AUTH_DISABLED_ALONE_MSG),
            ("spec.auth.key".to_owned(), rules::AUTH_KEY_MSG)
        ]
    );
    s.auth = Some(AuthSpec {
        disabled: true,
        ..AuthSpec::default()
    });
    assert!(validate_spec("c", &s).is_ok());
    // TLS: off alone, or on with its settings.
    s.tls = Some(crate::cachecluster::TlsSpec {
        secret_name: Some("certs".into()),
        disabled: true,
        ..Default::default()
    });
    assert_eq!(
        one_error("c", &s),
        ("spec.tls".to_owned(), rules::TLS_DISABLED_ALONE_MSG)
    );
    s.tls = Some(crate::cachecluster::TlsSpec {
        client_auth: ClientAuth::Required,
        disabled: true,
        ..Default::default()
    });
    assert_eq!(
        messages(validate_spec("c", &s)),
        [
            ("spec.tls".to_owned(), rules::CLIENT_AUTH_NEEDS_SECRET_MSG),
            ("spec.tls".to_owned(), rules::TLS_DISABLED_ALONE_MSG)
        ]
    );
    s.tls = Some(crate::cachecluster::TlsSpec {
        disabled: true,
        ..Default::default()
    });
    assert!(validate_spec("c", &s).is_ok());
}

#[test]
fn cross_field_rules_on_a_pool() {
    let mut pool = PoolSpec::new("p");
    pool.memory_limit = "2Gi".into();
    pool.persistence = Some(PersistenceSpec {
        size: "1Gi".into(),
        storage_class_name: None,
    });
    assert_eq!(
        one_error("c", &spec(vec![pool.clone()])),
        (
            "spec.pools[0].persistence.size".to_owned(),
            rules::SIZE_COVERS_MEMORY_MSG
        )
    );
    pool.persistence = Some(PersistenceSpec {
        size: "2Gi".into(),
        storage_class_name: Some("fast-ssd".into()),
    });
    assert_eq!(validate_spec("c", &spec(vec![pool.clone()])), Ok(()));

    pool.resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity("1Gi".into()),
        )])),
        ..Default::default()
    });
    assert_eq!(
        one_error("c", &spec(vec![pool.clone()])),
        (
            "spec.pools[0].resources.limits".to_owned(),
            rules::NO_RESOURCES_MEMORY_LIMIT_MSG
        )
    );
    pool.resources = None;
    pool.scheduling = Some(SchedulingSpec {
        priority_class_name: Some("Bad".into()),
        ..Default::default()
    });
    assert_eq!(
        one_error("c", &spec(vec![pool])),
        (
            "spec.pools[0].scheduling.priorityClassName".to_owned(),
            rules::PRIORITY_CLASS_MSG
        )
    );
}

#[test]
fn persistence_is_fixed_once_the_pool_exists() {
    let mut old_pool = PoolSpec::new("p");
    old_pool.persistence = Some(PersistenceSpec {
        size: "4Gi".into(),
        storage_class_name: Some("fast".into()),
    });
    let old = spec(vec![PoolSpec::new("other"), old_pool.clone()]);

    let changed = |edit: fn(&mut PoolSpec)| {
        let mut pool = old_pool.clone();
        edit(&mut pool);
        // Reordered on purpose: pools are matched by name.
        spec(vec![pool, PoolSpec::new("other")])
    };
    assert_eq!(
        messages(validate_update(&old, &changed(|p| p.persistence = None))),
        [(
            "spec.pools[0].persistence".to_owned(),
            rules::PERSISTENCE_KEPT_MSG
        )]
    );
    assert_eq!(
        messages(validate_update(
            &old,
            &changed(|p| p.persistence.as_mut().unwrap().storage_class_name = Some("slow".into()))
        )),
        [(
            "spec.pools[0].persistence.storageClassName".to_owned(),
            rules::STORAGE_CLASS_IMMUTABLE_MSG
        )]
    );
    // The StatefulSet's volume claim templates cannot change: neither shrink nor grow.
    for size in ["2Gi", "8Gi"] {
        let resized = |p: &mut PoolSpec, size: &str| {
            if let Some(persistence) = p.persistence.as_mut() {
                persistence.size = size.into();
            }
        };
        let mut pool = old_pool.clone();
        resized(&mut pool, size);
        assert_eq!(
            messages(validate_update(
                &old,
                &spec(vec![pool, PoolSpec::new("other")])
            )),
            [(
                "spec.pools[0].persistence.size".to_owned(),
                rules::SIZE_FIXED_MSG
            )],
            "{size}"
        );
    }
    // Nor is persistence added to a pool that has none.
    assert_eq!(
        messages(validate_update(&spec(vec![PoolSpec::new("p")]), &old)),
        [(
            "spec.pools[1].persistence".to_owned(),
            rules::PERSISTENCE_NOT_ADDED_MSG
        )]
    );
    // The same size in other units, live changes and a new pool are fine.
    assert_eq!(
        validate_update(
            &old,
            &changed(|p| p.persistence.as_mut().unwrap().size = "4096Mi".into())
        ),
        Ok(())
    );
    assert_eq!(
        validate_update(&old, &changed(|p| p.ttl = "5m".into())),
        Ok(())
    );
    assert_eq!(
        validate_update(&spec(vec![PoolSpec::new("other")]), &old),
        Ok(()),
        "a new pool may have any persistence"
    );
}

#[test]
fn the_error_lists_every_broken_field() {
    let mut pool = PoolSpec::new("p");
    pool.max_entries = 0;
    pool.ttl = "soon".into();
    let err = validate_spec("c", &spec(vec![pool])).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "invalid CacheCluster spec: spec.pools[0].maxEntries: {}; spec.pools[0].ttl: {}",
            rules::MAX_ENTRIES_MSG,
            rules::TTL_FORMAT_MSG
        )
    );
}

#[test]
fn spread_keys_are_label_keys_and_exclude_explicit_constraints() {
    use crate::cachecluster::{SpreadSpec, WhenUnsatisfiable};

    let with_spread = |keys: &[&str]| {
        let mut pool = PoolSpec::new("p");
        pool.scheduling = Some(SchedulingSpec {
            spread: Some(SpreadSpec {
                topology_keys: keys.iter().map(|k| (*k).to_owned()).collect(),
                when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
            }),
            ..Default::default()
        });
        spec(vec![pool])
    };
    for good in [
        &["topology.kubernetes.io/zone", "kubernetes.io/hostname"][..],
        &["rack"],
        &["example.com/Rack_1.a"],
        &[],
    ] {
        assert_eq!(validate_spec("c", &with_spread(good)), Ok(()), "{good:?}");
    }
    let long_name = "n".repeat(64);
    let long_prefix = format!("{}/zone", "p".repeat(254));
    let nine: Vec<String> = (0..9).map(|i| format!("key-{i}")).collect();
    let nine: Vec<&str> = nine.iter().map(String::as_str).collect();
    for bad in [
        &["Topology.kubernetes.io/zone"][..],
        &["zone/"],
        &["/zone"],
        &["a/b/c"],
        &["-zone"],
        &["zone key"],
        &[long_name.as_str()],
        &[long_prefix.as_str()],
        &["rack", "rack"],
        &nine,
    ] {
        assert_eq!(
            one_error("c", &with_spread(bad)),
            (
                "spec.pools[0].scheduling.spread.topologyKeys".to_owned(),
                rules::SPREAD_KEYS_MSG
            ),
            "{bad:?}"
        );
    }
    let mut both = with_spread(&["rack"]);
    if let Some(scheduling) = both.pools[0].scheduling.as_mut() {
        scheduling.topology_spread_constraints = Some(Vec::new());
    }
    assert_eq!(
        one_error("c", &both),
        (
            "spec.pools[0].scheduling.spread".to_owned(),
            rules::SPREAD_OR_CONSTRAINTS_MSG
        )
    );
}

#[test]
fn an_empty_spread_object_gets_the_default_keys() {
    let parsed: CacheClusterSpec =
        serde_json::from_str(r#"{"pools": [{"name": "p", "scheduling": {"spread": {}}}]}"#)
            .unwrap();
    let spread = parsed.pools[0]
        .scheduling
        .as_ref()
        .and_then(|s| s.spread.clone())
        .unwrap();
    assert_eq!(spread, crate::cachecluster::SpreadSpec::default());
    assert_eq!(
        spread.topology_keys,
        ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    );
    assert_eq!(
        spread.when_unsatisfiable.as_str(),
        "ScheduleAnyway",
        "a one-node cluster still schedules every pod"
    );
}
