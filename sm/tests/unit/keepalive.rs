//! Exact command sequences and instants of the keepalive machine.

use crate::support::drain;
use fleetcoord_sm::keepalive::*;
use fleetcoord_sm::*;
#[allow(unused_imports)]
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::time::{Duration, Instant};

const TTL: i64 = 9;
const LEASE: LeaseId = 7;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// 100 ms doubling to 1 s, no jitter: every retry instant is exact.
fn flat_backoff() -> BackoffConfig {
    BackoffConfig {
        initial: ms(100),
        max: s(1),
        multiplier: 2,
        jitter_percent: 0,
    }
}

fn config(binding: bool) -> KeepaliveConfig {
    KeepaliveConfig {
        ttl_secs: TTL,
        binding: binding.then(|| Binding {
            key: b"/coord/hosts/a".to_vec(),
            value: b"v1".to_vec(),
            // `leave_*` tests set one.
            leave_marker: None,
            companion: None,
            take_over: false,
        }),
        backoff: flat_backoff(),
        // The exact instants below trust a lease for its whole TTL; the
        // `margin_*` tests cover a safety margin and a drift allowance.
        safety_margin: Duration::ZERO,
        drift_allowance_ppm: 0,
        // No copies: the exact sequences below give up after one TTL;
        // `attempt_*` tests set their own.
        attempt_timeout: Duration::ZERO,
        // `trust_*` tests ask for the deadline's moves.
        announce_trust: false,
    }
}

type Cmd = Command<KeepaliveNotice>;

fn rpc(id: u64, request: Request) -> Cmd {
    Command::Rpc {
        id: RpcId(id),
        request,
    }
}

fn ok(id: u64, response: Response) -> KeepaliveInput {
    KeepaliveInput::Rpc(RpcReply {
        id: RpcId(id),
        result: Ok(response),
    })
}

fn err(id: u64) -> KeepaliveInput {
    KeepaliveInput::Rpc(RpcReply {
        id: RpcId(id),
        result: Err(RpcError::Unavailable("stream broke".into())),
    })
}

/// etcd's answer to the first grant: `LEASE`, TTL 9 s.
fn grant_reply() -> KeepaliveInput {
    ok(
        0,
        Response::Granted {
            lease: LEASE,
            ttl_secs: TTL,
        },
    )
}

fn registered() -> Cmd {
    Command::Notify(KeepaliveNotice::State(LivenessState::Registered {
        lease: LEASE,
    }))
}

/// The first put of the key: guarded on its absence (mod revision 0).
fn put(id: u64, value: &[u8]) -> Cmd {
    put_after(id, value, 0)
}

/// A put of the key on `LEASE`, guarded on its mod revision being
/// `revision` (as the machine last saw it), reading it otherwise.
fn put_after(id: u64, value: &[u8], revision: i64) -> Cmd {
    put_on(id, value, revision, LEASE)
}

fn put_on(id: u64, value: &[u8], revision: i64, lease: LeaseId) -> Cmd {
    let key = b"/coord/hosts/a".to_vec();
    rpc(
        id,
        Request::Txn(Txn {
            compare: vec![Compare::ModRevisionEquals {
                key: key.clone(),
                revision,
            }],
            success: vec![TxnOp::Put {
                key: key.clone(),
                value: value.to_vec(),
                lease,
            }],
            failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(key)))],
        }),
    )
}

/// etcd's answer to a put whose guard held, written at `revision`.
fn written(revision: i64) -> Response {
    Response::Txn {
        revision,
        succeeded: true,
        responses: vec![TxnOpResponse::Put],
    }
}

/// A lease-only machine granted `LEASE` (TTL 9 s) by a reply at t0 + 10 ms.
fn granted(t0: Instant) -> Keepalive {
    granted_with(config(false), t0)
}

/// [`granted`] with `config` (lease-only).
fn granted_with(config: KeepaliveConfig, t0: Instant) -> Keepalive {
    let mut m = Keepalive::new(config, t0, 1);
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
            rpc(0, Request::Grant { ttl_secs: TTL })
        ]
    );
    m.handle(t0 + ms(10), grant_reply());
    assert_eq!(drain(&mut m), vec![registered()]);
    m
}

#[test]
fn lease_only_registers_and_renews_at_a_third_of_the_ttl() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    assert_eq!(m.lease(), Some(LEASE));
    // Deadline from the grant's send time, not the reply's arrival.
    assert_eq!(m.local_deadline(), Some(t0 + s(9)));
    assert_eq!(m.poll_timeout(), Some(t0 + s(3)));

    m.handle_timeout(t0 + s(2));
    assert_eq!(drain(&mut m), vec![]);
    m.handle_timeout(t0 + s(3));
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::KeepAlive { lease: LEASE })]
    );
    // No second renewal while one is outstanding: the timer now gives up
    // halfway to the deadline.
    assert_eq!(m.poll_timeout(), Some(t0 + s(6)));

    m.handle(t0 + ms(3500), ok(1, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(m.local_deadline(), Some(t0 + s(12)));
    assert_eq!(m.poll_timeout(), Some(t0 + s(6)));

    m.handle_timeout(t0 + s(6));
    assert_eq!(
        drain(&mut m),
        vec![rpc(2, Request::KeepAlive { lease: LEASE })]
    );
}

#[test]
fn a_late_ack_renews_at_once_and_uses_the_replied_ttl() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    m.handle_timeout(t0 + s(3));
    let _ = drain(&mut m);
    // The ack arrives late: deadline t0+12 from the send time; t0+3+3 s has
    // already passed, so the next renewal is due at once.
    m.handle(t0 + s(8), ok(1, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(m.local_deadline(), Some(t0 + s(12)));
    assert_eq!(m.poll_timeout(), Some(t0 + s(8)));
    m.handle_timeout(t0 + s(8));
    assert_eq!(
        drain(&mut m),
        vec![rpc(2, Request::KeepAlive { lease: LEASE })]
    );
    // Its give-up instant is half of the remaining 4 s.
    assert_eq!(m.poll_timeout(), Some(t0 + s(10)));
    // A shorter TTL in the reply shortens both the deadline and the period.
    m.handle(t0 + ms(8100), ok(2, Response::KeptAlive { ttl_secs: 3 }));
    assert_eq!(m.local_deadline(), Some(t0 + s(11)));
    assert_eq!(m.poll_timeout(), Some(t0 + s(9)));
}

#[test]
fn an_ack_after_the_deadline_it_implies_loses_the_lease() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    m.handle_timeout(t0 + s(3));
    let _ = drain(&mut m);
    // Sent at t0+3 with TTL 2: trusted until t0+5 only, and now is t0+5.
    m.handle(t0 + s(5), ok(1, Response::KeptAlive { ttl_secs: 2 }));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Lost { lease: LEASE })),
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
            rpc(2, Request::Grant { ttl_secs: TTL }),
        ]
    );
}

fn trusted(until: Instant) -> Cmd {
    Command::Notify(KeepaliveNotice::Trusted {
        lease: LEASE,
        until,
    })
}

#[test]
fn trust_is_told_after_the_grant_and_each_answered_renewal_only() {
    let t0 = Instant::now();
    let config = KeepaliveConfig {
        announce_trust: true,
        ..config(false)
    };
    let mut m = Keepalive::new(config, t0, 1);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), grant_reply());
    // The state change first, then the deadline it came with.
    assert_eq!(drain(&mut m), vec![registered(), trusted(t0 + s(9))]);
    m.handle_timeout(t0 + s(3));
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::KeepAlive { lease: LEASE })]
    );
    // An answered renewal: the deadline moves, the state does not.
    m.handle(t0 + ms(3100), ok(1, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(drain(&mut m), vec![trusted(t0 + s(12))]);
    // A failed one moves nothing: only the state is told.
    m.handle_timeout(t0 + s(6));
    let _ = drain(&mut m);
    m.handle(t0 + ms(6100), err(2));
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Suspended { lease: LEASE }
        ))]
    );
    // Without `announce_trust` the same answers tell states only.
    let mut quiet = granted(t0);
    quiet.handle_timeout(t0 + s(3));
    let _ = drain(&mut quiet);
    quiet.handle(t0 + ms(3100), ok(1, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(drain(&mut quiet), vec![]);
}

#[test]
fn trust_in_binding_mode_is_told_from_the_grant_before_the_key_is_written() {
    let t0 = Instant::now();
    let config = KeepaliveConfig {
        announce_trust: true,
        ..config(true)
    };
    let mut m = Keepalive::new(config, t0, 1);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), grant_reply());
    // The lease is held, its key not yet written: a user pairs the deadline
    // with the state (`Registering` still).
    assert_eq!(drain(&mut m), vec![put(1, b"v1"), trusted(t0 + s(9))]);
    m.handle(t0 + ms(20), ok(1, written(5)));
    assert_eq!(drain(&mut m), vec![registered()]);
}

#[test]
fn binding_mode_puts_the_key_before_registered() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(config(true), t0, 1);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), grant_reply());
    assert_eq!(drain(&mut m), vec![put(1, b"v1")]);
    assert_eq!(m.state(), &LivenessState::Registering);
    assert_eq!(m.lease(), None);
    assert_eq!(m.local_deadline(), Some(t0 + s(9)));
    m.handle(t0 + ms(20), ok(1, written(5)));
    assert_eq!(drain(&mut m), vec![registered()]);
    assert_eq!(m.lease(), Some(LEASE));
    assert_eq!(m.poll_timeout(), Some(t0 + s(3)));
}

#[test]
fn put_failures_retry_on_the_same_lease_with_backoff() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(config(true), t0, 1);
    let _ = drain(&mut m);
    m.handle(t0, grant_reply());
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), err(1));
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(m.poll_timeout(), Some(t0 + ms(110)));
    m.handle_timeout(t0 + ms(110));
    assert_eq!(drain(&mut m), vec![put(2, b"v1")]);
    m.handle(
        t0 + ms(120),
        ok(
            2,
            Response::Range {
                revision: 1,
                kvs: vec![],
            },
        ),
    );
    assert_eq!(m.poll_timeout(), Some(t0 + ms(320)));
    m.handle_timeout(t0 + ms(320));
    assert_eq!(drain(&mut m), vec![put(3, b"v1")]);
    m.handle(t0 + ms(330), ok(3, written(9)));
    assert_eq!(drain(&mut m), vec![registered()]);
}

#[test]
fn put_rejected_for_a_missing_lease_loses_it_and_regrants_after_backoff() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(config(true), t0, 1);
    let _ = drain(&mut m);
    m.handle(t0, grant_reply());
    let _ = drain(&mut m);
    let reply = RpcReply {
        id: RpcId(1),
        result: Err(RpcError::LeaseNotFound),
    };
    m.handle(t0 + ms(10), reply.into());
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Lost { lease: LEASE })),
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
        ]
    );
    assert_eq!(m.local_deadline(), None);
    assert_eq!(m.poll_timeout(), Some(t0 + ms(110)));
    m.handle_timeout(t0 + ms(110));
    assert_eq!(
        drain(&mut m),
        vec![rpc(2, Request::Grant { ttl_secs: TTL })]
    );
}

#[test]
fn only_the_lease_not_found_variant_loses_the_lease_not_its_wording() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(config(true), t0, 1);
    let _ = drain(&mut m);
    m.handle(t0, grant_reply());
    let _ = drain(&mut m);
    // Rejected for some other reason, whatever the text says: the put is
    // retried on the same lease.
    let reply = RpcReply {
        id: RpcId(1),
        result: Err(RpcError::Rejected(
            "etcdserver: requested lease not found".into(),
        )),
    };
    m.handle(t0 + ms(10), reply.into());
    assert_eq!(drain(&mut m), vec![], "no Lost");
    m.handle_timeout(t0 + ms(110));
    assert_eq!(drain(&mut m), vec![put(2, b"v1")]);
}

