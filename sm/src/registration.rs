//! A key bound to a session lease this machine does not keep: a host's
//! registration on a shared session ([`crate::session`]), so that the host
//! key, elections and locks of one process cost etcd one lease's renewals.
//!
//! Rules:
//! 1. **Write.** While the session is up with lease L and the key is not
//!    written on L with the current value, one transaction puts the key on
//!    L, guarded on the key's mod revision as this machine last knew it (0:
//!    absent), and deletes the leave marker (a leave of an earlier
//!    registration must not read as this one's). A failed guard is
//!    answered with the key as it is: already the current value on L (an
//!    earlier copy landed) counts as the write; on a lease this machine
//!    was never told by its session, rule 7 decides; anything else
//!    (absent, on an earlier lease of the session's, on none) is taken
//!    over by the next put, guarded on what was read. The
//!    [`RegistrationConfig::companion`] key, if any, is put on L first in
//!    the same transaction, so both carry one mod revision. A failed request is
//!    sent again after a backoff delay. A put given up on an old lease and
//!    landing late fails its guard, since every later write moved the mod
//!    revision.
//! 2. **State.** `Registered { lease }` once the key is written on L;
//!    `Suspended`, `Lost`, `Refused` as the session tells; a new lease
//!    after a loss writes the key again (rule 1), which is the host
//!    registering again.
//! 3. **Leave.** [`RegistrationInput::Stop`] while the key is written on
//!    the current lease sends one transaction that puts the leave marker on
//!    that lease and deletes the key (and the companion), guarded on the
//!    key's mod revision as
//!    written (watchers see a leave, as with an own lease); a put still in
//!    flight is waited for first, so it cannot write the key after the
//!    leave. A failed leave is sent again after a backoff delay; one not
//!    done within `give_up` asks the session's owner to replace the lease
//!    ([`RegistrationNotice::SessionRequest`]), so the key goes with it.
//!    The lease is never revoked here: it is the session's.
//! 4. [`SessionInput::Closed`] stops at once: the owner's revoke deletes
//!    the key.
//! 5. **Detach.** [`RegistrationInput::Detach`] hands the registration to
//!    the next process, which resumes the session's lease: while the key
//!    is written on the current lease, the machine stops *without* leaving
//!    (no marker, no delete; a put in flight is canceled) and tells
//!    [`RegistrationNotice::Detached`] with the lease and the key's mod
//!    revision as last known. Otherwise there is nothing to hand over and
//!    it stops as after `Closed`. Either way the lease is left alone.
//! 6. **Resume.** [`Registration::resume`] starts from such a point: the
//!    first write (rule 1) is guarded on the point's mod revision instead
//!    of the key's absence, so it applies only if nobody wrote the key
//!    since the earlier process detached. On the same lease that write
//!    keeps the key where it is (watchers see at most an update of its
//!    value, never a delete); on another lease (the session's resume was
//!    refused) it moves the key there, or, if the key is gone (its lease
//!    expired), the failed guard reads it absent and the next put creates
//!    it (watchers saw the expiry, and see it come back). A canceled put
//!    of the earlier process that lands late moves the mod revision, so
//!    the guard fails, the key is read and taken over as in rule 1.
//!    On a lease of its own ([`Registration::set_own_lease`]), a failed
//!    guard of that first write on the point's lease that does not read
//!    the key as this machine would write it (the key was written,
//!    deleted or re-created since the detach) refuses the resume: the
//!    machine asks for the lease to be replaced
//!    ([`SessionRequest::Replace`]), stops writing on it without telling
//!    `Lost` (it never told it held), and writes the key on the next
//!    lease guarded on what it read, so the key moves there and the
//!    resumed lease can go.
//! 7. **Another holder.** A failed guard that reads the key on a lease
//!    the session never told this machine of (the last 8 are remembered)
//!    was written by another process: a crashed predecessor's, expiring,
//!    or a live duplicate's. The key is not written over: the state is
//!    [`LivenessState::Waiting`] `{ holder }` while the holder's lease is
//!    looked at as [`crate::holder`] rules. Gone, the put goes again,
//!    guarded as before (a key etcd has not deleted yet is looked at again
//!    after [`crate::holder::POLL`]); renewed past its remaining TTL, the
//!    state is [`LivenessState::Duplicate`] `{ holder }` and the machine
//!    stops (the session stays: it is shared). With
//!    [`RegistrationConfig::take_over`], and only before this machine
//!    first wrote the key, the key is written over at once and the
//!    holder's lease revoked once (its answer not waited for) after the
//!    write applied, so the displaced holder learns it at its next
//!    renewal; one that wrote the key before never takes it back. A leave
//!    that finds the key on such a lease tells `Duplicate` before
//!    `Stopped`: the key was taken over.
//! 8. **"Lease not found" is news for the session.** A put or a leave
//!    answered so asks the session's owner to learn that its lease is gone
//!    ([`SessionRequest::Gone`]) at once — the first evidence may be this
//!    machine's, and every belief on the lease (a leadership, a shard on
//!    it) must end at it, not at the next renewal — and is sent again
//!    after a backoff delay, as any failed request.
//! 9. **Refused.** A write refused with [`RpcError::PermissionDenied`]
//!    (a user without a grant on the key) is told
//!    [`LivenessState::Refused`] and the machine stops: no retry fixes
//!    it, and a user learns it at once instead of watching a retry loop.
//!    Nothing is left to delete (the key was never written by this user).
//!
//! Request ids start at 0 ([`Registration::new`]) or where the embedding
//! machine says ([`Registration::with_first_rpc_id`]): a host on its own
//! lease ([`crate::host`]) keeps its keepalive's ids and its
//! registration's apart that way.

