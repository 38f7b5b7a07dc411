//! The binary's start-up checks and the config file's live re-read.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

fn node_binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flightcache-node"))
}

#[test]
fn invalid_flags_and_config_stop_the_process_naming_the_field() {
    let cases: [(&[&str], &str); 4] = [
        (&["--memory-budget", "12 parsecs"], "--memory-budget"),
        (&["--ttl-mode", "forever"], "--ttl-mode"),
        (&["--max-entries", "0"], "max-entries"),
        (
            &["--memory-budget", "8MiB", "--max-entry-size", "9MiB"],
            "max-entry-size",
        ),
    ];
    for (args, field) in cases {
        let output = node_binary().args(args).output().unwrap();
        assert!(!output.status.success(), "{args:?} started");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(field), "{args:?}: {stderr}");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.json");
    std::fs::write(&file, r#"{"maxEntires": 5}"#).unwrap();
    let output = node_binary()
        .args(["--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("maxEntires"), "{stderr}");
}

#[test]
fn environment_variables_configure_the_node() {
    let output = node_binary()
        .env("FLIGHTCACHE_EVICTION", "random")
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("lru or tinylfu"));
    let output = node_binary()
        .env("FLIGHTCACHE_LOCATION_MODE", "sideways")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--location-mode") && stderr.contains("direct or proxy"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_changed_config_file_is_applied_live_without_dropping_entries() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.json");
    std::fs::write(
        &file,
        r#"{"generation": 1, "ttl": "1h", "maxEntries": 100, "locationMode": "proxy"}"#,
    )
    .unwrap();
    let node = start_node(&["--config", file.to_str().unwrap()]).await;
    let mut client = client(&node).await;
    for i in 0..5 {
        put(
            &mut client,
            path(&format!("f/{i}")),
            vec![sample_batch(10, i)],
            None,
        )
        .await
        .unwrap();
    }
    assert_eq!(stats(&mut client).await["generation"], 1);
    assert_eq!(stats(&mut client).await["locationMode"], "proxy");
    std::fs::write(
        &file,
        r#"{"generation": 2, "ttl": "2h", "maxEntries": 50, "eviction": "lru", "locationMode": "direct"}"#,
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let stats = loop {
        let stats = stats(&mut client).await;
        if stats["generation"] == 2 || tokio::time::Instant::now() > deadline {
            break stats;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(stats["generation"], 2);
    assert_eq!(stats["ttl"], "2h");
    assert_eq!(stats["maxEntries"], 50);
    assert_eq!(stats["locationMode"], "direct");
    assert_eq!(stats["entries"], 5, "entries that still fit are kept");
    // A broken file is ignored; the running config stays.
    std::fs::write(&file, r#"{"generation": 3, "ttl": "soon"}"#).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(stats_of(&mut client).await["generation"], 2);
    node.shutdown().await.unwrap();
}

async fn stats_of(client: &mut arrow_flight::FlightClient) -> serde_json::Value {
    stats(client).await
}
