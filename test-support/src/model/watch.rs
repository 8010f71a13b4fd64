//! The watch world: one real [`Watch`] machine on a prefix, behind a
//! [`Wire`] to the model etcd, with a writer whose puts and deletes of a
//! few keys are actions of their own, so every write lands at every point
//! of every snapshot and watch: between pages, before and after a watch
//! starts, while its stream is lost or the consumer is stalled, around a
//! compaction. There is no delay action: the machine arms no deadline
//! while a request is out, so time passing with messages in flight would
//! change nothing but the clock, and every order of runs and deliveries is
//! explored already.
//!
//! Safety, checked after every action, on the notices alone (the consumer's
//! view, rebuilt from them as the simulation does):
//! 1. **Nothing invented**: an `Up` or `Updated` carries a key under the
//!    prefix exactly as the store wrote it at its mod revision; an `Up` names a key not in
//!    the view, an `Updated` a key in it with the same create revision and
//!    a newer mod revision.
//! 2. **Nothing taken back without cause**: a `Down` names a key in the
//!    view, carries exactly its last-seen state, and that state is no
//!    longer etcd's (deleted, or written again since).
//! 3. **One `Synced`**, and no notice the prefix cannot produce (`Left`,
//!    `InvalidKey`, `Failed`: every key is valid and every error
//!    retryable).
//! 4. **`known()` is the view**: the machine's own account of what it told
//!    equals the view rebuilt from the notices.
//! 5. **One request at a time**, and deadlines never in the past.
//! 6. **A compacted watch resyncs at once**: once the machine handles a
//!    `WatchCanceled`, it has asked for a fresh snapshot.
//! 7. **Quiet means converged**: whenever nothing is in flight, no retry
//!    is armed and the consumer is not stalled, the view equals etcd's
//!    prefix and the watch is live.
//!
//! Liveness, from every quiescent state (nothing in flight): with no
//! further faults or writes, a stalled consumer draining at once, messages
//! delivered at once and time moving to each next deadline, within
//! `liveness_bound` the world is quiet (and so, by rule 7, converged).

use super::wire::{Bends, Taken, Wire, WireAction};
use super::{hash_debug, World};
use crate::ModelEtcd;
use fleetcoord_sm::watch::{KeyRule, Watch, WatchConfig, WatchInput, WatchNotice};
use fleetcoord_sm::{
    BackoffConfig, Command, KeyRange, KeyValue, Machine, Request, Response, Revision, RpcId,
};
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The watched prefix.
const PREFIX: &[u8] = b"/w/";
/// Next to the prefix but outside it: the first key after its range.
const NEIGHBOUR: &[u8] = b"/w0";
const SEED: u64 = 5;

/// The writer's keys under the prefix, in order.
const KEYS: [&[u8]; 3] = [b"/w/a", b"/w/b", b"/w/c"];

/// How many faults and writes of each kind one path may contain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// The writer's puts and deletes.
    pub writes: u32,
    /// Requests, replies or watch streams lost.
    pub lose: u32,
    /// Compactions of the whole history.
    pub compact: u32,
    /// Times the consumer stalls (it drains again at any later point).
    pub stall: u32,
}

/// A world to explore: its size, its faults and what it checks.
#[derive(Clone, Debug)]
pub struct WatchSetup {
    /// How many of the writer's keys (`/w/a`, `/w/b`, `/w/c`) it writes.
    pub keys: usize,
    /// Of those, how many exist before the watch starts.
    pub initial: usize,
    /// The writer also writes `/w0`, the first key past the prefix.
    pub neighbour: bool,
    /// The machine's snapshot page size.
    pub page_size: i64,
    /// Writes and faults per path.
    pub budget: Budget,
    /// Time stops here (time only passes for retry backoffs).
    pub horizon: Duration,
    /// The liveness bound from every quiescent state.
    pub liveness_bound: Duration,
    /// The revision of the writer's `n`-th write (1-based) never reaches
    /// a watch (a test that must fail, on rule 7).
    pub hide_write: Option<u32>,
    /// A stalled consumer never drains (a test that must fail, on
    /// liveness).
    pub consumer_never_ready: bool,
}

