//! `fleetcoord agent --state-file`: restarts within the TTL hand the
//! registration to the next run, so `watch-hosts` sees no `down` (only
//! `updated`); a restart past the TTL is exactly one `down` (expired) and
//! one `up`.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use common::start_etcd;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{Running, WAIT};

const ID: &str = "5b0e2c1d-7a44-4f3e-9c21-8d6a1f0b3e57";
const TTL_SECS: u64 = 5;

/// One run of the agent: registered (returns that record), then SIGTERM,
/// detached, exited with 0.
fn one_run(endpoint: &str, state_file: &Path) -> Value {
    let ttl = format!("{TTL_SECS}s");
    let state = state_file.to_str().expect("utf-8 path");
    let mut agent = Running::start(
        endpoint,
        &[
            "agent",
            "--host-id",
            ID,
            "--ttl",
            &ttl,
            "--state-file",
            state,
            "--publish-incarnation",
        ],
    );
    let registered = agent.until("state", "registered");
    let status = Command::new("kill")
        .args(["-TERM", &agent.child.id().to_string()])
        .status()
        .expect("kill(1)");
    assert!(status.success());
    let detached = agent.until("state", "detached");
    assert_eq!(detached["lease"], registered["lease"], "{detached}");
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = agent.child.try_wait().expect("try_wait") {
            assert_eq!(status.code(), Some(0));
            break;
        }
        assert!(Instant::now() < deadline, "the agent did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
    registered
}

/// The watcher's events that arrive within `quiet` of each other.
fn drain(watch: &Running, quiet: Duration) -> Vec<Value> {
    std::iter::from_fn(|| watch.next_within(quiet)).collect()
}

fn count(events: &[Value], name: &str) -> usize {
    events.iter().filter(|e| e["event"] == name).count()
}

#[test]
fn restarts_within_the_ttl_are_no_down_and_one_past_it_is_one_down_expired_and_one_up() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let dir = std::env::temp_dir().join(format!("fleetcoord-agent-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let state_file = dir.join("agent.state");
    let _ = std::fs::remove_file(&state_file);
    let watch = Running::start(&endpoint, &["watch-hosts"]);
    watch.until("event", "synced");

    // The first run registers; each of the 20 restarts resumes.
    let first = one_run(&endpoint, &state_file);
    assert_eq!(first["resumed"], false, "{first}");
    let lease = first["lease"].clone();
    let started = Instant::now();
    for restart in 1..=20 {
        let record = one_run(&endpoint, &state_file);
        assert_eq!(record["resumed"], true, "restart {restart}: {record}");
        assert_eq!(record["incarnation"], restart + 1, "{record}");
        assert_eq!(record["lease"], lease, "restart {restart}: {record}");
    }
    let took = started.elapsed();
    println!("20 restarts within the TTL: {took:?}");
    assert!(took < Duration::from_secs(TTL_SECS * 20), "{took:?}");
    let events = drain(&watch, Duration::from_secs(1));
    println!(
        "watcher: {} up, {} updated, {} down",
        count(&events, "up"),
        count(&events, "updated"),
        count(&events, "down")
    );
    assert_eq!(count(&events, "down"), 0, "{events:?}");
    assert_eq!(count(&events, "up"), 1, "{events:?}");
    assert_eq!(count(&events, "updated"), 20, "{events:?}");
    // Watchers count the restarts: each `updated` carries the incarnation
    // the run wrote.
    let counted: Vec<u64> = events
        .iter()
        .filter(|e| e["event"] == "up" || e["event"] == "updated")
        .filter_map(|e| e["incarnation"].as_u64())
        .collect();
    assert_eq!(counted, (1..=21).collect::<Vec<u64>>(), "{events:?}");

    // Past the TTL: the saved lease expires (one down, expired), and the
    // next run registers afresh (one up).
    let _ = one_run(&endpoint, &state_file);
    let stopped = Instant::now();
    let mut down = watch.next();
    while down["event"] != "down" {
        // Only this run's own `updated` comes before the down.
        assert_eq!(down["event"], "updated", "{down}");
        down = watch.next();
    }
    assert_eq!(down["id"], ID);
    assert_eq!(down["reason"], "expired", "{down}");
    assert_eq!(down["incarnation"], 22, "{down}");
    let gone = stopped.elapsed();
    println!("detached -> down (expired): {gone:?}");
    // Liveness: the detached lease is not kept alive by anyone, so its
    // expiry is seen within the TTL plus etcd's expiry slack.
    assert!(
        gone < Duration::from_secs(TTL_SECS) + Duration::from_secs(2),
        "down after {gone:?}"
    );
    let again = one_run(&endpoint, &state_file);
    assert_eq!(again["resumed"], false, "{again}");
    assert_ne!(again["lease"], lease);
    let events = drain(&watch, Duration::from_secs(1));
    // The `updated` of the run before the expiry came before the down.
    assert_eq!(count(&events, "up"), 1, "{events:?}");
    assert_eq!(count(&events, "down"), 0, "{events:?}");
    // Registered afresh, but still the next run of this host: 23.
    let up = events.iter().find(|e| e["event"] == "up");
    assert_eq!(
        up.map(|e| &e["incarnation"]),
        Some(&serde_json::json!(23)),
        "{events:?}"
    );
    // That last run detached too: its lease expires, once more one down.
    let down = watch.until("event", "down");
    assert_eq!(down["reason"], "expired", "{down}");
    let _ = std::fs::remove_dir_all(&dir);
}
