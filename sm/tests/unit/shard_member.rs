//! Exact sequences of the shard member (`fleetcoord_sm::shard::member`):
//! an own session driving the map, and a shared session's facts.

use fleetcoord_sm::election::SessionRequest;
use fleetcoord_sm::keepalive::KeepaliveConfig;
use fleetcoord_sm::session::SessionInput;
use fleetcoord_sm::shard::member::{Member, MemberInput, MemberNotice, MAP_FIRST_RPC_ID};
use fleetcoord_sm::shard::ShardConfig;
use fleetcoord_sm::{Command, Machine, Request, Response, RpcId, RpcReply};
use std::time::{Duration, Instant};

fn member(now: Instant) -> Member {
    let session = KeepaliveConfig {
        ttl_secs: 5,
        backoff: Default::default(),
        safety_margin: Duration::from_millis(250),
        drift_allowance_ppm: 10_000,
        attempt_timeout: Duration::from_millis(500),
        announce_trust: true,
    };
    Member::new(session, map_config(), None, now, 7)
}

fn map_config() -> ShardConfig {
    ShardConfig {
        prefix: b"/coord/shards/m/".to_vec(),
        member: b"a".to_vec(),
        weight: 1,
        shards: 2,
        backoff: Default::default(),
        attempt_timeout: Duration::from_millis(500),
        drain: Duration::from_secs(1),
    }
}

fn drain(m: &mut Member) -> Vec<Command<MemberNotice>> {
    std::iter::from_fn(|| m.poll_command()).collect()
}

fn rpc(commands: &[Command<MemberNotice>], pick: fn(&Request) -> bool) -> RpcId {
    commands
        .iter()
        .find_map(|c| match c {
            Command::Rpc { id, request } if pick(request) => Some(*id),
            _ => None,
        })
        .expect("the request")
}

#[test]
fn the_session_drives_the_map_as_the_simulation_composes_them() {
    let t0 = Instant::now();
    let mut m = member(t0);
    let first = drain(&mut m);
    let grant = rpc(&first, |r| matches!(r, Request::Grant { .. }));
    let read = rpc(&first, |r| matches!(r, Request::Range(_)));
    assert!(grant.0 < MAP_FIRST_RPC_ID && read.0 >= MAP_FIRST_RPC_ID);
    m.handle(
        t0,
        MemberInput::Rpc(RpcReply {
            id: read,
            result: Ok(Response::Range {
                revision: 1,
                kvs: vec![],
            }),
        }),
    );
    let _watch = drain(&mut m);
    m.handle(
        t0,
        MemberInput::Rpc(RpcReply {
            id: grant,
            result: Ok(Response::Granted {
                lease: 42,
                ttl_secs: 5,
            }),
        }),
    );
    // The grant's trust reaches the facade, and the map, now trusted,
    // registers the member on that lease.
    let after = drain(&mut m);
    assert!(
        after.iter().any(
            |c| matches!(c, Command::Notify(MemberNotice::Trusted { until, .. }) if *until > t0)
        ),
        "{after:?}"
    );
    let register = after.iter().any(|c| match c {
        Command::Rpc {
            request: Request::Txn(txn),
            ..
        } => txn.success.iter().any(|op| {
            matches!(op, fleetcoord_sm::TxnOp::Put { key, lease: 42, .. } if key == b"/coord/shards/m/members/a")
        }),
        _ => false,
    });
    assert!(register, "{after:?}");
    // Leaving with nothing owned finishes the map once its write is
    // answered (here: refused, so no key of it exists), and only then
    // stops the session: its lease is revoked.
    let register = rpc(&after, |r| matches!(r, Request::Txn(_)));
    m.handle(t0, MemberInput::Leave);
    let leaving = drain(&mut m);
    let revoke = |cs: &[Command<MemberNotice>]| {
        cs.iter().find_map(|c| match c {
            Command::Rpc {
                id,
                request: Request::Revoke { lease: 42 },
            } => Some(*id),
            _ => None,
        })
    };
    assert_eq!(revoke(&leaving), None, "a write is in flight: {leaving:?}");
    m.handle(
        t0,
        MemberInput::Rpc(RpcReply {
            id: register,
            result: Ok(Response::Txn {
                succeeded: false,
                revision: 2,
                responses: vec![],
            }),
        }),
    );
    let stopping = drain(&mut m);
    let revoke = revoke(&stopping).expect("the revoke once the map left");
    m.handle(
        t0,
        MemberInput::Rpc(RpcReply {
            id: revoke,
            result: Ok(Response::Revoked),
        }),
    );
    let last = drain(&mut m);
    assert!(
        last.contains(&Command::Notify(MemberNotice::Stopped { revoked: true })),
        "{last:?}"
    );
    assert!(m.is_finished());
}

