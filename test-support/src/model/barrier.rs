//! The double-barrier world: P real [`DoubleBarrier`] machines of one
//! barrier of `count`, each behind its own [`Wire`], each on a lease the
//! world granted (long enough never to expire by itself), entering at the
//! start; users may leave once entered, and a participant may die (its
//! lease expired at once, its machine gone).
//!
//! Safety, checked after every action:
//! 1. **Nobody enters before `count` were in at once**: when a machine
//!    says `Entered`, etcd has held `count` participant keys at one
//!    revision at some earlier point of the run (the world tracks the most
//!    keys ever present together; every action is at most one etcd
//!    operation, so no state between two checks is missed).
//! 2. **An entered participant's token is its key's create revision**, and
//!    tokens are never handed out twice.
//! 3. **Deadlines never lie in the past.**
//!
//! Liveness, from every quiescent state: with no further faults, messages
//! delivered at once and time moving to each next deadline, within
//! `liveness_bound` every live participant has its answer (entered, left
//! or failed), unless fewer than `count` participants are alive.

use super::wire::{Bends, Taken, Wire, WireAction};
use super::{debug_hash, hash_debug, World};
use crate::ModelEtcd;
use fleetcoord_sm::barrier::{BarrierConfig, BarrierInput, BarrierNotice, DoubleBarrier};
use fleetcoord_sm::{BackoffConfig, LeaseId, Machine, Request, Response, Revision};
use std::collections::BTreeSet;
use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEY: &[u8] = b"/b";
const WAITERS: &[u8] = b"/b/waiters/";
const SEED: u64 = 7;

/// How many faults of each kind one path may contain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BarrierBudget {
    /// Leaves asked by users, all participants together.
    pub leave: u32,
    /// Requests, replies or watch streams lost.
    pub lose: u32,
    /// Participants that die.
    pub die: u32,
}

/// A world to explore.
#[derive(Clone, Debug)]
pub struct BarrierSetup {
    /// Participants, each entering from the start.
    pub participants: usize,
    /// The barrier's count, as rule 1 judges it.
    pub count: u32,
    /// Faults per path.
    pub budget: BarrierBudget,
    /// The liveness bound from every quiescent state.
    pub liveness_bound: Duration,
    /// Time stops here.
    pub horizon: Duration,
    /// A seeded bug (a test that must fail): participant 0 counts one
    /// participant fewer than the others, so it readies a barrier that is
    /// not full.
    pub short_count_mutant: bool,
}

impl BarrierSetup {
    /// `participants` for a barrier of `count`, no faults, a 3 s horizon.
    pub fn new(participants: usize, count: u32) -> Self {
        BarrierSetup {
            participants,
            count,
            budget: BarrierBudget::default(),
            liveness_bound: Duration::from_secs(5),
            horizon: Duration::from_secs(3),
            short_count_mutant: false,
        }
    }
}

/// One step of the barrier world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BarrierAction {
    /// Participant `.0` leaves (entered).
    Leave(usize),
    /// Participant `.0` dies: its lease expires now.
    Die(usize),
    /// A step on participant `.0`'s wire.
    Wire(usize, WireAction),
    /// Time passes to the next deadline, nothing in flight.
    Tick,
}

#[derive(Clone, Debug)]
struct Participant {
    machine: DoubleBarrier,
    wire: Wire,
    lease: LeaseId,
    /// An operation asked for and not answered yet.
    open: bool,
    entered: Option<Revision>,
    /// Its open operation is a leave.
    leaving: bool,
    dead: bool,
}

/// The double-barrier world; see the module docs.
#[derive(Clone)]
pub struct BarrierWorld {
    setup: Arc<BarrierSetup>,
    etcd: ModelEtcd,
    start: Instant,
    now: Instant,
    parts: Vec<Participant>,
    budget: BarrierBudget,
    /// The most participant keys etcd held at once so far (rule 1).
    most_present: usize,
    tokens: BTreeSet<Revision>,
    bends: Bends,
    marks: u32,
}

const ENTERED: u32 = 1 << 0;
const LEFT: u32 = 1 << 1;
const DIED: u32 = 1 << 2;
const TOO_MANY: u32 = 1 << 3;
const LIVENESS: u32 = 1 << 4;

fn backoff() -> BackoffConfig {
    BackoffConfig {
        initial: Duration::from_millis(100),
        max: Duration::from_millis(800),
        multiplier: 2,
        jitter_percent: 0,
    }
}

