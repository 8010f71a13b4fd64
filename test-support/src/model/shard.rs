//! The shard world: two or three production shard members
//! ([`ShardMember`], the machine the facade runs) around the model etcd,
//! each behind its own [`Wire`], each on a shared session lease the world
//! keeps as a lease-only keepalive would: renewed every third of the TTL,
//! trusted until the renewal's instant plus the TTL less the safety margin
//! (told as `SessionInput::Trusted`; a loss as `Lost`; a member's
//! `SessionRequest::Gone` for its current lease is a loss learnt at once:
//! a new lease is granted). Faults: a session cut off (its renewals fail: at
//! its local deadline the session is lost and a new lease granted), a
//! member that crashes (its lease left to expire, its requests still able
//! to land), a member that leaves (every owned shard handed back at once,
//! its lease revoked once the member is finished); users hand released
//! shards back at once or never (the map's deadline then releases them).
//!
//! Safety, checked after every action (etcd's time is the members' time;
//! the numbers are the rules of `sm/src/shard/mod.rs`):
//! 1. **One owner per shard**: at most one member believes it owns a shard
//!    (`token(shard)` is some) — crashed members believe nothing.
//! 2. **Belief is backed by the key**: a member's belief with token T
//!    means etcd holds the shard key with create revision T, the member's
//!    id as its value, on the member's current session lease.
//! 3. **Tokens rise per shard**: every `Acquired` token is greater than
//!    every earlier one of the shard, or equal to the last one when the
//!    same member takes the same key back (an adoption, rule 6).
//! 4. **Acquired only while trusted** (rules 5, 6): `Acquired` is told
//!    only while the member's session is up and its local deadline is
//!    ahead; creates are sent only then, on the current lease, with the
//!    member's id as the value (rule 5).
//! 5. **Only one's own keys** (rules 3, 9): a member writes only its own
//!    member key and shard keys; it deletes a shard key only guarded on an
//!    incarnation of its own (never another member's key).
//! 6. **Release within the drain** (rule 8): a `Release` deadline is no
//!    later than now plus the drain.
//! 7. **Deadlines never lie in the past**: `poll_timeout()` is never
//!    earlier than now after a step.
//!
//! Liveness, from every quiescent state (nothing in flight): with no
//! further faults, messages delivered at once, released shards handed back
//! at once and time moving to each next deadline, within `liveness_bound`
//! every shard is owned by exactly the member placement names among the
//! members still running (not crashed, not leaving), believed with the
//! key's token, and every leaving member has finished.

use super::wire::{Bends, Taken, Wire, WireAction};
use super::{hash_debug, World};
use crate::ModelEtcd;
use fleetcoord_sm::election::SessionRequest;
use fleetcoord_sm::session::SessionInput;
use fleetcoord_sm::shard::member::{Member as ShardMember, MemberInput, MemberNotice};
use fleetcoord_sm::shard::{keys, placement, ShardConfig, ShardNotice};
use fleetcoord_sm::{
    BackoffConfig, Command, KeyRange, LeaseId, Machine, Request, Response, Revision, TxnOp,
};
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PREFIX: &[u8] = b"/s/";
/// Every member gets the same seed (no jitter: it decides nothing).
const SEED: u64 = 5;

/// Member `m`'s id.
fn id_of(m: usize) -> Vec<u8> {
    format!("m{m}").into_bytes()
}

/// How many faults of each kind one path may contain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// Requests, replies or watch streams lost.
    pub lose: u32,
    /// Orphans (requests given up) landing late.
    pub land: u32,
    /// Times time passes while messages are in flight.
    pub delay: u32,
    /// Sessions cut off (lost at their local deadline, then granted anew).
    pub cut: u32,
    /// Members crashing (their lease left to expire).
    pub crash: u32,
    /// Members leaving gracefully.
    pub leave: u32,
    /// Released shards whose user never hands them back (the map's
    /// deadline releases them).
    pub keep: u32,
}

