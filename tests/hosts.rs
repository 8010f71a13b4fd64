//! HostLiveness and HostWatcher against a real etcd: registration, graceful
//! and crash departures, replay, invalid keys and slow consumers.
//!
//! Timing bounds are generous on purpose: these run on small shared CI
//! machines where a step can stall for a second. Each bound says why.

mod common;

use common::{apply, connect, etcdctl, ChildGuard};
use fleetcoord::testing::EtcdServer;
use fleetcoord::{
    list_hosts, DownReason, Etcd, EtcdOptions, HostEvent, HostInfo, HostLiveness, HostWatcher,
    LivenessOptions, LivenessState, WatcherOptions, DEFAULT_HOSTS_PREFIX,
};
use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Upper bound for any single step that normally takes milliseconds; a
/// loaded 2-core machine can stall for seconds.
const WAIT: Duration = Duration::from_secs(10);

/// Set only in the child process of `crashed_host_goes_down_after_ttl`.
const CHILD_ENDPOINT: &str = "FLEETCOORD_TEST_CHILD_ENDPOINT";
const CHILD_HOST: &str = "FLEETCOORD_TEST_CHILD_HOST";
const CHILD_TTL: &str = "FLEETCOORD_TEST_CHILD_TTL";
const CHILD_MARKER: &str = "fleetcoord-child: registered";

fn next(watcher: &HostWatcher) -> HostEvent {
    watcher
        .events()
        .recv_timeout(WAIT)
        .unwrap_or_else(|e| panic!("no host event within {WAIT:?}: {e}"))
}

fn expect_synced(watcher: &HostWatcher) {
    assert_eq!(next(watcher), HostEvent::Synced);
}

fn etcd_view(etcd: &Etcd) -> HashMap<Uuid, HostInfo> {
    list_hosts(etcd, DEFAULT_HOSTS_PREFIX)
        .expect("list_hosts")
        .into_iter()
        .map(|h| (h.id, h))
        .collect()
}