impl WatchSetup {
    /// The writer on `keys` keys, `initial` of them present before the
    /// watch starts, pages of one key, no writes or faults, a 10 s
    /// horizon, liveness within 3 s.
    pub fn new(keys: usize, initial: usize) -> Self {
        WatchSetup {
            keys: keys.min(KEYS.len()),
            initial: initial.min(keys),
            neighbour: false,
            page_size: 1,
            budget: Budget::default(),
            horizon: Duration::from_secs(10),
            liveness_bound: Duration::from_secs(3),
            hide_write: None,
            consumer_never_ready: false,
        }
    }

    fn config(&self) -> WatchConfig {
        WatchConfig {
            prefix: PREFIX.to_vec(),
            keys: KeyRule::Any,
            backoff: BackoffConfig {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(800),
                multiplier: 2,
                jitter_percent: 0,
            },
            page_size: self.page_size,
        }
    }

    /// Every key the writer writes.
    fn writer_keys(&self) -> Vec<&'static [u8]> {
        let mut keys = KEYS[..self.keys].to_vec();
        if self.neighbour {
            keys.push(NEIGHBOUR);
        }
        keys
    }
}

/// One step of the watch world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchAction {
    /// A step on the machine's wire.
    Wire(WireAction),
    /// Time passes to the machine's next deadline, nothing in flight.
    Tick,
    /// The writer puts its key `.0` (see [`WatchSetup::keys`]; the last is
    /// `/w0` with [`WatchSetup::neighbour`]).
    Put(usize),
    /// The writer deletes its key `.0`, which exists.
    Delete(usize),
    /// etcd compacts its whole history.
    Compact,
    /// The consumer's channel fills up.
    Full,
    /// The consumer drains.
    Ready,
}

/// The consumer: what the notices told (rules 1–3).
#[derive(Clone, Debug, Default)]
struct Consumer {
    view: BTreeMap<Vec<u8>, KeyValue>,
    synced: u32,
}

/// The watch world; see the module docs for what it checks.
#[derive(Clone)]
pub struct WatchWorld {
    setup: Arc<WatchSetup>,
    etcd: ModelEtcd,
    start: Instant,
    now: Instant,
    machine: Watch,
    wire: Wire,
    consumer: Consumer,
    /// Requests issued and not yet ended (rule 5).
    outstanding: BTreeSet<RpcId>,
    stalled: bool,
    budget: Budget,
    /// Writes taken so far.
    writes: u32,
    /// Every state the store ever wrote, by key and mod revision (rule 1).
    /// Not in the fingerprint: every key a machine can report is in it
    /// alike on every path to one state.
    written: Arc<BTreeMap<(Vec<u8>, Revision), KeyValue>>,
    bends: Bends,
    marks: u32,
}

const UP: u32 = 1 << 0;
const UPDATED: u32 = 1 << 1;
const DOWN: u32 = 1 << 2;
const SYNCED: u32 = 1 << 3;
const WATCH_COMPACTED: u32 = 1 << 4;
const PAGE_COMPACTED: u32 = 1 << 5;
const RESYNCED: u32 = 1 << 6;
const STALLED: u32 = 1 << 7;
const LOST: u32 = 1 << 8;
const QUIET: u32 = 1 << 9;
const LIVENESS: u32 = 1 << 10;

impl WatchWorld {
    /// The writer's initial keys written, then the machine started.
    pub fn new(setup: WatchSetup) -> Self {
        let start = Instant::now();
        let mut world = WatchWorld {
            machine: Watch::new(setup.config(), start, SEED),
            budget: setup.budget.clone(),
            setup: Arc::new(setup),
            etcd: ModelEtcd::new(),
            start,
            now: start,
            wire: Wire::new(false),
            consumer: Consumer::default(),
            outstanding: BTreeSet::new(),
            stalled: false,
            writes: 0,
            written: Arc::new(BTreeMap::new()),
            bends: Bends::default(),
            marks: 0,
        };
        for key in &KEYS[..world.setup.initial] {
            world.put(key);
        }
        if let Err(message) = world.pump() {
            panic!("the initial world breaks a rule: {message}");
        }
        world
    }

