//! A fleetcoord campaigner and Go's `etcdctl elect` (Debian's etcd-client
//! package) share one election: they never both lead, and each sees the
//! other as leader.
//!
//! `etcdctl elect <name> <value>` keys its candidates `<name>/<lease hex>`,
//! so fleetcoord joins with prefix `""` and the same name. On SIGINT it
//! resigns (deletes its key) before exiting; its 60 s session lease is left
//! to expire, which does not matter once the key is gone.

mod common;

use common::EtcdctlChild;
use fleetcoord::{Election, ElectionOptions, TryCampaign};
use std::thread;
use std::time::{Duration, Instant};

// Generous: a loaded 2-core CI machine can take seconds per step, and a Go
// process needs a moment to start.
const WAIT: Duration = Duration::from_secs(10);

const NAME: &str = "interop";

/// A running `etcdctl elect`.
struct Etcdctl(EtcdctlChild);

impl Etcdctl {
    fn spawn(endpoint: &str, args: &[&str]) -> Etcdctl {
        let args: Vec<&str> = std::iter::once("elect")
            .chain(args.iter().copied())
            .collect();
        Etcdctl(EtcdctlChild::spawn(endpoint, &args))
    }

    /// The next `(key, value)` pair etcdctl prints (once elected, or per
    /// observed leader in listen mode).
    fn next_leader(&self, within: Duration) -> Option<(String, String)> {
        let key = self.0.lines.recv_timeout(within).ok()?;
        let value = self
            .0
            .lines
            .recv_timeout(WAIT)
            .expect("a value line after the key line");
        Some((key, value))
    }

    /// SIGINT: etcdctl resigns, then exits. Waits for the exit.
    fn interrupt(self) {
        self.0.interrupt(WAIT);
    }
}

#[test]
fn etcdctl_elect_and_fleetcoord_share_an_election() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let options = ElectionOptions::default()
        .with_prefix("")
        .with_ttl(Duration::from_secs(5));
    let ours = Election::with_options(&etcd, NAME, options).unwrap();
    assert_eq!(ours.key_prefix(), format!("{NAME}/"));

    // 1. etcdctl leads; fleetcoord sees it and cannot win.
    let go = Etcdctl::spawn(&endpoint, &[NAME, "go-value"]);
    let (go_key, go_value) = go
        .next_leader(WAIT)
        .expect("etcdctl is elected in an empty election");
    assert_eq!(go_value, "go-value");
    assert!(go_key.starts_with(&format!("{NAME}/")), "{go_key}");
    let leader = ours.leader().unwrap().expect("etcdctl leads");
    assert_eq!(
        (leader.key.as_str(), leader.value.as_slice()),
        (go_key.as_str(), &b"go-value"[..])
    );
    assert_eq!(
        format!("{NAME}/{:x}", leader.lease),
        go_key,
        "same key layout as Go"
    );
    match ours.try_campaign(b"rust-value").unwrap() {
        TryCampaign::NotElected(Some(l)) => assert_eq!(l.value, b"go-value".to_vec()),
        other => panic!("etcdctl leads, fleetcoord must not: {other:?}"),
    }

    // 2. A blocking campaign queues behind etcdctl and wins once it resigns.
    let ours = std::sync::Arc::new(ours);
    let campaigner = ours.clone();
    let campaign = thread::spawn(move || {
        let l = campaigner.campaign(b"rust-value").unwrap();
        (Instant::now(), l)
    });
    thread::sleep(Duration::from_millis(500));
    assert!(
        !campaign.is_finished(),
        "fleetcoord claimed leadership while etcdctl leads"
    );
    let resigned = Instant::now();
    go.interrupt();
    let (won_at, leadership) = campaign.join().unwrap();
    assert!(won_at > resigned);
    println!(
        "etcdctl SIGINT -> fleetcoord elected: {:?}",
        won_at.duration_since(resigned)
    );
    assert!(leadership.is_held());

    // 3. etcdctl's observer sees fleetcoord as leader, and its proclaims.
    let listen = Etcdctl::spawn(&endpoint, &["-l", NAME]);
    let (key, value) = listen
        .next_leader(WAIT)
        .expect("etcdctl -l reports the leader");
    assert_eq!(
        (key.as_str(), value.as_str()),
        (leadership.key(), "rust-value")
    );
    leadership.proclaim(b"rust-proclaimed").unwrap();
    let (key, value) = listen
        .next_leader(WAIT)
        .expect("etcdctl -l reports the proclaim");
    assert_eq!(
        (key.as_str(), value.as_str()),
        (leadership.key(), "rust-proclaimed")
    );

    // 4. Reverse roles: etcdctl queues behind fleetcoord and wins only after
    // fleetcoord resigns.
    let go = Etcdctl::spawn(&endpoint, &[NAME, "go-again"]);
    // etcdctl prints nothing until elected; give it time to queue up.
    let deadline = Instant::now() + WAIT;
    while common::etcdctl_keys(&endpoint, &format!("{NAME}/")).len() < 2 {
        assert!(Instant::now() < deadline, "etcdctl never queued up");
        thread::sleep(Duration::from_millis(20));
    }
    assert!(
        go.next_leader(Duration::from_millis(300)).is_none(),
        "etcdctl claimed leadership while fleetcoord leads"
    );
    assert!(leadership.is_held());
    leadership.resign().unwrap();
    let (key, value) = go
        .next_leader(WAIT)
        .expect("etcdctl is elected after fleetcoord resigned");
    assert_eq!(value, "go-again");
    let leader = ours.leader().unwrap().expect("etcdctl leads");
    assert_eq!(
        (leader.key, leader.value),
        (key.clone(), b"go-again".to_vec())
    );
    let (lkey, lvalue) = listen
        .next_leader(WAIT)
        .expect("etcdctl -l reports the new leader");
    assert_eq!((lkey, lvalue), (key, "go-again".to_string()));
    go.interrupt();
}
