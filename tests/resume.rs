//! `HostLiveness::detach` / `HostLiveness::resume` against a real etcd: a
//! resume takes the registration over only while the lease and the key
//! incarnation the detached process left still exist, and registers
//! afresh otherwise.

mod common;

use common::{connect, etcdctl, start_etcd};
use fleetcoord::{
    list_hosts, DownReason, HostEvent, HostLiveness, HostWatcher, LivenessOptions, LivenessState,
    Resume, Session, DEFAULT_HOSTS_PREFIX,
};
use std::time::{Duration, Instant};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(15);

fn options(ttl_secs: u64) -> LivenessOptions {
    LivenessOptions::default().with_ttl(Duration::from_secs(ttl_secs))
}

/// [`options`] of a host that publishes its incarnation for watchers.
fn published(ttl_secs: u64) -> LivenessOptions {
    options(ttl_secs).with_published_incarnation(true)
}

/// The host's metadata and lease as `list_hosts` reads them.
fn read_key(etcd: &fleetcoord::Etcd, id: Uuid) -> Option<(String, i64)> {
    list_hosts(etcd, DEFAULT_HOSTS_PREFIX)
        .expect("list hosts")
        .into_iter()
        .find(|h| h.id == id)
        .map(|h| (String::from_utf8(h.metadata).expect("utf-8"), h.lease))
}

fn registered_lease(host: &HostLiveness) -> i64 {
    match host.state() {
        LivenessState::Registered { lease } => lease,
        other => panic!("not registered: {other:?}"),
    }
}

#[test]
fn a_resume_within_the_ttl_keeps_lease_and_key_and_watchers_see_only_updated() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let watcher = HostWatcher::watch(&etcd).expect("watch");
    assert_eq!(watcher.events().recv_timeout(WAIT), Ok(HostEvent::Synced));
    let id = Uuid::new_v4();
    let host = HostLiveness::with_options(&etcd, id, b"one", options(5)).expect("register");
    let lease = registered_lease(&host);
    assert!(matches!(
        watcher.events().recv_timeout(WAIT),
        Ok(HostEvent::Up(_))
    ));
    let resume = host.detach().expect("detach");
    assert_eq!(resume.lease, lease);
    let text = resume.to_string();
    let resume: Resume = text.parse().expect("parse");
    let next = HostLiveness::resume(&etcd, resume, b"two", options(5)).expect("resume");
    assert!(next.resumed());
    assert_eq!(next.incarnation(), 2);
    assert_eq!(registered_lease(&next), lease);
    assert_eq!(read_key(&etcd, id), Some(("two".to_string(), lease)));
    match watcher.events().recv_timeout(WAIT) {
        Ok(HostEvent::Updated(info)) => {
            assert_eq!(info.metadata, b"two");
            assert_eq!(info.lease, lease);
        }
        other => panic!("expected Updated, got {other:?}"),
    }
    // Renewed from here on: alive past the first lease's TTL.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(registered_lease(&next), lease);
    assert!(watcher.events().try_recv().is_err(), "no Down, no Up");
    next.close().expect("close");
}

#[test]
fn a_resume_refuses_another_incarnation_of_the_key_and_registers_afresh() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let etcd = connect(&endpoint);
    let id = Uuid::new_v4();
    let host = HostLiveness::with_options(&etcd, id, b"one", options(30)).expect("register");
    let lease = registered_lease(&host);
    let key = host.key().to_string();
    let resume = host.detach().expect("detach");
    // Another incarnation of the key, on the very same lease: deleted and
    // written again, so only its create revision tells it apart.
    etcdctl(&endpoint, &["del", &key]);
    etcdctl(
        &endpoint,
        &["put", &key, "intruder", &format!("--lease={lease:x}")],
    );
    let next = HostLiveness::resume(&etcd, resume, b"two", options(30)).expect("register");
    assert!(!next.resumed());
    let fresh = registered_lease(&next);
    assert_ne!(fresh, lease);
    assert_eq!(read_key(&etcd, id), Some(("two".to_string(), fresh)));
    // The saved lease, still alive, is revoked once the new key is
    // written: it must not keep anything of this host's.
    let deadline = Instant::now() + WAIT;
    while etcd.lease_ttl(lease).expect("lease ttl").is_some() {
        assert!(
            Instant::now() < deadline,
            "the refused lease was never revoked"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    next.close().expect("close");
}

#[test]
fn a_resume_refuses_a_key_written_since_the_detach() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let etcd = connect(&endpoint);
    let host =
        HostLiveness::with_options(&etcd, Uuid::new_v4(), b"one", options(30)).expect("register");
    let lease = registered_lease(&host);
    let key = host.key().to_string();
    let resume = host.detach().expect("detach");
    // Same incarnation (create revision), same lease, but written since.
    etcdctl(
        &endpoint,
        &["put", &key, "other", &format!("--lease={lease:x}")],
    );
    let next = HostLiveness::resume(&etcd, resume, b"two", options(30)).expect("register");
    assert!(!next.resumed());
    assert_ne!(registered_lease(&next), lease);
    next.close().expect("close");
}

