//! Slow consumers against a real etcd: one test per watch-fed feed
//! (HostWatcher, LeaderObserver, EtcdCoordinator kv_watch, subscribe and
//! read_stream). Each opens its feed with a small capacity, stops reading
//! while far more changes than that are written (100,000, or as many as
//! stated on the test), and checks the one backpressure policy of the
//! driver:
//!
//! * the channel never holds more than its capacity, and it does reach it;
//! * while the consumer is stalled, the process's resident memory grows by
//!   far less than queueing every change would take (peak RSS, `VmHWM`,
//!   reset before the burst through `/proc/self/clear_refs`);
//! * once the consumer reads again, what it was told settles on etcd's real
//!   state — and a stream reader gets every entry exactly once, in order.
//!
//! The tests take turns (RSS is per process), and each prints what it
//! measured; `cargo test --test slow_consumers -- --nocapture` shows it.
//! Writers use a second connection and etcd transactions of up to 128 ops
//! where the feed allows it (fenced by a leadership, which makes
//! `Leadership::txn_if_leader` a general batch writer).

mod common;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use fleetcoord::coordinator::{
    Coordinator, EtcdCoordinator, EtcdCoordinatorOptions, Feed, KvEvent, Message, StreamEntry,
    StreamId, StreamPosition,
};
use fleetcoord::{
    list_hosts, Election, ElectionOptions, Error, Etcd, HostEvent, HostInfo, HostWatcher,
    LeaderInfo, Leadership, TxnOp, WatcherOptions,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Changes written while the consumer does not read.
const CHANGES: usize = 100_000;
/// Capacity of the feeds under test (the observer's is fixed).
const CAPACITY: usize = 128;
/// The observer's fixed capacity, as its docs state it: the channel holds
/// 1,024 leader changes.
const OBSERVER_CAPACITY: usize = 1024;
/// etcd's default limit of operations per transaction.
const OPS_PER_TXN: usize = 128;
/// Bytes of every value written, so that queued changes would be visible.
const VALUE_LEN: usize = 256;
/// Distinct keys the KV and host bursts cycle through.
const KEYS: usize = 1_000;
/// Writer threads of the multi-key bursts (each its own keys).
const WRITERS: usize = 8;
/// Changes to ONE key (a topic, the leader's value) for the pub/sub and
/// observer tests. Each is its own etcd revision, hence its own request
/// (etcd refuses a key twice in a transaction); at the 2,000–4,000 requests
/// a second a loaded 2-core machine manages, 100,000 would take 25–50 s
/// per test, so these two feeds get half of that.
const SINGLE_KEY_CHANGES: usize = 50_000;
/// Bytes of every value in the single-key bursts: larger, so that the
/// fewer changes would still take far more memory queued than the writer
/// threads' own stacks and buffers.
const SINGLE_KEY_VALUE_LEN: usize = 1024;
/// Connections, and threads on each, writing the single-key bursts.
const SINGLE_KEY_CONNECTIONS: usize = 4;
const SINGLE_KEY_THREADS: usize = 8;
/// What a consumer that fell behind may take to settle after it reads
/// again. Generous: a stream reader catches up on its whole backlog
/// through a channel of `CAPACITY`.
const SETTLE: Duration = Duration::from_secs(60);
/// How long a settled feed must stay quiet.
const QUIET: Duration = Duration::from_millis(500);
/// After the burst, how long the stalled consumer waits before measuring,
/// so that whatever the driver still does with the burst is done.
const AFTER_BURST: Duration = Duration::from_millis(500);

/// RSS is per process: the tests of this file take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    // Warnings of the library (a feed giving up, a resync failing) say why
    // a test failed; print them.
    let _ = log::set_logger(&StderrLog).map(|()| log::set_max_level(log::LevelFilter::Warn));
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            eprintln!("[{} {}] {}", record.level(), record.target(), record.args());
        }
    }

    fn flush(&self) {}
}

/// A field of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

fn rss_kib() -> u64 {
    status_kib("VmRSS")
}

fn peak_kib() -> u64 {
    status_kib("VmHWM")
}

/// Resets the peak RSS (`VmHWM`) to the current RSS (Linux >= 4.0).
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM via /proc/self/clear_refs");
}

