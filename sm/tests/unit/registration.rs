//! Exact command sequences of a key registered on a shared session
//! (`Registration`).

use crate::support::drain;
use fleetcoord_sm::election::SessionRequest;
use fleetcoord_sm::keepalive::LivenessState;
use fleetcoord_sm::registration::*;
use fleetcoord_sm::rpc::{
    Compare, KeyRange, RangeRequest, Request, Response, RpcError, RpcId, Txn, TxnOp, TxnOpResponse,
};
use fleetcoord_sm::session::SessionInput;
use fleetcoord_sm::*;
use std::time::{Duration, Instant};

const KEY: &[u8] = b"/h/a";
const MARKER: &[u8] = b"/h/a/left";
const INCARNATION: &[u8] = b"/h/a/incarnation";
const L1: LeaseId = 0x11;
const L2: LeaseId = 0x22;

fn registration(t0: Instant) -> Registration {
    let mut r = Registration::new(
        RegistrationConfig {
            key: KEY.to_vec(),
            value: b"v".to_vec(),
            leave_marker: Some(MARKER.to_vec()),
            companion: Some((INCARNATION.to_vec(), b"1".to_vec())),
            backoff: BackoffConfig {
                initial: Duration::from_millis(100),
                max: Duration::from_secs(1),
                multiplier: 2,
                jitter_percent: 0,
            },
            give_up: Duration::from_secs(9),
            take_over: false,
        },
        t0,
        7,
    );
    assert_eq!(
        drain(&mut r),
        vec![state(LivenessState::Registering)],
        "nothing is sent before the session is up"
    );
    r
}

fn state(s: LivenessState) -> Command<RegistrationNotice> {
    Command::Notify(RegistrationNotice::State(s))
}

fn rpc(id: u64, request: Request) -> Command<RegistrationNotice> {
    Command::Rpc {
        id: RpcId(id),
        request,
    }
}

fn put(known: Revision, value: &[u8], lease: LeaseId) -> Request {
    Request::Txn(Txn {
        compare: vec![Compare::ModRevisionEquals {
            key: KEY.to_vec(),
            revision: known,
        }],
        // The companion first, on the same lease, in every write.
        success: vec![
            TxnOp::Put {
                key: INCARNATION.to_vec(),
                value: b"1".to_vec(),
                lease,
            },
            TxnOp::Put {
                key: KEY.to_vec(),
                value: value.to_vec(),
                lease,
            },
            TxnOp::Delete(KeyRange::Key(MARKER.to_vec())),
        ],
        failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(KEY.to_vec())))],
    })
}

fn leave(written: Revision, lease: LeaseId) -> Request {
    Request::Txn(Txn {
        compare: vec![Compare::ModRevisionEquals {
            key: KEY.to_vec(),
            revision: written,
        }],
        success: vec![
            TxnOp::Put {
                key: MARKER.to_vec(),
                value: Vec::new(),
                lease,
            },
            TxnOp::Delete(KeyRange::Key(KEY.to_vec())),
            // The shared lease outlives the registration.
            TxnOp::Delete(KeyRange::Key(INCARNATION.to_vec())),
        ],
        // Read back when the guard fails: whose key it is now (rule 7).
        failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(KEY.to_vec())))],
    })
}

fn handle(
    r: &mut Registration,
    at: Instant,
    input: RegistrationInput,
) -> Vec<Command<RegistrationNotice>> {
    r.handle(at, input);
    drain(r)
}

fn reply(id: u64, result: Result<Response, RpcError>) -> RegistrationInput {
    RegistrationInput::Rpc(RpcReply {
        id: RpcId(id),
        result,
    })
}

fn written(revision: Revision) -> Result<Response, RpcError> {
    Ok(Response::Txn {
        revision,
        succeeded: true,
        responses: vec![],
    })
}

fn up(lease: LeaseId) -> RegistrationInput {
    RegistrationInput::Session(SessionInput::Up { lease })
}

