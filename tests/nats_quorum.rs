//! A JetStream cluster losing quorum, on 3 real nats-server processes with
//! replicas 3: 2 nodes are SIGKILLed. Appends and KV writes then fail
//! within the request timeout (+1 s) with an error saying that JetStream
//! has no quorum for the stream, from the handle that created the stream
//! and from a new one (which must not try to create it); once the nodes
//! are back, both write again. The error is retryable, except for an
//! append the surviving node accepted as the stream's leader: that leader
//! commits it when its replicas return, so it is `Indeterminate`, and the
//! stream holds at most one entry per such append.

use fleetcoord::coordinator::{Coordinator, NatsCoordinator, NatsOptions, StreamPosition};
use fleetcoord::testing::NatsCluster;
use fleetcoord::Error;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(3);
const SLACK: Duration = Duration::from_secs(1);
/// How long the nodes stay dead: nats-server 2.9 does not answer the
/// JetStream API at all for the first ~10 s without quorum, then answers
/// 10008; both phases must say the same.
const OUTAGE: Duration = Duration::from_secs(14);

/// `call`'s error, checked: within the bound, retryable (or, for an
/// append, `Indeterminate`), one line, naming the lack of quorum for
/// `what`, and never an attempt to create it. Also whether it was
/// `Indeterminate`.
fn no_quorum<T: std::fmt::Debug>(
    what: &str,
    call: impl FnOnce() -> Result<T, Error>,
) -> (String, bool) {
    let started = Instant::now();
    let result = call();
    let took = started.elapsed();
    let e = result.expect_err("stored without quorum");
    let text = e.to_string();
    assert!(took <= TIMEOUT + SLACK, "took {took:?}: {text}");
    let unknown = matches!(e, Error::Indeterminate { .. });
    assert!(
        e.is_retryable() || (unknown && what.starts_with("stream")),
        "{text}"
    );
    // What may have happened is said once.
    for phrase in ["may have been stored", "may or may not have been applied"] {
        assert!(text.matches(phrase).count() <= 1, "{text}");
    }
    assert!(
        text.contains(&format!("JetStream has no quorum for {what} (")),
        "{text}"
    );
    assert!(!text.contains("creating stream"), "{text}");
    assert!(!text.contains('\n'), "{text}");
    (text, unknown)
}

