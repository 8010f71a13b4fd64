//! What an idle fleet costs etcd, read from etcd's own `/metrics` (issue
//! 24, item 1): 50 agents, each one `Etcd` given all three endpoints of a
//! 3-member cluster, with 20 `HostLiveness` each (1,000 hosts, TTL 6 s).
//! Over 30 s in which nothing happens, checked:
//!
//! * every call etcd sees beyond the renewals (health probes, streams
//!   opened again, anything) is at most one per endpoint per agent per
//!   30 s — endpoint health costs nothing while every member answers;
//! * the renewals come at the pace the TTL asks (about three per TTL and
//!   host), on the keepalive streams already open: none is opened again,
//!   which also shows etcd never closed a quiet connection for pinging it
//!   too often (`too_many_pings`).
//!
//! It prints what etcd served per method.

use fleetcoord::testing::{EtcdCluster, GrpcCounts};
use fleetcoord::{Etcd, EtcdOptions, HostLiveness};
use std::thread;
use std::time::{Duration, Instant};
use uuid::Uuid;

const AGENTS: usize = 50;
const HOSTS_PER_AGENT: usize = 20;
const TTL: Duration = Duration::from_secs(6);
const WINDOW: Duration = Duration::from_secs(30);
/// A TTL whose renewals leave the connection quiet for ~10 s at a time.
const QUIET_TTL: Duration = Duration::from_secs(30);

fn served(cluster: &EtcdCluster) -> GrpcCounts {
    cluster.grpc_counts().expect("etcd's metrics")
}

#[test]
fn an_idle_fleet_costs_etcd_its_renewals_and_nothing_else() {
    let cluster = EtcdCluster::start(3).expect("3-member cluster");
    let endpoints = cluster.endpoints();
    let agents: Vec<(Etcd, Vec<HostLiveness>)> = (0..AGENTS)
        .map(|_| {
            let etcd = Etcd::with_options(&endpoints, EtcdOptions::default()).expect("connect");
            let hosts = (0..HOSTS_PER_AGENT)
                .map(|_| {
                    HostLiveness::register(&etcd, Uuid::new_v4(), b"{}", TTL).expect("register")
                })
                .collect();
            (etcd, hosts)
        })
        .collect();
    // Past the first renewal of every host, so that every keepalive stream
    // is open before the window starts.
    thread::sleep(TTL / 2);

    let before = served(&cluster);
    let started = Instant::now();
    thread::sleep(WINDOW);
    let window = started.elapsed();
    let during = served(&cluster).since(&before);

    let hosts = AGENTS * HOSTS_PER_AGENT;
    let renewals = during.received("LeaseKeepAlive");
    let calls: u64 = during.started_by_method().map(|(_, n)| n).sum();
    let by_method: Vec<String> = during
        .started_by_method()
        .map(|(m, n)| format!("{m} {n}"))
        .collect();
    println!(
        "{AGENTS} agents, {hosts} hosts, TTL {TTL:?}, {window:.1?} idle: etcd received {renewals} \
         renewals ({:.2} per host per TTL) and started {calls} calls: {by_method:?}",
        renewals as f64 / hosts as f64 / (window.as_secs_f64() / TTL.as_secs_f64())
    );

    let budget = (AGENTS * endpoints.len()) as u64;
    assert!(
        calls <= budget,
        "{calls} calls beyond the renewals in {window:.1?}, budget {budget} \
         (one per endpoint per agent per 30 s): {by_method:?}"
    );
    // Three renewals per TTL and host, a little more for the safety margin
    // the renewal schedule keeps; fewer would let leases expire.
    let per_ttl = renewals as f64 / hosts as f64 / (window.as_secs_f64() / TTL.as_secs_f64());
    assert!(
        (2.5..=4.5).contains(&per_ttl),
        "{per_ttl:.2} renewals per host per TTL"
    );
    for (_, hosts) in &agents {
        for host in hosts {
            assert!(
                matches!(host.state(), fleetcoord::LivenessState::Registered { .. }),
                "a host is not registered: {:?}",
                host.state()
            );
        }
    }
}

/// A quiet agent with a long TTL (a renewal every ~10 s) and a watcher on
/// one handle: etcd sends nothing for seconds at a time, the HTTP/2 pings
/// go on, and no stream may be dropped for them (etcd closes a connection
/// pinged more often than every 5 s while it sends nothing; at the old 2 s
/// interval the watch started over every ~10 s).
#[test]
fn quiet_streams_are_never_dropped_for_their_pings() {
    let cluster = EtcdCluster::start(3).expect("3-member cluster");
    let etcd = Etcd::with_options(&cluster.endpoints(), EtcdOptions::default()).expect("connect");
    let _host = HostLiveness::register(&etcd, Uuid::new_v4(), b"{}", Duration::from_secs(60))
        .expect("register");
    let watcher = fleetcoord::HostWatcher::watch(&etcd).expect("watch");
    assert!(matches!(
        watcher.events().recv_timeout(Duration::from_secs(10)),
        Ok(fleetcoord::HostEvent::Up(_))
    ));
    // From the first renewal on, which opens the keepalive stream.
    let since_start = served(&cluster);
    let opened = Instant::now();
    while served(&cluster)
        .since(&since_start)
        .started("LeaseKeepAlive")
        == 0
    {
        assert!(opened.elapsed() < QUIET_TTL, "no renewal within the TTL");
        thread::sleep(Duration::from_millis(200));
    }
    let before = served(&cluster);
    thread::sleep(WINDOW);
    let during = served(&cluster).since(&before);
    let by_method: Vec<String> = during
        .started_by_method()
        .map(|(m, n)| format!("{m} {n}"))
        .collect();
    println!("a quiet agent and watcher, {WINDOW:?}: etcd started {by_method:?}");
    assert_eq!(during.started("Watch"), 0, "{by_method:?}");
    assert_eq!(during.started("LeaseKeepAlive"), 0, "{by_method:?}");
    assert!(
        during.started_by_method().map(|(_, n)| n).sum::<u64>() <= 3,
        "{by_method:?}"
    );
}
