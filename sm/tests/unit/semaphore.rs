//! Exact command sequences of the election protocol with more than one
//! permit (a semaphore): who holds, what a waiter watches, and when it
//! reads again.

use crate::election_support::*;
use crate::support::{delete_event, drain};
use fleetcoord_sm::election::*;
use fleetcoord_sm::rpc::{
    EventKind, KeyRange, RangeRequest, Request, Response, RpcId, SortOrder, Txn, TxnOp,
    TxnOpResponse, WatchEvent,
};
use fleetcoord_sm::*;
use std::time::{Duration, Instant};

const PREFIX: &[u8] = b"/s/";

fn my_key() -> Vec<u8> {
    lease_key(PREFIX)
}

/// A semaphore of `permits` whose session holds lease `LEASE`, at `t0`.
fn registered(t0: Instant, permits: u32) -> Election {
    registered_with(election_config(PREFIX, permits), t0)
}

fn range(limit: i64, sort: SortOrder, max_create_revision: Revision) -> TxnOp {
    TxnOp::Range(RangeRequest {
        range: KeyRange::Prefix(PREFIX.to_vec()),
        sort,
        limit,
        max_create_revision,
        revision: 0,
        keys_only: true,
    })
}

fn mine() -> TxnOp {
    TxnOp::Range(RangeRequest::all(KeyRange::Key(my_key())))
}

/// The create with `permits`: on success the newest `permits + 2` keys
/// (mine, the `permits` ahead, one more to tell whether they are all);
/// if my key was there already, it and the oldest `permits` keys.
fn create_txn(permits: i64, value: &[u8]) -> Request {
    create_reading(
        permits,
        value,
        range(permits + 2, SortOrder::CreateDescending, 0),
    )
}

/// The create of a try-campaign: on success the oldest `permits` keys.
fn try_create_txn(permits: i64, value: &[u8]) -> Request {
    create_reading(
        permits,
        value,
        range(permits, SortOrder::CreateAscending, 0),
    )
}

/// Create my key and, on success, read `created`; if my key was there
/// already, read it and the oldest `permits` keys.
fn create_reading(permits: i64, value: &[u8], created: TxnOp) -> Request {
    create_key(
        &my_key(),
        value,
        created,
        range(permits, SortOrder::CreateAscending, 0),
    )
}

/// The answer to `try_create_txn` when it created my key at `revision`:
/// the oldest keys, `kvs`.
fn try_created(revision: Revision, kvs: Vec<KeyValue>) -> Response {
    txn(
        revision,
        true,
        vec![TxnOpResponse::Put, TxnOpResponse::Range { kvs }],
    )
}

/// The newest `permits + 1` keys created before my token (one more tells
/// whether the `permits` nearest are all), and my key.
fn older(permits: i64, token: Revision) -> Request {
    Request::Txn(Txn {
        compare: vec![],
        success: vec![
            range(permits + 1, SortOrder::CreateDescending, token - 1),
            mine(),
        ],
        failure: vec![],
    })
}

fn created(revision: Revision, value: &[u8], ahead: Vec<KeyValue>) -> Response {
    created_as(kv(&my_key(), value, revision), ahead)
}

fn older_found(revision: Revision, ahead: Vec<KeyValue>, token: Revision) -> Response {
    txn(
        revision,
        true,
        vec![
            TxnOpResponse::Range { kvs: ahead },
            TxnOpResponse::Range {
                kvs: vec![kv(&my_key(), b"2", token)],
            },
        ],
    )
}

/// The watch answer deleting `key` at `revision`.
fn deleted(key: &[u8], revision: Revision) -> Response {
    Response::WatchEvents {
        events: vec![delete_event(key.to_vec(), revision)],
    }
}

fn elected(op: u64, token: Revision, until: Instant) -> Command<ElectionNotice> {
    elected_after(op, token, until, false)
}

/// [`elected`] of a campaign that found `permits` holders and `waited`.
fn elected_after(
    op: u64,
    token: Revision,
    until: Instant,
    waited: bool,
) -> Command<ElectionNotice> {
    note(ElectionNotice::Elected {
        op: OpId(op),
        key: my_key(),
        token,
        lease: LEASE,
        waited,
        attempts: 1,
        trusted_until: until,
    })
}

