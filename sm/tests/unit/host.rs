//! Exact command sequences of a host registration on its own lease
//! (`Host`: a lease-only keepalive and a registration, composed).

use crate::support::drain;
use fleetcoord_sm::host::*;
use fleetcoord_sm::keepalive::{KeepaliveConfig, LivenessState};
use fleetcoord_sm::registration::RegistrationPoint;
use fleetcoord_sm::rpc::{
    Compare, KeyRange, KeyValue, RangeRequest, Request, Response, RpcError, RpcId, Txn, TxnOp,
    TxnOpResponse,
};
use fleetcoord_sm::*;
use std::time::{Duration, Instant};

const KEY: &[u8] = b"/h/a";
const MARKER: &[u8] = b"/h/a/left";
const L1: LeaseId = 0x11;
const L2: LeaseId = 0x22;
const OTHER: LeaseId = 0x99;
/// The registration's first request id.
const R: u64 = REGISTRATION_FIRST_RPC_ID;

type Cmd = Command<HostNotice>;

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn config() -> HostConfig {
    let backoff = BackoffConfig {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(1),
        multiplier: 2,
        jitter_percent: 0,
    };
    HostConfig {
        lease: KeepaliveConfig {
            ttl_secs: 9,
            backoff: backoff.clone(),
            safety_margin: Duration::ZERO,
            drift_allowance_ppm: 0,
            attempt_timeout: Duration::from_millis(500),
            announce_trust: true,
        },
        key: KEY.to_vec(),
        value: b"v".to_vec(),
        leave_marker: Some(MARKER.to_vec()),
        companion: None,
        take_over: false,
        backoff,
    }
}

fn rpc(id: u64, request: Request) -> Cmd {
    Command::Rpc {
        id: RpcId(id),
        request,
    }
}

fn state(s: LivenessState) -> Cmd {
    Command::Notify(HostNotice::State(s))
}

fn trusted(lease: LeaseId, until: Instant) -> Cmd {
    Command::Notify(HostNotice::Trusted { lease, until })
}

fn reply(id: u64, result: Result<Response, RpcError>) -> HostInput {
    HostInput::Rpc(RpcReply {
        id: RpcId(id),
        result,
    })
}

fn handle(h: &mut Host, at: Instant, input: HostInput) -> Vec<Cmd> {
    h.handle(at, input);
    drain(h)
}

fn granted(lease: LeaseId) -> Result<Response, RpcError> {
    Ok(Response::Granted { lease, ttl_secs: 9 })
}

fn written(revision: Revision) -> Result<Response, RpcError> {
    Ok(Response::Txn {
        revision,
        succeeded: true,
        responses: vec![],
    })
}

fn found(kv: Option<KeyValue>) -> Result<Response, RpcError> {
    Ok(Response::Txn {
        revision: 50,
        succeeded: false,
        responses: vec![TxnOpResponse::Range {
            kvs: kv.into_iter().collect(),
        }],
    })
}

fn key_on(lease: LeaseId, mod_revision: Revision) -> KeyValue {
    KeyValue {
        key: KEY.to_vec(),
        value: b"v".to_vec(),
        create_revision: 5,
        mod_revision,
        version: 1,
        lease,
    }
}

/// The registration's write: guarded on `known`, deleting the leave
/// marker of an earlier registration.
fn put(known: Revision, lease: LeaseId) -> Request {
    Request::Txn(Txn {
        compare: vec![Compare::ModRevisionEquals {
            key: KEY.to_vec(),
            revision: known,
        }],
        success: vec![
            TxnOp::Put {
                key: KEY.to_vec(),
                value: b"v".to_vec(),
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
        ],
        failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(KEY.to_vec())))],
    })
}

