//! Lease keepalive that heals itself: grant, (put), renew, re-grant.
//!
//! [`Keepalive`] holds one etcd lease alive for as long as it runs, in one of
//! two modes: lease-only (an election session) or lease plus one key bound to
//! it ([`Binding`], host liveness). It never trusts a lease longer than etcd
//! can: the *local deadline* is the send time of the last acknowledged
//! renewal (or of the grant) plus the lease's *trusted lifetime*
//! ([`trusted_lifetime`]): the TTL etcd returned, shortened by the clock
//! drift allowance, minus the safety margin. etcd computes its own expiry
//! from the moment it *received* that request, which is later, and on its
//! own clock; as long as this machine's clock runs at least
//! `1 - drift_allowance` times as fast as etcd's, the local deadline passes
//! at least `safety_margin` (of etcd's time) before etcd can expire the
//! lease, without relying on how late etcd's expiry loop runs.
//!
//! Life cycle, as seen through [`LivenessState`] notifications
//! ([`KeepaliveNotice::State`]):
//! `Registering → Registered ⇄ Suspended`, then on loss
//! `Lost → Registering → …` again, and finally `Stopped`.
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
//! 3. When the deadline passes, a renewal reply says TTL 0, a put fails
//!    with [`RpcError::LeaseNotFound`], or the user says another request on
//!    the lease did ([`KeepaliveInput::LeaseGone`]), the lease is `Lost`: a new one is
//!    granted (at once the first time, after a backoff delay when the previous
//!    registration attempt failed) and the key put again.
//! 4. Grant and put failures are retried with backoff; a put is retried on the
//!    same lease (putting the same value again is idempotent).
//! 5. Every put of the key is guarded on the key's mod revision as this
//!    machine last knew it (0: absent), and reads the key when the guard
//!    fails. A put given up without an answer can still land later (a paused
//!    member, a proxy): unguarded, it would write an older value back, or
//!    bind the key to a lease already given up — which takes the key away
//!    when that lease goes, while this machine reports `Registered`. Guarded,
//!    it applies only if nothing was written since it was sent. A failed
//!    guard is answered with the key as it is: if it already holds the
//!    current value on the current lease (an earlier copy applied), that is
//!    the write; on a lease this machine never held, rule 12 decides;
//!    otherwise (absent, on a lease of this machine's, or on none) the put
//!    goes again at once, guarded on what was read. A grant or put
//!    refused with [`RpcError::PermissionDenied`] is reported as
//!    [`LivenessState::Refused`] and the machine stops (revoking any lease it
//!    holds): a user without the grant learns it at once instead of watching
//!    a retry loop.
//! 6. A grant, put or revoke without any reply for one requested TTL counts as
//!    failed (the request is canceled), so a lost reply never stalls the
//!    machine. Before that, one unanswered for
//!    [`KeepaliveConfig::attempt_timeout`] is sent again (the first copy is
//!    canceled): etcd drops, without answering, writes it receives while its
//!    raft leader changes. A put and a revoke are idempotent; a second grant
//!    may create a second lease, which nobody renews and which expires by
//!    itself. The first three copies wait one attempt timeout each, later
//!    ones twice as long as the one before, up to 16 attempt timeouts.
//! 7. A lease given up while etcd may still hold it — replaced
//!    ([`KeepaliveInput::Replace`]) or presumed lost when the local deadline
//!    passed — is revoked in the background, copy after copy on the same
//!    schedule, until etcd answers (revoked, not found, or a refusal): etcd
//!    extends every lease to a full TTL at each raft leader change, so an
//!    unrevoked lease can outlive its TTL, and its keys with it, for as long
//!    as leader changes keep coming. In binding mode a revoke starts only
//!    once the key is written with the current lease, so it never takes the
//!    key away; a lease-only machine told to hold them
//!    ([`Keepalive::set_hold_retired`]: a host on its own lease,
//!    [`crate::host`]) starts only once its user said its keys are written
//!    on the current lease ([`KeepaliveInput::Settled`]). At most 8 such
//!    leases are remembered; a lease etcd said is gone (TTL 0, not found)
//!    is not revoked.
//! 8. [`KeepaliveInput::Stop`] cancels everything and revokes the lease (and
//!    sends one last revoke for each lease still being retired, not waited
//!    for); no renewal, grant or put is ever sent afterwards (but the leave
//!    transaction's, below). The revoke is sent again after each attempt
//!    timeout until answered or the stop's give-up, unless the user said
//!    the lease holds nothing that matters any more
//!    ([`Keepalive::set_revoke_once`]): then one copy, one attempt timeout. [`KeepaliveInput::Draining`] announces a stop
//!    that comes once the user's own ending is done: the lease is still
//!    renewed, but one lost meanwhile (or none held) stops the machine at
//!    once, as a stop, instead of granting a lease only to revoke it.
//! 9. Leave: with [`Binding::leave_marker`] set, a stop while the key is
//!    written with the current lease first sends one transaction that puts
//!    the marker key (empty value) on that lease and deletes the key, at one
//!    revision, guarded on the key's mod revision as this machine last
//!    wrote it. A watcher sees the key deleted by the revision that creates
//!    its marker (a leave) one round trip after the stop, and
//!    [`KeepaliveNotice::Left`] tells it when etcd answers. The revoke goes
//!    out when etcd answers that transaction, whatever the answer, or after
//!    one attempt timeout (half the requested TTL when the attempt timeout
//!    is zero) without an answer, the transaction then canceled; the revoke
//!    removes the marker (unrevoked, it expires with the lease). A failed
//!    guard is answered with the key as it is: still on the current lease
//!    at another mod revision (an earlier put of this machine's landed
//!    late), the transaction goes again guarded on that revision; otherwise
//!    (another writer's key, or none) nothing is deleted and only the revoke
//!    goes. One window remains: a copy of the key's first put, given up
//!    earlier but still on its way and guarded on the key's absence, that
//!    lands between the leave and the revoke writes the key again until
//!    the revoke removes it (watchers see it come and go once more). The
//!    leave is not retried after an error. The stop's give-up (one
//!    requested TTL, from the stop) covers leave and revoke together, so
//!    the leave never makes a stop take longer than it could before. Not
//!    written when there is no key on a lease to announce (registering,
//!    stopping after a loss) nor after a refusal.
//!
//! 10. Detach ([`KeepaliveInput::Detach`]): while the key is written
//!     with the current lease, the machine stops without leaving — no
//!     marker, no delete, no revoke; the renewal or put in flight is
//!     canceled — and tells [`KeepaliveNotice::Detached`] with a
//!     [`ResumePoint`]: the lease, the key's create revision (which
//!     incarnation of the key it is) and its mod revision as last written.
//!     Leases retired earlier get their last revoke, as in a stop. With
//!     nothing to hand over (registering, lost) a detach is a stop. In
//!     lease-only mode (a session) the lease is what is handed over,
//!     whenever one is held (`Registered` or `Suspended`): the point names
//!     it with both revisions 0, and every key bound to it stays, for the
//!     next process's primitives to take over or delete.
//! 11. Resume ([`Keepalive::resume`]) starts from a [`ResumePoint`]
//!     instead of a grant. It first proves the lease alive: one renewal,
//!     answered with a TTL above zero, gives the local deadline as a
//!     renewal does (rule 1) and the lease counts as proven. Then the
//!     *resume transaction*, guarded on the key's mod revision *and* its
//!     create revision being the point's, puts the current value on the
//!     lease (reading the key otherwise); applied, the key's mod revision is
//!     the transaction's, and the machine is `Registered` on the resumed
//!     lease, from then on as if it had granted it. Until then the state
//!     stays `Registering`. Every refusal registers afresh with a grant,
//!     at once and without `Lost` (the lease was never reported held): a
//!     renewal answered TTL 0 or not found (the lease is gone); a failed
//!     renewal or none answered within one requested TTL, and a failed
//!     guard (another incarnation of the key, or the key written since),
//!     each of which also revokes the lease in the background once the key
//!     is written anew (rule 7: it may still be alive and hold the key); a
//!     transaction refused for a missing lease. A failed guard that reads
//!     the key as this machine would write it (same lease, value and create
//!     revision: an earlier copy of the transaction applied) is the write.
//!     Puts and copies of the resume transaction follow the put rules
//!     (rules 4 to 6). A stop while the renewal is out revokes the point's
//!     lease without a leave. In lease-only mode there is no key to prove:
//!     the answered renewal alone makes the machine `Registered` on the
//!     resumed lease, and a refusal registers afresh as above (a lease that
//!     may still be alive is revoked in the background at once, since no
//!     key of this machine's waits to be written first). From a point
//!     without a lease, or (binding mode) without a create revision, a
//!     resume is a fresh registration.
//! 12. Another holder (binding mode). A failed guard that reads the key
//!     on a lease this machine never held (the last 8 granted or resumed
//!     are remembered) means another process wrote it: a crashed
//!     predecessor with the same key, whose lease runs out by itself, or a
//!     live duplicate. The machine does not write over it: it waits in
//!     [`LivenessState::Waiting`] `{ holder }`, renewing its own lease,
//!     and looks at the holder's lease as [`crate::holder`] rules: gone,
//!     the put goes again, guarded as before (the holder's key, if etcd
//!     has not deleted it yet, fails the guard and is looked at again
//!     after [`crate::holder::POLL`]); renewed past its remaining TTL, it
//!     is a live duplicate, told [`LivenessState::Duplicate`] `{ holder }`,
//!     and the machine stops, revoking its own lease (no leave: nothing of
//!     it is on the key). A crashed predecessor is waited for, at most its
//!     TTL plus a margin, and never failed. With [`Binding::take_over`],
//!     and only before this machine first wrote the key, the key is
//!     written over at once instead, and the holder's lease revoked in the
//!     background once the key is this machine's (rule 7), so the displaced
//!     holder's next renewal finds its lease gone: it re-registers, finds
//!     the key on this machine's lease and, having written the key before,
//!     never takes it back but waits as above and ends `Duplicate`. A key
//!     this machine held and finds on another lease at the leave (rule 9)
//!     is told `Duplicate` too, before `Stopped`: it was taken over.
//! 13. Stale renewals: a renewal answer extends trust only if it cannot
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
//! Backoff: registration (grant, put, an unproven lease lost) and renewal
//! failures count separately, each with its own jitter seed derived from the
//! seed given to [`Keepalive::new`]. The registration count is reset when a
//! lease is proven by its first acknowledged renewal; the renewal count on
//! every acknowledged renewal.

