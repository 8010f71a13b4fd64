//! Exact command sequences of the election protocol, driven by hand-written
//! replies.

use crate::election_support::*;
use crate::support::{delete_event, drain};
use fleetcoord_sm::election::*;
use fleetcoord_sm::keepalive::LivenessState;
use fleetcoord_sm::rpc::{
    Compare, EventKind, KeyRange, RangeRequest, Request, Response, RpcError, RpcId, SortOrder, Txn,
    TxnOp, TxnOpResponse, WatchEvent,
};
use fleetcoord_sm::*;
#[allow(unused_imports)]
use std::time::{Duration, Instant};

const PREFIX: &[u8] = b"/e/";

fn config() -> ElectionConfig {
    election_config(PREFIX, 1)
}

fn my_key() -> Vec<u8> {
    lease_key(PREFIX)
}

/// An election whose session holds lease `LEASE`, at `t0`.
fn registered(t0: Instant) -> Election {
    registered_with(config(), t0)
}

/// Create my key and, in the same revision, read the newest three keys (on
/// success: mine, the one ahead of me, and whether it is the only one) or my key and the first-created
/// key (when it already existed).
fn create_txn(value: &[u8]) -> Request {
    create_key(
        &my_key(),
        value,
        TxnOp::Range(RangeRequest {
            range: KeyRange::Prefix(b"/e/".to_vec()),
            sort: SortOrder::CreateDescending,
            limit: 3,
            max_create_revision: 0,
            revision: 0,
            keys_only: true,
        }),
        first_created(true),
    )
}

/// The answer to `create_txn` when it created my key at `revision`: the
/// newest keys, mine first, then those `ahead` of me, newest first.
fn created(revision: Revision, value: &[u8], ahead: Vec<KeyValue>) -> Response {
    created_as(kv(&my_key(), value, revision), ahead)
}

/// The answer to `create_txn` when my key already existed: it, and the
/// first-created key.
fn found(revision: Revision, mine: KeyValue, first: KeyValue) -> Response {
    txn(
        revision,
        false,
        vec![
            TxnOpResponse::Range { kvs: vec![mine] },
            TxnOpResponse::Range { kvs: vec![first] },
        ],
    )
}

/// The newest two keys created at or below `max_create_revision`, and my
/// key, in one revision.
fn older(max_create_revision: Revision) -> Request {
    Request::Txn(Txn {
        compare: vec![],
        success: vec![
            TxnOp::Range(RangeRequest {
                range: KeyRange::Prefix(b"/e/".to_vec()),
                sort: SortOrder::CreateDescending,
                limit: 2,
                max_create_revision,
                revision: 0,
                keys_only: true,
            }),
            TxnOp::Range(RangeRequest::all(KeyRange::Key(my_key()))),
        ],
        failure: vec![],
    })
}

/// The answer to `older`: what is ahead of me, and my key, at `revision`.
fn older_found(revision: Revision, ahead: Vec<KeyValue>, mine: Vec<KeyValue>) -> Response {
    txn(
        revision,
        true,
        vec![
            TxnOpResponse::Range { kvs: ahead },
            TxnOpResponse::Range { kvs: mine },
        ],
    )
}

/// The watch of the candidate second in line: every key of the election.
fn watch_all(start_revision: Revision) -> Request {
    Request::Watch {
        range: KeyRange::Prefix(b"/e/".to_vec()),
        start_revision,
    }
}

/// The first-created key; `keys_only` unless its value is reported (a
/// try-campaign names the leader with its value).
fn first_created(keys_only: bool) -> TxnOp {
    TxnOp::Range(RangeRequest {
        range: KeyRange::Prefix(b"/e/".to_vec()),
        sort: SortOrder::CreateAscending,
        limit: 1,
        max_create_revision: 0,
        revision: 0,
        keys_only,
    })
}

fn delete_mine(rev: Revision) -> Request {
    guarded_delete(&my_key(), rev)
}

/// A write of `value` to my key, guarded by its create revision `rev`: a
/// proclaim, or the fix of a stale value.
fn put_mine(rev: Revision, value: &[u8]) -> Request {
    Request::Txn(Txn {
        compare: vec![Compare::CreateRevisionEquals {
            key: my_key(),
            revision: rev,
        }],
        success: vec![TxnOp::Put {
            key: my_key(),
            value: value.to_vec(),
            lease: LEASE,
        }],
        failure: vec![],
    })
}

/// Campaign (operation 1, value "a") at `t0`; what the election queued.
fn campaign(e: &mut Election, t0: Instant) -> Vec<Command<ElectionNotice>> {
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(1),
            value: b"a".to_vec(),
        },
    );
    drain(e)
}

/// The id of `c` if it is a renewal of the session (a keep-alive).
fn renewal_id(c: &Command<ElectionNotice>) -> Option<u64> {
    match c {
        Command::Rpc {
            id,
            request: Request::KeepAlive { .. },
        } => Some(id.0),
        _ => None,
    }
}

/// Answers renewal `id` at `at` (TTL 9 s); what the election queued.
fn answer_renewal(e: &mut Election, at: Instant, id: u64) -> Vec<Command<ElectionNotice>> {
    ok(e, at, id, Response::KeptAlive { ttl_secs: 9 })
}

/// Campaign with no other candidate, ending as leader with token 5.
fn elected(t0: Instant) -> Election {
    let mut e = registered(t0);
    assert_eq!(campaign(&mut e, t0), vec![rpc(P, create_txn(b"a"))]);
    assert!(!e.is_leader(), "not before etcd answered");
    // One answer: my key created at 5 and nothing older at that revision.
    let until = e.session_deadline().expect("a lease");
    assert_eq!(
        ok(&mut e, t0, P, created(5, b"a", vec![])),
        vec![
            note(ElectionNotice::Elected {
                op: OpId(1),
                key: my_key(),
                token: 5,
                lease: LEASE,
                waited: false,
                attempts: 1,
                trusted_until: until
            }),
            rpc(P + 1, watch(&my_key(), 6)),
        ]
    );
    assert!(e.is_leader());
    assert_eq!(e.token(), Some(5));
    e
}

#[test]
fn keys_are_the_prefix_plus_lowercase_hex_lease() {
    let t0 = Instant::now();
    let e = registered(t0);
    assert_eq!(e.my_key(), Some(b"/e/2a1f".to_vec()));
}

#[test]
fn campaign_without_contenders_is_elected_by_the_create_answer_alone() {
    let t0 = Instant::now();
    let e = elected(t0);
    assert_eq!(e.session_deadline(), Some(t0 + Duration::from_secs(9)));
    assert_eq!(
        e.fence(),
        Some(Compare::CreateRevisionEquals {
            key: my_key(),
            revision: 5
        })
    );
}

fn deleted(key: &[u8], revision: Revision) -> WatchEvent {
    delete_event(key.to_vec(), revision)
}

fn events(events: Vec<WatchEvent>) -> Response {
    Response::WatchEvents { events }
}

#[test]
fn campaign_waits_for_the_newest_older_key_to_be_deleted() {
    let t0 = Instant::now();
    let mut e = registered(t0);
    assert_eq!(campaign(&mut e, t0), vec![rpc(P, create_txn(b"a"))]);
    // The create's own answer names the key just ahead of mine, and that
    // another is ahead of it: watch only the one just ahead (no herd).
    let other = kv(b"/e/99", b"b", 4);
    let oldest = kv(b"/e/77", b"c", 3);
    assert_eq!(
        ok(
            &mut e,
            t0,
            P,
            created(7, b"a", vec![other.clone(), oldest.clone()])
        ),
        vec![rpc(P + 1, watch(b"/e/99", 8))]
    );
    assert_eq!(ok(&mut e, t0, P + 1, events(vec![])), vec![]);
    let put = WatchEvent {
        kind: EventKind::Put,
        kv: other.clone(),
        prev_kv: None,
    };
    assert_eq!(ok(&mut e, t0, P + 1, events(vec![put])), vec![]);
    assert_eq!(
        ok(&mut e, t0, P + 1, events(vec![deleted(b"/e/99", 9)])),
        vec![cancel(P + 1), rpc(P + 2, older(6))]
    );
    assert!(!e.is_leader());
    // The oldest is still there, and now the only key ahead of mine: wait
    // for it on a watch of the whole election.
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 2,
            older_found(9, vec![oldest], vec![kv(&my_key(), b"a", 7)])
        ),
        vec![rpc(P + 3, watch_all(10))]
    );
    // Others joining, and the leader proclaiming, change nothing.
    let joined = WatchEvent {
        kind: EventKind::Put,
        kv: kv(b"/e/aa", b"d", 10),
        prev_kv: None,
    };
    let proclaimed = WatchEvent {
        kind: EventKind::Put,
        kv: KeyValue {
            mod_revision: 11,
            ..kv(b"/e/77", b"c2", 3)
        },
        prev_kv: None,
    };
    assert_eq!(
        ok(&mut e, t0, P + 3, events(vec![joined, proclaimed])),
        vec![]
    );
    assert!(!e.is_leader());
    // Its delete arrives with every event before it, none of them about my
    // key: at that revision my key is the one read at 9 and nothing is
    // older, so I lead with no further read.
    let until = e.session_deadline().expect("a lease");
    assert_eq!(
        ok(&mut e, t0, P + 3, events(vec![deleted(b"/e/77", 12)])),
        vec![
            cancel(P + 3),
            note(ElectionNotice::Elected {
                op: OpId(1),
                key: my_key(),
                token: 7,
                lease: LEASE,
                waited: true,
                attempts: 1,
                trusted_until: until
            }),
            rpc(P + 4, watch(&my_key(), 13)),
        ]
    );
    assert!(e.is_leader());
}

#[test]
fn the_candidate_second_in_line_reads_again_when_its_own_key_changes() {
    let t0 = Instant::now();
    let mut e = campaigning(t0, false);
    let leader = kv(b"/e/99", b"b", 4);
    assert_eq!(
        ok(&mut e, t0, P, created(7, b"a", vec![leader.clone()])),
        vec![rpc(P + 1, watch_all(8))]
    );
    // My key was deleted (by someone else) before the leader's delete, in
    // the same answer: read again instead of leading.
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 1,
            events(vec![deleted(&my_key(), 9), deleted(b"/e/99", 10)])
        ),
        vec![cancel(P + 1), rpc(P + 2, older(6))]
    );
    // The read shows it gone: queue up again.
    assert_eq!(
        ok(&mut e, t0, P + 2, older_found(10, vec![], vec![])),
        vec![rpc(P + 3, create_txn(b"a"))]
    );
    // Second in line again, behind a key read at 11; a delete claiming a
    // revision before the watch started is not trusted: read instead.
    assert_eq!(
        ok(&mut e, t0, P + 3, created(11, b"a", vec![leader.clone()])),
        vec![rpc(P + 4, watch_all(12))]
    );
    assert_eq!(
        ok(&mut e, t0, P + 4, events(vec![deleted(b"/e/99", 0)])),
        vec![cancel(P + 4), rpc(P + 5, older(10))]
    );
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 5,
            older_found(13, vec![leader], vec![kv(&my_key(), b"a", 11)])
        ),
        vec![rpc(P + 6, watch_all(14))]
    );
    // My key recreated by someone else (a new create revision) counts as
    // changed even without a delete in sight.
    let recreated = WatchEvent {
        kind: EventKind::Put,
        kv: kv(&my_key(), b"x", 15),
        prev_kv: None,
    };
    assert_eq!(
        ok(&mut e, t0, P + 6, events(vec![recreated])),
        vec![cancel(P + 6), rpc(P + 7, older(10))]
    );
    assert!(!e.is_leader());
}

#[test]
fn campaign_never_claims_a_key_that_vanished_while_waiting() {
    let t0 = Instant::now();
    let mut e = campaigning(t0, false);
    let oldest = kv(b"/e/77", b"c", 3);
    ok(
        &mut e,
        t0,
        P,
        created(7, b"a", vec![kv(b"/e/99", b"b", 4), oldest.clone()]),
    );
    assert_eq!(
        ok(&mut e, t0, P + 1, events(vec![deleted(b"/e/99", 9)])),
        vec![cancel(P + 1), rpc(P + 2, older(6))]
    );
    // My key is gone in the answer's revision (an older one remains, which
    // no longer matters): queue up again instead of leading or waiting.
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 2,
            older_found(9, vec![oldest.clone()], vec![])
        ),
        vec![rpc(P + 3, create_txn(b"a"))]
    );
    assert!(!e.is_leader());
    // Likewise when a key of my name exists but is not the one I created.
    ok(
        &mut e,
        t0,
        P + 3,
        created(10, b"a", vec![kv(b"/e/99", b"b", 8), oldest]),
    );
    ok(&mut e, t0, P + 4, events(vec![deleted(b"/e/99", 11)]));
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 5,
            older_found(12, vec![], vec![kv(&my_key(), b"a", 12)])
        ),
        vec![rpc(P + 6, create_txn(b"a"))]
    );
    assert!(!e.is_leader());
}