use crate::backoff::{Backoff, BackoffConfig};
use crate::clock::Clock;
use crate::election::SessionRequest;
use crate::holder::{HolderCheck, Step};
use crate::keepalive::LivenessState;
use crate::outbox::Outbox;
use crate::rpc::{
    Command, Compare, KeyRange, LeaseId, RangeRequest, Request, Response, Revision, RpcError,
    RpcId, RpcReply, Txn, TxnOp, TxnOpResponse,
};
use crate::session::SessionInput;
use crate::timer::TimerTable;
use crate::Machine;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How a [`Registration`] behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistrationConfig {
    /// The key to keep on the session's lease.
    pub key: Vec<u8>,
    /// Its value.
    pub value: Vec<u8>,
    /// Written on the lease when leaving, in the transaction that deletes
    /// the key (see `watch::leave_marker_key`); `None` deletes only.
    pub leave_marker: Option<Vec<u8>>,
    /// A second key and its value put on the lease in the same transaction
    /// as every write of `key` (host liveness: the host's
    /// [`incarnation_key`](crate::watch::incarnation_key)), and deleted by
    /// the leave, since the shared lease outlives the registration.
    pub companion: Option<(Vec<u8>, Vec<u8>)>,
    /// Delays between failed attempts.
    pub backoff: BackoffConfig,
    /// How long a leave may fail before the lease is given up (one TTL
    /// serves).
    pub give_up: Duration,
    /// Take the key over from a live holder on another lease (and revoke
    /// that lease) instead of waiting and failing with
    /// [`LivenessState::Duplicate`] (rule 7); `false` otherwise.
    pub take_over: bool,
}

/// Inputs of a [`Registration`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistrationInput {
    /// The reply to one of the machine's requests (others are ignored).
    Rpc(RpcReply),
    /// A fact of the session lease.
    Session(SessionInput),
    /// Replace the value: written at once while registered.
    SetValue(Vec<u8>),
    /// Leave (rule 3).
    Stop,
    /// Hand over to the next process without leaving (rule 5).
    Detach,
}

impl From<RpcReply> for RegistrationInput {
    fn from(reply: RpcReply) -> Self {
        RegistrationInput::Rpc(reply)
    }
}

/// What a [`Registration`] tells its user, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistrationNotice {
    /// The registration changed state (`Stopped { revoked: false }` at the
    /// end: the lease is the session's).
    State(LivenessState),
    /// The leave transaction applied on `lease`: the key is gone and the
    /// marker written.
    Left {
        /// The lease the marker is on.
        lease: LeaseId,
    },
    /// What the session's owner must do to the lease (rule 3).
    SessionRequest(SessionRequest),
    /// Detached (rule 5): where the next process's registration resumes
    /// ([`Registration::resume`]). Told at most once, right before
    /// `State(Stopped { revoked: false })`.
    Detached(RegistrationPoint),
}

