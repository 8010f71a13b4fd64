//! Fuzz the KV-watch mirror (`fleetcoord_sm::mirror`) against a `BTreeMap`
//! model of the source.
//!
//! The source is a map with a version counter and its whole history.
//! Operations change it (set, delete, keys inside and outside the watched
//! pattern), deliver its changes to the mirror in order, lose them (under
//! `Contiguous` a lost change is a silent gap; under `Increasing` the
//! backend must say `missed`), redeliver old ones, say `missed`, hand the
//! mirror a snapshot (whole, or in entries as NATS does, possibly with a
//! change arriving in between), and let the consumer read some notices.
//! After every step:
//! * the consumer's view, plus the notices still queued, equals the
//!   source's matching content at the mirror's version;
//! * nothing before the first snapshot; `Synced` exactly once, after the
//!   first snapshot's puts; `Deleted` only for a key the consumer holds;
//!   a snapshot's diff never repeats what the consumer holds.
//!
//! At the end one more change happens and the backend does what it must
//! (deliver everything, resync when the mirror wants it, drain): the
//! consumer's view then equals the source's matching content (the mirror
//! converges).

#![no_main]

use arbitrary::Arbitrary;
use fleetcoord_sm::mirror::{Mirror, MirrorNotice, Order, Step};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;

const KEYS: [&str; 6] = ["a", "ab", "ac", "b", "ba", "c"];

/// The watched pattern: keys starting with `a`.
fn matching(key: &str) -> bool {
    key.starts_with('a')
}

#[derive(Arbitrary, Debug)]
enum Op {
    Set {
        key: u8,
        value: u8,
    },
    Delete {
        key: u8,
    },
    /// Deliver the next undelivered change.
    Deliver,
    /// Lose the next undelivered change.
    Lose,
    /// Deliver an earlier change again (or late, if it was lost).
    Redeliver {
        back: u8,
    },
    Missed,
    /// A whole snapshot of the source as it is now.
    Snapshot,
    /// A snapshot in entries; `split` entries, then a source change
    /// delivered as an entry too (as a NATS consumer sees it), then the rest.
    SnapshotInEntries {
        split: u8,
        change: Option<(u8, u8)>,
    },
    /// The consumer reads up to `n` notices.
    Read {
        n: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    contiguous: bool,
    limit: u8,
    ops: Vec<Op>,
}

struct Source {
    content: BTreeMap<String, u8>,
    version: u64,
    /// Content after each version (index = version).
    history: Vec<BTreeMap<String, u8>>,
    /// Changes in version order: (version, key, value).
    changes: Vec<(u64, String, Option<u8>)>,
    /// Index into `changes` of the next one not yet delivered or lost.
    next: usize,
}

impl Source {
    fn apply(&mut self, key: &str, value: Option<u8>) {
        self.version += 1;
        match value {
            Some(v) => {
                self.content.insert(key.to_string(), v);
            }
            None => {
                self.content.remove(key);
            }
        }
        self.history.push(self.content.clone());
        self.changes.push((self.version, key.to_string(), value));
    }

