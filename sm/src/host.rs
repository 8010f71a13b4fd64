//! A host registration on a lease of its own: a [`Registration`] on a
//! lease-only [`Keepalive`], joined through a [`SessionHub`] — the same
//! composition as a host on a shared session, with the session's one
//! member the registration. The host key is bound to a lease in one place,
//! [`crate::registration`]; the lease is kept in one place,
//! [`crate::keepalive`]; this module only orders the two.
//!
//! Rules (beside those of the registration and the keepalive, which all
//! hold):
//!
//! 1. **Facts.** Every notice of the keepalive goes to the hub, and every
//!    fact the hub tells its member goes to the registration, in order
//!    (the hub's invariants, [`crate::session::hub`]). What the
//!    registration asks of the lease goes to the hub: "lease not found"
//!    ([`SessionRequest::Gone`]) loses the lease at once and a new one is
//!    granted, as on a shared session.
//! 2. **States.** The host's states are the registration's
//!    (`Registering`, `Registered` once the key is written, `Suspended`,
//!    `Lost`, `Waiting`, `Duplicate`, `Refused`), except the final one:
//!    `Stopped { revoked }` is the keepalive's, told once the lease is
//!    revoked (or given up) after the registration ended.
//!    [`HostNotice::Trusted`] is the keepalive's trust, from the grant on.
//! 3. **Retired leases wait for the key.** The keepalive holds a lease it
//!    gave up while etcd may still hold it (presumed lost at its
//!    deadline, a refused resume) until the key is written on the
//!    current lease ([`Keepalive::set_hold_retired`], told by
//!    [`KeepaliveInput::Settled`] at every `Registered`): its revoke
//!    never takes the key away, so watchers see the key move to the new
//!    lease, not go and come back.
//! 4. **Stop.** [`HostInput::Stop`] stops the registration first (its
//!    leave: the marker written on the lease and the key deleted at one
//!    revision, registration rule 3), then, once it ended, the keepalive,
//!    which revokes the lease (and the marker with it). The leave is given
//!    up after one attempt timeout of the keepalive (half the requested
//!    TTL when that is zero), so a leave never holds up the revoke for
//!    long: a registration's request to replace the lease at that give-up
//!    is the revoke that follows anyway. The keepalive renews the lease
//!    while the leave is out, but a lease lost meanwhile is not replaced
//!    ([`KeepaliveInput::Draining`]): the keepalive stops, and the
//!    registration, told the loss, ends without a leave (the key went
//!    with the lease). Once the leave is confirmed the lease holds only
//!    the marker, so its revoke gets one copy and is given up two attempt
//!    timeouts after it was sent ([`Keepalive::set_brief_revoke`]): a member gone
//!    silent costs an exit those two attempt timeouts at most, not copy
//!    after copy of a revoke that only ends the marker a TTL early.
//! 5. **The registration ends, the lease goes.** Whenever the
//!    registration ends on its own (a live duplicate, a refusal), the
//!    keepalive is stopped and revokes the lease: nothing of this host's is
//!    left on it.
//! 6. **Detach.** [`HostInput::Detach`] detaches the registration (no
//!    leave; registration rule 5) and then the keepalive (no revoke;
//!    keepalive rule 8). [`HostNotice::Detached`] is told when both
//!    handed over the same lease; a registration with nothing to hand over
//!    makes the keepalive stop instead (revoking), as rule 5 says.
//! 7. **Resume.** [`Host::resume`] resumes the keepalive on the point's
//!    lease (the renewal that proves it, keepalive rule 9) and the
//!    registration from the point (its first write guarded on the point's
//!    mod revision, registration rule 6). A refused resume — the lease
//!    not proven alive, or the key written, deleted or re-created since
//!    the detach (the registration then asks for the lease to be
//!    replaced, [`Registration::set_own_lease`]) — registers afresh on a
//!    new lease, without `Lost`, and the first write there, guarded on
//!    the key's mod revision as last read, moves the key off the saved
//!    lease; the saved lease, if it may still be alive, is revoked after
//!    (rule 3).
//! 8. Request ids: the keepalive's start at 0, the registration's at
//!    [`REGISTRATION_FIRST_RPC_ID`], so a reply's id alone says which part
//!    it is for.

use crate::backoff::BackoffConfig;
use crate::keepalive::{Keepalive, KeepaliveConfig, KeepaliveInput, KeepaliveNotice, RenewalGrid};
use crate::keepalive::{LivenessState, ResumePoint};
use crate::registration::{
    Registration, RegistrationConfig, RegistrationInput, RegistrationNotice, RegistrationPoint,
};
use crate::rpc::{Command, LeaseId, RpcError, RpcId, RpcReply};
use crate::session::{HubCommand, MemberId, SessionHub, SessionRequest};
use crate::Machine;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The registration's request ids start here, far above any the
/// keepalive issues.
pub const REGISTRATION_FIRST_RPC_ID: u64 = 1 << 40;

