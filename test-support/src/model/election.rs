//! The election world: N real [`Election`] machines (one permit or a
//! semaphore of several) around the model etcd, each behind its own
//! [`Wire`], with users who campaign, resign and cancel.
//!
//! Safety, checked after every action (etcd's time is the machines' time):
//! 1. **At most `allowed_holders` believe they hold** (`token()` is some),
//!    not counting holders whose lease etcd revoked early (rule 6).
//! 2. **A holder's key exists with its token**: `my_key()` has create
//!    revision `token` and the holder's session lease.
//! 3. **Belief ends before etcd's expiry**: a holder's session deadline
//!    plus `required_margin` is no later than etcd's expiry of its lease.
//! 4. **Tokens are never handed out twice**, and with one permit they rise.
//! 5. **Every answer names an open operation**: `Elected`, `NotElected`
//!    and `CampaignFailed` answer the candidate's one open campaign.
//! 6. **Belief ends at the first evidence**: a holder that is handed a
//!    watch batch deleting its own key, or told that etcd refused its
//!    fenced write ([`ElectionInput::FenceRefused`]), no longer holds once
//!    that input is handled — whether the lease expired, was revoked early
//!    by a faulty etcd (`RevokeEarly`, which rules 1–3 cannot survive and
//!    so do not judge), or the key was deleted.
//! 7. **Deadlines never lie in the past**: `poll_timeout()` is never
//!    earlier than the current instant after a step.
//!
//! As a read-write lock (`roles` not empty: candidate `i` is a reader or
//! a writer, [`ElectionConfig::rw`]), rule 1 reads: **no writer holds
//! while any other candidate holds; readers may hold together** (with
//! the same exception), and rule 4 drops "they rise" (readers released
//! by one writer's delete may hear in any order).
//!
//! Liveness, from every quiescent state (nothing in flight): with no
//! further faults or user requests, messages delivered at once and time
//! moving to each next deadline, within `liveness_bound` either nobody
//! waits or `permits` candidates hold, and every observer ([`Observe`],
//! `observers` of them) last reported the leader etcd has then (the key
//! with the lowest create revision, or none).

use super::wire::{Bends, Taken, Wire, WireAction};
use super::{debug_hash, hash_debug, World};
use crate::ModelEtcd;
use fleetcoord_sm::election::{
    Election, ElectionConfig, ElectionInput, ElectionNotice, OpId, RwRole,
};
use fleetcoord_sm::observe::{Observe, ObserveConfig, ObserveNotice};
use fleetcoord_sm::{BackoffConfig, EventKind, LeaseId, Machine, Response, Revision};
use std::collections::BTreeSet;
use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Short: every key is hashed in its `Debug` form, byte by byte.
const PREFIX: &[u8] = b"/e/";
/// Every machine gets the same seed: identical candidates are what makes
/// the candidate symmetry of the fingerprint sound.
const SEED: u64 = 7;

/// How many faults of each kind one path may contain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// User requests (campaign again, resign, cancel), all candidates
    /// together.
    pub user: u32,
    /// Requests, replies or watch streams lost.
    pub lose: u32,
    /// Orphans (requests given up) landing late.
    pub land: u32,
    /// Times time passes while messages are in flight.
    pub delay: u32,
    /// Candidates restarted (the process dies, its lease lives on).
    pub restart: u32,
    /// Compactions of the whole history.
    pub compact: u32,
    /// Leases etcd revokes before their expiry (etcd's own bug on 3.4 and
    /// 3.5 when a paused raft leader resumes).
    pub revoke_early: u32,
}