#[test]
fn campaign_with_an_existing_key_of_another_value_proclaims_it_first() {
    let t0 = Instant::now();
    let mut e = registered(t0);
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(1),
            value: b"new".to_vec(),
        },
    );
    drain(&mut e);
    let fix = put_mine(3, b"new");
    // Even when first in line, the value is fixed before anyone may see it
    // as the leader's.
    let mine = kv(&my_key(), b"old", 3);
    assert_eq!(
        ok(&mut e, t0, P, found(8, mine.clone(), mine)),
        vec![rpc(P + 1, fix)]
    );
    assert_eq!(
        ok(&mut e, t0, P + 1, txn(9, true, vec![TxnOpResponse::Put])),
        vec![rpc(P + 2, older(2))]
    );
}

#[test]
fn a_retried_create_that_finds_its_key_first_in_line_leads_at_once() {
    let t0 = Instant::now();
    let mut e = campaigning(t0, false);
    // The first create's answer was lost; its key is there, created at 3,
    // and is the first-created key of the election in the same revision.
    let mine = kv(&my_key(), b"a", 3);
    let until = e.session_deadline().expect("a lease");
    assert_eq!(
        ok(&mut e, t0, P, found(8, mine.clone(), mine)),
        vec![
            note(ElectionNotice::Elected {
                op: OpId(1),
                key: my_key(),
                token: 3,
                lease: LEASE,
                waited: false,
                attempts: 1,
                trusted_until: until
            }),
            rpc(P + 1, watch(&my_key(), 9)),
        ]
    );
}

#[test]
fn a_retried_create_behind_another_key_looks_for_the_one_just_ahead() {
    let t0 = Instant::now();
    let mut e = campaigning(t0, false);
    // The first-created key is not mine; the one just ahead of mine may be
    // another, so read it rather than watching the first.
    assert_eq!(
        ok(
            &mut e,
            t0,
            P,
            found(8, kv(&my_key(), b"a", 5), kv(b"/e/11", b"x", 2))
        ),
        vec![rpc(P + 1, older(4))]
    );
}

#[test]
fn session_loss_while_waiting_starts_the_campaign_over_on_the_next_lease() {
    let t0 = Instant::now();
    let mut e = campaigning(t0, false);
    ok(&mut e, t0, P, created(7, b"a", vec![kv(b"/e/99", b"b", 4)]));
    // No renewal is ever answered: at the local deadline the session is lost.
    let deadline = t0 + Duration::from_secs(9);
    let mut all = Vec::new();
    while let Some(at) = e.poll_timeout() {
        if at > deadline {
            break;
        }
        e.handle_timeout(at);
        all.extend(drain(&mut e));
    }
    let lost = all.iter().position(|c| {
        *c == note(ElectionNotice::Session(LivenessState::Lost {
            lease: LEASE,
        }))
    });
    let lost = lost.expect("session lost at the deadline");
    // The watch on the key ahead ends; the campaign is not answered: it
    // waits for the session's next lease (being granted now).
    assert_eq!(all[lost + 1], cancel(P + 1));
    let rest = &all[lost + 2..];
    assert!(
        rest.iter()
            .all(|c| !matches!(c, Command::Notify(ElectionNotice::CampaignFailed { .. }))),
        "{rest:?}"
    );
    let grant = rest
        .iter()
        .find_map(|c| match c {
            Command::Rpc {
                id,
                request: Request::Grant { .. },
            } => Some(*id),
            _ => None,
        })
        .expect("a new lease is granted");
    // A late delete and a late verification change nothing.
    let late = WatchEvent {
        kind: EventKind::Delete,
        kv: kv(b"/e/99", b"", 0),
        prev_kv: None,
    };
    let after = ok(
        &mut e,
        deadline,
        P + 1,
        Response::WatchEvents { events: vec![late] },
    );
    assert!(
        after.iter().all(|c| !matches!(
            c,
            Command::Notify(ElectionNotice::Elected { .. }) | Command::Rpc { .. }
        )),
        "{after:?}"
    );
    assert!(!e.is_leader());
    // The next lease: the campaign joins the queue again with a key on it.
    const NEXT: i64 = 0x2b00;
    let joined = answer_grant(&mut e, deadline, grant.0, NEXT);
    assert_eq!(
        joined[0],
        note(ElectionNotice::Session(LivenessState::Registered {
            lease: NEXT
        }))
    );
    let create = joined
        .iter()
        .find_map(|c| match c {
            Command::Rpc {
                request: Request::Txn(t),
                ..
            } => Some(t.clone()),
            _ => None,
        })
        .expect("the campaign creates its key on the new lease");
    assert_eq!(
        create.compare,
        vec![Compare::CreateRevisionEquals {
            key: b"/e/2b00".to_vec(),
            revision: 0
        }]
    );
    assert!(!e.is_leader());
    // It wins there on its second attempt, and says so.
    let id = joined
        .iter()
        .find_map(|c| match c {
            Command::Rpc {
                id,
                request: Request::Txn(_),
            } => Some(id.0),
            _ => None,
        })
        .expect("the create's id");
    let mine = KeyValue {
        lease: NEXT,
        ..kv(b"/e/2b00", b"a", 9)
    };
    let won = ok(&mut e, deadline, id, created_as(mine, vec![]));
    let attempts = won.iter().find_map(|c| match c {
        Command::Notify(ElectionNotice::Elected { attempts, .. }) => Some(*attempts),
        _ => None,
    });
    assert_eq!(attempts, Some(2), "{won:?}");
}

#[test]
fn a_campaign_refused_for_its_lease_renews_the_session_and_goes_on() {
    let t0 = Instant::now();
    let mut e = registered(t0);
    assert_eq!(campaign(&mut e, t0), vec![rpc(P, create_txn(b"a"))]);
    // etcd expired the lease before the session noticed.
    e.handle(
        t0,
        RpcReply {
            id: RpcId(P),
            result: Err(RpcError::LeaseNotFound),
        }
        .into(),
    );
    // The session is lost at once (its renewal, due at 3 s, is not waited
    // for); the campaign is not answered.
    assert_eq!(
        drain(&mut e),
        vec![
            note(ElectionNotice::Session(LivenessState::Lost {
                lease: LEASE
            })),
            note(ElectionNotice::Session(LivenessState::Registering)),
        ]
    );
    // A lease that never renewed counts as a failed registration: the
    // next grant waits for the backoff (100 ms here).
    assert_eq!(e.poll_timeout(), Some(t0 + Duration::from_millis(100)));
    e.handle_timeout(t0 + Duration::from_millis(100));
    assert_eq!(drain(&mut e), vec![rpc(1, Request::Grant { ttl_secs: 9 })]);
    const NEXT: i64 = 0x2b00;
    let t1 = t0 + Duration::from_millis(100);
    let joined = answer_grant(&mut e, t1, 1, NEXT);
    assert_eq!(
        joined[0],
        note(ElectionNotice::Session(LivenessState::Registered {
            lease: NEXT
        }))
    );
    assert!(
        matches!(&joined[1], Command::Rpc { id: RpcId(id), request: Request::Txn(t) }
        if *id == P + 1 && t.compare == vec![Compare::CreateRevisionEquals {
            key: b"/e/2b00".to_vec(),
            revision: 0,
        }]),
        "{joined:?}"
    );
    // A second LeaseNotFound for the old lease (a late copy) changes nothing.
    e.handle(
        t1,
        RpcReply {
            id: RpcId(P),
            result: Err(RpcError::LeaseNotFound),
        }
        .into(),
    );
    assert_eq!(drain(&mut e), vec![]);
}

/// `registered`, with `attempt` as the attempt timeout.
fn registered_with_attempt(t0: Instant, attempt: Duration) -> Election {
    let mut e = Election::new(
        ElectionConfig {
            attempt_timeout: attempt,
            ..config()
        },
        t0,
        7,
    );
    drain(&mut e);
    answer_grant(&mut e, t0, 0, LEASE);
    e
}

#[test]
fn an_unanswered_request_is_sent_again_after_each_attempt_timeout_then_less_often() {
    let t0 = Instant::now();
    let attempt = Duration::from_millis(500);
    let mut e = registered_with_attempt(t0, attempt);
    assert_eq!(campaign(&mut e, t0), vec![rpc(P, create_txn(b"a"))]);
    // The first three copies are given up after one attempt timeout each,
    // the fourth after two (then four, ...): a slow etcd still answers one.
    // (The session's renewals are due at 3 s and 6 s; they are answered.)
    let mut at = t0;
    for (n, wait) in [500u64, 500, 500, 1000, 2000].into_iter().enumerate() {
        at += Duration::from_millis(wait);
        let id = P + n as u64;
        while e.poll_timeout().is_some_and(|t| t < at) {
            // A renewal of the session: answer it.
            let t = e.poll_timeout().unwrap_or(at);
            e.handle_timeout(t);
            for id in drain(&mut e).iter().filter_map(renewal_id) {
                answer_renewal(&mut e, t, id);
            }
        }
        assert_eq!(e.poll_timeout(), Some(at), "copy {n}");
        e.handle_timeout(at);
        assert_eq!(
            drain(&mut e),
            vec![cancel(id), rpc(id + 1, create_txn(b"a"))]
        );
    }
    // The sixth copy is answered: the wait is one attempt timeout again
    // for the next request (FindOlder: someone is ahead at creation).
    let answered = ok(
        &mut e,
        at,
        P + 5,
        found(7, kv(&my_key(), b"a", 6), kv(b"/e/99", b"b", 4)),
    );
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(e.poll_timeout(), Some(at + attempt));
}

/// A create given up unanswered may still land after the campaign it
/// served is over (a held-up copy, landing after the resign's delete), and
/// make the key again on a session that lives on with no campaign, at the
/// head of the queue. Found by the model check
/// (sm/tests/model/election.rs,
/// `a_create_landing_after_a_resign_does_not_block_the_queue`): once
/// nothing runs on the lease, the session gives it up, so etcd refuses
/// that create (its lease is revoked).
#[test]
fn a_lease_with_a_create_in_doubt_is_given_up_once_nothing_runs_on_it() {
    let t0 = Instant::now();
    let attempt = Duration::from_millis(500);
    let mut e = registered_with_attempt(t0, attempt);
    assert_eq!(campaign(&mut e, t0), vec![rpc(P, create_txn(b"a"))]);
    let t1 = t0 + attempt;
    e.handle_timeout(t1);
    assert_eq!(drain(&mut e), vec![cancel(P), rpc(P + 1, create_txn(b"a"))]);
    // The copy wins; the first copy is somewhere still.
    let elected = ok(&mut e, t1, P + 1, created(7, b"a", vec![]));
    assert!(e.is_leader(), "{elected:?}");
    e.handle(t1, ElectionInput::Resign { token: 7 });
    assert_eq!(
        drain(&mut e),
        vec![cancel(P + 2), rpc(P + 3, guarded_delete(&my_key(), 7))]
    );
    // Resigned; then the lease is given up: revoked (not waited for) and a
    // new one granted.
    assert_eq!(
        ok(&mut e, t1, P + 3, txn(8, true, vec![])),
        vec![
            note(ElectionNotice::Resigned { token: 7 }),
            rpc(1, Request::Revoke { lease: LEASE }),
            note(ElectionNotice::Session(LivenessState::Lost {
                lease: LEASE
            })),
            note(ElectionNotice::Session(LivenessState::Registering)),
            rpc(2, Request::Grant { ttl_secs: 9 }),
        ]
    );
}

/// Without a create in doubt, a resign keeps the session's lease: the
/// give-up of the test above is paid only when a create may still land.
#[test]
fn a_resign_without_a_create_in_doubt_keeps_the_lease() {
    let t0 = Instant::now();
    let mut e = registered_with_attempt(t0, Duration::from_millis(500));
    campaign(&mut e, t0);
    let elected = ok(&mut e, t0, P, created(7, b"a", vec![]));
    assert!(e.is_leader(), "{elected:?}");
    e.handle(t0, ElectionInput::Resign { token: 7 });
    assert_eq!(
        drain(&mut e),
        vec![cancel(P + 1), rpc(P + 2, guarded_delete(&my_key(), 7))]
    );
    assert_eq!(
        ok(&mut e, t0, P + 2, txn(8, true, vec![])),
        vec![note(ElectionNotice::Resigned { token: 7 })]
    );
}

