//! Exact command sequences of the shard map member ([`ShardMap`]): member
//! `a` of a 4-shard map under `/m/`, on lease `LEASE`, answered by hand.

use crate::support::{delete_event, drain, put_event};
use fleetcoord_sm::shard::*;
use fleetcoord_sm::*;
use std::time::{Duration, Instant};

const PREFIX: &[u8] = b"/m/";
const LEASE: LeaseId = 0x51;
const SHARDS: u32 = 4;
/// The session's trusted lifetime in these tests.
const TRUST: Duration = Duration::from_secs(9);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn config() -> ShardConfig {
    ShardConfig {
        prefix: PREFIX.to_vec(),
        member: b"a".to_vec(),
        weight: 1,
        shards: SHARDS,
        backoff: BackoffConfig {
            initial: ms(100),
            max: ms(1000),
            multiplier: 2,
            jitter_percent: 0,
        },
        attempt_timeout: Duration::from_secs(3600),
        drain: Duration::from_secs(5),
    }
}

type Cmd = Command<ShardNotice>;

fn rpc(id: u64, request: Request) -> Cmd {
    Command::Rpc {
        id: RpcId(id),
        request,
    }
}

fn note(n: ShardNotice) -> Cmd {
    Command::Notify(n)
}

fn answer(m: &mut ShardMap, now: Instant, id: u64, response: Response) -> Vec<Cmd> {
    m.handle(
        now,
        RpcReply {
            id: RpcId(id),
            result: Ok(response),
        }
        .into(),
    );
    drain(m)
}

fn fail(m: &mut ShardMap, now: Instant, id: u64) -> Vec<Cmd> {
    m.handle(
        now,
        RpcReply {
            id: RpcId(id),
            result: Err(RpcError::Unavailable("down".into())),
        }
        .into(),
    );
    drain(m)
}

fn input(m: &mut ShardMap, now: Instant, input: ShardInput) -> Vec<Cmd> {
    m.handle(now, input);
    drain(m)
}

fn txn_ok(revision: Revision) -> Response {
    Response::Txn {
        revision,
        succeeded: true,
        responses: vec![],
    }
}

fn kv(key: Vec<u8>, value: &[u8], create: Revision, lease: LeaseId) -> KeyValue {
    KeyValue {
        key,
        value: value.to_vec(),
        create_revision: create,
        mod_revision: create,
        version: 1,
        lease,
    }
}

fn events(events: Vec<WatchEvent>) -> Response {
    Response::WatchEvents { events }
}

/// A guarded write of the map: a failed guard reads the key (rules 3
/// and 9).
fn guarded(compare: Compare, success: Vec<TxnOp>) -> Request {
    let key = match &compare {
        Compare::CreateRevisionEquals { key, .. } | Compare::ModRevisionEquals { key, .. } => {
            key.clone()
        }
        other => panic!("no guard of the map: {other:?}"),
    };
    Request::Txn(Txn {
        compare: vec![compare],
        success,
        failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(key)))],
    })
}

fn create_rev(key: Vec<u8>, revision: Revision) -> Compare {
    Compare::CreateRevisionEquals { key, revision }
}

/// The create of `shard`'s key by `a` on `lease`.
fn create(shard: u32, lease: LeaseId) -> Request {
    let key = keys::shard_key(PREFIX, shard);
    guarded(
        create_rev(key.clone(), 0),
        vec![TxnOp::Put {
            key,
            value: b"a".to_vec(),
            lease,
        }],
    )
}

/// The guarded delete of `shard`'s key incarnation `token`.
fn delete(shard: u32, token: Revision) -> Request {
    let key = keys::shard_key(PREFIX, shard);
    guarded(
        create_rev(key.clone(), token),
        vec![TxnOp::Delete(KeyRange::Key(key))],
    )
}

fn member_kv(member: &[u8], create: Revision, lease: LeaseId) -> KeyValue {
    kv(keys::member_key(PREFIX, member), b"1", create, lease)
}

fn shard_kv(shard: u32, owner: &[u8], create: Revision, lease: LeaseId) -> KeyValue {
    kv(keys::shard_key(PREFIX, shard), owner, create, lease)
}

/// The shards placement gives to `b` when `a` and `b` are members.
fn shards_of_b() -> Vec<u32> {
    (0..SHARDS)
        .filter(|s| {
            let members: [(&[u8], u32); 2] = [(b"a", 1), (b"b", 1)];
            placement::owner(members, *s) == Some(&b"b"[..])
        })
        .collect()
}

