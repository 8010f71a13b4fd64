//! Bad input to every entry point of the host and election APIs: each is
//! refused with `InvalidArgument` naming the field (or `Connect` naming the
//! endpoint), nothing panics, and nothing is half-written to etcd.

use fleetcoord::coordinator::{Coordinator, EtcdCoordinator, EtcdCoordinatorOptions};
use fleetcoord::testing::EtcdServer;
use fleetcoord::{
    list_hosts, DoubleBarrier, Election, ElectionOptions, ElectionPool, Error, Etcd, EtcdOptions,
    HostLiveness, HostWatcher, LivenessOptions, LockOptions, RwLock, TryCampaign, WatcherOptions,
    DEFAULT_HOSTS_PREFIX, DEFAULT_LOCK_PREFIX, MAX_BARRIER_COUNT,
};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Asserts `result` is `InvalidArgument` for `field`, and returns the reason.
#[track_caller]
fn invalid<T: std::fmt::Debug>(result: fleetcoord::Result<T>, field: &str) -> String {
    match result {
        Err(Error::InvalidArgument { what, why }) => {
            assert_eq!(what, field, "wrong field named ({why})");
            assert!(!why.is_empty());
            why
        }
        other => panic!("expected InvalidArgument for {field}, got {other:?}"),
    }
}

/// 1.5 MiB: etcd's request limit, so certainly over the payload limit.
const OVERSIZED: usize = 1536 * 1024;

#[test]
fn endpoints_are_checked_before_connecting() {
    let none: [&str; 0] = [];
    invalid(
        Etcd::with_options(&none, EtcdOptions::default()),
        "endpoints",
    );
    let why = invalid(
        Etcd::with_options(&["https://127.0.0.1:2379"], EtcdOptions::default()),
        "endpoints",
    );
    assert!(why.contains("https://127.0.0.1:2379"), "{why}");
    invalid(
        Etcd::with_options(&[""], EtcdOptions::default()),
        "endpoints",
    );
    invalid(
        Etcd::with_options(&["127.0.0.1:2379 127.0.0.1:2380"], EtcdOptions::default()),
        "endpoints",
    );
    let zero = EtcdOptions::default().with_connect_timeout(Duration::ZERO);
    invalid(
        Etcd::with_options(&["127.0.0.1:2379"], zero),
        "connect_timeout",
    );
}

#[test]
fn unreachable_endpoint_fails_with_connect_error_in_time() {
    // A loopback port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("127.0.0.1:{port}");
    let timeout = Duration::from_secs(2);
    let options = EtcdOptions::default().with_connect_timeout(timeout);
    let started = Instant::now();
    let result = Etcd::with_options(&[endpoint.as_str()], options);
    let took = started.elapsed();
    match result {
        Err(e @ Error::Connect { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&endpoint),
                "message does not name {endpoint}: {msg}"
            );
        }
        other => panic!("expected Error::Connect, got {other:?}"),
    }
    // The connect timeout bounds it; the slack is for thread start-up and a
    // loaded machine, not for retries.
    assert!(
        took < timeout + Duration::from_secs(3),
        "connect failed only after {took:?}"
    );
    println!("unreachable endpoint -> Connect error after {took:?}");
}