#[test]
fn a_lost_resign_is_sent_again_and_a_watch_is_never() {
    let t0 = Instant::now();
    let attempt = Duration::from_millis(500);
    let mut e = registered_with_attempt(t0, attempt);
    campaign(&mut e, t0);
    // Someone is ahead: the campaign watches, and a watch waits for events
    // however long they take.
    ok(&mut e, t0, P, created(7, b"a", vec![kv(b"/e/99", b"b", 4)]));
    let watching = e.poll_timeout();
    assert!(
        watching.is_none_or(|at| at > t0 + Duration::from_secs(2)),
        "{watching:?}"
    );
    // The one ahead leaves; I lead, and resign.
    let elected = ok(&mut e, t0, P + 1, events(vec![deleted(b"/e/99", 8)]));
    assert!(e.is_leader(), "{elected:?}");
    e.handle(t0, ElectionInput::Resign { token: 7 });
    let resign = drain(&mut e);
    let delete = resign
        .iter()
        .find_map(|c| match c {
            Command::Rpc {
                id,
                request: request @ Request::Txn(_),
            } => Some((*id, request.clone())),
            _ => None,
        })
        .expect("a guarded delete");
    // etcd never answers it (lost in a raft leader change): the same
    // delete again after one attempt timeout, then `Resigned`.
    e.handle_timeout(t0 + attempt);
    assert_eq!(
        drain(&mut e),
        vec![
            Command::Cancel { id: delete.0 },
            rpc(delete.0 .0 + 1, delete.1.clone())
        ]
    );
    let done = ok(&mut e, t0 + attempt, delete.0 .0 + 1, txn(9, true, vec![]));
    assert_eq!(done, vec![note(ElectionNotice::Resigned { token: 7 })]);
}

#[test]
fn leader_stops_believing_at_the_local_deadline() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    let deadline = t0 + Duration::from_secs(9);
    let mut seen = Vec::new();
    while let Some(at) = e.poll_timeout() {
        if at > deadline {
            break;
        }
        assert!(e.is_leader(), "still leader before {at:?}");
        e.handle_timeout(at);
        seen.extend(drain(&mut e));
    }
    assert!(!e.is_leader());
    assert!(
        seen.contains(&note(ElectionNotice::LeadershipLost { token: 5 })),
        "{seen:?}"
    );
}

/// Runs `e` to its next renewal and answers it (TTL 9 s): the instant,
/// and the commands the answer produced.
fn answer_next_renewal(e: &mut Election) -> (Instant, Vec<Command<ElectionNotice>>) {
    let at = e.poll_timeout().expect("a renewal timer");
    e.handle_timeout(at);
    let renewal = drain(e);
    let Some(id) = renewal.last().and_then(renewal_id) else {
        panic!("no renewal: {renewal:?}");
    };
    (at, answer_renewal(e, at, id))
}

/// Belief is bounded by the caller's clock: `Elected` carries the
/// session's local deadline, and each answered renewal while leading moves
/// it with one `Trusted`, right after the renewal's answer; a renewal of
/// the same lease while not leading tells nothing.
#[test]
fn an_answered_renewal_while_leading_moves_the_trusted_deadline() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    let first = e.session_deadline().expect("a lease");
    let (at, answered) = answer_next_renewal(&mut e);
    let until = e.session_deadline().expect("a lease");
    assert!(until > first, "{until:?} after {first:?}");
    assert_eq!(
        answered,
        vec![note(ElectionNotice::Trusted { token: 5, until })]
    );

    e.handle(at, ElectionInput::Resign { token: 5 });
    let resign = drain(&mut e);
    assert!(
        !resign
            .iter()
            .any(|c| matches!(c, Command::Notify(ElectionNotice::Trusted { .. }))),
        "{resign:?}"
    );
}

/// A renewal answered TTL 0 (etcd no longer has the lease, as when it
/// revoked it early) is evidence the key is gone: leadership ends in the
/// same step, right behind the session's loss, whatever time the local
/// deadline still allowed.
#[test]
fn a_renewal_answered_ttl_zero_ends_leadership_in_the_same_step() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    let at = e.poll_timeout().expect("a renewal timer");
    e.handle_timeout(at);
    let renewal = drain(&mut e);
    let Some(id) = renewal.last().and_then(renewal_id) else {
        panic!("no renewal: {renewal:?}");
    };
    assert!(
        e.session_deadline().is_some_and(|d| d > at),
        "still trusted"
    );
    let answered = ok(&mut e, at, id, Response::KeptAlive { ttl_secs: 0 });
    assert!(!e.is_leader());
    assert_eq!(
        answered[..3],
        [
            note(ElectionNotice::Session(LivenessState::Lost {
                lease: LEASE
            })),
            cancel(P + 1),
            note(ElectionNotice::LeadershipLost { token: 5 }),
        ]
    );
}

/// With `announce_session_trust`, every move of the session's deadline is
/// told, leading or not: the grant's, then each answered renewal's.
#[test]
fn session_trust_is_told_waiting_and_leading() {
    let t0 = Instant::now();
    let config = ElectionConfig {
        announce_session_trust: true,
        ..config()
    };
    let mut e = Election::new(config, t0, 7);
    let _ = drain(&mut e);
    let granted = answer_grant(&mut e, t0, 0, LEASE);
    let first = e.session_deadline().expect("a lease");
    assert_eq!(
        granted,
        vec![
            note(ElectionNotice::Session(LivenessState::Registered {
                lease: LEASE
            })),
            note(ElectionNotice::SessionTrusted {
                lease: LEASE,
                until: first
            }),
        ]
    );
    // Not campaigning: a renewal's answer still tells the new deadline.
    let (_, answered) = answer_next_renewal(&mut e);
    let until = e.session_deadline().expect("a lease");
    assert!(until > first, "{until:?} after {first:?}");
    assert_eq!(
        answered,
        vec![note(ElectionNotice::SessionTrusted {
            lease: LEASE,
            until
        })]
    );
}

#[test]
fn try_campaign_wins_when_first_in_line() {
    let t0 = Instant::now();
    let mut e = registered(t0);
    e.handle(
        t0,
        ElectionInput::TryCampaign {
            op: OpId(1),
            value: b"a".to_vec(),
        },
    );
    let expected = Request::Txn(Txn {
        compare: vec![Compare::CreateRevisionEquals {
            key: my_key(),
            revision: 0,
        }],
        success: vec![
            TxnOp::Put {
                key: my_key(),
                value: b"a".to_vec(),
                lease: LEASE,
            },
            first_created(false),
        ],
        failure: vec![
            TxnOp::Range(RangeRequest::all(KeyRange::Key(my_key()))),
            first_created(false),
        ],
    });
    assert_eq!(drain(&mut e), vec![rpc(P, expected)]);
    let first = TxnOpResponse::Range {
        kvs: vec![kv(&my_key(), b"a", 12)],
    };
    let until = e.session_deadline().expect("a lease");
    assert_eq!(
        ok(
            &mut e,
            t0,
            P,
            txn(12, true, vec![TxnOpResponse::Put, first])
        ),
        vec![
            note(ElectionNotice::Elected {
                op: OpId(1),
                key: my_key(),
                token: 12,
                lease: LEASE,
                waited: false,
                attempts: 1,
                trusted_until: until
            }),
            rpc(P + 1, watch(&my_key(), 13)),
        ]
    );
    assert!(e.is_leader());
}

#[test]
fn try_campaign_loses_deletes_its_key_and_names_the_leader() {
    let t0 = Instant::now();
    let mut e = registered(t0);
    e.handle(
        t0,
        ElectionInput::TryCampaign {
            op: OpId(1),
            value: b"a".to_vec(),
        },
    );
    drain(&mut e);
    let leader = kv(b"/e/1", b"boss", 3);
    let first = TxnOpResponse::Range {
        kvs: vec![leader.clone()],
    };
    assert_eq!(
        ok(
            &mut e,
            t0,
            P,
            txn(12, true, vec![TxnOpResponse::Put, first])
        ),
        vec![rpc(P + 1, delete_mine(12))]
    );
    assert!(!e.is_leader());
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 1,
            txn(13, true, vec![TxnOpResponse::Delete { deleted: 1 }])
        ),
        vec![note(ElectionNotice::NotElected {
            op: OpId(1),
            leader: Some(leader)
        })]
    );
}

#[test]
fn resign_drops_belief_before_sending_and_keeps_the_session() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(t0, ElectionInput::Resign { token: 5 });
    assert!(!e.is_leader());
    assert_eq!(
        drain(&mut e),
        vec![cancel(P + 1), rpc(P + 2, delete_mine(5))]
    );
    // A failed guard means nothing was left to delete: resigned all the same.
    assert_eq!(
        ok(&mut e, t0, P + 2, txn(9, false, vec![])),
        vec![note(ElectionNotice::Resigned { token: 5 })]
    );
    assert_eq!(e.my_key(), Some(my_key()));
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(2),
            value: b"b".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![rpc(P + 3, create_txn(b"b"))]);
}

#[test]
fn a_stale_resign_is_answered_and_ends_nothing() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    // Token 4 belonged to an earlier leadership of this machine.
    e.handle(t0, ElectionInput::Resign { token: 4 });
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::Resigned { token: 4 })]
    );
    assert!(e.is_leader());
    assert_eq!(e.token(), Some(5));
}

#[test]
fn a_resign_does_not_cancel_a_running_campaign() {
    let t0 = Instant::now();
    let mut e = registered(t0);
    assert_eq!(campaign(&mut e, t0), vec![rpc(P, create_txn(b"a"))]);
    // A dropped handle of an earlier leadership resigns its token late.
    e.handle(t0, ElectionInput::Resign { token: 3 });
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::Resigned { token: 3 })]
    );
    assert_eq!(
        ok(&mut e, t0, P, created(5, b"a", vec![kv(b"/e/99", b"b", 4)])),
        vec![rpc(P + 1, watch_all(6))]
    );
}

#[test]
fn a_campaign_during_a_resign_starts_once_the_key_is_gone() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(t0, ElectionInput::Resign { token: 5 });
    assert_eq!(
        drain(&mut e),
        vec![cancel(P + 1), rpc(P + 2, delete_mine(5))]
    );
    // Not Busy: it waits for the delete.
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(2),
            value: b"b".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![]);
    assert_eq!(
        ok(&mut e, t0, P + 2, txn(9, true, vec![])),
        vec![
            note(ElectionNotice::Resigned { token: 5 }),
            rpc(P + 3, create_txn(b"b"))
        ]
    );
}

#[test]
fn a_campaign_waiting_for_a_resign_can_be_canceled_or_stopped() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(t0, ElectionInput::Resign { token: 5 });
    drain(&mut e);
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(2),
            value: b"b".to_vec(),
        },
    );
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(2) });
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::CampaignFailed {
            op: OpId(2),
            error: ElectionError::Canceled
        })]
    );
    // Nothing starts after the delete.
    assert_eq!(
        ok(&mut e, t0, P + 2, txn(9, true, vec![])),
        vec![note(ElectionNotice::Resigned { token: 5 })]
    );

    let mut e = elected(t0);
    e.handle(t0, ElectionInput::Resign { token: 5 });
    drain(&mut e);
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(2),
            value: b"b".to_vec(),
        },
    );
    e.handle(t0, ElectionInput::Stop);
    let notices: Vec<_> = drain(&mut e)
        .into_iter()
        .filter_map(|c| match c {
            Command::Notify(n) => Some(n),
            _ => None,
        })
        .filter(|n| !matches!(n, ElectionNotice::Session(_)))
        .collect();
    assert_eq!(
        notices,
        vec![
            ElectionNotice::Resigned { token: 5 },
            ElectionNotice::CampaignFailed {
                op: OpId(2),
                error: ElectionError::Stopped
            }
        ]
    );
}

#[test]
fn resign_retries_after_an_unavailable_error() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(t0, ElectionInput::Resign { token: 5 });
    drain(&mut e);
    e.handle(
        t0,
        RpcReply {
            id: RpcId(P + 2),
            result: Err(RpcError::Unavailable("x".into())),
        }
        .into(),
    );
    assert_eq!(drain(&mut e), vec![]);
    let retry = t0 + Duration::from_millis(100);
    assert_eq!(e.poll_timeout(), Some(retry));
    e.handle_timeout(retry);
    assert_eq!(drain(&mut e), vec![rpc(P + 3, delete_mine(5))]);
}

