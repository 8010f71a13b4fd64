//! Requests a real `redis-server` refuses, and what each call and feed of
//! the Redis backend makes of the refusal: an ACL user without the rights
//! an operation needs (before and while feeds are live), keys of a foreign
//! type, notifications fleetcoord did not write, and a closed handle.

use crossbeam_channel::RecvTimeoutError;
use fleetcoord::coordinator::redis::RedisOptions;
use fleetcoord::coordinator::{Coordinator, KvEvent, RedisCoordinator, StreamPosition};
use fleetcoord::error::ErrorKind;
use fleetcoord::testing::RedisServer;
use fleetcoord::Error;
use std::time::{Duration, Instant};

/// Generous: a feed retries with a backoff of up to 2 s plus a connect.
const WAIT: Duration = Duration::from_secs(20);

fn server() -> RedisServer {
    RedisServer::start().expect("start redis-server (run `make deps-redis`)")
}

/// Gives the ACL user `app` (password `pw`) every right, then `rules`.
fn acl(server: &RedisServer, rules: &[&str]) {
    let mut args = vec![
        "ACL", "SETUSER", "app", "reset", "on", ">pw", "~*", "&*", "+@all",
    ];
    args.extend_from_slice(rules);
    assert_eq!(server.command(&args).unwrap(), "OK", "{args:?}");
}

fn as_app(server: &RedisServer) -> RedisCoordinator {
    RedisCoordinator::with_options(
        &server.url(),
        RedisOptions::default()
            .with_username("app")
            .with_password("pw"),
    )
    .expect("connect as app")
}

/// `result` failed with a redis error of `kind` whose message has `context`.
#[track_caller]
fn refused<T: std::fmt::Debug>(result: fleetcoord::Result<T>, kind: ErrorKind, context: &str) {
    match result {
        Err(Error::Backend {
            backend: "redis",
            kind: k,
            message,
            ..
        }) => {
            assert_eq!(k, kind, "{message}");
            assert!(message.contains(context), "{context:?} not in {message:?}");
        }
        other => panic!("expected a {kind:?} refusal with {context:?}, got {other:?}"),
    }
}

#[test]
fn operations_a_user_may_not_run_are_refused_as_permission_denied() {
    let server = server();
    acl(&server, &["-@scripting"]);
    let coord = as_app(&server);
    // Every KV write and every append is a script.
    refused(
        coord.kv_set("cfg", "a", b"1"),
        ErrorKind::PermissionDenied,
        r#"set "a" in bucket "cfg""#,
    );
    refused(
        coord.kv_delete("cfg", "a"),
        ErrorKind::PermissionDenied,
        r#"delete "a" in bucket "cfg""#,
    );
    refused(
        coord.append_stream("jobs", b"x"),
        ErrorKind::PermissionDenied,
        r#"append to stream "jobs""#,
    );
    // The watch subscribes, then its snapshot (a script) is refused.
    refused(
        coord.kv_watch("cfg", "*"),
        ErrorKind::PermissionDenied,
        r#"snapshot of bucket "cfg""#,
    );
    assert!(!coord.kv_set("cfg", "a", b"1").unwrap_err().is_retryable());

    // Without any channel: publishing, subscribing and watching (which
    // subscribes first) are refused.
    acl(&server, &["resetchannels"]);
    refused(
        coord.publish("alerts", b"x"),
        ErrorKind::PermissionDenied,
        r#"publish on "alerts""#,
    );
    refused(
        coord.subscribe("alerts"),
        ErrorKind::PermissionDenied,
        r#"subscription to "alerts""#,
    );
    refused(
        coord.kv_watch("cfg", "*"),
        ErrorKind::PermissionDenied,
        r#"watch of bucket "cfg""#,
    );

    // Without any key: reads are refused.
    acl(&server, &["resetkeys"]);
    refused(
        coord.kv_get("cfg", "a"),
        ErrorKind::PermissionDenied,
        r#"get "a" in bucket "cfg""#,
    );
    refused(
        coord.read_stream("jobs", StreamPosition::Start),
        ErrorKind::PermissionDenied,
        r#"reader of stream "jobs""#,
    );

    // Rights taken away after connecting apply at once, even to PING.
    acl(&server, &["-ping"]);
    refused(coord.ping(), ErrorKind::PermissionDenied, "ping");
    acl(&server, &[]);
    coord.ping().unwrap();
    coord.kv_set("cfg", "a", b"1").unwrap();
    assert_eq!(coord.kv_get("cfg", "a").unwrap(), b"1");
}

#[test]
fn a_wrong_password_fails_connect_naming_the_url_but_not_the_password() {
    let server = server();
    acl(&server, &[]);
    let err = RedisCoordinator::with_options(
        &server.url(),
        RedisOptions::default()
            .with_username("app")
            .with_password("not-the-password"),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        !err.is_retryable(),
        "bad credentials called retryable: {err:?}"
    );
    assert!(text.contains("cannot connect"), "{text}");
    assert!(text.contains(&server.url()), "{text}");
    assert!(!text.contains("not-the-password"), "{text}");
}

