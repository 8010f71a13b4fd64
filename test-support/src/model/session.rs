//! The shared-session world: an election, a shard member and a host
//! registration — the production machines (`Election::on_session`, the
//! shard `Member::on_session`, `Registration`) — on one session lease,
//! fanned out by the production [`SessionHub`], around the model etcd.
//! Each machine has its own [`Wire`] and its own inbox of session facts:
//! a fact the hub tells is queued, and the machine hears it when the
//! world says ([`SessionAction::Hear`]), so a reply may reach a machine
//! before the loss it was told, as on the driver, where each machine is a
//! task of its own. What the user may believe is kept beside each machine
//! as the facade keeps it: a [`SessionBelief`] fed the hub's
//! `EndBeliefs` (executed at once, as the facade does under the hub's
//! lock), and the leadership or the shards the machine reported.
//!
//! The lease-only keepalive is kept by the world as the shard world keeps
//! it, and its notices go to the hub: granted at once, renewed every third
//! of the TTL, trusted until the renewal's instant plus the TTL less the
//! margin. The hub's `Keepalive` commands are taken at once: `LeaseGone`
//! or `Replace` of the current lease is a loss (a replace revokes it
//! first), and a new lease is granted.
//!
//! Faults: the session cut off (renewals stop; at its local deadline it is
//! lost and a new lease granted); the lease revoked early by etcd (nobody
//! is told: a machine's "lease not found", or the next renewal, is the
//! first evidence); requests or replies lost; a given-up request landing
//! late; a machine hearing its session's facts late (a budget of steps
//! taken while a told fact is unheard; without it facts are heard at
//! once, which keeps the state space small).
//!
//! Safety, checked on every transition (etcd's time is the machines'):
//! 1. **No belief survives its lease.** A leadership or a shard believed
//!    (not ended, before its deadline by the world's clock) is backed by
//!    its key in etcd, with its token as create revision, on a lease etcd
//!    still holds — unless etcd revoked that lease early and nobody has
//!    seen any evidence of it yet (no client can know: property 3 covers
//!    the rest). A lease etcd *expired* never carries a belief.
//! 2. **Nothing about a new lease before every belief on the old one
//!    ended.** When the hub tells a member anything about lease L (`Up`,
//!    `Trusted`), or asks the keepalive to give a lease up, no member
//!    believes anything on another lease (on the given-up one).
//! 3. **Beliefs end at the first evidence.** Once the world has any
//!    evidence that a lease is gone (the keepalive's loss, a machine's
//!    "lease not found", a `Replace`), nothing on it is believed from that
//!    step on — even though the machines may not have heard of it yet.
//! 4. **Deadlines never lie in the past**: `poll_timeout()` is never
//!    earlier than now after a step.
//!
//! Liveness, from every quiescent state (nothing in flight, every inbox
//! heard): with no further faults, messages delivered at once and the
//! user campaigning again whenever its campaign ended, within
//! `liveness_bound` the election is believed led, the shard believed
//! owned, and the host key registered on the session's current lease.

use super::wire::{Bends, Taken, Wire, WireAction};
use super::{hash_debug, World};
use crate::ModelEtcd;
use fleetcoord_sm::election::{
    Election, ElectionConfig, ElectionInput, ElectionNotice, OpId, SessionRequest,
};
use fleetcoord_sm::keepalive::{KeepaliveInput, KeepaliveNotice, LivenessState};
use fleetcoord_sm::registration::{
    Registration, RegistrationConfig, RegistrationInput, RegistrationNotice,
};
use fleetcoord_sm::session::{HubCommand, MemberId, SessionBelief, SessionHub, SessionInput};
use fleetcoord_sm::shard::member::{Member as ShardMember, MemberInput, MemberNotice};
use fleetcoord_sm::shard::{keys, ShardConfig, ShardNotice};
use fleetcoord_sm::{BackoffConfig, LeaseId, Machine, Request, Response, RpcError};
use std::collections::{BTreeSet, VecDeque};
use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ELECTION: &[u8] = b"/e/a/";
const SHARDS: &[u8] = b"/s/";
const HOST: &[u8] = b"/h/x";
const SEED: u64 = 5;
/// The election, the shard member and the host registration, in the
/// order they join the hub.
const E: usize = 0;
const S: usize = 1;
const R: usize = 2;

/// How many faults of each kind one path may contain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// Requests, replies or watch streams lost.
    pub lose: u32,
    /// Orphans (requests given up) landing late.
    pub land: u32,
    /// Sessions cut off (lost at their local deadline, then granted anew).
    pub cut: u32,
    /// Leases revoked early by etcd, nobody told.
    pub revoke: u32,
    /// Steps (a reply, a landing, time, a fault) taken while a fact the
    /// hub told is still unheard: how far a machine may lag behind its
    /// session. Without it facts are heard at once, in member order.
    pub late: u32,
}

