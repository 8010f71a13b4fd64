//! Exact command sequences of the double barrier (`fleetcoord_sm::barrier`):
//! the keys of Go's `recipes.DoubleBarrier`, who readies, who waits, who is
//! one too many, and how leaving drains.

use crate::support::{delete_event, drain, put_event};
use fleetcoord_sm::barrier::*;
use fleetcoord_sm::rpc::{
    Compare, KeyRange, RangeRequest, Request, Response, RpcId, SortOrder, Txn, TxnOp, TxnOpResponse,
};
use fleetcoord_sm::*;
use std::time::{Duration, Instant};

const KEY: &[u8] = b"/b/jobs";
const LEASE: LeaseId = 0x2a1f;
const MINE: &[u8] = b"/b/jobs/waiters/2a1f";
const READY: &[u8] = b"/b/jobs/ready";

fn barrier(count: u32, t0: Instant) -> DoubleBarrier {
    DoubleBarrier::new(
        BarrierConfig {
            key: KEY.to_vec(),
            count,
            backoff: BackoffConfig {
                initial: Duration::from_millis(100),
                max: Duration::from_secs(1),
                multiplier: 2,
                jitter_percent: 0,
            },
        },
        t0,
        7,
    )
}

fn rpc(id: u64, request: Request) -> Command<BarrierNotice> {
    Command::Rpc {
        id: RpcId(id),
        request,
    }
}

fn note(n: BarrierNotice) -> Command<BarrierNotice> {
    Command::Notify(n)
}

fn kv(key: &[u8], create: Revision, modified: Revision) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        value: Vec::new(),
        create_revision: create,
        mod_revision: modified,
        version: 1,
        lease: LEASE,
    }
}

fn oldest(count: i64) -> TxnOp {
    TxnOp::Range(RangeRequest {
        range: KeyRange::Prefix(b"/b/jobs/waiters/".to_vec()),
        sort: SortOrder::CreateAscending,
        limit: count,
        max_create_revision: 0,
        revision: 0,
        keys_only: true,
    })
}

fn ready_read() -> TxnOp {
    TxnOp::Range(RangeRequest::all(KeyRange::Key(READY.to_vec())))
}

fn mine_is(revision: Revision) -> Compare {
    Compare::CreateRevisionEquals {
        key: MINE.to_vec(),
        revision,
    }
}

fn join(count: i64) -> Request {
    Request::Txn(Txn {
        compare: vec![mine_is(0)],
        success: vec![
            TxnOp::Put {
                key: MINE.to_vec(),
                value: Vec::new(),
                lease: LEASE,
            },
            oldest(count),
            ready_read(),
        ],
        failure: vec![
            TxnOp::Range(RangeRequest::all(KeyRange::Key(MINE.to_vec()))),
            oldest(count),
            ready_read(),
        ],
    })
}

/// My join answered at `revision` (my token): the oldest waiters `oldest`
/// (mine among them or not) and the ready key.
fn joined(revision: Revision, oldest: Vec<KeyValue>, ready: Vec<KeyValue>) -> Response {
    Response::Txn {
        revision,
        succeeded: true,
        responses: vec![
            TxnOpResponse::Put,
            TxnOpResponse::Range { kvs: oldest },
            TxnOpResponse::Range { kvs: ready },
        ],
    }
}

fn answer(b: &mut DoubleBarrier, t: Instant, id: u64, r: Response) -> Vec<Command<BarrierNotice>> {
    b.handle(
        t,
        RpcReply {
            id: RpcId(id),
            result: Ok(r),
        }
        .into(),
    );
    drain(b)
}

fn enter(b: &mut DoubleBarrier, t: Instant, count: i64) {
    b.handle(t, BarrierInput::Enter { lease: LEASE });
    assert_eq!(drain(b), vec![rpc(0, join(count))]);
}

fn watch_ready(from: Revision) -> Request {
    Request::Watch {
        range: KeyRange::Key(READY.to_vec()),
        start_revision: from,
    }
}

