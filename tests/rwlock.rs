//! `RwLock` against a real etcd: readers share, a writer excludes every
//! holder (checked on what the holders believed, with many handles racing),
//! a stale token is refused, a killed holder frees the lock within its
//! TTL + 1 s, and the key layout is that of Go's `recipes.RWMutex`
//! (keys written by hand as Go's source writes them, with etcdctl).

mod common;

use common::ChildGuard;
use fleetcoord::{Error, LockOptions, RwLock, RwLockGuard, RwMode, TxnOp, DEFAULT_RWLOCK_PREFIX};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

// Generous: a loaded 2-core CI machine can take seconds per step.
const WAIT: Duration = Duration::from_secs(10);

const CHILD_ENDPOINT: &str = "FLEETCOORD_TEST_RWLOCK_CHILD_ENDPOINT";
const CHILD_MARKER: &str = "fleetcoord-rwlock-child: holds";
/// The killed child's session TTL.
const CHILD_TTL: Duration = Duration::from_secs(2);

fn options() -> LockOptions {
    LockOptions::default().with_ttl(Duration::from_secs(5))
}

/// Whether the thread's result arrived within `within`.
fn finished_within<T>(handle: &thread::JoinHandle<T>, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if handle.is_finished() {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    handle.is_finished()
}

#[test]
fn readers_share_a_writer_waits_for_them_and_later_readers_wait_for_it() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let lock = |_| Arc::new(RwLock::with_options(&etcd, "catalog", options()).unwrap());
    let (a, b, w, late) = (lock(0), lock(1), lock(2), lock(3));
    assert_eq!(a.key_prefix(), format!("{DEFAULT_RWLOCK_PREFIX}catalog/"));

    let ra = a.read().unwrap();
    let rb = b.read().unwrap();
    assert!(ra.is_held() && rb.is_held(), "two readers hold together");
    assert_eq!(ra.mode(), RwMode::Read);
    assert!(!rb.contended(), "a reader behind a reader does not wait");
    assert!(
        ra.key().starts_with("/coord/rwlock/catalog/read/"),
        "{}",
        ra.key()
    );

    let writer = w.clone();
    let writing = thread::spawn(move || writer.write().unwrap());
    assert!(
        !finished_within(&writing, Duration::from_millis(500)),
        "a writer held beside two readers"
    );
    // Writer-preferring: a reader that comes after a waiting writer queues
    // behind it, so readers cannot starve writers.
    assert!(
        late.try_read().unwrap().is_none(),
        "a reader jumped a waiting writer"
    );
    assert!(matches!(
        late.read_timeout(Duration::from_millis(300)),
        Err(Error::Timeout(_))
    ));
    ra.unlock().unwrap();
    assert!(
        !finished_within(&writing, Duration::from_millis(300)),
        "a writer held beside a reader"
    );
    let released = Instant::now();
    rb.unlock().unwrap();
    let wg = writing.join().unwrap();
    println!(
        "last reader's unlock -> writer holds: {:?}",
        released.elapsed()
    );
    assert_eq!(wg.mode(), RwMode::Write);
    assert!(wg.contended());
    assert!(
        wg.waited() >= Duration::from_millis(800),
        "{:?}",
        wg.waited()
    );
    assert!(
        wg.key().starts_with("/coord/rwlock/catalog/write/"),
        "{}",
        wg.key()
    );

    let reader = late.clone();
    let reading = thread::spawn(move || reader.read().unwrap());
    assert!(
        !finished_within(&reading, Duration::from_millis(300)),
        "a reader held beside the writer"
    );
    let token = wg.fencing_token();
    wg.unlock().unwrap();
    let rl = reading.join().unwrap();
    assert!(rl.fencing_token() > token);
    rl.unlock().unwrap();
}

