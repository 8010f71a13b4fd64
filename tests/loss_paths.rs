//! What a user sees on each path by which a leadership or a campaign ends
//! other than by its own success, against a real etcd: the error's kind
//! says what happened, and `is_retryable()` whether the same call can
//! succeed. Paths: the session lost (own session and shared; a campaign
//! at the loss, a proclaim in flight across it), the lease revoked by
//! etcd, the session or election closed, the session detached (handed to
//! the next process), a leadership superseded by a newer one, a cancel
//! racing a win, and a campaign or proclaim asked while an earlier one
//! still runs.
//!
//! The session-loss test campaigns again the instant `is_held()` turns
//! false, which is before the driver's timer reports the loss: that
//! campaign reached the machine while it still led, and came back as
//! `etcd request failed: election: Busy` (not retryable, blaming etcd).

mod common;

use common::{connect, etcdctl, start_etcd};
use fleetcoord::testing::{FaultProxy, Mode};
use fleetcoord::{
    Election, ElectionOptions, Error, ErrorKind, Etcd, EtcdOptions, Leadership, Session,
};
use std::thread;
use std::time::{Duration, Instant};

/// Loss trials per session kind: each hits the window between the
/// caller's deadline and the driver's report of it.
const TRIALS: usize = 3;

/// How long a campaign may take to win again once etcd is reachable: a
/// new lease is granted, then the campaign runs on it.
const HEAL: Duration = Duration::from_secs(15);

fn kind_and_retry(e: &Error) -> (ErrorKind, bool) {
    (e.kind(), e.is_retryable())
}

/// Cuts `proxy` off until `leadership` stops being believed, then (at that
/// instant, before the driver can report the loss) starts the next
/// campaign and lets etcd through again. The campaign must win on the
/// session's next lease: not fail, and above all not as `Busy`.
fn campaign_at_the_loss(election: &Election, proxy: &FaultProxy, leadership: &Leadership) {
    proxy.set_mode(Mode::Blackhole);
    let cut = Instant::now();
    while leadership.is_held() {
        assert!(
            cut.elapsed() < Duration::from_secs(10),
            "belief outlived the cut by 10 s"
        );
        std::hint::spin_loop();
    }
    let pending = election.start_campaign(b"again");
    proxy.set_mode(Mode::Pass);
    let pending = pending.expect("a campaign right after the loss starts");
    match pending.wait_timeout(HEAL) {
        Ok(Some(again)) => {
            assert!(again.is_held());
            assert_ne!(again.fencing_token(), leadership.fencing_token());
            // The old handle is over for good.
            assert!(!leadership.is_held());
            again.resign().expect("resign");
        }
        Ok(None) => panic!("no win within {HEAL:?} of the heal"),
        Err(e) => panic!(
            "a campaign right after the session loss failed: {e} (kind {:?}, retryable {})",
            e.kind(),
            e.is_retryable()
        ),
    }
}

fn short_session() -> ElectionOptions {
    let mut options = ElectionOptions::default().with_ttl(Duration::from_secs(1));
    options.session = options
        .session
        .with_safety_margin(Duration::from_millis(200));
    options
}

#[test]
fn a_campaign_at_the_instant_of_an_own_session_loss_wins_on_the_next_lease() {
    let server = start_etcd();
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let etcd = connect(&proxy.endpoint());
    let election = Election::with_options(&etcd, "own", short_session()).expect("election");
    for _ in 0..TRIALS {
        let leadership = election.campaign(b"first").expect("elected");
        campaign_at_the_loss(&election, &proxy, &leadership);
    }
}