/// Member `a` at `t0`: map read at revision 10 (empty), watch from 11,
/// session up until `t0 + TRUST`, member key written at 11 and seen,
/// creates of all four shards sent (ids 3..=6), none answered yet.
fn joined(t0: Instant) -> ShardMap {
    let mut m = ShardMap::new(config(), t0, 1);
    assert_eq!(drain(&mut m), vec![rpc(0, keys_read())]);
    assert_eq!(
        answer(
            &mut m,
            t0,
            0,
            Response::Range {
                revision: 10,
                kvs: vec![]
            }
        ),
        vec![rpc(1, watch(11))]
    );
    assert_eq!(answer(&mut m, t0, 1, events(vec![])), vec![]);
    let up = ShardInput::SessionUp {
        lease: LEASE,
        trusted_until: t0 + TRUST,
    };
    let member_key = keys::member_key(PREFIX, b"a");
    assert_eq!(
        input(&mut m, t0, up),
        vec![rpc(
            2,
            guarded(
                create_rev(member_key.clone(), 0),
                vec![TxnOp::Put {
                    key: member_key,
                    value: b"1".to_vec(),
                    lease: LEASE
                }]
            )
        )]
    );
    assert_eq!(answer(&mut m, t0, 2, txn_ok(11)), vec![]);
    // Only once the view shows the member key does placement count `a`.
    assert_eq!(
        answer(
            &mut m,
            t0,
            1,
            events(vec![put_event(member_kv(b"a", 11, LEASE))])
        ),
        (0..SHARDS)
            .map(|s| rpc(3 + u64::from(s), create(s, LEASE)))
            .collect::<Vec<_>>()
    );
    m
}

fn keys_read() -> Request {
    Request::Range(RangeRequest::all(KeyRange::Prefix(PREFIX.to_vec())))
}

fn watch(from: Revision) -> Request {
    Request::Watch {
        range: KeyRange::Prefix(PREFIX.to_vec()),
        start_revision: from,
    }
}

/// `joined`, with every create answered: shard `s` created at `12 + s`
/// and seen on the watch.
fn owning_all(t0: Instant) -> ShardMap {
    let mut m = joined(t0);
    for s in 0..SHARDS {
        let token = 12 + i64::from(s);
        assert_eq!(
            answer(&mut m, t0, 3 + u64::from(s), txn_ok(token)),
            vec![note(ShardNotice::Acquired { shard: s, token })]
        );
    }
    let seen = (0..SHARDS)
        .map(|s| put_event(shard_kv(s, b"a", 12 + i64::from(s), LEASE)))
        .collect();
    assert_eq!(answer(&mut m, t0, 1, events(seen)), vec![]);
    assert_eq!(
        m.owned(),
        (0..SHARDS)
            .map(|s| (s, 12 + i64::from(s)))
            .collect::<Vec<_>>()
    );
    m
}

#[test]
fn nothing_is_written_before_the_session_is_up() {
    let t0 = Instant::now();
    let mut m = ShardMap::new(config(), t0, 1);
    assert_eq!(drain(&mut m), vec![rpc(0, keys_read())]);
    // The view shows a member `a` key from an unknown lease and free
    // shards: without a session nothing is created or deleted.
    let kvs = vec![member_kv(b"a", 5, 0x99)];
    assert_eq!(
        answer(&mut m, t0, 0, Response::Range { revision: 10, kvs }),
        vec![rpc(1, watch(11))]
    );
    assert_eq!(m.poll_timeout(), None);
    assert!(m.owned().is_empty());
}

#[test]
fn a_lone_member_creates_every_shard_and_acquires_on_success() {
    let t0 = Instant::now();
    let m = owning_all(t0);
    assert_eq!(m.fence(2), Some(create_rev(keys::shard_key(PREFIX, 2), 14)));
    assert_eq!(m.owner_of(2), Some((&b"a"[..], 14)));
    // Stable membership: nothing more to do but watch the trust deadline.
    assert_eq!(m.poll_timeout(), Some(t0 + TRUST));
}

#[test]
fn a_create_of_a_held_key_is_never_sent() {
    let t0 = Instant::now();
    let mut m = ShardMap::new(config(), t0, 1);
    drain(&mut m);
    // Shard 1 is held by `z` (not a member any more: its lease lingers).
    let kvs = vec![member_kv(b"a", 5, LEASE), shard_kv(1, b"z", 4, 0x77)];
    answer(&mut m, t0, 0, Response::Range { revision: 10, kvs });
    let up = ShardInput::SessionUp {
        lease: LEASE,
        trusted_until: t0 + TRUST,
    };
    assert_eq!(
        input(&mut m, t0, up),
        vec![
            rpc(2, create(0, LEASE)),
            rpc(3, create(2, LEASE)),
            rpc(4, create(3, LEASE)),
        ]
    );
    // Its lease expires: the delete is seen, the create follows.
    assert_eq!(
        answer(
            &mut m,
            t0 + ms(5),
            1,
            events(vec![delete_event(keys::shard_key(PREFIX, 1), 11)])
        ),
        vec![rpc(5, create(1, LEASE))]
    );
}