/// A world to explore: its size, its faults and what it checks.
#[derive(Clone, Debug)]
pub struct ShardSetup {
    /// Members, each joining from the start on its own session.
    pub members: usize,
    /// Shards of the map.
    pub shards: u32,
    /// The sessions' TTL.
    pub ttl_secs: i64,
    /// The sessions' safety margin.
    pub safety_margin: Duration,
    /// The members' attempt timeout.
    pub attempt_timeout: Duration,
    /// How long a user may drain a released shard.
    pub drain: Duration,
    /// Faults per path.
    pub budget: Budget,
    /// How many times time may pass between a request being given up and
    /// its landing (see [`Wire::age_orphans`]).
    pub land_within: u32,
    /// Time stops here (a quiescent state at the horizon is a leaf).
    pub horizon: Duration,
    /// The liveness bound from every quiescent state.
    pub liveness_bound: Duration,
    /// The session's keeper claims this much trust beyond its local
    /// deadline in every `Trusted`, and tells `Lost` this much late (a
    /// test that must fail, on rule 2).
    pub overtrust: Duration,
    /// etcd runs guarded puts as if their guard held (a test that must
    /// fail: a create no longer waits for the key to be gone).
    pub strip_put_guards: bool,
}

impl ShardSetup {
    /// `members` members, `shards` shards, TTL 2 s, margin 100 ms, attempt
    /// timeout 400 ms, drain 300 ms, no faults, a 2 s horizon, liveness
    /// within 2 × TTL + 2 s.
    pub fn new(members: usize, shards: u32) -> Self {
        ShardSetup {
            members,
            shards,
            ttl_secs: 2,
            safety_margin: Duration::from_millis(100),
            attempt_timeout: Duration::from_millis(400),
            drain: Duration::from_millis(300),
            budget: Budget::default(),
            land_within: 1,
            horizon: Duration::from_secs(2),
            liveness_bound: Duration::from_secs(6),
            overtrust: Duration::ZERO,
            strip_put_guards: false,
        }
    }

    fn config(&self, m: usize) -> ShardConfig {
        ShardConfig {
            prefix: PREFIX.to_vec(),
            member: id_of(m),
            weight: 1,
            shards: self.shards,
            backoff: BackoffConfig {
                initial: Duration::from_millis(100),
                max: Duration::from_millis(400),
                multiplier: 2,
                jitter_percent: 0,
            },
            attempt_timeout: self.attempt_timeout,
            drain: self.drain,
        }
    }

    fn lifetime(&self) -> Duration {
        Duration::from_secs(self.ttl_secs.unsigned_abs()).saturating_sub(self.safety_margin)
    }
}

/// One step of the shard world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardAction {
    /// A step on member `.0`'s wire.
    Wire(usize, WireAction),
    /// Time passes to the next deadline, nothing in flight.
    Tick,
    /// Time passes to the next deadline with messages in flight (a fault).
    Delay,
    /// Member `.0`'s session is cut off: no renewal succeeds any more.
    Cut(usize),
    /// Member `.0` crashes: it believes nothing from now on; its lease is
    /// left to expire.
    Crash(usize),
    /// Member `.0` leaves the map.
    Leave(usize),
    /// Member `.0`'s user hands shard `.1` back after its `Release`.
    Release(usize, u32),
    /// Member `.0`'s user never hands shard `.1` back.
    Keep(usize, u32),
}

#[derive(Clone, Debug)]
struct Member {
    /// The production member on a session this world keeps (its facts
    /// told as `SessionInput`s, its `SessionRequest`s acted on).
    machine: ShardMember,
    wire: Wire,
    lease: LeaseId,
    /// The session's local deadline.
    until: Instant,
    /// The next renewal; `None` while cut off.
    renew_at: Option<Instant>,
    crashed: bool,
    leaving: bool,
    /// The map finished and its lease was revoked.
    gone: bool,
    /// Shards told `Release`, not yet handed back or lost.
    releasing: BTreeSet<u32>,
}

impl Member {
    fn running(&self) -> bool {
        !self.crashed && !self.gone
    }
}