#[test]
fn permission_denied_is_refused_once_and_stops_revoking_the_lease() {
    let denied = || RpcError::PermissionDenied("etcdserver: permission denied".into());
    // On the put: the lease granted for it is revoked.
    let t0 = Instant::now();
    let mut m = Keepalive::new(config(true), t0, 1);
    let _ = drain(&mut m);
    m.handle(t0, grant_reply());
    let _ = drain(&mut m);
    let reply = RpcReply {
        id: RpcId(1),
        result: Err(denied()),
    };
    m.handle(t0 + ms(10), reply.into());
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Refused {
                error: denied()
            })),
            rpc(2, Request::Revoke { lease: LEASE }),
        ]
    );
    m.handle(t0 + ms(20), ok(2, Response::Revoked));
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Stopped { revoked: true }
        ))]
    );
    assert!(m.is_finished());

    // On the grant: nothing to revoke.
    let mut m = Keepalive::new(config(false), t0, 1);
    let _ = drain(&mut m);
    let reply = RpcReply {
        id: RpcId(0),
        result: Err(denied()),
    };
    m.handle(t0 + ms(10), reply.into());
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Refused {
                error: denied()
            })),
            Command::Notify(KeepaliveNotice::State(LivenessState::Stopped {
                revoked: false
            })),
        ]
    );
    assert_eq!(m.poll_timeout(), None);
}

#[test]
fn renewal_errors_suspend_once_and_retry_with_backoff_until_acked() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    m.handle_timeout(t0 + s(3));
    let _ = drain(&mut m);
    m.handle(t0 + s(3), err(1));
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Suspended { lease: LEASE }
        ))]
    );
    assert_eq!(m.lease(), Some(LEASE));
    assert_eq!(m.poll_timeout(), Some(t0 + ms(3100)));
    m.handle_timeout(t0 + ms(3100));
    assert_eq!(
        drain(&mut m),
        vec![rpc(2, Request::KeepAlive { lease: LEASE })]
    );
    m.handle(t0 + ms(3100), err(2));
    assert_eq!(drain(&mut m), vec![], "Suspended is notified once");
    assert_eq!(m.poll_timeout(), Some(t0 + ms(3300)));
    m.handle_timeout(t0 + ms(3300));
    assert_eq!(
        drain(&mut m),
        vec![rpc(3, Request::KeepAlive { lease: LEASE })]
    );
    m.handle(t0 + ms(3400), ok(3, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(drain(&mut m), vec![registered()]);
    assert_eq!(m.local_deadline(), Some(t0 + ms(12300)));
    // Backoff was reset: the next failure waits the initial delay again.
    m.handle_timeout(t0 + ms(6300));
    let _ = drain(&mut m);
    m.handle(t0 + ms(6300), err(4));
    let _ = drain(&mut m);
    assert_eq!(m.poll_timeout(), Some(t0 + ms(6400)));
}

#[test]
fn jittered_retry_instants_follow_the_seeded_schedule() {
    let t0 = Instant::now();
    let seed = 99;
    let mut cfg = config(false);
    cfg.backoff = BackoffConfig::default();
    let mut m = Keepalive::new(cfg.clone(), t0, seed);
    let _ = drain(&mut m);
    // Seed derivation: registration first, renewal second.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let register = Backoff::new(cfg.backoff.clone(), rng.next_u64());
    let renew = Backoff::new(cfg.backoff.clone(), rng.next_u64());
    let mut now = t0;
    for n in 0..3 {
        m.handle(now, err(n));
        assert_eq!(drain(&mut m), vec![]);
        now += register.delay_for(n as u32);
        assert_eq!(m.poll_timeout(), Some(now));
        m.handle_timeout(now);
        assert_eq!(
            drain(&mut m),
            vec![rpc(n + 1, Request::Grant { ttl_secs: TTL })]
        );
    }
    m.handle(
        now,
        ok(
            3,
            Response::Granted {
                lease: LEASE,
                ttl_secs: TTL,
            },
        ),
    );
    let _ = drain(&mut m);
    now += s(3);
    m.handle_timeout(now);
    assert_eq!(
        drain(&mut m),
        vec![rpc(4, Request::KeepAlive { lease: LEASE })]
    );
    m.handle(now, err(4));
    let _ = drain(&mut m);
    assert_eq!(m.poll_timeout(), Some(now + renew.delay_for(0)));
    assert_ne!(
        register.delay_for(0),
        renew.delay_for(0),
        "independent jitter streams"
    );
}

#[test]
fn deadline_passing_loses_the_lease_and_regrants_at_once() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    m.handle_timeout(t0 + s(3));
    let _ = drain(&mut m);
    // No reply: give up at t0+6 and retry after 100 ms, 200 ms, ...
    m.handle_timeout(t0 + s(6));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(1) },
            Command::Notify(KeepaliveNotice::State(LivenessState::Suspended {
                lease: LEASE
            })),
        ]
    );
    let mut id = 2;
    let mut now = t0 + s(6);
    while let Some(at) = m.poll_timeout().filter(|at| *at < t0 + s(9)) {
        now = at;
        m.handle_timeout(now);
        assert_eq!(
            drain(&mut m),
            vec![rpc(id, Request::KeepAlive { lease: LEASE })]
        );
        m.handle(now, err(id));
        id += 1;
    }
    // 100+200+400+800+1000 ms = 2.5 s of retries fit before t0+9; the next
    // (1 s later, t0+9.5) would not, so none is scheduled.
    assert_eq!(now, t0 + ms(8500));
    assert_eq!(m.poll_timeout(), Some(t0 + s(9)));
    m.handle_timeout(t0 + s(9));
    // etcd may still hold the lease (only the answers were lost): it is
    // revoked on the way out.
    assert_eq!(
        drain(&mut m),
        vec![
            rpc(id, Request::Revoke { lease: LEASE }),
            Command::Notify(KeepaliveNotice::State(LivenessState::Lost { lease: LEASE })),
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
            rpc(id + 1, Request::Grant { ttl_secs: TTL }),
        ]
    );
    assert_eq!(m.lease(), None);
    assert_eq!(m.local_deadline(), None);
}

#[test]
fn ttl_zero_loses_the_lease() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    m.handle_timeout(t0 + s(3));
    let _ = drain(&mut m);
    m.handle(t0 + ms(3001), ok(1, Response::KeptAlive { ttl_secs: TTL }));
    m.handle_timeout(t0 + s(6));
    let _ = drain(&mut m);
    m.handle(t0 + ms(6001), ok(2, Response::KeptAlive { ttl_secs: 0 }));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Lost { lease: LEASE })),
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
            rpc(3, Request::Grant { ttl_secs: TTL }),
        ]
    );
}

#[test]
fn ttl_zero_on_a_lease_that_never_renewed_backs_off() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    m.handle_timeout(t0 + s(3));
    let _ = drain(&mut m);
    m.handle(t0 + s(3), ok(1, Response::KeptAlive { ttl_secs: 0 }));
    assert_eq!(drain(&mut m).len(), 2);
    assert_eq!(m.poll_timeout(), Some(t0 + ms(3100)));
}

#[test]
fn set_value_puts_now_or_after_the_put_in_flight() {
    let t0 = Instant::now();
    let mut m = granted_with_put_in_flight(t0);
    m.handle(t0, KeepaliveInput::SetValue(b"v2".to_vec()));
    assert_eq!(drain(&mut m), vec![], "waits for the put in flight");
    m.handle(t0 + ms(1), ok(1, written(2)));
    // Each put is guarded on the revision the one before wrote.
    assert_eq!(drain(&mut m), vec![registered(), put_after(2, b"v2", 2)]);
    m.handle(t0 + ms(2), ok(2, written(3)));
    assert_eq!(drain(&mut m), vec![]);
    m.handle(t0 + ms(3), KeepaliveInput::SetValue(b"v3".to_vec()));
    assert_eq!(drain(&mut m), vec![put_after(3, b"v3", 3)]);
    m.handle(t0 + ms(4), ok(3, written(4)));
    // A re-registration uses the latest value.
    m.handle_timeout(t0 + s(3));
    assert_eq!(
        drain(&mut m),
        vec![rpc(4, Request::KeepAlive { lease: LEASE })]
    );
    m.handle(t0 + s(3), ok(4, Response::KeptAlive { ttl_secs: TTL }));
    m.handle_timeout(t0 + s(6));
    assert_eq!(
        drain(&mut m),
        vec![rpc(5, Request::KeepAlive { lease: LEASE })]
    );
    m.handle(t0 + s(6), ok(5, Response::KeptAlive { ttl_secs: 0 }));
    assert_eq!(
        drain(&mut m).last(),
        Some(&rpc(6, Request::Grant { ttl_secs: TTL }))
    );
    m.handle(
        t0 + s(6),
        ok(
            6,
            Response::Granted {
                lease: LEASE,
                ttl_secs: TTL,
            },
        ),
    );
    assert_eq!(drain(&mut m), vec![put_after(7, b"v3", 4)]);
}

/// etcd's answer to a put whose guard failed: the key as it is.
fn guard_failed(revision: i64, found: Option<KeyValue>) -> Response {
    Response::Txn {
        revision,
        succeeded: false,
        responses: vec![TxnOpResponse::Range {
            kvs: found.into_iter().collect(),
        }],
    }
}

fn host_key(value: &[u8], lease: LeaseId, mod_revision: i64) -> KeyValue {
    KeyValue {
        key: b"/coord/hosts/a".to_vec(),
        value: value.to_vec(),
        create_revision: 2,
        mod_revision,
        version: 1,
        lease,
    }
}

/// A put's guard failed because an earlier copy of it applied (its answer
/// was lost, the copy sent again found the key changed): the key holds
/// the current value on the current lease, which is the write — no put
/// goes again, and the revision read guards the next one.
#[test]
fn a_failed_guard_over_my_own_write_counts_as_written() {
    let t0 = Instant::now();
    let mut m = granted_with_put_in_flight(t0);
    m.handle(
        t0 + ms(1),
        ok(1, guard_failed(6, Some(host_key(b"v1", LEASE, 6)))),
    );
    assert_eq!(drain(&mut m), vec![registered()]);
    m.handle(t0 + ms(2), KeepaliveInput::SetValue(b"v2".to_vec()));
    assert_eq!(drain(&mut m), vec![put_after(2, b"v2", 6)]);
}

/// A put's guard failed and the key is not mine as I would write it but
/// on no other process's lease (an older value on this lease, a key on no
/// lease at all): put again at once, guarded on the revision read, so a
/// copy of either put that lands later finds the key changed and writes
/// nothing. (A key on another process's lease waits: `another_holder_*`.)
#[test]
fn a_failed_guard_over_another_write_puts_again_guarded_on_what_it_read() {
    let t0 = Instant::now();
    let mut m = granted_with_put_in_flight(t0);
    m.handle(
        t0 + ms(1),
        ok(1, guard_failed(8, Some(host_key(b"old", 0, 8)))),
    );
    assert_eq!(drain(&mut m), vec![put_after(2, b"v1", 8)]);
    assert_eq!(m.state(), &LivenessState::Registering);
    // Absent meanwhile (its lease expired): guarded on absence.
    m.handle(t0 + ms(2), ok(2, guard_failed(9, None)));
    assert_eq!(drain(&mut m), vec![put_after(3, b"v1", 0)]);
    m.handle(t0 + ms(3), ok(3, written(10)));
    assert_eq!(drain(&mut m), vec![registered()]);
}

#[test]
fn set_value_is_ignored_in_lease_only_mode() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    m.handle(t0 + ms(20), KeepaliveInput::SetValue(b"x".to_vec()));
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(m.poll_timeout(), Some(t0 + s(3)));
}

#[test]
fn stop_cancels_the_renewal_and_revokes() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    m.handle_timeout(t0 + s(3));
    let _ = drain(&mut m);
    m.handle(t0 + s(4), KeepaliveInput::Stop);
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(1) },
            rpc(2, Request::Revoke { lease: LEASE })
        ]
    );
    assert_eq!(m.lease(), None);
    m.handle(t0 + s(4), KeepaliveInput::Stop);
    m.handle(t0 + s(4), ok(1, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(drain(&mut m), vec![]);
    m.handle(t0 + s(5), ok(2, Response::Revoked));
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Stopped { revoked: true }
        ))]
    );
    assert_eq!(m.poll_timeout(), None);
    m.handle_timeout(t0 + s(100));
    m.handle(t0 + s(100), KeepaliveInput::SetValue(vec![1]));
    m.handle(t0 + s(100), KeepaliveInput::Stop);
    assert_eq!(drain(&mut m), vec![]);
}