/// How a [`Host`] behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// The lease: a lease-only keepalive's settings.
    pub lease: KeepaliveConfig,
    /// The host key.
    pub key: Vec<u8>,
    /// Its initial value; [`HostInput::SetValue`] replaces it.
    pub value: Vec<u8>,
    /// The leave marker written by a stop (registration rule 3), if any.
    pub leave_marker: Option<Vec<u8>>,
    /// A key put with every write of the host key
    /// ([`RegistrationConfig::companion`]).
    pub companion: Option<(Vec<u8>, Vec<u8>)>,
    /// Take the key over from a live holder (registration rule 7).
    pub take_over: bool,
    /// Delays between the registration's failed attempts.
    pub backoff: BackoffConfig,
}

/// Inputs of a [`Host`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostInput {
    /// The reply to one of the machine's requests (others are ignored).
    Rpc(RpcReply),
    /// Replace the key's value: written at once while registered.
    SetValue(Vec<u8>),
    /// Leave, then revoke the lease (rule 4). Repeated calls do nothing.
    Stop,
    /// Hand the registration and its lease to the next process (rule 6).
    Detach,
}

impl From<RpcReply> for HostInput {
    fn from(reply: RpcReply) -> Self {
        HostInput::Rpc(reply)
    }
}

/// What a [`Host`] tells its user, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostNotice {
    /// The state changed (rule 2).
    State(LivenessState),
    /// The lease is trusted until `until` (the keepalive's
    /// [`KeepaliveNotice::Trusted`]; only with
    /// [`KeepaliveConfig::announce_trust`]).
    Trusted {
        /// The lease.
        lease: LeaseId,
        /// Its local deadline now.
        until: Instant,
    },
    /// The leave applied on `lease`: the key is gone and the marker
    /// written (the revoke follows).
    Left {
        /// The lease the marker is on.
        lease: LeaseId,
    },
    /// Detached (rule 6): where the next process resumes
    /// ([`Host::resume`]). Told at most once, before
    /// `State(Stopped { revoked: false })`.
    Detached(RegistrationPoint),
    /// A lease grant failed and will be tried again
    /// ([`KeepaliveNotice::GrantFailed`]): why nothing is registered yet.
    GrantFailed {
        /// What etcd (or the connection) answered.
        error: RpcError,
    },
}

/// A host registration on its own lease; see the module docs.
///
/// `Clone` copies the whole machine, timers and queued commands included:
/// the model checker forks a world at every choice.
#[derive(Clone, Debug)]
pub struct Host {
    keepalive: Keepalive,
    hub: SessionHub,
    member: MemberId,
    registration: Registration,
    queue: VecDeque<Command<HostNotice>>,
    /// The keepalive was asked to stop or detach (once).
    keepalive_ended: bool,
    /// The state last told.
    state: LivenessState,
    /// Stop or detach asked by the user: later ones change nothing.
    stopping: bool,
    /// Detach asked by the user.
    detaching: bool,
    /// The registration's hand-over point, until the keepalive's confirms
    /// the lease (rule 6).
    detached: Option<RegistrationPoint>,
}

impl Host {
    /// Starts registering at `now`: the keepalive's grant goes first.
    pub fn new(config: HostConfig, now: Instant, seed: u64) -> Self {
        Self::with_first_rpc_id(config, now, seed, 0, None)
    }

    /// Resumes what a detached host handed over at `point` (rule 7). A
    /// point without a lease registers afresh.
    pub fn resume(config: HostConfig, now: Instant, seed: u64, point: RegistrationPoint) -> Self {
        Self::with_first_rpc_id(config, now, seed, 0, Some(point))
    }