/// The shard world; see the module docs for what it checks.
#[derive(Clone)]
pub struct ShardWorld {
    setup: Arc<ShardSetup>,
    etcd: ModelEtcd,
    start: Instant,
    now: Instant,
    members: Vec<Member>,
    /// Per shard, the greatest token acquired and who acquired it.
    tokens: BTreeMap<u32, (Revision, usize)>,
    budget: Budget,
    bends: Bends,
    marks: u32,
}

const ACQUIRED: u32 = 1 << 0;
const MOVED: u32 = 1 << 1;
const RELEASED: u32 = 1 << 2;
const RELEASE_EXPIRED: u32 = 1 << 3;
const LOST: u32 = 1 << 4;
const CUT: u32 = 1 << 5;
const CRASHED: u32 = 1 << 6;
const LEFT: u32 = 1 << 7;
const EXPIRED: u32 = 1 << 8;
const LANDED: u32 = 1 << 9;
const LIVENESS: u32 = 1 << 10;
const ADOPTED: u32 = 1 << 11;

impl ShardWorld {
    /// Every member started at one instant on a fresh session.
    pub fn new(setup: ShardSetup) -> Self {
        let start = Instant::now();
        let keep_orphans = setup.budget.land > 0;
        let mut etcd = ModelEtcd::new();
        let members = (0..setup.members)
            .map(|m| Member {
                machine: ShardMember::on_session(setup.config(m), start, SEED),
                wire: Wire::new(keep_orphans),
                lease: grant(&mut etcd, start, setup.ttl_secs),
                until: start,
                renew_at: None,
                crashed: false,
                leaving: false,
                gone: false,
                releasing: BTreeSet::new(),
            })
            .collect();
        let mut world = ShardWorld {
            budget: setup.budget.clone(),
            bends: Bends {
                strip_put_guards: setup.strip_put_guards,
                ..Bends::default()
            },
            setup: Arc::new(setup),
            etcd,
            start,
            now: start,
            members,
            tokens: BTreeMap::new(),
            marks: 0,
        };
        for m in 0..world.members.len() {
            let lease = world.members[m].lease;
            if let Err(message) = world.session_up(m, lease) {
                panic!("the initial world breaks a rule: {message}");
            }
        }
        world
    }

    /// Member `m`'s session holds `lease`, renewed (or granted) now.
    fn session_up(&mut self, m: usize, lease: LeaseId) -> Result<(), String> {
        let now = self.now;
        let member = &mut self.members[m];
        member.lease = lease;
        member.until = now + self.setup.lifetime();
        member.renew_at = Some(now + Duration::from_secs(self.setup.ttl_secs.unsigned_abs()) / 3);
        let until = member.until + self.setup.overtrust;
        member.machine.handle(
            now,
            MemberInput::Session(SessionInput::Trusted { lease, until }),
        );
        self.pump(m)
    }

