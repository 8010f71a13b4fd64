//! Fuzz a host registration on its own lease (`sm/src/host.rs`: a
//! registration on a lease-only keepalive, as `HostLiveness` runs it)
//! against the shared model etcd (`fleetcoord-test-support`).
//!
//! The target plays the wire as `keepalive.rs` does: it answers any
//! outstanding request, in any order, truthfully (the model etcd executes
//! it at the reply instant), with a chosen TTL (the model then keeps the
//! lease that long), with a failure, a lost reply (executed, then an
//! error), a "lease not found", a TTL of 0, or a reply of the wrong
//! variant; it advances time (expiring leases), breaks the renewal
//! stream, extends every lease (an etcd leader change), changes the value,
//! stops, detaches, resumes a successor, and feeds stray replies. After
//! every step:
//! * while `lease()` is `Some` (the key written), the model etcd still has
//!   that lease, its expiry is not before the keepalive's local deadline,
//!   and the key is bound to it: no key on a dead lease is believed;
//! * at most one renewal is outstanding;
//! * after `Stop` no grant goes out; the leave (the key deleted, in one
//!   transaction with the marker put exactly when one is configured) goes
//!   out before the revoke, of the lease the marker is written on; `Left`
//!   is told only after a leave and before the revoke; after the revoke only revokes go out, of that lease (one
//!   outstanding at a time) or of leases the keepalive gave up; once
//!   `Stopped`, `poll_timeout` is `None` and `Stopped` is the last
//!   notification;
//! * consecutive notifications differ;
//! * a told deadline (`Trusted`, with `announce_trust`, which odd TTLs ask
//!   for) is the keepalive's local deadline at that moment, later than
//!   `now`, and never told unasked;
//! * `poll_timeout` is never before `now`; draining commands terminates;
//! * detach (host rule 6): after `Detach` with a registration to hand
//!   over, nothing is sent but last revokes of other leases (no leave, no
//!   revoke of the point's lease), and `Detached` tells the point
//!   `resume_point()` gave, then `Stopped`; with nothing to hand over a
//!   detach is a stop;
//! * resume (host rule 7): registered on the point's lease, the successor
//!   (`Host::with_first_rpc_id` from the point) finds the model holding
//!   the key incarnation of the point (the same create revision: watchers
//!   see no `Down`/`Up`).

#![no_main]

use arbitrary::Arbitrary;
use fleetcoord_sm::host::{Host, HostConfig, HostInput, HostNotice};
use fleetcoord_sm::keepalive::{KeepaliveConfig, LivenessState};
use fleetcoord_sm::registration::RegistrationPoint;
use fleetcoord_sm::{
    BackoffConfig, Command, KeyRange, LeaseId, Machine, Request, Response, RpcError, RpcId,
    RpcReply, TxnOp,
};
use fleetcoord_test_support::ModelEtcd;
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};

const MAX_COMMANDS_PER_STEP: usize = 1_000;
const KEY: &[u8] = b"/coord/hosts/h";
const MARKER: &[u8] = b"/coord/hosts/h/left";

#[derive(Arbitrary, Debug)]
struct Input {
    ttl_secs: i8,
    /// Announce a leave marker on stop.
    leave_marker: bool,
    seed: u64,
    initial_ms: u16,
    max_ms: u16,
    multiplier: u8,
    jitter_percent: u8,
    /// 0 sends no copies of the keepalive's unanswered grants and revokes.
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
    SetValue(u8),
    Stop,
    /// A reply to an id the machine is not waiting for.
    Stray(RpcReply),
    /// The user detaches the host (a restart, host rule 6).
    Detach,
    /// A successor resumes from the detached point (host rule 7).
    Resume,
}

/// Whether `txn` is a leave: the key deleted, with the marker put when
/// one is configured.
fn is_leave(txn: &fleetcoord_sm::Txn) -> bool {
    txn.success
        .iter()
        .any(|op| matches!(op, TxnOp::Delete(KeyRange::Key(k)) if k.as_slice() == KEY))
        && txn.success.iter().all(|op| match op {
            TxnOp::Delete(KeyRange::Key(k)) => k.as_slice() == KEY,
            TxnOp::Put { key, .. } => key.as_slice() == MARKER,
            _ => false,
        })
}

struct Run {
    machine: Host,
    etcd: ModelEtcd,
    now: Instant,
    outstanding: Vec<(RpcId, Request)>,
    notifications: Vec<LivenessState>,
    /// The keepalive was asked to tell its deadline's moves.
    announce_trust: bool,
    stop_requested: bool,
    /// The stop's revoke went out, of this lease.
    revoked: Option<LeaseId>,
    leave_marker: bool,
    /// A leave went out.
    leave_sent: bool,
    /// The lease a leave's marker was written on.
    leave_lease: Option<LeaseId>,
    config: HostConfig,
    seed: u64,
    /// Detach asked with this point to hand over.
    detaching: Option<RegistrationPoint>,
    /// `Detached` told; no successor yet.
    detached: Option<RegistrationPoint>,
    /// The host was resumed from this point and has not registered.
    resumed: Option<RegistrationPoint>,
    /// Machines run so far (each successor's request ids are its own).
    incarnation: u64,
    /// The lease the keepalive held after the last step.
    held: Option<LeaseId>,
    /// Leases the keepalive held and gave up, and the points' leases
    /// handed over (a successor that cannot take one over gives it up
    /// without ever holding it): revoking them is retiring.
    given_up: Vec<LeaseId>,
}

