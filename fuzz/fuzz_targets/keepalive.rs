//! Fuzz the keepalive machine against the shared model etcd
//! (`fleetcoord-test-support`).
//!
//! The target plays the wire: it answers any outstanding request, in any
//! order, truthfully (the model etcd executes it at the reply instant, which
//! is never before the send instant), with a chosen TTL (the model then keeps
//! the lease that long), with a failure, a lost reply (executed, then an
//! error), a "lease not found", a TTL of 0, or a reply of the wrong variant;
//! it advances time (expiring leases), breaks the renewal stream, extends
//! every lease (an etcd leader change), settles on a lease, stops, and
//! feeds stray replies. The machine is lease-only: a key bound to its
//! lease is the host's, fuzzed by `host.rs` on the composition that runs
//! it. After every step:
//! * while `lease()` is `Some`, the model etcd still has that lease and its
//!   expiry is not before the machine's local deadline;
//! * at most one renewal is outstanding;
//! * the machine sends only grants, renewals and revokes;
//! * nothing but Revokes of one lease, one outstanding at a time, are
//!   issued after `Stop`, besides one last revoke of each lease given up
//!   earlier; once `Stopped`, `poll_timeout` is `None` and `Stopped` is
//!   the last notification;
//! * told to hold retired leases (`set_hold_retired`), a lease given up is
//!   revoked only while the user settled on the current one, never that
//!   one (the revoke must not take away what the user keeps on it);
//! * consecutive notifications differ;
//! * a told deadline (`Trusted`, with `announce_trust`, which odd TTLs
//!   ask for) is the machine's local deadline at that moment, later than
//!   `now`, and never told unasked;
//! * `poll_timeout` is never before `now`; draining commands terminates;
//! * detach (rule 8 of `sm/src/keepalive.rs`): after `Detach` with a
//!   lease to hand over, nothing is sent but last revokes of other leases
//!   (no revoke of the point's lease), and `Detached` tells the point
//!   `resume_point()` gave, then `Stopped`; with nothing to hand over a
//!   detach is a stop;
//! * resume (rule 9): the successor (`Keepalive::resume`) registered on
//!   the point's lease holds it in the model (the check above); a refused
//!   resume registers afresh without `Lost`.

#![no_main]

use arbitrary::Arbitrary;
use fleetcoord_sm::keepalive::{
    Keepalive, KeepaliveConfig, KeepaliveInput, KeepaliveNotice, LivenessState, ResumePoint,
};
use fleetcoord_sm::{
    BackoffConfig, Command, LeaseId, Machine, Request, Response, RpcError, RpcId, RpcReply,
};
use fleetcoord_test_support::ModelEtcd;
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};

const MAX_COMMANDS_PER_STEP: usize = 1_000;

