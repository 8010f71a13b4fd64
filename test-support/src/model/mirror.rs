//! The mirror world: the real KV-watch [`Mirror`] between a source (a map
//! with versions and its history) and a consumer, where every choice a
//! backend, a server and a consumer can make is an action: the source
//! sets or deletes a key, the backend delivers its next change, loses one,
//! delivers an old one again, says changes were missed, fetches a snapshot
//! (whole, or in entries with a change landing in between), and the
//! consumer reads one notice.
//!
//! The mirror is not a machine talking to etcd; it is a pure core fed by
//! events, so the world has no wire and no time. Keys `a` and `ab` match
//! the watched pattern, `b` does not; values are 0 or 1.
//!
//! Safety, checked after every action, numbered as the mirror's own
//! invariants:
//! 1. **First the snapshot, then `Synced`, then changes**: nothing is
//!    queued before the first snapshot, and `Synced` reaches the consumer
//!    exactly once, after the first snapshot's puts.
//! 2. **The told view follows the source**: the consumer's view plus every
//!    queued notice equals the source's matching content at the mirror's
//!    version, which is never ahead of the source.
//! 3. **Live changes are passed on as they are**: an applied set of a
//!    matching key queues exactly its `Put`, an applied delete queues
//!    `Deleted` exactly when the consumer was told the key holds a value,
//!    and a change of another key queues nothing; `Deleted` only ever
//!    reaches a consumer holding the key, `Put` only of a matching key.
//! 4. **A resync says only the difference**: a snapshot's notices are its
//!    `Deleted`s then its `Put`s, each in key order, none leaving the told
//!    view as it was.
//! 5. **A gap is never papered over**: a change before the first snapshot,
//!    after a skipped version under `Contiguous`, or after `missed` is
//!    answered `Resync`; an old one `Stale`; neither moves the version.
//! 6. **A slow consumer costs bounded memory**: at most `limit` notices of
//!    live changes wait in the queue.
//!
//! Liveness, from every state: once the source changes once more (a key
//! outside the pattern, so that a trailing change lost without notice
//! under `Contiguous` shows as a gap) and the backend does what it must —
//! delivers every change, resyncs when the mirror wants it, lets the
//! consumer read everything — within three rounds the mirror needs no
//! snapshot, the consumer is synced, and its view equals the source's
//! matching content.

use super::{hash_debug, World};
use fleetcoord_sm::mirror::{Mirror, MirrorNotice, Order, Step};
use std::collections::{BTreeMap, VecDeque};
use std::hash::{DefaultHasher, Hasher};
use std::time::Duration;

/// The source's keys: the first two match the pattern.
const KEYS: [&str; 3] = ["a", "ab", "b"];
/// The key outside the pattern the liveness continuation changes.
const HEARTBEAT: &str = "b";

fn matching(key: &str) -> bool {
    key.starts_with('a')
}

/// How many events of each kind one path may contain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// Source changes (sets and deletes).
    pub changes: u32,
    /// Changes lost on the way to the mirror.
    pub lose: u32,
    /// Old changes delivered again (late, or duplicated).
    pub redeliver: u32,
    /// Times the backend says changes were missed (a dropped connection).
    pub missed: u32,
    /// Snapshots the mirror did not ask for (a reconnect).
    pub resync: u32,
    /// Snapshots in entries with a source change landing in between.
    pub split: u32,
}

/// A world to explore: its source, its faults and what it checks.
#[derive(Clone, Debug)]
pub struct MirrorSetup {
    /// What the source's versions promise.
    pub order: Order,
    /// Live notices allowed to wait for the consumer.
    pub limit: usize,
    /// Events per path.
    pub budget: Budget,
    /// The backend says nothing when it loses a change under `Increasing`
    /// (a test that must fail: the mirror cannot see such a hole).
    pub silent_losses: bool,
    /// The liveness continuation makes no last change (a test that must
    /// fail under `Contiguous`: a trailing loss then never shows).
    pub no_heartbeat: bool,
}

impl MirrorSetup {
    /// A mirror of a source with `order`, `limit` live notices, no events.
    pub fn new(order: Order, limit: usize) -> Self {
        MirrorSetup {
            order,
            limit,
            budget: Budget::default(),
            silent_losses: false,
            no_heartbeat: false,
        }
    }
}