/// A world to explore: its size, its faults and what it checks.
#[derive(Clone, Debug)]
pub struct ElectionSetup {
    /// Candidates, each campaigning from the start.
    pub candidates: usize,
    /// Leader observers of the election.
    pub observers: usize,
    /// The machines' permits (1: an election; N: a semaphore).
    pub permits: u32,
    /// The most holders rule 1 accepts; `permits` unless a test means to
    /// catch one too many.
    pub allowed_holders: u32,
    /// The session TTL.
    pub ttl_secs: i64,
    /// The machines' safety margin.
    pub safety_margin: Duration,
    /// The margin rule 3 requires; `safety_margin` unless a test means to
    /// catch a machine trusting its lease too long.
    pub required_margin: Duration,
    /// The machines' attempt timeout.
    pub attempt_timeout: Duration,
    /// Faults per path.
    pub budget: Budget,
    /// Users act while their own requests are in flight (their requests
    /// race the replies); without, only when their wire is quiet.
    pub user_races: bool,
    /// How many times time may pass between a request being given up and
    /// its landing (see [`Wire::age_orphans`]).
    pub land_within: u32,
    /// Users whose fenced writes etcd refuses tell their machine.
    pub fence_refusals: bool,
    /// Time stops here (a quiescent state at the horizon is a leaf).
    pub horizon: Duration,
    /// The liveness bound from every quiescent state.
    pub liveness_bound: Duration,
    /// etcd runs guarded deletes as if their guard held (a test that must
    /// fail).
    pub strip_delete_guards: bool,
    /// Watches never deliver the deletes of expired leases (a test that
    /// must fail, on liveness).
    pub withhold_expiry_deletes: bool,
    /// Empty: an election or a semaphore. Else one role per candidate: a
    /// read-write lock, judged by rule 1's read-write form.
    pub roles: Vec<RwRole>,
    /// A seeded bug for the read-write world (a test that must fail):
    /// writers queue as readers (they wait for older writers only) while
    /// the world still judges them as writers.
    pub writers_queue_as_readers: bool,
    /// A seeded bug for the read-write world (a test that must fail):
    /// readers wait for no writer, older or not (their queue is a
    /// directory no writer's key is in: the root's `readers-elsewhere/`,
    /// their own keys still under the root, so writers still wait for
    /// them).
    pub readers_ignore_writers: bool,
}

impl ElectionSetup {
    /// `candidates` campaigning for `permits`, TTL 2 s, margin 100 ms,
    /// attempt timeout 400 ms, no user requests, no faults, a 5 s
    /// horizon, liveness within 3 × TTL.
    pub fn new(candidates: usize, permits: u32) -> Self {
        ElectionSetup {
            candidates,
            observers: 0,
            permits,
            allowed_holders: permits,
            ttl_secs: 2,
            safety_margin: Duration::from_millis(100),
            required_margin: Duration::from_millis(100),
            attempt_timeout: Duration::from_millis(400),
            budget: Budget::default(),
            land_within: 1,
            user_races: false,
            fence_refusals: false,
            horizon: Duration::from_secs(5),
            liveness_bound: Duration::from_secs(6),
            strip_delete_guards: false,
            withhold_expiry_deletes: false,
            roles: Vec::new(),
            writers_queue_as_readers: false,
            readers_ignore_writers: false,
        }
    }

    /// A read-write lock of `roles.len()` candidates, one permit each.
    pub fn rwlock(roles: Vec<RwRole>) -> Self {
        ElectionSetup {
            roles,
            ..ElectionSetup::new(0, 1)
        }
        .sized()
    }

    fn sized(mut self) -> Self {
        self.candidates = self.roles.len();
        self
    }

    /// The role candidate `c` is judged by.
    fn role(&self, c: usize) -> Option<RwRole> {
        self.roles.get(c).copied()
    }

    /// Candidate `c`'s machine configuration.
    fn config_of(&self, c: usize) -> ElectionConfig {
        let rw = match self.role(c) {
            Some(RwRole::Write) if self.writers_queue_as_readers => Some(RwRole::Read),
            role => role,
        };
        let mut config = ElectionConfig {
            rw,
            ..self.config()
        };
        if rw == Some(RwRole::Read) && self.readers_ignore_writers {
            config.prefix.extend_from_slice(b"readers-elsewhere/");
        }
        config
    }