#[derive(Arbitrary, Debug)]
struct Input {
    ttl_secs: i8,
    /// Hold retired leases until settled (`Keepalive::set_hold_retired`,
    /// as a host does). Where the binding mode's flag was, so the
    /// committed corpus keeps its layout.
    hold_retired: bool,
    /// Tell failed grants (`Keepalive::set_announce_failures`).
    announce_failures: bool,
    seed: u64,
    initial_ms: u16,
    max_ms: u16,
    multiplier: u8,
    jitter_percent: u8,
    /// 0 sends no copies of unanswered grants and revokes.
    attempt_ms: u16,
    margin_ms: u16,
    drift_allowance_ppm: u32,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Outcome {
    /// Processed; the reply tells the truth.
    Truth,
    /// Processed with this TTL (grant or renewal); the model's expiry
    /// follows the TTL it reported.
    Ttl(u8),
    /// Not processed.
    Unavailable,
    /// Processed, reply lost.
    LostReply,
    /// A "lease not found" rejection, whatever the truth.
    LeaseNotFound,
    /// A renewal reply of TTL 0, whatever the truth.
    TtlZero,
    /// A reply of the wrong variant.
    WrongVariant,
}

#[derive(Arbitrary, Debug)]
enum Op {
    AdvanceMs(u16),
    AdvanceSecs(u8),
    /// Jump to the machine's next deadline.
    AdvanceToTimeout,
    /// Answer outstanding request number `pick` (modulo their count); the
    /// model executes it now, the reply arrives `latency_ms` later.
    Reply {
        pick: u8,
        outcome: Outcome,
        latency_ms: u8,
    },
    /// The renewal stream breaks: the outstanding renewal fails.
    DropStream,
    /// The model extends every lease by a full TTL (leader change).
    ExtendLeases,
    /// The user says what it keeps is written on a lease: the current
    /// one for an even byte, else the last one it held before (where the
    /// binding mode's value change was, so the corpus keeps its layout).
    Settle(u8),
    Stop,
    /// A reply to an id the machine is not waiting for.
    Stray(RpcReply),
    /// The user gives the current lease up (`Replace`): it must be revoked.
    Replace,
    /// The user says etcd refused the current lease as not found.
    Gone,
    /// The user detaches the machine (a restart, rule 8).
    Detach,
    /// A successor resumes from the detached point (rule 9).
    Resume,
}

struct Run {
    machine: Keepalive,
    etcd: ModelEtcd,
    now: Instant,
    /// `Keepalive::set_hold_retired` was set.
    hold_retired: bool,
    /// `Keepalive::set_announce_failures` was set.
    announce_failures: bool,
    /// The lease the user last settled on.
    settled: Option<LeaseId>,
    /// Leases the machine held, newest last.
    held: Vec<LeaseId>,
    /// Held retired leases whose revoke started.
    revoking: Vec<LeaseId>,
    outstanding: Vec<(RpcId, Request)>,
    notifications: Vec<LivenessState>,
    /// The machine was asked to tell its deadline's moves.
    announce_trust: bool,
    stop_requested: bool,
    revoked: Option<i64>,
    config: KeepaliveConfig,
    seed: u64,
    /// Detach asked with this point to hand over.
    detaching: Option<ResumePoint>,
    /// `Detached` told; no successor yet.
    detached: Option<ResumePoint>,
    /// The machine was resumed from this point and has not registered.
    resumed: Option<ResumePoint>,
    /// Machines run so far (each successor's request ids are its own).
    incarnation: u64,
    /// Leases of the points resumed from: a successor that cannot take
    /// one over gives it up without `Lost` (it never held it) and revokes it.
    handed: Vec<LeaseId>,
}

impl Run {
    /// Executes `request` on the model at `now`. With `ttl`, a grant or a
    /// renewal reports that TTL instead of etcd's, and the model keeps the
    /// lease that long, so the checks still hold the machine to what it was
    /// told. A TTL of 0 leaves a renewal truthful and makes a grant's lease
    /// die at once.
    fn process(&mut self, request: &Request, ttl: Option<u8>) -> Result<Response, RpcError> {
        match request {
            Request::Grant { .. } | Request::KeepAlive { .. } | Request::Revoke { .. } => {}
            other => panic!("a lease-only keepalive never sends {other:?}"),
        }
        let truth = self.etcd.execute(self.now, request)?;
        let Some(ttl) = ttl.map(i64::from) else {
            return Ok(truth);
        };
        Ok(match (request, truth) {
            (_, Response::Granted { lease, .. }) => {
                self.etcd.retime_lease(self.now, lease, ttl);
                Response::Granted {
                    lease,
                    ttl_secs: ttl,
                }
            }
            (Request::KeepAlive { lease }, Response::KeptAlive { ttl_secs })
                if ttl_secs > 0 && ttl > 0 =>
            {
                self.etcd.retime_lease(self.now, *lease, ttl);
                Response::KeptAlive { ttl_secs: ttl }
            }
            (_, truth) => truth,
        })
    }

