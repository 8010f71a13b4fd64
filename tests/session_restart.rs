//! A whole process on a `Session` restarted through `Session::detach` /
//! `Session::resume`, against a real etcd.
//!
//! Agent `a` (a host registration, an election, a mutex and a shard map
//! on one session) is restarted ten times within the TTL, each
//! incarnation on a connection of its own, as a new process would be;
//! agent `b` (the election, the mutex and the map on its own session,
//! holding for 300 ms at a time) runs throughout. Checked:
//! * a watcher of the hosts sees no `Down` and no `Up` of `a` (at most
//!   `Updated`), and every incarnation has the first incarnation's lease;
//! * no two leaders, no two holders of the lock and no two owners of a
//!   shard at once: every belief is sampled as an interval [first seen,
//!   last seen held], and intervals of one election, lock or shard must
//!   not intersect (a belief is held from its start until it ends and
//!   never again, so a belief seen at `t` was held at every earlier
//!   instant of its interval); fencing tokens grow with time, so nothing
//!   was carried from one incarnation to the next;
//! * liveness: each detach and each resume is bounded, and `a` leads and
//!   locks again in most incarnations.
//!
//! Then one restart past the TTL: exactly one `Down(_, Expired)` and one
//! `Up`, the `Down` within TTL + 2 s of the detach.

mod common;

use common::{connect, start_etcd};
use fleetcoord::{
    DownReason, Election, Etcd, HostEvent, HostLiveness, HostWatcher, Leadership, LivenessOptions,
    Mutex, MutexGuard, Pending, Session, SessionOptions, SessionResume, ShardEvent, ShardMap,
    ShardOptions,
};
use parking_lot::Mutex as Lock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use uuid::Uuid;

const TTL: Duration = Duration::from_secs(4);
const RESTARTS: usize = 10;
const SHARDS: u32 = 4;
const MAP: &str = "restarts";
const ELECTION: &str = "restarts";
const LOCK: &str = "restarts";
/// A detach deletes the election's and the map's keys (a round trip
/// each) and stops renewing; a resume proves the lease and rewrites the
/// host key. Either well within a second on a loopback etcd.
const BOUND: Duration = Duration::from_secs(2);

/// A belief seen held from `first` to `last`: who, and its token.
#[derive(Clone, Debug)]
struct Held {
    who: String,
    token: i64,
    first: Instant,
    last: Instant,
}

/// Beliefs per election (key "leader") or shard (key "shard <n>").
type Beliefs = Arc<Lock<BTreeMap<String, Vec<Held>>>>;

/// Records what `owned` reports now into `open` (beliefs still seen held,
/// by shard and token), closing into `done` those no longer reported.
fn sample_shards(
    who: &str,
    owned: &[(u32, i64)],
    at: Instant,
    open: &mut BTreeMap<(u32, i64), Held>,
    done: &Beliefs,
) {
    for (shard, token) in owned {
        open.entry((*shard, *token))
            .and_modify(|h| h.last = at)
            .or_insert(Held {
                who: who.to_string(),
                token: *token,
                first: at,
                last: at,
            });
    }
    let gone: Vec<(u32, i64)> = open
        .keys()
        .filter(|k| !owned.contains(k))
        .copied()
        .collect();
    for key in gone {
        if let Some(held) = open.remove(&key) {
            done.lock()
                .entry(format!("shard {}", key.0))
                .or_default()
                .push(held);
        }
    }
}

fn close_all(open: &mut BTreeMap<(u32, i64), Held>, done: &Beliefs) {
    for ((shard, _), held) in std::mem::take(open) {
        done.lock()
            .entry(format!("shard {shard}"))
            .or_default()
            .push(held);
    }
}

