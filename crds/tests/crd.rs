//! The generated CacheCluster CRD: names, columns, defaults, every CEL rule where it
//! belongs, a doc and a change class for every field, and the committed files current.
#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions"
)]

use std::collections::BTreeSet;

use crds::cachecluster::{ChangeClass, MonitoringSpec, change_class, defaults, rules};
use crds::generate::{self, embedded};
use serde_json::{Value, json};

fn crd() -> Value {
    generate::crd_json().unwrap()
}

fn schema() -> Value {
    crd()
        .pointer("/spec/versions/0/schema/openAPIV3Schema")
        .unwrap()
        .clone()
}

/// The schema node at a reference path such as `spec.pools[].ttl` (`""` is the root).
fn node<'a>(schema: &'a Value, path: &str) -> &'a Value {
    let mut current = schema;
    if path.is_empty() {
        return current;
    }
    for segment in path.split('.') {
        let (name, items) = match segment.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (segment, false),
        };
        current = &current["properties"][name];
        assert!(!current.is_null(), "no field {name} in {path}");
        if items {
            current = &current["items"];
        }
    }
    current
}

/// Every field path of the schema, not descending into embedded Kubernetes types.
fn field_paths(schema: &Value, path: &str, out: &mut Vec<String>) {
    if embedded(path).is_some() {
        return;
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            let child = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            out.push(child.clone());
            field_paths(property, &child, out);
        }
    }
    if let Some(items) = schema.get("items") {
        field_paths(items, &format!("{path}[]"), out);
    }
}

#[test]
fn names_scope_and_subresources() {
    let crd = crd();
    assert_eq!(crd["metadata"]["name"], "cacheclusters.flightcache.dev");
    assert_eq!(crd["spec"]["group"], "flightcache.dev");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(
        crd["spec"]["names"],
        json!({"kind": "CacheCluster", "plural": "cacheclusters", "singular": "cachecluster",
               "shortNames": ["cc"], "categories": ["flightcache"]})
    );
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert_eq!(version["served"], true);
    assert_eq!(version["storage"], true);
    assert_eq!(version["subresources"], json!({"status": {}}));
}

#[test]
fn printer_columns_show_pools_shards_config_ready_hit_ratio_memory_and_age() {
    let crd = crd();
    let columns: Vec<(&str, &str)> = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["jsonPath"].as_str().unwrap()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Pools", ".status.poolNames"),
            ("Shards", ".status.shardsReady"),
            ("Config", ".status.configGeneration"),
            ("Up-To-Date", ".status.updatedShards"),
            ("Ready", ".status.conditions[?(@.type==\"Ready\")].status"),
            ("Hit-Ratio", ".status.hitRatio"),
            ("Memory", ".status.memoryUsed"),
            ("Reason", ".status.conditions[?(@.type==\"Ready\")].reason"),
            ("Age", ".metadata.creationTimestamp"),
        ]
    );
    // Every column but Age reads a field the schema declares.
    let schema = schema();
    for path in [
        "status.poolNames",
        "status.shardsReady",
        "status.configGeneration",
        "status.updatedShards",
        "status.hitRatio",
        "status.memoryUsed",
    ] {
        node(&schema, path);
    }
}