    /// Moves member `m`'s commands onto its wire, checking rules 4 and 5.
    fn pump(&mut self, m: usize) -> Result<(), String> {
        let me = id_of(m);
        let member_key = keys::member_key(PREFIX, &me);
        let shards_prefix = [PREFIX, b"shards/"].concat();
        while let Some(command) = self.members[m].machine.poll_command() {
            if let Command::Rpc {
                request: Request::Txn(txn),
                ..
            } = &command
            {
                for op in &txn.success {
                    match op {
                        TxnOp::Put { key, value, lease } if key.starts_with(&shards_prefix) => {
                            let member = &self.members[m];
                            if value != &me || *lease != member.lease || self.now >= member.until {
                                return Err(format!(
                                    "member {m} creates {} = {} on lease {lease:x} (its lease \
                                     {:x}, trusted until +{:?})",
                                    String::from_utf8_lossy(key),
                                    String::from_utf8_lossy(value),
                                    member.lease,
                                    member.until - self.start
                                ));
                            }
                        }
                        TxnOp::Put { key, .. } | TxnOp::Delete(KeyRange::Key(key))
                            if *key == member_key => {}
                        TxnOp::Delete(KeyRange::Key(key)) if key.starts_with(&shards_prefix) => {
                            let guard = txn.compare.iter().find_map(|c| match c {
                                fleetcoord_sm::Compare::CreateRevisionEquals {
                                    key: k,
                                    revision,
                                } if k == key => Some(*revision),
                                _ => None,
                            });
                            let Some(revision) = guard else {
                                return Err(format!("member {m} deletes a shard key unguarded"));
                            };
                            let kv = self.etcd.get(key);
                            if let Some(kv) = kv.filter(|kv| kv.create_revision == revision) {
                                if kv.value != me {
                                    return Err(format!(
                                        "member {m} deletes {} of {} (create revision \
                                         {revision})",
                                        String::from_utf8_lossy(key),
                                        String::from_utf8_lossy(&kv.value)
                                    ));
                                }
                            }
                        }
                        other => return Err(format!("member {m} writes {other:?}")),
                    }
                }
            }
            match self.members[m].wire.accept(command) {
                Some(MemberNotice::Shard(notice)) => self.notice(m, notice)?,
                // etcd answered "lease not found" for the current lease:
                // the session learns it now, as a keepalive told
                // `LeaseGone` does (lost, granted anew).
                Some(MemberNotice::SessionRequest(SessionRequest::Gone(lease)))
                    if lease == self.members[m].lease =>
                {
                    let lease = grant(&mut self.etcd, self.now, self.setup.ttl_secs);
                    self.session_up(m, lease)?;
                }
                Some(MemberNotice::SessionRequest(request)) => {
                    return Err(format!("member {m} asks its session {request:?}"));
                }
                // The session's facts as the member tells them.
                Some(_) | None => {}
            }
        }
        Ok(())
    }

    /// Rules 3, 4 and 6 on what member `m` tells its user.
    fn notice(&mut self, m: usize, notice: ShardNotice) -> Result<(), String> {
        let member = &mut self.members[m];
        match notice {
            ShardNotice::Acquired { shard, token } => {
                if self.now >= member.until {
                    return Err(format!(
                        "member {m} acquired shard {shard} at +{:?}, its session trusted only \
                         until +{:?}",
                        self.now - self.start,
                        member.until - self.start
                    ));
                }
                if let Some(&(last, by)) = self.tokens.get(&shard) {
                    if token < last || (token == last && by != m) {
                        return Err(format!(
                            "member {m} acquired shard {shard} with token {token}, member {by} \
                             had token {last}"
                        ));
                    }
                    if by != m {
                        self.marks |= MOVED;
                    }
                    if token == last {
                        self.marks |= ADOPTED;
                    }
                }
                self.tokens.insert(shard, (token, m));
                self.marks |= ACQUIRED;
            }
            ShardNotice::Release { shard, deadline } => {
                if deadline > self.now + self.setup.drain {
                    return Err(format!(
                        "member {m} releases shard {shard} by +{:?}, beyond the drain",
                        deadline - self.start
                    ));
                }
                member.releasing.insert(shard);
            }
            ShardNotice::Lost { shard } => {
                member.releasing.remove(&shard);
                self.marks |= LOST;
            }
            // Every member of this world has an id of its own.
            ShardNotice::Waiting { holder } | ShardNotice::Duplicate { holder } => {
                return Err(format!(
                    "member {m} found its key on lease {holder:x}, which it never held"
                ));
            }
        }
        Ok(())
    }