/// Rules 1 and 3: second of three, I watch the ready key from my join's
/// revision + 1 and enter at its put; a delete of it does not let me in.
#[test]
fn a_waiter_enters_at_the_put_of_ready_after_its_key() {
    let t0 = Instant::now();
    let mut b = barrier(3, t0);
    enter(&mut b, t0, 3);
    let first = kv(b"/b/jobs/waiters/1", 4, 4);
    assert_eq!(
        answer(
            &mut b,
            t0,
            0,
            joined(9, vec![first, kv(MINE, 9, 9)], vec![])
        ),
        vec![rpc(1, watch_ready(10))]
    );
    let deleted = Response::WatchEvents {
        events: vec![delete_event(READY.to_vec(), 11)],
    };
    assert_eq!(answer(&mut b, t0, 1, deleted), vec![]);
    assert_eq!(b.entered(), None);
    let put = Response::WatchEvents {
        events: vec![put_event(kv(READY, 12, 12))],
    };
    assert_eq!(
        answer(&mut b, t0, 1, put),
        vec![cancel(1), note(BarrierNotice::Entered { token: 9 })]
    );
    assert_eq!(b.entered(), Some(9));
}

fn cancel(id: u64) -> Command<BarrierNotice> {
    Command::Cancel { id: RpcId(id) }
}

/// Rule 2: the `count`-th key readies, guarded by the ready key's mod
/// revision as read (an old round's ready at 3) and by its own key.
#[test]
fn the_count_th_participant_readies_guarded_by_what_it_read() {
    let t0 = Instant::now();
    let mut b = barrier(2, t0);
    enter(&mut b, t0, 2);
    let first = kv(b"/b/jobs/waiters/1", 4, 4);
    let old_ready = kv(READY, 2, 3);
    let put_ready = Request::Txn(Txn {
        compare: vec![
            Compare::ModRevisionEquals {
                key: READY.to_vec(),
                revision: 3,
            },
            mine_is(9),
        ],
        success: vec![TxnOp::Put {
            key: READY.to_vec(),
            value: Vec::new(),
            lease: 0,
        }],
        failure: vec![
            ready_read(),
            TxnOp::Range(RangeRequest::all(KeyRange::Key(MINE.to_vec()))),
        ],
    });
    assert_eq!(
        answer(
            &mut b,
            t0,
            0,
            joined(9, vec![first, kv(MINE, 9, 9)], vec![old_ready])
        ),
        vec![rpc(1, put_ready)]
    );
    let done = Response::Txn {
        revision: 10,
        succeeded: true,
        responses: vec![TxnOpResponse::Put],
    };
    assert_eq!(
        answer(&mut b, t0, 1, done),
        vec![note(BarrierNotice::Entered { token: 9 })]
    );
}

/// Rule 4: `count` keys older than mine: I delete mine (guarded) and the
/// enter fails `TooMany`, as Go's `ErrTooManyClients`.
#[test]
fn one_too_many_withdraws_and_fails() {
    let t0 = Instant::now();
    let mut b = barrier(2, t0);
    enter(&mut b, t0, 2);
    let full = vec![
        kv(b"/b/jobs/waiters/1", 4, 4),
        kv(b"/b/jobs/waiters/2", 5, 5),
    ];
    let withdraw = Request::Txn(Txn {
        compare: vec![mine_is(9)],
        success: vec![TxnOp::Delete(KeyRange::Key(MINE.to_vec()))],
        failure: vec![],
    });
    assert_eq!(
        answer(&mut b, t0, 0, joined(9, full, vec![])),
        vec![rpc(1, withdraw)]
    );
    let done = Response::Txn {
        revision: 10,
        succeeded: true,
        responses: vec![],
    };
    assert_eq!(
        answer(&mut b, t0, 1, done),
        vec![note(BarrierNotice::Failed(BarrierError::TooMany))]
    );
}

fn any_waiter() -> TxnOp {
    TxnOp::Range(RangeRequest {
        limit: 1,
        keys_only: true,
        ..RangeRequest::all(KeyRange::Prefix(b"/b/jobs/waiters/".to_vec()))
    })
}