    /// [`Host::new`] (or, given a point, [`Host::resume`]) with the
    /// keepalive's request ids starting at `first_rpc_id` and the
    /// registration's [`REGISTRATION_FIRST_RPC_ID`] above that, so a
    /// successor's ids differ from its predecessor's.
    pub fn with_first_rpc_id(
        config: HostConfig,
        now: Instant,
        seed: u64,
        first_rpc_id: u64,
        point: Option<RegistrationPoint>,
    ) -> Self {
        let lease = config.lease;
        // Rule 4: the leave waits at most one attempt timeout.
        let give_up = if lease.attempt_timeout.is_zero() {
            secs(lease.ttl_secs) / 2
        } else {
            lease.attempt_timeout
        };
        let registration = RegistrationConfig {
            key: config.key,
            value: config.value,
            leave_marker: config.leave_marker,
            companion: config.companion,
            backoff: config.backoff,
            give_up,
            take_over: config.take_over,
        };
        let mut keepalive = match point.filter(|p| p.lease != 0) {
            Some(p) => Keepalive::resume(
                lease,
                now,
                seed,
                first_rpc_id,
                ResumePoint { lease: p.lease },
            ),
            None => Keepalive::with_first_rpc_id(lease, now, seed, first_rpc_id),
        };
        // Rule 3.
        keepalive.set_hold_retired(true);
        // Why nothing is registered yet, for a user who gives up waiting.
        keepalive.set_announce_failures(true);
        let mut registration = Registration::with_first_rpc_id(
            registration,
            now,
            seed ^ 0x5555,
            first_rpc_id.saturating_add(REGISTRATION_FIRST_RPC_ID),
            point.filter(|p| p.lease != 0),
        );
        // Rule 7: a refused resume gives this lease up.
        registration.set_own_lease(true);
        let mut hub = SessionHub::new();
        // A fresh hub is open and its only key is this one: never refused.
        let member = hub.attach("host").unwrap_or(MemberId(0));
        let mut host = Host {
            keepalive,
            hub,
            member,
            registration,
            queue: VecDeque::new(),
            keepalive_ended: false,
            state: LivenessState::Registering,
            stopping: false,
            detaching: false,
            detached: None,
        };
        host.pump(now);
        host
    }

    /// From the next answered renewal on, renew on `grid`
    /// ([`Keepalive::set_renewal_grid`]).
    pub fn set_renewal_grid(&mut self, grid: Option<RenewalGrid>) {
        self.keepalive.set_renewal_grid(grid);
    }

    /// The keepalive, to read what it believes (its lease, its deadline).
    pub fn keepalive(&self) -> &Keepalive {
        &self.keepalive
    }

    /// The registration, to read what it believes.
    pub fn registration(&self) -> &Registration {
        &self.registration
    }

    /// The lease the key is written on, while `Registered` or `Suspended`.
    pub fn lease(&self) -> Option<LeaseId> {
        self.registration.lease()
    }

    /// The keepalive's local deadline ([`Keepalive::local_deadline`]).
    pub fn local_deadline(&self) -> Option<Instant> {
        self.keepalive.local_deadline()
    }

    /// What a detach now would hand over: the registration's point, while
    /// the keepalive holds that lease.
    pub fn resume_point(&self) -> Option<RegistrationPoint> {
        self.registration.resume_point().filter(|p| {
            self.keepalive
                .resume_point()
                .is_some_and(|k| k.lease == p.lease)
        })
    }

    /// Whether `id` was issued by this machine.
    pub fn owns(&self, id: RpcId) -> bool {
        self.keepalive.owns(id) || self.registration.owns(id)
    }

    /// Moves every part's commands into the queue, in the order rule 1
    /// says, until none has any left.
    fn pump(&mut self, now: Instant) {
        loop {
            let mut progressed = false;
            while let Some(command) = self.keepalive.poll_command() {
                progressed = true;
                match command {
                    Command::Rpc { id, request } => {
                        self.queue.push_back(Command::Rpc { id, request })
                    }
                    Command::Cancel { id } => self.queue.push_back(Command::Cancel { id }),
                    Command::Notify(notice) => {
                        if let KeepaliveNotice::Trusted { lease, until } = &notice {
                            self.queue.push_back(Command::Notify(HostNotice::Trusted {
                                lease: *lease,
                                until: *until,
                            }));
                        }
                        if let KeepaliveNotice::GrantFailed { error } = &notice {
                            self.queue
                                .push_back(Command::Notify(HostNotice::GrantFailed {
                                    error: error.clone(),
                                }));
                        }
                        self.hub.keepalive(notice);
                    }
                }
            }
            while let Some(command) = self.hub.poll_command() {
                progressed = true;
                match command {
                    HubCommand::Tell { member, fact } if member == self.member => {
                        self.registration
                            .handle(now, RegistrationInput::Session(fact));
                        // What it says about this fact goes before the
                        // hub's next command (the keepalive's `Stopped`).
                        self.drain_registration(now);
                    }
                    HubCommand::Keepalive(input) => self.keepalive.handle(now, input),
                    // Rule 2: the last state is the keepalive's.
                    HubCommand::State(state @ LivenessState::Stopped { .. }) => self.tell(state),
                    HubCommand::Detached(point) => {
                        if let Some(ours) = self.detached.take().filter(|p| p.lease == point.lease)
                        {
                            self.queue
                                .push_back(Command::Notify(HostNotice::Detached(ours)));
                        }
                    }
                    // A registration holds no belief a lost lease must end
                    // at once: its state says `Lost` when told.
                    HubCommand::EndBeliefs { .. }
                    | HubCommand::Tell { .. }
                    | HubCommand::State(_) => {}
                }
            }
            progressed |= self.drain_registration(now);
            if self.registration.is_finished() && !self.keepalive_ended {
                self.keepalive_ended = true;
                progressed = true;
                // Rules 4 to 6.
                let input = if self.detached.is_some() {
                    KeepaliveInput::Detach
                } else {
                    KeepaliveInput::Stop
                };
                self.keepalive.handle(now, input);
            }
            if !progressed {
                break;
            }
        }
    }