#[test]
fn liveness_and_watcher_arguments() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
    let id = Uuid::new_v4();
    let with = |f: &dyn Fn(&mut LivenessOptions)| {
        let mut o = LivenessOptions::default();
        f(&mut o);
        o
    };

    for ttl in [
        Duration::ZERO,
        Duration::from_millis(500),
        Duration::from_millis(1500),
        Duration::from_secs(86_401),
    ] {
        invalid(HostLiveness::register(&etcd, id, b"m", ttl), "ttl");
    }
    invalid(
        HostLiveness::register(&etcd, Uuid::nil(), b"m", Duration::from_secs(5)),
        "host_id",
    );
    let why = invalid(
        HostLiveness::register(&etcd, id, &vec![0; OVERSIZED], Duration::from_secs(5)),
        "metadata",
    );
    assert!(why.contains("1.5 MiB"), "{why}");
    for prefix in [
        "",
        "coord/hosts",
        "/coord/hosts",
        "coord/hosts/",
        "/coord\0/hosts/",
    ] {
        invalid(
            HostLiveness::with_options(&etcd, id, b"m", with(&|o| o.prefix = prefix.into())),
            "prefix",
        );
        invalid(
            HostWatcher::with_options(&etcd, WatcherOptions::default().with_prefix(prefix)),
            "prefix",
        );
        invalid(list_hosts(&etcd, prefix), "prefix");
    }
    let long = format!("/{}/", "x".repeat(2000));
    invalid(
        HostLiveness::with_options(&etcd, id, b"m", with(&|o| o.prefix = long.clone())),
        "prefix",
    );
    invalid(
        HostLiveness::with_options(
            &etcd,
            id,
            b"m",
            with(&|o| o.session.safety_margin = o.session.ttl),
        ),
        "safety_margin",
    );
    invalid(
        HostLiveness::with_options(
            &etcd,
            id,
            b"m",
            LivenessOptions::default().with_drift_allowance_ppm(200_000),
        ),
        "drift_allowance_ppm",
    );
    invalid(
        HostWatcher::with_options(&etcd, WatcherOptions::default().with_capacity(1)),
        "capacity",
    );

    // Nothing was written by any refused call.
    assert!(list_hosts(&etcd, DEFAULT_HOSTS_PREFIX).unwrap().is_empty());

    // A registered host refuses oversized metadata and keeps the old one.
    let host =
        HostLiveness::register(&etcd, id, b"good", Duration::from_secs(5)).expect("register");
    invalid(host.set_metadata(&vec![0; OVERSIZED]), "metadata");
    std::thread::sleep(Duration::from_millis(200));
    let listed = list_hosts(&etcd, DEFAULT_HOSTS_PREFIX).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].metadata, b"good".to_vec());
    host.close().expect("close");
}

#[test]
fn election_arguments() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
    for name in [
        "",
        "ends-with/",
        "/starts-with",
        "nul\0byte",
        &"n".repeat(2000),
    ] {
        invalid(Election::new(&etcd, name), "name");
    }
    for prefix in ["no-slashes", "/no-trailing", "no-leading/"] {
        let options = ElectionOptions::default().with_prefix(prefix);
        invalid(Election::with_options(&etcd, "e", options), "prefix");
    }
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(999),
        Duration::from_millis(2500),
    ] {
        let options = ElectionOptions::default().with_ttl(ttl);
        invalid(Election::with_options(&etcd, "e", options), "ttl");
    }
    // A margin at or above the TTL, or above half of it once the drift
    // allowance is taken off, would leave the lease trusted for too little.
    let one = ElectionOptions::default().with_ttl(Duration::from_secs(1));
    for margin in [
        Duration::from_millis(496),
        Duration::from_secs(1),
        Duration::MAX,
    ] {
        let options = one.clone().with_safety_margin(margin);
        invalid(Election::with_options(&etcd, "e", options), "safety_margin");
    }
    for ppm in [100_001, u32::MAX] {
        let options = ElectionOptions::default().with_drift_allowance_ppm(ppm);
        invalid(
            Election::with_options(&etcd, "e", options),
            "drift_allowance_ppm",
        );
    }
    let edge = one
        .with_safety_margin(Duration::from_millis(495))
        .with_drift_allowance_ppm(10_000);
    assert_eq!(edge.trusted_lifetime(), Duration::from_millis(495));
    drop(Election::with_options(&etcd, "edge", edge).expect("the largest margin is valid"));
    // The handle still works after all that.
    let election = Election::new(&etcd, "fine").expect("valid election");
    let leadership = election.campaign(b"v").expect("campaign");
    assert!(leadership.is_held());
    leadership.resign().expect("resign");
}