/// Registered on L1 at revision 5.
fn registered(t0: Instant) -> Registration {
    let mut r = registration(t0);
    assert_eq!(handle(&mut r, t0, up(L1)), vec![rpc(0, put(0, b"v", L1))]);
    assert_eq!(
        handle(&mut r, t0, reply(0, written(5))),
        vec![state(LivenessState::Registered { lease: L1 })]
    );
    r
}

#[test]
fn the_key_is_written_on_the_session_lease_guarded_on_its_mod_revision() {
    let t0 = Instant::now();
    let r = registered(t0);
    assert_eq!(r.lease(), Some(L1));
}

/// A lost session lease is the registration's loss; the next lease writes
/// the key again, guarded on its absence (it went with the old lease).
#[test]
fn a_new_lease_after_a_loss_registers_again() {
    let t0 = Instant::now();
    let mut r = registered(t0);
    assert_eq!(
        handle(
            &mut r,
            t0,
            RegistrationInput::Session(SessionInput::Lost { lease: L1 })
        ),
        vec![state(LivenessState::Lost { lease: L1 })]
    );
    assert_eq!(handle(&mut r, t0, up(L2)), vec![rpc(1, put(0, b"v", L2))]);
    assert_eq!(
        handle(&mut r, t0, reply(1, written(9))),
        vec![state(LivenessState::Registered { lease: L2 })]
    );
}

/// A new value is written at once while nothing is in flight, else after
/// the write in flight, each write guarded on the revision the one before
/// wrote; the next lease's registration writes the latest value. Ported
/// from the keepalive's binding mode
/// (`set_value_puts_now_or_after_the_put_in_flight`).
#[test]
fn set_value_writes_now_or_after_the_write_in_flight() {
    let t0 = Instant::now();
    let mut r = registration(t0);
    assert_eq!(handle(&mut r, t0, up(L1)), vec![rpc(0, put(0, b"v", L1))]);
    assert_eq!(
        handle(&mut r, t0, RegistrationInput::SetValue(b"v2".to_vec())),
        vec![],
        "waits for the write in flight"
    );
    assert_eq!(
        handle(&mut r, t0, reply(0, written(2))),
        vec![
            state(LivenessState::Registered { lease: L1 }),
            rpc(1, put(2, b"v2", L1))
        ]
    );
    assert_eq!(handle(&mut r, t0, reply(1, written(3))), vec![]);
    assert_eq!(
        handle(&mut r, t0, RegistrationInput::SetValue(b"v3".to_vec())),
        vec![rpc(2, put(3, b"v3", L1))]
    );
    assert_eq!(handle(&mut r, t0, reply(2, written(4))), vec![]);
    assert_eq!(
        handle(
            &mut r,
            t0,
            RegistrationInput::Session(SessionInput::Lost { lease: L1 })
        ),
        vec![state(LivenessState::Lost { lease: L1 })]
    );
    assert_eq!(handle(&mut r, t0, up(L2)), vec![rpc(3, put(0, b"v3", L2))]);
}

/// A failed guard shows the key as it is: ours already (an earlier copy
/// landed) counts as written; one on no lease is taken over, guarded on
/// what was read (one on another process's lease waits: rule 7, the
/// `another_holder_*` tests).
#[test]
fn a_failed_guard_adopts_an_earlier_copy_or_takes_the_key_over() {
    let t0 = Instant::now();
    let mut r = registration(t0);
    assert_eq!(handle(&mut r, t0, up(L1)), vec![rpc(0, put(0, b"v", L1))]);
    let theirs = KeyValue {
        key: KEY.to_vec(),
        value: b"other".to_vec(),
        create_revision: 3,
        mod_revision: 4,
        version: 1,
        lease: 0,
    };
    let refused = |kv: KeyValue| {
        Ok(Response::Txn {
            revision: 6,
            succeeded: false,
            responses: vec![TxnOpResponse::Range { kvs: vec![kv] }],
        })
    };
    assert_eq!(
        handle(&mut r, t0, reply(0, refused(theirs.clone()))),
        vec![rpc(1, put(4, b"v", L1))]
    );
    let ours = KeyValue {
        value: b"v".to_vec(),
        mod_revision: 7,
        lease: L1,
        ..theirs
    };
    assert_eq!(
        handle(&mut r, t0, reply(1, refused(ours))),
        vec![state(LivenessState::Registered { lease: L1 })]
    );
    // The leave is guarded on the revision read.
    assert_eq!(
        handle(&mut r, t0, RegistrationInput::Stop),
        vec![rpc(2, leave(7, L1))]
    );
}