#[test]
fn proclaim_is_guarded_by_the_token() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(
        t0,
        ElectionInput::Proclaim {
            op: OpId(2),
            value: b"v2".to_vec(),
        },
    );
    let put = Request::Txn(Txn {
        compare: vec![Compare::CreateRevisionEquals {
            key: my_key(),
            revision: 5,
        }],
        success: vec![TxnOp::Put {
            key: my_key(),
            value: b"v2".to_vec(),
            lease: LEASE,
        }],
        failure: vec![],
    });
    assert_eq!(drain(&mut e), vec![rpc(P + 2, put.clone())]);
    assert_eq!(
        ok(&mut e, t0, P + 2, txn(8, true, vec![TxnOpResponse::Put])),
        vec![note(ElectionNotice::Proclaimed { op: OpId(2) })]
    );
    assert!(e.is_leader());
    e.handle(
        t0,
        ElectionInput::Proclaim {
            op: OpId(3),
            value: b"v2".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![rpc(P + 3, put)]);
    assert_eq!(
        ok(&mut e, t0, P + 3, txn(9, false, vec![])),
        vec![
            note(ElectionNotice::ProclaimFailed {
                op: OpId(3),
                error: ElectionError::NotLeader
            }),
            cancel(P + 1),
            note(ElectionNotice::LeadershipLost { token: 5 }),
        ]
    );
    assert!(!e.is_leader());
}

#[test]
fn proclaim_when_not_leader_fails_at_once() {
    let t0 = Instant::now();
    let mut e = registered(t0);
    e.handle(
        t0,
        ElectionInput::Proclaim {
            op: OpId(1),
            value: b"v".to_vec(),
        },
    );
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::ProclaimFailed {
            op: OpId(1),
            error: ElectionError::NotLeader
        })]
    );
}

#[test]
fn deletion_of_the_own_key_ends_leadership() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    let gone = WatchEvent {
        kind: EventKind::Delete,
        kv: kv(&my_key(), b"", 0),
        prev_kv: None,
    };
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 1,
            Response::WatchEvents { events: vec![gone] }
        ),
        vec![
            cancel(P + 1),
            note(ElectionNotice::LeadershipLost { token: 5 })
        ]
    );
    assert!(!e.is_leader());
}

/// etcd refusing a write fenced on the own key is evidence the key is
/// gone, and may come before the watch shows the delete (a watch served by
/// a member still catching up): the leadership ends on it at once, and the
/// watch is canceled as for a delete it had seen. Evidence about another
/// token ends nothing and is not answered.
#[test]
fn a_refused_fenced_write_ends_leadership_before_the_watch_shows_it() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(t0, ElectionInput::FenceRefused { token: 4 });
    assert_eq!(drain(&mut e), vec![]);
    assert!(e.is_leader(), "a stale handle's refusal ends nothing");
    e.handle(t0, ElectionInput::FenceRefused { token: 5 });
    assert_eq!(
        drain(&mut e),
        vec![
            cancel(P + 1),
            note(ElectionNotice::LeadershipLost { token: 5 })
        ]
    );
    assert!(!e.is_leader());
    // Told again (a second fenced write refused): nothing more happens.
    e.handle(t0, ElectionInput::FenceRefused { token: 5 });
    assert_eq!(drain(&mut e), vec![]);
    // The session stays up: the next campaign needs no new lease.
    assert_eq!(campaign(&mut e, t0), vec![rpc(P + 2, create_txn(b"a"))]);
}

#[test]
fn second_campaign_is_busy_and_cancel_deletes_the_key() {
    let t0 = Instant::now();
    let mut e = campaigning(t0, false);
    ok(&mut e, t0, P, created(7, b"a", vec![kv(b"/e/99", b"b", 4)]));
    e.handle(
        t0,
        ElectionInput::TryCampaign {
            op: OpId(2),
            value: b"a".to_vec(),
        },
    );
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::CampaignFailed {
            op: OpId(2),
            error: ElectionError::Busy
        })]
    );
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(1) });
    assert_eq!(
        drain(&mut e),
        vec![cancel(P + 1), rpc(P + 2, delete_mine(7))]
    );
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 2,
            txn(8, true, vec![TxnOpResponse::Delete { deleted: 1 }])
        ),
        vec![note(ElectionNotice::CampaignFailed {
            op: OpId(1),
            error: ElectionError::Canceled
        })]
    );
}

#[test]
fn campaign_before_the_session_waits_for_it() {
    let t0 = Instant::now();
    let mut e = Election::new(config(), t0, 7);
    drain(&mut e);
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(1),
            value: b"a".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![]);
    assert_eq!(
        answer_grant(&mut e, t0, 0, LEASE),
        vec![
            note(ElectionNotice::Session(LivenessState::Registered {
                lease: LEASE
            })),
            rpc(P, create_txn(b"a")),
        ]
    );
}

#[test]
fn a_campaign_waiting_for_the_session_is_canceled_or_stopped_without_a_request() {
    let t0 = Instant::now();
    let mut e = Election::new(config(), t0, 7);
    drain(&mut e);
    let campaign = |op| ElectionInput::Campaign {
        op: OpId(op),
        value: b"a".to_vec(),
    };
    e.handle(t0, campaign(1));
    // Only its own cancel ends it; no key was created, so none is deleted.
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(9) });
    assert_eq!(drain(&mut e), vec![]);
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(1) });
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::CampaignFailed {
            op: OpId(1),
            error: ElectionError::Canceled
        })]
    );
    e.handle(t0, campaign(2));
    assert_eq!(drain(&mut e), vec![]);
    e.handle(t0, ElectionInput::Stop);
    let commands = drain(&mut e);
    assert_eq!(
        commands.first(),
        Some(&note(ElectionNotice::CampaignFailed {
            op: OpId(2),
            error: ElectionError::Stopped
        })),
        "{commands:?}"
    );
    assert!(
        !commands
            .iter()
            .any(|c| matches!(c, Command::Rpc { id, .. } if id.0 >= P)),
        "{commands:?}"
    );
}

#[test]
fn stop_ends_leadership_at_once_and_revokes() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(t0, ElectionInput::Stop);
    assert!(!e.is_leader());
    let commands = drain(&mut e);
    assert_eq!(commands[0], cancel(P + 1));
    assert_eq!(
        commands[1],
        note(ElectionNotice::LeadershipLost { token: 5 })
    );
    assert!(
        commands.contains(&rpc(1, Request::Revoke { lease: LEASE })),
        "{commands:?}"
    );
    assert_eq!(
        ok(&mut e, t0, 1, Response::Revoked),
        vec![note(ElectionNotice::Session(LivenessState::Stopped {
            revoked: true
        }))]
    );
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(2),
            value: b"a".to_vec(),
        },
    );
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::CampaignFailed {
            op: OpId(2),
            error: ElectionError::Stopped
        })]
    );
    assert_eq!(e.poll_timeout(), None);
}

#[test]
fn an_absurd_backoff_does_not_panic() {
    // Found by review: retry instants were computed with a plain `+`.
    let t0 = Instant::now();
    let config = ElectionConfig {
        prefix: b"/e/".to_vec(),
        ttl_secs: 9,
        backoff: BackoffConfig {
            initial: Duration::MAX,
            max: Duration::MAX,
            multiplier: 2,
            jitter_percent: 0,
        },
        safety_margin: Duration::from_millis(250),
        drift_allowance_ppm: 10_000,
        attempt_timeout: Duration::MAX,
        announce_session_trust: false,
        permits: 1,
        rw: None,
    };
    let mut e = Election::new(config, t0, 1);
    let mut ids = Vec::new();
    let mut now = t0;
    // Fail every request for a while; nothing may panic and time must not
    // go backwards in the machine's answers.
    for step in 0..50u64 {
        while let Some(c) = e.poll_command() {
            if let Command::Rpc { id, .. } = c {
                ids.push(id);
            }
        }
        if step == 1 {
            e.handle(
                now,
                ElectionInput::Campaign {
                    op: OpId(1),
                    value: b"v".to_vec(),
                },
            );
        }
        // The session's grant succeeds; every later request fails, so the
        // campaign's create Txn is retried with the absurd backoff.
        for id in std::mem::take(&mut ids) {
            let result = if id.0 == 0 {
                Ok(Response::Granted {
                    lease: 42,
                    ttl_secs: 9,
                })
            } else {
                Err(RpcError::Unavailable("down".into()))
            };
            e.handle(now, ElectionInput::Rpc(RpcReply { id, result }));
        }
        if let Some(at) = e.poll_timeout() {
            assert!(at >= now);
        }
        now += Duration::from_millis(10);
        e.handle_timeout(now);
    }
}

/// The regression of issue 14 item 8: a driver cancels campaign 1, the
/// cancel is not confirmed for a while (etcd does not answer the delete),
/// the driver moves on to campaign 2. The late answer to campaign 1 must be
/// told apart from campaign 2's, which runs on and wins: before operations
/// had ids, the late `CampaignFailed(Canceled)` was taken as campaign 2's
/// answer, and campaign 2's `Elected` then reached nobody (a leadership
/// nobody held a handle for).
#[test]
fn a_late_answer_to_a_canceled_campaign_names_it_not_the_next_one() {
    let t0 = Instant::now();
    let mut e = registered(t0);
    assert_eq!(campaign(&mut e, t0), vec![rpc(P, create_txn(b"a"))]);
    assert_eq!(
        ok(&mut e, t0, P, created(7, b"a", vec![kv(b"/e/99", b"b", 4)])),
        vec![rpc(P + 1, watch_all(8))]
    );
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(1) });
    assert_eq!(
        drain(&mut e),
        vec![cancel(P + 1), rpc(P + 2, delete_mine(7))]
    );
    // The delete hangs; the driver gives up waiting and starts campaign 2,
    // which waits for the withdraw instead of failing with Busy.
    let later = t0 + Duration::from_secs(1);
    e.handle(
        later,
        ElectionInput::Campaign {
            op: OpId(2),
            value: b"b".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![]);
    // A repeated cancel of campaign 1 must not touch campaign 2.
    e.handle(later, ElectionInput::CancelCampaign { op: OpId(1) });
    assert_eq!(drain(&mut e), vec![]);
    // The delete is finally answered: campaign 1's answer names campaign 1,
    // then campaign 2 starts and wins, and its answer names campaign 2.
    assert_eq!(
        ok(
            &mut e,
            later,
            P + 2,
            txn(8, true, vec![TxnOpResponse::Delete { deleted: 1 }])
        ),
        vec![
            note(ElectionNotice::CampaignFailed {
                op: OpId(1),
                error: ElectionError::Canceled
            }),
            rpc(P + 3, create_txn(b"b"))
        ]
    );
    let until = e.session_deadline().expect("a lease");
    assert_eq!(
        ok(&mut e, later, P + 3, created(9, b"b", vec![])),
        vec![
            note(ElectionNotice::Elected {
                op: OpId(2),
                key: my_key(),
                token: 9,
                lease: LEASE,
                waited: false,
                attempts: 1,
                trusted_until: until
            }),
            rpc(P + 4, watch(&my_key(), 10)),
        ]
    );
    // A cancel of campaign 1 arriving now still ends nothing.
    e.handle(later, ElectionInput::CancelCampaign { op: OpId(1) });
    assert_eq!(drain(&mut e), vec![]);
    assert_eq!(e.token(), Some(9));
}

#[test]
fn canceling_a_campaign_that_already_won_resigns_its_leadership() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    // A cancel naming another campaign changes nothing.
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(9) });
    assert_eq!(drain(&mut e), vec![]);
    assert!(e.is_leader());
    // The `Elected` of campaign 1 crossed its cancel: the leadership goes.
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(1) });
    assert!(!e.is_leader(), "belief ends before the delete is sent");
    assert_eq!(
        drain(&mut e),
        vec![cancel(P + 1), rpc(P + 2, delete_mine(5))]
    );
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 2,
            txn(9, true, vec![TxnOpResponse::Delete { deleted: 1 }])
        ),
        vec![note(ElectionNotice::Resigned { token: 5 })]
    );
    // A resign of the same token afterwards (the driver's own) is answered.
    e.handle(t0, ElectionInput::Resign { token: 5 });
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::Resigned { token: 5 })]
    );
}