impl BarrierWorld {
    /// Every participant granted a lease and entering at one instant.
    pub fn new(setup: BarrierSetup) -> Self {
        let start = Instant::now();
        let mut etcd = ModelEtcd::new();
        let parts = (0..setup.participants)
            .map(|p| {
                let lease = match etcd.execute(start, &Request::Grant { ttl_secs: 3600 }) {
                    Ok(Response::Granted { lease, .. }) => lease,
                    other => panic!("the model etcd granted no lease: {other:?}"),
                };
                let count = if setup.short_count_mutant && p == 0 {
                    setup.count.saturating_sub(1).max(1)
                } else {
                    setup.count
                };
                let config = BarrierConfig {
                    key: KEY.to_vec(),
                    count,
                    backoff: backoff(),
                };
                let mut machine = DoubleBarrier::new(config, start, SEED);
                machine.handle(start, BarrierInput::Enter { lease });
                Participant {
                    machine,
                    wire: Wire::new(false),
                    lease,
                    open: true,
                    entered: None,
                    leaving: false,
                    dead: false,
                }
            })
            .collect();
        let mut world = BarrierWorld {
            budget: setup.budget.clone(),
            setup: Arc::new(setup),
            etcd,
            start,
            now: start,
            parts,
            most_present: 0,
            tokens: BTreeSet::new(),
            bends: Bends::default(),
            marks: 0,
        };
        for p in 0..world.parts.len() {
            if let Err(m) = world.pump(p) {
                panic!("the initial world breaks a rule: {m}");
            }
        }
        world
    }

    fn pump(&mut self, p: usize) -> Result<(), String> {
        while let Some(command) = self.parts[p].machine.poll_command() {
            if let Some(notice) = self.parts[p].wire.accept(command) {
                self.notice(p, notice)?;
            }
        }
        Ok(())
    }

    /// Rules 1 and 2 on one notice.
    fn notice(&mut self, p: usize, notice: BarrierNotice) -> Result<(), String> {
        let count = usize::try_from(self.setup.count).unwrap_or(usize::MAX);
        let part = &mut self.parts[p];
        part.open = false;
        part.leaving = false;
        match notice {
            BarrierNotice::Entered { token } => {
                if self.most_present < count {
                    return Err(format!(
                        "participant {p} entered while at most {} of {count} were ever in",
                        self.most_present
                    ));
                }
                if !self.tokens.insert(token) {
                    return Err(format!("participant {p} entered with token {token} twice"));
                }
                part.entered = Some(token);
                self.marks |= ENTERED;
            }
            BarrierNotice::Left => {
                part.entered = None;
                self.marks |= LEFT;
            }
            BarrierNotice::Failed(e) => {
                if format!("{e:?}") == "TooMany" {
                    self.marks |= TOO_MANY;
                }
            }
        }
        Ok(())
    }

    /// Rule 3, and the most keys present (rule 1).
    fn check(&mut self) -> Result<(), String> {
        let present = self.etcd.range_prefix(WAITERS).len();
        self.most_present = self.most_present.max(present);
        for (p, part) in self.parts.iter().enumerate() {
            if part.machine.poll_timeout().is_some_and(|t| t < self.now) {
                return Err(format!("participant {p}'s next deadline is in the past"));
            }
        }
        Ok(())
    }

    fn in_flight(&self) -> bool {
        self.parts
            .iter()
            .any(|p| p.wire.in_flight(&self.etcd, &self.bends))
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.parts
            .iter()
            .filter(|p| !p.dead)
            .filter_map(|p| p.machine.poll_timeout())
            .min()
    }

    fn tick_to(&mut self, at: Instant) -> Result<(), String> {
        self.now = self.now.max(at);
        self.etcd.advance(self.now);
        for p in 0..self.parts.len() {
            if self.parts[p].dead {
                continue;
            }
            if self.parts[p]
                .machine
                .poll_timeout()
                .is_some_and(|t| t <= self.now)
            {
                self.parts[p].machine.handle_timeout(self.now);
            }
            self.pump(p)?;
        }
        Ok(())
    }

    fn wire_step(&mut self, p: usize, action: WireAction) -> Result<(), String> {
        let now = self.now;
        let part = &mut self.parts[p];
        if let Taken::Reply(reply) = part.wire.take(action, &mut self.etcd, now, &self.bends) {
            if !part.dead {
                part.machine.handle(now, reply.into());
            }
        }
        self.pump(p)
    }

    fn fair_next(&self) -> Option<BarrierAction> {
        let mut actions = Vec::new();
        for (p, part) in self.parts.iter().enumerate() {
            actions.clear();
            part.wire
                .actions(&self.etcd, &self.bends, false, false, &mut actions);
            if let Some(a) = actions.first() {
                return Some(BarrierAction::Wire(p, *a));
            }
        }
        None
    }