/// Rule 8: "lease not found" for a put is the session's news, told at
/// once (as `Gone` of the lease the put carried); the put is sent again
/// after the backoff, as any failed one.
#[test]
fn lease_not_found_asks_the_session_to_learn_it_and_retries() {
    let t0 = Instant::now();
    let mut r = registration(t0);
    handle(&mut r, t0, up(L1));
    assert_eq!(
        handle(&mut r, t0, reply(0, Err(RpcError::LeaseNotFound))),
        vec![Command::Notify(RegistrationNotice::SessionRequest(
            SessionRequest::Gone(L1)
        ))]
    );
    assert_eq!(r.poll_timeout(), Some(t0 + Duration::from_millis(100)));
}

/// A failed put is sent again after a backoff delay.
#[test]
fn a_failed_put_is_sent_again_after_a_backoff() {
    let t0 = Instant::now();
    let mut r = registration(t0);
    handle(&mut r, t0, up(L1));
    assert_eq!(
        handle(&mut r, t0, reply(0, Err(RpcError::Unavailable("x".into())))),
        vec![]
    );
    let at = t0 + Duration::from_millis(100);
    assert_eq!(r.poll_timeout(), Some(at));
    r.handle_timeout(at);
    assert_eq!(drain(&mut r), vec![rpc(1, put(0, b"v", L1))]);
}

/// Stop writes the leave marker and deletes the key in one guarded txn,
/// then stops without revoking (the lease is the session's).
#[test]
fn stop_leaves_with_the_marker_and_keeps_the_lease() {
    let t0 = Instant::now();
    let mut r = registered(t0);
    assert_eq!(
        handle(&mut r, t0, RegistrationInput::Stop),
        vec![rpc(1, leave(5, L1))]
    );
    assert_eq!(
        handle(&mut r, t0, reply(1, written(6))),
        vec![
            Command::Notify(RegistrationNotice::Left { lease: L1 }),
            state(LivenessState::Stopped { revoked: false }),
        ]
    );
    assert!(r.is_finished());
}

/// A stop while a put is in flight waits for its answer, so the put
/// cannot write the key after the leave.
#[test]
fn a_stop_waits_for_the_put_in_flight() {
    let t0 = Instant::now();
    let mut r = registration(t0);
    handle(&mut r, t0, up(L1));
    assert_eq!(handle(&mut r, t0, RegistrationInput::Stop), vec![]);
    assert_eq!(
        handle(&mut r, t0, reply(0, written(5))),
        vec![rpc(1, leave(5, L1))]
    );
}

/// A leave that keeps failing for `give_up` asks the owner to replace the
/// lease, so the key goes with it.
#[test]
fn a_leave_failing_for_a_ttl_gives_the_lease_up() {
    let t0 = Instant::now();
    let mut r = registered(t0);
    handle(&mut r, t0, RegistrationInput::Stop);
    let mut now = t0;
    let mut id = 1;
    loop {
        let out = handle(
            &mut r,
            now,
            reply(id, Err(RpcError::Unavailable("x".into()))),
        );
        assert_eq!(out, vec![]);
        now = r.poll_timeout().expect("a retry or the give-up");
        r.handle_timeout(now);
        let out = drain(&mut r);
        if now >= t0 + Duration::from_secs(9) {
            assert_eq!(
                out,
                vec![
                    Command::Notify(RegistrationNotice::SessionRequest(SessionRequest::Replace(
                        L1
                    ))),
                    state(LivenessState::Stopped { revoked: false }),
                ]
            );
            break;
        }
        id += 1;
        assert_eq!(out, vec![rpc(id, leave(5, L1))]);
    }
    assert!(r.is_finished());
}