#[test]
fn a_cancel_of_another_operation_leaves_a_running_or_queued_campaign_alone() {
    let t0 = Instant::now();
    let mut e = registered(t0);
    e.handle(
        t0,
        ElectionInput::TryCampaign {
            op: OpId(4),
            value: b"a".to_vec(),
        },
    );
    assert_eq!(drain(&mut e).len(), 1);
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(3) });
    assert_eq!(drain(&mut e), vec![]);
    // A second campaign is refused, and the refusal names it.
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(5),
            value: b"b".to_vec(),
        },
    );
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::CampaignFailed {
            op: OpId(5),
            error: ElectionError::Busy
        })]
    );
    // Queued behind a resign, only its own cancel removes it.
    let mut e = elected(t0);
    e.handle(t0, ElectionInput::Resign { token: 5 });
    drain(&mut e);
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(2),
            value: b"b".to_vec(),
        },
    );
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(1) });
    assert_eq!(drain(&mut e), vec![]);
    assert_eq!(
        ok(&mut e, t0, P + 2, txn(9, true, vec![])),
        vec![
            note(ElectionNotice::Resigned { token: 5 }),
            rpc(P + 3, create_txn(b"b"))
        ]
    );
}

#[test]
fn a_busy_proclaim_is_answered_with_its_own_operation() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    for op in [2, 3] {
        e.handle(
            t0,
            ElectionInput::Proclaim {
                op: OpId(op),
                value: b"v".to_vec(),
            },
        );
    }
    let commands = drain(&mut e);
    assert_eq!(commands.len(), 2, "{commands:?}");
    assert_eq!(
        commands[1],
        note(ElectionNotice::ProclaimFailed {
            op: OpId(3),
            error: ElectionError::Busy
        })
    );
    // Leadership lost with the proclaim pending: the failure names it.
    e.handle(t0, ElectionInput::Stop);
    let notices: Vec<_> = drain(&mut e)
        .into_iter()
        .filter_map(|c| match c {
            Command::Notify(n @ ElectionNotice::ProclaimFailed { .. }) => Some(n),
            _ => None,
        })
        .collect();
    assert_eq!(
        notices,
        vec![ElectionNotice::ProclaimFailed {
            op: OpId(2),
            error: ElectionError::Stopped
        }]
    );
}

#[test]
fn a_margin_and_drift_allowance_end_leadership_before_the_ttl() {
    let t0 = Instant::now();
    let mut cfg = config();
    cfg.safety_margin = Duration::from_millis(300);
    cfg.drift_allowance_ppm = 10_000;
    let mut e = Election::new(cfg, t0, 7);
    drain(&mut e);
    answer_grant(&mut e, t0, 0, LEASE);
    // 9 s less 1 % less 300 ms, from the grant's send time.
    let deadline = t0 + Duration::from_millis(8610);
    assert_eq!(e.session_deadline(), Some(deadline));
    campaign(&mut e, t0);
    ok(&mut e, t0, P, created(5, b"a", vec![]));
    assert!(e.is_leader());
    // No renewal is answered: leadership ends at the shortened deadline.
    let mut seen = Vec::new();
    while let Some(at) = e.poll_timeout().filter(|at| *at <= deadline) {
        assert!(e.is_leader(), "still leader before {at:?}");
        e.handle_timeout(at);
        seen.extend(drain(&mut e));
    }
    assert!(!e.is_leader());
    assert!(
        seen.contains(&note(ElectionNotice::LeadershipLost { token: 5 })),
        "{seen:?}"
    );
}

fn campaigning(t0: Instant, try_only: bool) -> Election {
    let mut e = registered(t0);
    let value = b"a".to_vec();
    let op = OpId(1);
    e.handle(
        t0,
        if try_only {
            ElectionInput::TryCampaign { op, value }
        } else {
            ElectionInput::Campaign { op, value }
        },
    );
    drain(&mut e);
    e
}

#[test]
fn malformed_create_answers_are_retried_after_a_pause() {
    let t0 = Instant::now();
    let mut e = campaigning(t0, false);
    let retry = t0 + Duration::from_millis(100);
    // Not a txn answer; a txn answer without the second read; a found key
    // missing from the answer; a create revision that cannot be: each is
    // sent again after the backoff, never believed.
    let answers = [
        Response::Revoked,
        txn(5, true, vec![TxnOpResponse::Put]),
        txn(5, false, vec![TxnOpResponse::Range { kvs: vec![] }]),
        txn(
            0,
            true,
            vec![TxnOpResponse::Put, TxnOpResponse::Range { kvs: vec![] }],
        ),
    ];
    let mut id = P;
    let mut at = t0;
    for answer in answers {
        assert_eq!(ok(&mut e, at, id, answer), vec![]);
        assert!(!e.is_leader());
        let next = e.poll_timeout().expect("a retry is armed");
        assert!(next > at && next <= at + Duration::from_secs(1), "{next:?}");
        at = next;
        e.handle_timeout(at);
        id += 1;
        assert_eq!(drain(&mut e), vec![rpc(id, create_txn(b"a"))]);
    }
    assert!(retry <= at);
}

#[test]
fn malformed_answers_while_waiting_are_retried_or_the_wait_restarted() {
    let t0 = Instant::now();
    let mut e = campaigning(t0, false);
    let leader = kv(b"/e/99", b"b", 4);
    assert_eq!(
        ok(&mut e, t0, P, created(7, b"a", vec![leader.clone()])),
        vec![rpc(P + 1, watch_all(8))]
    );
    // A watch answering with something else than events is restarted with
    // a read after a pause.
    assert_eq!(
        ok(&mut e, t0, P + 1, Response::Revoked),
        vec![cancel(P + 1)]
    );
    let at = e.poll_timeout().expect("a retry is armed");
    e.handle_timeout(at);
    assert_eq!(drain(&mut e), vec![rpc(P + 2, older(6))]);
    // A read answered with a plain range, a txn without both reads, or one
    // whose first answer is not a range, is sent again after a pause.
    let answers = [
        Response::Range {
            revision: 9,
            kvs: vec![],
        },
        txn(9, true, vec![TxnOpResponse::Range { kvs: vec![] }]),
        txn(
            9,
            true,
            vec![TxnOpResponse::Put, TxnOpResponse::Range { kvs: vec![] }],
        ),
    ];
    let mut id = P + 2;
    let mut at = at;
    for answer in answers {
        assert_eq!(ok(&mut e, at, id, answer), vec![]);
        at = e.poll_timeout().expect("a retry is armed");
        e.handle_timeout(at);
        id += 1;
        assert_eq!(drain(&mut e), vec![rpc(id, older(6))]);
    }
    assert!(!e.is_leader());
}

#[test]
fn fixing_a_stale_value_that_fails_or_is_answered_oddly() {
    let t0 = Instant::now();
    let mut e = campaigning(t0, false);
    let mine = kv(&my_key(), b"old", 3);
    let fix = put_mine(3, b"a");
    assert_eq!(
        ok(&mut e, t0, P, found(8, mine.clone(), mine.clone())),
        vec![rpc(P + 1, fix.clone())]
    );
    // An odd answer: sent again after a pause.
    assert_eq!(ok(&mut e, t0, P + 1, Response::Revoked), vec![]);
    let at = e.poll_timeout().expect("a retry is armed");
    e.handle_timeout(at);
    assert_eq!(drain(&mut e), vec![rpc(P + 2, fix)]);
    // The guard fails: my key vanished meanwhile, so join the queue again.
    assert_eq!(
        ok(&mut e, at, P + 2, txn(9, false, vec![])),
        vec![rpc(P + 3, create_txn(b"a"))]
    );
}

#[test]
fn try_campaign_first_in_line_with_a_stale_value_fixes_it_then_leads() {
    let t0 = Instant::now();
    let mut e = campaigning(t0, true);
    let mine = kv(&my_key(), b"old", 3);
    assert_eq!(ok(&mut e, t0, P, found(8, mine.clone(), mine)).len(), 1);
    let until = e.session_deadline().expect("a lease");
    assert_eq!(
        ok(&mut e, t0, P + 1, txn(9, true, vec![TxnOpResponse::Put])),
        vec![
            note(ElectionNotice::Elected {
                op: OpId(1),
                key: my_key(),
                token: 3,
                lease: LEASE,
                waited: false,
                attempts: 1,
                trusted_until: until
            }),
            rpc(P + 2, watch(&my_key(), 10)),
        ]
    );
}

#[test]
fn a_refused_session_fails_the_waiting_campaign_and_every_later_one() {
    let t0 = Instant::now();
    let mut e = Election::new(config(), t0, 7);
    drain(&mut e);
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(1),
            value: b"a".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![], "waits for the session");
    let denied = RpcError::PermissionDenied("etcdserver: permission denied".into());
    e.handle(
        t0,
        RpcReply {
            id: RpcId(0),
            result: Err(denied.clone()),
        }
        .into(),
    );
    assert_eq!(
        drain(&mut e),
        vec![
            note(ElectionNotice::Session(LivenessState::Refused {
                error: denied.clone()
            })),
            note(ElectionNotice::CampaignFailed {
                op: OpId(1),
                error: ElectionError::Rejected(denied.clone()),
            }),
            note(ElectionNotice::Session(LivenessState::Stopped {
                revoked: false
            })),
        ]
    );
    assert_eq!(e.poll_timeout(), None);
    // No lease will come: a later campaign fails at once, not in a wait.
    e.handle(
        t0,
        ElectionInput::TryCampaign {
            op: OpId(2),
            value: b"b".to_vec(),
        },
    );
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::CampaignFailed {
            op: OpId(2),
            error: ElectionError::Rejected(denied),
        })]
    );
    assert_eq!(e.poll_timeout(), None);
}

#[test]
fn a_refused_watch_while_waiting_restarts_the_wait_with_a_read() {
    let t0 = Instant::now();
    let mut e = campaigning(t0, false);
    assert_eq!(
        ok(&mut e, t0, P, created(7, b"a", vec![kv(b"/e/99", b"b", 4)])),
        vec![rpc(P + 1, watch_all(8))]
    );
    // A compacted watch cannot be resumed where it was; the older key may
    // have gone unseen, so read again (after a pause), never fail.
    e.handle(
        t0,
        RpcReply {
            id: RpcId(P + 1),
            result: Err(RpcError::Compacted {
                compact_revision: 9,
            }),
        }
        .into(),
    );
    assert_eq!(drain(&mut e), vec![cancel(P + 1)]);
    let retry = t0 + Duration::from_millis(100);
    assert_eq!(e.poll_timeout(), Some(retry));
    e.handle_timeout(retry);
    assert_eq!(drain(&mut e), vec![rpc(P + 2, older(6))]);
    assert!(!e.is_leader());
}

#[test]
fn a_withdraw_answered_oddly_is_sent_again_after_a_pause() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(t0, ElectionInput::Resign { token: 5 });
    assert_eq!(
        drain(&mut e),
        vec![cancel(P + 1), rpc(P + 2, delete_mine(5))]
    );
    assert_eq!(ok(&mut e, t0, P + 2, Response::Revoked), vec![]);
    let retry = t0 + Duration::from_millis(100);
    assert_eq!(e.poll_timeout(), Some(retry));
    e.handle_timeout(retry);
    assert_eq!(drain(&mut e), vec![rpc(P + 3, delete_mine(5))]);
    assert_eq!(
        ok(
            &mut e,
            retry,
            P + 3,
            Response::Deleted {
                revision: 9,
                deleted: 1
            }
        ),
        vec![note(ElectionNotice::Resigned { token: 5 })]
    );
}

#[test]
fn a_proclaim_refused_for_good_fails_and_leadership_stays() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(
        t0,
        ElectionInput::Proclaim {
            op: OpId(2),
            value: b"v2".to_vec(),
        },
    );
    assert_eq!(drain(&mut e).len(), 1);
    let denied = RpcError::PermissionDenied("etcdserver: permission denied".into());
    e.handle(
        t0,
        RpcReply {
            id: RpcId(P + 2),
            result: Err(denied.clone()),
        }
        .into(),
    );
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::ProclaimFailed {
            op: OpId(2),
            error: ElectionError::Rejected(denied)
        })]
    );
    // The refusal says nothing about the key: still leader, and the next
    // proclaim is sent rather than refused as busy.
    assert!(e.is_leader());
    assert_eq!(e.poll_timeout(), Some(t0 + Duration::from_secs(3)));
    e.handle(
        t0,
        ElectionInput::Proclaim {
            op: OpId(3),
            value: b"v3".to_vec(),
        },
    );
    let put = put_mine(5, b"v3");
    assert_eq!(drain(&mut e), vec![rpc(P + 3, put)]);
}

