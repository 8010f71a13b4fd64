//! Exact command sequences of an election on a shared session
//! (`Election::on_session`): the session's facts come in as inputs, the
//! protocol's requests for the lease go out as notices.

use crate::election_support::*;
use crate::support::{delete_event, drain};
use fleetcoord_sm::election::*;
use fleetcoord_sm::keepalive::LivenessState;
use fleetcoord_sm::rpc::{
    KeyRange, RangeRequest, Request, Response, RpcError, RpcId, SortOrder, Txn, TxnOp,
};
use fleetcoord_sm::*;
use std::time::{Duration, Instant};

const PREFIX: &[u8] = b"/e/";
/// The protocol's first request id when the election's ids start at 0: the
/// shared part keeps the first 2^32 for the deletes of its stop.
const Q: u64 = 1 << 32;

fn my_key() -> Vec<u8> {
    lease_key(PREFIX)
}

fn priority_key() -> Vec<u8> {
    let mut key = priority_prefix(PREFIX);
    key.extend_from_slice(b"2a1f");
    key
}

fn shared(t0: Instant) -> Election {
    let mut config = election_config(PREFIX, 1);
    config.announce_session_trust = true;
    Election::on_session(config, t0, 7, 0)
}

fn session(e: &mut Election, at: Instant, input: SessionInput) -> Vec<Command<ElectionNotice>> {
    e.handle(at, ElectionInput::Session(input));
    drain(e)
}

fn create_txn() -> Request {
    create_key(
        &my_key(),
        b"a",
        TxnOp::Range(RangeRequest {
            range: KeyRange::Prefix(PREFIX.to_vec()),
            sort: SortOrder::CreateDescending,
            limit: 3,
            max_create_revision: 0,
            revision: 0,
            keys_only: true,
        }),
        TxnOp::Range(RangeRequest {
            range: KeyRange::Prefix(PREFIX.to_vec()),
            sort: SortOrder::CreateAscending,
            limit: 1,
            max_create_revision: 0,
            revision: 0,
            keys_only: true,
        }),
    )
}

fn campaign(e: &mut Election, at: Instant) -> Vec<Command<ElectionNotice>> {
    e.handle(
        at,
        ElectionInput::Campaign {
            op: OpId(1),
            value: b"a".to_vec(),
        },
    );
    drain(e)
}

/// The stop's delete of the own candidate and priority keys.
fn stop_delete() -> Request {
    Request::Txn(Txn {
        compare: vec![],
        success: vec![
            TxnOp::Delete(KeyRange::Key(my_key())),
            TxnOp::Delete(KeyRange::Key(priority_key())),
        ],
        failure: vec![],
    })
}

/// Up and trusted until `t0 + 9 s`, then elected with token 5.
fn elected(t0: Instant) -> Election {
    let mut e = shared(t0);
    let until = t0 + Duration::from_secs(9);
    assert_eq!(
        session(&mut e, t0, SessionInput::Up { lease: LEASE }),
        vec![note(ElectionNotice::Session(LivenessState::Registered {
            lease: LEASE
        }))]
    );
    assert_eq!(
        session(
            &mut e,
            t0,
            SessionInput::Trusted {
                lease: LEASE,
                until
            }
        ),
        vec![note(ElectionNotice::SessionTrusted {
            lease: LEASE,
            until
        })]
    );
    assert_eq!(campaign(&mut e, t0), vec![rpc(Q, create_txn())]);
    assert_eq!(
        ok(&mut e, t0, Q, created_as(kv(&my_key(), b"a", 5), vec![])),
        vec![
            note(ElectionNotice::Elected {
                op: OpId(1),
                key: my_key(),
                token: 5,
                lease: LEASE,
                waited: false,
                attempts: 1,
                trusted_until: until,
            }),
            rpc(Q + 1, watch(&my_key(), 6)),
        ]
    );
    assert_eq!(e.token(), Some(5));
    e
}

