//! Faults on real nats-server processes: a restart of the only server
//! while a subscriber, a KV watcher and a stream reader are open; one node
//! of a 3-node cluster killed under replicas 3; no server at start.
//!
//! Each fault test prints its counts (entries appended and read,
//! duplicates, losses) on standard error.

use fleetcoord::coordinator::{
    from_vars, Coordinator, KvEvent, NatsCoordinator, NatsOptions, StreamPosition,
};
use fleetcoord::testing::{NatsCluster, NatsServer};
use fleetcoord::Error;
use std::collections::{BTreeMap, BTreeSet};
use std::thread;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);
const ENTRIES: u32 = 300;
const KEYS: u32 = 20;

/// Appends `ENTRIES` entries and cycles through `KEYS` keys (set, and every
/// fifth write a delete); `fault` starts on its own thread a third of the
/// way in, so writes go on while servers die and come back. Every call
/// must succeed: the backend retries across the fault.
fn write_through_fault(writer: &NatsCoordinator, fault: impl FnOnce() + Send) -> u32 {
    let mut fault = Some(fault);
    let mut kv_writes = 0;
    let mut slowest = Duration::ZERO;
    thread::scope(|s| {
        for i in 0..ENTRIES {
            if i == ENTRIES / 3 {
                if let Some(f) = fault.take() {
                    s.spawn(f);
                }
            }
            let t = Instant::now();
            let id = writer
                .append_stream("jobs", format!("entry-{i}").as_bytes())
                .unwrap_or_else(|e| panic!("append {i}: {e}"));
            assert_eq!(id.0, u64::from(i) + 1, "ids are gap-free");
            let key = format!("k{}", i % KEYS);
            if i % 5 == 4 {
                writer
                    .kv_delete("fleet", &key)
                    .unwrap_or_else(|e| panic!("kv_delete {i}: {e}"));
            } else {
                writer
                    .kv_set("fleet", &key, format!("v{i}").as_bytes())
                    .unwrap_or_else(|e| panic!("kv_set {i}: {e}"));
            }
            kv_writes += 1;
            slowest = slowest.max(t.elapsed());
            // Spread the writes over the fault.
            thread::sleep(Duration::from_millis(10));
        }
    });
    eprintln!("slowest append + kv write through the fault: {slowest:?}");
    kv_writes
}

/// Reads `ENTRIES` entries and checks: ids 1..=ENTRIES in order, each once,
/// each payload the one appended. Returns (read, duplicates, lost).
fn read_all(reader: &fleetcoord::coordinator::StreamReader) -> (u32, u32, u32) {
    let mut seen = BTreeSet::new();
    let mut duplicates = 0;
    let mut last = 0;
    let mut longest_wait = Duration::ZERO;
    while seen.len() < ENTRIES as usize {
        let t = Instant::now();
        let Ok(e) = reader.recv_timeout(WAIT) else {
            break;
        };
        longest_wait = longest_wait.max(t.elapsed());
        assert!(e.id.0 > last, "order: {} after {last}", e.id.0);
        last = e.id.0;
        assert_eq!(e.payload, format!("entry-{}", e.id.0 - 1).into_bytes());
        if !seen.insert(e.id.0) {
            duplicates += 1;
        }
    }
    // Nothing beyond the appended entries, and nothing twice.
    if let Ok(extra) = reader.recv_timeout(Duration::from_millis(300)) {
        panic!("unexpected entry {:?}", extra.id);
    }
    eprintln!("longest wait for the next entry: {longest_wait:?}");
    let read = seen.len() as u32;
    (read, duplicates, ENTRIES - read)
}

/// Applies watch events until the view equals the bucket as a fresh
/// watch's snapshot shows it (taken again every second: right after a
/// failover the fresh watch may read a replica a moment behind); panics
/// with the keys that differ when it does not settle.
fn settle(
    watch: &fleetcoord::coordinator::KvWatcher,
    view: &mut BTreeMap<String, Vec<u8>>,
    check: &dyn Coordinator,
) {
    let deadline = Instant::now() + WAIT;
    let mut truth = snapshot(check);
    let mut taken = Instant::now();
    while *view != truth {
        match watch.recv_timeout(Duration::from_millis(100)) {
            Ok(KvEvent::Put { key, value }) => {
                view.insert(key, value);
            }
            Ok(KvEvent::Deleted { key }) => {
                assert!(view.remove(&key).is_some(), "delete of unknown {key}");
            }
            Ok(KvEvent::Synced) => panic!("second Synced"),
            Err(_) if Instant::now() < deadline => {
                if taken.elapsed() > Duration::from_secs(1) {
                    truth = snapshot(check);
                    taken = Instant::now();
                }
            }
            Err(e) => {
                let differ: Vec<_> = truth
                    .keys()
                    .chain(view.keys())
                    .filter(|k| truth.get(*k) != view.get(*k))
                    .map(|k| (k, view.get(k), truth.get(k)))
                    .collect();
                panic!("watch view never matched the bucket ({e}); (key, view, bucket): {differ:?}")
            }
        }
    }
}