/// Registered on L1 (granted at t0) with the key at revision 5.
fn registered(t0: Instant) -> Host {
    let mut h = Host::new(config(), t0, 1);
    assert_eq!(
        drain(&mut h),
        vec![
            rpc(0, Request::Grant { ttl_secs: 9 }),
            state(LivenessState::Registering),
        ],
        "the keepalive's grant first; nothing of the key before a lease"
    );
    assert_eq!(
        handle(&mut h, t0, reply(0, granted(L1))),
        vec![trusted(L1, t0 + s(9)), rpc(R, put(0, L1))],
        "trusted from the grant on (rule 2); the key written on the lease"
    );
    assert_eq!(
        handle(&mut h, t0, reply(R, written(5))),
        vec![state(LivenessState::Registered { lease: L1 })],
        "registered once the key is written, not at the grant"
    );
    h
}

#[test]
fn registers_on_the_granted_lease_once_the_key_is_written() {
    let t0 = Instant::now();
    let mut h = registered(t0);
    // The keepalive renews at a third of the TTL, as alone.
    assert_eq!(h.poll_timeout(), Some(t0 + s(3)));
    h.handle_timeout(t0 + s(3));
    assert_eq!(
        drain(&mut h),
        vec![rpc(1, Request::KeepAlive { lease: L1 })]
    );
}

#[test]
fn stop_leaves_then_revokes_the_lease() {
    let t0 = Instant::now();
    let mut h = registered(t0);
    assert_eq!(
        handle(&mut h, t0, HostInput::Stop),
        vec![rpc(R + 1, leave(5, L1))],
        "the leave first (rule 4); the lease stays until it is answered"
    );
    assert_eq!(handle(&mut h, t0, HostInput::Stop), vec![], "a second stop");
    assert_eq!(
        handle(&mut h, t0, reply(R + 1, written(6))),
        vec![
            Command::Notify(HostNotice::Left { lease: L1 }),
            rpc(1, Request::Revoke { lease: L1 }),
        ]
    );
    assert!(!h.is_finished());
    assert_eq!(
        handle(&mut h, t0, reply(1, Ok(Response::Revoked))),
        vec![state(LivenessState::Stopped { revoked: true })],
        "the keepalive's Stopped is the last state (rule 2)"
    );
    assert!(h.is_finished());
}

#[test]
fn an_unanswered_leave_is_given_up_after_one_attempt_timeout_and_the_lease_revoked() {
    let t0 = Instant::now();
    let mut h = registered(t0);
    assert_eq!(
        handle(&mut h, t0, HostInput::Stop),
        vec![rpc(R + 1, leave(5, L1))]
    );
    assert_eq!(h.poll_timeout(), Some(t0 + Duration::from_millis(500)));
    h.handle_timeout(t0 + Duration::from_millis(500));
    assert_eq!(
        drain(&mut h),
        vec![
            Command::Cancel { id: RpcId(R + 1) },
            rpc(1, Request::Revoke { lease: L1 }),
        ],
        "no leave told, no new lease asked for: the revoke at once"
    );
}

/// Rule 4: after a confirmed leave only the marker is on the lease, so a
/// revoke gone to a silent member gets one copy: the host stops two
/// attempt timeouts after the first, and the lease expires with its TTL.
#[test]
fn after_a_confirmed_leave_the_revoke_gets_one_copy() {
    let t0 = Instant::now();
    let mut h = registered(t0);
    let _ = handle(&mut h, t0, HostInput::Stop);
    let _ = handle(&mut h, t0, reply(R + 1, written(6)));
    let half = Duration::from_millis(500);
    assert_eq!(h.poll_timeout(), Some(t0 + half));
    h.handle_timeout(t0 + half);
    assert_eq!(
        drain(&mut h),
        vec![
            Command::Cancel { id: RpcId(1) },
            rpc(2, Request::Revoke { lease: L1 }),
        ],
        "one copy, once the probes could route around a silent member"
    );
    assert_eq!(h.poll_timeout(), Some(t0 + half + half));
    h.handle_timeout(t0 + half + half);
    assert_eq!(
        drain(&mut h),
        vec![
            Command::Cancel { id: RpcId(2) },
            state(LivenessState::Stopped { revoked: false }),
        ],
        "no second copy: stopped, the marker left to the TTL"
    );
    assert!(h.is_finished());
}

