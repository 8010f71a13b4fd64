//! Edges of the NATS backend on a real nats-server: requests the server
//! refuses, a paused server, streams and consumers changed behind a
//! handle's back (by an operator or another tool), foreign writes to a
//! bucket, and feeds paused on a full queue when the handle closes.
//!
//! Changes behind the handle's back are made with async-nats directly, as
//! the `nats` CLI would make them.

use crossbeam_channel::RecvTimeoutError;
use fleetcoord::coordinator::{
    Coordinator, KvEvent, KvWatcher, NatsCoordinator, NatsOptions, StreamPosition,
};
use fleetcoord::testing::NatsServer;
use fleetcoord::{Error, ErrorKind};
use futures_util::StreamExt;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

fn start() -> NatsServer {
    NatsServer::start().expect("start nats-server (`make deps-nats` installs it)")
}

fn handle(server: &NatsServer, options: NatsOptions) -> NatsCoordinator {
    NatsCoordinator::with_options(&server.url(), options).unwrap()
}

/// Runs `f` with a JetStream context of its own on `server`.
fn jetstream<T>(
    server: &NatsServer,
    f: impl AsyncFnOnce(async_nats::jetstream::Context) -> T,
) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = async_nats::connect(server.url()).await.unwrap();
        let js = async_nats::jetstream::new(client.clone());
        let out = f(js).await;
        client.flush().await.unwrap();
        out
    })
}

/// Deletes every consumer of JetStream stream `stream`.
fn delete_consumers(server: &NatsServer, stream: &str) -> usize {
    jetstream(server, async |js| {
        let stream = js.get_stream(stream).await.unwrap();
        let names: Vec<String> = stream.consumer_names().map(|n| n.unwrap()).collect().await;
        for name in &names {
            stream.delete_consumer(name).await.unwrap();
        }
        names.len()
    })
}

/// `e` is a backend error of `kind` naming the handle's `url`, with
/// `words` in its message.
fn assert_backend(e: &Error, kind: ErrorKind, url: &str, words: &str) {
    match e {
        Error::Backend {
            backend: "nats",
            endpoints,
            kind: k,
            message,
        } if *k == kind && endpoints == url && message.contains(words) => {}
        other => {
            panic!("expected a nats {kind:?} error naming {url} with {words:?}, got {other:?}")
        }
    }
}

fn synced(watch: &KvWatcher) {
    assert_eq!(watch.recv_timeout(WAIT).unwrap(), KvEvent::Synced);
}