/// Rule 5: leave deletes my key and reads who is left in one txn; while
/// someone is, it watches the waiters and reads again at a delete; when
/// nobody is, it deletes the ready key guarded by its mod revision.
#[test]
fn leaving_drains_then_deletes_ready() {
    let t0 = Instant::now();
    let mut b = barrier(1, t0);
    enter(&mut b, t0, 1);
    // Alone with count 1: I ready at once.
    answer(&mut b, t0, 0, joined(9, vec![kv(MINE, 9, 9)], vec![]));
    let done = Response::Txn {
        revision: 10,
        succeeded: true,
        responses: vec![TxnOpResponse::Put],
    };
    answer(&mut b, t0, 1, done);
    assert_eq!(b.entered(), Some(9));

    b.handle(t0, BarrierInput::Leave);
    let leave = Request::Txn(Txn {
        compare: vec![mine_is(9)],
        success: vec![
            TxnOp::Delete(KeyRange::Key(MINE.to_vec())),
            any_waiter(),
            ready_read(),
        ],
        failure: vec![any_waiter(), ready_read()],
    });
    assert_eq!(drain(&mut b), vec![rpc(2, leave.clone())]);
    let someone = Response::Txn {
        revision: 20,
        succeeded: true,
        responses: vec![
            TxnOpResponse::Delete { deleted: 1 },
            TxnOpResponse::Range {
                kvs: vec![kv(b"/b/jobs/waiters/1", 4, 4)],
            },
            TxnOpResponse::Range {
                kvs: vec![kv(READY, 10, 10)],
            },
        ],
    };
    let watch_waiters = Request::Watch {
        range: KeyRange::Prefix(b"/b/jobs/waiters/".to_vec()),
        start_revision: 21,
    };
    assert_eq!(answer(&mut b, t0, 2, someone), vec![rpc(3, watch_waiters)]);
    let gone = Response::WatchEvents {
        events: vec![delete_event(b"/b/jobs/waiters/1".to_vec(), 22)],
    };
    assert_eq!(answer(&mut b, t0, 3, gone), vec![cancel(3), rpc(4, leave)]);
    let nobody = Response::Txn {
        revision: 22,
        succeeded: false,
        responses: vec![
            TxnOpResponse::Range { kvs: vec![] },
            TxnOpResponse::Range {
                kvs: vec![kv(READY, 10, 10)],
            },
        ],
    };
    let close = Request::Txn(Txn {
        compare: vec![Compare::ModRevisionEquals {
            key: READY.to_vec(),
            revision: 10,
        }],
        success: vec![TxnOp::Delete(KeyRange::Key(READY.to_vec()))],
        failure: vec![],
    });
    assert_eq!(answer(&mut b, t0, 4, nobody), vec![rpc(5, close)]);
    let closed = Response::Txn {
        revision: 23,
        succeeded: true,
        responses: vec![],
    };
    assert_eq!(
        answer(&mut b, t0, 5, closed),
        vec![note(BarrierNotice::Left)]
    );
    assert_eq!(b.entered(), None);
}

/// Rule 6: a retryable failure sends the same request again after the
/// backoff; rule 7: a second enter is refused at once.
#[test]
fn failures_retry_and_a_second_enter_is_busy() {
    let t0 = Instant::now();
    let mut b = barrier(2, t0);
    enter(&mut b, t0, 2);
    b.handle(t0, BarrierInput::Enter { lease: LEASE });
    assert_eq!(
        drain(&mut b),
        vec![note(BarrierNotice::Failed(BarrierError::Busy))]
    );
    b.handle(
        t0,
        RpcReply {
            id: RpcId(0),
            result: Err(RpcError::Unavailable("down".into())),
        }
        .into(),
    );
    assert_eq!(drain(&mut b), vec![]);
    let at = b.poll_timeout().expect("a retry");
    assert_eq!(at, t0 + Duration::from_millis(100));
    b.handle_timeout(at);
    assert_eq!(drain(&mut b), vec![rpc(1, join(2))]);
    b.handle(t0 + Duration::from_millis(100), BarrierInput::Leave);
    assert_eq!(
        drain(&mut b),
        vec![note(BarrierNotice::Failed(BarrierError::NotEntered))]
    );
}