    fn config(&self) -> ElectionConfig {
        ElectionConfig {
            prefix: PREFIX.to_vec(),
            ttl_secs: self.ttl_secs,
            backoff: backoff(),
            safety_margin: self.safety_margin,
            drift_allowance_ppm: 0,
            attempt_timeout: self.attempt_timeout,
            announce_session_trust: false,
            permits: self.permits,
            rw: None,
        }
    }
}

fn backoff() -> BackoffConfig {
    BackoffConfig {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(800),
        multiplier: 2,
        // No jitter: the seed then decides nothing, and identical
        // candidates stay identical.
        jitter_percent: 0,
    }
}

/// One step of the election world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElectionAction {
    /// Candidate `.0` campaigns (again).
    Campaign(usize),
    /// Candidate `.0` resigns the leadership it holds.
    Resign(usize),
    /// Candidate `.0` cancels its open campaign.
    Cancel(usize),
    /// Candidate `.0`'s user had a fenced write refused (its key is gone).
    Refused(usize),
    /// A step on candidate `.0`'s wire.
    Wire(usize, WireAction),
    /// A step on observer `.0`'s wire.
    Observer(usize, WireAction),
    /// Time passes to the next deadline, nothing in flight.
    Tick,
    /// Time passes to the next deadline with messages in flight (a fault).
    Delay,
    /// Candidate `.0`'s process dies and starts again, campaigning; its
    /// old lease lives until etcd expires it.
    Restart(usize),
    /// etcd compacts its whole history.
    Compact,
    /// etcd revokes candidate `.0`'s lease early (etcd's bug, not ours).
    RevokeEarly(usize),
}

#[derive(Clone, Debug)]
struct Candidate {
    /// Its role in a read-write lock (part of the state: candidates of
    /// different roles are not interchangeable).
    role: Option<RwRole>,
    machine: Election,
    wire: Wire,
    /// The campaign asked for and not yet answered.
    open: Option<OpId>,
    /// The token and lease of the last `Elected`: what the user resigns
    /// with, possibly long after it was lost.
    elected: Option<(Revision, LeaseId)>,
    next_op: u64,
}

#[derive(Clone, Debug)]
struct Observer {
    machine: Observe,
    wire: Wire,
    /// The last leader reported: its key and create revision.
    reported: Option<Option<(Vec<u8>, Revision)>>,
}

/// The election world; see the module docs for what it checks.
#[derive(Clone)]
pub struct ElectionWorld {
    setup: Arc<ElectionSetup>,
    etcd: ModelEtcd,
    start: Instant,
    now: Instant,
    candidates: Vec<Candidate>,
    observers: Vec<Observer>,
    budget: Budget,
    /// Every token handed out (rule 4).
    tokens: BTreeSet<Revision>,
    /// Leases etcd revoked early (rule 6).
    revoked_early: BTreeSet<LeaseId>,
    bends: Bends,
    marks: u32,
}

const ELECTED: u32 = 1 << 0;
const LANDED: u32 = 1 << 1;
const EXPIRED: u32 = 1 << 2;
const COMPACTED: u32 = 1 << 3;
const RESTARTED: u32 = 1 << 4;
const REFUSED: u32 = 1 << 5;
const REVOKED_EARLY: u32 = 1 << 6;
const OVERLAP: u32 = 1 << 7;
const LIVENESS: u32 = 1 << 8;
const RESIGNED: u32 = 1 << 9;
const READERS_SHARED: u32 = 1 << 10;

