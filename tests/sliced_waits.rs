//! Waits you can cancel without losing your place (issue 36, part 2):
//! a campaign, lock or acquire started once ([`Pending`]) and waited on in
//! slices keeps its key, its create revision and so its place in the
//! queue, and writes nothing to etcd between slices; a cancel from another
//! thread returns within 50 ms with the key gone; `close(&self)` from
//! another thread ends a wait at once.
//!
//! etcd is read raw (etcd-client, not fleetcoord): its revision, which any
//! put or delete moves, and the candidate keys with their create
//! revisions. Each test has its own etcd, so that no other test's writes
//! move the revision.

mod common;

use common::{connect, start_etcd};
use fleetcoord::{
    Election, ElectionPool, Error, Mutex, Pending, Semaphore, DEFAULT_LOCK_PREFIX,
    DEFAULT_SEMAPHORE_PREFIX,
};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Generous: a loaded 2-core machine can take seconds per step.
const WAIT: Duration = Duration::from_secs(10);
const SLICE: Duration = Duration::from_millis(100);
/// How soon a cancel must return, and a wait end after a cancel or close.
const PROMPT: Duration = Duration::from_millis(50);

/// etcd read without fleetcoord.
struct Raw {
    runtime: tokio::runtime::Runtime,
    client: etcd_client::Client,
}

impl Raw {
    fn connect(endpoint: &str) -> Raw {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let client = runtime
            .block_on(etcd_client::Client::connect([endpoint], None))
            .expect("raw connect");
        Raw { runtime, client }
    }

    /// etcd's revision: moved by every put and delete, by nothing else.
    fn revision(&mut self) -> i64 {
        let response = self
            .runtime
            .block_on(self.client.get("/", None))
            .expect("raw get");
        response.header().expect("header").revision()
    }

