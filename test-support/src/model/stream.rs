//! The stream world: one or more real [`Append`] machines and one real
//! [`Reader`] on one stream of the model etcd, each behind its own
//! [`Wire`], with users who ask for appends, stop an appender, and a
//! consumer that pauses.
//!
//! Every payload is unique (appender and count), so the store says which
//! append wrote what. No trimming: every entry ever written stays.
//!
//! Safety, checked after every action:
//! 1. **The store is a stream**: the entries are exactly `1..=n` and the
//!    head key says `n` (absent while `n` is 0).
//! 2. **Nothing is invented, nothing stored twice**: every stored payload
//!    is one some appender was asked for, and no payload is stored under
//!    two sequence numbers — however often its transaction was lost,
//!    resent, or landed late.
//! 3. **An acknowledgement is true and lasting**: `Appended { seq,
//!    revision }` answers the appender's oldest unanswered append (answers
//!    come in the order asked, each once), entry `seq` holds its payload
//!    written at `revision`, and stays so from then on.
//! 4. **A failure says what may be stored**: a payload whose append failed
//!    with anything but `Indeterminate` is never stored, then or later; one
//!    that failed `Indeterminate { seq }` is stored, if ever, only as entry
//!    `seq`.
//! 5. **The reader reads the stream**: it delivers entries `1, 2, 3…` in
//!    order without gaps (nothing is trimmed), each with the payload the
//!    store holds under its sequence number; `Live` once; it never fails
//!    and reports no invalid key.
//! 6. **Deadlines never lie in the past**: `poll_timeout()` is never
//!    earlier than the current instant after a step.
//!
//! Liveness, from every quiescent state (nothing in flight): with no
//! further faults or user requests, messages delivered at once, a paused
//! consumer ready again and time moving to each next deadline, within
//! `liveness_bound` every append asked for is answered (appended, or
//! failed with its stated error) and the reader has delivered every stored
//! entry.

use super::wire::{Bends, Taken, Wire, WireAction};
use super::{hash_debug, World};
use crate::ModelEtcd;
use fleetcoord_sm::stream::{
    Append, AppendConfig, AppendInput, AppendNotice, ReadFrom, Reader, ReaderConfig, ReaderInput,
    ReaderNotice, StreamError, StreamKeys,
};
use fleetcoord_sm::{BackoffConfig, Machine, Response, Revision};
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Short names: every key is hashed in its `Debug` form, byte by byte.
const ROOT: &str = "";
const NAME: &str = "s";
const SEED: u64 = 7;

/// How many events of each kind one path may contain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// Appends each appender is asked for.
    pub appends: u32,
    /// Requests, replies or watch streams lost.
    pub lose: u32,
    /// Orphans (requests given up) landing late.
    pub land: u32,
    /// Times time passes while messages are in flight.
    pub delay: u32,
    /// Compactions of the whole history.
    pub compact: u32,
    /// Times the reader's consumer is full (it is ready again at any
    /// time after).
    pub pause: u32,
    /// Appenders stopped (their running and queued appends fail).
    pub stop: u32,
}

/// A world to explore: its size, its faults and what it checks.
#[derive(Clone, Debug)]
pub struct StreamSetup {
    /// Appenders, each behind its own wire.
    pub appenders: usize,
    /// Events per path.
    pub budget: Budget,
    /// Users ask for an append while their appender's requests are in
    /// flight (the appends then go together in the next transaction);
    /// without, only when its wire is quiet.
    pub user_races: bool,
    /// Transactions per append before it fails `Contended`.
    pub max_attempts: u32,
    /// How many times time may pass between a request being given up and
    /// its landing (see [`Wire::age_orphans`]).
    pub land_within: u32,
    /// Time stops here (a quiescent state at the horizon is a leaf).
    pub horizon: Duration,
    /// The liveness bound from every quiescent state.
    pub liveness_bound: Duration,
    /// etcd runs guarded transactions that put keys as if their guard held
    /// (a test that must fail).
    pub strip_put_guards: bool,
    /// Watches never deliver the entries appends write (a test that must
    /// fail, on liveness).
    pub withhold_appends: bool,
}