#[test]
fn stop_reports_a_failed_or_unanswered_revoke() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    m.handle(t0 + s(1), KeepaliveInput::Stop);
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::Revoke { lease: LEASE })]
    );
    m.handle(t0 + s(1), err(1));
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Stopped { revoked: false }
        ))]
    );

    let mut m = granted(t0);
    m.handle(t0 + s(1), KeepaliveInput::Stop);
    let _ = drain(&mut m);
    assert_eq!(m.poll_timeout(), Some(t0 + s(10)));
    m.handle_timeout(t0 + s(10));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(1) },
            Command::Notify(KeepaliveNotice::State(LivenessState::Stopped {
                revoked: false
            }))
        ]
    );
    assert_eq!(m.poll_timeout(), None);
}

#[test]
fn stop_during_a_grant_revokes_the_lease_it_creates() {
    // A grant still in flight at Stop may create a lease; revoking it keeps
    // it from lingering (and holding a key or an election slot) for a TTL.
    let t0 = Instant::now();
    let mut m = Keepalive::new(config(true), t0, 1);
    let _ = drain(&mut m);
    m.handle(t0, KeepaliveInput::Stop);
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(m.poll_timeout(), Some(t0 + s(TTL as u64)));
    m.handle(t0 + ms(5), grant_reply());
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::Revoke { lease: LEASE })]
    );
    m.handle(t0 + ms(6), ok(1, Response::Revoked));
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Stopped { revoked: true }
        ))]
    );
    assert_eq!(m.poll_timeout(), None);
}

#[test]
fn stop_during_an_unanswered_grant_gives_up_after_the_request_timeout() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(config(true), t0, 1);
    let _ = drain(&mut m);
    m.handle(t0, KeepaliveInput::Stop);
    m.handle_timeout(t0 + s(TTL as u64));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(0) },
            Command::Notify(KeepaliveNotice::State(LivenessState::Stopped {
                revoked: false
            }))
        ]
    );
    assert_eq!(m.poll_timeout(), None);
    // A grant answered after giving up is ignored.
    m.handle(t0 + s(TTL as u64 + 1), grant_reply());
    assert_eq!(drain(&mut m), vec![]);
}

#[test]
fn odd_replies_count_as_failures_and_strangers_are_ignored() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(config(false), t0, 1);
    let _ = drain(&mut m);
    m.handle(
        t0,
        ok(
            42,
            Response::Granted {
                lease: LEASE,
                ttl_secs: TTL,
            },
        ),
    );
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(
        m.poll_timeout(),
        Some(t0 + s(9)),
        "still waiting for grant 0"
    );
    m.handle(
        t0,
        ok(
            0,
            Response::Granted {
                lease: 0,
                ttl_secs: TTL,
            },
        ),
    );
    assert_eq!(m.poll_timeout(), Some(t0 + ms(100)));
    m.handle_timeout(t0 + ms(100));
    let _ = drain(&mut m);
    m.handle(t0 + ms(100), ok(1, Response::Revoked));
    assert_eq!(m.poll_timeout(), Some(t0 + ms(300)));
    m.handle_timeout(t0 + ms(300));
    let _ = drain(&mut m);
    // A grant that never answers is given up after one TTL.
    m.handle_timeout(t0 + ms(9300));
    assert_eq!(drain(&mut m), vec![Command::Cancel { id: RpcId(2) }]);
    assert_eq!(m.poll_timeout(), Some(t0 + ms(9700)));
}

#[test]
fn ids_start_where_asked_and_owns_knows_them() {
    let t0 = Instant::now();
    let mut m = Keepalive::with_first_rpc_id(config(false), t0, 1, 1000);
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
            rpc(1000, Request::Grant { ttl_secs: TTL })
        ]
    );
    assert!(m.owns(RpcId(1000)));
    assert!(!m.owns(RpcId(1001)));
    assert!(!m.owns(RpcId(999)));
}

#[test]
fn huge_ttls_and_tiny_configs_do_not_panic() {
    let t0 = Instant::now();
    let mut cfg = config(false);
    cfg.ttl_secs = -5;
    cfg.backoff.initial = Duration::ZERO;
    let mut m = Keepalive::new(cfg, t0, 1);
    assert_eq!(drain(&mut m)[1], rpc(0, Request::Grant { ttl_secs: 1 }));
    m.handle(
        t0,
        ok(
            0,
            Response::Granted {
                lease: LEASE,
                ttl_secs: i64::MAX,
            },
        ),
    );
    assert_eq!(
        m.local_deadline(),
        Some(t0 + Duration::from_secs(MAX_TTL_SECS as u64))
    );
    m.handle(t0, err(0));
    let mut now = t0;
    for _ in 0..100 {
        let Some(at) = m.poll_timeout() else { break };
        assert!(at >= now);
        now = at;
        m.handle_timeout(now);
        for c in drain(&mut m) {
            if let Command::Rpc { id, .. } = c {
                m.handle(now, err(id.0));
            }
        }
    }
}

#[test]
fn trusted_lifetime_takes_the_drift_then_the_margin_and_leaves_at_least_half() {
    // 9 s less 1 % is 8.91 s, less the 300 ms margin.
    assert_eq!(trusted_lifetime(s(9), ms(300), 10_000), ms(8610));
    assert_eq!(trusted_lifetime(s(9), Duration::ZERO, 0), s(9));
    // The drift part is rounded up: 1 ppm of 1 s is 1 µs exactly, of
    // 1.5 ns it is less than a nanosecond but still one.
    assert_eq!(
        trusted_lifetime(s(1), Duration::ZERO, 1),
        s(1) - Duration::from_micros(1)
    );
    assert_eq!(
        trusted_lifetime(Duration::from_nanos(3), Duration::ZERO, 1),
        Duration::from_nanos(2)
    );
    // A margin larger than half of the drift-adjusted TTL is cut to half.
    assert_eq!(trusted_lifetime(s(9), s(100), 10_000), ms(4455));
    // A drift beyond the bound is clamped to it (10 %).
    assert_eq!(trusted_lifetime(s(9), Duration::ZERO, u32::MAX), ms(8100));
    assert_eq!(
        trusted_lifetime(
            Duration::from_secs(MAX_TTL_SECS as u64),
            Duration::MAX,
            u32::MAX
        ),
        Duration::from_secs(MAX_TTL_SECS as u64) * 9 / 20
    );
}

/// Lease-only, TTL 9 s, 300 ms margin, 1 % drift: trusted for 8.61 s.
fn granted_with_margin(t0: Instant) -> Keepalive {
    let mut cfg = config(false);
    cfg.safety_margin = ms(300);
    cfg.drift_allowance_ppm = 10_000;
    let mut m = Keepalive::new(cfg, t0, 1);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), grant_reply());
    assert_eq!(drain(&mut m), vec![registered()]);
    m
}

#[test]
fn margin_and_drift_shorten_the_deadline_and_the_renewal_period() {
    let t0 = Instant::now();
    let mut m = granted_with_margin(t0);
    assert_eq!(m.local_deadline(), Some(t0 + ms(8610)));
    // Renewals keep their pace to the trusted lifetime: a third of 8.61 s.
    assert_eq!(m.poll_timeout(), Some(t0 + ms(2870)));
    m.handle_timeout(t0 + ms(2870));
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::KeepAlive { lease: LEASE })]
    );
    // Given up halfway to the (earlier) deadline.
    assert_eq!(m.poll_timeout(), Some(t0 + ms(5740)));
    m.handle(t0 + ms(2900), ok(1, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(m.local_deadline(), Some(t0 + ms(2870 + 8610)));
    assert_eq!(m.poll_timeout(), Some(t0 + ms(2870 + 2870)));
}

#[test]
fn margin_retries_stop_before_the_earlier_deadline_and_it_decides() {
    let t0 = Instant::now();
    let mut m = granted_with_margin(t0);
    let deadline = t0 + ms(8610);
    let mut now = t0;
    let mut renewals = Vec::new();
    // Every renewal fails; no renewal may be sent at or after the deadline.
    while let Some(at) = m.poll_timeout() {
        now = at;
        m.handle_timeout(now);
        let commands = drain(&mut m);
        if commands.contains(&Command::Notify(KeepaliveNotice::State(
            LivenessState::Lost { lease: LEASE },
        ))) {
            break;
        }
        for c in commands {
            if let Command::Rpc { id, request } = c {
                assert_eq!(request, Request::KeepAlive { lease: LEASE });
                renewals.push(now);
                m.handle(now, err(id.0));
            }
        }
    }
    assert_eq!(now, deadline, "lost exactly at the local deadline");
    assert!(renewals.len() > 3, "{renewals:?}");
    assert!(renewals.iter().all(|at| *at < deadline), "{renewals:?}");
    assert_eq!(m.local_deadline(), None);
}

#[test]
fn a_grant_whose_trusted_lifetime_has_passed_is_not_used() {
    // TTL 1 s trusted for 0.5 s at most (the margin is cut to half): a
    // grant answered 600 ms after it was sent is already untrusted.
    let t0 = Instant::now();
    let mut cfg = config(false);
    cfg.ttl_secs = 1;
    cfg.safety_margin = s(5);
    let mut m = Keepalive::new(cfg, t0, 1);
    let _ = drain(&mut m);
    m.handle(
        t0 + ms(600),
        ok(
            0,
            Response::Granted {
                lease: LEASE,
                ttl_secs: 1,
            },
        ),
    );
    assert_eq!(m.lease(), None);
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(
        m.poll_timeout(),
        Some(t0 + ms(700)),
        "granted again after backoff"
    );
}

/// A binding machine granted `LEASE` at `t0` (sent at t0, so the deadline
/// is t0 + 9 s) whose put (id 1) is still unanswered.
fn granted_with_put_in_flight(t0: Instant) -> Keepalive {
    let mut m = Keepalive::new(config(true), t0, 1);
    let _ = drain(&mut m);
    m.handle(t0, grant_reply());
    assert_eq!(drain(&mut m), vec![put(1, b"v1")]);
    m
}

#[test]
fn a_renewal_sent_in_the_last_nanosecond_has_no_give_up_and_the_deadline_cancels_it() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    m.handle_timeout(t0 + s(3));
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::KeepAlive { lease: LEASE })]
    );
    // The failure arrives so late that its 100 ms backoff lands one
    // nanosecond before the deadline (t0 + 9 s).
    let last = t0 + s(9) - Duration::from_nanos(1);
    m.handle(last - ms(100), err(1));
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Suspended { lease: LEASE }
        ))]
    );
    assert_eq!(m.poll_timeout(), Some(last));
    m.handle_timeout(last);
    assert_eq!(
        drain(&mut m),
        vec![rpc(2, Request::KeepAlive { lease: LEASE })]
    );
    // Half of the nanosecond left is nothing: no give-up instant is armed,
    // the deadline alone decides.
    assert_eq!(m.poll_timeout(), Some(t0 + s(9)));
    m.handle_timeout(t0 + s(9));
    assert_eq!(
        drain(&mut m),
        vec![
            rpc(3, Request::Revoke { lease: LEASE }),
            Command::Cancel { id: RpcId(2) },
            Command::Notify(KeepaliveNotice::State(LivenessState::Lost { lease: LEASE })),
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
            rpc(4, Request::Grant { ttl_secs: TTL }),
        ]
    );
    // The canceled renewal's late ack is a stranger now.
    m.handle(t0 + s(9), ok(2, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(m.lease(), None);
}

#[test]
fn a_lease_lost_on_the_put_cancels_the_renewal_in_flight() {
    let t0 = Instant::now();
    let mut m = granted_with_put_in_flight(t0);
    m.handle_timeout(t0 + s(3));
    assert_eq!(
        drain(&mut m),
        vec![rpc(2, Request::KeepAlive { lease: LEASE })]
    );
    let reply = RpcReply {
        id: RpcId(1),
        result: Err(RpcError::LeaseNotFound),
    };
    m.handle(t0 + ms(3010), reply.into());
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(2) },
            Command::Notify(KeepaliveNotice::State(LivenessState::Lost { lease: LEASE })),
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
        ]
    );
    // A failed registration: the grant waits for the backoff.
    assert_eq!(m.poll_timeout(), Some(t0 + ms(3110)));
}