    /// The keys under `prefix` with their create revisions, oldest first.
    fn keys(&mut self, prefix: &str) -> Vec<(String, i64)> {
        let options = etcd_client::GetOptions::new().with_prefix().with_sort(
            etcd_client::SortTarget::Create,
            etcd_client::SortOrder::Ascend,
        );
        let response = self
            .runtime
            .block_on(self.client.get(prefix, Some(options)))
            .expect("raw get");
        response
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.create_revision(),
                )
            })
            .collect()
    }

    /// Polls until `prefix` holds `n` keys; returns them.
    fn await_keys(&mut self, prefix: &str, n: usize) -> Vec<(String, i64)> {
        let deadline = Instant::now() + WAIT;
        loop {
            let keys = self.keys(prefix);
            if keys.len() == n {
                return keys;
            }
            assert!(
                Instant::now() < deadline,
                "{prefix} never held {n} keys: {keys:?}"
            );
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Runs `wait` in a thread of its own; its outcome and when it came
/// arrive on the receiver. A wait that never ends fails the test at a
/// bounded `recv_timeout` instead of hanging it.
fn in_thread(
    wait: impl FnOnce() -> fleetcoord::Result<()> + Send + 'static,
) -> crossbeam_channel::Receiver<(fleetcoord::Result<()>, Instant)> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    thread::spawn(move || {
        let outcome = wait();
        let _ = tx.send((outcome, Instant::now()));
    });
    rx
}

/// Waits on `pending` in slices of [`SLICE`] for `window`; every slice must
/// end without a win. Returns how many slices there were.
fn slice_for<T: std::fmt::Debug>(pending: &Pending<T>, window: Duration) -> u32 {
    let until = Instant::now() + window;
    let mut slices = 0;
    while Instant::now() < until {
        let started = Instant::now();
        let outcome = pending.wait_timeout(SLICE).expect("a slice");
        assert!(outcome.is_none(), "won while the holder holds: {outcome:?}");
        assert!(
            started.elapsed() < SLICE + Duration::from_millis(500),
            "a slice of {SLICE:?} took {:?}",
            started.elapsed()
        );
        slices += 1;
    }
    slices
}

/// Two candidates queued behind a leader, each waited on in 100 ms slices
/// for 10 s, keep their keys and their order (the first queued leads
/// first once the leader resigns, then the second), and nothing is
/// written to etcd meanwhile.
#[test]
fn sliced_candidates_keep_their_order_and_write_nothing() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let mut raw = Raw::connect(&server.endpoint());
    let leader = Election::new(&etcd, "ordered")
        .unwrap()
        .campaign(b"leader")
        .unwrap();
    let prefix = "/coord/election/ordered/";
    let first = Election::new(&etcd, "ordered").unwrap();
    let first_pending = first.start_campaign(b"first").unwrap();
    raw.await_keys(prefix, 2);
    let second = Election::new(&etcd, "ordered").unwrap();
    let second_pending = second.start_campaign(b"second").unwrap();
    let queued = raw.await_keys(prefix, 3);

    let revision = raw.revision();
    let window = Duration::from_secs(10);
    let (a, b) = thread::scope(|s| {
        let a = s.spawn(|| slice_for(&first_pending, window));
        let b = s.spawn(|| slice_for(&second_pending, window));
        (a.join().unwrap(), b.join().unwrap())
    });
    let after = raw.revision();
    println!("{a} and {b} slices of {SLICE:?} in {window:?}: revision {revision} -> {after}");
    assert!(a >= 50 && b >= 50, "too few slices: {a}, {b}");
    assert_eq!(
        after, revision,
        "etcd was written to while the candidates waited in slices"
    );
    assert_eq!(
        raw.keys(prefix),
        queued,
        "the queue changed: keys or create revisions"
    );

    leader.resign().unwrap();
    let first_leads = first_pending
        .wait_timeout(WAIT)
        .unwrap()
        .expect("the first in line leads next");
    assert_eq!(
        (first_leads.key().to_string(), first_leads.fencing_token()),
        queued[1],
        "it leads with the key it queued with"
    );
    assert!(
        second_pending.wait_timeout(SLICE).unwrap().is_none(),
        "the second waits behind the first"
    );
    first_leads.resign().unwrap();
    let second_leads = second_pending
        .wait_timeout(WAIT)
        .unwrap()
        .expect("then the second");
    assert_eq!(
        (second_leads.key().to_string(), second_leads.fencing_token()),
        queued[2]
    );
    assert!(
        matches!(
            second_pending.wait_timeout(SLICE),
            Err(Error::InvalidArgument {
                what: "campaign",
                ..
            })
        ),
        "a won campaign is not answered twice"
    );
    second_leads.resign().unwrap();
}