impl ElectionWorld {
    /// Every candidate started at one instant, each campaigning.
    pub fn new(setup: ElectionSetup) -> Self {
        let start = Instant::now();
        let keep_orphans = setup.budget.land > 0;
        let candidates = (0..setup.candidates)
            .map(|c| Candidate {
                role: setup.role(c),
                machine: Election::new(setup.config_of(c), start, SEED),
                wire: Wire::new(keep_orphans),
                open: None,
                elected: None,
                next_op: 0,
            })
            .collect();
        let observers = (0..setup.observers)
            .map(|_| Observer {
                machine: Observe::new(
                    ObserveConfig {
                        prefix: PREFIX.to_vec(),
                        backoff: backoff(),
                    },
                    start,
                    SEED,
                ),
                wire: Wire::new(keep_orphans),
                reported: None,
            })
            .collect();
        let mut world = ElectionWorld {
            budget: setup.budget.clone(),
            bends: Bends {
                strip_delete_guards: setup.strip_delete_guards,
                strip_put_guards: false,
                hidden: BTreeSet::new(),
            },
            setup: Arc::new(setup),
            etcd: ModelEtcd::new(),
            start,
            now: start,
            candidates,
            observers,
            tokens: BTreeSet::new(),
            revoked_early: BTreeSet::new(),
            marks: 0,
        };
        for c in 0..world.candidates.len() {
            // Campaigns at the start are not part of the user's budget.
            world.campaign(c);
            if let Err(message) = world.pump(c) {
                panic!("the initial world breaks a rule: {message}");
            }
        }
        for o in 0..world.observers.len() {
            if let Err(message) = world.pump_observer(o) {
                panic!("the initial world breaks a rule: {message}");
            }
        }
        world
    }

    /// Moves observer `o`'s commands onto its wire, keeping what it reports.
    fn pump_observer(&mut self, o: usize) -> Result<(), String> {
        let observer = &mut self.observers[o];
        while let Some(command) = observer.machine.poll_command() {
            match observer.wire.accept(command) {
                Some(ObserveNotice::Leader(leader)) => {
                    observer.reported = Some(leader.map(|kv| (kv.key, kv.create_revision)));
                }
                Some(ObserveNotice::Failed(error)) => {
                    return Err(format!("observer {o} failed: {error:?}"));
                }
                Some(_) | None => {}
            }
        }
        Ok(())
    }

    /// A step on observer `o`'s wire.
    fn observer_step(&mut self, o: usize, action: WireAction) -> Result<(), String> {
        let now = self.now;
        let observer = &mut self.observers[o];
        match observer.wire.take(action, &mut self.etcd, now, &self.bends) {
            Taken::Reply(reply) => {
                if observer.machine.poll_timeout().is_some_and(|t| t <= now) {
                    observer.machine.handle_timeout(now);
                }
                observer.machine.handle(now, reply.into());
            }
            Taken::Landed => self.marks |= LANDED,
            Taken::Nothing => {}
        }
        self.pump_observer(o)
    }

    /// Whether every observer last reported the leader etcd has now.
    fn observers_agree(&self) -> bool {
        let leader = self
            .etcd
            .range_prefix(PREFIX)
            .into_iter()
            .min_by_key(|kv| kv.create_revision)
            .map(|kv| (kv.key, kv.create_revision));
        self.observers
            .iter()
            .all(|o| o.reported.as_ref() == Some(&leader))
    }

    fn campaign(&mut self, c: usize) {
        let cand = &mut self.candidates[c];
        let op = OpId(cand.next_op);
        cand.next_op += 1;
        cand.open = Some(op);
        cand.machine.handle(
            self.now,
            ElectionInput::Campaign {
                op,
                value: b"v".to_vec(),
            },
        );
    }

    /// Moves candidate `c`'s commands onto its wire, checking every notice.
    fn pump(&mut self, c: usize) -> Result<(), String> {
        while let Some(command) = self.candidates[c].machine.poll_command() {
            if let Some(notice) = self.candidates[c].wire.accept(command) {
                self.notice(c, notice)?;
            }
        }
        Ok(())
    }

