//! One failure, one kind, on every backend: code behind a
//! `dyn Coordinator` acts on [`Error::kind`] and must not need to know
//! which backend it runs on. The same failures (a payload over the limit,
//! a bad name, a missing key, a call after close, a connect to a port
//! nothing listens on) must come back as the same [`ErrorKind`] whatever
//! the backend.

use super::case::{unique, Case, Ctx, Needs};
use crate::coordinator::{Coordinator, StreamPosition, MAX_PAYLOAD};
use crate::error::{Error, ErrorKind, Result};
use std::fmt::Debug;
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// This concern's cases, in the order they run.
pub(super) const CASES: &[Case] = &[Case {
    name: "one kind per failure",
    needs: Needs::Nothing,
    run: one_kind_per_failure,
}];

/// `result` failed with an error of `kind`.
#[track_caller]
fn expect_kind<T: Debug>(result: Result<T>, kind: ErrorKind, call: &str) {
    match result {
        Err(e) => assert_eq!(e.kind(), kind, "{call}: {e} ({e:?})"),
        Ok(v) => panic!("{call}: expected an error of kind {kind:?}, got Ok({v:?})"),
    }
}

fn one_kind_per_failure(ctx: &Ctx<'_>) {
    let c = ctx.open();
    let (topic, stream, bucket) = (unique("kind"), unique("kind"), unique("kind"));
    let too_big = vec![0x5A; MAX_PAYLOAD + 1];
    let invalid = ErrorKind::InvalidArgument;
    expect_kind(
        c.publish(&topic, &too_big),
        invalid,
        "publish above the limit",
    );
    expect_kind(
        c.append_stream(&stream, &too_big),
        invalid,
        "append_stream above the limit",
    );
    expect_kind(
        c.kv_set(&bucket, "k", &too_big),
        invalid,
        "kv_set above the limit",
    );
    expect_kind(c.publish("a/b", b"x"), invalid, "publish to a bad topic");
    expect_kind(c.kv_get(&bucket, "a/b"), invalid, "kv_get of a bad key");
    expect_kind(
        c.kv_get(&bucket, "absent"),
        ErrorKind::NotFound,
        "kv_get of a missing key",
    );
    let closed = ctx.open();
    closed.close().expect("close");
    let kind = ErrorKind::Closed;
    expect_kind(closed.ping(), kind, "ping after close");
    expect_kind(closed.publish(&topic, b"x"), kind, "publish after close");
    expect_kind(closed.subscribe(&topic), kind, "subscribe after close");
    expect_kind(
        closed.append_stream(&stream, b"x"),
        kind,
        "append_stream after close",
    );
    expect_kind(
        closed.read_stream(&stream, StreamPosition::Start),
        kind,
        "read_stream after close",
    );
    expect_kind(
        closed.kv_set(&bucket, "k", b"x"),
        kind,
        "kv_set after close",
    );
    expect_kind(closed.kv_get(&bucket, "k"), kind, "kv_get after close");
    expect_kind(
        closed.kv_delete(&bucket, "k"),
        kind,
        "kv_delete after close",
    );
    expect_kind(closed.kv_watch(&bucket, "*"), kind, "kv_watch after close");
}

/// How long a refused connect may take: a port nothing listens on on
/// loopback is refused at once, so this only covers a slow machine.
const REFUSED_WITHIN: Duration = Duration::from_secs(30);

/// Checks that connecting to a loopback port nothing listens on fails
/// the way it does on every backend: [`Error::Connect`] of kind
/// [`ErrorKind::Unavailable`] (retryable), naming the address, within
/// the backend's connect timeout. `connect(endpoint)` must connect the
/// backend under test to `endpoint`, given as `127.0.0.1:<port>` (the
/// `host:port` every backend accepts, see
/// [`Endpoints`](crate::Endpoints)). Panics saying what differed.
///
/// ```no_run
/// use fleetcoord::coordinator::{Coordinator, EtcdCoordinator};
///
/// fleetcoord::conformance::run_refused_connect(|endpoint| {
///     Ok(Box::new(EtcdCoordinator::connect(endpoint)?) as Box<dyn Coordinator>)
/// });
/// ```
pub fn run_refused_connect<F>(connect: F)
where
    F: Fn(&str) -> Result<Box<dyn Coordinator>>,
{
    // A port the system just handed out and nothing listens on any more.
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener.local_addr().expect("its address").port()
    };
    let endpoint = format!("127.0.0.1:{port}");
    let started = Instant::now();
    let result = connect(&endpoint);
    let took = started.elapsed();
    match result {
        Err(e @ Error::Connect { .. }) => {
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
            assert!(e.is_retryable(), "{e}");
            let text = e.to_string();
            assert!(
                text.contains(&endpoint),
                "the error names {endpoint}: {text}"
            );
            assert!(!text.contains('\n'), "one line: {text}");
        }
        Err(other) => panic!("connect to {endpoint}: expected Error::Connect, got {other:?}"),
        Ok(c) => panic!(
            "connect to {endpoint}: nothing listens there, yet {}",
            c.describe()
        ),
    }
    assert!(took < REFUSED_WITHIN, "a refused connect took {took:?}");
}
