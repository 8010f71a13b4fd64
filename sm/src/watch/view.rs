//! The set of keys the consumer has been told about, and the notices that
//! move it from one state to the next.
//!
//! Every change to the set goes through here and produces exactly the notices
//! that describe it, so "what the consumer believes" and "what we think the
//! consumer believes" cannot drift apart.

use super::{KeyRule, WatchNotice};
use crate::rpc::{EventKind, KeyValue, WatchEvent};
use std::collections::{BTreeMap, BTreeSet};

/// Known keys under one prefix, plus the invalid keys already reported.
#[derive(Clone, Debug)]
pub(crate) struct View {
    prefix: Vec<u8>,
    rule: KeyRule,
    known: BTreeMap<Vec<u8>, KeyValue>,
    /// Kept for the machine's whole life so each bad key is reported once,
    /// however often it is re-read; it grows only with distinct bad keys.
    reported: BTreeSet<Vec<u8>>,
}

impl View {
    pub(crate) fn new(prefix: Vec<u8>, rule: KeyRule) -> Self {
        View {
            prefix,
            rule,
            known: BTreeMap::new(),
            reported: BTreeSet::new(),
        }
    }

    pub(crate) fn known(&self) -> impl Iterator<Item = &KeyValue> {
        self.known.values()
    }

    /// Whether the consumer has been told of no key at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// Add one page of a snapshot streamed into the set, in key order:
    /// `Up` for new keys, and for a key already known (which a page never
    /// repeats, but nothing is taken on trust) what [`View::resync`] would
    /// say for it. Keys not in the page are left alone.
    pub(crate) fn add(&mut self, kvs: Vec<KeyValue>, out: &mut Vec<WatchNotice>) {
        let mut page = BTreeMap::new();
        for kv in kvs {
            if kv.key.starts_with(&self.prefix) {
                page.insert(kv.key.clone(), kv);
            }
        }
        for (key, now) in page {
            match self.known.remove(&key) {
                None => {
                    if self.admit(&key, out) {
                        out.push(WatchNotice::Up(now.clone()));
                        self.known.insert(key, now);
                    }
                }
                Some(before) => {
                    if before.create_revision != now.create_revision {
                        out.push(WatchNotice::Down(before));
                        out.push(WatchNotice::Up(now.clone()));
                    } else if before != now {
                        out.push(WatchNotice::Updated(now.clone()));
                    }
                    self.known.insert(key, now);
                }
            }
        }
    }

    /// Replace the set with a fresh snapshot and describe the difference:
    /// `Down` (last seen) for vanished keys, `Up` for new ones, `Down`+`Up`
    /// where the create revision changed, `Updated` where anything else
    /// changed. Notices come in key order.
    pub(crate) fn resync(&mut self, kvs: Vec<KeyValue>, out: &mut Vec<WatchNotice>) {
        let mut fresh = BTreeMap::new();
        for kv in kvs {
            if kv.key.starts_with(&self.prefix) {
                fresh.insert(kv.key.clone(), kv);
            }
        }
        let old = std::mem::take(&mut self.known);
        let keys: BTreeSet<Vec<u8>> = old.keys().chain(fresh.keys()).cloned().collect();
        for key in keys {
            match (old.get(&key), fresh.remove(&key)) {
                (Some(before), None) => out.push(WatchNotice::Down(before.clone())),
                (None, Some(now)) => {
                    if self.admit(&key, out) {
                        out.push(WatchNotice::Up(now.clone()));
                        self.known.insert(key, now);
                    }
                }
                (Some(before), Some(now)) => {
                    if before.create_revision != now.create_revision {
                        out.push(WatchNotice::Down(before.clone()));
                        out.push(WatchNotice::Up(now.clone()));
                    } else if *before != now {
                        out.push(WatchNotice::Updated(now.clone()));
                    }
                    self.known.insert(key, now);
                }
                (None, None) => {}
            }
        }
    }

    /// Apply one watch event. A put of a key seen with another create
    /// revision means a delete was missed: `Down` (old) then `Up` (new). Any
    /// other put of a known key is `Updated`, even if only the mod revision
    /// moved, because a consumer may use it as a heartbeat. Deletes of
    /// unknown keys say nothing: the consumer never saw them.
    pub(crate) fn apply(&mut self, event: WatchEvent, out: &mut Vec<WatchNotice>) {
        let kv = event.kv;
        if !kv.key.starts_with(&self.prefix) {
            return;
        }
        match event.kind {
            EventKind::Put => {
                if !self.admit(&kv.key, out) {
                    return;
                }
                match self.known.get(&kv.key) {
                    None => out.push(WatchNotice::Up(kv.clone())),
                    Some(before) if before.create_revision == kv.create_revision => {
                        out.push(WatchNotice::Updated(kv.clone()))
                    }
                    Some(before) => {
                        out.push(WatchNotice::Down(before.clone()));
                        out.push(WatchNotice::Up(kv.clone()));
                    }
                }
                self.known.insert(kv.key.clone(), kv);
            }
            EventKind::Delete => {
                if let Some(before) = self.known.remove(&kv.key) {
                    out.push(WatchNotice::Down(before));
                }
            }
        }
    }

    /// Whether `key` (already known to be under the prefix) passes the key
    /// rule; a failing key is reported the first time it is seen.
    fn admit(&mut self, key: &[u8], out: &mut Vec<WatchNotice>) -> bool {
        let suffix = key.get(self.prefix.len()..).unwrap_or_default();
        if self.rule.accepts(suffix) {
            return true;
        }
        if self.reported.insert(key.to_vec()) {
            out.push(WatchNotice::InvalidKey(key.to_vec()));
        }
        false
    }
}