    /// Rules 4 and 5 on one notice.
    fn notice(&mut self, c: usize, notice: ElectionNotice) -> Result<(), String> {
        let cand = &mut self.candidates[c];
        let answered = match &notice {
            ElectionNotice::Elected { op, .. }
            | ElectionNotice::NotElected { op, .. }
            | ElectionNotice::CampaignFailed { op, .. } => Some(*op),
            _ => None,
        };
        if let Some(op) = answered {
            if cand.open != Some(op) {
                return Err(format!(
                    "candidate {c} was answered for {op:?}, but its open campaign is {:?}: {notice:?}",
                    cand.open
                ));
            }
            cand.open = None;
        }
        if let ElectionNotice::Elected { token, lease, .. } = notice {
            let newest = self.tokens.last().copied().unwrap_or(0);
            if self.tokens.contains(&token) {
                return Err(format!(
                    "candidate {c} elected with token {token}, handed out before"
                ));
            }
            if self.setup.permits <= 1 && self.setup.roles.is_empty() && token <= newest {
                return Err(format!(
                    "candidate {c} elected with token {token}, not above the last token {newest}"
                ));
            }
            self.tokens.insert(token);
            cand.elected = Some((token, lease));
            self.marks |= ELECTED;
        }
        if let ElectionNotice::Resigned { .. } = notice {
            self.marks |= RESIGNED;
        }
        Ok(())
    }

    /// Rules 1–3 and 7.
    fn check(&mut self) -> Result<(), String> {
        let mut holders = 0;
        let mut believers = 0;
        let mut writers = Vec::new();
        for (c, cand) in self.candidates.iter().enumerate() {
            if cand.machine.poll_timeout().is_some_and(|t| t < self.now) {
                return Err(format!("candidate {c}'s next deadline is in the past"));
            }
            let Some(token) = cand.machine.token() else {
                continue;
            };
            believers += 1;
            let Some((_, lease)) = cand.elected.filter(|(t, _)| *t == token) else {
                return Err(format!(
                    "candidate {c} holds token {token} it was never told of"
                ));
            };
            if self.revoked_early.contains(&lease) {
                continue;
            }
            holders += 1;
            if cand.role == Some(RwRole::Write) {
                writers.push(c);
            }
            let key = cand.machine.my_key().unwrap_or_default();
            match self.etcd.get(&key) {
                Some(kv) if kv.create_revision == token && kv.lease == lease => {}
                found => {
                    return Err(format!(
                        "candidate {c} holds token {token} but etcd has its key as {found:?}"
                    ))
                }
            }
            let trusted = cand.machine.session_deadline();
            let expiry = self.etcd.lease_deadline(lease);
            let in_time = match (trusted, expiry) {
                (Some(trusted), Some(expiry)) => trusted + self.setup.required_margin <= expiry,
                _ => false,
            };
            if !in_time {
                return Err(format!(
                    "candidate {c} trusts its lease until +{:?} but etcd expires it at +{:?} \
                     (margin {:?} required)",
                    trusted.map(|t| t - self.start),
                    expiry.map(|t| t - self.start),
                    self.setup.required_margin
                ));
            }
        }
        if !self.setup.roles.is_empty() {
            if let Some(w) = writers.first().filter(|_| holders > 1) {
                return Err(format!(
                    "writer {w} holds while {} other candidates hold",
                    holders - 1
                ));
            }
            if holders > 1 {
                self.marks |= READERS_SHARED;
            }
            return Ok(());
        }
        if holders > self.setup.allowed_holders {
            return Err(format!(
                "{holders} candidates hold at once (at most {} allowed)",
                self.setup.allowed_holders
            ));
        }
        if believers > self.setup.permits {
            self.marks |= OVERLAP;
        }
        Ok(())
    }

    fn in_flight(&self) -> bool {
        self.candidates
            .iter()
            .map(|c| &c.wire)
            .chain(self.observers.iter().map(|o| &o.wire))
            .any(|w| w.in_flight(&self.etcd, &self.bends))
    }

    /// The next instant anything is due: a machine's deadline or a lease
    /// expiry.
    fn next_deadline(&self) -> Option<Instant> {
        self.candidates
            .iter()
            .filter_map(|c| c.machine.poll_timeout())
            .chain(
                self.observers
                    .iter()
                    .filter_map(|o| o.machine.poll_timeout()),
            )
            .chain(self.etcd.next_deadline())
            .min()
    }

    fn within_horizon(&self, at: Instant) -> bool {
        at <= self.start + self.setup.horizon
    }

