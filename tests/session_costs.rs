//! What one `Session` costs etcd, read from etcd's own `/metrics` as
//! `tests/fleet_cost.rs` does: an idle agent with its host registration,
//! an election, three pool names and a mutex all on one session is renewed
//! as one lease (about three renewals per TTL), where the same agent
//! without a session keeps six leases and pays six times that.

mod common;

use common::{etcdctl_keys, start_etcd};
use fleetcoord::{
    Election, ElectionPool, Etcd, EtcdOptions, HostLiveness, LivenessState, LockOptions, Mutex,
    Session,
};
use std::thread;
use std::time::{Duration, Instant};
use uuid::Uuid;

const TTL: Duration = Duration::from_secs(3);
const WINDOW: Duration = Duration::from_secs(9);

/// Renewals etcd received per TTL during an idle window.
fn renewals_per_ttl(server: &fleetcoord::testing::EtcdServer) -> f64 {
    // Past the first renewals, so every stream is open.
    thread::sleep(TTL / 2);
    let before = server.grpc_counts().expect("metrics");
    let started = Instant::now();
    thread::sleep(WINDOW);
    let window = started.elapsed();
    let during = server.grpc_counts().expect("metrics").since(&before);
    during.received("LeaseKeepAlive") as f64 / (window.as_secs_f64() / TTL.as_secs_f64())
}

#[test]
fn an_idle_agent_on_one_session_costs_etcd_one_leases_renewals() {
    let server = start_etcd();
    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");

    // The agent on one session.
    let session = Session::new(&etcd, TTL).expect("session");
    let host = HostLiveness::with_session(&session, Uuid::new_v4(), b"{}", Default::default())
        .expect("host");
    let election =
        Election::with_session(&session, "rebalancer", Default::default()).expect("election");
    let leadership = election.campaign(b"me").expect("elected");
    let pool = ElectionPool::with_session(&session, Default::default());
    let shards: Vec<_> = ["shard-0", "shard-1", "shard-2"]
        .iter()
        .map(|n| pool.campaign(n, b"me").expect("shard"))
        .collect();
    let lock = Mutex::with_session(&session, "maintenance", LockOptions::default()).expect("mutex");
    let guard = lock.lock().expect("locked");
    let lease = session.lease().expect("a lease");
    assert_eq!(host.lease(), Some(lease));
    assert!(shards.iter().all(|s| s.lease() == lease) && leadership.lease() == lease);
    assert!(guard.key().ends_with(&format!("/{lease:x}")));
    let shared = renewals_per_ttl(&server);

    // The same agent without a session: six leases.
    let ttl = TTL;
    let _own_host = HostLiveness::register(&etcd, Uuid::new_v4(), b"{}", ttl).expect("host");
    let options = fleetcoord::ElectionOptions::default()
        .with_prefix("/own/")
        .with_ttl(ttl);
    let own_election = Election::with_options(&etcd, "rebalancer", options.clone()).expect("e");
    let own_leadership = own_election.campaign(b"me").expect("elected");
    let own_pool = ElectionPool::with_options(&etcd, options);
    let own_shards: Vec<_> = ["shard-0", "shard-1", "shard-2"]
        .iter()
        .map(|n| own_pool.campaign(n, b"me").expect("shard"))
        .collect();
    let own_lock = Mutex::with_options(
        &etcd,
        "maintenance",
        LockOptions::default()
            .with_prefix("/own-lock/")
            .with_ttl(ttl),
    )
    .expect("mutex");
    let own_guard = own_lock.lock().expect("locked");
    let both = renewals_per_ttl(&server);
    let own = both - shared;
    println!(
        "idle agent, host + election + 3 pool names + mutex, TTL {TTL:?}: one session \
         {shared:.2} renewals per TTL; six own leases {own:.2} per TTL"
    );
    // One lease renews about three times per TTL (a little more for the
    // margin its schedule keeps); two leases' worth would be six.
    assert!(
        (2.5..=4.5).contains(&shared),
        "{shared:.2} renewals per TTL for the whole agent on one session"
    );
    assert!(
        own >= 5.0 * shared,
        "six own leases cost only {own:.2} per TTL"
    );

    // The host is registered again when the session comes back on a new
    // lease: revoke the lease behind its back.
    assert!(matches!(host.state(), LivenessState::Registered { .. }));
    common::etcdctl(
        &server.endpoint(),
        &["lease", "revoke", &format!("{lease:x}")],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match host.state() {
            LivenessState::Registered { lease: l } if l != lease => break,
            s => assert!(Instant::now() < deadline, "not registered again: {s:?}"),
        }
        thread::sleep(Duration::from_millis(20));
    }
    let ours = |keys: Vec<String>| -> Vec<String> {
        keys.into_iter()
            .filter(|k| k.starts_with(host.key()))
            .collect()
    };
    let keys = ours(etcdctl_keys(&server.endpoint(), "/coord/hosts/"));
    // The host key alone (one key per host), written again on the new lease.
    assert_eq!(keys, vec![host.key().to_string()]);
    drop((
        leadership,
        shards,
        guard,
        own_leadership,
        own_shards,
        own_guard,
    ));
    let key = host.key().to_string();
    host.close().expect("leave");
    let keys = etcdctl_keys(&server.endpoint(), "/coord/hosts/");
    assert!(!keys.contains(&key), "{keys:?}");
    assert!(
        keys.contains(&format!("{key}/left")),
        "the leave marker: {keys:?}"
    );
    session.close().expect("close");
}
