//! ElectionPool against a real etcd: one long-lived session per name.
//!
//! Leases are counted with `etcdctl lease list`, i.e. as etcd has them,
//! not as fleetcoord believes. Each test starts its own etcd, so every
//! lease it lists belongs to the test.

mod common;

use fleetcoord::testing::EtcdServer;
use fleetcoord::{ElectionOptions, ElectionPool, Error, Etcd};
use std::time::{Duration, Instant};

// Generous: a loaded 2-core CI machine can take seconds per step.
const WAIT: Duration = Duration::from_secs(10);

fn start_etcd() -> (EtcdServer, Etcd) {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    (server, etcd)
}

fn pool(etcd: &Etcd) -> ElectionPool {
    ElectionPool::with_options(
        etcd,
        ElectionOptions::default()
            .with_prefix("/test/pool/")
            .with_ttl(Duration::from_secs(5)),
    )
}

/// The leases etcd holds, via `etcdctl lease list` (ids in hex).
fn leases(endpoint: &str) -> Vec<i64> {
    // "found N leases" and then one id per line.
    let text = common::etcdctl(endpoint, &["lease", "list"]);
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let ids: Vec<i64> = lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| i64::from_str_radix(l.trim(), 16).unwrap())
        .collect();
    assert_eq!(
        header,
        format!("found {} leases", ids.len()),
        "unexpected etcdctl output: {text}"
    );
    ids
}

fn wait_for_leases(endpoint: &str, want: &[i64]) {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut have = leases(endpoint);
        have.sort();
        let mut want = want.to_vec();
        want.sort();
        if have == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "etcd's leases {have:?}, expected {want:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn campaign_resign_cycles_on_one_name_grant_one_lease() {
    let (server, etcd) = start_etcd();
    let pool = pool(&etcd);
    let mut seen = Vec::new();
    let mut tokens = Vec::new();
    for i in 0..10 {
        let l = pool
            .campaign("cycles", format!("round-{i}").as_bytes())
            .unwrap();
        assert!(l.is_held());
        seen.push(l.lease());
        tokens.push(l.fencing_token());
        l.resign().unwrap();
    }
    assert!(
        seen.iter().all(|&l| l == seen[0]),
        "one session for every cycle: {seen:?}"
    );
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    assert_eq!(
        leases(&server.endpoint()),
        vec![seen[0]],
        "etcd must hold exactly the pool's one lease"
    );
    pool.close().unwrap();
}

#[test]
fn two_names_get_two_sessions_and_both_lead() {
    let (server, etcd) = start_etcd();
    let pool = pool(&etcd);
    let x = pool.campaign("x", b"me").unwrap();
    let y = pool.campaign("y", b"me").unwrap();
    assert_ne!(x.lease(), y.lease());
    assert!(
        x.is_held() && y.is_held(),
        "different names are different elections"
    );
    wait_for_leases(&server.endpoint(), &[x.lease(), y.lease()]);
    // Same name again: the pool hands out the same election and session.
    let (lx, ly) = (x.lease(), y.lease());
    x.resign().unwrap();
    let x2 = pool.campaign("x", b"me").unwrap();
    assert_eq!(x2.lease(), lx);
    assert!(pool
        .election("y")
        .unwrap()
        .leader()
        .unwrap()
        .is_some_and(|l| l.lease == ly));
    drop((x2, y));
    pool.close().unwrap();
}

#[test]
fn release_revokes_the_session_and_a_later_campaign_starts_a_new_one() {
    let (server, etcd) = start_etcd();
    let pool = pool(&etcd);
    let l = pool.campaign("rel", b"me").unwrap();
    let old = l.lease();
    let other = pool.campaign("keep", b"me").unwrap();
    wait_for_leases(&server.endpoint(), &[old, other.lease()]);

    pool.close_election("rel").unwrap();
    // Revoked at once, not left to expire: the list changes well within
    // the 5 s TTL.
    let t = Instant::now();
    wait_for_leases(&server.endpoint(), &[other.lease()]);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(!l.is_held(), "the released session's leadership is over");
    assert!(other.is_held(), "other names are untouched");
    drop(l);

    let again = pool.campaign("rel", b"me").unwrap();
    assert_ne!(again.lease(), old, "a new session");
    wait_for_leases(&server.endpoint(), &[again.lease(), other.lease()]);
    drop((again, other));
    pool.close().unwrap();
}

#[test]
fn close_revokes_everything_and_later_calls_are_closed() {
    let (server, etcd) = start_etcd();
    let pool = pool(&etcd);
    pool.campaign("a", b"me").unwrap().resign().unwrap();
    pool.campaign("b", b"me").unwrap().resign().unwrap();
    assert_eq!(leases(&server.endpoint()).len(), 2);
    pool.close().unwrap();
    wait_for_leases(&server.endpoint(), &[]);
    assert!(matches!(pool.campaign("a", b"me"), Err(Error::Closed)));
    assert!(matches!(pool.campaign("c", b"me"), Err(Error::Closed)));
    assert!(matches!(pool.try_campaign("a", b"me"), Err(Error::Closed)));
    assert!(matches!(
        pool.campaign_timeout("a", b"me", Duration::from_secs(1)),
        Err(Error::Closed)
    ));
    assert!(
        leases(&server.endpoint()).is_empty(),
        "a closed pool must not start sessions"
    );
}

/// Releasing a name whose election a caller still shares leaves that
/// election running for the caller; the next campaign through the pool
/// starts a session of its own.
#[test]
fn release_leaves_a_shared_election_to_its_holder() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let pool = ElectionPool::new(&etcd);
    let shared = pool.election("kept").expect("election");
    assert_eq!(format!("{pool:?}"), "ElectionPool { names: 1 }");
    pool.close_election("kept").expect("release");
    assert_eq!(format!("{pool:?}"), "ElectionPool { names: 0 }");
    let held = shared
        .campaign(b"me")
        .expect("the shared election still runs");
    let fresh = pool.try_campaign("kept", b"other").expect("try_campaign");
    assert!(
        matches!(fresh, fleetcoord::TryCampaign::NotElected(Some(ref l)) if l.value == b"me"),
        "{fresh:?}"
    );
    held.resign().expect("resign");
    pool.close().expect("close");
}