impl StreamSetup {
    /// `appenders` appending `appends` entries each, 3 attempts per
    /// append, a 400 ms horizon, liveness within 2 s, no faults.
    pub fn new(appenders: usize, appends: u32) -> Self {
        StreamSetup {
            appenders,
            budget: Budget {
                appends,
                ..Budget::default()
            },
            user_races: false,
            max_attempts: 3,
            land_within: 1,
            horizon: Duration::from_millis(400),
            liveness_bound: Duration::from_secs(2),
            strip_put_guards: false,
            withhold_appends: false,
        }
    }

    fn keys() -> StreamKeys {
        StreamKeys::new(ROOT, NAME)
    }

    fn backoff() -> BackoffConfig {
        // No jitter: the seed then decides nothing, and a retry's instant
        // is one state, not a range.
        BackoffConfig {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(200),
            multiplier: 2,
            jitter_percent: 0,
        }
    }

    fn append_config(&self) -> AppendConfig {
        AppendConfig {
            backoff: Self::backoff(),
            max_attempts: self.max_attempts,
            patience: Duration::from_secs(1),
            ..AppendConfig::new(Self::keys())
        }
    }

    fn reader_config(&self) -> ReaderConfig {
        ReaderConfig {
            keys: Self::keys(),
            from: ReadFrom::Start,
            backoff: Self::backoff(),
        }
    }
}

/// Which machine a wire step is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Appender `.0`.
    Appender(usize),
    /// The reader.
    Reader,
}

/// One step of the stream world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamAction {
    /// Appender `.0`'s user asks for one more append.
    Append(usize),
    /// Appender `.0` is stopped.
    Stop(usize),
    /// A step on a machine's wire.
    Wire(Peer, WireAction),
    /// The reader's consumer is full.
    Full,
    /// The reader's consumer has room again.
    Ready,
    /// Time passes to the next deadline, nothing in flight.
    Tick,
    /// Time passes to the next deadline with messages in flight (a fault).
    Delay,
    /// etcd compacts its whole history.
    Compact,
}

#[derive(Clone, Debug)]
struct Appender {
    machine: Append,
    wire: Wire,
    /// Payloads asked for, in order.
    asked: Vec<Vec<u8>>,
    /// How many of `asked` were answered.
    answered: usize,
    /// The revision of its last acknowledged write: a group's appends
    /// share it.
    last_write: Option<Revision>,
    stopped: bool,
}

#[derive(Clone, Debug)]
struct Consumer {
    machine: Reader,
    wire: Wire,
    /// The last sequence number delivered.
    last: u64,
    live: bool,
    paused: bool,
}

/// The stream world; see the module docs for what it checks.
#[derive(Clone)]
pub struct StreamWorld {
    setup: Arc<StreamSetup>,
    keys: Arc<StreamKeys>,
    etcd: ModelEtcd,
    start: Instant,
    now: Instant,
    appenders: Vec<Appender>,
    reader: Consumer,
    budget: Budget,
    /// Appends left to ask for, per appender.
    to_ask: Vec<u32>,
    /// Acknowledged payloads and their sequence numbers (rule 3).
    acked: BTreeMap<Vec<u8>, u64>,
    /// Payloads whose append failed with nothing written (rule 4).
    never: BTreeSet<Vec<u8>>,
    /// Payloads whose append failed `Indeterminate`, and the one sequence
    /// number each may be stored under (rule 4).
    maybe: BTreeMap<Vec<u8>, u64>,
    bends: Bends,
    marks: u32,
}