fn campaign(e: &mut Election, t0: Instant, permits: i64) {
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(1),
            value: b"2".to_vec(),
        },
    );
    assert_eq!(drain(e), vec![rpc(P, create_txn(permits, b"2"))]);
}

/// The watch of the first waiter: every key of the semaphore.
fn watch_all(start_revision: Revision) -> Request {
    Request::Watch {
        range: KeyRange::Prefix(PREFIX.to_vec()),
        start_revision,
    }
}

/// Two permits, my key created at 7 behind bb (4), aa (3) and at least
/// one more: I wait, watching bb (request P + 1) and aa (P + 2).
fn waiting_on_two(t0: Instant) -> Election {
    let mut e = registered(t0, 2);
    campaign(&mut e, t0, 2);
    let b = kv(b"/s/bb", b"2", 4);
    let a = kv(b"/s/aa", b"2", 3);
    let z = kv(b"/s/zz", b"2", 2);
    ok(&mut e, t0, P, created(7, b"2", vec![b, a, z]));
    e
}

#[test]
fn with_one_older_key_and_two_permits_the_create_answer_holds() {
    let t0 = Instant::now();
    let mut e = registered(t0, 2);
    campaign(&mut e, t0, 2);
    let until = e.session_deadline().unwrap();
    assert_eq!(
        ok(&mut e, t0, P, created(7, b"2", vec![kv(b"/s/99", b"2", 4)])),
        vec![elected(1, 7, until), rpc(P + 1, watch(&my_key(), 8))]
    );
    assert!(e.is_leader());
    assert_eq!(e.token(), Some(7));
}

/// Queue [z, a, b, me] with two permits: I watch both a and b, not the
/// prefix (a herd) and not only b (deleting a would leave me waiting).
/// Deleting the farther one, a, wakes me; the read shows one older key
/// (z went too, unseen).
#[test]
fn with_more_older_keys_a_waiter_watches_the_nearest_two_and_holds_when_the_farther_goes() {
    let t0 = Instant::now();
    let mut e = registered(t0, 2);
    campaign(&mut e, t0, 2);
    let b = kv(b"/s/bb", b"2", 4);
    let a = kv(b"/s/aa", b"2", 3);
    let z = kv(b"/s/zz", b"2", 2);
    assert_eq!(
        ok(
            &mut e,
            t0,
            P,
            created(7, b"2", vec![b.clone(), a.clone(), z])
        ),
        vec![
            rpc(P + 1, watch(b"/s/bb", 8)),
            rpc(P + 2, watch(b"/s/aa", 8))
        ]
    );
    assert!(!e.is_leader());
    // A write to a watched key (a proclaim, say) changes nobody's rank.
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 1,
            Response::WatchEvents {
                events: vec![WatchEvent {
                    kind: EventKind::Put,
                    kv: KeyValue {
                        mod_revision: 8,
                        ..b.clone()
                    },
                    prev_kv: None,
                }]
            }
        ),
        vec![]
    );
    // a goes: both watches end, and one read decides.
    assert_eq!(
        ok(&mut e, t0, P + 2, deleted(b"/s/aa", 9)),
        vec![cancel(P + 1), cancel(P + 2), rpc(P + 3, older(2, 7))]
    );
    let until = e.session_deadline().unwrap();
    assert_eq!(
        ok(&mut e, t0, P + 3, older_found(9, vec![b], 7)),
        vec![
            elected_after(1, 7, until, true),
            rpc(P + 4, watch(&my_key(), 10))
        ]
    );
    assert!(e.is_leader());
}