#[test]
fn every_rule_sits_on_its_field_with_its_message() {
    let schema = schema();
    let expected: &[(&str, &str, &str)] = &[
        ("", rules::CLUSTER_NAME, rules::CLUSTER_NAME_MSG),
        ("", rules::NAME_LENGTH, rules::NAME_LENGTH_MSG),
        ("spec", rules::PORTS_DIFFER, rules::PORTS_DIFFER_MSG),
        ("spec.image", rules::IMAGE, rules::IMAGE_MSG),
        ("spec.port", rules::PORT, rules::PORT_MSG),
        (
            "spec.auth.secretName",
            rules::DNS_SUBDOMAIN,
            rules::AUTH_SECRET_MSG,
        ),
        ("spec.auth.key", rules::SECRET_KEY, rules::AUTH_KEY_MSG),
        (
            "spec.auth",
            rules::AUTH_DISABLED_ALONE,
            rules::AUTH_DISABLED_ALONE_MSG,
        ),
        (
            "spec.tls.secretName",
            rules::DNS_SUBDOMAIN,
            rules::TLS_SECRET_MSG,
        ),
        (
            "spec.monitoring.metricsPort",
            rules::PORT,
            rules::METRICS_PORT_MSG,
        ),
        (
            "spec.pools",
            rules::POOLS_NOT_EMPTY,
            rules::POOLS_NOT_EMPTY_MSG,
        ),
        ("spec.pools", rules::POOLS_UNIQUE, rules::POOLS_UNIQUE_MSG),
        (
            "spec.pools",
            rules::POOL_OBJECTS_DISTINCT,
            rules::POOL_OBJECTS_DISTINCT_MSG,
        ),
        (
            "spec.pools[]",
            rules::REPLICAS_LE_SHARDS,
            rules::REPLICAS_LE_SHARDS_MSG,
        ),
        (
            "spec.pools[]",
            rules::SIZE_COVERS_MEMORY,
            rules::SIZE_COVERS_MEMORY_MSG,
        ),
        (
            "spec.pools[]",
            rules::NO_RESOURCES_MEMORY_LIMIT,
            rules::NO_RESOURCES_MEMORY_LIMIT_MSG,
        ),
        (
            "spec.pools[]",
            rules::PERSISTENCE_KEPT,
            rules::PERSISTENCE_KEPT_MSG,
        ),
        (
            "spec.pools[]",
            rules::PERSISTENCE_NOT_ADDED,
            rules::PERSISTENCE_NOT_ADDED_MSG,
        ),
        ("spec.pools[].name", rules::POOL_NAME, rules::POOL_NAME_MSG),
        ("spec.pools[].shards", rules::SHARDS, rules::SHARDS_MSG),
        (
            "spec.pools[].maxEntries",
            rules::MAX_ENTRIES,
            rules::MAX_ENTRIES_MSG,
        ),
        ("spec.pools[].ttl", rules::TTL_FORMAT, rules::TTL_FORMAT_MSG),
        ("spec.pools[].ttl", rules::TTL_RANGE, rules::TTL_RANGE_MSG),
        (
            "spec.pools[].memoryLimit",
            rules::BYTES_FORMAT,
            rules::MEMORY_FORMAT_MSG,
        ),
        (
            "spec.pools[].memoryLimit",
            rules::MEMORY_RANGE,
            rules::MEMORY_RANGE_MSG,
        ),
        (
            "spec.pools[].replicas",
            rules::REPLICAS,
            rules::REPLICAS_MSG,
        ),
        ("spec.pools[].image", rules::IMAGE, rules::POOL_IMAGE_MSG),
        (
            "spec.pools[].persistence",
            rules::STORAGE_CLASS_IMMUTABLE,
            rules::STORAGE_CLASS_IMMUTABLE_MSG,
        ),
        (
            "spec.pools[].persistence.size",
            rules::BYTES_FORMAT,
            rules::SIZE_FORMAT_MSG,
        ),
        (
            "spec.pools[].persistence.size",
            rules::SIZE_FIXED,
            rules::SIZE_FIXED_MSG,
        ),
        (
            "spec.pools[].persistence.storageClassName",
            rules::DNS_SUBDOMAIN,
            rules::STORAGE_CLASS_MSG,
        ),
        (
            "spec.pools[].scheduling.priorityClassName",
            rules::DNS_SUBDOMAIN,
            rules::PRIORITY_CLASS_MSG,
        ),
        (
            "spec.pools[].scheduling",
            rules::SPREAD_OR_CONSTRAINTS,
            rules::SPREAD_OR_CONSTRAINTS_MSG,
        ),
        (
            "spec.pools[].scheduling.spread.topologyKeys",
            rules::SPREAD_KEYS,
            rules::SPREAD_KEYS_MSG,
        ),
        (
            "spec.tls",
            rules::CLIENT_AUTH_NEEDS_SECRET,
            rules::CLIENT_AUTH_NEEDS_SECRET_MSG,
        ),
        (
            "spec.tls",
            rules::TLS_DISABLED_ALONE,
            rules::TLS_DISABLED_ALONE_MSG,
        ),
    ];
    let mut found = 0;
    for (path, rule, message) in expected {
        let rules = node(&schema, path)["x-kubernetes-validations"]
            .as_array()
            .unwrap_or_else(|| panic!("no rules on {path}"));
        assert!(
            rules
                .iter()
                .any(|r| r["rule"] == *rule && r["message"] == *message),
            "{path}: {rule}"
        );
        found += 1;
    }
    // No rule in the schema is missing from the list above.
    let mut paths = vec![String::new()];
    field_paths(&schema, "", &mut paths);
    let total: usize = paths
        .iter()
        .map(|p| {
            let n = node(&schema, p);
            let own = n["x-kubernetes-validations"].as_array().map_or(0, Vec::len);
            let items = n["items"]["x-kubernetes-validations"]
                .as_array()
                .map_or(0, Vec::len);
            own + items
        })
        .sum();
    assert_eq!(total, found);
}

