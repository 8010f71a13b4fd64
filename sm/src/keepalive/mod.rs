//! Lease keepalive that heals itself: grant, renew, re-grant.
//!
//! [`Keepalive`] holds one etcd lease alive for as long as it runs. It
//! knows nothing of what its user keeps on the lease: a host's key is
//! bound to it by [`crate::registration`] (composed in [`crate::host`]),
//! an election's and a shard map's keys by their own machines, all
//! through a session ([`crate::session`]). It never trusts a lease longer
//! than etcd can: the *local deadline* is the send time of the last
//! acknowledged renewal (or of the grant) plus the lease's *trusted
//! lifetime* ([`trusted_lifetime`]): the TTL etcd returned, shortened by
//! the clock drift allowance, minus the safety margin. etcd computes its
//! own expiry from the moment it *received* that request, which is later,
//! and on its own clock; as long as this machine's clock runs at least
//! `1 - drift_allowance` times as fast as etcd's, the local deadline passes
//! at least `safety_margin` (of etcd's time) before etcd can expire the
//! lease, without relying on how late etcd's expiry loop runs.
//!
//! Life cycle, as seen through [`LivenessState`] notifications
//! ([`KeepaliveNotice::State`]):
//! `Registering → Registered ⇄ Suspended`, then on loss
//! `Lost → Registering → …` again, and finally `Stopped` (after
//! `Refused` when etcd refuses for good).
//!
//! 1. Renewals: at most one `KeepAlive` outstanding; the next one is sent at
//!    `min(last_ack_send + trusted/3, now + (deadline - now)/2)` (`trusted`
//!    being the trusted lifetime), so at least half of the remaining lifetime
//!    is always left for a retry, and no renewal is scheduled at or after the
//!    local deadline.
//! 2. A failed renewal (error, wrong reply, or no reply by the midpoint of the
//!    remaining lifetime) makes the state `Suspended`; renewals are retried on
//!    the same lease after a backoff delay, but never at or after the local
//!    deadline. A retry that would land there is dropped: the deadline decides.
//! 3. When the deadline passes, a renewal reply says TTL 0, or the user says
//!    another request on the lease was refused with
//!    [`RpcError::LeaseNotFound`] ([`KeepaliveInput::LeaseGone`]), the lease
//!    is `Lost`: a new one is granted (at once the first time, after a
//!    backoff delay when the previous registration attempt failed).
//! 4. Grant failures are retried with backoff (each told as
//!    [`KeepaliveNotice::GrantFailed`] when asked,
//!    [`Keepalive::set_announce_failures`]). A grant refused with
//!    [`RpcError::PermissionDenied`] is reported as
//!    [`LivenessState::Refused`] and the machine stops (revoking any lease
//!    it holds): a user without the grant learns it at once instead of
//!    watching a retry loop.
//! 5. A grant or revoke without any reply for one requested TTL counts as
//!    failed (the request is canceled), so a lost reply never stalls the
//!    machine. Before that, one unanswered for
//!    [`KeepaliveConfig::attempt_timeout`] is sent again (the first copy is
//!    canceled): etcd drops, without answering, writes it receives while its
//!    raft leader changes. A revoke is idempotent; a second grant may
//!    create a second lease, which nobody renews and which expires by
//!    itself. The first three copies wait one attempt timeout each, later
//!    ones twice as long as the one before, up to 16 attempt timeouts.
//! 6. A lease given up while etcd may still hold it — replaced
//!    ([`KeepaliveInput::Replace`]), presumed lost when the local deadline
//!    passed, or a resume refused while it may live (rule 9) — is revoked
//!    in the background, copy after copy on the same schedule, until etcd
//!    answers (revoked, not found, or a refusal): etcd extends every lease
//!    to a full TTL at each raft leader change, so an unrevoked lease can
//!    outlive its TTL, and whatever is bound to it with it, for as long as
//!    leader changes keep coming. A machine told to hold them
//!    ([`Keepalive::set_hold_retired`]: a host on its own lease,
//!    [`crate::host`]) starts a revoke only once its user said what it
//!    keeps is written on the current lease ([`KeepaliveInput::Settled`]),
//!    so the revoke never takes it away. At most 8 such leases are
//!    remembered; a lease etcd said is gone (TTL 0, not found) is not
//!    revoked.
//! 7. [`KeepaliveInput::Stop`] cancels everything and revokes the lease (and
//!    sends one last revoke for each lease still being retired, not waited
//!    for); no renewal or grant is ever sent afterwards. The revoke is
//!    sent again after each attempt timeout until answered, and given up
//!    one requested TTL after the stop (the state is then
//!    `Stopped { revoked: false }`), unless the user said the lease holds
//!    nothing that matters any more ([`Keepalive::set_brief_revoke`]): then
//!    one copy, and given up two attempt timeouts after the first. [`KeepaliveInput::Draining`]
//!    announces a stop that comes once the user's own ending is done: the
//!    lease is still renewed, but one lost meanwhile (or none held) stops
//!    the machine at once, as a stop, instead of granting a lease only to
//!    revoke it.
//! 8. Detach ([`KeepaliveInput::Detach`]): while a lease is held
//!    (`Registered` or `Suspended`), the machine stops without revoking
//!    it — the renewal in flight is canceled — and tells
//!    [`KeepaliveNotice::Detached`] with a [`ResumePoint`] naming the
//!    lease: whatever is bound to it stays, for the next process to take
//!    over or delete. Leases retired earlier get their last revoke, as in
//!    a stop. With nothing to hand over (registering, lost) a detach is a
//!    stop.
//! 9. Resume ([`Keepalive::resume`]) starts from a [`ResumePoint`]
//!    instead of a grant. It first proves the lease alive: one renewal,
//!    answered with a TTL above zero, gives the local deadline as a
//!    renewal does (rule 1), and the machine is `Registered` on the
//!    resumed lease, from then on as if it had granted it. Until then the
//!    state stays `Registering`. Every refusal registers afresh with a
//!    grant, at once and without `Lost` (the lease was never reported
//!    held): a renewal answered TTL 0 or not found (the lease is gone); a
//!    failed renewal, or none answered within one requested TTL, which
//!    also retires the lease (rule 6: it may still be alive). A stop while
//!    the renewal is out revokes the point's lease. From a point without a
//!    lease, a resume is a fresh registration.
//! 10. Stale renewals: a renewal answer extends trust only if it cannot
//!     predate the last revoke or re-grant of that lease this machine
//!     made or learned of. Every renewal carries its own request id, and
//!     the machine matches an answer to the one renewal in flight of the
//!     lease it holds by that id alone. Each event that ends a lease's
//!     generation — a grant of a new lease, a loss (deadline, TTL 0,
//!     [`KeepaliveInput::LeaseGone`]), a [`KeepaliveInput::Replace`], a
//!     stop or detach, a refused resume — cancels the renewal in flight
//!     first. So an answer to a renewal sent before any of them (etcd may
//!     have answered it before the revoke, and deliver it after:
//!     etcd-io/etcd#21638) matches nothing and moves no deadline, whatever
//!     TTL it carries. Why ids and not the answer's header revision: a
//!     revoke of a lease with no key does not advance etcd's revision, so
//!     no revision orders it against a renewal, and the loss evidence the
//!     machine acts on (a TTL 0, a refused request, its own deadline)
//!     carries none. The renewal stream keeps the same rule for revokes
//!     (`crate::renewals`, rule 10), and trust is counted from the send
//!     of the renewal (rule 1), so an answer that comes late only
//!     shortens it.
//!
//! Backoff: registration (grant, an unproven lease lost) and renewal
//! failures count separately, each with its own jitter seed derived from the
//! seed given to [`Keepalive::new`]. The registration count is reset when a
//! lease is proven by its first acknowledged renewal; the renewal count on
//! every acknowledged renewal.

