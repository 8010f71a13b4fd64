//! The set of keys the consumer has been told about, and the notices that
//! move it from one state to the next.
//!
//! Every change to the set goes through here and produces exactly the notices
//! that describe it, so "what the consumer believes" and "what we think the
//! consumer believes" cannot drift apart.
//!
//! Leave markers ([`KeyClass::LeaveMarker`]) are tracked beside the known
//! keys but never reported; they only decide whether a known key that
//! disappears is reported [`WatchNotice::Left`] or [`WatchNotice::Down`]
//! (the rule is in the [watch module docs](super)).
//!
//! Incarnation keys ([`KeyClass::Incarnation`]) are never reported either;
//! each known key carries the incarnation joined from the one written with
//! its current state ([`join`]), told as [`WatchNotice::Incarnation`]
//! right before every notice about that key. In a first snapshot a host
//! key comes before its incarnation key (key order), possibly on the next
//! page, so the last new key read is *held* ([`View::add`]) until a key
//! at or past its incarnation key is read, or the snapshot ends
//! ([`View::flush`]).

use super::keys::{KeyClass, INCARNATION_SUFFIX};
use super::{KeyRule, WatchNotice};
use crate::outbox::Outbox;
use crate::rpc::{EventKind, KeyValue, WatchEvent};
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

/// Where the view puts its notices: a list, or straight into the
/// machine's outbox (a first snapshot's page of `Up`s is queued once, not
/// built as a list and then copied into the outbox).
pub(crate) trait Notices {
    /// Queue one notice.
    fn push(&mut self, notice: WatchNotice);
    /// Make room for `additional` more.
    fn reserve(&mut self, additional: usize);
}

impl Notices for Vec<WatchNotice> {
    fn push(&mut self, notice: WatchNotice) {
        Vec::push(self, notice);
    }

    fn reserve(&mut self, additional: usize) {
        Vec::reserve(self, additional);
    }
}

impl Notices for Outbox<WatchNotice> {
    fn push(&mut self, notice: WatchNotice) {
        self.notify(notice);
    }

    fn reserve(&mut self, additional: usize) {
        Outbox::reserve(self, additional);
    }
}

/// A key's last seen state in the set of known keys, with its joined
/// incarnation (0: none), ordered and found by its key alone: a map from
/// key to state would hold every key twice (the map's copy and the
/// state's own).
#[derive(Clone, Debug)]
struct ByKey(KeyValue, u64);

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for ByKey {}

impl PartialOrd for ByKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.key.cmp(&other.0.key)
    }
}

// Consistent with `Ord`: both compare the key's bytes.
impl Borrow<[u8]> for ByKey {
    fn borrow(&self) -> &[u8] {
        &self.0.key
    }
}

/// Known keys under one prefix, plus the invalid keys already reported.
#[derive(Clone, Debug)]
pub(crate) struct View {
    prefix: Vec<u8>,
    rule: KeyRule,
    known: BTreeSet<ByKey>,
    /// The leave markers etcd holds as far as this view knows, keyed by the
    /// key of the entry they belong to (known or not: a marker may be read
    /// before its entry). Bounded by the markers in etcd: a delete event
    /// or a resync that no longer has one removes it.
    markers: BTreeMap<Vec<u8>, KeyValue>,
    /// A new key of a first snapshot whose `Up` waits for its incarnation
    /// key, which may follow it (see the module docs). Not in `known`: the
    /// consumer has not been told of it.
    held: Option<ByKey>,
    /// Kept for the machine's whole life so each bad key is reported once,
    /// however often it is re-read; it grows only with distinct bad keys.
    reported: BTreeSet<Vec<u8>>,
}

impl View {
    pub(crate) fn new(prefix: Vec<u8>, rule: KeyRule) -> Self {
        View {
            prefix,
            rule,
            known: BTreeSet::new(),
            markers: BTreeMap::new(),
            held: None,
            reported: BTreeSet::new(),
        }
    }