use crate::backoff::{Backoff, BackoffConfig};
use crate::clock::Clock;
use crate::holder::{HolderCheck, Step};
use crate::outbox::Outbox;
use crate::rpc::{
    Command, Compare, KeyRange, LeaseId, RangeRequest, Request, Response, Revision, RpcError,
    RpcId, RpcReply, Txn, TxnOp, TxnOpResponse,
};
use crate::timer::TimerTable;
use crate::Machine;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::time::{Duration, Instant};

/// The largest TTL the machine believes, in seconds (etcd's own maximum).
/// Larger replies are clamped down, which only makes the local deadline
/// earlier and therefore stays safe.
pub const MAX_TTL_SECS: i64 = 9_000_000_000;

/// A key kept bound to the lease (host liveness): it exists exactly while the
/// lease lives (or until a leave deletes it first), so its disappearance is
/// the cluster-wide "down" signal.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub struct Binding {
    /// The key written with the lease.
    pub key: Vec<u8>,
    /// Its initial value; [`KeepaliveInput::SetValue`] replaces it.
    pub value: Vec<u8>,
    /// The key of the *leave marker* announced on stop, if any (host
    /// liveness: [`leave_marker_key`](crate::watch::leave_marker_key) of
    /// `key`). See "Leave" in the module docs.
    pub leave_marker: Option<Vec<u8>>,
    /// A second key and its value put on the same lease in the same
    /// transaction as every write of `key`, so both carry one mod revision
    /// and live and die with the lease (host liveness: the host's
    /// [`incarnation_key`](crate::watch::incarnation_key)). Put before
    /// `key` in the transaction; never guarded, never read back.
    pub companion: Option<(Vec<u8>, Vec<u8>)>,
    /// Take the key over from a live holder on another lease (and revoke
    /// that lease) instead of waiting for it to expire and failing with
    /// [`LivenessState::Duplicate`] when it does not: see "Another
    /// holder" in the module docs. For an operator who means to replace
    /// a running process; `false` otherwise.
    pub take_over: bool,
}

/// The largest clock drift allowance the machine applies, in parts per
/// million (10 %); larger values are clamped down to it. A clock that errs
/// by more is broken, not drifting, and no allowance makes it safe.
pub const MAX_DRIFT_ALLOWANCE_PPM: u32 = 100_000;