#[test]
fn nothing_is_sent_before_the_session_is_up_and_the_campaign_waits_for_it() {
    let t0 = Instant::now();
    let mut e = shared(t0);
    assert!(e.is_on_shared_session());
    assert_eq!(drain(&mut e), vec![], "no grant: the lease is the owner's");
    assert_eq!(e.poll_timeout(), None);
    assert_eq!(campaign(&mut e, t0), vec![]);
    assert_eq!(
        session(&mut e, t0, SessionInput::Up { lease: LEASE }),
        vec![
            note(ElectionNotice::Session(LivenessState::Registered {
                lease: LEASE
            })),
            rpc(Q, create_txn()),
        ]
    );
    assert_eq!(e.my_key(), Some(my_key()));
}

/// Without a `Trusted` for the lease nothing is believed: the `Elected`
/// carries `now` as its deadline, and the first `Trusted` is announced as
/// the leadership's.
#[test]
fn belief_needs_a_deadline_told_by_the_owner() {
    let t0 = Instant::now();
    let mut e = shared(t0);
    session(&mut e, t0, SessionInput::Up { lease: LEASE });
    assert_eq!(campaign(&mut e, t0), vec![rpc(Q, create_txn())]);
    let t1 = t0 + Duration::from_millis(5);
    let elected = ok(&mut e, t1, Q, created_as(kv(&my_key(), b"a", 5), vec![]));
    assert_eq!(
        elected[0],
        note(ElectionNotice::Elected {
            op: OpId(1),
            key: my_key(),
            token: 5,
            lease: LEASE,
            waited: false,
            attempts: 1,
            trusted_until: t1,
        })
    );
    assert!(!e.is_leader(), "no deadline told yet");
    let until = t0 + Duration::from_secs(9);
    assert_eq!(
        session(
            &mut e,
            t1,
            SessionInput::Trusted {
                lease: LEASE,
                until
            }
        ),
        vec![
            note(ElectionNotice::SessionTrusted {
                lease: LEASE,
                until
            }),
            note(ElectionNotice::Trusted { token: 5, until }),
        ]
    );
    assert_eq!(e.token(), Some(5));
}

/// The deadline last told is the one believed: a later one moves belief
/// on, an earlier (stale) one ends it sooner, never later.
#[test]
fn the_deadline_last_told_bounds_belief() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    let later = t0 + Duration::from_secs(12);
    assert_eq!(
        session(
            &mut e,
            t0,
            SessionInput::Trusted {
                lease: LEASE,
                until: later
            }
        ),
        vec![
            note(ElectionNotice::SessionTrusted {
                lease: LEASE,
                until: later
            }),
            note(ElectionNotice::Trusted {
                token: 5,
                until: later
            }),
        ]
    );
    assert_eq!(e.session_deadline(), Some(later));
    let stale = t0 + Duration::from_secs(2);
    session(
        &mut e,
        t0,
        SessionInput::Trusted {
            lease: LEASE,
            until: stale,
        },
    );
    assert_eq!(e.session_deadline(), Some(stale));
    e.handle_timeout(stale - Duration::from_millis(1));
    assert!(e.is_leader());
    e.handle_timeout(stale);
    assert!(!e.is_leader(), "belief ends at the stale deadline");
}

#[test]
fn a_lost_session_ends_the_leadership_at_once_and_a_new_campaign_waits_for_the_next_lease() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(
        session(&mut e, t1, SessionInput::Lost { lease: LEASE }),
        vec![
            note(ElectionNotice::Session(LivenessState::Lost {
                lease: LEASE
            })),
            cancel(Q + 1),
            note(ElectionNotice::LeadershipLost { token: 5 }),
        ]
    );
    assert!(!e.is_leader());
    assert_eq!(e.my_key(), None);
    e.handle(
        t1,
        ElectionInput::Campaign {
            op: OpId(2),
            value: b"a".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![], "no lease: the campaign waits");
}

/// A new lease without a loss told in between still means the old one is
/// gone: the leadership on it ends.
#[test]
fn a_new_lease_ends_the_leadership_on_the_old_one() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    let out = session(&mut e, t0, SessionInput::Up { lease: LEASE + 1 });
    assert_eq!(
        out,
        vec![
            note(ElectionNotice::Session(LivenessState::Lost {
                lease: LEASE
            })),
            cancel(Q + 1),
            note(ElectionNotice::LeadershipLost { token: 5 }),
            note(ElectionNotice::Session(LivenessState::Registered {
                lease: LEASE + 1
            })),
        ]
    );
    assert!(!e.is_leader());
}