#[test]
fn a_broken_leader_watch_is_replaced_after_a_read_of_the_own_key() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    // The watch of my key breaks: belief stays (the session deadline
    // bounds it), and after a pause a read decides.
    assert_eq!(
        ok(&mut e, t0, P + 1, Response::Revoked),
        vec![cancel(P + 1)]
    );
    assert!(e.is_leader());
    let retry = t0 + Duration::from_millis(100);
    assert_eq!(e.poll_timeout(), Some(retry));
    e.handle_timeout(retry);
    assert_eq!(
        drain(&mut e),
        vec![rpc(
            P + 2,
            Request::Range(RangeRequest::all(KeyRange::Key(my_key())))
        )]
    );
    // The read finds my key gone: the leadership ended while unwatched.
    // The read is answered, so nothing is canceled.
    assert_eq!(
        ok(
            &mut e,
            retry,
            P + 2,
            Response::Range {
                revision: 9,
                kvs: vec![]
            }
        ),
        vec![note(ElectionNotice::LeadershipLost { token: 5 })]
    );
    assert!(!e.is_leader());
    assert_eq!(e.token(), None);
    assert_eq!(e.fence(), None);
}

#[test]
fn a_stale_reply_while_leading_changes_nothing() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    // A late second answer to the create, then one to an id never issued.
    for id in [P, P + 99] {
        assert_eq!(ok(&mut e, t0, id, created(5, b"a", vec![])), vec![]);
        assert!(e.is_leader());
        assert_eq!(e.token(), Some(5));
    }
}

#[test]
fn after_stop_every_request_is_answered_stopped_and_the_machine_finishes() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    assert_eq!(Election::stop_input(), ElectionInput::Stop);
    assert!(!e.is_finished());
    e.handle(t0, Election::stop_input());
    assert!(!e.is_finished(), "the revoke is still to be sent");
    let commands = drain(&mut e);
    assert!(
        commands.contains(&rpc(1, Request::Revoke { lease: LEASE })),
        "{commands:?}"
    );
    assert!(!e.is_finished(), "the revoke is not answered yet");
    assert_eq!(
        ok(&mut e, t0, 1, Response::Revoked),
        vec![note(ElectionNotice::Session(LivenessState::Stopped {
            revoked: true
        }))]
    );
    assert!(e.is_finished());
    e.handle(
        t0,
        ElectionInput::Proclaim {
            op: OpId(2),
            value: b"v".to_vec(),
        },
    );
    e.handle(t0, ElectionInput::Resign { token: 5 });
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(1) });
    e.handle(t0, ElectionInput::Stop);
    assert!(!e.is_finished(), "answers are still to be taken");
    assert_eq!(
        drain(&mut e),
        vec![
            note(ElectionNotice::ProclaimFailed {
                op: OpId(2),
                error: ElectionError::Stopped
            }),
            note(ElectionNotice::Resigned { token: 5 }),
        ]
    );
    assert!(e.is_finished());
    assert_eq!(e.poll_timeout(), None);
}

#[test]
fn the_leader_query_reads_the_first_created_key() {
    assert_eq!(
        leader_query(b"/e/"),
        Request::Range(RangeRequest {
            range: KeyRange::Prefix(b"/e/".to_vec()),
            sort: SortOrder::CreateAscending,
            limit: 1,
            max_create_revision: 0,
            revision: 0,
            keys_only: true,
        })
    );
}

#[test]
fn a_resign_refused_for_good_gives_the_session_up_so_the_key_goes_with_it() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(t0, ElectionInput::Resign { token: 5 });
    let resign = drain(&mut e);
    let Some(Command::Rpc { id, .. }) = resign.last() else {
        panic!("no guarded delete: {resign:?}");
    };
    let denied = RpcError::PermissionDenied("etcdserver: permission denied".into());
    e.handle(
        t0,
        RpcReply {
            id: *id,
            result: Err(denied),
        }
        .into(),
    );
    // The key stays while its lease lives, and would hold the queue: the
    // resign is answered, the lease revoked and a new one granted.
    assert_eq!(
        drain(&mut e),
        vec![
            note(ElectionNotice::Resigned { token: 5 }),
            rpc(1, Request::Revoke { lease: LEASE }),
            note(ElectionNotice::Session(LivenessState::Lost {
                lease: LEASE
            })),
            note(ElectionNotice::Session(LivenessState::Registering)),
            rpc(2, Request::Grant { ttl_secs: 9 }),
        ]
    );
    assert!(!e.is_leader());
}

#[test]
fn a_resign_unconfirmed_for_one_ttl_gives_the_session_up_while_renewals_get_through() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(t0, ElectionInput::Resign { token: 5 });
    let resign = drain(&mut e);
    let Some(Command::Rpc { id: delete, .. }) = resign.last().cloned() else {
        panic!("no guarded delete: {resign:?}");
    };
    // The deletes never get an answer; the session's renewals do.
    let limit = t0 + Duration::from_secs(9);
    let mut seen = Vec::new();
    while let Some(at) = e.poll_timeout() {
        if at > limit {
            break;
        }
        e.handle_timeout(at);
        for c in drain(&mut e) {
            if let Some(id) = renewal_id(&c) {
                seen.extend(answer_renewal(&mut e, at, id));
            } else {
                seen.push(c);
            }
        }
    }
    let position = |wanted: &Command<ElectionNotice>| {
        seen.iter()
            .position(|c| c == wanted)
            .unwrap_or_else(|| panic!("no {wanted:?} in {seen:?}"))
    };
    let revoke = seen
        .iter()
        .position(|c| {
            matches!(
                c,
                Command::Rpc {
                    request: Request::Revoke { lease: LEASE },
                    ..
                }
            )
        })
        .unwrap_or_else(|| panic!("the session was not given up: {seen:?}"));
    let lost = position(&note(ElectionNotice::Session(LivenessState::Lost {
        lease: LEASE,
    })));
    let resigned = position(&note(ElectionNotice::Resigned { token: 5 }));
    assert!(revoke < lost && lost < resigned, "{seen:?}");
    assert!(
        seen.contains(&Command::Cancel { id: delete }),
        "the delete in flight is given up: {seen:?}"
    );
    assert!(
        seen.iter().any(|c| matches!(
            c,
            Command::Rpc {
                request: Request::Grant { .. },
                ..
            }
        )),
        "a new session: {seen:?}"
    );
}

// ----- ranked campaigns and hand-over ----------------------------------

const PRIO: &[u8] = b"/e\x1fpriority/";

fn prio_key(lease_hex: &[u8]) -> Vec<u8> {
    [PRIO, lease_hex].concat()
}

/// The whole queue, keys only: what ranked waiters and bumps decide by.
fn queue_range() -> TxnOp {
    queue_read(true)
}

/// The whole queue; with values where one is compared (a retried ranked
/// create checks my value, a hand-over may name its target by value).
fn queue_read(keys_only: bool) -> TxnOp {
    TxnOp::Range(RangeRequest {
        range: KeyRange::Prefix(b"/e/".to_vec()),
        sort: SortOrder::CreateAscending,
        limit: 0,
        max_create_revision: 0,
        revision: 0,
        keys_only,
    })
}

/// A leader's read before a hand-over: the queue with values.
fn hand_over_read() -> Request {
    Request::Txn(Txn {
        compare: vec![],
        success: vec![queue_read(false), prio_range()],
        failure: vec![],
    })
}

fn prio_range() -> TxnOp {
    TxnOp::Range(RangeRequest::all(KeyRange::Prefix(PRIO.to_vec())))
}

fn ranked_read() -> Request {
    Request::Txn(Txn {
        compare: vec![],
        success: vec![queue_range(), prio_range()],
        failure: vec![],
    })
}

fn prio(lease_hex: &[u8], p: &str) -> KeyValue {
    kv(&prio_key(lease_hex), p.as_bytes(), 1)
}

fn create_rev(key: &[u8], revision: Revision) -> Compare {
    Compare::CreateRevisionEquals {
        key: key.to_vec(),
        revision,
    }
}

fn delete(key: &[u8]) -> TxnOp {
    TxnOp::Delete(KeyRange::Key(key.to_vec()))
}

#[test]
fn a_ranked_join_publishes_its_priority_bumps_a_lower_waiter_and_hears_of_a_higher_one() {
    let t0 = Instant::now();
    let mut e = registered(t0);
    e.handle(
        t0,
        ElectionInput::CampaignRanked {
            op: OpId(1),
            value: b"a".to_vec(),
            rank: Rank {
                priority: 5,
                yield_to_higher: false,
            },
        },
    );
    let publish = TxnOp::Put {
        key: prio_key(b"2a1f"),
        value: b"5".to_vec(),
        lease: LEASE,
    };
    assert_eq!(
        drain(&mut e),
        vec![rpc(
            P,
            Request::Txn(Txn {
                compare: vec![create_rev(&my_key(), 0)],
                success: vec![
                    TxnOp::Put {
                        key: my_key(),
                        value: b"a".to_vec(),
                        lease: LEASE,
                    },
                    publish.clone(),
                    queue_range(),
                    prio_range(),
                ],
                failure: vec![publish, queue_read(false), prio_range()],
            })
        )]
    );
    // The leader (3), a waiter of priority 1 (4), a plain waiter (6), me.
    let leader = kv(b"/e/77", b"c", 3);
    let low = kv(b"/e/99", b"b", 4);
    let plain = kv(b"/e/55", b"p", 6);
    let mine = kv(&my_key(), b"a", 9);
    assert_eq!(
        ok(
            &mut e,
            t0,
            P,
            txn(
                9,
                true,
                vec![
                    TxnOpResponse::Put,
                    TxnOpResponse::Put,
                    TxnOpResponse::Range {
                        kvs: vec![leader.clone(), low.clone(), plain.clone(), mine.clone()]
                    },
                    TxnOpResponse::Range {
                        kvs: vec![prio(b"99", "1"), prio(b"2a1f", "5")]
                    },
                ]
            )
        ),
        // Only the ranked lower waiter is bumped, while the leader holds;
        // the plain one keeps its place.
        vec![rpc(
            P + 1,
            Request::Txn(Txn {
                compare: vec![create_rev(b"/e/77", 3), create_rev(b"/e/99", 4)],
                success: vec![delete(b"/e/99"), queue_range(), prio_range()],
                failure: vec![queue_range(), prio_range()],
            })
        )]
    );
    // After the bump: watch the whole prefix (a bump of my key must be
    // seen at once), waiting for the plain waiter just ahead.
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 1,
            txn(
                10,
                true,
                vec![
                    TxnOpResponse::Delete { deleted: 1 },
                    TxnOpResponse::Range {
                        kvs: vec![leader.clone(), plain.clone(), mine.clone()]
                    },
                    TxnOpResponse::Range {
                        kvs: vec![prio(b"99", "1"), prio(b"2a1f", "5")]
                    },
                ]
            )
        ),
        vec![rpc(P + 2, watch_all(11))]
    );
    // The plain waiter leaves: read the queue again; then only the leader
    // is ahead, and its delete elects me.
    assert_eq!(
        ok(&mut e, t0, P + 2, events(vec![deleted(b"/e/55", 12)])),
        vec![cancel(P + 2), rpc(P + 3, ranked_read())]
    );
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 3,
            txn(
                12,
                true,
                vec![
                    TxnOpResponse::Range {
                        kvs: vec![leader, mine]
                    },
                    TxnOpResponse::Range { kvs: vec![] },
                ]
            )
        ),
        vec![rpc(P + 4, watch_all(13))]
    );
    let until = e.session_deadline().expect("a lease");
    assert_eq!(
        ok(&mut e, t0, P + 4, events(vec![deleted(b"/e/77", 14)])),
        vec![
            cancel(P + 4),
            note(ElectionNotice::Elected {
                op: OpId(1),
                key: my_key(),
                token: 9,
                lease: LEASE,
                waited: true,
                attempts: 1,
                trusted_until: until
            }),
            rpc(P + 5, watch(&my_key(), 15)),
            rpc(
                P + 6,
                Request::Range(RangeRequest::all(KeyRange::Prefix(PRIO.to_vec())))
            ),
        ]
    );
    // The leader reads the priorities once, then watches them.
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 6,
            Response::Range {
                revision: 15,
                kvs: vec![prio(b"99", "1"), prio(b"2a1f", "5")]
            }
        ),
        vec![rpc(
            P + 7,
            Request::Watch {
                range: KeyRange::Prefix(PRIO.to_vec()),
                start_revision: 16
            }
        )]
    );
    let higher = WatchEvent {
        kind: EventKind::Put,
        kv: prio(b"aa", "7"),
        prev_kv: None,
    };
    assert_eq!(
        ok(&mut e, t0, P + 7, events(vec![higher.clone()])),
        vec![note(ElectionNotice::StepDownRequested {
            token: 9,
            by: prio_key(b"aa"),
            priority: 7,
            yielding: false
        })]
    );
    assert!(e.is_leader(), "told, not yielding");
    assert_eq!(
        ok(&mut e, t0, P + 7, events(vec![higher])),
        vec![],
        "told once"
    );
}

