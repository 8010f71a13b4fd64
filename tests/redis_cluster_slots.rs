//! Cluster safety of the Redis key layout on a real 3-master cluster: every
//! bucket's hash, version and notification channel (and every stream's two
//! keys) share one slot, and no operation raises CROSSSLOT, across many
//! bucket names including ones full of `{`, `}`, `:` and non-ASCII bytes.

use fleetcoord::coordinator::{Coordinator, KvEvent, RedisCoordinator, StreamPosition};
use fleetcoord::testing::RedisCluster;
use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// The documented escaping of names into hash tags: bytes outside
/// `[A-Za-z0-9._-]` as `%XX`.
fn escape(name: &str) -> String {
    name.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn names() -> Vec<String> {
    let mut names: Vec<String> = (0..150).map(|i| format!("bucket-{i}")).collect();
    names.extend(
        [
            "a{b}",
            "{",
            "}",
            "{}",
            "}{",
            "a:b",
            "coord:kv:{x}",
            "%",
            "%7B",
            "sp ace",
            "ünï",
            "日本",
            "*?",
            "x{y}z{w}",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    names
}

#[test]
fn every_bucket_is_slot_local_and_nothing_crosses_slots() {
    let cluster = RedisCluster::start(3).expect("start a redis cluster (run `make deps-redis`)");
    let coord = RedisCoordinator::connect(&cluster.urls()).expect("connect");
    assert!(coord.is_cluster());
    let node = cluster.node(0);
    let slot = |key: &str| -> u16 {
        node.command(&["CLUSTER", "KEYSLOT", key])
            .expect("CLUSTER KEYSLOT")
            .parse()
            .expect("a slot number")
    };
    let mut slots = BTreeSet::new();
    let mut owners = HashSet::new();
    for name in names() {
        let tag = escape(&name);
        let kv = slot(&format!("coord:kv:{{{tag}}}"));
        assert_eq!(kv, slot(&format!("coord:kvn:{{{tag}}}")), "{name:?}");
        assert_eq!(kv, slot(&format!("coord:kvv:{{{tag}}}")), "{name:?}");
        assert_eq!(kv, slot(&tag), "the hash tag of {name:?} is {tag:?}");
        let stream = slot(&format!("coord:stream:{{{tag}}}"));
        assert_eq!(
            stream,
            slot(&format!("coord:streame:{{{tag}}}")),
            "{name:?}"
        );
        slots.insert(kv);

        // Every operation on the name succeeds: a CROSSSLOT would fail it.
        coord.kv_set(&name, "k:{1}", b"v").expect("kv_set");
        assert_eq!(coord.kv_get(&name, "k:{1}").expect("kv_get"), b"v");
        coord.kv_delete(&name, "k:{1}").expect("kv_delete");
        coord
            .kv_delete(&name, "missing")
            .expect("kv_delete of a missing key");
        coord.kv_set(&name, "kept", &[0, 255]).expect("kv_set");
        let id = coord.append_stream(&name, b"e").expect("append_stream");
        coord.publish(&name, b"m").expect("publish");

        // The hash lives where the documented layout says: exactly one node
        // serves it (the others answer MOVED).
        let hash = format!("coord:kv:{{{tag}}}");
        let serving: Vec<usize> = (0..cluster.len())
            .filter(|&i| {
                cluster
                    .node(i)
                    .command(&["HEXISTS", &hash, "kept"])
                    .is_ok_and(|r| r == "1")
            })
            .collect();
        assert_eq!(serving.len(), 1, "{name:?}: {serving:?}");
        owners.insert(serving[0]);
        assert_eq!(id.0, 1, "{name:?}");
    }
    assert_eq!(owners.len(), 3, "the names spread over every master");

    // Feeds on a few names, including awkward ones, on the cluster.
    for name in ["a{b}", "日本", "bucket-7"] {
        let watch = coord.kv_watch(name, "*").expect("kv_watch");
        assert_eq!(
            watch.recv_timeout(WAIT).unwrap(),
            KvEvent::Put {
                key: "kept".into(),
                value: vec![0, 255]
            }
        );
        assert_eq!(watch.recv_timeout(WAIT).unwrap(), KvEvent::Synced);
        coord.kv_set(name, "new", b"1").unwrap();
        assert_eq!(
            watch.recv_timeout(WAIT).unwrap(),
            KvEvent::Put {
                key: "new".into(),
                value: b"1".to_vec()
            }
        );
        let reader = coord.read_stream(name, StreamPosition::Start).unwrap();
        assert_eq!(reader.recv_timeout(WAIT).unwrap().payload, b"e");
        let sub = coord.subscribe(name).unwrap();
        coord.publish(name, b"live").unwrap();
        assert_eq!(sub.recv_timeout(WAIT).unwrap().payload, b"live");
    }
    eprintln!(
        "slot check: {} names, {} distinct slots, served by {} masters; kv/kvn/kvv and \
         stream/epoch keys shared a slot for every name; 0 CROSSSLOT",
        names().len(),
        slots.len(),
        owners.len()
    );
}
