//! One member of a shard map as a driver runs it: a [`ShardMap`] composed
//! with its session, either its own lease-only [`Keepalive`]
//! ([`Member::new`]) or a session kept by someone else that tells it facts
//! ([`Member::on_session`], [`SessionInput`]). This is the machine the
//! facade runs and the shard simulation drives, so what the simulation
//! checks is what runs.
//!
//! Guarantees (beside those of [`ShardMap`], which all hold):
//! * **Order.** On a new lease the map hears `SessionUp` before its
//!   [`MemberNotice::Trusted`] is told: the map's `Lost` notices for
//!   shards on the old lease leave before anything about the new lease.
//!   A loss is told ([`MemberNotice::SessionLost`]) before the map's
//!   `Lost` notices that follow from it.
//! * **Stale leases.** On a shared session, a "lease not found" answer to
//!   one of the map's requests loses the lease here at once (the session
//!   is asked to learn it: [`MemberNotice::SessionRequest`]), and later
//!   facts about that lease (a renewal the session answered before it
//!   learnt the loss) are ignored: they cannot bring it back. The answer
//!   is about the lease its request carried: one about an earlier lease
//!   (sent before a loss, answered after the next grant) ends nothing.
//! * **Leave.** [`MemberInput::Leave`] hands every owned shard back at
//!   once (its caller has stopped their work), the member key is deleted,
//!   then an own session's lease is revoked; a shared session stays.
//! * Request ids: an own session's start at 0, the map's at
//!   [`MAP_FIRST_RPC_ID`], so a reply's id alone says which part it is for.

use super::{ShardConfig, ShardInput, ShardMap, ShardNotice};
use crate::election::SessionRequest;
use crate::keepalive::{
    Keepalive, KeepaliveConfig, KeepaliveInput, KeepaliveNotice, LivenessState, RenewalGrid,
};
use crate::rpc::{Command, LeaseId, Request, RpcError, RpcId, RpcReply, TxnOp};
use crate::session::SessionInput;
use crate::Machine;
use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

/// The map's request ids start here, far above any an own session issues.
pub const MAP_FIRST_RPC_ID: u64 = 1 << 40;

/// What a [`Member`]'s driver and user ask of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberInput {
    /// The reply to one of the member's requests (others are ignored).
    Rpc(RpcReply),
    /// The user drained `shard` after its `Release`: hand it back.
    Release(u32),
    /// Leave now: every owned shard is handed back at once (the caller has
    /// stopped their work), the member key deleted, then the lease revoked
    /// (an own session's; a shared one stays).
    Leave,
    /// A fact about the shared session the member is on
    /// ([`Member::on_session`]); ignored by a member with its own session.
    Session(SessionInput),
}

impl From<RpcReply> for MemberInput {
    fn from(reply: RpcReply) -> Self {
        MemberInput::Rpc(reply)
    }
}

/// What a [`Member`] tells its user, in order, via [`Command::Notify`].
///
/// Exhaustive, as [`ShardNotice`] is: a driver that matches every notice
/// must learn of a new one at compile time, since each bears on belief.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberNotice {
    /// The map's own notice.
    Shard(ShardNotice),
    /// The session is trusted until `until` (its local deadline): no
    /// belief outlives it, whatever the driver reports later.
    Trusted {
        /// The session lease.
        lease: LeaseId,
        /// Its local deadline now.
        until: Instant,
    },
    /// The session was lost; the map tells `Lost` for every owned shard.
    SessionLost,
    /// The session ended for good; `revoked`: etcd confirmed the revoke
    /// (every key of the member went with it).
    Stopped {
        /// Whether etcd confirmed the revoke.
        revoked: bool,
    },
    /// etcd refused an own session for good (permission denied): the
    /// member leaves and ends. Holds etcd's refusal.
    Refused(RpcError),
    /// What the member asks of the shared session it is on.
    SessionRequest(SessionRequest),
}

/// A shard map member with its session; see the module docs.
///
/// `Clone` copies the whole machine, timers and queued commands included:
/// the model checker forks a world at every choice.
#[derive(Clone, Debug)]
pub struct Member {
    /// The member's own session; `None` on a shared session, whose facts
    /// come as [`MemberInput::Session`].
    session: Option<Keepalive>,
    map: ShardMap,
    queue: VecDeque<Command<MemberNotice>>,
    session_stopped: bool,
    /// The shared session's lease as last told (`Up` or `Trusted`).
    lease: Option<LeaseId>,
    /// A shared lease this member found gone (etcd answered "lease not
    /// found"): later facts about it are ignored, so a renewal the session
    /// answered before it learnt the loss cannot bring it back.
    gone: Option<LeaseId>,
    /// The lease each of the map's requests in flight was sent on (those
    /// that carry one): a "lease not found" answer is about that lease,
    /// which may be an old one by the time the answer arrives.
    sent_on: BTreeMap<RpcId, LeaseId>,
}