#[test]
fn register_up_then_graceful_close_down_within_a_second() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = connect(&server.endpoint());
    let watcher = HostWatcher::watch(&etcd).expect("watch");
    expect_synced(&watcher);

    let id = Uuid::new_v4();
    let host = HostLiveness::register(&etcd, id, br#"{"zone":"a"}"#, Duration::from_secs(5))
        .expect("register");
    let up = match next(&watcher) {
        HostEvent::Up(info) => info,
        other => panic!("expected Up, got {other:?}"),
    };
    assert_eq!(up.id, id);
    assert_eq!(up.metadata, br#"{"zone":"a"}"#.to_vec());
    assert_eq!(Some(up.lease), host.lease());

    let started = Instant::now();
    host.close().expect("close revokes");
    let down = match next(&watcher) {
        // The close announced its leave before revoking.
        HostEvent::Down(info, DownReason::Left) => info,
        other => panic!("expected Down(Left), got {other:?}"),
    };
    let latency = started.elapsed();
    println!("graceful close -> Down(Left): {latency:?}");
    assert_eq!(down.id, id);
    assert_eq!(down.metadata, br#"{"zone":"a"}"#.to_vec());
    // A leave is one round trip plus one watch event (~1 ms here); one
    // second leaves room for a stalled machine yet is far below any TTL, so
    // it proves the lease was revoked rather than left to expire.
    assert!(
        latency < Duration::from_secs(1),
        "close -> Down took {latency:?}"
    );
    assert!(etcd_view(&etcd).is_empty(), "key still present after close");
}

#[test]
fn states_start_with_the_state_register_returned() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = connect(&server.endpoint());
    let host = HostLiveness::register(&etcd, Uuid::new_v4(), b"m", Duration::from_secs(5))
        .expect("register");
    let returned = host.state();
    assert!(
        matches!(returned, LivenessState::Registered { .. }),
        "{returned:?}"
    );
    // Not the `Registering` that was over before `register` returned.
    assert_eq!(host.states().try_recv(), Ok(returned));
    assert!(host.states().try_recv().is_err(), "nothing else happened");
    host.close().expect("close");
}

/// Not a test of its own: the body of the child process that
/// `crashed_host_goes_down_after_ttl` starts and SIGKILLs. Without the
/// environment variables (a normal test run) it returns at once.
#[test]
fn child_host_process() {
    let Ok(endpoint) = std::env::var(CHILD_ENDPOINT) else {
        return;
    };
    let id: Uuid = std::env::var(CHILD_HOST)
        .expect("host id")
        .parse()
        .expect("uuid");
    let ttl: u64 = std::env::var(CHILD_TTL)
        .expect("ttl")
        .parse()
        .expect("ttl secs");
    let etcd = Etcd::with_options(&[endpoint], EtcdOptions::default()).expect("child connect");
    let host = HostLiveness::register(&etcd, id, b"child-metadata", Duration::from_secs(ttl))
        .expect("child register");
    println!("{CHILD_MARKER} lease {:?}", host.lease());
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    // Keep the lease alive until the parent kills us; the bound only
    // matters if the parent died without killing us.
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn crashed_host_goes_down_after_ttl() {
    const TTL: u64 = 2;
    let server = EtcdServer::start().expect("etcd");
    let etcd = connect(&server.endpoint());
    let watcher = HostWatcher::watch(&etcd).expect("watch");
    expect_synced(&watcher);

    let id = Uuid::new_v4();
    let child = common::this_test_binary()
        .args([
            "--exact",
            "child_host_process",
            "--nocapture",
            "--include-ignored",
        ])
        .env(CHILD_ENDPOINT, server.endpoint())
        .env(CHILD_HOST, id.to_string())
        .env(CHILD_TTL, TTL.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let mut child = ChildGuard(child);
    let lines = common::lines_of(child.stdout.take().expect("child stdout"));
    // Starting a process and connecting takes well under a second; 20 s
    // covers a cold, loaded machine.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .expect("child never said it registered");
        if line.contains(CHILD_MARKER) {
            break;
        }
    }
    match next(&watcher) {
        HostEvent::Up(info) => {
            assert_eq!(info.id, id);
            assert_eq!(info.metadata, b"child-metadata".to_vec());
        }
        other => panic!("expected the child's Up, got {other:?}"),
    }
    // Give the child a few renewals so the expiry below is measured from a
    // renewed lease, not from the grant.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        watcher.events().is_empty(),
        "unexpected event while the child lives: {:?}",
        watcher.events().try_recv()
    );

    child.kill().expect("SIGKILL the child");
    let killed = Instant::now();
    child.wait().expect("reap child");
    let event = watcher
        .events()
        .recv_timeout(Duration::from_secs(TTL + 10))
        .expect("no Down for the crashed host");
    let latency = killed.elapsed();
    println!("SIGKILL -> Down(Expired) at TTL {TTL} s: {latency:?}");
    match event {
        // Killed: no leave announced, the lease ran out.
        HostEvent::Down(info, DownReason::Expired) => {
            assert_eq!(info.id, id);
            assert_eq!(
                info.metadata,
                b"child-metadata".to_vec(),
                "Down must carry the last-seen metadata"
            );
        }
        other => panic!("expected Down(Expired), got {other:?}"),
    }
    // The child renews every TTL/3, so at the kill its lease had at least
    // 2/3 of the TTL left: etcd cannot expire it sooner than that (minus a
    // little scheduling slack). etcd's lessor checks every 500 ms and a
    // loaded machine adds delay, hence TTL + 3 s above.
    let lower = Duration::from_millis(TTL * 1000 * 2 / 3 - 200);
    assert!(
        latency >= lower,
        "Down after {latency:?}: before the lease could have expired"
    );
    assert!(
        latency <= Duration::from_secs(TTL + 3),
        "Down after {latency:?}: far beyond the TTL"
    );
    assert!(etcd_view(&etcd).is_empty());
}

#[test]
fn fresh_watcher_replays_existing_hosts_then_synced() {
    const N: usize = 20;
    let server = EtcdServer::start().expect("etcd");
    let etcd = connect(&server.endpoint());
    let mut hosts = Vec::new();
    let mut expected = HashMap::new();
    for i in 0..N {
        let id = Uuid::new_v4();
        let meta = format!("host-{i}").into_bytes();
        hosts.push(
            HostLiveness::register(&etcd, id, &meta, Duration::from_secs(10)).expect("register"),
        );
        expected.insert(id, meta);
    }

    let listed = list_hosts(&etcd, DEFAULT_HOSTS_PREFIX).expect("list");
    assert_eq!(listed.len(), N);
    for h in &listed {
        assert_eq!(expected.get(&h.id), Some(&h.metadata), "{h:?}");
    }

    let watcher = HostWatcher::watch(&etcd).expect("watch");
    let mut seen = HashMap::new();
    for _ in 0..N {
        match next(&watcher) {
            HostEvent::Up(info) => assert!(
                seen.insert(info.id, info.metadata).is_none(),
                "host replayed twice"
            ),
            other => panic!(
                "expected {N} Ups before Synced, got {other:?} after {}",
                seen.len()
            ),
        }
    }
    expect_synced(&watcher);
    assert_eq!(seen, expected);
    // Nothing changed, so nothing more may arrive.
    assert!(watcher
        .events()
        .recv_timeout(Duration::from_millis(300))
        .is_err());
    drop(hosts);
}

#[test]
fn invalid_keys_under_the_prefix_are_skipped() {
    let _ = log::set_logger(&Warnings).map(|()| log::set_max_level(log::LevelFilter::Warn));
    let server = EtcdServer::start().expect("etcd");
    let etcd = connect(&server.endpoint());
    let valid = Uuid::new_v4();
    let host =
        HostLiveness::register(&etcd, valid, b"ok", Duration::from_secs(10)).expect("register");
    let endpoint = server.endpoint();
    etcdctl(&endpoint, &["put", "/coord/hosts/not-a-uuid", "x"]);
    etcdctl(
        &endpoint,
        &[
            "put",
            &format!("/coord/hosts/{}/nested", Uuid::new_v4()),
            "x",
        ],
    );

    let listed = list_hosts(&etcd, DEFAULT_HOSTS_PREFIX).expect("list");
    assert_eq!(listed.iter().map(|h| h.id).collect::<Vec<_>>(), vec![valid]);

    let watcher = HostWatcher::watch(&etcd).expect("watch");
    match next(&watcher) {
        HostEvent::Up(info) => assert_eq!(info.id, valid),
        other => panic!("expected the one valid host, got {other:?}"),
    }
    expect_synced(&watcher);

    // Live: an invalid key is skipped, the valid change after it arrives.
    etcdctl(&endpoint, &["put", "/coord/hosts/also-not-a-uuid", "y"]);
    let second = Uuid::new_v4();
    let host2 =
        HostLiveness::register(&etcd, second, b"two", Duration::from_secs(10)).expect("register");
    match next(&watcher) {
        HostEvent::Up(info) => assert_eq!(info.id, second),
        other => panic!("expected Up for the second host, got {other:?}"),
    }
    assert!(watcher
        .events()
        .recv_timeout(Duration::from_millis(300))
        .is_err());
    // Skipped, not silently: each invalid key is named in the log.
    let warnings = WARNINGS.lock().unwrap().clone();
    for key in ["/coord/hosts/not-a-uuid", "/coord/hosts/also-not-a-uuid"] {
        assert!(
            warnings.iter().any(|w| w.contains(key)),
            "{key} not in {warnings:?}"
        );
    }
    drop((host, host2));
}

/// Every warning logged in this test binary.
static WARNINGS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

struct Warnings;

impl log::Log for Warnings {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            WARNINGS.lock().unwrap().push(record.args().to_string());
        }
    }

    fn flush(&self) {}
}