    fn drain(&mut self) {
        for _ in 0..MAX_COMMANDS_PER_STEP {
            let Some(command) = self.machine.poll_command() else {
                return;
            };
            match command {
                Command::Rpc { id, request } => {
                    assert!(self.outstanding.iter().all(|(o, _)| *o != id), "id reused");
                    if let Some(point) = self.detaching {
                        assert!(
                            matches!(request, Request::Revoke { lease } if lease != point.lease),
                            "{request:?} after Detach at {point:?}"
                        );
                    }
                    if let Request::Revoke { lease } = request {
                        // A held retired lease's first revoke goes only
                        // once the user settled on another, current lease
                        // (rule 6; its copies follow on their own); a stop
                        // or detach sends its last revoke anyway.
                        if self.hold_retired
                            && !self.stop_requested
                            && self.detaching.is_none()
                            && !self.revoking.contains(&lease)
                        {
                            assert!(
                                self.settled.is_some_and(|s| s != lease),
                                "a held lease {lease} revoked before the user settled elsewhere"
                            );
                            self.revoking.push(lease);
                        }
                    }
                    if self.stop_requested {
                        assert!(
                            matches!(request, Request::Revoke { .. }),
                            "{request:?} after stop"
                        );
                        // Copies of the revoke (an unanswered one is sent
                        // again) name the same lease, one outstanding at a
                        // time; besides, one last revoke of each lease given
                        // up earlier (notified Lost) may go out.
                        let Request::Revoke { lease } = request else {
                            unreachable!("checked above")
                        };
                        if !self.given_up(lease) {
                            assert!(
                                self.revoked.is_none_or(|l| l == lease),
                                "a revoke of another lease"
                            );
                            self.revoked = Some(lease);
                            assert!(
                                !self.outstanding.iter().any(|(_, r)| matches!(
                                    r,
                                    Request::Revoke { lease: l } if !self.given_up(*l)
                                )),
                                "a second revoke outstanding"
                            );
                        }
                    }
                    self.outstanding.push((id, request));
                }
                Command::Cancel { id } => self.outstanding.retain(|(o, _)| *o != id),
                Command::Notify(KeepaliveNotice::Trusted { until, .. }) => {
                    assert!(self.announce_trust, "deadline told unasked");
                    assert_eq!(
                        self.machine.local_deadline(),
                        Some(until),
                        "told a deadline that is not the machine's"
                    );
                    assert!(until > self.now, "told a deadline already past");
                }
                Command::Notify(KeepaliveNotice::Detached(point)) => {
                    assert_eq!(self.detaching, Some(point), "detached at another point");
                    assert!(self.detached.is_none(), "detached twice");
                    self.detached = Some(point);
                }
                Command::Notify(KeepaliveNotice::State(n)) => {
                    assert_ne!(self.notifications.last(), Some(&n), "repeated notification");
                    assert!(
                        !matches!(
                            self.notifications.last(),
                            Some(LivenessState::Stopped { .. })
                        ),
                        "notification after Stopped"
                    );
                    if let (Some(_), LivenessState::Registered { .. }) = (self.resumed, &n) {
                        self.resumed = None;
                    }
                    if let LivenessState::Registered { lease } = &n {
                        if self.held.last() != Some(lease) {
                            self.held.push(*lease);
                        }
                    }
                    // Settled on a lease no longer current: not settled.
                    let still = matches!(&n, LivenessState::Registered { lease }
                        | LivenessState::Suspended { lease } if self.settled == Some(*lease));
                    if !still {
                        self.settled = None;
                    }
                    self.notifications.push(n);
                }
                // A report of a failed grant; it claims nothing.
                Command::Notify(KeepaliveNotice::GrantFailed { .. }) => {
                    assert!(self.announce_failures, "a failed grant told unasked");
                }
            }
        }
        panic!("more than {MAX_COMMANDS_PER_STEP} commands in one step");
    }

    /// `lease` was notified `Lost`: the machine gave it up.
    fn given_up(&self, lease: LeaseId) -> bool {
        self.handed.contains(&lease)
            || self
                .notifications
                .iter()
                .any(|n| matches!(n, LivenessState::Lost { lease: l } if *l == lease))
    }

