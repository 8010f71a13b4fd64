//! What one primitive on a session (a leadership, a lock, a shard
//! ownership) may believe: the dead-lease rule and belief by the
//! caller's clock, kept by one value per primitive.
//!
//! A driver keeps one [`SessionBelief`] beside each primitive's own
//! beliefs, under the same lock, and feeds it two things: the hub's
//! [`HubCommand::EndBeliefs`](super::HubCommand::EndBeliefs) for that
//! primitive ([`SessionBelief::end`]), and the primitive's own notices
//! about trust ([`SessionBelief::trusted`], [`SessionBelief::lost`]). It
//! then asks it, and nothing else, whether a win may be believed
//! ([`SessionBelief::admits`]) and for how long ([`SessionBelief::left`]).
//!
//! Invariants:
//! 1. **A dead lease founds nothing.** Once `end(Some(lease), _)` ran,
//!    `admits(lease)` is false and no trust on `lease` is kept or
//!    reported, whatever arrives later: a primitive's machine runs on its
//!    own and may report a win or a renewal on that lease after the
//!    session ended it (it was on its way), while the lease's revoke may
//!    already be freeing the key. Only the last lease ended is
//!    remembered (see [`is_dead`]): a machine learns of the loss before it
//!    can hear of the lease after it, so nothing older arrives.
//! 2. **For good is for good.** After `end(_, true)` (the session closed,
//!    was detached, or refused for good) nothing is admitted again.
//! 3. **Belief by the caller's clock.** [`SessionBelief::left`] is
//!    [`trust_left`] of the earliest deadline told (the session's, and the
//!    primitive's own, e.g. a shard's release deadline) at the `now` the
//!    *asking* thread passes: a late report can only end belief early.
//! 4. **A loss ends trust at once** ([`SessionBelief::lost`],
//!    [`SessionBelief::end`]); only a later `trusted` on a lease that is
//!    not dead brings it back.

use super::{is_dead, trust_left};
use crate::rpc::LeaseId;
use std::time::{Duration, Instant};

/// One primitive's belief in its session; see the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SessionBelief {
    /// The last lease the session ended beliefs on (0: none).
    dead: LeaseId,
    /// Ended for good.
    over: bool,
    /// The lease last told trusted, dead or not.
    lease: Option<LeaseId>,
    /// Until when that lease is trusted; `None` once lost or ended.
    until: Option<Instant>,
}

impl SessionBelief {
    /// Nothing trusted yet, nothing dead.
    pub fn new() -> Self {
        Self::default()
    }

    /// The session ended every belief on `lease` (`None`: on whatever
    /// lease, e.g. a session refused before it had one); `for_good` when
    /// nothing on this session may be believed again.
    pub fn end(&mut self, lease: Option<LeaseId>, for_good: bool) {
        if let Some(lease) = lease {
            self.dead = lease;
        }
        self.over |= for_good;
        self.until = None;
    }

    /// Whether a win on `lease` may be believed (invariants 1 and 2).
    pub fn admits(&self, lease: LeaseId) -> bool {
        !self.over && !is_dead(lease, self.dead)
    }

    /// Whether the lease last told trusted (if any) may still found
    /// belief: a win reported without its lease (a shard acquired) is
    /// about that lease.
    pub fn admits_current(&self) -> bool {
        !self.over && self.lease.is_none_or(|lease| !is_dead(lease, self.dead))
    }

    /// The primitive's machine told that `lease` is trusted until `until`;
    /// kept only when `lease` may be believed.
    pub fn trusted(&mut self, lease: LeaseId, until: Instant) {
        self.lease = Some(lease);
        self.until = self.admits(lease).then_some(until);
    }

    /// The primitive's machine told that its session is lost or stopped.
    pub fn lost(&mut self) {
        self.until = None;
    }

    /// The session's deadline as last told, while it may be believed.
    pub fn until(&self) -> Option<Instant> {
        self.until.filter(|_| self.admits_current())
    }

    /// How long something founded on the session may still be believed at
    /// `now` (the asking thread's clock), when it has a deadline of its
    /// own `own` too (the earlier one counts); `None` when it may not be.
    pub fn left(&self, now: Instant, own: Option<Instant>) -> Option<Duration> {
        let until = self.until()?;
        trust_left(now, own.map_or(until, |own| own.min(until)))
    }
}