/// The owner closing the session stops the registration at once: its
/// revoke deletes the key.
#[test]
fn a_closed_session_stops_at_once() {
    let t0 = Instant::now();
    let mut r = registered(t0);
    assert_eq!(
        handle(&mut r, t0, RegistrationInput::Session(SessionInput::Closed)),
        vec![state(LivenessState::Stopped { revoked: false })]
    );
    assert!(r.is_finished());
}

/// Detach hands the key over as it stands: no leave, no delete, the lease
/// left alone, the put in flight canceled.
#[test]
fn detach_hands_the_key_over_without_leaving() {
    let t0 = Instant::now();
    let mut r = registered(t0);
    r.handle(t0, RegistrationInput::SetValue(b"w".to_vec()));
    let put_w = drain(&mut r);
    assert_eq!(put_w, vec![rpc(1, put(5, b"w", L1))]);
    assert_eq!(
        handle(&mut r, t0, RegistrationInput::Detach),
        vec![
            Command::Cancel { id: RpcId(1) },
            Command::Notify(RegistrationNotice::Detached(RegistrationPoint {
                lease: L1,
                mod_revision: 5,
                // The first write created the key.
                create_revision: 5,
            })),
            state(LivenessState::Stopped { revoked: false }),
        ]
    );
    assert!(r.is_finished());
    assert_eq!(handle(&mut r, t0, RegistrationInput::Stop), vec![]);
}

#[test]
fn detach_with_nothing_written_or_while_leaving_hands_nothing_over() {
    let t0 = Instant::now();
    let mut r = registration(t0);
    assert_eq!(
        handle(&mut r, t0, RegistrationInput::Detach),
        vec![state(LivenessState::Stopped { revoked: false })]
    );
    let mut r = registered(t0);
    assert_eq!(
        handle(&mut r, t0, RegistrationInput::Stop),
        vec![rpc(1, leave(5, L1))]
    );
    // The leave may have deleted the key already: it is not undone.
    assert_eq!(
        handle(&mut r, t0, RegistrationInput::Detach),
        vec![
            Command::Cancel { id: RpcId(1) },
            state(LivenessState::Stopped { revoked: false }),
        ]
    );
}

fn resumed(t0: Instant) -> Registration {
    let mut r = Registration::resume(
        RegistrationConfig {
            key: KEY.to_vec(),
            value: b"v".to_vec(),
            leave_marker: Some(MARKER.to_vec()),
            companion: Some((INCARNATION.to_vec(), b"1".to_vec())),
            backoff: BackoffConfig::default(),
            give_up: Duration::from_secs(9),
            take_over: false,
        },
        t0,
        7,
        RegistrationPoint {
            lease: L1,
            mod_revision: 5,
            create_revision: 3,
        },
    );
    assert_eq!(drain(&mut r), vec![state(LivenessState::Registering)]);
    r
}

/// On the resumed lease the first write is guarded on the point: the key
/// stays (same create revision), watchers see at most its value change.
#[test]
fn resume_writes_the_key_guarded_on_where_the_earlier_process_left_it() {
    let t0 = Instant::now();
    let mut r = resumed(t0);
    assert_eq!(handle(&mut r, t0, up(L1)), vec![rpc(0, put(5, b"v", L1))]);
    assert_eq!(
        handle(&mut r, t0, reply(0, written(9))),
        vec![state(LivenessState::Registered { lease: L1 })]
    );
}

/// Past the TTL the key is gone: the guard fails, the key reads absent,
/// and the next put creates it on the new lease (watchers saw it expire).
#[test]
fn resume_after_the_key_expired_registers_again_on_the_new_lease() {
    let t0 = Instant::now();
    let mut r = resumed(t0);
    assert_eq!(handle(&mut r, t0, up(L2)), vec![rpc(0, put(5, b"v", L2))]);
    let absent = Ok(Response::Txn {
        revision: 12,
        succeeded: false,
        responses: vec![TxnOpResponse::Range { kvs: vec![] }],
    });
    assert_eq!(
        handle(&mut r, t0, reply(0, absent)),
        vec![rpc(1, put(0, b"v", L2))]
    );
    assert_eq!(
        handle(&mut r, t0, reply(1, written(13))),
        vec![state(LivenessState::Registered { lease: L2 })]
    );
}

