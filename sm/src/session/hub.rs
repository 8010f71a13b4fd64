//! The session hub: the owner's side of a lease shared by several
//! machines (elections, shard members, host registrations), and the one
//! place that orders what they are told against what may still be
//! believed.
//!
//! The owner runs a lease-only [`Keepalive`](crate::keepalive::Keepalive)
//! that announces trust and feeds each of its notices to
//! [`SessionHub::keepalive`]; primitives join with
//! [`SessionHub::attach`] and leave with [`SessionHub::leave`]; what their
//! machines ask of the lease goes to [`SessionHub::request`]; the user's
//! [`SessionHub::close`] and [`SessionHub::detach`] end the session. The
//! hub answers in [`HubCommand`]s, drained with
//! [`SessionHub::poll_command`] after every call, which the owner executes
//! in order and without judging them:
//!
//! * `EndBeliefs { member, lease, for_good }`: end, on the calling thread
//!   and before the next command, every belief of `member` founded on the
//!   session (its leadership, lock, owned shards), and feed its
//!   [`SessionBelief`](super::SessionBelief) the same
//!   ([`SessionBelief::end`](super::SessionBelief::end)).
//! * `Tell { member, fact }`: feed `member`'s machine `fact`.
//! * `Keepalive(input)`: feed the keepalive `input`.
//! * `State(state)`: report the lease's state to the session's user.
//! * `Detached(point)`: the keepalive handed the lease over at `point`.
//!
//! It is not a [`crate::Machine`]: it sends no requests and keeps no time.
//!
//! # Invariants
//!
//! 1. **End before tell.** Before anything is told about a lease (to any
//!    member, as a fact or a replay) and before the keepalive is asked to
//!    give a lease up, every member's beliefs on the lease before it were
//!    ended: for each member an `EndBeliefs` naming the old lease is
//!    queued ahead. This holds for a loss the keepalive reports, a
//!    `Replace` a member asks for, a close, a detach, a refusal, and a new
//!    lease reported without a loss in between.
//! 2. **The dead-lease mark.** A lease is marked dead
//!    ([`SessionHub::dead_lease`]) in the same call that queues the
//!    `EndBeliefs` naming it, which carry it to every member's
//!    `SessionBelief`: a win on it that a member's machine reports later
//!    (it was on its way) is never believed. Facts that found belief
//!    (`Up`, `Trusted`, `Suspended`) about a dead lease are never told nor
//!    replayed, and a dead lease is never the current one
//!    ([`SessionHub::lease`]); its `Lost` still is told.
//! 3. **One order for all.** Members hear facts in the order the
//!    keepalive reported them, each fact to every member in the order they
//!    joined. A member that joins late first hears the facts that say the
//!    current state (`Up`, then `Trusted` if it is about that lease, then
//!    `Suspended` if renewals fail; or `Refused`), and then the same
//!    stream as the others, so it knows what they know.
//! 4. **A stale `Replace` changes nothing.** `Replace(lease)` of a lease
//!    that is not the current one (an older lease, given up or lost
//!    already) queues nothing: neither an `EndBeliefs` on a lease still
//!    believed nor a revoke of the new lease. `Gone(lease)` goes to the
//!    keepalive as is: it ignores a lease that is not its own.
//! 5. **Closed is final.** After a close, a successful detach, a refusal
//!    or a stop, every `EndBeliefs` is `for_good` and nobody joins
//!    ([`AttachError::Closed`]); a close tells `Closed` after ending
//!    beliefs. A key prefix is held by one member at a time
//!    ([`AttachError::KeyInUse`]): two would share the key
//!    `<prefix><lease>`.
//! 6. **States follow beliefs.** `State(Lost | Refused | Stopped)` is
//!    queued after the `EndBeliefs` of that step, so a user reading the
//!    session's states sees a loss only once every belief on it ended.

use super::{is_dead, SessionInput, SessionRequest};
use crate::keepalive::{KeepaliveInput, KeepaliveNotice, LivenessState, ResumePoint};
use crate::rpc::{LeaseId, RpcError};
use std::collections::VecDeque;
use std::time::Instant;

/// A member of a hub, as [`SessionHub::attach`] named it. Ids are never
/// reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberId(pub u64);

/// What the hub asks its owner to do; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HubCommand {
    /// End every belief of `member` on the session now, and feed its
    /// `SessionBelief` the same ([`SessionBelief::end`](super::SessionBelief::end)).
    EndBeliefs {
        /// Whose beliefs.
        member: MemberId,
        /// The lease they were founded on, marked dead; `None` when no
        /// lease was believed.
        lease: Option<LeaseId>,
        /// Nothing on this session may be believed again.
        for_good: bool,
    },
    /// Feed `member`'s machine `fact`.
    Tell {
        /// To whom.
        member: MemberId,
        /// What.
        fact: SessionInput,
    },
    /// Feed the session's keepalive `input`.
    Keepalive(KeepaliveInput),
    /// The lease's state changed: report it to the session's user.
    State(LivenessState),
    /// The keepalive detached, handing the lease over at this point.
    Detached(ResumePoint),
}

