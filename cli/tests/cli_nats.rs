//! The `fleetcoord` binary on the NATS backend: `--coord nats --coord-url`
//! reaches a real nats-server for kv and stream commands, and a dead URL
//! is a clear error.

use fleetcoord::coordinator::{Coordinator, NatsCoordinator};
use fleetcoord::testing::NatsServer;
use serde_json::Value;
use std::process::{Command, Output, Stdio};

fn run(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fleetcoord"))
        .env_remove("COORD")
        .env_remove("COORD_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .args(["--json", "--coord", "nats", "--coord-url", url])
        .args(args)
        .output()
        .expect("spawn fleetcoord")
}

fn ok(url: &str, args: &[&str]) -> Vec<Value> {
    let output = run(url, args);
    assert_eq!(
        output.status.code(),
        Some(0),
        "fleetcoord {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

#[test]
fn kv_and_streams_on_nats() {
    let server = NatsServer::start().expect("start nats-server (`make deps-nats` installs it)");
    let url = server.url();

    ok(&url, &["kv", "set", "config", "mode", "on"]);
    let got = ok(&url, &["kv", "get", "config", "mode"]);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["value"], "on", "{got:?}");
    // What the CLI wrote is in NATS, for any other client to see.
    let direct = NatsCoordinator::connect(&url).unwrap();
    assert_eq!(direct.kv_get("config", "mode").unwrap(), b"on");

    for (i, payload) in ["first", "second"].iter().enumerate() {
        let appended = ok(&url, &["stream", "append", "audit", payload]);
        assert_eq!(appended[0]["id"], (i + 1) as u64, "{appended:?}");
    }
    let read = ok(&url, &["stream", "read", "audit", "--count", "2"]);
    let entries: Vec<(u64, &str)> = read
        .iter()
        .map(|v| (v["id"].as_u64().unwrap(), v["payload"].as_str().unwrap()))
        .collect();
    assert_eq!(entries, [(1, "first"), (2, "second")]);
    let after = ok(
        &url,
        &["stream", "read", "audit", "--from", "1", "--count", "1"],
    );
    assert_eq!(after[0]["id"], 2);
}

#[test]
fn unreachable_nats_is_a_clear_error() {
    let output = run("nats://127.0.0.1:1", &["kv", "get", "config", "mode"]);
    assert_ne!(output.status.code(), Some(0));
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(
        err.contains("nats at nats://127.0.0.1:1: cannot connect"),
        "{err}"
    );
}
