//! `Session`: one lease shared by an election, a semaphore and a mutex of
//! one process, against a real etcd. Its loss ends every primitive on it
//! before a contender on another session can win; its close ends them and
//! revokes; a primitive's close leaves the session and the others alone;
//! two primitives with one key on one session are refused.

mod common;

use common::{connect, etcdctl, etcdctl_keys, start_etcd};
use fleetcoord::testing::{FaultProxy, Mode};
use fleetcoord::{
    Election, ElectionPool, Error, LivenessState, LockOptions, Mutex, Semaphore, Session,
};
use std::thread;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(5);

/// Holds an election, a semaphore permit and a mutex on `session`, with a
/// contender for each on `theirs` queued behind; each contender, the
/// moment it is elected, reads whether anything on our session still
/// believes it holds. Returns our three handles (as their `lost()`
/// receivers and `is_held` readers) and the contenders' threads.
struct Scene {
    lost: Vec<crossbeam_channel::Receiver<()>>,
    held: std::sync::Arc<dyn Fn() -> [bool; 3] + Send + Sync>,
    lease: i64,
    contenders: Vec<thread::JoinHandle<(Instant, [bool; 3])>>,
}

fn scene(session: &Session, theirs: &fleetcoord::Etcd) -> Scene {
    let election = Election::with_session(session, "db", Default::default()).expect("election");
    let semaphore =
        Semaphore::with_session(session, "slots", 1, LockOptions::default()).expect("semaphore");
    let mutex = Mutex::with_session(session, "job", LockOptions::default()).expect("mutex");
    let leadership = election.campaign(b"ours").expect("elected");
    let permit = semaphore.acquire().expect("permit");
    let guard = mutex.lock().expect("locked");
    let lease = session.lease().expect("a lease");
    assert_eq!(leadership.lease(), lease);
    let hex = format!("{lease:x}");
    for key in [leadership.key(), permit.key(), guard.key()] {
        assert!(key.ends_with(&format!("/{hex}")), "{key} is not on {hex}");
    }
    let lost = vec![
        leadership.lost().clone(),
        permit.lost().clone(),
        guard.lost().clone(),
    ];
    let ours = std::sync::Mutex::new((election, semaphore, mutex, leadership, permit, guard));
    let held: std::sync::Arc<dyn Fn() -> [bool; 3] + Send + Sync> =
        std::sync::Arc::new(move || {
            let o = ours.lock().expect("not poisoned");
            [o.3.is_held(), o.4.is_held(), o.5.is_held()]
        });
    let e = Election::new(theirs, "db").expect("contender election");
    let s = Semaphore::new(theirs, "slots", 1).expect("contender semaphore");
    let m = Mutex::new(theirs, "job").expect("contender mutex");
    let (h1, h2, h3) = (held.clone(), held.clone(), held.clone());
    let contenders = vec![
        thread::spawn(move || {
            let l = e.campaign(b"theirs").expect("contender elected");
            let seen = (Instant::now(), h1());
            drop(l);
            seen
        }),
        thread::spawn(move || {
            let g = s.acquire().expect("contender permit");
            let seen = (Instant::now(), h2());
            drop(g);
            seen
        }),
        thread::spawn(move || {
            let g = m.lock().expect("contender lock");
            let seen = (Instant::now(), h3());
            drop(g);
            seen
        }),
    ];
    // Let the contenders queue up.
    thread::sleep(Duration::from_millis(300));
    Scene {
        lost,
        held,
        lease,
        contenders,
    }
}

/// When each `lost()` fired, waiting at most `bound`.
fn lost_at(lost: &[crossbeam_channel::Receiver<()>], bound: Duration) -> Vec<Instant> {
    let watchers: Vec<_> = lost
        .iter()
        .cloned()
        .map(|rx| {
            thread::spawn(move || {
                rx.recv_timeout(bound).expect("lost() fires");
                Instant::now()
            })
        })
        .collect();
    watchers
        .into_iter()
        .map(|t| t.join().expect("lost"))
        .collect()
}

