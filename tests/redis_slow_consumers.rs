//! The one feed policy on the Redis backend, with feeds of capacity 8 and
//! consumers that read only after the writers are done: a stream reader
//! still delivers every entry exactly once, a KV watch (whose snapshot alone
//! overflows the feed) converges on the bucket, and a subscription keeps
//! delivering after dropping what did not fit.

use fleetcoord::coordinator::redis::RedisOptions;
use fleetcoord::coordinator::{Coordinator, KvEvent, RedisCoordinator, StreamPosition};
use fleetcoord::testing::RedisServer;
use std::collections::BTreeMap;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn small_feeds_lose_nothing_that_must_not_be_lost() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    let writer = RedisCoordinator::connect(&server.url()).unwrap();
    let slow = RedisCoordinator::with_options(
        &server.url(),
        RedisOptions::default().with_feed_capacity(8),
    )
    .unwrap();

    let mut expected = BTreeMap::new();
    for i in 0..100 {
        let value = format!("v{i}").into_bytes();
        writer.kv_set("big", &format!("k{i:03}"), &value).unwrap();
        expected.insert(format!("k{i:03}"), value);
    }
    let watch = slow.kv_watch("big", "*").unwrap();
    let reader = slow.read_stream("flood", StreamPosition::Start).unwrap();
    let sub = slow.subscribe("chatter").unwrap();
    for i in 0..300u32 {
        writer.append_stream("flood", &i.to_be_bytes()).unwrap();
        if i % 3 == 0 {
            let key = format!("k{:03}", i % 120);
            let value = format!("w{i}").into_bytes();
            writer.kv_set("big", &key, &value).unwrap();
            expected.insert(key, value);
        }
        writer.publish("chatter", &i.to_be_bytes()).unwrap();
    }
    writer.kv_delete("big", "k000").unwrap();
    expected.remove("k000");

    // Stream: every entry, in order, exactly once.
    for i in 0..300u32 {
        let e = reader.recv_timeout(WAIT).expect("entry");
        assert_eq!(e.id.0, u64::from(i) + 1);
        assert_eq!(e.payload, i.to_be_bytes());
    }
    assert!(reader.recv_timeout(Duration::from_millis(300)).is_err());

    // KV: one Synced, and the view converges on the bucket.
    let mut view = BTreeMap::new();
    let mut synced = 0;
    while view != expected {
        match watch.recv_timeout(WAIT).expect("kv event") {
            KvEvent::Put { key, value } => {
                view.insert(key, value);
            }
            KvEvent::Deleted { key } => {
                view.remove(&key);
            }
            KvEvent::Synced => synced += 1,
        }
    }
    assert!(synced <= 1);
    while let Ok(e) = watch.recv_timeout(Duration::from_millis(300)) {
        if e == KvEvent::Synced {
            synced += 1;
        }
    }
    assert_eq!(synced, 1, "exactly one Synced");

    // Pub/sub: what fit is in order; after the consumer caught up, new
    // messages flow again.
    let mut last = None;
    while let Ok(m) = sub.recv_timeout(Duration::from_millis(300)) {
        let n = u32::from_be_bytes(m.payload.try_into().unwrap());
        assert!(last.is_none_or(|l| n > l), "in order");
        last = Some(n);
    }
    writer.publish("chatter", b"after").unwrap();
    assert_eq!(sub.recv_timeout(WAIT).unwrap().payload, b"after");
}

#[test]
fn a_resync_larger_than_the_feed_is_told_in_pieces() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    let writer = RedisCoordinator::connect(&server.url()).unwrap();
    let slow = RedisCoordinator::with_options(
        &server.url(),
        RedisOptions::default().with_feed_capacity(2),
    )
    .unwrap();
    let mut expected = BTreeMap::new();
    for i in 0..10 {
        writer.kv_set("b", &format!("k{i}"), b"v").unwrap();
        expected.insert(format!("k{i}"), b"v".to_vec());
    }
    let watch = slow.kv_watch("b", "*").unwrap();
    let mut view = BTreeMap::new();
    let converge = |view: &mut BTreeMap<String, Vec<u8>>, expected: &BTreeMap<String, Vec<u8>>| {
        while view != expected {
            match watch.recv_timeout(WAIT).expect("kv event") {
                KvEvent::Put { key, value } => {
                    view.insert(key, value);
                }
                KvEvent::Deleted { key } => {
                    assert!(view.remove(&key).is_some(), "Deleted {key:?} it never had");
                }
                KvEvent::Synced => {}
            }
        }
    };
    converge(&mut view, &expected);

    // Live changes while the consumer does not read: more than its queue.
    for i in 10..20 {
        writer.kv_set("b", &format!("k{i}"), b"w").unwrap();
        expected.insert(format!("k{i}"), b"w".to_vec());
    }
    std::thread::sleep(Duration::from_millis(300));
    converge(&mut view, &expected);

    // Deletions behind the watch's back, found by a resync (a notification
    // version far ahead is a gap): more deletions than the queue holds.
    let mut hdel = vec!["HDEL", "coord:kv:{b}"];
    let gone: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    hdel.extend(gone.iter().map(String::as_str));
    assert_eq!(server.command(&hdel).unwrap(), "8");
    for key in &gone {
        expected.remove(key);
    }
    server
        .command(&["PUBLISH", "coord:kvn:{b}", "999 s 1 x"])
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    converge(&mut view, &expected);
    assert!(watch.recv_timeout(Duration::from_millis(300)).is_err());
}