/// Three older keys with two permits: a delete of one of the two nearest
/// wakes me, the read still finds two older, and I watch the new two.
#[test]
fn a_delete_with_three_older_keys_reads_again_and_watches_the_new_nearest_two() {
    let t0 = Instant::now();
    let mut e = registered(t0, 2);
    campaign(&mut e, t0, 2);
    let c = kv(b"/s/cc", b"2", 5);
    let b = kv(b"/s/bb", b"2", 4);
    let a = kv(b"/s/aa", b"2", 3);
    // The create reads mine, the two nearest and a, which says that
    // more than those two are ahead.
    assert_eq!(
        ok(
            &mut e,
            t0,
            P,
            created(7, b"2", vec![c.clone(), b.clone(), a.clone()])
        ),
        vec![
            rpc(P + 1, watch(b"/s/cc", 8)),
            rpc(P + 2, watch(b"/s/bb", 8))
        ]
    );
    assert_eq!(
        ok(&mut e, t0, P + 1, deleted(b"/s/cc", 8)),
        vec![cancel(P + 1), cancel(P + 2), rpc(P + 3, older(2, 7))]
    );
    // b and a are all that is left ahead: the first waiter watches the
    // prefix, so that either delete decides alone.
    assert_eq!(
        ok(&mut e, t0, P + 3, older_found(8, vec![b, a], 7)),
        vec![rpc(P + 4, watch_all(9))]
    );
    assert!(!e.is_leader());
    // A late answer of a canceled watch changes nothing.
    assert_eq!(ok(&mut e, t0, P + 2, deleted(b"/s/bb", 9)), vec![]);
}

/// A broken watch may have missed a delete: every watch ends, and the
/// read comes after the backoff.
#[test]
fn a_broken_watch_cancels_the_others_and_reads_again_after_the_backoff() {
    let t0 = Instant::now();
    let mut e = waiting_on_two(t0);
    e.handle(
        t0,
        RpcReply {
            id: RpcId(P + 2),
            result: Err(RpcError::Unavailable("stream reset".into())),
        }
        .into(),
    );
    assert_eq!(drain(&mut e), vec![cancel(P + 1), cancel(P + 2)]);
    assert_eq!(e.poll_timeout(), Some(t0 + Duration::from_millis(100)));
    e.handle_timeout(t0 + Duration::from_millis(100));
    assert_eq!(drain(&mut e), vec![rpc(P + 3, older(2, 7))]);
}

/// Giving up while waiting cancels every watch, not only the first.
#[test]
fn a_canceled_wait_cancels_every_watch_and_withdraws() {
    let t0 = Instant::now();
    let mut e = waiting_on_two(t0);
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(1) });
    let withdraw = guarded_delete(&my_key(), 7);
    assert_eq!(
        drain(&mut e),
        vec![cancel(P + 1), rpc(P + 3, withdraw), cancel(P + 2)]
    );
}

/// Queue [a, b, me] with two permits, and the read says nothing else is
/// ahead: I am the first waiter. One watch of the whole prefix, and the
/// delete of either older key makes me hold with no read at all (a read
/// sorted by create revision makes etcd 3.4-3.6 read the whole queue).
#[test]
fn the_first_waiter_holds_on_the_delete_alone() {
    let t0 = Instant::now();
    let mut e = registered(t0, 2);
    campaign(&mut e, t0, 2);
    let b = kv(b"/s/bb", b"2", 4);
    let a = kv(b"/s/aa", b"2", 3);
    assert_eq!(
        ok(&mut e, t0, P, created(7, b"2", vec![b, a])),
        vec![rpc(P + 1, watch_all(8))]
    );
    // A newer waiter queues behind me: nothing changes.
    let newer = Response::WatchEvents {
        events: vec![WatchEvent {
            kind: EventKind::Put,
            kv: kv(b"/s/cc", b"2", 8),
            prev_kv: None,
        }],
    };
    assert_eq!(ok(&mut e, t0, P + 1, newer), vec![]);
    assert!(!e.is_leader());
    let until = e.session_deadline().unwrap();
    assert_eq!(
        ok(&mut e, t0, P + 1, deleted(b"/s/bb", 9)),
        vec![
            cancel(P + 1),
            elected_after(1, 7, until, true),
            rpc(P + 2, watch(&my_key(), 10))
        ]
    );
    assert!(e.is_leader());
}