#[test]
fn slow_consumer_converges_to_etcd() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = connect(&server.endpoint());
    let watcher = HostWatcher::with_options(&etcd, WatcherOptions::default().with_capacity(8))
        .expect("watch");
    expect_synced(&watcher);

    // 100 changes while nobody reads: 40 registrations, 30 metadata
    // updates, 30 graceful leaves.
    let options = LivenessOptions::default().with_ttl(Duration::from_secs(10));
    let mut hosts: Vec<HostLiveness> = (0..40)
        .map(|i| {
            HostLiveness::with_options(
                &etcd,
                Uuid::new_v4(),
                format!("v0-{i}").as_bytes(),
                options.clone(),
            )
            .expect("register")
        })
        .collect();
    for (i, h) in hosts.iter().enumerate().take(30) {
        h.set_metadata(format!("v1-{i}").as_bytes())
            .expect("set_metadata");
    }
    for h in hosts.drain(10..40) {
        h.close().expect("close");
    }
    // Let the queued metadata writes of the survivors land.
    std::thread::sleep(Duration::from_millis(500));
    let pending = watcher.events().len();
    println!("events queued unread after 100 changes (capacity 8): {pending}");
    // Unpaused, the watcher would have queued at least 100 events; a watch
    // paused at capacity holds far fewer (capacity plus one etcd batch).
    assert!(
        pending < 100,
        "the watcher did not pause: {pending} events queued"
    );

    let expected = etcd_view(&etcd);
    assert_eq!(expected.len(), 10);
    let mut view = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    // Drain until the view matches etcd and nothing more arrives for a
    // while; the resume poller runs every 50 ms, so 1 s of quiet is ample.
    loop {
        match watcher.events().recv_timeout(Duration::from_secs(1)) {
            Ok(event) => apply(&mut view, event),
            Err(_) if view == expected => break,
            Err(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "view never matched etcd:\n view {view:?}\n etcd {expected:?}"
        );
    }
    let ids: HashSet<Uuid> = hosts.iter().map(|h| h.host_id()).collect();
    assert_eq!(view.keys().copied().collect::<HashSet<_>>(), ids);
    for (i, h) in hosts.iter().enumerate() {
        assert_eq!(view[&h.host_id()].metadata, format!("v1-{i}").into_bytes());
    }
}

