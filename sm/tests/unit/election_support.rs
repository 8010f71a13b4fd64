//! Fixtures the election's exact-sequence tests share, with one permit
//! (`election.rs`) and with more (`semaphore.rs`): the two differ only in
//! the key prefix and the number of permits.

use crate::support::drain;
use fleetcoord_sm::election::*;
use fleetcoord_sm::keepalive::LivenessState;
use fleetcoord_sm::rpc::{
    Compare, KeyRange, RangeRequest, Request, Response, RpcId, Txn, TxnOp, TxnOpResponse,
};
use fleetcoord_sm::*;
use std::time::{Duration, Instant};

/// The lease every session of these tests is granted.
pub const LEASE: LeaseId = 0x2a1f;
// The protocol part of an Election numbers its requests from 2^40 (the
// session's from 0), so a reply id alone says which part it belongs to.
pub const P: u64 = 1 << 40;

/// An election (`permits` 1) or semaphore under `prefix`.
pub fn election_config(prefix: &[u8], permits: u32) -> ElectionConfig {
    ElectionConfig {
        prefix: prefix.to_vec(),
        ttl_secs: 9,
        backoff: BackoffConfig {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            multiplier: 2,
            jitter_percent: 0,
        },
        // Exact instants in the tests assume the lease is trusted for its
        // TTL; election.rs's `margin_and_drift_*` cover the other settings.
        safety_margin: Duration::ZERO,
        drift_allowance_ppm: 0,
        // Far beyond every instant the exact sequences reach; election.rs's
        // `attempt_*` tests set their own.
        attempt_timeout: Duration::from_secs(3600),
        // election.rs's `session_trust_*` tests ask for the session's
        // deadline moves.
        announce_session_trust: false,
        permits,
        rw: None,
    }
}

/// The key a candidate of lease `LEASE` creates under `prefix`: the
/// prefix and the lease in lowercase hex.
pub fn lease_key(prefix: &[u8]) -> Vec<u8> {
    [prefix, b"2a1f"].concat()
}

/// An election built from `config` whose session holds lease `LEASE`, at
/// `t0`: the grant asked for and answered.
pub fn registered_with(config: ElectionConfig, t0: Instant) -> Election {
    let mut e = Election::new(config, t0, 7);
    assert_eq!(
        drain(&mut e),
        vec![
            note(ElectionNotice::Session(LivenessState::Registering)),
            rpc(0, Request::Grant { ttl_secs: 9 })
        ]
    );
    assert_eq!(
        answer_grant(&mut e, t0, 0, LEASE),
        vec![note(ElectionNotice::Session(LivenessState::Registered {
            lease: LEASE
        }))]
    );
    e
}

/// Answers the session's grant request `id` at `now` with `lease` (TTL
/// 9 s); what the election queued.
pub fn answer_grant(
    e: &mut Election,
    now: Instant,
    id: u64,
    lease: LeaseId,
) -> Vec<Command<ElectionNotice>> {
    ok(e, now, id, Response::Granted { lease, ttl_secs: 9 })
}

/// Answer request `id` with `response` at `now`; what the election queued.
pub fn ok(
    e: &mut Election,
    now: Instant,
    id: u64,
    response: Response,
) -> Vec<Command<ElectionNotice>> {
    e.handle(
        now,
        RpcReply {
            id: RpcId(id),
            result: Ok(response),
        }
        .into(),
    );
    drain(e)
}

/// A key of lease `LEASE` created (and last written) at `create`.
pub fn kv(key: &[u8], value: &[u8], create: Revision) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        value: value.to_vec(),
        create_revision: create,
        mod_revision: create,
        version: 1,
        lease: LEASE,
    }
}

pub fn rpc(id: u64, request: Request) -> Command<ElectionNotice> {
    Command::Rpc {
        id: RpcId(id),
        request,
    }
}

pub fn cancel(id: u64) -> Command<ElectionNotice> {
    Command::Cancel { id: RpcId(id) }
}

pub fn note(n: ElectionNotice) -> Command<ElectionNotice> {
    Command::Notify(n)
}

pub fn txn(revision: Revision, succeeded: bool, responses: Vec<TxnOpResponse>) -> Response {
    Response::Txn {
        revision,
        succeeded,
        responses,
    }
}

/// The answer to a create that made `mine`, at its revision: the newest
/// keys, mine first, then those `ahead` of me, newest first.
pub fn created_as(mine: KeyValue, ahead: Vec<KeyValue>) -> Response {
    let revision = mine.create_revision;
    let mut kvs = vec![mine];
    kvs.extend(ahead);
    txn(
        revision,
        true,
        vec![TxnOpResponse::Put, TxnOpResponse::Range { kvs }],
    )
}

/// Create `key` with `value` (unless it exists) and, in the same
/// revision, read `on_created` if it was created, or the key and
/// `on_existing` if it was there already.
pub fn create_key(key: &[u8], value: &[u8], on_created: TxnOp, on_existing: TxnOp) -> Request {
    Request::Txn(Txn {
        compare: vec![Compare::CreateRevisionEquals {
            key: key.to_vec(),
            revision: 0,
        }],
        success: vec![
            TxnOp::Put {
                key: key.to_vec(),
                value: value.to_vec(),
                lease: LEASE,
            },
            on_created,
        ],
        failure: vec![
            TxnOp::Range(RangeRequest::all(KeyRange::Key(key.to_vec()))),
            on_existing,
        ],
    })
}

/// A delete of `key`, guarded by its create revision `rev`.
pub fn guarded_delete(key: &[u8], rev: Revision) -> Request {
    Request::Txn(Txn {
        compare: vec![Compare::CreateRevisionEquals {
            key: key.to_vec(),
            revision: rev,
        }],
        success: vec![TxnOp::Delete(KeyRange::Key(key.to_vec()))],
        failure: vec![],
    })
}

/// A watch of the one key `key`, from `start_revision`.
pub fn watch(key: &[u8], start_revision: Revision) -> Request {
    Request::Watch {
        range: KeyRange::Key(key.to_vec()),
        start_revision,
    }
}