    fn check(&self) {
        if let Some(at) = self.machine.poll_timeout() {
            assert!(at >= self.now, "poll_timeout before now");
        }
        let renewals = self
            .outstanding
            .iter()
            .filter(|(_, r)| matches!(r, Request::KeepAlive { .. }))
            .count();
        assert!(renewals <= 1, "{renewals} renewals outstanding");
        if let Some(lease) = self.machine.lease() {
            let expiry = self
                .etcd
                .lease_deadline(lease)
                .expect("machine trusts an expired lease");
            let local = self
                .machine
                .local_deadline()
                .expect("a held lease has a deadline");
            assert!(local <= expiry, "local deadline after the model's expiry");
            assert!(
                local > self.now,
                "a lease past its local deadline is still held"
            );
        }
        if matches!(self.machine.state(), LivenessState::Stopped { .. }) {
            assert_eq!(self.machine.poll_timeout(), None);
            assert!(self.machine.lease().is_none());
        }
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        self.etcd.advance(self.now);
        if self.machine.poll_timeout().is_some_and(|at| at <= self.now) {
            self.machine.handle_timeout(self.now);
        }
    }

    fn reply(&mut self, pick: u8, outcome: Outcome, latency_ms: u8) {
        if self.outstanding.is_empty() {
            return;
        }
        let (id, request) = self
            .outstanding
            .remove(usize::from(pick) % self.outstanding.len());
        let result = match outcome {
            Outcome::Truth => self.process(&request, None),
            Outcome::Ttl(t) => self.process(&request, Some(t)),
            Outcome::Unavailable => Err(RpcError::Unavailable("injected".into())),
            Outcome::LostReply => {
                let _ = self.process(&request, None);
                Err(RpcError::Unavailable("reply lost".into()))
            }
            Outcome::LeaseNotFound => Err(RpcError::LeaseNotFound),
            Outcome::TtlZero => Ok(Response::KeptAlive { ttl_secs: 0 }),
            Outcome::WrongVariant => Ok(Response::Put { revision: 1 }),
        };
        // Time passes (and timers fire) between processing and delivery.
        self.advance(Duration::from_millis(u64::from(latency_ms)));
        self.machine
            .handle(self.now, RpcReply { id, result }.into());
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::AdvanceMs(ms) => self.advance(Duration::from_millis(u64::from(ms))),
            Op::AdvanceSecs(s) => self.advance(Duration::from_secs(u64::from(s))),
            Op::AdvanceToTimeout => {
                if let Some(at) = self.machine.poll_timeout() {
                    self.advance(at.saturating_duration_since(self.now));
                }
            }
            Op::Reply {
                pick,
                outcome,
                latency_ms,
            } => self.reply(pick, outcome, latency_ms),
            Op::DropStream => {
                let renewal = self
                    .outstanding
                    .iter()
                    .position(|(_, r)| matches!(r, Request::KeepAlive { .. }));
                if let Some(index) = renewal {
                    let (id, _) = self.outstanding.remove(index);
                    let result = Err(RpcError::Unavailable("stream dropped".into()));
                    self.machine
                        .handle(self.now, RpcReply { id, result }.into());
                }
            }
            Op::ExtendLeases => self.etcd.extend_all_leases(self.now),
            Op::Settle(pick) => {
                let current = self.machine.lease();
                let lease = match pick % 2 {
                    0 => current,
                    _ => self
                        .held
                        .iter()
                        .rev()
                        .find(|l| Some(**l) != current)
                        .copied(),
                };
                if let Some(lease) = lease {
                    // Only the current lease is settled on (the input's
                    // contract); another changes nothing.
                    if Some(lease) == current {
                        self.settled = Some(lease);
                    }
                    self.machine
                        .handle(self.now, KeepaliveInput::Settled { lease });
                }
            }
            Op::Stop => {
                self.stop_requested = true;
                self.machine.handle(self.now, KeepaliveInput::Stop);
            }
            Op::Stray(reply) => {
                if self.outstanding.iter().all(|(id, _)| *id != reply.id) {
                    self.machine.handle(self.now, reply.into());
                }
            }
            Op::Replace => {
                if let Some(lease) = self.machine.lease() {
                    // A point's lease a lease-only successor could not
                    // prove is given up without `Lost`, and may still be
                    // queued for its revoke.
                    let first_given_up = !self
                        .notifications
                        .iter()
                        .any(|n| matches!(n, LivenessState::Lost { .. }))
                        && self.handed.iter().all(|l| *l == lease);
                    self.machine
                        .handle(self.now, KeepaliveInput::Replace { lease });
                    self.drain();
                    // Not held, nothing else being retired: revoked at
                    // once. (Otherwise it may queue behind an earlier one,
                    // or wait until the user settled on a new lease.)
                    assert!(
                        self.hold_retired
                            || !first_given_up
                            || self
                                .outstanding
                                .iter()
                                .any(|(_, r)| *r == Request::Revoke { lease }),
                        "a replaced lease is not being revoked"
                    );
                    assert_ne!(self.machine.lease(), Some(lease), "replaced but kept");
                }
            }
            Op::Gone => {
                if let Some(lease) = self.machine.lease() {
                    self.machine
                        .handle(self.now, KeepaliveInput::LeaseGone { lease });
                    assert_ne!(self.machine.lease(), Some(lease), "gone but kept");
                }
            }
            Op::Detach => {
                if self.stop_requested || self.detaching.is_some() {
                    return;
                }
                match self.machine.resume_point() {
                    Some(point) => self.detaching = Some(point),
                    // Nothing to hand over: a stop.
                    None => self.stop_requested = true,
                }
                self.machine.handle(self.now, KeepaliveInput::Detach);
                self.drain();
                if let Some(point) = self.detaching {
                    assert_eq!(self.detached, Some(point), "Detached not told");
                    assert!(
                        matches!(
                            self.notifications.last(),
                            Some(LivenessState::Stopped { revoked: false })
                        ),
                        "a detach that does not stop without a revoke"
                    );
                }
            }
            Op::Resume => {
                let Some(point) = self.detached.take() else {
                    return;
                };
                self.incarnation += 1;
                self.machine = Keepalive::resume(
                    self.config.clone(),
                    self.now,
                    self.seed,
                    self.incarnation << 32,
                    point,
                );
                // The detached process is gone, and its requests with it.
                self.outstanding.clear();
                self.notifications.clear();
                self.detaching = None;
                // A stop asked of the detached machine was not this one's.
                self.stop_requested = false;
                self.revoked = None;
                self.machine.set_hold_retired(self.hold_retired);
                self.machine.set_announce_failures(self.announce_failures);
                self.settled = None;
                self.resumed = Some(point);
                self.handed.push(point.lease);
            }
        }
    }
}

