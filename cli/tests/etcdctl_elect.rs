//! `--prefix ''` on `leader`, `observe` and `elect`: the tool sees and
//! joins an election held by `etcdctl elect NAME` (keys `NAME/<lease
//! hex>`, no fleetcoord prefix), against a real etcd and etcdctl.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use common::{etcdctl, etcdctl_keys, start_etcd, EtcdctlChild};
use serde_json::Value;
use std::time::{Duration, Instant};
use support::{at, stderr, stdout, Running, WAIT};

/// `fleetcoord --json leader NAME ARGS...`: the leader record.
fn leader(endpoint: &str, args: &[&str]) -> Value {
    let output = at(endpoint)
        .args(["--json", "leader"])
        .args(args)
        .output()
        .expect("spawn fleetcoord");
    // 3: no leader, which the record says too.
    assert!(
        matches!(output.status.code(), Some(0 | 3)),
        "leader: {}",
        stderr(&output)
    );
    serde_json::from_str(&stdout(&output)).expect("one JSON record")
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn prefix_sees_and_joins_an_etcdctl_election() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let mut held = EtcdctlChild::spawn(&endpoint, &["elect", "jobs", "from-etcdctl"]);
    // Once leading, etcdctl prints its key, then its value.
    let key = held.lines.recv_timeout(WAIT).expect("etcdctl leads");
    assert!(key.starts_with("jobs/"), "{key}");

    // `leader` and `observe` show etcdctl's leadership under --prefix ''.
    let seen = leader(&endpoint, &["--prefix", "", "jobs"]);
    assert_eq!(seen["leader"]["value"], "from-etcdctl", "{seen}");
    assert_eq!(seen["leader"]["key"], key.as_str(), "{seen}");
    // Under the default prefix, the same name is another (empty) election.
    assert_eq!(leader(&endpoint, &["jobs"])["leader"], Value::Null);
    let observer = Running::start(&endpoint, &["observe", "--prefix", "", "jobs"]);
    assert_eq!(observer.next()["leader"]["value"], "from-etcdctl");

    // `elect --prefix ''` queues behind etcdctl, in etcdctl's election.
    let candidate = Running::start(
        &endpoint,
        &[
            "elect",
            "--prefix",
            "",
            "jobs",
            "--value",
            "from-fleetcoord",
        ],
    );
    candidate.until("event", "campaigning");
    wait_until("fleetcoord's key queued under jobs/", || {
        etcdctl_keys(&endpoint, "jobs/").len() == 2
    });
    assert!(
        candidate.next_within(Duration::from_millis(500)).is_none(),
        "fleetcoord led while etcdctl did"
    );

    // etcdctl dies. etcdctl 3.4 gives its session a 60 s lease and no flag
    // to shorten it; revoking the lease is what its expiry would do.
    held.child.kill().expect("kill etcdctl");
    held.child.wait().expect("reap etcdctl");
    let lease = key.rsplit('/').next().expect("lease hex");
    etcdctl(&endpoint, &["lease", "revoke", lease]);

    let elected = candidate.until("event", "elected");
    let new_key = elected["key"].as_str().expect("key");
    assert!(new_key.starts_with("jobs/"), "{elected}");
    assert_eq!(
        observer.next()["leader"]["value"],
        "from-fleetcoord",
        "observe --prefix '' follows the change"
    );
    // etcdctl's view: the only candidate key is fleetcoord's, and it holds
    // fleetcoord's value.
    assert_eq!(etcdctl_keys(&endpoint, "jobs/"), [new_key]);
    assert_eq!(
        etcdctl(&endpoint, &["get", new_key, "--print-value-only"]).trim(),
        "from-fleetcoord"
    );
}