#[test]
fn a_failed_create_guard_acquires_nothing_and_backs_off() {
    let t0 = Instant::now();
    let mut m = joined(t0);
    let refused = Response::Txn {
        revision: 12,
        succeeded: false,
        responses: vec![],
    };
    assert_eq!(answer(&mut m, t0, 3, refused), vec![]);
    assert_eq!(m.token(0), None);
    assert_eq!(m.poll_timeout(), Some(t0 + ms(100)));
}

#[test]
fn requests_failing_together_are_one_failure_and_hold_back_once() {
    let t0 = Instant::now();
    let mut m = joined(t0);
    // The connection breaks: the four creates sent at t0 fail together.
    let t1 = t0 + ms(10);
    for id in 3..=6 {
        assert_eq!(fail(&mut m, t1, id), vec![]);
    }
    // One outage, one delay (100 ms), not four (100 + 200 + 400 + 800).
    assert_eq!(m.poll_timeout(), Some(t1 + ms(100)));
    m.handle_timeout(t1 + ms(100));
    assert_eq!(
        drain(&mut m),
        (0..SHARDS)
            .map(|s| rpc(7 + u64::from(s), create(s, LEASE)))
            .collect::<Vec<_>>()
    );
    // A request sent after that failure failing is a new failure: the
    // delay doubles.
    let t2 = t1 + ms(150);
    assert_eq!(fail(&mut m, t2, 7), vec![]);
    assert_eq!(m.poll_timeout(), Some(t2 + ms(200)));
    // Its companions, sent with it, fail with it.
    assert_eq!(fail(&mut m, t2 + ms(1), 8), vec![]);
    assert_eq!(m.poll_timeout(), Some(t2 + ms(200)));
}

/// A guarded write whose guard failed, answered with its key as the
/// failure branch read it at `revision`.
fn txn_failed(revision: Revision, read: Option<KeyValue>) -> Response {
    Response::Txn {
        revision,
        succeeded: false,
        responses: vec![TxnOpResponse::Range {
            kvs: read.into_iter().collect(),
        }],
    }
}

/// The member key's put on `lease`, guarded on its mod revision (0: absent).
fn register(lease: LeaseId, mod_revision: Revision) -> Request {
    let key = keys::member_key(PREFIX, b"a");
    let compare = if mod_revision == 0 {
        create_rev(key.clone(), 0)
    } else {
        Compare::ModRevisionEquals {
            key: key.clone(),
            revision: mod_revision,
        }
    };
    guarded(
        compare,
        vec![TxnOp::Put {
            key,
            value: b"1".to_vec(),
            lease,
        }],
    )
}

/// Rules 3 and 9 with a view that stands still (its watch on a member that
/// went silent): the lease was lost and revoked, which deleted every key of
/// the member at revision 20, and the view still shows them. The deletes
/// and the member key's put, guarded on what the view shows, fail; their
/// failure branches read the keys as they are. Neither is an outage: the
/// put goes again at once, guarded on the key's absence, and no delete is
/// sent again before the view reaches revision 20. Before, each failed
/// guard held everything back for a backoff delay, and the put went again
/// guarded on the view's stale mod revision, failing until the view moved
/// (in the soak: 8 s without a member key).
#[test]
fn failed_guards_read_their_key_and_the_member_key_is_put_on_what_was_read() {
    const LEASE2: LeaseId = 0x52;
    let t0 = Instant::now();
    let mut m = owning_all(t0);
    let t1 = t0 + ms(10);
    let lost = input(&mut m, t1, ShardInput::SessionLost);
    assert_eq!(lost.len(), 2 * SHARDS as usize);
    let up = ShardInput::SessionUp {
        lease: LEASE2,
        trusted_until: t1 + TRUST,
    };
    assert_eq!(input(&mut m, t1, up), vec![rpc(11, register(LEASE2, 11))]);
    // The sweep's deletes (ids 7..=10) find their keys gone.
    for id in 7..=10 {
        assert_eq!(answer(&mut m, t1, id, txn_failed(20, None)), vec![]);
    }
    // The put finds the member key gone too, and goes again at once on
    // that.
    assert_eq!(
        answer(&mut m, t1, 11, txn_failed(20, None)),
        vec![rpc(12, register(LEASE2, 0))]
    );
    assert_eq!(answer(&mut m, t1, 12, txn_ok(21)), vec![]);
    // Nothing held back, nothing sent again while the view stands still.
    assert_eq!(m.poll_timeout(), None);
    m.handle_timeout(t1 + ms(500));
    assert_eq!(drain(&mut m), vec![]);
    // The view catches up: every shard is created on the new lease, and
    // no delete goes again.
    let caught_up = (0..SHARDS)
        .map(|s| delete_event(keys::shard_key(PREFIX, s), 20))
        .chain([
            delete_event(keys::member_key(PREFIX, b"a"), 20),
            put_event(member_kv(b"a", 21, LEASE2)),
        ])
        .collect();
    let t2 = t1 + ms(600);
    assert_eq!(
        answer(&mut m, t2, 1, events(caught_up)),
        (0..SHARDS)
            .map(|s| rpc(13 + u64::from(s), create(s, LEASE2)))
            .collect::<Vec<_>>()
    );
}

