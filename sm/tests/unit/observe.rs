//! Exact leader reports for hand-built elections.

use crate::support::{delete_event, drain, put_event};
use fleetcoord_sm::observe::*;
use fleetcoord_sm::rpc::{KeyRange, RangeRequest, Request, Response, RpcError, RpcId, WatchEvent};
use fleetcoord_sm::*;
#[allow(unused_imports)]
use std::time::{Duration, Instant};

fn config() -> ObserveConfig {
    ObserveConfig {
        prefix: b"/e/".to_vec(),
        backoff: BackoffConfig::default(),
    }
}

/// Tests need some instant to start from; the machine itself never reads a clock.
fn start() -> Instant {
    Instant::now()
}

fn cand(lease: i64, value: &str, create: Revision, modified: Revision) -> KeyValue {
    KeyValue {
        key: format!("/e/{lease:x}").into_bytes(),
        value: value.as_bytes().to_vec(),
        create_revision: create,
        mod_revision: modified,
        version: 1,
        lease,
    }
}

fn put(kv: KeyValue) -> WatchEvent {
    put_event(kv)
}

fn del(lease: i64, revision: Revision) -> WatchEvent {
    delete_event(format!("/e/{lease:x}").into_bytes(), revision)
}

fn ok(id: u64, response: Response) -> ObserveInput {
    ObserveInput::Rpc(RpcReply {
        id: RpcId(id),
        result: Ok(response),
    })
}

fn events(events: Vec<WatchEvent>) -> ObserveInput {
    ok(1, Response::WatchEvents { events })
}

fn leader(kv: Option<KeyValue>) -> Command<ObserveNotice> {
    Command::Notify(ObserveNotice::Leader(kv))
}

/// Observer whose snapshot at revision 10 held `kvs`; returns the commands
/// after the snapshot.
fn synced(now: Instant, kvs: Vec<KeyValue>) -> (Observe, Vec<Command<ObserveNotice>>) {
    let mut o = Observe::new(config(), now, 3);
    let range = Request::Range(RangeRequest {
        // The watch's page, plus the key that says whether more follow.
        limit: fleetcoord_sm::watch::DEFAULT_PAGE_SIZE + 1,
        ..RangeRequest::all(KeyRange::Prefix(b"/e/".to_vec()))
    });
    assert_eq!(
        drain(&mut o),
        vec![Command::Rpc {
            id: RpcId(0),
            request: range
        }]
    );
    assert_eq!(o.leader(), None);
    o.handle(now, ok(0, Response::Range { revision: 10, kvs }));
    let commands = drain(&mut o);
    o.handle(now, events(vec![]));
    (o, commands)
}

#[test]
fn reports_the_oldest_candidate_right_after_the_snapshot() {
    let t0 = start();
    let (first, second) = (cand(0xa, "a", 5, 5), cand(0xb, "b", 3, 3));
    let (o, commands) = synced(t0, vec![first, second.clone()]);
    let watch = Request::Watch {
        range: KeyRange::Prefix(b"/e/".to_vec()),
        start_revision: 11,
    };
    assert_eq!(
        commands,
        vec![
            Command::Rpc {
                id: RpcId(1),
                request: watch
            },
            leader(Some(second.clone()))
        ]
    );
    assert_eq!(o.leader(), Some(&second));
}

#[test]
fn an_empty_election_reports_no_leader() {
    let (o, commands) = synced(start(), vec![]);
    assert_eq!(commands.last(), Some(&leader(None)));
    assert_eq!(o.leader(), None);
}

#[test]
fn the_next_candidate_leads_when_the_leader_key_is_deleted() {
    let t0 = start();
    let (old, next, last) = (cand(1, "a", 3, 3), cand(2, "b", 4, 4), cand(3, "c", 6, 6));
    let (mut o, _) = synced(t0, vec![old, next.clone(), last]);
    assert!(drain(&mut o).is_empty());
    o.handle(t0, events(vec![del(1, 11)]));
    assert_eq!(drain(&mut o), vec![leader(Some(next))]);
    // Losing a non-leading candidate changes nothing for observers.
    o.handle(t0, events(vec![del(3, 12)]));
    assert!(drain(&mut o).is_empty());
    assert_eq!(o.leader().map(|kv| kv.lease), Some(2));
}