/// The same when the first revoke fails rather than going unanswered: the
/// copy still goes at the attempt timeout, and a second failure stops.
#[test]
fn after_a_confirmed_leave_a_failed_revoke_gets_one_copy() {
    let t0 = Instant::now();
    let mut h = registered(t0);
    let _ = handle(&mut h, t0, HostInput::Stop);
    let _ = handle(&mut h, t0, reply(R + 1, written(6)));
    let down = Err(RpcError::Unavailable("down".into()));
    assert_eq!(handle(&mut h, t0, reply(1, down.clone())), vec![]);
    let half = Duration::from_millis(500);
    h.handle_timeout(t0 + half);
    assert_eq!(
        drain(&mut h),
        vec![
            Command::Cancel { id: RpcId(1) },
            rpc(2, Request::Revoke { lease: L1 }),
        ]
    );
    assert_eq!(
        handle(&mut h, t0 + half, reply(2, down)),
        vec![state(LivenessState::Stopped { revoked: false })]
    );
    assert!(h.is_finished());
}

/// Without a leave the revoke is what makes the host Down at once, so it
/// is sent again after each attempt timeout (keepalive rule 7).
#[test]
fn without_a_leave_the_revoke_is_sent_again() {
    let t0 = Instant::now();
    let mut h = registered(t0);
    let _ = handle(&mut h, t0, HostInput::Stop);
    let half = Duration::from_millis(500);
    h.handle_timeout(t0 + half);
    assert_eq!(
        drain(&mut h),
        vec![
            Command::Cancel { id: RpcId(R + 1) },
            rpc(1, Request::Revoke { lease: L1 }),
        ]
    );
    h.handle_timeout(t0 + half + half);
    assert_eq!(
        drain(&mut h),
        vec![
            Command::Cancel { id: RpcId(1) },
            rpc(2, Request::Revoke { lease: L1 }),
        ],
        "a copy of the revoke, not a stop"
    );
    assert!(!h.is_finished());
}

#[test]
fn a_lease_lost_at_its_deadline_is_revoked_only_once_the_key_moved_off_it() {
    let t0 = Instant::now();
    let mut h = registered(t0);
    // Renewals unanswered until the deadline.
    h.handle_timeout(t0 + s(3));
    assert_eq!(
        drain(&mut h),
        vec![rpc(1, Request::KeepAlive { lease: L1 })]
    );
    h.handle_timeout(t0 + s(6));
    let _ = drain(&mut h);
    let t1 = t0 + s(9);
    h.handle_timeout(t1);
    let lost = drain(&mut h);
    assert!(
        lost.contains(&state(LivenessState::Lost { lease: L1 })),
        "{lost:?}"
    );
    assert!(
        !lost.contains(&rpc(3, Request::Revoke { lease: L1 }))
            && !lost.iter().any(|c| matches!(
                c,
                Command::Rpc {
                    request: Request::Revoke { .. },
                    ..
                }
            )),
        "the lost lease may still hold the key: not revoked yet (rule 3): {lost:?}"
    );
    let grant = lost
        .iter()
        .find_map(|c| match c {
            Command::Rpc {
                id,
                request: Request::Grant { .. },
            } => Some(id.0),
            _ => None,
        })
        .expect("a new grant");
    assert_eq!(
        handle(&mut h, t1, reply(grant, granted(L2))),
        vec![trusted(L2, t1 + s(9)), rpc(R + 1, put(0, L2))],
        "the key went with the lease, as far as this host knows"
    );
    assert_eq!(
        handle(&mut h, t1, reply(R + 1, found(Some(key_on(L1, 5))))),
        vec![rpc(R + 2, put(5, L2))],
        "still on the old lease, which was this host's: moved by a put"
    );
    assert_eq!(
        handle(&mut h, t1, reply(R + 2, written(8))),
        vec![
            state(LivenessState::Registered { lease: L2 }),
            rpc(grant + 1, Request::Revoke { lease: L1 }),
        ],
        "the key is on L2: now the old lease goes"
    );
}