fn snapshot(c: &dyn Coordinator) -> BTreeMap<String, Vec<u8>> {
    let watch = c.kv_watch("fleet", "*").unwrap();
    let mut map = BTreeMap::new();
    loop {
        match watch.recv_timeout(WAIT).unwrap() {
            KvEvent::Put { key, value } => {
                map.insert(key, value);
            }
            KvEvent::Synced => return map,
            other => panic!("{other:?} in a snapshot"),
        }
    }
}

fn synced_watch(c: &dyn Coordinator) -> fleetcoord::coordinator::KvWatcher {
    let watch = c.kv_watch("fleet", "*").unwrap();
    assert_eq!(watch.recv_timeout(WAIT).unwrap(), KvEvent::Synced);
    watch
}

/// Publishes until the subscriber hears one: after a reconnect its
/// subscription comes back a moment after the publisher's connection does.
fn pubsub_works(publisher: &dyn Coordinator, sub: &fleetcoord::coordinator::Subscription) {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        publisher.publish("alerts", b"after").unwrap();
        if let Ok(m) = sub.recv_timeout(Duration::from_millis(200)) {
            assert_eq!(m.payload, b"after");
            return;
        }
    }
    panic!("the subscription never delivered again");
}

#[test]
fn server_restart_loses_and_repeats_nothing() {
    let mut server = NatsServer::start().expect("start nats-server (`make deps-nats`)");
    let writer = NatsCoordinator::connect(&server.url()).unwrap();
    let observer = NatsCoordinator::connect(&server.url()).unwrap();
    let sub = observer.subscribe("alerts").unwrap();
    let reader = observer.read_stream("jobs", StreamPosition::Start).unwrap();
    let watch = synced_watch(&observer);

    let kv_writes = write_through_fault(&writer, || {
        server.kill().unwrap();
        thread::sleep(Duration::from_secs(1));
        server.restart().unwrap();
    });

    let (read, duplicates, lost) = read_all(&reader);
    let mut view = BTreeMap::new();
    settle(&watch, &mut view, &observer);
    pubsub_works(&writer, &sub);
    eprintln!(
        "nats restart: appended {ENTRIES}, read {read}, duplicates {duplicates}, lost {lost}; \
         kv writes {kv_writes}, watcher view = bucket ({} keys)",
        view.len()
    );
    assert_eq!((read, duplicates, lost), (ENTRIES, 0, 0));
}

#[test]
fn cluster_node_loss_is_invisible_with_three_replicas() {
    let cluster = NatsCluster::start(3).expect("start a 3-node nats cluster (`make deps-nats`)");
    let options = NatsOptions::default()
        .with_kv_replicas(3)
        .with_stream_replicas(3);
    let writer = NatsCoordinator::with_options(&cluster.urls(), options.clone()).unwrap();
    let observer = NatsCoordinator::with_options(&cluster.urls(), options).unwrap();
    let sub = observer.subscribe("alerts").unwrap();
    let reader = observer.read_stream("jobs", StreamPosition::Start).unwrap();
    let watch = synced_watch(&observer);

    // Kill the node leading the stream (its readers' consumers live there
    // too) a third of the way in; it stays dead while the writes go on.
    let leader = cluster
        .stream_leader("COORD_S_jobs")
        .expect("the stream has a leader");
    let cluster = std::sync::Mutex::new(cluster);
    let kv_writes = write_through_fault(&writer, || {
        cluster.lock().unwrap().kill(leader).unwrap();
    });
    let cluster = cluster.into_inner().unwrap();
    assert!(cluster.node(leader).unwrap().pid().is_none());

    let (read, duplicates, lost) = read_all(&reader);
    let mut view = BTreeMap::new();
    settle(&watch, &mut view, &observer);
    pubsub_works(&writer, &sub);
    eprintln!(
        "nats 3-node cluster, stream leader n{leader} killed: appended {ENTRIES}, read {read}, \
         duplicates {duplicates}, lost {lost}; kv writes {kv_writes}, watcher view = bucket \
         ({} keys)",
        view.len()
    );
    assert_eq!((read, duplicates, lost), (ENTRIES, 0, 0));
    // The node comes back and catches up.
    let mut cluster = cluster;
    cluster.restart(leader).unwrap();
}

#[test]
fn no_server_at_start_is_a_clear_error_and_env_falls_back() {
    let url = "nats://127.0.0.1:1";
    let started = Instant::now();
    match NatsCoordinator::connect(url) {
        Err(e @ Error::Connect { .. }) => {
            let text = e.to_string();
            assert!(text.contains("nats") && text.contains(url), "{text}");
        }
        other => panic!("expected Error::Connect, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    let coord = from_vars(
        |name| match name {
            "COORD" => Some("nats".into()),
            "COORD_URL" => Some(url.into()),
            _ => None,
        },
        None,
    );
    assert!(!coord.capabilities().delivers, "falls back to noop");
    coord.ping().unwrap();
}