/// A ranked campaign (priority 0, yielding) elected with token 5 by its
/// create's answer alone; what that answer queued.
fn ranked_yielding_elected(t0: Instant) -> (Election, Vec<Command<ElectionNotice>>) {
    let mut e = registered(t0);
    e.handle(
        t0,
        ElectionInput::CampaignRanked {
            op: OpId(1),
            value: b"a".to_vec(),
            rank: Rank {
                priority: 0,
                yield_to_higher: true,
            },
        },
    );
    drain(&mut e);
    let elected = ok(
        &mut e,
        t0,
        P,
        txn(
            5,
            true,
            vec![
                TxnOpResponse::Put,
                TxnOpResponse::Put,
                TxnOpResponse::Range {
                    kvs: vec![kv(&my_key(), b"a", 5)],
                },
                TxnOpResponse::Range { kvs: vec![] },
            ],
        ),
    );
    (e, elected)
}

#[test]
fn a_yielding_leader_hands_over_to_the_higher_candidate_right_after_the_notice() {
    let t0 = Instant::now();
    let (mut e, elected) = ranked_yielding_elected(t0);
    let mine = kv(&my_key(), b"a", 5);
    assert_eq!(elected.len(), 3, "{elected:?}");
    assert!(e.is_leader());
    // A candidate of priority 1 waits: told, and belief ends at once.
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 2,
            Response::Range {
                revision: 6,
                kvs: vec![prio(b"bb", "1")]
            }
        ),
        vec![
            rpc(
                P + 3,
                Request::Watch {
                    range: KeyRange::Prefix(PRIO.to_vec()),
                    start_revision: 7
                }
            ),
            note(ElectionNotice::StepDownRequested {
                token: 5,
                by: prio_key(b"bb"),
                priority: 1,
                yielding: true
            }),
            rpc(P + 4, hand_over_read()),
        ]
    );
    assert!(!e.is_leader());
    // Handed to it, not resigned: a lower one ahead of it must not win.
    let low = kv(b"/e/aa", b"l", 6);
    let high = kv(b"/e/bb", b"h", 7);
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 4,
            txn(
                8,
                true,
                vec![
                    TxnOpResponse::Range {
                        kvs: vec![mine, low, high.clone()]
                    },
                    TxnOpResponse::Range {
                        kvs: vec![prio(b"aa", "0"), prio(b"bb", "1")]
                    },
                ]
            )
        ),
        vec![rpc(
            P + 5,
            Request::Txn(Txn {
                compare: vec![
                    create_rev(&my_key(), 5),
                    create_rev(b"/e/bb", 7),
                    create_rev(b"/e/aa", 6)
                ],
                success: vec![
                    delete(&my_key()),
                    delete(&prio_key(b"2a1f")),
                    delete(b"/e/aa")
                ],
                failure: vec![
                    TxnOp::Range(RangeRequest::all(KeyRange::Key(b"/e/bb".to_vec()))),
                    TxnOp::Range(RangeRequest::all(KeyRange::Key(my_key()))),
                ],
            })
        )]
    );
    assert_eq!(
        ok(&mut e, t0, P + 5, txn(9, true, vec![])),
        vec![
            cancel(P + 3),
            cancel(P + 1),
            note(ElectionNotice::HandedOver {
                op: OpId(1),
                token: 5,
                to: high
            }),
        ]
    );
    assert!(!e.is_leader());
}

/// The fuzz input crash-bdb2a651 ("2 watches open with 1 permits"), by
/// hand: a ranked leader holds two watches by design, its own key's and
/// the priorities' (the fuzz target now counts the second apart); stale
/// resigns and a busy try-campaign open nothing, and the resign of its
/// token cancels both before the withdraw is sent.
#[test]
fn a_ranked_leader_watches_its_key_and_the_priorities_and_its_resign_cancels_both() {
    let t0 = Instant::now();
    let mut e = registered(t0);
    e.handle(
        t0,
        ElectionInput::CampaignRanked {
            op: OpId(1),
            value: b"a".to_vec(),
            rank: Rank {
                priority: 3,
                yield_to_higher: true,
            },
        },
    );
    let queued = drain(&mut e);
    assert!(
        matches!(queued.as_slice(), [Command::Rpc { id, request: Request::Txn(_) }] if *id == RpcId(P)),
        "{queued:?}"
    );
    // Alone in the queue: elected at once, then the guard's watch of my
    // key and the read of the priorities.
    let until = e.session_deadline().expect("a lease");
    assert_eq!(
        ok(
            &mut e,
            t0,
            P,
            txn(
                5,
                true,
                vec![
                    TxnOpResponse::Put,
                    TxnOpResponse::Put,
                    TxnOpResponse::Range {
                        kvs: vec![kv(&my_key(), b"a", 5)]
                    },
                    TxnOpResponse::Range { kvs: vec![] },
                ]
            )
        ),
        vec![
            note(ElectionNotice::Elected {
                op: OpId(1),
                key: my_key(),
                token: 5,
                lease: LEASE,
                waited: false,
                attempts: 1,
                trusted_until: until
            }),
            rpc(P + 1, watch(&my_key(), 6)),
            rpc(
                P + 2,
                Request::Range(RangeRequest::all(KeyRange::Prefix(PRIO.to_vec())))
            ),
        ]
    );
    // Neither a try-campaign while leading (it waits for the leadership
    // to end, and its cancel answers it) nor a stale resign opens or
    // closes anything.
    e.handle(
        t0,
        ElectionInput::TryCampaign {
            op: OpId(2),
            value: b"b".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![]);
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(2) });
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::CampaignFailed {
            op: OpId(2),
            error: ElectionError::Canceled
        })]
    );
    e.handle(t0, ElectionInput::Resign { token: 4 });
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::Resigned { token: 4 })]
    );
    assert!(e.is_leader());
    // The priorities read (one unparsable value: no priority, no notice)
    // turns into their watch, beside the watch of my key: two watches.
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 2,
            Response::Range {
                revision: 6,
                kvs: vec![kv(&prio_key(b"1"), b"\"", 1)]
            }
        ),
        vec![rpc(
            P + 3,
            Request::Watch {
                range: KeyRange::Prefix(PRIO.to_vec()),
                start_revision: 7
            }
        )]
    );
    assert!(e.is_leader());
    // The resign of this leadership cancels both, then deletes my key and
    // my priority key, guarded by my token.
    e.handle(t0, ElectionInput::Resign { token: 5 });
    assert_eq!(
        drain(&mut e),
        vec![
            cancel(P + 1),
            cancel(P + 3),
            rpc(
                P + 4,
                Request::Txn(Txn {
                    compare: vec![create_rev(&my_key(), 5)],
                    success: vec![delete(&my_key()), delete(&prio_key(b"2a1f"))],
                    failure: vec![delete(&prio_key(b"2a1f"))],
                })
            ),
        ]
    );
    assert!(!e.is_leader());
    assert_eq!(
        ok(&mut e, t0, P + 4, txn(8, true, vec![])),
        vec![note(ElectionNotice::Resigned { token: 5 })]
    );
}

/// A ranked leader (token 5, priority 0, yielding) that just learnt of a
/// higher candidate: belief over, its guard's watch of my key (`P + 1`),
/// its watch of the priorities (`P + 3`) and its hand-over's read of the
/// queue (`P + 4`) open.
fn yielding_leader(t0: Instant) -> Election {
    let (mut e, elected) = ranked_yielding_elected(t0);
    assert_eq!(
        elected[1..],
        [
            rpc(P + 1, watch(&my_key(), 6)),
            rpc(
                P + 2,
                Request::Range(RangeRequest::all(KeyRange::Prefix(PRIO.to_vec())))
            )
        ]
    );
    let told = ok(
        &mut e,
        t0,
        P + 2,
        Response::Range {
            revision: 6,
            kvs: vec![prio(b"bb", "1")],
        },
    );
    assert_eq!(told.last(), Some(&rpc(P + 4, hand_over_read())), "{told:?}");
    assert!(!e.is_leader());
    e
}

// A yield's hand-over carries the campaign's op. Cut short, it was
// answered with `HandOverFailed { op: <the campaign> }`: an answer to a
// hand-over the user never asked for, and a second answer naming the
// campaign after its `Elected` (fuzz crash-d6b6ca58). However a yield
// ends, the leadership's own end answers it: `LeadershipLost` on a loss
// (of the session, or of my key), `Resigned` when the user resigns
// meanwhile.

/// The fuzz input's way: the session is lost mid-yield.
#[test]
fn a_yield_cut_short_by_the_session_loss_answers_no_hand_over() {
    let t0 = Instant::now();
    let mut e = yielding_leader(t0);
    let at = e.poll_timeout().expect("a renewal timer");
    e.handle_timeout(at);
    let renewal = drain(&mut e);
    let Some(id) = renewal.last().and_then(renewal_id) else {
        panic!("no renewal: {renewal:?}");
    };
    assert_eq!(
        ok(&mut e, at, id, Response::KeptAlive { ttl_secs: 0 }),
        vec![
            note(ElectionNotice::Session(LivenessState::Lost {
                lease: LEASE
            })),
            cancel(P + 1),
            cancel(P + 3),
            cancel(P + 4),
            note(ElectionNotice::LeadershipLost { token: 5 }),
            note(ElectionNotice::Session(LivenessState::Registering)),
        ]
    );
}

/// The hand-over's read shows my key gone: the leadership is lost, and
/// that is all.
#[test]
fn a_yield_that_finds_my_key_gone_is_lost_without_a_hand_over_answer() {
    let t0 = Instant::now();
    let mut e = yielding_leader(t0);
    let other = kv(b"/e/bb", b"h", 7);
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 4,
            txn(
                8,
                true,
                vec![
                    TxnOpResponse::Range { kvs: vec![other] },
                    TxnOpResponse::Range {
                        kvs: vec![prio(b"bb", "1")]
                    },
                ]
            )
        ),
        vec![
            cancel(P + 1),
            cancel(P + 3),
            note(ElectionNotice::LeadershipLost { token: 5 }),
        ]
    );
}

/// The user resigns mid-yield: everything of the yield is canceled, the
/// key withdrawn, and `Resigned` is the only answer.
#[test]
fn a_resign_during_a_yield_is_answered_by_resigned_alone() {
    let t0 = Instant::now();
    let mut e = yielding_leader(t0);
    e.handle(t0, ElectionInput::Resign { token: 5 });
    assert_eq!(
        drain(&mut e),
        vec![
            cancel(P + 1),
            cancel(P + 3),
            cancel(P + 4),
            rpc(
                P + 5,
                Request::Txn(Txn {
                    compare: vec![create_rev(&my_key(), 5)],
                    success: vec![delete(&my_key()), delete(&prio_key(b"2a1f"))],
                    failure: vec![delete(&prio_key(b"2a1f"))],
                })
            ),
        ]
    );
    assert_eq!(
        ok(&mut e, t0, P + 5, txn(9, true, vec![])),
        vec![note(ElectionNotice::Resigned { token: 5 })]
    );
}