/// A `/` in an election name would make it a sub-election: the candidates
/// of `nest/sub` (keys `<prefix>nest/sub/<lease>`) fall inside the range
/// `<prefix>nest/` that election `nest` reads, so `nest` would report and
/// wait for the leader of `nest/sub`. Such names are refused everywhere a
/// name is taken, by the election and by the pool, before anything is
/// written.
#[test]
fn election_names_with_a_slash_are_refused() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
    let options = ElectionOptions::default();
    for name in ["nest/sub", "a/b/c", "nest//sub"] {
        let why = invalid(Election::new(&etcd, name), "name");
        assert!(why.contains('/'), "{why}");
        invalid(Election::leader_of(&etcd, name, &options), "name");
        invalid(Election::observe_of(&etcd, name, &options), "name");
        let etcdctl_style = ElectionOptions::default().with_prefix("");
        invalid(Election::with_options(&etcd, name, etcdctl_style), "name");

        let pool = ElectionPool::new(&etcd);
        invalid(pool.election(name), "name");
        invalid(pool.campaign(name, b"v"), "name");
        invalid(pool.try_campaign(name, b"v"), "name");
        invalid(
            pool.campaign_timeout(name, b"v", Duration::from_secs(1)),
            "name",
        );
        pool.close().expect("close pool");
    }
    // Nothing was written: no candidate key anywhere.
    assert_eq!(
        Election::leader_of(&etcd, "nest", &options).expect("leader_of"),
        None
    );

    // Names that only share a beginning stay independent.
    let nest = Election::new(&etcd, "nest").expect("nest");
    let sibling = Election::new(&etcd, "nest-sub").expect("nest-sub");
    let leading = nest.campaign(b"nest").expect("campaign nest");
    match sibling.try_campaign(b"sibling").expect("try nest-sub") {
        TryCampaign::Elected(l) => l.resign().expect("resign nest-sub"),
        TryCampaign::NotElected(leader) => panic!("nest-sub saw a leader: {leader:?}"),
    }
    leading.resign().expect("resign nest");
}

/// Durations near `Duration::MAX` used to overflow `Instant + Duration`
/// and panic. A campaign timeout that large means "no deadline"; option
/// timeouts that large are refused with the field named.
#[test]
fn huge_durations_never_panic() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");

    let election = Election::new(&etcd, "huge").expect("election");
    let leadership = election
        .campaign_timeout(b"v", Duration::MAX)
        .expect("an uncontested campaign wins, whatever its timeout");
    assert!(leadership.is_held());
    leadership.resign().expect("resign");
    let pool = ElectionPool::new(&etcd);
    let pooled = pool
        .campaign_timeout("huge-pooled", b"v", Duration::MAX)
        .expect("pooled campaign");
    pooled.resign().expect("resign pooled");
    pool.close().expect("close pool");

    let endpoint = [server.endpoint()];
    let huge = Duration::MAX;
    invalid(
        Etcd::with_options(&endpoint, EtcdOptions::default().with_connect_timeout(huge)),
        "connect_timeout",
    );
    invalid(
        Etcd::with_options(&endpoint, EtcdOptions::default().with_request_timeout(huge)),
        "request_timeout",
    );
    invalid(
        Etcd::with_options(
            &endpoint,
            EtcdOptions::default().with_keepalive_interval(huge),
        ),
        "keepalive_interval",
    );
    invalid(
        HostLiveness::with_options(
            &etcd,
            Uuid::new_v4(),
            b"m",
            LivenessOptions::default().with_register_timeout(huge),
        ),
        "register_timeout",
    );
}

/// Every option is range-checked where it is used, naming the field: a
/// zero keepalive interval, for one, made the client reconnect constantly.
#[test]
fn options_out_of_range_are_refused() {
    let server = EtcdServer::start().expect("etcd");
    let endpoint = [server.endpoint()];
    let connect = |options: EtcdOptions| Etcd::with_options(&endpoint, options);
    for interval in [
        Duration::ZERO,
        Duration::from_millis(999),
        Duration::from_secs(3601),
    ] {
        invalid(
            connect(EtcdOptions::default().with_keepalive_interval(interval)),
            "keepalive_interval",
        );
    }
    for timeout in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::from_secs(86_401),
    ] {
        invalid(
            connect(EtcdOptions::default().with_connect_timeout(timeout)),
            "connect_timeout",
        );
        invalid(
            connect(EtcdOptions::default().with_request_timeout(timeout)),
            "request_timeout",
        );
    }

    let etcd = connect(EtcdOptions::default()).expect("connect");
    for timeout in [Duration::ZERO, Duration::from_secs(86_401)] {
        invalid(
            HostLiveness::with_options(
                &etcd,
                Uuid::new_v4(),
                b"m",
                LivenessOptions::default().with_register_timeout(timeout),
            ),
            "register_timeout",
        );
    }
    for capacity in [0, 1, usize::MAX, (1 << 20) + 1] {
        invalid(
            HostWatcher::with_options(&etcd, WatcherOptions::default().with_capacity(capacity)),
            "capacity",
        );
        invalid(
            EtcdCoordinator::on_etcd_with_options(
                &etcd,
                EtcdCoordinatorOptions::default().with_feed_capacity(capacity),
            ),
            "feed_capacity",
        );
    }
    // The bounds themselves are accepted.
    let edges = EtcdOptions::default()
        .with_connect_timeout(Duration::from_secs(86_400))
        .with_request_timeout(Duration::from_millis(1))
        .with_keepalive_interval(Duration::from_secs(1));
    connect(edges)
        .expect("options at their bounds")
        .close()
        .expect("close");
    let largest =
        HostWatcher::with_options(&etcd, WatcherOptions::default().with_capacity(1 << 20))
            .expect("largest capacity");
    drop(largest);
    assert!(list_hosts(&etcd, DEFAULT_HOSTS_PREFIX).unwrap().is_empty());
}