/// Samples a channel's length every millisecond and keeps the maximum.
struct LenProbe {
    max: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl LenProbe {
    fn start<T: Send + 'static>(rx: Receiver<T>) -> LenProbe {
        let max = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (max, stop) = (max.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    max.fetch_max(rx.len(), Ordering::Relaxed);
                    thread::sleep(Duration::from_millis(1));
                }
            })
        };
        LenProbe {
            max,
            stop,
            thread: Some(thread),
        }
    }

    fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }
}

impl Drop for LenProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What one test measured.
struct Stall {
    feed: &'static str,
    capacity: usize,
    changes: usize,
    /// Bytes the changes would take as queued items (an unbounded feed).
    queued_bytes: u64,
    burst: Duration,
    rss_before_kib: u64,
    peak_stalled_kib: u64,
    rss_stalled_kib: u64,
    len_stalled: usize,
    probe: LenProbe,
}

impl Stall {
    /// Writes the burst with `produce` while nobody reads `rx`, then checks
    /// the bound: the channel is full, never over capacity, and memory grew
    /// by less than a quarter of what the queued changes would take.
    /// `produce` calls its argument once its writers are ready (their
    /// threads started, their connections dialled): memory is counted from
    /// there, so that the feed is charged with its own growth, not with the
    /// writers' stacks.
    fn run<T: Send + 'static>(
        feed: &'static str,
        rx: &Receiver<T>,
        capacity: usize,
        changes: usize,
        bytes_per_change: usize,
        produce: impl FnOnce(&mut dyn FnMut()),
    ) -> Stall {
        let probe = LenProbe::start(rx.clone());
        let mut start: Option<(u64, Instant)> = None;
        produce(&mut || {
            reset_peak();
            start = Some((rss_kib(), Instant::now()));
        });
        let (rss_before_kib, started) = start.expect("the burst never said its writers were ready");
        let burst = started.elapsed();
        thread::sleep(AFTER_BURST);
        let stall = Stall {
            feed,
            capacity,
            changes,
            queued_bytes: (changes * bytes_per_change) as u64,
            burst,
            rss_before_kib,
            peak_stalled_kib: peak_kib(),
            rss_stalled_kib: rss_kib(),
            len_stalled: rx.len(),
            probe,
        };
        println!(
            "{feed}: {changes} changes written in {:.2?} ({:.0}/s) while the consumer was \
             stalled; channel len {} of {capacity} (max seen {}); RSS {} KiB before, {} KiB \
             stalled, peak growth {} KiB; queued, the changes would take {} KiB",
            burst,
            changes as f64 / burst.as_secs_f64(),
            stall.len_stalled,
            stall.probe.max(),
            stall.rss_before_kib,
            stall.rss_stalled_kib,
            stall.growth_kib(),
            stall.queued_bytes / 1024,
        );
        assert!(
            stall.probe.max() <= capacity && stall.len_stalled <= capacity,
            "{feed}: the channel held more than its capacity {capacity}"
        );
        assert_eq!(
            stall.len_stalled, capacity,
            "{feed}: the burst did not fill the channel, so the bound was not exercised"
        );
        assert!(
            stall.growth_kib() * 1024 < stall.queued_bytes / 4,
            "{feed}: RSS grew by {} KiB while stalled; queueing all {changes} changes would \
             take {} KiB, and a bounded feed must stay far below that",
            stall.growth_kib(),
            stall.queued_bytes / 1024
        );
        stall
    }

    fn growth_kib(&self) -> u64 {
        self.peak_stalled_kib.saturating_sub(self.rss_before_kib)
    }

    /// Prints how catching up went and checks the bounds again: the
    /// channel never held more than its capacity, and catching up (one
    /// resync, one read) took memory of the order of the state, not of
    /// every change: less than half of what the changes would take queued.
    fn finish(&self, delivered: usize, catch_up: Duration) {
        let peak = peak_kib().saturating_sub(self.rss_before_kib);
        println!(
            "{}: consumer read again; settled after {:.2?} with {delivered} items delivered in \
             all (capacity {}); max channel len seen {}; peak RSS growth including the \
             catch-up {peak} KiB",
            self.feed,
            catch_up,
            self.capacity,
            self.probe.max()
        );
        println!(
            "SUMMARY {}: {} changes in {:.2?}; peak RSS growth {} KiB stalled, {peak} KiB with \
             the catch-up (queued: {} KiB); max channel len {} of {}; settled {:.2?} after \
             reading again, {delivered} items",
            self.feed,
            self.changes,
            self.burst,
            self.growth_kib(),
            self.queued_bytes / 1024,
            self.probe.max(),
            self.capacity,
            catch_up,
        );
        assert!(
            self.probe.max() <= self.capacity,
            "{}: the channel held more than its capacity",
            self.feed
        );
        assert!(
            peak * 1024 < self.queued_bytes / 2,
            "{}: RSS grew by {peak} KiB by the time the consumer caught up; queueing all {} \
             changes would take {} KiB, and catching up must not come near that",
            self.feed,
            self.changes,
            self.queued_bytes / 1024
        );
    }
}

