//! The admin JSON: the `configure` action run whole (`flight::actions::configure`: the
//! node config document, its live fields and ring applied to a live store and routing
//! table), the config file and topology documents (`crds::node_config`), and the
//! bodies of `rebalance`, `invalidate-tag`, `invalidate-local` and `held`
//! (`crds::admin`), each as the node reads it.
#![no_main]

mod common;

use bytes::Bytes;
use cache_node::flight::actions;
use cache_node::live::LiveConfig;
use cache_node::routing::members::RoutingTable;
use crds::admin;
use crds::node_config::{LocationMode, NodeDocument, Topology};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let body = Bytes::copy_from_slice(data);
    let _ = admin::RebalanceRequest::from_body(data);
    let _ = admin::InvalidateTagRequest::decode(data);
    let _ = admin::InvalidateLocalRequest::decode(data);
    let _ = admin::HeldRequest::decode(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Topology::from_json(text);
        if let Ok(doc) = NodeDocument::from_json(text) {
            // What the node derives from a config file at startup.
            let _ = doc.config.memory_budget_bytes();
            let _ = doc.config.max_entry_size_bytes();
            let _ = doc.config.ttl_duration();
            let _ = doc.config.shutdown_grace_duration();
            let _ = doc.config.ensure_live_only();
        }
    }
    let store = common::store(64 << 20, 8 << 20);
    let live = LiveConfig::new(1, store.config(), LocationMode::default());
    let Ok(routing) = RoutingTable::new(Some("node-0".to_owned()), None) else {
        return;
    };
    let _ = actions::configure(&body, &live, &routing, &store);
    let _ = actions::invalidate_local(&body, &store);
    let _ = actions::remove_here(actions::NodeAction::InvalidateTag, &body, &store);
});
