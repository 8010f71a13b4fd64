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

fn config() -> KeepaliveConfig {
    KeepaliveConfig {
        ttl_secs: TTL,
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

/// A lease-only machine granted `LEASE` (TTL 9 s) by a reply at t0 + 10 ms.
fn granted(t0: Instant) -> Keepalive {
    granted_with(config(), t0)
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
        ..config()
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
fn a_grant_refused_for_permission_is_refused_once_and_stops() {
    let denied = || RpcError::PermissionDenied("etcdserver: permission denied".into());
    let t0 = Instant::now();
    // On the grant: nothing to revoke (a refused write of a key is the
    // registration's: `unit/registration.rs`,
    // `a_write_refused_for_permission_is_refused_and_stops`, and
    // `unit/host.rs`, `a_refused_write_is_refused_and_the_lease_revoked`).
    let mut m = Keepalive::new(config(), t0, 1);
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
    let mut cfg = config();
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
    let mut m = Keepalive::new(config(), t0, 1);
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
    let mut m = Keepalive::new(config(), t0, 1);
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
    let mut m = Keepalive::new(config(), t0, 1);
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
    let mut m = Keepalive::with_first_rpc_id(config(), t0, 1, 1000);
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
    let mut cfg = config();
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
    let mut cfg = config();
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
    let mut cfg = config();
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
fn the_stop_input_of_the_machine_contract_is_stop() {
    assert_eq!(<Keepalive as Machine>::stop_input(), KeepaliveInput::Stop);
}

#[test]
fn attempt_a_lost_grant_and_a_lost_revoke_are_sent_again_after_the_attempt_timeout() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(with_copies(), t0, 1);
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
            rpc(0, Request::Grant { ttl_secs: TTL })
        ]
    );
    // The grant is lost (a raft leader change): the same grant again, half
    // a second after it was sent, three times at that pace, then slower.
    assert_eq!(m.poll_timeout(), Some(t0 + ms(500)));
    m.handle_timeout(t0 + ms(500));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(0) },
            rpc(1, Request::Grant { ttl_secs: TTL })
        ]
    );
    m.handle_timeout(t0 + ms(1000));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(1) },
            rpc(2, Request::Grant { ttl_secs: TTL })
        ]
    );
    m.handle_timeout(t0 + ms(1500));
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Cancel { id: RpcId(2) },
            rpc(3, Request::Grant { ttl_secs: TTL })
        ]
    );
    assert_eq!(
        m.poll_timeout(),
        Some(t0 + ms(2500)),
        "the fourth copy waits 1 s"
    );
    m.handle(
        t0 + ms(1600),
        ok(
            3,
            Response::Granted {
                lease: LEASE,
                ttl_secs: TTL,
            },
        ),
    );
    assert_eq!(drain(&mut m), vec![registered()]);
    // Stop: the revoke is lost too, and sent again; its answer ends it.
    m.handle(t0 + ms(1700), KeepaliveInput::Stop);
    assert_eq!(
        drain(&mut m),
        vec![rpc(4, Request::Revoke { lease: LEASE })]
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
            Command::Cancel { id: RpcId(4) },
            rpc(5, Request::Revoke { lease: LEASE })
        ]
    );
    m.handle(t0 + ms(2300), ok(5, Response::Revoked));
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
    granted_with(with_copies(), t0)
}

/// [`config`] with copies every 500 ms.
fn with_copies() -> KeepaliveConfig {
    KeepaliveConfig {
        attempt_timeout: ms(500),
        ..config()
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

/// The id of the one grant among `commands`.
fn grant_id(commands: &[Cmd]) -> u64 {
    let ids: Vec<u64> = commands
        .iter()
        .filter_map(|c| match c {
            Command::Rpc {
                id,
                request: Request::Grant { .. },
            } => Some(id.0),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 1, "one grant in {commands:?}");
    ids[0]
}

/// At most 8 retired leases are remembered, a ninth evicting the oldest —
/// never the one whose revoke is under way, also while only its next copy
/// waits for its timer: that copy goes to the first lease without a new
/// check, so evicting it sent a held lease its first revoke before the
/// user settled elsewhere (found by the fuzz target `keepalive`).
#[test]
fn retire_never_evicts_the_lease_whose_revoke_copy_waits() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(with_copies(), t0, 1);
    m.set_hold_retired(true);
    let _ = drain(&mut m);
    let granted = |lease: LeaseId, id: u64| {
        ok(
            id,
            Response::Granted {
                lease,
                ttl_secs: TTL,
            },
        )
    };
    m.handle(t0, granted(100, 0));
    let _ = drain(&mut m);
    m.handle(t0, KeepaliveInput::Replace { lease: 100 });
    let id = grant_id(&drain(&mut m));
    m.handle(t0, granted(101, id));
    let _ = drain(&mut m);
    // Settled on 101: 100's revoke goes, fails, and its copy waits.
    m.handle(t0, KeepaliveInput::Settled { lease: 101 });
    let revoke = drain(&mut m);
    let [Command::Rpc {
        id: RpcId(r),
        request: Request::Revoke { lease: 100 },
    }] = revoke.as_slice()
    else {
        panic!("{revoke:?}");
    };
    m.handle(t0, err(*r));
    assert_eq!(m.poll_timeout(), Some(t0 + ms(500)));
    // Eight more leases given up, none settled on: the ninth retired one
    // evicts an old lease, not 100.
    for lease in 101..=108 {
        m.handle(t0, KeepaliveInput::Replace { lease });
        let commands = drain(&mut m);
        assert!(
            !commands.iter().any(|c| matches!(
                c,
                Command::Rpc {
                    request: Request::Revoke { .. },
                    ..
                }
            )),
            "nothing settled on: no revoke, {commands:?}"
        );
        m.handle(t0, granted(lease + 1, grant_id(&commands)));
        let _ = drain(&mut m);
    }
    m.handle_timeout(t0 + ms(500));
    let copy = drain(&mut m);
    assert!(
        matches!(
            copy.as_slice(),
            [Command::Rpc {
                request: Request::Revoke { lease: 100 },
                ..
            }]
        ),
        "the copy is 100's, not a held lease's first revoke: {copy:?}"
    );
}

/// A machine told to hold retired leases (a host on its own lease) keeps
/// one presumed lost at its deadline until its user settled on the new
/// lease: the revoke never takes away a key still on the old one.
/// Ported from the binding mode's
/// `retire_in_binding_mode_waits_until_the_key_is_written_with_the_new_lease`.
#[test]
fn retire_held_waits_until_the_user_settled_on_the_new_lease() {
    let t0 = Instant::now();
    let mut m = Keepalive::new(config(), t0, 1);
    m.set_hold_retired(true);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), grant_reply());
    assert_eq!(drain(&mut m), vec![registered()]);
    // Renewals unanswered until the deadline: lost, regranted, but the old
    // lease may still hold the user's key, so it is not revoked yet.
    let (revokes, now) = revokes_until(&mut m, t0 + ms(10), t0 + s(9), 0, LEASE);
    assert_eq!(revokes, vec![]);
    assert_eq!(m.lease(), None);
    let grant = 5; // renewals 1 to 4 went out first
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
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Registered { lease: 8 }
        ))]
    );
    // Settled on another lease than the current one: nothing.
    m.handle(now, KeepaliveInput::Settled { lease: LEASE });
    assert_eq!(drain(&mut m), vec![]);
    // The user's keys are on lease 8: now lease 7 goes.
    m.handle(now, KeepaliveInput::Settled { lease: 8 });
    assert_eq!(
        drain(&mut m),
        vec![rpc(grant + 1, Request::Revoke { lease: LEASE })]
    );
}