    /// Runs one writer request at etcd and logs what it wrote.
    fn write(&mut self, request: &Request) {
        let before = self.etcd.revision();
        // A put without a lease and a delete always succeed.
        let _ = self.etcd.execute(self.now, request);
        let revision = self.etcd.revision();
        if revision == before {
            return;
        }
        if let Request::Put { key, .. } = request {
            if let Some(kv) = self.etcd.get(key) {
                Arc::make_mut(&mut self.written).insert((key.clone(), revision), kv);
            }
        }
    }

    fn put(&mut self, key: &[u8]) {
        let value = format!("{}", self.writes).into_bytes();
        self.write(&Request::Put {
            key: key.to_vec(),
            value,
            lease: 0,
        });
    }

    /// Moves the machine's commands onto the wire, checking every notice;
    /// `Ok(whether it asked for a snapshot page)`.
    fn pump(&mut self) -> Result<bool, String> {
        let mut ranged = false;
        while let Some(command) = self.machine.poll_command() {
            match &command {
                Command::Rpc { id, request } => {
                    if !self.outstanding.is_empty() {
                        return Err(format!(
                            "two requests outstanding: {:?} and {request:?}",
                            self.outstanding
                        ));
                    }
                    self.outstanding.insert(*id);
                    if matches!(request, Request::Range(_)) {
                        ranged = true;
                        if self.consumer.synced > 0 {
                            self.marks |= RESYNCED;
                        }
                    }
                }
                Command::Cancel { id } => {
                    self.outstanding.remove(id);
                }
                Command::Notify(_) => {}
            }
            if let Some(notice) = self.wire.accept(command) {
                self.notice(notice)?;
            }
        }
        Ok(ranged)
    }

    /// Rules 1–3 on one notice.
    fn notice(&mut self, notice: WatchNotice) -> Result<(), String> {
        let view = &mut self.consumer.view;
        match notice {
            WatchNotice::Up(kv) | WatchNotice::Updated(kv)
                if !kv.key.starts_with(PREFIX)
                    || self.written.get(&(kv.key.clone(), kv.mod_revision)) != Some(&kv) =>
            {
                Err(format!(
                    "told {kv:?}, which the store never wrote under the prefix"
                ))
            }
            WatchNotice::Up(kv) => {
                if view.contains_key(&kv.key) {
                    return Err(format!("Up for a key already up: {kv:?}"));
                }
                view.insert(kv.key.clone(), kv);
                self.marks |= UP;
                Ok(())
            }
            WatchNotice::Updated(kv) => {
                match view.get(&kv.key) {
                    Some(before)
                        if before.create_revision == kv.create_revision
                            && before.mod_revision < kv.mod_revision => {}
                    before => {
                        return Err(format!("Updated {kv:?} over {before:?}"));
                    }
                }
                view.insert(kv.key.clone(), kv);
                self.marks |= UPDATED;
                Ok(())
            }
            WatchNotice::Down(kv) => {
                if view.get(&kv.key) != Some(&kv) {
                    return Err(format!(
                        "Down {kv:?}, but the view has {:?}",
                        view.get(&kv.key)
                    ));
                }
                if self.etcd.get(&kv.key).as_ref() == Some(&kv) {
                    return Err(format!("Down {kv:?}, which etcd still has"));
                }
                view.remove(&kv.key);
                self.marks |= DOWN;
                Ok(())
            }
            WatchNotice::Synced => {
                self.consumer.synced += 1;
                self.marks |= SYNCED;
                if self.consumer.synced > 1 {
                    return Err("Synced twice".into());
                }
                Ok(())
            }
            other => Err(format!("a notice this prefix cannot produce: {other:?}")),
        }
    }

    /// Nothing will happen unless the world acts: nothing in flight, no
    /// retry armed, the consumer draining.
    fn quiet(&self) -> bool {
        !self.stalled
            && !self.wire.in_flight(&self.etcd, &self.bends)
            && self.machine.poll_timeout().is_none()
    }