#[test]
fn a_proclamation_is_reported_but_a_rewrite_of_the_same_value_is_not() {
    let t0 = start();
    let (mut o, _) = synced(t0, vec![cand(1, "v1", 3, 3)]);
    let proclaimed = cand(1, "v2", 3, 11);
    o.handle(t0, events(vec![put(proclaimed.clone())]));
    assert_eq!(drain(&mut o), vec![leader(Some(proclaimed))]);
    let rewritten = cand(1, "v2", 3, 12);
    o.handle(
        t0,
        events(vec![put(rewritten.clone()), put(cand(9, "late", 13, 13))]),
    );
    assert!(drain(&mut o).is_empty());
    assert_eq!(o.leader(), Some(&rewritten));
}

#[test]
fn none_when_the_last_candidate_goes_and_a_newcomer_leads_after() {
    let t0 = start();
    let (mut o, _) = synced(t0, vec![cand(1, "a", 3, 3), cand(2, "b", 4, 4)]);
    // A lease revoke taking both candidates in one revision: one report only.
    o.handle(t0, events(vec![del(1, 11), del(2, 11)]));
    assert_eq!(drain(&mut o), vec![leader(None)]);
    let newcomer = cand(7, "n", 12, 12);
    o.handle(t0, events(vec![put(newcomer.clone())]));
    assert_eq!(drain(&mut o), vec![leader(Some(newcomer))]);
}

#[test]
fn a_resync_reports_only_the_resulting_leader() {
    let t0 = start();
    let (mut o, _) = synced(t0, vec![cand(1, "a", 3, 3)]);
    o.handle(
        t0,
        ObserveInput::Rpc(RpcReply {
            id: RpcId(1),
            result: Err(RpcError::Unavailable("x".into())),
        }),
    );
    assert_eq!(drain(&mut o), vec![Command::Cancel { id: RpcId(1) }]);
    let retry = o.poll_timeout().unwrap();
    assert!(retry > t0 && retry <= t0 + Duration::from_millis(100));
    o.handle_timeout(retry);
    drain(&mut o);
    let replacement = cand(2, "b", 15, 15);
    o.handle(
        retry,
        ok(
            2,
            Response::Range {
                revision: 20,
                kvs: vec![replacement.clone()],
            },
        ),
    );
    let commands = drain(&mut o);
    assert_eq!(commands.last(), Some(&leader(Some(replacement))));
    assert_eq!(
        commands
            .iter()
            .filter(|c| matches!(c, Command::Notify(_)))
            .count(),
        1
    );
    o.handle(retry, ObserveInput::Stop);
    assert_eq!(drain(&mut o), vec![Command::Cancel { id: RpcId(3) }]);
    assert_eq!(o.poll_timeout(), None);
}

#[test]
fn a_snapshot_read_that_cannot_succeed_fails_the_observer_once() {
    let t0 = start();
    let mut o = Observe::new(config(), t0, 3);
    drain(&mut o);
    let denied = RpcError::PermissionDenied("etcdserver: permission denied".into());
    o.handle(
        t0,
        ObserveInput::Rpc(RpcReply {
            id: RpcId(0),
            result: Err(denied.clone()),
        }),
    );
    assert_eq!(
        drain(&mut o),
        vec![
            Command::Cancel { id: RpcId(0) },
            Command::Notify(ObserveNotice::Failed(denied)),
        ]
    );
    assert_eq!(o.leader(), None);
    assert_eq!(o.poll_timeout(), None);
    assert!(o.is_finished());
    let later = t0 + Duration::from_secs(60);
    o.handle_timeout(later);
    o.handle(later, ObserveInput::ConsumerReady);
    assert!(drain(&mut o).is_empty(), "nothing after the failure");
}