    /// Rules 1, 2 and 7.
    fn check(&self) -> Result<(), String> {
        for (m, member) in self.members.iter().enumerate() {
            if member.crashed {
                continue;
            }
            if member.machine.poll_timeout().is_some_and(|t| t < self.now) {
                return Err(format!("member {m}'s next deadline is in the past"));
            }
        }
        for shard in 0..self.setup.shards {
            let believers: Vec<(usize, Revision)> = self
                .members
                .iter()
                .enumerate()
                .filter(|(_, member)| !member.crashed)
                .filter_map(|(m, member)| member.machine.map().token(shard).map(|t| (m, t)))
                .collect();
            if believers.len() > 1 {
                return Err(format!(
                    "shard {shard} is believed owned by {believers:?} at once"
                ));
            }
            let Some(&(m, token)) = believers.first() else {
                continue;
            };
            let kv = self.etcd.get(&keys::shard_key(PREFIX, shard));
            let backed = kv.as_ref().is_some_and(|kv| {
                kv.create_revision == token
                    && kv.value == id_of(m)
                    && kv.lease == self.members[m].lease
            });
            if !backed {
                return Err(format!(
                    "member {m} believes it owns shard {shard} with token {token}, but etcd \
                     has {kv:?}"
                ));
            }
        }
        Ok(())
    }

    fn in_flight(&self) -> bool {
        self.members
            .iter()
            .filter(|m| m.running())
            .any(|m| m.wire.in_flight(&self.etcd, &self.bends))
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.members
            .iter()
            .filter(|m| m.running())
            .flat_map(|m| {
                let cut = m
                    .renew_at
                    .is_none()
                    .then_some(m.until + self.setup.overtrust);
                [m.machine.poll_timeout(), m.renew_at, cut]
            })
            .flatten()
            .chain(self.etcd.next_deadline())
            .min()
    }

    /// Time passes to `at`: leases expire, sessions are renewed or lost,
    /// then every due member deadline fires.
    fn tick_to(&mut self, at: Instant) -> Result<(), String> {
        self.now = self.now.max(at);
        let leases = self.etcd.leases().len();
        self.etcd.advance(self.now);
        if self.etcd.leases().len() < leases {
            self.marks |= EXPIRED;
        }
        for m in 0..self.members.len() {
            self.members[m].wire.age_orphans(self.setup.land_within);
            if !self.members[m].running() {
                continue;
            }
            let lease = self.members[m].lease;
            match self.members[m].renew_at {
                Some(at) if at <= self.now => {
                    let renewed = self.etcd.execute(self.now, &Request::KeepAlive { lease });
                    if matches!(renewed, Ok(Response::KeptAlive { ttl_secs }) if ttl_secs > 0) {
                        self.session_up(m, lease)?;
                    } else {
                        return Err(format!("member {m}'s live session lease {lease:x} is gone"));
                    }
                }
                None if self.members[m].until + self.setup.overtrust <= self.now => {
                    // The keepalive's local deadline: lost, granted anew.
                    let now = self.now;
                    self.members[m]
                        .machine
                        .handle(now, MemberInput::Session(SessionInput::Lost { lease }));
                    self.pump(m)?;
                    let lease = grant(&mut self.etcd, now, self.setup.ttl_secs);
                    self.session_up(m, lease)?;
                }
                _ => {}
            }
            if self.members[m]
                .machine
                .poll_timeout()
                .is_some_and(|t| t <= self.now)
            {
                self.members[m].machine.handle_timeout(self.now);
            }
            self.pump(m)?;
            self.finish_leave(m);
        }
        Ok(())
    }

    /// A leaving member whose map finished: its driver revokes the lease.
    fn finish_leave(&mut self, m: usize) {
        let member = &mut self.members[m];
        if member.leaving && !member.gone && member.machine.is_finished() {
            member.gone = true;
            let _ = self.etcd.execute(
                self.now,
                &Request::Revoke {
                    lease: member.lease,
                },
            );
            self.marks |= LEFT;
        }
    }

    fn wire_step(&mut self, m: usize, action: WireAction) -> Result<(), String> {
        let now = self.now;
        let member = &mut self.members[m];
        let taken = member.wire.take(action, &mut self.etcd, now, &self.bends);
        let reply = match taken {
            Taken::Nothing => return Ok(()),
            Taken::Landed => {
                self.marks |= LANDED;
                return Ok(());
            }
            Taken::Reply(reply) => reply,
        };
        if !member.running() {
            return Ok(());
        }
        if member.machine.poll_timeout().is_some_and(|t| t <= now) {
            member.machine.handle_timeout(now);
        }
        member.machine.handle(now, MemberInput::Rpc(reply));
        self.pump(m)?;
        self.finish_leave(m);
        Ok(())
    }