    fn matching_at(&self, version: u64) -> BTreeMap<String, u8> {
        let state = usize::try_from(version)
            .ok()
            .and_then(|v| self.history.get(v))
            .expect("a version the source had");
        filtered(state)
    }
}

fn filtered(state: &BTreeMap<String, u8>) -> BTreeMap<String, u8> {
    state
        .iter()
        .filter(|(k, _)| matching(k))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

struct Consumer {
    view: BTreeMap<String, u8>,
    synced: bool,
}

impl Consumer {
    fn read(&mut self, mirror: &mut Mirror<u8>, n: usize) {
        for _ in 0..n {
            let Some(notice) = mirror.poll() else { return };
            self.take(notice);
        }
    }

    fn take(&mut self, notice: MirrorNotice<u8>) {
        match notice {
            MirrorNotice::Put { key, value } => {
                assert!(matching(&key), "put of a key outside the pattern: {key}");
                self.view.insert(key, value);
            }
            MirrorNotice::Deleted { key } => {
                assert!(
                    self.view.remove(&key).is_some(),
                    "Deleted for {key}, which the consumer does not hold"
                );
            }
            MirrorNotice::Synced => {
                assert!(!self.synced, "Synced twice");
                self.synced = true;
            }
        }
    }
}

/// The consumer's view once it has read everything queued, read from a
/// copy so the real queue is left alone; also checks the queue's shape.
fn eventual(consumer: &Consumer, mirror: &Mirror<u8>) -> BTreeMap<String, u8> {
    let mut copy = mirror.clone();
    let mut view = Consumer {
        view: consumer.view.clone(),
        synced: consumer.synced,
    };
    while let Some(n) = copy.poll() {
        view.take(n);
    }
    view.view
}

fuzz_target!(|input: Input| {
    let order = if input.contiguous {
        Order::Contiguous
    } else {
        Order::Increasing
    };
    let limit = usize::from(input.limit % 5).max(1);
    let mut mirror = Mirror::<u8>::new(order, limit);
    let mut source = Source {
        content: BTreeMap::new(),
        version: 0,
        history: vec![BTreeMap::new()],
        changes: Vec::new(),
        next: 0,
    };
    let mut consumer = Consumer {
        view: BTreeMap::new(),
        synced: false,
    };
    for op in input.ops.iter().take(300) {
        let told_before = eventual(&consumer, &mirror);
        let queued_before = mirror.queued();
        let mut snapshot_taken = false;
        match op {
            Op::Set { key, value } => {
                source.apply(KEYS[usize::from(*key) % KEYS.len()], Some(*value));
            }
            Op::Delete { key } => {
                source.apply(KEYS[usize::from(*key) % KEYS.len()], None);
            }
            Op::Deliver => {
                if let Some((v, k, val)) = source.changes.get(source.next).cloned() {
                    source.next += 1;
                    let m = matching(&k);
                    let step = if m {
                        mirror.change(v, k, val)
                    } else {
                        mirror.passed(v)
                    };
                    if mirror.at().is_none() {
                        assert_eq!(step, Step::Resync, "a change before any snapshot");
                    }
                }
            }
            Op::Lose => {
                if source.next < source.changes.len() {
                    source.next += 1;
                    if order == Order::Increasing {
                        // Holes mean nothing there: the backend must say so.
                        mirror.missed();
                    }
                }
            }
            Op::Redeliver { back } => {
                let back = usize::from(*back) + 1;
                if let Some(i) = source.next.checked_sub(back) {
                    let (v, k, val) = source.changes[i].clone();
                    let m = matching(&k);
                    let at = mirror.at();
                    let step = if m {
                        mirror.change(v, k, val)
                    } else {
                        mirror.passed(v)
                    };
                    if at.is_some_and(|at| v <= at) {
                        assert_eq!(step, Step::Stale);
                    }
                }
            }
            Op::Missed => mirror.missed(),
            Op::Snapshot => {
                mirror.snapshot(source.version, filtered(&source.content));
                // Everything up to now is in the snapshot.
                source.next = source.changes.len();
                snapshot_taken = true;
            }
            Op::SnapshotInEntries { split, change } => {
                let entries: Vec<(String, u8)> = filtered(&source.content).into_iter().collect();
                let split = usize::from(*split).min(entries.len());
                let version = source.version;
                for (k, v) in &entries[..split] {
                    mirror.snapshot_entry(version, k.clone(), Some(*v));
                }
                if let Some((key, value)) = change {
                    let key = KEYS[usize::from(*key) % KEYS.len()];
                    // Odd values delete.
                    let value = (value % 2 == 0).then_some(*value);
                    source.apply(key, value);
                    if matching(key) {
                        mirror.snapshot_entry(source.version, key.to_string(), value);
                    } else {
                        mirror.snapshot_seen(source.version);
                    }
                }
                for (k, v) in &entries[split..] {
                    // A key the change above rewrote comes as its newest
                    // entry only (the consumer reads last-per-subject).
                    if let Some((key, _)) = change {
                        if KEYS[usize::from(*key) % KEYS.len()] == k.as_str() {
                            continue;
                        }
                    }
                    mirror.snapshot_entry(version, k.clone(), Some(*v));
                }
                assert_eq!(
                    mirror.is_building(),
                    split > 0 || change.is_some() || split < entries.len()
                );
                mirror.snapshot_end(version);
                source.next = source.changes.len();
                snapshot_taken = true;
            }
            Op::Read { n } => consumer.read(&mut mirror, usize::from(*n)),
        }
        // Invariant 1: nothing before the first snapshot.
        if mirror.at().is_none() {
            assert_eq!(mirror.queued(), 0);
            assert!(!consumer.synced);
        }
        // Invariant 2: the told view follows the source.
        if let Some(at) = mirror.at() {
            assert!(at <= source.version);
            assert_eq!(
                eventual(&consumer, &mirror),
                source.matching_at(at),
                "told view at version {at}"
            );
        }
        // Invariant 4: a resync says only the difference.
        if snapshot_taken {
            let mut copy = mirror.clone();
            for _ in 0..queued_before {
                copy.poll();
            }
            let mut view = told_before.clone();
            while let Some(n) = copy.poll() {
                match n {
                    MirrorNotice::Put { key, value } => {
                        assert_ne!(view.get(&key), Some(&value), "a resync repeated {key}");
                        view.insert(key, value);
                    }
                    MirrorNotice::Deleted { key } => {
                        assert!(view.remove(&key).is_some());
                    }
                    MirrorNotice::Synced => {}
                }
            }
        }
    }
    // Convergence: the backend delivers what is left, resyncs when the
    // mirror wants it, and the consumer reads everything. A silently lost
    // last change under `Contiguous` shows only when a later one arrives:
    // one more change, of a key outside the pattern, is that later one.
    source.apply("b", Some(0));
    for _ in 0..3 {
        while let Some((v, k, val)) = source.changes.get(source.next).cloned() {
            source.next += 1;
            let m = matching(&k);
            let _ = if m {
                mirror.change(v, k, val)
            } else {
                mirror.passed(v)
            };
            consumer.read(&mut mirror, usize::MAX);
        }
        consumer.read(&mut mirror, usize::MAX);
        if mirror.wants_snapshot() {
            mirror.snapshot(source.version, filtered(&source.content));
        }
        consumer.read(&mut mirror, usize::MAX);
    }
    assert!(!mirror.needs_snapshot());
    assert!(consumer.synced);
    assert_eq!(consumer.view, filtered(&source.content), "converged");
});