/// One step of the mirror world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MirrorAction {
    /// The source sets `KEYS[.0]` to `.1`.
    Set(usize, u8),
    /// The source deletes `KEYS[.0]`.
    Delete(usize),
    /// The backend delivers the next change.
    Deliver,
    /// The backend loses the next change.
    Lose,
    /// The backend delivers the last change delivered or lost again.
    Redeliver,
    /// The backend says changes were missed.
    Missed,
    /// The backend hands over a whole snapshot of the source as it is.
    Snapshot,
    /// A snapshot in entries: the first matching entry, then the source
    /// sets `KEYS[.0]` to `.1` (delivered as an entry too), then the rest.
    Split(usize, u8),
    /// The consumer reads one notice.
    Read,
}

#[derive(Clone, Debug)]
struct Source {
    content: BTreeMap<String, u8>,
    version: u64,
    /// Matching content after each version (index = version).
    history: Vec<BTreeMap<String, u8>>,
    /// Changes in version order: (version, key, value).
    changes: Vec<(u64, String, Option<u8>)>,
    /// Index of the next change not yet delivered or lost.
    next: usize,
}

impl Source {
    fn apply(&mut self, key: &str, value: Option<u8>) {
        self.version += 1;
        match value {
            Some(v) => self.content.insert(key.to_string(), v),
            None => self.content.remove(key),
        };
        self.history.push(filtered(&self.content));
        self.changes.push((self.version, key.to_string(), value));
    }
}

fn filtered(content: &BTreeMap<String, u8>) -> BTreeMap<String, u8> {
    content
        .iter()
        .filter(|(k, _)| matching(k))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// Where a queued notice came from, in queue order (rule 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Snapshot,
    Live,
}

#[derive(Clone, Debug)]
struct Consumer {
    view: BTreeMap<String, u8>,
    synced: bool,
}

impl Consumer {
    /// Rules 1 and 3 on one notice the consumer reads.
    fn take(&mut self, notice: MirrorNotice<u8>) -> Result<(), String> {
        match notice {
            MirrorNotice::Put { key, value } => {
                if !matching(&key) {
                    return Err(format!("a Put of {key}, outside the pattern"));
                }
                self.view.insert(key, value);
            }
            MirrorNotice::Deleted { key } => {
                if self.view.remove(&key).is_none() {
                    return Err(format!("Deleted {key}, which the consumer does not hold"));
                }
            }
            MirrorNotice::Synced => {
                if std::mem::replace(&mut self.synced, true) {
                    return Err("Synced twice".into());
                }
            }
        }
        Ok(())
    }
}

/// The mirror world; see the module docs for what it checks.
#[derive(Clone)]
pub struct MirrorWorld {
    setup: MirrorSetup,
    mirror: Mirror<u8>,
    source: Source,
    consumer: Consumer,
    /// Where each queued notice came from, front first.
    queued: VecDeque<Origin>,
    budget: Budget,
    marks: u32,
}

const SYNCED: u32 = 1 << 0;
const APPLIED: u32 = 1 << 1;
const STALE: u32 = 1 << 2;
const GAP: u32 = 1 << 3;
const BEHIND: u32 = 1 << 4;
const DIFF: u32 = 1 << 5;
const SPLIT: u32 = 1 << 6;
const DELETED: u32 = 1 << 7;

impl MirrorWorld {
    /// An empty source at version 0 and a mirror that has seen nothing.
    pub fn new(setup: MirrorSetup) -> Self {
        MirrorWorld {
            mirror: Mirror::new(setup.order, setup.limit),
            source: Source {
                content: BTreeMap::new(),
                version: 0,
                history: vec![BTreeMap::new()],
                changes: Vec::new(),
                next: 0,
            },
            consumer: Consumer {
                view: BTreeMap::new(),
                synced: false,
            },
            queued: VecDeque::new(),
            budget: setup.budget.clone(),
            setup,
            marks: 0,
        }
    }

    /// The consumer's view once it has read every queued notice, read
    /// from copies; `Err` if a notice breaks rule 1 or 3 on the way.
    fn eventual(&self) -> Result<BTreeMap<String, u8>, String> {
        let mut mirror = self.mirror.clone();
        let mut consumer = self.consumer.clone();
        while let Some(notice) = mirror.poll() {
            consumer.take(notice)?;
        }
        Ok(consumer.view)
    }

