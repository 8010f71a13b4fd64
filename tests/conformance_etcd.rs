//! The public conformance suite against the etcd backend on a real etcd
//! process. Every instance from the factory has its own `Etcd` connection
//! (like separate processes) and shares the root, so cross-instance cases
//! see each other's writes; streams are trimmed so the trimmed-resume case
//! runs; the restart hook kills etcd and starts it again with its data.

use fleetcoord::coordinator::{Coordinator, EtcdCoordinator, EtcdCoordinatorOptions};
use fleetcoord::testing::EtcdServer;
use fleetcoord::{Etcd, EtcdOptions};

#[test]
fn etcd_backend_conforms() {
    let server = EtcdServer::start().expect("start etcd (run `make test` to install it)");
    let endpoint = server.endpoint();
    let server = std::sync::Mutex::new(server);
    let report = fleetcoord::conformance::run_with_restart(
        || {
            let etcd =
                Etcd::with_options(&[endpoint.as_str()], EtcdOptions::default()).expect("connect");
            let options = EtcdCoordinatorOptions::default()
                .with_root("/conformance")
                .with_stream_max_len(64);
            Box::new(EtcdCoordinator::on_etcd_with_options(&etcd, options).expect("coordinator"))
                as Box<dyn Coordinator>
        },
        // kill -9 and start again: same port, same data.
        || server.lock().unwrap_or_else(|p| p.into_inner()).restart(),
    );
    report.assert_nothing_skipped();
}

#[test]
fn etcd_backend_follows_the_slow_consumer_contract() {
    let server = EtcdServer::start().expect("start etcd (run `make test` to install it)");
    let etcd =
        Etcd::with_options(&[server.endpoint().as_str()], EtcdOptions::default()).expect("connect");
    let report = fleetcoord::conformance::run_slow_consumers(|capacity| {
        let options = EtcdCoordinatorOptions::default()
            .with_root("/slow")
            .with_feed_capacity(capacity);
        Ok(Box::new(EtcdCoordinator::on_etcd_with_options(&etcd, options)?) as Box<dyn Coordinator>)
    });
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(report.passed.len(), 4);
}

// ---- the etcd backend beyond the shared contract ------------------------

use fleetcoord::coordinator::{KvEvent, StreamId, StreamPosition};
use fleetcoord::{Error, ErrorKind};
use std::os::unix::ffi::OsStrExt;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

/// Every warning logged in this test binary, so a test can check what the
/// backend reported about data it skipped.
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Warnings;

impl log::Log for Warnings {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            WARNINGS.lock().unwrap().push(record.args().to_string());
        }
    }

    fn flush(&self) {}
}

fn capture_warnings() {
    let _ = log::set_logger(&Warnings).map(|()| log::set_max_level(log::LevelFilter::Warn));
}

/// Writes `key = value` with etcdctl, as a writer that is not fleetcoord
/// would; the key may be any bytes.
fn foreign_put(endpoint: &str, key: &[u8], value: &str) {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "put"])
        .arg(std::ffi::OsStr::from_bytes(key))
        .arg(value)
        .output()
        .expect("run etcdctl (run `make test` to install it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn etcd_error<T: std::fmt::Debug>(result: fleetcoord::Result<T>) -> (ErrorKind, String) {
    match result {
        Err(Error::Etcd { kind, message }) => (kind, message),
        other => panic!("expected an etcd error, got {other:?}"),
    }
}