/// `list_hosts` and `HostWatcher` apply one rule to the keys under the
/// prefix: only the canonical spelling of a host id (lowercase, hyphenated)
/// is a host. A hand-written key with another spelling of the same UUID is
/// skipped by both, so one host is never listed twice.
#[test]
fn list_hosts_and_the_watcher_agree_on_non_canonical_keys() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = connect(&server.endpoint());
    let endpoint = server.endpoint();
    let id = Uuid::parse_str("3f2c1d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5f").unwrap();
    etcdctl(
        &endpoint,
        &["put", &format!("/coord/hosts/{id}"), "canonical"],
    );
    for other in [
        id.simple().to_string(),
        id.hyphenated().to_string().to_uppercase(),
        id.braced().to_string(),
        id.urn().to_string(),
    ] {
        etcdctl(
            &endpoint,
            &["put", &format!("/coord/hosts/{other}"), "other"],
        );
    }

    let listed = list_hosts(&etcd, DEFAULT_HOSTS_PREFIX).expect("list");
    assert_eq!(
        listed
            .iter()
            .map(|h| (h.id, h.metadata.as_slice()))
            .collect::<Vec<_>>(),
        vec![(id, &b"canonical"[..])],
        "list_hosts: {listed:?}"
    );

    let watcher = HostWatcher::watch(&etcd).expect("watch");
    let mut replayed = Vec::new();
    loop {
        match next(&watcher) {
            HostEvent::Up(info) => replayed.push(info),
            HostEvent::Synced => break,
            other => panic!("before Synced: {other:?}"),
        }
    }
    assert_eq!(replayed, listed, "the watcher and list_hosts disagree");
}

/// What a watcher sees when a host registers again while its old key still
/// exists — the self-healing keepalive does this after its local deadline
/// passed but before etcd expired the old lease (after an etcd restart,
/// say), and so does a restarted process reusing its id. The put lands on
/// the existing key: it is `Updated`, with the new lease and the old create
/// revision, and the old lease expiring later is no `Down`. Played here
/// with etcdctl, exactly as the keepalive writes it (a put with the new
/// lease).
#[test]
fn registration_on_a_new_lease_over_a_live_key_is_updated() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = connect(&server.endpoint());
    let endpoint = server.endpoint();
    let lease = |ttl: &str| {
        // "lease 694d77aa9e38260f granted with TTL(60s)"
        let text = etcdctl(&endpoint, &["lease", "grant", ttl]);
        let hex = text
            .split_whitespace()
            .nth(1)
            .expect("lease id")
            .to_string();
        (i64::from_str_radix(&hex, 16).expect("hex lease id"), hex)
    };
    let watcher = HostWatcher::watch(&etcd).expect("watch");
    expect_synced(&watcher);

    let id = Uuid::new_v4();
    let key = format!("/coord/hosts/{id}");
    let (old, old_hex) = lease("60");
    etcdctl(&endpoint, &["put", "--lease", &old_hex, &key, "first"]);
    let up = match next(&watcher) {
        HostEvent::Up(info) => info,
        other => panic!("expected Up, got {other:?}"),
    };
    assert_eq!(up.lease, old);

    let (new, new_hex) = lease("60");
    etcdctl(&endpoint, &["put", "--lease", &new_hex, &key, "second"]);
    match next(&watcher) {
        HostEvent::Updated(info) => {
            assert_eq!(info.lease, new, "the new lease is reported");
            assert_eq!(
                info.create_revision, up.create_revision,
                "the key was never deleted, so its create revision stays"
            );
            assert!(info.mod_revision > up.mod_revision);
        }
        other => panic!("expected Updated with the new lease, got {other:?}"),
    }
    // The old lease ending takes nothing with it: the key is on the new one.
    etcdctl(&endpoint, &["lease", "revoke", &old_hex]);
    assert!(
        watcher
            .events()
            .recv_timeout(Duration::from_millis(500))
            .is_err(),
        "the old lease's end is no event"
    );
    // A re-registration after the key was gone is Down, then Up with a new
    // create revision.
    etcdctl(&endpoint, &["lease", "revoke", &new_hex]);
    // A revoke by someone else, with no leave marker: not a leave.
    assert!(matches!(
        next(&watcher),
        HostEvent::Down(info, DownReason::Expired) if info.lease == new
    ));
    let (third, third_hex) = lease("60");
    etcdctl(&endpoint, &["put", "--lease", &third_hex, &key, "third"]);
    match next(&watcher) {
        HostEvent::Up(info) => {
            assert_eq!(info.lease, third);
            assert!(info.create_revision > up.create_revision);
        }
        other => panic!("expected Up, got {other:?}"),
    }
}