/// How the world bends the hub, for tests that must fail.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mutant {
    /// The production hub.
    #[default]
    None,
    /// The hub's `EndBeliefs` are not executed: beliefs end only when each
    /// machine hears the loss ("end beliefs first" removed).
    NoEndFirst,
    /// `EndBeliefs` are executed without their lease, so no member's
    /// belief learns it is dead (the dead-lease mark removed).
    NoDeadMark,
}

/// A world to explore: its faults, bounds and bends.
#[derive(Clone, Debug)]
pub struct SessionSetup {
    /// The session's TTL.
    pub ttl_secs: i64,
    /// The session's safety margin.
    pub safety_margin: Duration,
    /// The machines' attempt timeout.
    pub attempt_timeout: Duration,
    /// Faults per path.
    pub budget: Budget,
    /// How many times time may pass between a request being given up and
    /// its landing.
    pub land_within: u32,
    /// Time stops here (a quiescent state at the horizon is a leaf).
    pub horizon: Duration,
    /// The liveness bound from every quiescent state.
    pub liveness_bound: Duration,
    /// How the hub is bent.
    pub mutant: Mutant,
}

impl SessionSetup {
    /// TTL 2 s, margin 100 ms, attempt timeout 400 ms, no faults, a 1.5 s
    /// horizon, liveness within 2 × TTL + 2 s.
    pub fn new() -> Self {
        SessionSetup {
            ttl_secs: 2,
            safety_margin: Duration::from_millis(100),
            attempt_timeout: Duration::from_millis(400),
            budget: Budget::default(),
            land_within: 1,
            horizon: Duration::from_millis(1_500),
            liveness_bound: Duration::from_secs(6),
            mutant: Mutant::None,
        }
    }

    fn backoff(&self) -> BackoffConfig {
        BackoffConfig {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(400),
            multiplier: 2,
            jitter_percent: 0,
        }
    }

    fn lifetime(&self) -> Duration {
        Duration::from_secs(self.ttl_secs.unsigned_abs()).saturating_sub(self.safety_margin)
    }
}

impl Default for SessionSetup {
    fn default() -> Self {
        Self::new()
    }
}

/// One step of the shared-session world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionAction {
    /// A step on member `.0`'s wire.
    Wire(usize, WireAction),
    /// Member `.0`'s machine hears the oldest fact in its inbox.
    Hear(usize),
    /// The election's user campaigns (again).
    Campaign,
    /// Time passes to the next deadline, nothing in flight.
    Tick,
    /// The session is cut off: no renewal succeeds any more.
    Cut,
    /// etcd revokes the session's lease now; nobody is told.
    Revoke,
}

/// A leadership the election's user believes, as the facade keeps it.
#[derive(Clone, Debug, Hash)]
struct Held {
    token: i64,
    lease: LeaseId,
    until: Instant,
    /// Handed out over: its lease was ended already.
    over: bool,
}

#[derive(Clone, Debug)]
enum Machine3 {
    Election(Box<Election>),
    Shard(Box<ShardMember>),
    Host(Box<Registration>),
}

#[derive(Clone, Debug)]
struct Part {
    machine: Machine3,
    wire: Wire,
    inbox: VecDeque<SessionInput>,
    id: MemberId,
    belief: SessionBelief,
}

/// The shared-session world; see the module docs for what it checks.
#[derive(Clone)]
pub struct SessionWorld {
    setup: Arc<SessionSetup>,
    etcd: ModelEtcd,
    start: Instant,
    now: Instant,
    hub: SessionHub,
    parts: Vec<Part>,
    /// The session's lease and local deadline, as its keepalive keeps it.
    lease: LeaseId,
    until: Instant,
    /// The next renewal; `None` while cut off.
    renew_at: Option<Instant>,
    /// The election's user believes this leadership.
    held: Option<Held>,
    /// A campaign is open.
    campaigning: bool,
    next_op: u64,
    /// The shard member's beliefs: owned shards with tokens, and the lease
    /// of its last `Trusted`.
    shards: Vec<(u32, i64)>,
    shard_lease: Option<LeaseId>,
    /// The host registration's last state.
    host: LivenessState,
    /// Leases the world has evidence are gone (property 3).
    buried: BTreeSet<LeaseId>,
    /// Leases etcd revoked early ([`SessionAction::Revoke`]).
    revoked: BTreeSet<LeaseId>,
    budget: Budget,
    bends: Bends,
    marks: u32,
}

const ELECTED: u32 = 1 << 0;
const ACQUIRED: u32 = 1 << 1;
const REGISTERED: u32 = 1 << 2;
const CUT: u32 = 1 << 3;
const REVOKED: u32 = 1 << 4;
const GONE: u32 = 1 << 5;
const REPLACED: u32 = 1 << 6;
const REGRANTED: u32 = 1 << 7;
const LATE_WIN: u32 = 1 << 8;
const HEARD_LATE: u32 = 1 << 9;
const LANDED: u32 = 1 << 10;
const LIVENESS: u32 = 1 << 11;