fuzz_target!(|input: Input| {
    let now = Instant::now();
    let config = KeepaliveConfig {
        ttl_secs: i64::from(input.ttl_secs),
        backoff: BackoffConfig {
            initial: Duration::from_millis(u64::from(input.initial_ms)),
            max: Duration::from_millis(u64::from(input.max_ms)),
            multiplier: u32::from(input.multiplier),
            jitter_percent: input.jitter_percent,
        },
        safety_margin: Duration::from_millis(u64::from(input.margin_ms)),
        drift_allowance_ppm: input.drift_allowance_ppm,
        attempt_timeout: Duration::from_millis(u64::from(input.attempt_ms)),
        // From a field the input has, so the committed corpus keeps its
        // meaning.
        announce_trust: input.ttl_secs & 1 == 1,
    };
    let announce_trust = config.announce_trust;
    let mut machine = Keepalive::new(config.clone(), now, input.seed);
    machine.set_hold_retired(input.hold_retired);
    machine.set_announce_failures(input.announce_failures);
    let mut run = Run {
        machine,
        etcd: ModelEtcd::new(),
        now,
        hold_retired: input.hold_retired,
        announce_failures: input.announce_failures,
        settled: None,
        held: Vec::new(),
        revoking: Vec::new(),
        outstanding: Vec::new(),
        notifications: Vec::new(),
        announce_trust,
        stop_requested: false,
        revoked: None,
        config,
        seed: input.seed,
        detaching: None,
        detached: None,
        resumed: None,
        incarnation: 0,
        handed: Vec::new(),
    };
    run.drain();
    run.check();
    for op in input.ops.into_iter().take(2_000) {
        run.apply(op);
        run.drain();
        run.check();
    }
});
