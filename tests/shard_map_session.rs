//! `ShardMap::with_session` against a real etcd: a shard map on a
//! `Session` it shares with an election.
//!
//! * Two members, each with a session holding an election and the map;
//!   one member's session is cut off from etcd through a blackholing
//!   proxy: its `Lost` events and its leadership's `lost()` fire before
//!   the other member acquires any of its shards, and every shard is
//!   owned again within TTL + 1 s of the cut.
//! * One map per name per session; leaving deletes the map's keys and
//!   leaves the session (and the election on it) alone.

mod common;

use common::{connect, start_etcd};
use fleetcoord::testing::{FaultProxy, Mode};
use fleetcoord::{Election, Error, Etcd, Session, ShardEvent, ShardMap, ShardOptions};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const MAP: &str = "on-session";
const SHARDS: u32 = 8;
const TTL: Duration = Duration::from_secs(3);

/// Every event of a member with the instant it was read.
type Log = Arc<Mutex<Vec<(Instant, ShardEvent)>>>;

fn record(map: &ShardMap) -> Log {
    let log: Log = Arc::default();
    let events = map.events().clone();
    let into = log.clone();
    thread::spawn(move || {
        while let Ok(event) = events.recv() {
            into.lock().push((Instant::now(), event));
        }
    });
    log
}

fn owners(etcd: &Etcd) -> BTreeMap<u32, String> {
    ShardMap::owners_of(etcd, MAP, SHARDS, &ShardOptions::default())
        .expect("read owners")
        .into_iter()
        .map(|o| (o.shard, o.member))
        .collect()
}

