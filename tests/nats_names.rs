//! Every name and key fleetcoord accepts works on NATS, including the ones
//! NATS' own alphabets reject, and different names never share data.
//! Stream names sit at the server's measured bound: nats-server 2.9 caps
//! JetStream stream names at 255 characters.

use fleetcoord::coordinator::{Coordinator, KvEvent, NatsCoordinator, StreamPosition};
use fleetcoord::testing::NatsServer;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn names() -> Vec<String> {
    let mut names: Vec<String> = [
        "plain",
        "a b",
        "*",
        ">",
        ".",
        "a..b",
        ".lead",
        "trail.",
        "x.*.>",
        "ünïcödé",
        "_5F",
        "_",
        "tab\u{a0}nbsp",
        "emoji 🚀",
        "$KV",
        "-",
        "=",
        ":",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // "COORD_S_" + 247 = 255 characters: the longest name used unshortened;
    // one more and the name is shortened with a hash.
    names.push("x".repeat(247));
    names.push("x".repeat(248));
    // 255 bytes, the most fleetcoord accepts: plain, and escaped 3×.
    names.push("x".repeat(255));
    names.push(format!("{}y", "x".repeat(254)));
    names.push(format!("{}x", "é".repeat(127)));
    names.push(".".repeat(255));
    names
}

#[test]
fn every_accepted_name_round_trips_and_stays_apart() {
    let server = NatsServer::start().expect("start nats-server (`make deps-nats`)");
    let a = NatsCoordinator::connect(&server.url()).unwrap();
    let b = NatsCoordinator::connect(&server.url()).unwrap();
    let names = names();

    // Pub/sub: every topic gets exactly its own message.
    let subs: Vec<_> = names.iter().map(|n| b.subscribe(n).unwrap()).collect();
    for n in &names {
        a.publish(n, n.as_bytes()).unwrap();
    }
    for (n, sub) in names.iter().zip(&subs) {
        let m = sub.recv_timeout(WAIT).unwrap();
        assert_eq!(
            (m.topic.as_str(), m.payload.as_slice()),
            (n.as_str(), n.as_bytes())
        );
        assert!(
            sub.recv_timeout(Duration::from_millis(50)).is_err(),
            "{n:?}"
        );
    }

    // Streams: every name its own stream, numbered from 1.
    for n in &names {
        assert_eq!(a.append_stream(n, n.as_bytes()).unwrap().0, 1, "{n:?}");
    }
    for n in &names {
        let reader = b.read_stream(n, StreamPosition::Start).unwrap();
        let e = reader.recv_timeout(WAIT).unwrap();
        assert_eq!((e.id.0, e.payload.as_slice()), (1, n.as_bytes()), "{n:?}");
    }

    // KV: names as buckets and as keys; a watch reports keys as they were set.
    for n in &names {
        a.kv_set(n, n, n.as_bytes()).unwrap();
        a.kv_set("keys", n, n.as_bytes()).unwrap();
    }
    for n in &names {
        assert_eq!(b.kv_get(n, n).unwrap(), n.as_bytes(), "{n:?}");
        assert_eq!(b.kv_get("keys", n).unwrap(), n.as_bytes(), "{n:?}");
    }
    let watch = b.kv_watch("keys", "*").unwrap();
    let mut seen = Vec::new();
    loop {
        match watch.recv_timeout(WAIT).unwrap() {
            KvEvent::Put { key, value } => {
                assert_eq!(key.as_bytes(), value.as_slice());
                seen.push(key);
            }
            KvEvent::Synced => break,
            other => panic!("{other:?}"),
        }
    }
    let mut expected = names.clone();
    expected.sort();
    seen.sort();
    assert_eq!(seen, expected);
    a.kv_delete("keys", "*").unwrap();
    assert_eq!(
        watch.recv_timeout(WAIT).unwrap(),
        KvEvent::Deleted { key: "*".into() }
    );
    assert!(b.kv_get("keys", ">").is_ok());
}