const ACKED: u32 = 1 << 0;
const GROUPED: u32 = 1 << 1;
const RACE_LOST: u32 = 1 << 2;
const SETTLED: u32 = 1 << 3;
const LANDED: u32 = 1 << 4;
const LANDED_APPLIED: u32 = 1 << 5;
const INDETERMINATE: u32 = 1 << 6;
const CONTENDED: u32 = 1 << 7;
const READ: u32 = 1 << 8;
const COMPACTED: u32 = 1 << 9;
const PAUSED: u32 = 1 << 10;
const STOPPED: u32 = 1 << 11;
const LIVENESS: u32 = 1 << 12;

impl StreamWorld {
    /// Every machine started at one instant; the reader reads from the
    /// start, no append is asked for yet.
    pub fn new(setup: StreamSetup) -> Self {
        let start = Instant::now();
        let keep_orphans = setup.budget.land > 0;
        let appenders = (0..setup.appenders)
            .map(|_| Appender {
                machine: Append::new(setup.append_config(), start, SEED),
                wire: Wire::new(keep_orphans),
                asked: Vec::new(),
                answered: 0,
                last_write: None,
                stopped: false,
            })
            .collect();
        let reader = Consumer {
            machine: Reader::new(setup.reader_config(), start, SEED),
            wire: Wire::new(keep_orphans),
            last: 0,
            live: false,
            paused: false,
        };
        let mut world = StreamWorld {
            budget: Budget {
                appends: 0,
                ..setup.budget.clone()
            },
            to_ask: vec![setup.budget.appends; setup.appenders],
            bends: Bends {
                strip_put_guards: setup.strip_put_guards,
                ..Bends::default()
            },
            keys: Arc::new(StreamSetup::keys()),
            setup: Arc::new(setup),
            etcd: ModelEtcd::new(),
            start,
            now: start,
            appenders,
            reader,
            acked: BTreeMap::new(),
            never: BTreeSet::new(),
            maybe: BTreeMap::new(),
            marks: 0,
        };
        if let Err(message) = world.pump_reader() {
            panic!("the initial world breaks a rule: {message}");
        }
        world
    }

    /// Moves appender `a`'s commands onto its wire, checking every notice.
    fn pump_appender(&mut self, a: usize) -> Result<(), String> {
        while let Some(command) = self.appenders[a].machine.poll_command() {
            if let Some(notice) = self.appenders[a].wire.accept(command) {
                self.append_notice(a, notice)?;
            }
        }
        Ok(())
    }

    /// Moves the reader's commands onto its wire, checking every notice.
    fn pump_reader(&mut self) -> Result<(), String> {
        while let Some(command) = self.reader.machine.poll_command() {
            if let Some(notice) = self.reader.wire.accept(command) {
                self.reader_notice(notice)?;
            }
        }
        Ok(())
    }

    /// Rules 3 and 4 on one answer to an append.
    fn append_notice(&mut self, a: usize, notice: AppendNotice) -> Result<(), String> {
        let app = &mut self.appenders[a];
        let Some(payload) = app.asked.get(app.answered).cloned() else {
            return Err(format!(
                "appender {a} answered an append it was never asked for: {notice:?}"
            ));
        };
        app.answered += 1;
        let shown = String::from_utf8_lossy(&payload).into_owned();
        match notice {
            AppendNotice::Appended { seq, revision } => {
                let stored = self.etcd.get(&self.keys.entry_key(seq));
                match stored {
                    Some(kv) if kv.value == payload && kv.mod_revision == revision => {}
                    found => {
                        return Err(format!(
                            "appender {a} acknowledged {shown} as entry {seq} at revision \
                             {revision}, but etcd has that entry as {found:?}"
                        ))
                    }
                }
                if self.acked.values().any(|s| *s == seq) {
                    return Err(format!(
                        "appender {a} acknowledged {shown} as entry {seq}, acknowledged before"
                    ));
                }
                let app = &mut self.appenders[a];
                if app.last_write == Some(revision) {
                    self.marks |= GROUPED;
                }
                app.last_write = Some(revision);
                self.acked.insert(payload, seq);
                self.marks |= ACKED;
            }
            AppendNotice::Failed(StreamError::Indeterminate { seq, .. }) => {
                self.maybe.insert(payload, seq);
                self.marks |= INDETERMINATE;
            }
            AppendNotice::Failed(error) => {
                if matches!(error, StreamError::Contended { .. }) {
                    self.marks |= CONTENDED;
                }
                self.never.insert(payload);
            }
            other => return Err(format!("appender {a} answered {shown} with {other:?}")),
        }
        Ok(())
    }