/// Agent `b`: its own session, a campaign loop holding 300 ms at a time,
/// and its shard map sampled every 2 ms, until `stop`.
fn rival(endpoint: String, beliefs: Beliefs, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let etcd = connect(&endpoint);
        let session = Session::new(&etcd, TTL).expect("b session");
        let election =
            Election::with_session(&session, ELECTION, Default::default()).expect("b election");
        let map = Arc::new(
            ShardMap::with_session(
                &session,
                MAP,
                SHARDS,
                ShardOptions::default().with_member("b"),
            )
            .expect("b joins"),
        );
        let mutex = Mutex::with_session(&session, LOCK, Default::default()).expect("b mutex");
        let locker = {
            let (beliefs, stop) = (beliefs.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let Ok(guard) = mutex.lock_timeout(Duration::from_secs(1)) else {
                        continue;
                    };
                    let mut held = Held {
                        who: "b".into(),
                        token: guard.fencing_token(),
                        first: Instant::now(),
                        last: Instant::now(),
                    };
                    assert!(guard.is_held(), "b locked and does not believe it");
                    let until = Instant::now() + Duration::from_millis(300);
                    while Instant::now() < until {
                        let at = Instant::now();
                        if guard.is_held() {
                            held.last = at;
                        }
                        thread::sleep(Duration::from_millis(2));
                    }
                    beliefs.lock().entry("lock".into()).or_default().push(held);
                    guard.unlock().expect("b unlocks");
                    thread::sleep(Duration::from_millis(300));
                }
            })
        };
        let sampler = {
            let (map, beliefs, stop) = (map.clone(), beliefs.clone(), stop.clone());
            thread::spawn(move || {
                let mut open = BTreeMap::new();
                while !stop.load(Ordering::SeqCst) {
                    // Drained at once: `a` gets its share within a round
                    // trip of joining, not after the 5 s drain.
                    while let Ok(event) = map.events().try_recv() {
                        if let ShardEvent::Release { shard, .. } = event {
                            let _ = map.release(shard);
                        }
                    }
                    let at = Instant::now();
                    sample_shards("b", &map.owned(), at, &mut open, &beliefs);
                    thread::sleep(Duration::from_millis(2));
                }
                close_all(&mut open, &beliefs);
            })
        };
        while !stop.load(Ordering::SeqCst) {
            let Ok(leadership) = election.campaign_timeout(b"b", Duration::from_secs(1)) else {
                continue;
            };
            let mut held = Held {
                who: "b".into(),
                token: leadership.fencing_token(),
                first: Instant::now(),
                last: Instant::now(),
            };
            assert!(leadership.is_held(), "b won and does not believe it");
            let until = Instant::now() + Duration::from_millis(300);
            while Instant::now() < until {
                let at = Instant::now();
                if leadership.is_held() {
                    held.last = at;
                }
                thread::sleep(Duration::from_millis(2));
            }
            beliefs
                .lock()
                .entry("leader".into())
                .or_default()
                .push(held);
            leadership.resign().expect("b resigns");
            // Room for `a` to win.
            thread::sleep(Duration::from_millis(300));
        }
        sampler.join().expect("sampler");
        locker.join().expect("locker");
        drop(election);
        drop(map);
        session.close().expect("b closes");
    })
}

/// One incarnation of agent `a`: a new connection, its session (resumed
/// when `saved`), host, election and map.
struct Agent {
    etcd: Etcd,
    session: Session,
    host: HostLiveness,
    election: Election,
    mutex: Mutex,
    map: ShardMap,
}

fn start_agent(endpoint: &str, id: Uuid, saved: Option<SessionResume>, n: usize) -> Agent {
    let etcd = connect(endpoint);
    let options = SessionOptions::default().with_ttl(TTL);
    let session = match saved {
        Some(saved) => Session::resume(&etcd, saved, options).expect("resume"),
        None => Session::with_options(&etcd, options).expect("session"),
    };
    let host = HostLiveness::with_session(
        &session,
        id,
        format!("incarnation {n}").as_bytes(),
        LivenessOptions::default(),
    )
    .expect("host");
    let election =
        Election::with_session(&session, ELECTION, Default::default()).expect("a election");
    let mutex = Mutex::with_session(&session, LOCK, Default::default()).expect("a mutex");
    let map = ShardMap::with_session(
        &session,
        MAP,
        SHARDS,
        ShardOptions::default().with_member("a"),
    )
    .expect("a joins");
    Agent {
        etcd,
        session,
        host,
        election,
        mutex,
        map,
    }
}