impl SessionWorld {
    /// The session granted, the three members joined, the election
    /// campaigning, at one instant.
    pub fn new(setup: SessionSetup) -> Self {
        let start = Instant::now();
        let keep_orphans = setup.budget.land > 0;
        let election = ElectionConfig {
            prefix: ELECTION.to_vec(),
            ttl_secs: setup.ttl_secs,
            backoff: setup.backoff(),
            safety_margin: setup.safety_margin,
            drift_allowance_ppm: 0,
            attempt_timeout: setup.attempt_timeout,
            announce_session_trust: false,
            permits: 1,
            rw: None,
        };
        let shard = ShardConfig {
            prefix: SHARDS.to_vec(),
            member: b"m0".to_vec(),
            weight: 1,
            shards: 1,
            backoff: setup.backoff(),
            attempt_timeout: setup.attempt_timeout,
            drain: Duration::from_millis(300),
        };
        let host = RegistrationConfig {
            key: HOST.to_vec(),
            value: b"up".to_vec(),
            leave_marker: None,
            companion: None,
            backoff: setup.backoff(),
            give_up: Duration::from_secs(setup.ttl_secs.unsigned_abs()),
            take_over: false,
        };
        let mut hub = SessionHub::new();
        let machines = [
            (
                ELECTION,
                Machine3::Election(Box::new(Election::on_session(
                    election,
                    start,
                    SEED,
                    1 << 44,
                ))),
            ),
            (
                SHARDS,
                Machine3::Shard(Box::new(ShardMember::on_session(shard, start, SEED))),
            ),
            (
                HOST,
                Machine3::Host(Box::new(Registration::new(host, start, SEED))),
            ),
        ];
        let parts = machines
            .into_iter()
            .map(|(key, machine)| Part {
                machine,
                wire: Wire::new(keep_orphans),
                inbox: VecDeque::new(),
                id: hub
                    .attach(&String::from_utf8_lossy(key))
                    .expect("three prefixes"),
                belief: SessionBelief::new(),
            })
            .collect();
        let mut world = SessionWorld {
            budget: setup.budget.clone(),
            bends: Bends::default(),
            setup: Arc::new(setup),
            etcd: ModelEtcd::new(),
            start,
            now: start,
            hub,
            parts,
            lease: 0,
            until: start,
            renew_at: None,
            held: None,
            campaigning: false,
            next_op: 1,
            shards: Vec::new(),
            shard_lease: None,
            host: LivenessState::Registering,
            buried: BTreeSet::new(),
            revoked: BTreeSet::new(),
            marks: 0,
        };
        // The shard member and the registration settle first, in order
        // (nothing in flight when the exploration starts but the
        // election's campaign): what is explored is the session's rules,
        // not every order of three start-ups.
        let ready = world
            .grant()
            .and_then(|()| world.hear_all())
            .and_then(|()| world.settle_others())
            .and_then(|()| world.campaign());
        if let Err(message) = ready {
            panic!("the initial world breaks a rule: {message}");
        }
        world
    }

    // ----- the session's keepalive, as the world keeps it -------------------

    /// A new lease is granted now and told to the hub.
    fn grant(&mut self) -> Result<(), String> {
        let lease = match self.etcd.execute(
            self.now,
            &Request::Grant {
                ttl_secs: self.setup.ttl_secs,
            },
        ) {
            Ok(Response::Granted { lease, .. }) => lease,
            other => return Err(format!("the model grants: {other:?}")),
        };
        if self.lease != 0 {
            self.marks |= REGRANTED;
        }
        self.lease = lease;
        self.keepalive(KeepaliveNotice::State(LivenessState::Registered { lease }))?;
        self.renewed()
    }

    /// The lease was granted or renewed now: trusted for its lifetime.
    fn renewed(&mut self) -> Result<(), String> {
        self.until = self.now + self.setup.lifetime();
        self.renew_at =
            Some(self.now + Duration::from_secs(self.setup.ttl_secs.unsigned_abs()) / 3);
        let (lease, until) = (self.lease, self.until);
        self.keepalive(KeepaliveNotice::Trusted { lease, until })
    }

    /// The current lease is lost (evidence, or its local deadline): told,
    /// then a new one granted.
    fn lose_lease(&mut self) -> Result<(), String> {
        let lease = self.lease;
        self.buried.insert(lease);
        self.keepalive(KeepaliveNotice::State(LivenessState::Lost { lease }))?;
        self.keepalive(KeepaliveNotice::State(LivenessState::Registering))?;
        self.grant()
    }

