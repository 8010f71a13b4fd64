//! Slow-consumer cases: the contract stated once in the coordinator docs
//! ("Slow consumers"), checked on a feed of [`CAPACITY`] whose consumer
//! reads nothing until hundreds of items were sent — its queue never holds
//! more than its capacity; a subscription ends with the latest message
//! (and a fast subscriber beside it misses nothing it must see); a stream
//! reader, and a replay larger than the queue, get every entry exactly
//! once, also while appends go on; a KV watch whose snapshot is larger
//! than its queue ends with the bucket as it is, as does a narrower watch
//! beside it — plus the capacity bounds every backend refuses alike.

use super::case::{unique, Case, Ctx, Needs};
use super::expect::{expect_invalid, ok};
use super::{QUIET, WAIT};
use crate::coordinator::{
    Feed, KvEvent, Message, StreamEntry, StreamId, StreamPosition, MAX_FEED_CAPACITY,
    MIN_FEED_CAPACITY,
};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The feed capacity of every handle these cases open.
pub const CAPACITY: usize = 4;

/// How many items a case sends before its consumer reads: far more than
/// [`CAPACITY`].
const SENT: u32 = 300;

/// How long a case lets the backend work through what was sent before the
/// consumer starts reading, so the feed is full and paused by then.
const SETTLE: Duration = Duration::from_millis(500);

/// This concern's cases, in the order they run.
pub(super) const CASES: &[Case] = &[
    Case {
        name: "slow consumer: feed capacities outside the bounds are refused",
        needs: Needs::Delivery,
        run: capacity_bounds,
    },
    Case {
        name: "slow consumer: a subscription ends with the latest message",
        needs: Needs::Delivery,
        run: subscription_ends_with_the_latest,
    },
    Case {
        name: "slow consumer: a stream reader gets every entry once, in order",
        needs: Needs::Delivery,
        run: reader_gets_every_entry,
    },
    Case {
        name: "slow consumer: a KV watch ends with the bucket as it is",
        needs: Needs::Delivery,
        run: watch_ends_with_the_bucket,
    },
];

fn capacity_bounds(ctx: &Ctx<'_>) {
    let with_capacity = ctx
        .with_capacity
        .expect("slow-consumer cases run with a capacity factory");
    for bad in [0, 1, MAX_FEED_CAPACITY + 1, usize::MAX] {
        expect_invalid(
            with_capacity(bad).map(|c| {
                let _ = c.close();
            }),
            "feed_capacity",
            &format!("a handle with feed capacity {bad}"),
        );
    }
    for good in [MIN_FEED_CAPACITY, MAX_FEED_CAPACITY] {
        let handle = ok(
            with_capacity(good),
            &format!("a handle with feed capacity {good}"),
        );
        let _ = handle.close();
    }
}

/// Panics if `feed`'s queue holds more than [`CAPACITY`] items.
fn assert_bounded<T>(feed: &Feed<T>, what: &str) {
    let queued = feed.receiver().len();
    assert!(
        queued <= CAPACITY,
        "{what}: {queued} items queued in a feed of capacity {CAPACITY}"
    );
}

/// Reads `feed` until the message numbered `last` arrives, checking that
/// the numbers only increase; what it got.
fn read_to(feed: &Feed<Message>, last: u32, what: &str) -> Vec<u32> {
    let mut got: Vec<u32> = Vec::new();
    let deadline = Instant::now() + WAIT;
    while got.last() != Some(&last) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(m) = feed.recv_timeout(left) else {
            panic!(
                "{what} never got the latest message ({last}); it got {} message(s), \
                 the last {:?}",
                got.len(),
                got.last()
            );
        };
        got.push(number(&m.payload));
    }
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "{what}: messages out of order or repeated: {got:?}"
    );
    got
}

