//! The public conformance suite every [`Coordinator`] backend must pass,
//! including third-party ones:
//!
//! ```no_run
//! // In tests/conformance_mine.rs, inside a #[test] function:
//! use fleetcoord::coordinator::MemoryCoordinator;
//!
//! let hub = MemoryCoordinator::new();
//! let report = fleetcoord::conformance::run(|| Box::new(hub.clone()));
//! assert!(report.skipped.is_empty());
//! ```
//!
//! **The factory.** Each call must return a new, independent handle onto
//! *the same* backing store — as two processes connected to the same server
//! would be — because several cases check that what one handle writes
//! another sees. Closing one handle must not affect the others. Each case
//! opens its own handles and closes them at its end; names carry a random
//! suffix, so cases never see each other's data even on a shared server.
//!
//! **Asynchronous backends.** Every expected delivery may take up to
//! [`WAIT`]; absence is checked for at most [`QUIET`], or not at all where
//! per-topic, per-stream or per-bucket ordering lets a later item prove that
//! an earlier one was never sent.
//!
//! **Declarations.** Cases a backend declares it cannot pass (through
//! [`Coordinator::capabilities`]) are skipped, and each skip is printed as
//! `skipped: <case> (backend declares ...)` on standard error, bypassing the
//! test harness's output capture so it is always visible.
//!
//! [`run`] runs every case, then panics listing each failed case and why.

use super::{
    Capabilities, Coordinator, Feed, KvEvent, Message, StreamEntry, StreamId, StreamPosition,
    MAX_PAYLOAD,
};
use crate::error::{Error, Result};
use crossbeam_channel::{RecvTimeoutError, TryRecvError};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

/// How long one expected item may take to arrive. Generous on purpose:
/// networked backends deliver in tens of milliseconds, but CI machines
/// stall for seconds, and a slow pass is better than a flaky failure. A
/// passing run never waits this long.
pub const WAIT: Duration = Duration::from_secs(5);

/// How long the suite watches for an item that must not arrive. Short,
/// because every passing run pays it.
pub const QUIET: Duration = Duration::from_millis(200);

/// What a run did. Failed cases make [`run`] panic instead of returning.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Report {
    /// What the backend declared.
    pub capabilities: Capabilities,
    /// Cases that ran and passed.
    pub passed: Vec<&'static str>,
    /// Cases skipped by declaration, with the declaration.
    pub skipped: Vec<(&'static str, &'static str)>,
}

/// Runs every case against handles from `factory` (see the module docs for
/// what the factory must return). Panics, after running all cases, with the
/// name and failure of each case that failed.
pub fn run<F: Fn() -> Box<dyn Coordinator>>(factory: F) -> Report {
    run_selected(factory, |_| true)
}

/// [`run`] restricted to the cases whose name `select` accepts.
fn run_selected<F: Fn() -> Box<dyn Coordinator>>(
    factory: F,
    select: impl Fn(&str) -> bool,
) -> Report {
    let capabilities = {
        let probe = factory();
        let caps = probe.capabilities();
        let _ = probe.close();
        caps
    };
    let mut report = Report {
        capabilities,
        ..Report::default()
    };
    let mut failures = Vec::new();
    for case in CASES.iter().filter(|c| select(c.name)) {
        if let Some(reason) = case.needs.unmet(&capabilities) {
            let _ = writeln!(
                std::io::stderr().lock(),
                "skipped: {} (backend declares {reason})",
                case.name
            );
            report.skipped.push((case.name, reason));
            continue;
        }
        let ctx = Ctx {
            factory: &factory,
            caps: capabilities,
            opened: RefCell::new(Vec::new()),
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| (case.run)(&ctx)));
        for c in ctx.opened.borrow().iter() {
            let _ = c.close();
        }
        match outcome {
            Ok(()) => report.passed.push(case.name),
            Err(panic) => failures.push(format!("{}: {}", case.name, panic_text(&*panic))),
        }
    }
    let _ = writeln!(
        std::io::stderr().lock(),
        "conformance suite: {} case(s) ok, {} skipped by declaration, {} failing",
        report.passed.len(),
        report.skipped.len(),
        failures.len()
    );
    if !failures.is_empty() {
        panic!(
            "{} conformance case(s) failed:\n  {}",
            failures.len(),
            failures.join("\n  ")
        );
    }
    report
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panicked".to_owned()
    }
}

