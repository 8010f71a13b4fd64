//! How `Leadership` handles behave when users hold, drop and race them:
//! regressions for a self-deadlock in `campaign_timeout` and for a stale
//! handle resigning a newer leadership.

mod common;

use fleetcoord::{Election, Error};
use std::time::Duration;

// Generous bounds: the operations take milliseconds; these only turn a hang
// into a failure on a loaded machine.
const WAIT: Duration = Duration::from_secs(20);

#[test]
fn campaign_timeout_racing_its_own_win_never_hangs() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let election = Election::new(&etcd, "race").expect("election");
    // Tiny timeouts make the campaign win right around the moment it is
    // cancelled; the win must then be resigned without deadlocking.
    let (done_tx, done) = crossbeam_channel::bounded(1);
    let worker = std::thread::spawn(move || {
        let mut wins = 0;
        for i in 0..300u64 {
            match election.campaign_timeout(b"v", Duration::from_micros(50 + (i % 40) * 100)) {
                Ok(leadership) => {
                    wins += 1;
                    leadership.resign().expect("resign");
                }
                Err(Error::Timeout(_)) => {}
                Err(e) => panic!("iteration {i}: {e}"),
            }
        }
        let _ = done_tx.send(wins);
        election
    });
    let wins = done
        .recv_timeout(Duration::from_secs(120))
        .expect("campaign_timeout loop hung (deadlock)");
    let election = worker.join().expect("worker");
    println!("{wins} of 300 tiny-timeout campaigns won");
    // Whatever happened, nothing is left behind (the last timed-out
    // campaign's key is removed in the background, within a round trip or
    // two) and the election still works.
    let gave_up = std::time::Instant::now();
    while election.leader().expect("leader").is_some() {
        assert!(
            gave_up.elapsed() < Duration::from_secs(2),
            "a timed-out campaign's key is still queued after 2 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let l = election
        .campaign_timeout(b"final", WAIT)
        .expect("campaign after the loop");
    assert!(l.is_held());
}

#[test]
fn dropping_a_lost_leadership_does_not_resign_the_new_one() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let election = Election::new(&etcd, "stale").expect("election");
    let first = election.campaign(b"one").expect("first campaign");
    // Depose it from outside: delete the candidate key.
    common::etcdctl(&endpoint, &["del", first.key()]);
    first
        .lost()
        .recv_timeout(WAIT)
        .expect("lost() fires when the key is deleted");
    assert!(!first.is_held());

    let second = election.campaign(b"two").expect("second campaign");
    assert!(second.fencing_token() > first.fencing_token());
    drop(first);
    // Give a wrongly sent resign time to land before checking.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        second.is_held(),
        "dropping the stale handle ended the new leadership"
    );
    let leader = election.leader().expect("leader").expect("someone leads");
    assert_eq!(
        (leader.token, leader.value),
        (second.fencing_token(), b"two".to_vec())
    );
    assert!(second.lost().try_recv().is_err());
}

#[test]
fn try_campaign_against_an_unreachable_etcd_times_out() {
    use fleetcoord::testing::{FaultProxy, Mode};
    use fleetcoord::{Etcd, EtcdOptions};
    let server = common::start_etcd();
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let options = EtcdOptions::default().with_request_timeout(Duration::from_secs(1));
    let etcd = Etcd::with_options(&[proxy.endpoint()], options).expect("connect");
    // Cut the network before the session can be granted: the try-campaign
    // can then neither win nor lose, and must give up (3 request timeouts).
    proxy.set_mode(Mode::Blackhole);
    proxy.reset_all();
    let election = Election::new(&etcd, "unreachable").expect("election");
    let started = std::time::Instant::now();
    match election.try_campaign(b"v") {
        Err(Error::Timeout(bound)) => assert_eq!(bound, Duration::from_secs(3)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    // The bound plus the cancel's settling time; generous for a busy machine.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_blocked_campaign_returns_when_the_connection_closes() {
    let server = common::start_etcd();
    let leader_etcd = common::connect(&server.endpoint());
    let leader = Election::new(&leader_etcd, "closing").expect("election");
    let _held = leader.campaign(b"first").expect("first leads");

    let etcd = common::connect(&server.endpoint());
    let waiting = Election::new(&etcd, "closing").expect("election");
    let (done_tx, done) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let _ = done_tx.send(waiting.campaign(b"second").map(|_| ()));
    });
    std::thread::sleep(Duration::from_millis(300));
    etcd.close().expect("close");
    // The waiting campaign must end (with an error: it never led), not hang.
    let result = done
        .recv_timeout(WAIT)
        .expect("campaign still blocked after the connection closed");
    assert!(
        result.is_err(),
        "a campaign behind a live leader cannot succeed"
    );
}