/// A second connection that writes bursts: a leadership whose fenced
/// transaction carries any ops.
struct Writer {
    leadership: Leadership,
    _election: Election,
    etcd: Etcd,
}

impl Writer {
    fn new(endpoint: &str) -> Writer {
        Self::named(endpoint, "slow-consumers-writer")
    }

    /// A writer leading its own election `name`.
    fn named(endpoint: &str, name: &str) -> Writer {
        let etcd = common::connect(endpoint);
        let election = Election::new(&etcd, name).expect("election");
        let leadership = election.campaign(b"writer").expect("campaign");
        Writer {
            leadership,
            _election: election,
            etcd,
        }
    }

    /// Runs each transaction (at most 128 ops, no key twice), in order.
    /// Built as they are sent, so that the burst itself takes no memory.
    fn write(&self, txns: impl IntoIterator<Item = Vec<TxnOp>>) {
        for ops in txns {
            assert!(ops.len() <= OPS_PER_TXN);
            let done = self.leadership.txn_if_leader(ops).expect("txn");
            assert!(done.is_some(), "the writer lost its leadership");
        }
    }
}

/// A value of `VALUE_LEN` bytes that starts with `tag`.
fn value(tag: &str) -> Vec<u8> {
    sized(tag, VALUE_LEN)
}

/// A value of `len` bytes that starts with `tag`.
fn sized(tag: &str, len: usize) -> Vec<u8> {
    let mut v = tag.as_bytes().to_vec();
    v.resize(len.max(v.len()), b'.');
    v
}

/// Runs `change(connection, i)` for every `i` in `0..SINGLE_KEY_CHANGES`
/// on `SINGLE_KEY_CONNECTIONS` × `SINGLE_KEY_THREADS` threads at once;
/// thread `t` takes the `i` with `i % threads == t`, in increasing order.
/// Each thread first calls `warm(connection)` (a write the feed does not
/// see), then all wait until `ready` has been called.
fn single_key_burst(
    ready: &mut dyn FnMut(),
    warm: impl Fn(usize) + Sync,
    change: impl Fn(usize, usize) + Sync,
) {
    let threads = SINGLE_KEY_CONNECTIONS * SINGLE_KEY_THREADS;
    let warmed = std::sync::Barrier::new(threads + 1);
    let go = std::sync::Barrier::new(threads + 1);
    thread::scope(|s| {
        for t in 0..threads {
            let (change, warm, warmed, go) = (&change, &warm, &warmed, &go);
            s.spawn(move || {
                warm(t % SINGLE_KEY_CONNECTIONS);
                warmed.wait();
                go.wait();
                for i in (t..SINGLE_KEY_CHANGES).step_by(threads) {
                    change(t % SINGLE_KEY_CONNECTIONS, i);
                }
            });
        }
        warmed.wait();
        ready();
        go.wait();
    });
}

/// Writes `CHANGES` changes cycling through `KEYS` keys named by `key(k)`,
/// split by key over `WRITERS` threads (so each key's changes stay in
/// order), one transaction per thread and round: puts, except that in the
/// last round every tenth key is deleted.
fn cycling_burst(writer: &Writer, key: impl Fn(usize) -> Vec<u8> + Sync) {
    assert!(KEYS.div_ceil(WRITERS) <= OPS_PER_TXN && CHANGES.is_multiple_of(KEYS));
    let rounds = CHANGES / KEYS;
    let txn = |w: usize, round: usize| -> Vec<TxnOp> {
        (w..KEYS)
            .step_by(WRITERS)
            .map(|k| {
                if round == rounds - 1 && k % 10 == 0 {
                    TxnOp::delete(key(k))
                } else {
                    TxnOp::put(key(k), value(&format!("round {round} key {k}")))
                }
            })
            .collect()
    };
    thread::scope(|s| {
        for w in 0..WRITERS {
            let txn = &txn;
            s.spawn(move || writer.write((0..rounds).map(|round| txn(w, round))));
        }
    });
}

