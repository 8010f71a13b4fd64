//! The shard map on a real 3-member etcd cluster: 20 members, 256 shards,
//! joins one by one, then a graceful leave, a member dropped without
//! leaving (its lease left to expire, like SIGKILL), a member cut off
//! through a blackholing proxy for longer than its TTL (like SIGSTOP) and
//! back, and an etcd member restart.
//!
//! Checked:
//! * safety: per shard, no two members' belief intervals overlap. A belief
//!   runs from the `Acquired` event to its end: the hand-back (`release`),
//!   the `Release` deadline, or the `Lost` event, whichever is first,
//!   clipped at the session's trusted deadline as the member last read it
//!   ([`ShardMap::session_trusted_until`]); tokens rise from one owner to
//!   the next; an old owner's `txn_if_owner` with its stale ownership is
//!   refused and writes nothing;
//! * liveness: after each membership change, every shard is owned (in
//!   etcd) by the member placement names among the live members within
//!   TTL + 1 s (a graceful leave or a join: within 1 s, a few round trips
//!   plus the hand-back); no ownership event at all while membership is
//!   stable;
//! * moves: per join or leave, the shards whose owner changed; the mean
//!   over the run is at most the mean of ⌈M/N⌉ + 10 % (N the larger
//!   membership of the two), and each join moves shards only to the
//!   joiner, each leave only the leaver's. The per-event maximum is
//!   printed: plain rendezvous hashing cannot bound each event.
//!
//! Plus `a_refused_fence_ends_the_ownership` on one server: a shard key
//! deleted behind its owner's back makes its next `txn_if_owner` come back
//! refused, with `Lost` told before the call returns and nothing written.

#[path = "common/shards.rs"]
mod shards;

use fleetcoord::testing::{EtcdCluster, EtcdServer, FaultProxy, Mode};
use fleetcoord::{
    Election, Etcd, EtcdOptions, ShardEvent, ShardMap, ShardOptions, TxnOp, TxnOpResponse,
};
use fleetcoord_sm::shard::placement;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const MAP: &str = "fault-test";
const SHARDS: u32 = 256;
const MEMBERS: usize = 20;
const TTL: Duration = Duration::from_secs(3);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound after a crash or a cut-off: the lease expires within the TTL.
const LOST_BOUND: Duration = Duration::from_secs(4);
/// Bound after a join or a graceful leave: round trips and the hand-back.
const GRACEFUL_BOUND: Duration = Duration::from_secs(1);
/// How long membership stays stable between changes (no event allowed).
const QUIET: Duration = Duration::from_millis(500);

fn etcd_options() -> EtcdOptions {
    EtcdOptions::default().with_request_timeout(REQUEST_TIMEOUT)
}

fn shard_options(id: &str) -> ShardOptions {
    ShardOptions::default()
        .with_member(id)
        .with_ttl(TTL)
        .with_drain(Duration::from_secs(1))
}

/// A member and the thread that consumes its events as a user would:
/// start on `Acquired`, hand back at once on `Release`, stop on `Lost`.
struct Running {
    id: String,
    map: Arc<ShardMap>,
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<()>,
    /// The member's own etcd handle (and its proxy, for the fault targets).
    etcd: Etcd,
    proxy: Option<FaultProxy>,
}

fn start(
    id: &str,
    endpoints: &[String],
    proxy: Option<FaultProxy>,
    log: Arc<Mutex<shards::Log>>,
) -> Running {
    let etcd = match &proxy {
        Some(p) => Etcd::with_options(&[p.endpoint()], etcd_options()),
        None => Etcd::with_options(endpoints, etcd_options()),
    }
    .expect("connect");
    let map = Arc::new(ShardMap::join(&etcd, MAP, SHARDS, shard_options(id)).expect("join"));
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (stop, map) = (stop.clone(), map.clone());
        let id = id.to_string();
        thread::spawn(move || shards::consume(&id, &map, &stop, &log, None))
    };
    Running {
        id: id.to_string(),
        map,
        stop,
        thread,
        etcd,
        proxy,
    }
}

impl Running {
    fn stop(self) -> (ShardMap, Etcd, Option<FaultProxy>) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("consumer");
        let map = Arc::try_unwrap(self.map).expect("the consumer's handle is gone");
        (map, self.etcd, self.proxy)
    }
}