/// One campaign of `a`'s (a leadership or a lock): waited on in slices,
/// then, once won, its belief sampled up to the detach.
struct Attempt<T> {
    pending: Pending<T>,
    won: Option<(T, Held)>,
    is_held: fn(&T) -> bool,
    token: fn(&T) -> i64,
}

impl<T> Attempt<T> {
    fn new(pending: Pending<T>, is_held: fn(&T) -> bool, token: fn(&T) -> i64) -> Self {
        Attempt {
            pending,
            won: None,
            is_held,
            token,
        }
    }

    fn step(&mut self, at: Instant) {
        match &mut self.won {
            Some((won, held)) => {
                if (self.is_held)(won) {
                    held.last = at;
                }
            }
            None => {
                let wait = Duration::from_millis(1);
                if let Some(won) = self.pending.wait_timeout(wait).expect("a waits") {
                    let now = Instant::now();
                    assert!((self.is_held)(&won), "a won and does not believe it");
                    let token = (self.token)(&won);
                    let held = Held {
                        who: "a".into(),
                        token,
                        first: now,
                        last: now,
                    };
                    self.won = Some((won, held));
                }
            }
        }
    }

    /// Held for 200 ms, or given up waiting after `patience`.
    fn done(&self, elapsed: Duration, patience: Duration) -> bool {
        match &self.won {
            Some((_, held)) => held.last - held.first >= Duration::from_millis(200),
            None => elapsed >= patience,
        }
    }

    /// Records the belief under `what`; returns what was won, still held.
    fn finish(self, what: &str, beliefs: &Beliefs) -> Option<T> {
        let (won, held) = self.won?;
        beliefs.lock().entry(what.into()).or_default().push(held);
        Some(won)
    }
}

/// Runs `a` for a while: campaigns and locks, holds what it won for
/// 200 ms (or gives up waiting after 1.5 s), and waits (3 s at most)
/// until it owns a shard; samples its beliefs all along and once more at
/// the end, right before the detach. Returns what it won, still held, for
/// the detach to end.
fn run_agent(agent: &Agent, beliefs: &Beliefs) -> (Option<Leadership>, Option<MutexGuard>) {
    let mut open = BTreeMap::new();
    let mut leading = Attempt::new(
        agent.election.start_campaign(b"a").expect("a campaigns"),
        Leadership::is_held,
        Leadership::fencing_token,
    );
    let mut locking = Attempt::new(
        agent.mutex.start_lock().expect("a locks"),
        MutexGuard::is_held,
        MutexGuard::fencing_token,
    );
    let started = Instant::now();
    let patience = Duration::from_millis(1500);
    loop {
        let at = Instant::now();
        let owned = agent.map.owned();
        sample_shards("a", &owned, at, &mut open, beliefs);
        leading.step(at);
        locking.step(at);
        let elapsed = started.elapsed();
        let shards_done = !owned.is_empty() || elapsed >= Duration::from_secs(3);
        if leading.done(elapsed, patience) && locking.done(elapsed, patience) && shards_done {
            break;
        }
        thread::sleep(Duration::from_millis(2));
    }
    close_all(&mut open, beliefs);
    // Still held: the detach ends them (the point of the test).
    (
        leading.finish("leader", beliefs),
        locking.finish("lock", beliefs),
    )
}

