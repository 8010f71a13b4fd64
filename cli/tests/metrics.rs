//! `--metrics-addr`: a plain HTTP client scrapes `/metrics` and `/healthz`
//! of a running `fleetcoord agent` and `elect`, and the series follow etcd
//! being paused past the lease TTL and resumed.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::{start_etcd, ChildGuard};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

/// A long-running command with `--metrics-addr 127.0.0.1:0`; returns it and
/// the address it serves on (from its `metrics` record on stderr).
fn start(endpoint: &str, args: &[&str]) -> (ChildGuard, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fleetcoord"))
        .env_remove("RUST_LOG")
        .args([
            "--json",
            "--endpoints",
            endpoint,
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fleetcoord");
    let lines = common::lines_of(child.stderr.take().unwrap());
    let addr = loop {
        let line = lines
            .recv_timeout(WAIT)
            .expect("a metrics record on stderr");
        if let Ok(record) = serde_json::from_str::<Value>(&line) {
            if record["event"] == "metrics" {
                break record["addr"].as_str().unwrap().to_string();
            }
        }
    };
    (ChildGuard(child), addr)
}

/// `GET path` with a bare HTTP/1.0 client: (status code, body).
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the metrics address");
    stream.set_read_timeout(Some(WAIT)).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The value of the first sample of `series` (name plus labels prefix).
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn agent_metrics_and_health_follow_a_paused_etcd() {
    let server = start_etcd();
    let id = "6f1c2b1e-3a0d-4c7e-9b1a-2d3e4f5a6b7c";
    let key = format!("/coord/hosts/{id}");
    let (_agent, addr) = start(
        &server.endpoint(),
        &["agent", "--host-id", id, "--ttl", "2s"],
    );
    until("healthz 200 once registered", || {
        get(&addr, "/healthz").0 == 200
    });
    let registered = format!("fleetcoord_liveness_registered{{key=\"{key}\"}}");
    let (status, body) = get(&addr, "/metrics");
    assert_eq!(status, 200);
    assert_eq!(sample(&body, &registered), Some(1.0), "{body}");
    until("a renewal round trip is recorded", || {
        get(&addr, "/metrics")
            .1
            .contains("fleetcoord_request_duration_seconds_count{kind=\"keepalive\"}")
    });

    // Past the TTL: renewals fail, the lease is presumed lost.
    server.pause().unwrap();
    until("healthz 503 while etcd is paused", || {
        get(&addr, "/healthz").0 == 503
    });
    let body = get(&addr, "/metrics").1;
    assert_eq!(sample(&body, &registered), Some(0.0), "{body}");
    until("the suspension is counted", || {
        get(&addr, "/metrics").1.contains(&format!(
            "fleetcoord_liveness_transitions_total{{key=\"{key}\",state=\"suspended\"}}"
        ))
    });
    std::thread::sleep(Duration::from_secs(3));
    server.resume().unwrap();
    until("healthz 200 again after etcd resumed", || {
        get(&addr, "/healthz").0 == 200
    });
    let body = get(&addr, "/metrics").1;
    assert_eq!(sample(&body, &registered), Some(1.0), "{body}");
    assert!(body.contains("state=\"lost\""), "{body}");
    assert!(body.contains("fleetcoord_request_errors_total"), "{body}");
    assert_eq!(get(&addr, "/nope").0, 404);
    every_family_has_help(&body);
}

/// What `promtool check metrics` asks first: every `# TYPE` family comes
/// with a `# HELP` line.
fn every_family_has_help(body: &str) {
    let families: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(!families.is_empty(), "{body}");
    for family in families {
        assert!(
            body.lines()
                .any(|l| l.starts_with(&format!("# HELP {family} "))),
            "no help text for {family}:\n{body}"
        );
    }
}

#[test]
fn elect_is_ready_only_while_leading() {
    let server = start_etcd();
    let (_leader, leader_addr) = start(&server.endpoint(), &["elect", "metrics-e"]);
    until("the first candidate leads", || {
        get(&leader_addr, "/healthz").0 == 200
    });
    let (_second, second_addr) = start(&server.endpoint(), &["elect", "metrics-e"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        get(&second_addr, "/healthz").0,
        503,
        "a waiting candidate is not ready"
    );
    let body = get(&leader_addr, "/metrics").1;
    assert_eq!(
        sample(
            &body,
            "fleetcoord_election_held{election=\"/coord/election/metrics-e/\"}"
        ),
        Some(1.0),
        "{body}"
    );
    assert!(
        sample(
            &body,
            "fleetcoord_election_token{election=\"/coord/election/metrics-e/\"}"
        )
        .is_some_and(|t| t > 0.0),
        "{body}"
    );
    every_family_has_help(&body);
}

/// A candidate that waited behind a leader records the wait and the
/// contention once it leads; the leader, which found nobody ahead, records
/// its wait and no contention, and its hold time once it resigned.
#[test]
fn a_contended_campaign_records_its_wait() {
    let server = start_etcd();
    let series = |name: &str| format!("{name}{{election=\"/coord/election/metrics-w/\"}}");
    let (mut first, first_addr) = start(&server.endpoint(), &["elect", "metrics-w"]);
    until("the first candidate leads", || {
        get(&first_addr, "/healthz").0 == 200
    });
    let body = get(&first_addr, "/metrics").1;
    let count = |body: &str| sample(body, &series("fleetcoord_wait_seconds_count"));
    assert_eq!(count(&body), Some(1.0), "{body}");
    assert!(!body.contains("fleetcoord_contended_total"), "{body}");
    let (_second, second_addr) = start(&server.endpoint(), &["elect", "metrics-w"]);
    let queued = Duration::from_millis(1500);
    std::thread::sleep(queued);
    // SIGTERM: the first resigns, the second leads at once.
    let pid = first.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let _ = first.wait();
    until("the second candidate leads", || {
        get(&second_addr, "/healthz").0 == 200
    });
    let body = get(&second_addr, "/metrics").1;
    assert_eq!(count(&body), Some(1.0), "{body}");
    let waited = sample(&body, &series("fleetcoord_wait_seconds_sum")).expect("a wait sum");
    // Queued for `queued`, less however long the second took to campaign
    // after it served its metrics; a wait not measured would be ~0.
    let at_least = queued.as_secs_f64() - 0.5;
    assert!(waited >= at_least, "waited {waited} s: {body}");
    assert_eq!(
        sample(&body, &series("fleetcoord_contended_total")),
        Some(1.0),
        "{body}"
    );
    every_family_has_help(&body);
}

#[test]
fn metrics_addr_is_refused_for_short_commands() {
    let server = start_etcd();
    let output = Command::new(env!("CARGO_BIN_EXE_fleetcoord"))
        .args([
            "--endpoints",
            &server.endpoint(),
            "--metrics-addr",
            "127.0.0.1:0",
            "hosts",
        ])
        .output()
        .unwrap();
    // A usage error: the flag does not go with this command.
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("long-running"));
}