#[test]
fn keys_of_a_foreign_type_are_refused_not_misread() {
    let server = server();
    let coord = RedisCoordinator::connect(&server.url()).unwrap();
    // Someone else's plain strings where the bucket's hash and the stream
    // would be.
    server.command(&["SET", "coord:kv:{cfg}", "x"]).unwrap();
    server
        .command(&["SET", "coord:stream:{jobs}", "x"])
        .unwrap();
    refused(coord.kv_get("cfg", "a"), ErrorKind::Rejected, "WRONGTYPE");
    refused(
        coord.kv_set("cfg", "a", b"1"),
        ErrorKind::Rejected,
        "WRONGTYPE",
    );
    refused(
        coord.kv_watch("cfg", "*"),
        ErrorKind::Rejected,
        r#"snapshot of bucket "cfg""#,
    );
    refused(
        coord.read_stream("jobs", StreamPosition::Start),
        ErrorKind::Rejected,
        r#"reader of stream "jobs""#,
    );
    let err = coord.append_stream("jobs", b"x").unwrap_err();
    let text = err.to_string();
    assert!(text.contains(r#"append to stream "jobs""#), "{text}");
    // Not blamed on a foreign entry id: it is a foreign key type.
    assert!(!text.contains("not appended by fleetcoord"), "{text}");
    assert!(!err.is_retryable(), "{err:?}");
}

#[test]
fn forged_notifications_never_reach_the_consumer() {
    let server = server();
    let coord = RedisCoordinator::connect(&server.url()).unwrap();
    coord.kv_set("cfg", "a", b"1").unwrap();
    let watch = coord.kv_watch("cfg", "*").unwrap();
    let put = |key: &str, value: &[u8]| KvEvent::Put {
        key: key.into(),
        value: value.to_vec(),
    };
    assert_eq!(watch.recv_timeout(WAIT).unwrap(), put("a", b"1"));
    assert_eq!(watch.recv_timeout(WAIT).unwrap(), KvEvent::Synced);
    let forge = |text: &str| {
        server
            .command(&["PUBLISH", "coord:kvn:{cfg}", text])
            .unwrap();
    };
    // Not in the script's format; at or below the watch's version (1).
    forge("garbage");
    forge("1 s 5 stale1");
    // A foreign writer that follows the protocol: it bumps the version and
    // announces the delete of a key the consumer was never told about.
    server.command(&["INCR", "coord:kvv:{cfg}"]).unwrap();
    forge("2 d 5 ghost");
    // The next real write (version 3) follows without a gap.
    coord.kv_set("cfg", "b", b"2").unwrap();
    assert_eq!(watch.recv_timeout(WAIT).unwrap(), put("b", b"2"));

    // A version far ahead is a gap: the watch takes a new snapshot, which
    // has what was written behind its back, and never the forged change.
    server
        .command(&["HSET", "coord:kv:{cfg}", "c", "behind"])
        .unwrap();
    forge("99 s 4 fake!");
    assert_eq!(watch.recv_timeout(WAIT).unwrap(), put("c", b"behind"));
    match watch.recv_timeout(Duration::from_millis(300)) {
        Err(RecvTimeoutError::Timeout) => {}
        other => panic!("unexpected event after the resync: {other:?}"),
    }
    coord.kv_set("cfg", "d", b"4").unwrap();
    assert_eq!(watch.recv_timeout(WAIT).unwrap(), put("d", b"4"));
}

#[test]
fn a_closed_handle_refuses_everything_and_ends_its_feeds() {
    let server = server();
    let coord = RedisCoordinator::connect(&server.url()).unwrap();
    let shown = format!("{coord:?}");
    assert!(
        shown.contains(&server.url()) && shown.contains("cluster: false"),
        "{shown}"
    );
    assert!(!coord.is_cluster());
    assert_eq!(coord.capabilities().stream_max_len, None);
    assert!(coord.capabilities().delivers);
    let sub = coord.subscribe("alerts").unwrap();
    let reader = coord.read_stream("jobs", StreamPosition::End).unwrap();
    coord.close().unwrap();
    coord.close().unwrap();
    assert!(matches!(coord.ping(), Err(Error::Closed)));
    assert!(matches!(coord.publish("alerts", b"x"), Err(Error::Closed)));
    assert!(matches!(coord.kv_set("b", "k", b"v"), Err(Error::Closed)));
    assert!(matches!(coord.kv_get("b", "k"), Err(Error::Closed)));
    assert!(matches!(
        coord.append_stream("jobs", b"x"),
        Err(Error::Closed)
    ));
    assert!(matches!(coord.subscribe("alerts"), Err(Error::Closed)));
    assert!(matches!(coord.kv_watch("b", "*"), Err(Error::Closed)));
    assert!(matches!(
        coord.read_stream("jobs", StreamPosition::Start),
        Err(Error::Closed)
    ));
    assert_eq!(
        sub.recv_timeout(WAIT).unwrap_err(),
        RecvTimeoutError::Disconnected
    );
    assert_eq!(
        reader.recv_timeout(WAIT).unwrap_err(),
        RecvTimeoutError::Disconnected
    );
    // Their connections are gone from the server too.
    let deadline = Instant::now() + WAIT;
    while server
        .command(&["CLIENT", "LIST", "TYPE", "pubsub"])
        .unwrap()
        != ""
    {
        assert!(Instant::now() < deadline, "the subscription stayed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn feeds_retry_while_their_rights_are_revoked_and_resume_without_loss() {
    let server = server();
    acl(&server, &[]);
    let writer = RedisCoordinator::connect(&server.url()).unwrap();
    let side = as_app(&server);
    writer.kv_set("cfg", "a", b"1").unwrap();
    writer.append_stream("jobs", b"0").unwrap();
    let sub = side.subscribe("alerts").unwrap();
    let watch = side.kv_watch("cfg", "*").unwrap();
    let reader = side.read_stream("jobs", StreamPosition::Start).unwrap();
    assert!(matches!(
        watch.recv_timeout(WAIT).unwrap(),
        KvEvent::Put { .. }
    ));
    assert_eq!(watch.recv_timeout(WAIT).unwrap(), KvEvent::Synced);
    assert_eq!(reader.recv_timeout(WAIT).unwrap().payload, b"0");
    let kill_pubsub = || {
        server
            .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .unwrap();
    };

    // Scripts refused: the watch resubscribes but its snapshot fails.
    acl(&server, &["-@scripting"]);
    kill_pubsub();
    std::thread::sleep(Duration::from_millis(500));
    // Nothing at all: the subscription and the watch cannot resubscribe,
    // the reader's next read and its reconnects are refused.
    acl(&server, &["-@all"]);
    kill_pubsub();
    std::thread::sleep(Duration::from_millis(1_500));
    for i in 1..=5 {
        writer
            .append_stream("jobs", i.to_string().as_bytes())
            .unwrap();
    }
    writer.kv_set("cfg", "b", b"2").unwrap();
    writer.kv_delete("cfg", "a").unwrap();
    assert_eq!(
        sub.recv_timeout(Duration::from_millis(300)).unwrap_err(),
        RecvTimeoutError::Timeout
    );

    acl(&server, &[]);
    // The reader delivers what was appended meanwhile, exactly once.
    for i in 1..=5 {
        let e = reader.recv_timeout(WAIT).unwrap();
        assert_eq!((e.id.0, e.payload), (i + 1, i.to_string().into_bytes()));
    }
    // The watch tells the difference to its new snapshot.
    let mut events = vec![
        watch.recv_timeout(WAIT).unwrap(),
        watch.recv_timeout(WAIT).unwrap(),
    ];
    events.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(
        events,
        [
            KvEvent::Deleted { key: "a".into() },
            KvEvent::Put {
                key: "b".into(),
                value: b"2".to_vec()
            }
        ]
    );
    // The subscription is back once one of a series of publishes reaches it.
    let deadline = Instant::now() + WAIT;
    loop {
        writer.publish("alerts", b"probe").unwrap();
        if sub.recv_timeout(Duration::from_millis(100)).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the subscriber never came back");
    }
}

#[test]
fn closing_while_feeds_retry_is_prompt() {
    let server = server();
    acl(&server, &[]);
    let coord = as_app(&server);
    coord.kv_set("cfg", "a", b"1").unwrap();
    let sub = coord.subscribe("alerts").unwrap();
    let watch = coord.kv_watch("cfg", "*").unwrap();
    let reader = coord.read_stream("jobs", StreamPosition::Start).unwrap();
    // Every feed loses its connection and cannot get a new one.
    acl(&server, &["-@all"]);
    for kind in ["pubsub", "normal"] {
        server.command(&["CLIENT", "KILL", "TYPE", kind]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(700));
    // The retrying feeds stop at once instead of being aborted after the
    // shutdown grace (2 s).
    let t = Instant::now();
    coord.close().unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(1_500),
        "{:?}",
        t.elapsed()
    );
    // What was delivered before stays readable; then every feed ends.
    let told: Vec<KvEvent> = std::iter::from_fn(|| watch.recv_timeout(WAIT).ok()).collect();
    assert_eq!(
        told,
        [
            KvEvent::Put {
                key: "a".into(),
                value: b"1".to_vec()
            },
            KvEvent::Synced
        ]
    );
    assert_eq!(
        watch.recv_timeout(WAIT).unwrap_err(),
        RecvTimeoutError::Disconnected
    );
    assert_eq!(
        sub.recv_timeout(WAIT).unwrap_err(),
        RecvTimeoutError::Disconnected
    );
    assert_eq!(
        reader.recv_timeout(WAIT).unwrap_err(),
        RecvTimeoutError::Disconnected
    );
}