    /// Time passes to `at`: etcd expires leases first, then every due
    /// machine deadline fires (the harness's order at one instant).
    fn tick_to(&mut self, at: Instant) -> Result<(), String> {
        self.now = self.now.max(at);
        let before = self.etcd.revision();
        self.etcd.advance(self.now);
        let after = self.etcd.revision();
        if after > before {
            self.marks |= EXPIRED;
            if self.setup.withhold_expiry_deletes {
                self.bends.hidden.extend(before + 1..=after);
            }
        }
        let land_within = self.setup.land_within;
        for c in 0..self.candidates.len() {
            self.candidates[c].wire.age_orphans(land_within);
            if self.candidates[c]
                .machine
                .poll_timeout()
                .is_some_and(|t| t <= self.now)
            {
                self.candidates[c].machine.handle_timeout(self.now);
            }
            self.pump(c)?;
        }
        for o in 0..self.observers.len() {
            self.observers[o].wire.age_orphans(land_within);
            if self.observers[o]
                .machine
                .poll_timeout()
                .is_some_and(|t| t <= self.now)
            {
                self.observers[o].machine.handle_timeout(self.now);
            }
            self.pump_observer(o)?;
        }
        Ok(())
    }

    /// A step on candidate `c`'s wire, with rule 6 for what it delivers.
    fn wire_step(&mut self, c: usize, action: WireAction) -> Result<(), String> {
        let now = self.now;
        let taken = self.candidates[c]
            .wire
            .take(action, &mut self.etcd, now, &self.bends);
        match taken {
            Taken::Nothing => Ok(()),
            Taken::Landed => {
                self.marks |= LANDED;
                Ok(())
            }
            Taken::Reply(reply) => {
                let cand = &self.candidates[c];
                let held = cand.machine.token();
                let key = cand.machine.my_key();
                let evidence = match (&reply.result, held, &key) {
                    (Ok(Response::WatchEvents { events }), Some(token), Some(key)) => {
                        events.iter().any(|e| {
                            e.kind == EventKind::Delete
                                && &e.kv.key == key
                                && e.prev_kv
                                    .as_ref()
                                    .is_none_or(|p| p.create_revision == token)
                        })
                    }
                    _ => false,
                };
                if matches!(reply.result, Ok(Response::WatchCanceled { .. })) {
                    self.marks |= COMPACTED;
                }
                let cand = &mut self.candidates[c];
                if cand.machine.poll_timeout().is_some_and(|t| t <= now) {
                    cand.machine.handle_timeout(now);
                }
                cand.machine.handle(now, reply.into());
                if evidence && cand.machine.token() == held {
                    return Err(format!(
                        "candidate {c} still holds token {held:?} after its key's delete was delivered"
                    ));
                }
                self.pump(c)
            }
        }
    }

    /// The fair continuation's next message: the first request to run,
    /// else the first answer to deliver, candidate by candidate.
    fn fair_next(&self) -> Option<ElectionAction> {
        let mut actions = Vec::new();
        for (c, cand) in self.candidates.iter().enumerate() {
            actions.clear();
            cand.wire
                .actions(&self.etcd, &self.bends, false, false, &mut actions);
            if let Some(action) = actions.first() {
                return Some(ElectionAction::Wire(c, *action));
            }
        }
        for (o, observer) in self.observers.iter().enumerate() {
            actions.clear();
            observer
                .wire
                .actions(&self.etcd, &self.bends, false, false, &mut actions);
            if let Some(action) = actions.first() {
                return Some(ElectionAction::Observer(o, *action));
            }
        }
        None
    }

    fn waiting_and_holders(&self) -> (usize, usize) {
        let waiting = self.candidates.iter().filter(|c| c.open.is_some()).count();
        let holders = self
            .candidates
            .iter()
            .filter(|c| c.machine.token().is_some())
            .count();
        (waiting, holders)
    }

    fn live(&self) -> bool {
        let (waiting, holders) = self.waiting_and_holders();
        let served =
            waiting == 0 || holders >= usize::try_from(self.setup.permits.max(1)).unwrap_or(1);
        served && self.observers_agree()
    }
}