struct Case {
    name: &'static str,
    needs: Needs,
    run: fn(&Ctx<'_>),
}

#[derive(Clone, Copy)]
enum Needs {
    Nothing,
    Delivery,
    Trimming,
}

impl Needs {
    fn unmet(self, caps: &Capabilities) -> Option<&'static str> {
        match self {
            Needs::Nothing => None,
            Needs::Delivery if !caps.delivers => Some("it does not deliver"),
            Needs::Trimming if !caps.delivers => Some("it does not deliver"),
            Needs::Trimming if caps.stream_max_len.is_none() => Some("no stream trimming"),
            Needs::Delivery | Needs::Trimming => None,
        }
    }
}

struct Ctx<'a> {
    factory: &'a dyn Fn() -> Box<dyn Coordinator>,
    caps: Capabilities,
    opened: RefCell<Vec<Arc<dyn Coordinator>>>,
}

impl Ctx<'_> {
    /// A new handle, closed when the case ends.
    fn open(&self) -> Arc<dyn Coordinator> {
        let c: Arc<dyn Coordinator> = Arc::from((self.factory)());
        self.opened.borrow_mut().push(c.clone());
        c
    }
}

/// A name no other case or run uses.
fn unique(base: &str) -> String {
    format!("{base}-{}", uuid::Uuid::new_v4().simple())
}