/// The fence and the accessors of a leadership, through its whole life:
/// its writes apply while it leads, are refused by etcd once a newer leader
/// holds, and a lost leadership can neither proclaim nor resign anything.
#[test]
fn a_leadership_fences_its_writes_and_a_lost_one_refuses_to_act() {
    use fleetcoord::{ElectionOptions, LivenessState, Mutex, TxnOp, TxnOpResponse};
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let options = ElectionOptions::default()
        .with_ttl(Duration::from_secs(4))
        .with_safety_margin(Duration::from_millis(500))
        .with_drift_allowance_ppm(50_000);
    // 4 s less 5 % less 500 ms.
    assert_eq!(options.trusted_lifetime(), Duration::from_millis(3_300));
    let election = Election::with_options(&etcd, "fenced", options.clone()).expect("election");
    assert!(format!("{election:?}").contains("fenced/"), "{election:?}");
    assert_eq!(
        Election::leader_of(&etcd, "fenced", &options).unwrap(),
        None
    );
    let observer = Election::observe_of(&etcd, "fenced", &options).expect("observe");
    assert!(format!("{observer:?}").starts_with("LeaderObserver"));
    assert_eq!(observer.leaders().recv_timeout(WAIT).unwrap(), None);

    let leadership = election.campaign(b"a").expect("campaign");
    assert!(matches!(
        election.session(),
        Some(LivenessState::Registered { .. })
    ));
    let shown = format!("{leadership:?}");
    assert!(shown.contains("held: true"), "{shown}");
    leadership.proclaim(b"a2").expect("proclaim");
    let leader = Election::leader_of(&etcd, "fenced", &options)
        .unwrap()
        .expect("a leads");
    assert_eq!(
        (leader.value, leader.token),
        (b"a2".to_vec(), leadership.fencing_token())
    );
    let written = leadership
        .txn_if_leader([
            TxnOp::put("/fenced/owner", "a"),
            TxnOp::get("/fenced/owner"),
        ])
        .expect("fenced txn")
        .expect("applied while leading");
    assert_eq!(written[0], TxnOpResponse::Put);
    assert!(matches!(&written[1], TxnOpResponse::Get { kvs } if kvs[0].value == b"a"));

    // Somebody deletes the candidate key: leadership is lost, and the
    // stale handle's fenced write is refused by etcd, applying nothing.
    common::etcdctl(&server.endpoint(), &["del", leadership.key()]);
    leadership.lost().recv_timeout(WAIT).expect("lost");
    assert!(!leadership.is_held());
    assert!(format!("{leadership:?}").contains("held: false"));
    assert_eq!(
        leadership
            .txn_if_leader([TxnOp::put("/fenced/owner", "stale")])
            .expect("fenced txn"),
        None
    );
    assert!(matches!(
        leadership.proclaim(b"late"),
        Err(Error::NotLeader)
    ));
    // Nothing to resign: the machine no longer has it.
    leadership
        .resign()
        .expect("a lost leadership resigns as a no-op");
    let owner = common::etcdctl(
        &server.endpoint(),
        &["get", "/fenced/owner", "--print-value-only"],
    );
    assert_eq!(owner.trim(), "a");

    // The mutex face of the same protocol.
    let lock_options = fleetcoord::LockOptions::default()
        .with_ttl(options.session.ttl)
        .with_safety_margin(options.session.safety_margin)
        .with_drift_allowance_ppm(options.session.drift_allowance_ppm);
    assert_eq!(lock_options.trusted_lifetime(), options.trusted_lifetime());
    let mutex = Mutex::with_options(&etcd, "fenced-lock", lock_options).expect("mutex");
    let guard = mutex
        .try_lock()
        .expect("try_lock")
        .expect("nobody holds it");
    assert!(guard.is_held());
    assert!(matches!(
        mutex.session(),
        Some(LivenessState::Registered { .. })
    ));
    guard.unlock().expect("unlock");
    mutex.close().expect("close");
    election.close().expect("close");
}

/// A fenced write that etcd refuses is the holder's first evidence that its
/// key is gone (etcd may revoke a lease early, and the election's own
/// watch can lag behind): on every face of the protocol, the holding ends
/// before the refused call returns. The key is deleted from outside, then
/// the write is tried at once, before anything else can be waited for.
#[test]
fn a_refused_fenced_write_ends_the_holding_before_it_returns() {
    use fleetcoord::{ElectionPool, Mutex, Semaphore, TxnOp};
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let put = || [TxnOp::put("/refused/owner", "stale")];

    let election = Election::new(&etcd, "refused").expect("election");
    let leadership = election.campaign(b"a").expect("campaign");
    common::etcdctl(&endpoint, &["del", leadership.key()]);
    assert_eq!(leadership.txn_if_leader(put()).expect("txn"), None);
    assert!(!leadership.is_held(), "election: still believed");
    assert_eq!(leadership.lost().try_recv(), Ok(()), "election: lost()");

    let pool = ElectionPool::new(&etcd);
    let pooled = pool.campaign("refused-pool", b"a").expect("pool campaign");
    common::etcdctl(&endpoint, &["del", pooled.key()]);
    assert_eq!(pooled.txn_if_leader(put()).expect("txn"), None);
    assert!(!pooled.is_held(), "pool: still believed");
    assert_eq!(pooled.lost().try_recv(), Ok(()), "pool: lost()");

    let mutex = Mutex::new(&etcd, "refused-lock").expect("mutex");
    let guard = mutex.lock().expect("lock");
    common::etcdctl(&endpoint, &["del", guard.key()]);
    assert_eq!(guard.txn_if_held(put()).expect("txn"), None);
    assert!(!guard.is_held(), "mutex: still believed");
    assert_eq!(guard.lost().try_recv(), Ok(()), "mutex: lost()");

    let semaphore = Semaphore::new(&etcd, "refused-permits", 2).expect("semaphore");
    let permit = semaphore.acquire().expect("acquire");
    common::etcdctl(&endpoint, &["del", permit.key()]);
    assert_eq!(permit.txn_if_held(put()).expect("txn"), None);
    assert!(!permit.is_held(), "semaphore: still believed");
    assert_eq!(permit.lost().try_recv(), Ok(()), "semaphore: lost()");

    let written = common::etcdctl(&endpoint, &["get", "/refused/owner"]);
    assert!(
        written.trim().is_empty(),
        "a refused write applied: {written}"
    );
}