/// Every setting of a registration is used, and what the handles show of
/// themselves: the key under the chosen prefix, the lease etcd reports
/// until `close` revokes it.
#[test]
fn custom_prefix_registration_and_what_handles_show() {
    let server = EtcdServer::start().expect("start etcd (run `make test` to install it)");
    let etcd = connect(&server.endpoint());
    let prefix = "/fleet-x/";
    let watcher = HostWatcher::with_options(&etcd, WatcherOptions::default().with_prefix(prefix))
        .expect("watch");
    expect_synced(&watcher);
    assert!(format!("{watcher:?}").contains("pending: 0"), "{watcher:?}");
    let id = Uuid::new_v4();
    let options = LivenessOptions::default()
        .with_prefix(prefix)
        .with_ttl(Duration::from_secs(3))
        .with_safety_margin(Duration::from_millis(400));
    let host = HostLiveness::with_options(&etcd, id, b"m", options).expect("register");
    assert_eq!(host.key(), format!("{prefix}{}", id.hyphenated()));
    assert!(
        format!("{host:?}").contains(host.key()) && format!("{host:?}").contains("Registered"),
        "{host:?}"
    );
    match next(&watcher) {
        HostEvent::Up(info) => assert_eq!(info.id, id),
        other => panic!("expected Up, got {other:?}"),
    }
    let lease = host.lease().expect("registered on a lease");
    let ttl = etcd.lease_ttl(lease).unwrap().expect("the lease exists");
    // etcd grants at least what was asked for (a short TTL may be rounded up).
    assert!(ttl.granted >= Duration::from_secs(3), "{ttl:?}");
    assert!(ttl.remaining <= ttl.granted, "{ttl:?}");
    host.close().expect("close");
    // `close` returns once the leave applied; the revoke follows at once,
    // unwaited for.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while etcd.lease_ttl(lease).unwrap().is_some() {
        assert!(std::time::Instant::now() < deadline, "never revoked");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(matches!(
        next(&watcher),
        HostEvent::Down(info, DownReason::Left) if info.id == id
    ));
    watcher.close().expect("close");
}

