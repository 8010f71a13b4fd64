//! The Redis backend under faults, on real `redis-server` processes: a
//! restart (which, without persistence, also wipes the data) while a
//! subscriber, a KV watcher and a stream reader are open; every client
//! connection killed between bursts of writes; a server that is not there
//! at start; and a stream entry that fleetcoord did not write.

use crossbeam_channel::RecvTimeoutError;
use fleetcoord::coordinator::redis::RedisOptions;
use fleetcoord::coordinator::{
    from_vars, Coordinator, KvEvent, KvWatcher, RedisCoordinator, StreamEntry, StreamPosition,
    StreamReader,
};
use fleetcoord::testing::RedisServer;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Generous: a reconnect takes up to the 2 s backoff cap plus a connect.
const WAIT: Duration = Duration::from_secs(20);

fn wait_until_answering(coord: &RedisCoordinator) {
    let deadline = Instant::now() + WAIT;
    while coord.ping().is_err() {
        assert!(Instant::now() < deadline, "redis did not come back");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads entries until `n` arrived; panics on a timeout.
fn read_n(reader: &StreamReader, n: usize) -> Vec<StreamEntry> {
    (0..n)
        .map(|i| {
            reader
                .recv_timeout(WAIT)
                .unwrap_or_else(|e| panic!("entry {i} of {n}: {e}"))
        })
        .collect()
}

/// Applies watch events to `view` until it equals `expected` (or panics
/// after `WAIT`), then checks nothing more arrives.
fn converge(
    watch: &KvWatcher,
    view: &mut BTreeMap<String, Vec<u8>>,
    expected: &BTreeMap<String, Vec<u8>>,
) {
    let deadline = Instant::now() + WAIT;
    while view != expected {
        let left = deadline.saturating_duration_since(Instant::now());
        match watch.recv_timeout(left) {
            Ok(KvEvent::Put { key, value }) => {
                view.insert(key, value);
            }
            Ok(KvEvent::Deleted { key }) => {
                assert!(view.remove(&key).is_some(), "Deleted {key:?} it never had");
            }
            Ok(KvEvent::Synced) => panic!("a second Synced"),
            Err(e) => panic!("watcher view {view:?} never became {expected:?}: {e}"),
        }
    }
    match watch.recv_timeout(Duration::from_millis(300)) {
        Err(RecvTimeoutError::Timeout) => {}
        other => panic!("unexpected event after convergence: {other:?}"),
    }
}

/// The watcher's view equals the hash on the server, field by field.
fn assert_view_is_the_hash(server: &RedisServer, bucket: &str, view: &BTreeMap<String, Vec<u8>>) {
    let hash = format!("coord:kv:{{{bucket}}}");
    assert_eq!(
        server.command(&["HLEN", &hash]).unwrap(),
        view.len().to_string(),
        "HLEN of {hash}"
    );
    for (key, value) in view {
        assert_eq!(
            server.command(&["HGET", &hash, key]).unwrap().into_bytes(),
            *value,
            "{key}"
        );
    }
}

fn initial_view(watch: &KvWatcher) -> BTreeMap<String, Vec<u8>> {
    let mut view = BTreeMap::new();
    loop {
        match watch.recv_timeout(WAIT).expect("snapshot") {
            KvEvent::Put { key, value } => {
                view.insert(key, value);
            }
            KvEvent::Synced => return view,
            KvEvent::Deleted { key } => panic!("Deleted {key:?} in the snapshot"),
        }
    }
}

/// Counts what a reader delivered against what was appended, by payload.
fn count(appended: &[Vec<u8>], read: &[StreamEntry]) -> (usize, usize) {
    let mut seen = BTreeMap::new();
    for e in read {
        *seen.entry(e.payload.clone()).or_insert(0usize) += 1;
    }
    let duplicates = seen.values().map(|n| n - 1).sum();
    let lost = appended.iter().filter(|p| !seen.contains_key(*p)).count();
    (duplicates, lost)
}

#[test]
fn restart_with_open_subscriber_watcher_and_reader() {
    let mut server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    let url = server.url();
    let writer = RedisCoordinator::connect(&url).unwrap();
    let side = RedisCoordinator::connect(&url).unwrap();

    for i in 0..10 {
        writer
            .kv_set("cfg", &format!("k{i}"), format!("before-{i}").as_bytes())
            .unwrap();
    }
    let pre: Vec<Vec<u8>> = (0..50).map(|i| format!("pre-{i}").into_bytes()).collect();
    for p in &pre {
        writer.append_stream("metrics", p).unwrap();
    }
    let sub = side.subscribe("alerts").unwrap();
    let watch = side.kv_watch("cfg", "*").unwrap();
    let reader = side.read_stream("metrics", StreamPosition::Start).unwrap();
    let mut view = initial_view(&watch);
    assert_eq!(view.len(), 10);
    let mut read = read_n(&reader, 50);
    writer.publish("alerts", b"before").unwrap();
    assert_eq!(sub.recv_timeout(WAIT).unwrap().payload, b"before");

    // The restart loses everything (no persistence): the stream starts
    // over at id 1 and the bucket is empty until written again.
    server.restart().unwrap();
    wait_until_answering(&writer);
    let mut expected = BTreeMap::new();
    for i in 0..5 {
        let value = format!("after-{i}").into_bytes();
        writer.kv_set("cfg", &format!("k{i}"), &value).unwrap();
        expected.insert(format!("k{i}"), value);
    }
    writer.kv_set("cfg", "fresh", b"1").unwrap();
    expected.insert("fresh".to_string(), b"1".to_vec());
    let post: Vec<Vec<u8>> = (0..50).map(|i| format!("post-{i}").into_bytes()).collect();
    for p in &post {
        writer.append_stream("metrics", p).unwrap();
    }

    let after = read_n(&reader, 50);
    assert_eq!(
        after.iter().map(|e| e.payload.clone()).collect::<Vec<_>>(),
        post,
        "the recreated stream is read from its first entry, in order"
    );
    assert_eq!(after[0].id.0, 1, "a wiped stream numbers from 1 again");
    read.extend(after);
    assert!(reader.recv_timeout(Duration::from_millis(300)).is_err());
    let appended: Vec<Vec<u8>> = pre.iter().chain(&post).cloned().collect();
    let (duplicates, lost) = count(&appended, &read);
    assert_eq!((duplicates, lost), (0, 0));

    converge(&watch, &mut view, &expected);
    assert_view_is_the_hash(&server, "cfg", &view);

    // The subscriber is back once one of a series of publishes reaches it;
    // from then on it misses nothing.
    let deadline = Instant::now() + WAIT;
    loop {
        writer.publish("alerts", b"probe").unwrap();
        if sub.recv_timeout(Duration::from_millis(100)).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the subscriber never came back");
    }
    while sub.try_recv().is_ok() {}
    for i in 0..20 {
        writer
            .publish("alerts", format!("burst-{i}").as_bytes())
            .unwrap();
    }
    for i in 0..20 {
        assert_eq!(
            sub.recv_timeout(WAIT).unwrap().payload,
            format!("burst-{i}").into_bytes()
        );
    }
    eprintln!(
        "restart: appended {} (50 before, 50 after), read {}, duplicates {duplicates}, \
         lost {lost}; watcher view = hash ({} keys); subscriber got 20/20 after resubscribing",
        appended.len(),
        read.len(),
        view.len()
    );
}

#[test]
fn killed_connections_lose_and_repeat_nothing() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    let url = server.url();
    let writer = RedisCoordinator::connect(&url).unwrap();
    let side = RedisCoordinator::connect(&url).unwrap();
    let reader = side.read_stream("jobs", StreamPosition::Start).unwrap();
    let watch = side.kv_watch("state", "*").unwrap();
    let mut view = initial_view(&watch);
    let mut appended = Vec::new();
    let mut read = Vec::new();
    let mut expected = BTreeMap::new();
    let mut kills = 0;
    for round in 0..5 {
        for i in 0..40 {
            let payload = format!("r{round}-{i}").into_bytes();
            writer.append_stream("jobs", &payload).unwrap();
            let key = format!("k{}", i % 7);
            writer.kv_set("state", &key, &payload).unwrap();
            expected.insert(key, payload.clone());
            appended.push(payload);
        }
        // Both feeds caught up, so they are connected (a blocked XREAD, a
        // subscription) when every client connection is cut.
        read.extend(read_n(&reader, 40));
        converge(&watch, &mut view, &expected);
        let normal: u32 = server
            .command(&["CLIENT", "KILL", "TYPE", "normal"])
            .unwrap()
            .parse()
            .unwrap();
        let pubsub: u32 = server
            .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .unwrap()
            .parse()
            .unwrap();
        // At least the writer's, the reader's and the watcher's.
        assert!(normal + pubsub >= 3, "killed {normal} + {pubsub}");
        kills += normal + pubsub;
        wait_until_answering(&writer);
    }
    let ids: Vec<u64> = read.iter().map(|e| e.id.0).collect();
    assert_eq!(ids, (1..=200).collect::<Vec<u64>>(), "in order, gap-free");
    assert!(reader.recv_timeout(Duration::from_millis(300)).is_err());
    let (duplicates, lost) = count(&appended, &read);
    assert_eq!((duplicates, lost), (0, 0));
    converge(&watch, &mut view, &expected);
    assert_view_is_the_hash(&server, "state", &view);
    eprintln!(
        "connection kills (5 rounds, {kills} connections cut): appended {}, read {}, \
         duplicates {duplicates}, lost {lost}; watcher view = hash ({} keys)",
        appended.len(),
        read.len(),
        view.len()
    );
}

#[test]
fn unreachable_at_start_names_the_url_and_from_env_falls_back() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let started = Instant::now();
    let err = RedisCoordinator::connect(&url).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(text.contains(&url), "{text}");
    assert!(text.contains("cannot connect"), "{text}");
    assert!(err.is_retryable(), "{err:?}");
    let fallback = from_vars(
        |name| match name {
            "COORD" => Some("redis".into()),
            "COORD_URL" => Some(url.clone()),
            _ => None,
        },
        None,
    );
    assert!(!fallback.capabilities().delivers, "noop");
    assert!(fallback.ping().is_ok());
}