#[test]
fn stop_while_the_put_is_in_flight_cancels_it_and_revokes() {
    let t0 = Instant::now();
    let mut m = granted_with_put_in_flight(t0);
    m.handle(t0 + ms(10), KeepaliveInput::Stop);
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(1) },
            rpc(2, Request::Revoke { lease: LEASE }),
        ]
    );
    // The put's late answer does not register anything.
    m.handle(t0 + ms(20), ok(1, written(5)));
    assert_eq!(drain(&mut m), vec![]);
    m.handle(t0 + ms(30), ok(2, Response::Revoked));
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Stopped { revoked: true }
        ))]
    );
    assert!(m.is_finished());
}

#[test]
fn an_unanswered_put_is_given_up_after_the_request_timeout_and_retried() {
    let t0 = Instant::now();
    let mut m = granted_with_put_in_flight(t0);
    // Renewals keep the lease alive past the put's 9 s request timeout.
    for (n, at) in [(2, 3), (3, 6)] {
        m.handle_timeout(t0 + s(at));
        assert_eq!(
            drain(&mut m),
            vec![rpc(n, Request::KeepAlive { lease: LEASE })]
        );
        m.handle(t0 + s(at), ok(n, Response::KeptAlive { ttl_secs: TTL }));
        assert_eq!(drain(&mut m), vec![]);
    }
    assert_eq!(m.local_deadline(), Some(t0 + s(15)));
    assert_eq!(m.poll_timeout(), Some(t0 + s(9)));
    // Both timers are due at t0 + 9 s; the put's give-up goes first.
    m.handle_timeout(t0 + s(9));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(1) },
            rpc(4, Request::KeepAlive { lease: LEASE }),
        ]
    );
    assert_eq!(m.state(), &LivenessState::Registering);
    // The retry is the same put on the same lease, after the backoff.
    assert_eq!(m.poll_timeout(), Some(t0 + ms(9100)));
    m.handle_timeout(t0 + ms(9100));
    assert_eq!(drain(&mut m), vec![put(5, b"v1")]);
    m.handle(t0 + ms(9110), ok(5, written(7)));
    assert_eq!(drain(&mut m), vec![registered()]);
}

#[test]
fn the_stop_input_of_the_machine_contract_is_stop() {
    assert_eq!(<Keepalive as Machine>::stop_input(), KeepaliveInput::Stop);
}

#[test]
fn attempt_a_lost_put_and_a_lost_revoke_are_sent_again_after_the_attempt_timeout() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(with_copies(true), t0, 1);
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
            rpc(0, Request::Grant { ttl_secs: TTL })
        ]
    );
    m.handle(t0 + ms(10), grant_reply());
    assert_eq!(drain(&mut m), vec![put(1, b"v1")]);
    // The put is lost (a raft leader change): the same put again, half a
    // second after it was sent, three times at that pace, then slower.
    assert_eq!(m.poll_timeout(), Some(t0 + ms(510)));
    m.handle_timeout(t0 + ms(510));
    assert_eq!(
        drain(&mut m),
        vec![Command::Cancel { id: RpcId(1) }, put(2, b"v1")]
    );
    m.handle_timeout(t0 + ms(1010));
    assert_eq!(
        drain(&mut m),
        vec![Command::Cancel { id: RpcId(2) }, put(3, b"v1")]
    );
    m.handle_timeout(t0 + ms(1510));
    assert_eq!(
        drain(&mut m),
        vec![Command::Cancel { id: RpcId(3) }, put(4, b"v1")]
    );
    assert_eq!(
        m.poll_timeout(),
        Some(t0 + ms(2510)),
        "the fourth copy waits 1 s"
    );
    m.handle(t0 + ms(1600), ok(4, written(2)));
    assert_eq!(drain(&mut m), vec![registered()]);
    // Stop: the revoke is lost too, and sent again; its answer ends it.
    m.handle(t0 + ms(1700), KeepaliveInput::Stop);
    assert_eq!(
        drain(&mut m),
        vec![rpc(5, Request::Revoke { lease: LEASE })]
    );
    assert_eq!(
        m.poll_timeout(),
        Some(t0 + ms(2200)),
        "a fresh attempt count"
    );
    m.handle_timeout(t0 + ms(2200));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(5) },
            rpc(6, Request::Revoke { lease: LEASE })
        ]
    );
    m.handle(t0 + ms(2300), ok(6, Response::Revoked));
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Stopped { revoked: true }
        ))]
    );
    assert!(m.is_finished());
}

#[test]
fn attempt_a_revoke_broken_in_flight_is_sent_again_and_not_found_means_revoked() {
    let t0 = Instant::now();
    let mut m = granted_with_copies(t0);
    m.handle(t0 + ms(100), KeepaliveInput::Stop);
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::Revoke { lease: LEASE })]
    );
    // The connection breaks under it: another copy after the attempt timeout.
    m.handle(t0 + ms(200), err(1));
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(m.poll_timeout(), Some(t0 + ms(700)));
    m.handle_timeout(t0 + ms(700));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(1) },
            rpc(2, Request::Revoke { lease: LEASE })
        ]
    );
    // The first copy was applied after all: the second finds no lease.
    m.handle(
        t0 + ms(800),
        KeepaliveInput::Rpc(RpcReply {
            id: RpcId(2),
            result: Err(RpcError::LeaseNotFound),
        }),
    );
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Stopped { revoked: true }
        ))]
    );
}

/// Granted with copies every 500 ms; the grant was id 0, the first renewal
/// goes out at t0 + 3 s.
fn granted_with_copies(t0: Instant) -> Keepalive {
    granted_with(with_copies(false), t0)
}

/// [`config`] with copies every 500 ms.
fn with_copies(binding: bool) -> KeepaliveConfig {
    KeepaliveConfig {
        attempt_timeout: ms(500),
        ..config(binding)
    }
}

/// Runs `m` from `now` to `until`, acknowledging every renewal of
/// `renewing`; the instants and ids of the revokes of `lease` it sent, and
/// the last instant it was run at.
fn revokes_until(
    m: &mut Keepalive,
    mut now: Instant,
    until: Instant,
    renewing: LeaseId,
    lease: LeaseId,
) -> (Vec<(Instant, u64)>, Instant) {
    let mut revokes = Vec::new();
    while let Some(at) = m.poll_timeout().filter(|at| *at <= until) {
        now = at;
        m.handle_timeout(now);
        for c in drain(m) {
            match c {
                Command::Rpc {
                    id,
                    request: Request::Revoke { lease: l },
                } if l == lease => revokes.push((now, id.0)),
                Command::Rpc {
                    id,
                    request: Request::KeepAlive { lease: l },
                } if l == renewing => {
                    m.handle(now, ok(id.0, Response::KeptAlive { ttl_secs: TTL }))
                }
                _ => {}
            }
        }
    }
    (revokes, now)
}

#[test]
fn retire_a_replaced_lease_is_revoked_copy_after_copy_until_etcd_answers() {
    let t0 = Instant::now();
    let mut m = granted_with_copies(t0);
    m.handle(t0 + s(1), KeepaliveInput::Replace { lease: LEASE });
    assert_eq!(
        drain(&mut m),
        vec![
            rpc(1, Request::Revoke { lease: LEASE }),
            Command::Notify(KeepaliveNotice::State(LivenessState::Lost { lease: LEASE })),
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
            rpc(2, Request::Grant { ttl_secs: TTL }),
        ]
    );
    let new = 8;
    m.handle(
        t0 + s(1),
        ok(
            2,
            Response::Granted {
                lease: new,
                ttl_secs: TTL,
            },
        ),
    );
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Registered { lease: new }
        ))]
    );
    // Unanswered: copies 500 ms, 500 ms, 500 ms, then 1, 2, 4, 8, 8 s apart
    // — well past the TTL, since etcd may keep extending the lease.
    let mut revokes = vec![(t0 + s(1), 1)];
    let (copies, now) = revokes_until(&mut m, t0 + s(1), t0 + s(40), new, LEASE);
    revokes.extend(copies);
    let gaps: Vec<Duration> = revokes.windows(2).map(|w| w[1].0 - w[0].0).collect();
    assert_eq!(
        gaps[..8],
        [ms(500), ms(500), ms(500), s(1), s(2), s(4), s(8), s(8)]
    );
    // etcd answers the last copy: no more.
    let (_, last) = *revokes.last().expect("copies");
    m.handle(now, ok(last, Response::Revoked));
    assert_eq!(
        revokes_until(&mut m, now, now + s(60), new, LEASE).0,
        vec![]
    );
    assert_eq!(m.lease(), Some(new));
}

#[test]
fn retire_a_lease_lost_at_its_deadline_is_revoked_until_not_found() {
    let t0 = Instant::now();
    let mut m = granted_with_copies(t0);
    // The renewals go unanswered until the deadline (t0 + 9 s).
    let (revokes, now) = revokes_until(&mut m, t0, t0 + s(9), 0, LEASE);
    assert_eq!(revokes.len(), 1, "one revoke as the deadline passes");
    assert_eq!(revokes[0].0, t0 + s(9));
    assert_eq!(m.lease(), None);
    // A broken connection: another copy; then 'not found' (an earlier copy
    // got through, or it expired) ends it.
    m.handle(now, err(revokes[0].1));
    let (more, now) = revokes_until(&mut m, now, now + ms(600), 0, LEASE);
    assert_eq!(more.len(), 1);
    m.handle(
        now,
        KeepaliveInput::Rpc(RpcReply {
            id: RpcId(more[0].1),
            result: Err(RpcError::LeaseNotFound),
        }),
    );
    assert_eq!(revokes_until(&mut m, now, now + s(60), 0, LEASE).0, vec![]);
}

#[test]
fn retire_in_binding_mode_waits_until_the_key_is_written_with_the_new_lease() {
    let t0 = Instant::now();
    let mut m = granted_with_put_in_flight(t0);
    m.handle(t0 + ms(20), ok(1, written(5)));
    assert_eq!(drain(&mut m), vec![registered()]);
    // Renewals unanswered until the deadline: lost, regranted, but the old
    // lease still holds the key, so it is not revoked yet.
    let (revokes, now) = revokes_until(&mut m, t0 + ms(20), t0 + s(9), 0, LEASE);
    assert_eq!(revokes, vec![]);
    assert_eq!(m.lease(), None);
    let grant = 6; // renewals 2 to 5 went out first
    m.handle(
        now,
        ok(
            grant,
            Response::Granted {
                lease: 8,
                ttl_secs: TTL,
            },
        ),
    );
    assert_eq!(
        drain(&mut m),
        // Guarded on the revision the put on the old lease wrote.
        vec![put_on(grant + 1, b"v1", 5, 8)]
    );
    // The key is bound to lease 8: now lease 7 goes.
    m.handle(now, ok(grant + 1, written(9)));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Registered {
                lease: 8
            })),
            rpc(grant + 2, Request::Revoke { lease: LEASE }),
        ]
    );
}

const MARKER: &[u8] = b"/coord/hosts/a/left";

