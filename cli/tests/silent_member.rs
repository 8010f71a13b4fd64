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

/// The member goes silent while the agent runs, just before `systemctl
/// stop`: the leave may go to it before the health probes take it out of
/// use. The agent still exits within a bound and the host is Down for its
/// watchers at once, never a TTL later. When the leave transaction went to
/// the silent member it is not sent again (a write), and after the
/// machine's attempt timeout the revoke goes instead (sent again once the
/// member is out of use): watchers then see the host Down at once with
/// reason `expired` rather than `left`, and the agent's record says so
/// (`left: false`) instead of claiming a leave.
#[test]
fn an_agent_exits_promptly_when_a_member_goes_silent_before_sigterm() {
    /// The leave or the revoke, routed around the silent member once
    /// (suspicion after a quarter second, the probes' half-second grace,
    /// the machine's half-second attempt timeout), plus the exit.
    const EXIT_BOUND: Duration = Duration::from_secs(2);
    let server = start_etcd();
    let watch = Running::start(&server.endpoint(), &["watch-hosts"]);
    watch.until("event", "synced");
    let mut exits = Vec::new();
    for round in 0..6 {
        let proxies: Vec<FaultProxy> = (0..3)
            .map(|_| FaultProxy::start(&server.endpoint()).expect("proxy"))
            .collect();
        let endpoints = proxies
            .iter()
            .map(FaultProxy::endpoint)
            .collect::<Vec<_>>()
            .join(",");
        let id = uuid::Uuid::new_v4().to_string();
        let mut agent = Running::start(&endpoints, &["agent", "--host-id", &id]);
        agent.until("state", "registered");
        let up = watch.until("event", "up");
        assert_eq!(up["id"], id.as_str(), "{up}");
        proxies[round % 3].set_mode(Mode::Blackhole);
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
        let said: Vec<String> = agent.lines.try_iter().collect();
        println!(
            "agent, member {} gone silent: SIGTERM to exit {took:?}, said {said:?}",
            round % 3
        );
        assert_eq!(code, Some(0));
        let down = watch.until("event", "down");
        let seen = t.elapsed();
        println!("  watchers: {down}, {seen:?} after SIGTERM");
        assert_eq!(down["id"], id.as_str(), "{down}");
        assert!(
            seen < EXIT_BOUND + Duration::from_millis(500),
            "Down seen {seen:?} after SIGTERM: the key waited for its TTL"
        );
        let claimed_left = said.iter().any(|l| l.contains("\"left\":true"));
        if down["reason"] != "left" {
            assert_eq!(down["reason"], "expired", "{down}");
            assert!(
                !claimed_left,
                "the agent claimed a leave watchers did not see: {said:?}"
            );
        }
        assert!(took < EXIT_BOUND, "the agent took {took:?} to exit");
        exits.push(took);
    }
    let (p50, max) = p50_max(&mut exits);
    println!("a member gone silent just before SIGTERM: exit p50 {p50:?} max {max:?}");
}
