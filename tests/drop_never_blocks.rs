//! Dropping a guard never waits for etcd: `drop(Leadership)`,
//! `drop(HostLiveness)` and `drop(ElectionPool)` hand the resign/revoke to
//! the driver and return, even with etcd paused (before, they blocked for
//! up to 10 s). The handover still happens: at once when etcd answers, and
//! when the process closes its `Etcd` handle right after dropping.

mod common;

use fleetcoord::{Election, ElectionPool, HostEvent, HostLiveness, HostWatcher};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The bound the guards' drops must meet with etcd paused.
const DROP_BOUND: Duration = Duration::from_millis(100);
/// Generous: the handovers take milliseconds.
const WAIT: Duration = Duration::from_secs(15);

fn timed_drop<T>(guard: T) -> Duration {
    let started = Instant::now();
    drop(guard);
    started.elapsed()
}

#[test]
fn drops_return_at_once_with_etcd_paused() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let election = Election::new(&etcd, "paused").expect("election");
    let leadership = election.campaign(b"me").expect("campaign");
    let host = HostLiveness::register(&etcd, Uuid::new_v4(), b"{}", Duration::from_secs(5))
        .expect("register");
    let pool = ElectionPool::new(&etcd);
    let pooled = pool.campaign("pooled", b"me").expect("pool campaign");

    server.pause().expect("pause etcd");
    let leadership_drop = timed_drop(leadership);
    let liveness_drop = timed_drop(host);
    let pooled_drop = timed_drop(pooled);
    let pool_drop = timed_drop(pool);
    server.resume().expect("resume etcd");
    println!(
        "with etcd paused: drop(Leadership) {leadership_drop:?}, drop(HostLiveness) \
         {liveness_drop:?}, drop(pooled Leadership) {pooled_drop:?}, drop(ElectionPool) {pool_drop:?}"
    );
    for (what, took) in [
        ("Leadership", leadership_drop),
        ("HostLiveness", liveness_drop),
        ("pooled Leadership", pooled_drop),
        ("ElectionPool", pool_drop),
    ] {
        assert!(
            took < DROP_BOUND,
            "drop({what}) blocked {took:?} with etcd paused"
        );
    }
    // Once etcd answers again the handed-over resign goes through: the
    // election is free long before the session's TTL would free it.
    let deadline = Instant::now() + WAIT;
    while election.leader().expect("leader").is_some() {
        assert!(
            Instant::now() < deadline,
            "the dropped leadership never resigned"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_dropped_leadership_hands_over_at_once() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let election = Election::new(&etcd, "handover").expect("election");
    let other_etcd = common::connect(&server.endpoint());
    let other = Election::new(&other_etcd, "handover").expect("other election");
    let first = election.campaign(b"one").expect("first");
    let waiter = std::thread::spawn(move || {
        let l = other.campaign(b"two").expect("second campaign");
        (Instant::now(), l.fencing_token())
    });
    std::thread::sleep(Duration::from_millis(300));
    let token = first.fencing_token();
    let dropped_at = Instant::now();
    drop(first);
    // The same election campaigns again at once: it queues behind the
    // resign instead of failing as busy.
    let again = election.campaign_timeout(b"three", WAIT);
    let (elected_at, second_token) = waiter.join().expect("waiter");
    let handover = elected_at.duration_since(dropped_at);
    println!("dropped leadership -> next leader in {handover:?}");
    assert!(second_token > token);
    assert!(
        handover < Duration::from_secs(5),
        "handover took {handover:?}"
    );
    // `again` either waits behind "two" or timed out; it must not be an error
    // other than the timeout.
    match again {
        Ok(l) => assert!(l.fencing_token() > second_token),
        Err(fleetcoord::Error::Timeout(_)) => {}
        Err(e) => panic!("campaign right after a drop failed: {e}"),
    }
}

#[test]
fn dropping_guards_then_the_handle_still_revokes() {
    let server = common::start_etcd();
    let watch_etcd = common::connect(&server.endpoint());
    let watcher = HostWatcher::watch(&watch_etcd).expect("watch");
    let etcd = common::connect(&server.endpoint());
    let id = Uuid::new_v4();
    let host = HostLiveness::register(&etcd, id, b"{}", Duration::from_secs(30)).expect("register");
    let leadership = Election::new(&etcd, "exit")
        .expect("election")
        .campaign(b"me")
        .expect("campaign");
    // What a process does on its way out: drop everything, handle last.
    drop(leadership);
    drop(host);
    let closed_at = Instant::now();
    drop(etcd);
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match watcher
            .events()
            .recv_timeout(left)
            .expect("no Down before the deadline")
        {
            HostEvent::Down(info, _) if info.id == id => break,
            _ => {}
        }
    }
    let down_after = closed_at.elapsed();
    println!("guards and handle dropped -> Down seen after {down_after:?} (TTL 30 s)");
    assert!(
        down_after < Duration::from_secs(10),
        "Down only after {down_after:?}: not revoked"
    );
    let observer = Election::new(&watch_etcd, "exit").expect("observer election");
    assert_eq!(
        observer.leader().expect("leader"),
        None,
        "the leadership was not resigned"
    );
}