/// Waits until every shard is owned and both members own some.
fn settle(etcd: &Etcd, within: Duration) -> BTreeMap<u32, String> {
    let until = Instant::now() + within;
    loop {
        let owners = owners(etcd);
        let both = owners.values().any(|m| m == "a") && owners.values().any(|m| m == "b");
        if owners.len() == SHARDS as usize && both {
            return owners;
        }
        assert!(Instant::now() < until, "not settled: {owners:?}");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_session_cut_off_ends_its_shards_and_its_leadership_before_another_member_takes_them() {
    let server = start_etcd();
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let ours = connect(&proxy.endpoint());
    let theirs = connect(&server.endpoint());
    let session_a = Session::new(&ours, TTL).expect("session a");
    let session_b = Session::new(&theirs, TTL).expect("session b");
    let election_a = Election::with_session(&session_a, "lead", Default::default()).expect("a");
    let election_b = Election::with_session(&session_b, "lead", Default::default()).expect("b");
    let leadership_a = election_a.campaign(b"a").expect("a elected");
    let lost_a = leadership_a.lost().clone();
    // b queues behind a; its win is recorded.
    let b_elected = thread::spawn(move || {
        let leadership = election_b.campaign(b"b").expect("b elected");
        let at = Instant::now();
        (at, leadership, election_b)
    });
    let map_a = ShardMap::with_session(
        &session_a,
        MAP,
        SHARDS,
        ShardOptions::default().with_member("a"),
    )
    .expect("a joins");
    let map_b = ShardMap::with_session(
        &session_b,
        MAP,
        SHARDS,
        ShardOptions::default().with_member("b"),
    )
    .expect("b joins");
    let (log_a, log_b) = (record(&map_a), record(&map_b));
    let before = settle(&theirs, Duration::from_secs(10));
    // Let the ownership events reach the logs (the keys are in etcd once
    // acquired; the events follow the answer).
    let a_shards: Vec<u32> = before
        .iter()
        .filter(|(_, m)| *m == "a")
        .map(|(s, _)| *s)
        .collect();
    let until = Instant::now() + Duration::from_secs(2);
    while map_a.owned().len() != a_shards.len() && Instant::now() < until {
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        map_a.owned().iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        a_shards
    );
    let settled_at = log_b.lock().len();

    let cut = Instant::now();
    proxy.set_mode(Mode::Blackhole);
    lost_a
        .recv_timeout(TTL + Duration::from_secs(2))
        .expect("a's leadership lost");
    let leadership_lost = Instant::now();
    // Every shard owned again, by b, within TTL + 1 s of the cut.
    let bound = cut + TTL + Duration::from_secs(1);
    let owned_again = loop {
        let owners = owners(&theirs);
        if owners.len() == SHARDS as usize && owners.values().all(|m| m == "b") {
            break Instant::now();
        }
        assert!(
            Instant::now() < bound,
            "not owned again in time: {owners:?}"
        );
        thread::sleep(Duration::from_millis(20));
    };
    let (b_won, _leadership_b, _election_b) = b_elected.join().expect("b's campaign");
    thread::sleep(Duration::from_millis(200));

    let lost: BTreeMap<u32, Instant> = log_a
        .lock()
        .iter()
        .filter_map(|(t, e)| match e {
            ShardEvent::Lost { shard } => Some((*shard, *t)),
            _ => None,
        })
        .collect();
    let acquired: BTreeMap<u32, Instant> = log_b.lock()[settled_at..]
        .iter()
        .filter_map(|(t, e)| match e {
            ShardEvent::Acquired { shard, .. } => Some((*shard, *t)),
            _ => None,
        })
        .collect();
    let after = |t: &Instant| t.saturating_duration_since(cut);
    let report = format!(
        "after the cut: a's leadership lost {:?}, a's shards lost {:?}, b acquired {:?}, \
         b elected {:?}, all owned again {:?}",
        after(&leadership_lost),
        lost.iter().map(|(s, t)| (*s, after(t))).collect::<Vec<_>>(),
        acquired
            .iter()
            .map(|(s, t)| (*s, after(t)))
            .collect::<Vec<_>>(),
        after(&b_won),
        after(&owned_again),
    );
    eprintln!("{report}");
    assert!(map_a.owned().is_empty(), "{report}");
    for shard in &a_shards {
        let lost_at = lost
            .get(shard)
            .unwrap_or_else(|| panic!("{shard} not lost; {report}"));
        let taken_at = acquired
            .get(shard)
            .unwrap_or_else(|| panic!("{shard} not acquired by b; {report}"));
        assert!(
            lost_at < taken_at,
            "shard {shard} taken before lost; {report}"
        );
        assert!(leadership_lost < *taken_at, "{report}");
    }
    assert!(leadership_lost < b_won, "{report}");
    proxy.set_mode(Mode::Pass);
    drop((map_a, map_b));
}

#[test]
fn one_map_per_name_per_session_and_leaving_keeps_the_session() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let session = Session::new(&etcd, TTL).expect("session");
    let election = Election::with_session(&session, "lead", Default::default()).expect("election");
    let leadership = election.campaign(b"a").expect("elected");
    let map = ShardMap::with_session(&session, MAP, 2, ShardOptions::default()).expect("joins");
    match ShardMap::with_session(&session, MAP, 2, ShardOptions::default()) {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("a second map of one name on one session: {other:?}"),
    }
    let until = Instant::now() + Duration::from_secs(10);
    while map.owned().len() < 2 {
        assert!(Instant::now() < until, "not acquired");
        thread::sleep(Duration::from_millis(20));
    }
    let members = ShardMap::members_of(&etcd, MAP, &ShardOptions::default()).expect("members");
    assert_eq!(members.len(), 1);
    assert_eq!(
        members[0].lease,
        leadership.lease(),
        "the map is on the session"
    );
    map.leave().expect("leave");
    assert!(ShardMap::owners_of(&etcd, MAP, 2, &ShardOptions::default())
        .expect("owners")
        .is_empty());
    assert!(ShardMap::members_of(&etcd, MAP, &ShardOptions::default())
        .expect("members")
        .is_empty());
    assert!(leadership.is_held(), "leaving the map keeps the session");
    assert_eq!(session.lease(), Some(leadership.lease()));
    // The name is free again on this session.
    let again =
        ShardMap::with_session(&session, MAP, 2, ShardOptions::default()).expect("joins again");
    drop(again);
    session.close().expect("close");
}
