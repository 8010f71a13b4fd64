//! One member of a shard map as the driver runs it: a lease-only
//! [`Keepalive`] session and the [`ShardMap`] machine in one task, composed
//! as `sm/tests/sim/shard.rs` composes them (its `Member`), so what the
//! simulation checked is what runs. Glue only: the session's notices
//! become the map's session inputs, every decision stays in the machines.

use fleetcoord_sm::election::{SessionInput, SessionRequest};
use fleetcoord_sm::keepalive::{
    Keepalive, KeepaliveConfig, KeepaliveInput, KeepaliveNotice, LivenessState, RenewalGrid,
};
use fleetcoord_sm::shard::{ShardConfig, ShardInput, ShardMap, ShardNotice};
use fleetcoord_sm::{Command, Machine, RpcError, RpcReply};
use std::collections::VecDeque;
use std::time::Instant;

/// The map's request ids start here, far above any the session issues.
const MAP_FIRST_RPC_ID: u64 = 1 << 40;

/// What the member's user (the facade) asks of it.
#[derive(Clone, Debug)]
pub(crate) enum MemberInput {
    Rpc(RpcReply),
    /// The user drained `shard` after its `Release`.
    Release(u32),
    /// Leave now: every owned shard is handed back at once (the caller has
    /// stopped their work), the member key deleted, then the lease revoked
    /// (an own session's; a shared one stays).
    Leave,
    /// A fact about the shared session the member is on.
    Session(SessionInput),
}

impl From<RpcReply> for MemberInput {
    fn from(reply: RpcReply) -> Self {
        MemberInput::Rpc(reply)
    }
}

/// What the member tells the facade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MemberNotice {
    /// The map's own notice.
    Shard(ShardNotice),
    /// The session is trusted until `until` (its local deadline): no
    /// belief outlives it, whatever the driver reports later.
    Trusted { lease: i64, until: Instant },
    /// The session was lost; the map tells `Lost` for every owned shard.
    SessionLost,
    /// The session ended for good; `revoked`: etcd confirmed the revoke
    /// (every key of the member went with it).
    Stopped { revoked: bool },
    /// etcd refused the session for good (permission denied): the member
    /// leaves and ends.
    Refused(String),
    /// What the member asks of the shared session it is on.
    SessionRequest(SessionRequest),
}

pub(crate) struct Member {
    /// The member's own session; `None` on a shared session, whose facts
    /// come as [`MemberInput::Session`].
    session: Option<Keepalive>,
    map: ShardMap,
    queue: VecDeque<Command<MemberNotice>>,
    session_stopped: bool,
    /// The shared session's lease as last told (`Up` or `Trusted`).
    lease: Option<i64>,
    /// A shared lease this member found gone (etcd answered "lease not
    /// found"): later facts about it are ignored, so a renewal the session
    /// answered before it learnt the loss cannot bring it back.
    gone: Option<i64>,
}

impl Member {
    pub(crate) fn new(
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
        };
        member.pump(now);
        member
    }

    /// A member on a shared session: the map alone, fed the session's
    /// facts ([`MemberInput::Session`]); leaving never ends the session.
    pub(crate) fn on_session(map: ShardConfig, now: Instant, seed: u64) -> Self {
        let map = ShardMap::with_first_rpc_id(map, now, seed ^ 0x5555, MAP_FIRST_RPC_ID);
        let mut member = Member {
            session: None,
            map,
            queue: VecDeque::new(),
            session_stopped: true,
            lease: None,
            gone: None,
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
                // The map first, as for an own session (see `pump`).
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

    /// On a shared session, a "lease not found" answer to one of the map's
    /// requests: the lease is lost here at once, and the session is asked
    /// to learn it now rather than at its next renewal.
    fn lease_not_found(&mut self, now: Instant, reply: &RpcReply) {
        if self.session.is_some() || !matches!(reply.result, Err(RpcError::LeaseNotFound)) {
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
                        // The map first: a new lease ends the beliefs on
                        // the old one (its `Lost` notices), and those must
                        // reach the facade before the new deadline does.
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
                                .push_back(Command::Notify(MemberNotice::Refused(format!(
                                    "{error:?}"
                                ))));
                            self.map.handle(now, ShardInput::Leave);
                        }
                        LivenessState::Registering
                        | LivenessState::Registered { .. }
                        | LivenessState::Suspended { .. } => {}
                    },
                    Command::Notify(
                        KeepaliveNotice::Left { .. } | KeepaliveNotice::Detached(_),
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
                Command::Rpc { id, request } => Command::Rpc { id, request },
                Command::Cancel { id } => Command::Cancel { id },
                Command::Notify(n) => Command::Notify(MemberNotice::Shard(n)),
            });
        }
        any
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