/// Why [`SessionHub::attach`] refused a member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachError {
    /// The session is closed or detached.
    Closed,
    /// Another member uses this key prefix.
    KeyInUse,
}

/// Why [`SessionHub::detach`] refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DetachError {
    /// Closed or detached already.
    Closed,
    /// etcd refused the session for good.
    Refused(RpcError),
    /// No lease is held now (being granted, or lost and granted again):
    /// nothing changed, and a detach once a lease is held may succeed.
    NoLease,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Entry {
    id: MemberId,
    key: String,
}

/// The fan-out of one session lease; see the module docs.
///
/// `Clone` copies it whole, queued commands included: the model checker
/// forks a world at every choice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionHub {
    state: LivenessState,
    trust: Option<(LeaseId, Instant)>,
    members: Vec<Entry>,
    next: u64,
    closed: bool,
    /// The last lease beliefs were ended on (0: none): see invariant 2.
    dead: LeaseId,
    /// The lease facts were last told about, while not ended: a fact
    /// about another lease ends it first (invariant 1).
    told: Option<LeaseId>,
    queue: VecDeque<HubCommand>,
}

impl Default for SessionHub {
    fn default() -> Self {
        Self::new()
    }
}

impl SessionHub {
    /// A hub whose keepalive has not reported anything yet (it is
    /// `Registering`).
    pub fn new() -> Self {
        SessionHub {
            state: LivenessState::Registering,
            trust: None,
            members: Vec::new(),
            next: 0,
            closed: false,
            dead: 0,
            told: None,
            queue: VecDeque::new(),
        }
    }

    /// The next command, in order; `None` when there is none.
    #[must_use]
    pub fn poll_command(&mut self) -> Option<HubCommand> {
        self.queue.pop_front()
    }

    /// The lease's state as the keepalive last reported it.
    pub fn state(&self) -> &LivenessState {
        &self.state
    }

    /// The lease believed alive now: `Registered` or `Suspended`, and not
    /// dead (invariant 2).
    pub fn lease(&self) -> Option<LeaseId> {
        match self.state {
            LivenessState::Registered { lease } | LivenessState::Suspended { lease }
                if !is_dead(lease, self.dead) =>
            {
                Some(lease)
            }
            _ => None,
        }
    }

    /// Until when the current lease is trusted, if the keepalive said.
    pub fn trusted_until(&self) -> Option<Instant> {
        let lease = self.lease()?;
        self.trust
            .filter(|(trusted, _)| *trusted == lease)
            .map(|(_, until)| until)
    }

    /// The last lease every belief was ended on (0: none yet).
    pub fn dead_lease(&self) -> LeaseId {
        self.dead
    }