    /// Moves the registration's commands into the queue; whether there
    /// were any.
    fn drain_registration(&mut self, now: Instant) -> bool {
        let mut any = false;
        while let Some(command) = self.registration.poll_command() {
            any = true;
            match command {
                Command::Rpc { id, request } => self.queue.push_back(Command::Rpc { id, request }),
                Command::Cancel { id } => self.queue.push_back(Command::Cancel { id }),
                Command::Notify(notice) => self.on_registration(now, notice),
            }
        }
        any
    }

    fn tell(&mut self, state: LivenessState) {
        self.state = state.clone();
        self.queue
            .push_back(Command::Notify(HostNotice::State(state)));
    }

    /// The state last told.
    pub fn state(&self) -> &LivenessState {
        &self.state
    }

    fn on_registration(&mut self, now: Instant, notice: RegistrationNotice) {
        match notice {
            RegistrationNotice::State(LivenessState::Stopped { .. }) => {}
            RegistrationNotice::State(state) => {
                if let LivenessState::Registered { lease } = state {
                    self.keepalive
                        .handle(now, KeepaliveInput::Settled { lease });
                }
                self.tell(state);
            }
            RegistrationNotice::Left { lease } => {
                // Rule 4: watchers saw the leave; the revoke is a courtesy.
                self.keepalive.set_brief_revoke(true);
                self.queue
                    .push_back(Command::Notify(HostNotice::Left { lease }));
            }
            RegistrationNotice::SessionRequest(request) => match request {
                SessionRequest::Gone(_) => self.hub.request(request),
                // At the leave's give-up, right before the registration
                // ends, the keepalive revokes the lease anyway (rule 4): a
                // replace would grant a new one first.
                SessionRequest::Replace(_) if self.stopping => {}
                // A refused resume (rule 7).
                SessionRequest::Replace(_) => self.hub.request(request),
            },
            RegistrationNotice::Detached(point) => {
                if self.detaching {
                    self.detached = Some(point);
                }
            }
        }
    }
}

impl Machine for Host {
    type Input = HostInput;
    type Notice = HostNotice;

    fn handle(&mut self, now: Instant, input: HostInput) {
        match input {
            HostInput::Rpc(reply) => {
                if self.keepalive.owns(reply.id) {
                    self.keepalive.handle(now, KeepaliveInput::Rpc(reply));
                } else {
                    self.registration.handle(now, RegistrationInput::Rpc(reply));
                }
            }
            HostInput::SetValue(value) => self
                .registration
                .handle(now, RegistrationInput::SetValue(value)),
            // A second stop must not move the leave's give-up.
            HostInput::Stop if !self.stopping => {
                self.stopping = true;
                // Rule 4: the lease lives for the leave, but one lost
                // meanwhile is not replaced.
                self.keepalive.handle(now, KeepaliveInput::Draining);
                self.registration.handle(now, RegistrationInput::Stop);
            }
            HostInput::Detach if !self.stopping => {
                self.stopping = true;
                self.detaching = true;
                self.registration.handle(now, RegistrationInput::Detach);
            }
            HostInput::Stop | HostInput::Detach => {}
        }
        self.pump(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.keepalive.handle_timeout(now);
        self.pump(now);
        self.registration.handle_timeout(now);
        self.pump(now);
    }

    fn poll_command(&mut self) -> Option<Command<HostNotice>> {
        self.queue.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        [
            self.keepalive.poll_timeout(),
            self.registration.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn stop_input() -> HostInput {
        HostInput::Stop
    }

    fn is_finished(&self) -> bool {
        self.keepalive.is_finished() && self.registration.is_finished() && self.queue.is_empty()
    }
}

fn secs(ttl_secs: i64) -> Duration {
    Duration::from_secs(
        u64::try_from(ttl_secs.clamp(1, crate::keepalive::MAX_TTL_SECS)).unwrap_or(1),
    )
}
