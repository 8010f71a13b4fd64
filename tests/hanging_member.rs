//! One of three etcd members accepts connections but never answers (a
//! blackholing proxy in front of it): calls keep succeeding, no lease is
//! lost, no leader loses leadership, and the member is used again once it
//! answers. Prints calls/s and the worst latency with and without the fault.

use fleetcoord::testing::{EtcdCluster, FaultProxy, Mode};
use fleetcoord::{
    Election, ElectionOptions, Etcd, EtcdOptions, HostEvent, HostLiveness, HostWatcher,
    LivenessState,
};
use std::time::{Duration, Instant};
use uuid::Uuid;

const TTL: Duration = Duration::from_secs(6);
const PHASE: Duration = Duration::from_secs(6);
const WAIT: Duration = Duration::from_secs(10);

/// Calls made back to back for `how_long`: (calls, failures, worst latency).
fn measure(election: &Election, how_long: Duration) -> (u32, u32, Duration) {
    let (mut calls, mut failures, mut worst) = (0u32, 0u32, Duration::ZERO);
    let started = Instant::now();
    while started.elapsed() < how_long {
        let t = Instant::now();
        let result = election.leader();
        worst = worst.max(t.elapsed());
        calls += 1;
        if let Err(e) = result {
            failures += 1;
            println!("call failed after {:?}: {e}", t.elapsed());
        }
    }
    (calls, failures, worst)
}

fn report(what: &str, (calls, failures, worst): (u32, u32, Duration), over: Duration) {
    println!(
        "{what}: {calls} calls in {over:?} = {:.0} calls/s, {failures} failed, worst latency {worst:?}",
        f64::from(calls) / over.as_secs_f64()
    );
}

#[test]
fn a_hanging_member_costs_at_most_one_timeout_and_no_lease() {
    let cluster = EtcdCluster::start(3).expect("3-member cluster");
    let proxies: Vec<FaultProxy> = cluster
        .endpoints()
        .iter()
        .map(|e| FaultProxy::start(e).expect("proxy"))
        .collect();
    let endpoints: Vec<String> = proxies.iter().map(FaultProxy::endpoint).collect();
    let options = EtcdOptions::default()
        .with_request_timeout(Duration::from_secs(2))
        .with_keepalive_interval(Duration::from_secs(1));
    let etcd = Etcd::with_options(&endpoints, options).expect("connect");

    let watcher = HostWatcher::watch(&etcd).expect("watch");
    assert_eq!(
        watcher.events().recv_timeout(WAIT).unwrap(),
        HostEvent::Synced
    );
    let host = HostLiveness::register(&etcd, Uuid::new_v4(), b"h", TTL).expect("register");
    let election =
        Election::with_options(&etcd, "hanging", ElectionOptions::default().with_ttl(TTL))
            .expect("election");
    let leadership = election.campaign(b"me").expect("campaign");
    std::thread::sleep(Duration::from_secs(1));
    let mut events: Vec<HostEvent> = watcher.events().try_iter().collect();
    while host.states().try_recv().is_ok() {}

    let healthy = measure(&election, PHASE);
    report("no fault", healthy, PHASE);

    proxies[0].set_mode(Mode::Blackhole);
    let faulty = measure(&election, PHASE);
    report("member 0 hanging", faulty, PHASE);
    assert!(leadership.is_held(), "leadership lost during the fault");

    // Back: after a few probes member 0 is in use again, so the cluster
    // stays reachable when the two others hang instead.
    proxies[0].set_mode(Mode::Pass);
    std::thread::sleep(Duration::from_secs(4));
    proxies[1].set_mode(Mode::Blackhole);
    proxies[2].set_mode(Mode::Blackhole);
    let others = measure(&election, PHASE);
    report("members 1 and 2 hanging", others, PHASE);
    proxies[1].set_mode(Mode::Pass);
    proxies[2].set_mode(Mode::Pass);

    events.extend(watcher.events().try_iter());
    assert!(
        !events.iter().any(|e| matches!(e, HostEvent::Down(..))),
        "false Down: {events:?}"
    );
    let states: Vec<LivenessState> = host.states().try_iter().collect();
    println!("liveness states during the faults: {states:?}");
    assert!(
        !states
            .iter()
            .any(|s| matches!(s, LivenessState::Lost { .. })),
        "lease lost: {states:?}"
    );
    assert!(leadership.is_held(), "leadership lost");
    assert!(leadership.lost().try_recv().is_err(), "leadership lost");
    assert_eq!(healthy.1, 0, "calls failed without any fault");
    // Before the probe notices, the calls already sent to the hanging
    // member time out: one for a single caller, at most one per probe
    // round.
    for (what, phase) in [("member 0", faulty), ("members 1 and 2", others)] {
        assert!(phase.1 <= 3, "{what} hanging: {} calls failed", phase.1);
        assert!(
            phase.0 > 10 * phase.1.max(1),
            "{what} hanging: only {} calls",
            phase.0
        );
    }
}

