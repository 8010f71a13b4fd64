//! A session lease shared by many machines, as one composition: its
//! vocabulary, the hub that fans it out, and the belief rules every
//! primitive on it applies.
//!
//! * **Vocabulary.** [`SessionInput`]: the facts of a session lease, as
//!   its owner tells the machines that run on it without keeping a lease
//!   of their own: elections
//!   ([`Election::on_session`](crate::election::Election::on_session)),
//!   shard members ([`Member::on_session`](crate::shard::member::Member::on_session))
//!   and host registrations
//!   ([`Registration`](crate::registration::Registration)).
//!   [`SessionRequest`]: what such a machine asks of the lease.
//! * **The hub** ([`SessionHub`], module [`hub`]): the owner's side. It
//!   turns a lease-only [`Keepalive`](crate::keepalive::Keepalive)'s
//!   notices into facts, replays them to a late joiner, marks a dead lease
//!   and ends every belief on it before anything is told about the next
//!   one, and drops a stale `Replace`. Its invariants are numbered in
//!   [`hub`]'s docs; a driver executes its [`HubCommand`]s and decides
//!   nothing.
//! * **Belief** ([`SessionBelief`], module [`belief`]): what one primitive
//!   on a session may believe, as the hub's `EndBeliefs` commands and the
//!   primitive's own notices leave it: the dead-lease rule ([`is_dead`])
//!   and belief by the caller's clock ([`trust_left`]) in one place.
//!
//! A driver with a lease-only keepalive that announces trust feeds its
//! notices to the hub ([`SessionHub::keepalive`]); the hub tells each
//! member `Trusted { lease, until }` as [`SessionInput::Trusted`], the
//! `Registered`, `Suspended`, `Lost`, `Refused` states as `Up`,
//! `Suspended`, `Lost`, `Refused`, and [`SessionInput::Closed`] before the
//! lease is revoked.

pub mod belief;
pub mod hub;

pub use belief::SessionBelief;
pub use hub::{AttachError, DetachError, HubCommand, MemberId, SessionHub};

use crate::rpc::{LeaseId, RpcError};
use std::time::{Duration, Instant};

/// Belief by the caller's clock: how long something founded on the
/// session's trust (a leadership, an owned shard) may still be believed
/// at `now`, given `until`, the deadline last told for it (the session's
/// local deadline, or an earlier one of its own such as a release
/// deadline); `None` once `until` has come. A driver passes the
/// `Instant::now()` of the thread that asks, not of the thread that
/// reports: a report that comes late (a starved driver, a paused process)
/// can then only make belief end early, never late, since `until` only
/// ever moves on an answered renewal.
pub fn trust_left(now: Instant, until: Instant) -> Option<Duration> {
    until
        .checked_duration_since(now)
        .filter(|left| !left.is_zero())
}

/// The dead-lease rule: nothing founded on `lease` is believed when it is
/// `last_dead`, the last lease the session gave up or lost (0: none yet;
/// etcd never grants lease 0). A session marks a lease dead before it
/// ends every belief on it, so a win or a trust notice about that lease
/// that a primitive's machine reports after the ending (it was on its way)
/// founds nothing: the lease's revoke may already be freeing the key.
pub fn is_dead(lease: LeaseId, last_dead: LeaseId) -> bool {
    last_dead != 0 && lease == last_dead
}

/// What the owner of a shared session tells a machine running on it (an
/// [`Election`](crate::election::Election) or a
/// [`Registration`](crate::registration::Registration)), in the order it
/// learns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionInput {
    /// The lease `lease` is granted (a new lease means the previous one is
    /// gone, with every key on it).
    Up {
        /// The session lease.
        lease: LeaseId,
    },
    /// The lease `lease` may be believed until `until`, the session's local
    /// deadline (a grant or an answered renewal moved it). Implies `Up`.
    Trusted {
        /// The session lease.
        lease: LeaseId,
        /// Its local deadline now, on this machine's clock.
        until: Instant,
    },
    /// Renewals of `lease` fail; it may still be alive until its deadline.
    Suspended {
        /// The session lease.
        lease: LeaseId,
    },
    /// The lease is gone (or presumed gone): every key on it too. A new
    /// one is being granted.
    Lost {
        /// The lease that was lost.
        lease: LeaseId,
    },
    /// etcd refused the session for good: every campaign fails.
    Refused(RpcError),
    /// The owner closes the session and revokes its lease: stop, without
    /// deleting anything, since the revoke deletes every key of the lease.
    Closed,
}

/// What a machine on a shared session asks of its owner (an election's
/// [`ElectionNotice::SessionRequest`](crate::election::ElectionNotice::SessionRequest),
/// a shard member's, a registration's); one with its own session acts on
/// it itself. The owner passes both to the hub ([`SessionHub::request`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionRequest {
    /// etcd refused a request naming this lease as not found: it is gone,
    /// the session must learn it now rather than at its next renewal.
    Gone(LeaseId),
    /// A key of this lease could not be deleted (etcd refused it, or no
    /// delete was confirmed within the withdraw limit): give the lease up,
    /// so the key does not stay queued for as long as the session lives.
    Replace(LeaseId),
}