impl Member {
    /// A member on its own session, made from `session` (a lease-only
    /// one: `binding: None`), renewing on `grid` if given. Its first
    /// commands are the grant and the map's read.
    pub fn new(
        session: KeepaliveConfig,
        map: ShardConfig,
        grid: Option<RenewalGrid>,
        now: Instant,
        seed: u64,
    ) -> Self {
        let mut session = Keepalive::with_first_rpc_id(session, now, seed, 0);
        session.set_renewal_grid(grid);
        let map = ShardMap::with_first_rpc_id(map, now, seed ^ 0x5555, MAP_FIRST_RPC_ID);
        let mut member = Member {
            session: Some(session),
            map,
            queue: VecDeque::new(),
            session_stopped: false,
            lease: None,
            gone: None,
            sent_on: BTreeMap::new(),
        };
        member.pump(now);
        member
    }

    /// A member on a shared session: the map alone, fed the session's
    /// facts ([`MemberInput::Session`]); leaving never ends the session.
    pub fn on_session(map: ShardConfig, now: Instant, seed: u64) -> Self {
        let map = ShardMap::with_first_rpc_id(map, now, seed ^ 0x5555, MAP_FIRST_RPC_ID);
        let mut member = Member {
            session: None,
            map,
            queue: VecDeque::new(),
            session_stopped: true,
            lease: None,
            gone: None,
            sent_on: BTreeMap::new(),
        };
        member.pump(now);
        member
    }

    /// A fact of the shared session, as the map must hear it (the rules of
    /// `sm/src/election/shared.rs`): trust from `Trusted` on, loss at once
    /// on `Lost`, `Refused` or `Closed`; `Closed` also leaves the map,
    /// whose keys go with the session's revoke.
    fn session_fact(&mut self, now: Instant, fact: SessionInput) {
        match fact {
            SessionInput::Up { lease } | SessionInput::Suspended { lease } => {
                if self.gone != Some(lease) {
                    self.lease = Some(lease);
                }
            }
            SessionInput::Trusted { lease, until } => {
                if self.gone == Some(lease) {
                    return;
                }
                self.lease = Some(lease);
                self.trusted(now, lease, until);
            }
            SessionInput::Lost { .. } | SessionInput::Refused(_) => {
                self.lease = None;
                self.lose(now);
            }
            SessionInput::Closed => {
                self.lease = None;
                self.lose(now);
                self.map.handle(now, ShardInput::Leave);
            }
        }
    }

    /// The session trusts `lease` until `until`: the map hears it first,
    /// since a new lease ends the beliefs on the old one (its `Lost`
    /// notices) and those must reach the facade before the new deadline
    /// does; an own session's and a shared one's trust go the same way.
    fn trusted(&mut self, now: Instant, lease: i64, until: Instant) {
        self.map.handle(
            now,
            ShardInput::SessionUp {
                lease,
                trusted_until: until,
            },
        );
        self.drain_map();
        self.queue
            .push_back(Command::Notify(MemberNotice::Trusted { lease, until }));
    }

    /// On a shared session, a "lease not found" answer to one of the map's
    /// requests: the lease is lost here at once, and the session is asked
    /// to learn it now rather than at its next renewal.
    fn lease_not_found(&mut self, now: Instant, reply: &RpcReply) {
        let sent_on = self.sent_on.remove(&reply.id);
        if self.session.is_some() || !matches!(reply.result, Err(RpcError::LeaseNotFound)) {
            return;
        }
        // About the lease the request carried: an answer about an earlier
        // lease (sent before a loss, answered after the next grant) says
        // nothing about the current one.
        if sent_on.is_none() || sent_on != self.lease {
            return;
        }
        let Some(lease) = self.lease.take() else {
            return;
        };
        self.gone = Some(lease);
        self.lose(now);
        self.queue
            .push_back(Command::Notify(MemberNotice::SessionRequest(
                SessionRequest::Gone(lease),
            )));
    }