/// The median and the largest of `values`.
fn p50_max(values: &mut [Duration]) -> (Duration, Duration) {
    values.sort();
    (values[values.len() / 2], values[values.len() - 1])
}

/// One endpoint of two accepts connections and never answers, from the
/// start (the member it fronts is healthy; the blackholing proxy is the
/// fault). Closing a host, an election and the handle, or dropping the
/// handle, takes what the leave and the revoke need from the member that
/// answers — milliseconds — and never waits on the silent one: before, the
/// health monitor's probe of the silent member (a whole request timeout,
/// 5 s) held `Etcd::close` for 5.0-7.0 s. Watchers on another connection
/// see the leave at once: the work was done, not skipped.
#[test]
fn a_silent_member_never_slows_a_close_or_a_drop() {
    /// Closing the handle (the revokes and the driver's stop), with
    /// everything on it closed first; "100 ms plus what the leave needs".
    const CLOSE_BOUND: Duration = Duration::from_millis(500);
    /// Closing one primitive: its leave or resign, one or two requests.
    const PRIMITIVE_BOUND: Duration = Duration::from_millis(300);
    const ROUNDS: usize = 4;

    let server = fleetcoord::testing::EtcdServer::start().expect("etcd");
    let silent = FaultProxy::start(&server.endpoint()).expect("proxy");
    silent.set_mode(Mode::Blackhole);
    let endpoints = [server.endpoint(), silent.endpoint()];
    let observer = Etcd::connect(&[server.endpoint()]).expect("observer");
    let watcher = HostWatcher::watch(&observer).expect("watch");
    assert_eq!(
        watcher.events().recv_timeout(WAIT).unwrap(),
        HostEvent::Synced
    );

    let (mut host_closes, mut election_closes, mut handle_closes) = (vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        let etcd = Etcd::connect(&endpoints).expect("connect with one silent endpoint");
        let id = Uuid::new_v4();
        let host = HostLiveness::register(&etcd, id, b"h", TTL).expect("register");
        let election = Election::new(&etcd, "silent-exit").expect("election");
        let leadership = election.campaign(b"me").expect("campaign");
        loop {
            match watcher.events().recv_timeout(WAIT).expect("Up") {
                HostEvent::Up(info) if info.id == id => break,
                _ => {}
            }
        }

        let t = Instant::now();
        host.close().expect("close the host");
        host_closes.push(t.elapsed());
        let t = Instant::now();
        drop(leadership);
        election.close().expect("close the election");
        election_closes.push(t.elapsed());
        // Even rounds close the handle, odd ones drop its last clone.
        let t = Instant::now();
        if round % 2 == 0 {
            etcd.close().expect("close the handle");
        } else {
            drop(etcd);
        }
        handle_closes.push(t.elapsed());
        let seen = Instant::now();
        loop {
            match watcher.events().recv_timeout(WAIT).expect("Down") {
                HostEvent::Down(info, reason) if info.id == id => {
                    assert_eq!(reason, fleetcoord::DownReason::Left);
                    break;
                }
                _ => {}
            }
        }
        assert!(seen.elapsed() < PRIMITIVE_BOUND, "leave seen late");
        assert!(observer.lease_ttl(0).is_ok(), "the observer still answers");
    }
    let (host_p50, host_max) = p50_max(&mut host_closes);
    let (election_p50, election_max) = p50_max(&mut election_closes);
    let (handle_p50, handle_max) = p50_max(&mut handle_closes);
    println!(
        "one of two endpoints silent, {ROUNDS} rounds: HostLiveness::close p50 {host_p50:?} max \
         {host_max:?}; Election::close p50 {election_p50:?} max {election_max:?}; \
         Etcd::close / drop p50 {handle_p50:?} max {handle_max:?}"
    );
    assert!(
        host_max < PRIMITIVE_BOUND,
        "HostLiveness::close took {host_max:?}"
    );
    assert!(
        election_max < PRIMITIVE_BOUND,
        "Election::close took {election_max:?}"
    );
    assert!(handle_max < CLOSE_BOUND, "Etcd::close took {handle_max:?}");
}

