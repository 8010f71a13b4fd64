//! `elect hand-over` refused by the leader fails at once, with the
//! leader's own reason, instead of waiting out its timeout for a guess.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use common::{etcdctl_keys, start_etcd};
use serde_json::Value;
use std::time::{Duration, Instant};
use support::{at, stderr, stdout, Running, WAIT};

/// The leader of election `name` (default prefix), as `leader --json`.
fn leader(endpoint: &str, name: &str) -> Value {
    let output = at(endpoint)
        .args(["--json", "leader", name])
        .output()
        .expect("spawn");
    // 3: no leader, which the record says too.
    assert!(
        matches!(output.status.code(), Some(0 | 3)),
        "{}",
        stderr(&output)
    );
    serde_json::from_str::<Value>(&stdout(&output)).expect("JSON")["leader"].clone()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asks for a hand-over of `name` to `to` with a long timeout; expects
/// the refusal well before it: exit 1, one line naming the leader and
/// `reason`. Returns how long it took.
fn refused(endpoint: &str, name: &str, to: &str, reason: &str) -> Duration {
    let started = Instant::now();
    let output = at(endpoint)
        .args(["elect", "hand-over", name, "--to", to, "--timeout", "60s"])
        .output()
        .expect("spawn");
    let took = started.elapsed();
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {text:?}");
    assert!(lines[0].contains("refused to hand over"), "{text}");
    assert!(lines[0].contains(reason), "{reason:?} not in {text}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {text}");
    // The request and the refusal are both gone.
    assert_eq!(
        etcdctl_keys(endpoint, &format!("/coord/election/{name}\u{1f}hand-over")),
        Vec::<String>::new()
    );
    took
}

#[test]
fn a_leader_that_refuses_says_why_at_once_and_keeps_leading() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let a = Running::start(
        &endpoint,
        &["elect", "ho", "--value", "a", "--accept-hand-over"],
    );
    let elected = a.until("event", "elected");
    // Nobody of that name waits.
    let took = refused(&endpoint, "ho", "nobody", "no waiting candidate");
    println!("refusal (no such candidate) took {took:?}");
    assert_eq!(leader(&endpoint, "ho")["token"], elected["token"]);
    // The target waits behind a candidate that did not opt into
    // priorities, which a hand-over must not move.
    let _plain = Running::start(&endpoint, &["elect", "ho", "--value", "plain"]);
    wait_until("plain queued", || {
        etcdctl_keys(&endpoint, "/coord/election/ho/").len() == 2
    });
    let _b = Running::start(
        &endpoint,
        &["elect", "ho", "--value", "b", "--priority", "1"],
    );
    wait_until("b queued", || {
        etcdctl_keys(&endpoint, "/coord/election/ho/").len() == 3
    });
    let took = refused(&endpoint, "ho", "b", "joined without a priority");
    println!("refusal (plain candidate ahead) took {took:?}");
    assert_eq!(leader(&endpoint, "ho")["token"], elected["token"]);
    a.until("event", "step_down_failed");
}

#[test]
fn a_gated_leader_that_refuses_says_why_and_that_it_resigned() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let _a = Running::start(
        &endpoint,
        &[
            "elect",
            "gho",
            "--value",
            "a",
            "--accept-hand-over",
            "--",
            "sleep",
            "100",
        ],
    );
    wait_until("a leads", || leader(&endpoint, "gho")["value"] == "a");
    let took = refused(&endpoint, "gho", "nobody", "resigned");
    println!("refusal (gated) took {took:?}");
}
