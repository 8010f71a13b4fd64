//! Bad input to every entry point of the host and election APIs: each is
//! refused with `InvalidArgument` naming the field (or `Connect` naming the
//! endpoint), nothing panics, and nothing is half-written to etcd.

use fleetcoord::testing::EtcdServer;
use fleetcoord::{
    list_hosts, Election, ElectionOptions, Error, Etcd, EtcdOptions, HostLiveness, HostWatcher,
    LivenessOptions, WatcherOptions, DEFAULT_HOSTS_PREFIX,
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
    invalid(Etcd::connect(&none, EtcdOptions::default()), "endpoints");
    let why = invalid(
        Etcd::connect(&["https://127.0.0.1:2379"], EtcdOptions::default()),
        "endpoints",
    );
    assert!(why.contains("https://127.0.0.1:2379"), "{why}");
    invalid(Etcd::connect(&[""], EtcdOptions::default()), "endpoints");
    invalid(
        Etcd::connect(&["127.0.0.1:2379 127.0.0.1:2380"], EtcdOptions::default()),
        "endpoints",
    );
    let zero = EtcdOptions::default().with_connect_timeout(Duration::ZERO);
    invalid(Etcd::connect(&["127.0.0.1:2379"], zero), "options");
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
    let result = Etcd::connect(&[endpoint.as_str()], options);
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
    let etcd = Etcd::connect(&[server.endpoint()], EtcdOptions::default()).expect("connect");
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
            HostLiveness::register_with(&etcd, id, b"m", with(&|o| o.prefix = prefix.into())),
            "prefix",
        );
        invalid(
            HostWatcher::watch_with(&etcd, WatcherOptions::default().with_prefix(prefix)),
            "prefix",
        );
        invalid(list_hosts(&etcd, prefix), "prefix");
    }
    let long = format!("/{}/", "x".repeat(2000));
    invalid(
        HostLiveness::register_with(&etcd, id, b"m", with(&|o| o.prefix = long.clone())),
        "prefix",
    );
    invalid(
        HostWatcher::watch_with(&etcd, WatcherOptions::default().with_capacity(1)),
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
    let etcd = Etcd::connect(&[server.endpoint()], EtcdOptions::default()).expect("connect");
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
    // The handle still works after all that.
    let election = Election::new(&etcd, "fine").expect("valid election");
    let leadership = election.campaign(b"v").expect("campaign");
    assert!(leadership.is_held());
    leadership.resign().expect("resign");
}