    /// Rule 5 on one reader notice.
    fn reader_notice(&mut self, notice: ReaderNotice) -> Result<(), String> {
        match notice {
            ReaderNotice::Entry(entry) => {
                let shown = String::from_utf8_lossy(&entry.payload).into_owned();
                if entry.seq != self.reader.last + 1 {
                    return Err(format!(
                        "the reader delivered entry {} ({shown}) after entry {}",
                        entry.seq, self.reader.last
                    ));
                }
                let stored = self.etcd.get(&self.keys.entry_key(entry.seq));
                if stored.as_ref().map(|kv| &kv.value) != Some(&entry.payload) {
                    return Err(format!(
                        "the reader delivered entry {} as {shown}, but etcd has it as {stored:?}",
                        entry.seq
                    ));
                }
                self.reader.last = entry.seq;
                self.marks |= READ;
            }
            ReaderNotice::Live => {
                if std::mem::replace(&mut self.reader.live, true) {
                    return Err("the reader said Live twice".into());
                }
            }
            other => return Err(format!("the reader said {other:?}")),
        }
        Ok(())
    }

    /// The stored entries, by sequence number.
    fn stored(&self) -> BTreeMap<u64, Vec<u8>> {
        self.etcd
            .range_prefix(self.keys.entry_prefix())
            .into_iter()
            .filter_map(|kv| Some((self.keys.entry_seq(&kv.key)?, kv.value)))
            .collect()
    }

    /// The head's sequence number as stored (0 when absent).
    fn head(&self) -> Result<u64, String> {
        match self.etcd.get(self.keys.head()) {
            None => Ok(0),
            Some(kv) => String::from_utf8_lossy(&kv.value)
                .parse()
                .map_err(|_| format!("the head holds {:?}", kv.value)),
        }
    }

    /// Rules 1–4 on the store, and rule 6.
    fn check(&self) -> Result<(), String> {
        if self.poll_timeouts().any(|t| t < self.now) {
            return Err("a machine's next deadline is in the past".into());
        }
        let stored = self.stored();
        let head = self.head()?;
        let seqs: Vec<u64> = stored.keys().copied().collect();
        let expected: Vec<u64> = (1..=head).collect();
        if seqs != expected {
            return Err(format!(
                "the head says {head} but the stored entries are {seqs:?}"
            ));
        }
        let mut seen: BTreeMap<&[u8], u64> = BTreeMap::new();
        for (seq, payload) in &stored {
            let shown = String::from_utf8_lossy(payload);
            if let Some(first) = seen.insert(payload, *seq) {
                return Err(format!(
                    "{shown} is stored twice, as entries {first} and {seq}"
                ));
            }
            if !self.appenders.iter().any(|a| a.asked.contains(payload)) {
                return Err(format!("entry {seq} holds {shown}, which nobody appended"));
            }
            if self.never.contains(payload) {
                return Err(format!(
                    "entry {seq} holds {shown}, whose append failed with nothing written"
                ));
            }
            if let Some(only) = self.maybe.get(payload).filter(|only| *only != seq) {
                return Err(format!(
                    "entry {seq} holds {shown}, whose append failed naming entry {only}"
                ));
            }
        }
        for (payload, seq) in &self.acked {
            if stored.get(seq) != Some(payload) {
                return Err(format!(
                    "acknowledged {} is no longer entry {seq}",
                    String::from_utf8_lossy(payload)
                ));
            }
        }
        Ok(())
    }