fn subscription_ends_with_the_latest(ctx: &Ctx<'_>) {
    let (writer, slow, quick) = (ctx.open(), ctx.open(), ctx.open());
    let topic = unique("slow-sub");
    let sub = ok(slow.subscribe(&topic), "subscribe");
    let fast = ok(quick.subscribe(&topic), "subscribe (fast)");
    let mut fast_got: Vec<u32> = Vec::new();
    for i in 0..SENT {
        ok(writer.publish(&topic, &i.to_be_bytes()), "publish");
        assert_bounded(&sub, "the slow subscription");
        while let Ok(m) = fast.try_recv() {
            fast_got.push(number(&m.payload));
        }
    }
    let last = SENT - 1;
    // A consumer that keeps reading may fall behind for a moment, never
    // for long: it ends with the latest message too.
    if fast_got.last() != Some(&last) {
        fast_got.extend(read_to(&fast, last, "the fast subscriber"));
    }
    assert!(
        fast_got.windows(2).all(|w| w[0] < w[1]),
        "the fast subscriber: messages out of order or repeated: {fast_got:?}"
    );
    std::thread::sleep(SETTLE);
    assert_bounded(&sub, "the slow subscription");
    let got = read_to(&sub, last, "the slow consumer");
    // Bounded: the queue plus what the backend holds for it, with room
    // for what arrived while the test began reading — not every message.
    let bound = 2 * CAPACITY + 2;
    assert!(
        got.len() <= bound,
        "{} messages reached a consumer with a queue of {CAPACITY}: a slow consumer \
         must not be buffered without bound (at most {bound} expected)",
        got.len()
    );
    // Once it has read, it is live again.
    ok(
        writer.publish(&topic, b"after"),
        "publish after catching up",
    );
    match sub.recv_timeout(WAIT) {
        Ok(m) => assert_eq!(m.payload, b"after", "after catching up"),
        Err(_) => panic!("the message published after the consumer caught up never arrived"),
    }
}

/// Reads `n` entries from `reader`, checking the queue's bound as it goes.
fn read_entries(reader: &Feed<StreamEntry>, n: u32, what: &str) -> Vec<(StreamId, u32)> {
    (0..n)
        .map(|i| {
            assert_bounded(reader, what);
            match reader.recv_timeout(WAIT) {
                Ok(e) => (e.id, number(&e.payload)),
                Err(_) => panic!("entry {i} of {n} never reached {what}"),
            }
        })
        .collect()
}

fn reader_gets_every_entry(ctx: &Ctx<'_>) {
    let (writer, slow, late) = (ctx.open(), ctx.open(), ctx.open());
    let stream = unique("slow-stream");
    // A backend that trims keeps at least its maximum length: send no
    // more, so nothing is trimmed before it is read.
    let sent = ctx
        .caps
        .stream_max_len
        .map_or(SENT, |n| u32::try_from(n).unwrap_or(SENT).min(SENT));
    let reader = ok(
        slow.read_stream(&stream, StreamPosition::Start),
        "read_stream",
    );
    // The last quarter is appended while the reader catches up.
    let first = sent - sent / 4;
    let append = |i: u32| ok(writer.append_stream(&stream, &i.to_be_bytes()), "append");
    let mut ids: Vec<StreamId> = Vec::new();
    for i in 0..first {
        ids.push(append(i));
        assert_bounded(&reader, "the slow reader");
    }
    std::thread::sleep(SETTLE);
    let got = std::thread::scope(|scope| {
        let appending = scope.spawn(|| (first..sent).map(append).collect::<Vec<_>>());
        let got = read_entries(&reader, sent, "the slow reader");
        match appending.join() {
            Ok(more) => ids.extend(more),
            Err(panic) => std::panic::resume_unwind(panic),
        }
        got
    });
    let want: Vec<(StreamId, u32)> = ids.iter().copied().zip(0..sent).collect();
    assert_eq!(got, want, "the slow reader: every entry once, in order");
    // A replay larger than the queue is delivered as it is read.
    let replay = ok(
        late.read_stream(&stream, StreamPosition::Start),
        "read_stream (replay)",
    );
    std::thread::sleep(SETTLE);
    let replayed = read_entries(&replay, sent, "the replay");
    assert_eq!(replayed, want, "the replay: every entry once, in order");
    for (feed, what) in [(&reader, "the slow reader"), (&replay, "the replay")] {
        if let Ok(extra) = feed.recv_timeout(QUIET) {
            panic!("{what}: an entry after the last one appended: {extra:?}");
        }
    }
}