/// `close` ends the watch before it returns: the events channel (a clone
/// of it, since `close` takes the watcher) is disconnected at once, with
/// nothing delivered after, and etcd sees its watch stream end.
#[test]
fn close_ends_the_feed_and_the_watch_on_etcd() {
    let server = EtcdServer::start().expect("start etcd (run `make test` to install it)");
    let etcd = connect(&server.endpoint());
    let open_watches = || {
        let counts = server.grpc_counts().expect("etcd's gRPC counters");
        counts
            .started("Watch")
            .saturating_sub(counts.handled("Watch"))
    };
    // etcd's counters move a moment after the client acts: the watch
    // stream opens after the snapshot read that `Synced` ends, and a
    // canceled stream is counted once etcd's handler has returned.
    let wait_for_open = |want: u64, what: &str| {
        let deadline = Instant::now() + WAIT;
        while open_watches() != want {
            assert!(Instant::now() < deadline, "{what} within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let before = open_watches();
    let watcher = HostWatcher::watch(&etcd).expect("watch");
    expect_synced(&watcher);
    wait_for_open(before + 1, "the watcher opens one watch stream");
    let events = watcher.events().clone();
    watcher.close().expect("close");
    assert_eq!(
        events.try_recv(),
        Err(crossbeam_channel::TryRecvError::Disconnected),
        "the feed ended when close returned"
    );
    wait_for_open(before, "etcd sees the closed watcher's stream end");
    // The connection itself is unaffected; once its user closes it, a new
    // watch is refused as closed, not as a dead driver.
    assert!(etcd.lease_ttl(1).is_ok());
    etcd.close().expect("close etcd");
    assert!(matches!(
        HostWatcher::watch(&etcd),
        Err(fleetcoord::Error::Closed)
    ));
}

/// etcd accepts the connection but never answers: single requests, a
/// registration and a listing each fail with their own timeout instead of
/// hanging.
#[test]
fn an_unresponsive_etcd_times_out_requests_registration_and_listing() {
    use fleetcoord::coordinator::{Coordinator, EtcdCoordinator};
    use fleetcoord::testing::{FaultProxy, Mode};
    use fleetcoord::Error;

    let server = EtcdServer::start().expect("start etcd (run `make test` to install it)");
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let request_timeout = Duration::from_millis(500);
    let etcd = Etcd::with_options(
        &[proxy.endpoint()],
        EtcdOptions::default().with_request_timeout(request_timeout),
    )
    .expect("connect");
    let coord = EtcdCoordinator::on_etcd(&etcd).unwrap();
    assert_eq!(
        format!("{etcd:?}"),
        format!("Etcd {{ endpoints: [\"http://{}\"] }}", proxy.endpoint())
    );
    proxy.set_mode(Mode::Blackhole);

    assert!(matches!(
        coord.kv_get("config", "mode"),
        Err(Error::Timeout(t)) if t == request_timeout
    ));
    let register_timeout = Duration::from_millis(700);
    let options = LivenessOptions::default().with_register_timeout(register_timeout);
    assert!(matches!(
        HostLiveness::with_options(&etcd, Uuid::new_v4(), b"m", options),
        Err(Error::Timeout(t)) if t == register_timeout
    ));
    assert!(matches!(
        list_hosts(&etcd, DEFAULT_HOSTS_PREFIX),
        Err(Error::Timeout(t)) if t == request_timeout * 3
    ));
    proxy.set_mode(Mode::Pass);
}

/// `trusted_until` is the lease's local deadline: within one TTL of the
/// last renewal, moved forward by each answered renewal (about every third
/// of the TTL), and gone once etcd stops answering long enough for the
/// lease to be given up; `Election::session_trusted_until` likewise,
/// waiting or leading.
#[test]
fn trusted_until_moves_with_each_renewal_and_ends_with_the_lease() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = connect(&server.endpoint());
    let ttl = Duration::from_secs(3);
    let host = HostLiveness::register(&etcd, Uuid::new_v4(), b"{}", ttl).expect("register");
    let election = fleetcoord::Election::with_options(
        &etcd,
        "trust",
        fleetcoord::ElectionOptions::default().with_ttl(ttl),
    )
    .expect("election");
    let first = host.trusted_until().expect("trusted once registered");
    let now = Instant::now();
    assert!(
        first > now && first <= now + ttl,
        "{first:?} vs now {now:?}"
    );
    // Renewals every ~1 s: within 2.5 s (a loaded machine included) it moved.
    let deadline = Instant::now() + Duration::from_millis(2500);
    let session_first = loop {
        if let Some(until) = election.session_trusted_until() {
            break until;
        }
        assert!(Instant::now() < deadline, "the session was never trusted");
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut host_moved, mut session_moved) = (false, false);
    while Instant::now() < deadline && !(host_moved && session_moved) {
        std::thread::sleep(Duration::from_millis(50));
        host_moved |= host.trusted_until().is_some_and(|u| u > first);
        session_moved |= election
            .session_trusted_until()
            .is_some_and(|u| u > session_first);
    }
    assert!(host_moved, "the host's trust did not move in 2.5 s");
    assert!(session_moved, "the session's trust did not move in 2.5 s");

    // Frozen etcd: nothing moves, and past the deadline the lease is
    // given up (`Lost`): no trust is claimed any more.
    server.pause().expect("freeze etcd");
    let frozen = host
        .trusted_until()
        .expect("still trusted right after the freeze");
    let frozen_session = election.session_trusted_until().expect("trusted");
    let give_up = frozen.max(frozen_session) + Duration::from_millis(500);
    while Instant::now() < give_up {
        assert!(
            host.trusted_until().is_none_or(|u| u <= frozen),
            "moved while frozen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        host.trusted_until(),
        None,
        "trust claimed past the deadline"
    );
    assert_eq!(
        election.session_trusted_until(),
        None,
        "session trust past the deadline"
    );
    server.resume().expect("thaw etcd");
    // Back: a new lease, trusted again within a bound.
    let back = Instant::now() + Duration::from_secs(10);
    while host.trusted_until().is_none() || election.session_trusted_until().is_none() {
        assert!(
            Instant::now() < back,
            "not trusted again 10 s after the thaw"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    host.close().expect("close");
    election.close().expect("close");
}

/// What every plain reader of the hosts prefix assumes (the README's key
/// layout, a Go watcher, an operator counting hosts): exactly one key per
/// live host. Hosts on their own lease, on a shared session, resumed after
/// a restart and with new metadata are all listed once by
/// `etcdctl get --prefix /coord/hosts/ --keys-only`, and a host that left
/// is not listed at all; only a host that asks to publish its incarnation
/// adds a second key.
#[test]
fn etcdctl_lists_exactly_the_live_hosts_under_the_prefix() {
    let server = EtcdServer::start().expect("etcd");
    let endpoint = server.endpoint();
    let etcd = connect(&endpoint);
    let options = LivenessOptions::default().with_ttl(Duration::from_secs(30));
    let own =
        HostLiveness::with_options(&etcd, Uuid::new_v4(), b"a", options.clone()).expect("register");
    own.set_metadata(b"a2").expect("set_metadata");
    let restarted =
        HostLiveness::with_options(&etcd, Uuid::new_v4(), b"b", options.clone()).expect("register");
    let resume = restarted.detach().expect("detach");
    let restarted = HostLiveness::resume(&etcd, resume, b"b2", options.clone()).expect("resume");
    assert!(restarted.resumed());
    assert_eq!(restarted.incarnation(), 2, "the counter is kept locally");
    let session = fleetcoord::Session::new(&etcd, Duration::from_secs(30)).expect("session");
    let shared = HostLiveness::with_session(&session, Uuid::new_v4(), b"c", options.clone())
        .expect("register");
    let leaving =
        HostLiveness::with_options(&etcd, Uuid::new_v4(), b"d", options.clone()).expect("register");

    let listed = |expected: &[&HostLiveness]| {
        let mut want: Vec<String> = expected.iter().map(|h| h.key().to_string()).collect();
        want.sort();
        (common::etcdctl_keys(&endpoint, DEFAULT_HOSTS_PREFIX), want)
    };
    let (keys, want) = listed(&[&own, &restarted, &shared, &leaving]);
    assert_eq!(keys, want, "one key per live host");

    // A leave writes its marker and deletes the key at one revision, then
    // revokes the lease, which takes the marker: once that is done, the
    // host is simply gone from the listing.
    leaving.close().expect("close");
    let deadline = Instant::now() + WAIT;
    loop {
        let (keys, want) = listed(&[&own, &restarted, &shared]);
        if keys == want {
            break;
        }
        assert!(Instant::now() < deadline, "{keys:?} is not {want:?}");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Opting in to publishing the incarnation is what adds a second key.
    let published = HostLiveness::with_options(
        &etcd,
        Uuid::new_v4(),
        b"e",
        options.with_published_incarnation(true),
    )
    .expect("register");
    let extra: Vec<String> = common::etcdctl_keys(&endpoint, DEFAULT_HOSTS_PREFIX)
        .into_iter()
        .filter(|k| k.starts_with(published.key()))
        .collect();
    assert_eq!(
        extra,
        vec![
            published.key().to_string(),
            format!("{}/incarnation", published.key())
        ]
    );
    let view = etcd_view(&etcd);
    assert_eq!(view[&published.host_id()].incarnation, 1);
    assert_eq!(view[&restarted.host_id()].incarnation, 0, "not published");
    drop((own, restarted, shared, published));
    session.close().expect("close session");
}