impl Run {
    /// Executes `request` on the model at `now`. With `ttl`, a grant or a
    /// renewal reports that TTL instead of etcd's, and the model keeps the
    /// lease that long, so the checks still hold the machine to what it was
    /// told. A TTL of 0 leaves a renewal truthful and makes a grant's lease
    /// die at once.
    fn process(&mut self, request: &Request, ttl: Option<u8>) -> Result<Response, RpcError> {
        match request {
            // The key put guarded (an earlier leave's marker deleted with
            // it), or the leave.
            Request::Txn(txn) => assert!(
                txn.success.iter().all(|op| match op {
                    TxnOp::Put { key, .. } => key.as_slice() == KEY,
                    TxnOp::Delete(KeyRange::Key(key)) => key.as_slice() == MARKER,
                    _ => false,
                }) || is_leave(txn),
                "a txn {txn:?}"
            ),
            Request::Grant { .. }
            | Request::KeepAlive { .. }
            | Request::Revoke { .. }
            | Request::LeaseTimeToLive { .. } => {}
            other => panic!("a host never sends {other:?}"),
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

    /// A lease the keepalive held and holds no more was given up (not
    /// the one a stop revokes or a detach hands over: the checks hold
    /// those to their own rules).
    fn note_held(&mut self) {
        let held = self.machine.keepalive().lease();
        if let Some(old) = self.held.filter(|old| held != Some(*old)) {
            if !self.stop_requested && self.detaching.is_none() {
                self.given_up.push(old);
            }
        }
        self.held = held;
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
                    if self.stop_requested {
                        self.after_stop(&request);
                    }
                    self.outstanding.push((id, request));
                }
                Command::Cancel { id } => self.outstanding.retain(|(o, _)| *o != id),
                Command::Notify(HostNotice::Trusted { until, .. }) => {
                    assert!(self.announce_trust, "deadline told unasked");
                    assert_eq!(
                        self.machine.local_deadline(),
                        Some(until),
                        "told a deadline that is not the keepalive's"
                    );
                    assert!(until > self.now, "told a deadline already past");
                }
                Command::Notify(HostNotice::Left { lease }) => {
                    assert!(self.leave_sent, "Left without a leave");
                    assert!(
                        self.leave_lease.is_none_or(|l| l == lease),
                        "Left on another lease than its marker's"
                    );
                    assert!(self.revoked.is_none(), "Left after the revoke");
                }
                Command::Notify(HostNotice::Detached(point)) => {
                    assert_eq!(self.detaching, Some(point), "detached at another point");
                    assert!(self.detached.is_none(), "detached twice");
                    self.detached = Some(point);
                }
                Command::Notify(HostNotice::State(n)) => {
                    assert_ne!(self.notifications.last(), Some(&n), "repeated notification");
                    assert!(
                        !matches!(
                            self.notifications.last(),
                            Some(LivenessState::Stopped { .. })
                        ),
                        "notification after Stopped"
                    );
                    if let (Some(point), LivenessState::Registered { lease }) = (self.resumed, &n) {
                        if *lease == point.lease {
                            let created = self.etcd.get(KEY).map(|kv| kv.create_revision);
                            assert_eq!(
                                created,
                                Some(point.create_revision),
                                "resumed on the point's lease with another key"
                            );
                        }
                        self.resumed = None;
                    }
                    self.notifications.push(n);
                }
                // A report of a failed grant; it claims nothing.
                Command::Notify(HostNotice::GrantFailed { .. }) => {}
            }
        }
        panic!("more than {MAX_COMMANDS_PER_STEP} commands in one step");
    }

    /// What may go out once the user asked to stop.
    fn after_stop(&mut self, request: &Request) {
        match request {
            Request::Grant { .. } => panic!("a grant after stop"),
            Request::Txn(txn) if is_leave(txn) => {
                assert!(self.revoked.is_none(), "a leave after the revoke");
                let lease = txn.success.iter().find_map(|op| match op {
                    TxnOp::Put { key, lease, .. } if key.as_slice() == MARKER => Some(*lease),
                    _ => None,
                });
                assert!(
                    self.leave_lease.is_none() || self.leave_lease == lease,
                    "leaves on two leases"
                );
                assert_eq!(
                    lease.is_some(),
                    self.leave_marker,
                    "a marker iff configured"
                );
                self.leave_sent = true;
                self.leave_lease = lease;
            }
            Request::Revoke { lease } if !self.given_up.contains(lease) => {
                assert!(
                    self.revoked.is_none_or(|l| l == *lease),
                    "a revoke of another lease"
                );
                assert!(
                    self.leave_lease.is_none_or(|l| l == *lease),
                    "the leave went on another lease than the one revoked"
                );
                assert!(
                    !self.outstanding.iter().any(|(_, r)| matches!(
                        r,
                        Request::Revoke { lease: l } if !self.given_up.contains(l)
                    )),
                    "a second revoke outstanding"
                );
                self.revoked = Some(*lease);
            }
            Request::Revoke { .. } => {}
            // Renewals while the leave is out, and the registration's
            // put in flight at the stop: never after the revoke.
            other => assert!(self.revoked.is_none(), "{other:?} after the stop's revoke"),
        }
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
                .expect("the host believes a key on an expired lease");
            let local = self
                .machine
                .local_deadline()
                .expect("a registered host's lease has a deadline");
            assert!(local <= expiry, "local deadline after the model's expiry");
            assert!(
                local > self.now,
                "a lease past its local deadline is still held"
            );
            let bound = self.etcd.get(KEY).map(|kv| kv.lease);
            assert_eq!(bound, Some(lease), "registered but the key is not bound");
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
            self.note_held();
        }
    }

    fn give(&mut self, input: HostInput) {
        self.machine.handle(self.now, input);
        self.note_held();
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
            Outcome::WrongVariant => Ok(match request {
                Request::Txn(_) => Response::Revoked,
                _ => Response::Put { revision: 1 },
            }),
        };
        // Time passes (and timers fire) between processing and delivery.
        self.advance(Duration::from_millis(u64::from(latency_ms)));
        self.give(HostInput::Rpc(RpcReply { id, result }));
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
                    self.give(HostInput::Rpc(RpcReply { id, result }));
                }
            }
            Op::ExtendLeases => self.etcd.extend_all_leases(self.now),
            Op::SetValue(v) => self.give(HostInput::SetValue(vec![v])),
            Op::Stop => {
                self.stop_requested = true;
                self.give(HostInput::Stop);
            }
            Op::Stray(reply) => {
                if self.outstanding.iter().all(|(id, _)| *id != reply.id) {
                    self.give(HostInput::Rpc(reply));
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
                self.give(HostInput::Detach);
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
                self.machine = Host::with_first_rpc_id(
                    self.config.clone(),
                    self.now,
                    self.seed,
                    self.incarnation << 32,
                    Some(point),
                );
                // The detached process is gone, and its requests with it.
                self.outstanding.clear();
                self.notifications.clear();
                self.detaching = None;
                // A stop asked of the detached machine was not this one's.
                self.stop_requested = false;
                self.revoked = None;
                self.leave_sent = false;
                self.leave_lease = None;
                self.resumed = Some(point);
                self.held = None;
                self.given_up.push(point.lease);
            }
        }
    }
}