/// Keys `k00`..`k15`; [`NARROW`] matches ten of them.
fn kv_key(i: u32) -> String {
    format!("k{:02}", i % 16)
}

/// The pattern of the narrower watch beside the one of every key.
const NARROW: &str = "k0?";

fn watch_ends_with_the_bucket(ctx: &Ctx<'_>) {
    let (writer, slow) = (ctx.open(), ctx.open());
    let bucket = unique("slow-kv");
    let mut expected: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    // A snapshot four times the queue.
    for i in 0..16 {
        ok(writer.kv_set(&bucket, &kv_key(i), b"before"), "kv_set");
        expected.insert(kv_key(i), b"before".to_vec());
    }
    let all = ok(slow.kv_watch(&bucket, "*"), "kv_watch");
    let narrow = ok(slow.kv_watch(&bucket, NARROW), "kv_watch (narrow)");
    for i in 0..SENT {
        let key = kv_key(i.wrapping_mul(7));
        if i % 7 == 6 {
            ok(writer.kv_delete(&bucket, &key), "kv_delete");
            expected.remove(&key);
        } else {
            let value = i.to_be_bytes().to_vec();
            ok(writer.kv_set(&bucket, &key, &value), "kv_set");
            expected.insert(key, value);
        }
        assert_bounded(&all, "the slow watch");
        assert_bounded(&narrow, "the narrow watch");
    }
    std::thread::sleep(SETTLE);
    let narrowed: BTreeMap<String, Vec<u8>> = expected
        .iter()
        .filter(|(k, _)| crate::coordinator::pattern::matches(NARROW, k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    follow_to(&all, &expected, "the slow watch");
    follow_to(&narrow, &narrowed, "the narrow watch");
}

/// Applies `watch`'s events to a view of the bucket until it equals
/// `expected` and nothing follows, checking the watch contract on the way:
/// a snapshot names each key once, `Deleted` comes after `Synced` and only
/// for a key the consumer was told of, `Synced` comes once, and a resync
/// does not repeat what was told.
fn follow_to(watch: &Feed<KvEvent>, expected: &BTreeMap<String, Vec<u8>>, what: &str) {
    let mut view: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut synced = false;
    let mut events: u32 = 0;
    let deadline = Instant::now() + WAIT;
    loop {
        if synced && view == *expected {
            // Caught up; nothing may follow.
            match watch.recv_timeout(QUIET) {
                Err(_) => break,
                Ok(e) => panic!("{what}: after the bucket's final state: unexpected {e:?}"),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(event) = watch.recv_timeout(left) else {
            panic!(
                "{what} never reached the bucket's final state (synced: {synced}); \
                 it holds {view:?}, the bucket {expected:?}"
            );
        };
        events = events.saturating_add(1);
        match event {
            KvEvent::Put { key, value } => {
                let before = view.insert(key.clone(), value);
                assert!(
                    synced || before.is_none(),
                    "{what}: {key:?} twice in the snapshot"
                );
            }
            KvEvent::Deleted { key } => {
                assert!(synced, "{what}: Deleted for {key:?} before Synced");
                assert!(
                    view.remove(&key).is_some(),
                    "{what}: Deleted for {key:?}, which the consumer was never told holds a value"
                );
            }
            KvEvent::Synced => {
                assert!(!synced, "{what}: Synced twice");
                synced = true;
            }
        }
    }
    let bound = SENT + 16 + 4;
    assert!(
        events <= bound,
        "{what}: {events} events for a snapshot of 16 and {SENT} changes: a resync repeated \
         what was told"
    );
}

/// The `u32` a case sent as a payload (`u32::MAX` for anything else, which
/// then fails the comparison it is part of).
fn number(payload: &[u8]) -> u32 {
    <[u8; 4]>::try_from(payload).map_or(u32::MAX, u32::from_be_bytes)
}
