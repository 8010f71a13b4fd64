//! The rate-limit world: three members of one fleet-wide rate limit, each
//! the real [`RateShare`], around a store of member keys with lease
//! expiries, where every choice is an action: a member joins (writes its
//! key, reads the prefix), grants a permit, is killed, leaves gracefully
//! or is cut off from etcd; a watch delivers a membership change to one
//! member; time passes one tick.
//!
//! The store and the members' keepalives are kept by the world, as the
//! shard world keeps its keepalive: every member not cut off renews at
//! each tick, its key then expiring a TTL later and its trust
//! ([`RateShare::trusted`]) ending a margin before that. A cut-off member
//! renews nothing and hears nothing; its key expires at its last renewal
//! plus the TTL. A watch delivers each change to each member at most
//! [`WORLD_LAG`] after the store applied it (a tick may not pass over an
//! undelivered change that is due), in order, any interleaving.
//!
//! Safety, checked on every transition: in every interval of one window
//! the permits granted by the whole fleet number at most the bound the
//! module docs of `fleetcoord_sm::ratelimit` state: `R`, plus
//! `ceil(R / n)` for each cut-off member that may still grant in the
//! window (`n` its view's size). Checking the window that ends at each
//! grant covers every window, since a window's count only grows at a
//! grant.
//!
//! Liveness, from every settled state (no member cut off or leaving,
//! every change delivered): the live members' shares add up to exactly
//! `R` (a killed or cut-off member's share is back once its key expired,
//! within a TTL of its last renewal), and each live member with a share
//! grants within one join wait and one window from now.

use super::{hash_debug, World};
use fleetcoord_sm::ratelimit::{Grant, RateConfig, RateShare};
use std::collections::{BTreeMap, VecDeque};
use std::hash::{DefaultHasher, Hasher};
use std::time::{Duration, Instant};

/// One step of virtual time.
pub const TICK: Duration = Duration::from_millis(100);
/// The window, W.
pub const WINDOW: Duration = Duration::from_millis(200);
/// How late the world's watch may deliver a change.
pub const WORLD_LAG: Duration = TICK;
/// The members' session TTL.
pub const TTL: Duration = Duration::from_millis(600);
/// How long before the key's expiry a member's trust ends.
pub const MARGIN: Duration = Duration::from_millis(100);
/// Members in the world.
pub const MEMBERS: usize = 3;

/// How many events of each kind one path may contain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Budget {
    /// Members joining (member 0 is there from the start).
    pub joins: u32,
    /// Members killed.
    pub kills: u32,
    /// Graceful leaves.
    pub leaves: u32,
    /// Members cut off from etcd.
    pub cuts: u32,
}

/// A bend of how the machines are used, for a world that must fail.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mutant {
    /// None: the world must pass.
    #[default]
    None,
    /// The members are configured with no lag allowance while the watch
    /// lags a tick: a joiner spends while a member still grants on its
    /// share of the view without it.
    ShortJoin,
    /// A graceful leave deletes its key at once instead of at
    /// `release_at`: the others spend its share in the window it spent it.
    NoLeaveWait,
}

/// A world to explore.
#[derive(Clone, Debug)]
pub struct RateSetup {
    /// R.
    pub permits: u32,
    /// Virtual time the world runs for.
    pub horizon: Duration,
    /// Events per path.
    pub budget: Budget,
    /// The bend, if any.
    pub mutant: Mutant,
}

impl RateSetup {
    /// `permits` per window, a 1 s horizon, no events, no bend.
    pub fn new(permits: u32) -> Self {
        RateSetup {
            permits,
            horizon: Duration::from_millis(1_000),
            budget: Budget::default(),
            mutant: Mutant::None,
        }
    }
}

/// One step of the rate-limit world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RateAction {
    /// Member `.0` writes its key and reads the prefix.
    Join(usize),
    /// Member `.0` grants every permit its share allows now.
    Grant(usize),
    /// The watch delivers member `.0`'s next change.
    Deliver(usize),
    /// Member `.0` dies.
    Kill(usize),
    /// Member `.0` leaves gracefully.
    Leave(usize),
    /// Member `.0` is cut off from etcd.
    Cut(usize),
    /// Time passes one tick.
    Tick,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Life {
    /// Not joined yet.
    Absent,
    /// Running, renewing unless `cut`.
    Live { share: RateShare<usize>, cut: bool },
    /// Stopped granting; its key is deleted at `at` (`None`: at once).
    Leaving { at: Option<Instant> },
    /// Dead or gone; its key, if any, expires.
    Gone,
}

