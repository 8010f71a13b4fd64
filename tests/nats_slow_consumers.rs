//! The one backpressure policy on the NATS backend: feeds of capacity 4
//! whose consumer reads late. A stream reader pauses and resumes after the
//! last entry it delivered (every entry once, in order); a KV watch resumes
//! with what changed since (its view ends equal to the bucket); a
//! subscription drops what arrives while its queue is full and goes on.

use fleetcoord::coordinator::{Coordinator, KvEvent, NatsCoordinator, NatsOptions, StreamPosition};
use fleetcoord::testing::NatsServer;
use std::collections::BTreeMap;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn small(server: &NatsServer) -> NatsCoordinator {
    NatsCoordinator::with_options(
        NatsOptions::default()
            .with_urls(&server.url())
            .with_feed_capacity(4),
    )
    .unwrap()
}

#[test]
fn late_readers_lose_nothing_they_are_promised() {
    let server = NatsServer::start().expect("start nats-server (`make deps-nats` installs it)");
    let writer = NatsCoordinator::connect(&server.url()).unwrap();
    let reader_side = small(&server);

    let reader = reader_side
        .read_stream("jobs", StreamPosition::Start)
        .unwrap();
    let watch = reader_side.kv_watch("fleet", "*").unwrap();
    let sub = reader_side.subscribe("alerts").unwrap();
    assert_eq!(watch.recv_timeout(WAIT).unwrap(), KvEvent::Synced);

    for i in 0..200u32 {
        writer.append_stream("jobs", &i.to_be_bytes()).unwrap();
        let key = format!("k{}", i % 7);
        if i % 9 == 8 {
            writer.kv_delete("fleet", &key).unwrap();
        } else {
            writer.kv_set("fleet", &key, &i.to_be_bytes()).unwrap();
        }
        writer.publish("alerts", &i.to_be_bytes()).unwrap();
    }
    // Let every feed run into its bound before anything is read.
    std::thread::sleep(Duration::from_millis(500));

    for i in 0..200u32 {
        let e = reader.recv_timeout(WAIT).unwrap();
        assert_eq!(
            (e.id.0, e.payload),
            (u64::from(i) + 1, i.to_be_bytes().to_vec())
        );
    }
    assert!(reader.recv_timeout(Duration::from_millis(200)).is_err());

    let mut truth = BTreeMap::new();
    for k in 0..7 {
        let key = format!("k{k}");
        if let Ok(v) = writer.kv_get("fleet", &key) {
            truth.insert(key, v);
        }
    }
    let mut view = BTreeMap::new();
    while view != truth {
        match watch.recv_timeout(WAIT) {
            Ok(KvEvent::Put { key, value }) => {
                view.insert(key, value);
            }
            Ok(KvEvent::Deleted { key }) => {
                assert!(view.remove(&key).is_some(), "delete of unknown {key}");
            }
            other => panic!("{other:?}; view {view:?}, bucket {truth:?}"),
        }
    }

    // The first messages filled the queue; later ones were dropped while
    // it was full, in order, and delivery goes on afterwards.
    let mut last = None;
    while let Ok(m) = sub.recv_timeout(Duration::from_millis(200)) {
        let n = u32::from_be_bytes(m.payload.try_into().unwrap());
        assert!(last.is_none_or(|l| n > l), "order");
        last = Some(n);
    }
    writer.publish("alerts", b"later").unwrap();
    assert_eq!(sub.recv_timeout(WAIT).unwrap().payload, b"later");
}
