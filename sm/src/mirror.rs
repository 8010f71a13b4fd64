//! The KV-watch mirror: what one consumer of a pattern watch has been told,
//! and the notices that bring it up to date — shared by every bus backend
//! whose KV store is not etcd (Redis, NATS, memory; etcd's watch has its
//! own machine, [`crate::watch`]).
//!
//! A backend feeds the mirror what its server says and drains the notices
//! it queues; the mirror decides everything else. It is not a
//! [`crate::Machine`]: it sends no requests and keeps no time, it only
//! answers "what does the consumer need to hear now", so the backend's
//! async code is left with I/O.
//!
//! # The source, as the mirror sees it
//!
//! * A **snapshot** is the complete content of the watched keys at one
//!   *version* (a Redis bucket version, a NATS stream sequence, the memory
//!   store's change counter). It comes whole ([`Mirror::snapshot`]) or in
//!   entries ([`Mirror::snapshot_entry`] … [`Mirror::snapshot_end`]), where
//!   a later entry for a key replaces an earlier one and `None` is a delete
//!   marker.
//! * A **change** is one key set or deleted at one version: of a key the
//!   watch's pattern covers ([`Mirror::change`]; the backend matches), or of
//!   another key, which only moves the version on ([`Mirror::passed`]).
//! * [`Order`] says what versions promise. `Contiguous`: every change of
//!   the bucket has the next version, so a skipped one is a change missed
//!   (Redis's notification counter, memory's change counter).
//!   `Increasing`: versions only grow, with holes that mean nothing (a NATS
//!   stream sequence filtered to one bucket's subjects).
//!
//! # What the consumer is told
//!
//! Notices are [`MirrorNotice::Put`], [`MirrorNotice::Deleted`] and, once,
//! [`MirrorNotice::Synced`]. The invariants, enforced here and checked by
//! the `mirror` fuzz target against a `BTreeMap` model:
//!
//! 1. **First the snapshot, then `Synced`, then changes.** Nothing is
//!    queued before the first complete snapshot; it yields a `Put` for
//!    every matching key with a value, in key order, then `Synced`.
//!    `Synced` is queued exactly once.
//! 2. **The told view follows the source.** Applying every queued notice in
//!    order to an empty map gives the source's content at the mirror's
//!    version ([`Mirror::at`]) — after every snapshot, and after every
//!    change applied since.
//! 3. **Live changes are passed on as they are**: every matching set is a
//!    `Put`, even of an unchanged value; a delete is `Deleted` only for a
//!    key the consumer was told holds a value.
//! 4. **A resync says only the difference**: a snapshot after the first is
//!    compared with what the consumer was told — `Deleted` for keys gone
//!    (first, in key order), then `Put` for keys new or changed, in key
//!    order — never a notice that would leave the told view as it was.
//! 5. **A gap is never papered over.** A change that cannot be applied in
//!    order (a skipped version under `Contiguous`, any change before the
//!    first snapshot, a change after [`Mirror::missed`]) is not applied and
//!    the answer is [`Step::Resync`]: the backend fetches a snapshot, and
//!    changes keep answering `Resync` until one arrives. A snapshot is the
//!    truth, even at a lower version than the mirror's (a server that
//!    restarted without its data): the told view becomes it.
//! 6. **A slow consumer costs bounded memory.** At most `limit` live
//!    changes wait in the queue; the next one marks the mirror stale
//!    (`Resync`), and the backend resyncs once the consumer has room
//!    ([`Mirror::wants_snapshot`]), so the consumer ends with the latest
//!    state rather than every intermediate one. A snapshot's own notices are
//!    bounded by the number of matching keys, not by `limit`.

use std::collections::{BTreeMap, VecDeque};

/// What the versions of a source promise (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Every change has the next version: a skipped version is a change
    /// missed.
    Contiguous,
    /// Versions only grow; holes mean nothing.
    Increasing,
}