/// A membership change on its way to one member.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Change {
    id: usize,
    up: bool,
    due: Instant,
}

/// The rate-limit world; see the module docs for what it checks.
#[derive(Clone)]
pub struct RateWorld {
    setup: RateSetup,
    config: RateConfig,
    start: Instant,
    now: Instant,
    life: Vec<Life>,
    /// Member keys in the store: id -> expiry.
    store: BTreeMap<usize, Instant>,
    inbox: Vec<VecDeque<Change>>,
    /// Grants of the last window: (instant, member).
    granted: VecDeque<(Instant, usize)>,
    /// The view size of each member when it was cut off: its grants on it
    /// count in the bound for as long as they are in the window, after
    /// it died too.
    cut_views: Vec<Option<usize>>,
    budget: Budget,
    marks: u32,
}

const GRANTED: u32 = 1 << 0;
const JOINED: u32 = 1 << 1;
const KILLED: u32 = 1 << 2;
const LEFT: u32 = 1 << 3;
const CUT: u32 = 1 << 4;
const EXPIRED: u32 = 1 << 5;
const FULL: u32 = 1 << 6;
const SHARE_BACK: u32 = 1 << 7;
const OVER: u32 = 1 << 8;

impl RateWorld {
    /// Member 0 registered at the world's start, the others absent.
    pub fn new(setup: RateSetup) -> Self {
        let start = Instant::now();
        let lag = match setup.mutant {
            Mutant::ShortJoin => Duration::ZERO,
            _ => WORLD_LAG,
        };
        let config = RateConfig {
            permits: setup.permits,
            window: WINDOW,
            lag,
        };
        let mut world = RateWorld {
            budget: setup.budget.clone(),
            setup,
            config,
            start,
            now: start,
            life: vec![Life::Absent; MEMBERS],
            store: BTreeMap::new(),
            inbox: vec![VecDeque::new(); MEMBERS],
            granted: VecDeque::new(),
            cut_views: vec![None; MEMBERS],
            marks: 0,
        };
        world.join(0);
        world
    }

    fn join(&mut self, i: usize) {
        self.store.insert(i, self.now + TTL);
        self.publish(i, true);
        let Ok(mut share) = RateShare::new(self.config, i) else {
            return;
        };
        share.registered(self.now);
        share.trusted(self.now + TTL - MARGIN);
        for &id in self.store.keys() {
            share.member_up(id);
        }
        share.synced();
        // Changes queued before its read are in the read.
        self.inbox[i].clear();
        self.life[i] = Life::Live { share, cut: false };
    }

    /// Queues a change of `id`'s key to every live member.
    fn publish(&mut self, id: usize, up: bool) {
        let due = self.now + WORLD_LAG;
        for (j, life) in self.life.iter().enumerate() {
            if matches!(life, Life::Live { .. }) {
                self.inbox[j].push_back(Change { id, up, due });
            }
        }
    }

    fn delete(&mut self, id: usize) {
        if self.store.remove(&id).is_some() {
            self.publish(id, false);
        }
    }

    fn live(&self, i: usize) -> Option<(&RateShare<usize>, bool)> {
        match &self.life[i] {
            Life::Live { share, cut } => Some((share, *cut)),
            _ => None,
        }
    }

    /// The bound on the permits of a window ending now.
    fn bound(&self) -> u64 {
        let r = u64::from(self.setup.permits);
        let mut bound = r;
        for (i, n) in self.cut_views.iter().enumerate() {
            let Some(n) = n else { continue };
            let may_grant = matches!(self.life[i], Life::Live { cut: true, .. });
            if may_grant || self.granted.iter().any(|(_, j)| *j == i) {
                bound += r.div_ceil((*n).max(1) as u64);
            }
        }
        bound
    }