    /// What `key` (already known to be under the prefix) is.
    fn class(&self, key: &[u8]) -> KeyClass {
        self.rule
            .classify(key.get(self.prefix.len()..).unwrap_or_default())
    }

    /// Whether keys carry incarnations (only host keys do).
    fn joins(&self) -> bool {
        self.rule == KeyRule::HostId
    }

    pub(crate) fn known(&self) -> impl Iterator<Item = &KeyValue> {
        self.known.iter().map(|known| &known.0)
    }

    /// Whether the consumer has been told of no key at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// Add one page of a snapshot streamed into the set, in key order:
    /// `Up` for new keys, and for a key already known (which a page never
    /// repeats, but nothing is taken on trust) what [`View::resync`] would
    /// say for it. Keys not in the page are left alone. The last new key
    /// read may be held for the next page (see the module docs), unless
    /// `lookahead`, the first key after the page, settles it; the page
    /// that ends the snapshot is followed by [`View::flush`].
    ///
    /// This runs once per key of every first snapshot, so each key is
    /// classified once (twice only on a first page whose check for "all
    /// valid entries" fails part-way), and a page already in strict key
    /// order (etcd's answer to a range always is) is taken as it comes
    /// instead of being sorted again.
    pub(crate) fn add(
        &mut self,
        kvs: Vec<KeyValue>,
        lookahead: Option<KeyValue>,
        out: &mut impl Notices,
    ) {
        self.add_page(kvs, out);
        // The key after the page (read to learn that more follow) settles
        // the held key without waiting for the next page: it is its
        // incarnation key, or sorts past where that would be. The next
        // page reads it again, and finds nothing held for it then.
        if let Some(next) = lookahead {
            if let Some(held) = self.held.take() {
                let incarnation = if next.key.strip_suffix(INCARNATION_SUFFIX) == Some(&held.0.key)
                    && self.class(&next.key) == KeyClass::Incarnation
                {
                    join(&held.0, &next)
                } else {
                    0
                };
                if incarnation != 0 || past_incarnation(&next.key, &held.0.key) {
                    self.tell(ByKey(held.0, incarnation), out);
                } else {
                    self.held = Some(held);
                }
            }
        }
    }

    fn add_page(&mut self, kvs: Vec<KeyValue>, out: &mut impl Notices) {
        out.reserve(kvs.len());
        let sorted = kvs.windows(2).all(|w| w[0].key < w[1].key);
        if sorted
            && self.known.is_empty()
            && self.held.is_none()
            && kvs.iter().all(|kv| {
                kv.key.starts_with(&self.prefix)
                    && matches!(self.class(&kv.key), KeyClass::Entry | KeyClass::Incarnation)
            })
        {
            // The first page of a first snapshot, every key a valid entry
            // or an incarnation key (the common case): the set is built
            // from the page in one go, in the page's own memory, with full
            // tree nodes; inserted one by one, in key order, every node
            // would be split half full. In key order an incarnation key
            // directly follows its entry (nothing valid sorts between
            // `<id>` and `<id>/incarnation`).
            let joins = self.joins();
            let mut entries: Vec<ByKey> = Vec::with_capacity(kvs.len());
            for kv in kvs {
                // Both classes passed above, and no entry under this rule
                // ends like an incarnation key.
                if !(joins && kv.key.ends_with(INCARNATION_SUFFIX)) {
                    entries.push(ByKey(kv, 0));
                    continue;
                }
                // One not right after its entry belongs to no entry of
                // this page.
                if let Some(last) = entries.last_mut() {
                    if kv.key.strip_suffix(INCARNATION_SUFFIX) == Some(&last.0.key) {
                        last.1 = join(&last.0, &kv);
                    }
                }
            }
            // The last key's incarnation key may open the next page.
            if joins && entries.last().is_some_and(|last| last.1 == 0) {
                self.held = entries.pop();
            }
            for known in &entries {
                push(out, known.1, WatchNotice::Up(known.0.clone()));
            }
            self.known = entries.into_iter().collect();
            return;
        }
        if sorted {
            // A first snapshot's pages touch fresh memory for every key
            // they keep (the notice's copy, the set's), and in a process
            // that just started each new page of it is a page fault: so no
            // second list of the page is built.
            for kv in kvs {
                self.add_one(kv, out);
            }
            return;
        }
        // Key order, and the last of several kvs for one key wins: a
        // stable sort keeps repeats in page order, and `dedup_by` keeps
        // the first of each run, which the reversal makes the last one.
        let mut page = kvs;
        page.sort_by(|a, b| a.key.cmp(&b.key));
        page.reverse();
        page.dedup_by(|a, b| a.key == b.key);
        page.reverse();
        for kv in page {
            self.add_one(kv, out);
        }
    }

