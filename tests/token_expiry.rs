//! Auth tokens expiring mid-session (`--auth-token-ttl=2`): renewals,
//! watches and elections carry on with no Lost state, no false Down and no
//! lost leadership, also when every stream must be opened again with an
//! expired token (the proxy resets all connections).
//!
//! etcd 3.5 counts a lease renewal on a stream as a use of the token, so
//! the handle that renews leases here keeps its token alive there; 3.4
//! does not. The fresh watch of each round therefore runs on a second
//! handle that holds no lease: its token expires while it idles, on every
//! version, so every round makes etcd refuse an expired token.

use fleetcoord::testing::{EtcdBuilder, FaultProxy};
use fleetcoord::{
    Election, ElectionOptions, Etcd, EtcdOptions, HostEvent, HostLiveness, HostWatcher,
    LivenessState,
};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Seconds an idle simple token lives (etcd checks once a second).
const TOKEN_TTL_SECS: u64 = 2;
/// Lease TTL of the host and the election session.
const TTL: Duration = Duration::from_secs(5);
/// Two lease TTLs.
const RUN: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(10);

#[test]
fn expired_tokens_cause_no_lost_lease_no_false_down_and_no_lost_leadership() {
    let server = EtcdBuilder::new()
        .auth()
        .arg(format!("--auth-token-ttl={TOKEN_TTL_SECS}"))
        .start()
        .expect("auth etcd");
    let agent = server
        .create_user("agent", "agent-pw", Some("/coord/"))
        .expect("agent");
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let options = EtcdOptions::default().with_user(agent);
    let etcd = Etcd::with_options(&[proxy.endpoint()], options.clone()).expect("connect as agent");
    let idle = Etcd::with_options(&[proxy.endpoint()], options).expect("connect as agent");

    let watcher = HostWatcher::watch(&etcd).expect("watch");
    assert_eq!(
        watcher.events().recv_timeout(WAIT).unwrap(),
        HostEvent::Synced
    );
    let first = HostLiveness::register(&etcd, Uuid::new_v4(), b"first", TTL).expect("register");
    let election = Election::with_options(
        &etcd,
        "token-expiry",
        ElectionOptions::default().with_ttl(TTL),
    )
    .expect("election");
    let leadership = election.campaign(b"me").expect("campaign");

    let mut hosts = vec![first];
    let mut events = Vec::new();
    let started = Instant::now();
    let mut round = 0;
    while started.elapsed() < RUN {
        // Idle longer than the token lives: only streams ran meanwhile.
        let idle_until = Instant::now() + Duration::from_secs(TOKEN_TTL_SECS + 1);
        while Instant::now() < idle_until {
            if let Ok(e) = watcher.events().recv_timeout(Duration::from_millis(100)) {
                events.push(e);
            }
            assert!(leadership.is_held(), "leadership lost in round {round}");
        }
        round += 1;
        // Every stream (keepalive, watches, the leader's guard watch) is
        // opened again, now with an expired token.
        let reset = proxy.reset_all();
        println!("round {round}: reset {reset} connections");
        // A unary call and a fresh watch, both with an expired token (on
        // 3.5, only the watch's).
        let host = HostLiveness::register(&etcd, Uuid::new_v4(), b"late", TTL)
            .expect("register with an expired token");
        let fresh = HostWatcher::watch(&idle).expect("a new watch with an expired token");
        let mut seen = HashSet::new();
        loop {
            match fresh.events().recv_timeout(WAIT).expect("fresh watcher") {
                HostEvent::Up(info) => {
                    seen.insert(info.id);
                }
                HostEvent::Synced => break,
                other => panic!("fresh watcher: {other:?}"),
            }
        }
        hosts.push(host);
        assert!(
            hosts.iter().all(|h| seen.contains(&h.host_id())),
            "the fresh watcher misses hosts: {seen:?}"
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    events.extend(watcher.events().try_iter());

    println!("rounds: {round}; events at the first watcher: {events:?}");
    assert!(
        !events.iter().any(|e| matches!(e, HostEvent::Down(..))),
        "false Down: {events:?}"
    );
    for h in &hosts {
        let states: Vec<LivenessState> = h.states().try_iter().collect();
        assert!(
            !states
                .iter()
                .any(|s| matches!(s, LivenessState::Lost { .. })),
            "host {} lost its lease: {states:?}",
            h.host_id()
        );
        assert!(
            matches!(h.state(), LivenessState::Registered { .. }),
            "{:?}",
            h.state()
        );
    }
    assert!(leadership.is_held());
    assert_eq!(
        election.leader().expect("leader").map(|l| l.token),
        Some(leadership.fencing_token())
    );
    // etcd really did refuse expired tokens along the way.
    let refused = server
        .log_tail(100_000)
        .matches("invalid auth token")
        .count();
    println!("etcd refused an expired token {refused} times");
    assert!(refused > 0, "no token expired during the run");
}