    /// Every live participant is answered, or is leaving while another
    /// live participant is in and has not asked to leave (a leave waits
    /// for every key to go), or the barrier cannot fill.
    fn live(&self) -> bool {
        let alive = self.parts.iter().filter(|p| !p.dead).count();
        let count = usize::try_from(self.setup.count).unwrap_or(usize::MAX);
        let staying = |me: usize| {
            self.parts.iter().enumerate().any(|(q, other)| {
                q != me && !other.dead && !other.leaving && other.entered.is_some()
            })
        };
        alive < count
            || self
                .parts
                .iter()
                .enumerate()
                .all(|(p, part)| part.dead || !part.open || (part.leaving && staying(p)))
    }
}

impl World for BarrierWorld {
    type Action = BarrierAction;

    const MARKS: &'static [&'static str] =
        &["entered", "left", "died", "too many", "liveness checked"];

    fn actions(&self, out: &mut Vec<BarrierAction>) {
        let b = &self.budget;
        for (p, part) in self.parts.iter().enumerate() {
            let mut wire = Vec::new();
            part.wire
                .actions(&self.etcd, &self.bends, b.lose > 0, false, &mut wire);
            out.extend(wire.into_iter().map(|a| BarrierAction::Wire(p, a)));
            if part.dead {
                continue;
            }
            if b.leave > 0 && part.entered.is_some() && !part.open {
                out.push(BarrierAction::Leave(p));
            }
            if b.die > 0 {
                out.push(BarrierAction::Die(p));
            }
        }
        let due = self
            .next_deadline()
            .is_some_and(|at| at <= self.start + self.setup.horizon);
        if due && !self.in_flight() {
            out.push(BarrierAction::Tick);
        }
    }

    fn apply(&mut self, action: &BarrierAction) -> Result<(), String> {
        match *action {
            BarrierAction::Leave(p) => {
                self.budget.leave -= 1;
                let part = &mut self.parts[p];
                part.open = true;
                part.leaving = true;
                part.machine.handle(self.now, BarrierInput::Leave);
                self.pump(p)?;
            }
            BarrierAction::Die(p) => {
                self.budget.die -= 1;
                self.marks |= DIED;
                let part = &mut self.parts[p];
                part.dead = true;
                part.open = false;
                part.wire.reset();
                self.etcd.expire_lease(part.lease);
            }
            BarrierAction::Wire(p, step) => {
                if let WireAction::Lose(_) = step {
                    self.budget.lose -= 1;
                }
                self.wire_step(p, step)?;
            }
            BarrierAction::Tick => {
                if let Some(at) = self.next_deadline() {
                    self.tick_to(at)?;
                }
            }
        }
        self.check()
    }

    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        hash_debug(&mut hasher, &self.etcd);
        hash_debug(&mut hasher, &(self.now - self.start));
        hash_debug(&mut hasher, &self.budget);
        hash_debug(&mut hasher, &self.most_present);
        hash_debug(&mut hasher, &self.tokens);
        // Participants differ by lease only when nothing else does: hash
        // them in a canonical order.
        let mut parts: Vec<u64> = self.parts.iter().map(debug_hash).collect();
        parts.sort_unstable();
        for p in parts {
            hasher.write_u64(p);
        }
        hasher.finish()
    }

    fn check_liveness(&mut self) -> Result<(), String> {
        if self.in_flight() || self.live() {
            return Ok(());
        }
        self.marks |= LIVENESS;
        let mut fair = self.clone();
        fair.budget = BarrierBudget::default();
        let from = fair.now;
        let until = from + self.setup.liveness_bound;
        loop {
            if fair.live() {
                return Ok(());
            }
            let step = match fair.fair_next() {
                Some(BarrierAction::Wire(p, a)) => fair.wire_step(p, a),
                _ => match fair.next_deadline().filter(|at| *at <= until) {
                    Some(at) => fair.tick_to(at),
                    None => break,
                },
            };
            step.and_then(|()| fair.check())
                .map_err(|m| format!("in the fair continuation: {m}"))?;
        }
        Err(format!(
            "liveness: from +{:?}, a live participant still waits after {:?} without faults",
            from - self.start,
            self.setup.liveness_bound
        ))
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn take_marks(&mut self) -> u32 {
        std::mem::take(&mut self.marks)
    }

    fn describe(&self) -> String {
        let mut out = self.etcd.describe(self.start);
        for (p, part) in self.parts.iter().enumerate() {
            out += &format!(
                "\n  participant {p}: lease {:x}, open {}, entered {:?}, dead {}\n    wire {:?}",
                part.lease, part.open, part.entered, part.dead, part.wire
            );
        }
        out
    }
}
