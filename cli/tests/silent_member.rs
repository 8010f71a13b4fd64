//! One of the endpoints accepts connections and never answers (a hung or
//! half-partitioned member; here a blackholing proxy in front of a healthy
//! etcd): one-shot commands still answer within a second, and an agent
//! exits on SIGTERM as quickly as with every member healthy, having left
//! (watchers see `down`, reason `left`). Before, `hosts` took 5.5-7.5 s and
//! the agent 2.5 s: the driver's shutdown waited for the health monitor's
//! probe of the silent member.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use common::start_etcd;
use fleetcoord::testing::{FaultProxy, Mode};
use std::process::Command;
use std::time::{Duration, Instant};
use support::{at, stderr, Running, WAIT};

/// A one-shot command: connect's 0.5 s grace for members that have not
/// answered yet, a round trip, and a close that no longer waits on the
/// silent member. The bound is 1 s plus one round trip.
const ONE_SHOT_BOUND: Duration = Duration::from_millis(1500);
/// SIGTERM to exit: the leave and the revoke, from the member that
/// answers (milliseconds), plus the process' own exit.
const EXIT_BOUND: Duration = Duration::from_millis(500);

fn p50_max(values: &mut [Duration]) -> (Duration, Duration) {
    values.sort();
    (values[values.len() / 2], values[values.len() - 1])
}

#[test]
fn one_shot_commands_and_agent_exits_ignore_a_silent_member() {
    let server = start_etcd();
    let healthy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let silent = FaultProxy::start(&server.endpoint()).expect("proxy");
    silent.set_mode(Mode::Blackhole);
    // One of three endpoints silent.
    let endpoints = format!(
        "{},{},{}",
        server.endpoint(),
        healthy.endpoint(),
        silent.endpoint()
    );

    let mut one_shots = Vec::new();
    for args in [
        vec!["hosts"],
        vec!["leader", "silent"],
        vec!["kv", "get", "bucket", "key"],
        vec!["shards", "silent", "--shards", "4"],
    ] {
        let t = Instant::now();
        let output = at(&endpoints).args(&args).output().expect("run fleetcoord");
        let took = t.elapsed();
        // Nothing there (no leader, no key, no shard owned) exits 3;
        // nothing may fail for want of an answer.
        assert!(
            matches!(output.status.code(), Some(0 | 3)),
            "{args:?}: {}",
            stderr(&output)
        );
        println!("{args:?} with one of three endpoints silent: {took:?}");
        assert!(took < ONE_SHOT_BOUND, "{args:?} took {took:?}");
        one_shots.push(took);
    }

    let watch = Running::start(&server.endpoint(), &["watch-hosts"]);
    watch.until("event", "synced");
    let mut exits = Vec::new();
    for _ in 0..3 {
        let id = uuid::Uuid::new_v4().to_string();
        let mut agent = Running::start(&endpoints, &["agent", "--host-id", &id]);
        agent.until("state", "registered");
        let up = watch.until("event", "up");
        assert_eq!(up["id"], id.as_str(), "{up}");
        let t = Instant::now();
        let status = Command::new("kill")
            .args(["-TERM", &agent.child.id().to_string()])
            .status()
            .expect("kill(1)");
        assert!(status.success());
        let code = loop {
            if let Some(status) = agent.child.try_wait().expect("try_wait") {
                break status.code();
            }
            assert!(t.elapsed() < WAIT, "the agent did not exit");
            std::thread::sleep(Duration::from_millis(2));
        };
        let took = t.elapsed();
        assert_eq!(code, Some(0));
        let down = watch.until("event", "down");
        assert_eq!(down["id"], id.as_str(), "{down}");
        assert_eq!(down["reason"], "left", "{down}");
        println!("agent: SIGTERM to exit {took:?}");
        assert!(took < EXIT_BOUND, "the agent took {took:?} to exit");
        exits.push(took);
    }
    let (shot_p50, shot_max) = p50_max(&mut one_shots);
    let (exit_p50, exit_max) = p50_max(&mut exits);
    println!(
        "one of three endpoints silent: one-shot commands p50 {shot_p50:?} max {shot_max:?}; \
         agent SIGTERM to exit p50 {exit_p50:?} max {exit_max:?}"
    );
}