/// etcd answering "lease not found" is the lease's end here at once: the
/// owner is asked to learn it (`Gone`), the campaign waits for the next
/// lease, and facts about the gone lease still on their way are ignored.
#[test]
fn a_lease_etcd_does_not_know_is_lost_here_at_once_and_reported_to_the_owner() {
    let t0 = Instant::now();
    let mut e = shared(t0);
    let until = t0 + Duration::from_secs(9);
    session(&mut e, t0, SessionInput::Up { lease: LEASE });
    session(
        &mut e,
        t0,
        SessionInput::Trusted {
            lease: LEASE,
            until,
        },
    );
    assert_eq!(campaign(&mut e, t0), vec![rpc(Q, create_txn())]);
    e.handle(
        t0,
        RpcReply {
            id: RpcId(Q),
            result: Err(RpcError::LeaseNotFound),
        }
        .into(),
    );
    assert_eq!(
        drain(&mut e),
        vec![
            note(ElectionNotice::SessionRequest(SessionRequest::Gone(LEASE))),
            note(ElectionNotice::Session(LivenessState::Lost {
                lease: LEASE
            })),
        ]
    );
    assert_eq!(e.my_key(), None);
    assert_eq!(
        session(
            &mut e,
            t0,
            SessionInput::Trusted {
                lease: LEASE,
                until
            }
        ),
        vec![],
        "a renewal answer of the gone lease changes nothing"
    );
    assert_eq!(e.my_key(), None);
    assert_eq!(
        session(&mut e, t0, SessionInput::Up { lease: LEASE + 1 }),
        vec![
            note(ElectionNotice::Session(LivenessState::Registered {
                lease: LEASE + 1
            })),
            rpc(Q + 1, {
                let mut r = create_txn();
                if let Request::Txn(t) = &mut r {
                    let key = [PREFIX, b"2a20"].concat();
                    t.compare = vec![Compare::CreateRevisionEquals {
                        key: key.clone(),
                        revision: 0,
                    }];
                    t.success[0] = TxnOp::Put {
                        key: key.clone(),
                        value: b"a".to_vec(),
                        lease: LEASE + 1,
                    };
                    t.failure[0] = TxnOp::Range(RangeRequest::all(KeyRange::Key(key)));
                }
                r
            }),
        ]
    );
}

/// A stop on a shared session ends belief first, then deletes the own keys
/// (the lease is the owner's, not revoked), then says it stopped.
#[test]
fn stop_deletes_the_own_keys_and_leaves_the_lease_alone() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(t0, ElectionInput::Stop);
    assert_eq!(
        drain(&mut e),
        vec![
            cancel(Q + 1),
            note(ElectionNotice::LeadershipLost { token: 5 }),
            rpc(0, stop_delete()),
        ]
    );
    assert!(!e.is_leader());
    assert!(!e.is_finished());
    assert_eq!(
        ok(&mut e, t0, 0, txn(6, true, vec![])),
        vec![note(ElectionNotice::Session(LivenessState::Stopped {
            revoked: false
        }))]
    );
    assert!(e.is_finished());
}