    /// Rules 4, 5 and 7.
    fn check(&mut self) -> Result<(), String> {
        if self.machine.poll_timeout().is_some_and(|t| t < self.now) {
            return Err("the machine's next deadline is in the past".into());
        }
        let known: Vec<&KeyValue> = self.machine.known().collect();
        let view: Vec<&KeyValue> = self.consumer.view.values().collect();
        if known != view {
            return Err(format!(
                "known() differs from the notices: {known:?} against {view:?}"
            ));
        }
        if self.quiet() {
            self.marks |= QUIET;
            let expected = self.etcd.range_prefix(PREFIX);
            let view: Vec<KeyValue> = self.consumer.view.values().cloned().collect();
            if view != expected || !self.machine.is_live() || self.consumer.synced != 1 {
                return Err(format!(
                    "quiet, but the view differs from etcd (live {}, synced {}):\n    view {}\n    etcd {}",
                    self.machine.is_live(),
                    self.consumer.synced,
                    show(&view),
                    show(&expected)
                ));
            }
        }
        Ok(())
    }

    /// A step on the wire, with rule 6 for what it delivers.
    fn wire_step(&mut self, action: WireAction) -> Result<(), String> {
        let now = self.now;
        let taken = self.wire.take(action, &mut self.etcd, now, &self.bends);
        let Taken::Reply(reply) = taken else {
            return Ok(());
        };
        let canceled = matches!(reply.result, Ok(Response::WatchCanceled { .. }));
        match &reply.result {
            Ok(Response::WatchEvents { .. }) => {}
            Ok(Response::WatchCanceled { .. }) => {
                self.marks |= WATCH_COMPACTED;
                self.outstanding.remove(&reply.id);
            }
            Err(fleetcoord_sm::RpcError::Compacted { .. }) => {
                self.marks |= PAGE_COMPACTED;
                self.outstanding.remove(&reply.id);
            }
            _ => {
                self.outstanding.remove(&reply.id);
            }
        }
        if self.machine.poll_timeout().is_some_and(|t| t <= now) {
            self.machine.handle_timeout(now);
        }
        self.machine.handle(now, reply.into());
        let ranged = self.pump()?;
        if canceled && !ranged {
            return Err("a watch canceled for compaction did not resync at once".into());
        }
        Ok(())
    }

    fn tick_to(&mut self, at: Instant) -> Result<(), String> {
        self.now = self.now.max(at);
        if self.machine.poll_timeout().is_some_and(|t| t <= self.now) {
            self.machine.handle_timeout(self.now);
        }
        self.pump().map(drop)
    }

    /// The fair continuation's next step: drain the consumer, else the
    /// first request to run or answer to deliver.
    fn fair_next(&self) -> Option<WatchAction> {
        if self.stalled && !self.setup.consumer_never_ready {
            return Some(WatchAction::Ready);
        }
        let mut actions = Vec::new();
        self.wire
            .actions(&self.etcd, &self.bends, false, false, &mut actions);
        actions.first().map(|a| WatchAction::Wire(*a))
    }

    fn consumer_input(&mut self, input: WatchInput) -> Result<(), String> {
        self.machine.handle(self.now, input);
        self.pump().map(drop)
    }
}

/// Keys with their create and mod revisions, for a counterexample's reader.
fn show<'a>(kvs: impl IntoIterator<Item = &'a KeyValue>) -> String {
    let kvs: Vec<String> = kvs
        .into_iter()
        .map(|kv| {
            format!(
                "{}@{}/{}",
                String::from_utf8_lossy(&kv.key),
                kv.create_revision,
                kv.mod_revision
            )
        })
        .collect();
    format!("[{}]", kvs.join(", "))
}

impl World for WatchWorld {
    type Action = WatchAction;

