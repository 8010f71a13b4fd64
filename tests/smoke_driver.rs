//! First contact with a real etcd: connect, register, watch, elect.

use fleetcoord::testing::EtcdServer;
use fleetcoord::{
    DownReason, Election, Etcd, EtcdOptions, HostEvent, HostLiveness, HostWatcher, LivenessState,
};
use std::time::{Duration, Instant};

// Generous: a loaded 2-core CI machine can take seconds per step.
const WAIT: Duration = Duration::from_secs(10);

#[test]
fn register_watch_close_and_elect() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
    let watcher = HostWatcher::watch(&etcd).expect("watch");
    assert_eq!(
        watcher.events().recv_timeout(WAIT).unwrap(),
        HostEvent::Synced
    );
    let id = uuid::Uuid::new_v4();
    let host = HostLiveness::register(&etcd, id, b"m1", Duration::from_secs(2)).expect("register");
    assert!(matches!(host.state(), LivenessState::Registered { .. }));
    match watcher.events().recv_timeout(WAIT).unwrap() {
        HostEvent::Up(info) => assert_eq!((info.id, info.metadata), (id, b"m1".to_vec())),
        other => panic!("{other:?}"),
    }
    host.set_metadata(b"m2").unwrap();
    match watcher.events().recv_timeout(WAIT).unwrap() {
        HostEvent::Updated(info) => assert_eq!(info.metadata, b"m2".to_vec()),
        other => panic!("{other:?}"),
    }
    let t = Instant::now();
    host.close().expect("close");
    match watcher.events().recv_timeout(WAIT).unwrap() {
        HostEvent::Down(info, DownReason::Left) => assert_eq!(info.metadata, b"m2".to_vec()),
        other => panic!("{other:?}"),
    }
    println!("close -> Down: {:?}", t.elapsed());

    let a = Election::new(&etcd, "smoke").unwrap();
    let b = Election::new(&etcd, "smoke").unwrap();
    let la = a.campaign(b"a").unwrap();
    let observer = a.observe().unwrap();
    let first = observer
        .leaders()
        .recv_timeout(WAIT)
        .unwrap()
        .expect("a leads");
    assert_eq!(first.value, b"a".to_vec());
    let t2 = std::thread::spawn(move || b.campaign(b"b").map(|l| (l.fencing_token(), b, l)));
    std::thread::sleep(Duration::from_millis(300));
    let token_a = la.fencing_token();
    la.resign().unwrap();
    let (token_b, _b, _lb) = t2.join().unwrap().unwrap();
    assert!(token_b > token_a);
}

/// A request that fails names where it went: "Connection refused" alone
/// does not tell an operator which etcd refused (issue 51: an agent died
/// with `endpoints: ""`).
#[test]
fn a_failed_request_names_the_endpoints() {
    let mut server = EtcdServer::start().expect("etcd");
    let endpoint = server.endpoint();
    let etcd = Etcd::with_options(endpoint.as_str(), EtcdOptions::default()).expect("connect");
    let election = Election::new(&etcd, "named-endpoints").expect("election");
    let leadership = election.campaign(b"me").expect("campaign");
    server.kill().expect("kill etcd");
    let started = Instant::now();
    let failed = leadership
        .txn_if_leader([fleetcoord::TxnOp::put("k", "v")])
        .expect_err("etcd is gone");
    assert!(started.elapsed() < WAIT, "took {:?}", started.elapsed());
    assert!(failed.is_retryable(), "{failed:?}");
    let port = endpoint.rsplit(':').next().expect("a port");
    let (shown, debug) = (failed.to_string(), format!("{failed:?}"));
    assert!(shown.contains(port), "{shown}");
    assert!(!debug.contains("endpoints: \"\""), "{debug}");
    let failed = etcd.lease_ttl(1).expect_err("etcd is gone");
    assert!(failed.to_string().contains(port), "{failed}");
}