/// One of three endpoints goes silent while the handle is in use (the
/// member it fronts stays healthy; the blackholing proxy is the fault),
/// with the default options (5 s request timeout). Reads made back to back
/// from one thread, unary ones (`Etcd::lease_ttl`) and a machine's
/// (`list_hosts`), route around it on the first slow one: that read raises
/// suspicion after a quarter of a second, the probes find the member
/// silent half a second after the others answered, and the read, which
/// may have gone there, is sent again on the members still in use. No
/// read fails, one takes about 0.75 s, the rest a round trip. Before, the first read
/// sent there failed after 5 s (a machine's read, retried, took 10 s), and
/// the next ones kept landing there until a probe with a 5 s timeout gave
/// up on it: 1-3 reads in 8 s.
#[test]
fn a_member_that_goes_silent_costs_one_read_under_a_second() {
    /// The first slow read: suspicion after a quarter of a second, the
    /// probe round's half-second grace, the read sent again; 1 s plus a
    /// round trip, and slack for a loaded machine.
    const FIRST_SLOW_BOUND: Duration = Duration::from_millis(1500);
    const ROUNDS: usize = 3;
    const READS: Duration = Duration::from_secs(8);

    let server = fleetcoord::testing::EtcdServer::start().expect("etcd");
    let mut worst_of_rounds = Vec::new();
    for round in 0..ROUNDS {
        let proxies: Vec<FaultProxy> = (0..3)
            .map(|_| FaultProxy::start(&server.endpoint()).expect("proxy"))
            .collect();
        let endpoints: Vec<String> = proxies.iter().map(FaultProxy::endpoint).collect();
        let etcd = Etcd::connect(&endpoints).expect("connect");
        // Every endpoint carries calls before the fault.
        for _ in 0..30 {
            fleetcoord::list_hosts(&etcd, fleetcoord::DEFAULT_HOSTS_PREFIX).expect("read");
        }
        proxies[round % 3].set_mode(Mode::Blackhole);
        let (mut reads, mut failures, mut latencies) = (0u32, Vec::new(), Vec::new());
        let started = Instant::now();
        while started.elapsed() < READS {
            let t = Instant::now();
            let result = if reads % 2 == 0 {
                fleetcoord::list_hosts(&etcd, fleetcoord::DEFAULT_HOSTS_PREFIX).map(|_| ())
            } else {
                etcd.lease_ttl(1).map(|_| ())
            };
            latencies.push(t.elapsed());
            reads += 1;
            if let Err(e) = result {
                failures.push(format!("after {:?}: {e}", t.elapsed()));
            }
        }
        let slow = latencies
            .iter()
            .filter(|l| **l > Duration::from_millis(250))
            .count();
        let worst = latencies.iter().max().copied().unwrap_or_default();
        println!(
            "round {round}: endpoint {} silent: {reads} reads in {READS:?}, {} failed {failures:?}, \
             {slow} slower than 250 ms, worst {worst:?}",
            round % 3,
            failures.len()
        );
        assert!(failures.is_empty(), "reads failed: {failures:?}");
        assert!(
            slow <= 1,
            "{slow} reads were slow: not routed around at once"
        );
        assert!(
            worst < FIRST_SLOW_BOUND,
            "the first slow read took {worst:?}"
        );
        worst_of_rounds.push(worst);
        let t = Instant::now();
        etcd.close().expect("close");
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "close took {:?}",
            t.elapsed()
        );
    }
    let (p50, max) = p50_max(&mut worst_of_rounds);
    println!("one of three endpoints went silent: worst read per round p50 {p50:?} max {max:?}");
}