    /// Moves both parts' commands into the queue, the session's notices
    /// turned into the map's session inputs; once the map has left, the
    /// session is stopped (its lease revoked).
    fn pump(&mut self, now: Instant) {
        loop {
            let mut progressed = false;
            while let Some(command) = self.session.as_mut().and_then(|s| s.poll_command()) {
                progressed = true;
                match command {
                    Command::Rpc { id, request } => {
                        self.queue.push_back(Command::Rpc { id, request })
                    }
                    Command::Cancel { id } => self.queue.push_back(Command::Cancel { id }),
                    Command::Notify(KeepaliveNotice::Trusted { lease, until }) => {
                        self.trusted(now, lease, until);
                    }
                    Command::Notify(KeepaliveNotice::State(state)) => match state {
                        LivenessState::Lost { .. } => self.lose(now),
                        LivenessState::Stopped { revoked } => {
                            self.lose(now);
                            self.queue
                                .push_back(Command::Notify(MemberNotice::Stopped { revoked }));
                        }
                        LivenessState::Refused { error } => {
                            self.lose(now);
                            self.queue
                                .push_back(Command::Notify(MemberNotice::Refused(error)));
                            self.map.handle(now, ShardInput::Leave);
                        }
                        // Waiting and Duplicate are about a bound key,
                        // which a lease-only session has not.
                        LivenessState::Registering
                        | LivenessState::Registered { .. }
                        | LivenessState::Suspended { .. }
                        | LivenessState::Waiting { .. }
                        | LivenessState::Duplicate { .. } => {}
                    },
                    Command::Notify(
                        KeepaliveNotice::Detached(_) | KeepaliveNotice::GrantFailed { .. },
                    ) => {}
                }
            }
            progressed |= self.drain_map();
            if self.map.is_finished() && !self.session_stopped {
                self.session_stopped = true;
                if let Some(session) = &mut self.session {
                    session.handle(now, KeepaliveInput::Stop);
                }
                progressed = true;
            }
            if !progressed {
                break;
            }
        }
    }

    /// Moves the map's commands into the queue; whether there were any.
    fn drain_map(&mut self) -> bool {
        let mut any = false;
        while let Some(command) = self.map.poll_command() {
            any = true;
            self.queue.push_back(match command {
                Command::Rpc { id, request } => {
                    if let Some(lease) = lease_of(&request) {
                        self.sent_on.insert(id, lease);
                    }
                    Command::Rpc { id, request }
                }
                Command::Cancel { id } => {
                    self.sent_on.remove(&id);
                    Command::Cancel { id }
                }
                Command::Notify(n) => Command::Notify(MemberNotice::Shard(n)),
            });
        }
        any
    }

    /// The map, to read what it believes (owned shards, the member's
    /// view); every change goes through [`Machine::handle`].
    pub fn map(&self) -> &ShardMap {
        &self.map
    }

    fn lose(&mut self, now: Instant) {
        self.queue
            .push_back(Command::Notify(MemberNotice::SessionLost));
        self.map.handle(now, ShardInput::SessionLost);
    }
}

impl Machine for Member {
    type Input = MemberInput;
    type Notice = MemberNotice;

    fn handle(&mut self, now: Instant, input: MemberInput) {
        match input {
            MemberInput::Rpc(reply) => match &mut self.session {
                Some(session) if session.owns(reply.id) => {
                    session.handle(now, KeepaliveInput::Rpc(reply))
                }
                _ => {
                    self.lease_not_found(now, &reply);
                    self.map.handle(now, ShardInput::Rpc(reply));
                }
            },
            MemberInput::Session(fact) => self.session_fact(now, fact),
            MemberInput::Release(shard) => self.map.handle(now, ShardInput::Release { shard }),
            MemberInput::Leave => {
                self.map.handle(now, ShardInput::Leave);
                // Leaving tells `Release` for every owned shard; nobody
                // drains them any more, so each is handed back at once.
                for (shard, _) in self.map.owned() {
                    self.map.handle(now, ShardInput::Release { shard });
                }
            }
        }
        self.pump(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        if let Some(session) = &mut self.session {
            session.handle_timeout(now);
        }
        self.pump(now);
        self.map.handle_timeout(now);
        self.pump(now);
    }

    fn poll_command(&mut self) -> Option<Command<MemberNotice>> {
        self.queue.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        [
            self.session.as_ref().and_then(|s| s.poll_timeout()),
            self.map.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn stop_input() -> MemberInput {
        MemberInput::Leave
    }

    fn is_finished(&self) -> bool {
        self.map.is_finished()
            && self.session.as_ref().is_none_or(|s| s.is_finished())
            && self.queue.is_empty()
    }
}

/// The lease a request writes keys on, if it writes any: only such a
/// request can be answered "lease not found".
fn lease_of(request: &Request) -> Option<LeaseId> {
    let txn = match request {
        Request::Put { lease, .. } => return (*lease != 0).then_some(*lease),
        Request::Txn(txn) => txn,
        _ => return None,
    };
    txn.success
        .iter()
        .chain(&txn.failure)
        .find_map(|op| match op {
            TxnOp::Put { lease, .. } if *lease != 0 => Some(*lease),
            _ => None,
        })
}