#[test]
fn hand_over_deletes_the_leader_and_those_ahead_of_the_target_in_one_guarded_txn() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    let b = kv(b"/e/b", b"b", 6);
    let d = kv(b"/e/d", b"d", 7);
    let x = kv(b"/e/x", b"x", 8);
    let queue = |e: &mut Election, id: u64| {
        ok(
            e,
            t0,
            id,
            txn(
                20,
                true,
                vec![
                    TxnOpResponse::Range {
                        kvs: vec![kv(&my_key(), b"a", 5), b.clone(), d.clone(), x.clone()],
                    },
                    TxnOpResponse::Range {
                        kvs: vec![prio(b"b", "0"), prio(b"d", "0")],
                    },
                ],
            ),
        )
    };
    // Nobody of that name: refused, still leading.
    e.handle(
        t0,
        ElectionInput::HandOver {
            op: OpId(2),
            token: 5,
            to: b"nobody".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![rpc(P + 2, hand_over_read())]);
    assert!(e.is_leader(), "believed while only reading");
    assert_eq!(
        queue(&mut e, P + 2),
        vec![note(ElectionNotice::HandOverFailed {
            op: OpId(2),
            error: ElectionError::NoSuchCandidate
        })]
    );
    assert!(e.is_leader());
    // The target by value: my key and b (ahead of d) go, x stays.
    e.handle(
        t0,
        ElectionInput::HandOver {
            op: OpId(3),
            token: 5,
            to: b"d".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![rpc(P + 3, hand_over_read())]);
    assert_eq!(
        queue(&mut e, P + 3),
        vec![rpc(
            P + 4,
            Request::Txn(Txn {
                compare: vec![
                    create_rev(&my_key(), 5),
                    create_rev(b"/e/d", 7),
                    create_rev(b"/e/b", 6)
                ],
                success: vec![delete(&my_key()), delete(b"/e/b")],
                failure: vec![
                    TxnOp::Range(RangeRequest::all(KeyRange::Key(b"/e/d".to_vec()))),
                    TxnOp::Range(RangeRequest::all(KeyRange::Key(my_key()))),
                ],
            })
        )]
    );
    assert!(!e.is_leader(), "belief ends before the delete can apply");
    assert_eq!(
        ok(&mut e, t0, P + 4, txn(21, true, vec![])),
        vec![
            cancel(P + 1),
            note(ElectionNotice::HandedOver {
                op: OpId(3),
                token: 5,
                to: d
            })
        ]
    );
    assert!(!e.is_leader());
}

#[test]
fn a_hand_over_whose_target_left_keeps_the_leadership() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    let d = kv(b"/e/d", b"d", 7);
    e.handle(
        t0,
        ElectionInput::HandOver {
            op: OpId(2),
            token: 5,
            to: b"/e/d".to_vec(),
        },
    );
    drain(&mut e);
    let read = txn(
        20,
        true,
        vec![
            TxnOpResponse::Range {
                kvs: vec![kv(&my_key(), b"a", 5), d],
            },
            TxnOpResponse::Range { kvs: vec![] },
        ],
    );
    assert_eq!(ok(&mut e, t0, P + 2, read).len(), 1);
    assert!(!e.is_leader());
    // The guard on the target failed: it is gone, my key is not.
    let until = e.session_deadline().expect("a lease");
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 3,
            txn(
                21,
                false,
                vec![
                    TxnOpResponse::Range { kvs: vec![] },
                    TxnOpResponse::Range {
                        kvs: vec![kv(&my_key(), b"a", 5)]
                    },
                ]
            )
        ),
        vec![
            note(ElectionNotice::HandOverFailed {
                op: OpId(2),
                error: ElectionError::NoSuchCandidate
            }),
            note(ElectionNotice::Trusted { token: 5, until }),
        ]
    );
    assert!(e.is_leader(), "the leadership is kept");
}

// The order of a leadership's end and its hand-over's answer, on every
// path that ends a leadership while a user's hand-over runs: always
// `LeadershipLost` first, `HandOverFailed { NotLeader }` right behind it
// (documented on `ElectionNotice::HandOverFailed`). The facade ends belief
// and fires `lost()` at the first, so the hand-over's caller, woken by the
// second, finds the leadership over. The path by the hand-over's own
// answer emitted them the other way round.

/// A user's hand-over that has just begun (its queue read in flight as
/// `P + 2`) on the leader of `elected`.
fn handing_over(t0: Instant) -> Election {
    let mut e = elected(t0);
    e.handle(
        t0,
        ElectionInput::HandOver {
            op: OpId(2),
            token: 5,
            to: b"d".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![rpc(P + 2, hand_over_read())]);
    e
}

/// The hand-over's read shows my key gone.
#[test]
fn a_hand_over_that_finds_my_key_gone_tells_the_loss_before_the_failure() {
    let t0 = Instant::now();
    let mut e = handing_over(t0);
    let other = kv(b"/e/d", b"d", 7);
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 2,
            txn(
                8,
                true,
                vec![
                    TxnOpResponse::Range { kvs: vec![other] },
                    TxnOpResponse::Range { kvs: vec![] },
                ]
            )
        ),
        vec![
            cancel(P + 1),
            note(ElectionNotice::LeadershipLost { token: 5 }),
            note(ElectionNotice::HandOverFailed {
                op: OpId(2),
                error: ElectionError::NotLeader
            }),
        ]
    );
    assert!(!e.is_leader());
}

/// etcd answers the hand-over's read "lease not found".
#[test]
fn a_hand_over_refused_for_the_lease_tells_the_loss_before_the_failure() {
    let t0 = Instant::now();
    let mut e = handing_over(t0);
    e.handle(
        t0,
        RpcReply {
            id: RpcId(P + 2),
            result: Err(RpcError::LeaseNotFound),
        }
        .into(),
    );
    let told = drain(&mut e);
    let lost = told
        .iter()
        .position(|c| *c == note(ElectionNotice::LeadershipLost { token: 5 }));
    let failed = told.iter().position(|c| {
        *c == note(ElectionNotice::HandOverFailed {
            op: OpId(2),
            error: ElectionError::NotLeader,
        })
    });
    assert!(
        matches!((lost, failed), (Some(l), Some(f)) if f == l + 1),
        "{told:?}"
    );
    assert!(
        !told.contains(&cancel(P + 2)),
        "the answered read is not canceled: {told:?}"
    );
}

/// The own key's delete arrives on the leader's watch mid-hand-over (not
/// the hand-over's own delete: that is not sent before the read's
/// answer).
#[test]
fn a_delete_seen_mid_hand_over_read_tells_the_loss_before_the_failure() {
    let t0 = Instant::now();
    let mut e = handing_over(t0);
    let deleted = delete_event(my_key(), 9);
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 1,
            Response::WatchEvents {
                events: vec![deleted]
            }
        ),
        vec![
            cancel(P + 1),
            cancel(P + 2),
            note(ElectionNotice::LeadershipLost { token: 5 }),
            note(ElectionNotice::HandOverFailed {
                op: OpId(2),
                error: ElectionError::NotLeader
            }),
        ]
    );
}

/// A campaign given up before its create was answered does not know
/// whether its key exists, nor its revision: it reads the key and deletes
/// only the incarnation it found. An unguarded delete held up somewhere
/// (a paused member) could otherwise land after the next campaign created
/// the key again, and delete that one while it leads.
#[test]
fn a_withdraw_without_a_token_reads_the_key_and_deletes_only_what_it_found() {
    let t0 = Instant::now();
    let mut e = registered(t0);
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(1),
            value: b"a".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![rpc(P, create_txn(b"a"))]);
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(1) });
    let read_mine = Request::Range(RangeRequest::all(KeyRange::Key(my_key())));
    assert_eq!(
        drain(&mut e),
        vec![
            Command::Cancel { id: RpcId(P) },
            rpc(P + 1, read_mine.clone())
        ]
    );
    // The create had landed, at revision 12: delete that key, and only it.
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 1,
            Response::Range {
                revision: 13,
                kvs: vec![kv(&my_key(), b"a", 12)]
            }
        ),
        vec![rpc(P + 2, delete_mine(12))]
    );
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 2,
            txn(14, true, vec![TxnOpResponse::Delete { deleted: 1 }])
        ),
        vec![
            note(ElectionNotice::CampaignFailed {
                op: OpId(1),
                error: ElectionError::Canceled
            }),
            // The create's first copy may land yet: the lease is given up
            // (`a_lease_with_a_create_in_doubt_is_given_up_once_nothing_runs_on_it`).
            rpc(1, Request::Revoke { lease: LEASE }),
            note(ElectionNotice::Session(LivenessState::Lost {
                lease: LEASE
            })),
            note(ElectionNotice::Session(LivenessState::Registering)),
            rpc(2, Request::Grant { ttl_secs: 9 }),
        ]
    );

    // Again (on a fresh session), and this time the create never landed:
    // nothing to delete.
    let mut e = registered(t0);
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(2),
            value: b"a".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![rpc(P, create_txn(b"a"))]);
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(2) });
    assert_eq!(
        drain(&mut e),
        vec![Command::Cancel { id: RpcId(P) }, rpc(P + 1, read_mine)]
    );
    let canceled = ok(
        &mut e,
        t0,
        P + 1,
        Response::Range {
            revision: 15,
            kvs: vec![],
        },
    );
    assert_eq!(
        canceled.first(),
        Some(&note(ElectionNotice::CampaignFailed {
            op: OpId(2),
            error: ElectionError::Canceled
        }))
    );
    assert!(
        !canceled.iter().any(|c| matches!(
            c,
            Command::Rpc {
                request: Request::Txn(_) | Request::Delete(_),
                ..
            }
        )),
        "nothing to delete: {canceled:?}"
    );
}

/// A campaign that reaches the machine while it still leads (its driver
/// saw the leadership end first: the caller's clock passed the deadline,
/// or etcd refused a fenced write, before the machine heard) is not
/// refused with `Busy`: it waits for that end, then runs. Only a second
/// campaign behind it is busy, and a cancel of the waiting one answers it
/// without touching the leadership.
#[test]
fn a_campaign_while_leading_waits_for_the_leadership_to_end() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    let ask = |e: &mut Election, op: u64| {
        e.handle(
            t0,
            ElectionInput::Campaign {
                op: OpId(op),
                value: b"a".to_vec(),
            },
        );
        drain(e)
    };
    assert_eq!(ask(&mut e, 2), vec![], "waits; nothing sent");
    assert!(e.is_leader(), "the leadership is not touched");
    assert_eq!(
        ask(&mut e, 3),
        vec![note(ElectionNotice::CampaignFailed {
            op: OpId(3),
            error: ElectionError::Busy
        })],
        "one campaign at a time"
    );
    e.handle(t0, ElectionInput::CancelCampaign { op: OpId(2) });
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::CampaignFailed {
            op: OpId(2),
            error: ElectionError::Canceled
        })]
    );
    assert!(
        e.is_leader(),
        "a cancel of the waiting campaign ends nothing"
    );
    // The leadership ends (here a refused fence): the campaign waiting
    // behind it starts in the same step, right after the loss is told.
    assert_eq!(ask(&mut e, 4), vec![]);
    e.handle(t0, ElectionInput::FenceRefused { token: 5 });
    assert_eq!(
        drain(&mut e),
        vec![
            cancel(P + 1),
            note(ElectionNotice::LeadershipLost { token: 5 }),
            rpc(P + 2, create_txn(b"a")),
        ]
    );
}

/// The same at the session's local deadline: the caller's clock ends
/// belief, the user campaigns again before the machine's timer fired; the
/// loss, then the campaign on the next lease.
#[test]
fn a_campaign_asked_at_the_deadline_runs_on_the_next_lease() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    let deadline = e.session_deadline().expect("a lease");
    e.handle(
        deadline,
        ElectionInput::Campaign {
            op: OpId(2),
            value: b"a".to_vec(),
        },
    );
    let asked = drain(&mut e);
    assert!(
        !asked
            .iter()
            .any(|c| matches!(c, Command::Notify(ElectionNotice::CampaignFailed { .. }))),
        "not refused: {asked:?}"
    );
    let mut seen = asked;
    let mut now = deadline;
    while let Some(at) = e.poll_timeout() {
        if at > deadline + Duration::from_secs(1) {
            break;
        }
        now = at;
        e.handle_timeout(at);
        seen.extend(drain(&mut e));
    }
    let lost = seen
        .iter()
        .position(|c| *c == note(ElectionNotice::LeadershipLost { token: 5 }))
        .unwrap_or_else(|| panic!("no loss by {now:?}: {seen:?}"));
    assert!(
        !seen
            .iter()
            .any(|c| matches!(c, Command::Notify(ElectionNotice::CampaignFailed { .. }))),
        "{seen:?}"
    );
    assert!(
        seen[..lost]
            .iter()
            .all(|c| !matches!(c, Command::Rpc { request, .. } if *request == create_txn(b"a"))),
        "nothing of the campaign before the loss: {seen:?}"
    );
}

/// A grant of the election's own session refused for space is told, so a
/// campaign timing out meanwhile can say why; the grant is tried again
/// and the answered grant registers as usual.
#[test]
fn a_refused_session_grant_is_told_and_tried_again() {
    let t0 = Instant::now();
    let mut e = Election::new(election_config(b"/e/", 1), t0, 7);
    assert_eq!(
        drain(&mut e),
        vec![
            note(ElectionNotice::Session(LivenessState::Registering)),
            rpc(0, Request::Grant { ttl_secs: 9 })
        ]
    );
    let full = RpcError::NoSpace("etcdserver: mvcc: database space exceeded".into());
    e.handle(
        t0,
        RpcReply {
            id: RpcId(0),
            result: Err(full.clone()),
        }
        .into(),
    );
    assert_eq!(
        drain(&mut e),
        vec![note(ElectionNotice::GrantFailed { error: full })]
    );
    let again = e.poll_timeout().expect("the grant is tried again");
    e.handle_timeout(again);
    assert_eq!(drain(&mut e), vec![rpc(1, Request::Grant { ttl_secs: 9 })]);
    assert_eq!(
        answer_grant(&mut e, again, 1, LEASE),
        vec![note(ElectionNotice::Session(LivenessState::Registered {
            lease: LEASE
        }))]
    );
}