/// One thing the consumer is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MirrorNotice<V> {
    /// `key` holds `value`.
    Put {
        /// The key.
        key: String,
        /// Its value.
        value: V,
    },
    /// `key`, which the consumer was told holds a value, no longer exists.
    Deleted {
        /// The key.
        key: String,
    },
    /// Everything the first snapshot held has been told.
    Synced,
}

/// What [`Mirror::change`] did with a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Applied: whatever the consumer must hear is queued.
    Applied,
    /// At or below the mirror's version: already reflected, ignored.
    Stale,
    /// Not applied: the mirror needs a snapshot newer than this change's
    /// predecessors before it can go on.
    Resync,
}

/// What one consumer of a KV watch has been told (see the module docs).
#[derive(Clone, Debug)]
pub struct Mirror<V> {
    order: Order,
    limit: usize,
    /// What the consumer holds once it has read the queue: key → value.
    told: BTreeMap<String, V>,
    /// The version `told` reflects; `None` before the first snapshot.
    at: Option<u64>,
    /// A change after `at` was not applied: only a snapshot may follow.
    stale: bool,
    /// A snapshot arriving in entries: its version so far and content
    /// (`None` marks a deleted key), restricted to matching keys.
    building: Option<(u64, BTreeMap<String, Option<V>>)>,
    synced: bool,
    queue: VecDeque<MirrorNotice<V>>,
    /// How many notices in `queue` come from live changes.
    live: usize,
}

impl<V: Clone + Eq> Mirror<V> {
    /// An empty mirror for a source with `order`, letting at most `limit`
    /// (at least 1) live changes wait for the consumer.
    pub fn new(order: Order, limit: usize) -> Self {
        Mirror {
            order,
            limit: limit.max(1),
            told: BTreeMap::new(),
            at: None,
            stale: false,
            building: None,
            synced: false,
            queue: VecDeque::new(),
            live: 0,
        }
    }

    /// The version the told view reflects; `None` before the first
    /// snapshot.
    pub fn at(&self) -> Option<u64> {
        self.at
    }

    /// Whether changes cannot be applied until a snapshot arrives (none
    /// yet, a gap, or [`Mirror::missed`]).
    pub fn needs_snapshot(&self) -> bool {
        self.at.is_none() || self.stale
    }

    /// Whether the backend should fetch a snapshot now: one is needed and
    /// the consumer has read everything queued, so the snapshot's diff is
    /// what it hears next.
    pub fn wants_snapshot(&self) -> bool {
        self.needs_snapshot() && self.queue.is_empty()
    }

    /// Whether a snapshot is arriving in entries.
    pub fn is_building(&self) -> bool {
        self.building.is_some()
    }

    /// Where a source that resumes by version should start: the version
    /// after the newest one seen (snapshot entries included), or `None`
    /// when nothing was seen.
    pub fn resume_at(&self) -> Option<u64> {
        let seen = match (&self.building, self.at) {
            (Some((v, _)), Some(at)) => Some((*v).max(at)),
            (Some((v, _)), None) => Some(*v),
            (None, at) => at,
        };
        seen.map(|v| v.saturating_add(1))
    }

    /// Changes may have been lost (a connection dropped, notifications
    /// discarded): changes stop applying until a snapshot arrives.
    pub fn missed(&mut self) {
        if self.at.is_some() {
            self.stale = true;
        }
    }

    /// One change of `key`, a key the watch's pattern covers, at
    /// `version`: set to `value`, or deleted (`None`).
    pub fn change(&mut self, version: u64, key: String, value: Option<V>) -> Step {
        if let Err(step) = self.admit(version) {
            return step;
        }
        let notice = match &value {
            Some(v) => Some(MirrorNotice::Put {
                key: key.clone(),
                value: v.clone(),
            }),
            None => self
                .told
                .contains_key(&key)
                .then(|| MirrorNotice::Deleted { key: key.clone() }),
        };
        if let Some(notice) = notice {
            if self.live >= self.limit {
                // The consumer is this far behind: rather than queue
                // without bound, let a snapshot bring it to the latest
                // state once it has room (nothing of this change is
                // recorded as told).
                self.stale = true;
                return Step::Resync;
            }
            match value {
                Some(v) => {
                    self.told.insert(key, v);
                }
                None => {
                    self.told.remove(&key);
                }
            }
            self.queue.push_back(notice);
            self.live = self.live.saturating_add(1);
        }
        self.at = Some(version);
        Step::Applied
    }