/// Many handles of one lock take reads and writes in turn; each notes the
/// instants between its lock returning and its unlock being called (within
/// what it believed). No writer's interval may overlap any other, and
/// readers' intervals must overlap somewhere (else the test proved nothing
/// about sharing).
#[test]
fn no_writer_overlaps_any_holder_while_readers_overlap() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    type Interval = (RwMode, Instant, Instant, i64);
    let log: Arc<Mutex<Vec<Interval>>> = Arc::default();
    let started = Instant::now();
    let workers: Vec<_> = (0..5)
        .map(|i| {
            let lock = RwLock::with_options(&etcd, "stress", options()).unwrap();
            let log = log.clone();
            thread::spawn(move || {
                for round in 0..6 {
                    // Writers one time in three, readers the rest.
                    let mode = if (i + round) % 3 == 0 {
                        RwMode::Write
                    } else {
                        RwMode::Read
                    };
                    let guard = lock.lock(mode, Some(WAIT)).unwrap();
                    let from = Instant::now();
                    thread::sleep(Duration::from_millis(40));
                    assert!(guard.is_held());
                    let to = Instant::now();
                    log.lock()
                        .unwrap()
                        .push((mode, from, to, guard.fencing_token()));
                    guard.unlock().unwrap();
                }
                lock.close().unwrap();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let log = log.lock().unwrap();
    let mut shared = 0;
    for (i, a) in log.iter().enumerate() {
        for b in log.iter().skip(i + 1) {
            let overlap = a.1 < b.2 && b.1 < a.2;
            if !overlap {
                continue;
            }
            assert!(
                a.0 == RwMode::Read && b.0 == RwMode::Read,
                "{:?} (token {}) and {:?} (token {}) held at once",
                a.0,
                a.3,
                b.0,
                b.3
            );
            shared += 1;
        }
    }
    let writes = log.iter().filter(|i| i.0 == RwMode::Write).count();
    println!(
        "{} holds ({writes} writes), {shared} overlapping read pairs, {:?}",
        log.len(),
        started.elapsed()
    );
    assert_eq!(log.len(), 30);
    assert!(shared > 0, "no two readers ever held together");
    let tokens: std::collections::BTreeSet<i64> = log.iter().map(|i| i.3).collect();
    assert_eq!(tokens.len(), log.len(), "a token was handed out twice");
}

/// A holder whose key etcd no longer has (deleted here by hand, as an
/// operator or a lease expiry would) is refused by the fence, and learns
/// it lost the lock; the next writer holds with a greater token.
#[test]
fn a_stale_token_is_refused() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let a = RwLock::with_options(&etcd, "fenced", options()).unwrap();
    let b = RwLock::with_options(&etcd, "fenced", options()).unwrap();
    for mode in [RwMode::Read, RwMode::Write] {
        let guard = a.lock(mode, Some(WAIT)).unwrap();
        let wrote = guard.txn_if_held([TxnOp::put("/fenced/x", "1")]).unwrap();
        assert!(
            wrote.is_some(),
            "{mode:?}: the holder's fenced write applies"
        );
        common::etcdctl(&endpoint, &["del", guard.key()]);
        let refused = guard.txn_if_held([TxnOp::put("/fenced/x", "2")]).unwrap();
        assert!(refused.is_none(), "{mode:?}: a stale token's write applied");
        guard
            .lost()
            .recv_timeout(WAIT)
            .expect("a refused fence ends the hold");
        assert!(!guard.is_held());
        let token = guard.fencing_token();
        drop(guard);
        let next = b.write_timeout(WAIT).unwrap();
        assert!(next.fencing_token() > token);
        next.unlock().unwrap();
    }
    let value = common::etcdctl(&endpoint, &["get", "/fenced/x", "--print-value-only"]);
    assert_eq!(
        value.trim(),
        "1",
        "only the fenced writes of a holder applied"
    );
}

/// The child process of `a_killed_writer_frees_the_lock_within_ttl_and_a_second`:
/// takes the write and holds it until killed. Returns at once in a
/// normal run.
#[test]
fn child_rwlock_writer() {
    let Ok(endpoint) = std::env::var(CHILD_ENDPOINT) else {
        return;
    };
    let etcd = common::connect(&endpoint);
    let lock =
        RwLock::with_options(&etcd, "crash", LockOptions::default().with_ttl(CHILD_TTL)).unwrap();
    let guard = lock.write().unwrap();
    println!("{CHILD_MARKER} {}", guard.key());
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_killed_writer_frees_the_lock_within_ttl_and_a_second() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let child = common::this_test_binary()
        .args(["--exact", "child_rwlock_writer", "--nocapture"])
        .env(CHILD_ENDPOINT, server.endpoint())
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
        let line = lines.recv_timeout(left).expect("the child never held");
        if line.contains(CHILD_MARKER) {
            break;
        }
    }
    let reader = RwLock::with_options(&etcd, "crash", options()).unwrap();
    assert!(
        reader.try_read().unwrap().is_none(),
        "the child holds the write"
    );
    // A renewal, so the lease has run on from one.
    thread::sleep(Duration::from_millis(800));
    child.kill().expect("SIGKILL the child");
    let killed = Instant::now();
    child.wait().expect("reap child");
    let guard = reader.read_timeout(WAIT).unwrap();
    let freed = killed.elapsed();
    println!("killed writer -> reader holds: {freed:?} (TTL {CHILD_TTL:?})");
    assert!(
        freed <= CHILD_TTL + Duration::from_secs(1),
        "the lock was freed {freed:?} after the kill"
    );
    assert!(guard.contended());
    guard.unlock().unwrap();
}

/// Go's `recipes.RWMutex` with prefix `rw` writes `rw/read/<unix nanos>`
/// and `rw/write/<unix nanos>`, value "", on its session's lease; a
/// reader waits for the newest older key under `rw/write`, a writer for
/// the newest older key under `rw/`. The Go keys are written here with
/// etcdctl as that source writes them; fleetcoord with prefix `""` and
/// name `rw` must queue behind them, and its keys must lie where a Go
/// process looks.
#[test]
fn go_recipes_rwmutex_keys_queue_with_fleetcoord() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let shared = LockOptions::default()
        .with_prefix("")
        .with_ttl(Duration::from_secs(5));
    let ours = Arc::new(RwLock::with_options(&etcd, "rw", shared.clone()).unwrap());
    assert_eq!(ours.key_prefix(), "rw/");

    // A Go writer holds: our reader and writer both wait for it.
    let go_writer = "rw/write/1765000000000000001";
    common::etcdctl(&endpoint, &["put", go_writer, ""]);
    assert!(
        ours.try_read().unwrap().is_none(),
        "read beside a Go writer"
    );
    assert!(
        ours.try_write().unwrap().is_none(),
        "write beside a Go writer"
    );
    let reader = ours.clone();
    let reading = thread::spawn(move || reader.read().unwrap());
    assert!(!finished_within(&reading, Duration::from_millis(400)));
    common::etcdctl(&endpoint, &["del", go_writer]); // Go's RUnlock/Unlock
    let read: RwLockGuard = reading.join().unwrap();
    // Where Go's writer looks (`rw/`, oldest first): our reader's key.
    assert!(read.key().starts_with("rw/read/"), "{}", read.key());
    let value = common::etcdctl(&endpoint, &["get", read.key(), "--print-value-only"]);
    assert_eq!(
        value.trim(),
        "",
        "Go's keys carry no value; neither do ours"
    );

    // A Go reader beside ours: both read; our writer waits for both.
    let go_reader = "rw/read/1765000000000000002";
    common::etcdctl(&endpoint, &["put", go_reader, ""]);
    let other = RwLock::with_options(&etcd, "rw", shared).unwrap();
    assert!(
        other.try_write().unwrap().is_none(),
        "write beside Go and our readers"
    );
    read.unlock().unwrap();
    assert!(
        other.try_write().unwrap().is_none(),
        "write beside a Go reader"
    );
    assert!(
        other.try_read().unwrap().is_some(),
        "a reader holds beside a Go reader"
    );
    common::etcdctl(&endpoint, &["del", go_reader]);
    let write = other.write_timeout(WAIT).unwrap();
    assert!(write.key().starts_with("rw/write/"), "{}", write.key());
    write.unlock().unwrap();
}

#[test]
fn bad_names_and_foreign_namespaces_are_refused_before_anything_is_sent() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    for name in ["", "a/b", "x\u{0}y"] {
        match RwLock::new(&etcd, name) {
            Err(Error::InvalidArgument { what: "name", .. }) => {}
            other => panic!("{name:?}: {:?}", other.map(|l| l.key_prefix().to_string())),
        }
    }
    let in_locks = LockOptions::default().with_prefix(fleetcoord::DEFAULT_LOCK_PREFIX);
    assert!(matches!(
        RwLock::with_options(&etcd, "x", in_locks),
        Err(Error::InvalidArgument { what: "prefix", .. })
    ));
    let short = LockOptions::default().with_ttl(Duration::from_millis(500));
    assert!(matches!(
        RwLock::with_options(&etcd, "x", short),
        Err(Error::InvalidArgument { .. })
    ));
    let keys = common::etcdctl_keys(&server.endpoint(), "");
    assert!(keys.is_empty(), "a refused lock left keys: {keys:?}");
}