    /// One key of a page, in key order (see [`View::add`]).
    fn add_one(&mut self, now: KeyValue, out: &mut impl Notices) {
        if !now.key.starts_with(&self.prefix) {
            return;
        }
        let class = self.class(&now.key);
        if let Some(held) = self.held.take() {
            if class == KeyClass::Incarnation
                && now.key.strip_suffix(INCARNATION_SUFFIX) == Some(&held.0.key)
            {
                let incarnation = join(&held.0, &now);
                return self.tell(ByKey(held.0, incarnation), out);
            }
            if held.0.key == now.key && class == KeyClass::Entry {
                // A page repeating the held key (never in etcd's answers,
                // but nothing is taken on trust): it was never told, so
                // the later state simply replaces it.
                self.held = Some(ByKey(now, 0));
                return;
            }
            if past_incarnation(&now.key, &held.0.key) {
                self.tell(held, out);
            } else {
                self.held = Some(held);
            }
        }
        if let Some(entry) = marker_entry(&now.key, class) {
            self.markers.insert(entry, now);
            return;
        }
        if class == KeyClass::Incarnation {
            return;
        }
        match self.known.get(now.key.as_slice()) {
            None => {
                if class == KeyClass::Entry && !self.joins() {
                    self.tell(ByKey(now, 0), out);
                } else if class == KeyClass::Entry {
                    // Keys come in key order, so a held key was told
                    // above: nothing sorts between it and its incarnation
                    // key but invalid keys.
                    if let Some(before) = self.held.replace(ByKey(now, 0)) {
                        self.tell(before, out);
                    }
                } else {
                    report_invalid(&mut self.reported, &now.key, out);
                }
            }
            Some(ByKey(before, incarnation)) => {
                if before.create_revision != now.create_revision {
                    let up = now.clone();
                    if let Some(ByKey(before, incarnation)) = self.known.replace(ByKey(now, 0)) {
                        push(out, incarnation, WatchNotice::Down(before));
                    }
                    out.push(WatchNotice::Up(up));
                } else if *before != now {
                    let incarnation = *incarnation;
                    out.push(WatchNotice::Updated(now.clone()));
                    self.known.replace(ByKey(now, incarnation));
                }
            }
        }
    }

    /// Tell the consumer of a new key, with its incarnation.
    fn tell(&mut self, new: ByKey, out: &mut impl Notices) {
        push(out, new.1, WatchNotice::Up(new.0.clone()));
        self.known.insert(new);
    }

    /// The snapshot [`View::add`] was fed has ended: tell the held key.
    pub(crate) fn flush(&mut self, out: &mut impl Notices) {
        if let Some(held) = self.held.take() {
            self.tell(held, out);
        }
    }

    /// The snapshot [`View::add`] was fed is given up: the held key was
    /// never told, so the next snapshot finds it as new.
    pub(crate) fn forget_held(&mut self) {
        self.held = None;
    }