/// Our session is cut off from etcd (a partition: every byte dropped), so
/// its lease expires: every leadership and lock on it ends at the session's
/// local deadline, before etcd can expire the lease, and so before any
/// contender on another session and connection is elected.
#[test]
fn a_session_cut_off_from_etcd_ends_every_primitive_on_it_before_a_contender_wins() {
    let server = start_etcd();
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let ours = connect(&proxy.endpoint());
    let theirs = connect(&server.endpoint());
    let session = Session::new(&ours, Duration::from_secs(3)).expect("session");
    let scene = scene(&session, &theirs);
    let cut = Instant::now();
    proxy.set_mode(Mode::Blackhole);
    let lost = lost_at(&scene.lost, Duration::from_secs(10));
    assert_eq!((scene.held)(), [false; 3]);
    let won: Vec<(Instant, [bool; 3])> = scene
        .contenders
        .into_iter()
        .map(|t| t.join().expect("contender"))
        .collect();
    let after = |t: &Instant| t.saturating_duration_since(cut);
    let report = format!(
        "after the cut: lost() fired {:?}, contenders elected {:?}",
        lost.iter().map(after).collect::<Vec<_>>(),
        won.iter().map(|(t, _)| after(t)).collect::<Vec<_>>(),
    );
    eprintln!("{report}");
    let last_lost = lost.iter().max().copied().expect("three");
    // Liveness: belief ends by the TTL, and the leaderless time after the
    // cut is bounded (TTL + 1.5 s: etcd's expiry, then the contenders'
    // watches).
    assert!(
        after(&last_lost) <= Duration::from_secs(3),
        "belief outlived the TTL; {report}"
    );
    for (at, _) in &won {
        assert!(
            after(at) <= Duration::from_millis(4_500),
            "leaderless too long; {report}"
        );
    }
    for (at, believing) in &won {
        assert!(
            last_lost < *at,
            "a contender won before every loss; {report}"
        );
        assert_eq!(
            believing, &[false; 3],
            "believed at a contender's win; {report}"
        );
    }
    proxy.set_mode(Mode::Pass);
    drop(session);
}

