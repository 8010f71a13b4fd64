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
