//! What the cases assert with: receive within [`WAIT`], stay quiet for
//! [`QUIET`], and the expected errors, each failing with a message that
//! names the call and what was expected, since that message is all a
//! backend author sees in the report.

use super::{QUIET, WAIT};
use crate::coordinator::{Feed, KvEvent, Message, StreamEntry, StreamId};
use crate::error::{Error, Result};
use crossbeam_channel::RecvTimeoutError;
use std::collections::BTreeMap;
use std::fmt::Debug;

pub(super) fn recv<T>(feed: &Feed<T>, what: &str) -> T {
    match feed.recv_timeout(WAIT) {
        Ok(item) => item,
        Err(RecvTimeoutError::Timeout) => panic!("{what}: nothing arrived within {WAIT:?}"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: the feed ended"),
    }
}

pub(super) fn assert_quiet<T: Debug>(feed: &Feed<T>, what: &str) {
    match feed.recv_timeout(QUIET) {
        Err(RecvTimeoutError::Timeout) => {}
        Ok(item) => panic!("{what}: unexpected {item:?}"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: the feed ended"),
    }
}

pub(super) fn ok<T>(result: Result<T>, what: &str) -> T {
    match result {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

pub(super) fn expect_invalid<T: Debug>(result: Result<T>, field: &str, call: &str) {
    match result {
        Err(Error::InvalidArgument { what, .. }) if what == field => {}
        other => panic!("{call}: expected InvalidArgument naming {field:?}, got {other:?}"),
    }
}

pub(super) fn expect_closed<T: Debug>(result: Result<T>, call: &str) {
    match result {
        Err(Error::Closed) => {}
        other => panic!("{call} after close: expected Error::Closed, got {other:?}"),
    }
}

pub(super) fn expect_not_found<T: Debug>(result: Result<T>, call: &str) {
    match result {
        Err(Error::NotFound) => {}
        other => panic!("{call}: expected Error::NotFound, got {other:?}"),
    }
}

pub(super) fn msg(feed: &Feed<Message>, topic: &str, payload: &[u8], what: &str) {
    let m = recv(feed, what);
    assert_eq!(m.topic, topic, "{what}: topic");
    assert_eq!(m.payload, payload, "{what}: payload");
}

/// Reads a watch's snapshot up to `Synced`.
pub(super) fn snapshot(feed: &Feed<KvEvent>, what: &str) -> BTreeMap<String, Vec<u8>> {
    let mut seen = BTreeMap::new();
    loop {
        match recv(feed, what) {
            KvEvent::Put { key, value } => {
                assert!(
                    seen.insert(key.clone(), value).is_none(),
                    "{what}: {key:?} twice in the snapshot"
                );
            }
            KvEvent::Synced => return seen,
            other => panic!("{what}: {other:?} before Synced"),
        }
    }
}

pub(super) fn put(key: &str, value: &[u8]) -> KvEvent {
    KvEvent::Put {
        key: key.to_owned(),
        value: value.to_vec(),
    }
}

/// Reads a watch's snapshot and checks it is exactly `entries`.
pub(super) fn expect_snapshot(feed: &Feed<KvEvent>, entries: &[(&str, &[u8])], what: &str) {
    let expected: BTreeMap<String, Vec<u8>> = entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
        .collect();
    assert_eq!(snapshot(feed, what), expected, "{what}");
}

/// Receives the next stream entry and checks it.
pub(super) fn entry(feed: &Feed<StreamEntry>, id: StreamId, payload: &[u8], what: &str) {
    let e = recv(feed, what);
    assert_eq!((e.id, e.payload.as_slice()), (id, payload), "{what}");
}

/// Reads until the feed ends; fails if it does not end within [`WAIT`].
pub(super) fn drain_to_end<T>(feed: &Feed<T>, what: &str) {
    for _ in 0..100_000 {
        match feed.recv_timeout(WAIT) {
            Ok(_) => {}
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => panic!("{what}: still open {WAIT:?} after close"),
        }
    }
    panic!("{what}: still delivering after close");
}