/// A cancel from another thread than the waiting one returns within 50 ms
/// with the key deleted in etcd, and the wait ends with `Canceled`; a
/// `Canceller` does the same from a third thread, and dropping a `Pending`
/// withdraws its key too. A second campaign while one is pending is
/// refused at once.
#[test]
fn a_cancel_from_another_thread_is_prompt_and_removes_the_key() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let mut raw = Raw::connect(&server.endpoint());
    let prefix = "/coord/election/cancel/";
    let _leader = Election::new(&etcd, "cancel")
        .unwrap()
        .campaign(b"leader")
        .unwrap();
    let election = Election::new(&etcd, "cancel").unwrap();
    let pending = election.start_campaign(b"waiter").unwrap();
    let waiter_key = raw.await_keys(prefix, 2)[1].0.clone();
    assert!(
        matches!(
            election.try_campaign(b"again"),
            Err(Error::InvalidArgument {
                what: "campaign",
                ..
            })
        ),
        "a second campaign of the election while one is pending"
    );
    assert!(matches!(
        election.start_campaign(b"again"),
        Err(Error::InvalidArgument {
            what: "campaign",
            ..
        })
    ));

    let revision = raw.revision();
    let pending = Arc::new(pending);
    let waiter = in_thread({
        let pending = pending.clone();
        move || pending.wait().map(drop)
    });
    thread::sleep(Duration::from_millis(300));
    assert!(waiter.try_recv().is_err(), "the wait ended by itself");
    let started = Instant::now();
    pending.cancel().expect("cancel");
    let took = started.elapsed();
    let (outcome, ended) = waiter.recv_timeout(WAIT).expect("the wait never ended");
    assert!(
        matches!(outcome, Err(Error::Canceled)),
        "the wait ends canceled: {outcome:?}"
    );
    let waited = ended.saturating_duration_since(started);
    println!("cancel returned after {took:?}; the waiting thread's wait after {waited:?}");
    assert!(took < PROMPT, "cancel took {took:?}");
    assert!(
        waited < PROMPT,
        "the wait ended {waited:?} after the cancel"
    );
    assert!(
        !raw.keys(prefix).iter().any(|(k, _)| *k == waiter_key),
        "the candidate key is still there"
    );
    assert_eq!(raw.revision(), revision + 1, "one delete, nothing else");
    assert!(matches!(pending.wait_timeout(SLICE), Err(Error::Canceled)));
    drop(Arc::try_unwrap(pending).expect("the waiting thread is done"));

    // A canceller, from a thread that never waited.
    let pending = election.start_campaign(b"waiter").unwrap();
    let waiter_key = raw.await_keys(prefix, 2)[1].0.clone();
    let canceller = pending.canceller();
    let took = thread::spawn(move || {
        let started = Instant::now();
        canceller.cancel().expect("cancel");
        (started.elapsed(), canceller)
    })
    .join()
    .unwrap();
    println!("a canceller's cancel returned after {:?}", took.0);
    assert!(took.0 < PROMPT, "cancel took {:?}", took.0);
    assert!(!raw.keys(prefix).iter().any(|(k, _)| *k == waiter_key));
    drop(pending);
    took.1
        .cancel()
        .expect("a canceller outliving its Pending does nothing");

    // Dropping withdraws in the background.
    let pending = election.start_campaign(b"waiter").unwrap();
    raw.await_keys(prefix, 2);
    drop(pending);
    raw.await_keys(prefix, 1);
}

/// `close(&self)` from another thread ends a wait at once with `Closed`:
/// an `Election`'s pending and blocking campaigns, an `ElectionPool`'s, and
/// a campaign on an `Etcd` that is closed.
#[test]
fn close_from_another_thread_ends_a_waiting_campaign() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let mut raw = Raw::connect(&server.endpoint());
    let _leader = Election::new(&etcd, "closing")
        .unwrap()
        .campaign(b"leader")
        .unwrap();
    let prefix = "/coord/election/closing/";
    let pending_one = Election::new(&etcd, "closing").unwrap();
    let blocking_one = Election::new(&etcd, "closing").unwrap();
    let pool = ElectionPool::new(&etcd);
    let other_etcd = connect(&server.endpoint());
    let on_other_etcd = Election::new(&other_etcd, "closing").unwrap();

    let pending_one = Arc::new(pending_one);
    let blocking_one = Arc::new(blocking_one);
    let pool = Arc::new(pool);
    let pending = pending_one.start_campaign(b"pending").unwrap();
    let waits = [
        in_thread(move || pending.wait().map(drop)),
        in_thread({
            let e = blocking_one.clone();
            move || e.campaign(b"blocking").map(drop)
        }),
        in_thread({
            let pool = pool.clone();
            move || pool.campaign("closing", b"pool").map(drop)
        }),
        in_thread(move || on_other_etcd.campaign(b"other").map(drop)),
    ];
    raw.await_keys(prefix, 5);
    thread::sleep(Duration::from_millis(200));
    assert!(waits.iter().all(|w| w.is_empty()), "a wait ended by itself");
    let closes: [&dyn Fn() -> fleetcoord::Result<()>; 4] = [
        &|| pending_one.close(),
        &|| blocking_one.close(),
        &|| pool.close(),
        &|| other_etcd.close(),
    ];
    let ended: Vec<Duration> = waits
        .into_iter()
        .zip(closes)
        .map(|(wait, close)| {
            let started = Instant::now();
            close().expect("close");
            let (outcome, at) = wait.recv_timeout(WAIT).expect("the wait never ended");
            assert!(
                matches!(outcome, Err(Error::Closed)),
                "a clear error: {outcome:?}"
            );
            at.saturating_duration_since(started)
        })
        .collect();
    println!("waits ended {ended:?} after their close (pending, blocking, pool, Etcd)");
    for took in ended {
        // A close also waits for the revoke; the wait ends before that.
        assert!(took < PROMPT * 4, "a wait ended {took:?} after its close");
    }
    assert!(matches!(
        pending_one.start_campaign(b"late"),
        Err(Error::Closed)
    ));
    assert_eq!(
        raw.await_keys(prefix, 1).len(),
        1,
        "every waiter's key is gone"
    );
}