    /// Closed or detached (by the user): nobody joins.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The members, in the order they joined.
    pub fn members(&self) -> impl Iterator<Item = MemberId> + '_ {
        self.members.iter().map(|m| m.id)
    }

    /// A primitive joins under `key` (its key prefix). Queues the replay
    /// of the current facts to it (invariant 3).
    pub fn attach(&mut self, key: &str) -> Result<MemberId, AttachError> {
        if self.closed {
            return Err(AttachError::Closed);
        }
        if self.members.iter().any(|m| m.key == key) {
            return Err(AttachError::KeyInUse);
        }
        let id = MemberId(self.next);
        self.next = self.next.saturating_add(1);
        self.members.push(Entry {
            id,
            key: key.to_string(),
        });
        for fact in self.replay() {
            self.queue.push_back(HubCommand::Tell { member: id, fact });
        }
        Ok(id)
    }

    /// `member` left (or its machine is gone): it hears nothing more and
    /// its key prefix is free.
    pub fn leave(&mut self, member: MemberId) {
        self.members.retain(|m| m.id != member);
        self.queue.retain(|c| match c {
            HubCommand::Tell { member: m, .. } | HubCommand::EndBeliefs { member: m, .. } => {
                *m != member
            }
            _ => true,
        });
    }

    /// One notice of the session's keepalive.
    pub fn keepalive(&mut self, notice: KeepaliveNotice) {
        match notice {
            KeepaliveNotice::Trusted { lease, until } => {
                if is_dead(lease, self.dead) {
                    return;
                }
                self.trust = Some((lease, until));
                self.tell_about(lease, SessionInput::Trusted { lease, until });
            }
            KeepaliveNotice::State(state) => self.new_state(state),
            KeepaliveNotice::Detached(point) => {
                self.queue.push_back(HubCommand::Detached(point));
            }
            // Failed grants are for a user waiting on a grant, which the
            // hub is not.
            KeepaliveNotice::GrantFailed { .. } => {}
        }
    }

    fn new_state(&mut self, state: LivenessState) {
        self.state = state.clone();
        match &state {
            // About a bound key, which a session's keepalive has not.
            LivenessState::Registering
            | LivenessState::Waiting { .. }
            | LivenessState::Duplicate { .. } => {}
            LivenessState::Registered { lease } => {
                if !is_dead(*lease, self.dead) {
                    self.tell_about(*lease, SessionInput::Up { lease: *lease });
                }
            }
            LivenessState::Suspended { lease } => {
                if !is_dead(*lease, self.dead) {
                    self.tell_about(*lease, SessionInput::Suspended { lease: *lease });
                }
            }
            LivenessState::Lost { lease } => {
                let for_good = self.over();
                self.end_beliefs(Some(*lease), for_good);
                self.tell(SessionInput::Lost { lease: *lease });
            }
            LivenessState::Refused { error } => {
                let lease = self.told;
                self.end_beliefs(lease, true);
                self.tell(SessionInput::Refused(error.clone()));
            }
            LivenessState::Stopped { .. } => {
                let lease = self.told;
                self.end_beliefs(lease, true);
                self.tell(SessionInput::Closed);
            }
        }
        self.queue.push_back(HubCommand::State(state));
    }

    /// What a member's machine asked of the lease (invariant 4).
    pub fn request(&mut self, request: SessionRequest) {
        match request {
            SessionRequest::Gone(lease) => {
                self.queue
                    .push_back(HubCommand::Keepalive(KeepaliveInput::LeaseGone { lease }));
            }
            SessionRequest::Replace(lease) => {
                if self.lease() != Some(lease) {
                    return;
                }
                // Its revoke frees every key on it: nothing founded on it
                // may be believed from here on.
                let for_good = self.over();
                self.end_beliefs(Some(lease), for_good);
                self.queue
                    .push_back(HubCommand::Keepalive(KeepaliveInput::Replace { lease }));
            }
        }
    }

    /// The user closes the session: every belief ends for good, then every
    /// member is told `Closed` (its machine stops without deleting: the
    /// revoke that follows deletes every key on the lease). The owner
    /// stops the keepalive after. Closing again queues nothing.
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        let lease = self.lease();
        self.end_beliefs(lease, true);
        self.tell(SessionInput::Closed);
    }

    /// The user hands the lease over to the next process: every belief
    /// ends for good and nobody joins from here on. Returns the members in
    /// the order they joined, for the owner to stop (or hand over) each;
    /// refused with nothing changed when there is no lease to hand over.
    pub fn detach(&mut self) -> Result<Vec<MemberId>, DetachError> {
        if self.closed {
            return Err(DetachError::Closed);
        }
        if let LivenessState::Refused { error } = &self.state {
            return Err(DetachError::Refused(error.clone()));
        }
        let Some(lease) = self.lease() else {
            return Err(DetachError::NoLease);
        };
        self.closed = true;
        self.end_beliefs(Some(lease), true);
        Ok(self.members().collect())
    }

    /// Nothing on the session may be believed again: closed, detached,
    /// refused or stopped (invariant 5).
    fn over(&self) -> bool {
        self.closed
            || matches!(
                self.state,
                LivenessState::Refused { .. } | LivenessState::Stopped { .. }
            )
    }

    /// The facts a member joining now needs (invariant 3).
    fn replay(&self) -> Vec<SessionInput> {
        if let LivenessState::Refused { error } = &self.state {
            return vec![SessionInput::Refused(error.clone())];
        }
        let Some(lease) = self.lease() else {
            return Vec::new();
        };
        let mut facts = vec![SessionInput::Up { lease }];
        if let Some(until) = self.trusted_until() {
            facts.push(SessionInput::Trusted { lease, until });
        }
        if matches!(self.state, LivenessState::Suspended { .. }) {
            facts.push(SessionInput::Suspended { lease });
        }
        facts
    }

    /// Tells `fact`, about `lease`, to every member; a lease told about
    /// before and not ended yet is ended first (invariant 1).
    fn tell_about(&mut self, lease: LeaseId, fact: SessionInput) {
        if let Some(old) = self.told.filter(|old| *old != lease) {
            let for_good = self.over();
            self.end_beliefs(Some(old), for_good);
        }
        self.told = Some(lease);
        self.tell(fact);
    }

    fn tell(&mut self, fact: SessionInput) {
        for m in &self.members {
            self.queue.push_back(HubCommand::Tell {
                member: m.id,
                fact: fact.clone(),
            });
        }
    }

    /// Marks `lease` dead and ends every member's beliefs on it
    /// (invariants 1, 2, 5).
    fn end_beliefs(&mut self, lease: Option<LeaseId>, for_good: bool) {
        if let Some(lease) = lease {
            self.dead = lease;
            if self.told == Some(lease) {
                self.told = None;
            }
        }
        for m in &self.members {
            self.queue.push_back(HubCommand::EndBeliefs {
                member: m.id,
                lease,
                for_good,
            });
        }
    }
}