    /// The notices queued after the first `skip`, from a copy.
    fn queued_after(&self, skip: usize) -> Vec<MirrorNotice<u8>> {
        let mut mirror = self.mirror.clone();
        for _ in 0..skip {
            mirror.poll();
        }
        std::iter::from_fn(|| mirror.poll()).collect()
    }

    /// Hands change `i` to the mirror; rules 3 and 5 on the answer.
    fn deliver(&mut self, i: usize) -> Result<(), String> {
        let (version, key, value) = self.source.changes[i].clone();
        let at = self.mirror.at();
        let needed = self.mirror.needs_snapshot();
        let before = self.mirror.queued();
        let view = self.eventual()?;
        let step = if matching(&key) {
            self.mirror.change(version, key.clone(), value)
        } else {
            self.mirror.passed(version)
        };
        let expected = match at {
            None => Step::Resync,
            Some(at) if version <= at => Step::Stale,
            Some(_) if needed => Step::Resync,
            Some(at) if self.setup.order == Order::Contiguous && version != at + 1 => {
                self.marks |= GAP;
                Step::Resync
            }
            // A consumer behind is the one more reason for a resync, for
            // a change that has something to tell while notices wait;
            // rule 6 judges how far behind.
            Some(_)
                if step == Step::Resync
                    && matching(&key)
                    && (value.is_some() || view.contains_key(&key))
                    && !self.queued.is_empty() =>
            {
                self.marks |= BEHIND;
                Step::Resync
            }
            Some(_) => Step::Applied,
        };
        if step != expected {
            return Err(format!(
                "change of {key} to {value:?} at version {version}, mirror at {at:?}: \
                 answered {step:?}, {expected:?} expected"
            ));
        }
        let added = self.queued_after(before);
        match step {
            Step::Applied => {
                self.marks |= APPLIED;
                let wanted = match (&value, matching(&key)) {
                    (_, false) => vec![],
                    (Some(v), true) => vec![MirrorNotice::Put {
                        key: key.clone(),
                        value: *v,
                    }],
                    (None, true) if view.contains_key(&key) => {
                        self.marks |= DELETED;
                        vec![MirrorNotice::Deleted { key: key.clone() }]
                    }
                    (None, true) => vec![],
                };
                if added != wanted {
                    return Err(format!(
                        "change of {key} to {value:?} queued {added:?}, {wanted:?} expected"
                    ));
                }
                if self.mirror.at() != Some(version) {
                    return Err(format!(
                        "an applied change at {version} left the mirror at {:?}",
                        self.mirror.at()
                    ));
                }
                self.queued.extend(added.iter().map(|_| Origin::Live));
            }
            Step::Stale | Step::Resync => {
                if step == Step::Stale {
                    self.marks |= STALE;
                }
                if !added.is_empty() || self.mirror.at() != at {
                    return Err(format!(
                        "a change answered {step:?} queued {added:?} and moved the \
                         mirror from {at:?} to {:?}",
                        self.mirror.at()
                    ));
                }
            }
        }
        Ok(())
    }