use crate::backoff::{Backoff, BackoffConfig};
use crate::clock::Clock;
use crate::outbox::Outbox;
use crate::rpc::{Command, LeaseId, Request, Response, RpcError, RpcId, RpcReply};
use crate::timer::TimerTable;
use crate::Machine;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::time::{Duration, Instant};

mod resume;
mod retire;

use retire::Retired;

/// The largest TTL the machine believes, in seconds (etcd's own maximum).
/// Larger replies are clamped down, which only makes the local deadline
/// earlier and therefore stays safe.
pub const MAX_TTL_SECS: i64 = 9_000_000_000;

/// The largest clock drift allowance the machine applies, in parts per
/// million (10 %); larger values are clamped down to it. A clock that errs
/// by more is broken, not drifting, and no allowance makes it safe.
pub const MAX_DRIFT_ALLOWANCE_PPM: u32 = 100_000;

/// How a [`Keepalive`] behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeepaliveConfig {
    /// Requested lease TTL in seconds; values below 1 are treated as 1. etcd
    /// may grant more, and the granted TTL is the one used. Also the time the
    /// machine waits for a grant or revoke reply before giving up on it.
    pub ttl_secs: i64,
    /// Delays between failed attempts.
    pub backoff: BackoffConfig,
    /// Taken off every lease's lifetime, so the local deadline passes this
    /// long before etcd can expire the lease: room for a driver that fires
    /// the deadline late and for a user acting on a belief it just checked.
    /// At most half of the drift-adjusted TTL is taken (see
    /// [`trusted_lifetime`]); `Duration::ZERO` takes nothing.
    pub safety_margin: Duration,
    /// How much slower than etcd's clock this machine's clock may run, in
    /// parts per million: the TTL is shortened by this fraction before the
    /// margin is taken off, so a clock running up to that much slow still
    /// gives up first. Clamped to [`MAX_DRIFT_ALLOWANCE_PPM`]; 0 assumes
    /// equal clock rates.
    pub drift_allowance_ppm: u32,
    /// How long a grant or revoke may go unanswered before the same
    /// request is sent again (see the module docs). `Duration::ZERO` sends
    /// no copies: a request then waits up to one TTL.
    pub attempt_timeout: Duration,
    /// Tell every move of the local deadline ([`KeepaliveNotice::Trusted`]):
    /// one notice per grant and per answered renewal, for a user that shows
    /// how long the lease is trusted or proves progress to a watchdog.
    /// `false` tells only state changes.
    pub announce_trust: bool,
}

/// Instants shared by many machines, at which their renewals are due
/// ([`Keepalive::set_renewal_grid`]): `origin + k × step` for any `k ≥ 0`.
/// A driver that keeps many leases alive on one connection gives every
/// machine the same grid, so renewals due within one step of each other
/// are sent together — one wake-up and one write for all of them instead
/// of one each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenewalGrid {
    /// Where the grid starts.
    pub origin: Instant,
    /// Its spacing. Zero, or more than a tenth of a lease's renewal
    /// interval, leaves that lease's renewals where they were.
    pub step: Duration,
}