#[test]
fn configs_the_server_refuses_fail_at_once_naming_the_urls() {
    let server = start();
    let url = server.url();
    let started = Instant::now();
    let streams = handle(&server, NatsOptions::default().with_stream_replicas(3));
    let e = streams.append_stream("jobs", b"x").unwrap_err();
    assert_backend(
        &e,
        ErrorKind::Rejected,
        &url,
        "creating stream COORD_S_jobs",
    );
    assert!(!e.is_retryable(), "{e}");
    let one = handle(&server, NatsOptions::default());
    let buckets = handle(&server, NatsOptions::default().with_kv_replicas(3));
    let e = buckets.kv_set("fleet", "k", b"v").unwrap_err();
    assert_backend(&e, ErrorKind::Rejected, &url, "creating stream KV_fleet");
    // Subjects another stream holds (made by another tool).
    jetstream(&server, async |js| {
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "OTHER".into(),
            subjects: vec!["coord.stream.taken".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    });
    let e = one.append_stream("taken", b"x").unwrap_err();
    assert_backend(
        &e,
        ErrorKind::Rejected,
        &url,
        "creating stream COORD_S_taken",
    );
    // Not retried until the request timeout (20 s).
    assert!(started.elapsed() < Duration::from_secs(10));
    // The refusal is the config's: a handle with one replica works.
    assert_eq!(one.append_stream("jobs", b"x").unwrap().0, 1);
    assert!(format!("{one:?}").contains(&url));
}

#[test]
fn a_max_age_below_the_dedupe_window_works() {
    let server = start();
    let aged = handle(
        &server,
        NatsOptions::default().with_stream_max_age(Duration::from_secs(1)),
    );
    assert_eq!(aged.append_stream("aged", b"x").unwrap().0, 1);
    let reader = aged.read_stream("aged", StreamPosition::Start).unwrap();
    assert_eq!(reader.recv_timeout(WAIT).unwrap().payload, b"x");
}

#[test]
fn a_stream_made_with_other_options_is_used_as_it_is() {
    let server = start();
    let first = handle(&server, NatsOptions::default());
    for i in 0..5u8 {
        first.append_stream("jobs", &[i]).unwrap();
    }
    // Other limits than the stream has: it is neither changed nor trimmed.
    let other = handle(
        &server,
        NatsOptions::default()
            .with_stream_max_len(2)
            .with_stream_max_age(Duration::from_secs(3600)),
    );
    let reader = other.read_stream("jobs", StreamPosition::Start).unwrap();
    assert_eq!(other.append_stream("jobs", &[5]).unwrap().0, 6);
    for i in 0..6u8 {
        let entry = reader.recv_timeout(WAIT).unwrap();
        assert_eq!((entry.id.0, entry.payload), (u64::from(i) + 1, vec![i]));
    }
}

#[test]
fn a_paused_server_fails_calls_within_the_request_timeout() {
    let server = start();
    let url = server.url();
    let fast = handle(
        &server,
        NatsOptions::default().with_request_timeout(Duration::from_secs(1)),
    );
    // Long enough for one attempt to run into its own 2 s bound.
    let slow = handle(
        &server,
        NatsOptions::default().with_request_timeout(Duration::from_secs(3)),
    );
    fast.append_stream("known", b"before").unwrap();
    fast.kv_set("known", "k", b"v").unwrap();
    // Opens (and keeps) the bucket's store, so the next read goes to it.
    assert_eq!(fast.kv_get("known", "k").unwrap(), b"v");
    server.pause().unwrap();
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            // The publish reached the socket: its outcome is unknown, and
            // the error says so in its type.
            match fast.append_stream("known", b"during").unwrap_err() {
                fleetcoord::Error::Indeterminate {
                    backend: "nats",
                    stream,
                    id: None,
                    message,
                } => {
                    assert_eq!(stream, "known");
                    assert!(message.contains("not acknowledged"), "{message}");
                }
                other => panic!("expected Indeterminate, got {other:?}"),
            }
        });
        s.spawn(|| {
            let e = fast
                .read_stream("unknown", StreamPosition::Start)
                .unwrap_err();
            assert_backend(&e, ErrorKind::Unavailable, &url, "creating stream");
        });
        s.spawn(|| {
            let e = fast.kv_get("known", "k").unwrap_err();
            // With the other calls overlapping it, the read may run on a
            // connection that has not opened the bucket's store yet: then
            // opening it is what finds the server paused.
            let opening = e.to_string().contains("reading stream KV_known");
            let words = if opening {
                "reading stream KV_known"
            } else {
                "reading \"k\" in bucket"
            };
            assert_backend(&e, ErrorKind::Unavailable, &url, words);
        });
        s.spawn(|| {
            let e = fast.kv_watch("known", "*").unwrap_err();
            assert_backend(&e, ErrorKind::Unavailable, &url, "watching bucket");
        });
        s.spawn(|| {
            let e = slow
                .read_stream("unknown", StreamPosition::Start)
                .unwrap_err();
            assert_backend(&e, ErrorKind::Unavailable, &url, "no answer within");
        });
    });
    // ping waits for the server, not only for the socket.
    let e = fast.ping().expect_err("ping of a paused server");
    assert_backend(&e, ErrorKind::Unavailable, &url, "ping");
    let took = started.elapsed();
    server.resume().unwrap();
    assert!(took < Duration::from_secs(9), "{took:?}");
    // Nothing broke for good.
    assert_eq!(fast.kv_get("known", "k").unwrap(), b"v");
    let reader = slow.read_stream("unknown", StreamPosition::Start).unwrap();
    assert!(reader.try_recv().is_err(), "an empty stream");
    fast.ping().expect("ping after resume");
}

#[test]
fn a_stream_deleted_behind_the_handle_is_created_again() {
    let server = start();
    let coord = handle(&server, NatsOptions::default());
    for i in 0..3u8 {
        coord.append_stream("jobs", &[i]).unwrap();
    }
    jetstream(&server, async |js| {
        js.delete_stream("COORD_S_jobs").await.unwrap();
    });
    // The handle still thinks the stream exists; its publishes find no
    // stream until it creates it again, as a new stream.
    assert_eq!(coord.append_stream("jobs", b"again").unwrap().0, 1);
    let reader = coord.read_stream("jobs", StreamPosition::Start).unwrap();
    let entry = reader.recv_timeout(WAIT).unwrap();
    assert_eq!((entry.id.0, entry.payload), (1, b"again".to_vec()));
    // A bucket that never existed: a delete is nothing, a get NotFound.
    coord.kv_delete("nobucket", "k").unwrap();
    assert!(matches!(
        coord.kv_get("nobucket", "k"),
        Err(Error::NotFound)
    ));
}