/// A registration handed from one process to the next on a resumed session
/// lease (rules 5 and 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegistrationPoint {
    /// The session lease the key was written on.
    pub lease: LeaseId,
    /// The key's mod revision as the detached machine last knew it.
    pub mod_revision: Revision,
    /// The key's create revision as the detached machine last knew it
    /// (0: unknown): which incarnation of the key the point is. Told, not
    /// guarded on: a mod revision names one write, so the guard on it
    /// (rule 6) already refuses any other incarnation.
    pub create_revision: Revision,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    Retry,
    GiveUp,
    /// The next look at another holder's lease, or the give-up of the
    /// one in flight (rule 7).
    Look,
}

/// How many of the session's leases are remembered as this machine's.
const MAX_HELD: usize = 8;

/// Waiting on another holder of the key (rule 7).
#[derive(Clone, Debug)]
struct Probe {
    check: HolderCheck,
    /// The look in flight and its send time.
    look: Option<(RpcId, Instant)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum InFlight {
    Put {
        id: RpcId,
        lease: LeaseId,
        value: Vec<u8>,
    },
    Leave {
        id: RpcId,
        lease: LeaseId,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Running,
    /// Stop asked: leave once nothing is in flight.
    Leaving,
    Done,
}

/// The registration machine. See the module docs for its rules.
#[derive(Clone, Debug)]
pub struct Registration {
    key: Vec<u8>,
    value: Vec<u8>,
    marker: Option<Vec<u8>>,
    companion: Option<(Vec<u8>, Vec<u8>)>,
    give_up: Duration,
    lease: Option<LeaseId>,
    /// The key's mod revision as this machine last knew it (0: absent).
    known: Revision,
    /// The key's create revision as this machine last knew it (0:
    /// absent or unknown), told with a detach.
    created: Revision,
    /// The lease of the point resumed from, until the first write on it
    /// applied or another lease was told (rule 6).
    resume_lease: Option<LeaseId>,
    /// The lease is this registration's alone ([`Registration::set_own_lease`]).
    own_lease: bool,
    /// The lease and value the key was last written with by this machine.
    written: Option<(LeaseId, Vec<u8>)>,
    in_flight: Option<InFlight>,
    /// The session's leases as told, newest last (rule 7).
    held: VecDeque<LeaseId>,
    /// Waiting on another holder (rule 7).
    probe: Option<Probe>,
    take_over: bool,
    /// Written at least once: a key on another lease was taken from this
    /// machine, and is never taken back.
    ever_written: bool,
    /// A holder whose key was taken over, revoked after the write.
    evict: Option<LeaseId>,
    phase: Phase,
    state: LivenessState,
    backoff: Backoff,
    timers: TimerTable<Timer>,
    outbox: Outbox<RegistrationNotice>,
    clock: Clock,
}

impl Registration {
    /// Resumes the registration a detached machine handed over at `point`
    /// (rule 6); otherwise as [`Registration::new`].
    pub fn resume(
        config: RegistrationConfig,
        now: Instant,
        seed: u64,
        point: RegistrationPoint,
    ) -> Self {
        Self::with_first_rpc_id(config, now, seed, 0, Some(point))
    }

    /// Waits for the session's first lease (`Registering`).
    pub fn new(config: RegistrationConfig, now: Instant, seed: u64) -> Self {
        Self::with_first_rpc_id(config, now, seed, 0, None)
    }

    /// [`Registration::new`] (or, given a point, [`Registration::resume`])
    /// with request ids starting at `first_rpc_id`, so a machine embedding
    /// this one keeps id ranges disjoint.
    pub fn with_first_rpc_id(
        config: RegistrationConfig,
        now: Instant,
        seed: u64,
        first_rpc_id: u64,
        point: Option<RegistrationPoint>,
    ) -> Self {
        let mut r = Self::fresh(config, now, seed, first_rpc_id);
        if let Some(point) = point {
            r.known = point.mod_revision.max(0);
            r.created = point.create_revision.max(0);
            r.resume_lease = Some(point.lease);
            r.remember(point.lease);
        }
        r
    }

    fn fresh(config: RegistrationConfig, now: Instant, seed: u64, first_rpc_id: u64) -> Self {
        let mut r = Registration {
            key: config.key,
            value: config.value,
            marker: config.leave_marker,
            companion: config.companion,
            give_up: config.give_up,
            lease: None,
            known: 0,
            created: 0,
            resume_lease: None,
            own_lease: false,
            written: None,
            in_flight: None,
            held: VecDeque::new(),
            probe: None,
            take_over: config.take_over,
            ever_written: false,
            evict: None,
            phase: Phase::Running,
            state: LivenessState::Registering,
            backoff: Backoff::new(config.backoff, seed),
            timers: TimerTable::new(),
            outbox: Outbox::new(first_rpc_id),
            clock: Clock::new(now),
        };
        r.outbox
            .notify(RegistrationNotice::State(LivenessState::Registering));
        r
    }

    /// With `own` true, the lease is this registration's alone (a host on
    /// its own lease, [`crate::host`]): a resume whose first write finds
    /// the key changed since the detach gives that lease up
    /// ([`SessionRequest::Replace`]) and writes the key on the next one
    /// instead of taking it over on the resumed lease (rule 6). `false`
    /// (the default, a shared session) takes it over where it is.
    pub fn set_own_lease(&mut self, own: bool) {
        self.own_lease = own;
    }

    /// What a detach now would hand over (rule 5): the lease and the key's
    /// revisions, while the key is written on the current lease and no
    /// stop is under way.
    pub fn resume_point(&self) -> Option<RegistrationPoint> {
        match (self.lease, self.written_on_lease(), self.phase) {
            (Some(lease), true, Phase::Running) => Some(RegistrationPoint {
                lease,
                mod_revision: self.known,
                create_revision: self.created,
            }),
            _ => None,
        }
    }

    /// Whether `id` was issued by this machine (replies to it belong here).
    pub fn owns(&self, id: RpcId) -> bool {
        self.outbox.owns(id)
    }

    /// The lease the key is written on, while registered; `None` once a
    /// stop is under way (its leave may have deleted the key already).
    pub fn lease(&self) -> Option<LeaseId> {
        if self.phase != Phase::Running {
            return None;
        }
        match self.state {
            LivenessState::Registered { lease } | LivenessState::Suspended { lease } => Some(lease),
            _ => None,
        }
    }

    fn notify(&mut self, state: LivenessState) {
        if self.state != state {
            self.state = state.clone();
            self.outbox.notify(RegistrationNotice::State(state));
        }
    }

    fn is_written(&self) -> bool {
        matches!((&self.written, self.lease), (Some((l, v)), Some(lease)) if *l == lease && *v == self.value)
    }

    /// Remembers `lease` as one of the session's.
    fn remember(&mut self, lease: LeaseId) {
        if self.held.contains(&lease) {
            return;
        }
        if self.held.len() >= MAX_HELD {
            self.held.pop_front();
        }
        self.held.push_back(lease);
    }

    /// `lease` is another process's: not one the session told of.
    fn is_foreign(&self, lease: LeaseId) -> bool {
        lease != 0 && !self.held.contains(&lease)
    }

    /// Ends the wait on another holder (rule 7).
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

    fn send_look(&mut self, now: Instant) {
        let Some(probe) = &self.probe else { return };
        let lease = probe.check.holder();
        let id = self.outbox.rpc(Request::LeaseTimeToLive { lease });
        if let Some(probe) = &mut self.probe {
            probe.look = Some((id, now));
        }
        // A look is a read: given up after the leave's give-up, looked at
        // again after a backoff delay.
        self.timers
            .set(Timer::Look, now.checked_add(self.give_up).unwrap_or(now));
    }

    /// Rule 7: the key is on `holder`, another process's lease.
    fn wait_on_holder(&mut self, now: Instant, holder: LeaseId) {
        self.written = None;
        match &self.probe {
            Some(p) if p.check.holder() == holder => {
                let at = now.checked_add(crate::holder::POLL).unwrap_or(now);
                self.timers.set(Timer::Look, at);
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
        self.notify(LivenessState::Waiting { holder });
    }

    fn on_look_reply(&mut self, now: Instant, sent: Instant, result: Result<Response, RpcError>) {
        self.timers.stop(Timer::Look);
        let Some(probe) = &mut self.probe else { return };
        probe.look = None;
        let holder = probe.check.holder();
        let step = match &result {
            Ok(Response::LeaseTimeToLive { ttl_secs, .. }) => {
                Some(probe.check.on_answer(sent, now, *ttl_secs))
            }
            Err(RpcError::LeaseNotFound) => Some(Step::Gone),
            _ => None,
        };
        match step {
            // The put goes again (`sync`), guarded on what this machine
            // last knew, never on the holder's key.
            Some(Step::Gone) => {}
            Some(Step::Live) => {
                self.end_probe();
                self.notify(LivenessState::Duplicate { holder });
                self.finish();
            }
            Some(Step::LookAt(at)) => self.timers.set(Timer::Look, at),
            None => {
                let at = now.checked_add(self.backoff.next_delay()).unwrap_or(now);
                self.timers.set(Timer::Look, at);
            }
        }
    }

    /// Sends what rule 1 or 3 asks for, if nothing is in flight or waiting.
    fn sync(&mut self) {
        if self.in_flight.is_some() || self.timers.is_armed(Timer::Retry) {
            return;
        }
        // Rule 7: nothing is written while another holder is looked at.
        if self.phase == Phase::Running
            && self
                .probe
                .as_ref()
                .is_some_and(|p| p.look.is_some() || self.timers.is_armed(Timer::Look))
        {
            return;
        }
        match self.phase {
            Phase::Done => {}
            Phase::Leaving => self.leave(),
            Phase::Running => {
                let Some(lease) = self.lease else { return };
                if self.is_written() {
                    return;
                }
                let mut success = Vec::with_capacity(3);
                if let Some((key, value)) = &self.companion {
                    success.push(TxnOp::Put {
                        key: key.clone(),
                        value: value.clone(),
                        lease,
                    });
                }
                success.push(TxnOp::Put {
                    key: self.key.clone(),
                    value: self.value.clone(),
                    lease,
                });
                if let Some(marker) = &self.marker {
                    success.push(TxnOp::Delete(KeyRange::Key(marker.clone())));
                }
                let id = self.outbox.rpc(Request::Txn(Txn {
                    compare: vec![Compare::ModRevisionEquals {
                        key: self.key.clone(),
                        revision: self.known,
                    }],
                    success,
                    failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(
                        self.key.clone(),
                    )))],
                }));
                self.in_flight = Some(InFlight::Put {
                    id,
                    lease,
                    value: self.value.clone(),
                });
            }
        }
    }

    fn leave(&mut self) {
        let (Some(lease), true) = (self.lease, self.is_written() || self.written_on_lease()) else {
            self.finish();
            return;
        };
        let mut success = Vec::new();
        if let Some(marker) = &self.marker {
            success.push(TxnOp::Put {
                key: marker.clone(),
                value: Vec::new(),
                lease,
            });
        }
        success.push(TxnOp::Delete(KeyRange::Key(self.key.clone())));
        if let Some((key, _)) = &self.companion {
            success.push(TxnOp::Delete(KeyRange::Key(key.clone())));
        }
        let id = self.outbox.rpc(Request::Txn(Txn {
            compare: vec![Compare::ModRevisionEquals {
                key: self.key.clone(),
                revision: self.known,
            }],
            success,
            failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(
                self.key.clone(),
            )))],
        }));
        self.in_flight = Some(InFlight::Leave { id, lease });
    }

    fn written_on_lease(&self) -> bool {
        matches!((&self.written, self.lease), (Some((l, _)), Some(lease)) if *l == lease)
    }

    fn finish(&mut self) {
        self.phase = Phase::Done;
        self.end_probe();
        self.timers.clear();
        if let Some(InFlight::Put { id, .. } | InFlight::Leave { id, .. }) = self.in_flight.take() {
            self.outbox.cancel(id);
        }
        self.notify(LivenessState::Stopped { revoked: false });
    }

    fn fail(&mut self) {
        let now = self.clock.now();
        let at = now.checked_add(self.backoff.next_delay()).unwrap_or(now);
        self.timers.set(Timer::Retry, at);
    }

    fn on_reply(&mut self, reply: RpcReply) {
        if let Some((_, sent)) = self
            .probe
            .as_ref()
            .and_then(|p| p.look)
            .filter(|(id, _)| *id == reply.id)
        {
            let now = self.clock.now();
            return self.on_look_reply(now, sent, reply.result);
        }
        let Some(flight) = self.in_flight.clone() else {
            return;
        };
        match flight {
            InFlight::Put { id, lease, value } if id == reply.id => {
                self.in_flight = None;
                match reply.result {
                    Ok(Response::Txn {
                        succeeded: true,
                        revision,
                        ..
                    }) => {
                        if self.known == 0 {
                            // Written over absence: this write created it.
                            self.created = revision;
                        }
                        self.resume_lease = None;
                        self.known = revision;
                        self.backoff.reset();
                        self.written = Some((lease, value));
                        self.ever_written = true;
                        self.end_probe();
                        if let Some(holder) = self.evict.take() {
                            // Rule 7: the displaced holder learns it at
                            // its next renewal.
                            let _ = self.outbox.rpc(Request::Revoke { lease: holder });
                        }
                        if self.lease == Some(lease) && self.phase == Phase::Running {
                            self.notify(LivenessState::Registered { lease });
                        }
                    }
                    Ok(Response::Txn {
                        succeeded: false,
                        responses,
                        ..
                    }) => {
                        let kv = responses.first().and_then(|r| match r {
                            TxnOpResponse::Range { kvs } => kvs.first().cloned(),
                            _ => None,
                        });
                        let foreign = kv
                            .as_ref()
                            .map(|kv| kv.lease)
                            .filter(|h| *h != lease && self.is_foreign(*h));
                        if let Some(holder) = foreign.filter(|_| self.phase == Phase::Running) {
                            if self.take_over && !self.ever_written {
                                self.evict = Some(holder);
                            } else {
                                let now = self.clock.now();
                                return self.wait_on_holder(now, holder);
                            }
                        }
                        self.known = kv.as_ref().map_or(0, |kv| kv.mod_revision);
                        self.created = kv.as_ref().map_or(0, |kv| kv.create_revision);
                        let ours = kv
                            .as_ref()
                            .is_some_and(|kv| kv.lease == lease && kv.value == value);
                        if self.resume_lease == Some(lease) && self.own_lease && !ours {
                            // Rule 6: the key changed since the detach; the
                            // lease goes, the key is written afresh on the
                            // next one, guarded on what was read.
                            self.resume_lease = None;
                            self.lease = None;
                            self.outbox.notify(RegistrationNotice::SessionRequest(
                                SessionRequest::Replace(lease),
                            ));
                            return;
                        }
                        if let Some(kv) = kv.filter(|kv| kv.lease == lease) {
                            // An earlier copy of ours landed (or the value
                            // is already this one): that is the write.
                            self.written = Some((lease, kv.value.clone()));
                            if kv.value == self.value && self.lease == Some(lease) {
                                self.backoff.reset();
                                if self.phase == Phase::Running {
                                    self.notify(LivenessState::Registered { lease });
                                }
                            }
                        }
                    }
                    Err(RpcError::LeaseNotFound) => self.lease_not_found(lease),
                    // Rule 9.
                    Err(error @ RpcError::PermissionDenied(_)) => {
                        self.notify(LivenessState::Refused { error });
                        self.finish();
                    }
                    _ => self.fail(),
                }
            }
            InFlight::Leave { id, lease } if id == reply.id => {
                self.in_flight = None;
                match reply.result {
                    Ok(Response::Txn {
                        succeeded: true, ..
                    }) => {
                        self.outbox.notify(RegistrationNotice::Left { lease });
                        self.finish();
                    }
                    // Another writer's key now: nothing of ours to delete.
                    Ok(Response::Txn { responses, .. }) => {
                        let holder = responses.first().and_then(|r| match r {
                            TxnOpResponse::Range { kvs } => kvs.first().map(|kv| kv.lease),
                            _ => None,
                        });
                        if let Some(holder) = holder.filter(|h| self.is_foreign(*h)) {
                            // Taken over while held (rule 7): say so.
                            self.notify(LivenessState::Duplicate { holder });
                        }
                        self.finish();
                    }
                    Err(RpcError::LeaseNotFound) => self.lease_not_found(lease),
                    _ => self.fail(),
                }
            }
            _ => {}
        }
    }

    /// etcd said `lease`, which a request carried, is gone (rule 8): the
    /// session's owner learns it now, the request is sent again after a
    /// backoff (on the next lease, once told).
    fn lease_not_found(&mut self, lease: LeaseId) {
        self.outbox
            .notify(RegistrationNotice::SessionRequest(SessionRequest::Gone(
                lease,
            )));
        self.fail();
    }

    fn on_session(&mut self, input: SessionInput) {
        match input {
            SessionInput::Up { lease } | SessionInput::Trusted { lease, .. } => {
                self.remember(lease);
                if self.lease != Some(lease) {
                    if let Some(old) = self.lease {
                        self.lost(old);
                    }
                    if self.resume_lease != Some(lease) {
                        // Resumed elsewhere: an ordinary write (rule 6).
                        self.resume_lease = None;
                    }
                    self.lease = Some(lease);
                } else if matches!(self.state, LivenessState::Suspended { .. }) && self.is_written()
                {
                    self.notify(LivenessState::Registered { lease });
                }
            }
            SessionInput::Suspended { lease } => {
                if self.lease == Some(lease) && self.is_written() {
                    self.notify(LivenessState::Suspended { lease });
                }
            }
            SessionInput::Lost { lease } => {
                if self.lease == Some(lease) {
                    self.lost(lease);
                }
            }
            SessionInput::Refused(error) => {
                self.lease = None;
                self.notify(LivenessState::Refused { error });
                self.finish();
            }
            SessionInput::Closed => {
                self.lease = None;
                self.finish();
            }
        }
    }

    /// Rule 5.
    fn detach(&mut self) {
        // A leave under way is not undone: the key may be deleted already.
        if let (Some(lease), true, Phase::Running) =
            (self.lease, self.written_on_lease(), self.phase)
        {
            // Canceled first: nothing of this machine's is in flight once
            // the next one may take the key over.
            if let Some(InFlight::Put { id, .. } | InFlight::Leave { id, .. }) =
                self.in_flight.take()
            {
                self.outbox.cancel(id);
            }
            self.outbox
                .notify(RegistrationNotice::Detached(RegistrationPoint {
                    lease,
                    mod_revision: self.known,
                    create_revision: self.created,
                }));
        }
        self.finish();
    }

    fn lost(&mut self, lease: LeaseId) {
        self.lease = None;
        // Judged again on the next lease, from its own first look.
        self.end_probe();
        // The key went with the lease.
        self.known = 0;
        self.created = 0;
        if let Some(InFlight::Put { id, .. }) = self.in_flight.take() {
            self.outbox.cancel(id);
        }
        if matches!(
            self.state,
            LivenessState::Registered { .. } | LivenessState::Suspended { .. }
        ) {
            self.notify(LivenessState::Lost { lease });
        }
        if self.phase == Phase::Leaving {
            self.finish();
        }
    }
}