impl RenewalGrid {
    /// The latest grid instant at or before `due`, if it is at most one
    /// step earlier, the step is non-zero and at most a tenth of
    /// `interval`; else `due` itself. Never later than `due`.
    pub fn floor(&self, due: Instant, interval: Duration) -> Instant {
        let step = self.step.as_nanos();
        if step == 0 || step.saturating_mul(10) > interval.as_nanos() {
            return due;
        }
        let Some(since) = due.checked_duration_since(self.origin) else {
            return due;
        };
        // Less than `step`, which is at most a tenth of a Duration.
        let early = u64::try_from(since.as_nanos() % step).unwrap_or(0);
        due.checked_sub(Duration::from_nanos(early)).unwrap_or(due)
    }
}

/// What a [`Keepalive`] tells its user through [`Command::Notify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeepaliveNotice {
    /// The state changed (never the same state twice in a row).
    State(LivenessState),
    /// A grant or an answered renewal moved the local deadline of `lease`
    /// to `until`: the lease is trusted until then. Only with
    /// [`KeepaliveConfig::announce_trust`]; told after the state change the
    /// same answer caused, if any. `until` is the machine's
    /// [`Keepalive::local_deadline`] and later than the instant of the
    /// answer.
    Trusted {
        /// The lease.
        lease: LeaseId,
        /// Its new local deadline.
        until: Instant,
    },
    /// The machine detached ([`KeepaliveInput::Detach`]): the lease is
    /// left as it is, for a later machine to [resume](Keepalive::resume)
    /// from this point. Told at most once, right before
    /// `Stopped { revoked: false }`.
    Detached(ResumePoint),
    /// A lease grant failed with `error` and will be tried again after a
    /// backoff delay: what a user waiting for the first lease is told when
    /// it gives up waiting (etcd out of space, say, refuses every grant
    /// but does not refuse for good). Only with
    /// [`Keepalive::set_announce_failures`]; never for a refusal, which
    /// ends in `Refused`.
    GrantFailed {
        /// What etcd (or the connection) answered.
        error: RpcError,
    },
}

/// A lease handed from one machine to the next (a process restart). See
/// "Resume" in the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumePoint {
    /// The lease handed over.
    pub lease: LeaseId,
}

/// How long a lease granted or renewed with `ttl` is trusted, counted from
/// the send of that grant or renewal: `ttl × (1 − drift) − margin`, where
/// `drift` is `drift_allowance_ppm` (clamped to [`MAX_DRIFT_ALLOWANCE_PPM`])
/// over a million, rounded against the lease, and `margin` is
/// `safety_margin` but at most half of `ttl × (1 − drift)`: a lease is
/// always trusted for at least half of that, so a margin too large for the
/// TTL etcd granted weakens the margin instead of leaving a lease that is
/// never trusted (a driver should refuse such settings up front).
pub fn trusted_lifetime(
    ttl: Duration,
    safety_margin: Duration,
    drift_allowance_ppm: u32,
) -> Duration {
    const MILLION: u128 = 1_000_000;
    let ppm = u128::from(drift_allowance_ppm.min(MAX_DRIFT_ALLOWANCE_PPM));
    let nanos = ttl.as_nanos();
    // The drift part is rounded up: never trust a nanosecond too long.
    let adjusted = nanos - (nanos * ppm).div_ceil(MILLION);
    let margin = safety_margin.as_nanos().min(adjusted / 2);
    // `adjusted` is at most `ttl`'s nanoseconds, which came from a Duration.
    let trusted = u64::try_from(adjusted - margin).unwrap_or(u64::MAX);
    Duration::from_nanos(trusted)
}

/// Inputs of a [`Keepalive`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum KeepaliveInput {
    /// The reply to one of the machine's requests (others are ignored).
    Rpc(RpcReply),
    /// etcd refused another request naming `lease` with
    /// [`RpcError::LeaseNotFound`] (an election's campaign, say): the lease
    /// is gone. If it is the current lease it is `Lost` now, and a new one
    /// is granted, instead of at the next renewal up to a third of the TTL
    /// later, while every request on the dead lease fails the same way. Any
    /// other lease (an older one, already replaced) changes nothing.
    LeaseGone {
        /// The lease etcd said does not exist.
        lease: LeaseId,
    },
    /// The user must not keep `lease` (an election could not delete a key
    /// bound to it, which would otherwise stay queued for as long as the
    /// lease lives): if it is the current lease, revoke it (the answer is
    /// not waited for; unrevoked, it expires after its TTL) and register
    /// with a new one, as after a loss. Any other lease changes nothing.
    Replace {
        /// The lease to give up.
        lease: LeaseId,
    },
    /// Everything the user keeps on the lease is written on `lease` now:
    /// with [`Keepalive::set_hold_retired`], leases given up earlier may
    /// be revoked from here on (their revoke can no longer take away
    /// what the user still needs). Any other lease than the current one
    /// changes nothing.
    Settled {
        /// The current lease.
        lease: LeaseId,
    },
    /// A stop is coming once the user's own ending is done (a host's
    /// leave, [`crate::host`]): until then the lease is kept and renewed,
    /// but one lost is not replaced — the machine stops instead, as after
    /// [`KeepaliveInput::Stop`], so no lease is granted only to be revoked.
    Draining,
    /// Revoke the lease and stop for good. Repeated calls do nothing.
    Stop,
    /// Stop for good *without* revoking the lease: it is left to a later
    /// machine ([`Keepalive::resume`]) or to expire. Tells
    /// [`KeepaliveNotice::Detached`] first when a lease is held
    /// ([`Keepalive::resume_point`]); otherwise it is a
    /// [`KeepaliveInput::Stop`]. Ignored once stopping.
    Detach,
}

impl From<RpcReply> for KeepaliveInput {
    fn from(reply: RpcReply) -> Self {
        KeepaliveInput::Rpc(reply)
    }
}

pub use crate::liveness::LivenessState;

