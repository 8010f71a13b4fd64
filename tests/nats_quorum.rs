//! A JetStream cluster losing quorum, on 3 real nats-server processes with
//! replicas 3: 2 nodes are SIGKILLed. Appends and KV writes then fail
//! within the request timeout (+1 s) with a retryable error saying that
//! JetStream has no quorum for the stream, from the handle that created
//! the stream and from a new one (which must not try to create it); once
//! the nodes are back, both write again.

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

/// `call`'s error, checked: within the bound, retryable, one line, naming
/// the lack of quorum for `what`, and never an attempt to create it.
fn no_quorum<T: std::fmt::Debug>(what: &str, call: impl FnOnce() -> Result<T, Error>) -> String {
    let started = Instant::now();
    let result = call();
    let took = started.elapsed();
    let e = result.expect_err("stored without quorum");
    let text = e.to_string();
    assert!(took <= TIMEOUT + SLACK, "took {took:?}: {text}");
    assert!(e.is_retryable(), "{text}");
    assert!(
        text.contains(&format!("JetStream has no quorum for {what} (")),
        "{text}"
    );
    assert!(!text.contains("creating stream"), "{text}");
    assert!(!text.contains('\n'), "{text}");
    text
}

#[test]
fn appends_without_quorum_fail_in_time_saying_so_and_resume_after() {
    let mut cluster = NatsCluster::start(3).expect("start a 3-node nats cluster (make deps-nats)");
    let options = NatsOptions::default()
        .with_urls(&cluster.urls())
        .with_stream_replicas(3)
        .with_kv_replicas(3)
        .with_request_timeout(TIMEOUT);
    let writer = NatsCoordinator::with_options(options.clone()).expect("connect");
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
    while killed.elapsed() < OUTAGE {
        seen.push(no_quorum(r#"stream "jobs""#, || {
            writer.append_stream("jobs", b"during")
        }));
        seen.push(no_quorum(r#"bucket "cfg""#, || {
            writer.kv_set("cfg", "k", b"during")
        }));
        if !fresh_checked && killed.elapsed() > OUTAGE / 2 {
            // A handle that never saw the stream looks it up instead of
            // creating it, and says the same.
            let fresh = NatsCoordinator::with_options(options.clone()).expect("connect");
            seen.push(no_quorum(r#"stream "jobs""#, || {
                fresh.append_stream("jobs", b"fresh")
            }));
            fresh_checked = true;
        }
    }
    assert!(fresh_checked);
    seen.dedup();
    eprintln!("without quorum ({} distinct messages), e.g.:", seen.len());
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
    // Nothing was stored without quorum.
    let reader = writer
        .read_stream("jobs", StreamPosition::Start)
        .expect("read");
    let first = reader.recv_timeout(Duration::from_secs(10)).expect("entry");
    assert_eq!((first.id.0, first.payload.as_slice()), (1, &b"before"[..]));
    let next = reader.recv_timeout(Duration::from_secs(10)).expect("entry");
    assert_eq!((next.id, next.payload.as_slice()), (resumed, &b"after"[..]));
    assert_eq!(
        resumed.0, 2,
        "an append failed for lack of quorum was stored"
    );
}