#[cfg(test)]
mod tests {
    use super::*;
    use fleetcoord_sm::{Request, Response, RpcId, RpcReply};
    use std::time::Duration;

    fn member(now: Instant) -> Member {
        let session = KeepaliveConfig {
            ttl_secs: 5,
            binding: None,
            backoff: Default::default(),
            safety_margin: Duration::from_millis(250),
            drift_allowance_ppm: 10_000,
            attempt_timeout: Duration::from_millis(500),
            announce_trust: true,
        };
        Member::new(session, map_config(), None, now, 7)
    }

    fn map_config() -> ShardConfig {
        ShardConfig {
            prefix: b"/coord/shards/m/".to_vec(),
            member: b"a".to_vec(),
            weight: 1,
            shards: 2,
            backoff: Default::default(),
            attempt_timeout: Duration::from_millis(500),
            drain: Duration::from_secs(1),
        }
    }

    fn drain(m: &mut Member) -> Vec<Command<MemberNotice>> {
        std::iter::from_fn(|| m.poll_command()).collect()
    }

    fn rpc(commands: &[Command<MemberNotice>], pick: fn(&Request) -> bool) -> RpcId {
        commands
            .iter()
            .find_map(|c| match c {
                Command::Rpc { id, request } if pick(request) => Some(*id),
                _ => None,
            })
            .expect("the request")
    }

    #[test]
    fn the_session_drives_the_map_as_the_simulation_composes_them() {
        let t0 = Instant::now();
        let mut m = member(t0);
        let first = drain(&mut m);
        let grant = rpc(&first, |r| matches!(r, Request::Grant { .. }));
        let read = rpc(&first, |r| matches!(r, Request::Range(_)));
        assert!(grant.0 < MAP_FIRST_RPC_ID && read.0 >= MAP_FIRST_RPC_ID);
        m.handle(
            t0,
            MemberInput::Rpc(RpcReply {
                id: read,
                result: Ok(Response::Range {
                    revision: 1,
                    kvs: vec![],
                }),
            }),
        );
        let _watch = drain(&mut m);
        m.handle(
            t0,
            MemberInput::Rpc(RpcReply {
                id: grant,
                result: Ok(Response::Granted {
                    lease: 42,
                    ttl_secs: 5,
                }),
            }),
        );
        // The grant's trust reaches the facade, and the map, now trusted,
        // registers the member on that lease.
        let after = drain(&mut m);
        assert!(
            after.iter().any(
                |c| matches!(c, Command::Notify(MemberNotice::Trusted { until, .. }) if *until > t0)
            ),
            "{after:?}"
        );
        let register = after.iter().any(|c| match c {
            Command::Rpc {
                request: Request::Txn(txn),
                ..
            } => txn.success.iter().any(|op| {
                matches!(op, fleetcoord_sm::TxnOp::Put { key, lease: 42, .. } if key == b"/coord/shards/m/members/a")
            }),
            _ => false,
        });
        assert!(register, "{after:?}");
        // Leaving with nothing owned finishes the map once its write is
        // answered (here: refused, so no key of it exists), and only then
        // stops the session: its lease is revoked.
        let register = rpc(&after, |r| matches!(r, Request::Txn(_)));
        m.handle(t0, MemberInput::Leave);
        let leaving = drain(&mut m);
        let revoke = |cs: &[Command<MemberNotice>]| {
            cs.iter().find_map(|c| match c {
                Command::Rpc {
                    id,
                    request: Request::Revoke { lease: 42 },
                } => Some(*id),
                _ => None,
            })
        };
        assert_eq!(revoke(&leaving), None, "a write is in flight: {leaving:?}");
        m.handle(
            t0,
            MemberInput::Rpc(RpcReply {
                id: register,
                result: Ok(Response::Txn {
                    succeeded: false,
                    revision: 2,
                    responses: vec![],
                }),
            }),
        );
        let stopping = drain(&mut m);
        let revoke = revoke(&stopping).expect("the revoke once the map left");
        m.handle(
            t0,
            MemberInput::Rpc(RpcReply {
                id: revoke,
                result: Ok(Response::Revoked),
            }),
        );
        let last = drain(&mut m);
        assert!(
            last.contains(&Command::Notify(MemberNotice::Stopped { revoked: true })),
            "{last:?}"
        );
        assert!(m.is_finished());
    }