/// A binding-mode machine with a leave marker, registered on `LEASE` by
/// t0 + 20 ms, with `attempt` as its attempt timeout.
fn registered_announcing(t0: Instant, attempt: Duration) -> Keepalive {
    let mut cfg = config(true);
    cfg.attempt_timeout = attempt;
    if let Some(b) = &mut cfg.binding {
        b.leave_marker = Some(MARKER.to_vec());
    }
    let mut m = Keepalive::new(cfg, t0, 1);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), grant_reply());
    assert_eq!(drain(&mut m), vec![put(1, b"v1")]);
    m.handle(t0 + ms(20), ok(1, written(5)));
    assert_eq!(drain(&mut m), vec![registered()]);
    m
}

/// The leave: the marker put on `LEASE` and the key deleted at one
/// revision, guarded on the key's mod revision being `revision`, reading
/// the key otherwise.
fn leave_after(id: u64, revision: i64) -> Cmd {
    let key = b"/coord/hosts/a".to_vec();
    rpc(
        id,
        Request::Txn(Txn {
            compare: vec![Compare::ModRevisionEquals {
                key: key.clone(),
                revision,
            }],
            success: vec![
                TxnOp::Put {
                    key: MARKER.to_vec(),
                    value: Vec::new(),
                    lease: LEASE,
                },
                TxnOp::Delete(KeyRange::Key(key.clone())),
            ],
            failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(key)))],
        }),
    )
}

/// The leave of [`registered_announcing`], whose key was written at 5.
fn leave(id: u64) -> Cmd {
    leave_after(id, 5)
}

/// etcd's answer to a leave whose guard held, applied at `revision`.
fn left(revision: i64) -> Response {
    Response::Txn {
        revision,
        succeeded: true,
        responses: vec![TxnOpResponse::Put, TxnOpResponse::Delete { deleted: 1 }],
    }
}

/// etcd's answer to a guard that failed: the key as it is (`None`: absent).
fn found(kv: Option<KeyValue>) -> Response {
    Response::Txn {
        revision: 20,
        succeeded: false,
        responses: vec![TxnOpResponse::Range {
            kvs: kv.into_iter().collect(),
        }],
    }
}

fn key_on(lease: LeaseId, mod_revision: i64) -> KeyValue {
    KeyValue {
        key: b"/coord/hosts/a".to_vec(),
        value: b"v1".to_vec(),
        create_revision: 5,
        mod_revision,
        version: 2,
        lease,
    }
}

fn revoke(id: u64) -> Cmd {
    rpc(id, Request::Revoke { lease: LEASE })
}

fn told_left() -> Cmd {
    Command::Notify(KeepaliveNotice::Left { lease: LEASE })
}

#[test]
fn leave_writes_the_marker_and_deletes_the_key_in_one_txn_then_revokes() {
    let t0 = Instant::now();
    let mut m = registered_announcing(t0, Duration::ZERO);
    m.handle(t0 + s(1), KeepaliveInput::Stop);
    assert_eq!(drain(&mut m), vec![leave(2)]);
    assert_eq!(m.lease(), None, "stopping: nothing is trusted any more");
    // Repeated stops and value changes add nothing.
    m.handle(t0 + s(1), KeepaliveInput::Stop);
    m.handle(t0 + s(1), KeepaliveInput::SetValue(b"v2".to_vec()));
    assert_eq!(drain(&mut m), vec![]);
    m.handle(t0 + s(1) + ms(3), ok(2, left(9)));
    assert_eq!(drain(&mut m), vec![told_left(), revoke(3)]);
    // The give-up is still one TTL from the stop, leave included.
    assert_eq!(m.poll_timeout(), Some(t0 + s(1) + s(TTL as u64)));
    m.handle(t0 + s(1) + ms(5), ok(3, Response::Revoked));
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Stopped { revoked: true }
        ))]
    );
    assert_eq!(m.poll_timeout(), None);
}

#[test]
fn a_failed_leave_still_revokes_at_once_and_tells_no_leave() {
    let t0 = Instant::now();
    let mut m = registered_announcing(t0, ms(500));
    m.handle(t0 + s(1), KeepaliveInput::Stop);
    assert_eq!(drain(&mut m), vec![leave(2)]);
    m.handle(t0 + s(1) + ms(1), err(2));
    assert_eq!(
        drain(&mut m),
        vec![rpc(3, Request::Revoke { lease: LEASE })]
    );
    m.handle(t0 + s(1) + ms(2), ok(3, Response::Revoked));
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Stopped { revoked: true }
        ))]
    );
}

#[test]
fn an_unanswered_leave_is_given_up_after_one_attempt_timeout() {
    let t0 = Instant::now();
    let mut m = registered_announcing(t0, ms(500));
    m.handle(t0 + s(1), KeepaliveInput::Stop);
    assert_eq!(drain(&mut m), vec![leave(2)]);
    assert_eq!(m.poll_timeout(), Some(t0 + s(1) + ms(500)));
    m.handle_timeout(t0 + s(1) + ms(499));
    assert_eq!(drain(&mut m), vec![]);
    m.handle_timeout(t0 + s(1) + ms(500));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(2) },
            rpc(3, Request::Revoke { lease: LEASE })
        ]
    );
    // A late answer to the leave changes nothing (the watchers saw it; this
    // machine is past waiting); the revoke's copies run on their own
    // schedule, and the give-up stays one TTL from the stop.
    m.handle(t0 + s(1) + ms(600), ok(2, left(9)));
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(m.poll_timeout(), Some(t0 + s(1) + ms(1000)));
    m.handle_timeout(t0 + s(1) + s(TTL as u64));
    let last = drain(&mut m);
    assert_eq!(
        last.last(),
        Some(&Command::Notify(KeepaliveNotice::State(
            LivenessState::Stopped { revoked: false }
        )))
    );
}

#[test]
fn without_attempt_copies_the_leave_waits_half_the_ttl() {
    let t0 = Instant::now();
    let mut m = registered_announcing(t0, Duration::ZERO);
    m.handle(t0 + s(1), KeepaliveInput::Stop);
    assert_eq!(drain(&mut m), vec![leave(2)]);
    assert_eq!(m.poll_timeout(), Some(t0 + s(1) + ms(4500)));
    m.handle_timeout(t0 + s(1) + ms(4500));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(2) },
            rpc(3, Request::Revoke { lease: LEASE })
        ]
    );
}

#[test]
fn a_leave_whose_guard_failed_over_a_late_write_of_its_own_goes_again() {
    // A put of ours canceled by the stop landed before the leave: the key
    // is still on this lease, at revision 8. The leave goes again, guarded
    // on 8, within the same attempt timeout.
    let t0 = Instant::now();
    let mut m = registered_announcing(t0, ms(500));
    m.handle(t0 + s(1), KeepaliveInput::Stop);
    assert_eq!(drain(&mut m), vec![leave(2)]);
    m.handle(t0 + s(1) + ms(2), ok(2, found(Some(key_on(LEASE, 8)))));
    assert_eq!(drain(&mut m), vec![leave_after(3, 8)]);
    assert_eq!(m.poll_timeout(), Some(t0 + s(1) + ms(500)));
    // The same revision again is no progress: revoke without a leave.
    m.handle(t0 + s(1) + ms(4), ok(3, found(Some(key_on(LEASE, 8)))));
    assert_eq!(drain(&mut m), vec![revoke(4)]);
}

#[test]
fn a_leave_whose_guard_failed_over_another_writer_deletes_nothing_and_revokes() {
    for (what, kv) in [
        ("another lease", Some(key_on(LEASE + 1, 8))),
        ("no key", None),
    ] {
        let t0 = Instant::now();
        let mut m = registered_announcing(t0, ms(500));
        m.handle(t0 + s(1), KeepaliveInput::Stop);
        assert_eq!(drain(&mut m), vec![leave(2)], "{what}");
        m.handle(t0 + s(1) + ms(2), ok(2, found(kv.clone())));
        // Taken over by another lease: said so, before the revoke.
        let mut expected = Vec::new();
        if let Some(kv) = &kv {
            expected.push(Command::Notify(KeepaliveNotice::State(
                LivenessState::Duplicate { holder: kv.lease },
            )));
        }
        expected.push(revoke(3));
        assert_eq!(drain(&mut m), expected, "{what}");
        m.handle(t0 + s(1) + ms(3), ok(3, Response::Revoked));
        assert_eq!(
            drain(&mut m),
            vec![Command::Notify(KeepaliveNotice::State(
                LivenessState::Stopped { revoked: true }
            ))],
            "{what}"
        );
    }
}

#[test]
fn no_leave_marker_without_a_key_written_on_the_lease() {
    // Stopped while the key's put is in flight: there is no registration to
    // announce the end of, so no marker, and the revoke goes out at once.
    let t0 = Instant::now();
    let mut cfg = config(true);
    if let Some(b) = &mut cfg.binding {
        b.leave_marker = Some(MARKER.to_vec());
    }
    let mut m = Keepalive::new(cfg, t0, 1);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), grant_reply());
    assert_eq!(drain(&mut m), vec![put(1, b"v1")]);
    m.handle(t0 + ms(11), KeepaliveInput::Stop);
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(1) },
            rpc(2, Request::Revoke { lease: LEASE })
        ]
    );
}

#[test]
fn a_refused_put_stops_without_a_leave_marker() {
    let t0 = Instant::now();
    let mut cfg = config(true);
    if let Some(b) = &mut cfg.binding {
        b.leave_marker = Some(MARKER.to_vec());
    }
    let mut m = Keepalive::new(cfg, t0, 1);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), grant_reply());
    let _ = drain(&mut m);
    let denied = RpcError::PermissionDenied("no".into());
    m.handle(
        t0 + ms(11),
        KeepaliveInput::Rpc(RpcReply {
            id: RpcId(1),
            result: Err(denied.clone()),
        }),
    );
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Refused {
                error: denied
            })),
            rpc(2, Request::Revoke { lease: LEASE })
        ]
    );
}

/// A lease-only machine on `grid`, granted `LEASE` (TTL 9 s) by a reply at
/// t0 + 10 ms to the grant sent at t0.
fn granted_on(grid: RenewalGrid, t0: Instant) -> Keepalive {
    let mut m = Keepalive::new(config(false), t0, 1);
    m.set_renewal_grid(Some(grid));
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), grant_reply());
    assert_eq!(drain(&mut m), vec![registered()]);
    m
}