/// A fenced write waits no longer than the leadership may be believed:
/// with etcd unreachable and a request timeout longer than the TTL, it
/// gives up at the trusted deadline, not at the request timeout; and once
/// belief is over it sends nothing and answers at once.
#[test]
fn a_fenced_write_waits_at_most_until_the_trusted_deadline() {
    use fleetcoord::testing::{FaultProxy, Mode};
    use fleetcoord::{ElectionOptions, Etcd, EtcdOptions, TxnOp};
    let server = common::start_etcd();
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let request_timeout = Duration::from_secs(8);
    let options = EtcdOptions::default().with_request_timeout(request_timeout);
    let etcd = Etcd::with_options(&[proxy.endpoint()], options).expect("connect");
    let election_options = ElectionOptions::default().with_ttl(Duration::from_secs(2));
    let trusted = election_options.trusted_lifetime();
    let election = Election::with_options(&etcd, "bounded", election_options).expect("election");
    let leadership = election.campaign(b"a").expect("campaign");
    proxy.set_mode(Mode::Blackhole);
    let started = std::time::Instant::now();
    match leadership.txn_if_leader([TxnOp::put("/bounded/owner", "a")]) {
        Err(Error::Timeout(after)) => assert!(after <= trusted, "{after:?} > {trusted:?}"),
        other => panic!("expected a timeout at the trusted deadline, got {other:?}"),
    }
    let took = started.elapsed();
    // The trusted deadline plus a scheduling slack, far below the 8 s timeout.
    assert!(
        took <= trusted + Duration::from_millis(500),
        "waited {took:?}, trusted for {trusted:?}"
    );
    assert!(!leadership.is_held());
    let again = std::time::Instant::now();
    assert_eq!(
        leadership
            .txn_if_leader([TxnOp::put("/bounded/owner", "a")])
            .expect("not held: no request"),
        None
    );
    assert!(
        again.elapsed() < Duration::from_millis(50),
        "{:?}",
        again.elapsed()
    );
}

/// A delete of the holder's key that another watch of the same `Etcd`
/// sees first (here the election's own observer: etcd orders events
/// within one watch only) ends the holding before that watch's consumer
/// hears of it: whoever reads "no leader" from the observer finds the
/// leadership over, on every round, whichever watch etcd served first.
#[test]
fn a_delete_seen_by_another_watch_of_the_handle_ends_the_holding_first() {
    const ROUNDS: usize = 100;
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let election = Election::new(&etcd, "foreign-delete").expect("election");
    let observer = election.observe().expect("observe");
    let leaders = observer.leaders();
    assert!(leaders.recv_timeout(WAIT).expect("first answer").is_none());
    let started = std::time::Instant::now();
    let mut believed_after = 0;
    for round in 0..ROUNDS {
        let leadership = election.campaign(b"a").expect("campaign");
        // Up to the observer's report of this leadership.
        loop {
            let seen = leaders.recv_timeout(WAIT).expect("observer: the leader");
            if seen.is_some_and(|l| l.token == leadership.fencing_token()) {
                break;
            }
        }
        common::etcdctl(&endpoint, &["del", leadership.key()]);
        let seen = leaders.recv_timeout(WAIT).expect("observer: the delete");
        assert!(
            seen.is_none(),
            "round {round}: no candidate is left: {seen:?}"
        );
        // Read at once: the consumer of the other watch just heard of it.
        let held = leadership.is_held();
        let lost = leadership.lost().try_recv().is_ok();
        if held || !lost {
            believed_after += 1;
            eprintln!("round {round}: held {held}, lost() fired {lost}");
        }
        // Liveness, had it not: the loss reaches the handle within WAIT.
        let until = std::time::Instant::now() + WAIT;
        while leadership.is_held() {
            assert!(
                std::time::Instant::now() < until,
                "round {round}: the holding outlived the delete by {WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert_eq!(
        believed_after, 0,
        "{believed_after} of {ROUNDS} rounds: the observer told the delete while the holder still believed"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{ROUNDS} rounds took {:?}",
        started.elapsed()
    );
}