    #[test]
    fn on_a_shared_session_lease_not_found_is_a_loss_at_once_and_the_session_is_told() {
        let t0 = Instant::now();
        let mut m = Member::on_session(map_config(), t0, 7);
        let first = drain(&mut m);
        assert!(
            !first.iter().any(|c| matches!(
                c,
                Command::Rpc {
                    request: Request::Grant { .. },
                    ..
                }
            )),
            "no lease of its own: {first:?}"
        );
        let read = rpc(&first, |r| matches!(r, Request::Range(_)));
        m.handle(
            t0,
            MemberInput::Rpc(RpcReply {
                id: read,
                result: Ok(Response::Range {
                    revision: 1,
                    kvs: vec![],
                }),
            }),
        );
        let _watch = drain(&mut m);
        let until = t0 + Duration::from_secs(4);
        m.handle(t0, MemberInput::Session(SessionInput::Up { lease: 42 }));
        m.handle(
            t0,
            MemberInput::Session(SessionInput::Trusted { lease: 42, until }),
        );
        let trusted = drain(&mut m);
        assert!(
            trusted.contains(&Command::Notify(MemberNotice::Trusted { lease: 42, until })),
            "{trusted:?}"
        );
        let write = rpc(&trusted, |r| matches!(r, Request::Txn(_)));
        m.handle(
            t0,
            MemberInput::Rpc(RpcReply {
                id: write,
                result: Err(fleetcoord_sm::RpcError::LeaseNotFound),
            }),
        );
        let gone = drain(&mut m);
        assert!(
            gone.contains(&Command::Notify(MemberNotice::SessionLost)),
            "{gone:?}"
        );
        assert!(
            gone.contains(&Command::Notify(MemberNotice::SessionRequest(
                SessionRequest::Gone(42)
            ))),
            "{gone:?}"
        );
        // A renewal of the gone lease the session answered earlier brings
        // nothing back.
        m.handle(
            t0,
            MemberInput::Session(SessionInput::Trusted { lease: 42, until }),
        );
        let late = drain(&mut m);
        assert!(
            !late
                .iter()
                .any(|c| matches!(c, Command::Notify(MemberNotice::Trusted { .. }))),
            "{late:?}"
        );
        // Closing the session leaves the map; the member ends without a
        // revoke of its own.
        m.handle(t0, MemberInput::Session(SessionInput::Closed));
        let closing = drain(&mut m);
        assert!(
            !closing.iter().any(|c| matches!(
                c,
                Command::Rpc {
                    request: Request::Revoke { .. },
                    ..
                }
            )),
            "{closing:?}"
        );
    }
}