    /// Replace the set with a fresh snapshot and describe the difference:
    /// `Down` or `Left` (last seen) for vanished keys, `Up` for new ones,
    /// `Down`/`Left` + `Up` where the create revision changed, `Updated`
    /// where anything else changed. Notices come in key order, each
    /// preceded by its key's incarnation where one is known.
    ///
    /// A vanished key is `Left` only if a leave marker matching it (see
    /// [`marks`]) is in the fresh snapshot (the one-transaction leave,
    /// its revoke not yet applied), or was seen before and is gone from
    /// the fresh snapshot too (both went with the lease). A leave whose
    /// marker came and went entirely while the view was not watching is
    /// not seen, so it reads as `Down`.
    ///
    /// A key whose state is unchanged keeps the incarnation it was told
    /// with: an incarnation key rewritten alone (by another client) is not
    /// the host's.
    pub(crate) fn resync(&mut self, kvs: Vec<KeyValue>, out: &mut Vec<WatchNotice>) {
        self.held = None;
        let mut fresh = BTreeMap::new();
        let mut fresh_markers = BTreeMap::new();
        let mut incarnations = BTreeMap::new();
        for kv in kvs {
            if !kv.key.starts_with(&self.prefix) {
                continue;
            }
            let class = self.class(&kv.key);
            if let Some(entry) = marker_entry(&kv.key, class) {
                fresh_markers.insert(entry, kv);
            } else if class == KeyClass::Incarnation {
                if let Some(entry) = kv.key.strip_suffix(INCARNATION_SUFFIX) {
                    incarnations.insert(entry.to_vec(), kv);
                }
            } else {
                fresh.insert(kv.key.clone(), kv);
            }
        }
        let old_markers = std::mem::replace(&mut self.markers, fresh_markers);
        let gone = |key: &Vec<u8>, before: &KeyValue| -> WatchNotice {
            let seen = old_markers.get(key).filter(|m| marks(m, before));
            let still_there = |m: &KeyValue| {
                self.markers
                    .get(key)
                    .is_some_and(|now| now.create_revision == m.create_revision)
            };
            // Written with the delete (the one-transaction leave) and not
            // yet revoked: the fresh snapshot has it.
            let fresh = self.markers.get(key).is_some_and(|m| marks(m, before));
            match seen {
                Some(m) if !still_there(m) => WatchNotice::Left(before.clone()),
                _ if fresh => WatchNotice::Left(before.clone()),
                _ => WatchNotice::Down(before.clone()),
            }
        };
        let joined =
            |key: &Vec<u8>, now: &KeyValue| incarnations.get(key).map_or(0, |i| join(now, i));
        let old = std::mem::take(&mut self.known);
        let keys: BTreeSet<Vec<u8>> = old
            .iter()
            .map(|known| &known.0.key)
            .chain(fresh.keys())
            .cloned()
            .collect();
        let mut known = BTreeSet::new();
        for key in keys {
            match (old.get(key.as_slice()), fresh.remove(&key)) {
                (Some(ByKey(before, was)), None) => push(out, *was, gone(&key, before)),
                (None, Some(now)) => {
                    if admit(self.rule, &self.prefix, &mut self.reported, &key, out) {
                        let incarnation = joined(&key, &now);
                        push(out, incarnation, WatchNotice::Up(now.clone()));
                        known.insert(ByKey(now, incarnation));
                    }
                }
                (Some(ByKey(before, was)), Some(now)) => {
                    let mut incarnation = *was;
                    if before.create_revision != now.create_revision {
                        push(out, *was, gone(&key, before));
                        incarnation = joined(&key, &now);
                        push(out, incarnation, WatchNotice::Up(now.clone()));
                    } else if *before != now {
                        incarnation = joined(&key, &now);
                        push(out, incarnation, WatchNotice::Updated(now.clone()));
                    }
                    known.insert(ByKey(now, incarnation));
                }
                (None, None) => {}
            }
        }
        self.known = known;
    }