/// A put the earlier process gave up at its detach lands after the
/// resume was asked for: the guard on the saved mod revision fails, the
/// key is read (still on the saved lease, with the earlier value) and
/// written again guarded on what was read. Never a delete.
#[test]
fn resume_over_a_late_put_of_the_earlier_process_takes_the_key_over() {
    let t0 = Instant::now();
    let mut r = resumed(t0);
    assert_eq!(handle(&mut r, t0, up(L1)), vec![rpc(0, put(5, b"v", L1))]);
    let late = KeyValue {
        key: KEY.to_vec(),
        value: b"w".to_vec(),
        create_revision: 3,
        mod_revision: 6,
        version: 3,
        lease: L1,
    };
    let refused = Ok(Response::Txn {
        revision: 6,
        succeeded: false,
        responses: vec![TxnOpResponse::Range { kvs: vec![late] }],
    });
    assert_eq!(
        handle(&mut r, t0, reply(0, refused)),
        vec![rpc(1, put(6, b"v", L1))]
    );
    assert_eq!(
        handle(&mut r, t0, reply(1, written(8))),
        vec![state(LivenessState::Registered { lease: L1 })]
    );
}

// Rule 7: another holder of the key.

const THEIRS: LeaseId = 0x99;

fn theirs_at(mod_revision: Revision) -> Result<Response, RpcError> {
    Ok(Response::Txn {
        revision: mod_revision + 1,
        succeeded: false,
        responses: vec![TxnOpResponse::Range {
            kvs: vec![KeyValue {
                key: KEY.to_vec(),
                value: b"other".to_vec(),
                create_revision: 3,
                mod_revision,
                version: 1,
                lease: THEIRS,
            }],
        }],
    })
}

fn ttl_left(ttl_secs: i64) -> Result<Response, RpcError> {
    Ok(Response::LeaseTimeToLive {
        ttl_secs,
        granted_secs: 5,
    })
}

fn look() -> Request {
    Request::LeaseTimeToLive { lease: THEIRS }
}

/// The first put on L1 found the key on `THEIRS`: waiting, first look out.
fn waiting_on_theirs(t0: Instant) -> Registration {
    let mut r = registration(t0);
    assert_eq!(handle(&mut r, t0, up(L1)), vec![rpc(0, put(0, b"v", L1))]);
    assert_eq!(
        handle(
            &mut r,
            t0 + Duration::from_millis(1),
            reply(0, theirs_at(4))
        ),
        vec![
            rpc(1, look()),
            state(LivenessState::Waiting { holder: THEIRS })
        ]
    );
    r
}

/// A crashed predecessor on a shared session: waited for, then the key is
/// written guarded on what this machine last knew (absence), never on the
/// holder's revision, and registered without any failure.
#[test]
fn another_holder_that_crashed_is_waited_for_then_registered() {
    let t0 = Instant::now();
    let mut r = waiting_on_theirs(t0);
    let ms = Duration::from_millis;
    assert_eq!(handle(&mut r, t0 + ms(2), reply(1, ttl_left(2))), vec![]);
    let bound = t0 + ms(2) + ms(2020) + ms(100);
    assert_eq!(r.poll_timeout(), Some(bound));
    r.handle_timeout(bound);
    assert_eq!(drain(&mut r), vec![rpc(2, look())]);
    assert_eq!(
        handle(&mut r, bound + ms(1), reply(2, ttl_left(-1))),
        vec![rpc(3, put(0, b"v", L1))]
    );
    assert_eq!(
        handle(&mut r, bound + ms(2), reply(3, written(9))),
        vec![state(LivenessState::Registered { lease: L1 })]
    );
}

/// A live duplicate: renewed past the bound. `Duplicate`, then `Stopped`
/// (the session stays; nothing was written, so no leave).
#[test]
fn another_holder_renewed_past_its_ttl_is_a_duplicate() {
    let t0 = Instant::now();
    let mut r = waiting_on_theirs(t0);
    let ms = Duration::from_millis;
    assert_eq!(handle(&mut r, t0 + ms(2), reply(1, ttl_left(2))), vec![]);
    let bound = t0 + ms(2) + ms(2020) + ms(100);
    r.handle_timeout(bound);
    assert_eq!(drain(&mut r), vec![rpc(2, look())]);
    assert_eq!(
        handle(&mut r, bound + ms(1), reply(2, ttl_left(4))),
        vec![
            state(LivenessState::Duplicate { holder: THEIRS }),
            state(LivenessState::Stopped { revoked: false }),
        ]
    );
    assert!(r.is_finished());
}