    /// A change at `version` of a key the watch does not cover: nothing to
    /// tell, but the version moves on (a gap is still a gap).
    pub fn passed(&mut self, version: u64) -> Step {
        if let Err(step) = self.admit(version) {
            return step;
        }
        self.at = Some(version);
        Step::Applied
    }

    /// Whether a change at `version` may be applied now (rule 5 of the
    /// module docs); the answer to give when not.
    fn admit(&mut self, version: u64) -> Result<(), Step> {
        let Some(at) = self.at else {
            return Err(Step::Resync);
        };
        if version <= at {
            return Err(Step::Stale);
        }
        if self.stale {
            return Err(Step::Resync);
        }
        if self.order == Order::Contiguous && version != at.saturating_add(1) {
            self.stale = true;
            return Err(Step::Resync);
        }
        Ok(())
    }

    /// A complete snapshot of the matching keys at `version` (keys that do
    /// not match must be left out by the caller). Replaces any snapshot
    /// arriving in entries.
    pub fn snapshot(&mut self, version: u64, content: impl IntoIterator<Item = (String, V)>) {
        let content = content.into_iter().map(|(k, v)| (k, Some(v))).collect();
        self.building = Some((version, content));
        self.snapshot_end(version);
    }

    /// One entry of a snapshot arriving in entries: `key` (matching keys
    /// only) holds `value`, or was deleted (`None`), as of `version`.
    pub fn snapshot_entry(&mut self, version: u64, key: String, value: Option<V>) {
        let (v, content) = self
            .building
            .get_or_insert_with(|| (version, BTreeMap::new()));
        *v = (*v).max(version);
        content.insert(key, value);
    }

    /// Notes that a snapshot arriving in entries has reached `version`
    /// without a matching entry (a change of another key).
    pub fn snapshot_seen(&mut self, version: u64) {
        let (v, _) = self
            .building
            .get_or_insert_with(|| (version, BTreeMap::new()));
        *v = (*v).max(version);
    }

    /// The snapshot arriving in entries is complete as of `version` (or of
    /// its newest entry, if later; a snapshot of no entries at all is an
    /// empty source): queue the difference from what the consumer was told
    /// (then `Synced`, the first time). A snapshot is the truth: one at a
    /// lower version than the mirror's (a server restarted without its
    /// data) replaces the told view all the same, and versions go on from
    /// it.
    pub fn snapshot_end(&mut self, version: u64) {
        let (seen, content) = self.building.take().unwrap_or_default();
        let version = seen.max(version);
        let fresh: BTreeMap<String, V> = content
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        let gone: Vec<String> = self
            .told
            .keys()
            .filter(|k| !fresh.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            self.told.remove(&key);
            self.queue.push_back(MirrorNotice::Deleted { key });
        }
        for (key, value) in fresh {
            if self.told.get(&key) == Some(&value) {
                continue;
            }
            self.told.insert(key.clone(), value.clone());
            self.queue.push_back(MirrorNotice::Put { key, value });
        }
        if !self.synced {
            self.synced = true;
            self.queue.push_back(MirrorNotice::Synced);
        }
        self.at = Some(version);
        self.stale = false;
    }

    /// The next notice for the consumer, if any.
    pub fn poll(&mut self) -> Option<MirrorNotice<V>> {
        let notice = self.queue.pop_front()?;
        // Live notices sit behind any snapshot's; counting them down in
        // any order keeps `live` an upper bound of those still queued.
        if self.queue.len() < self.live {
            self.live = self.queue.len();
        }
        Some(notice)
    }

    /// Puts back a notice [`Mirror::poll`] gave out that the consumer had
    /// no room for; it is the next one polled.
    pub fn unpoll(&mut self, notice: MirrorNotice<V>) {
        self.queue.push_front(notice);
    }

    /// How many notices wait for the consumer.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
}