#[test]
fn appends_without_quorum_fail_in_time_saying_so_and_resume_after() {
    let mut cluster = NatsCluster::start(3).expect("start a 3-node nats cluster (make deps-nats)");
    let urls = cluster.urls();
    let options = NatsOptions::default()
        .with_stream_replicas(3)
        .with_kv_replicas(3)
        .with_request_timeout(TIMEOUT);
    let writer = NatsCoordinator::with_options(&urls, options.clone()).expect("connect");
    assert_eq!(
        writer.append_stream("jobs", b"before").expect("append").0,
        1
    );
    writer.kv_set("cfg", "k", b"v1").expect("kv_set");

    cluster.kill(1).expect("kill n1");
    cluster.kill(2).expect("kill n2");
    let killed = Instant::now();
    let mut seen = Vec::new();
    let mut fresh_checked = false;
    // Appends that may have been stored, by payload.
    let mut unknown: Vec<&[u8]> = Vec::new();
    while killed.elapsed() < OUTAGE {
        let (text, maybe) = no_quorum(r#"stream "jobs""#, || {
            writer.append_stream("jobs", b"during")
        });
        seen.push(text);
        if maybe {
            unknown.push(b"during");
        }
        seen.push(no_quorum(r#"bucket "cfg""#, || writer.kv_set("cfg", "k", b"during")).0);
        if !fresh_checked && killed.elapsed() > OUTAGE / 2 {
            // A handle that never saw the stream looks it up instead of
            // creating it, and says the same.
            let fresh = NatsCoordinator::with_options(&urls, options.clone()).expect("connect");
            let (text, maybe) =
                no_quorum(r#"stream "jobs""#, || fresh.append_stream("jobs", b"fresh"));
            seen.push(text);
            if maybe {
                unknown.push(b"fresh");
            }
            fresh_checked = true;
        }
    }
    assert!(fresh_checked);
    seen.dedup();
    eprintln!(
        "without quorum ({} distinct messages, {} appends Indeterminate), e.g.:",
        seen.len(),
        unknown.len()
    );
    for text in seen.iter().take(4) {
        eprintln!("  {text}");
    }

    cluster.restart(1).expect("restart n1");
    cluster.restart(2).expect("restart n2");
    let restored = Instant::now();
    // Liveness: appends resume (the first may wait for a stream leader).
    let resumed = loop {
        match writer.append_stream("jobs", b"after") {
            Ok(id) => break id,
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                assert!(
                    restored.elapsed() < Duration::from_secs(20),
                    "appends did not resume: {e}"
                );
            }
        }
    };
    eprintln!("appends resumed {:?} after the restart", restored.elapsed());
    writer.kv_set("cfg", "k", b"v2").expect("kv_set after");
    assert_eq!(writer.kv_get("cfg", "k").expect("kv_get"), b"v2");
    // Only Indeterminate appends may have been stored, once each at
    // most; a retryable failure never was.
    let reader = writer
        .read_stream("jobs", StreamPosition::Start)
        .expect("read");
    let first = reader.recv_timeout(Duration::from_secs(10)).expect("entry");
    assert_eq!((first.id.0, first.payload.as_slice()), (1, &b"before"[..]));
    let mut between = Vec::new();
    let next = loop {
        let entry = reader.recv_timeout(Duration::from_secs(10)).expect("entry");
        if entry.id >= resumed {
            break entry;
        }
        between.push(entry.payload);
    };
    assert_eq!((next.id, next.payload.as_slice()), (resumed, &b"after"[..]));
    assert_eq!(resumed.0, 2 + between.len() as u64, "ids are gap-free");
    for payload in &between {
        let at = unknown
            .iter()
            .position(|p| p == payload)
            .unwrap_or_else(|| {
                panic!(
                    "{:?} was stored, more often than appends said it may have been ({} Indeterminate)",
                    String::from_utf8_lossy(payload),
                    unknown.len()
                )
            });
        unknown.remove(at);
    }
    eprintln!("{} Indeterminate appends were stored", between.len());
}

/// A compare-and-set while the bucket has no quorum is never reported as
/// a win, and one reported as anything but `KvIndeterminate` was not
/// stored: after the nodes return, the key holds its value from before
/// or the value of a write that said its outcome was unknown.
#[test]
fn a_compare_and_set_without_quorum_is_never_a_false_win() {
    let mut cluster = NatsCluster::start(3).expect("start a 3-node nats cluster (make deps-nats)");
    let urls = cluster.urls();
    let options = NatsOptions::default()
        .with_kv_replicas(3)
        .with_request_timeout(TIMEOUT);
    let writer = NatsCoordinator::with_options(&urls, options).expect("connect");
    let start = writer
        .kv_set_if("locks", "owner", b"before", 0)
        .expect("claim");

    cluster.kill(1).expect("kill n1");
    cluster.kill(2).expect("kill n2");
    let killed = Instant::now();
    let mut unknown: Vec<Vec<u8>> = Vec::new();
    let mut refused = 0;
    let mut i = 0;
    while killed.elapsed() < OUTAGE / 2 {
        let value = format!("during {i}").into_bytes();
        i += 1;
        let began = Instant::now();
        match writer.kv_set_if("locks", "owner", &value, start) {
            Ok(revision) => panic!("a win without quorum, at revision {revision}"),
            Err(Error::KvIndeterminate { .. }) => unknown.push(value),
            Err(e) => {
                assert!(e.is_retryable(), "neither unknown nor retryable: {e}");
                refused += 1;
            }
        }
        assert!(
            began.elapsed() <= TIMEOUT + SLACK,
            "took {:?}",
            began.elapsed()
        );
    }
    eprintln!(
        "without quorum: {refused} conditional sets refused (not stored), {} outcome unknown",
        unknown.len()
    );

    cluster.restart(1).expect("restart n1");
    cluster.restart(2).expect("restart n2");
    let restored = Instant::now();
    let entry = loop {
        match writer.kv_get_entry("locks", "owner") {
            Ok(entry) => break entry,
            Err(e) => assert!(
                restored.elapsed() < Duration::from_secs(20),
                "reads did not resume: {e}"
            ),
        }
    };
    assert!(
        entry.value == b"before" || unknown.contains(&entry.value),
        "the key holds {:?}, written by a set reported as not stored",
        String::from_utf8_lossy(&entry.value)
    );
    // The revision read is the one a next conditional set needs.
    let next = loop {
        match writer.kv_set_if("locks", "owner", b"after", entry.revision) {
            Ok(revision) => break revision,
            Err(e) => assert!(
                e.is_retryable() && restored.elapsed() < Duration::from_secs(20),
                "the conditional set after the outage: {e}"
            ),
        }
    };
    assert!(next > entry.revision);
    assert_eq!(writer.kv_get("locks", "owner").expect("kv_get"), b"after");
}