    /// Member `i` grants every permit its share allows now, each checked
    /// (a member granting fewer is a schedule with fewer grants, never one
    /// with more in a window).
    fn grant(&mut self, i: usize) -> Result<(), String> {
        let now = self.now;
        loop {
            let Life::Live { share, .. } = &mut self.life[i] else {
                return Ok(());
            };
            if share.try_acquire(now) != Grant::Granted {
                return Ok(());
            }
            let own = share.share();
            self.marks |= GRANTED;
            self.granted.push_back((now, i));
            let count = self
                .granted
                .iter()
                .filter(|(at, _)| now.duration_since(*at) < WINDOW)
                .count() as u64;
            if count == u64::from(self.setup.permits) {
                self.marks |= FULL;
            }
            let bound = self.bound();
            if count > u64::from(self.setup.permits) && count <= bound {
                self.marks |= OVER;
            }
            if count > bound {
                return Err(format!(
                    "overshoot: {count} permits granted in the window ending at +{} ms, \
                     bound {bound} (member {i}, share {own})",
                    now.duration_since(self.start).as_millis()
                ));
            }
        }
    }

    fn tick(&mut self) {
        self.now += TICK;
        let now = self.now;
        while self
            .granted
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) >= WINDOW)
        {
            self.granted.pop_front();
        }
        // Renewals of the members not cut off.
        for i in 0..MEMBERS {
            if let Life::Live { share, cut: false } = &mut self.life[i] {
                share.trusted(now + TTL - MARGIN);
                self.store.insert(i, now + TTL);
            }
        }
        // Leaves whose wait is over.
        for i in 0..MEMBERS {
            if let Life::Leaving { at } = self.life[i] {
                if at.is_none_or(|at| at <= now) {
                    self.life[i] = Life::Gone;
                    self.delete(i);
                }
            }
        }
        // Expiries.
        let expired: Vec<usize> = self
            .store
            .iter()
            .filter(|(_, &at)| at <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            self.marks |= EXPIRED;
            if let Life::Live { share, .. } = &mut self.life[id] {
                // Its keepalive's deadline passed long before.
                share.lost();
                self.life[id] = Life::Gone;
            }
            self.delete(id);
        }
    }

    fn settled(&self) -> bool {
        (0..MEMBERS).all(|i| match &self.life[i] {
            Life::Live { cut, .. } => !cut && self.inbox[i].is_empty(),
            Life::Leaving { .. } => false,
            Life::Absent | Life::Gone => !self.store.contains_key(&i),
        })
    }
}

impl World for RateWorld {
    type Action = RateAction;