/// Closes (or drops) one of every primitive on `etcd` once `fault` has
/// run, each timed, then the handle; returns the name and time of each.
/// The mutex and the host id are returned too, so the caller can check
/// that the leave was done.
fn close_every_primitive(
    etcd: Etcd,
    fault: impl FnOnce(),
) -> (Vec<(&'static str, Duration)>, String, Uuid) {
    use fleetcoord::coordinator::{Coordinator, EtcdCoordinator};
    use fleetcoord::{ElectionPool, Mutex, Semaphore, Session, ShardMap, ShardOptions};
    let name = Uuid::new_v4().to_string();
    let id = Uuid::new_v4();
    let host = HostLiveness::register(&etcd, id, b"h", TTL).expect("register");
    let watcher = HostWatcher::watch(&etcd).expect("watch");
    let election = Election::new(&etcd, &name).expect("election");
    let leadership = election.campaign(b"me").expect("campaign");
    let mutex = Mutex::new(&etcd, &name).expect("mutex");
    let guard = mutex.lock().expect("lock");
    let semaphore = Semaphore::new(&etcd, &name, 2).expect("semaphore");
    let permit = semaphore.acquire().expect("acquire");
    // A second holder, its permit dropped rather than released.
    let other_semaphore = Semaphore::new(&etcd, &name, 2).expect("semaphore");
    let dropped_permit = other_semaphore.acquire().expect("acquire");
    let session = Session::new(&etcd, TTL).expect("session");
    let pool = ElectionPool::new(&etcd);
    let pooled = pool
        .campaign(&format!("{name}-pool"), b"p")
        .expect("pooled campaign");
    let shards = ShardMap::join(
        &etcd,
        &name,
        2,
        ShardOptions::default().with_member(Uuid::new_v4().to_string()),
    )
    .expect("join");
    let bus = EtcdCoordinator::on_etcd(&etcd).expect("bus");
    bus.kv_set("b", "k", b"v").expect("kv_set");

    fault();
    let mut took = Vec::new();
    let mut time = |what: &'static str, f: Box<dyn FnOnce() + '_>| {
        let t = Instant::now();
        f();
        took.push((what, t.elapsed()));
    };
    time(
        "HostLiveness::close",
        Box::new(|| host.close().expect("close host")),
    );
    time(
        "HostWatcher::close",
        Box::new(|| watcher.close().expect("close watcher")),
    );
    time(
        "Leadership::resign",
        Box::new(|| leadership.resign().expect("resign")),
    );
    time(
        "Election::close",
        Box::new(|| election.close().expect("close election")),
    );
    time(
        "MutexGuard::unlock",
        Box::new(|| guard.unlock().expect("unlock")),
    );
    time(
        "Mutex::close",
        Box::new(|| mutex.close().expect("close mutex")),
    );
    time(
        "SemaphoreGuard::release",
        Box::new(|| permit.release().expect("release")),
    );
    time("SemaphoreGuard drop", Box::new(|| drop(dropped_permit)));
    time(
        "Semaphore::close",
        Box::new(|| {
            semaphore.close().expect("close semaphore");
            other_semaphore.close().expect("close semaphore");
        }),
    );
    time(
        "Session::close",
        Box::new(|| session.close().expect("close session")),
    );
    time("pooled Leadership drop", Box::new(|| drop(pooled)));
    time(
        "ElectionPool::close",
        Box::new(|| pool.close().expect("close pool")),
    );
    time(
        "ShardMap::leave",
        Box::new(|| shards.leave().expect("leave")),
    );
    time(
        "EtcdCoordinator::close",
        Box::new(|| bus.close().expect("close bus")),
    );
    time(
        "Etcd::close",
        Box::new(|| etcd.close().expect("close handle")),
    );
    (took, name, id)
}

/// Every primitive's close, resign, release, leave and drop, and the
/// handle's close, with one of three endpoints silent: from the start
/// (each takes what its leave needs from a member that answers), and
/// going silent just before the closes (a close whose request went to
/// the silent member before it was out of use takes half a second to
/// 0.75 s: its machine sends a copy after half a second, and a read or a
/// revoke is sent again once the member is out of use; the closes after
/// that take milliseconds). Before, a member going silent cost each close
/// whose request went there its machine's attempt timeout: 0.5-1.3 s
/// each, 2-3.8 s for the closes together. Each leave is done: the host is gone and the mutex
/// free, seen from another connection.
#[test]
fn every_close_is_bounded_with_a_silent_member() {
    /// What a leave needs from a member that answers, generously.
    const SILENT_FROM_START: Duration = Duration::from_millis(300);
    /// One request routed around the silent member, plus the above.
    const GONE_SILENT_FIRST: Duration = Duration::from_millis(1500);
    /// Every close together after the member went silent: one routing.
    const GONE_SILENT_ALL: Duration = Duration::from_millis(2500);

    let server = fleetcoord::testing::EtcdServer::start().expect("etcd");
    let observer = Etcd::connect(&[server.endpoint()]).expect("observer");
    let mut summary = Vec::new();
    for round in 0..4 {
        let from_start = round % 2 == 0;
        let proxies: Vec<FaultProxy> = (0..3)
            .map(|_| FaultProxy::start(&server.endpoint()).expect("proxy"))
            .collect();
        let silent = &proxies[round % 3];
        if from_start {
            silent.set_mode(Mode::Blackhole);
        }
        let endpoints: Vec<String> = proxies.iter().map(FaultProxy::endpoint).collect();
        let etcd = Etcd::connect(&endpoints).expect("connect");
        let (took, name, id) = close_every_primitive(etcd, || silent.set_mode(Mode::Blackhole));
        let total: Duration = took.iter().map(|(_, t)| *t).sum();
        let worst = took
            .iter()
            .max_by_key(|(_, t)| *t)
            .copied()
            .unwrap_or(("", Duration::ZERO));
        println!(
            "round {round}, silent {}: total {total:?}, worst {worst:?}: {took:?}",
            if from_start {
                "from the start"
            } else {
                "just before the closes"
            }
        );
        let bound = if from_start {
            SILENT_FROM_START
        } else {
            GONE_SILENT_FIRST
        };
        for (what, t) in &took {
            assert!(*t < bound, "{what} took {t:?} (round {round})");
        }
        if !from_start {
            assert!(total < GONE_SILENT_ALL, "all closes took {total:?}");
        }
        let hosts =
            fleetcoord::list_hosts(&observer, fleetcoord::DEFAULT_HOSTS_PREFIX).expect("list");
        assert!(!hosts.iter().any(|h| h.id == id), "the host did not leave");
        let free = fleetcoord::Mutex::new(&observer, &name)
            .expect("mutex")
            .try_lock()
            .expect("try_lock");
        assert!(free.is_some(), "the mutex was not unlocked");
        summary.push((from_start, worst.1, total));
    }
    println!("worst close, total of closes per round (silent from start?): {summary:?}");
}
