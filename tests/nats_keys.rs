//! NATS KV keys are the keys other NATS clients see: a key NATS accepts is
//! stored as it is, in both directions, and only other keys are escaped
//! (`=` and an `_XX` encoding). The other client here is async-nats used
//! directly, as `nats kv` would use the bucket.

use fleetcoord::coordinator::{
    Coordinator, KvEvent, KvWatcher, NatsCoordinator, NatsKeyEncoding, NatsOptions,
};
use fleetcoord::testing::NatsServer;
use fleetcoord::Error;
use futures_util::StreamExt;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);
/// How long a watch must stay quiet to count as having nothing more.
const QUIET: Duration = Duration::from_millis(300);

/// Every warning logged in this test binary, so a test can check what the
/// backend said about entries it skipped.
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Warnings;

impl log::Log for Warnings {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            WARNINGS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(record.args().to_string());
        }
    }

    fn flush(&self) {}
}

/// The warnings logged so far that contain `text`.
fn warnings_with(text: &str) -> Vec<String> {
    WARNINGS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|w| w.contains(text))
        .cloned()
        .collect()
}

fn start() -> NatsServer {
    let _ = log::set_logger(&Warnings).map(|()| log::set_max_level(log::LevelFilter::Warn));
    NatsServer::start().expect("start nats-server (`make deps-nats` installs it)")
}

fn handle(server: &NatsServer, encoding: NatsKeyEncoding) -> NatsCoordinator {
    let options = NatsOptions::default().with_key_encoding(encoding);
    NatsCoordinator::with_options(&server.url(), options).expect("connect")
}

/// Runs `f` with a JetStream context of its own on `server`: a NATS client
/// that is not fleetcoord.
fn jetstream<T>(
    server: &NatsServer,
    f: impl AsyncFnOnce(async_nats::jetstream::Context) -> T,
) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = async_nats::connect(server.url()).await.expect("connect");
        let js = async_nats::jetstream::new(client.clone());
        let out = f(js).await;
        client.flush().await.expect("flush");
        out
    })
}

/// Every key of `bucket` as NATS names it, sorted.
fn nats_keys(server: &NatsServer, bucket: &str) -> Vec<String> {
    jetstream(server, async |js| {
        let store = js.get_key_value(bucket).await.expect("bucket");
        let keys = store.keys().await.expect("keys");
        let mut keys: Vec<String> = keys.map(|k| k.expect("key")).collect().await;
        keys.sort();
        keys
    })
}

/// Puts `(key, value)` pairs into `bucket` with async-nats.
fn nats_put(server: &NatsServer, bucket: &str, pairs: &[(&str, &str)]) {
    jetstream(server, async |js| {
        let store = js.get_key_value(bucket).await.expect("bucket");
        for (key, value) in pairs {
            store
                .put(*key, value.to_string().into())
                .await
                .unwrap_or_else(|e| panic!("put {key:?}: {e}"));
        }
    });
}