    /// A snapshot of the source as it is now, whole or (with `split`) in
    /// entries with one more change landing after the first; rule 4 on
    /// what it queues.
    fn snapshot(&mut self, split: Option<(usize, u8)>) -> Result<(), String> {
        let before = self.mirror.queued();
        let view = self.eventual()?;
        let first = self.mirror.at().is_none();
        let entries: Vec<(String, u8)> = filtered(&self.source.content).into_iter().collect();
        let version = self.source.version;
        match split {
            None => self.mirror.snapshot(version, entries),
            Some((k, value)) => {
                self.marks |= SPLIT;
                let key = KEYS[k];
                let mut rest = entries.into_iter();
                if let Some((k0, v0)) = rest.next() {
                    self.mirror.snapshot_entry(version, k0, Some(v0));
                }
                self.source.apply(key, Some(value));
                if matching(key) {
                    self.mirror
                        .snapshot_entry(self.source.version, key.to_string(), Some(value));
                } else {
                    self.mirror.snapshot_seen(self.source.version);
                }
                // A key the change rewrote comes as its newest entry only
                // (a consumer reading the last entry per key).
                for (k1, v1) in rest.filter(|(k1, _)| k1 != key) {
                    self.mirror.snapshot_entry(version, k1, Some(v1));
                }
                self.mirror.snapshot_end(version);
            }
        }
        self.source.next = self.source.changes.len();
        let added = self.queued_after(before);
        let mut told = view;
        let mut puts_began = false;
        let mut last_key: Option<(bool, String)> = None;
        for notice in &added {
            let (is_put, key) = match notice {
                MirrorNotice::Put { key, value } => {
                    if told.get(key) == Some(value) {
                        return Err(format!("a resync repeated {key} = {value}"));
                    }
                    told.insert(key.clone(), *value);
                    (true, key.clone())
                }
                MirrorNotice::Deleted { key } => {
                    if puts_began {
                        return Err(format!("a resync deleted {key} after its puts"));
                    }
                    if told.remove(key).is_none() {
                        return Err(format!("a resync deleted {key}, never told"));
                    }
                    (false, key.clone())
                }
                MirrorNotice::Synced => {
                    if !first {
                        return Err("Synced after a later snapshot".into());
                    }
                    continue;
                }
            };
            puts_began |= is_put;
            if let Some((was_put, last)) = &last_key {
                if *was_put == is_put && *last >= key {
                    return Err(format!("a resync told {key} after {last}"));
                }
            }
            last_key = Some((is_put, key));
        }
        if first {
            self.marks |= SYNCED;
            if added.last() != Some(&MirrorNotice::Synced) {
                return Err(format!(
                    "the first snapshot queued {added:?}, not ending in Synced"
                ));
            }
        } else if !added.is_empty() {
            self.marks |= DIFF;
        }
        self.queued.extend(added.iter().map(|_| Origin::Snapshot));
        Ok(())
    }

    /// Rules 1, 2 and 6 on the whole state.
    fn check(&self) -> Result<(), String> {
        let Some(at) = self.mirror.at() else {
            if self.mirror.queued() > 0 || self.consumer.synced {
                return Err("notices before the first snapshot".into());
            }
            return Ok(());
        };
        if at > self.source.version {
            return Err(format!(
                "the mirror is at version {at}, the source at {}",
                self.source.version
            ));
        }
        let view = self.eventual()?;
        let truth = &self.source.history[usize::try_from(at).unwrap_or(usize::MAX)];
        if view != *truth {
            return Err(format!(
                "the told view {view:?} is not the source's {truth:?} at version {at}"
            ));
        }
        let live = self.queued.iter().filter(|f| **f == Origin::Live).count();
        if live > self.setup.limit {
            return Err(format!(
                "{live} live notices wait, at most {} allowed",
                self.setup.limit
            ));
        }
        if self.queued.len() != self.mirror.queued() {
            return Err(format!(
                "{} notices queued, {} accounted for",
                self.mirror.queued(),
                self.queued.len()
            ));
        }
        Ok(())
    }

    /// The consumer reads every queued notice.
    fn drain(&mut self) -> Result<(), String> {
        while let Some(notice) = self.mirror.poll() {
            self.queued.pop_front();
            self.consumer.take(notice)?;
        }
        Ok(())
    }
}

impl World for MirrorWorld {
    type Action = MirrorAction;

