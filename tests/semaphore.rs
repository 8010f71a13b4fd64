//! `Semaphore` against a real etcd: never more than N believing holders,
//! fencing, liveness after releases and faults, timed and non-blocking
//! acquires, and that a release wakes only the waiters it can let in.

mod common;

use common::etcd_calls;
use fleetcoord::testing::{FaultProxy, Mode};
use fleetcoord::{
    ElectionOptions, Error, Etcd, EtcdOptions, Semaphore, SemaphoreGuard, TxnOp,
    DEFAULT_SEMAPHORE_PREFIX,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

// Generous: a loaded 2-core machine can take seconds per step.
const WAIT: Duration = Duration::from_secs(20);

fn short_ttl() -> ElectionOptions {
    ElectionOptions::default()
        .with_prefix(DEFAULT_SEMAPHORE_PREFIX)
        .with_ttl(Duration::from_secs(2))
}

/// Waits until `prefix` has `n` keys.
fn wait_for_keys(endpoint: &str, prefix: &str, n: usize) {
    let deadline = Instant::now() + WAIT;
    loop {
        let keys = common::etcdctl_keys(endpoint, prefix);
        if keys.len() == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "expected {n} keys under {prefix}, have {keys:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// The largest number of intervals open at one instant.
fn max_overlap(intervals: &[(Instant, Instant)]) -> usize {
    let mut edges: Vec<(Instant, i32)> = intervals
        .iter()
        .flat_map(|&(a, b)| [(a, 1), (b, -1)])
        .collect();
    // Ends before starts at the same instant: touching is no overlap.
    edges.sort();
    let (mut open, mut max) = (0i32, 0i32);
    for (_, d) in edges {
        open += d;
        max = max.max(open);
    }
    max as usize
}

#[test]
fn six_contenders_never_have_more_than_two_believing_holders() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let intervals = Arc::new(Mutex::new(Vec::new()));
    let until = Instant::now() + Duration::from_secs(6);
    let threads: Vec<_> = (0..6u64)
        .map(|i| {
            let etcd = etcd.clone();
            let intervals = intervals.clone();
            thread::spawn(move || {
                let sem = Semaphore::new(&etcd, "six", 2).unwrap();
                let mut rounds = 0;
                while Instant::now() < until {
                    let guard = sem.acquire_timeout(WAIT).unwrap();
                    let start = Instant::now();
                    thread::sleep(Duration::from_millis(20 + 7 * i));
                    // The belief, checked at the end of the hold: the
                    // interval counts only if it was believed throughout.
                    let end = Instant::now();
                    assert!(guard.is_held(), "a permit lost without a fault");
                    intervals.lock().unwrap().push((start, end));
                    guard.release().unwrap();
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    let rounds: Vec<u32> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let intervals = intervals.lock().unwrap();
    let overlap = max_overlap(&intervals);
    println!(
        "{} holds by 6 contenders (per contender {rounds:?}), at most {overlap} at once",
        intervals.len()
    );
    assert!(overlap <= 2, "{overlap} believing holders of 2 permits");
    assert_eq!(overlap, 2, "two permits were never held at once");
    assert!(
        rounds.iter().all(|&r| r > 0),
        "a contender starved: {rounds:?}"
    );
}

#[test]
fn a_guard_whose_key_is_gone_is_fenced_and_told() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let sem = Semaphore::new(&etcd, "fenced", 2).unwrap();
    let guard = sem.acquire().unwrap();
    assert!(guard.key().starts_with("/coord/semaphore/fenced/"));
    assert!(guard
        .txn_if_held([TxnOp::put("/fenced/owner", "a")])
        .unwrap()
        .is_some());
    // The key goes behind the holder's back (an operator, an expiry).
    common::etcdctl(&endpoint, &["del", guard.key()]);
    guard
        .lost()
        .recv_timeout(WAIT)
        .expect("lost() fires when the key is deleted");
    assert!(!guard.is_held());
    assert!(
        guard
            .txn_if_held([TxnOp::put("/fenced/owner", "stale")])
            .unwrap()
            .is_none(),
        "a fenced write of a released permit must not apply"
    );
    assert_eq!(
        common::etcdctl(&endpoint, &["get", "--print-value-only", "/fenced/owner"]).trim(),
        "a"
    );
}

#[test]
fn a_released_permit_goes_to_the_next_waiter_within_a_second() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let a = Semaphore::new(&etcd, "handover", 2).unwrap();
    let b = Semaphore::new(&etcd, "handover", 2).unwrap();
    let first = a.acquire().unwrap();
    let second = b.acquire().unwrap();
    let mut handovers = Vec::new();
    let (mut first, mut second) = (Some(first), Some(second));
    for round in 0..5 {
        let c = Semaphore::new(&etcd, "handover", 2).unwrap();
        let waiting = thread::spawn(move || {
            let guard = c.acquire().unwrap();
            (Instant::now(), guard, c)
        });
        wait_for_keys(&endpoint, "/coord/semaphore/handover/", 3);
        thread::sleep(Duration::from_millis(100));
        assert!(!waiting.is_finished(), "a third holder of 2 permits");
        // Release the older and the newer holder in turn: either frees
        // the permit the waiter waits for.
        let released = if round % 2 == 0 {
            &mut first
        } else {
            &mut second
        };
        let at = Instant::now();
        released.take().unwrap().release().unwrap();
        let (held_at, guard, c) = waiting.join().unwrap();
        let handover = held_at.duration_since(at);
        assert!(
            handover < Duration::from_secs(1),
            "round {round}: the waiter held {handover:?} after the release"
        );
        handovers.push(handover);
        *released = Some(guard);
        // The handle must outlive its guard; leak it to the end of the test.
        std::mem::forget(c);
    }
    println!("release -> next holder: {handovers:?}");
}

#[test]
fn acquire_timeout_returns_on_time_and_leaves_no_key() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let holders: Vec<SemaphoreGuard> = (0..2)
        .map(|_| {
            let sem = Box::leak(Box::new(Semaphore::new(&etcd, "timed", 2).unwrap()));
            sem.acquire().unwrap()
        })
        .collect();
    let waiter = Semaphore::new(&etcd, "timed", 2).unwrap();
    for _ in 0..3 {
        let started = Instant::now();
        let result = waiter.acquire_timeout(Duration::from_secs(1));
        let took = started.elapsed();
        assert!(matches!(result, Err(Error::Timeout(_))), "{result:?}");
        assert!(
            took < Duration::from_millis(1500),
            "acquire_timeout(1s) took {took:?}"
        );
        assert!(took >= Duration::from_secs(1), "gave up early: {took:?}");
        // The waiting key is withdrawn in the background, promptly.
        wait_for_keys(&endpoint, "/coord/semaphore/timed/", 2);
    }
    drop(holders);
}

#[test]
fn try_acquire_takes_a_free_permit_and_otherwise_leaves_nothing() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let a = Semaphore::new(&etcd, "try", 2).unwrap();
    let b = Semaphore::new(&etcd, "try", 2).unwrap();
    let c = Semaphore::new(&etcd, "try", 2).unwrap();
    let first = a.try_acquire().unwrap().expect("a free permit");
    let second = b.try_acquire().unwrap().expect("the second permit");
    assert!(first.is_held() && second.is_held());
    assert!(second.fencing_token() > first.fencing_token());
    assert!(c.try_acquire().unwrap().is_none(), "both permits are held");
    wait_for_keys(&endpoint, "/coord/semaphore/try/", 2);
    first.release().unwrap();
    let third = c.try_acquire().unwrap().expect("a released permit");
    assert!(third.fencing_token() > second.fencing_token());
    // A waiter queued ahead counts as taken: try never jumps the queue.
    drop(third);
    let d = Arc::new(Semaphore::new(&etcd, "try", 2).unwrap());
    let e = Semaphore::new(&etcd, "try", 2).unwrap();
    let _third = c.acquire().unwrap();
    let queued = {
        let d = d.clone();
        thread::spawn(move || d.acquire().map(|g| g.fencing_token()))
    };
    wait_for_keys(&endpoint, "/coord/semaphore/try/", 3);
    assert!(e.try_acquire().unwrap().is_none());
    drop(second);
    assert!(queued.join().unwrap().is_ok());
}

#[test]
fn bad_permits_and_mismatched_permits_are_clear_errors() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    match Semaphore::new(&etcd, "zero", 0) {
        Err(Error::InvalidArgument {
            what: "permits", ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        Semaphore::new(&etcd, "a/b", 2),
        Err(Error::InvalidArgument { what: "name", .. })
    ));
    for options in [
        ElectionOptions::default().with_priority(3),
        ElectionOptions::default().with_yield_to_higher(true),
    ] {
        assert!(matches!(
            Semaphore::with_options(&etcd, "ranked", 2, options),
            Err(Error::InvalidArgument {
                what: "priority",
                ..
            })
        ));
    }
    let two = Semaphore::new(&etcd, "mixed", 2).unwrap();
    let _held = two.acquire().unwrap();
    match Semaphore::new(&etcd, "mixed", 3) {
        Err(Error::InvalidArgument {
            what: "permits",
            why,
        }) => {
            assert!(why.contains("2 permits") && why.contains("3"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert!(Semaphore::new(&etcd, "mixed", 2).is_ok());
}

/// 2 holders and 8 waiters: releasing the newer holder wakes only the
/// waiters that watch it (at most 2, the permits), counted by etcd's own
/// Txn counter: each woken waiter reads once, the release is one Txn.
#[test]
fn a_release_wakes_at_most_permits_waiters() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let first = Semaphore::new(&etcd, "herd", 2).unwrap().acquire();
    let older = first.unwrap();
    let second_sem = Semaphore::new(&etcd, "herd", 2).unwrap();
    let newer = second_sem.acquire().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let etcd = etcd.clone();
            let stop = stop.clone();
            thread::spawn(move || {
                let sem = Semaphore::new(&etcd, "herd", 2).unwrap();
                let guard = sem.acquire().unwrap();
                while !stop.load(Ordering::Relaxed) {
                    thread::sleep(Duration::from_millis(10));
                }
                drop(guard);
            })
        })
        .collect();
    wait_for_keys(&endpoint, "/coord/semaphore/herd/", 10);
    thread::sleep(Duration::from_millis(300));
    let before = etcd_calls(&endpoint, "Txn");
    newer.release().unwrap();
    // Let every woken waiter read (and re-watch or hold).
    thread::sleep(Duration::from_millis(500));
    let reads = etcd_calls(&endpoint, "Txn") - before;
    println!("Txns for one release with 8 waiters and 2 permits: {reads}");
    assert!(
        reads <= 3,
        "{reads} Txns: the release ({}) and more than 2 woken waiters",
        1
    );
    assert!(reads >= 2, "nobody woke: {reads} Txns");
    stop.store(true, Ordering::Relaxed);
    drop(older);
    for w in waiters {
        w.join().unwrap();
    }
}

/// A holder cut off from etcd: its `lost()` fires before the waiter gets
/// its permit, and the waiter gets it within 2 x TTL + 2 s.
#[test]
fn a_partitioned_holder_is_told_before_its_permit_passes_on() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let proxy = FaultProxy::start(&endpoint).unwrap();
    let cut = Etcd::with_options(&[proxy.endpoint()], EtcdOptions::default()).unwrap();
    let etcd = common::connect(&endpoint);
    let doomed_sem = Semaphore::with_options(&cut, "part", 2, short_ttl()).unwrap();
    let doomed = doomed_sem.acquire().unwrap();
    let other = Semaphore::with_options(&etcd, "part", 2, short_ttl()).unwrap();
    let _other = other.acquire().unwrap();
    let waiter = Semaphore::with_options(&etcd, "part", 2, short_ttl()).unwrap();
    let waiting = thread::spawn(move || {
        let guard = waiter.acquire().unwrap();
        (Instant::now(), guard, waiter)
    });
    wait_for_keys(&endpoint, "/coord/semaphore/part/", 3);
    let cut_at = Instant::now();
    proxy.set_mode(Mode::Blackhole);
    doomed.lost().recv_timeout(WAIT).expect("lost() fires");
    let lost_at = Instant::now();
    assert!(!doomed.is_held());
    let (held_at, guard, _waiter) = waiting.join().unwrap();
    println!(
        "partition -> lost {:?}, -> next holder {:?}",
        lost_at - cut_at,
        held_at - cut_at
    );
    assert!(
        lost_at < held_at,
        "the waiter held before the partitioned holder knew"
    );
    assert!(
        held_at - cut_at < Duration::from_secs(2 * 2 + 2),
        "the freed permit took {:?}",
        held_at - cut_at
    );
    assert!(guard.is_held());
    proxy.set_mode(Mode::Pass);
}

/// etcd frozen past the TTL: on resume it expires every lease. Both
/// holders are told before anyone holds again, and the waiter (its session
/// re-granted) holds within a bound after the resume.
#[test]
fn a_frozen_etcd_ends_every_permit_before_any_is_held_again() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let a = Semaphore::with_options(&etcd, "frozen", 2, short_ttl()).unwrap();
    let b = Semaphore::with_options(&etcd, "frozen", 2, short_ttl()).unwrap();
    let ga = a.acquire().unwrap();
    let gb = b.acquire().unwrap();
    let waiter = Semaphore::with_options(&etcd, "frozen", 2, short_ttl()).unwrap();
    let waiting = thread::spawn(move || {
        let guard = waiter.acquire().unwrap();
        (Instant::now(), guard, waiter)
    });
    wait_for_keys(&endpoint, "/coord/semaphore/frozen/", 3);
    server.pause().unwrap();
    thread::sleep(Duration::from_secs(4));
    ga.lost().recv_timeout(WAIT).expect("a's lost() fires");
    gb.lost().recv_timeout(WAIT).expect("b's lost() fires");
    let both_lost = Instant::now();
    assert!(!waiting.is_finished(), "a holder while etcd is frozen");
    let resumed = Instant::now();
    server.resume().unwrap();
    let (held_at, guard, _waiter) = waiting.join().unwrap();
    assert!(both_lost < held_at);
    assert!(
        held_at - resumed < Duration::from_secs(2 * 2 + 2),
        "a permit was free for {:?} after the resume",
        held_at - resumed
    );
    assert!(guard.is_held());
}