/// Asserts that no two beliefs of one election or one shard intersect,
/// and that tokens grow with time; returns how many were checked, by
/// agent and kind ("a leader", "b shard", ...).
fn assert_no_overlap(beliefs: &Beliefs) -> BTreeMap<String, usize> {
    let mut checked = BTreeMap::new();
    for (what, held) in beliefs.lock().iter_mut() {
        held.sort_by_key(|h| h.first);
        for pair in held.windows(2) {
            assert!(
                pair[0].last < pair[1].first,
                "{what}: {:?} and {:?} overlap",
                pair[0],
                pair[1]
            );
            assert!(
                pair[0].token < pair[1].token,
                "{what}: tokens do not grow: {:?} then {:?}",
                pair[0],
                pair[1]
            );
        }
        let kind = what.split(' ').next().unwrap_or_default();
        for h in held.iter() {
            *checked.entry(format!("{} {kind}", h.who)).or_default() += 1;
        }
    }
    checked
}

/// Every event of host `id` the watcher has, waiting `settle` for late ones.
fn events_of(watcher: &HostWatcher, id: Uuid, settle: Duration) -> Vec<HostEvent> {
    let mut out = Vec::new();
    while let Ok(event) = watcher.events().recv_timeout(settle) {
        let of = match &event {
            HostEvent::Up(info) | HostEvent::Updated(info) | HostEvent::Down(info, _) => info.id,
            HostEvent::Synced => continue,
        };
        if of == id {
            out.push(event);
        }
    }
    out
}

#[test]
fn a_process_on_a_session_restarts_within_the_ttl_without_a_down_and_past_it_with_one() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let observer = connect(&endpoint);
    let watcher = HostWatcher::watch(&observer).expect("watch");
    assert_eq!(
        watcher.events().recv_timeout(BOUND),
        Ok(HostEvent::Synced),
        "an empty prefix syncs at once"
    );
    let id = Uuid::new_v4();
    let beliefs: Beliefs = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let b = rival(endpoint.clone(), beliefs.clone(), stop.clone());

    let mut agent = start_agent(&endpoint, id, None, 0);
    let lease = agent.session.lease().expect("a lease");
    assert!(matches!(
        watcher.events().recv_timeout(BOUND),
        Ok(HostEvent::Up(info)) if info.id == id
    ));
    let (mut led, mut locked, mut detaches, mut resumes) = (0, 0, Vec::new(), Vec::new());
    for n in 1..=RESTARTS {
        let (leadership, guard) = run_agent(&agent, &beliefs);
        let started = Instant::now();
        let saved = agent.session.detach().expect("detach");
        detaches.push(started.elapsed());
        // Every belief ended before the detach returned.
        assert!(agent.map.owned().is_empty(), "shards outlived the detach");
        if let Some(leadership) = leadership {
            led += 1;
            assert!(!leadership.is_held(), "the leadership outlived the detach");
        }
        if let Some(guard) = guard {
            locked += 1;
            assert!(!guard.is_held(), "the lock outlived the detach");
        }
        assert_eq!(saved.lease, lease);
        assert_eq!(saved.hosts.len(), 1);
        // The process exits; only the text survives it.
        let text = saved.to_string();
        drop(agent);
        let started = Instant::now();
        agent = start_agent(&endpoint, id, Some(text.parse().expect("parse")), n);
        resumes.push(started.elapsed());
        assert!(agent.host.resumed(), "restart {n} registered afresh");
        assert_eq!(agent.host.incarnation(), n as u64 + 1);
        assert_eq!(agent.session.lease(), Some(lease), "restart {n}");
    }
    let events = events_of(&watcher, id, Duration::from_millis(500));
    let downs = events
        .iter()
        .filter(|e| matches!(e, HostEvent::Down(..)))
        .count();
    let ups = events
        .iter()
        .filter(|e| matches!(e, HostEvent::Up(..)))
        .count();
    let updated = events.len() - downs - ups;
    let worst_detach = detaches.iter().max().copied().unwrap_or_default();
    let worst_resume = resumes.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{RESTARTS} restarts within the TTL: {downs} Down, {ups} Up, {updated} Updated; \
         a led in {led}, locked in {locked}; detach at most {worst_detach:?}, resume at most \
         {worst_resume:?}"
    );
    assert_eq!((downs, ups), (0, 0), "{events:?}");
    assert!(worst_detach < BOUND, "detach took {worst_detach:?}");
    assert!(worst_resume < BOUND, "resume took {worst_resume:?}");
    assert!(led >= RESTARTS / 2, "a led in only {led} of {RESTARTS}");
    assert!(
        locked >= RESTARTS / 2,
        "a locked in only {locked} of {RESTARTS}"
    );

    // One restart past the TTL: the lease expires with the host key.
    let held = run_agent(&agent, &beliefs);
    let saved = agent.session.detach().expect("detach");
    let detached = Instant::now();
    drop(held);
    drop(agent);
    let down = match watcher.events().recv_timeout(TTL + BOUND) {
        Ok(HostEvent::Down(info, reason)) if info.id == id => (reason, detached.elapsed()),
        other => panic!("expected the host Down, got {other:?}"),
    };
    assert_eq!(down.0, DownReason::Expired);
    let agent = start_agent(&endpoint, id, Some(saved), RESTARTS + 1);
    assert!(!agent.host.resumed());
    assert_ne!(agent.session.lease(), Some(lease), "a new lease");
    let events = events_of(&watcher, id, Duration::from_millis(500));
    eprintln!(
        "past the TTL: Down({:?}) {:?} after the detach, then {events:?}",
        down.0, down.1
    );
    assert!(
        matches!(&events[..], [HostEvent::Up(info)] if info.id == id),
        "{events:?}"
    );

    stop.store(true, Ordering::SeqCst);
    b.join().expect("b");
    let checked = assert_no_overlap(&beliefs);
    eprintln!("beliefs checked, none overlapping: {checked:?}");
    assert!(
        ["b leader", "b lock", "b shard"]
            .iter()
            .all(|k| checked.get(*k).copied().unwrap_or(0) > 0),
        "the rival never held anything: nothing was checked against it"
    );
    assert!(
        checked.get("a shard").copied().unwrap_or(0) >= RESTARTS,
        "a owned too few shards for the check to mean much: {checked:?}"
    );
    agent.host.close().expect("close host");
    agent.session.close().expect("close session");
    drop(agent.etcd);
}

