//! Duplicate host ids (issue 48, item 2): a second registration of a host
//! id that a live process holds fails with `DuplicateId` and leaves the
//! first alone; a restart after a crash waits for the old lease and
//! registers without an error; a take-over on purpose is observed by the
//! displaced process as its own loss. Shard map member ids are in
//! `tests/shard_map.rs`.
//!
//! Every test bounds how long the outcome takes.

mod common;

use common::{connect, ChildGuard};
use fleetcoord::testing::EtcdServer;
use fleetcoord::{
    list_hosts, ErrorKind, HostLiveness, LivenessOptions, LivenessState, DEFAULT_HOSTS_PREFIX,
};
use std::process::Stdio;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The lease TTL of every registration here (etcd grants it as asked).
const TTL: Duration = Duration::from_secs(3);

/// Room for a loaded 2-core machine on top of what the rules allow.
const SLACK: Duration = Duration::from_millis(1500);

/// Set only in the child process of the crash-restart test.
const CHILD_ENDPOINT: &str = "FLEETCOORD_TEST_DUP_CHILD_ENDPOINT";
const CHILD_HOST: &str = "FLEETCOORD_TEST_DUP_CHILD_HOST";
const CHILD_MARKER: &str = "fleetcoord-dup-child: registered";

fn options(take_over: bool) -> LivenessOptions {
    LivenessOptions::default()
        .with_ttl(TTL)
        .with_take_over(take_over)
        .with_register_timeout(Duration::from_secs(30))
}

/// The host key's lease and value as etcd has them.
fn holder(etcd: &fleetcoord::Etcd, id: Uuid) -> Option<(i64, Vec<u8>)> {
    list_hosts(etcd, DEFAULT_HOSTS_PREFIX)
        .expect("list_hosts")
        .into_iter()
        .find(|h| h.id == id)
        .map(|h| (h.lease, h.metadata))
}

#[test]
fn a_live_duplicate_fails_within_a_ttl_and_the_first_stays_registered() {
    let server = EtcdServer::start().expect("etcd");
    // Two connections, as two processes would have.
    let (etcd1, etcd2) = (connect(&server.endpoint()), connect(&server.endpoint()));
    let id = Uuid::new_v4();
    let first = HostLiveness::with_options(&etcd1, id, b"first", options(false)).expect("first");
    let lease = first.lease().expect("first lease");

    let started = Instant::now();
    let err = HostLiveness::with_options(&etcd2, id, b"second", options(false))
        .expect_err("a second registration of a live host id must fail");
    let detected = started.elapsed();
    println!("live duplicate detected in {detected:?}: {err}");
    assert_eq!(err.kind(), ErrorKind::DuplicateId, "{err}");
    assert!(!err.is_retryable());
    let text = err.to_string();
    assert!(text.contains(&id.to_string()), "names the id: {text}");
    assert!(
        text.contains(&format!("{lease:x}")),
        "names the lease: {text}"
    );
    // One look, a second after the first answer's remaining TTL (at most
    // the TTL) plus 1 % and 100 ms.
    assert!(detected <= TTL + SLACK, "took {detected:?}");

    // The first never noticed, and its key is untouched.
    assert_eq!(first.state(), LivenessState::Registered { lease });
    // `states()` starts with the state `register` returned.
    let seen: Vec<_> = first.states().try_iter().collect();
    assert_eq!(
        seen,
        vec![LivenessState::Registered { lease }],
        "the first registration changed state"
    );
    assert_eq!(holder(&etcd1, id), Some((lease, b"first".to_vec())));
    assert!(first.leave().expect("leave"), "the first leaves as usual");
}

