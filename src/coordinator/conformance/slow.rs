//! Slow-consumer cases: the contract stated once in the coordinator docs
//! ("Slow consumers"), checked on a feed of [`CAPACITY`] whose consumer
//! reads nothing until hundreds of items were sent — a subscription ends
//! with the latest message, a stream reader gets every entry exactly once,
//! a KV watch ends with the bucket as it is — plus the capacity bounds
//! every backend refuses alike.

use super::case::{unique, Case, Ctx, Needs};
use super::expect::{expect_invalid, ok};
use super::{QUIET, WAIT};
use crate::coordinator::{KvEvent, StreamPosition, MAX_FEED_CAPACITY, MIN_FEED_CAPACITY};
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

fn subscription_ends_with_the_latest(ctx: &Ctx<'_>) {
    let (writer, slow) = (ctx.open(), ctx.open());
    let topic = unique("slow-sub");
    let sub = ok(slow.subscribe(&topic), "subscribe");
    for i in 0..SENT {
        ok(writer.publish(&topic, &i.to_be_bytes()), "publish");
    }
    std::thread::sleep(SETTLE);
    let last = SENT - 1;
    let mut got: Vec<u32> = Vec::new();
    let deadline = Instant::now() + WAIT;
    while got.last() != Some(&last) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(m) = sub.recv_timeout(left) else {
            panic!(
                "the consumer never got the latest message ({last}); it got {} message(s), \
                 the last {:?}",
                got.len(),
                got.last()
            );
        };
        got.push(number(&m.payload));
    }
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "messages out of order or repeated: {got:?}"
    );
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

fn reader_gets_every_entry(ctx: &Ctx<'_>) {
    let (writer, slow) = (ctx.open(), ctx.open());
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
    let mut ids = Vec::new();
    for i in 0..sent {
        ids.push(ok(
            writer.append_stream(&stream, &i.to_be_bytes()),
            "append",
        ));
    }
    std::thread::sleep(SETTLE);
    for (i, id) in ids.iter().enumerate() {
        let entry = match reader.recv_timeout(WAIT) {
            Ok(e) => e,
            Err(_) => panic!("entry {i} of {sent} ({id:?}) never reached the slow reader"),
        };
        assert_eq!(
            (&entry.id, number(&entry.payload)),
            (id, u32::try_from(i).unwrap_or(u32::MAX)),
            "entry {i}: every entry once, in order"
        );
    }
    if let Ok(extra) = reader.recv_timeout(QUIET) {
        panic!("an entry after the last one appended: {extra:?}");
    }
}

fn watch_ends_with_the_bucket(ctx: &Ctx<'_>) {
    let (writer, slow) = (ctx.open(), ctx.open());
    let bucket = unique("slow-kv");
    let key = |i: u32| format!("k{}", i % 8);
    let mut expected: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for i in 0..3 {
        ok(writer.kv_set(&bucket, &key(i), b"before"), "kv_set");
        expected.insert(key(i), b"before".to_vec());
    }
    let watch = ok(slow.kv_watch(&bucket, "*"), "kv_watch");
    for i in 0..SENT {
        if i % 7 == 6 {
            ok(writer.kv_delete(&bucket, &key(i)), "kv_delete");
            expected.remove(&key(i));
        } else {
            let value = i.to_be_bytes().to_vec();
            ok(writer.kv_set(&bucket, &key(i), &value), "kv_set");
            expected.insert(key(i), value);
        }
    }
    std::thread::sleep(SETTLE);
    let mut view: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut synced = false;
    let mut events: u32 = 0;
    let deadline = Instant::now() + WAIT;
    loop {
        if synced && view == expected {
            // Caught up; nothing may follow.
            match watch.recv_timeout(QUIET) {
                Err(_) => break,
                Ok(e) => panic!("after the bucket's final state: unexpected {e:?}"),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(event) = watch.recv_timeout(left) else {
            panic!(
                "the slow watch never reached the bucket's final state (synced: {synced}); \
                 it holds {view:?}, the bucket {expected:?}"
            );
        };
        events = events.saturating_add(1);
        match event {
            KvEvent::Put { key, value } => {
                view.insert(key, value);
            }
            KvEvent::Deleted { key } => {
                assert!(
                    view.remove(&key).is_some(),
                    "Deleted for {key:?}, which the consumer was never told holds a value"
                );
            }
            KvEvent::Synced => {
                assert!(!synced, "Synced twice");
                synced = true;
            }
        }
    }
    assert!(
        events <= SENT + 4,
        "{events} events for {SENT} changes: a resync repeated what was told"
    );
}

/// The `u32` a case sent as a payload (`u32::MAX` for anything else, which
/// then fails the comparison it is part of).
fn number(payload: &[u8]) -> u32 {
    <[u8; 4]>::try_from(payload).map_or(u32::MAX, u32::from_be_bytes)
}