#[test]
fn a_resume_after_the_lease_expired_registers_afresh() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let etcd = connect(&endpoint);
    let watcher = HostWatcher::watch(&etcd).expect("watch");
    assert_eq!(watcher.events().recv_timeout(WAIT), Ok(HostEvent::Synced));
    let host =
        HostLiveness::with_options(&etcd, Uuid::new_v4(), b"one", options(2)).expect("register");
    let lease = registered_lease(&host);
    assert!(matches!(
        watcher.events().recv_timeout(WAIT),
        Ok(HostEvent::Up(_))
    ));
    let resume = host.detach().expect("detach");
    match watcher.events().recv_timeout(WAIT) {
        Ok(HostEvent::Down(_, reason)) => assert_eq!(reason, fleetcoord::DownReason::Expired),
        other => panic!("expected Down(Expired), got {other:?}"),
    }
    assert_eq!(etcd.lease_ttl(lease).expect("lease ttl"), None);
    let next = HostLiveness::resume(&etcd, resume, b"two", options(2)).expect("register");
    assert!(!next.resumed());
    assert_ne!(registered_lease(&next), lease);
    assert!(matches!(
        watcher.events().recv_timeout(WAIT),
        Ok(HostEvent::Up(_))
    ));
    next.close().expect("close");
}

/// The incarnation key's value, and whether it was written by the same
/// transaction on the same lease as the host key (what a reader joining the
/// two must check), as a plain etcd reader sees them.
fn read_incarnation(endpoint: &str, id: Uuid) -> (String, bool) {
    let key = format!("{DEFAULT_HOSTS_PREFIX}{id}");
    let fields = |key: &str| -> (String, String, String) {
        let out = etcdctl(endpoint, &["get", key, "-w", "fields"]);
        let field = |name: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("\"{name}\" : ")))
                .unwrap_or_default()
                .trim_matches('"')
                .to_string()
        };
        (field("Value"), field("Lease"), field("ModRevision"))
    };
    let (_, host_lease, host_mod) = fields(&key);
    let (value, lease, modified) = fields(&format!("{key}/incarnation"));
    let joined = !lease.is_empty() && lease == host_lease && modified == host_mod;
    (value, joined)
}

/// The host's incarnation as `list_hosts` reads it.
fn listed_incarnation(etcd: &fleetcoord::Etcd, id: Uuid) -> Option<u64> {
    list_hosts(etcd, DEFAULT_HOSTS_PREFIX)
        .expect("list hosts")
        .into_iter()
        .find(|h| h.id == id)
        .map(|h| h.incarnation)
}

fn next_event(watcher: &HostWatcher) -> HostEvent {
    watcher.events().recv_timeout(WAIT).expect("an event")
}