/// Rule 3: a put whose failure branch reads the member key on a lease
/// this member never held does not write over it; the view decides
/// (rule 12).
#[test]
fn a_failed_member_key_guard_that_reads_another_holder_writes_nothing() {
    const LEASE2: LeaseId = 0x52;
    let t0 = Instant::now();
    let mut m = owning_all(t0);
    let t1 = t0 + ms(10);
    let _ = input(&mut m, t1, ShardInput::SessionLost);
    let up = ShardInput::SessionUp {
        lease: LEASE2,
        trusted_until: t1 + TRUST,
    };
    assert_eq!(input(&mut m, t1, up), vec![rpc(11, register(LEASE2, 11))]);
    let theirs = member_kv(b"a", 20, 0x99);
    assert_eq!(answer(&mut m, t1, 11, txn_failed(20, Some(theirs))), vec![]);
    m.handle_timeout(t1 + ms(500));
    assert_eq!(drain(&mut m), vec![]);
}

#[test]
fn a_join_releases_exactly_the_shards_placed_on_the_joiner() {
    let t0 = Instant::now();
    let mut m = owning_all(t0);
    let moving = shards_of_b();
    assert!(!moving.is_empty() && moving.len() < SHARDS as usize);
    let t1 = t0 + ms(10);
    let deadline = t1 + Duration::from_secs(5);
    assert_eq!(
        answer(
            &mut m,
            t1,
            1,
            events(vec![put_event(member_kv(b"b", 20, 0x62))])
        ),
        moving
            .iter()
            .map(|&shard| note(ShardNotice::Release { shard, deadline }))
            .collect::<Vec<_>>()
    );
    // Still owned while draining.
    let first = moving[0];
    assert_eq!(m.token(first), Some(12 + i64::from(first)));
    assert_eq!(m.poll_timeout(), Some(deadline));
    // The user hands the first back: belief ends, then the guarded delete.
    assert_eq!(
        input(&mut m, t1, ShardInput::Release { shard: first }),
        vec![rpc(7, delete(first, 12 + i64::from(first)))]
    );
    assert_eq!(m.token(first), None);
    // A second release of it changes nothing.
    assert_eq!(
        input(&mut m, t1, ShardInput::Release { shard: first }),
        vec![]
    );
    // The rest are released by the map at the deadline.
    m.handle_timeout(deadline);
    assert_eq!(
        drain(&mut m),
        moving[1..]
            .iter()
            .enumerate()
            .map(|(i, &s)| rpc(8 + i as u64, delete(s, 12 + i64::from(s))))
            .collect::<Vec<_>>()
    );
    let kept: Vec<u32> = (0..SHARDS).filter(|s| !moving.contains(s)).collect();
    assert_eq!(
        m.owned().into_iter().map(|(s, _)| s).collect::<Vec<_>>(),
        kept
    );
}

#[test]
fn a_release_deadline_is_bounded_by_the_trusted_lifetime() {
    let t0 = Instant::now();
    let mut m = owning_all(t0);
    // A renewal with only 2 s of trust: the drain (5 s) is cut to 2 s.
    let t1 = t0 + ms(10);
    assert_eq!(
        input(
            &mut m,
            t1,
            ShardInput::SessionUp {
                lease: LEASE,
                trusted_until: t1 + ms(2000)
            }
        ),
        vec![]
    );
    let deadline = t1 + ms(2000);
    assert_eq!(
        answer(
            &mut m,
            t1,
            1,
            events(vec![put_event(member_kv(b"b", 20, 0x62))])
        ),
        shards_of_b()
            .iter()
            .map(|&shard| note(ShardNotice::Release { shard, deadline }))
            .collect::<Vec<_>>()
    );
}