#[test]
fn readers_whose_consumer_vanished_start_again_where_they_were() {
    let server = start();
    let coord = handle(&server, NatsOptions::default());
    coord.append_stream("jobs", b"1").unwrap();
    let reader = coord.read_stream("jobs", StreamPosition::Start).unwrap();
    assert_eq!(reader.recv_timeout(WAIT).unwrap().id.0, 1);
    // A watch that has seen nothing yet (an empty bucket) and one that has.
    let empty = coord.kv_watch("empty", "*").unwrap();
    synced(&empty);
    coord.kv_set("fleet", "a", b"1").unwrap();
    let watch = coord.kv_watch("fleet", "*").unwrap();
    assert_eq!(
        watch.recv_timeout(WAIT).unwrap(),
        KvEvent::Put {
            key: "a".into(),
            value: b"1".to_vec()
        }
    );
    synced(&watch);

    assert_eq!(delete_consumers(&server, "COORD_S_jobs"), 1);
    assert_eq!(delete_consumers(&server, "KV_empty"), 1);
    assert_eq!(delete_consumers(&server, "KV_fleet"), 1);
    coord.append_stream("jobs", b"2").unwrap();
    coord.kv_set("empty", "b", b"2").unwrap();
    coord.kv_set("fleet", "a", b"3").unwrap();

    let entry = reader.recv_timeout(WAIT).unwrap();
    assert_eq!((entry.id.0, entry.payload), (2, b"2".to_vec()));
    assert_eq!(
        empty.recv_timeout(WAIT).unwrap(),
        KvEvent::Put {
            key: "b".into(),
            value: b"2".to_vec()
        }
    );
    assert_eq!(
        watch.recv_timeout(WAIT).unwrap(),
        KvEvent::Put {
            key: "a".into(),
            value: b"3".to_vec()
        }
    );
    // Once each: nothing repeated by the restart.
    let quiet = Duration::from_millis(300);
    assert!(reader.recv_timeout(quiet).is_err());
    assert!(empty.recv_timeout(quiet).is_err());
    assert!(watch.recv_timeout(quiet).is_err());
}

#[test]
fn foreign_writes_to_a_bucket() {
    let server = start();
    let coord = handle(&server, NatsOptions::default());
    coord.kv_set("fleet", "a", b"1").unwrap();
    let watch = coord.kv_watch("fleet", "*").unwrap();
    assert!(matches!(
        watch.recv_timeout(WAIT).unwrap(),
        KvEvent::Put { .. }
    ));
    synced(&watch);
    jetstream(&server, async |js| {
        // A plain publish to a key's subject, as a NATS client writes one.
        js.publish("$KV.fleet.x.y", "foreign".into())
            .await
            .unwrap()
            .await
            .unwrap();
        // A purge as `nats kv purge` writes it.
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("KV-Operation", "PURGE");
        headers.insert("Nats-Rollup", "sub");
        js.publish_with_headers("$KV.fleet.a", headers, "".into())
            .await
            .unwrap()
            .await
            .unwrap();
    });
    assert_eq!(
        watch.recv_timeout(WAIT).unwrap(),
        KvEvent::Put {
            key: "x.y".into(),
            value: b"foreign".to_vec()
        }
    );
    assert_eq!(
        watch.recv_timeout(WAIT).unwrap(),
        KvEvent::Deleted { key: "a".into() }
    );
    assert!(watch.recv_timeout(Duration::from_millis(300)).is_err());
    assert!(matches!(coord.kv_get("fleet", "a"), Err(Error::NotFound)));
    assert_eq!(coord.kv_get("fleet", "x.y").unwrap(), b"foreign");
}