/// An endpoint is `host:port` or `http://host:port`, the host a name, an
/// IPv4 address or a bracketed IPv6 address, the port 1..=65535. Anything
/// else used to be passed on and dialled on port 80. Only loopback hosts
/// appear here: a wrongly accepted endpoint is dialled.
#[test]
fn endpoints_are_parsed_strictly() {
    for bad in [
        "127.0.0.1:99999",
        "127.0.0.1:65536",
        "127.0.0.1:0",
        "localhost:notaport",
        "localhost:",
        "localhost",
        "127.0.0.1",
        "http://127.0.0.1",
        "http://",
        "http://127.0.0.1:2379/v3",
        "http://127.0.0.1:2379?x=1",
        "http://user@127.0.0.1:2379",
        "[::1]",
        "[::1]:",
        "::1:2379",
        "[::1:2379",
        "127.0.0.1:2379:2380",
        "127.0.0.1:+2379",
        "127.0.0.1:-1",
        ":2379",
    ] {
        let why = invalid(
            Etcd::with_options(&[bad], EtcdOptions::default()),
            "endpoints",
        );
        assert!(
            why.contains(bad),
            "{bad:?}: the reason does not name it: {why}"
        );
    }
    let server = EtcdServer::start().expect("etcd");
    let port = server.endpoint().rsplit(':').next().unwrap().to_string();
    for good in [
        format!("127.0.0.1:{port}"),
        format!("http://127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("  127.0.0.1:{port} "),
    ] {
        let etcd = Etcd::with_options(&[good.as_str()], EtcdOptions::default())
            .unwrap_or_else(|e| panic!("{good:?}: {e}"));
        assert_eq!(
            etcd.endpoints(),
            [format!(
                "http://{}",
                good.trim().trim_start_matches("http://")
            )]
        );
        etcd.close().expect("close");
    }
}

/// The largest payload accepted must fit in one etcd request beside the
/// longest keys accepted, in the largest request each API sends (an
/// election's try-campaign names its key three times and its prefix four;
/// a trimming stream append names four keys). A 4 KiB margin was not
/// enough: etcd refused such a try-campaign as too large.
#[test]
fn largest_payload_fits_beside_the_longest_keys() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
    let largest = vec![b'x'; fleetcoord::coordinator::MAX_PAYLOAD];
    let longest_prefix = format!("/{}/", "p".repeat(1022));
    let longest_name = "n".repeat(255);

    let options = ElectionOptions::default().with_prefix(longest_prefix.clone());
    let election = Election::with_options(&etcd, &longest_name, options).expect("election");
    match election.try_campaign(&largest).expect("try_campaign") {
        TryCampaign::Elected(leadership) => {
            leadership.proclaim(&largest).expect("proclaim");
            leadership.resign().expect("resign");
        }
        TryCampaign::NotElected(leader) => panic!("nobody else campaigns: {leader:?}"),
    }
    election
        .campaign(&largest)
        .expect("campaign")
        .resign()
        .expect("resign");
    election.close().expect("close");

    let root = format!("/{}", "r".repeat(1023));
    let options = EtcdCoordinatorOptions::default()
        .with_root(root)
        .with_stream_max_len(1);
    let coordinator = EtcdCoordinator::on_etcd_with_options(&etcd, options).expect("coordinator");
    for _ in 0..2 {
        coordinator
            .append_stream(&longest_name, &largest)
            .expect("append (the second one trims the first)");
    }
    coordinator
        .kv_set(&longest_name, &longest_name, &largest)
        .expect("kv_set");
    coordinator
        .publish(&longest_name, &largest)
        .expect("publish");
}