impl Machine for Registration {
    type Input = RegistrationInput;
    type Notice = RegistrationNotice;

    fn handle(&mut self, now: Instant, input: RegistrationInput) {
        self.clock.observe(now);
        if self.phase == Phase::Done {
            return;
        }
        match input {
            RegistrationInput::Rpc(reply) => self.on_reply(reply),
            RegistrationInput::Session(input) => self.on_session(input),
            RegistrationInput::SetValue(value) => self.value = value,
            RegistrationInput::Detach => self.detach(),
            RegistrationInput::Stop => {
                self.phase = Phase::Leaving;
                if let Some(at) = now.checked_add(self.give_up) {
                    self.timers.set(Timer::GiveUp, at);
                }
                // A put in flight is waited for (rule 3); a retry is not.
                self.timers.stop(Timer::Retry);
            }
        }
        self.sync();
    }

    fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        while let Some(timer) = self.timers.pop_expired(now) {
            match timer {
                Timer::Retry => {}
                Timer::Look => match self.probe.as_ref().and_then(|p| p.look) {
                    Some((id, _)) => {
                        self.outbox.cancel(id);
                        if let Some(p) = &mut self.probe {
                            p.look = None;
                        }
                        let at = now.checked_add(self.backoff.next_delay()).unwrap_or(now);
                        self.timers.set(Timer::Look, at);
                    }
                    None if self.probe.is_some() && self.phase == Phase::Running => {
                        self.send_look(now)
                    }
                    None => {}
                },
                Timer::GiveUp => {
                    if let Some(lease) = self.lease {
                        self.outbox.notify(RegistrationNotice::SessionRequest(
                            SessionRequest::Replace(lease),
                        ));
                    }
                    self.finish();
                }
            }
        }
        self.sync();
    }

    fn poll_command(&mut self) -> Option<Command<RegistrationNotice>> {
        self.outbox.pop()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next().map(|at| self.clock.clamp(at))
    }

    fn stop_input() -> RegistrationInput {
        RegistrationInput::Stop
    }

    fn is_finished(&self) -> bool {
        self.phase == Phase::Done && self.outbox.is_empty()
    }
}