    fn poll_timeouts(&self) -> impl Iterator<Item = Instant> + '_ {
        self.appenders
            .iter()
            .filter_map(|a| a.machine.poll_timeout())
            .chain(self.reader.machine.poll_timeout())
    }

    fn in_flight(&self) -> bool {
        self.appenders
            .iter()
            .map(|a| &a.wire)
            .chain([&self.reader.wire])
            .any(|w| w.in_flight(&self.etcd, &self.bends))
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.poll_timeouts().min()
    }

    fn within_horizon(&self, at: Instant) -> bool {
        at <= self.start + self.setup.horizon
    }

    /// Time passes to `at`: every due machine deadline fires.
    fn tick_to(&mut self, at: Instant) -> Result<(), String> {
        self.now = self.now.max(at);
        let now = self.now;
        let land_within = self.setup.land_within;
        for a in 0..self.appenders.len() {
            let app = &mut self.appenders[a];
            app.wire.age_orphans(land_within);
            if app.machine.poll_timeout().is_some_and(|t| t <= now) {
                app.machine.handle_timeout(now);
            }
            self.pump_appender(a)?;
        }
        self.reader.wire.age_orphans(land_within);
        if self.reader.machine.poll_timeout().is_some_and(|t| t <= now) {
            self.reader.machine.handle_timeout(now);
        }
        self.pump_reader()
    }

    /// A step on `peer`'s wire.
    fn wire_step(&mut self, peer: Peer, action: WireAction) -> Result<(), String> {
        let now = self.now;
        let before = self.etcd.revision();
        let wire = match peer {
            Peer::Appender(a) => &mut self.appenders[a].wire,
            Peer::Reader => &mut self.reader.wire,
        };
        let taken = wire.take(action, &mut self.etcd, now, &self.bends);
        let after = self.etcd.revision();
        if self.setup.withhold_appends && after > before {
            self.bends.hidden.extend(before + 1..=after);
        }
        let reply = match taken {
            Taken::Nothing => return Ok(()),
            Taken::Landed => {
                self.marks |= LANDED;
                if after > before {
                    self.marks |= LANDED_APPLIED;
                }
                return Ok(());
            }
            Taken::Reply(reply) => reply,
        };
        match peer {
            Peer::Appender(a) => {
                let failed_guard = matches!(
                    reply.result,
                    Ok(Response::Txn {
                        succeeded: false,
                        ..
                    })
                );
                let acked = self.acked.len();
                let app = &mut self.appenders[a];
                if app.machine.poll_timeout().is_some_and(|t| t <= now) {
                    app.machine.handle_timeout(now);
                }
                app.machine.handle(now, AppendInput::from(reply));
                self.pump_appender(a)?;
                if failed_guard {
                    self.marks |= if self.acked.len() > acked {
                        SETTLED
                    } else {
                        RACE_LOST
                    };
                }
                Ok(())
            }
            Peer::Reader => {
                if matches!(reply.result, Ok(Response::WatchCanceled { .. })) {
                    self.marks |= COMPACTED;
                }
                let reader = &mut self.reader.machine;
                if reader.poll_timeout().is_some_and(|t| t <= now) {
                    reader.handle_timeout(now);
                }
                reader.handle(now, ReaderInput::from(reply));
                self.pump_reader()
            }
        }
    }

    fn ask(&mut self, a: usize) -> Result<(), String> {
        self.to_ask[a] -= 1;
        let app = &mut self.appenders[a];
        let payload = vec![
            b'a' + u8::try_from(a).unwrap_or(0),
            b'0' + u8::try_from(app.asked.len()).unwrap_or(0),
        ];
        app.asked.push(payload.clone());
        app.machine.handle(self.now, AppendInput::Append(payload));
        self.pump_appender(a)
    }

    /// The fair continuation's next message: the first request to run,
    /// else the first answer to deliver, machine by machine.
    fn fair_next(&self) -> Option<(Peer, WireAction)> {
        let mut actions = Vec::new();
        let wires = self
            .appenders
            .iter()
            .enumerate()
            .map(|(a, app)| (Peer::Appender(a), &app.wire))
            .chain([(Peer::Reader, &self.reader.wire)]);
        for (peer, wire) in wires {
            actions.clear();
            wire.actions(&self.etcd, &self.bends, false, false, &mut actions);
            if let Some(action) = actions.first() {
                return Some((peer, *action));
            }
        }
        None
    }

    fn unanswered(&self) -> usize {
        self.appenders
            .iter()
            .map(|a| a.asked.len() - a.answered)
            .sum()
    }

    fn live(&self) -> bool {
        self.unanswered() == 0 && self.head().is_ok_and(|head| self.reader.last == head)
    }
}