#[test]
fn a_campaign_at_the_instant_of_a_shared_session_loss_wins_on_the_next_lease() {
    let server = start_etcd();
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let etcd = connect(&proxy.endpoint());
    let options = fleetcoord::SessionOptions::default()
        .with_ttl(Duration::from_secs(1))
        .with_safety_margin(Duration::from_millis(200));
    let session = Session::with_options(&etcd, options).expect("session");
    let election =
        Election::with_session(&session, "shared", ElectionOptions::default()).expect("election");
    // Other primitives on the session: the session ends every belief on
    // it before it tells any of them.
    let mutex =
        fleetcoord::Mutex::with_session(&session, "job", Default::default()).expect("mutex");
    for _ in 0..TRIALS {
        let leadership = election.campaign(b"first").expect("elected");
        campaign_at_the_loss(&election, &proxy, &leadership);
    }
    // The same after `lost()`, with the old handle dropped first (the
    // README's loop): the session's loss ended its belief, so the drop
    // sends no resign, and the campaign again reaches a machine that may
    // not have heard of the loss.
    for _ in 0..TRIALS {
        let leadership = election.campaign(b"first").expect("elected");
        proxy.set_mode(Mode::Blackhole);
        leadership
            .lost()
            .recv_timeout(Duration::from_secs(10))
            .expect("lost() fires");
        drop(leadership);
        let pending = election.start_campaign(b"again");
        proxy.set_mode(Mode::Pass);
        let won = pending
            .expect("started")
            .wait_timeout(HEAL)
            .unwrap_or_else(|e| panic!("{e} ({:?})", e.kind()))
            .expect("won within the heal");
        won.resign().expect("resign");
    }
    drop(mutex);
    session.close().expect("close");
}

/// etcd revokes the lease (an operator): the leadership ends, its handle
/// refuses work as `NotLeader` (not retryable: campaign again), and a
/// campaign again wins on the next lease.
#[test]
fn a_revoked_lease_ends_the_leadership_as_not_leader() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let session = Session::new(&etcd, Duration::from_secs(5)).expect("session");
    let election =
        Election::with_session(&session, "revoked", ElectionOptions::default()).expect("election");
    let leadership = election.campaign(b"a").expect("elected");
    etcdctl(
        &server.endpoint(),
        &["lease", "revoke", &format!("{:x}", leadership.lease())],
    );
    leadership
        .lost()
        .recv_timeout(Duration::from_secs(5))
        .expect("lost() fires");
    let refused = leadership.proclaim(b"b").expect_err("over");
    assert_eq!(kind_and_retry(&refused), (ErrorKind::NotLeader, false));
    assert_eq!(leadership.txn_if_leader([]).expect("no request"), None);
    let again = election
        .campaign_timeout(b"c", HEAL)
        .expect("a campaign after the revoke wins");
    assert_ne!(again.lease(), leadership.lease(), "on the next lease");
    // The stale handle still answers as over, never as the new one.
    let stale = leadership.hand_over(b"x").expect_err("stale");
    assert_eq!(kind_and_retry(&stale), (ErrorKind::NotLeader, false));
    leadership.resign().expect("a stale resign does nothing");
    assert!(again.is_held(), "the stale resign ended nothing");
    again.resign().expect("resign");
    session.close().expect("close");
}

/// Closing the session (or the election) while a campaign waits behind
/// another candidate: the wait ends with `Closed`, not retryable.
#[test]
fn closing_ends_a_waiting_campaign_as_closed() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let theirs = connect(&server.endpoint());
    let leader = Election::new(&theirs, "closed").expect("leader election");
    let held = leader.campaign(b"leader").expect("leader");
    let session = Session::new(&etcd, Duration::from_secs(5)).expect("session");
    let election =
        Election::with_session(&session, "closed", ElectionOptions::default()).expect("election");
    let pending = election.start_campaign(b"waiting").expect("queued");
    assert!(pending
        .wait_timeout(Duration::from_millis(200))
        .expect("queued")
        .is_none());
    let (_stop_tx, stop) = crossbeam_channel::bounded::<()>(0);
    let waiter = thread::spawn(move || pending.wait_until(&stop).map(|won| won.is_some()));
    thread::sleep(Duration::from_millis(100));
    session.close().expect("close");
    let closed = waiter.join().expect("waiter").expect_err("closed");
    assert_eq!(kind_and_retry(&closed), (ErrorKind::Closed, false));
    let after = election.start_campaign(b"again").expect_err("closed");
    assert_eq!(kind_and_retry(&after), (ErrorKind::Closed, false));

    let own = Election::new(&etcd, "closed").expect("own election");
    let pending = own.start_campaign(b"waiting").expect("queued");
    own.close().expect("close");
    let closed = pending.wait().expect_err("closed");
    assert_eq!(kind_and_retry(&closed), (ErrorKind::Closed, false));
    held.resign().expect("resign");
}