/// A refusal no retry of the machine's can fix: the user lacks the
/// permission. Other refusals stay retried: a missing lease is fixed by a
/// new one, and a `Rejected` grant may be etcd's space alarm, which an
/// operator clears — a fleet must not unregister itself over it.
fn is_refusal(e: &RpcError) -> bool {
    matches!(e, RpcError::PermissionDenied(_))
}

/// The machine's timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// Next renewal, or the give-up instant of the outstanding one.
    Renew,
    /// The local deadline of the lease.
    Deadline,
    /// Next grant attempt, or the give-up instant of the outstanding
    /// grant, resume renewal or stop.
    Retry,
    /// The outstanding grant or revoke has gone unanswered for an attempt
    /// timeout: send it again.
    Attempt,
    /// The revoke of the first retired lease has gone unanswered for its
    /// attempt timeout: send it again ([`Retired`]).
    RetireAttempt,
}

/// One held lease.
#[derive(Clone, Debug)]
struct Lease {
    id: LeaseId,
    /// The trusted lifetime of the last grant or acknowledged renewal.
    trusted: Duration,
    deadline: Instant,
    last_ack_send: Instant,
    /// Outstanding renewal and its send time.
    renewal: Option<(RpcId, Instant)>,
    /// Renewals are failing.
    failing: bool,
    /// At least one renewal was acknowledged.
    proven: bool,
}

impl Lease {
    /// A lease just granted (`proven` false) or just proven alive by a
    /// renewal (`proven` true, a resume): nothing outstanding.
    fn fresh(
        id: LeaseId,
        trusted: Duration,
        deadline: Instant,
        sent: Instant,
        proven: bool,
    ) -> Lease {
        Lease {
            id,
            trusted,
            deadline,
            last_ack_send: sent,
            renewal: None,
            failing: false,
            proven,
        }
    }
}

#[derive(Clone, Debug)]
enum Phase {
    /// No lease; a grant is outstanding (with its send time) or scheduled.
    Granting {
        grant: Option<(RpcId, Instant)>,
    },
    Leased(Lease),
    /// Resuming a lease an earlier process detached: the renewal proving
    /// `point.lease` alive is outstanding (with its send time).
    Resuming {
        point: ResumePoint,
        renewal: (RpcId, Instant),
    },
    Stopping {
        revoke: RpcId,
        /// The lease being revoked, for a copy of the revoke.
        lease: LeaseId,
    },
    /// Stopped while a grant was in flight: waiting for it, so a lease it
    /// created is revoked instead of lingering for a TTL.
    StoppingGrant {
        grant: RpcId,
    },
    Stopped,
}

impl Phase {
    /// Whether a stop is under way or done: nothing but the stop's own
    /// revoke goes out from here on.
    fn is_stopping(&self) -> bool {
        matches!(
            self,
            Phase::Stopping { .. } | Phase::StoppingGrant { .. } | Phase::Stopped
        )
    }
}

/// The keepalive state machine. See the module docs for its guarantees.
#[derive(Clone, Debug)]
pub struct Keepalive {
    ttl_request: i64,
    safety_margin: Duration,
    drift_allowance_ppm: u32,
    phase: Phase,
    state: LivenessState,
    timers: TimerTable<Timer>,
    register_backoff: Backoff,
    renew_backoff: Backoff,
    attempt_timeout: Duration,
    /// Copies sent again in a row since the last answer ([`Timer::Attempt`]).
    resent: u32,
    retired: Retired,
    announce_trust: bool,
    /// [`Keepalive::set_announce_failures`].
    announce_failures: bool,
    /// Retired leases wait for [`KeepaliveInput::Settled`] on the current
    /// one before they are revoked ([`Keepalive::set_hold_retired`]).
    hold_retired: bool,
    /// Set by [`Keepalive::set_brief_revoke`].
    brief_revoke: bool,
    /// Whether a copy of the stop's revoke went out (its first send
    /// clears it).
    stop_copied: bool,
    /// The lease the user last said was settled.
    settled: Option<LeaseId>,
    /// [`KeepaliveInput::Draining`] was told: a lost lease ends the machine.
    draining: bool,
    renewal_grid: Option<RenewalGrid>,
    outbox: Outbox<KeepaliveNotice>,
    clock: Clock,
}

impl Keepalive {
    /// Starts registering at `now`: the first commands are
    /// `Notify(Registering)` and `Rpc(Grant)`. RPC ids start at 0.
    pub fn new(config: KeepaliveConfig, now: Instant, seed: u64) -> Self {
        Self::with_first_rpc_id(config, now, seed, 0)
    }

    /// Like [`Keepalive::new`], with RPC ids starting at `first_rpc_id`, so a
    /// machine embedding this one can keep id ranges disjoint.
    pub fn with_first_rpc_id(
        config: KeepaliveConfig,
        now: Instant,
        seed: u64,
        first_rpc_id: u64,
    ) -> Self {
        let mut machine = Self::idle(config, now, seed, first_rpc_id);
        machine
            .outbox
            .notify(KeepaliveNotice::State(LivenessState::Registering));
        machine.send_grant(now);
        machine
    }