#[test]
fn a_foreign_stream_entry_is_reported_not_mangled() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    let coord = RedisCoordinator::connect(&server.url()).unwrap();
    coord.append_stream("foreign", b"one").unwrap();
    coord.append_stream("foreign", b"two").unwrap();
    // Someone appends by hand with an auto id (milliseconds part > 0).
    server
        .command(&["XADD", "coord:stream:{foreign}", "*", "p", "by-hand"])
        .unwrap();
    let reader = coord.read_stream("foreign", StreamPosition::Start).unwrap();
    assert_eq!(reader.recv_timeout(WAIT).unwrap().payload, b"one");
    assert_eq!(reader.recv_timeout(WAIT).unwrap().payload, b"two");
    // The reader ends rather than deliver an id it would have to invent.
    assert_eq!(
        reader.recv_timeout(WAIT).unwrap_err(),
        RecvTimeoutError::Disconnected
    );
    let err = coord.append_stream("foreign", b"three").unwrap_err();
    assert!(
        err.to_string().contains("not appended by fleetcoord"),
        "{err}"
    );
    assert!(!err.is_retryable(), "{err:?}");
}

fn pubsub_clients(server: &RedisServer) -> usize {
    server
        .command(&["CLIENT", "LIST", "TYPE", "pubsub"])
        .unwrap()
        .lines()
        .count()
}