/// `RateLimit`: names with '/', rates of 0 or past the maximum, windows,
/// lags and TTLs out of range are refused naming the field and the
/// allowed form, before anything is written; a huge acquire timeout means
/// no deadline, never a panic.
#[test]
fn rate_limit_arguments() {
    use fleetcoord::{RateLimit, RateLimitOptions, Session};
    let server = EtcdServer::start().expect("etcd");
    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
    let ok = RateLimitOptions::default;
    for name in ["a/b", "", "nul\0"] {
        invalid(RateLimit::new(&etcd, name, 10), "name");
    }
    let why = invalid(RateLimit::new(&etcd, "r", 0), "permits");
    assert!(why.contains("1 to 1,000,000"), "{why}");
    invalid(RateLimit::new(&etcd, "r", 1_000_001), "permits");
    invalid(RateLimit::new(&etcd, "r", u32::MAX), "permits");
    let why = invalid(
        RateLimit::with_options(&etcd, "r", 10, ok().with_window(Duration::ZERO)),
        "window",
    );
    assert!(why.contains("10 ms to 1 h"), "{why}");
    invalid(
        RateLimit::with_options(&etcd, "r", 10, ok().with_window(Duration::MAX)),
        "window",
    );
    invalid(
        RateLimit::with_options(&etcd, "r", 10, ok().with_lag(Duration::MAX)),
        "lag",
    );
    invalid(
        RateLimit::with_options(&etcd, "r", 10, ok().with_ttl(Duration::ZERO)),
        "ttl",
    );
    invalid(
        RateLimit::with_options(&etcd, "r", 10, ok().with_ttl(Duration::from_millis(1500))),
        "ttl",
    );
    invalid(
        RateLimit::with_options(&etcd, "r", 10, ok().with_prefix("no-slash")),
        "prefix",
    );
    invalid(
        RateLimit::with_options(&etcd, "r", 10, ok().with_register_timeout(Duration::ZERO)),
        "register_timeout",
    );
    let session = Session::new(&etcd, Duration::from_secs(5)).expect("session");
    invalid(RateLimit::with_session(&session, "a/b", 10, ok()), "name");
    invalid(RateLimit::with_session(&session, "r", 0, ok()), "permits");
    // Nothing was written by any refused constructor.
    let hosts = list_hosts(&etcd, fleetcoord::DEFAULT_RATELIMIT_PREFIX).expect("list");
    assert!(hosts.is_empty(), "{hosts:?}");

    // A valid one: a huge timeout is no deadline, and closing works.
    let limit = RateLimit::with_session(
        &session,
        "r",
        10,
        ok().with_window(Duration::from_millis(10))
            .with_lag(Duration::ZERO),
    )
    .expect("rate limit");
    limit.acquire_timeout(Duration::MAX).expect("acquire");
    limit.close().expect("close");
    session.close().expect("close session");
}

/// A window that the session's lease cannot cover (a member grants only
/// while its lease is trusted for a window more) would wait forever: it
/// is refused naming the window, on an own lease and on a session.
#[test]
fn rate_limit_window_longer_than_the_lease_is_refused() {
    use fleetcoord::{RateLimit, RateLimitOptions, Session};
    let server = EtcdServer::start().expect("etcd");
    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
    let long = RateLimitOptions::default().with_window(Duration::from_secs(4));
    let why = invalid(
        RateLimit::with_options(&etcd, "r", 10, long.clone()),
        "window",
    );
    assert!(why.contains("raise the TTL"), "{why}");
    let session = Session::new(&etcd, Duration::from_secs(5)).expect("session");
    invalid(
        RateLimit::with_session(&session, "r", 10, long.clone()),
        "window",
    );
    // A TTL that covers it is accepted.
    let fits = long.with_ttl(Duration::from_secs(10));
    assert!(fits.check("r", 10).is_ok());
    session.close().expect("close session");
}