    /// The machine before its first request.
    fn idle(config: KeepaliveConfig, now: Instant, seed: u64, first_rpc_id: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let register_seed = rng.next_u64();
        let renew_seed = rng.next_u64();
        Keepalive {
            ttl_request: config.ttl_secs.clamp(1, MAX_TTL_SECS),
            safety_margin: config.safety_margin,
            drift_allowance_ppm: config.drift_allowance_ppm,
            phase: Phase::Granting { grant: None },
            state: LivenessState::Registering,
            timers: TimerTable::new(),
            register_backoff: Backoff::new(config.backoff.clone(), register_seed),
            renew_backoff: Backoff::new(config.backoff, renew_seed),
            attempt_timeout: config.attempt_timeout,
            retired: Retired::default(),
            announce_trust: config.announce_trust,
            announce_failures: false,
            hold_retired: false,
            brief_revoke: false,
            stop_copied: false,
            settled: None,
            draining: false,
            renewal_grid: None,
            resent: 0,
            outbox: Outbox::new(first_rpc_id),
            clock: Clock::new(now),
        }
    }

    /// The state last notified.
    pub fn state(&self) -> &LivenessState {
        &self.state
    }

    /// The lease, while `Registered` or `Suspended`.
    pub fn lease(&self) -> Option<LeaseId> {
        match (&self.state, &self.phase) {
            (
                LivenessState::Registered { .. } | LivenessState::Suspended { .. },
                Phase::Leased(l),
            ) => Some(l.id),
            _ => None,
        }
    }