/// The same for a `Mutex` and a `Semaphore` (shorter): waiters sliced for
/// 2 s keep their keys and order and write nothing, then hold in order.
#[test]
fn sliced_locks_and_acquires_keep_their_order() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let mut raw = Raw::connect(&server.endpoint());
    let window = Duration::from_secs(2);

    let holder = Mutex::new(&etcd, "sliced").unwrap().lock().unwrap();
    let prefix = format!("{DEFAULT_LOCK_PREFIX}sliced/");
    let first = Mutex::new(&etcd, "sliced").unwrap();
    let first_pending = first.start_lock().unwrap();
    raw.await_keys(&prefix, 2);
    let second = Mutex::new(&etcd, "sliced").unwrap();
    let second_pending = second.start_lock().unwrap();
    let queued = raw.await_keys(&prefix, 3);
    let revision = raw.revision();
    thread::scope(|s| {
        s.spawn(|| slice_for(&first_pending, window));
        s.spawn(|| slice_for(&second_pending, window));
    });
    assert_eq!(raw.revision(), revision, "a sliced lock wrote to etcd");
    assert_eq!(raw.keys(&prefix), queued);
    holder.unlock().unwrap();
    let guard = first_pending.wait_timeout(WAIT).unwrap().expect("first");
    assert_eq!(guard.fencing_token(), queued[1].1);
    assert!(second_pending.wait_timeout(SLICE).unwrap().is_none());
    guard.unlock().unwrap();
    let guard = second_pending.wait_timeout(WAIT).unwrap().expect("second");
    assert_eq!(guard.fencing_token(), queued[2].1);
    guard.unlock().unwrap();

    // Two permits: both held, two waiters behind.
    let semaphore = |n| Semaphore::new(&etcd, "sliced", n).unwrap();
    let holders = [semaphore(2), semaphore(2)];
    let held: Vec<_> = holders.iter().map(|h| h.acquire().unwrap()).collect();
    let prefix = format!("{DEFAULT_SEMAPHORE_PREFIX}sliced/");
    let first = semaphore(2);
    let first_pending = first.start_acquire().unwrap();
    raw.await_keys(&prefix, 3);
    let second = semaphore(2);
    let second_pending = second.start_acquire().unwrap();
    let queued = raw.await_keys(&prefix, 4);
    let revision = raw.revision();
    thread::scope(|s| {
        s.spawn(|| slice_for(&first_pending, window));
        s.spawn(|| slice_for(&second_pending, window));
    });
    assert_eq!(raw.revision(), revision, "a sliced acquire wrote to etcd");
    assert_eq!(raw.keys(&prefix), queued);
    let mut held = held.into_iter();
    held.next().unwrap().release().unwrap();
    let permit = first_pending.wait_timeout(WAIT).unwrap().expect("first");
    assert_eq!(permit.fencing_token(), queued[2].1);
    assert!(second_pending.wait_timeout(SLICE).unwrap().is_none());
    held.next().unwrap().release().unwrap();
    let other = second_pending.wait_timeout(WAIT).unwrap().expect("second");
    assert_eq!(other.fencing_token(), queued[3].1);
}