/// How a [`Keepalive`] behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeepaliveConfig {
    /// Requested lease TTL in seconds; values below 1 are treated as 1. etcd
    /// may grant more, and the granted TTL is the one used. Also the time the
    /// machine waits for a grant, put or revoke reply before giving up on it.
    pub ttl_secs: i64,
    /// `Some` for lease + key mode, `None` for lease-only mode.
    pub binding: Option<Binding>,
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
    /// How long a grant, put or revoke may go unanswered before the same
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
    /// The leave transaction (see "Leave" in the module docs) applied: the
    /// key is deleted and its leave marker written on `lease` at one
    /// revision, so every watcher sees a leave. Told at most once, while
    /// stopping, before the revoke's answer and `Stopped`; never in
    /// lease-only mode.
    Left {
        /// The lease the marker is bound to (about to be revoked).
        lease: LeaseId,
    },
    /// The machine detached ([`KeepaliveInput::Detach`]): the lease and the
    /// key are left as they are, for a later machine to
    /// [resume](Keepalive::resume) from this point. Told at most once,
    /// right before `Stopped { revoked: false }`.
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

/// A registration handed from one machine to the next (a process restart):
/// the lease and the incarnation of the key written with it. See "Resume"
/// in the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumePoint {
    /// The lease the key is bound to.
    pub lease: LeaseId,
    /// The key's create revision: which incarnation of the key it is.
    pub create_revision: Revision,
    /// The key's mod revision as last written by the detached machine.
    pub key_revision: Revision,
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
    /// Replace the bound key's value; written at once when registered, and
    /// used by every later registration. Ignored in lease-only mode.
    SetValue(Vec<u8>),
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
    /// Stop for good *without* leaving: no leave marker, no delete, no
    /// revoke; the lease and the key are left to a later machine
    /// ([`Keepalive::resume`]) or to expire. Tells
    /// [`KeepaliveNotice::Detached`] first when there is a registration to
    /// hand over ([`Keepalive::resume_point`]); otherwise it is a
    /// [`KeepaliveInput::Stop`]. Ignored once stopping.
    Detach,
}

impl From<RpcReply> for KeepaliveInput {
    fn from(reply: RpcReply) -> Self {
        KeepaliveInput::Rpc(reply)
    }
}

/// What the user of a [`Keepalive`] is told, in order, via
/// [`Command::Notify`]. Consecutive notifications always differ.
///
/// Exhaustive on purpose: `fleetcoord` shows each state in a public type of
/// its own, and a new state must break that conversion's build rather than
/// be reported as another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LivenessState {
    /// Granting a lease or writing the key; nothing is registered yet.
    Registering,
    /// The lease is held (and the key written, in binding mode).
    Registered {
        /// The lease.
        lease: LeaseId,
    },
    /// Renewals are failing; the lease may still be alive and renewals are
    /// retried until the local deadline.
    Suspended {
        /// The lease.
        lease: LeaseId,
    },
    /// The lease is gone (local deadline passed or etcd said so); a new one
    /// is being granted.
    Lost {
        /// The lease that was lost.
        lease: LeaseId,
    },
    /// The key is held on `holder`, a lease this machine never held: a
    /// crashed predecessor's, expiring, or a live duplicate's. Nothing is
    /// registered; the machine waits until that lease is gone (then
    /// registers) or proven renewed (then `Duplicate`). See "Another
    /// holder" in the module docs.
    Waiting {
        /// The lease the key is held on.
        holder: LeaseId,
    },
    /// Another registration holds the key on `holder`, which is alive: it
    /// was renewed past its TTL while this machine waited, or it took the
    /// key over from this machine (found so at a write or at the leave).
    /// No retry fixes it; the machine is stopping (never deleting that
    /// key) and `Stopped` follows.
    Duplicate {
        /// The other registration's lease.
        holder: LeaseId,
    },
    /// etcd refused the grant or the write with permission denied, which no
    /// retry fixes; the machine is stopping and `Stopped` follows.
    Refused {
        /// What etcd said.
        error: RpcError,
    },
    /// Final. `revoked` is false when there was no lease to revoke or the
    /// revoke failed (the lease then expires on its own).
    Stopped {
        /// Whether etcd confirmed the revoke.
        revoked: bool,
    },
}

/// A refusal no retry of the machine's can fix: the user lacks the
/// permission. Other refusals stay retried: a missing lease is fixed by a
/// new one, and a `Rejected` write may be etcd's space alarm, which an
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
    /// Next grant/put attempt, or the give-up instant of the outstanding
    /// grant, put or revoke.
    Retry,
    /// The outstanding grant, put or revoke has gone unanswered for an
    /// attempt timeout: send it again.
    Attempt,
    /// The revoke of the first retired lease has gone unanswered for its
    /// attempt timeout: send it again ([`Retired`]).
    RetireAttempt,
    /// The next look at another holder's lease, or the give-up instant of
    /// the outstanding one ([`Probe`]).
    Look,
}

/// How many leases of this machine's are remembered as its own: a key
/// found on one of them is this machine's earlier write, not another
/// holder's.
const MAX_HELD: usize = 8;

/// Waiting on another holder of the key (see "Another holder" in the
/// module docs).
#[derive(Clone, Debug)]
struct Probe {
    check: HolderCheck,
    /// The look in flight and its send time.
    look: Option<(RpcId, Instant)>,
}

/// How many given-up leases are remembered for revoking at most; beyond
/// that the oldest is left to expire by itself.
const MAX_RETIRED: usize = 8;

/// Leases given up while etcd may still hold them (replaced at the user's
/// request, or presumed lost when the local deadline passed), revoked one
/// after another in the background, copy after copy, until etcd answers.
/// Nobody renews them, but etcd extends every lease to a full TTL at each
/// raft leader change: while leader changes come faster than the TTL, an
/// unrevoked lease lives on, and with it any key bound to it (an election
/// candidate's key at the front of the queue stalled an election for 30 s,
/// `tests/member_restarts.rs`).
#[derive(Clone, Debug, Default)]
struct Retired {
    leases: std::collections::VecDeque<LeaseId>,
    /// The revoke in flight, of `leases[0]`.
    revoke: Option<RpcId>,
    /// Copies sent again in a row since the last answer.
    resent: u32,
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
    /// Outstanding put and the value generation it writes.
    put: Option<(RpcId, u64)>,
    /// Value generation known to be written with this lease.
    written: Option<u64>,
    /// Renewals are failing.
    failing: bool,
    /// At least one renewal was acknowledged.
    proven: bool,
}

