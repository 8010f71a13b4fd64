//! How fast a HostWatcher recovers once correctness already holds again
//! (issue 23, item 4): after a partition heals, and after etcd compacted
//! past the revision its watch would resume from. Each prints the time
//! from the heal until the watcher's view equals etcd's hosts, and bounds
//! it. A connection opened during the partition is dead (the proxy
//! discarded its bytes) and is noticed by the HTTP/2 keepalive: a ping
//! every `keepalive_interval`, unanswered for as long. So the bound is two
//! keepalive intervals, plus a second for the snapshot and the reconnect.

mod common;

use common::{apply, connect, etcdctl, start_etcd};
use fleetcoord::testing::{FaultProxy, Mode};
use fleetcoord::{list_hosts, HostInfo, HostLiveness, HostWatcher, DEFAULT_HOSTS_PREFIX};
use std::collections::{BTreeSet, HashMap};
use std::thread;
use std::time::{Duration, Instant};
use uuid::Uuid;

const TTL: Duration = Duration::from_secs(5);
/// The watcher's `EtcdOptions::keepalive_interval`, the shortest accepted.
const KEEPALIVE: Duration = Duration::from_secs(1);
/// Two keepalive intervals to notice the dead connection, a second more.
const BOUND: Duration = Duration::from_secs(3);

/// Applies the watcher's events until its view equals etcd's hosts, or
/// `within` passes; how long that took.
fn converge(
    watcher: &HostWatcher,
    view: &mut HashMap<Uuid, HostInfo>,
    etcd: &fleetcoord::Etcd,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        while let Ok(event) = watcher.events().try_recv() {
            if !matches!(event, fleetcoord::HostEvent::Synced) {
                apply(view, event);
            }
        }
        let actual: BTreeSet<Uuid> = list_hosts(etcd, DEFAULT_HOSTS_PREFIX)
            .expect("list")
            .into_iter()
            .map(|h| h.id)
            .collect();
        let seen: BTreeSet<Uuid> = view.keys().copied().collect();
        if actual == seen {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "not converged within {within:?}: etcd {actual:?}, watcher {seen:?}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// A watcher behind a proxy, three hosts beside it on a direct handle.
struct Setup {
    server: fleetcoord::testing::EtcdServer,
    proxy: FaultProxy,
    direct: fleetcoord::Etcd,
    watcher: HostWatcher,
    view: HashMap<Uuid, HostInfo>,
    hosts: Vec<HostLiveness>,
}

fn setup() -> Setup {
    let server = start_etcd();
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let direct = connect(&server.endpoint());
    let cut = fleetcoord::Etcd::with_options(
        &[proxy.endpoint()],
        fleetcoord::EtcdOptions::default().with_keepalive_interval(KEEPALIVE),
    )
    .expect("connect");
    let hosts: Vec<HostLiveness> = (0..3)
        .map(|_| HostLiveness::register(&direct, Uuid::new_v4(), b"m", TTL).expect("register"))
        .collect();
    let watcher = HostWatcher::watch(&cut).expect("watch");
    let mut view = HashMap::new();
    converge(&watcher, &mut view, &direct, Duration::from_secs(5));
    Setup {
        server,
        proxy,
        direct,
        watcher,
        view,
        hosts,
    }
}

#[test]
fn a_healed_partition_converges_within_two_keepalive_intervals() {
    let mut s = setup();
    s.proxy.set_mode(Mode::Blackhole);
    // While the watcher hears nothing: one host leaves, two arrive.
    let _left = s.hosts.remove(0).close();
    for _ in 0..2 {
        s.hosts
            .push(HostLiveness::register(&s.direct, Uuid::new_v4(), b"m", TTL).expect("register"));
    }
    thread::sleep(Duration::from_secs(5));
    s.proxy.set_mode(Mode::Pass);
    let took = converge(&s.watcher, &mut s.view, &s.direct, Duration::from_secs(15));
    println!("5 s partition healed -> watcher converged in {took:?}");
    assert!(took < BOUND, "{took:?}");
}

#[test]
fn a_compaction_behind_the_watch_resyncs_at_once() {
    let mut s = setup();
    s.proxy.set_mode(Mode::Blackhole);
    let _left = s.hosts.remove(0).close();
    s.hosts
        .push(HostLiveness::register(&s.direct, Uuid::new_v4(), b"m", TTL).expect("register"));
    // Compact everything the watcher has not seen: its watch must start
    // over from a snapshot.
    let status = etcdctl(
        &s.server.endpoint(),
        &["endpoint", "status", "--write-out", "json"],
    );
    let revision: i64 = status
        .split("\"revision\":")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .expect("a revision in etcdctl's status");
    etcdctl(&s.server.endpoint(), &["compact", &revision.to_string()]);
    // Long enough for the client to drop the silent connection.
    thread::sleep(Duration::from_secs(5));
    s.proxy.set_mode(Mode::Pass);
    let took = converge(&s.watcher, &mut s.view, &s.direct, Duration::from_secs(15));
    println!("compacted past the watch, healed -> watcher converged in {took:?}");
    assert!(took < BOUND, "{took:?}");
}