impl World for StreamWorld {
    type Action = StreamAction;

    const MARKS: &'static [&'static str] = &[
        "acknowledged",
        "grouped",
        "race lost",
        "settled by a resend",
        "landed late",
        "landed late and applied",
        "indeterminate",
        "contended",
        "read",
        "watch compacted",
        "paused",
        "stopped",
        "liveness checked",
    ];

    fn actions(&self, out: &mut Vec<StreamAction>) {
        let b = &self.budget;
        for (a, app) in self.appenders.iter().enumerate() {
            let mut wire = Vec::new();
            app.wire
                .actions(&self.etcd, &self.bends, b.lose > 0, b.land > 0, &mut wire);
            out.extend(
                wire.into_iter()
                    .map(|w| StreamAction::Wire(Peer::Appender(a), w)),
            );
            let quiet = !app.wire.in_flight(&self.etcd, &self.bends);
            if self.to_ask[a] > 0 && !app.stopped && (self.setup.user_races || quiet) {
                out.push(StreamAction::Append(a));
            }
            if b.stop > 0 && !app.stopped && app.machine.pending() > 0 {
                out.push(StreamAction::Stop(a));
            }
        }
        let mut wire = Vec::new();
        self.reader
            .wire
            .actions(&self.etcd, &self.bends, b.lose > 0, b.land > 0, &mut wire);
        out.extend(
            wire.into_iter()
                .map(|w| StreamAction::Wire(Peer::Reader, w)),
        );
        if self.reader.paused {
            out.push(StreamAction::Ready);
        } else if b.pause > 0 {
            out.push(StreamAction::Full);
        }
        if b.compact > 0 && self.etcd.revision() > self.etcd.compacted_revision() {
            out.push(StreamAction::Compact);
        }
        if self
            .next_deadline()
            .is_some_and(|at| self.within_horizon(at))
        {
            if !self.in_flight() {
                out.push(StreamAction::Tick);
            } else if b.delay > 0 {
                out.push(StreamAction::Delay);
            }
        }
    }

    fn apply(&mut self, action: &StreamAction) -> Result<(), String> {
        let now = self.now;
        match *action {
            StreamAction::Append(a) => self.ask(a)?,
            StreamAction::Stop(a) => {
                self.budget.stop -= 1;
                self.marks |= STOPPED;
                let app = &mut self.appenders[a];
                app.stopped = true;
                app.machine.handle(now, AppendInput::Stop);
                self.pump_appender(a)?;
            }
            StreamAction::Wire(peer, step) => self.wire_step(peer, step)?,
            StreamAction::Full => {
                self.budget.pause -= 1;
                self.marks |= PAUSED;
                self.reader.paused = true;
                self.reader.machine.handle(now, ReaderInput::ConsumerFull);
                self.pump_reader()?;
            }
            StreamAction::Ready => {
                self.reader.paused = false;
                self.reader.machine.handle(now, ReaderInput::ConsumerReady);
                self.pump_reader()?;
            }
            StreamAction::Tick | StreamAction::Delay => {
                if *action == StreamAction::Delay {
                    self.budget.delay -= 1;
                }
                if let Some(at) = self.next_deadline() {
                    self.tick_to(at)?;
                }
            }
            StreamAction::Compact => {
                self.budget.compact -= 1;
                let revision = self.etcd.revision();
                self.etcd.compact(revision);
            }
        }
        if let StreamAction::Wire(_, WireAction::Lose(_)) = action {
            self.budget.lose -= 1;
        }
        if let StreamAction::Wire(_, WireAction::Land(_)) = action {
            self.budget.land -= 1;
            if self.budget.land == 0 {
                for app in &mut self.appenders {
                    app.wire.forget_orphans();
                }
                self.reader.wire.forget_orphans();
            }
        }
        self.check()
    }

    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        hash_debug(&mut hasher, &self.etcd);
        hash_debug(&mut hasher, &(self.now - self.start));
        hash_debug(&mut hasher, &self.budget);
        hash_debug(&mut hasher, &self.to_ask);
        hash_debug(&mut hasher, &self.acked);
        hash_debug(&mut hasher, &self.never);
        hash_debug(&mut hasher, &self.maybe);
        hash_debug(&mut hasher, &self.bends.hidden);
        // Appenders are told apart by their payloads: no symmetry to fold.
        hash_debug(&mut hasher, &self.appenders);
        hash_debug(&mut hasher, &self.reader);
        hasher.finish()
    }

    fn check_liveness(&mut self) -> Result<(), String> {
        if self.in_flight() || self.live() {
            return Ok(());
        }
        self.marks |= LIVENESS;
        let mut fair = self.clone();
        fair.budget = Budget::default();
        fair.to_ask.iter_mut().for_each(|n| *n = 0);
        let from = fair.now;
        let until = from + self.setup.liveness_bound;
        loop {
            if fair.live() {
                return Ok(());
            }
            let step = if fair.reader.paused {
                fair.apply(&StreamAction::Ready)
            } else {
                match fair.fair_next() {
                    Some((peer, a)) => fair.wire_step(peer, a),
                    None => match fair.next_deadline().filter(|at| *at <= until) {
                        Some(at) => fair.tick_to(at),
                        None => break,
                    },
                }
            };
            step.and_then(|()| fair.check()).map_err(|m| {
                format!(
                    "in the fair continuation from +{:?}: {m}",
                    from - self.start
                )
            })?;
        }
        Err(format!(
            "liveness: from the quiescent state at +{:?}, {} appends are unanswered and the \
             reader is at entry {} of {:?} after {:?} without faults",
            from - self.start,
            fair.unanswered(),
            fair.reader.last,
            fair.head(),
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
        let at = |t: Instant| format!("+{} ms", (t - self.start).as_millis());
        let mut out = format!(
            "  etcd at revision {}, head {:?}:",
            self.etcd.revision(),
            self.head()
        );
        for (seq, payload) in self.stored() {
            out += &format!("\n    entry {seq}: {}", String::from_utf8_lossy(&payload));
        }
        for (a, app) in self.appenders.iter().enumerate() {
            out += &format!(
                "\n  appender {a}: asked {:?}, answered {}, pending {}, next deadline {:?}\n    wire {:?}",
                app.asked
                    .iter()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .collect::<Vec<_>>(),
                app.answered,
                app.machine.pending(),
                app.machine.poll_timeout().map(at),
                app.wire
            );
        }
        out += &format!(
            "\n  reader: last {}, live {}, paused {}, watching {}, next deadline {:?}\n    wire {:?}",
            self.reader.last,
            self.reader.live,
            self.reader.paused,
            self.reader.machine.is_watching(),
            self.reader.machine.poll_timeout().map(at),
            self.reader.wire
        );
        out += &format!(
            "\n  acknowledged {:?}, never {:?}, maybe {:?}",
            self.acked, self.never, self.maybe
        );
        out
    }
}