fn recv<T>(feed: &Feed<T>, what: &str) -> T {
    match feed.recv_timeout(WAIT) {
        Ok(item) => item,
        Err(RecvTimeoutError::Timeout) => panic!("{what}: nothing arrived within {WAIT:?}"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: the feed ended"),
    }
}

fn assert_quiet<T: Debug>(feed: &Feed<T>, what: &str) {
    match feed.recv_timeout(QUIET) {
        Err(RecvTimeoutError::Timeout) => {}
        Ok(item) => panic!("{what}: unexpected {item:?}"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: the feed ended"),
    }
}

fn ok<T>(result: Result<T>, what: &str) -> T {
    match result {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

fn expect_invalid<T: Debug>(result: Result<T>, field: &str, call: &str) {
    match result {
        Err(Error::InvalidArgument { what, .. }) if what == field => {}
        other => panic!("{call}: expected InvalidArgument naming {field:?}, got {other:?}"),
    }
}

fn expect_closed<T: Debug>(result: Result<T>, call: &str) {
    match result {
        Err(Error::Closed) => {}
        other => panic!("{call} after close: expected Error::Closed, got {other:?}"),
    }
}

fn expect_not_found<T: Debug>(result: Result<T>, call: &str) {
    match result {
        Err(Error::NotFound) => {}
        other => panic!("{call}: expected Error::NotFound, got {other:?}"),
    }
}

fn msg(feed: &Feed<Message>, topic: &str, payload: &[u8], what: &str) {
    let m = recv(feed, what);
    assert_eq!(m.topic, topic, "{what}: topic");
    assert_eq!(m.payload, payload, "{what}: payload");
}

/// Reads a watch's snapshot up to `Synced`.
fn snapshot(feed: &Feed<KvEvent>, what: &str) -> BTreeMap<String, Vec<u8>> {
    let mut seen = BTreeMap::new();
    loop {
        match recv(feed, what) {
            KvEvent::Put { key, value } => {
                assert!(
                    seen.insert(key.clone(), value).is_none(),
                    "{what}: {key:?} twice in the snapshot"
                );
            }
            KvEvent::Synced => return seen,
            other => panic!("{what}: {other:?} before Synced"),
        }
    }
}

fn put(key: &str, value: &[u8]) -> KvEvent {
    KvEvent::Put {
        key: key.to_owned(),
        value: value.to_vec(),
    }
}

/// Reads a watch's snapshot and checks it is exactly `entries`.
fn expect_snapshot(feed: &Feed<KvEvent>, entries: &[(&str, &[u8])], what: &str) {
    let expected: BTreeMap<String, Vec<u8>> = entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
        .collect();
    assert_eq!(snapshot(feed, what), expected, "{what}");
}

/// Receives the next stream entry and checks it.
fn entry(feed: &Feed<StreamEntry>, id: StreamId, payload: &[u8], what: &str) {
    let e = recv(feed, what);
    assert_eq!((e.id, e.payload.as_slice()), (id, payload), "{what}");
}

/// Reads until the feed ends; fails if it does not end within [`WAIT`].
fn drain_to_end<T>(feed: &Feed<T>, what: &str) {
    for _ in 0..100_000 {
        match feed.recv_timeout(WAIT) {
            Ok(_) => {}
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => panic!("{what}: still open {WAIT:?} after close"),
        }
    }
    panic!("{what}: still delivering after close");
}

const CASES: &[Case] = &[
    Case {
        name: "input validation",
        needs: Needs::Nothing,
        run: validation,
    },
    Case {
        name: "pub/sub exact topic",
        needs: Needs::Delivery,
        run: pubsub_exact,
    },
    Case {
        name: "pub/sub topic isolation",
        needs: Needs::Delivery,
        run: pubsub_isolation,
    },
    Case {
        name: "pub/sub multiple subscribers",
        needs: Needs::Delivery,
        run: pubsub_multiple,
    },
    Case {
        name: "pub/sub per-topic ordering",
        needs: Needs::Delivery,
        run: pubsub_ordering,
    },
    Case {
        name: "pub/sub unsubscribe and resubscribe",
        needs: Needs::Delivery,
        run: pubsub_resubscribe,
    },
    Case {
        name: "stream append and tail",
        needs: Needs::Delivery,
        run: stream_tail,
    },
    Case {
        name: "stream replay from start",
        needs: Needs::Delivery,
        run: stream_replay,
    },
    Case {
        name: "stream resume strictly after an id",
        needs: Needs::Delivery,
        run: stream_resume,
    },
    Case {
        name: "stream concurrent appenders",
        needs: Needs::Nothing,
        run: stream_concurrent,
    },
    Case {
        name: "stream resume from a trimmed id",
        needs: Needs::Trimming,
        run: stream_trimmed,
    },
    Case {
        name: "kv round trip",
        needs: Needs::Delivery,
        run: kv_round_trip,
    },
    Case {
        name: "kv missing key is NotFound",
        needs: Needs::Nothing,
        run: kv_missing,
    },
    Case {
        name: "kv watch snapshot, Synced, updates",
        needs: Needs::Delivery,
        run: kv_watch_updates,
    },
    Case {
        name: "kv watch deletes",
        needs: Needs::Delivery,
        run: kv_watch_deletes,
    },
    Case {
        name: "kv watch pattern isolation",
        needs: Needs::Delivery,
        run: kv_watch_patterns,
    },
    Case {
        name: "kv watch Synced on an empty bucket",
        needs: Needs::Delivery,
        run: kv_watch_empty,
    },
    Case {
        name: "binary payloads",
        needs: Needs::Delivery,
        run: binary_payloads,
    },
    Case {
        name: "payload size limit",
        needs: Needs::Nothing,
        run: size_limit,
    },
    Case {
        name: "ping",
        needs: Needs::Nothing,
        run: ping,
    },
    Case {
        name: "close is idempotent",
        needs: Needs::Nothing,
        run: close_idempotent,
    },
    Case {
        name: "concurrent close",
        needs: Needs::Nothing,
        run: close_concurrent,
    },
    Case {
        name: "Closed after close",
        needs: Needs::Nothing,
        run: closed_after_close,
    },
    Case {
        name: "feeds end after close",
        needs: Needs::Nothing,
        run: feeds_end_on_close,
    },
];

fn validation(ctx: &Ctx<'_>) {
    let c = ctx.open();
    let bucket = unique("validation");
    let long = "x".repeat(256);
    for bad in ["", "a/b", "a\0b", long.as_str()] {
        expect_invalid(c.publish(bad, b"x"), "topic", &format!("publish({bad:?})"));
        expect_invalid(c.subscribe(bad), "topic", &format!("subscribe({bad:?})"));
        expect_invalid(
            c.append_stream(bad, b"x"),
            "stream",
            &format!("append_stream({bad:?})"),
        );
        expect_invalid(
            c.read_stream(bad, StreamPosition::Start),
            "stream",
            &format!("read_stream({bad:?})"),
        );
        expect_invalid(
            c.kv_set(bad, "k", b"x"),
            "bucket",
            &format!("kv_set(bucket {bad:?})"),
        );
        expect_invalid(
            c.kv_get(bad, "k"),
            "bucket",
            &format!("kv_get(bucket {bad:?})"),
        );
        expect_invalid(
            c.kv_delete(bad, "k"),
            "bucket",
            &format!("kv_delete(bucket {bad:?})"),
        );
        expect_invalid(
            c.kv_watch(bad, "*"),
            "bucket",
            &format!("kv_watch(bucket {bad:?})"),
        );
        expect_invalid(
            c.kv_set(&bucket, bad, b"x"),
            "key",
            &format!("kv_set(key {bad:?})"),
        );
        expect_invalid(
            c.kv_get(&bucket, bad),
            "key",
            &format!("kv_get(key {bad:?})"),
        );
        expect_invalid(
            c.kv_delete(&bucket, bad),
            "key",
            &format!("kv_delete(key {bad:?})"),
        );
    }
    for bad in ["", "a\0*"] {
        expect_invalid(
            c.kv_watch(&bucket, bad),
            "pattern",
            &format!("kv_watch(pattern {bad:?})"),
        );
    }
    // A rejected call writes nothing.
    expect_not_found(c.kv_get(&bucket, "k"), "kv_get after rejected calls");
}

fn pubsub_exact(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let topic = unique("exact");
    let sub = ok(b.subscribe(&topic), "subscribe");
    ok(
        a.publish(&format!("{topic}x"), b"longer"),
        "publish on a longer topic",
    );
    ok(
        a.publish(&topic[..topic.len() - 1], b"shorter"),
        "publish on a prefix",
    );
    ok(a.publish(&topic, b"hit"), "publish");
    msg(&sub, &topic, b"hit", "the exact topic");
    assert_quiet(&sub, "after the exact topic");
}

fn pubsub_isolation(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let (t1, t2) = (unique("iso-one"), unique("iso-two"));
    let s1 = ok(b.subscribe(&t1), "subscribe one");
    let s2 = ok(b.subscribe(&t2), "subscribe two");
    ok(a.publish(&t1, b"one"), "publish one");
    ok(a.publish(&t2, b"two"), "publish two");
    msg(&s1, &t1, b"one", "topic one");
    msg(&s2, &t2, b"two", "topic two");
    assert_quiet(&s1, "topic one");
    assert_quiet(&s2, "topic two");
}

fn pubsub_multiple(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let topic = unique("multi");
    let subs = [
        ok(b.subscribe(&topic), "subscribe"),
        ok(b.subscribe(&topic), "subscribe"),
        ok(a.subscribe(&topic), "subscribe"),
    ];
    for i in 0..3u8 {
        ok(a.publish(&topic, &[i]), "publish");
    }
    for (n, sub) in subs.iter().enumerate() {
        for i in 0..3u8 {
            msg(sub, &topic, &[i], &format!("subscriber {n}, message {i}"));
        }
    }
}

fn pubsub_ordering(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let topic = unique("order");
    let remote = ok(b.subscribe(&topic), "subscribe");
    let local = ok(a.subscribe(&topic), "subscribe");
    const N: u32 = 150;
    for i in 0..N {
        ok(a.publish(&topic, &i.to_be_bytes()), "publish");
    }
    for (name, sub) in [("remote", &remote), ("local", &local)] {
        for i in 0..N {
            msg(
                sub,
                &topic,
                &i.to_be_bytes(),
                &format!("{name} subscriber, message {i} of {N}"),
            );
        }
        assert_quiet(sub, name);
    }
}

fn pubsub_resubscribe(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let topic = unique("resub");
    let sub = ok(b.subscribe(&topic), "subscribe");
    ok(a.publish(&topic, b"before"), "publish");
    msg(&sub, &topic, b"before", "first subscription");
    drop(sub);
    ok(
        a.publish(&topic, b"while away"),
        "publish with no subscriber",
    );
    let again = ok(b.subscribe(&topic), "subscribe again");
    ok(a.publish(&topic, b"after"), "publish");
    msg(
        &again,
        &topic,
        b"after",
        "second subscription (live-only: nothing from before it)",
    );
    assert_quiet(&again, "second subscription");
}

fn stream_tail(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let stream = unique("tail");
    let reader = ok(
        b.read_stream(&stream, StreamPosition::End),
        "read_stream(End)",
    );
    let ids: Vec<StreamId> = (0..3u8)
        .map(|i| ok(a.append_stream(&stream, &[i]), "append"))
        .collect();
    assert_eq!(
        ids,
        [StreamId(1), StreamId(2), StreamId(3)],
        "a new stream numbers its entries from 1"
    );
    for (i, id) in ids.iter().enumerate() {
        entry(&reader, *id, &[i as u8], &format!("tailed entry {i}"));
    }
    assert_quiet(&reader, "tail");
}

fn stream_replay(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let stream = unique("replay");
    let ids: Vec<StreamId> = (0..5u8)
        .map(|i| ok(a.append_stream(&stream, &[i]), "append"))
        .collect();
    let reader = ok(
        b.read_stream(&stream, StreamPosition::Start),
        "read_stream(Start)",
    );
    for (i, id) in ids.iter().enumerate() {
        entry(&reader, *id, &[i as u8], &format!("replayed entry {i}"));
    }
    let next = ok(a.append_stream(&stream, b"live"), "append");
    assert!(next > ids[4], "ids increase: {next} after {}", ids[4]);
    entry(&reader, next, b"live", "tailed after replay");
    assert_quiet(&reader, "after replay");
}

fn stream_resume(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let stream = unique("resume");
    let ids: Vec<StreamId> = (0..5u8)
        .map(|i| ok(a.append_stream(&stream, &[i]), "append"))
        .collect();
    let reader = ok(
        b.read_stream(&stream, StreamPosition::After(ids[1])),
        "read_stream(After)",
    );
    let at_head = ok(
        b.read_stream(&stream, StreamPosition::After(ids[4])),
        "read_stream(After(head))",
    );
    let beyond = StreamId(ids[4].0 + 1000);
    let past_head = ok(
        b.read_stream(&stream, StreamPosition::After(beyond)),
        "read_stream(After(beyond head))",
    );
    for (i, id) in ids.iter().enumerate().skip(2) {
        entry(
            &reader,
            *id,
            &[i as u8],
            &format!("entry {i} after id {}", ids[1]),
        );
    }
    let next = ok(a.append_stream(&stream, b"next"), "append");
    entry(&reader, next, b"next", "tailed after resuming");
    entry(&at_head, next, b"next", "reader after the head id");
    entry(
        &past_head,
        next,
        b"next",
        "reader after an id beyond the head starts at the next append",
    );
    assert_quiet(&reader, "resumed reader");
}

fn stream_concurrent(ctx: &Ctx<'_>) {
    const THREADS: usize = 4;
    const EACH: usize = 50;
    let stream = unique("concurrent");
    let handles: Vec<_> = (0..THREADS).map(|_| ctx.open()).collect();
    let per_thread: Vec<Vec<(StreamId, Vec<u8>)>> = std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(t, c)| {
                let stream = &stream;
                s.spawn(move || {
                    (0..EACH)
                        .map(|i| {
                            let payload = format!("{t}:{i}").into_bytes();
                            (
                                ok(c.append_stream(stream, &payload), "concurrent append"),
                                payload,
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut all = BTreeMap::new();
    for (t, appended) in per_thread.iter().enumerate() {
        for pair in appended.windows(2) {
            assert!(
                pair[0].0 < pair[1].0,
                "thread {t}: id {} then {}",
                pair[0].0,
                pair[1].0
            );
        }
        for (id, payload) in appended {
            assert!(
                all.insert(*id, payload.clone()).is_none(),
                "id {id} handed out twice"
            );
        }
    }
    if !ctx.caps.delivers {
        return;
    }
    let expected: BTreeSet<StreamId> = (1..=(THREADS * EACH) as u64).map(StreamId).collect();
    assert_eq!(
        all.keys().copied().collect::<BTreeSet<_>>(),
        expected,
        "ids are 1..={}",
        THREADS * EACH
    );
    // A trimming backend replays only the newest entries it keeps.
    let kept = ctx
        .caps
        .stream_max_len
        .map_or(all.len(), |n| all.len().min(n as usize));
    let reader = ok(
        ctx.open().read_stream(&stream, StreamPosition::Start),
        "read_stream(Start)",
    );
    for (id, payload) in all.iter().skip(all.len() - kept) {
        entry(
            &reader,
            *id,
            payload,
            &format!("replay of concurrent entry {id}"),
        );
    }
}

fn stream_trimmed(ctx: &Ctx<'_>) {
    let max = ctx.caps.stream_max_len.unwrap_or(0);
    assert!(
        (1..=10_000).contains(&max),
        "stream_max_len {max} is outside what this case can test (1..=10000)"
    );
    let max = max as usize;
    let (a, b) = (ctx.open(), ctx.open());
    let stream = unique("trimmed");
    const EXTRA: usize = 5;
    let ids: Vec<StreamId> = (0..max + EXTRA)
        .map(|i| {
            ok(
                a.append_stream(&stream, &(i as u32).to_be_bytes()),
                "append",
            )
        })
        .collect();
    let oldest_retained = EXTRA;
    for from in [StreamPosition::After(ids[0]), StreamPosition::Start] {
        let reader = ok(b.read_stream(&stream, from), "read_stream");
        for (i, id) in ids.iter().enumerate().skip(oldest_retained) {
            entry(
                &reader,
                *id,
                &(i as u32).to_be_bytes(),
                &format!("{from:?}: retained entry {i} of {}", ids.len()),
            );
        }
    }
}

fn kv_round_trip(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let bucket = unique("kv");
    ok(a.kv_set(&bucket, "k", b"one"), "kv_set");
    assert_eq!(ok(a.kv_get(&bucket, "k"), "kv_get"), b"one");
    assert_eq!(
        ok(b.kv_get(&bucket, "k"), "kv_get from another handle"),
        b"one"
    );
    ok(b.kv_set(&bucket, "k", b"two"), "kv_set overwrite");
    assert_eq!(ok(a.kv_get(&bucket, "k"), "kv_get after overwrite"), b"two");
    ok(a.kv_set(&bucket, "empty", b""), "kv_set empty value");
    assert_eq!(ok(b.kv_get(&bucket, "empty"), "kv_get empty value"), b"");
    ok(a.kv_delete(&bucket, "k"), "kv_delete");
    expect_not_found(a.kv_get(&bucket, "k"), "kv_get after delete");
    expect_not_found(b.kv_get(&bucket, "k"), "kv_get after delete, other handle");
    ok(a.kv_delete(&bucket, "k"), "kv_delete of a missing key");
}

fn kv_missing(ctx: &Ctx<'_>) {
    let c = ctx.open();
    let bucket = unique("missing");
    expect_not_found(c.kv_get(&bucket, "nope"), "kv_get in an unused bucket");
    ok(c.kv_set(&bucket, "other", b"x"), "kv_set");
    expect_not_found(c.kv_get(&bucket, "nope"), "kv_get of a missing key");
}

fn kv_watch_updates(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let (bucket, elsewhere) = (unique("watch"), unique("elsewhere"));
    ok(a.kv_set(&bucket, "k1", b"v1"), "kv_set");
    ok(a.kv_set(&bucket, "k2", b"v2"), "kv_set");
    ok(a.kv_set(&elsewhere, "k3", b"other bucket"), "kv_set");
    let watch = ok(b.kv_watch(&bucket, "*"), "kv_watch");
    expect_snapshot(&watch, &[("k1", b"v1"), ("k2", b"v2")], "snapshot");
    ok(a.kv_set(&elsewhere, "k4", b"other bucket"), "kv_set");
    ok(a.kv_set(&bucket, "k3", b"v3"), "kv_set");
    assert_eq!(recv(&watch, "new key"), put("k3", b"v3"));
    ok(a.kv_set(&bucket, "k1", b"v1b"), "kv_set");
    assert_eq!(recv(&watch, "changed key"), put("k1", b"v1b"));
    assert_quiet(&watch, "after updates");
}

fn kv_watch_deletes(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let bucket = unique("deletes");
    ok(a.kv_set(&bucket, "k1", b"v1"), "kv_set");
    let watch = ok(b.kv_watch(&bucket, "*"), "kv_watch");
    expect_snapshot(&watch, &[("k1", b"v1")], "snapshot");
    ok(a.kv_delete(&bucket, "k1"), "kv_delete");
    assert_eq!(
        recv(&watch, "delete"),
        KvEvent::Deleted { key: "k1".into() }
    );
    ok(
        a.kv_delete(&bucket, "never-set"),
        "kv_delete of a missing key",
    );
    ok(a.kv_set(&bucket, "k2", b"v2"), "kv_set");
    assert_eq!(
        recv(
            &watch,
            "the set after deleting a missing key (which reports nothing)"
        ),
        put("k2", b"v2")
    );
}

fn kv_watch_patterns(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let bucket = unique("patterns");
    for key in ["app.one", "apx.one", "other", "others"] {
        ok(a.kv_set(&bucket, key, key.as_bytes()), "kv_set");
    }
    let star = ok(b.kv_watch(&bucket, "app.*"), "kv_watch(app.*)");
    let question = ok(b.kv_watch(&bucket, "ap?.one"), "kv_watch(ap?.one)");
    let literal = ok(b.kv_watch(&bucket, "other"), "kv_watch(other)");
    expect_snapshot(&star, &[("app.one", b"app.one")], "app.* snapshot");
    expect_snapshot(
        &question,
        &[("app.one", b"app.one"), ("apx.one", b"apx.one")],
        "ap?.one snapshot",
    );
    expect_snapshot(&literal, &[("other", b"other")], "other snapshot");
    // Each watcher's first event must be its own key: bucket order proves
    // the earlier non-matching sets were not delivered.
    for key in ["otherz", "apx.two", "ap.one", "app.two", "apy.one", "other"] {
        ok(a.kv_set(&bucket, key, key.as_bytes()), "kv_set");
    }
    assert_eq!(recv(&star, "app.*"), put("app.two", b"app.two"));
    assert_eq!(recv(&question, "ap?.one"), put("apy.one", b"apy.one"));
    assert_eq!(recv(&literal, "other"), put("other", b"other"));
    std::thread::sleep(QUIET);
    for (name, w) in [
        ("app.*", &star),
        ("ap?.one", &question),
        ("other", &literal),
    ] {
        match w.try_recv() {
            Err(TryRecvError::Empty) => {}
            other => panic!("{name}: unexpected {other:?}"),
        }
    }
}

fn kv_watch_empty(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let bucket = unique("empty");
    let watch = ok(b.kv_watch(&bucket, "*"), "kv_watch");
    assert_eq!(recv(&watch, "empty bucket"), KvEvent::Synced);
    ok(a.kv_set(&bucket, "k", b"v"), "kv_set");
    assert_eq!(recv(&watch, "first set"), put("k", b"v"));
    assert_quiet(&watch, "after the first set");
}

fn binary_payloads(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let bytes: Vec<u8> = (0..=255u8).collect();
    let (topic, stream, bucket) = (unique("bin"), unique("bin"), unique("bin"));
    let sub = ok(b.subscribe(&topic), "subscribe");
    let watch = ok(b.kv_watch(&bucket, "*"), "kv_watch");
    assert_eq!(recv(&watch, "empty bucket"), KvEvent::Synced);
    ok(a.publish(&topic, &bytes), "publish");
    msg(&sub, &topic, &bytes, "all 256 byte values via pub/sub");
    let id = ok(a.append_stream(&stream, &bytes), "append");
    let reader = ok(b.read_stream(&stream, StreamPosition::Start), "read_stream");
    entry(&reader, id, &bytes, "all 256 byte values via a stream");
    ok(a.kv_set(&bucket, "bin", &bytes), "kv_set");
    assert_eq!(
        ok(b.kv_get(&bucket, "bin"), "kv_get"),
        bytes,
        "all 256 byte values via kv_get"
    );
    assert_eq!(
        recv(&watch, "all 256 byte values via kv_watch"),
        put("bin", &bytes)
    );
}

fn size_limit(ctx: &Ctx<'_>) {
    let c = ctx.open();
    let (topic, stream, bucket) = (unique("size"), unique("size"), unique("size"));
    let too_big = vec![0xA5; MAX_PAYLOAD + 1];
    expect_invalid(
        c.publish(&topic, &too_big),
        "payload",
        "publish above the limit",
    );
    expect_invalid(
        c.append_stream(&stream, &too_big),
        "payload",
        "append_stream above the limit",
    );
    expect_invalid(
        c.kv_set(&bucket, "k", &too_big),
        "value",
        "kv_set above the limit",
    );
    expect_not_found(c.kv_get(&bucket, "k"), "kv_get after a rejected kv_set");

    let exact = vec![0x5A; MAX_PAYLOAD];
    let sub = ctx
        .caps
        .delivers
        .then(|| ok(c.subscribe(&topic), "subscribe"));
    ok(c.publish(&topic, &exact), "publish at exactly the limit");
    let id = ok(
        c.append_stream(&stream, &exact),
        "append_stream at exactly the limit",
    );
    ok(
        c.kv_set(&bucket, "k", &exact),
        "kv_set at exactly the limit",
    );
    if let Some(sub) = sub {
        assert!(
            recv(&sub, "message at the limit").payload == exact,
            "message at the limit changed"
        );
        let reader = ok(c.read_stream(&stream, StreamPosition::Start), "read_stream");
        let e = recv(&reader, "entry at the limit");
        assert!(
            e.id == id && e.payload == exact,
            "entry at the limit changed"
        );
        assert!(
            ok(c.kv_get(&bucket, "k"), "kv_get") == exact,
            "value at the limit changed"
        );
    }
}

fn ping(ctx: &Ctx<'_>) {
    ok(ctx.open().ping(), "ping");
}

fn close_idempotent(ctx: &Ctx<'_>) {
    let c = ctx.open();
    ok(c.close(), "first close");
    ok(c.close(), "second close");
    expect_closed(c.ping(), "ping");
}

fn close_concurrent(ctx: &Ctx<'_>) {
    let c = ctx.open();
    std::thread::scope(|s| {
        let joins: Vec<_> = (0..4).map(|_| s.spawn(|| c.close())).collect();
        for j in joins {
            let result = j.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            ok(result, "concurrent close");
        }
    });
    expect_closed(c.ping(), "ping");
}

fn closed_after_close(ctx: &Ctx<'_>) {
    let c = ctx.open();
    ok(c.close(), "close");
    expect_closed(c.publish("t", b"x"), "publish");
    expect_closed(c.subscribe("t"), "subscribe");
    expect_closed(c.append_stream("s", b"x"), "append_stream");
    expect_closed(c.read_stream("s", StreamPosition::Start), "read_stream");
    expect_closed(c.kv_set("b", "k", b"x"), "kv_set");
    expect_closed(c.kv_get("b", "k"), "kv_get");
    expect_closed(c.kv_delete("b", "k"), "kv_delete");
    expect_closed(c.kv_watch("b", "*"), "kv_watch");
    expect_closed(c.ping(), "ping");
}

fn feeds_end_on_close(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let (topic, stream, bucket) = (unique("end"), unique("end"), unique("end"));
    let sub = ok(a.subscribe(&topic), "subscribe");
    let reader = ok(a.read_stream(&stream, StreamPosition::Start), "read_stream");
    let watch = ok(a.kv_watch(&bucket, "*"), "kv_watch");
    let survivor = ok(b.subscribe(&topic), "subscribe on another handle");
    ok(a.close(), "close");
    drain_to_end(&sub, "subscription");
    drain_to_end(&reader, "stream reader");
    drain_to_end(&watch, "kv watch");
    if ctx.caps.delivers {
        ok(
            b.publish(&topic, b"still here"),
            "publish on another handle",
        );
        msg(
            &survivor,
            &topic,
            b"still here",
            "a feed of another handle survives the close",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::{KvWatcher, MemoryCoordinator, StreamReader, Subscription};

    /// A memory backend with one deliberate bug, to prove the suite notices.
    #[derive(Clone, Copy)]
    enum Bug {
        CloseDoesNothing,
        AfterSkipsOne,
        PatternIgnored,
        TopicIsPrefix,
    }

    struct Buggy(MemoryCoordinator, Bug);

    impl Coordinator for Buggy {
        fn publish(&self, topic: &str, payload: &[u8]) -> Result<()> {
            self.0.publish(topic, payload)?;
            if let Bug::TopicIsPrefix = self.1 {
                // Also deliver to the topic one character shorter.
                self.0.publish(&topic[..topic.len() - 1], payload)?;
            }
            Ok(())
        }
        fn subscribe(&self, topic: &str) -> Result<Subscription> {
            self.0.subscribe(topic)
        }
        fn append_stream(&self, stream: &str, payload: &[u8]) -> Result<StreamId> {
            self.0.append_stream(stream, payload)
        }
        fn read_stream(&self, stream: &str, from: StreamPosition) -> Result<StreamReader> {
            let from = match (self.1, from) {
                (Bug::AfterSkipsOne, StreamPosition::After(id)) => {
                    StreamPosition::After(StreamId(id.0 + 1))
                }
                (_, from) => from,
            };
            self.0.read_stream(stream, from)
        }
        fn kv_set(&self, bucket: &str, key: &str, value: &[u8]) -> Result<()> {
            self.0.kv_set(bucket, key, value)
        }
        fn kv_get(&self, bucket: &str, key: &str) -> Result<Vec<u8>> {
            self.0.kv_get(bucket, key)
        }
        fn kv_delete(&self, bucket: &str, key: &str) -> Result<()> {
            self.0.kv_delete(bucket, key)
        }
        fn kv_watch(&self, bucket: &str, pattern: &str) -> Result<KvWatcher> {
            match self.1 {
                Bug::PatternIgnored => self.0.kv_watch(bucket, "*"),
                _ => self.0.kv_watch(bucket, pattern),
            }
        }
        fn ping(&self) -> Result<()> {
            self.0.ping()
        }
        fn close(&self) -> Result<()> {
            match self.1 {
                Bug::CloseDoesNothing => Ok(()),
                _ => self.0.close(),
            }
        }
    }

    fn fails(bug: Bug, case: &str) -> String {
        let hub = MemoryCoordinator::new();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            run_selected(|| Box::new(Buggy(hub.clone(), bug)), |name| name == case)
        }));
        match outcome {
            Ok(report) => panic!("the suite missed a bug in {case:?}: {report:?}"),
            Err(panic) => panic_text(&*panic),
        }
    }

    #[test]
    fn the_suite_catches_bugs() {
        assert!(
            fails(Bug::CloseDoesNothing, "Closed after close").contains("expected Error::Closed")
        );
        assert!(fails(Bug::CloseDoesNothing, "feeds end after close").contains("still open"));
        assert!(
            fails(Bug::AfterSkipsOne, "stream resume strictly after an id").contains("after id")
        );
        assert!(fails(Bug::PatternIgnored, "kv watch pattern isolation").contains("snapshot"));
        assert!(fails(Bug::TopicIsPrefix, "pub/sub exact topic").contains("the exact topic"));
    }

    #[test]
    fn a_correct_backend_passes_selected_cases() {
        let hub = MemoryCoordinator::new();
        let report = run_selected(|| Box::new(hub.clone()), |name| name.starts_with("kv"));
        assert_eq!(
            report.passed.len(),
            CASES.iter().filter(|c| c.name.starts_with("kv")).count()
        );
    }
}