    fn release(&mut self, m: usize, shard: u32) -> Result<(), String> {
        let member = &mut self.members[m];
        member.releasing.remove(&shard);
        member.machine.handle(self.now, MemberInput::Release(shard));
        self.marks |= RELEASED;
        self.pump(m)?;
        self.finish_leave(m);
        Ok(())
    }

    fn fair_next(&self) -> Option<ShardAction> {
        let mut actions = Vec::new();
        for (m, member) in self.members.iter().enumerate() {
            actions.clear();
            member
                .wire
                .actions(&self.etcd, &self.bends, false, false, &mut actions);
            if let Some(action) = actions.first() {
                return Some(ShardAction::Wire(m, *action));
            }
            if let Some(&shard) = member.releasing.iter().next() {
                if member.running() {
                    return Some(ShardAction::Release(m, shard));
                }
            }
        }
        None
    }

    /// Where liveness wants the world (see the module docs).
    fn settled(&self) -> bool {
        let placed: Vec<(Vec<u8>, usize)> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, member)| member.running() && !member.leaving)
            .map(|(m, _)| (id_of(m), m))
            .collect();
        if self
            .members
            .iter()
            .any(|member| member.leaving && member.running())
        {
            return false;
        }
        (0..self.setup.shards).all(|shard| {
            let owner = placement::owner(placed.iter().map(|(id, _)| (id.as_slice(), 1)), shard);
            let Some(&(_, m)) = placed.iter().find(|(id, _)| Some(id.as_slice()) == owner) else {
                return true;
            };
            let kv = self.etcd.get(&keys::shard_key(PREFIX, shard));
            let believed = self.members[m].machine.map().token(shard);
            believed.is_some() && kv.is_some_and(|kv| Some(kv.create_revision) == believed)
        })
    }
}

fn grant(etcd: &mut ModelEtcd, now: Instant, ttl_secs: i64) -> LeaseId {
    match etcd.execute(now, &Request::Grant { ttl_secs }) {
        Ok(Response::Granted { lease, .. }) => lease,
        other => panic!("the model grants: {other:?}"),
    }
}

impl World for ShardWorld {
    type Action = ShardAction;