#[test]
fn on_a_shared_session_lease_not_found_is_a_loss_at_once_and_the_session_is_told() {
    let t0 = Instant::now();
    let mut m = Member::on_session(map_config(), t0, 7);
    let first = drain(&mut m);
    assert!(
        !first.iter().any(|c| matches!(
            c,
            Command::Rpc {
                request: Request::Grant { .. },
                ..
            }
        )),
        "no lease of its own: {first:?}"
    );
    let read = rpc(&first, |r| matches!(r, Request::Range(_)));
    m.handle(
        t0,
        MemberInput::Rpc(RpcReply {
            id: read,
            result: Ok(Response::Range {
                revision: 1,
                kvs: vec![],
            }),
        }),
    );
    let _watch = drain(&mut m);
    let until = t0 + Duration::from_secs(4);
    m.handle(t0, MemberInput::Session(SessionInput::Up { lease: 42 }));
    m.handle(
        t0,
        MemberInput::Session(SessionInput::Trusted { lease: 42, until }),
    );
    let trusted = drain(&mut m);
    assert!(
        trusted.contains(&Command::Notify(MemberNotice::Trusted { lease: 42, until })),
        "{trusted:?}"
    );
    let write = rpc(&trusted, |r| matches!(r, Request::Txn(_)));
    m.handle(
        t0,
        MemberInput::Rpc(RpcReply {
            id: write,
            result: Err(fleetcoord_sm::RpcError::LeaseNotFound),
        }),
    );
    let gone = drain(&mut m);
    assert!(
        gone.contains(&Command::Notify(MemberNotice::SessionLost)),
        "{gone:?}"
    );
    assert!(
        gone.contains(&Command::Notify(MemberNotice::SessionRequest(
            SessionRequest::Gone(42)
        ))),
        "{gone:?}"
    );
    // A renewal of the gone lease the session answered earlier brings
    // nothing back.
    m.handle(
        t0,
        MemberInput::Session(SessionInput::Trusted { lease: 42, until }),
    );
    let late = drain(&mut m);
    assert!(
        !late
            .iter()
            .any(|c| matches!(c, Command::Notify(MemberNotice::Trusted { .. }))),
        "{late:?}"
    );
    // Closing the session leaves the map; the member ends without a
    // revoke of its own.
    m.handle(t0, MemberInput::Session(SessionInput::Closed));
    let closing = drain(&mut m);
    assert!(
        !closing.iter().any(|c| matches!(
            c,
            Command::Rpc {
                request: Request::Revoke { .. },
                ..
            }
        )),
        "{closing:?}"
    );
}

/// A "lease not found" answer names the lease its request was sent on,
/// not the lease current when it arrives: a register write sent on lease
/// 42, answered after the session moved to lease 43, is about a lease
/// already gone, and must not cost the new one (a loss of every shard and
/// a `Gone(43)` that would end every primitive on the shared session).
#[test]
fn a_late_lease_not_found_for_an_old_lease_ends_nothing_on_the_new_one() {
    let t0 = Instant::now();
    let mut m = Member::on_session(map_config(), t0, 7);
    let first = drain(&mut m);
    let read = rpc(&first, |r| matches!(r, Request::Range(_)));
    m.handle(
        t0,
        MemberInput::Rpc(RpcReply {
            id: read,
            result: Ok(Response::Range {
                revision: 1,
                kvs: vec![],
            }),
        }),
    );
    let _watch = drain(&mut m);
    let until = t0 + Duration::from_secs(4);
    m.handle(
        t0,
        MemberInput::Session(SessionInput::Trusted { lease: 42, until }),
    );
    let old_write = rpc(&drain(&mut m), |r| matches!(r, Request::Txn(_)));
    m.handle(t0, MemberInput::Session(SessionInput::Lost { lease: 42 }));
    m.handle(
        t0,
        MemberInput::Session(SessionInput::Trusted { lease: 43, until }),
    );
    let moved = drain(&mut m);
    assert!(
        moved.contains(&Command::Notify(MemberNotice::Trusted { lease: 43, until })),
        "{moved:?}"
    );
    m.handle(
        t0,
        MemberInput::Rpc(RpcReply {
            id: old_write,
            result: Err(fleetcoord_sm::RpcError::LeaseNotFound),
        }),
    );
    let late = drain(&mut m);
    assert!(
        !late.iter().any(|c| matches!(
            c,
            Command::Notify(MemberNotice::SessionLost | MemberNotice::SessionRequest(_))
        )),
        "lease 43 is not lost for an answer about 42: {late:?}"
    );
    // The same answer for a request on lease 43 is the loss of 43: the
    // map writes again on 43 once its retry is due.
    let mut seen = [moved, late].concat();
    let mut now = t0;
    while !seen.iter().any(|c| on_lease(c, 43)) {
        now = m.poll_timeout().expect("a retry is due");
        assert!(
            now < t0 + Duration::from_secs(4),
            "no write on 43: {seen:?}"
        );
        m.handle_timeout(now);
        seen.extend(drain(&mut m));
    }
    let new_write = seen
        .iter()
        .find_map(|c| match c {
            Command::Rpc {
                id,
                request: Request::Txn(txn),
            } if txn
                .success
                .iter()
                .any(|op| matches!(op, fleetcoord_sm::TxnOp::Put { lease: 43, .. })) =>
            {
                Some(*id)
            }
            _ => None,
        })
        .expect("a write on lease 43");
    m.handle(
        now,
        MemberInput::Rpc(RpcReply {
            id: new_write,
            result: Err(fleetcoord_sm::RpcError::LeaseNotFound),
        }),
    );
    let gone = drain(&mut m);
    assert!(
        gone.contains(&Command::Notify(MemberNotice::SessionRequest(
            SessionRequest::Gone(43)
        ))),
        "{gone:?}"
    );
}

/// Whether `c` sends a write of a key on `lease`.
fn on_lease(c: &Command<MemberNotice>, lease: i64) -> bool {
    matches!(c, Command::Rpc { request: Request::Txn(txn), .. }
        if txn.success.iter().any(|op| matches!(op, fleetcoord_sm::TxnOp::Put { lease: l, .. } if *l == lease)))
}