/// The first waiter's prefix watch shows its own key deleted before an
/// older key goes: it never holds on the delete, it reads again.
#[test]
fn the_first_waiter_whose_key_changed_reads_again() {
    let t0 = Instant::now();
    let mut e = registered(t0, 2);
    campaign(&mut e, t0, 2);
    let b = kv(b"/s/bb", b"2", 4);
    let a = kv(b"/s/aa", b"2", 3);
    assert_eq!(
        ok(&mut e, t0, P, created(7, b"2", vec![b, a])),
        vec![rpc(P + 1, watch_all(8))]
    );
    let both = Response::WatchEvents {
        events: vec![
            delete_event(my_key(), 8),
            delete_event(b"/s/bb".to_vec(), 9),
        ],
    };
    assert_eq!(
        ok(&mut e, t0, P + 1, both),
        vec![cancel(P + 1), rpc(P + 2, older(2, 7))]
    );
    assert!(!e.is_leader());
}

#[test]
fn try_with_two_permits_holds_as_the_second_and_not_as_the_third() {
    let t0 = Instant::now();
    let mut e = registered(t0, 2);
    e.handle(
        t0,
        ElectionInput::TryCampaign {
            op: OpId(1),
            value: b"2".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![rpc(P, try_create_txn(2, b"2"))]);
    let a = kv(b"/s/aa", b"2", 3);
    let until = e.session_deadline().unwrap();
    assert_eq!(
        ok(
            &mut e,
            t0,
            P,
            try_created(7, vec![a.clone(), kv(&my_key(), b"2", 7)])
        ),
        vec![elected(1, 7, until), rpc(P + 1, watch(&my_key(), 8))]
    );

    // Third in line: not held, the key is withdrawn, the oldest reported.
    let mut e = registered(t0, 2);
    e.handle(
        t0,
        ElectionInput::TryCampaign {
            op: OpId(2),
            value: b"2".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![rpc(P, try_create_txn(2, b"2"))]);
    let b = kv(b"/s/bb", b"2", 4);
    let withdraw = guarded_delete(&my_key(), 7);
    assert_eq!(
        ok(&mut e, t0, P, try_created(7, vec![a.clone(), b])),
        vec![rpc(P + 1, withdraw)]
    );
    assert_eq!(
        ok(&mut e, t0, P + 1, txn(8, true, vec![])),
        vec![note(ElectionNotice::NotElected {
            op: OpId(2),
            leader: Some(a)
        })]
    );
    assert!(!e.is_leader());
}

/// Zero permits is not a panic: it counts as one, the election.
#[test]
fn zero_permits_count_as_one() {
    let t0 = Instant::now();
    let mut e = registered(t0, 0);
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(1),
            value: b"2".to_vec(),
        },
    );
    let commands = drain(&mut e);
    let Some(Command::Rpc {
        request: Request::Txn(t),
        ..
    }) = commands.first()
    else {
        panic!("{commands:?}")
    };
    // The election's create reads three keys (mine and two ahead).
    assert!(matches!(
        t.success.get(1),
        Some(TxnOp::Range(RangeRequest { limit: 3, .. }))
    ));
}

/// The session lost while waiting on two watches: the campaign starts over
/// on the next lease, and neither watch is left open.
#[test]
fn a_session_lost_while_waiting_cancels_every_watch() {
    let t0 = Instant::now();
    let mut e = waiting_on_two(t0);
    // No renewal is answered: the session's deadline (9 s) passes.
    let mut commands = Vec::new();
    let end = t0 + Duration::from_secs(10);
    while let Some(at) = e.poll_timeout().filter(|at| *at <= end) {
        e.handle_timeout(at);
        commands.extend(drain(&mut e));
    }
    assert!(!e.is_leader());
    assert!(commands.contains(&cancel(P + 1)), "{commands:?}");
    assert!(commands.contains(&cancel(P + 2)), "{commands:?}");
    assert!(
        commands.iter().any(|c| matches!(
            c,
            Command::Rpc {
                request: Request::Grant { .. },
                ..
            }
        )),
        "a new lease is asked for: {commands:?}"
    );
}

#[test]
fn a_semaphore_refuses_ranked_campaigns_and_sends_nothing() {
    let t0 = Instant::now();
    let mut e = registered(t0, 2);
    e.handle(
        t0,
        ElectionInput::CampaignRanked {
            op: OpId(1),
            value: b"2".to_vec(),
            rank: Rank {
                priority: 5,
                yield_to_higher: false,
            },
        },
    );
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::CampaignFailed {
            op: OpId(1),
            error: ElectionError::NotWithPermits,
        })]
    );
}