    /// While a lease is held, the instant from which it must be presumed
    /// gone: the send time of the last grant or acknowledged renewal plus
    /// its [`trusted_lifetime`]. At least the safety margin before etcd's
    /// own expiry of that lease, while this clock runs no slower than the
    /// drift allowance permits. `None` without a lease and once stopping.
    pub fn local_deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Leased(l) => Some(l.deadline),
            _ => None,
        }
    }

    /// From the next acknowledged renewal (or grant) on, the renewal after
    /// it is due at the latest instant of `grid` at or before the instant
    /// the renewal rule gives, at most one step earlier (see
    /// [`RenewalGrid::floor`]); `None` restores the rule's own instant.
    /// Never later than the rule: the local deadline and the safety it
    /// gives are unchanged, and a lease is renewed at most one step per
    /// interval more often.
    pub fn set_renewal_grid(&mut self, grid: Option<RenewalGrid>) {
        self.renewal_grid = grid;
    }

    /// With `announce` true, every failed grant that is tried again is
    /// told ([`KeepaliveNotice::GrantFailed`]). Off by default.
    pub fn set_announce_failures(&mut self, announce: bool) {
        self.announce_failures = announce;
    }

    /// With `hold` true, a lease given up while etcd may still hold it
    /// (rule 6) is revoked only once the user said its keys are written
    /// on the current lease ([`KeepaliveInput::Settled`]), so the revoke
    /// never takes away a key the user moves from lease to lease by its
    /// own writes (a host registration, [`crate::host`]): watchers then
    /// see the key move, not go and come back. `false` (the default)
    /// revokes at once. A stop or detach still sends each retired lease
    /// its last revoke.
    pub fn set_hold_retired(&mut self, hold: bool) {
        self.hold_retired = hold;
    }

    /// With `brief` true, the stop's revoke gets one copy: it is given up
    /// two attempt timeouts after it was first sent (unanswered, or failed
    /// twice), the machine stops (`Stopped { revoked: false }`) and the
    /// lease expires after its TTL. For a lease whose keys are gone
    /// already (a host that left: only its leave marker is on it), where
    /// more copies would only hold up the process's exit, behind a member
    /// gone silent, for what the TTL does anyway; the one copy goes after
    /// the health probes had time to route around such a member. `false`
    /// (the default) sends copies until the stop's give-up (rule 7).
    pub fn set_brief_revoke(&mut self, brief: bool) {
        self.brief_revoke = brief;
    }

    /// Whether the stop's revoke has had all the copies it gets.
    fn revoke_spent(&self) -> bool {
        self.brief_revoke && self.stop_copied
    }

    /// Whether `id` was issued by this machine (replies to it belong here).
    pub fn owns(&self, id: RpcId) -> bool {
        self.outbox.owns(id)
    }

    fn notify(&mut self, state: LivenessState) {
        if self.state != state {
            self.state = state.clone();
            self.outbox.notify(KeepaliveNotice::State(state));
        }
    }

    /// After a grant or an answered renewal: tells the new local deadline,
    /// when asked to.
    fn announce_trust(&mut self) {
        if !self.announce_trust {
            return;
        }
        if let Phase::Leased(l) = &self.phase {
            let (lease, until) = (l.id, l.deadline);
            self.outbox
                .notify(KeepaliveNotice::Trusted { lease, until });
        }
    }

    /// Arms `timer`, never earlier than the last `now` seen.
    fn arm(&mut self, timer: Timer, at: Instant) {
        self.timers.set(timer, self.clock.clamp(at));
    }

    fn request_timeout(&self) -> Duration {
        secs(self.ttl_request)
    }

    /// Arms [`Timer::Attempt`] for the grant or revoke just sent.
    fn arm_attempt(&mut self) {
        self.arm_copy(Timer::Attempt, self.resent);
    }

    /// Arms `timer` for the next copy of a request already sent `resent`
    /// times again: one attempt timeout for the first three copies, then
    /// twice as long as the one before, up to 16 attempt timeouts.
    fn arm_copy(&mut self, timer: Timer, resent: u32) {
        if self.attempt_timeout.is_zero() {
            return;
        }
        let wait = self
            .attempt_timeout
            .saturating_mul(1 << resent.saturating_sub(2).min(4));
        // Too long to represent: no copies at all (the TTL give-up stays).
        match self.clock.now().checked_add(wait) {
            Some(at) => self.timers.set(timer, at),
            None => self.timers.stop(timer),
        }
    }

    /// Stops the timers of the phase; a retired lease's revoke goes on.
    fn stop_phase_timers(&mut self) {
        for timer in [Timer::Renew, Timer::Deadline, Timer::Retry, Timer::Attempt] {
            self.timers.stop(timer);
        }
    }

    /// The grant or revoke in flight was answered (or given up).
    fn end_attempt(&mut self) {
        self.timers.stop(Timer::Attempt);
        self.resent = 0;
    }

    /// How long a grant or renewal answered with `ttl_secs` is trusted.
    fn trusted(&self, ttl_secs: i64) -> Duration {
        trusted_lifetime(secs(ttl_secs), self.safety_margin, self.drift_allowance_ppm)
    }

    /// Notifies the state that follows from the phase, if it changed.
    fn sync_state(&mut self) {
        let desired = match &self.phase {
            Phase::Granting { .. } | Phase::Resuming { .. } => LivenessState::Registering,
            Phase::Leased(l) if l.failing => LivenessState::Suspended { lease: l.id },
            Phase::Leased(l) => LivenessState::Registered { lease: l.id },
            Phase::Stopping { .. } | Phase::StoppingGrant { .. } | Phase::Stopped => return,
        };
        self.notify(desired);
    }

    fn send_grant(&mut self, now: Instant) {
        let id = self.outbox.rpc(Request::Grant {
            ttl_secs: self.ttl_request,
        });
        self.phase = Phase::Granting {
            grant: Some((id, now)),
        };
        let at = now.checked_add(self.request_timeout()).unwrap_or(now);
        self.arm(Timer::Retry, at);
        self.arm_attempt();
    }

    fn schedule_grant(&mut self, now: Instant) {
        self.phase = Phase::Granting { grant: None };
        let delay = self.register_backoff.next_delay();
        self.arm(Timer::Retry, now.checked_add(delay).unwrap_or(now));
    }

    fn on_grant_reply(&mut self, now: Instant, sent: Instant, result: Result<Response, RpcError>) {
        self.timers.stop(Timer::Retry);
        self.end_attempt();
        let granted = match result {
            Ok(Response::Granted { lease, ttl_secs }) if lease != 0 && ttl_secs > 0 => {
                let trusted = self.trusted(ttl_secs);
                sent.checked_add(trusted)
                    .filter(|d| *d > now)
                    .map(|d| (lease, trusted, d))
            }
            _ => None,
        };
        if let Err(e) = &result {
            if is_refusal(e) {
                // This grant is answered: nothing to wait for when stopping.
                self.phase = Phase::Granting { grant: None };
                return self.refuse(now, e.clone());
            }
            if self.announce_failures {
                self.outbox
                    .notify(KeepaliveNotice::GrantFailed { error: e.clone() });
            }
        }
        let Some((id, trusted, deadline)) = granted else {
            // An unusable grant (error, nonsense, or already expired) is a
            // failed attempt; whatever lease it named expires by itself.
            self.schedule_grant(now);
            return;
        };
        self.phase = Phase::Leased(Lease::fresh(id, trusted, deadline, sent, false));
        self.arm(Timer::Deadline, deadline);
        self.schedule_renewal(now);
        self.sync_state();
        self.announce_trust();
    }

    /// Arms the next renewal after an acknowledged one (or the grant).
    fn schedule_renewal(&mut self, now: Instant) {
        let Phase::Leased(l) = &self.phase else {
            return;
        };
        // A third of the *trusted* lifetime: with a safety margin the
        // deadline comes before `ttl`, and renewals keep their pace to it.
        let by_life = l.last_ack_send.checked_add(l.trusted / 3).unwrap_or(now);
        let half_left = now + l.deadline.saturating_duration_since(now) / 2;
        let due = by_life.min(half_left);
        let at = match &self.renewal_grid {
            Some(grid) => grid.floor(due, l.trusted / 3),
            None => due,
        };
        self.arm(Timer::Renew, at);
    }

    fn send_keepalive(&mut self, now: Instant) {
        let Phase::Leased(l) = &self.phase else {
            return;
        };
        let (lease, deadline) = (l.id, l.deadline);
        let id = self.outbox.rpc(Request::KeepAlive { lease });
        if let Phase::Leased(l) = &mut self.phase {
            l.renewal = Some((id, now));
        }
        // Give up on this renewal halfway to the deadline, leaving the other
        // half for retries.
        let give_up = now + deadline.saturating_duration_since(now) / 2;
        if give_up > now {
            self.arm(Timer::Renew, give_up);
        } else {
            self.timers.stop(Timer::Renew);
        }
    }

    fn on_renewal_failed(&mut self, now: Instant) {
        let Phase::Leased(l) = &mut self.phase else {
            return;
        };
        l.renewal = None;
        l.failing = true;
        let deadline = l.deadline;
        let at = now.checked_add(self.renew_backoff.next_delay());
        match at {
            Some(at) if at < deadline => self.arm(Timer::Renew, at),
            _ => self.timers.stop(Timer::Renew),
        }
        self.sync_state();
    }

    fn on_renewal_reply(
        &mut self,
        now: Instant,
        sent: Instant,
        result: Result<Response, RpcError>,
    ) {
        if let Phase::Leased(l) = &mut self.phase {
            l.renewal = None;
        }
        match result {
            Ok(Response::KeptAlive { ttl_secs }) if ttl_secs > 0 => {
                let trusted = self.trusted(ttl_secs);
                let Phase::Leased(l) = &mut self.phase else {
                    return;
                };
                let Some(deadline) = sent.checked_add(trusted).filter(|d| *d > now) else {
                    // Acknowledged, but too late to still trust the lease.
                    self.lose(now, false);
                    return;
                };
                l.trusted = trusted;
                l.deadline = deadline;
                l.last_ack_send = sent;
                l.failing = false;
                if !l.proven {
                    l.proven = true;
                    self.register_backoff.reset();
                }
                self.renew_backoff.reset();
                self.arm(Timer::Deadline, deadline);
                self.schedule_renewal(now);
                self.sync_state();
                self.announce_trust();
            }
            Ok(Response::KeptAlive { .. }) => {
                let proven = matches!(&self.phase, Phase::Leased(l) if l.proven);
                // A lease that never renewed counts as a failed registration,
                // so a server that keeps forgetting leases is not hammered.
                self.lose(now, !proven);
            }
            _ => self.on_renewal_failed(now),
        }
    }

    /// Forgets the lease and registers again. `failed` says whether this
    /// counts as a failed registration attempt (then the grant waits).
    fn lose(&mut self, now: Instant, failed: bool) {
        let Phase::Leased(l) = std::mem::replace(&mut self.phase, Phase::Granting { grant: None })
        else {
            return;
        };
        // Rule 10: an answer to this renewal, however late, moves nothing.
        if let Some((id, _)) = l.renewal {
            self.outbox.cancel(id);
        }
        self.stop_phase_timers();
        self.resent = 0;
        self.renew_backoff.reset();
        self.notify(LivenessState::Lost { lease: l.id });
        if self.draining {
            return self.stop(now);
        }
        self.sync_state();
        if failed || self.register_backoff.failures() > 0 {
            self.schedule_grant(now);
        } else {
            self.send_grant(now);
        }
    }

    /// The local deadline passed: the lease is presumed lost, but etcd may
    /// still hold it (the renewals got through, their answers did not), so
    /// it is also revoked ([`Retired`]).
    fn lose_at_deadline(&mut self, now: Instant) {
        let Phase::Leased(l) = &self.phase else {
            return;
        };
        let lease = l.id;
        self.retire(lease);
        self.lose(now, false);
    }

    /// A permanent refusal: tell the user, then stop as if asked.
    fn refuse(&mut self, now: Instant, error: RpcError) {
        self.notify(LivenessState::Refused { error });
        self.stop(now);
    }

    /// Stops for good (rule 7).
    fn stop(&mut self, now: Instant) {
        // Already stopping: a second stop must not disarm the give-up and
        // the copies of the stop under way.
        if self.phase.is_stopping() {
            return;
        }
        self.timers.clear();
        self.resent = 0;
        self.last_retired_revokes();
        match std::mem::replace(&mut self.phase, Phase::Stopped) {
            Phase::Granting {
                grant: Some((grant, _)),
            } => {
                // The grant in flight may still create a lease: wait for it
                // (bounded by the retry timer) and revoke what it created.
                self.phase = Phase::StoppingGrant { grant };
                let at = now.checked_add(self.request_timeout()).unwrap_or(now);
                self.arm(Timer::Retry, at);
            }
            Phase::Granting { grant: None } => {
                self.notify(LivenessState::Stopped { revoked: false });
            }
            Phase::Resuming {
                point,
                renewal: (id, _),
            } => {
                // Not proven, nothing announced: the saved lease (and what
                // an earlier process left on it) is revoked.
                self.outbox.cancel(id);
                let at = now.checked_add(self.request_timeout()).unwrap_or(now);
                self.arm(Timer::Retry, at);
                self.send_stop_revoke(point.lease);
            }
            Phase::Leased(l) => {
                if let Some((id, _)) = l.renewal {
                    self.outbox.cancel(id);
                }
                let at = now.checked_add(self.request_timeout()).unwrap_or(now);
                self.arm(Timer::Retry, at);
                self.send_stop_revoke(l.id);
            }
            already @ (Phase::Stopping { .. } | Phase::StoppingGrant { .. } | Phase::Stopped) => {
                self.phase = already
            }
        }
    }

    /// The revoke that ends a stop (the TTL give-up is armed already).
    fn send_stop_revoke(&mut self, lease: LeaseId) {
        let revoke = self.outbox.rpc(Request::Revoke { lease });
        self.phase = Phase::Stopping { revoke, lease };
        self.resent = 0;
        self.stop_copied = false;
        self.arm_attempt();
    }

    fn finish(&mut self, revoked: bool) {
        self.timers.clear();
        self.resent = 0;
        self.phase = Phase::Stopped;
        self.notify(LivenessState::Stopped { revoked });
    }

    fn on_reply(&mut self, now: Instant, reply: RpcReply) {
        let RpcReply { id, result } = reply;
        if self.retired.revoke == Some(id) {
            return self.on_retired_reply(result);
        }
        match &self.phase {
            Phase::Granting {
                grant: Some((grant, sent)),
            } if *grant == id => {
                let sent = *sent;
                self.on_grant_reply(now, sent, result);
            }
            // Rule 10: only the renewal in flight on this lease, by its
            // id; answers to renewals canceled at a revoke or re-grant
            // fall through.
            Phase::Leased(Lease {
                renewal: Some((renewal, sent)),
                ..
            }) if *renewal == id => {
                let sent = *sent;
                self.on_renewal_reply(now, sent, result);
            }
            Phase::Resuming {
                point,
                renewal: (renewal, sent),
            } if *renewal == id => {
                let (point, sent) = (*point, *sent);
                self.on_resume_renewal(now, point, sent, result);
            }
            Phase::Stopping { revoke, .. } if *revoke == id => match result {
                // Not found: an earlier copy revoked it (its answer lost),
                // or it expired; either way its keys are gone.
                Ok(Response::Revoked) | Err(RpcError::LeaseNotFound) => self.finish(true),
                // A broken connection in a raft leader change: another copy
                // after an attempt timeout, until the TTL give-up.
                Err(e)
                    if e.is_retryable()
                        && !self.attempt_timeout.is_zero()
                        && !self.revoke_spent() =>
                {
                    self.resent = self.resent.saturating_add(1);
                    self.arm_attempt();
                }
                _ => self.finish(false),
            },
            Phase::StoppingGrant { grant } if *grant == id => match result {
                Ok(Response::Granted { lease, .. }) if lease != 0 => {
                    let revoke = self.outbox.rpc(Request::Revoke { lease });
                    self.phase = Phase::Stopping { revoke, lease };
                    let at = now.checked_add(self.request_timeout()).unwrap_or(now);
                    self.arm(Timer::Retry, at);
                    self.resent = 0;
                    self.stop_copied = false;
                    self.arm_attempt();
                }
                _ => self.finish(false),
            },
            _ => {}
        }
    }

    fn on_timer(&mut self, now: Instant, timer: Timer) {
        match (timer, &self.phase) {
            // Unanswered for an attempt timeout: the same request again.
            (
                Timer::Attempt,
                Phase::Granting {
                    grant: Some((id, _)),
                },
            ) => {
                let id = *id;
                self.outbox.cancel(id);
                self.resent = self.resent.saturating_add(1);
                self.send_grant(now);
            }
            (Timer::Attempt, Phase::Stopping { revoke, .. }) if self.revoke_spent() => {
                let old = *revoke;
                self.outbox.cancel(old);
                self.finish(false);
            }
            (Timer::Attempt, Phase::Stopping { revoke, lease }) => {
                let (old, lease) = (*revoke, *lease);
                self.outbox.cancel(old);
                self.resent = self.resent.saturating_add(1);
                let revoke = self.outbox.rpc(Request::Revoke { lease });
                self.phase = Phase::Stopping { revoke, lease };
                self.stop_copied = true;
                // The TTL give-up (`Timer::Retry`) stays where it was.
                self.arm_attempt();
            }
            (Timer::Deadline, Phase::Leased(_)) => self.lose_at_deadline(now),
            // A copy of the revoke under way (it passed `start_retiring`'s
            // check when it began; the user has only moved on since).
            (Timer::RetireAttempt, _) => {
                if let Some(id) = self.retired.revoke.take() {
                    self.outbox.cancel(id);
                }
                self.retired.resent = self.retired.resent.saturating_add(1);
                self.send_retired_revoke();
            }
            (Timer::Renew, Phase::Leased(l)) => match l.renewal {
                Some((id, _)) => {
                    self.outbox.cancel(id);
                    self.on_renewal_failed(now);
                }
                None => self.send_keepalive(now),
            },
            (
                Timer::Retry,
                Phase::Granting {
                    grant: Some((id, _)),
                },
            ) => {
                let id = *id;
                self.outbox.cancel(id);
                self.schedule_grant(now);
            }
            (Timer::Retry, Phase::Granting { grant: None }) => self.send_grant(now),
            (
                Timer::Retry,
                Phase::Resuming {
                    point,
                    renewal: (id, _),
                },
            ) => {
                let (lease, id) = (point.lease, *id);
                self.outbox.cancel(id);
                self.phase = Phase::Granting { grant: None };
                self.retire(lease);
                self.send_grant(now);
            }
            (
                Timer::Retry,
                Phase::Stopping { revoke: id, .. } | Phase::StoppingGrant { grant: id },
            ) => {
                let id = *id;
                self.outbox.cancel(id);
                self.finish(false);
            }
            _ => {}
        }
    }
}