    const MARKS: &'static [&'static str] = &[
        "acquired",
        "moved",
        "released",
        "release deadline",
        "lost",
        "session cut",
        "crashed",
        "left",
        "lease expired",
        "landed late",
        "liveness checked",
        "adopted",
    ];

    fn actions(&self, out: &mut Vec<ShardAction>) {
        let b = &self.budget;
        for (m, member) in self.members.iter().enumerate() {
            let mut wire = Vec::new();
            member
                .wire
                .actions(&self.etcd, &self.bends, b.lose > 0, b.land > 0, &mut wire);
            if !member.running() {
                // Only what it left behind may still land.
                wire.retain(|a| matches!(a, WireAction::Land(_)));
            }
            out.extend(wire.into_iter().map(|a| ShardAction::Wire(m, a)));
            if !member.running() {
                continue;
            }
            for &shard in &member.releasing {
                out.push(ShardAction::Release(m, shard));
                if b.keep > 0 {
                    out.push(ShardAction::Keep(m, shard));
                }
            }
            if b.cut > 0 && member.renew_at.is_some() {
                out.push(ShardAction::Cut(m));
            }
            if b.crash > 0 {
                out.push(ShardAction::Crash(m));
            }
            if b.leave > 0 && !member.leaving {
                out.push(ShardAction::Leave(m));
            }
        }
        if self
            .next_deadline()
            .is_some_and(|at| at <= self.start + self.setup.horizon)
        {
            if !self.in_flight() {
                out.push(ShardAction::Tick);
            } else if b.delay > 0 {
                out.push(ShardAction::Delay);
            }
        }
    }

    fn apply(&mut self, action: &ShardAction) -> Result<(), String> {
        match *action {
            ShardAction::Wire(m, step) => {
                if let WireAction::Lose(_) = step {
                    self.budget.lose -= 1;
                }
                if let WireAction::Land(_) = step {
                    self.budget.land -= 1;
                }
                self.wire_step(m, step)?;
                if self.budget.land == 0 {
                    for member in &mut self.members {
                        member.wire.forget_orphans();
                    }
                }
            }
            ShardAction::Tick | ShardAction::Delay => {
                if *action == ShardAction::Delay {
                    self.budget.delay -= 1;
                }
                if let Some(at) = self.next_deadline() {
                    self.tick_to(at)?;
                }
            }
            ShardAction::Cut(m) => {
                self.budget.cut -= 1;
                self.members[m].renew_at = None;
                self.marks |= CUT;
            }
            ShardAction::Crash(m) => {
                self.budget.crash -= 1;
                let member = &mut self.members[m];
                member.crashed = true;
                member.releasing.clear();
                member.wire.reset();
                self.marks |= CRASHED;
            }
            ShardAction::Leave(m) => {
                self.budget.leave -= 1;
                self.members[m].leaving = true;
                // The production leave: every owned shard handed back at
                // once (its user has stopped their work).
                self.members[m].releasing.clear();
                self.members[m].machine.handle(self.now, MemberInput::Leave);
                self.pump(m)?;
                // Its `Release` notices name shards already handed back.
                self.members[m].releasing.clear();
                self.finish_leave(m);
            }
            ShardAction::Release(m, shard) => self.release(m, shard)?,
            ShardAction::Keep(m, shard) => {
                self.budget.keep -= 1;
                self.members[m].releasing.remove(&shard);
                self.marks |= RELEASE_EXPIRED;
            }
        }
        self.check()
    }

    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        hash_debug(&mut hasher, &self.etcd);
        hash_debug(&mut hasher, &(self.now - self.start));
        hash_debug(&mut hasher, &self.budget);
        hash_debug(&mut hasher, &self.tokens);
        for member in &self.members {
            if member.crashed {
                // Only its orphans and its lease decide anything now.
                hash_debug(&mut hasher, &(member.lease, &member.wire));
            } else {
                hash_debug(&mut hasher, member);
            }
        }
        hasher.finish()
    }

    fn check_liveness(&mut self) -> Result<(), String> {
        if self.in_flight() || self.settled() {
            return Ok(());
        }
        self.marks |= LIVENESS;
        let mut fair = self.clone();
        fair.budget = Budget::default();
        for member in &mut fair.members {
            member.wire.forget_orphans();
        }
        let from = fair.now;
        let until = from + self.setup.liveness_bound;
        loop {
            if fair.settled() {
                return Ok(());
            }
            let step = match fair.fair_next() {
                Some(ShardAction::Wire(m, a)) => fair.wire_step(m, a),
                Some(ShardAction::Release(m, shard)) => fair.release(m, shard),
                _ => match fair.next_deadline().filter(|at| *at <= until) {
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
        let owned: Vec<String> = fair
            .members
            .iter()
            .enumerate()
            .map(|(m, member)| format!("member {m} owns {:?}", member.machine.map().owned()))
            .collect();
        Err(format!(
            "liveness: from the quiescent state at +{:?}, after {:?} without faults the map \
             is not settled: {}",
            from - self.start,
            self.setup.liveness_bound,
            owned.join(", ")
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
        for (m, member) in self.members.iter().enumerate() {
            out += &format!(
                "\n  member {m}: lease {:x} trusted until {}, renewing {}, crashed {}, leaving \
                 {}, gone {}, owns {:?}, releasing {:?}, next deadline {:?}\n    wire {:?}",
                member.lease,
                at(member.until),
                member.renew_at.is_some(),
                member.crashed,
                member.leaving,
                member.gone,
                member.machine.map().owned(),
                member.releasing,
                member.machine.poll_timeout().map(at),
                member.wire
            );
        }
        out
    }
}