#[test]
fn a_connection_lost_while_the_consumer_is_behind_is_rebuilt() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    let writer = RedisCoordinator::connect(&server.url()).unwrap();
    let slow = RedisCoordinator::with_options(
        &server.url(),
        RedisOptions::default().with_feed_capacity(2),
    )
    .unwrap();
    for i in 0..10 {
        writer.kv_set("big", &format!("k{i}"), b"v").unwrap();
    }
    let sub = slow.subscribe("chatter").unwrap();
    // The snapshot alone overflows the watch's queue: it holds one event.
    let watch = slow.kv_watch("big", "*").unwrap();
    for i in 0..10u8 {
        writer.publish("chatter", &[i]).unwrap();
    }
    // Both feeds are paused on a full queue when their connections go.
    std::thread::sleep(Duration::from_millis(300));
    server
        .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    writer.kv_set("big", "after", b"kill").unwrap();

    // The subscription delivers what fit and then the newest message it
    // held (the slow-consumer contract: it ends with the latest); what
    // arrived in between was dropped; after rebuilding its connection it
    // delivers again.
    let got: Vec<u8> = (0..3)
        .map(|_| sub.recv_timeout(WAIT).unwrap().payload[0])
        .collect();
    assert_eq!(got, [0, 1, 9]);
    let deadline = Instant::now() + WAIT;
    loop {
        writer.publish("chatter", b"probe").unwrap();
        if let Ok(m) = sub.recv_timeout(Duration::from_millis(100)) {
            assert_eq!(m.payload, b"probe", "a dropped message came back");
            break;
        }
        assert!(Instant::now() < deadline, "the subscriber never came back");
    }

    // The watch converges on the bucket through a new connection.
    let mut expected: BTreeMap<String, Vec<u8>> =
        (0..10).map(|i| (format!("k{i}"), b"v".to_vec())).collect();
    expected.insert("after".into(), b"kill".to_vec());
    let mut view = BTreeMap::new();
    let mut synced = 0;
    let deadline = Instant::now() + WAIT;
    while view != expected || synced == 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        match watch.recv_timeout(left) {
            Ok(KvEvent::Put { key, value }) => {
                view.insert(key, value);
            }
            Ok(KvEvent::Synced) => synced += 1,
            other => panic!("{other:?} with view {view:?}"),
        }
    }
    assert_eq!(synced, 1);
    assert_view_is_the_hash(&server, "big", &view);
}