/// A stop's delete that fails is sent again after the attempt timeout; one
/// unconfirmed for a TTL gives the lease up instead (`Replace`), so the key
/// goes with it.
#[test]
fn a_stop_delete_unconfirmed_for_a_ttl_asks_for_a_new_lease() {
    let t0 = Instant::now();
    let mut config = election_config(PREFIX, 1);
    config.attempt_timeout = Duration::from_secs(4);
    let mut e = Election::on_session(config, t0, 7, 0);
    session(&mut e, t0, SessionInput::Up { lease: LEASE });
    e.handle(t0, ElectionInput::Stop);
    assert_eq!(drain(&mut e), vec![rpc(0, stop_delete())]);
    e.handle(
        t0,
        RpcReply {
            id: RpcId(0),
            result: Err(RpcError::Unavailable("down".into())),
        }
        .into(),
    );
    assert_eq!(drain(&mut e), vec![]);
    let t4 = t0 + Duration::from_secs(4);
    assert_eq!(e.poll_timeout(), Some(t4));
    e.handle_timeout(t4);
    assert_eq!(drain(&mut e), vec![rpc(1, stop_delete())]);
    let t8 = t4 + Duration::from_secs(4);
    e.handle_timeout(t8);
    assert_eq!(drain(&mut e), vec![cancel(1), rpc(2, stop_delete())]);
    let ttl = t0 + Duration::from_secs(9);
    assert_eq!(e.poll_timeout(), Some(ttl));
    e.handle_timeout(ttl);
    assert_eq!(
        drain(&mut e),
        vec![
            cancel(2),
            note(ElectionNotice::SessionRequest(SessionRequest::Replace(
                LEASE
            ))),
            note(ElectionNotice::Session(LivenessState::Stopped {
                revoked: false
            })),
        ]
    );
    assert!(e.is_finished());
}

/// The owner closing the session stops the election without a delete: the
/// revoke that follows deletes every key of the lease.
#[test]
fn a_closed_session_stops_the_election_without_a_delete() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    assert_eq!(
        session(&mut e, t0, SessionInput::Closed),
        vec![
            cancel(Q + 1),
            note(ElectionNotice::LeadershipLost { token: 5 }),
            note(ElectionNotice::Session(LivenessState::Stopped {
                revoked: false
            })),
        ]
    );
    assert!(e.is_finished());
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
}

/// A delete seen on the leader's own watch ends the leadership, as on an
/// own session; the shared lease is not touched.
#[test]
fn a_deleted_key_ends_the_leadership_and_asks_nothing_of_the_session() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(
        t0,
        RpcReply {
            id: RpcId(Q + 1),
            result: Ok(Response::WatchEvents {
                events: vec![delete_event(my_key(), 7)],
            }),
        }
        .into(),
    );
    let out = drain(&mut e);
    assert!(
        out.contains(&note(ElectionNotice::LeadershipLost { token: 5 })),
        "{out:?}"
    );
    assert!(
        !out.iter()
            .any(|c| matches!(c, Command::Notify(ElectionNotice::SessionRequest(_)))),
        "{out:?}"
    );
    assert_eq!(
        e.my_key(),
        Some(my_key()),
        "the lease is still the session's"
    );
}

/// The loss path that reached a user as `election: Busy`: a shared
/// session ends every belief on its lease before it tells the primitives,
/// so the user's next campaign can reach this machine while it still
/// leads. It waits for the `Lost` that follows, and runs on the next lease.
#[test]
fn a_campaign_that_overtakes_the_session_loss_runs_on_the_next_lease() {
    let t0 = Instant::now();
    let mut e = elected(t0);
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(2),
            value: b"a".to_vec(),
        },
    );
    assert_eq!(drain(&mut e), vec![], "waits for the leadership's end");
    assert_eq!(
        session(&mut e, t0, SessionInput::Lost { lease: LEASE }),
        vec![
            note(ElectionNotice::Session(LivenessState::Lost {
                lease: LEASE
            })),
            cancel(Q + 1),
            note(ElectionNotice::LeadershipLost { token: 5 }),
        ],
        "no lease: the campaign waits, unanswered"
    );
    let next = LEASE + 1;
    let mut key = PREFIX.to_vec();
    key.extend_from_slice(format!("{next:x}").as_bytes());
    let out = session(&mut e, t0, SessionInput::Up { lease: next });
    assert_eq!(
        out[0],
        note(ElectionNotice::Session(LivenessState::Registered {
            lease: next
        }))
    );
    assert!(
        matches!(
            &out[1..],
            [Command::Rpc { id, request: Request::Txn(Txn { success, .. }) }]
                if *id == RpcId(Q + 2)
                    && matches!(success.first(), Some(TxnOp::Put { key: k, lease, .. }) if *k == key && *lease == next)
        ),
        "the campaign's create, on the next lease: {out:?}"
    );
}
