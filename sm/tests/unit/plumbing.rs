//! The Machine contract's wiring of every machine that feeds a consumer
//! (the inputs the driver derives from `Machine` alone: stop, consumer
//! full/ready, conversions from replies), and the small pure helpers the
//! driver relies on: exact expectations, no etcd.

use crate::support::drain;
use fleetcoord_sm::keepalive::{Keepalive, KeepaliveInput};
use fleetcoord_sm::observe::{Observe, ObserveConfig, ObserveInput};
use fleetcoord_sm::rpc::{prefix_end, RpcError, RpcId, RpcReply};
use fleetcoord_sm::stream::{
    Append, AppendConfig, AppendInput, ReadFrom, Reader, ReaderConfig, ReaderInput, StreamError,
    StreamKeys,
};
use fleetcoord_sm::watch::{KeyRule, Watch, WatchConfig, WatchInput};
use fleetcoord_sm::{BackoffConfig, Command, Machine};
use std::time::{Duration, Instant};

fn reply() -> RpcReply {
    RpcReply {
        id: RpcId(7),
        result: Err(RpcError::Unavailable("x".into())),
    }
}

/// Stopping a fresh machine through `M::stop_input()` (what the driver
/// sends) finishes it, and it issues no RPC afterwards.
fn stops_cleanly<M: Machine>(mut m: M, now: Instant) {
    drain(&mut m);
    m.handle(now, M::stop_input());
    let after: Vec<_> = drain(&mut m)
        .into_iter()
        .filter(|c| matches!(c, Command::Rpc { .. }))
        .collect();
    assert!(after.is_empty(), "an RPC after stop");
    assert!(m.is_finished());
    assert_eq!(m.poll_timeout(), None);
}

fn watch_config() -> WatchConfig {
    WatchConfig {
        prefix: b"/p/".to_vec(),
        keys: KeyRule::Any,
        backoff: BackoffConfig::default(),
        page_size: 10,
    }
}

fn reader_config() -> ReaderConfig {
    ReaderConfig {
        keys: StreamKeys::new("/c", "s"),
        from: ReadFrom::Start,
        backoff: BackoffConfig::default(),
    }
}

#[test]
fn feeding_machines_declare_their_consumer_inputs() {
    assert_eq!(Watch::consumer_full_input(), Some(WatchInput::ConsumerFull));
    assert_eq!(
        Watch::consumer_ready_input(),
        Some(WatchInput::ConsumerReady)
    );
    assert_eq!(
        Observe::consumer_full_input(),
        Some(ObserveInput::ConsumerFull)
    );
    assert_eq!(
        Observe::consumer_ready_input(),
        Some(ObserveInput::ConsumerReady)
    );
    assert_eq!(
        Reader::consumer_full_input(),
        Some(ReaderInput::ConsumerFull)
    );
    assert_eq!(
        Reader::consumer_ready_input(),
        Some(ReaderInput::ConsumerReady)
    );
    // Machines whose notices answer the caller never wait for a consumer.
    assert_eq!(Keepalive::consumer_full_input(), None);
    assert_eq!(Keepalive::consumer_ready_input(), None);
    assert_eq!(Append::consumer_full_input(), None);
    assert_eq!(Append::consumer_ready_input(), None);
}

#[test]
fn replies_convert_into_each_machines_input() {
    assert_eq!(WatchInput::from(reply()), WatchInput::Rpc(reply()));
    assert_eq!(ObserveInput::from(reply()), ObserveInput::Rpc(reply()));
    assert_eq!(ReaderInput::from(reply()), ReaderInput::Rpc(reply()));
    assert_eq!(AppendInput::from(reply()), AppendInput::Rpc(reply()));
    assert_eq!(KeepaliveInput::from(reply()), KeepaliveInput::Rpc(reply()));
}

#[test]
fn every_machine_stops_through_its_stop_input() {
    let now = Instant::now();
    stops_cleanly(Watch::new(watch_config(), now, 1), now);
    stops_cleanly(
        Observe::new(
            ObserveConfig {
                prefix: b"/e/".to_vec(),
                backoff: BackoffConfig::default(),
            },
            now,
            1,
        ),
        now,
    );
    stops_cleanly(Reader::new(reader_config(), now, 1), now);
    stops_cleanly(
        Append::new(AppendConfig::new(StreamKeys::new("/c", "s")), now, 1),
        now,
    );
}

#[test]
fn a_paused_observer_resumes_when_its_consumer_is_ready() {
    let now = Instant::now();
    let mut m = Observe::new(
        ObserveConfig {
            prefix: b"/e/".to_vec(),
            backoff: BackoffConfig::default(),
        },
        now,
        1,
    );
    let first = drain(&mut m);
    assert!(
        matches!(first.as_slice(), [Command::Rpc { .. }]),
        "{first:?}"
    );
    m.handle(now, ObserveInput::ConsumerFull);
    m.handle(now + Duration::from_millis(1), ObserveInput::ConsumerReady);
    // Paused before anything was delivered: it reads again from scratch.
    let again = drain(&mut m);
    assert!(
        again.iter().any(|c| matches!(c, Command::Rpc { .. })),
        "{again:?}"
    );
}

#[test]
fn prefix_end_is_the_first_key_after_the_prefix() {
    assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
    assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
    assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    assert_eq!(prefix_end(b""), vec![0]);
}

#[test]
fn errors_read_as_one_line_each() {
    let rpc = [
        (RpcError::Unavailable("down".into()), "down"),
        (RpcError::Rejected("no".into()), "no"),
        (RpcError::LeaseNotFound, "lease"),
        (RpcError::PermissionDenied("nope".into()), "nope"),
        (RpcError::Unauthenticated("who".into()), "who"),
    ];
    for (e, part) in rpc {
        let text = e.to_string();
        assert!(text.contains(part) && !text.contains('\n'), "{text}");
    }
    let stream = [
        (StreamError::Contended { attempts: 3 }, "3 races"),
        (
            StreamError::BadHead {
                value: b"x".to_vec(),
            },
            "\"x\"",
        ),
        (StreamError::Exhausted, "exhausted"),
        (StreamError::Rpc(RpcError::LeaseNotFound), "lease"),
        (
            StreamError::Indeterminate {
                seq: 7,
                error: RpcError::Unavailable("t".into()),
            },
            "may or may not have been applied; if it was, it is entry 7",
        ),
        (StreamError::Unexpected("odd".into()), "odd"),
        (StreamError::Stopped, "stopped"),
    ];
    for (e, part) in stream {
        let text = e.to_string();
        assert!(text.contains(part) && !text.contains('\n'), "{text}");
    }
}
