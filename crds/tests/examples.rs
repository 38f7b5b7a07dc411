//! The documented examples read into the Rust types, pass the same checks as the API
//! server, and the minimal one gets every default.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions"
)]

use crds::cachecluster::{PoolSpec, validate};
use crds::node_config::{EvictionPolicy, TtlMode};
use crds::{CacheCluster, CacheClusterSpec};

fn example(name: &str) -> CacheCluster {
    let path = std::path::Path::new(
        &std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR"),
    )
    .join("../docs/examples")
    .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_minimal_example_is_one_pool_with_every_default() {
    let cc = example("cachecluster-minimal.yaml");
    assert_eq!(cc.metadata.name.as_deref(), Some("results"));
    assert_eq!(
        cc.spec,
        CacheClusterSpec::with_pools(vec![PoolSpec::new("default")])
    );
    assert_eq!(validate::validate(&cc), Ok(()));
}

#[test]
fn the_full_example_sets_every_field_and_is_valid() {
    let cc = example("cachecluster-full.yaml");
    assert_eq!(validate::validate(&cc), Ok(()));
    let spec = &cc.spec;
    assert!(spec.image.is_some() && spec.auth.is_some() && spec.tls.is_some());
    let [hot, batch] = spec.pools.as_slice() else {
        panic!("two pools expected");
    };
    assert_eq!((hot.name.as_str(), hot.shards, hot.replicas), ("hot", 4, 2));
    assert_eq!(hot.ttl_mode, TtlMode::Sliding);
    assert_eq!(hot.memory_limit_bytes(), Ok(2 << 30));
    let scheduling = hot.scheduling.as_ref().unwrap();
    assert!(scheduling.node_selector.is_some() && scheduling.affinity.is_some());
    assert!(scheduling.tolerations.is_some() && scheduling.topology_spread_constraints.is_some());
    assert!(scheduling.priority_class_name.is_some());
    assert!(hot.resources.is_some());
    assert_eq!(
        hot.persistence.as_ref().and_then(|p| p.size_bytes()),
        Some(4 << 30)
    );
    assert_eq!(batch.eviction, EvictionPolicy::Lru);
    let spread = batch
        .scheduling
        .as_ref()
        .and_then(|s| s.spread.as_ref())
        .unwrap();
    assert_eq!(
        spread.when_unsatisfiable,
        crds::cachecluster::WhenUnsatisfiable::DoNotSchedule
    );
    assert!(batch.image.is_some());
    // Every field of the spec and of a pool appears in the file.
    let text = serde_json::to_value(spec).unwrap();
    for field in ["image", "port", "auth", "tls", "monitoring", "pools"] {
        assert!(text.get(field).is_some(), "{field}");
    }
    for field in [
        "name",
        "shards",
        "maxEntries",
        "ttl",
        "ttlMode",
        "memoryLimit",
        "eviction",
        "replicas",
        "persistence",
        "resources",
        "scheduling",
    ] {
        assert!(text["pools"][0].get(field).is_some(), "{field}");
    }
}

#[test]
fn the_invalidation_example_names_a_tag_and_a_key_on_every_pool() {
    let path = std::path::Path::new(
        &std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR"),
    )
    .join("../docs/examples/cacheinvalidation.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let inv: crds::CacheInvalidation = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(inv.spec.cluster, "results");
    assert_eq!(inv.spec.pools, None, "the cluster-wide form");
    let request = inv.spec.request();
    assert_eq!(request.tags, ["sales.orders"]);
    assert_eq!(request.keys, ["reports/daily"]);
    crds::invalidation::check_selectors(&request.keys, &request.prefixes, &request.tags).unwrap();
    assert_eq!(
        (
            inv.spec.active_deadline_seconds,
            inv.spec.ttl_seconds_after_finished
        ),
        (600, 3600)
    );
}