#[test]
fn dropping_a_full_feed_releases_its_connection() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    let writer = RedisCoordinator::connect(&server.url()).unwrap();
    let slow = RedisCoordinator::with_options(
        &server.url(),
        RedisOptions::default().with_feed_capacity(2),
    )
    .unwrap();
    for i in 0..10 {
        writer.kv_set("big", &format!("k{i}"), b"v").unwrap();
        writer.append_stream("flood", b"e").unwrap();
    }
    let watch = slow.kv_watch("big", "*").unwrap();
    let sub = slow.subscribe("chatter").unwrap();
    let reader = slow.read_stream("flood", StreamPosition::Start).unwrap();
    for i in 0..10u8 {
        writer.publish("chatter", &[i]).unwrap();
    }
    assert_eq!(pubsub_clients(&server), 2);
    std::thread::sleep(Duration::from_millis(300));
    drop((watch, sub, reader));
    let deadline = Instant::now() + WAIT;
    while pubsub_clients(&server) > 0 {
        assert!(
            Instant::now() < deadline,
            "a dropped feed kept its subscription"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The handle itself still works.
    slow.ping().unwrap();
}

#[test]
fn a_stream_recreated_under_a_blocked_reader_is_read_from_its_start() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    let coord = RedisCoordinator::connect(&server.url()).unwrap();
    for p in [b"a", b"b"] {
        coord.append_stream("jobs", p).unwrap();
    }
    let reader = coord.read_stream("jobs", StreamPosition::Start).unwrap();
    let old: Vec<Vec<u8>> = read_n(&reader, 2).into_iter().map(|e| e.payload).collect();
    assert_eq!(old, [b"a".to_vec(), b"b".to_vec()]);
    // In one step, as a restart without persistence would leave it: a new
    // epoch and three entries, the newest above the reader's position.
    let script = "redis.call('DEL', KEYS[1], KEYS[2]) \
                  redis.call('SET', KEYS[2], 'B') \
                  for i = 1, 3 do redis.call('XADD', KEYS[1], '0-*', 'e', 'B', 'p', 'n' .. i) end \
                  return 'OK'";
    server
        .command(&[
            "EVAL",
            script,
            "2",
            "coord:stream:{jobs}",
            "coord:streame:{jobs}",
        ])
        .unwrap();
    let new: Vec<(u64, Vec<u8>)> = read_n(&reader, 3)
        .into_iter()
        .map(|e| (e.id.0, e.payload))
        .collect();
    assert_eq!(
        new,
        [
            (1, b"n1".to_vec()),
            (2, b"n2".to_vec()),
            (3, b"n3".to_vec())
        ]
    );

    // Deleted under an idle reader: its idle probe notices (a read from
    // its position alone would wait for an id above 3 for ever), so the
    // next stream is read from its first entry.
    server
        .command(&["DEL", "coord:stream:{jobs}", "coord:streame:{jobs}"])
        .unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    coord.append_stream("jobs", b"first").unwrap();
    let e = reader.recv_timeout(WAIT).unwrap();
    assert_eq!((e.id.0, e.payload), (1, b"first".to_vec()));

    // A key of another type where the stream was: reads fail, the reader
    // retries; once the stream is back it is read from its first entry.
    server
        .command(&["DEL", "coord:stream:{jobs}", "coord:streame:{jobs}"])
        .unwrap();
    server
        .command(&["SET", "coord:stream:{jobs}", "x"])
        .unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    server.command(&["DEL", "coord:stream:{jobs}"]).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    coord.append_stream("jobs", b"again").unwrap();
    let e = reader.recv_timeout(WAIT).unwrap();
    assert_eq!((e.id.0, e.payload), (1, b"again".to_vec()));
    assert!(reader.recv_timeout(Duration::from_millis(300)).is_err());
}

#[test]
fn a_frozen_server_times_requests_out_and_they_work_again_after() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    let short = Duration::from_millis(300);
    let coord = RedisCoordinator::with_options(
        &server.url(),
        RedisOptions::default()
            .with_connect_timeout(short)
            .with_request_timeout(short),
    )
    .unwrap();
    coord.kv_set("cfg", "a", b"1").unwrap();
    server.pause().unwrap();
    let t = Instant::now();
    let err = coord.kv_get("cfg", "a").unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    let err = coord.kv_watch("cfg", "*").unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(t.elapsed() < WAIT, "{:?}", t.elapsed());
    server.resume().unwrap();
    wait_until_answering(&coord);
    assert_eq!(coord.kv_get("cfg", "a").unwrap(), b"1");
}

/// A resync larger than the feed (a small one, whose consumer stops
/// reading), after live changes and after deletions made behind the
/// watch's back and found by a notification gap, is told in pieces.
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
