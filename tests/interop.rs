//! A fleetcoord campaigner and Go's `etcdctl elect` (Debian's etcd-client
//! package) share one election: they never both lead, and each sees the
//! other as leader.
//!
//! `etcdctl elect <name> <value>` keys its candidates `<name>/<lease hex>`,
//! so fleetcoord joins with prefix `""` and the same name. On SIGINT it
//! resigns (deletes its key) before exiting; its 60 s session lease is left
//! to expire, which does not matter once the key is gone.

mod common;

use common::{ChildGuard, INSTALL};
use fleetcoord::{Election, ElectionOptions, TryCampaign};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

// Generous: a loaded 2-core CI machine can take seconds per step, and a Go
// process needs a moment to start.
const WAIT: Duration = Duration::from_secs(10);

const NAME: &str = "interop";

/// A running `etcdctl elect` whose stdout lines arrive on a channel.
struct Etcdctl {
    child: ChildGuard,
    lines: crossbeam_channel::Receiver<String>,
}

impl Etcdctl {
    fn spawn(endpoint: &str, args: &[&str]) -> Etcdctl {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoint, "elect"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run etcdctl ({e}); {INSTALL}"));
        let lines = common::lines_of(child.stdout.take().unwrap());
        Etcdctl {
            child: ChildGuard(child),
            lines,
        }
    }

    /// The next `(key, value)` pair etcdctl prints (once elected, or per
    /// observed leader in listen mode).
    fn next_leader(&self, within: Duration) -> Option<(String, String)> {
        let key = self.lines.recv_timeout(within).ok()?;
        let value = self
            .lines
            .recv_timeout(WAIT)
            .expect("a value line after the key line");
        Some((key, value))
    }

    /// SIGINT: etcdctl resigns, then exits. Waits for the exit.
    fn interrupt(mut self) {
        let status = Command::new("sh")
            .args(["-c", "kill -s INT \"$0\"", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + WAIT;
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "etcdctl did not exit after SIGINT"
            );
            thread::sleep(Duration::from_millis(10));
        }
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