/// A lease-only machine on `grid`, granted `LEASE` (TTL 9 s) by a reply at
/// t0 + 10 ms to the grant sent at t0.
fn granted_on(grid: RenewalGrid, t0: Instant) -> Keepalive {
    let mut m = Keepalive::new(config(), t0, 1);
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

/// A resume refused by a failed or unanswered renewal registers afresh;
/// the saved lease may still be alive, and a machine holding retired
/// leases revokes it once its user settled on the new one. Ported from
/// the binding mode's
/// `resume_falls_back_on_a_failed_or_unanswered_renewal_and_revokes_the_lease_later`.
#[test]
fn resume_falls_back_on_a_failed_or_unanswered_renewal_and_a_held_lease_goes_once_settled() {
    let t0 = Instant::now();
    let mut m = Keepalive::resume(config(), t0, 1, 0, POINT);
    m.set_hold_retired(true);
    let _ = drain(&mut m);
    m.handle(t0 + ms(10), err(0));
    assert_eq!(
        drain(&mut m),
        vec![rpc(1, Request::Grant { ttl_secs: TTL })]
    );

    let mut m = Keepalive::resume(config(), t0, 1, 0, POINT);
    m.set_hold_retired(true);
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
    assert_eq!(
        drain(&mut m),
        vec![Command::Notify(KeepaliveNotice::State(
            LivenessState::Registered { lease: 11 }
        ))],
        "never `Lost`, and the saved lease is held"
    );
    m.handle(t0 + s(9), KeepaliveInput::Settled { lease: 11 });
    assert_eq!(
        drain(&mut m),
        vec![rpc(2, Request::Revoke { lease: LEASE })]
    );
}

#[test]
fn stop_while_resuming_revokes_the_saved_lease() {
    let t0 = Instant::now();
    let mut m = Keepalive::resume(config(), t0, 1, 0, POINT);
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
fn resume_from_a_point_without_a_lease_registers_afresh() {
    let t0 = Instant::now();
    let mut m = Keepalive::resume(config(), t0, 1, 0, ResumePoint { lease: 0 });
    assert_eq!(
        drain(&mut m),
        vec![
            Command::Notify(KeepaliveNotice::State(LivenessState::Registering)),
            rpc(0, Request::Grant { ttl_secs: TTL })
        ]
    );
}

/// The point a machine registered on `LEASE` hands over.
const POINT: ResumePoint = ResumePoint { lease: LEASE };

#[test]
fn a_session_detaches_its_lease_without_revoking_it() {
    let t0 = Instant::now();
    let mut m = granted(t0);
    assert_eq!(m.resume_point(), Some(POINT));
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
            Command::Notify(KeepaliveNotice::Detached(POINT)),
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
    let mut m = Keepalive::new(config(), t0, 1);
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
    let mut m = Keepalive::resume(config(), t0, 1, 0, POINT);
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
    assert_eq!(m.resume_point(), Some(POINT));
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
        let mut m = Keepalive::resume(config(), t0, 1, 0, POINT);
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
    let mut m = Keepalive::resume(config(), t0, 1, 0, POINT);
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

/// Rule 13, replayed: a renewal answer etcd sent before the lease was
/// revoked and a new one granted, delivered after both. Its TTL proves
/// nothing about any lease now: no trust is told, no deadline moves.
#[test]
fn stale_a_renewal_answer_that_predates_a_revoke_and_regrant_extends_no_trust() {
    let t0 = Instant::now();
    let config = KeepaliveConfig {
        announce_trust: true,
        ..config()
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