#[test]
fn each_resume_counts_one_more_incarnation_that_watchers_and_list_hosts_read_without_a_down() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let etcd = connect(&endpoint);
    let watcher = HostWatcher::watch(&etcd).expect("watch");
    assert_eq!(next_event(&watcher), HostEvent::Synced);
    let id = Uuid::new_v4();
    let mut host = HostLiveness::with_options(&etcd, id, b"m", published(30)).expect("register");
    let lease = registered_lease(&host);
    match next_event(&watcher) {
        HostEvent::Up(info) => assert_eq!((info.id, info.incarnation), (id, 1)),
        other => panic!("expected Up, got {other:?}"),
    }
    assert_eq!(read_incarnation(&endpoint, id), ("1".to_string(), true));
    assert_eq!(listed_incarnation(&etcd, id), Some(1));
    for n in 2..=4u64 {
        let resume = host.detach().expect("detach");
        host = HostLiveness::resume(&etcd, resume, b"m", published(30)).expect("resume");
        assert!(host.resumed());
        assert_eq!(host.incarnation(), n);
        assert_eq!(read_incarnation(&endpoint, id), (n.to_string(), true));
        // A restart that kept the registration: Updated, counted.
        match next_event(&watcher) {
            HostEvent::Updated(info) => {
                assert_eq!((info.id, info.lease, info.incarnation), (id, lease, n))
            }
            other => panic!("expected Updated, got {other:?}"),
        }
        assert_eq!(listed_incarnation(&etcd, id), Some(n));
    }
    // New metadata is written with it too.
    host.set_metadata(b"m2").expect("set_metadata");
    match next_event(&watcher) {
        HostEvent::Updated(info) => {
            assert_eq!((info.metadata, info.incarnation), (b"m2".to_vec(), 4))
        }
        other => panic!("expected Updated, got {other:?}"),
    }
    // A watcher started now reads it from its snapshot; `list_hosts`
    // lists the host once, not its incarnation key.
    let late = HostWatcher::watch(&etcd).expect("watch");
    match next_event(&late) {
        HostEvent::Up(info) => assert_eq!((info.id, info.incarnation), (id, 4)),
        other => panic!("expected Up, got {other:?}"),
    }
    assert_eq!(next_event(&late), HostEvent::Synced);
    let listed = list_hosts(&etcd, DEFAULT_HOSTS_PREFIX).expect("list hosts");
    assert_eq!(
        listed
            .iter()
            .map(|h| (h.id, h.incarnation))
            .collect::<Vec<_>>(),
        vec![(id, 4)]
    );
    assert!(
        watcher.events().try_recv().is_err(),
        "no Down, nothing else"
    );
    // The leave carries the last incarnation.
    host.close().expect("close");
    for w in [&watcher, &late] {
        match next_event(w) {
            HostEvent::Down(info, DownReason::Left) => {
                assert_eq!((info.id, info.incarnation), (id, 4))
            }
            other => panic!("expected Down(Left), got {other:?}"),
        }
    }
    // A host key written by another client, without an incarnation key:
    // unknown (0), though an older incarnation key is still there.
    let other =
        HostLiveness::with_options(&etcd, Uuid::new_v4(), b"o", published(30)).expect("register");
    let other_id = other.host_id();
    assert!(matches!(next_event(&watcher), HostEvent::Up(_)));
    let key = format!("{DEFAULT_HOSTS_PREFIX}{other_id}");
    let lease_arg = format!("--lease={:x}", registered_lease(&other));
    etcdctl(&endpoint, &["put", &key, "by hand", &lease_arg]);
    match next_event(&watcher) {
        HostEvent::Updated(info) => assert_eq!((info.id, info.incarnation), (other_id, 0)),
        e => panic!("expected Updated, got {e:?}"),
    }
    assert_eq!(
        read_incarnation(&endpoint, other_id),
        ("1".to_string(), false)
    );
    assert_eq!(listed_incarnation(&etcd, other_id), Some(0));
    drop(other);
}

/// A host on a shared session writes its incarnation key with its key, and
/// its leave deletes it: the session's lease outlives the registration.
#[test]
fn a_host_on_a_session_has_incarnation_one_and_its_leave_deletes_the_key() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let etcd = connect(&endpoint);
    let watcher = HostWatcher::watch(&etcd).expect("watch");
    assert_eq!(next_event(&watcher), HostEvent::Synced);
    let session = Session::new(&etcd, Duration::from_secs(30)).expect("session");
    let id = Uuid::new_v4();
    let host = HostLiveness::with_session(&session, id, b"m", published(30)).expect("register");
    match next_event(&watcher) {
        HostEvent::Up(info) => assert_eq!((info.id, info.incarnation), (id, 1)),
        other => panic!("expected Up, got {other:?}"),
    }
    assert_eq!(read_incarnation(&endpoint, id), ("1".to_string(), true));
    host.close().expect("close");
    match next_event(&watcher) {
        HostEvent::Down(info, DownReason::Left) => assert_eq!(info.incarnation, 1),
        other => panic!("expected Down(Left), got {other:?}"),
    }
    let incarnation_key = format!("{DEFAULT_HOSTS_PREFIX}{id}/incarnation");
    assert_eq!(
        etcdctl(&endpoint, &["get", &incarnation_key, "--print-value-only"]).trim(),
        "",
        "the incarnation key outlived the leave"
    );
    session.close().expect("close session");
}
