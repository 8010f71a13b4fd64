//! Contention telemetry against a real etcd: a contended lock's wait is
//! in the wait histogram (and on the guard), refusals, losses and holds
//! are counted, and the registry the Prometheus exporter renders after
//! that traffic passes `promtool check metrics` with no lint message.
//!
//! One test in this binary: the recorder is process-global.

mod common;

use fleetcoord::{Mutex, TxnOp};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the first holder keeps the lock while the second waits.
const HOLD: Duration = Duration::from_millis(400);

/// Generous: the operations take milliseconds.
const WAIT: Duration = Duration::from_secs(20);

const PROMTOOL_HINT: &str =
    "promtool is missing: run `make deps-promtool` or `apt-get install prometheus`";

/// The value of the sample `name{labels}` in Prometheus text.
fn sample(text: &str, name: &str, label: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with('{') && l.contains(label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `promtool check metrics` on `text`: its exit status and what it said.
fn promtool(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run promtool ({e}); {PROMTOOL_HINT}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool output");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn a_contended_lock_shows_in_the_wait_histogram_and_the_registry_lints_clean() {
    // promtool first: a missing tool fails here, with the hint, before
    // anything else runs.
    let (_, version) = {
        let out = Command::new("promtool")
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("cannot run promtool ({e}); {PROMTOOL_HINT}"));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    eprintln!("{}", version.lines().next().unwrap_or(""));

    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
        .expect("buckets")
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).expect("the only recorder");
    fleetcoord::metrics::describe();

    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let etcd = common::connect(&endpoint);
    let first = Mutex::new(&etcd, "contended").expect("mutex");
    let second = Mutex::new(&etcd, "contended").expect("mutex");

    // Uncontended: the first lock wins at once.
    let held = first.lock().expect("first lock");
    assert!(!held.contended());
    assert_eq!(held.attempts(), 1);
    let label = {
        let key = held.key();
        let prefix = &key[..=key.rfind('/').expect("a prefix")];
        format!("election=\"{prefix}\"")
    };

    // A try while held is refused.
    assert!(second.try_lock().expect("try_lock").is_none());

    // Contended: the second waits for the first's release.
    let started = Instant::now();
    let waiter = std::thread::spawn(move || {
        let guard = second.lock_timeout(WAIT).expect("second lock");
        (guard, second)
    });
    std::thread::sleep(HOLD);
    held.unlock().expect("unlock");
    let (guard, second) = waiter.join().expect("waiter");
    assert!(started.elapsed() < WAIT, "the contended lock took {WAIT:?}");
    assert!(guard.contended(), "the second lock waited behind a holder");
    assert!(
        guard.waited() >= HOLD - Duration::from_millis(50),
        "waited {:?}, held {HOLD:?}",
        guard.waited()
    );
    assert_eq!(guard.attempts(), 1);

    // Lost: its key deleted behind its back (the watch ends the holding;
    // a fenced write then sends nothing).
    common::etcdctl(&endpoint, &["del", guard.key()]);
    guard
        .lost()
        .recv_timeout(WAIT)
        .expect("lost() within the bound");
    assert_eq!(
        guard
            .txn_if_held([TxnOp::put("/contended/x", "y")])
            .expect("txn"),
        None
    );
    drop(guard);
    drop(second);
    drop(first);

    // A read-write lock records the same, under one label per side
    // (`<root>read/`, `<root>write/`): a reader holds, a try of the write
    // is refused, a write waits for the reader's release.
    let reader = fleetcoord::RwLock::new(&etcd, "contended-rw").expect("rwlock");
    let writer = fleetcoord::RwLock::new(&etcd, "contended-rw").expect("rwlock");
    let write_label = format!("election=\"{}write/\"", writer.key_prefix());
    let read = reader.read().expect("read");
    assert_eq!(read.attempts(), 1);
    assert!(writer.try_write().expect("try_write").is_none());
    let started = Instant::now();
    let waiter = std::thread::spawn(move || {
        let guard = writer.write_timeout(WAIT).expect("write");
        (guard, writer)
    });
    std::thread::sleep(HOLD);
    read.unlock().expect("unlock");
    let (write, writer) = waiter.join().expect("writer");
    assert!(
        started.elapsed() < WAIT,
        "the contended write took {WAIT:?}"
    );
    assert!(write.contended(), "the write waited behind the reader");
    assert_eq!(write.attempts(), 1);
    assert!(write.waited() >= HOLD - Duration::from_millis(50));
    write.unlock().expect("unlock");
    drop(writer);
    drop(reader);

    let text = handle.render();
    assert_eq!(
        sample(&text, "fleetcoord_wait_seconds_count", &write_label),
        Some(1.0),
        "the write's wait:\n{text}"
    );
    assert!(
        sample(&text, "fleetcoord_wait_seconds_sum", &write_label)
            .is_some_and(|s| s >= (HOLD - Duration::from_millis(50)).as_secs_f64()),
        "the write's contended wait is not in the histogram:\n{text}"
    );
    for name in ["fleetcoord_refused_total", "fleetcoord_contended_total"] {
        assert_eq!(
            sample(&text, name, &write_label),
            Some(1.0),
            "{name}:\n{text}"
        );
    }

    let count = sample(&text, "fleetcoord_wait_seconds_count", &label);
    let sum = sample(&text, "fleetcoord_wait_seconds_sum", &label);
    assert_eq!(count, Some(2.0), "two wins recorded:\n{text}");
    let sum = sum.expect("a wait sum");
    assert!(
        sum >= (HOLD - Duration::from_millis(50)).as_secs_f64(),
        "the contended wait is not in the histogram: sum {sum}\n{text}"
    );
    // The contended wait is in a bucket above 0.25 s, the other below.
    let le = |b: &str| {
        sample(
            &text,
            "fleetcoord_wait_seconds_bucket",
            &format!("{label},le=\"{b}\""),
        )
    };
    assert_eq!(le("0.25"), Some(1.0), "{text}");
    assert_eq!(le("+Inf"), Some(2.0), "{text}");
    assert_eq!(
        sample(&text, "fleetcoord_contended_total", &label),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "fleetcoord_refused_total", &label),
        Some(1.0),
        "{text}"
    );
    assert!(
        sample(&text, "fleetcoord_hold_seconds_count", &label).is_some_and(|c| c >= 1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "fleetcoord_election_transitions_total",
            &format!("{label},event=\"lost\"")
        ),
        Some(1.0),
        "{text}"
    );

    let (ok, said) = promtool(&text);
    assert!(ok, "promtool check metrics failed: {said}\n{text}");
    assert!(said.trim().is_empty(), "promtool lint: {said}");
}