#[test]
fn grid_renews_at_the_latest_grid_instant_before_the_rule_and_stays_on_it() {
    let t0 = Instant::now();
    let grid = RenewalGrid {
        origin: t0 + ms(1),
        step: ms(40),
    };
    let mut m = granted_on(grid, t0);
    // The rule says t0 + 3 s; the grid instant before it is origin + 74
    // steps = t0 + 2961 ms. The deadline is the rule's, from the send.
    assert_eq!(m.local_deadline(), Some(t0 + s(9)));
    assert_eq!(m.poll_timeout(), Some(t0 + ms(2961)));
    m.handle_timeout(t0 + ms(2960));
    assert_eq!(drain(&mut m), vec![]);
    m.handle_timeout(t0 + ms(2961));
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::KeepAlive { lease: LEASE })]
    );
    // Giving up on the renewal is not moved: halfway to the deadline.
    assert_eq!(
        m.poll_timeout(),
        Some(t0 + ms(2961) + (s(9) - ms(2961)) / 2)
    );
    // Sent on the grid, a third of the TTL later is on it too: no drift.
    m.handle(t0 + ms(2970), ok(1, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(m.local_deadline(), Some(t0 + ms(11_961)));
    assert_eq!(m.poll_timeout(), Some(t0 + ms(5961)));
    // Sent 15 ms late (a busy driver), the next is back on the grid, never
    // later than the rule's t0 + 8976 ms.
    m.handle_timeout(t0 + ms(5976));
    assert_eq!(
        drain(&mut m),
        vec![rpc(2, Request::KeepAlive { lease: LEASE })]
    );
    m.handle(t0 + ms(5980), ok(2, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(m.local_deadline(), Some(t0 + ms(14_976)));
    assert_eq!(m.poll_timeout(), Some(t0 + ms(8961)));
}

#[test]
fn grid_too_coarse_for_the_interval_or_removed_leaves_the_rule_alone() {
    let t0 = Instant::now();
    // More than a tenth of the 3 s interval.
    let coarse = RenewalGrid {
        origin: t0 + ms(1),
        step: ms(301),
    };
    let m = granted_on(coarse, t0);
    assert_eq!(m.poll_timeout(), Some(t0 + s(3)));

    let fine = RenewalGrid {
        origin: t0 + ms(1),
        step: ms(40),
    };
    let mut m = granted_on(fine, t0);
    m.set_renewal_grid(None);
    m.handle_timeout(t0 + ms(2961));
    let _ = drain(&mut m);
    m.handle(t0 + ms(2970), ok(1, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(m.poll_timeout(), Some(t0 + ms(5961)));
    m.handle_timeout(t0 + ms(5976));
    let _ = drain(&mut m);
    m.handle(t0 + ms(5980), ok(2, Response::KeptAlive { ttl_secs: TTL }));
    // Off the grid now: exactly a third of the TTL after the send.
    assert_eq!(m.poll_timeout(), Some(t0 + ms(8976)));
}

#[test]
fn grid_floor_is_never_later_and_at_most_one_step_earlier() {
    let t0 = Instant::now();
    let grid = RenewalGrid {
        origin: t0 + s(1),
        step: ms(20),
    };
    let interval = s(3);
    // Before the origin, and with a zero step: untouched.
    assert_eq!(grid.floor(t0, interval), t0);
    let zero = RenewalGrid {
        step: Duration::ZERO,
        ..grid
    };
    assert_eq!(zero.floor(t0 + s(2), interval), t0 + s(2));
    // On the grid: itself; between: the instant before.
    assert_eq!(grid.floor(t0 + ms(1040), interval), t0 + ms(1040));
    assert_eq!(grid.floor(t0 + ms(1059), interval), t0 + ms(1040));
    assert_eq!(
        grid.floor(t0 + ms(1041) + Duration::from_nanos(1), interval),
        t0 + ms(1040)
    );
    // A step above a tenth of the interval is not applied.
    assert_eq!(grid.floor(t0 + ms(1059), ms(199)), t0 + ms(1059));
}

/// A resume point as a detached machine leaves it: `LEASE`, key created at
/// revision 5, last written at 8.
const POINT: ResumePoint = ResumePoint {
    lease: LEASE,
    create_revision: 5,
    key_revision: 8,
};

/// The resume transaction: the key's mod revision and create revision
/// guarded, the value put on `POINT.lease`, the key read otherwise.
fn resume_txn(id: u64, value: &[u8]) -> Cmd {
    let key = b"/coord/hosts/a".to_vec();
    rpc(
        id,
        Request::Txn(Txn {
            compare: vec![
                Compare::ModRevisionEquals {
                    key: key.clone(),
                    revision: POINT.key_revision,
                },
                Compare::CreateRevisionEquals {
                    key: key.clone(),
                    revision: POINT.create_revision,
                },
            ],
            success: vec![TxnOp::Put {
                key: key.clone(),
                value: value.to_vec(),
                lease: POINT.lease,
            }],
            failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(key)))],
        }),
    )
}

fn with_leave_marker() -> KeepaliveConfig {
    let mut c = config(true);
    if let Some(b) = c.binding.as_mut() {
        b.leave_marker = Some(b"/coord/hosts/a/left".to_vec());
    }
    c
}

/// A resuming machine at `t0`, its opening renewal answered at t0 + 10 ms
/// with the full TTL: the resume transaction is out (id 1).
fn resumed_renewal(t0: Instant) -> Keepalive {
    let mut m = Keepalive::resume(config(true), t0, 1, 0, POINT);
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
            rpc(0, Request::KeepAlive { lease: LEASE }),
        ]
    );
    m.handle(t0 + ms(10), ok(0, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(drain(&mut m), vec![resume_txn(1, b"v1")]);
    m
}

#[test]
fn detach_hands_over_lease_and_key_incarnation_without_leave_or_revoke() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(with_leave_marker(), t0, 1);
    let _ = drain(&mut m);
    assert_eq!(m.resume_point(), None);
    m.handle(t0 + ms(10), grant_reply());
    assert_eq!(drain(&mut m), vec![put(1, b"v1")]);
    // Not written yet: nothing to hand over.
    assert_eq!(m.resume_point(), None);
    m.handle(t0 + ms(20), ok(1, written(5)));
    let _ = drain(&mut m);
    m.handle(t0 + ms(30), KeepaliveInput::SetValue(b"v2".to_vec()));
    assert_eq!(drain(&mut m), vec![put_after(2, b"v2", 5)]);
    m.handle(t0 + ms(40), ok(2, written(8)));
    // A rewrite keeps the incarnation (create revision) and moves the
    // mod revision.
    assert_eq!(m.resume_point(), Some(POINT));
    assert_eq!(m.key_revision(), 8);
    m.handle_timeout(t0 + s(3));
    assert_eq!(
        drain(&mut m),
        vec![rpc(3, Request::KeepAlive { lease: LEASE })]
    );
    m.handle(t0 + s(3), KeepaliveInput::Detach);
    // The renewal in flight is canceled; no leave, no delete, no revoke.
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(3) },
            Command::Notify(KeepaliveNotice::Detached(POINT)),
            Command::Notify(KeepaliveNotice::State(LivenessState::Stopped {
                revoked: false
            })),
        ]
    );
    assert!(m.is_finished());
    assert_eq!(m.poll_timeout(), None);
    for input in [KeepaliveInput::Stop, KeepaliveInput::Detach] {
        m.handle(t0 + s(4), input);
    }
    assert_eq!(drain(&mut m), vec![]);
}

#[test]
fn detach_with_nothing_to_hand_over_is_a_stop() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(config(true), t0, 1);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), grant_reply());
    assert_eq!(drain(&mut m), vec![put(1, b"v1")]);
    m.handle(t0 + ms(20), KeepaliveInput::Detach);
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(1) },
            rpc(2, Request::Revoke { lease: LEASE })
        ]
    );
}

#[test]
fn resume_proves_the_lease_then_the_key_incarnation_then_is_registered() {
    let t0 = Instant::now();
    let mut m = resumed_renewal(t0);
    // Proven alive, the key not yet: still registering, but trusted from
    // the renewal's send.
    assert_eq!(m.state(), &LivenessState::Registering);
    assert_eq!(m.lease(), None);
    assert_eq!(m.local_deadline(), Some(t0 + s(9)));
    assert_eq!(m.resume_point(), None);
    m.handle(t0 + ms(20), ok(1, written(12)));
    assert_eq!(drain(&mut m), vec![registered()]);
    assert_eq!(m.key_revision(), 12);
    assert_eq!(
        m.resume_point(),
        Some(ResumePoint {
            key_revision: 12,
            ..POINT
        })
    );
    // From here on an ordinary registration: renewed at a third of the
    // TTL, later puts guarded on the resumed revision alone.
    assert_eq!(m.poll_timeout(), Some(t0 + s(3)));
    m.handle(t0 + ms(30), KeepaliveInput::SetValue(b"v2".to_vec()));
    assert_eq!(drain(&mut m), vec![put_after(2, b"v2", 12)]);
}

#[test]
fn resume_refused_by_a_dead_lease_registers_afresh_without_lost() {
    for reply in [
        ok(0, Response::KeptAlive { ttl_secs: 0 }),
        KeepaliveInput::Rpc(RpcReply {
            id: RpcId(0),
            result: Err(RpcError::LeaseNotFound),
        }),
    ] {
        let t0 = Instant::now();
        let mut m = Keepalive::resume(config(true), t0, 1, 0, POINT);
        let _ = drain(&mut m);
        m.handle(t0 + ms(10), reply);
        // Gone: nothing to revoke, and a fresh grant at once.
        assert_eq!(
            drain(&mut m),
            vec![rpc(1, Request::Grant { ttl_secs: TTL })]
        );
        m.handle(
            t0 + ms(20),
            ok(
                1,
                Response::Granted {
                    lease: 11,
                    ttl_secs: TTL,
                },
            ),
        );
        assert_eq!(drain(&mut m), vec![put_on(2, b"v1", 0, 11)]);
        m.handle(t0 + ms(30), ok(2, written(20)));
        assert_eq!(
            drain(&mut m),
            vec![Command::Notify(KeepaliveNotice::State(
                LivenessState::Registered { lease: 11 }
            ))]
        );
        assert_eq!(m.resume_point().map(|p| p.create_revision), Some(20));
    }
}

#[test]
fn resume_refused_by_another_key_incarnation_registers_afresh_then_revokes_the_lease() {
    let t0 = Instant::now();
    let mut m = resumed_renewal(t0);
    // Deleted and created again on the same lease since the detach.
    let other = KeyValue {
        create_revision: 15,
        ..host_key(b"v1", LEASE, 15)
    };
    m.handle(t0 + ms(20), ok(1, guard_failed(15, Some(other))));
    assert_eq!(
        drain(&mut m),
        vec![rpc(2, Request::Grant { ttl_secs: TTL })]
    );
    assert_eq!(m.state(), &LivenessState::Registering);
    m.handle(
        t0 + ms(30),
        ok(
            2,
            Response::Granted {
                lease: 11,
                ttl_secs: TTL,
            },
        ),
    );
    // Guarded on the key as read: the other incarnation is taken over.
    assert_eq!(drain(&mut m), vec![put_on(3, b"v1", 15, 11)]);
    m.handle(t0 + ms(40), ok(3, written(16)));
    // Written on the new lease: the refused one, alive, is revoked.
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Registered {
                lease: 11
            })),
            rpc(4, Request::Revoke { lease: LEASE }),
        ]
    );
    assert_eq!(m.resume_point().map(|p| p.create_revision), Some(15));
}

#[test]
fn resume_counts_an_earlier_copy_of_its_own_transaction_as_written() {
    let t0 = Instant::now();
    let mut m = resumed_renewal(t0);
    let mine = KeyValue {
        create_revision: POINT.create_revision,
        ..host_key(b"v1", LEASE, 13)
    };
    m.handle(t0 + ms(20), ok(1, guard_failed(13, Some(mine))));
    assert_eq!(drain(&mut m), vec![registered()]);
    assert_eq!(m.key_revision(), 13);
}

#[test]
fn resume_falls_back_on_a_failed_or_unanswered_renewal_and_revokes_the_lease_later() {
    let t0 = Instant::now();
    let mut m = Keepalive::resume(config(true), t0, 1, 0, POINT);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), err(0));
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::Grant { ttl_secs: TTL })]
    );

    let mut m = Keepalive::resume(config(true), t0, 1, 0, POINT);
    let _ = drain(&mut m);
    assert_eq!(m.poll_timeout(), Some(t0 + s(9)));
    m.handle_timeout(t0 + s(9));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(0) },
            rpc(1, Request::Grant { ttl_secs: TTL })
        ]
    );
    m.handle(
        t0 + s(9),
        ok(
            1,
            Response::Granted {
                lease: 11,
                ttl_secs: TTL,
            },
        ),
    );
    assert_eq!(drain(&mut m), vec![put_on(2, b"v1", 0, 11)]);
    m.handle(t0 + s(9), ok(2, written(30)));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Registered {
                lease: 11
            })),
            rpc(3, Request::Revoke { lease: LEASE }),
        ]
    );
}

#[test]
fn stop_while_resuming_revokes_the_saved_lease() {
    let t0 = Instant::now();
    let mut m = Keepalive::resume(with_leave_marker(), t0, 1, 0, POINT);
    let _ = drain(&mut m);
    m.handle(t0 + ms(5), KeepaliveInput::Stop);
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(0) },
            rpc(1, Request::Revoke { lease: LEASE })
        ]
    );
    m.handle(t0 + ms(10), ok(1, Response::Revoked));
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Stopped { revoked: true }
        ))]
    );
}