#[test]
fn closing_the_handle_ends_feeds_paused_on_a_full_queue() {
    let server = start();
    let writer = handle(&server, NatsOptions::default());
    let coord = handle(&server, NatsOptions::default().with_feed_capacity(2));
    for i in 0..12u8 {
        writer.kv_set("fleet", &format!("k{i:02}"), &[i]).unwrap();
    }
    let watch = coord.kv_watch("fleet", "*").unwrap();
    let reader = coord.read_stream("jobs", StreamPosition::Start).unwrap();
    let sub = coord.subscribe("alerts").unwrap();
    for i in 0..6u8 {
        writer.append_stream("jobs", &[i]).unwrap();
        writer.publish("alerts", &[i]).unwrap();
    }
    // The snapshot (12 keys and Synced) does not fit a queue of 2: read it
    // slowly, one at a time, so the watch refills a little at a time.
    for i in 0..12u8 {
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            watch.recv_timeout(WAIT).unwrap(),
            KvEvent::Put {
                key: format!("k{i:02}"),
                value: vec![i]
            }
        );
    }
    synced(&watch);
    for i in 0..6u8 {
        writer.kv_set("fleet", "late", &[i]).unwrap();
    }
    // Every feed now waits on a full queue.
    std::thread::sleep(Duration::from_millis(500));
    coord.close().unwrap();
    // Each feed hands over what its queue held, then ends (no timeout).
    fn drain<T>(feed: &fleetcoord::coordinator::Feed<T>) -> usize {
        let mut n = 0;
        loop {
            match feed.recv_timeout(WAIT) {
                Ok(_) => n += 1,
                Err(RecvTimeoutError::Disconnected) => return n,
                Err(RecvTimeoutError::Timeout) => panic!("feed still open after close"),
            }
        }
    }
    let counts = [drain(&reader), drain(&sub), drain(&watch)];
    assert!(counts.iter().all(|&n| n <= 2), "{counts:?}");
    assert!(matches!(coord.ping(), Err(Error::Closed)));
}

#[test]
fn a_reader_that_cannot_reopen_yet_keeps_trying() {
    let server = start();
    // The stream made by another tool, with room for one consumer.
    jetstream(&server, async |js| {
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "COORD_S_jobs".into(),
            subjects: vec!["coord.stream.jobs".into()],
            max_consumers: 1,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .unwrap();
    });
    let coord = handle(&server, NatsOptions::default());
    coord.append_stream("jobs", b"1").unwrap();
    let first = coord.read_stream("jobs", StreamPosition::Start).unwrap();
    assert_eq!(first.recv_timeout(WAIT).unwrap().id.0, 1);
    // Its consumer vanishes and another reader takes the only place.
    assert_eq!(delete_consumers(&server, "COORD_S_jobs"), 1);
    let second = coord.read_stream("jobs", StreamPosition::Start).unwrap();
    assert_eq!(second.recv_timeout(WAIT).unwrap().id.0, 1);
    coord.append_stream("jobs", b"2").unwrap();
    assert_eq!(second.recv_timeout(WAIT).unwrap().id.0, 2);
    // The first reader finds its consumer gone and fails to make another
    // until the place is free again.
    std::thread::sleep(Duration::from_secs(4));
    assert!(first.try_recv().is_err());
    drop(second);
    delete_consumers(&server, "COORD_S_jobs");
    let entry = first.recv_timeout(WAIT).unwrap();
    assert_eq!((entry.id.0, entry.payload), (2, b"2".to_vec()));
    assert!(first.recv_timeout(Duration::from_millis(300)).is_err());
}

/// A handle that sits idle between calls keeps every connection through
/// the server's pings, also the one its callers drive themselves (which
/// nobody reads between calls but its tender): with pings every second and
/// one left unanswered closing a connection, 5 idle seconds end none.
#[test]
fn an_idle_handle_answers_the_servers_pings_on_every_connection() {
    let server = fleetcoord::testing::NatsBuilder::new()
        .ping_interval(Duration::from_secs(1))
        .start()
        .expect("start nats-server");
    let coord = handle(&server, NatsOptions::default());
    // The first calls go through the runtime thread while the callers'
    // own connection is dialled; a few later ones use it.
    for i in 0..20u8 {
        coord.kv_set("idle", "k", &[i]).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_secs(5));
    let log = server.log_tail(200);
    assert!(
        !log.contains("Stale Connection"),
        "a connection left the server's pings unanswered:\n{log}"
    );
    let started = Instant::now();
    coord.kv_set("idle", "k", b"after").unwrap();
    assert_eq!(coord.kv_get("idle", "k").unwrap(), b"after");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}
