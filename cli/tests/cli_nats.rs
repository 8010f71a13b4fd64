//! The `fleetcoord` binary on the NATS backend: `--coord nats --coord-url`
//! reaches a real nats-server for kv and stream commands, and a dead URL
//! is a clear error.

use fleetcoord::coordinator::{Coordinator, NatsCoordinator};
use fleetcoord::testing::{NatsBuilder, NatsServer};
use serde_json::Value;
use std::process::{Command, Output, Stdio};

/// Every variable the bus commands (and TLS) read, so the caller's shell
/// cannot leak in.
const COORD_VARS: [&str; 11] = [
    "COORD",
    "COORD_URL",
    "COORD_TLS_CA",
    "COORD_TLS_CERT",
    "COORD_TLS_KEY",
    "COORD_TLS_SERVER_NAME",
    "COORD_NATS_CREDS",
    "COORD_NATS_NKEY_FILE",
    "RUST_LOG",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

fn run(url: &str, args: &[&str]) -> Output {
    run_with(url, args, &[])
}

fn run_with(url: &str, args: &[&str], env: &[(&str, String)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fleetcoord"));
    for var in COORD_VARS {
        command.env_remove(var);
    }
    command
        .envs(env.iter().map(|(k, v)| (k, v)))
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
        err.contains("cannot connect to nats at nats://127.0.0.1:1"),
        "{err}"
    );
}

#[test]
fn tls_flags_and_a_creds_variable_reach_a_secured_server() {
    let server = NatsBuilder::new()
        .tls_verify_clients()
        .jwt_auth()
        .start()
        .expect("start nats-server (`make deps-nats` installs it)");
    let pki = server.pki().expect("test certificates");
    let (ca, cert, key) = (
        pki.ca_path().display().to_string(),
        pki.client_cert_path().display().to_string(),
        pki.client_key_path().display().to_string(),
    );
    let creds = server
        .creds_path()
        .expect("a creds file")
        .display()
        .to_string();
    let tls_flags = [
        "--coord-tls-ca",
        ca.as_str(),
        "--coord-tls-cert",
        cert.as_str(),
        "--coord-tls-key",
        key.as_str(),
    ];
    let set: Vec<&str> = tls_flags
        .iter()
        .copied()
        .chain(["kv", "set", "config", "mode", "on"])
        .collect();
    let output = run_with(&server.url(), &set, &[("COORD_NATS_CREDS", creds.clone())]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // The same through variables only, and the flag for the creds file.
    let env = [
        ("COORD_TLS_CA", ca.clone()),
        ("COORD_TLS_CERT", cert.clone()),
        ("COORD_TLS_KEY", key.clone()),
    ];
    let output = run_with(
        &server.url(),
        &["--nats-creds", &creds, "kv", "get", "config", "mode"],
        &env,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("\"on\""),
        "{stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Without the client certificate: a one-line error naming the cause.
    let output = run_with(
        &server.url(),
        &[
            "--coord-tls-ca",
            &ca,
            "--nats-creds",
            &creds,
            "kv",
            "get",
            "config",
            "mode",
        ],
        &[],
    );
    assert_ne!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("requires a client certificate"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");

    // async-nats reads the platform's roots even with a CA bundle given:
    // a broken SSL_CERT_FILE is named, not a mystery.
    let output = run_with(
        &server.url(),
        &["--nats-creds", &creds, "kv", "get", "config", "mode"],
        &[
            env[0].clone(),
            env[1].clone(),
            env[2].clone(),
            ("SSL_CERT_FILE", "/nonexistent/certs.pem".to_string()),
        ],
    );
    assert_ne!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("check SSL_CERT_FILE"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}