#[test]
fn detach_hands_over_the_lease_and_the_key_without_leave_or_revoke() {
    let t0 = Instant::now();
    let mut h = registered(t0);
    assert_eq!(
        handle(&mut h, t0, HostInput::Detach),
        vec![
            Command::Notify(HostNotice::Detached(RegistrationPoint {
                lease: L1,
                mod_revision: 5,
                create_revision: 5,
            })),
            state(LivenessState::Stopped { revoked: false }),
        ]
    );
    assert!(h.is_finished());
}

#[test]
fn resume_proves_the_lease_then_writes_guarded_on_the_handed_over_revision() {
    let t0 = Instant::now();
    let point = RegistrationPoint {
        lease: L1,
        mod_revision: 5,
        create_revision: 5,
    };
    let mut h = Host::resume(config(), t0, 1, point);
    assert_eq!(
        drain(&mut h),
        vec![
            rpc(0, Request::KeepAlive { lease: L1 }),
            state(LivenessState::Registering),
        ]
    );
    assert_eq!(
        handle(
            &mut h,
            t0,
            reply(0, Ok(Response::KeptAlive { ttl_secs: 9 }))
        ),
        vec![trusted(L1, t0 + s(9)), rpc(R, put(5, L1))],
        "the key kept where it is: guarded on the detached write"
    );
    assert_eq!(
        handle(&mut h, t0, reply(R, written(7))),
        vec![state(LivenessState::Registered { lease: L1 })]
    );
}

#[test]
fn a_refused_write_is_refused_and_the_lease_revoked() {
    let t0 = Instant::now();
    let mut h = Host::new(config(), t0, 1);
    let _ = drain(&mut h);
    let _ = handle(&mut h, t0, reply(0, granted(L1)));
    let error = RpcError::PermissionDenied("no grant".into());
    assert_eq!(
        handle(&mut h, t0, reply(R, Err(error.clone()))),
        vec![
            state(LivenessState::Refused { error }),
            rpc(1, Request::Revoke { lease: L1 }),
        ],
        "no retry loop (registration rule 9); nothing to leave"
    );
}

#[test]
fn a_live_duplicate_ends_the_registration_and_revokes_the_own_lease() {
    let t0 = Instant::now();
    let mut h = Host::new(config(), t0, 1);
    let _ = drain(&mut h);
    let _ = handle(&mut h, t0, reply(0, granted(L1)));
    assert_eq!(
        handle(&mut h, t0, reply(R, found(Some(key_on(OTHER, 3))))),
        vec![
            rpc(R + 1, Request::LeaseTimeToLive { lease: OTHER }),
            state(LivenessState::Waiting { holder: OTHER }),
        ]
    );
    let ttl = |ttl_secs| {
        Ok(Response::LeaseTimeToLive {
            ttl_secs,
            granted_secs: 9,
        })
    };
    // One second left: the expiry bound comes before the first renewal.
    let _ = handle(&mut h, t0, reply(R + 1, ttl(1)));
    // Looked at again past the expiry bound, still renewed: a duplicate.
    let bound = h.poll_timeout().expect("the next look");
    assert!(bound < t0 + s(3), "{bound:?}");
    h.handle_timeout(bound);
    assert_eq!(
        drain(&mut h),
        vec![rpc(R + 2, Request::LeaseTimeToLive { lease: OTHER })]
    );
    assert_eq!(
        handle(&mut h, bound, reply(R + 2, ttl(7))),
        vec![
            state(LivenessState::Duplicate { holder: OTHER }),
            rpc(1, Request::Revoke { lease: L1 }),
        ],
        "nothing of this host's on its lease: revoked (rule 5)"
    );
}