/// The key goes while waiting: the look says the lease is gone, the put
/// goes at once; a key etcd has not deleted yet is looked at again.
#[test]
fn another_holder_gone_while_waiting_registers() {
    let t0 = Instant::now();
    let mut r = waiting_on_theirs(t0);
    let ms = Duration::from_millis;
    assert_eq!(
        handle(&mut r, t0 + ms(2), reply(1, ttl_left(-1))),
        vec![rpc(2, put(0, b"v", L1))]
    );
    // Still there (etcd's expiry loop lags): not put over, looked at again.
    assert_eq!(handle(&mut r, t0 + ms(3), reply(2, theirs_at(4))), vec![]);
    assert_eq!(r.poll_timeout(), Some(t0 + ms(253)));
    r.handle_timeout(t0 + ms(253));
    assert_eq!(drain(&mut r), vec![rpc(3, look())]);
    assert_eq!(
        handle(&mut r, t0 + ms(254), reply(3, ttl_left(-1))),
        vec![rpc(4, put(0, b"v", L1))]
    );
    assert_eq!(
        handle(&mut r, t0 + ms(255), reply(4, written(9))),
        vec![state(LivenessState::Registered { lease: L1 })]
    );
}

/// A leave whose guard finds the key on another process's lease: it was
/// taken over; `Duplicate` says so before `Stopped`, and no `Left`.
#[test]
fn a_leave_that_finds_the_key_taken_over_says_so() {
    let t0 = Instant::now();
    let mut r = registered(t0);
    assert_eq!(
        handle(&mut r, t0, RegistrationInput::Stop),
        vec![rpc(1, leave(5, L1))]
    );
    assert_eq!(
        handle(&mut r, t0, reply(1, theirs_at(7))),
        vec![
            state(LivenessState::Duplicate { holder: THEIRS }),
            state(LivenessState::Stopped { revoked: false }),
        ]
    );
}

/// With `take_over`, a first registration writes over another process's
/// key (guarded on what it read) and then revokes that process's lease
/// once, so it learns it at its next renewal.
#[test]
fn take_over_writes_over_the_holder_then_revokes_its_lease() {
    let t0 = Instant::now();
    let mut r = Registration::new(
        RegistrationConfig {
            key: KEY.to_vec(),
            value: b"v".to_vec(),
            leave_marker: Some(MARKER.to_vec()),
            companion: Some((INCARNATION.to_vec(), b"1".to_vec())),
            backoff: BackoffConfig::default(),
            give_up: Duration::from_secs(9),
            take_over: true,
        },
        t0,
        7,
    );
    let _ = drain(&mut r);
    assert_eq!(handle(&mut r, t0, up(L1)), vec![rpc(0, put(0, b"v", L1))]);
    assert_eq!(
        handle(&mut r, t0, reply(0, theirs_at(4))),
        vec![rpc(1, put(4, b"v", L1))]
    );
    assert_eq!(
        handle(&mut r, t0, reply(1, written(6))),
        vec![
            rpc(2, Request::Revoke { lease: THEIRS }),
            state(LivenessState::Registered { lease: L1 }),
        ]
    );
}

#[test]
fn a_write_refused_for_permission_is_refused_and_stops() {
    let t0 = Instant::now();
    let mut r = registration(t0);
    assert_eq!(handle(&mut r, t0, up(L1)), vec![rpc(0, put(0, b"v", L1))]);
    let error = RpcError::PermissionDenied("no grant on /h/".into());
    assert_eq!(
        handle(&mut r, t0, reply(0, Err(error.clone()))),
        vec![
            state(LivenessState::Refused { error }),
            state(LivenessState::Stopped { revoked: false }),
        ],
        "rule 9: no retry loop"
    );
    assert!(r.is_finished());
}