    /// Apply the events of one revision (etcd sends all of a revision's
    /// events in one response). A put of a key seen with another create
    /// revision means a delete was missed: `Down` (old) then `Up` (new). Any
    /// other put of a known key is `Updated`, even if only the mod revision
    /// moved, because a consumer may use it as a heartbeat. Deletes of
    /// unknown keys say nothing: the consumer never saw them.
    ///
    /// A known key deleted in the same revision as its leave marker is
    /// written, or is deleted, where that marker (as written, or as known
    /// before this revision) [`marks`] the key's last state, is `Left`; any
    /// other delete is `Down`. The first is the one-transaction leave, the
    /// second what a lease revoke (or expiry) of the lease both are bound
    /// to produces after a marker put on its own; either way in any order
    /// etcd lists the events in.
    ///
    /// A put's incarnation is the one its incarnation key is written with
    /// in the same revision ([`join`]), in any order; an incarnation key
    /// written or deleted alone changes nothing.
    pub(crate) fn apply_revision(&mut self, events: Vec<WatchEvent>, out: &mut Vec<WatchNotice>) {
        let mut leaving: BTreeMap<Vec<u8>, KeyValue> = BTreeMap::new();
        let mut incarnations: BTreeMap<Vec<u8>, KeyValue> = BTreeMap::new();
        for event in &events {
            if !event.kv.key.starts_with(&self.prefix) {
                continue;
            }
            let class = self.class(&event.kv.key);
            if class == KeyClass::Incarnation && event.kind == EventKind::Put {
                if let Some(entry) = event.kv.key.strip_suffix(INCARNATION_SUFFIX) {
                    incarnations.insert(entry.to_vec(), event.kv.clone());
                }
                continue;
            }
            let Some(entry) = marker_entry(&event.kv.key, class) else {
                continue;
            };
            match event.kind {
                // Written in the revision that deletes its entry: a leave
                // in one transaction (`HostLiveness::close`).
                EventKind::Put => {
                    leaving.insert(entry, event.kv.clone());
                }
                // Deleted with its entry: the revoke (or expiry) of the
                // lease both are bound to, after a marker put on its own.
                EventKind::Delete => {
                    if let Some(marker) = self.markers.get(&entry) {
                        leaving.insert(entry, marker.clone());
                    }
                }
            }
        }
        for event in events {
            self.apply(event, &leaving, &incarnations, out);
        }
    }

    fn apply(
        &mut self,
        event: WatchEvent,
        leaving: &BTreeMap<Vec<u8>, KeyValue>,
        incarnations: &BTreeMap<Vec<u8>, KeyValue>,
        out: &mut Vec<WatchNotice>,
    ) {
        let kv = event.kv;
        if !kv.key.starts_with(&self.prefix) {
            return;
        }
        let class = self.class(&kv.key);
        if class == KeyClass::Incarnation {
            return;
        }
        if let Some(entry) = marker_entry(&kv.key, class) {
            match event.kind {
                EventKind::Put => {
                    self.markers.insert(entry, kv);
                }
                EventKind::Delete => {
                    self.markers.remove(&entry);
                }
            }
            return;
        }
        match event.kind {
            EventKind::Put => {
                if !self.admit_class(class == KeyClass::Entry, &kv.key, out) {
                    return;
                }
                let incarnation = incarnations.get(&kv.key).map_or(0, |i| join(&kv, i));
                match self.known.get(kv.key.as_slice()) {
                    None => push(out, incarnation, WatchNotice::Up(kv.clone())),
                    Some(ByKey(before, _)) if before.create_revision == kv.create_revision => {
                        push(out, incarnation, WatchNotice::Updated(kv.clone()))
                    }
                    Some(ByKey(before, was)) => {
                        push(out, *was, WatchNotice::Down(before.clone()));
                        push(out, incarnation, WatchNotice::Up(kv.clone()));
                    }
                }
                self.known.replace(ByKey(kv, incarnation));
            }
            EventKind::Delete => {
                if let Some(ByKey(before, was)) = self.known.take(kv.key.as_slice()) {
                    let left = leaving.get(&kv.key).is_some_and(|m| marks(m, &before));
                    push(
                        out,
                        was,
                        if left {
                            WatchNotice::Left(before)
                        } else {
                            WatchNotice::Down(before)
                        },
                    );
                }
            }
        }
    }

