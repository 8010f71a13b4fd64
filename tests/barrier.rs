//! `DoubleBarrier` against a real etcd: nobody passes `enter` before all
//! N entered, nobody passes `leave` before all left, one too many is
//! refused, a participant killed without leaving (its handle leaked, its
//! lease left to expire) frees its place within TTL + 1 s, and the keys
//! are those of Go's `recipes.DoubleBarrier` (written here by hand).

mod common;

use fleetcoord::testing::{FaultProxy, Mode};
use fleetcoord::{DoubleBarrier, Error, LockOptions};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

fn options() -> LockOptions {
    LockOptions::default().with_ttl(Duration::from_secs(5))
}

/// Three participants arrive 300 ms apart: nobody's `enter` returns before
/// the third arrived, and nobody's `leave` before the last one left.
#[test]
fn nobody_enters_before_all_arrived_nor_leaves_before_all_left() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    type Log = Arc<Mutex<Vec<(usize, &'static str, Instant)>>>;
    let log: Log = Arc::default();
    let started = Instant::now();
    let workers: Vec<_> = (0..3)
        .map(|i| {
            let b = DoubleBarrier::with_options(&etcd, "batch", 3, options()).unwrap();
            let log = log.clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(300 * i as u64));
                log.lock().unwrap().push((i, "arrive", Instant::now()));
                b.enter_timeout(WAIT).unwrap();
                log.lock().unwrap().push((i, "entered", Instant::now()));
                // The work: the last one takes longest.
                thread::sleep(Duration::from_millis(200 * i as u64));
                log.lock().unwrap().push((i, "leave", Instant::now()));
                b.leave_timeout(WAIT).unwrap();
                log.lock().unwrap().push((i, "left", Instant::now()));
                b.close().unwrap();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let log = log.lock().unwrap();
    let last = |what: &str| {
        log.iter()
            .filter(|e| e.1 == what)
            .map(|e| e.2)
            .max()
            .unwrap()
    };
    let first = |what: &str| {
        log.iter()
            .filter(|e| e.1 == what)
            .map(|e| e.2)
            .min()
            .unwrap()
    };
    assert!(
        first("entered") >= last("arrive"),
        "someone entered {:?} before the last arrived",
        last("arrive") - first("entered")
    );
    assert!(
        first("left") >= last("leave"),
        "someone left {:?} before the last one started leaving",
        last("leave") - first("left")
    );
    println!(
        "last arrival -> all entered: {:?}; last leave -> all left: {:?} (run {:?})",
        last("entered") - last("arrive"),
        last("left") - last("leave"),
        started.elapsed()
    );
    assert!(last("entered") - last("arrive") < Duration::from_secs(1));
    let keys = common::etcdctl_keys(&server.endpoint(), "/coord/barrier/batch/");
    assert!(keys.is_empty(), "left behind: {keys:?}");
}

/// A third participant of a barrier of two is refused, its key removed.
#[test]
fn one_too_many_is_refused() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let a = Arc::new(DoubleBarrier::with_options(&etcd, "pair", 2, options()).unwrap());
    let b = DoubleBarrier::with_options(&etcd, "pair", 2, options()).unwrap();
    let c = DoubleBarrier::with_options(&etcd, "pair", 2, options()).unwrap();
    let entering = {
        let a = a.clone();
        thread::spawn(move || a.enter_timeout(WAIT))
    };
    b.enter_timeout(WAIT).unwrap();
    entering.join().unwrap().unwrap();
    match c.enter_timeout(WAIT) {
        Err(Error::InvalidArgument { what: "count", why }) => {
            assert!(why.contains("ErrTooManyClients"), "{why}")
        }
        other => panic!("a third of two entered: {other:?}"),
    }
    let keys = common::etcdctl_keys(&server.endpoint(), "/coord/barrier/pair/waiters/");
    assert_eq!(keys.len(), 2, "{keys:?}");
}