#[test]
fn resume_from_a_point_without_a_lease_or_key_incarnation_registers_afresh() {
    let t0 = Instant::now();
    let nonsense = ResumePoint {
        create_revision: 0,
        ..POINT
    };
    let no_lease = ResumePoint { lease: 0, ..POINT };
    for (config, point) in [
        (config(false), no_lease),
        (config(true), no_lease),
        (config(true), nonsense),
    ] {
        let mut m = Keepalive::resume(config, t0, 1, 0, point);
        assert_eq!(
            drain(&mut m),
            vec![
                Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
                rpc(0, Request::Grant { ttl_secs: TTL })
            ]
        );
    }
}

/// A resume transaction never answered until the lease's deadline: the
/// lease is lost as any other, and the next registration's put is an
/// ordinary one (guarded on the mod revision alone), not the resume's.
#[test]
fn a_resume_transaction_unanswered_until_the_deadline_ends_the_resume() {
    let t0 = Instant::now();
    let mut m = resumed_renewal(t0);
    m.handle_timeout(t0 + s(9));
    let commands = drain(&mut m);
    assert_eq!(commands.first(), Some(&Command::Cancel { id: RpcId(1) }));
    assert!(
        commands.contains(&rpc(2, Request::Grant { ttl_secs: TTL })),
        "{commands:?}"
    );
    m.handle(
        t0 + s(9),
        ok(
            2,
            Response::Granted {
                lease: 11,
                ttl_secs: TTL,
            },
        ),
    );
    assert_eq!(drain(&mut m), vec![put_on(3, b"v1", 8, 11)]);
    m.handle(t0 + s(9), ok(3, guard_failed(20, None)));
    assert_eq!(drain(&mut m), vec![put_on(4, b"v1", 0, 11)]);
    m.handle(t0 + s(9), ok(4, written(21)));
    let commands = drain(&mut m);
    assert_eq!(
        commands.first(),
        Some(&Command::Notify(KeepaliveNotice::State(
            LivenessState::Registered { lease: 11 }
        ))),
        "{commands:?}"
    );
}

fn with_companion() -> KeepaliveConfig {
    let mut c = config(true);
    if let Some(b) = c.binding.as_mut() {
        b.companion = Some((b"/coord/hosts/a/incarnation".to_vec(), b"7".to_vec()));
    }
    c
}

/// `put_on` with the companion put first, in the same transaction, on the
/// same lease.
fn with_companion_put(cmd: Cmd) -> Cmd {
    let Command::Rpc {
        id,
        request: Request::Txn(mut txn),
    } = cmd
    else {
        panic!("not a transaction: {cmd:?}");
    };
    let lease = match &txn.success[0] {
        TxnOp::Put { lease, .. } => *lease,
        other => panic!("not a put: {other:?}"),
    };
    txn.success.insert(
        0,
        TxnOp::Put {
            key: b"/coord/hosts/a/incarnation".to_vec(),
            value: b"7".to_vec(),
            lease,
        },
    );
    Command::Rpc {
        id,
        request: Request::Txn(txn),
    }
}

#[test]
fn the_companion_is_put_in_every_write_of_the_key_on_the_same_lease() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(with_companion(), t0, 1);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), grant_reply());
    assert_eq!(drain(&mut m), vec![with_companion_put(put(1, b"v1"))]);
    m.handle(t0 + ms(20), ok(1, written(5)));
    assert_eq!(drain(&mut m), vec![registered()]);
    m.handle(t0 + ms(30), KeepaliveInput::SetValue(b"v2".to_vec()));
    assert_eq!(
        drain(&mut m),
        vec![with_companion_put(put_after(2, b"v2", 5))]
    );
}

#[test]
fn the_companion_is_put_in_the_resume_transaction() {
    let t0 = Instant::now();
    let mut m = Keepalive::resume(with_companion(), t0, 1, 0, POINT);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), ok(0, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(
        drain(&mut m),
        vec![with_companion_put(resume_txn(1, b"v1"))]
    );
}

/// The point a lease-only machine hands over: the lease alone.
const SESSION_POINT: ResumePoint = ResumePoint {
    lease: LEASE,
    create_revision: 0,
    key_revision: 0,
};

#[test]
fn a_session_detaches_its_lease_without_revoking_it() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    assert_eq!(m.resume_point(), Some(SESSION_POINT));
    m.handle_timeout(t0 + s(3));
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::KeepAlive { lease: LEASE })]
    );
    m.handle(t0 + s(3), KeepaliveInput::Detach);
    // The renewal in flight is canceled; the lease is left to the next
    // process: no revoke, ever.
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(1) },
            Command::Notify(KeepaliveNotice::Detached(SESSION_POINT)),
            Command::Notify(KeepaliveNotice::State(LivenessState::Stopped {
                revoked: false
            })),
        ]
    );
    assert!(m.is_finished());
    m.handle(t0 + s(4), KeepaliveInput::Stop);
    assert_eq!(drain(&mut m), vec![]);
}

#[test]
fn a_session_with_no_lease_to_hand_over_detaches_as_a_stop() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(config(false), t0, 1);
    let _ = drain(&mut m);
    assert_eq!(m.resume_point(), None);
    m.handle(t0 + ms(5), KeepaliveInput::Detach);
    // The grant in flight is waited for, so the lease it makes is revoked.
    assert_eq!(drain(&mut m), vec![]);
    m.handle(t0 + ms(10), grant_reply());
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::Revoke { lease: LEASE })]
    );
}

#[test]
fn a_session_resume_is_registered_on_the_renewal_that_proves_the_lease() {
    let t0 = Instant::now();
    let mut m = Keepalive::resume(config(false), t0, 1, 0, SESSION_POINT);
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
            rpc(0, Request::KeepAlive { lease: LEASE }),
        ]
    );
    assert_eq!(m.lease(), None, "not held before etcd says it lives");
    m.handle(t0 + ms(10), ok(0, Response::KeptAlive { ttl_secs: TTL }));
    // No key to prove: held from the renewal's send, renewed at a third.
    assert_eq!(drain(&mut m), vec![registered()]);
    assert_eq!(m.lease(), Some(LEASE));
    assert_eq!(m.local_deadline(), Some(t0 + s(9)));
    assert_eq!(m.poll_timeout(), Some(t0 + s(3)));
    m.handle_timeout(t0 + s(3));
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::KeepAlive { lease: LEASE })]
    );
    // And handed on again as it was taken.
    assert_eq!(m.resume_point(), Some(SESSION_POINT));
}

#[test]
fn a_session_resume_refused_grants_afresh_and_revokes_a_lease_that_may_live() {
    // Gone (past the TTL, revoked): a grant at once, nothing to revoke.
    for reply in [
        ok(0, Response::KeptAlive { ttl_secs: 0 }),
        KeepaliveInput::Rpc(RpcReply {
            id: RpcId(0),
            result: Err(RpcError::LeaseNotFound),
        }),
    ] {
        let t0 = Instant::now();
        let mut m = Keepalive::resume(config(false), t0, 1, 0, SESSION_POINT);
        let _ = drain(&mut m);
        m.handle(t0 + ms(10), reply);
        assert_eq!(
            drain(&mut m),
            vec![rpc(1, Request::Grant { ttl_secs: TTL })]
        );
        m.handle(
            t0 + ms(20),
            ok(
                1,
                Response::Granted {
                    lease: 11,
                    ttl_secs: TTL,
                },
            ),
        );
        assert_eq!(
            drain(&mut m),
            vec![Command::Notify(KeepaliveNotice::State(
                LivenessState::Registered { lease: 11 }
            ))],
            "never `Lost`: the resumed lease was never reported held"
        );
    }
    // A failed renewal: the lease may live on, holding every key on it,
    // so it is revoked in the background (no key of this machine waits).
    let t0 = Instant::now();
    let mut m = Keepalive::resume(config(false), t0, 1, 0, SESSION_POINT);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), err(0));
    assert_eq!(
        drain(&mut m),
        vec![
            rpc(1, Request::Revoke { lease: LEASE }),
            rpc(2, Request::Grant { ttl_secs: TTL }),
        ]
    );
}

// Another holder of the key (module docs, rule 12; `fleetcoord_sm::holder`).

/// The lease a predecessor or a duplicate wrote the key on.
const THEIRS: LeaseId = 99;

fn look(id: u64) -> Cmd {
    rpc(id, Request::LeaseTimeToLive { lease: THEIRS })
}

fn ttl_left(id: u64, ttl_secs: i64) -> KeepaliveInput {
    ok(
        id,
        Response::LeaseTimeToLive {
            ttl_secs,
            granted_secs: 9,
        },
    )
}

fn waiting() -> Cmd {
    Command::Notify(KeepaliveNotice::State(LivenessState::Waiting {
        holder: THEIRS,
    }))
}

/// The first put (id 1) found the key on `THEIRS` at t0 + 1 ms: the first
/// look goes out (id 2) and the machine says why it waits; nothing is put.
fn waiting_on_theirs(config: KeepaliveConfig, t0: Instant) -> Keepalive {
    let mut m = Keepalive::new(config, t0, 1);
    let _ = drain(&mut m);
    m.handle(t0, grant_reply());
    assert_eq!(drain(&mut m), vec![put(1, b"v1")]);
    m.handle(
        t0 + ms(1),
        ok(1, guard_failed(8, Some(host_key(b"old", THEIRS, 8)))),
    );
    assert_eq!(drain(&mut m), vec![look(2), waiting()]);
    assert_eq!(
        m.state(),
        &LivenessState::Waiting { holder: THEIRS },
        "the state says why nothing is registered"
    );
    m
}

/// A crashed predecessor (systemd's `Restart=`): its lease has 1 s left
/// and nobody renews it. The machine looks again at the expiry bound
/// (answer + 1 s + 1 % + 100 ms), finds it at its end (TTL 0), looks every
/// 250 ms until etcd says it is gone, then puts the key guarded on its
/// absence, as it would have: registered, never failed.
#[test]
fn another_holder_that_crashed_is_waited_for_then_the_key_is_registered() {
    let t0 = Instant::now();
    let mut m = waiting_on_theirs(config(true), t0);
    m.handle(t0 + ms(2), ttl_left(2, 1));
    assert_eq!(drain(&mut m), vec![]);
    let bound = t0 + ms(2) + ms(1010) + ms(100);
    assert_eq!(m.poll_timeout(), Some(bound));
    m.handle_timeout(bound);
    assert_eq!(drain(&mut m), vec![look(3)]);
    // At its end, not yet revoked by etcd's expiry loop.
    m.handle(bound + ms(1), ttl_left(3, 0));
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(m.poll_timeout(), Some(bound + ms(251)));
    m.handle_timeout(bound + ms(251));
    assert_eq!(drain(&mut m), vec![look(4)]);
    m.handle(bound + ms(252), ttl_left(4, -1));
    assert_eq!(drain(&mut m), vec![put(5, b"v1")]);
    m.handle(bound + ms(253), ok(5, written(12)));
    assert_eq!(drain(&mut m), vec![registered()]);
}

/// A live duplicate: its lease still has time left at a look sent after
/// the expiry bound of the first answer, so someone renewed it. The
/// machine says `Duplicate`, writes nothing and stops, revoking its own
/// lease (no leave: the key is not its own).
#[test]
fn another_holder_renewed_past_its_ttl_is_a_duplicate_and_the_machine_stops() {
    let t0 = Instant::now();
    let mut m = waiting_on_theirs(config(true), t0);
    m.handle(t0 + ms(2), ttl_left(2, 1));
    let bound = t0 + ms(2) + ms(1010) + ms(100);
    m.handle_timeout(bound);
    assert_eq!(drain(&mut m), vec![look(3)]);
    m.handle(bound + ms(1), ttl_left(3, 1));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Duplicate {
                holder: THEIRS
            })),
            rpc(4, Request::Revoke { lease: LEASE }),
        ]
    );
    m.handle(bound + ms(2), ok(4, Response::Revoked));
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Stopped { revoked: true }
        ))]
    );
    assert!(m.is_finished());
}