#[test]
fn every_message_names_its_field() {
    for (path, message) in [
        ("spec.pools[].shards", rules::SHARDS_MSG),
        ("spec.pools[].maxEntries", rules::MAX_ENTRIES_MSG),
        ("spec.pools[].ttl", rules::TTL_RANGE_MSG),
        ("spec.pools[].memoryLimit", rules::MEMORY_RANGE_MSG),
        ("spec.pools[].replicas", rules::REPLICAS_LE_SHARDS_MSG),
        ("spec.pools", rules::POOLS_NOT_EMPTY_MSG),
        ("spec.port", rules::PORTS_DIFFER_MSG),
        (
            "spec.pools[].scheduling.spread.topologyKeys",
            rules::SPREAD_KEYS_MSG,
        ),
        (
            "spec.pools[].scheduling.spread",
            rules::SPREAD_OR_CONSTRAINTS_MSG,
        ),
    ] {
        assert!(message.starts_with(path), "{message}");
    }
}

#[test]
fn pools_and_status_lists_are_list_maps() {
    let schema = schema();
    for (path, key) in [
        ("spec.pools", "name"),
        ("status.pools", "name"),
        ("status.conditions", "type"),
    ] {
        let list = node(&schema, path);
        assert_eq!(list["x-kubernetes-list-type"], "map", "{path}");
        assert_eq!(list["x-kubernetes-list-map-keys"], json!([key]), "{path}");
    }
    assert_eq!(node(&schema, "spec.pools")["maxItems"], 16);
}

#[test]
fn schema_defaults_are_the_named_defaults() {
    let schema = schema();
    let default = |path: &str| node(&schema, path)["default"].clone();
    assert_eq!(default("spec.port"), json!(defaults::port()));
    assert_eq!(
        default("spec.monitoring"),
        serde_json::to_value(MonitoringSpec::default()).unwrap()
    );
    assert_eq!(
        default("spec.monitoring.metricsPort"),
        json!(defaults::METRICS_PORT)
    );
    assert_eq!(default("spec.monitoring.serviceMonitor"), json!(false));
    assert_eq!(default("spec.auth.key"), json!(defaults::AUTH_KEY));
    assert_eq!(default("spec.pools[].shards"), json!(defaults::SHARDS));
    assert_eq!(
        default("spec.pools[].maxEntries"),
        json!(defaults::MAX_ENTRIES)
    );
    assert_eq!(default("spec.pools[].ttl"), json!(defaults::TTL));
    assert_eq!(default("spec.pools[].ttlMode"), json!("absolute"));
    assert_eq!(
        default("spec.pools[].memoryLimit"),
        json!(defaults::MEMORY_LIMIT)
    );
    assert_eq!(default("spec.pools[].eviction"), json!("tinylfu"));
    assert_eq!(default("spec.pools[].replicas"), json!(defaults::REPLICAS));
    assert_eq!(
        node(&schema, "spec.pools[].ttlMode")["enum"],
        json!(["absolute", "sliding"])
    );
    assert_eq!(
        node(&schema, "spec.pools[].eviction")["enum"],
        json!(["lru", "tinylfu"])
    );
    assert_eq!(
        default("spec.pools[].scheduling.spread.topologyKeys"),
        json!(defaults::SPREAD_TOPOLOGY_KEYS)
    );
    assert_eq!(
        default("spec.pools[].scheduling.spread.whenUnsatisfiable"),
        json!("ScheduleAnyway")
    );
}

#[test]
fn spread_is_bounded_for_the_api_server() {
    let schema = schema();
    let keys = node(&schema, "spec.pools[].scheduling.spread.topologyKeys");
    // A set (unique items), at most 8 keys of at most 317 characters (253 for the
    // prefix, '/', 63 for the name), so the CEL rule's cost is bounded.
    assert_eq!(keys["x-kubernetes-list-type"], "set");
    assert_eq!(keys["maxItems"], 8);
    assert_eq!(keys["items"]["maxLength"], 317);
    assert_eq!(
        node(&schema, "spec.pools[].scheduling.spread.whenUnsatisfiable")["enum"],
        json!(["ScheduleAnyway", "DoNotSchedule"])
    );
}