/// A cancel racing the win: the wait ends `Canceled` (not retryable),
/// the cancel returns once etcd confirmed, and no leadership is left
/// behind, whichever of the two etcd saw first.
#[test]
fn a_cancel_racing_a_win_is_canceled_and_leaves_no_leader() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let theirs = connect(&server.endpoint());
    let leader = Election::new(&theirs, "race").expect("leader election");
    let election = Election::new(&etcd, "race").expect("election");
    for round in 0..5u64 {
        let held = leader.campaign(b"leader").expect("leader");
        let pending = election.start_campaign(b"racer").expect("queued");
        assert!(pending
            .wait_timeout(Duration::from_millis(100))
            .expect("queued")
            .is_none());
        // The resign frees the queue; the cancel follows after a delay
        // that moves across the win from round to round.
        let resign = thread::spawn(move || held.resign());
        thread::sleep(Duration::from_micros(500 * round));
        pending.cancel().expect("cancel confirmed");
        resign.join().expect("resign").expect("resigned");
        let canceled = pending.wait().expect_err("canceled");
        assert_eq!(kind_and_retry(&canceled), (ErrorKind::Canceled, false));
        // Nobody leads: a won campaign was resigned for the cancel.
        let deadline = Instant::now() + Duration::from_secs(5);
        while election.leader().expect("read").is_some() {
            assert!(Instant::now() < deadline, "a canceled win still leads");
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A campaign asked while this election's leadership is still held is
/// the caller's mistake, said as such (it would otherwise wait for a
/// leadership the caller keeps); a proclaim asked while an earlier one,
/// timed out, still waits for etcd is `Unavailable`, retryable.
#[test]
fn operations_asked_while_another_runs_say_so() {
    let server = start_etcd();
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let options = EtcdOptions::default().with_request_timeout(Duration::from_millis(200));
    let etcd = Etcd::with_options(&[proxy.endpoint()], options).expect("connect");
    let election = Election::with_options(
        &etcd,
        "busy",
        ElectionOptions::default().with_ttl(Duration::from_secs(10)),
    )
    .expect("election");
    let leadership = election.campaign(b"a").expect("elected");
    let again = election
        .campaign_timeout(b"b", Duration::from_secs(1))
        .expect_err("held");
    assert_eq!(kind_and_retry(&again), (ErrorKind::InvalidArgument, false));
    assert!(again.to_string().contains("held already"), "{again}");
    assert!(leadership.is_held(), "the refusal ended nothing");

    proxy.set_mode(Mode::Blackhole);
    let first = leadership.proclaim(b"b").expect_err("no answer");
    assert_eq!(kind_and_retry(&first), (ErrorKind::Timeout, true));
    let second = leadership.proclaim(b"c").expect_err("the first still runs");
    assert_eq!(
        kind_and_retry(&second),
        (ErrorKind::Unavailable, true),
        "{second}"
    );
    assert!(!second.to_string().contains("Busy"), "{second}");
    proxy.set_mode(Mode::Pass);
    drop(leadership);
    election.close().ok();
}

/// A leadership's proclaim in flight when its session is lost (etcd cut
/// off until the session's local deadline passes): the proclaim ends as
/// the loss, `SessionLost`, within the session's trusted lifetime plus
/// slack, not at the proclaim's own bound (three request timeouts); the
/// handle then refuses work as `NotLeader`.
#[test]
fn a_proclaim_in_flight_when_the_session_is_lost_fails_as_session_lost() {
    let server = start_etcd();
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let etcd = connect(&proxy.endpoint());
    let options = fleetcoord::SessionOptions::default()
        .with_ttl(Duration::from_secs(1))
        .with_safety_margin(Duration::from_millis(200));
    let session = Session::with_options(&etcd, options).expect("session");
    let election =
        Election::with_session(&session, "inflight", ElectionOptions::default()).expect("election");
    let leadership = election.campaign(b"a").expect("elected");
    proxy.set_mode(Mode::Blackhole);
    let started = Instant::now();
    let failed = leadership.proclaim(b"b").expect_err("lost");
    let took = started.elapsed();
    assert_eq!(
        kind_and_retry(&failed),
        (ErrorKind::SessionLost, true),
        "{failed}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(!leadership.is_held());
    let again = leadership.proclaim(b"c").expect_err("over");
    assert_eq!(kind_and_retry(&again), (ErrorKind::NotLeader, false));
    proxy.set_mode(Mode::Pass);
    drop(leadership);
    session.close().ok();
}

/// `Session::detach` (a process handing its lease to the next one): a
/// campaign waiting on the session ends `Closed`, its leadership ends
/// before the detach returns (`NotLeader` from then on), and later calls
/// on the election are `Closed`; none is retryable in this process.
#[test]
fn a_detached_session_ends_waits_as_closed_and_leaderships_as_not_leader() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let theirs = connect(&server.endpoint());
    let session = Session::new(&etcd, Duration::from_secs(5)).expect("session");
    let leading =
        Election::with_session(&session, "detach-a", ElectionOptions::default()).expect("a");
    let leadership = leading.campaign(b"a").expect("elected");
    let other = Election::new(&theirs, "detach-b").expect("their election");
    let held = other.campaign(b"theirs").expect("theirs leads");
    let waiting =
        Election::with_session(&session, "detach-b", ElectionOptions::default()).expect("b");
    let pending = waiting.start_campaign(b"waiting").expect("queued");
    let (_stop_tx, stop) = crossbeam_channel::bounded::<()>(0);
    let waiter = thread::spawn(move || {
        let result = pending.wait_until(&stop).map(|won| won.is_some());
        (result, Instant::now())
    });
    thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let saved = session.detach().expect("detach");
    let returned = Instant::now();
    assert!(
        returned - started < Duration::from_secs(2),
        "detach took too long"
    );
    assert!(!leadership.is_held(), "a leadership outlived the detach");
    let (waited, woke) = waiter.join().expect("waiter");
    let closed = waited.expect_err("closed");
    assert_eq!(kind_and_retry(&closed), (ErrorKind::Closed, false));
    assert!(
        woke - started < Duration::from_secs(2),
        "the wait outlived the detach"
    );
    let refused = leadership.proclaim(b"b").expect_err("over");
    assert_eq!(kind_and_retry(&refused), (ErrorKind::NotLeader, false));
    let after = leading.start_campaign(b"again").expect_err("closed");
    assert_eq!(kind_and_retry(&after), (ErrorKind::Closed, false));
    let again = session.detach().expect_err("detached already");
    assert_eq!(kind_and_retry(&again), (ErrorKind::Closed, false));
    session
        .close()
        .expect("a close after a detach leaves the lease alone");
    // Nothing of either election is left on the lease handed over.
    for name in ["detach-a", "detach-b"] {
        let keys = common::etcdctl_keys(&server.endpoint(), &format!("/coord/election/{name}/"));
        assert!(
            keys.iter()
                .all(|k| !k.ends_with(&format!("{:x}", saved.lease))),
            "{name}: {keys:?}"
        );
    }
    held.resign().expect("resign");
    drop(leadership);
}

/// `Session::detach` while etcd is cut off: the election's key cannot be
/// deleted, so the lease is not handed over (it would carry the key).
/// The detach fails, bounded, as `Unavailable` (retryable with a new
/// session), saying so, and the session is closed. A detach before the
/// session has a lease changes nothing and is `SessionLost` (retryable).
#[test]
fn a_detach_cut_off_from_etcd_hands_nothing_over_and_says_so() {
    let server = start_etcd();
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let etcd = connect(&proxy.endpoint());
    proxy.set_mode(Mode::Blackhole);
    let session = Session::new(&etcd, Duration::from_secs(5)).expect("session");
    let early = session.detach().expect_err("no lease yet");
    assert_eq!(kind_and_retry(&early), (ErrorKind::SessionLost, true));
    proxy.set_mode(Mode::Pass);
    let election =
        Election::with_session(&session, "cut", ElectionOptions::default()).expect("election");
    let leadership = election.campaign(b"a").expect("elected");
    proxy.set_mode(Mode::Blackhole);
    let started = Instant::now();
    let failed = session.detach().expect_err("nothing can be handed over");
    let took = started.elapsed();
    eprintln!(
        "detach cut off: {failed} ({:?}, retryable {}) after {took:?}",
        failed.kind(),
        failed.is_retryable()
    );
    assert_eq!(kind_and_retry(&failed), (ErrorKind::Unavailable, true));
    assert!(failed.to_string().contains("not handed over"), "{failed}");
    assert!(!leadership.is_held(), "the leadership outlived the detach");
    assert!(took < Duration::from_secs(22), "took {took:?}");
    let again = session.detach().expect_err("closed");
    assert_eq!(kind_and_retry(&again), (ErrorKind::Closed, false));
    proxy.set_mode(Mode::Pass);
    drop(leadership);
}