fuzz_target!(|input: Input| {
    let now = Instant::now();
    let backoff = BackoffConfig {
        initial: Duration::from_millis(u64::from(input.initial_ms)),
        max: Duration::from_millis(u64::from(input.max_ms)),
        multiplier: u32::from(input.multiplier),
        jitter_percent: input.jitter_percent,
    };
    let config = HostConfig {
        lease: KeepaliveConfig {
            ttl_secs: i64::from(input.ttl_secs),
            backoff: backoff.clone(),
            safety_margin: Duration::from_millis(u64::from(input.margin_ms)),
            drift_allowance_ppm: input.drift_allowance_ppm,
            attempt_timeout: Duration::from_millis(u64::from(input.attempt_ms)),
            announce_trust: input.ttl_secs & 1 == 1,
        },
        key: KEY.to_vec(),
        value: b"0".to_vec(),
        leave_marker: input.leave_marker.then(|| MARKER.to_vec()),
        companion: None,
        // Every successor resumes its predecessor's point: no other
        // holder of the key ever appears here.
        take_over: false,
        backoff,
    };
    let announce_trust = config.lease.announce_trust;
    let mut run = Run {
        machine: Host::new(config.clone(), now, input.seed),
        etcd: ModelEtcd::new(),
        now,
        outstanding: Vec::new(),
        notifications: Vec::new(),
        announce_trust,
        stop_requested: false,
        revoked: None,
        leave_marker: input.leave_marker,
        leave_sent: false,
        leave_lease: None,
        config,
        seed: input.seed,
        detaching: None,
        detached: None,
        resumed: None,
        incarnation: 0,
        held: None,
        given_up: Vec::new(),
    };
    run.note_held();
    run.drain();
    run.check();
    for op in input.ops.into_iter().take(2_000) {
        run.apply(op);
        run.drain();
        run.check();
    }
});