/// A failed look is looked at again after a backoff delay; it decides
/// nothing.
#[test]
fn another_holder_failed_look_is_sent_again_after_a_backoff() {
    let t0 = Instant::now();
    let mut m = waiting_on_theirs(config(true), t0);
    m.handle(t0 + ms(2), ttl_left(2, 1));
    let bound = t0 + ms(2) + ms(1010) + ms(100);
    // A look sent before the bound (a failed one, retried early).
    m.handle_timeout(bound);
    assert_eq!(drain(&mut m), vec![look(3)]);
    m.handle(bound + ms(1), err(3));
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(
        m.poll_timeout(),
        Some(bound + ms(101)),
        "after a backoff delay"
    );
    m.handle_timeout(bound + ms(101));
    assert_eq!(drain(&mut m), vec![look(4)]);
    m.handle(bound + ms(102), ttl_left(4, -1));
    assert_eq!(drain(&mut m), vec![put(5, b"v1")]);
}

/// The key goes while the machine waits: etcd answers the look "no such
/// lease" (-1) at once, and the put goes guarded on absence. If etcd has
/// not deleted the key yet (its expiry loop lags), the put's guard fails
/// on the same holder: looked at again after 250 ms, not put over.
#[test]
fn another_holder_gone_while_waiting_registers_and_a_lagging_delete_is_waited_for() {
    let t0 = Instant::now();
    let mut m = waiting_on_theirs(config(true), t0);
    m.handle(t0 + ms(2), ttl_left(2, -1));
    assert_eq!(drain(&mut m), vec![put(3, b"v1")]);
    m.handle(
        t0 + ms(3),
        ok(3, guard_failed(9, Some(host_key(b"old", THEIRS, 8)))),
    );
    assert_eq!(drain(&mut m), vec![]);
    assert_eq!(m.poll_timeout(), Some(t0 + ms(253)));
    m.handle_timeout(t0 + ms(253));
    assert_eq!(drain(&mut m), vec![look(4)]);
    m.handle(t0 + ms(254), ttl_left(4, -1));
    assert_eq!(drain(&mut m), vec![put(5, b"v1")]);
    m.handle(t0 + ms(255), ok(5, guard_failed(10, None)));
    assert_eq!(drain(&mut m), vec![put(6, b"v1")]);
    m.handle(t0 + ms(256), ok(6, written(11)));
    assert_eq!(drain(&mut m), vec![registered()]);
}

fn taking_over() -> KeepaliveConfig {
    let mut c = with_copies(true);
    if let Some(b) = &mut c.binding {
        b.take_over = true;
    }
    c
}

/// With `take_over`, a first registration writes over a live holder's key
/// at once (guarded on what it read) and then revokes the holder's lease,
/// so the displaced process learns it at its next renewal.
#[test]
fn take_over_writes_over_the_holder_then_revokes_its_lease() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(taking_over(), t0, 1);
    let _ = drain(&mut m);
    m.handle(t0, grant_reply());
    assert_eq!(drain(&mut m), vec![put(1, b"v1")]);
    m.handle(
        t0 + ms(1),
        ok(1, guard_failed(8, Some(host_key(b"old", THEIRS, 8)))),
    );
    assert_eq!(drain(&mut m), vec![put_after(2, b"v1", 8)]);
    m.handle(t0 + ms(2), ok(2, written(9)));
    assert_eq!(
        drain(&mut m),
        vec![registered(), rpc(3, Request::Revoke { lease: THEIRS })]
    );
}

/// A machine that wrote the key and finds it on another lease (a write
/// after it was taken over) has lost it: `Waiting` on the taker, never
/// taking it back, even with `take_over` (two such processes would take
/// it from each other forever).
#[test]
fn a_displaced_holder_waits_on_the_taker_and_never_takes_the_key_back() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(taking_over(), t0, 1);
    let _ = drain(&mut m);
    m.handle(t0, grant_reply());
    assert_eq!(drain(&mut m), vec![put(1, b"v1")]);
    m.handle(t0 + ms(1), ok(1, written(5)));
    assert_eq!(drain(&mut m), vec![registered()]);
    m.handle(t0 + ms(2), KeepaliveInput::SetValue(b"v2".to_vec()));
    assert_eq!(drain(&mut m), vec![put_after(2, b"v2", 5)]);
    m.handle(
        t0 + ms(3),
        ok(2, guard_failed(8, Some(host_key(b"v1", THEIRS, 8)))),
    );
    assert_eq!(drain(&mut m), vec![look(3), waiting()]);
    m.handle(t0 + ms(4), ttl_left(3, 1));
    let bound = t0 + ms(4) + ms(1010) + ms(100);
    m.handle_timeout(bound);
    assert_eq!(drain(&mut m), vec![look(4)]);
    m.handle(bound + ms(1), ttl_left(4, 8));
    let commands = drain(&mut m);
    assert_eq!(
        commands.first(),
        Some(&Command::Notify(KeepaliveNotice::State(
            LivenessState::Duplicate { holder: THEIRS }
        )))
    );
    assert_eq!(
        commands.last(),
        Some(&rpc(5, Request::Revoke { lease: LEASE })),
        "its own lease is revoked, the taker's key left alone: {commands:?}"
    );
}

/// The judge alone: only an answer above zero to a look *sent* at or after
/// the expiry bound is a renewal; before it, or 0, looks again; -1 is gone.
#[test]
fn holder_check_judges_only_looks_sent_after_the_expiry_bound() {
    use fleetcoord_sm::holder::{HolderCheck, Step, POLL};
    let t0 = Instant::now();
    let mut c = HolderCheck::new(THEIRS);
    let bound = t0 + ms(3030) + ms(100);
    assert_eq!(c.on_answer(t0, t0, 3), Step::LookAt(bound));
    // Sent before the bound: the lease may simply not have run down.
    assert_eq!(
        c.on_answer(bound - ms(1), bound, 2),
        Step::LookAt(bound + POLL)
    );
    assert_eq!(c.on_answer(t0 + s(1), t0 + s(1), 2), Step::LookAt(bound));
    assert_eq!(
        c.on_answer(bound, bound + ms(1), 0),
        Step::LookAt(bound + ms(1) + POLL)
    );
    assert_eq!(c.on_answer(bound, bound + ms(1), 1), Step::Live);
    assert_eq!(c.on_answer(bound, bound + ms(1), -1), Step::Gone);
    // A lease etcd has no more, at the first look.
    assert_eq!(HolderCheck::new(THEIRS).on_answer(t0, t0, -1), Step::Gone);
    // Huge TTLs saturate instead of overflowing.
    let mut big = HolderCheck::new(THEIRS);
    assert!(matches!(big.on_answer(t0, t0, i64::MAX), Step::LookAt(_)));
}

/// A resume whose key another process now holds (on a lease neither
/// process held) is refused, and the fresh registration is guarded on
/// absence, never on the holder's revision: it finds the key and waits.
#[test]
fn a_resume_refused_by_another_holder_registers_afresh_and_waits_on_it() {
    let t0 = Instant::now();
    let mut m = resumed_renewal(t0);
    m.handle(
        t0 + ms(20),
        ok(1, guard_failed(15, Some(host_key(b"theirs", THEIRS, 15)))),
    );
    assert_eq!(
        drain(&mut m),
        vec![rpc(2, Request::Grant { ttl_secs: TTL })]
    );
    m.handle(
        t0 + ms(30),
        ok(
            2,
            Response::Granted {
                lease: 11,
                ttl_secs: TTL,
            },
        ),
    );
    assert_eq!(drain(&mut m), vec![put_on(3, b"v1", 0, 11)]);
    m.handle(
        t0 + ms(40),
        ok(3, guard_failed(15, Some(host_key(b"theirs", THEIRS, 15)))),
    );
    assert_eq!(drain(&mut m), vec![look(4), waiting()]);
}

/// Rule 13, replayed: a renewal answer etcd sent before the lease was
/// revoked and a new one granted, delivered after both. Its TTL proves
/// nothing about any lease now: no trust is told, no deadline moves.
#[test]
fn stale_a_renewal_answer_that_predates_a_revoke_and_regrant_extends_no_trust() {
    let t0 = Instant::now();
    let config = KeepaliveConfig {
        announce_trust: true,
        ..config(false)
    };
    let mut m = Keepalive::new(config, t0, 1);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), grant_reply());
    assert_eq!(drain(&mut m), vec![registered(), trusted(t0 + s(9))]);
    m.handle_timeout(t0 + s(3));
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::KeepAlive { lease: LEASE })]
    );
    // The user gives the lease up while renewal 1 is out: it is revoked
    // and a new lease granted.
    m.handle(t0 + ms(3100), KeepaliveInput::Replace { lease: LEASE });
    assert_eq!(
        drain(&mut m),
        vec![
            rpc(2, Request::Revoke { lease: LEASE }),
            Command::Cancel { id: RpcId(1) },
            Command::Notify(KeepaliveNotice::State(LivenessState::Lost { lease: LEASE })),
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
            rpc(3, Request::Grant { ttl_secs: TTL }),
        ]
    );
    let new = 8;
    m.handle(
        t0 + ms(3200),
        ok(
            3,
            Response::Granted {
                lease: new,
                ttl_secs: TTL,
            },
        ),
    );
    let regranted = drain(&mut m);
    let until = t0 + ms(3100) + s(9);
    assert_eq!(
        regranted,
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Registered {
                lease: new
            })),
            Command::Notify(KeepaliveNotice::Trusted { lease: new, until }),
        ]
    );
    // Renewal 1's answer, TTL 9, arrives now (the driver delivers the
    // answers of canceled renewals: `src/driver/runner.rs`). Matched by
    // lease or by arrival, it would trust something until t0 + 12.3 s.
    m.handle(t0 + ms(3300), ok(1, Response::KeptAlive { ttl_secs: TTL }));
    assert_eq!(drain(&mut m), vec![], "a stale answer tells nothing");
    assert_eq!(m.local_deadline(), Some(until));
    assert_eq!(m.lease(), Some(new));
    assert_eq!(
        m.poll_timeout(),
        Some(t0 + ms(3100) + s(3)),
        "the new lease's renewal schedule is its own"
    );
}

/// Rule 13 at a loss by the deadline: the renewal given up on the way
/// (its answer held back past the lease's deadline) is answered after the
/// re-grant; it moves nothing.
#[test]
fn stale_an_answer_held_past_the_deadline_moves_nothing_after_the_regrant() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    m.handle_timeout(t0 + s(3));
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::KeepAlive { lease: LEASE })]
    );
    // Unanswered: given up at t0 + 6 s, retried after 100 ms, unanswered
    // again; the deadline (t0 + 9 s) passes.
    m.handle_timeout(t0 + s(6));
    let _ = drain(&mut m);
    m.handle_timeout(t0 + ms(6100));
    assert_eq!(
        drain(&mut m),
        vec![rpc(2, Request::KeepAlive { lease: LEASE })]
    );
    m.handle_timeout(t0 + s(9));
    let lost = drain(&mut m);
    assert!(
        lost.contains(&Command::Notify(KeepaliveNotice::State(
            LivenessState::Lost { lease: LEASE }
        ))),
        "{lost:?}"
    );
    let Some(Command::Rpc { id: grant, .. }) = lost
        .iter()
        .find(|c| {
            matches!(
                c,
                Command::Rpc {
                    request: Request::Grant { .. },
                    ..
                }
            )
        })
        .cloned()
    else {
        panic!("no grant after the loss: {lost:?}");
    };
    let new = 8;
    m.handle(
        t0 + ms(9010),
        KeepaliveInput::Rpc(RpcReply {
            id: grant,
            result: Ok(Response::Granted {
                lease: new,
                ttl_secs: TTL,
            }),
        }),
    );
    let _ = drain(&mut m);
    let until = m.local_deadline();
    assert_eq!(until, Some(t0 + s(9) + s(9)));
    // Both old renewals are answered now, TTL 9: nothing moves.
    for id in [1, 2] {
        m.handle(t0 + ms(9020), ok(id, Response::KeptAlive { ttl_secs: TTL }));
        assert_eq!(drain(&mut m), vec![]);
        assert_eq!(m.local_deadline(), until);
        assert_eq!(m.lease(), Some(new));
    }
}
