//! `Mutex`: exclusion, fencing, and interop with Go's `etcdctl lock`
//! (Debian's etcd-client package), which keys its waiters
//! `<name>/<lease hex>` like Go's `concurrency.Mutex`: with prefix `""`
//! fleetcoord and etcdctl queue for the same lock and never both hold it.

mod common;

use common::EtcdctlChild;
use fleetcoord::{Error, LockOptions, Mutex, TxnOp, DEFAULT_LOCK_PREFIX};
use std::thread;
use std::time::{Duration, Instant};

// Generous: a loaded 2-core CI machine can take seconds per step.
const WAIT: Duration = Duration::from_secs(10);

/// A running `etcdctl lock NAME`: prints its key once it holds the lock and
/// holds it until SIGINT, when it unlocks and exits.
struct EtcdctlLock(EtcdctlChild);

impl EtcdctlLock {
    fn spawn(endpoint: &str, name: &str) -> EtcdctlLock {
        EtcdctlLock(EtcdctlChild::spawn(endpoint, &["lock", name]))
    }

    /// The key etcdctl prints once it holds the lock.
    fn held(&self, within: Duration) -> Option<String> {
        self.0.lines.recv_timeout(within).ok()
    }

    /// SIGINT, then waits for the exit.
    fn interrupt(self) {
        self.0.interrupt(WAIT);
    }
}

fn shared_with_etcdctl() -> LockOptions {
    LockOptions::default()
        .with_prefix("")
        .with_ttl(Duration::from_secs(5))
}

#[test]
fn etcdctl_holds_first_then_fleetcoord() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let mutex = Mutex::with_options(&etcd, "interop-a", shared_with_etcdctl()).unwrap();
    assert_eq!(mutex.key_prefix(), "interop-a/");

    let go = EtcdctlLock::spawn(&endpoint, "interop-a");
    let go_key = go.held(WAIT).expect("etcdctl takes a free lock");
    assert!(go_key.starts_with("interop-a/"), "{go_key}");
    assert!(
        mutex.try_lock().unwrap().is_none(),
        "etcdctl holds the lock; try_lock must not take it"
    );
    assert!(matches!(
        mutex.lock_timeout(Duration::from_millis(300)),
        Err(Error::Timeout(_))
    ));

    let mutex = std::sync::Arc::new(mutex);
    let locker = mutex.clone();
    let waiting = thread::spawn(move || {
        let guard = locker.lock().unwrap();
        (Instant::now(), guard)
    });
    thread::sleep(Duration::from_millis(500));
    assert!(
        !waiting.is_finished(),
        "fleetcoord locked while etcdctl holds"
    );
    let interrupted = Instant::now();
    go.interrupt();
    let (locked_at, guard) = waiting.join().unwrap();
    assert!(
        locked_at > interrupted,
        "locked before etcdctl was told to unlock"
    );
    // etcdctl unlocks by deleting its key; only then may anyone else hold.
    assert!(
        !common::etcdctl_keys(&endpoint, "interop-a/").contains(&go_key),
        "fleetcoord holds the lock while etcdctl's key still exists"
    );
    assert!(guard.is_held());
    assert!(guard.key().starts_with("interop-a/"));
    guard.unlock().unwrap();
}

#[test]
fn fleetcoord_holds_first_then_etcdctl() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let mutex = Mutex::with_options(&etcd, "interop-b", shared_with_etcdctl()).unwrap();
    let guard = mutex.lock().unwrap();

    let go = EtcdctlLock::spawn(&endpoint, "interop-b");
    let deadline = Instant::now() + WAIT;
    while common::etcdctl_keys(&endpoint, "interop-b/").len() < 2 {
        assert!(Instant::now() < deadline, "etcdctl never queued up");
        thread::sleep(Duration::from_millis(20));
    }
    assert!(
        go.held(Duration::from_millis(500)).is_none(),
        "etcdctl took the lock while fleetcoord holds it"
    );
    assert!(guard.is_held());
    let unlocked = Instant::now();
    guard.unlock().unwrap();
    let go_key = go
        .held(WAIT)
        .expect("etcdctl takes the lock once fleetcoord unlocks");
    println!(
        "fleetcoord unlock -> etcdctl holds: {:?}",
        unlocked.elapsed()
    );
    assert!(
        mutex.try_lock().unwrap().is_none(),
        "etcdctl holds {go_key}"
    );
    go.interrupt();
    let again = mutex.lock_timeout(WAIT).unwrap();
    again.unlock().unwrap();
}

#[test]
fn holders_are_exclusive_and_fenced() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let a = Mutex::new(&etcd, "jobs").unwrap();
    let b = Mutex::new(&etcd, "jobs").unwrap();
    assert_eq!(a.key_prefix(), format!("{DEFAULT_LOCK_PREFIX}jobs/"));

    let first = a.lock().unwrap();
    assert!(b.try_lock().unwrap().is_none());
    let wrote = first.txn_if_held([TxnOp::put("/jobs/owner", "a")]).unwrap();
    assert!(wrote.is_some(), "the holder's fenced write applies");
    let token = first.fencing_token();
    let first_contended = first.contended();

    let b = std::sync::Arc::new(b);
    let waiter = b.clone();
    let next = thread::spawn(move || waiter.lock().unwrap());
    thread::sleep(Duration::from_millis(300));
    assert!(!next.is_finished(), "two holders at once");
    first.unlock().unwrap();
    let second = next.join().unwrap();
    assert!(second.fencing_token() > token, "tokens only grow");
    // The guards say who waited behind a holder, and how long.
    assert!(!first_contended, "the first holder found nobody ahead");
    assert!(second.contended(), "the second waited behind the first");
    assert!(
        second.waited() >= Duration::from_millis(300),
        "{:?}",
        second.waited()
    );
    assert!(second.is_held());
    assert!(second.lost().try_recv().is_err());
    drop(second);
    // Dropping unlocks without waiting; the next lock gets it soon.
    let third = a.lock_timeout(WAIT).unwrap();
    assert!(third.fencing_token() > token);
    assert!(Mutex::new(&etcd, "a/b").is_err(), "names are one segment");
}

/// Options that set only a session TTL keep the mutex in the lock
/// namespace: it does not queue behind a held election of the same name
/// (with election options it used to take their prefix and wait there).
#[test]
fn options_never_move_a_mutex_into_the_elections_namespace() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let leader = fleetcoord::Election::new(&etcd, "shared-name")
        .unwrap()
        .campaign(b"leader")
        .unwrap();
    let mutex = Mutex::with_options(
        &etcd,
        "shared-name",
        LockOptions::default().with_ttl(Duration::from_secs(5)),
    )
    .unwrap();
    let guard = mutex
        .try_lock()
        .unwrap()
        .expect("the lock is free although the election of its name is held");
    assert!(
        guard.key().starts_with(DEFAULT_LOCK_PREFIX),
        "{}",
        guard.key()
    );
    guard.unlock().unwrap();
    leader.resign().unwrap();
    let election_prefix = fleetcoord::election::DEFAULT_ELECTION_PREFIX;
    assert!(matches!(
        Mutex::with_options(
            &etcd,
            "shared-name",
            LockOptions::default().with_prefix(election_prefix)
        ),
        Err(Error::InvalidArgument { what: "prefix", .. })
    ));
}