impl Lease {
    /// A lease just granted (`proven` false) or just proven alive by a
    /// renewal (`proven` true, a resume): nothing outstanding, nothing
    /// written on it yet.
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
            put: None,
            written: None,
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
    /// Resuming a registration an earlier process detached: the renewal
    /// proving `point.lease` alive is outstanding (with its send time).
    Resuming {
        point: ResumePoint,
        renewal: (RpcId, Instant),
    },
    /// Stopping: the leave transaction is outstanding; the revoke of
    /// `lease` follows its answer or its attempt timeout.
    Leaving {
        txn: RpcId,
        lease: LeaseId,
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

/// The keepalive state machine. See the module docs for its guarantees.
#[derive(Clone, Debug)]
pub struct Keepalive {
    ttl_request: i64,
    safety_margin: Duration,
    drift_allowance_ppm: u32,
    binding: Option<Binding>,
    value_gen: u64,
    /// The key's mod revision as last seen (a put's answer or a failed
    /// guard's read); 0 when absent or never seen. Every put is guarded on
    /// it (see the module docs).
    key_revision: Revision,
    /// The key's create revision as last seen (0: unknown or absent).
    key_created: Revision,
    /// While the resume transaction is the put: the create revision it is
    /// guarded on (see "Resume" in the module docs).
    resuming: Option<Revision>,
    phase: Phase,
    state: LivenessState,
    timers: TimerTable<Timer>,
    register_backoff: Backoff,
    renew_backoff: Backoff,
    attempt_timeout: Duration,
    /// Copies sent again in a row since the last answer ([`Timer::Attempt`]).
    resent: u32,
    retired: Retired,
    /// Leases this machine held (granted or resumed), newest last, at most
    /// [`MAX_HELD`].
    held: std::collections::VecDeque<LeaseId>,
    /// Waiting on another holder of the key.
    probe: Option<Probe>,
    /// The key was written by this machine at least once: from then on a
    /// key on another lease was taken from it, and is never taken back.
    ever_written: bool,
    announce_trust: bool,
    /// [`Keepalive::set_announce_failures`].
    announce_failures: bool,
    /// Retired leases wait for [`KeepaliveInput::Settled`] on the current
    /// one before they are revoked ([`Keepalive::set_hold_retired`]).
    hold_retired: bool,
    /// Set by [`Keepalive::set_revoke_once`].
    revoke_once: bool,
    /// The lease the user last said was settled.
    settled: Option<LeaseId>,
    /// [`KeepaliveInput::Draining`] was told: a lost lease ends the machine.
    draining: bool,
    renewal_grid: Option<RenewalGrid>,
    outbox: Outbox<KeepaliveNotice>,
    clock: Clock,
}

impl Phase {
    /// Whether a stop is under way or done: nothing but the stop's own
    /// requests (the leave transaction, the revoke) goes out from here on.
    fn is_stopping(&self) -> bool {
        matches!(
            self,
            Phase::Leaving { .. }
                | Phase::Stopping { .. }
                | Phase::StoppingGrant { .. }
                | Phase::Stopped
        )
    }
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

    /// Starts at `now` by resuming the registration `point` that an
    /// earlier machine detached ([`KeepaliveInput::Detach`]): the first
    /// commands are `Notify(Registering)` and `Rpc(KeepAlive)` on
    /// `point.lease`, then the resume transaction; on any refusal it
    /// registers afresh (see "Resume" in the module docs). In lease-only
    /// mode (no binding) the renewal alone proves the point: answered with
    /// a TTL above zero, the machine is `Registered` on `point.lease`. A
    /// point without a lease (or, in binding mode, without a create
    /// revision) starts as [`Keepalive::with_first_rpc_id`] does.
    pub fn resume(
        config: KeepaliveConfig,
        now: Instant,
        seed: u64,
        first_rpc_id: u64,
        point: ResumePoint,
    ) -> Self {
        if point.lease == 0 || (config.binding.is_some() && point.create_revision <= 0) {
            return Self::with_first_rpc_id(config, now, seed, first_rpc_id);
        }
        let mut machine = Self::idle(config, now, seed, first_rpc_id);
        // The key on it is this registration's, handed over.
        machine.remember(point.lease);
        machine
            .outbox
            .notify(KeepaliveNotice::State(LivenessState::Registering));
        let renewal = machine
            .outbox
            .rpc(Request::KeepAlive { lease: point.lease });
        machine.phase = Phase::Resuming {
            point,
            renewal: (renewal, now),
        };
        // Unanswered for one requested TTL: the lease cannot be proven in
        // time, and a fresh registration is the only way forward.
        let at = now.checked_add(machine.request_timeout()).unwrap_or(now);
        machine.arm(Timer::Retry, at);
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
            binding: config.binding,
            value_gen: 0,
            key_revision: 0,
            key_created: 0,
            resuming: None,
            phase: Phase::Granting { grant: None },
            state: LivenessState::Registering,
            timers: TimerTable::new(),
            register_backoff: Backoff::new(config.backoff.clone(), register_seed),
            renew_backoff: Backoff::new(config.backoff, renew_seed),
            attempt_timeout: config.attempt_timeout,
            retired: Retired::default(),
            held: std::collections::VecDeque::new(),
            probe: None,
            ever_written: false,
            announce_trust: config.announce_trust,
            announce_failures: false,
            hold_retired: false,
            revoke_once: false,
            settled: None,
            draining: false,
            renewal_grid: None,
            resent: 0,
            outbox: Outbox::new(first_rpc_id),
            clock: Clock::new(now),
        }
    }

    /// What a later machine needs to resume this registration
    /// ([`Keepalive::resume`]): in binding mode `Some` only while the key
    /// is written with the current lease; in lease-only mode while a lease
    /// is held (both revisions 0); never once a stop is under way.
    pub fn resume_point(&self) -> Option<ResumePoint> {
        match &self.phase {
            Phase::Leased(l) if self.binding.is_none() => Some(ResumePoint {
                lease: l.id,
                create_revision: 0,
                key_revision: 0,
            }),
            Phase::Leased(l)
                if self.binding.is_some() && l.written.is_some() && self.key_created > 0 =>
            {
                Some(ResumePoint {
                    lease: l.id,
                    create_revision: self.key_created,
                    key_revision: self.key_revision,
                })
            }
            _ => None,
        }
    }

    /// The key's mod revision as this machine last saw it (0: absent or
    /// never seen); every put is guarded on it.
    pub fn key_revision(&self) -> Revision {
        self.key_revision
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

    /// While a lease is held (also while its key is still being written),
    /// the instant from which it must be presumed gone: the send time of
    /// the last grant or acknowledged renewal plus its [`trusted_lifetime`].
    /// At least the safety margin before etcd's own expiry of that lease,
    /// while this clock runs no slower than the drift allowance permits.
    /// `None` without a lease and once stopping.
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
    /// (rule 7) is revoked only once the user said its keys are written
    /// on the current lease ([`KeepaliveInput::Settled`]), so the revoke
    /// never takes away a key the user moves from lease to lease by its
    /// own writes (a host registration, [`crate::host`]): watchers then
    /// see the key move, not go and come back. `false` (the default)
    /// revokes at once. A stop or detach still sends each retired lease
    /// its last revoke.
    pub fn set_hold_retired(&mut self, hold: bool) {
        self.hold_retired = hold;
    }

    /// With `once` true, the stop's revoke is sent once and waited for one
    /// attempt timeout at most: unanswered or failed, the machine stops
    /// (`Stopped { revoked: false }`) and the lease expires after its TTL.
    /// For a lease whose keys are gone already (a host that left: only
    /// its leave marker is on it), where a copy of the revoke would only
    /// hold up the process's exit, behind a member gone silent, for what
    /// the TTL does anyway. `false` (the default) sends copies until the
    /// stop's give-up (rule 8).
    pub fn set_revoke_once(&mut self, once: bool) {
        self.revoke_once = once;
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

    /// Arms [`Timer::Attempt`] for the grant, put or revoke just sent.
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
        for timer in [
            Timer::Renew,
            Timer::Deadline,
            Timer::Retry,
            Timer::Attempt,
            Timer::Look,
        ] {
            self.timers.stop(timer);
        }
    }

    /// Remembers `lease` as this machine's own.
    fn remember(&mut self, lease: LeaseId) {
        if self.held.contains(&lease) {
            return;
        }
        if self.held.len() >= MAX_HELD {
            self.held.pop_front();
        }
        self.held.push_back(lease);
    }

    /// Ends the wait on another holder, canceling the look in flight.
    fn end_probe(&mut self) {
        if let Some(Probe {
            look: Some((id, _)),
            ..
        }) = self.probe.take()
        {
            self.outbox.cancel(id);
        }
        self.timers.stop(Timer::Look);
    }

    /// A look at the other holder's lease, with its give-up instant.
    fn send_look(&mut self, now: Instant) {
        let Some(probe) = &self.probe else { return };
        let lease = probe.check.holder();
        let id = self.outbox.rpc(Request::LeaseTimeToLive { lease });
        if let Some(probe) = &mut self.probe {
            probe.look = Some((id, now));
        }
        let wait = if self.attempt_timeout.is_zero() {
            self.request_timeout()
        } else {
            self.attempt_timeout
        };
        self.arm(Timer::Look, now.checked_add(wait).unwrap_or(now));
    }

    /// The put found the key on `holder`, a lease this machine never held
    /// (see "Another holder" in the module docs): wait on it, or, on a
    /// holder already judged gone whose key etcd has not deleted yet,
    /// look again shortly.
    fn wait_on_holder(&mut self, now: Instant, holder: LeaseId) {
        if let Phase::Leased(l) = &mut self.phase {
            // Whatever this machine wrote before is not the key any more.
            l.written = None;
        }
        match &self.probe {
            Some(p) if p.check.holder() == holder => {
                let at = now.checked_add(crate::holder::POLL).unwrap_or(now);
                self.arm(Timer::Look, at);
            }
            _ => {
                self.end_probe();
                self.probe = Some(Probe {
                    check: HolderCheck::new(holder),
                    look: None,
                });
                self.send_look(now);
            }
        }
        self.sync_state();
    }

    /// The answer to a look at the other holder's lease.
    fn on_look_reply(&mut self, now: Instant, sent: Instant, result: Result<Response, RpcError>) {
        self.timers.stop(Timer::Look);
        let step = {
            let Some(probe) = &mut self.probe else { return };
            probe.look = None;
            match &result {
                Ok(Response::LeaseTimeToLive { ttl_secs, .. }) => {
                    Some(probe.check.on_answer(sent, now, *ttl_secs))
                }
                Err(RpcError::LeaseNotFound) => Some(Step::Gone),
                _ => None,
            }
        };
        match (step, result) {
            (Some(Step::Gone), _) => self.send_put(now),
            (Some(Step::Live), _) => {
                let holder = self.probe.as_ref().map_or(0, |p| p.check.holder());
                self.end_probe();
                self.notify(LivenessState::Duplicate { holder });
                // Nothing of this machine's is on the key: no leave.
                self.stop(now, false);
            }
            (Some(Step::LookAt(at)), _) => self.arm(Timer::Look, at),
            (None, Err(e)) if is_refusal(&e) => self.refuse(now, e),
            (None, _) => {
                let delay = self.register_backoff.next_delay();
                self.arm(Timer::Look, now.checked_add(delay).unwrap_or(now));
            }
        }
    }

    /// Revoke `lease` in the background ([`Retired`]).
    fn retire(&mut self, lease: LeaseId) {
        if self.retired.leases.contains(&lease) {
            return;
        }
        if self.retired.leases.len() >= MAX_RETIRED {
            // The oldest, unless its revoke is in flight.
            let at = usize::from(self.retired.revoke.is_some());
            let _ = self.retired.leases.remove(at);
        }
        self.retired.leases.push_back(lease);
        self.start_retiring();
    }

    /// Starts revoking the first retired lease when nothing of it is under
    /// way and nothing of ours is still bound to it: in binding mode only
    /// once the key is written with the current lease, so that the revoke
    /// never takes the key away (a watcher would see the host `Down`, then
    /// `Up` again).
    fn start_retiring(&mut self) {
        let busy = self.retired.revoke.is_some() || self.timers.is_armed(Timer::RetireAttempt);
        let first = self.retired.leases.front();
        let bound_elsewhere = (self.binding.is_none() && !self.hold_retired)
            || matches!(&self.phase, Phase::Leased(l)
                if (l.written.is_some() || self.settled == Some(l.id)) && Some(&l.id) != first);
        if !busy && bound_elsewhere && !self.retired.leases.is_empty() {
            self.retired.resent = 0;
            self.send_retired_revoke();
        }
    }

    /// A copy of the revoke of the first retired lease, and its copy timer.
    fn send_retired_revoke(&mut self) {
        let Some(&lease) = self.retired.leases.front() else {
            return;
        };
        self.retired.revoke = Some(self.outbox.rpc(Request::Revoke { lease }));
        self.arm_copy(Timer::RetireAttempt, self.retired.resent);
    }

    /// The answer to a retired lease's revoke: done with it when etcd
    /// revoked it, does not have it, or refuses for good; another copy
    /// (when its timer fires) after a broken connection.
    fn on_retired_reply(&mut self, result: Result<Response, RpcError>) {
        self.retired.revoke = None;
        match result {
            Err(e) if e.is_retryable() && !self.attempt_timeout.is_zero() => {
                self.retired.resent = self.retired.resent.saturating_add(1);
                self.arm_copy(Timer::RetireAttempt, self.retired.resent);
            }
            _ => {
                self.timers.stop(Timer::RetireAttempt);
                self.retired.leases.pop_front();
                self.start_retiring();
            }
        }
    }

    /// The grant, put or revoke in flight was answered (or given up).
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
            Phase::Leased(l) => {
                if self.binding.is_some() && l.written.is_none() {
                    match &self.probe {
                        Some(p) => LivenessState::Waiting {
                            holder: p.check.holder(),
                        },
                        None => LivenessState::Registering,
                    }
                } else if l.failing {
                    LivenessState::Suspended { lease: l.id }
                } else {
                    LivenessState::Registered { lease: l.id }
                }
            }
            Phase::Leaving { .. }
            | Phase::Stopping { .. }
            | Phase::StoppingGrant { .. }
            | Phase::Stopped => return,
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
        self.remember(id);
        self.arm(Timer::Deadline, deadline);
        self.schedule_renewal(now);
        if self.binding.is_some() {
            self.send_put(now);
        }
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

    fn send_put(&mut self, now: Instant) {
        let Some(binding) = &self.binding else { return };
        let Phase::Leased(l) = &self.phase else {
            return;
        };
        let mut compare = vec![Compare::ModRevisionEquals {
            key: binding.key.clone(),
            revision: self.key_revision,
        }];
        if let Some(created) = self.resuming {
            compare.push(Compare::CreateRevisionEquals {
                key: binding.key.clone(),
                revision: created,
            });
        }
        let mut success = Vec::with_capacity(2);
        if let Some((key, value)) = &binding.companion {
            success.push(TxnOp::Put {
                key: key.clone(),
                value: value.clone(),
                lease: l.id,
            });
        }
        success.push(TxnOp::Put {
            key: binding.key.clone(),
            value: binding.value.clone(),
            lease: l.id,
        });
        let request = Request::Txn(Txn {
            compare,
            success,
            failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(
                binding.key.clone(),
            )))],
        });
        let generation = self.value_gen;
        let id = self.outbox.rpc(request);
        if let Phase::Leased(l) = &mut self.phase {
            l.put = Some((id, generation));
        }
        let at = now.checked_add(self.request_timeout()).unwrap_or(now);
        self.arm(Timer::Retry, at);
        self.arm_attempt();
    }

    fn on_put_reply(&mut self, now: Instant, generation: u64, result: Result<Response, RpcError>) {
        self.timers.stop(Timer::Retry);
        self.end_attempt();
        let Phase::Leased(l) = &mut self.phase else {
            return;
        };
        l.put = None;
        let lease = l.id;
        match result {
            Ok(Response::Txn {
                succeeded: false,
                responses,
                ..
            }) => {
                let found = responses.into_iter().find_map(|r| match r {
                    TxnOpResponse::Range { kvs } => Some(kvs.into_iter().next()),
                    _ => None,
                });
                let Some(found) = found else {
                    return self.schedule_put(now);
                };
                let take_over =
                    !self.ever_written && self.binding.as_ref().is_some_and(|b| b.take_over);
                let foreign = found
                    .as_ref()
                    .map(|kv| kv.lease)
                    .filter(|h| *h != 0 && *h != lease && !self.held.contains(h));
                if let Some(holder) = foreign.filter(|_| !take_over) {
                    if self.resuming.take().is_some() {
                        // A refused resume: afresh, guarded on absence,
                        // so the fresh put cannot land on the holder's
                        // key either; it finds it and waits.
                        self.key_revision = 0;
                        self.key_created = 0;
                        return self.abandon_resume(now, lease);
                    }
                    // Not taken over: the guard stays on what this machine
                    // last wrote, so no later put lands on the holder's key.
                    return self.wait_on_holder(now, holder);
                }
                if let Some(holder) = foreign.filter(|_| take_over) {
                    // Taken over on purpose: the holder's lease goes once
                    // the key is ours, so the holder learns it at its next
                    // renewal (TTL 0) instead of believing it still holds
                    // the key.
                    self.retire(holder);
                }
                self.key_revision = found.as_ref().map_or(0, |kv| kv.mod_revision);
                self.key_created = found.as_ref().map_or(0, |kv| kv.create_revision);
                let current = self.binding.as_ref().is_some_and(|b| {
                    found.as_ref().is_some_and(|kv| {
                        kv.lease == lease
                            && kv.value == b.value
                            && self.resuming.is_none_or(|c| c == kv.create_revision)
                    })
                });
                if current {
                    // An earlier copy of this put applied.
                    self.resuming = None;
                    self.on_put_written(now, self.value_gen);
                } else if self.resuming.take().is_some() {
                    // Another incarnation of the key, or the key moved
                    // since the detach: refused, register afresh.
                    self.abandon_resume(now, lease);
                } else {
                    self.send_put(now);
                }
            }
            Ok(Response::Txn {
                succeeded: true,
                revision,
                ..
            }) => {
                match self.resuming.take() {
                    Some(created) => self.key_created = created,
                    None if self.key_revision == 0 => self.key_created = revision,
                    None => {}
                }
                self.key_revision = revision;
                self.on_put_written(now, generation);
            }
            // The resumed lease expired between its renewal and the
            // transaction: register afresh, as for any refused resume.
            Err(RpcError::LeaseNotFound) if self.resuming.take().is_some() => {
                self.key_revision = 0;
                self.key_created = 0;
                self.abandon_resume(now, lease);
            }
            // etcd expired the lease before the key was bound to it (a
            // pause longer than the TTL): only a new lease helps.
            Err(RpcError::LeaseNotFound) => self.lose(now, true),
            Err(e) if is_refusal(&e) => self.refuse(now, e),
            _ => self.schedule_put(now),
        }
    }

    /// The key holds value `generation` on the current lease.
    fn on_put_written(&mut self, now: Instant, generation: u64) {
        let Phase::Leased(l) = &mut self.phase else {
            return;
        };
        l.written = Some(generation);
        self.ever_written = true;
        self.end_probe();
        self.sync_state();
        // The key is bound to this lease now: earlier ones may go.
        self.start_retiring();
        if generation != self.value_gen {
            self.send_put(now);
        }
    }

    /// The resume was refused: forget `lease` without telling `Lost` (it
    /// was never reported held), revoke it in the background once the key
    /// is written anew (it may still hold the key), and register afresh.
    fn abandon_resume(&mut self, now: Instant, lease: LeaseId) {
        if let Phase::Leased(l) =
            std::mem::replace(&mut self.phase, Phase::Granting { grant: None })
        {
            if let Some((id, _)) = l.renewal {
                self.outbox.cancel(id);
            }
            if let Some((id, _)) = l.put {
                self.outbox.cancel(id);
            }
        }
        self.stop_phase_timers();
        self.end_probe();
        self.resent = 0;
        self.resuming = None;
        self.retire(lease);
        self.send_grant(now);
    }

    /// The answer to the renewal that opens a resume: a TTL above zero
    /// proves the lease, and the resume transaction follows; anything else
    /// registers afresh.
    fn on_resume_renewal(
        &mut self,
        now: Instant,
        point: ResumePoint,
        sent: Instant,
        result: Result<Response, RpcError>,
    ) {
        self.timers.stop(Timer::Retry);
        let proven = match result {
            Ok(Response::KeptAlive { ttl_secs }) if ttl_secs > 0 => {
                let trusted = self.trusted(ttl_secs);
                sent.checked_add(trusted)
                    .filter(|d| *d > now)
                    .map(|d| (trusted, d))
            }
            _ => None,
        };
        let gone = matches!(
            result,
            Ok(Response::KeptAlive { ttl_secs: ..=0 }) | Err(RpcError::LeaseNotFound)
        );
        let Some((trusted, deadline)) = proven else {
            self.phase = Phase::Granting { grant: None };
            if !gone {
                // Maybe alive still: revoked once the key is written anew.
                self.retire(point.lease);
            }
            self.send_grant(now);
            return;
        };
        self.phase = Phase::Leased(Lease::fresh(point.lease, trusted, deadline, sent, true));
        self.arm(Timer::Deadline, deadline);
        if self.binding.is_none() {
            // No key to prove: the lease is held as if just granted.
            self.register_backoff.reset();
            self.schedule_renewal(now);
            self.sync_state();
            self.announce_trust();
            return;
        }
        self.key_revision = point.key_revision;
        self.key_created = point.create_revision;
        self.resuming = Some(point.create_revision);
        self.schedule_renewal(now);
        self.send_put(now);
        self.announce_trust();
    }

    /// Stops for good without leaving (see [`KeepaliveInput::Detach`]).
    fn detach(&mut self, now: Instant) {
        if self.phase.is_stopping() {
            return;
        }
        let Some(point) = self.resume_point() else {
            return self.stop(now, true);
        };
        if let Phase::Leased(l) = &self.phase {
            let ids: Vec<RpcId> = l
                .renewal
                .iter()
                .map(|(id, _)| *id)
                .chain(l.put.iter().map(|(id, _)| *id))
                .collect();
            for id in ids {
                self.outbox.cancel(id);
            }
        }
        if let Some(id) = self.retired.revoke.take() {
            self.outbox.cancel(id);
        }
        self.end_probe();
        // Leases given up earlier hold nothing the next machine resumes.
        for lease in std::mem::take(&mut self.retired.leases) {
            let _ = self.outbox.rpc(Request::Revoke { lease });
        }
        self.outbox.notify(KeepaliveNotice::Detached(point));
        self.finish(false);
    }

    fn schedule_put(&mut self, now: Instant) {
        let delay = self.register_backoff.next_delay();
        self.arm(Timer::Retry, now.checked_add(delay).unwrap_or(now));
    }

    /// Forgets the lease and registers again. `failed` says whether this
    /// counts as a failed registration attempt (then the grant waits).
    fn lose(&mut self, now: Instant, failed: bool) {
        let Phase::Leased(l) = std::mem::replace(&mut self.phase, Phase::Granting { grant: None })
        else {
            return;
        };
        for (id, _) in l.renewal.iter() {
            self.outbox.cancel(*id);
        }
        for (id, _) in l.put.iter() {
            self.outbox.cancel(*id);
        }
        self.stop_phase_timers();
        self.end_probe();
        self.resent = 0;
        self.renew_backoff.reset();
        // A resume not confirmed by now is over: the next lease's puts are
        // ordinary ones.
        self.resuming = None;
        self.notify(LivenessState::Lost { lease: l.id });
        if self.draining {
            return self.stop(now, true);
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
        // No leave announced: the leave transaction would be refused too.
        self.stop(now, false);
    }

    /// Stops for good; `announce` says whether the leave may be announced
    /// first (see the module docs).
    fn stop(&mut self, now: Instant, announce: bool) {
        // Already stopping: a second stop must not disarm the give-up and
        // the copies of the stop under way.
        if self.phase.is_stopping() {
            return;
        }
        self.end_probe();
        self.timers.clear();
        self.resent = 0;
        // A last copy of each retired lease's revoke, answers not waited
        // for: stopping must not wait on leases given up earlier.
        if let Some(id) = self.retired.revoke.take() {
            self.outbox.cancel(id);
        }
        for lease in std::mem::take(&mut self.retired.leases) {
            let _ = self.outbox.rpc(Request::Revoke { lease });
        }
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
                // Not proven, nothing announced: the saved lease (and the
                // key an earlier process left on it) is revoked.
                self.outbox.cancel(id);
                let at = now.checked_add(self.request_timeout()).unwrap_or(now);
                self.arm(Timer::Retry, at);
                self.send_stop_revoke(point.lease);
            }
            Phase::Leased(l) => {
                for (id, _) in l.renewal.iter() {
                    self.outbox.cancel(*id);
                }
                for (id, _) in l.put.iter() {
                    self.outbox.cancel(*id);
                }
                let at = now.checked_add(self.request_timeout()).unwrap_or(now);
                self.arm(Timer::Retry, at);
                let marker = self
                    .binding
                    .as_ref()
                    .and_then(|b| b.leave_marker.clone())
                    .filter(|_| announce && l.written.is_some());
                match marker {
                    Some(marker) => {
                        self.send_leave(marker, l.id);
                        let wait = if self.attempt_timeout.is_zero() {
                            self.request_timeout() / 2
                        } else {
                            self.attempt_timeout
                        };
                        let at = now.checked_add(wait).unwrap_or(now);
                        self.arm(Timer::Attempt, at);
                    }
                    None => self.send_stop_revoke(l.id),
                }
            }
            already @ (Phase::Leaving { .. }
            | Phase::Stopping { .. }
            | Phase::StoppingGrant { .. }
            | Phase::Stopped) => self.phase = already,
        }
    }

    /// The leave transaction (see "Leave" in the module docs), guarded on
    /// the key's mod revision as last known.
    fn send_leave(&mut self, marker: Vec<u8>, lease: LeaseId) {
        let Some(binding) = &self.binding else { return };
        let key = binding.key.clone();
        let request = Request::Txn(Txn {
            compare: vec![Compare::ModRevisionEquals {
                key: key.clone(),
                revision: self.key_revision,
            }],
            success: vec![
                TxnOp::Put {
                    key: marker,
                    value: Vec::new(),
                    lease,
                },
                TxnOp::Delete(KeyRange::Key(key.clone())),
            ],
            failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(key)))],
        });
        let txn = self.outbox.rpc(request);
        self.phase = Phase::Leaving { txn, lease };
    }

    /// The answer to the leave transaction: told and revoked when it
    /// applied, sent again when only an earlier write of this machine's
    /// moved the key, else revoked without a leave.
    fn on_leave_reply(&mut self, lease: LeaseId, result: Result<Response, RpcError>) {
        match result {
            Ok(Response::Txn {
                succeeded: true, ..
            }) => {
                self.outbox.notify(KeepaliveNotice::Left { lease });
                self.after_leave(None, lease);
            }
            Ok(Response::Txn {
                succeeded: false,
                responses,
                ..
            }) => {
                let found = responses.into_iter().find_map(|r| match r {
                    TxnOpResponse::Range { kvs } => kvs.into_iter().next(),
                    _ => None,
                });
                let marker = self.binding.as_ref().and_then(|b| b.leave_marker.clone());
                match (found, marker) {
                    // Still this lease's key, moved by a write of ours that
                    // landed late: guarded on what was read, the leave is
                    // sent again (each time the revision moved, so never
                    // in a loop), within the same attempt timeout.
                    (Some(kv), Some(marker))
                        if kv.lease == lease && kv.mod_revision != self.key_revision =>
                    {
                        self.key_revision = kv.mod_revision;
                        self.send_leave(marker, lease);
                    }
                    // Another registration's key: it took the key over
                    // while this machine held it. Nothing of this
                    // machine's is there to leave, and saying so is the
                    // only way its user learns it.
                    (Some(kv), _) if kv.lease != 0 && !self.held.contains(&kv.lease) => {
                        self.notify(LivenessState::Duplicate { holder: kv.lease });
                        self.after_leave(None, lease);
                    }
                    _ => self.after_leave(None, lease),
                }
            }
            // Whatever else etcd said: the revoke goes out (a failed leave
            // only makes the host read as expired).
            _ => self.after_leave(None, lease),
        }
    }

    /// The revoke that ends a stop (the TTL give-up is armed already).
    fn send_stop_revoke(&mut self, lease: LeaseId) {
        let revoke = self.outbox.rpc(Request::Revoke { lease });
        self.phase = Phase::Stopping { revoke, lease };
        self.resent = 0;
        self.arm_attempt();
    }

    /// The leave transaction was answered, or (`unanswered`: then
    /// canceled) waited for long enough: revoke.
    fn after_leave(&mut self, unanswered: Option<RpcId>, lease: LeaseId) {
        if let Some(put) = unanswered {
            self.outbox.cancel(put);
        }
        self.timers.stop(Timer::Attempt);
        self.send_stop_revoke(lease);
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
            Phase::Leased(l) => {
                // Rule 13: only the renewal in flight on this lease, by
                // its id; answers to renewals canceled at a revoke or
                // re-grant fall through.
                if let Some((_, sent)) = l.renewal.filter(|(r, _)| *r == id) {
                    self.on_renewal_reply(now, sent, result);
                } else if let Some((_, generation)) = l.put.filter(|(p, _)| *p == id) {
                    self.on_put_reply(now, generation, result);
                } else if let Some((_, sent)) = self
                    .probe
                    .as_ref()
                    .and_then(|p| p.look)
                    .filter(|(look, _)| *look == id)
                {
                    self.on_look_reply(now, sent, result);
                }
            }
            Phase::Resuming {
                point,
                renewal: (renewal, sent),
            } if *renewal == id => {
                let (point, sent) = (*point, *sent);
                self.on_resume_renewal(now, point, sent, result);
            }
            Phase::Leaving { txn, lease } if *txn == id => {
                let lease = *lease;
                self.on_leave_reply(lease, result);
            }
            Phase::Stopping { revoke, .. } if *revoke == id => match result {
                // Not found: an earlier copy revoked it (its answer lost),
                // or it expired; either way its keys are gone.
                Ok(Response::Revoked) | Err(RpcError::LeaseNotFound) => self.finish(true),
                // A broken connection in a raft leader change: another copy
                // after an attempt timeout, until the TTL give-up.
                Err(e)
                    if e.is_retryable() && !self.attempt_timeout.is_zero() && !self.revoke_once =>
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
            (Timer::Attempt, Phase::Leased(l)) => {
                if let Some((id, _)) = l.put {
                    self.outbox.cancel(id);
                    if let Phase::Leased(l) = &mut self.phase {
                        l.put = None;
                    }
                    self.resent = self.resent.saturating_add(1);
                    self.send_put(now);
                }
            }
            (Timer::Attempt, Phase::Leaving { txn, lease }) => {
                let (txn, lease) = (*txn, *lease);
                self.after_leave(Some(txn), lease);
            }
            (Timer::Attempt, Phase::Stopping { revoke, .. }) if self.revoke_once => {
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
                // The TTL give-up (`Timer::Retry`) stays where it was.
                self.arm_attempt();
            }
            (Timer::Deadline, Phase::Leased(_)) => self.lose_at_deadline(now),
            (Timer::Look, Phase::Leased(_)) => match self.probe.as_ref().and_then(|p| p.look) {
                // Unanswered until its give-up: canceled, and looked at
                // again after a backoff delay (a look is a read).
                Some((id, _)) => {
                    self.outbox.cancel(id);
                    if let Some(p) = &mut self.probe {
                        p.look = None;
                    }
                    let delay = self.register_backoff.next_delay();
                    self.arm(Timer::Look, now.checked_add(delay).unwrap_or(now));
                }
                None if self.probe.is_some() => self.send_look(now),
                None => {}
            },
            // A copy of the revoke under way (it passed `start_retiring`'s
            // check when it began; the key has only moved on since).
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
            (Timer::Retry, Phase::Leased(l)) => match l.put {
                Some((id, _)) => {
                    if let Phase::Leased(l) = &mut self.phase {
                        l.put = None;
                    }
                    self.outbox.cancel(id);
                    self.schedule_put(now);
                }
                None if l.written != Some(self.value_gen) => self.send_put(now),
                None => {}
            },
            (
                Timer::Retry,
                Phase::Leaving { txn: id, .. }
                | Phase::Stopping { revoke: id, .. }
                | Phase::StoppingGrant { grant: id },
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
            KeepaliveInput::SetValue(value) => {
                let Some(binding) = &mut self.binding else {
                    return;
                };
                if self.phase.is_stopping() {
                    return;
                }
                binding.value = value;
                self.value_gen = self.value_gen.wrapping_add(1);
                // Written now only when nothing else is pending; otherwise the
                // in-flight put or the scheduled retry picks the value up.
                // While another holder is waited on, the put after the
                // wait picks the value up.
                if let Phase::Leased(l) = &self.phase {
                    if l.put.is_none()
                        && !self.timers.is_armed(Timer::Retry)
                        && self.probe.is_none()
                    {
                        self.send_put(now);
                    }
                }
            }
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
                    self.stop(now, true);
                }
            }
            KeepaliveInput::Stop => self.stop(now, true),
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
