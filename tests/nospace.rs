//! A full etcd: its `NOSPACE` alarm raised by a small
//! `--quota-backend-bytes`, under a registered host, a watcher, a leader
//! doing fenced writes and the etcd bus. While the alarm stands, writes are
//! refused with `ErrorKind::NoSpace` (and nothing is half-written), while
//! leases, leaderships and watches stay; once an operator compacts,
//! defragments and disarms, everything writes again without a restart.

mod common;

use common::etcdctl;
use fleetcoord::coordinator::{Coordinator, EtcdCoordinator};
use fleetcoord::testing::EtcdBuilder;
use fleetcoord::{
    Election, ErrorKind, Etcd, EtcdOptions, HostEvent, HostLiveness, HostWatcher, LivenessOptions,
    LivenessState, TxnOp,
};
use std::time::{Duration, Instant};

/// Small enough to fill in a second or two, large enough for etcd's own
/// start-up data.
const QUOTA: u64 = 4 << 20;
/// Each fenced write's value: a fresh revision of one key, so the
/// database grows until it is compacted.
const VALUE: usize = 256 << 10;
const TTL: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(10);

#[test]
fn a_full_etcd_refuses_writes_by_name_keeps_leases_and_recovers_when_disarmed() {
    let server = EtcdBuilder::new()
        .arg(format!("--quota-backend-bytes={QUOTA}"))
        .start()
        .expect("etcd");
    let endpoint = server.endpoint();
    let etcd = Etcd::with_options(endpoint.as_str(), EtcdOptions::default()).expect("connect");
    let watcher = HostWatcher::watch(&etcd).expect("watch");
    assert_eq!(watcher.events().recv_timeout(WAIT), Ok(HostEvent::Synced));
    let host = HostLiveness::register(&etcd, uuid::Uuid::new_v4(), b"up", TTL).expect("register");
    assert!(matches!(
        watcher.events().recv_timeout(WAIT),
        Ok(HostEvent::Up(_))
    ));
    let election = Election::new(&etcd, "full").expect("election");
    let leadership = election.campaign(b"me").expect("campaign");
    let bus = EtcdCoordinator::on_etcd(&etcd).expect("bus");
    bus.kv_set("b", "k", b"before").expect("kv_set");
    let before = bus.append_stream("s", b"before").expect("append");

    // Fill etcd with fenced writes until it refuses one.
    let big = vec![b'x'; VALUE];
    let mut refused = None;
    let mut puts = 0;
    let filling = Instant::now();
    // etcd sees its size as its backend commits (every 100 ms): a few
    // writes land past the quota before the alarm is raised.
    while filling.elapsed() < 2 * WAIT {
        match leadership.txn_if_leader([TxnOp::put("full/blob", big.clone())]) {
            Ok(Some(_)) => {
                puts += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(None) => panic!("the leadership ended while filling etcd"),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let refused = refused.expect("etcd never refused a write: the quota was not reached");
    println!(
        "{puts} writes of {VALUE} bytes in {:?}, then: {refused}",
        filling.elapsed()
    );
    assert_eq!(refused.kind(), ErrorKind::NoSpace, "{refused:?}");
    assert!(refused.to_string().contains("out of space"), "{refused}");
    assert!(refused.is_retryable());
    let alarms = etcdctl(&endpoint, &["alarm", "list"]);
    assert!(alarms.contains("NOSPACE"), "{alarms}");

    // Under the alarm, for several TTLs: every write is refused by name,
    // while leases are renewed, the leadership stays and no host goes down.
    let small = leadership.txn_if_leader([TxnOp::put("full/small", "v")]);
    assert_eq!(small.map_err(|e| e.kind()).err(), Some(ErrorKind::NoSpace));
    let set = bus
        .kv_set("b", "k", b"during")
        .expect_err("kv_set on a full etcd");
    assert_eq!(set.kind(), ErrorKind::NoSpace, "{set:?}");
    let started = Instant::now();
    let append = bus
        .append_stream("s", b"during")
        .expect_err("append on a full etcd");
    assert_eq!(append.kind(), ErrorKind::NoSpace, "{append:?}");
    assert!(
        started.elapsed() < WAIT,
        "append took {:?}",
        started.elapsed()
    );
    println!("kv_set: {set}\nappend_stream: {append}");
    // A new registration (its lease grant refused) keeps trying, and gives
    // up at its register timeout saying why, leaving nothing behind.
    let started = Instant::now();
    let options = LivenessOptions::default()
        .with_ttl(TTL)
        .with_register_timeout(Duration::from_secs(3));
    let late = HostLiveness::with_options(&etcd, uuid::Uuid::new_v4(), b"late", options)
        .expect_err("a registration on a full etcd");
    println!(
        "a registration on a full etcd: {late} (after {:?})",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(3) + WAIT,
        "{:?}",
        started.elapsed()
    );
    // Named, not a bare timeout: the grants were refused for space.
    assert_eq!(late.kind(), ErrorKind::NoSpace, "{late:?}");
    assert!(late.is_retryable(), "{late:?}");
    let text = late.to_string();
    assert!(
        text.contains("no lease granted within 3s") && text.contains("out of space"),
        "{text}"
    );
    // A campaign needs a lease grant (a new session) and a put.
    let started = Instant::now();
    let other = Election::new(&etcd, "full-other").expect("election");
    let campaign = other
        .campaign_timeout(b"other", Duration::from_secs(2))
        .expect_err("a campaign on a full etcd");
    println!(
        "a campaign on a full etcd: {campaign} (after {:?})",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(2) + WAIT,
        "{:?}",
        started.elapsed()
    );
    // Named too: the session's grants were refused for space.
    assert_eq!(campaign.kind(), ErrorKind::NoSpace, "{campaign:?}");
    assert!(campaign.is_retryable(), "{campaign:?}");
    let text = campaign.to_string();
    assert!(
        text.contains("its session: no lease granted within 2s") && text.contains("out of space"),
        "{text}"
    );
    let held_until = Instant::now() + 3 * TTL;
    while Instant::now() < held_until {
        assert!(
            matches!(host.state(), LivenessState::Registered { .. }),
            "{:?}",
            host.state()
        );
        assert!(
            leadership.lost().try_recv().is_err(),
            "the leadership ended under the alarm"
        );
        if let Ok(event) = watcher.events().recv_timeout(Duration::from_millis(200)) {
            panic!("the watcher saw {event:?} under the alarm");
        }
    }

    // The operator's way out: compact to the current revision, defragment,
    // disarm. Then every write works again, on the same handles.
    let status = etcdctl(&endpoint, &["endpoint", "status", "--write-out=fields"]);
    let revision = status
        .lines()
        .find_map(|l| l.strip_prefix("\"Revision\" : "))
        .expect("a revision in endpoint status")
        .trim()
        .to_string();
    etcdctl(&endpoint, &["compact", &revision, "--physical"]);
    etcdctl(&endpoint, &["defrag"]);
    etcdctl(&endpoint, &["alarm", "disarm"]);
    let disarmed = Instant::now();
    let written = leadership
        .txn_if_leader([TxnOp::put("full/small", "after")])
        .expect("a fenced write once disarmed");
    assert!(written.is_some(), "the leadership ended across the alarm");
    bus.kv_set("b", "k", b"after")
        .expect("kv_set once disarmed");
    assert_eq!(bus.kv_get("b", "k").expect("kv_get"), b"after".to_vec());
    let after = bus
        .append_stream("s", b"after")
        .expect("append once disarmed");
    // The refused append stored nothing: the next entry follows the first.
    assert_eq!(after.0, before.0 + 1, "{before:?} then {after:?}");
    let late = HostLiveness::register(&etcd, uuid::Uuid::new_v4(), b"late", TTL)
        .expect("a registration once disarmed");
    match watcher.events().recv_timeout(WAIT) {
        Ok(HostEvent::Up(info)) => assert_eq!(info.metadata, b"late".to_vec()),
        other => panic!("{other:?}"),
    }
    println!(
        "all written again {:?} after the disarm",
        disarmed.elapsed()
    );
    assert!(matches!(host.state(), LivenessState::Registered { .. }));

    let campaigned = other
        .campaign_timeout(b"other", WAIT)
        .expect("a campaign once disarmed");
    campaigned.resign().expect("resign");
    other.close().expect("close");
    late.close().expect("close");
    host.close().expect("close");
    election.close().expect("close");
    etcd.close().expect("close");
}