#[test]
fn options_are_checked_and_connect_takes_a_list() {
    let server = EtcdServer::start().expect("start etcd (run `make test` to install it)");
    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
    for root in ["", "/", "coord", "/coord/"] {
        let options = EtcdCoordinatorOptions::default().with_root(root);
        match EtcdCoordinator::on_etcd_with_options(&etcd, options) {
            Err(Error::InvalidArgument { what: "root", why }) => {
                assert!(why.contains("must start with '/'"), "{root:?}: {why}")
            }
            other => panic!("root {root:?}: {other:?}"),
        }
    }
    let options = EtcdCoordinatorOptions::default().with_stream_max_len(0);
    assert!(matches!(
        EtcdCoordinator::on_etcd_with_options(&etcd, options),
        Err(Error::InvalidArgument {
            what: "stream_max_len",
            ..
        })
    ));
    let options = EtcdCoordinatorOptions::default().with_root("/app");
    let coord = EtcdCoordinator::on_etcd_with_options(&etcd, options).unwrap();
    assert_eq!(format!("{coord:?}"), r#"EtcdCoordinator { root: "/app" }"#);

    // Blanks around endpoints and empty entries are ignored.
    let endpoint = server.endpoint();
    let listed = EtcdCoordinator::connect(&format!(" {endpoint} ,, {endpoint} ")).unwrap();
    listed.kv_set("config", "mode", b"on").unwrap();
    let plain = EtcdCoordinator::on_etcd(&etcd).unwrap();
    assert_eq!(plain.kv_get("config", "mode").unwrap(), b"on");
}

#[test]
fn a_foreign_stream_head_fails_appends_and_end_readers_naming_the_stream() {
    let server = EtcdServer::start().expect("start etcd (run `make test` to install it)");
    let endpoint = server.endpoint();
    let etcd = Etcd::with_options(&[endpoint.as_str()], EtcdOptions::default()).expect("connect");
    let coord = EtcdCoordinator::on_etcd(&etcd).unwrap();
    foreign_put(&endpoint, b"/coord/stream/jobs/head", "garbage");
    let (kind, message) = etcd_error(coord.append_stream("jobs", b"x"));
    assert_eq!(kind, ErrorKind::Unexpected);
    assert!(
        message.contains("\"jobs\"") && message.contains("garbage"),
        "{message}"
    );
    // A reader from the end must read the head first: it fails the same way.
    let (kind, message) = etcd_error(coord.read_stream("jobs", StreamPosition::End));
    assert_eq!(kind, ErrorKind::Unexpected);
    assert!(message.contains("\"jobs\""), "{message}");
}

#[test]
fn foreign_keys_under_a_stream_or_bucket_are_skipped() {
    capture_warnings();
    let server = EtcdServer::start().expect("start etcd (run `make test` to install it)");
    let endpoint = server.endpoint();
    let etcd = Etcd::with_options(&[endpoint.as_str()], EtcdOptions::default()).expect("connect");
    let coord = EtcdCoordinator::on_etcd(&etcd).unwrap();

    assert_eq!(coord.append_stream("mixed", b"1").unwrap(), StreamId(1));
    foreign_put(&endpoint, b"/coord/stream/mixed/e/not-a-number", "x");
    let reader = coord.read_stream("mixed", StreamPosition::Start).unwrap();
    assert_eq!(reader.recv_timeout(T).unwrap().id, StreamId(1));
    assert_eq!(coord.append_stream("mixed", b"2").unwrap(), StreamId(2));
    let next = reader.recv_timeout(T).unwrap();
    assert_eq!((next.id, next.payload.as_slice()), (StreamId(2), &b"2"[..]));
    assert!(
        WARNINGS
            .lock()
            .unwrap()
            .iter()
            .any(|w| w.contains("\"mixed\"") && w.contains("not-a-number")),
        "the skipped key is logged: {:?}",
        WARNINGS.lock().unwrap()
    );

    // A key that is not UTF-8 is no key of the bucket's.
    coord.kv_set("b", "ok", b"1").unwrap();
    foreign_put(&endpoint, b"/coord/kv/b/\xff\xfe", "x");
    let watch = coord.kv_watch("b", "*").unwrap();
    assert_eq!(
        watch.recv_timeout(T).unwrap(),
        KvEvent::Put {
            key: "ok".into(),
            value: b"1".to_vec()
        }
    );
    assert_eq!(watch.recv_timeout(T).unwrap(), KvEvent::Synced);
    foreign_put(&endpoint, b"/coord/kv/b/\xff\xfe", "y");
    coord.kv_set("b", "later", b"2").unwrap();
    assert_eq!(
        watch.recv_timeout(T).unwrap(),
        KvEvent::Put {
            key: "later".into(),
            value: b"2".to_vec()
        }
    );
}

/// A coordinator remembers the heads of at most 1,024 streams; past that
/// it forgets them all, and appends still get the right IDs (they read the
/// head again), also where another handle appended meanwhile.
#[test]
fn appends_stay_in_sequence_past_the_remembered_heads() {
    let server = EtcdServer::start().expect("start etcd (run `make test` to install it)");
    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
    let coord = EtcdCoordinator::on_etcd(&etcd).unwrap();
    let other = EtcdCoordinator::on_etcd(&etcd).unwrap();
    assert_eq!(coord.append_stream("s0", b"a").unwrap(), StreamId(1));
    for i in 1..=1024 {
        assert_eq!(
            coord.append_stream(&format!("s{i}"), b"a").unwrap(),
            StreamId(1)
        );
    }
    assert_eq!(other.append_stream("s0", b"b").unwrap(), StreamId(2));
    assert_eq!(coord.append_stream("s0", b"c").unwrap(), StreamId(3));
    assert_eq!(coord.append_stream("s1024", b"b").unwrap(), StreamId(2));
}