    const MARKS: &'static [&'static str] = &[
        "synced",
        "applied",
        "stale ignored",
        "gap",
        "consumer behind",
        "resync diff",
        "snapshot in entries",
        "deleted",
    ];

    fn actions(&self, out: &mut Vec<MirrorAction>) {
        let b = &self.budget;
        if b.changes > 0 {
            for (k, key) in KEYS.iter().enumerate() {
                for v in 0..2 {
                    out.push(MirrorAction::Set(k, v));
                }
                if self.source.content.contains_key(*key) {
                    out.push(MirrorAction::Delete(k));
                }
            }
        }
        let undelivered = self.source.next < self.source.changes.len();
        if undelivered {
            out.push(MirrorAction::Deliver);
            if b.lose > 0 {
                out.push(MirrorAction::Lose);
            }
        }
        if b.redeliver > 0 && self.source.next > 0 {
            out.push(MirrorAction::Redeliver);
        }
        if b.missed > 0 && self.mirror.at().is_some() {
            out.push(MirrorAction::Missed);
        }
        if self.mirror.wants_snapshot() || b.resync > 0 {
            out.push(MirrorAction::Snapshot);
        }
        if b.split > 0 && (self.mirror.wants_snapshot() || b.resync > 0) {
            for k in 0..KEYS.len() {
                for v in 0..2 {
                    out.push(MirrorAction::Split(k, v));
                }
            }
        }
        if self.mirror.queued() > 0 {
            out.push(MirrorAction::Read);
        }
    }

    fn apply(&mut self, action: &MirrorAction) -> Result<(), String> {
        // A snapshot the mirror asked for is the backend's duty, not a
        // fault; only unasked ones spend the budget.
        let asked = self.mirror.wants_snapshot();
        match *action {
            MirrorAction::Set(k, v) => {
                self.budget.changes -= 1;
                self.source.apply(KEYS[k], Some(v));
            }
            MirrorAction::Delete(k) => {
                self.budget.changes -= 1;
                self.source.apply(KEYS[k], None);
            }
            MirrorAction::Deliver => {
                let i = self.source.next;
                self.source.next += 1;
                self.deliver(i)?;
            }
            MirrorAction::Lose => {
                self.budget.lose -= 1;
                self.source.next += 1;
                if self.setup.order == Order::Increasing && !self.setup.silent_losses {
                    // Holes mean nothing there: the backend must say so.
                    self.mirror.missed();
                }
            }
            MirrorAction::Redeliver => {
                self.budget.redeliver -= 1;
                self.deliver(self.source.next - 1)?;
            }
            MirrorAction::Missed => {
                self.budget.missed -= 1;
                self.mirror.missed();
            }
            MirrorAction::Snapshot => {
                if !asked {
                    self.budget.resync -= 1;
                }
                self.snapshot(None)?;
            }
            MirrorAction::Split(k, v) => {
                if !asked {
                    self.budget.resync -= 1;
                }
                self.budget.split -= 1;
                self.snapshot(Some((k, v)))?;
            }
            MirrorAction::Read => {
                if let Some(notice) = self.mirror.poll() {
                    self.queued.pop_front();
                    self.consumer.take(notice)?;
                }
            }
        }
        self.check()
    }

    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        hash_debug(&mut hasher, &self.mirror);
        hash_debug(&mut hasher, &self.source.content);
        hash_debug(&mut hasher, &self.source.version);
        // What an old change redelivered, and what the told view is judged
        // against, depend on the history behind the mirror.
        hash_debug(&mut hasher, &self.source.changes);
        hash_debug(&mut hasher, &self.source.next);
        hash_debug(&mut hasher, &self.consumer);
        hash_debug(&mut hasher, &self.queued);
        hash_debug(&mut hasher, &self.budget);
        hasher.finish()
    }

    fn check_liveness(&mut self) -> Result<(), String> {
        let mut quiet = self.clone();
        if !self.setup.no_heartbeat {
            quiet.source.apply(HEARTBEAT, Some(0));
        }
        let fail = |m: String| format!("in the quiet continuation: {m}");
        for _ in 0..3 {
            while quiet.source.next < quiet.source.changes.len() {
                let i = quiet.source.next;
                quiet.source.next += 1;
                quiet.deliver(i).map_err(fail)?;
                quiet.drain().map_err(fail)?;
            }
            quiet.drain().map_err(fail)?;
            if quiet.mirror.wants_snapshot() {
                quiet.snapshot(None).map_err(fail)?;
            }
            quiet.drain().map_err(fail)?;
            quiet.check().map_err(fail)?;
        }
        let truth = filtered(&quiet.source.content);
        if quiet.mirror.needs_snapshot() || !quiet.consumer.synced || quiet.consumer.view != truth {
            return Err(format!(
                "liveness: once quiet the consumer holds {:?} (synced {}), the source {truth:?} \
                 (the mirror needs a snapshot: {})",
                quiet.consumer.view,
                quiet.consumer.synced,
                quiet.mirror.needs_snapshot()
            ));
        }
        Ok(())
    }

    fn elapsed(&self) -> Duration {
        Duration::ZERO
    }

    fn take_marks(&mut self) -> u32 {
        std::mem::take(&mut self.marks)
    }

    fn describe(&self) -> String {
        format!(
            "  source at version {}: {:?}\n  changes {:?}, next {}\n  mirror {:?}\n  \
             consumer {:?}",
            self.source.version,
            self.source.content,
            self.source.changes,
            self.source.next,
            self.mirror,
            self.consumer
        )
    }
}