/// What the README promises a watcher when a session's lease is lost and
/// the key really went away (here an operator revokes it): exactly one
/// `Down(_, Expired)`, then one `Up` with a new create revision once the
/// session has its next lease, within a TTL and a bit (the session learns
/// of the revoke at its next renewal, a third of the TTL at most).
#[test]
fn a_revoked_session_lease_shows_one_down_expired_then_one_up() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let watcher = HostWatcher::watch(&etcd).expect("watch");
    assert_eq!(watcher.events().recv_timeout(BOUND), Ok(HostEvent::Synced));
    let session = Session::new(&etcd, TTL).expect("session");
    let id = Uuid::new_v4();
    let host =
        HostLiveness::with_session(&session, id, b"m", LivenessOptions::default()).expect("host");
    let created = match watcher.events().recv_timeout(BOUND) {
        Ok(HostEvent::Up(info)) if info.id == id => info.create_revision,
        other => panic!("expected Up, got {other:?}"),
    };
    let lease = session.lease().expect("lease");
    let revoked = Instant::now();
    common::etcdctl(
        &server.endpoint(),
        &["lease", "revoke", &format!("{lease:x}")],
    );
    let events = events_of(&watcher, id, TTL);
    let took = revoked.elapsed();
    match &events[..] {
        [HostEvent::Down(down, DownReason::Expired), HostEvent::Up(up)] => {
            assert_eq!(down.create_revision, created);
            assert!(up.create_revision > created);
            assert_ne!(up.lease, lease);
        }
        other => panic!("expected Down(Expired) then Up, got {other:?}"),
    }
    // `events_of` waits one TTL of silence after the last event.
    assert!(took < TTL + TTL + BOUND, "took {took:?}");
    assert_eq!(host.lease(), session.lease());
    host.close().expect("close");
    session.close().expect("close");
}