#[test]
fn session_lost_loses_every_shard_at_once() {
    let t0 = Instant::now();
    let mut m = owning_all(t0);
    // Every belief ends first; then the keys of the lost lease, which
    // nobody believes in any more, are deleted (rule 9) rather than left
    // to hold their shards until etcd expires the lease.
    assert_eq!(
        input(&mut m, t0 + ms(1), ShardInput::SessionLost),
        (0..SHARDS)
            .map(|shard| note(ShardNotice::Lost { shard }))
            .chain((0..SHARDS).map(|s| rpc(7 + u64::from(s), delete(s, 12 + i64::from(s)))))
            .collect::<Vec<_>>()
    );
    assert!(m.owned().is_empty());
}

#[test]
fn belief_ends_at_the_trust_deadline_before_the_timer_fires() {
    let t0 = Instant::now();
    let mut m = owning_all(t0);
    let until = t0 + TRUST;
    // Any input at the deadline instant sees the shards gone.
    assert_eq!(answer(&mut m, until, 1, events(vec![])), vec![]);
    assert_eq!(m.token(0), None);
    assert!(m.owned().is_empty());
    m.handle_timeout(until);
    assert_eq!(
        drain(&mut m),
        (0..SHARDS)
            .map(|shard| note(ShardNotice::Lost { shard }))
            .collect::<Vec<_>>()
    );
    // Renewed too late on the same lease: the keys are still its own and
    // still placed here, so they are believed again with their tokens.
    let later = until + ms(1);
    assert_eq!(
        input(
            &mut m,
            later,
            ShardInput::SessionUp {
                lease: LEASE,
                trusted_until: later + TRUST
            }
        ),
        (0..SHARDS)
            .map(|shard| note(ShardNotice::Acquired {
                shard,
                token: 12 + i64::from(shard)
            }))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_key_seen_deleted_or_recreated_is_lost() {
    let t0 = Instant::now();
    let mut m = owning_all(t0);
    let key0 = keys::shard_key(PREFIX, 0);
    let key1 = keys::shard_key(PREFIX, 1);
    assert_eq!(
        answer(
            &mut m,
            t0,
            1,
            events(vec![
                delete_event(key0, 30),
                delete_event(key1, 31),
                put_event(shard_kv(1, b"z", 32, 0x77)),
            ])
        ),
        vec![
            note(ShardNotice::Lost { shard: 0 }),
            note(ShardNotice::Lost { shard: 1 }),
            // Shard 0 is free and placed here: created again.
            rpc(7, create(0, LEASE)),
        ]
    );
}

#[test]
fn a_create_answered_after_its_key_was_seen_deleted_is_not_believed() {
    let t0 = Instant::now();
    let mut m = joined(t0);
    let key0 = keys::shard_key(PREFIX, 0);
    // The watch shows the create (12) and a delete (13) before the answer.
    answer(
        &mut m,
        t0,
        1,
        events(vec![
            put_event(shard_kv(0, b"a", 12, LEASE)),
            delete_event(key0, 13),
        ]),
    );
    // Not believed; the key is gone and placed here: created again.
    assert_eq!(
        answer(&mut m, t0, 3, txn_ok(12)),
        vec![rpc(7, create(0, LEASE))]
    );
    assert_eq!(m.token(0), None);
}

#[test]
fn a_create_answered_on_a_replaced_lease_is_not_believed_and_swept() {
    let t0 = Instant::now();
    let mut m = joined(t0);
    let new_lease = 0x52;
    let up = ShardInput::SessionUp {
        lease: new_lease,
        trusted_until: t0 + TRUST,
    };
    // The new lease: the member key is put again, guarded on what is seen.
    let member_key = keys::member_key(PREFIX, b"a");
    assert_eq!(
        input(&mut m, t0, up),
        vec![rpc(
            7,
            guarded(
                Compare::ModRevisionEquals {
                    key: member_key.clone(),
                    revision: 11
                },
                vec![TxnOp::Put {
                    key: member_key,
                    value: b"1".to_vec(),
                    lease: new_lease
                }]
            )
        )]
    );
    assert_eq!(answer(&mut m, t0, 3, txn_ok(12)), vec![]);
    assert_eq!(m.token(0), None);
    // Once seen, the key on the old lease is deleted (rule 9).
    assert_eq!(
        answer(
            &mut m,
            t0,
            1,
            events(vec![put_event(shard_kv(0, b"a", 12, LEASE))])
        ),
        vec![rpc(8, delete(0, 12))]
    );
}

#[test]
fn a_create_whose_answer_was_lost_is_adopted_from_the_view() {
    let t0 = Instant::now();
    let mut m = config_with_attempts(t0);
    // Shard 0's create goes unanswered past the attempt timeout.
    m.handle_timeout(t0 + ms(500));
    let cancels: Vec<Cmd> = (2..=5)
        .map(|id| Command::Cancel { id: RpcId(id) })
        .collect();
    assert_eq!(drain(&mut m), cancels);
    // The watch shows it landed: adopted with its create revision.
    assert_eq!(
        answer(
            &mut m,
            t0 + ms(501),
            1,
            events(vec![put_event(shard_kv(0, b"a", 12, LEASE))])
        ),
        vec![note(ShardNotice::Acquired {
            shard: 0,
            token: 12
        })]
    );
    // The others are created again once the backoff has passed.
    m.handle_timeout(t0 + ms(600));
    assert_eq!(
        drain(&mut m),
        vec![
            rpc(6, create(1, LEASE)),
            rpc(7, create(2, LEASE)),
            rpc(8, create(3, LEASE)),
        ]
    );
}

/// A member with a 500 ms attempt timeout whose read showed its member
/// key on `LEASE`: at `SessionUp` it creates all four shards (ids 2..=5).
fn config_with_attempts(t0: Instant) -> ShardMap {
    let mut c = config();
    c.attempt_timeout = ms(500);
    let mut m = ShardMap::new(c, t0, 1);
    drain(&mut m);
    answer(
        &mut m,
        t0,
        0,
        Response::Range {
            revision: 10,
            kvs: vec![member_kv(b"a", 5, LEASE)],
        },
    );
    let up = ShardInput::SessionUp {
        lease: LEASE,
        trusted_until: t0 + TRUST,
    };
    // The member key is current: straight to the creates (ids 2..=5),
    // then the watch of id 1 is answered.
    assert_eq!(
        input(&mut m, t0, up),
        (0..SHARDS)
            .map(|s| rpc(2 + u64::from(s), create(s, LEASE)))
            .collect::<Vec<_>>()
    );
    m
}

#[test]
fn a_released_key_is_never_adopted_again() {
    let t0 = Instant::now();
    let mut m = owning_all(t0);
    let moving = shards_of_b();
    let s = moving[0];
    let t1 = t0 + ms(10);
    answer(
        &mut m,
        t1,
        1,
        events(vec![put_event(member_kv(b"b", 20, 0x62))]),
    );
    let token = 12 + i64::from(s);
    assert_eq!(
        input(&mut m, t1, ShardInput::Release { shard: s }),
        vec![rpc(7, delete(s, token))]
    );
    // `b` leaves before the delete is answered: placement names `a` again,
    // but the key it is deleting is not believed in again.
    let left = answer(
        &mut m,
        t1,
        1,
        events(vec![delete_event(keys::member_key(PREFIX, b"b"), 21)]),
    );
    assert!(
        !left.contains(&note(ShardNotice::Acquired { shard: s, token })),
        "{left:?}"
    );
    // The delete fails; after the backoff it is sent again (the sweep).
    assert_eq!(fail(&mut m, t1, 7), vec![]);
    m.handle_timeout(t1 + ms(100));
    let again = drain(&mut m);
    assert!(
        again
            .iter()
            .any(|c| matches!(c, Command::Rpc { request, .. } if *request == delete(s, token))),
        "{again:?}"
    );
    assert_eq!(m.token(s), None);
}

#[test]
fn leave_releases_everything_then_deletes_the_member_key() {
    let t0 = Instant::now();
    let mut m = owning_all(t0);
    let deadline = t0 + Duration::from_secs(5);
    assert_eq!(
        input(&mut m, t0, ShardInput::Leave),
        (0..SHARDS)
            .map(|shard| note(ShardNotice::Release { shard, deadline }))
            .chain([rpc(
                7,
                guarded(
                    create_rev(keys::member_key(PREFIX, b"a"), 11),
                    vec![TxnOp::Delete(KeyRange::Key(keys::member_key(PREFIX, b"a")))]
                )
            )])
            .collect::<Vec<_>>()
    );
    for s in 0..SHARDS {
        assert_eq!(
            input(&mut m, t0, ShardInput::Release { shard: s }),
            vec![rpc(8 + u64::from(s), delete(s, 12 + i64::from(s)))]
        );
    }
    for id in 7..12 {
        assert_eq!(answer(&mut m, t0, id, txn_ok(40 + id as i64)), vec![]);
    }
    assert!(!m.is_finished());
    // The watch shows every key gone: done, the watch canceled.
    let gone = std::iter::once(delete_event(keys::member_key(PREFIX, b"a"), 47))
        .chain((0..SHARDS).map(|s| delete_event(keys::shard_key(PREFIX, s), 48 + i64::from(s))))
        .collect();
    assert_eq!(
        answer(&mut m, t0, 1, events(gone)),
        vec![Command::Cancel { id: RpcId(1) }]
    );
    assert!(m.is_finished());
}

/// Rule 11: a leave deletes the member key at once, even while a failure
/// holds writes back (rule 10). Before, the delete waited out the hold,
/// and the others went on placing shards on the leaver meanwhile.
#[test]
fn a_leave_deletes_the_member_key_at_once_during_a_hold() {
    let t0 = Instant::now();
    let mut m = joined(t0);
    let t1 = t0 + ms(10);
    assert_eq!(fail(&mut m, t1, 3), vec![]);
    assert_eq!(m.poll_timeout(), Some(t1 + ms(100)));
    let member_key = keys::member_key(PREFIX, b"a");
    assert_eq!(
        input(&mut m, t1 + ms(1), ShardInput::Leave),
        vec![rpc(
            7,
            guarded(
                create_rev(member_key.clone(), 11),
                vec![TxnOp::Delete(KeyRange::Key(member_key))]
            )
        )]
    );
}

#[test]
fn a_broken_watch_reads_again_after_a_backoff_and_keeps_beliefs() {
    let t0 = Instant::now();
    let mut m = owning_all(t0);
    assert_eq!(fail(&mut m, t0, 1), vec![Command::Cancel { id: RpcId(1) }]);
    assert_eq!(m.token(0), Some(12));
    m.handle_timeout(t0 + ms(100));
    assert_eq!(drain(&mut m), vec![rpc(7, keys_read())]);
    // The new read shows shard 3 gone: lost; the rest kept.
    let kvs = vec![
        member_kv(b"a", 11, LEASE),
        shard_kv(0, b"a", 12, LEASE),
        shard_kv(1, b"a", 13, LEASE),
        shard_kv(2, b"a", 14, LEASE),
    ];
    assert_eq!(
        answer(
            &mut m,
            t0 + ms(100),
            7,
            Response::Range { revision: 30, kvs }
        ),
        vec![
            rpc(8, watch(31)),
            note(ShardNotice::Lost { shard: 3 }),
            rpc(9, create(3, LEASE)),
        ]
    );
}

#[test]
fn a_create_answered_after_its_key_was_adopted_and_released_is_not_believed() {
    let t0 = Instant::now();
    let mut m = joined(t0);
    // The watch shows shard 0's key before the create's answer: adopted.
    assert_eq!(
        answer(
            &mut m,
            t0,
            1,
            events(vec![put_event(shard_kv(0, b"a", 12, LEASE))])
        ),
        vec![note(ShardNotice::Acquired {
            shard: 0,
            token: 12
        })]
    );
    let deadline = t0 + Duration::from_secs(5);
    let member_key = keys::member_key(PREFIX, b"a");
    assert_eq!(
        input(&mut m, t0, ShardInput::Leave),
        vec![
            note(ShardNotice::Release { shard: 0, deadline }),
            rpc(
                7,
                guarded(
                    create_rev(member_key.clone(), 11),
                    vec![TxnOp::Delete(KeyRange::Key(member_key))]
                )
            ),
        ]
    );
    assert_eq!(
        input(&mut m, t0, ShardInput::Release { shard: 0 }),
        vec![rpc(8, delete(0, 12))]
    );
    // The create's late success names the key being deleted: not believed.
    assert_eq!(answer(&mut m, t0, 3, txn_ok(12)), vec![]);
    assert_eq!(m.token(0), None);
}

#[test]
fn foreign_keys_under_the_prefix_are_ignored_and_weight_zero_is_never_placed() {
    let t0 = Instant::now();
    let mut m = ShardMap::new(config(), t0, 1);
    drain(&mut m);
    let shards = keys::shard_key(PREFIX, 0);
    let foreign = |suffix: &[u8]| {
        let mut key = shards[..shards.len() - 1].to_vec();
        key.extend_from_slice(suffix);
        kv(key, b"z", 3, 0x77)
    };
    let kvs = vec![
        member_kv(b"a", 5, LEASE),
        // Weight 0: a member that only observes.
        kv(keys::member_key(PREFIX, b"b"), b"0", 6, 0x62),
        // Not shard keys of a 4-shard map: leading zero, out of range,
        // not a number, and a key beside the layout.
        foreign(b"01"),
        foreign(b"4"),
        foreign(b"x"),
        kv([PREFIX, b"other"].concat(), b"", 7, 0),
    ];
    answer(&mut m, t0, 0, Response::Range { revision: 10, kvs });
    let up = ShardInput::SessionUp {
        lease: LEASE,
        trusted_until: t0 + TRUST,
    };
    assert_eq!(
        input(&mut m, t0, up),
        (0..SHARDS)
            .map(|s| rpc(2 + u64::from(s), create(s, LEASE)))
            .collect::<Vec<_>>()
    );
    assert_eq!(m.owner_of(1), None);
    assert_eq!(m.placed_owner(1), Some(&b"a"[..]));
}

// Rule 12: another process holds this member id's key.

const THEIRS: LeaseId = 0x99;

/// Member `a` whose first read shows `a`'s key on `THEIRS` (revision 10):
/// the session comes up, nothing is written and no shard created; the
/// map says why and looks at the holder's lease (id 2).
fn waiting_on_theirs(t0: Instant) -> ShardMap {
    let mut m = ShardMap::new(config(), t0, 1);
    assert_eq!(drain(&mut m), vec![rpc(0, keys_read())]);
    assert_eq!(
        answer(
            &mut m,
            t0,
            0,
            Response::Range {
                revision: 10,
                kvs: vec![member_kv(b"a", 10, THEIRS)]
            }
        ),
        vec![rpc(1, watch(11))]
    );
    let up = ShardInput::SessionUp {
        lease: LEASE,
        trusted_until: t0 + TRUST,
    };
    assert_eq!(
        input(&mut m, t0, up),
        vec![
            note(ShardNotice::Waiting { holder: THEIRS }),
            rpc(2, Request::LeaseTimeToLive { lease: THEIRS }),
        ]
    );
    m
}

fn ttl_left(ttl_secs: i64) -> Response {
    Response::LeaseTimeToLive {
        ttl_secs,
        granted_secs: 5,
    }
}

/// A crashed predecessor with this member id: its lease runs out, the
/// watch shows its key deleted, and only then is the key written (guarded
/// on absence) and shards created.
#[test]
fn another_holder_of_the_member_key_that_crashed_is_waited_for_then_joined() {
    let t0 = Instant::now();
    let mut m = waiting_on_theirs(t0);
    assert_eq!(answer(&mut m, t0 + ms(1), 2, ttl_left(2)), vec![]);
    let bound = t0 + ms(1) + ms(2020) + ms(100);
    assert_eq!(m.poll_timeout(), Some(bound));
    m.handle_timeout(bound);
    assert_eq!(
        drain(&mut m),
        vec![rpc(3, Request::LeaseTimeToLive { lease: THEIRS })]
    );
    // At its end: looked at again, nothing written.
    assert_eq!(answer(&mut m, bound + ms(1), 3, ttl_left(0)), vec![]);
    // etcd expires it; the watch shows the key deleted: the key is written.
    let member_key = keys::member_key(PREFIX, b"a");
    assert_eq!(
        answer(
            &mut m,
            bound + ms(2),
            1,
            events(vec![delete_event(keys::member_key(PREFIX, b"a"), 12)])
        ),
        vec![rpc(
            4,
            guarded(
                create_rev(member_key.clone(), 0),
                vec![TxnOp::Put {
                    key: member_key,
                    value: b"1".to_vec(),
                    lease: LEASE
                }]
            )
        )]
    );
}

/// A live duplicate: renewed past the expiry bound. `Duplicate`, nothing
/// of the other's touched, the map finished.
#[test]
fn another_live_holder_of_the_member_key_is_a_duplicate_and_the_map_ends() {
    let t0 = Instant::now();
    let mut m = waiting_on_theirs(t0);
    assert_eq!(answer(&mut m, t0 + ms(1), 2, ttl_left(2)), vec![]);
    let bound = t0 + ms(1) + ms(2020) + ms(100);
    m.handle_timeout(bound);
    assert_eq!(
        drain(&mut m),
        vec![rpc(3, Request::LeaseTimeToLive { lease: THEIRS })]
    );
    assert_eq!(
        answer(&mut m, bound + ms(1), 3, ttl_left(4)),
        vec![
            note(ShardNotice::Duplicate { holder: THEIRS }),
            Command::Cancel { id: RpcId(1) },
        ]
    );
    assert!(m.is_finished());
    assert!(m.owned().is_empty());
}

/// The key goes while waiting (the look says the lease is gone and the
/// watch shows the delete): joined as usual.
#[test]
fn another_holder_of_the_member_key_gone_while_waiting_joins() {
    let t0 = Instant::now();
    let mut m = waiting_on_theirs(t0);
    assert_eq!(answer(&mut m, t0 + ms(1), 2, ttl_left(-1)), vec![]);
    let commands = answer(
        &mut m,
        t0 + ms(2),
        1,
        events(vec![delete_event(keys::member_key(PREFIX, b"a"), 11)]),
    );
    assert!(
        matches!(commands.as_slice(), [Command::Rpc { id: RpcId(3), .. }]),
        "the member key's put: {commands:?}"
    );
}