impl Machine for Keepalive {
    type Input = KeepaliveInput;
    type Notice = KeepaliveNotice;

    fn handle(&mut self, now: Instant, input: KeepaliveInput) {
        let now = self.clock.observe(now);
        match input {
            KeepaliveInput::Rpc(reply) => self.on_reply(now, reply),
            KeepaliveInput::LeaseGone { lease } => {
                if let Phase::Leased(l) = &self.phase {
                    if l.id == lease {
                        // As for a TTL-0 renewal: a lease that never renewed
                        // counts as a failed registration.
                        let failed = !l.proven;
                        self.lose(now, failed);
                    }
                }
            }
            KeepaliveInput::Replace { lease } => {
                if matches!(&self.phase, Phase::Leased(l) if l.id == lease) {
                    self.retire(lease);
                    self.lose(now, false);
                }
            }
            KeepaliveInput::Settled { lease } => {
                if matches!(&self.phase, Phase::Leased(l) if l.id == lease) {
                    self.settled = Some(lease);
                    self.start_retiring();
                }
            }
            KeepaliveInput::Draining => {
                self.draining = true;
                // Nothing held to keep: the stop need not wait.
                if matches!(self.phase, Phase::Granting { .. } | Phase::Resuming { .. }) {
                    self.stop(now);
                }
            }
            KeepaliveInput::Stop => self.stop(now),
            KeepaliveInput::Detach => self.detach(now),
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        // The deadline goes first so nothing is sent on a lease presumed gone.
        if let Phase::Leased(l) = &self.phase {
            if l.deadline <= now {
                self.lose_at_deadline(now);
            }
        }
        while let Some(timer) = self.timers.pop_expired(now) {
            self.on_timer(now, timer);
        }
    }

    fn poll_command(&mut self) -> Option<Command<KeepaliveNotice>> {
        self.outbox.pop()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next().map(|at| self.clock.clamp(at))
    }

    fn stop_input() -> KeepaliveInput {
        KeepaliveInput::Stop
    }

    fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Stopped) && self.outbox.is_empty()
    }
}

fn secs(ttl_secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl_secs.clamp(0, MAX_TTL_SECS)).unwrap_or(0))
}