    /// Feeds the hub one keepalive notice and executes its commands.
    fn keepalive(&mut self, notice: KeepaliveNotice) -> Result<(), String> {
        self.hub.keepalive(notice);
        self.run_hub()
    }

    /// Executes the hub's commands in order, as the facade does, checking
    /// property 2 at each.
    fn run_hub(&mut self) -> Result<(), String> {
        let mut keepalive = Vec::new();
        while let Some(command) = self.hub.poll_command() {
            match command {
                HubCommand::EndBeliefs {
                    member,
                    lease,
                    for_good,
                } => {
                    let lease = match self.setup.mutant {
                        Mutant::NoEndFirst => continue,
                        Mutant::NoDeadMark => None,
                        Mutant::None => lease,
                    };
                    let p = self.part_of(member);
                    self.parts[p].belief.end(lease, for_good);
                    match p {
                        E => self.held = None,
                        S => self.shards.clear(),
                        _ => {}
                    }
                }
                HubCommand::Tell { member, fact } => {
                    let told = match &fact {
                        SessionInput::Up { lease } | SessionInput::Trusted { lease, .. } => {
                            Some(*lease)
                        }
                        _ => None,
                    };
                    if let Some(lease) = told {
                        self.nothing_believed_but(lease)
                            .map_err(|m| format!("told {fact:?} while {m}"))?;
                    }
                    let p = self.part_of(member);
                    self.parts[p].inbox.push_back(fact);
                }
                HubCommand::Keepalive(input) => keepalive.push(input),
                HubCommand::State(_) | HubCommand::Detached(_) => {}
            }
        }
        for input in keepalive {
            match input {
                KeepaliveInput::LeaseGone { lease } if lease == self.lease => {
                    self.marks |= GONE;
                    self.lose_lease()?;
                }
                KeepaliveInput::Replace { lease } if lease == self.lease => {
                    self.marks |= REPLACED;
                    self.buried.insert(lease);
                    self.nothing_believed_on(lease)
                        .map_err(|m| format!("lease {lease:x} given up while {m}"))?;
                    let _ = self.etcd.execute(self.now, &Request::Revoke { lease });
                    self.lose_lease()?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn part_of(&self, member: MemberId) -> usize {
        self.parts
            .iter()
            .position(|p| p.id == member)
            .unwrap_or(usize::MAX)
    }

    // ----- beliefs ------------------------------------------------------------

    /// The leadership believed now: token and lease.
    fn leadership(&self) -> Option<(i64, LeaseId)> {
        self.held
            .as_ref()
            .filter(|h| !h.over && self.now < h.until)
            .map(|h| (h.token, h.lease))
    }

    /// The shards believed owned now, with their tokens and the lease they
    /// were founded on.
    fn owned(&self) -> Vec<(u32, i64, Option<LeaseId>)> {
        if self.parts[S].belief.left(self.now, None).is_none() {
            return Vec::new();
        }
        self.shards
            .iter()
            .map(|&(shard, token)| (shard, token, self.shard_lease))
            .collect()
    }

    /// Property 2's condition: nothing believed on a lease but `lease`.
    fn nothing_believed_but(&self, lease: LeaseId) -> Result<(), String> {
        if let Some((token, on)) = self.leadership().filter(|(_, on)| *on != lease) {
            return Err(format!("leadership {token} on lease {on:x} is believed"));
        }
        if let Some((shard, token, on)) = self
            .owned()
            .into_iter()
            .find(|(_, _, on)| *on != Some(lease))
        {
            return Err(format!("shard {shard} ({token}) on {on:x?} is believed"));
        }
        Ok(())
    }

    /// Nothing believed on `lease`.
    fn nothing_believed_on(&self, lease: LeaseId) -> Result<(), String> {
        if let Some((token, _)) = self.leadership().filter(|(_, on)| *on == lease) {
            return Err(format!("leadership {token} on it is believed"));
        }
        if let Some((shard, token, _)) = self
            .owned()
            .into_iter()
            .find(|(_, _, on)| *on == Some(lease))
        {
            return Err(format!("shard {shard} ({token}) on it is believed"));
        }
        Ok(())
    }

    /// Properties 1, 3 and 4.
    fn check(&self) -> Result<(), String> {
        for (p, part) in self.parts.iter().enumerate() {
            if poll_timeout(&part.machine).is_some_and(|t| t < self.now) {
                return Err(format!("member {p}'s next deadline is in the past"));
            }
        }
        let alive = |lease: LeaseId| self.etcd.lease_deadline(lease).is_some();
        // Revoked early, no evidence yet: nobody can know (property 1).
        let unseen = |lease: LeaseId| self.revoked.contains(&lease);
        if let Some((token, lease)) = self.leadership() {
            if self.buried.contains(&lease) {
                return Err(format!(
                    "leadership {token} on lease {lease:x} believed after evidence that the \
                     lease is gone"
                ));
            }
            let key = [ELECTION, format!("{lease:x}").as_bytes()].concat();
            let kv = self.etcd.get(&key);
            if !unseen(lease)
                && (!alive(lease) || kv.as_ref().map(|kv| kv.create_revision) != Some(token))
            {
                return Err(format!(
                    "leadership {token} on lease {lease:x} believed, but etcd has {kv:?} \
                     (lease alive: {})",
                    alive(lease)
                ));
            }
        }
        for (shard, token, lease) in self.owned() {
            if lease.is_some_and(|l| self.buried.contains(&l)) {
                return Err(format!(
                    "shard {shard} ({token}) on lease {lease:x?} believed after evidence \
                     that the lease is gone"
                ));
            }
            if lease.is_some_and(unseen) {
                continue;
            }
            let kv = self.etcd.get(&keys::shard_key(SHARDS, shard));
            let backed = kv.as_ref().is_some_and(|kv| {
                kv.create_revision == token && Some(kv.lease) == lease && alive(kv.lease)
            });
            if !backed {
                return Err(format!(
                    "shard {shard} ({token}) believed on lease {lease:x?}, but etcd has {kv:?}"
                ));
            }
        }
        Ok(())
    }

    // ----- the machines ---------------------------------------------------------

    /// The election's user campaigns.
    fn campaign(&mut self) -> Result<(), String> {
        let op = OpId(self.next_op);
        self.next_op += 1;
        self.campaigning = true;
        if let Machine3::Election(m) = &mut self.parts[E].machine {
            m.handle(
                self.now,
                ElectionInput::Campaign {
                    op,
                    value: b"a".to_vec(),
                },
            );
        }
        self.pump(E)
    }

    /// Moves member `p`'s commands onto its wire and its notices to the
    /// user's beliefs and the hub, as the facade does.
    fn pump(&mut self, p: usize) -> Result<(), String> {
        loop {
            let part = &mut self.parts[p];
            let notice = match &mut part.machine {
                Machine3::Election(m) => m.poll_command().map(|c| match part.wire.accept(c) {
                    Some(n) => Notice::Election(n),
                    None => Notice::None,
                }),
                Machine3::Shard(m) => m.poll_command().map(|c| match part.wire.accept(c) {
                    Some(n) => Notice::Shard(n),
                    None => Notice::None,
                }),
                Machine3::Host(m) => m.poll_command().map(|c| match part.wire.accept(c) {
                    Some(n) => Notice::Host(n),
                    None => Notice::None,
                }),
            };
            let Some(notice) = notice else {
                return Ok(());
            };
            match notice {
                Notice::None => {}
                Notice::Election(n) => self.election_notice(n)?,
                Notice::Shard(n) => self.shard_notice(n)?,
                Notice::Host(n) => match n {
                    RegistrationNotice::State(state) => {
                        if matches!(state, LivenessState::Registered { .. }) {
                            self.marks |= REGISTERED;
                        }
                        self.host = state;
                    }
                    RegistrationNotice::SessionRequest(request) => self.request(request)?,
                    RegistrationNotice::Left { .. } | RegistrationNotice::Detached(_) => {}
                },
            }
        }
    }

    /// A machine asked the session: the hub decides (the request is
    /// evidence about its lease, property 3).
    fn request(&mut self, request: SessionRequest) -> Result<(), String> {
        let (SessionRequest::Gone(lease) | SessionRequest::Replace(lease)) = request;
        self.buried.insert(lease);
        self.hub.request(request);
        self.run_hub()
    }

    /// What the facade's election handler does with a notice.
    fn election_notice(&mut self, notice: ElectionNotice) -> Result<(), String> {
        match notice {
            ElectionNotice::SessionRequest(request) => self.request(request)?,
            ElectionNotice::Elected {
                token,
                lease,
                trusted_until,
                ..
            } => {
                self.campaigning = false;
                let over = !self.parts[E].belief.admits(lease);
                if over {
                    self.marks |= LATE_WIN;
                } else {
                    self.marks |= ELECTED;
                }
                self.held = Some(Held {
                    token,
                    lease,
                    until: trusted_until,
                    over,
                });
            }
            ElectionNotice::Trusted { token, until } => {
                if let Some(held) = self.held.as_mut().filter(|h| h.token == token) {
                    held.until = until;
                }
            }
            ElectionNotice::LeadershipLost { token } | ElectionNotice::Resigned { token }
                if self.held.as_ref().is_some_and(|h| h.token == token) =>
            {
                self.held = None;
            }
            ElectionNotice::Session(LivenessState::Stopped { .. }) => self.held = None,
            ElectionNotice::NotElected { .. } | ElectionNotice::CampaignFailed { .. } => {
                self.campaigning = false;
            }
            _ => {}
        }
        Ok(())
    }

    /// What the facade's shard beliefs do with a notice.
    fn shard_notice(&mut self, notice: MemberNotice) -> Result<(), String> {
        let belief = &mut self.parts[S].belief;
        match notice {
            MemberNotice::SessionRequest(request) => self.request(request)?,
            MemberNotice::Trusted { lease, until } => {
                self.shard_lease = Some(lease);
                belief.trusted(lease, until);
            }
            MemberNotice::SessionLost | MemberNotice::Stopped { .. } => belief.lost(),
            MemberNotice::Refused(_) => {}
            MemberNotice::Shard(ShardNotice::Acquired { shard, token }) => {
                if belief.admits_current() {
                    self.marks |= ACQUIRED;
                    self.shards.retain(|(s, _)| *s != shard);
                    self.shards.push((shard, token));
                } else {
                    self.marks |= LATE_WIN;
                }
            }
            // One member: nothing moves, so a release is handed back at
            // once by the user (its belief ends now).
            MemberNotice::Shard(ShardNotice::Release { shard, .. }) => {
                self.shards.retain(|(s, _)| *s != shard);
                if let Machine3::Shard(m) = &mut self.parts[S].machine {
                    m.handle(self.now, MemberInput::Release(shard));
                }
            }
            MemberNotice::Shard(ShardNotice::Lost { shard }) => {
                self.shards.retain(|(s, _)| *s != shard);
            }
            // The world's one member id is never another process's.
            MemberNotice::Shard(
                notice @ (ShardNotice::Waiting { .. } | ShardNotice::Duplicate { .. }),
            ) => return Err(format!("the only member saw another holder: {notice:?}")),
        }
        Ok(())
    }

    /// Member `p` hears the oldest fact of its inbox.
    fn hear(&mut self, p: usize) -> Result<(), String> {
        let Some(fact) = self.parts[p].inbox.pop_front() else {
            return Ok(());
        };
        let now = self.now;
        match &mut self.parts[p].machine {
            Machine3::Election(m) => m.handle(now, ElectionInput::Session(fact)),
            Machine3::Shard(m) => m.handle(now, MemberInput::Session(fact)),
            Machine3::Host(m) => m.handle(now, RegistrationInput::Session(fact)),
        }
        self.pump(p)
    }

    fn hear_all(&mut self) -> Result<(), String> {
        while let Some(p) = self.parts.iter().position(|p| !p.inbox.is_empty()) {
            self.hear(p)?;
        }
        Ok(())
    }

    fn wire_step(&mut self, p: usize, action: WireAction) -> Result<(), String> {
        let now = self.now;
        let taken = self.parts[p]
            .wire
            .take(action, &mut self.etcd, now, &self.bends);
        let reply = match taken {
            Taken::Nothing => return Ok(()),
            Taken::Landed => {
                self.marks |= LANDED;
                return Ok(());
            }
            Taken::Reply(reply) => reply,
        };
        if let Err(RpcError::LeaseNotFound) = &reply.result {
            // Evidence, whatever the machine makes of it.
            let lease = self.lease_of_evidence();
            self.buried.insert(lease);
        }
        let part = &mut self.parts[p];
        if !part.inbox.is_empty() {
            self.marks |= HEARD_LATE;
        }
        if poll_timeout(&part.machine).is_some_and(|t| t <= now) {
            handle_timeout(&mut part.machine, now);
        }
        match &mut part.machine {
            Machine3::Election(m) => m.handle(now, ElectionInput::Rpc(reply)),
            Machine3::Shard(m) => m.handle(now, MemberInput::Rpc(reply)),
            Machine3::Host(m) => m.handle(now, RegistrationInput::Rpc(reply)),
        }
        self.pump(p)
    }

    /// The lease a "lease not found" is about: every request of the
    /// members carries the session's lease, and etcd forgets only a lease
    /// revoked or expired, which no later grant reuses; the current one is
    /// then the only one it can be news about.
    fn lease_of_evidence(&self) -> LeaseId {
        if self.etcd.lease_deadline(self.lease).is_none() {
            self.lease
        } else {
            0
        }
    }

    // ----- time ------------------------------------------------------------------

    fn in_flight(&self) -> bool {
        self.parts
            .iter()
            .any(|p| !p.inbox.is_empty() || p.wire.in_flight(&self.etcd, &self.bends))
    }

    fn next_deadline(&self) -> Option<Instant> {
        let cut = self.renew_at.is_none().then_some(self.until);
        self.parts
            .iter()
            .filter_map(|p| poll_timeout(&p.machine))
            .chain([self.renew_at, cut].into_iter().flatten())
            .chain(self.etcd.next_deadline())
            .min()
    }

    /// Time passes to `at`: leases expire, the session is renewed or lost,
    /// then every due machine deadline fires.
    fn tick_to(&mut self, at: Instant) -> Result<(), String> {
        self.now = self.now.max(at);
        self.etcd.advance(self.now);
        for p in 0..self.parts.len() {
            self.parts[p].wire.age_orphans(self.setup.land_within);
        }
        match self.renew_at {
            Some(at) if at <= self.now => {
                let lease = self.lease;
                match self.etcd.execute(self.now, &Request::KeepAlive { lease }) {
                    Ok(Response::KeptAlive { ttl_secs }) if ttl_secs > 0 => self.renewed()?,
                    // Revoked early: the renewal's answer is the evidence.
                    _ => self.lose_lease()?,
                }
            }
            None if self.until <= self.now => self.lose_lease()?,
            _ => {}
        }
        for p in 0..self.parts.len() {
            if poll_timeout(&self.parts[p].machine).is_some_and(|t| t <= self.now) {
                handle_timeout(&mut self.parts[p].machine, self.now);
            }
            self.pump(p)?;
        }
        Ok(())
    }

    /// Runs the shard member's and the registration's requests in order
    /// until nothing of theirs is in flight.
    fn settle_others(&mut self) -> Result<(), String> {
        loop {
            self.hear_all()?;
            let mut next = None;
            for p in [S, R] {
                let mut actions = Vec::new();
                self.parts[p]
                    .wire
                    .actions(&self.etcd, &self.bends, false, false, &mut actions);
                if let Some(action) = actions.first() {
                    next = Some((p, *action));
                    break;
                }
            }
            match next {
                Some((p, action)) => self.wire_step(p, action)?,
                None => return Ok(()),
            }
        }
    }

    fn fair_next(&self) -> Option<SessionAction> {
        if let Some(p) = self.parts.iter().position(|p| !p.inbox.is_empty()) {
            return Some(SessionAction::Hear(p));
        }
        let mut actions = Vec::new();
        for (p, part) in self.parts.iter().enumerate() {
            part.wire
                .actions(&self.etcd, &self.bends, false, false, &mut actions);
            if let Some(action) = actions.first() {
                return Some(SessionAction::Wire(p, *action));
            }
        }
        (!self.campaigning && self.held.is_none()).then_some(SessionAction::Campaign)
    }

    /// Where liveness wants the world (see the module docs).
    fn settled(&self) -> bool {
        let host = matches!(self.host, LivenessState::Registered { lease } if lease == self.lease)
            && self.etcd.get(HOST).is_some_and(|kv| kv.lease == self.lease);
        host && self.leadership().is_some_and(|(_, l)| l == self.lease) && self.owned().len() == 1
    }

    fn step(&mut self, action: &SessionAction) -> Result<(), String> {
        match *action {
            SessionAction::Wire(p, step) => self.wire_step(p, step),
            SessionAction::Hear(p) => self.hear(p),
            SessionAction::Campaign => self.campaign(),
            SessionAction::Tick => match self.next_deadline() {
                Some(at) => self.tick_to(at),
                None => Ok(()),
            },
            SessionAction::Cut => {
                self.renew_at = None;
                self.marks |= CUT;
                Ok(())
            }
            SessionAction::Revoke => {
                let lease = self.lease;
                let _ = self.etcd.execute(self.now, &Request::Revoke { lease });
                self.revoked.insert(lease);
                self.marks |= REVOKED;
                Ok(())
            }
        }
    }
}

/// A notice of one of the three machines.
enum Notice {
    None,
    Election(ElectionNotice),
    Shard(MemberNotice),
    Host(RegistrationNotice),
}

fn poll_timeout(machine: &Machine3) -> Option<Instant> {
    match machine {
        Machine3::Election(m) => m.poll_timeout(),
        Machine3::Shard(m) => m.poll_timeout(),
        Machine3::Host(m) => m.poll_timeout(),
    }
}

fn handle_timeout(machine: &mut Machine3, now: Instant) {
    match machine {
        Machine3::Election(m) => m.handle_timeout(now),
        Machine3::Shard(m) => m.handle_timeout(now),
        Machine3::Host(m) => m.handle_timeout(now),
    }
}

impl World for SessionWorld {
    type Action = SessionAction;

    const MARKS: &'static [&'static str] = &[
        "elected",
        "acquired",
        "registered",
        "session cut",
        "revoked early",
        "lease not found",
        "replaced",
        "granted anew",
        "late win not believed",
        "reply before a fact",
        "landed late",
        "liveness checked",
    ];

    fn actions(&self, out: &mut Vec<SessionAction>) {
        let b = &self.budget;
        if b.late == 0 {
            if let Some(p) = self.parts.iter().position(|p| !p.inbox.is_empty()) {
                out.push(SessionAction::Hear(p));
                return;
            }
        }
        for (p, part) in self.parts.iter().enumerate() {
            let mut wire = Vec::new();
            part.wire
                .actions(&self.etcd, &self.bends, b.lose > 0, b.land > 0, &mut wire);
            if p != E {
                // The shard member's and the registration's wires run in
                // order (their first action only): the races explored are
                // the election's against the session.
                let first_run = wire.iter().position(|a| !matches!(a, WireAction::Land(_)));
                if let Some(first) = first_run {
                    let lands = wire.split_off(first + 1);
                    wire.truncate(first + 1);
                    wire.extend(
                        lands
                            .into_iter()
                            .filter(|a| matches!(a, WireAction::Land(_))),
                    );
                }
            }
            out.extend(wire.into_iter().map(|a| SessionAction::Wire(p, a)));
            if !part.inbox.is_empty() {
                out.push(SessionAction::Hear(p));
            }
        }
        if !self.campaigning && self.held.is_none() {
            out.push(SessionAction::Campaign);
        }
        if b.cut > 0 && self.renew_at.is_some() {
            out.push(SessionAction::Cut);
        }
        if b.revoke > 0 && self.etcd.lease_deadline(self.lease).is_some() {
            out.push(SessionAction::Revoke);
        }
        if !self.in_flight()
            && self
                .next_deadline()
                .is_some_and(|at| at <= self.start + self.setup.horizon)
        {
            out.push(SessionAction::Tick);
        }
    }

    fn apply(&mut self, action: &SessionAction) -> Result<(), String> {
        match action {
            SessionAction::Wire(_, WireAction::Lose(_)) => self.budget.lose -= 1,
            SessionAction::Wire(_, WireAction::Land(_)) => self.budget.land -= 1,
            SessionAction::Cut => self.budget.cut -= 1,
            SessionAction::Revoke => self.budget.revoke -= 1,
            _ => {}
        }
        if !matches!(action, SessionAction::Hear(_))
            && self.parts.iter().any(|p| !p.inbox.is_empty())
        {
            self.budget.late -= 1;
        }
        self.step(action)?;
        if self.budget.land == 0 {
            for part in &mut self.parts {
                part.wire.forget_orphans();
            }
        }
        self.check()
    }

    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        hash_debug(&mut hasher, &self.etcd);
        hash_debug(&mut hasher, &(self.now - self.start));
        hash_debug(&mut hasher, &self.budget);
        hash_debug(&mut hasher, &self.hub);
        hash_debug(&mut hasher, &self.parts);
        hash_debug(
            &mut hasher,
            &(
                self.lease,
                self.until,
                self.renew_at,
                &self.held,
                self.campaigning,
                &self.shards,
                self.shard_lease,
                &self.host,
                &self.buried,
                &self.revoked,
            ),
        );
        hasher.finish()
    }

    fn check_liveness(&mut self) -> Result<(), String> {
        if self.in_flight() || self.settled() {
            return Ok(());
        }
        self.marks |= LIVENESS;
        let mut fair = self.clone();
        fair.budget = Budget::default();
        for part in &mut fair.parts {
            part.wire.forget_orphans();
        }
        let from = fair.now;
        let until = from + self.setup.liveness_bound;
        loop {
            if fair.settled() {
                return Ok(());
            }
            let step = match fair.fair_next() {
                Some(action) => fair.step(&action),
                None => match fair.next_deadline().filter(|at| *at <= until) {
                    Some(at) => fair.tick_to(at),
                    None => break,
                },
            };
            step.and_then(|()| fair.check()).map_err(|m| {
                format!(
                    "in the fair continuation from +{:?}: {m}",
                    from - self.start
                )
            })?;
        }
        Err(format!(
            "liveness: from the quiescent state at +{:?}, after {:?} without faults: \
             leadership {:?}, shards {:?}, host {:?} (session lease {:x})",
            from - self.start,
            self.setup.liveness_bound,
            fair.leadership(),
            fair.owned(),
            fair.host,
            fair.lease
        ))
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn take_marks(&mut self) -> u32 {
        std::mem::take(&mut self.marks)
    }

    fn describe(&self) -> String {
        let at = |t: Instant| format!("+{} ms", (t - self.start).as_millis());
        let mut out = self.etcd.describe(self.start);
        out += &format!(
            "\n  session: lease {:x} trusted until {}, renewing {}; buried {:x?}\n  \
             leadership {:?}, shards {:?} on {:x?}, host {:?}",
            self.lease,
            at(self.until),
            self.renew_at.is_some(),
            self.buried,
            self.held,
            self.shards,
            self.shard_lease,
            self.host
        );
        for (p, part) in self.parts.iter().enumerate() {
            out += &format!(
                "\n  member {p}: inbox {:?}, belief {:?}\n    wire {:?}",
                part.inbox, part.belief, part.wire
            );
        }
        out
    }
}