#[test]
fn every_field_has_a_description() {
    let schema = schema();
    let mut paths = Vec::new();
    field_paths(&schema, "", &mut paths);
    for path in paths
        .iter()
        .filter(|p| p.starts_with("spec") || p.starts_with("status"))
    {
        let description = node(&schema, path)["description"].as_str().unwrap_or("");
        assert!(description.len() > 10, "{path} has no description");
    }
}

#[test]
fn every_spec_field_has_a_change_class_stated_in_its_description() {
    let schema = schema();
    let mut paths = Vec::new();
    field_paths(node(&schema, "spec"), "spec", &mut paths);
    let paths: BTreeSet<String> = paths.into_iter().collect();
    let unclassified: BTreeSet<&str> = [
        "spec.pools",
        "spec.pools[].name",
        "spec.monitoring",
        "spec.networkPolicy",
    ]
    .into();
    for path in &paths {
        let class = change_class::SPEC_FIELDS.iter().find(|(p, _)| p == path);
        match class {
            None => assert!(
                unclassified.contains(path.as_str()),
                "{path} has no change class"
            ),
            Some((_, class)) => {
                let description = node(&schema, path)["description"].as_str().unwrap();
                let line = format!("Change: {}", class.as_str());
                assert!(
                    description.contains(&line),
                    "{path}: description lacks '{line}'"
                );
            }
        }
    }
    for (path, _) in change_class::SPEC_FIELDS {
        assert!(
            paths.contains(*path),
            "{path} is classified but not in the schema"
        );
    }
    // The brief's classes for the headline fields.
    for (path, class) in [
        ("spec.pools[].ttl", ChangeClass::Live),
        ("spec.pools[].ttlMode", ChangeClass::Live),
        ("spec.pools[].eviction", ChangeClass::Live),
        ("spec.pools[].maxEntries", ChangeClass::Live),
        ("spec.pools[].memoryLimit", ChangeClass::Resize),
        ("spec.pools[].shards", ChangeClass::RingChange),
        ("spec.pools[].replicas", ChangeClass::RingChange),
        ("spec.image", ChangeClass::RestartWithHandoff),
        ("spec.pools[].resources", ChangeClass::RestartWithHandoff),
        ("spec.pools[].scheduling", ChangeClass::RestartWithHandoff),
        ("spec.pools[].persistence", ChangeClass::Fixed),
        ("spec.pools[].persistence.size", ChangeClass::Fixed),
        ("spec.tls", ChangeClass::RestartWithHandoff),
        ("spec.auth", ChangeClass::RestartWithHandoff),
        ("spec.port", ChangeClass::RestartWithHandoff),
    ] {
        assert_eq!(change_class::of(path), Some(class), "{path}");
    }
}

#[test]
fn the_yaml_reads_back_as_the_crd() {
    let yaml = generate::crd_yaml().unwrap();
    let read: Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(read, crd());
}

#[test]
fn the_reference_lists_every_field_and_rule_message() {
    let crd = crd();
    let reference = generate::reference::reference(&crd).unwrap();
    let schema = schema();
    let mut paths = Vec::new();
    field_paths(&schema, "", &mut paths);
    for path in paths
        .iter()
        .filter(|p| p.starts_with("spec.") || p.starts_with("status."))
    {
        let name = path.rsplit('.').next().unwrap().trim_end_matches("[]");
        assert!(
            reference.contains(&format!("| `{name}` |")),
            "{path} missing"
        );
    }
    for message in [
        rules::SHARDS_MSG,
        rules::TTL_RANGE_MSG,
        rules::STORAGE_CLASS_IMMUTABLE_MSG,
    ] {
        assert!(reference.contains(message), "{message}");
    }
}

/// The drift check `cargo run -p crds --bin crdgen -- --check` also runs as a test.
#[test]
fn committed_crd_and_reference_are_up_to_date() {
    // At run time, not env!: a reused test binary checks this clone (scripts/source-mtimes).
    let root = std::path::Path::new(
        &std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR"),
    )
    .join("..");
    let committed = |path: &str| std::fs::read_to_string(root.join(path)).unwrap_or_default();
    let hint = "stale: run `cargo run -p crds --bin crdgen` and commit the result";
    assert!(
        committed(generate::CRD_PATH) == generate::crd_yaml().unwrap(),
        "{} {hint}",
        generate::CRD_PATH
    );
    assert!(
        committed(generate::REFERENCE_PATH) == generate::reference::reference(&crd()).unwrap(),
        "{} {hint}",
        generate::REFERENCE_PATH
    );
}