/// `RwLock` takes what a mutex takes: one-segment names, its own
/// namespace, a session TTL of whole seconds (at least one), a margin
/// and drift allowance in range; all refused before a lease is granted.
#[test]
fn rwlock_arguments() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
    for name in ["", "a/b", "/lead", "trail/", "nul\0byte", &"n".repeat(2000)] {
        let why = invalid(RwLock::new(&etcd, name), "name");
        assert!(!why.is_empty());
        invalid(LockOptions::default().check_rwlock(name), "name");
    }
    for prefix in ["no-slashes", "/no-trailing", DEFAULT_LOCK_PREFIX] {
        let options = LockOptions::default().with_prefix(prefix);
        invalid(RwLock::with_options(&etcd, "r", options), "prefix");
    }
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(999),
        Duration::from_millis(2500),
        Duration::MAX,
    ] {
        let options = LockOptions::default().with_ttl(ttl);
        invalid(RwLock::with_options(&etcd, "r", options), "ttl");
    }
    let options = LockOptions::default().with_drift_allowance_ppm(u32::MAX);
    invalid(
        RwLock::with_options(&etcd, "r", options),
        "drift_allowance_ppm",
    );
    let session = fleetcoord::Session::new(&etcd, Duration::from_secs(5)).expect("session");
    invalid(
        RwLock::with_session(&session, "a/b", LockOptions::default()),
        "name",
    );
    let first = RwLock::with_session(&session, "twice", LockOptions::default()).expect("first");
    // One key per name and session: a second handle would share it.
    invalid(
        RwLock::with_session(&session, "twice", LockOptions::default()),
        "name",
    );
    // Nothing was written by any refused call; the valid one still works.
    let out = std::process::Command::new("etcdctl")
        .args([
            "--endpoints",
            &server.endpoint(),
            "get",
            "",
            "--prefix",
            "--keys-only",
        ])
        .output()
        .expect("etcdctl");
    assert!(
        String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "keys left: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let guard = first.write().expect("write");
    assert!(guard.is_held());
    guard.unlock().expect("unlock");
    session.close().expect("close");
}

/// `DoubleBarrier`: sizes of 0 or above `MAX_BARRIER_COUNT`, names that
/// are not one key segment, bad prefixes and TTLs, each refused naming its
/// field and the allowed form before a lease is granted; the same checks
/// without a connection (`DoubleBarrier::check`); nothing left in etcd.
#[test]
fn double_barrier_arguments() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
    for count in [0, MAX_BARRIER_COUNT + 1, u32::MAX] {
        let why = invalid(DoubleBarrier::new(&etcd, "b", count), "count");
        assert!(
            why.contains(&format!("1 to {MAX_BARRIER_COUNT}")) && why.contains(&count.to_string()),
            "names the allowed range and the value: {why}"
        );
        invalid(
            DoubleBarrier::check("b", count, &LockOptions::default()),
            "count",
        );
    }
    for name in ["", "a/b", "/lead", "trail/", "nul\0byte", &"n".repeat(2000)] {
        invalid(DoubleBarrier::new(&etcd, name, 2), "name");
        invalid(
            DoubleBarrier::check(name, 2, &LockOptions::default()),
            "name",
        );
    }
    let why = invalid(DoubleBarrier::new(&etcd, "a/b", 2), "name");
    assert!(why.contains("\"a/b\""), "names the name: {why}");
    for prefix in ["no-slashes", "/no-trailing"] {
        let options = LockOptions::default().with_prefix(prefix);
        invalid(
            DoubleBarrier::with_options(&etcd, "b", 2, options),
            "prefix",
        );
    }
    for ttl in [Duration::ZERO, Duration::from_millis(999), Duration::MAX] {
        let options = LockOptions::default().with_ttl(ttl);
        invalid(DoubleBarrier::with_options(&etcd, "b", 2, options), "ttl");
    }
    let session = fleetcoord::Session::new(&etcd, Duration::from_secs(5)).expect("session");
    invalid(
        DoubleBarrier::with_session(&session, "b", 0, LockOptions::default()),
        "count",
    );
    invalid(
        DoubleBarrier::with_session(&session, "a/b", 2, LockOptions::default()),
        "name",
    );
    session.close().expect("close");
    // Nothing was written by any refused call.
    let out = std::process::Command::new("etcdctl")
        .args([
            "--endpoints",
            &server.endpoint(),
            "get",
            "",
            "--prefix",
            "--keys-only",
        ])
        .output()
        .expect("etcdctl");
    assert!(
        String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "keys left: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // A valid one of a single participant passes at once.
    let one = DoubleBarrier::new(&etcd, "b", 1).expect("barrier of 1");
    one.enter_timeout(Duration::from_secs(10)).expect("enter");
    one.leave_timeout(Duration::from_secs(10)).expect("leave");
    one.close().expect("close");
}