fn key_on(lease: LeaseId, value: &[u8], mod_revision: Revision) -> KeyValue {
    KeyValue {
        key: KEY.to_vec(),
        value: value.to_vec(),
        create_revision: 3,
        mod_revision,
        version: 2,
        lease,
    }
}

fn guard_failed(kv: Option<KeyValue>) -> Result<Response, RpcError> {
    Ok(Response::Txn {
        revision: 9,
        succeeded: false,
        responses: vec![TxnOpResponse::Range {
            kvs: kv.into_iter().collect(),
        }],
    })
}

#[test]
fn a_resume_on_an_own_lease_refused_by_a_changed_key_asks_for_a_new_lease() {
    let t0 = Instant::now();
    let mut r = resumed(t0);
    r.set_own_lease(true);
    assert_eq!(handle(&mut r, t0, up(L1)), vec![rpc(0, put(5, b"v", L1))]);
    // Written by someone since the detach, on the same lease.
    assert_eq!(
        handle(
            &mut r,
            t0,
            reply(0, guard_failed(Some(key_on(L1, b"other", 7))))
        ),
        vec![Command::Notify(RegistrationNotice::SessionRequest(
            SessionRequest::Replace(L1)
        ))],
        "rule 6: not taken over on the resumed lease; no Lost either"
    );
    assert_eq!(
        handle(
            &mut r,
            t0,
            RegistrationInput::Session(SessionInput::Lost { lease: L1 })
        ),
        vec![]
    );
    assert_eq!(
        handle(&mut r, t0, up(L2)),
        vec![rpc(1, put(7, b"v", L2))],
        "moved to the next lease, guarded on what was read"
    );
    assert_eq!(
        handle(&mut r, t0, reply(1, written(8))),
        vec![state(LivenessState::Registered { lease: L2 })]
    );
}

#[test]
fn a_resume_on_a_shared_lease_takes_a_changed_key_over_where_it_is() {
    let t0 = Instant::now();
    let mut r = resumed(t0);
    assert_eq!(handle(&mut r, t0, up(L1)), vec![rpc(0, put(5, b"v", L1))]);
    assert_eq!(
        handle(
            &mut r,
            t0,
            reply(0, guard_failed(Some(key_on(L1, b"other", 7))))
        ),
        vec![rpc(1, put(7, b"v", L1))],
        "the session's lease is not this machine's to give up"
    );
}

/// The judge alone: only an answer above zero to a look *sent* at or after
/// the expiry bound is a renewal; before it, or 0, looks again; -1 is gone.
#[test]
fn holder_check_judges_only_looks_sent_after_the_expiry_bound() {
    use fleetcoord_sm::holder::{HolderCheck, Step, POLL};
    let t0 = Instant::now();
    let mut c = HolderCheck::new(THEIRS);
    let bound = t0 + Duration::from_millis(3030) + Duration::from_millis(100);
    assert_eq!(c.on_answer(t0, t0, 3), Step::LookAt(bound));
    // Sent before the bound: the lease may simply not have run down.
    assert_eq!(
        c.on_answer(bound - Duration::from_millis(1), bound, 2),
        Step::LookAt(bound + POLL)
    );
    assert_eq!(
        c.on_answer(t0 + Duration::from_secs(1), t0 + Duration::from_secs(1), 2),
        Step::LookAt(bound)
    );
    assert_eq!(
        c.on_answer(bound, bound + Duration::from_millis(1), 0),
        Step::LookAt(bound + Duration::from_millis(1) + POLL)
    );
    assert_eq!(
        c.on_answer(bound, bound + Duration::from_millis(1), 1),
        Step::Live
    );
    assert_eq!(
        c.on_answer(bound, bound + Duration::from_millis(1), -1),
        Step::Gone
    );
    // A lease etcd has no more, at the first look.
    assert_eq!(HolderCheck::new(THEIRS).on_answer(t0, t0, -1), Step::Gone);
    // Huge TTLs saturate instead of overflowing.
    let mut big = HolderCheck::new(THEIRS);
    assert!(matches!(big.on_answer(t0, t0, i64::MAX), Step::LookAt(_)));
}