/// Receives until `settled(state)` holds and then nothing comes for
/// [`QUIET`]; `apply` folds each item into `state`. Returns the number of
/// items and the time taken.
fn read_until_settled<T, S>(
    what: &str,
    rx: &Receiver<T>,
    state: &mut S,
    mut apply: impl FnMut(&mut S, T),
    mut settled: impl FnMut(&S) -> bool,
) -> (usize, Duration) {
    let started = Instant::now();
    let mut count = 0;
    loop {
        assert!(
            started.elapsed() < SETTLE,
            "{what}: not settled {SETTLE:?} after the consumer read again ({count} items read)"
        );
        let wait = if settled(state) {
            QUIET
        } else {
            Duration::from_millis(100)
        };
        match rx.recv_timeout(wait) {
            Ok(item) => {
                count += 1;
                apply(state, item);
            }
            Err(RecvTimeoutError::Timeout) if wait == QUIET => return (count, started.elapsed()),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                panic!("{what}: the feed ended after {count} items")
            }
        }
    }
}

fn recv<T>(rx: &Receiver<T>, what: &str) -> T {
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[test]
fn host_watcher_stays_bounded_and_converges() {
    let _turn = serial();
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let writer = Writer::new(&endpoint);
    let prefix = "/slow/hosts/";
    let watcher = HostWatcher::with_options(
        &etcd,
        WatcherOptions::default()
            .with_prefix(prefix)
            .with_capacity(CAPACITY),
    )
    .expect("watch");
    let events = watcher.events();
    assert_eq!(recv(events, "empty snapshot"), HostEvent::Synced);

    let hosts: Vec<Uuid> = (0..KEYS).map(|_| Uuid::new_v4()).collect();
    let per_change = std::mem::size_of::<HostEvent>() + VALUE_LEN;
    let stall = Stall::run(
        "HostWatcher",
        events,
        CAPACITY,
        CHANGES,
        per_change,
        |ready| {
            ready();
            cycling_burst(&writer, |k| format!("{prefix}{}", hosts[k]).into_bytes())
        },
    );

    let truth: HashMap<Uuid, HostInfo> = list_hosts(&etcd, prefix)
        .expect("list_hosts")
        .into_iter()
        .map(|h| (h.id, h))
        .collect();
    assert_eq!(truth.len(), KEYS - KEYS / 10);
    let mut view = HashMap::new();
    let (delivered, took) = read_until_settled(
        "HostWatcher",
        events,
        &mut view,
        // Also checks the stream: no Down or Updated without Up, no second Up.
        common::apply,
        |view| *view == truth,
    );
    stall.finish(delivered, took);
    assert_eq!(view, truth, "the watcher's view is not etcd's hosts");
}

#[test]
fn leader_observer_stays_bounded_and_converges() {
    let _turn = serial();
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let name = "slow-observed";
    let election = Election::new(&common::connect(&endpoint), name).expect("election");
    let leadership = election.campaign(b"start").expect("campaign");
    let observer = Election::observe_of(&etcd, name, &ElectionOptions::default()).expect("observe");
    let leaders = observer.leaders();
    let first = recv(leaders, "current leader").expect("a leader");
    assert_eq!(first.value, b"start");

    // Every change rewrites the leader's key with a new value, as a
    // proclamation does, from several connections at once.
    let writers: Vec<Writer> = (0..SINGLE_KEY_CONNECTIONS)
        .map(|i| Writer::named(&endpoint, &format!("slow-observer-writer-{i}")))
        .collect();
    let key = leadership.key().to_owned();
    let lease = leadership.lease();
    let per_change = std::mem::size_of::<Option<LeaderInfo>>() + key.len() + SINGLE_KEY_VALUE_LEN;
    let final_value = sized("final", SINGLE_KEY_VALUE_LEN);
    let stall = Stall::run(
        "LeaderObserver",
        leaders,
        OBSERVER_CAPACITY,
        SINGLE_KEY_CHANGES,
        per_change,
        |ready| {
            let warm = |conn: usize| {
                let ops = vec![TxnOp::put(
                    format!("slow-observer-warm-{conn}"),
                    b"w".to_vec(),
                )];
                writers[conn].write(vec![ops]);
            };
            single_key_burst(ready, warm, |conn, i| {
                let value = sized(&format!("change {i}"), SINGLE_KEY_VALUE_LEN);
                writers[conn].write(vec![vec![TxnOp::put_with_lease(
                    key.as_bytes(),
                    value,
                    lease,
                )]]);
            });
            leadership.proclaim(&final_value).expect("proclaim");
        },
    );

    let truth = election.leader().expect("leader").expect("a leader");
    assert_eq!(truth.value, final_value);
    let mut last: Option<Option<LeaderInfo>> = None;
    let (delivered, took) = read_until_settled(
        "LeaderObserver",
        leaders,
        &mut last,
        |last, leader| {
            assert_ne!(last.as_ref(), Some(&leader), "a repeated leader");
            *last = Some(leader);
        },
        |last| last.as_ref() == Some(&Some(truth.clone())),
    );
    stall.finish(delivered, took);
    assert_eq!(
        last,
        Some(Some(truth)),
        "the observer's last leader is not etcd's"
    );
}

/// The coordinator a test reads through, with small feeds, and one on the
/// writer's connection with the same root.
fn coordinators(etcd: &Etcd, writer: &Writer, root: &str) -> (EtcdCoordinator, EtcdCoordinator) {
    let options = EtcdCoordinatorOptions::default().with_root(root);
    let reader =
        EtcdCoordinator::on_etcd_with_options(etcd, options.clone().with_feed_capacity(CAPACITY))
            .expect("coordinator");
    let writing =
        EtcdCoordinator::on_etcd_with_options(&writer.etcd, options).expect("coordinator");
    (reader, writing)
}

fn feed_rx<T>(feed: &Feed<T>) -> &Receiver<T> {
    feed.receiver()
}

/// The bucket as a fresh watch's snapshot shows it.
fn snapshot(coord: &EtcdCoordinator, bucket: &str) -> BTreeMap<String, Vec<u8>> {
    let watch = coord.kv_watch(bucket, "*").expect("kv_watch");
    let mut map = BTreeMap::new();
    loop {
        match recv(watch.receiver(), "snapshot") {
            KvEvent::Put { key, value } => {
                map.insert(key, value);
            }
            KvEvent::Synced => return map,
            other => panic!("{other:?} in a snapshot"),
        }
    }
}

#[test]
fn kv_watch_stays_bounded_and_converges() {
    let _turn = serial();
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let writer = Writer::new(&endpoint);
    let root = "/slowkv";
    let (coord, writing) = coordinators(&etcd, &writer, root);
    let watch = coord.kv_watch("b", "*").expect("kv_watch");
    let rx = feed_rx(&watch);
    assert_eq!(recv(rx, "empty snapshot"), KvEvent::Synced);

    let key = |k: usize| format!("k{k:04}");
    let per_change = std::mem::size_of::<KvEvent>() + key(0).len() + VALUE_LEN;
    let stall = Stall::run("kv_watch", rx, CAPACITY, CHANGES, per_change, |ready| {
        ready();
        cycling_burst(&writer, |k| format!("{root}/kv/b/{}", key(k)).into_bytes())
    });

    let truth = snapshot(&writing, "b");
    assert_eq!(truth.len(), KEYS - KEYS / 10);
    for k in [0, 1, 10, 999] {
        match writing.kv_get("b", &key(k)) {
            Ok(v) => assert_eq!(truth.get(&key(k)), Some(&v)),
            Err(Error::NotFound) => assert!(!truth.contains_key(&key(k))),
            Err(e) => panic!("kv_get: {e}"),
        }
    }
    let mut view = BTreeMap::new();
    let (delivered, took) = read_until_settled(
        "kv_watch",
        rx,
        &mut view,
        |view, event| match event {
            KvEvent::Put { key, value } => {
                view.insert(key, value);
            }
            KvEvent::Deleted { key } => {
                assert!(view.remove(&key).is_some(), "Deleted {key}, never told");
            }
            KvEvent::Synced => panic!("a second Synced"),
        },
        |view| *view == truth,
    );
    stall.finish(delivered, took);
    assert_eq!(view, truth, "the watch's view is not the bucket");
}

#[test]
fn subscription_stays_bounded_and_ends_with_the_last_message() {
    let _turn = serial();
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let writer = Writer::new(&endpoint);
    let root = "/slowps";
    let (coord, writing) = coordinators(&etcd, &writer, root);
    let publishers: Vec<EtcdCoordinator> = (0..SINGLE_KEY_CONNECTIONS)
        .map(|_| {
            let options = EtcdCoordinatorOptions::default().with_root(root);
            EtcdCoordinator::on_etcd_with_options(&common::connect(&endpoint), options)
                .expect("coordinator")
        })
        .collect();
    let sub = coord.subscribe("t").expect("subscribe");
    let rx = feed_rx(&sub);

    let per_change = std::mem::size_of::<Message>() + 1 + SINGLE_KEY_VALUE_LEN;
    let final_payload = sized("final", SINGLE_KEY_VALUE_LEN);
    let stall = Stall::run(
        "subscribe",
        rx,
        CAPACITY,
        SINGLE_KEY_CHANGES,
        per_change,
        |ready| {
            let warm = |conn: usize| {
                publishers[conn].publish("warm", b"w").expect("publish");
            };
            single_key_burst(ready, warm, |conn, i| {
                let payload = sized(&format!("{i:08} "), SINGLE_KEY_VALUE_LEN);
                publishers[conn].publish("t", &payload).expect("publish");
            });
            writing.publish("t", &final_payload).expect("publish");
        },
    );

    // Messages of one publishing thread arrive in its order, at most once.
    let threads = SINGLE_KEY_CONNECTIONS * SINGLE_KEY_THREADS;
    let mut last_of_thread: HashMap<usize, usize> = HashMap::new();
    let mut last: Option<Vec<u8>> = None;
    let (delivered, took) = read_until_settled(
        "subscribe",
        rx,
        &mut last,
        |last, msg| {
            assert_eq!(msg.topic, "t");
            let i = std::str::from_utf8(&msg.payload[..8])
                .ok()
                .and_then(|n| n.parse::<usize>().ok());
            if let Some(i) = i {
                let before = last_of_thread.insert(i % threads, i);
                assert!(
                    before.is_none_or(|b| b < i),
                    "message {i} after {before:?} of the same thread"
                );
            }
            *last = Some(msg.payload);
        },
        |last| last.as_ref() == Some(&final_payload),
    );
    stall.finish(delivered, took);
    assert_eq!(
        last,
        Some(final_payload),
        "the last message is not the last published"
    );
}

/// A stream must not coalesce: after the stall the reader resumes after
/// the last entry it delivered and must deliver all 100,010 entries, each
/// once, in order — whose re-read is far larger than one etcd response of
/// a few MiB.
#[test]
fn stream_reader_stays_bounded_and_delivers_every_entry_once() {
    let _turn = serial();
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let writer = Writer::new(&endpoint);
    let root = "/slowst";
    let (coord, writing) = coordinators(&etcd, &writer, root);
    let reader = coord
        .read_stream("s", StreamPosition::Start)
        .expect("read_stream");
    let rx = feed_rx(&reader);

    // Entries written as the append machine writes them (the head and the
    // entry keys), 127 entries and the head per transaction, in order;
    // then a few appends through the API continue after them.
    let entry = |seq: u64| value(&format!("entry {seq}"));
    let appended = 10;
    let entries = CHANGES;
    let per_change = std::mem::size_of::<StreamEntry>() + VALUE_LEN;
    let stall = Stall::run("read_stream", rx, CAPACITY, entries, per_change, |ready| {
        ready();
        writer.write((1..=entries as u64).step_by(OPS_PER_TXN - 1).map(|first| {
            let last = (first + OPS_PER_TXN as u64 - 2).min(entries as u64);
            let mut ops: Vec<TxnOp> = (first..=last)
                .map(|seq| TxnOp::put(format!("{root}/stream/s/e/{seq:020}"), entry(seq)))
                .collect();
            ops.push(TxnOp::put(
                format!("{root}/stream/s/head"),
                last.to_string(),
            ));
            ops
        }));
        for i in 1..=appended {
            let id = writing
                .append_stream("s", &entry(entries as u64 + i))
                .expect("append");
            assert_eq!(id, StreamId(entries as u64 + i));
        }
    });

    let total = entries as u64 + appended;
    let mut next = 1u64;
    let (delivered, took) = read_until_settled(
        "read_stream",
        rx,
        &mut next,
        |next, e| {
            assert_eq!(
                e.id,
                StreamId(*next),
                "entries out of order, repeated or lost"
            );
            assert_eq!(e.payload, entry(*next));
            *next += 1;
        },
        |next| *next > total,
    );
    stall.finish(delivered, took);
    assert_eq!(next, total + 1, "not every entry was delivered");
    assert_eq!(delivered as u64, total);
}