/// Waits until etcd shows every shard owned by its placed member among
/// `live`; returns the owners and how long it took from `since`.
fn settle(
    etcd: &Etcd,
    running: &[Running],
    live: &BTreeSet<String>,
    since: Instant,
    bound: Duration,
    what: &str,
) -> (Vec<String>, Duration) {
    let want = shards::placed(live, SHARDS);
    let give_up = since + bound + Duration::from_secs(10);
    loop {
        // The reader shares the faults: a read cut off by one is asked
        // again (the bound below still holds).
        let owners = match ShardMap::owners_of(etcd, MAP, SHARDS, &ShardOptions::default()) {
            Ok(owners) => owners,
            Err(e) if e.is_retryable() && Instant::now() < give_up => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(e) => panic!("read owners: {e:?}"),
        };
        let now = Instant::now();
        let have: Vec<String> = owners.iter().map(|o| o.member.clone()).collect();
        // And every member believes exactly what etcd shows it owning.
        let believed = running
            .iter()
            .all(|r| shards::believes_as_etcd(&r.map, &owners));
        if owners.len() == SHARDS as usize && have == want && believed {
            let took = now - since;
            assert!(
                took <= bound,
                "{what}: settled after {took:?}, bound {bound:?}"
            );
            return (have, took);
        }
        assert!(
            now < give_up,
            "{what}: not settled after {:?}: {} of {SHARDS} owned as placed",
            now - since,
            have.iter().zip(&want).filter(|(a, b)| a == b).count()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Moves between two settled maps, checked against who joined or left.
fn moves(before: &[String], after: &[String], joiner: Option<&str>, leaver: Option<&str>) -> usize {
    let mut moved = 0;
    for (s, (b, a)) in before.iter().zip(after).enumerate() {
        if a != b {
            moved += 1;
            if let Some(j) = joiner {
                assert_eq!(a, j, "shard {s} moved {b} -> {a} on the join of {j}");
            }
            if let Some(l) = leaver {
                assert_eq!(b, l, "shard {s} moved {b} -> {a} on the leave of {l}");
            }
        }
    }
    moved
}

/// No event between `from` and `to` (membership stable).
fn assert_quiet(log: &Mutex<shards::Log>, from: Instant, to: Instant, what: &str) {
    let flaps = shards::events_between(&log.lock(), from, to);
    assert!(
        flaps.is_empty(),
        "{what}: {} events while membership was stable: {:?}",
        flaps.len(),
        &flaps[..flaps.len().min(5)]
    );
}

struct Moves {
    /// (moved, ⌈M/N⌉ + 10 %, what)
    events: Vec<(usize, f64, String)>,
}

impl Moves {
    fn record(&mut self, moved: usize, members: usize, what: String) {
        let bound = f64::from(SHARDS.div_ceil(members as u32)) * 1.1;
        self.events.push((moved, bound, what));
    }
}

#[test]
fn twenty_members_share_256_shards_without_overlap_through_faults() {
    let run_started = Instant::now();
    let mut cluster = EtcdCluster::start(3).expect("cluster");
    let endpoints = cluster.endpoints();
    let observer = Etcd::with_options(&endpoints, etcd_options()).expect("observer");
    let log = Arc::new(Mutex::new(shards::Log::default()));
    let mut running: Vec<Running> = Vec::new();
    let mut live: BTreeSet<String> = BTreeSet::new();
    let mut moves_log = Moves { events: Vec::new() };
    let mut settles: Vec<(String, Duration)> = Vec::new();
    // The fault targets reach etcd through a proxy to member 0 (never the
    // member restarted below); the others through every endpoint.
    let crash_id = "m18";
    let stop_id = "m19";
    let mut current: Vec<String> = Vec::new();
    for i in 0..MEMBERS {
        let id = format!("m{i:02}");
        let proxy = (i >= 18).then(|| FaultProxy::start(&endpoints[0]).expect("proxy"));
        let changed = Instant::now();
        running.push(start(&id, &endpoints, proxy, log.clone()));
        live.insert(id.clone());
        // The first member also waits for its session and creates all.
        let bound = GRACEFUL_BOUND + if i == 0 { TTL } else { Duration::ZERO };
        let (owners, took) = settle(
            &observer,
            &running,
            &live,
            changed,
            bound,
            &format!("join of {id}"),
        );
        if i > 0 {
            let n = live.len();
            let moved = moves(&current, &owners, Some(&id), None);
            moves_log.record(moved, n, format!("join {} -> {n}", n - 1));
        }
        settles.push((format!("join of {id}"), took));
        current = owners;
        let settled = Instant::now();
        thread::sleep(QUIET);
        assert_quiet(
            &log,
            settled,
            Instant::now(),
            &format!("after the join of {id}"),
        );
    }

    // A graceful leave.
    let leaver = running.remove(0);
    let leaver_id = leaver.id.clone();
    let changed = Instant::now();
    let (map, etcd, _) = leaver.stop();
    map.leave().expect("leave");
    drop(etcd);
    live.remove(&leaver_id);
    let (owners, took) = settle(
        &observer,
        &running,
        &live,
        changed,
        GRACEFUL_BOUND,
        "graceful leave",
    );
    let n = live.len() + 1;
    moves_log.record(
        moves(&current, &owners, None, Some(&leaver_id)),
        n,
        format!("leave {n} -> {}", n - 1),
    );
    settles.push(("graceful leave".into(), took));
    current = owners;
    let settled = Instant::now();
    thread::sleep(QUIET);
    assert_quiet(&log, settled, Instant::now(), "after the graceful leave");

    // A member dropped without leaving (SIGKILL): cut off, then gone; its
    // lease is left to expire.
    let i = running
        .iter()
        .position(|r| r.id == crash_id)
        .expect("crash target");
    let crashed = running.remove(i);
    crashed
        .proxy
        .as_ref()
        .expect("proxy")
        .set_mode(Mode::Blackhole);
    let changed = Instant::now();
    let (crashed_map, crashed_etcd, crashed_proxy) = crashed.stop();
    drop(crashed_map);
    live.remove(crash_id);
    let (owners, took) = settle(&observer, &running, &live, changed, LOST_BOUND, "crash");
    let n = live.len() + 1;
    moves_log.record(
        moves(&current, &owners, None, Some(crash_id)),
        n,
        format!("crash {n} -> {}", n - 1),
    );
    settles.push(("crash".into(), took));
    current = owners;
    let settled = Instant::now();
    thread::sleep(QUIET);
    assert_quiet(&log, settled, Instant::now(), "after the crash");

    // A member cut off past its TTL (SIGSTOP), then back: it loses its
    // shards, and rejoins on a new lease.
    let target = running
        .iter()
        .find(|r| r.id == stop_id)
        .expect("stop target");
    let stale: Vec<u32> = target.map.owned().into_iter().map(|(s, _)| s).collect();
    assert!(
        !stale.is_empty(),
        "{stop_id} owns shards before the cut-off"
    );
    target
        .proxy
        .as_ref()
        .expect("proxy")
        .set_mode(Mode::Blackhole);
    let changed = Instant::now();
    live.remove(stop_id);
    let (owners, took) = settle(&observer, &running, &live, changed, LOST_BOUND, "cut off");
    let n = live.len() + 1;
    moves_log.record(
        moves(&current, &owners, None, Some(stop_id)),
        n,
        format!("cut off {n} -> {}", n - 1),
    );
    settles.push(("cut off".into(), took));
    current = owners;
    // Its old ownerships are over (others hold those shards now): a write
    // with them is refused, and nothing reaches etcd.
    for shard in &stale {
        let key = format!("/{MAP}-data/{shard}");
        let answer = target
            .map
            .txn_if_owner(*shard, [TxnOp::put(key, "stale")])
            .expect("txn");
        assert_eq!(answer, None, "a stale ownership of shard {shard} wrote");
    }
    assert_eq!(
        target.map.owned(),
        vec![],
        "nothing is believed past the deadline"
    );
    target.proxy.as_ref().expect("proxy").set_mode(Mode::Pass);
    // Bytes dropped mid-stream leave the connections broken: start afresh.
    target.proxy.as_ref().expect("proxy").reset_all();
    let changed = Instant::now();
    live.insert(stop_id.to_string());
    // Back: a join, after a reconnect and a session grant that may wait
    // out the backoff of the failed attempts (at most 5 s).
    let back_bound = GRACEFUL_BOUND + Duration::from_secs(5);
    let (owners, took) = settle(
        &observer,
        &running,
        &live,
        changed,
        back_bound,
        "back after the cut-off",
    );
    let n = live.len();
    moves_log.record(
        moves(&current, &owners, Some(stop_id), None),
        n,
        format!("back {} -> {n}", n - 1),
    );
    settles.push(("back after the cut-off".into(), took));
    current = owners;
    let settled = Instant::now();
    thread::sleep(QUIET);
    assert_quiet(
        &log,
        settled,
        Instant::now(),
        "after the cut-off member came back",
    );

    // An etcd member restart (a follower, never member 0): membership
    // does not change, so nothing may move.
    let leader = cluster.leader_index().expect("leader");
    let follower = (1..3).find(|i| *i != leader).expect("a follower");
    let restarted = Instant::now();
    cluster.restart(follower).expect("restart");
    let (owners, took) = settle(
        &observer,
        &running,
        &live,
        restarted,
        LOST_BOUND,
        "etcd member restart",
    );
    settles.push(("etcd member restart".into(), took));
    assert_eq!(
        owners, current,
        "membership did not change, so nothing moved"
    );
    thread::sleep(QUIET);
    assert_quiet(
        &log,
        restarted,
        Instant::now(),
        "through the etcd member restart",
    );
    for shard in &stale {
        let key = format!("/{MAP}-data/{shard}");
        let read = observer_read(&observer, &key);
        assert!(read.is_empty(), "a stale write of shard {shard} applied");
    }

    // Everybody stops acting (intervals close), then leaves: the shards
    // the first leavers hand back go to members nobody records any more.
    let stopped: Vec<_> = running.into_iter().map(Running::stop).collect();
    drop(stopped);
    // Its handle's driver waits out a grace for the blackholed leave.
    thread::spawn(move || drop((crashed_etcd, crashed_proxy)));

    // Safety over the whole run.
    let log = log.lock();
    let (overlaps, tokens) = shards::check_intervals(&log.intervals);
    for (a, b) in &overlaps {
        eprintln!("shard {}: {a:?} overlaps {b:?}", a.shard);
    }
    assert!(tokens.is_empty(), "{}", tokens.join("\n"));
    assert!(log.violations.is_empty(), "{}", log.violations.join("\n"));
    let overlaps = overlaps.len();
    assert_eq!(overlaps, 0, "belief intervals overlapped");
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, _, e) in &log.events {
        let kind = match e {
            ShardEvent::Acquired { .. } => "acquired",
            ShardEvent::Release { .. } => "release",
            ShardEvent::Lost { .. } => "lost",
            _ => "other",
        };
        *kinds.entry(kind).or_default() += 1;
    }
    eprintln!("events by kind: {kinds:?}");

    let total: usize = moves_log.events.iter().map(|e| e.0).sum();
    let bound: f64 = moves_log.events.iter().map(|e| e.1).sum();
    let n = moves_log.events.len() as f64;
    let worst = moves_log
        .events
        .iter()
        .max_by(|a, b| (a.0 as f64 / a.1).total_cmp(&(b.0 as f64 / b.1)))
        .expect("events");
    eprintln!(
        "shard map: {} intervals, {} events, 0 overlaps; moves: mean {:.1} vs mean bound {:.1} \
         over {} changes, worst {} ({} moved, bound {:.1}); settles: {:?}; run {:?}",
        log.intervals.len(),
        log.events.len(),
        total as f64 / n,
        bound / n,
        moves_log.events.len(),
        worst.2,
        worst.0,
        worst.1,
        settles,
        run_started.elapsed()
    );
    assert!(
        total as f64 <= bound,
        "mean moves {:.1} above the mean bound {:.1}",
        total as f64 / n,
        bound / n
    );
}

/// The keys under `key` (a prefix), read through a member-less handle.
fn observer_read(etcd: &Etcd, key: &str) -> Vec<fleetcoord::KeyValue> {
    let election = Election::new(etcd, "reader").expect("election");
    let leadership = election.campaign(b"r").expect("lead");
    let answer = leadership
        .txn_if_leader([TxnOp::get_prefix(key)])
        .expect("read")
        .expect("leader");
    leadership.resign().expect("resign");
    match answer.into_iter().next() {
        Some(TxnOpResponse::Get { kvs }) => kvs,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_refused_fence_ends_the_ownership() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = Etcd::with_options(&[server.endpoint()], etcd_options()).expect("connect");
    let map = ShardMap::join(&etcd, "fenced", 1, shard_options("only")).expect("join");
    let token = match map
        .events()
        .recv_timeout(Duration::from_secs(10))
        .expect("acquired")
    {
        ShardEvent::Acquired { shard: 0, token } => token,
        other => panic!("unexpected {other:?}"),
    };
    let written = map
        .txn_if_owner(0, [TxnOp::put("/fenced-data/0", "a")])
        .expect("txn");
    assert_eq!(written, Some(vec![TxnOpResponse::Put]));
    // The shard key deleted behind the owner's back (an operator, a bug;
    // here a leader's unfenced ops), together with a heavy foreign member
    // that placement now names, so the member does not create it again.
    let prefix = map.key_prefix().to_string();
    let ghost = format!("{prefix}members/ghost");
    let members = [(b"only".as_slice(), 1), (b"ghost".as_slice(), 1_000_000)];
    assert_eq!(placement::owner(members, 0), Some(b"ghost".as_slice()));
    let election = Election::new(&etcd, "vandal").expect("election");
    let vandal = election.campaign(b"v").expect("lead");
    let ops = [
        TxnOp::delete(format!("{prefix}shards/0")),
        TxnOp::put(ghost.clone(), "1000000"),
    ];
    vandal.txn_if_leader(ops).expect("delete").expect("leader");
    // The stale ownership's write is refused and `Lost` is told before the
    // call returns (by the refused fence, or by the map's own watch if it
    // was quicker; either way exactly once).
    let refused = map
        .txn_if_owner(0, [TxnOp::put("/fenced-data/0", "stale")])
        .expect("txn");
    assert_eq!(refused, None, "a write with a stale token applied");
    assert_eq!(map.token(0), None, "belief ended before the call returned");
    let told: Vec<ShardEvent> = map.events().try_iter().collect();
    assert_eq!(
        told,
        vec![ShardEvent::Lost { shard: 0 }],
        "Lost, once, before the call returned"
    );
    let value = vandal
        .txn_if_leader([TxnOp::get("/fenced-data/0")])
        .expect("read")
        .expect("leader");
    assert!(
        matches!(&value[0], TxnOpResponse::Get { kvs } if kvs[0].value == b"a"),
        "{value:?}"
    );
    // The foreign member gone, the member creates the key again: a new
    // ownership, with a greater token, and no second `Lost` before it.
    vandal
        .txn_if_leader([TxnOp::delete(ghost)])
        .expect("delete")
        .expect("leader");
    match map
        .events()
        .recv_timeout(Duration::from_secs(10))
        .expect("again")
    {
        ShardEvent::Acquired {
            shard: 0,
            token: again,
        } => assert!(again > token),
        other => panic!("unexpected {other:?}"),
    }
    vandal.resign().expect("resign");
    map.leave().expect("leave");
    let left = ShardMap::owners_of(&etcd, "fenced", 1, &ShardOptions::default()).expect("read");
    assert!(left.is_empty(), "leave deletes the keys: {left:?}");
}

#[test]
fn bad_input_is_refused_before_anything_is_written() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = Etcd::with_options(&[server.endpoint()], etcd_options()).expect("connect");
    let ok = ShardOptions::default;
    let cases: Vec<(&str, u32, ShardOptions, &str)> = vec![
        ("", 8, ok(), "name"),
        ("a/b", 8, ok(), "name"),
        ("m", 0, ok(), "shards"),
        ("m", fleetcoord::MAX_SHARDS + 1, ok(), "shards"),
        ("m", 8, ok().with_prefix("no-slashes"), "prefix"),
        ("m", 8, ok().with_member("x/y"), "member"),
        ("m", 8, ok().with_member(""), "member"),
        ("m", 8, ok().with_ttl(Duration::from_millis(1500)), "ttl"),
        (
            "m",
            8,
            ok().with_drain(Duration::from_secs(2 * 86_400)),
            "drain",
        ),
    ];
    for (name, shards, options, what) in cases {
        match ShardMap::join(&etcd, name, shards, options) {
            Err(fleetcoord::Error::InvalidArgument { what: w, .. }) => assert_eq!(w, what),
            other => panic!("{name:?} {shards}: {other:?}"),
        }
    }
    let map = ShardMap::join(&etcd, "m", 8, ok()).expect("join");
    for shard in [8, u32::MAX] {
        assert!(matches!(
            map.release(shard),
            Err(fleetcoord::Error::InvalidArgument { what: "shard", .. })
        ));
        assert!(matches!(
            map.owner_of(shard),
            Err(fleetcoord::Error::InvalidArgument { what: "shard", .. })
        ));
        assert!(matches!(
            map.txn_if_owner(shard, [TxnOp::put("/k", "v")]),
            Err(fleetcoord::Error::InvalidArgument { what: "shard", .. })
        ));
    }
    map.leave().expect("leave");
}