    /// Whether a key (already known to be under the prefix) passes the key
    /// rule, for a key already classified: `valid` is whether its class is
    /// [`KeyClass::Entry`], which is exactly what the rule accepts
    /// ([`KeyRule::classify`]). A failing key is reported the first time it
    /// is seen.
    fn admit_class(&mut self, valid: bool, key: &[u8], out: &mut Vec<WatchNotice>) -> bool {
        if !valid {
            report_invalid(&mut self.reported, key, out);
        }
        valid
    }
}

/// The entry key a leave marker `key` of class `class` belongs to, if it is
/// one.
fn marker_entry(key: &[u8], class: KeyClass) -> Option<Vec<u8>> {
    match class {
        KeyClass::LeaveMarker { marker_len } => key
            .get(..key.len().saturating_sub(marker_len))
            .map(<[u8]>::to_vec),
        _ => None,
    }
}

/// Tell the consumer about an invalid `key` the first time it is seen.
fn report_invalid(reported: &mut BTreeSet<Vec<u8>>, key: &[u8], out: &mut impl Notices) {
    if reported.insert(key.to_vec()) {
        out.push(WatchNotice::InvalidKey(key.to_vec()));
    }
}

/// Whether `key` passes the key rule (reporting it the first time when it
/// does not), on the fields it needs, so a caller may hold other fields
/// borrowed meanwhile.
fn admit(
    rule: KeyRule,
    prefix: &[u8],
    reported: &mut BTreeSet<Vec<u8>>,
    key: &[u8],
    out: &mut Vec<WatchNotice>,
) -> bool {
    let suffix = key.get(prefix.len()..).unwrap_or_default();
    if rule.accepts(suffix) {
        return true;
    }
    report_invalid(reported, key, out);
    false
}

/// Whether `marker` announces the leave of the entry last seen as `entry`:
/// bound to the same lease (a lease, not 0) and created after the entry
/// was. A marker on another lease does not go with the entry's lease, and
/// an older one belongs to an earlier registration.
fn marks(marker: &KeyValue, entry: &KeyValue) -> bool {
    marker.lease != 0
        && marker.lease == entry.lease
        && marker.create_revision > entry.create_revision
}

/// Queue `notice` about a key, preceded by the key's incarnation when one
/// is known (the order [`WatchNotice::Incarnation`] promises).
fn push(out: &mut impl Notices, incarnation: u64, notice: WatchNotice) {
    if incarnation != 0 {
        out.push(WatchNotice::Incarnation(incarnation));
    }
    out.push(notice);
}

/// The incarnation `incarnation_key` gives the host key's state `entry`:
/// its value when it was written with that state — in the same revision
/// (the registration's transaction writes both) and on the same lease —
/// and is a positive decimal number; 0 otherwise (written alone, by
/// another client, or by a version that writes none).
pub(crate) fn join(entry: &KeyValue, incarnation_key: &KeyValue) -> u64 {
    if incarnation_key.mod_revision != entry.mod_revision || incarnation_key.lease != entry.lease {
        return 0;
    }
    parse_incarnation(&incarnation_key.value).unwrap_or(0)
}

/// A positive decimal number of ASCII digits only, without overflow.
fn parse_incarnation(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value)
        .ok()?
        .parse()
        .ok()
        .filter(|&n| n > 0)
}

/// Whether `key` sorts past `entry`'s incarnation key
/// (`<entry>/incarnation`), compared without building that key.
fn past_incarnation(key: &[u8], entry: &[u8]) -> bool {
    match key.strip_prefix(entry) {
        Some(rest) => rest > INCARNATION_SUFFIX,
        None => key > entry,
    }
}