    const MARKS: &'static [&'static str] = &[
        "up",
        "updated",
        "down",
        "synced",
        "watch compacted",
        "page compacted",
        "resynced",
        "stalled",
        "lost",
        "quiet checked",
        "liveness checked",
    ];

    fn actions(&self, out: &mut Vec<WatchAction>) {
        let b = &self.budget;
        let mut wire = Vec::new();
        self.wire
            .actions(&self.etcd, &self.bends, b.lose > 0, false, &mut wire);
        out.extend(wire.into_iter().map(WatchAction::Wire));
        if b.writes > 0 {
            for (k, key) in self.setup.writer_keys().into_iter().enumerate() {
                out.push(WatchAction::Put(k));
                if self.etcd.get(key).is_some() {
                    out.push(WatchAction::Delete(k));
                }
            }
        }
        if b.compact > 0 && self.etcd.revision() > self.etcd.compacted_revision() {
            out.push(WatchAction::Compact);
        }
        if self.stalled {
            if !self.setup.consumer_never_ready {
                out.push(WatchAction::Ready);
            }
        } else if b.stall > 0 {
            out.push(WatchAction::Full);
        }
        let due = self
            .machine
            .poll_timeout()
            .is_some_and(|at| at <= self.start + self.setup.horizon);
        if due && !self.wire.in_flight(&self.etcd, &self.bends) {
            out.push(WatchAction::Tick);
        }
    }

    fn apply(&mut self, action: &WatchAction) -> Result<(), String> {
        match *action {
            WatchAction::Wire(step) => {
                if let WireAction::Lose(_) = step {
                    self.budget.lose -= 1;
                    self.marks |= LOST;
                }
                self.wire_step(step)?;
            }
            WatchAction::Tick => {
                if let Some(at) = self.machine.poll_timeout() {
                    self.tick_to(at)?;
                }
            }
            WatchAction::Put(k) | WatchAction::Delete(k) => {
                self.budget.writes -= 1;
                self.writes += 1;
                let key = self.setup.writer_keys()[k];
                let before = self.etcd.revision();
                if let WatchAction::Put(_) = action {
                    self.put(key);
                } else {
                    self.write(&Request::Delete(KeyRange::Key(key.to_vec())));
                }
                if self.setup.hide_write == Some(self.writes) {
                    self.bends.hidden.extend(before + 1..=self.etcd.revision());
                }
            }
            WatchAction::Compact => {
                self.budget.compact -= 1;
                let revision = self.etcd.revision();
                self.etcd.compact(revision);
            }
            WatchAction::Full => {
                self.budget.stall -= 1;
                self.stalled = true;
                self.marks |= STALLED;
                self.consumer_input(WatchInput::ConsumerFull)?;
            }
            WatchAction::Ready => {
                self.stalled = false;
                self.consumer_input(WatchInput::ConsumerReady)?;
            }
        }
        self.check()
    }

    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        hash_debug(&mut hasher, &self.etcd);
        hash_debug(&mut hasher, &(self.now - self.start));
        hash_debug(&mut hasher, &self.budget);
        hash_debug(&mut hasher, &self.machine);
        hash_debug(&mut hasher, &self.wire);
        hash_debug(&mut hasher, &self.consumer);
        hash_debug(&mut hasher, &self.outstanding);
        hash_debug(&mut hasher, &self.stalled);
        hash_debug(&mut hasher, &self.bends.hidden);
        hasher.finish()
    }

    fn check_liveness(&mut self) -> Result<(), String> {
        if self.wire.in_flight(&self.etcd, &self.bends) || self.quiet() {
            return Ok(());
        }
        self.marks |= LIVENESS;
        let mut fair = self.clone();
        fair.budget = Budget::default();
        let from = fair.now;
        let until = from + self.setup.liveness_bound;
        loop {
            if fair.quiet() {
                // Rule 7 has judged the view.
                return Ok(());
            }
            let step = match fair.fair_next() {
                Some(WatchAction::Ready) => {
                    fair.stalled = false;
                    fair.consumer_input(WatchInput::ConsumerReady)
                }
                Some(WatchAction::Wire(a)) => fair.wire_step(a),
                _ => match fair.machine.poll_timeout().filter(|at| *at <= until) {
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
            "liveness: from the quiescent state at +{:?}, not quiet after {:?} without faults \
             (stalled {}, live {}, next deadline {:?})",
            from - self.start,
            self.setup.liveness_bound,
            fair.stalled,
            fair.machine.is_live(),
            fair.machine.poll_timeout().map(|t| t - self.start)
        ))
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn take_marks(&mut self) -> u32 {
        std::mem::take(&mut self.marks)
    }

    fn describe(&self) -> String {
        format!(
            "  etcd at revision {} (compacted {}, hidden {:?}): {}\n  view (synced {}): {}\n  \
             machine live {}, stalled {}, next deadline {:?}\n  wire {:?}",
            self.etcd.revision(),
            self.etcd.compacted_revision(),
            self.bends.hidden,
            show(&self.etcd.range_prefix(b"")),
            self.consumer.synced,
            show(self.consumer.view.values()),
            self.machine.is_live(),
            self.stalled,
            self.machine.poll_timeout().map(|t| t - self.start),
            self.wire
        )
    }
}