/// The child process of `a_crash_restart_waits_for_the_old_lease_and_registers`:
/// registers and renews until killed. Returns at once in a normal run.
#[test]
fn child_host_process() {
    let Ok(endpoint) = std::env::var(CHILD_ENDPOINT) else {
        return;
    };
    let id: Uuid = std::env::var(CHILD_HOST)
        .expect("host id")
        .parse()
        .expect("uuid");
    let etcd = connect(&endpoint);
    let host =
        HostLiveness::with_options(&etcd, id, b"crashed", options(false)).expect("child register");
    println!("{CHILD_MARKER} lease {:?}", host.lease());
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_crash_restart_waits_for_the_old_lease_and_registers() {
    let server = EtcdServer::start().expect("etcd");
    let etcd = connect(&server.endpoint());
    let id = Uuid::new_v4();
    let child = common::this_test_binary()
        .args(["--exact", "child_host_process", "--nocapture"])
        .env(CHILD_ENDPOINT, server.endpoint())
        .env(CHILD_HOST, id.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let mut child = ChildGuard(child);
    let lines = common::lines_of(child.stdout.take().expect("child stdout"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .expect("child never said it registered");
        if line.contains(CHILD_MARKER) {
            break;
        }
    }
    let (old, _) = holder(&etcd, id).expect("the child's key");
    // A renewal or two, so the lease has run on from a renewal.
    std::thread::sleep(Duration::from_millis(1200));

    // systemd's Restart=: the process dies, the next one starts at once.
    child.kill().expect("SIGKILL the child");
    let killed = Instant::now();
    child.wait().expect("reap child");
    let host = HostLiveness::with_options(&etcd, id, b"restarted", options(false))
        .expect("a restart after a crash registers without an error");
    let waited = killed.elapsed();
    println!("crash-restart registered {waited:?} after the SIGKILL (TTL {TTL:?})");
    let lease = host.lease().expect("registered");
    assert_ne!(lease, old);
    // etcd deletes the key between TTL and TTL + 0.5 s after the last
    // renewal; the restart follows within a look interval.
    assert!(
        waited <= TTL + Duration::from_secs(1) + SLACK,
        "took {waited:?}"
    );
    assert!(
        waited >= Duration::from_millis(500),
        "registered before the old lease could have expired ({waited:?}): it wrote over it"
    );
    assert_eq!(holder(&etcd, id), Some((lease, b"restarted".to_vec())));
    host.close().expect("close");
}

#[test]
fn take_over_displaces_the_first_which_observes_its_loss() {
    let server = EtcdServer::start().expect("etcd");
    let (etcd1, etcd2) = (connect(&server.endpoint()), connect(&server.endpoint()));
    let id = Uuid::new_v4();
    let first = HostLiveness::with_options(&etcd1, id, b"first", options(false)).expect("first");
    let first_lease = first.lease().expect("first lease");

    let started = Instant::now();
    let second = HostLiveness::with_options(&etcd2, id, b"second", options(true))
        .expect("a take-over registers at once");
    let took = started.elapsed();
    let second_lease = second.lease().expect("second lease");
    assert!(took < Duration::from_secs(1) + SLACK, "took {took:?}");
    assert_eq!(holder(&etcd2, id), Some((second_lease, b"second".to_vec())));

    // The first learns it at its next renewal (its lease was revoked),
    // registers again, finds the taker alive past its TTL: Duplicate.
    let started = Instant::now();
    let bound = TTL / 3 + TTL + SLACK + SLACK;
    let mut seen = Vec::new();
    loop {
        let left = bound.saturating_sub(started.elapsed());
        let state = first
            .states()
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no Duplicate within {bound:?}; saw {seen:?}"));
        seen.push(state.clone());
        if state
            == (LivenessState::Duplicate {
                holder: second_lease,
            })
        {
            break;
        }
    }
    println!(
        "displaced holder told Duplicate {:?} after the take-over: {seen:?}",
        started.elapsed()
    );
    assert!(
        seen.contains(&LivenessState::Lost { lease: first_lease }),
        "the loss comes first: {seen:?}"
    );
    let err = first.leave().expect_err("the displaced one cannot leave");
    assert_eq!(err.kind(), ErrorKind::DuplicateId, "{err}");
    println!("displaced close: {err}");
    // The taker was never disturbed.
    assert_eq!(
        second.state(),
        LivenessState::Registered {
            lease: second_lease
        }
    );
    assert_eq!(holder(&etcd2, id), Some((second_lease, b"second".to_vec())));
    assert!(second.leave().expect("leave"));
}

#[test]
fn a_duplicate_on_a_shared_session_fails_too() {
    let server = EtcdServer::start().expect("etcd");
    let (etcd1, etcd2) = (connect(&server.endpoint()), connect(&server.endpoint()));
    let id = Uuid::new_v4();
    let first = HostLiveness::with_options(&etcd1, id, b"first", options(false)).expect("first");
    let lease = first.lease().expect("first lease");
    let session = fleetcoord::Session::new(&etcd2, TTL).expect("session");
    let started = Instant::now();
    let err = HostLiveness::with_session(&session, id, b"second", options(false))
        .expect_err("a live duplicate on a session fails");
    let detected = started.elapsed();
    println!("live duplicate on a session detected in {detected:?}: {err}");
    assert_eq!(err.kind(), ErrorKind::DuplicateId, "{err}");
    assert!(detected <= TTL + SLACK, "took {detected:?}");
    assert_eq!(first.state(), LivenessState::Registered { lease });
    assert_eq!(holder(&etcd1, id), Some((lease, b"first".to_vec())));
    // The session is shared: it stays.
    assert!(
        matches!(session.state(), LivenessState::Registered { .. }),
        "{:?}",
        session.state()
    );
    session.close().expect("close the session");
}

#[test]
fn a_duplicate_shard_member_id_is_refused_and_the_first_keeps_its_shards() {
    use fleetcoord::{ShardEvent, ShardMap, ShardOptions};
    const SHARDS: u32 = 4;
    let server = EtcdServer::start().expect("etcd");
    let (etcd1, etcd2) = (connect(&server.endpoint()), connect(&server.endpoint()));
    let options = || {
        ShardOptions::default()
            .with_member("worker-1")
            .with_ttl(TTL)
    };
    let first = ShardMap::join(&etcd1, "jobs", SHARDS, options()).expect("first join");
    for _ in 0..SHARDS {
        match first.events().recv_timeout(Duration::from_secs(10)) {
            Ok(ShardEvent::Acquired { .. }) => {}
            other => panic!("expected the first member's shards, got {other:?}"),
        }
    }
    let owned = first.owned();

    let started = Instant::now();
    let second = ShardMap::join(&etcd2, "jobs", SHARDS, options()).expect("second join");
    let holder = match second.events().recv_timeout(Duration::from_secs(5)) {
        Ok(ShardEvent::Waiting { holder }) => holder,
        other => panic!("expected Waiting, got {other:?}"),
    };
    let refused = match second.events().recv_timeout(TTL + SLACK) {
        Ok(ShardEvent::Duplicate { holder: h }) => {
            assert_eq!(h, holder);
            started.elapsed()
        }
        other => panic!("expected Duplicate within {:?}, got {other:?}", TTL + SLACK),
    };
    println!("duplicate member id refused in {refused:?}");
    assert!(second.owned().is_empty());
    let err = second
        .leave()
        .expect_err("a refused member's leave says why");
    assert_eq!(err.kind(), ErrorKind::DuplicateId, "{err}");
    println!("duplicate member leave: {err}");

    // The first never noticed: same shards, same tokens, no event.
    assert_eq!(first.owned(), owned);
    assert!(
        first.events().try_recv().is_err(),
        "the first member was disturbed"
    );
    let members = ShardMap::members_of(&etcd1, "jobs", &ShardOptions::default()).expect("members");
    assert_eq!(members.len(), 1);
    first.leave().expect("leave");
}