#[test]
fn lease_not_found_on_the_write_loses_the_lease_at_once() {
    let t0 = Instant::now();
    let mut h = Host::new(config(), t0, 1);
    let _ = drain(&mut h);
    let _ = handle(&mut h, t0, reply(0, granted(L1)));
    let out = handle(&mut h, t0, reply(R, Err(RpcError::LeaseNotFound)));
    assert!(
        out.contains(&Command::Cancel { id: RpcId(0) })
            || out.iter().all(|c| !matches!(
                c,
                Command::Rpc {
                    request: Request::KeepAlive { .. },
                    ..
                }
            )),
        "{out:?}"
    );
    // A lease that never renewed counts as a failed registration: the
    // next grant after a backoff delay, not a renewal of the dead lease.
    assert!(
        !out.iter().any(|c| matches!(
            c,
            Command::Rpc {
                request: Request::KeepAlive { .. },
                ..
            }
        )),
        "{out:?}"
    );
    let at = h.poll_timeout().expect("the next grant");
    assert!(at <= t0 + Duration::from_millis(100), "{at:?}");
    h.handle_timeout(at);
    assert_eq!(drain(&mut h), vec![rpc(1, Request::Grant { ttl_secs: 9 })]);
}

#[test]
fn a_lease_found_gone_while_leaving_ends_the_host_without_a_new_lease() {
    let t0 = Instant::now();
    let mut h = registered(t0);
    // A proven lease: one lost would be granted again at once.
    h.handle_timeout(t0 + s(3));
    assert_eq!(
        drain(&mut h),
        vec![rpc(1, Request::KeepAlive { lease: L1 })]
    );
    let t0 = t0 + s(3);
    assert_eq!(
        handle(
            &mut h,
            t0,
            reply(1, Ok(Response::KeptAlive { ttl_secs: 9 }))
        ),
        vec![trusted(L1, t0 + s(9))]
    );
    let _ = handle(&mut h, t0, HostInput::SetValue(b"w".to_vec()));
    // The key went (the lease was revoked behind the machine's back): the
    // write goes again, guarded on absence.
    assert_eq!(handle(&mut h, t0, reply(R + 1, found(None))).len(), 1);
    assert_eq!(
        handle(&mut h, t0, HostInput::Stop),
        vec![],
        "the leave waits for the write in flight"
    );
    assert_eq!(
        handle(&mut h, t0, reply(R + 2, Err(RpcError::LeaseNotFound))),
        vec![
            state(LivenessState::Lost { lease: L1 }),
            state(LivenessState::Stopped { revoked: false }),
        ],
        "no grant after the stop (rule 4), and Stopped is the last state"
    );
    assert!(h.is_finished());
    assert_eq!(h.poll_timeout(), None);
}

#[test]
fn a_resume_refused_by_a_key_written_since_registers_afresh_then_revokes_the_saved_lease() {
    let t0 = Instant::now();
    let point = RegistrationPoint {
        lease: L1,
        mod_revision: 5,
        create_revision: 5,
    };
    let mut h = Host::resume(config(), t0, 1, point);
    let _ = drain(&mut h);
    assert_eq!(
        handle(
            &mut h,
            t0,
            reply(0, Ok(Response::KeptAlive { ttl_secs: 9 }))
        ),
        vec![trusted(L1, t0 + s(9)), rpc(R, put(5, L1))]
    );
    let mut other = key_on(L1, 7);
    other.value = b"other".to_vec();
    assert_eq!(
        handle(&mut h, t0, reply(R, found(Some(other)))),
        vec![rpc(1, Request::Grant { ttl_secs: 9 })],
        "rule 7: the saved lease is given up, without Lost, and not revoked \
         while it holds the key"
    );
    assert_eq!(
        handle(&mut h, t0, reply(1, granted(L2))),
        vec![trusted(L2, t0 + s(9)), rpc(R + 1, put(7, L2))],
        "the key moved to the new lease, guarded on what was read"
    );
    assert_eq!(
        handle(&mut h, t0, reply(R + 1, written(8))),
        vec![
            state(LivenessState::Registered { lease: L2 }),
            rpc(2, Request::Revoke { lease: L1 }),
        ]
    );
}