/// A participant that dies holding its place (cut off from etcd behind a
/// blackholing proxy, as a killed or partitioned process is: no renewal,
/// no delete gets through) gives the place up when etcd expires its lease,
/// within TTL + 1 s of its last renewal; two others then fill the barrier.
#[test]
fn a_dead_participant_gives_its_place_up_within_ttl_and_a_second() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let ttl = Duration::from_secs(2);
    let proxy = FaultProxy::start(&endpoint).unwrap();
    let dying_etcd = common::connect(&proxy.endpoint());
    let dying = Arc::new(
        DoubleBarrier::with_options(
            &dying_etcd,
            "crash",
            2,
            LockOptions::default().with_ttl(ttl),
        )
        .unwrap(),
    );
    let d = dying.clone();
    let _waiting = thread::spawn(move || d.enter_timeout(Duration::from_secs(30)));
    let deadline = Instant::now() + WAIT;
    while common::etcdctl_keys(&endpoint, "/coord/barrier/crash/waiters/").is_empty() {
        assert!(
            Instant::now() < deadline,
            "the dying participant never joined"
        );
        thread::sleep(Duration::from_millis(20));
    }
    proxy.set_mode(Mode::Blackhole);
    let cut = Instant::now();
    while !common::etcdctl_keys(&endpoint, "/coord/barrier/crash/waiters/").is_empty() {
        assert!(
            cut.elapsed() < WAIT,
            "the dead participant's key never went"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let freed = cut.elapsed();
    println!("dead participant's place free after {freed:?} (TTL {ttl:?})");
    assert!(freed <= ttl + Duration::from_secs(1), "took {freed:?}");
    let survivor = Arc::new(DoubleBarrier::with_options(&etcd, "crash", 2, options()).unwrap());
    let newcomer = DoubleBarrier::with_options(&etcd, "crash", 2, options()).unwrap();
    let s = survivor.clone();
    let t = thread::spawn(move || s.enter_timeout(WAIT));
    newcomer.enter_timeout(WAIT).unwrap();
    t.join().unwrap().unwrap();
}

/// Go's `recipe.NewDoubleBarrier(s, "go", 2)` writes `go/waiters/<nanos>`
/// (on its lease, value "") and waits for a put of `go/ready`. One Go
/// participant is written here by hand; ours is the second, so it must
/// put `go/ready` (what the Go participant waits for) and enter.
#[test]
fn go_recipes_double_barrier_keys_fill_with_fleetcoord() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    common::etcdctl(&endpoint, &["put", "go/waiters/1765000000000000001", ""]);
    let shared = LockOptions::default()
        .with_prefix("")
        .with_ttl(Duration::from_secs(5));
    let ours = DoubleBarrier::with_options(&etcd, "go", 2, shared).unwrap();
    assert_eq!(ours.key(), "go");
    ours.enter_timeout(WAIT).unwrap();
    let ready = common::etcdctl_keys(&endpoint, "go/ready");
    assert_eq!(ready, vec!["go/ready".to_string()], "Go waits for this put");
    // Go's participant leaves (deletes its key); ours then drains.
    common::etcdctl(&endpoint, &["del", "go/waiters/1765000000000000001"]);
    ours.leave_timeout(WAIT).unwrap();
    assert!(common::etcdctl_keys(&endpoint, "go/").is_empty());
}

#[test]
fn bad_counts_and_names_are_refused_before_anything_is_sent() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    for count in [0, fleetcoord::MAX_BARRIER_COUNT + 1, u32::MAX] {
        match DoubleBarrier::new(&etcd, "x", count) {
            Err(Error::InvalidArgument { what: "count", why }) => {
                assert!(why.contains("1 to"), "{why}")
            }
            other => panic!("count {count}: {other:?}"),
        }
    }
    for name in ["", "a/b", "nul\0"] {
        assert!(matches!(
            DoubleBarrier::new(&etcd, name, 2),
            Err(Error::InvalidArgument { what: "name", .. })
        ));
    }
    let short = LockOptions::default().with_ttl(Duration::from_millis(300));
    assert!(matches!(
        DoubleBarrier::with_options(&etcd, "x", 2, short),
        Err(Error::InvalidArgument { what: "ttl", .. })
    ));
    let b = DoubleBarrier::new(&etcd, "order", 2).unwrap();
    assert!(matches!(
        b.leave_timeout(WAIT),
        Err(Error::InvalidArgument { what: "leave", .. })
    ));
}
