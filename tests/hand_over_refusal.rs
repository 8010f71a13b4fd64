//! A leader's refusal of a hand-over request, against a real etcd: what
//! `Leadership::refuse_hand_over` records is what
//! `Election::hand_over_refusal` reads, fenced like every leader's write,
//! and the next request or a withdrawal removes it.

mod common;

use common::{connect, etcdctl, etcdctl_keys, start_etcd};
use fleetcoord::{Election, ElectionOptions};
use std::time::Duration;

fn options() -> ElectionOptions {
    ElectionOptions::default()
        .with_prefix("/test/refusal/")
        .with_ttl(Duration::from_secs(5))
}

#[test]
fn a_refusal_reaches_the_requester_until_the_next_request_or_a_withdrawal() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let election = Election::with_options(&etcd, "db", options()).expect("join");
    let leadership = election.campaign(b"a").expect("lead");
    let refusal = || Election::hand_over_refusal(&etcd, "db", &options()).expect("read");
    assert_eq!(refusal(), None);

    Election::request_hand_over(&etcd, "db", &options(), b"nobody").expect("request");
    assert_eq!(
        leadership.hand_over_requested().expect("read"),
        Some(b"nobody".to_vec())
    );
    let why = leadership.hand_over(b"nobody").expect_err("nobody waits");
    leadership
        .refuse_hand_over(&why.to_string())
        .expect("refuse");
    assert_eq!(refusal(), Some(why.to_string()));
    // The request is answered: the leader does not read it again.
    assert_eq!(leadership.hand_over_requested().expect("read"), None);
    assert!(leadership.is_held(), "a refusal keeps the leadership");

    // A new request is not answered by the old refusal.
    Election::request_hand_over(&etcd, "db", &options(), b"other").expect("request");
    assert_eq!(refusal(), None);
    leadership.refuse_hand_over("busy").expect("refuse");
    assert_eq!(refusal().as_deref(), Some("busy"));
    Election::withdraw_hand_over_request(&etcd, "db", &options()).expect("withdraw");
    assert_eq!(refusal(), None);
    assert!(etcdctl_keys(&server.endpoint(), "/test/refusal/db\u{1f}").is_empty());

    // A deposed leader's refusal writes nothing: the fence refuses it.
    Election::request_hand_over(&etcd, "db", &options(), b"x").expect("request");
    etcdctl(&server.endpoint(), &["del", leadership.key()]);
    leadership.refuse_hand_over("late").expect("refuse");
    assert_eq!(refusal(), None);
}

/// The order of a leadership's end and its hand-over's answer
/// (`ElectionNotice::HandOverFailed`'s docs): a hand-over cut short by the
/// loss of the leadership (here the session's deadline passes while etcd
/// is cut off) returns `NotLeader` only after `lost()` fired, so its
/// caller never finds the leadership still believed. Bounded: the loss
/// comes within the TTL, and the target leads once etcd is back.
#[test]
fn a_hand_over_cut_short_by_a_loss_returns_not_leader_after_lost_fired() {
    use fleetcoord::testing::{FaultProxy, Mode};
    use fleetcoord::{Error, Etcd, EtcdOptions};
    use std::time::Instant;
    let server = start_etcd();
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let cut_off = Etcd::with_options(
        &[proxy.endpoint()],
        EtcdOptions::default().with_request_timeout(Duration::from_secs(10)),
    )
    .expect("connect through the proxy");
    let direct = connect(&server.endpoint());
    let options = || {
        ElectionOptions::default()
            .with_prefix("/test/cut/")
            .with_ttl(Duration::from_secs(2))
    };
    let a = Election::with_options(&cut_off, "db", options()).expect("join a");
    let b = Election::with_options(&direct, "db", options()).expect("join b");
    let leadership = a.campaign(b"a").expect("a leads");
    let waiting = b.start_campaign(b"b").expect("b waits");
    let queued = Instant::now();
    while etcdctl_keys(&server.endpoint(), "/test/cut/db/").len() < 2 {
        assert!(queued.elapsed() < Duration::from_secs(10), "b never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    proxy.set_mode(Mode::Blackhole);
    let started = Instant::now();
    let answer = leadership.hand_over(b"b");
    let took = started.elapsed();
    let lost = leadership.lost().try_recv();
    let held = leadership.is_held();
    proxy.set_mode(Mode::Pass);
    assert!(matches!(answer, Err(Error::NotLeader)), "{answer:?}");
    assert_eq!(lost, Ok(()), "lost() had not fired when hand_over returned");
    assert!(!held, "still believed when hand_over returned");
    assert!(took < Duration::from_secs(5), "the loss took {took:?}");
    let next = waiting
        .wait_timeout(Duration::from_secs(15))
        .expect("b's campaign")
        .expect("b leads once a's key is gone");
    assert!(next.fencing_token() > leadership.fencing_token());
}