    const MARKS: &'static [&'static str] = &[
        "granted",
        "joined",
        "killed",
        "left",
        "cut",
        "expired",
        "window full",
        "share back",
        "over R within the bound",
    ];

    fn actions(&self, out: &mut Vec<RateAction>) {
        for i in 0..MEMBERS {
            match &self.life[i] {
                Life::Absent if self.budget.joins > 0 => out.push(RateAction::Join(i)),
                Life::Live { share, cut } => {
                    if share.clone().try_acquire(self.now) == Grant::Granted {
                        out.push(RateAction::Grant(i));
                    }
                    if !cut && !self.inbox[i].is_empty() {
                        out.push(RateAction::Deliver(i));
                    }
                    if self.budget.kills > 0 {
                        out.push(RateAction::Kill(i));
                    }
                    if self.budget.leaves > 0 && !cut {
                        out.push(RateAction::Leave(i));
                    }
                    if self.budget.cuts > 0 && !cut {
                        out.push(RateAction::Cut(i));
                    }
                }
                _ => {}
            }
        }
        let next = self.now + TICK;
        let overdue = (0..MEMBERS).any(|i| {
            matches!(self.live(i), Some((_, false)))
                && self.inbox[i].front().is_some_and(|c| c.due < next)
        });
        if !overdue && next.duration_since(self.start) <= self.setup.horizon {
            out.push(RateAction::Tick);
        }
    }

    fn apply(&mut self, action: &RateAction) -> Result<(), String> {
        match *action {
            RateAction::Join(i) => {
                self.budget.joins -= 1;
                self.marks |= JOINED;
                self.join(i);
            }
            RateAction::Grant(i) => self.grant(i)?,
            RateAction::Deliver(i) => {
                if let (Some(change), Life::Live { share, .. }) =
                    (self.inbox[i].pop_front(), &mut self.life[i])
                {
                    if change.up {
                        share.member_up(change.id);
                    } else {
                        share.member_down(&change.id);
                    }
                }
            }
            RateAction::Kill(i) => {
                self.budget.kills -= 1;
                self.marks |= KILLED;
                self.life[i] = Life::Gone;
                self.inbox[i].clear();
            }
            RateAction::Leave(i) => {
                self.budget.leaves -= 1;
                self.marks |= LEFT;
                if let Life::Live { share, .. } = &mut self.life[i] {
                    share.lost();
                    let at = match self.setup.mutant {
                        Mutant::NoLeaveWait => None,
                        _ => share.release_at().filter(|&at| at > self.now),
                    };
                    self.inbox[i].clear();
                    self.life[i] = Life::Leaving { at };
                    if at.is_none() {
                        self.life[i] = Life::Gone;
                        self.delete(i);
                    }
                }
            }
            RateAction::Cut(i) => {
                self.budget.cuts -= 1;
                self.marks |= CUT;
                if let Life::Live { cut, share } = &mut self.life[i] {
                    *cut = true;
                    self.cut_views[i] = Some(share.members());
                }
            }
            RateAction::Tick => self.tick(),
        }
        Ok(())
    }

    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        let since = |at: Instant| at.duration_since(self.start);
        hash_debug(&mut hasher, &since(self.now));
        hash_debug(&mut hasher, &self.life);
        hash_debug(
            &mut hasher,
            &self
                .store
                .iter()
                .map(|(id, at)| (*id, since(*at)))
                .collect::<Vec<_>>(),
        );
        hash_debug(&mut hasher, &self.inbox);
        hash_debug(
            &mut hasher,
            &self
                .granted
                .iter()
                .map(|(at, i)| (since(*at), *i))
                .collect::<Vec<_>>(),
        );
        hash_debug(&mut hasher, &self.cut_views);
        hash_debug(&mut hasher, &self.budget);
        hasher.finish()
    }

    fn check_liveness(&mut self) -> Result<(), String> {
        if !self.settled() {
            return Ok(());
        }
        let live: Vec<RateShare<usize>> = (0..MEMBERS)
            .filter_map(|i| self.live(i).map(|l| l.0.clone()))
            .collect();
        if live.is_empty() {
            return Ok(());
        }
        let total: u32 = live.iter().map(|s| s.share()).sum();
        if total != self.setup.permits {
            return Err(format!(
                "settled with shares adding up to {total}, not {}",
                self.setup.permits
            ));
        }
        if self.store.len() < self.life.len() && self.life.iter().any(|l| matches!(l, Life::Gone)) {
            self.marks |= SHARE_BACK;
        }
        // Each live member with a share grants within one join wait and
        // one window, renewed meanwhile.
        let later = self.now + WINDOW + self.config.lag + WINDOW;
        for share in &live {
            if share.share() == 0 {
                continue;
            }
            let mut probe = share.clone();
            probe.trusted(later + TTL - MARGIN);
            if probe.try_acquire(later) != Grant::Granted {
                return Err(format!(
                    "a settled member with a share of {} grants nothing by +{} ms",
                    share.share(),
                    later.duration_since(self.start).as_millis()
                ));
            }
        }
        Ok(())
    }

    fn elapsed(&self) -> Duration {
        self.now.duration_since(self.start)
    }

    fn take_marks(&mut self) -> u32 {
        std::mem::take(&mut self.marks)
    }

    fn describe(&self) -> String {
        let mut out = format!("+{} ms\n", self.elapsed().as_millis());
        for (i, life) in self.life.iter().enumerate() {
            let what = match life {
                Life::Absent => "absent".to_string(),
                Life::Live { share, cut } => format!(
                    "live{} view {} share {} spent {}",
                    if *cut { " (cut off)" } else { "" },
                    share.members(),
                    share.share(),
                    share.spent(self.now)
                ),
                Life::Leaving { at } => format!("leaving until {:?}", at.map(|a| a - self.start)),
                Life::Gone => "gone".to_string(),
            };
            out.push_str(&format!(
                "member {i}: {what}; key {:?}; inbox {}\n",
                self.store.get(&i).map(|at| *at - self.start),
                self.inbox[i].len()
            ));
        }
        out.push_str(&format!(
            "granted in the last window: {:?}",
            self.granted
                .iter()
                .map(|(at, i)| (*i, (*at - self.start).as_millis()))
                .collect::<Vec<_>>()
        ));
        out
    }
}