/// The session's lease revoked behind its back (etcdctl, as an operator
/// would): every leadership and lock on it ends (`lost()` fires, `is_held`
/// false) and the session heals on a new lease. (Each primitive learns it
/// from the delete of its own key, as the contender waiting for that key
/// does: a revoke is not a loss the local deadline can run ahead of.)
#[test]
fn a_revoked_session_lease_ends_every_primitive_on_it_and_the_session_heals() {
    let server = start_etcd();
    let ours = connect(&server.endpoint());
    let theirs = connect(&server.endpoint());
    let session = Session::new(&ours, TTL).expect("session");
    let scene = scene(&session, &theirs);
    let hex = format!("{:x}", scene.lease);
    etcdctl(&server.endpoint(), &["lease", "revoke", &hex]);
    let revoked = Instant::now();
    let lost = lost_at(&scene.lost, Duration::from_secs(5));
    assert_eq!((scene.held)(), [false; 3]);
    let won: Vec<Instant> = scene
        .contenders
        .into_iter()
        .map(|t| t.join().expect("contender").0)
        .collect();
    eprintln!(
        "after the revoke returned: lost() fired {:?}, contenders elected {:?}",
        lost.iter()
            .map(|t| t.saturating_duration_since(revoked))
            .collect::<Vec<_>>(),
        won.iter()
            .map(|t| t.saturating_duration_since(revoked))
            .collect::<Vec<_>>(),
    );
    // Liveness: the revoke frees every name at once, so the contenders
    // lead within a couple of round trips of it.
    for at in &won {
        assert!(
            at.saturating_duration_since(revoked) <= Duration::from_secs(2),
            "a contender waited {:?} after the revoke",
            at.saturating_duration_since(revoked)
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while session.lease().is_none_or(|l| l == scene.lease) {
        assert!(
            Instant::now() < deadline,
            "no new lease: {:?}",
            session.state()
        );
        thread::sleep(Duration::from_millis(20));
    }
    let lease = scene.lease;
    assert!(
        session
            .states()
            .try_iter()
            .any(|s| s == LivenessState::Lost { lease }),
        "states() shows the loss"
    );
    session.close().expect("close");
}

#[test]
fn closing_the_session_ends_every_primitive_and_revokes_the_lease() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let session = Session::new(&etcd, TTL).expect("session");
    let election = Election::with_session(&session, "db", Default::default()).expect("election");
    let mutex = Mutex::with_session(&session, "job", LockOptions::default()).expect("mutex");
    let leadership = election.campaign(b"ours").expect("elected");
    let guard = mutex.lock().expect("locked");
    session.close().expect("close");
    assert!(!leadership.is_held() && !guard.is_held());
    assert!(leadership.lost().try_recv().is_ok() && guard.lost().try_recv().is_ok());
    assert!(matches!(election.campaign(b"again"), Err(Error::Closed)));
    assert!(matches!(
        Election::with_session(&session, "other", Default::default()),
        Err(Error::Closed)
    ));
    let keys = etcdctl_keys(&server.endpoint(), "/coord/");
    assert!(keys.is_empty(), "left behind: {keys:?}");
}

/// A primitive closed on its own deletes its key and leaves the session,
/// and every other primitive on it, as they were.
#[test]
fn closing_one_primitive_deletes_its_key_and_keeps_the_session() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let session = Session::new(&etcd, TTL).expect("session");
    let election = Election::with_session(&session, "db", Default::default()).expect("election");
    let mutex = Mutex::with_session(&session, "job", LockOptions::default()).expect("mutex");
    let leadership = election.campaign(b"ours").expect("elected");
    let guard = mutex.lock().expect("locked");
    let key = leadership.key().to_string();
    election.close().expect("close the election");
    assert!(!leadership.is_held());
    let keys = etcdctl_keys(&server.endpoint(), "/coord/");
    assert!(!keys.contains(&key), "{key} left behind: {keys:?}");
    assert!(keys.contains(&guard.key().to_string()), "{keys:?}");
    assert!(guard.is_held(), "the mutex on the same session still holds");
    assert!(matches!(session.state(), LivenessState::Registered { .. }));
    // The name is free again on this session.
    let again = Election::with_session(&session, "db", Default::default()).expect("rejoin");
    let l = again.campaign(b"ours").expect("elected again");
    assert_eq!(l.key(), key, "same name, same lease: same key");
    drop((l, guard));
    session.close().expect("close");
}

#[test]
fn two_primitives_with_one_key_on_one_session_are_refused() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let session = Session::new(&etcd, TTL).expect("session");
    let first = Election::with_session(&session, "db", Default::default()).expect("first");
    match Election::with_session(&session, "db", Default::default()) {
        Err(Error::InvalidArgument { what, why }) => {
            assert_eq!(what, "name");
            assert!(why.contains("already used"), "{why}");
        }
        other => panic!("a second election with one key was not refused: {other:?}"),
    }
    // Another kind of primitive with the same name has its own prefix.
    let _mutex = Mutex::with_session(&session, "db", LockOptions::default()).expect("mutex");
    drop(first);
    let _again = Election::with_session(&session, "db", Default::default()).expect("freed");
    session.close().expect("close");
}

/// A pool on a session: every name's key is on the one lease.
#[test]
fn a_pool_on_a_session_puts_every_name_on_its_lease() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let session = Session::new(&etcd, TTL).expect("session");
    let pool = ElectionPool::with_session(&session, Default::default());
    let held: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|name| pool.campaign(name, b"me").expect("elected"))
        .collect();
    let lease = session.lease().expect("a lease");
    assert!(held.iter().all(|l| l.lease() == lease));
    drop(held);
    pool.close().expect("pool close");
    assert!(etcdctl_keys(&server.endpoint(), "/coord/election/").is_empty());
    assert!(matches!(session.state(), LivenessState::Registered { .. }));
    session.close().expect("close");
}