/// The snapshot a watch starts with, up to `Synced`.
fn snapshot(watch: &KvWatcher) -> BTreeMap<String, Vec<u8>> {
    let mut seen = BTreeMap::new();
    loop {
        match watch.recv_timeout(WAIT).expect("watch event") {
            KvEvent::Put { key, value } => {
                assert!(seen.insert(key.clone(), value).is_none(), "{key:?} twice");
            }
            KvEvent::Synced => return seen,
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn put(key: &str, value: &str) -> KvEvent {
    KvEvent::Put {
        key: key.into(),
        value: value.as_bytes().to_vec(),
    }
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect()
}

#[test]
fn a_key_fleetcoord_sets_is_the_key_nats_clients_read() {
    let server = start();
    let coord = handle(&server, NatsKeyEncoding::Nats);
    coord.kv_set("svc", "svc.a_b", b"one").unwrap();
    coord.kv_set("svc", "x=y-Z.9", b"two").unwrap();
    assert_eq!(nats_keys(&server, "svc"), ["svc.a_b", "x=y-Z.9"]);
    let values = jetstream(&server, async |js| {
        let store = js.get_key_value("svc").await.expect("bucket");
        let a = store.get("svc.a_b").await.expect("get");
        let b = store.get("x=y-Z.9").await.expect("get");
        (a, b)
    });
    assert_eq!(values.0.as_deref(), Some(&b"one"[..]));
    assert_eq!(values.1.as_deref(), Some(&b"two"[..]));

    // A delete is NATS' delete of that key.
    coord.kv_delete("svc", "svc.a_b").unwrap();
    let gone = jetstream(&server, async |js| {
        let store = js.get_key_value("svc").await.expect("bucket");
        store.get("svc.a_b").await.expect("get")
    });
    assert_eq!(gone, None);
}

#[test]
fn keys_other_clients_write_are_seen_by_get_and_watch() {
    let server = start();
    let coord = handle(&server, NatsKeyEncoding::Nats);
    // A bucket another client created (the stream `nats kv add` makes;
    // async-nats 0.51's own `create_key_value` cannot parse nats-server
    // 2.9's answer) and filled.
    jetstream(&server, async |js| {
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "KV_theirs".into(),
            subjects: vec!["$KV.theirs.>".into()],
            max_messages_per_subject: 1,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            ..Default::default()
        })
        .await
        .expect("create bucket");
    });
    nats_put(
        &server,
        "theirs",
        &[("svc.x_y", "1"), ("a/b=c", "2"), ("x=", "3"), ("_5F", "4")],
    );

    assert_eq!(coord.kv_get("theirs", "svc.x_y").unwrap(), b"1");
    assert_eq!(coord.kv_get("theirs", "x=").unwrap(), b"3");
    // A key in the legacy encoding's shape is just a key now.
    assert_eq!(coord.kv_get("theirs", "_5F").unwrap(), b"4");
    // fleetcoord keys never contain '/': asking for one is refused, but a
    // watch reports it (below).
    assert!(matches!(
        coord.kv_get("theirs", "a/b=c"),
        Err(Error::InvalidArgument { what: "key", .. })
    ));

    let all = coord.kv_watch("theirs", "*").unwrap();
    let svc = coord.kv_watch("theirs", "svc.*").unwrap();
    assert_eq!(
        snapshot(&all),
        map(&[("svc.x_y", "1"), ("a/b=c", "2"), ("x=", "3"), ("_5F", "4")])
    );
    assert_eq!(snapshot(&svc), map(&[("svc.x_y", "1")]));

    // Live changes by the other client.
    nats_put(&server, "theirs", &[("svc.live_1", "5"), ("a/b=c", "6")]);
    jetstream(&server, async |js| {
        let store = js.get_key_value("theirs").await.expect("bucket");
        store.delete("svc.x_y").await.expect("delete");
    });
    for expected in [
        put("svc.live_1", "5"),
        put("a/b=c", "6"),
        KvEvent::Deleted {
            key: "svc.x_y".into(),
        },
    ] {
        assert_eq!(all.recv_timeout(WAIT).unwrap(), expected);
    }
    for expected in [
        put("svc.live_1", "5"),
        KvEvent::Deleted {
            key: "svc.x_y".into(),
        },
    ] {
        assert_eq!(svc.recv_timeout(WAIT).unwrap(), expected);
    }
    assert!(all.recv_timeout(QUIET).is_err());
    assert!(svc.recv_timeout(QUIET).is_err());
    assert!(matches!(
        coord.kv_get("theirs", "svc.x_y"),
        Err(Error::NotFound)
    ));
}

#[test]
fn keys_nats_cannot_hold_round_trip_escaped() {
    let server = start();
    let coord = handle(&server, NatsKeyEncoding::Nats);
    // (key, the NATS key it is stored under)
    let keys = [
        ("a b", "=a_20b"),
        ("*", "=_2A"),
        (">", "=_3E"),
        ("ünï", "=_C3_BCn_C3_AF"),
        (".lead", "=_2Elead"),
        ("trail.", "=trail_2E"),
        ("a..b", "=a_2E_2Eb"),
        ("=", "=_3D"),
        ("=x", "=_3Dx"),
        ("=_3Dx", "=_3D_5F3Dx"),
        ("x.*.>", "=x_2E_2A_2E_3E"),
        ("plain.one", "plain.one"),
    ];
    for (key, _) in keys {
        coord.kv_set("odd", key, key.as_bytes()).unwrap();
    }
    let mut stored: Vec<&str> = keys.iter().map(|(_, s)| *s).collect();
    stored.sort_unstable();
    assert_eq!(nats_keys(&server, "odd"), stored);
    for (key, _) in keys {
        assert_eq!(coord.kv_get("odd", key).unwrap(), key.as_bytes(), "{key:?}");
    }
    let watch = coord.kv_watch("odd", "*").unwrap();
    let seen = snapshot(&watch);
    let expected: BTreeMap<String, Vec<u8>> = keys
        .iter()
        .map(|(k, _)| (k.to_string(), k.as_bytes().to_vec()))
        .collect();
    assert_eq!(seen, expected);
    // Glob characters in keys are matched as wildcards, on the decoded key.
    let stars = coord.kv_watch("odd", "x.*").unwrap();
    assert_eq!(snapshot(&stars), map(&[("x.*.>", "x.*.>")]));

    coord.kv_delete("odd", "=x").unwrap();
    assert_eq!(
        watch.recv_timeout(WAIT).unwrap(),
        KvEvent::Deleted { key: "=x".into() }
    );
    assert!(matches!(coord.kv_get("odd", "=x"), Err(Error::NotFound)));
    // The plain key `=_3Dx` is another key and still there.
    assert_eq!(coord.kv_get("odd", "=_3Dx").unwrap(), b"=_3Dx");
}

#[test]
fn marked_keys_that_do_not_decode_are_logged_and_skipped() {
    let server = start();
    let coord = handle(&server, NatsKeyEncoding::Nats);
    coord.kv_set("marks", "ok", b"0").unwrap();
    // `=abc` and `=a_2Eb` are plain-looking escapes no fleetcoord key
    // is stored as; `=_zz` is no escape at all.
    nats_put(
        &server,
        "marks",
        &[("=abc", "1"), ("=a_2Eb", "2"), ("=_zz", "3")],
    );
    // A raw subject outside the key alphabet, as a plain publish can make.
    jetstream(&server, async |js| {
        js.publish("$KV.marks.é", "4".into())
            .await
            .expect("publish")
            .await
            .expect("ack");
    });

    let watch = coord.kv_watch("marks", "*").unwrap();
    assert_eq!(snapshot(&watch), map(&[("ok", "0")]));
    // Live: an undecodable key is skipped, the next good one still comes.
    nats_put(
        &server,
        "marks",
        &[("=abc", "5"), ("=abc", "6"), ("next", "7")],
    );
    assert_eq!(watch.recv_timeout(WAIT).unwrap(), put("next", "7"));
    assert!(watch.recv_timeout(QUIET).is_err());

    for subject in [
        "$KV.marks.=abc",
        "$KV.marks.=a_2Eb",
        "$KV.marks.=_zz",
        "$KV.marks.é",
    ] {
        let logged = warnings_with(&format!("{subject:?} in KV_marks"));
        // Once per key and watch, although `=abc` arrived three times.
        assert_eq!(logged.len(), 1, "{subject}: {logged:?}");
    }
    // `=a_2Eb` would be key `a.b`, which is stored as it is: no such key.
    assert!(matches!(coord.kv_get("marks", "a.b"), Err(Error::NotFound)));
}

#[test]
fn the_legacy_encoding_reads_buckets_written_before_and_copies_out() {
    let server = start();
    let legacy = handle(&server, NatsKeyEncoding::Legacy);
    // Keys as a fleetcoord deployment from before stored them, including
    // a key and its own legacy escape.
    let keys = ["web.a", "a_b", "a_5Fb", "plain-1", "a b"];
    for key in keys {
        legacy.kv_set("old", key, key.as_bytes()).unwrap();
    }
    assert_eq!(
        nats_keys(&server, "old"),
        ["a_20b", "a_5F5Fb", "a_5Fb", "plain-1", "web_2Ea"]
    );

    // Another legacy handle (a later process of that deployment) reads
    // every key back.
    let again = handle(&server, NatsKeyEncoding::Legacy);
    for key in keys {
        assert_eq!(again.kv_get("old", key).unwrap(), key.as_bytes(), "{key:?}");
    }
    let watch = again.kv_watch("old", "*").unwrap();
    let old = snapshot(&watch);
    assert_eq!(old.keys().map(String::as_str).collect::<Vec<_>>(), {
        let mut k = keys.to_vec();
        k.sort_unstable();
        k
    });
    // A default handle sees the stored text; letters, digits and '-' are
    // the same key in both.
    let current = handle(&server, NatsKeyEncoding::Nats);
    assert_eq!(current.kv_get("old", "web_2Ea").unwrap(), b"web.a");
    assert_eq!(current.kv_get("old", "plain-1").unwrap(), b"plain-1");
    assert!(matches!(
        current.kv_get("old", "web.a"),
        Err(Error::NotFound)
    ));

    // Foreign NATS keys are not legacy keys: skipped, and logged.
    nats_put(&server, "old", &[("svc.x_y", "foreign")]);
    legacy.kv_set("old", "after", b"1").unwrap();
    assert_eq!(watch.recv_timeout(WAIT).unwrap(), put("after", "1"));
    assert_eq!(warnings_with("\"$KV.old.svc.x_y\" in KV_old").len(), 1);

    // The documented move: the old bucket's snapshot, read with a legacy
    // handle, set into a new bucket with a default one.
    for (key, value) in &old {
        current.kv_set("new", key, value).unwrap();
    }
    for key in keys {
        assert_eq!(
            current.kv_get("new", key).unwrap(),
            key.as_bytes(),
            "{key:?}"
        );
    }
    assert_eq!(
        nats_keys(&server, "new"),
        ["=a_20b", "a_5Fb", "a_b", "plain-1", "web.a"]
    );
}