impl World for ElectionWorld {
    type Action = ElectionAction;

    const MARKS: &'static [&'static str] = &[
        "elected",
        "landed late",
        "lease expired",
        "watch compacted",
        "restarted",
        "fence refused",
        "revoked early",
        "overlap after early revocation",
        "liveness checked",
        "resigned",
        "readers shared",
    ];

    fn actions(&self, out: &mut Vec<ElectionAction>) {
        let b = &self.budget;
        for (c, cand) in self.candidates.iter().enumerate() {
            let mut wire = Vec::new();
            cand.wire
                .actions(&self.etcd, &self.bends, b.lose > 0, b.land > 0, &mut wire);
            out.extend(wire.into_iter().map(|a| ElectionAction::Wire(c, a)));
            let holding = cand.machine.token();
            let user_may = b.user > 0
                && (self.setup.user_races || !cand.wire.in_flight(&self.etcd, &self.bends));
            if user_may {
                if cand.open.is_none() && holding.is_none() {
                    out.push(ElectionAction::Campaign(c));
                }
                if holding.is_some() {
                    out.push(ElectionAction::Resign(c));
                }
                if cand.open.is_some() {
                    out.push(ElectionAction::Cancel(c));
                }
            }
            if let Some(token) = holding {
                let key = cand.machine.my_key().unwrap_or_default();
                let current = self
                    .etcd
                    .get(&key)
                    .is_some_and(|kv| kv.create_revision == token);
                if self.setup.fence_refusals && !current {
                    out.push(ElectionAction::Refused(c));
                }
                if b.revoke_early > 0 && current {
                    out.push(ElectionAction::RevokeEarly(c));
                }
            }
            if b.restart > 0 {
                out.push(ElectionAction::Restart(c));
            }
        }
        for (o, observer) in self.observers.iter().enumerate() {
            let mut wire = Vec::new();
            observer
                .wire
                .actions(&self.etcd, &self.bends, b.lose > 0, b.land > 0, &mut wire);
            out.extend(wire.into_iter().map(|a| ElectionAction::Observer(o, a)));
        }
        if b.compact > 0 && self.etcd.revision() > self.etcd.compacted_revision() {
            out.push(ElectionAction::Compact);
        }
        if let Some(at) = self.next_deadline().filter(|at| self.within_horizon(*at)) {
            let _ = at;
            if !self.in_flight() {
                out.push(ElectionAction::Tick);
            } else if b.delay > 0 {
                out.push(ElectionAction::Delay);
            }
        }
    }

    fn apply(&mut self, action: &ElectionAction) -> Result<(), String> {
        let now = self.now;
        match *action {
            ElectionAction::Campaign(c) => {
                self.budget.user -= 1;
                self.campaign(c);
                self.pump(c)?;
            }
            ElectionAction::Resign(c) => {
                self.budget.user -= 1;
                let cand = &mut self.candidates[c];
                if let Some((token, _)) = cand.elected.take() {
                    cand.machine.handle(now, ElectionInput::Resign { token });
                }
                self.pump(c)?;
            }
            ElectionAction::Cancel(c) => {
                self.budget.user -= 1;
                let cand = &mut self.candidates[c];
                if let Some(op) = cand.open {
                    cand.machine
                        .handle(now, ElectionInput::CancelCampaign { op });
                }
                self.pump(c)?;
            }
            ElectionAction::Refused(c) => {
                let cand = &mut self.candidates[c];
                let held = cand.machine.token();
                if let Some(token) = held {
                    cand.machine
                        .handle(now, ElectionInput::FenceRefused { token });
                }
                self.marks |= REFUSED;
                if held.is_some() && cand.machine.token() == held {
                    return Err(format!(
                        "candidate {c} still holds token {held:?} after its fenced write was refused"
                    ));
                }
                self.pump(c)?;
            }
            ElectionAction::Wire(c, step) => self.wire_step(c, step)?,
            ElectionAction::Observer(o, step) => self.observer_step(o, step)?,
            ElectionAction::Tick | ElectionAction::Delay => {
                if *action == ElectionAction::Delay {
                    self.budget.delay -= 1;
                }
                if let Some(at) = self.next_deadline() {
                    self.tick_to(at)?;
                }
            }
            ElectionAction::Restart(c) => {
                self.budget.restart -= 1;
                self.marks |= RESTARTED;
                let config = self.setup.config_of(c);
                let cand = &mut self.candidates[c];
                cand.wire.reset();
                cand.machine = Election::new(config, now, SEED);
                cand.open = None;
                cand.elected = None;
                self.campaign(c);
                self.pump(c)?;
            }
            ElectionAction::Compact => {
                self.budget.compact -= 1;
                let revision = self.etcd.revision();
                self.etcd.compact(revision);
            }
            ElectionAction::RevokeEarly(c) => {
                self.budget.revoke_early -= 1;
                if let Some((_, lease)) = self.candidates[c].elected {
                    self.etcd.expire_lease(lease);
                    self.revoked_early.insert(lease);
                    self.marks |= REVOKED_EARLY;
                }
            }
        }
        if let ElectionAction::Wire(_, step) | ElectionAction::Observer(_, step) = action {
            if let WireAction::Lose(_) = step {
                self.budget.lose -= 1;
            }
            if let WireAction::Land(_) = step {
                self.budget.land -= 1;
                if self.budget.land == 0 {
                    for cand in &mut self.candidates {
                        cand.wire.forget_orphans();
                    }
                    for observer in &mut self.observers {
                        observer.wire.forget_orphans();
                    }
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
        hash_debug(&mut hasher, &self.tokens);
        hash_debug(&mut hasher, &self.revoked_early);
        hash_debug(&mut hasher, &self.bends.hidden);
        hash_debug(&mut hasher, &self.observers);
        // Candidates are identical but for what happened to them: a state
        // and its permutations are one state.
        let mut candidates: Vec<u64> = self.candidates.iter().map(debug_hash).collect();
        candidates.sort_unstable();
        for c in candidates {
            hasher.write_u64(c);
        }
        hasher.finish()
    }

    fn check_liveness(&mut self) -> Result<(), String> {
        if self.in_flight() || self.live() {
            return Ok(());
        }
        self.marks |= LIVENESS;
        let mut fair = self.clone();
        fair.budget = Budget::default();
        let from = fair.now;
        let until = from + self.setup.liveness_bound;
        loop {
            if fair.live() {
                return Ok(());
            }
            let step = match fair.fair_next() {
                Some(ElectionAction::Wire(c, a)) => fair.wire_step(c, a),
                Some(ElectionAction::Observer(o, a)) => fair.observer_step(o, a),
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
        let (waiting, holders) = fair.waiting_and_holders();
        Err(format!(
            "liveness: from the quiescent state at +{:?}, {waiting} candidates still wait \
             and {holders} hold after {:?} without faults (permits {}); observers agree \
             with etcd: {}",
            from - self.start,
            self.setup.liveness_bound,
            self.setup.permits,
            fair.observers_agree()
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
        for (c, cand) in self.candidates.iter().enumerate() {
            out += &format!(
                "\n  candidate {c}: open {:?}, elected {:?}, holds {:?}, key {:?}, \
                 trusted until {:?}, next deadline {:?}\n    wire {:?}",
                cand.open,
                cand.elected,
                cand.machine.token(),
                cand.machine
                    .my_key()
                    .map(|k| String::from_utf8_lossy(&k).into_owned()),
                cand.machine.session_deadline().map(at),
                cand.machine.poll_timeout().map(at),
                cand.wire
            );
        }
        for (o, observer) in self.observers.iter().enumerate() {
            out += &format!(
                "\n  observer {o}: reported {:?}, next deadline {:?}\n    wire {:?}",
                observer
                    .reported
                    .as_ref()
                    .map(|l| l.as_ref().map(|(k, r)| (String::from_utf8_lossy(k), r))),
                observer.machine.poll_timeout().map(at),
                observer.wire
            );
        }
        out
    }
}
