//! In-process backend: the embedded default. Like every backend it follows
//! the contract stated in the coordinator docs (`coordinator/mod.rs`), and
//! the conformance suite (`coordinator/conformance/`) is what checks it —
//! the semantics are the suite's, not this file's.

use super::kv_mirror::{offer_queued, KvMirror};
use super::lifecycle::Lifecycle;
use super::{
    check_key, check_name, check_payload, pattern, Capabilities, Coordinator, Feed, KvEvent,
    KvWatcher, Message, StreamEntry, StreamId, StreamPosition, StreamReader, Subscription,
};
use crate::error::{Error, Result};
use crate::feed_queue::{FeedQueue, Offer};
use fleetcoord_sm::mirror::Order;
use fleetcoord_sm::newest::Newest;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::{check_set, refused, KvEntry, KvSetOptions, DEFAULT_FEED_CAPACITY};

/// The longest the expiry thread sleeps: a key set with a TTL while it
/// sleeps towards a later deadline is expired at most this late, well
/// within the contract's second.
const EXPIRY_PAUSE: Duration = Duration::from_millis(200);

/// How long the catch-up thread waits between rounds: [`CATCH_UP_FAST`]
/// after a round in which a consumer had read enough to be sent more (it
/// is reading), doubling up to [`CATCH_UP_SLOW`] while none had.
const CATCH_UP_FAST: Duration = Duration::from_millis(1);
const CATCH_UP_SLOW: Duration = Duration::from_millis(20);

/// How a [`MemoryCoordinator`] hub is set up; checked by
/// [`MemoryCoordinator::with_options`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryOptions {
    /// Keep only the newest `n` entries of each stream (`None`: all).
    pub stream_max_len: Option<usize>,
    /// The capacity of every feed (see "Slow consumers" on
    /// [`MemoryCoordinator`]); default
    /// [`DEFAULT_FEED_CAPACITY`](super::DEFAULT_FEED_CAPACITY).
    pub feed_capacity: usize,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions {
            stream_max_len: None,
            feed_capacity: DEFAULT_FEED_CAPACITY,
        }
    }
}

impl MemoryOptions {
    /// These options with [`MemoryOptions::stream_max_len`] set.
    #[must_use]
    pub const fn with_stream_max_len(mut self, max_len: usize) -> Self {
        self.stream_max_len = Some(max_len);
        self
    }

    /// These options with [`MemoryOptions::feed_capacity`] set.
    #[must_use]
    pub const fn with_feed_capacity(mut self, capacity: usize) -> Self {
        self.feed_capacity = capacity;
        self
    }
}

/// A [`Coordinator`] inside one process, built on `parking_lot` and
/// crossbeam.
///
/// **Handles.** `MemoryCoordinator::new()` creates a hub; [`Clone`] gives
/// another, independent handle onto the same hub — like a second process
/// connected to the same server. Handles see each other's messages, streams
/// and keys. [`close`](Coordinator::close) (and dropping a handle) closes
/// only that handle and ends only the feeds it opened; the hub lives while
/// any handle does.
///
/// **Slow consumers.** Delivery never blocks the sender, and no feed grows
/// without bound: every feed is a channel of at most
/// [`MemoryOptions::feed_capacity`] items (default 4,096),
/// filled while the hub's lock is held (which is what orders each topic,
/// stream and bucket). When a feed's channel is full the feed falls
/// *behind*: the hub stops sending to it and remembers only where it was —
///
/// * a stream reader: the ID of the last entry it was given;
/// * a KV watch: what its consumer was told (a value per matching key,
///   kept for the watch's life) and at most as many changes as its channel
///   holds; beyond that the changes are not kept, only that some were
///   missed;
/// * a subscription: the newest message published since (one message).
///
/// Once the consumer has read its channel down to half, the feed catches
/// up: a stream reader gets every retained entry after the last one it was
/// given, in order — each entry exactly once; a KV watch gets the changes
/// kept, then, if some were missed, the difference between what it was
/// told and the bucket now (`Put` for keys that changed or appeared,
/// `Deleted` for keys that are gone; intermediate values are coalesced,
/// final ones never are — `coordinator/kv_mirror.rs`); a subscription gets the
/// newest message, so, like the etcd backend, pub/sub is at-most-once for a
/// consumer that falls behind — it always ends with the latest message.
/// Catching up happens on the next write to the same topic, stream or
/// bucket, and otherwise on a background thread of the hub that runs only
/// while some feed is behind (it checks every 1–20 ms, faster while the
/// consumer is reading) and ends when none is. The same applies to a
/// stream replay or a KV snapshot larger than the channel: what does not
/// fit is delivered as the consumer reads. Memory per feed is thus bounded
/// by its channel plus one message (subscription), one number (stream
/// reader) or one value per matching key plus a channel's worth of changes
/// (KV watch).
///
/// Dropped feeds are removed at once by their drop hook, and any channel
/// found disconnected is removed on the next send. A feed ended by `close`
/// delivers what is in its channel; what it was behind on is not sent.
///
/// **Streams** number entries 1, 2, 3… per stream and keep all of them, or
/// only the newest `n` with [`MemoryOptions::stream_max_len`];
/// a reader that is behind while its next entries are trimmed continues at
/// the oldest retained entry, as a new reader from a trimmed position would.
pub struct MemoryCoordinator {
    hub: Arc<Hub>,
    id: u64,
    // Closed only with the hub lock held, so a call that checked it under
    // the lock cannot register a feed that `close` then misses.
    life: Lifecycle,
}

struct Hub {
    state: Mutex<State>,
    next_id: AtomicU64,
    stream_max_len: Option<usize>,
    feed_capacity: AtomicUsize,
}

#[derive(Default)]
struct State {
    topics: HashMap<String, Vec<Sub>>,
    streams: HashMap<String, Stream>,
    buckets: HashMap<String, Bucket>,
    /// Whether the catch-up thread runs.
    catching_up: bool,
    /// The last revision handed to a KV write, hub-wide: revisions never
    /// repeat, also across a bucket emptied and set again.
    revision: u64,
    /// Whether the expiry thread runs.
    expiring: bool,
}

/// A registered feed: `id` for its drop hook, `owner` for `close`.
///
/// A feed's state after an offer or a catch-up attempt is an [`Offer`]:
/// `Taken` when everything has been delivered, `Full` while something is
/// still to be delivered (the feed is behind), `Gone` when the consumer
/// is gone and the feed must be unregistered.
struct Reg<T> {
    id: u64,
    owner: u64,
    queue: FeedQueue<T>,
}

impl<T> Reg<T> {
    fn send(&self, item: T) -> Offer<T> {
        self.queue.offer(item)
    }

    /// Whether a feed that is behind may catch up: its consumer has read
    /// the channel down to half.
    fn has_room(&self) -> bool {
        self.queue.has_room()
    }
}

/// A subscription; `latest` holds the newest message it has not been given
/// (holding one = behind), by the keep-newest rule every backend's
/// subscriptions share.
struct Sub {
    reg: Reg<Message>,
    latest: Newest<Message>,
}

impl Sub {
    fn offer(&mut self, msg: &Message) -> Offer {
        if self.latest.is_holding() {
            // Behind: the newer message replaces the older one.
            self.latest.hold(msg.clone());
            return self.catch_up();
        }
        self.send(msg.clone())
    }

    fn catch_up(&mut self) -> Offer {
        let Some(msg) = self.latest.take() else {
            return Offer::Taken;
        };
        if !self.reg.has_room() {
            self.latest.hold(msg);
            return Offer::Full(());
        }
        self.send(msg)
    }

    /// Send `msg`, keeping it as the newest undelivered one if it does not
    /// fit.
    fn send(&mut self, msg: Message) -> Offer {
        match self.reg.send(msg) {
            Offer::Taken => Offer::Taken,
            Offer::Full(msg) => {
                self.latest.hold(msg);
                Offer::Full(())
            }
            Offer::Gone => Offer::Gone,
        }
    }
}

#[derive(Default)]
struct Stream {
    head: u64,
    entries: VecDeque<StreamEntry>,
    readers: Vec<StreamSub>,
}

/// A stream reader: `last` is the ID of the last entry it was given (or its
/// starting point); `behind` while retained entries after it are undelivered.
struct StreamSub {
    reg: Reg<StreamEntry>,
    last: u64,
    behind: bool,
}

impl StreamSub {
    /// Offer the newest entry (already pushed to `entries`).
    fn offer(&mut self, entry: &StreamEntry, entries: &VecDeque<StreamEntry>) -> Offer {
        if self.behind {
            return self.catch_up(entries);
        }
        let offer = self.reg.send(entry.clone()).outcome();
        match offer {
            Offer::Taken => self.last = entry.id.0,
            Offer::Full(()) => self.behind = true,
            Offer::Gone => {}
        }
        offer
    }

    /// Deliver the retained entries after `last`, in order, while they fit.
    fn catch_up(&mut self, entries: &VecDeque<StreamEntry>) -> Offer {
        if !self.behind {
            return Offer::Taken;
        }
        if !self.reg.has_room() {
            return Offer::Full(());
        }
        let start = entries.partition_point(|e| e.id.0 <= self.last);
        for entry in entries.range(start..) {
            match self.reg.send(entry.clone()) {
                Offer::Taken => self.last = entry.id.0,
                Offer::Full(_) => return Offer::Full(()),
                Offer::Gone => return Offer::Gone,
            }
        }
        self.behind = false;
        Offer::Taken
    }
}

#[derive(Default)]
struct Bucket {
    entries: BTreeMap<String, Vec<u8>>,
    /// Each entry's revision.
    revisions: HashMap<String, u64>,
    /// The deadline of each entry set with a TTL.
    expiries: HashMap<String, Instant>,
    /// Counts the bucket's changes: the version its watchers' mirrors
    /// follow (see `coordinator/kv_mirror.rs`).
    version: u64,
    watchers: Vec<KvSub>,
}

/// A KV watch: its consumer's channel and the mirror of what that
/// consumer was told, which decides what it hears (the snapshot, changes,
/// and after falling behind the difference to the bucket as it is then).
struct KvSub {
    reg: Reg<KvEvent>,
    pattern: String,
    mirror: KvMirror,
}

impl KvSub {
    fn new(reg: Reg<KvEvent>, pattern: String) -> Self {
        let limit = reg.queue.capacity();
        KvSub {
            reg,
            pattern,
            // One counter per bucket, bumped under the hub's lock.
            mirror: KvMirror::new(Order::Contiguous, limit),
        }
    }

    fn is_behind(&self) -> bool {
        self.mirror.queued() > 0 || self.mirror.needs_snapshot()
    }

    /// The bucket's change of `key` to `value` (`None`: deleted), which
    /// made its version `version`; `entries` is the bucket after it.
    fn offer(
        &mut self,
        version: u64,
        key: &str,
        value: Option<&[u8]>,
        entries: &BTreeMap<String, Vec<u8>>,
    ) -> Offer {
        // Copied only for a key the watch covers; every change moves the
        // version on.
        let _ = if pattern::matches(&self.pattern, key) {
            self.mirror
                .change(version, key.to_owned(), value.map(<[u8]>::to_vec))
        } else {
            self.mirror.passed(version)
        };
        self.catch_up(version, entries)
    }

    /// Send what the mirror has queued while it fits (resuming only once
    /// the consumer read down to half, like every feed here), and resync
    /// from `entries` (the bucket at `version`) when the mirror wants it.
    fn catch_up(&mut self, version: u64, entries: &BTreeMap<String, Vec<u8>>) -> Offer {
        if !self.is_behind() {
            return Offer::Taken;
        }
        if self.mirror.queued() > 0 && !self.reg.has_room() {
            return Offer::Full(());
        }
        let KvSub {
            reg,
            pattern,
            mirror,
        } = self;
        loop {
            match offer_queued(mirror, |event| reg.send(event)) {
                Offer::Taken if mirror.wants_snapshot() => {
                    let matching = entries
                        .iter()
                        .filter(|(k, _)| pattern::matches(pattern, k))
                        .map(|(k, v)| (k.clone(), v.clone()));
                    mirror.snapshot(version, matching);
                }
                offer => return offer,
            }
        }
    }
}

impl Bucket {
    /// Sets `key` (the entries, its revision, its deadline or none) and
    /// tells the watchers; true if one of them is behind.
    fn set(&mut self, key: &str, value: &[u8], revision: u64, expires: Option<Instant>) -> bool {
        self.entries.insert(key.to_owned(), value.to_vec());
        self.revisions.insert(key.to_owned(), revision);
        match expires {
            Some(at) => self.expiries.insert(key.to_owned(), at),
            // A plain set makes the key permanent again.
            None => self.expiries.remove(key),
        };
        self.version = self.version.saturating_add(1);
        let (entries, version) = (&self.entries, self.version);
        step_all(&mut self.watchers, |w| {
            w.offer(version, key, Some(value), entries)
        })
    }

    /// Removes `key` if present and tells the watchers; true if one of
    /// them is behind.
    fn remove(&mut self, key: &str) -> bool {
        self.revisions.remove(key);
        self.expiries.remove(key);
        if self.entries.remove(key).is_none() {
            return false;
        }
        self.version = self.version.saturating_add(1);
        let (entries, version) = (&self.entries, self.version);
        step_all(&mut self.watchers, |w| w.offer(version, key, None, entries))
    }

    /// Removes every key whose deadline is not after `now`, as deletes;
    /// true if a watcher is behind.
    fn expire(&mut self, now: Instant) -> bool {
        let due: Vec<String> = self
            .expiries
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let mut behind = false;
        for key in due {
            behind |= self.remove(&key);
        }
        behind
    }

    /// The key's revision, `None` when absent (an expired key is absent
    /// even before the expiry thread removed it).
    fn revision(&self, key: &str, now: Instant) -> Option<u64> {
        if self.expiries.get(key).is_some_and(|at| *at <= now) {
            return None;
        }
        self.revisions.get(key).copied()
    }
}

/// Keeps the feeds for which `step` does not say [`Offer::Gone`]; true if
/// any of them is still behind.
fn step_all<T>(feeds: &mut Vec<T>, mut step: impl FnMut(&mut T) -> Offer) -> bool {
    let mut behind = false;
    feeds.retain_mut(|f| match step(f) {
        Offer::Taken => true,
        Offer::Full(()) => {
            behind = true;
            true
        }
        Offer::Gone => false,
    });
    behind
}

impl State {
    /// One catch-up round over every feed that is behind. Returns whether
    /// any is still behind, and whether any consumer had read enough to be
    /// sent more (so another round soon is worth it).
    fn catch_up(&mut self) -> (bool, bool) {
        let mut behind = false;
        let mut moved = false;
        for subs in self.topics.values_mut() {
            behind |= step_all(subs, |s| {
                moved |= s.latest.is_holding() && s.reg.has_room();
                s.catch_up()
            });
        }
        self.topics.retain(|_, subs| !subs.is_empty());
        for stream in self.streams.values_mut() {
            let entries = &stream.entries;
            behind |= step_all(&mut stream.readers, |r| {
                moved |= r.behind && r.reg.has_room();
                r.catch_up(entries)
            });
        }
        for bucket in self.buckets.values_mut() {
            let (entries, version) = (&bucket.entries, bucket.version);
            behind |= step_all(&mut bucket.watchers, |w| {
                moved |= w.is_behind() && w.reg.has_room();
                w.catch_up(version, entries)
            });
        }
        self.buckets
            .retain(|_, b| !(b.entries.is_empty() && b.watchers.is_empty()));
        (behind, moved)
    }
}

impl State {
    /// Expires what is due in `bucket` (watchers hear it before anything
    /// else that happens to the bucket); true if a watcher is behind.
    fn expire_bucket(&mut self, bucket: &str, now: Instant) -> bool {
        let Some(b) = self.buckets.get_mut(bucket) else {
            return false;
        };
        if b.expiries.is_empty() {
            return false;
        }
        let behind = b.expire(now);
        if b.entries.is_empty() && b.watchers.is_empty() {
            self.buckets.remove(bucket);
        }
        behind
    }

    /// Expires what is due in every bucket; returns whether a watcher is
    /// behind, and the next deadline left.
    fn expire_all(&mut self, now: Instant) -> (bool, Option<Instant>) {
        let mut behind = false;
        let mut next: Option<Instant> = None;
        for b in self.buckets.values_mut() {
            if b.expiries.is_empty() {
                continue;
            }
            behind |= b.expire(now);
            if let Some(at) = b.expiries.values().min() {
                next = Some(next.map_or(*at, |n| n.min(*at)));
            }
        }
        self.buckets
            .retain(|_, b| !(b.entries.is_empty() && b.watchers.is_empty()));
        (behind, next)
    }

    /// The next revision, hub-wide.
    fn next_revision(&mut self) -> u64 {
        self.revision = self.revision.saturating_add(1);
        self.revision
    }
}

/// Where a feed is registered, for its drop hook.
enum Place {
    Topic(String),
    Stream(String),
    Bucket(String),
}

impl MemoryCoordinator {
    /// A new, empty hub whose streams keep every entry, with feeds of the
    /// default capacity (4,096).
    pub fn new() -> Self {
        Self::with_hub(None)
    }

    /// A new, empty hub with `options`, checked: a feed capacity outside
    /// [`MIN_FEED_CAPACITY`](super::MIN_FEED_CAPACITY) ..=
    /// [`MAX_FEED_CAPACITY`](super::MAX_FEED_CAPACITY) or a stream length
    /// of 0 is refused with [`Error::InvalidArgument`], as every backend
    /// refuses it.
    ///
    /// ```
    /// use fleetcoord::coordinator::{Coordinator, MemoryCoordinator, MemoryOptions};
    ///
    /// let options = MemoryOptions::default().with_feed_capacity(2).with_stream_max_len(100);
    /// let coord = MemoryCoordinator::with_options(options)?;
    /// let sub = coord.subscribe("t")?;
    /// for i in 0..10u8 {
    ///     coord.publish("t", &[i])?; // never blocks
    /// }
    /// assert_eq!(sub.receiver().len(), 2);
    /// assert!(MemoryCoordinator::with_options(MemoryOptions::default().with_feed_capacity(1)).is_err());
    /// # Ok::<(), fleetcoord::Error>(())
    /// ```
    pub fn with_options(options: MemoryOptions) -> Result<Self> {
        crate::validate::capacity("feed_capacity", options.feed_capacity)?;
        if options.stream_max_len == Some(0) {
            return Err(Error::invalid("stream_max_len", "0 would keep no entry"));
        }
        let coord = Self::with_hub(options.stream_max_len);
        coord
            .hub
            .feed_capacity
            .store(options.feed_capacity, Ordering::Relaxed);
        Ok(coord)
    }

    /// The capacity of feeds opened from now on.
    pub fn feed_capacity(&self) -> usize {
        self.hub.feed_capacity.load(Ordering::Relaxed)
    }

    fn with_hub(stream_max_len: Option<usize>) -> Self {
        let hub = Hub {
            state: Mutex::new(State::default()),
            next_id: AtomicU64::new(1),
            stream_max_len,
            feed_capacity: AtomicUsize::new(DEFAULT_FEED_CAPACITY),
        };
        Self::handle(Arc::new(hub))
    }

    fn handle(hub: Arc<Hub>) -> Self {
        let id = hub.next_id.fetch_add(1, Ordering::Relaxed);
        MemoryCoordinator {
            hub,
            id,
            life: Lifecycle::new(),
        }
    }

    /// Locks the hub, failing if this handle is closed (the calls that
    /// check without the lock fail fast, and check again under it).
    fn lock(&self) -> Result<parking_lot::MutexGuard<'_, State>> {
        let state = self.hub.state.lock();
        self.life.check_open()?;
        Ok(state)
    }

    /// A registration with a new feed queue, and its receiver.
    fn new_reg<T>(&self) -> (Reg<T>, crossbeam_channel::Receiver<T>) {
        let (queue, rx) = FeedQueue::new(self.feed_capacity());
        let reg = Reg {
            id: self.hub.next_id.fetch_add(1, Ordering::Relaxed),
            owner: self.id,
            queue,
        };
        (reg, rx)
    }

    fn feed<T>(&self, rx: crossbeam_channel::Receiver<T>, id: u64, place: Place) -> Feed<T> {
        let hub = Arc::downgrade(&self.hub);
        Feed::new(rx, move || unregister(&hub, id, place))
    }

    /// Make sure the catch-up thread runs while a feed is behind. Called
    /// with the lock held, which is also what the thread needs to end: it
    /// cannot miss a feed that falls behind while it decides to stop.
    fn keep_up(&self, state: &mut State, behind: bool) {
        if !behind || state.catching_up {
            return;
        }
        let hub = Arc::downgrade(&self.hub);
        let spawned = std::thread::Builder::new()
            .name("fleetcoord-memory-catch-up".into())
            .spawn(move || catch_up_loop(&hub));
        match spawned {
            Ok(_) => state.catching_up = true,
            // Feeds that are behind then catch up on the next write to them.
            Err(e) => log::warn!("cannot start the memory hub's catch-up thread: {e}"),
        }
    }

    /// Make sure the expiry thread runs while a key has a deadline. Called
    /// with the lock held, which the thread needs to decide to end: it
    /// cannot miss a deadline set while it stops.
    fn keep_expiring(&self, state: &mut State) {
        if state.expiring {
            return;
        }
        let hub = Arc::downgrade(&self.hub);
        let spawned = std::thread::Builder::new()
            .name("fleetcoord-memory-expiry".into())
            .spawn(move || expiry_loop(&hub));
        match spawned {
            Ok(_) => state.expiring = true,
            // Refused rather than kept forever: the contract says the key
            // is gone, and watchers hear it, after its TTL.
            Err(e) => log::warn!("cannot start the memory hub's expiry thread: {e}"),
        }
    }

    /// Ends every feed this handle opened (their senders are dropped).
    fn close_feeds(&self, state: &mut State) {
        let me = self.id;
        state.topics.retain(|_, subs| {
            subs.retain(|s| s.reg.owner != me);
            !subs.is_empty()
        });
        for stream in state.streams.values_mut() {
            stream.readers.retain(|r| r.reg.owner != me);
        }
        state.buckets.retain(|_, b| {
            b.watchers.retain(|w| w.reg.owner != me);
            !(b.entries.is_empty() && b.watchers.is_empty())
        });
    }
}

/// The catch-up thread: while some feed is behind, deliver to it as its
/// consumer reads; end when none is, or when the hub is gone.
fn catch_up_loop(hub: &Weak<Hub>) {
    let mut pause = CATCH_UP_FAST;
    loop {
        std::thread::sleep(pause);
        let Some(hub) = hub.upgrade() else { return };
        let mut state = hub.state.lock();
        let (behind, moved) = state.catch_up();
        if !behind {
            state.catching_up = false;
            return;
        }
        pause = if moved {
            CATCH_UP_FAST
        } else {
            (pause * 2).min(CATCH_UP_SLOW)
        };
    }
}

/// The expiry thread: while some key has a deadline, remove it when due
/// (as a delete watchers hear); end when none has, or the hub is gone.
fn expiry_loop(hub: &Weak<Hub>) {
    loop {
        let pause = {
            let Some(hub) = hub.upgrade() else { return };
            let mut state = hub.state.lock();
            let now = Instant::now();
            let (behind, next) = state.expire_all(now);
            if behind && !state.catching_up {
                let weak = Arc::downgrade(&hub);
                if std::thread::Builder::new()
                    .name("fleetcoord-memory-catch-up".into())
                    .spawn(move || catch_up_loop(&weak))
                    .is_ok()
                {
                    state.catching_up = true;
                }
            }
            let Some(next) = next else {
                state.expiring = false;
                return;
            };
            next.saturating_duration_since(now).min(EXPIRY_PAUSE)
        };
        std::thread::sleep(pause);
    }
}

fn unregister(hub: &Weak<Hub>, id: u64, place: Place) {
    let Some(hub) = hub.upgrade() else { return };
    let mut state = hub.state.lock();
    match place {
        Place::Topic(topic) => {
            if let Some(subs) = state.topics.get_mut(&topic) {
                subs.retain(|s| s.reg.id != id);
                if subs.is_empty() {
                    state.topics.remove(&topic);
                }
            }
        }
        Place::Stream(name) => {
            if let Some(stream) = state.streams.get_mut(&name) {
                stream.readers.retain(|r| r.reg.id != id);
            }
        }
        Place::Bucket(name) => {
            if let Some(bucket) = state.buckets.get_mut(&name) {
                bucket.watchers.retain(|w| w.reg.id != id);
                if bucket.entries.is_empty() && bucket.watchers.is_empty() {
                    state.buckets.remove(&name);
                }
            }
        }
    }
}

impl Default for MemoryCoordinator {
    fn default() -> Self {
        Self::new()
    }
}

impl Clone for MemoryCoordinator {
    /// Another open handle onto the same hub, closed independently.
    fn clone(&self) -> Self {
        Self::handle(self.hub.clone())
    }
}

impl Drop for MemoryCoordinator {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl std::fmt::Debug for MemoryCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryCoordinator")
            .field("handle", &self.id)
            .field("closed", &self.life.is_closed())
            .field("feed_capacity", &self.feed_capacity())
            .finish()
    }
}

impl Coordinator for MemoryCoordinator {
    fn publish(&self, topic: &str, payload: &[u8]) -> Result<()> {
        self.life.check_open()?;
        check_name("topic", topic)?;
        check_payload("memory", "payload", payload)?;
        let mut state = self.lock()?;
        let Some(subs) = state.topics.get_mut(topic) else {
            return Ok(());
        };
        let msg = Message {
            topic: topic.to_owned(),
            payload: payload.to_vec(),
        };
        let behind = step_all(subs, |s| s.offer(&msg));
        if subs.is_empty() {
            state.topics.remove(topic);
        }
        self.keep_up(&mut state, behind);
        Ok(())
    }

    fn subscribe(&self, topic: &str) -> Result<Subscription> {
        self.life.check_open()?;
        check_name("topic", topic)?;
        let (reg, rx) = self.new_reg();
        let id = reg.id;
        self.lock()?
            .topics
            .entry(topic.to_owned())
            .or_default()
            .push(Sub {
                reg,
                latest: Newest::new(),
            });
        Ok(self.feed(rx, id, Place::Topic(topic.to_owned())))
    }

    fn append_stream(&self, stream: &str, payload: &[u8]) -> Result<StreamId> {
        self.life.check_open()?;
        check_name("stream", stream)?;
        check_payload("memory", "payload", payload)?;
        let mut state = self.lock()?;
        let s = state.streams.entry(stream.to_owned()).or_default();
        s.head += 1;
        let id = StreamId(s.head);
        let entry = StreamEntry {
            id,
            payload: payload.to_vec(),
        };
        s.entries.push_back(entry.clone());
        let entries = &s.entries;
        let behind = step_all(&mut s.readers, |r| r.offer(&entry, entries));
        if let Some(max) = self.hub.stream_max_len {
            while s.entries.len() > max {
                s.entries.pop_front();
            }
        }
        self.keep_up(&mut state, behind);
        Ok(id)
    }

    fn read_stream(&self, stream: &str, from: StreamPosition) -> Result<StreamReader> {
        self.life.check_open()?;
        check_name("stream", stream)?;
        let (reg, rx) = self.new_reg();
        let id = reg.id;
        let mut state = self.lock()?;
        let s = state.streams.entry(stream.to_owned()).or_default();
        // Replay and registration happen under one lock: no gap, no repeat.
        // A reader starts behind its starting point; what of the replay
        // does not fit in its channel comes as the consumer reads.
        let last = match from {
            StreamPosition::Start => 0,
            StreamPosition::End => s.head,
            StreamPosition::After(StreamId(n)) => n.min(s.head),
        };
        let mut reader = StreamSub {
            reg,
            last,
            behind: true,
        };
        // The receiver is still in hand, so this cannot be Gone.
        let behind = reader.catch_up(&s.entries) == Offer::Full(());
        s.readers.push(reader);
        self.keep_up(&mut state, behind);
        drop(state);
        Ok(self.feed(rx, id, Place::Stream(stream.to_owned())))
    }

    fn kv_set(&self, bucket: &str, key: &str, value: &[u8]) -> Result<()> {
        self.kv_set_with(bucket, key, value, KvSetOptions::new())
            .map(|_| ())
    }

    fn kv_get(&self, bucket: &str, key: &str) -> Result<Vec<u8>> {
        self.kv_get_entry(bucket, key).map(|entry| entry.value)
    }

    fn kv_get_entry(&self, bucket: &str, key: &str) -> Result<KvEntry> {
        self.life.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        let state = self.lock()?;
        let b = state.buckets.get(bucket).ok_or(Error::NotFound)?;
        let revision = b.revision(key, Instant::now()).ok_or(Error::NotFound)?;
        let value = b.entries.get(key).cloned().ok_or(Error::NotFound)?;
        Ok(KvEntry { value, revision })
    }

    fn kv_set_with(
        &self,
        bucket: &str,
        key: &str,
        value: &[u8],
        options: KvSetOptions,
    ) -> Result<u64> {
        self.life.check_open()?;
        let plan = check_set("memory", bucket, key, value, options)?;
        let now = Instant::now();
        let expires = plan
            .ttl_secs
            .map(|secs| now.checked_add(Duration::from_secs(secs)))
            .map(|at| {
                at.ok_or_else(|| Error::invalid("ttl", "ends beyond what this clock can count"))
            })
            .transpose()?;
        let mut state = self.lock()?;
        // Whatever expired is gone before the condition is checked, and
        // watchers hear its delete before this write.
        let mut behind = state.expire_bucket(bucket, now);
        let current = state.buckets.get(bucket).and_then(|b| b.revision(key, now));
        let verdict = fleetcoord_sm::kv::check(plan.condition, current);
        if let Some(error) = refused(bucket, key, plan.condition, verdict) {
            self.keep_up(&mut state, behind);
            return Err(error);
        }
        let revision = state.next_revision();
        let b = state.buckets.entry(bucket.to_owned()).or_default();
        behind |= b.set(key, value, revision, expires);
        if expires.is_some() {
            self.keep_expiring(&mut state);
        }
        self.keep_up(&mut state, behind);
        Ok(revision)
    }

    fn kv_delete(&self, bucket: &str, key: &str) -> Result<()> {
        self.life.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        let mut state = self.lock()?;
        let mut behind = state.expire_bucket(bucket, Instant::now());
        let Some(b) = state.buckets.get_mut(bucket) else {
            self.keep_up(&mut state, behind);
            return Ok(());
        };
        behind |= b.remove(key);
        if b.entries.is_empty() && b.watchers.is_empty() {
            state.buckets.remove(bucket);
        }
        self.keep_up(&mut state, behind);
        Ok(())
    }

    fn kv_watch(&self, bucket: &str, pat: &str) -> Result<KvWatcher> {
        self.life.check_open()?;
        check_name("bucket", bucket)?;
        pattern::validate(pat)?;
        let (reg, rx) = self.new_reg();
        let id = reg.id;
        let mut state = self.lock()?;
        // The snapshot holds no key past its deadline.
        let expired_behind = state.expire_bucket(bucket, Instant::now());
        self.keep_up(&mut state, expired_behind);
        let b = state.buckets.entry(bucket.to_owned()).or_default();
        // The watch starts with its whole snapshot queued; what does not
        // fit in its channel comes as the consumer reads, then `Synced`.
        let mut watcher = KvSub::new(reg, pat.to_owned());
        // The receiver is still in hand, so this cannot be Gone.
        let behind = watcher.catch_up(b.version, &b.entries) == Offer::Full(());
        b.watchers.push(watcher);
        self.keep_up(&mut state, behind);
        drop(state);
        Ok(self.feed(rx, id, Place::Bucket(bucket.to_owned())))
    }

    fn ping(&self) -> Result<()> {
        self.life.check_open()
    }

    fn close(&self) -> Result<()> {
        let mut state = self.hub.state.lock();
        if self.life.close() {
            self.close_feeds(&mut state);
        }
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            delivers: true,
            stream_max_len: self.hub.stream_max_len.map(|n| n as u64),
        }
    }

    fn describe(&self) -> String {
        "memory".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hub whose feeds hold `capacity` items.
    fn capped(capacity: usize) -> MemoryCoordinator {
        MemoryCoordinator::with_options(MemoryOptions::default().with_feed_capacity(capacity))
            .expect("a capacity within the bounds")
    }
    use crossbeam_channel::Receiver;
    use std::time::Instant;

    const T: Duration = Duration::from_secs(1);

    fn counts(c: &MemoryCoordinator) -> (usize, usize, usize) {
        let s = c.hub.state.lock();
        (
            s.topics.values().map(Vec::len).sum(),
            s.streams.values().map(|s| s.readers.len()).sum(),
            s.buckets.values().map(|b| b.watchers.len()).sum(),
        )
    }

    fn catching_up(c: &MemoryCoordinator) -> bool {
        c.hub.state.lock().catching_up
    }

    /// Waits until the catch-up thread has ended (nothing is behind).
    fn settle(c: &MemoryCoordinator) {
        let wait = Duration::from_secs(5);
        let deadline = Instant::now() + wait;
        while catching_up(c) {
            assert!(
                Instant::now() < deadline,
                "still catching up after {wait:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn dropped_feeds_are_unregistered() {
        let c = MemoryCoordinator::new();
        let sub = c.subscribe("t").unwrap();
        let reader = c.read_stream("s", StreamPosition::End).unwrap();
        let watch = c.kv_watch("b", "*").unwrap();
        assert_eq!(counts(&c), (1, 1, 1));
        drop((sub, reader, watch));
        assert_eq!(counts(&c), (0, 0, 0));
        assert!(c.hub.state.lock().topics.is_empty());
        assert!(c.hub.state.lock().buckets.is_empty());
    }

    #[test]
    fn close_ends_only_own_feeds() {
        let a = MemoryCoordinator::new();
        let b = a.clone();
        let sa = a.subscribe("t").unwrap();
        let sb = b.subscribe("t").unwrap();
        a.close().unwrap();
        assert!(matches!(
            sa.recv_timeout(T),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        ));
        assert!(matches!(a.publish("t", b"x"), Err(Error::Closed)));
        b.publish("t", b"x").unwrap();
        assert_eq!(sb.recv_timeout(T).unwrap().payload, b"x");
        assert_eq!(counts(&b), (1, 0, 0));
    }

    #[test]
    fn dropping_the_last_handle_ends_feeds() {
        let c = MemoryCoordinator::new();
        let sub = c.subscribe("t").unwrap();
        drop(c);
        assert!(sub.recv_timeout(T).is_err());
    }

    #[test]
    fn trimming_keeps_newest() {
        let c = MemoryCoordinator::with_options(MemoryOptions::default().with_stream_max_len(3))
            .unwrap();
        for i in 0..10u8 {
            c.append_stream("s", &[i]).unwrap();
        }
        let r = c
            .read_stream("s", StreamPosition::After(StreamId(2)))
            .unwrap();
        let ids: Vec<u64> = (0..3).map(|_| r.recv_timeout(T).unwrap().id.0).collect();
        assert_eq!(ids, [8, 9, 10]);
        assert!(r.try_recv().is_err());
    }

    #[test]
    fn after_beyond_head_starts_with_next_append() {
        let c = MemoryCoordinator::new();
        c.append_stream("s", b"1").unwrap();
        let r = c
            .read_stream("s", StreamPosition::After(StreamId(100)))
            .unwrap();
        assert_eq!(c.append_stream("s", b"2").unwrap(), StreamId(2));
        assert_eq!(r.recv_timeout(T).unwrap().id, StreamId(2));
    }

    #[test]
    fn capacity_is_the_hubs_and_applies_to_its_feeds() {
        let c = MemoryCoordinator::new();
        assert_eq!(c.feed_capacity(), DEFAULT_FEED_CAPACITY);
        let default = c.subscribe("t").unwrap();
        for i in 0..=DEFAULT_FEED_CAPACITY {
            c.publish("t", &i.to_be_bytes()).unwrap();
        }
        assert_eq!(default.receiver().len(), DEFAULT_FEED_CAPACITY);
        let c = capped(8);
        let other = c.clone();
        assert_eq!(other.feed_capacity(), 8, "the capacity is the hub's");
        let sub = other.subscribe("t").unwrap();
        for i in 0..20u8 {
            c.publish("t", &[i]).unwrap();
        }
        assert_eq!(sub.receiver().len(), 8);
    }

    /// A capacity of `usize::MAX` used to abort the process at the next
    /// subscribe (when feeds were bounded channels that allocate every slot
    /// up front), and below 2 the half-read resume rule has no room. Both
    /// are refused.
    #[test]
    fn capacity_outside_the_library_wide_bounds_is_refused() {
        for capacity in [0, 1, crate::validate::MAX_CAPACITY + 1, usize::MAX] {
            let options = MemoryOptions::default().with_feed_capacity(capacity);
            match MemoryCoordinator::with_options(options) {
                Err(Error::InvalidArgument {
                    what: "feed_capacity",
                    ..
                }) => {}
                other => panic!("{capacity}: {other:?}"),
            }
        }
        let c = capped(crate::validate::MAX_CAPACITY);
        assert_eq!(c.feed_capacity(), crate::validate::MAX_CAPACITY);
    }

    // The slow-consumer contract is the conformance suite's
    // (`conformance/slow.rs`, run on this backend by
    // tests/conformance_memory.rs); what stays here is only what this hub
    // promises beyond it: exactly what fit and then the newest message,
    // trimming, and how far a backlog is coalesced.

    #[test]
    fn a_slow_subscriber_gets_exactly_what_fit_then_the_newest() {
        let c = capped(4);
        let slow = c.subscribe("t").unwrap();
        for i in 0..10_000u32 {
            c.publish("t", &i.to_be_bytes()).unwrap();
        }
        // What fit, then (after reading) the newest one.
        let mut seen = Vec::new();
        while let Ok(m) = slow.recv_timeout(Duration::from_millis(500)) {
            seen.push(u32::from_be_bytes(m.payload.try_into().unwrap()));
        }
        assert_eq!(seen, [0, 1, 2, 3, 9_999]);
        settle(&c);
        // Current again: the next message is delivered as usual.
        c.publish("t", b"next").unwrap();
        assert_eq!(slow.recv_timeout(T).unwrap().payload, b"next");
    }

    #[test]
    fn behind_reader_skips_only_trimmed_entries() {
        let c = MemoryCoordinator::with_options(
            MemoryOptions::default()
                .with_stream_max_len(10)
                .with_feed_capacity(4),
        )
        .unwrap();
        let r = c.read_stream("s", StreamPosition::Start).unwrap();
        for i in 0..100u8 {
            c.append_stream("s", &[i]).unwrap();
        }
        let ids: Vec<u64> = std::iter::from_fn(|| r.recv_timeout(Duration::from_millis(500)).ok())
            .map(|e| e.id.0)
            .collect();
        assert_eq!(ids, [1, 2, 3, 4, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100]);
    }

    #[test]
    fn catch_up_thread_ends_when_nothing_is_behind() {
        let c = capped(2);
        let sub = c.subscribe("t").unwrap();
        for i in 0..5u8 {
            c.publish("t", &[i]).unwrap();
        }
        assert!(catching_up(&c));
        while sub.recv_timeout(Duration::from_millis(500)).is_ok() {}
        settle(&c);
        // A dropped feed that was behind does not keep it running either.
        for i in 0..5u8 {
            c.publish("t", &[i]).unwrap();
        }
        assert!(catching_up(&c));
        drop(sub);
        settle(&c);
    }

    #[test]
    fn debug_default_and_deleting_what_is_not_there() {
        let c = MemoryCoordinator::default();
        let text = format!("{c:?}");
        assert!(
            text.contains("closed: false") && text.contains("feed_capacity: 4096"),
            "{text}"
        );
        // Deleting in a bucket that never existed creates nothing.
        c.kv_delete("nowhere", "k").unwrap();
        assert!(c.hub.state.lock().buckets.is_empty());
        // A bucket emptied by a delete, with no watch on it, is forgotten.
        c.kv_set("b", "k", b"v").unwrap();
        c.kv_delete("b", "k").unwrap();
        assert!(c.hub.state.lock().buckets.is_empty());
        c.close().unwrap();
        assert!(format!("{c:?}").contains("closed: true"));
    }

    #[test]
    fn a_key_created_and_deleted_while_behind_ends_absent() {
        let c = capped(2);
        let watch = c.kv_watch("b", "*").unwrap();
        c.kv_set("b", "a", b"1").unwrap();
        // The channel (Synced, a) is full: `x` comes and goes while the
        // consumer is behind, and more changes than its mirror may hold
        // for it follow, so it resyncs to the bucket as it is.
        c.kv_set("b", "x", b"brief").unwrap();
        c.kv_delete("b", "x").unwrap();
        for i in 0..4 {
            c.kv_set("b", "a", format!("{i}").as_bytes()).unwrap();
        }
        assert_eq!(watch.recv_timeout(T).unwrap(), KvEvent::Synced);
        let mut view = BTreeMap::new();
        let mut events = 0;
        loop {
            match watch.recv_timeout(Duration::from_millis(300)) {
                Ok(KvEvent::Put { key, value }) => {
                    view.insert(key, value);
                }
                Ok(KvEvent::Deleted { key }) => {
                    assert!(view.remove(&key).is_some(), "Deleted for an untold {key}");
                }
                Ok(KvEvent::Synced) => panic!("Synced twice"),
                Err(_) => break,
            }
            events += 1;
        }
        assert_eq!(view, BTreeMap::from([("a".to_string(), b"3".to_vec())]));
        // 1 + at most the mirror's bound (2) of live changes + the resync.
        assert!(
            events <= 4,
            "{events} events: the backlog was not coalesced"
        );
        c.kv_set("b", "after", b"2").unwrap();
        assert_eq!(
            watch.recv_timeout(T).unwrap(),
            KvEvent::Put {
                key: "after".into(),
                value: b"2".to_vec()
            }
        );
        assert!(watch.try_recv().is_err());
    }

    // A `Feed` runs its drop hook (which unregisters it) before its receiver
    // goes, so through the public API the hub never finds a channel
    // disconnected. These register feeds as `subscribe`, `read_stream` and
    // `kv_watch` do but hand back the bare receiver: dropping it is a
    // consumer gone without unregistering, which the hub must notice by
    // itself the next time it sends, whether the feed is current or behind.

    fn bare_subscription(c: &MemoryCoordinator, topic: &str) -> Receiver<Message> {
        let (reg, rx) = c.new_reg();
        let mut state = c.lock().unwrap();
        let subs = state.topics.entry(topic.to_owned()).or_default();
        subs.push(Sub {
            reg,
            latest: Newest::new(),
        });
        rx
    }

    fn bare_reader(c: &MemoryCoordinator, stream: &str) -> Receiver<StreamEntry> {
        let (reg, rx) = c.new_reg();
        let mut state = c.lock().unwrap();
        let s = state.streams.entry(stream.to_owned()).or_default();
        let last = s.head;
        s.readers.push(StreamSub {
            reg,
            last,
            behind: false,
        });
        rx
    }

    /// A watch of every key: `current` = its snapshot and `Synced` already
    /// delivered; otherwise nothing of them yet.
    fn bare_watch(c: &MemoryCoordinator, bucket: &str, current: bool) -> Receiver<KvEvent> {
        let (reg, rx) = c.new_reg();
        let mut state = c.lock().unwrap();
        let b = state.buckets.entry(bucket.to_owned()).or_default();
        let mut watcher = KvSub::new(reg, "*".into());
        watcher.mirror.snapshot(b.version, b.entries.clone());
        if current {
            // As if the consumer had been told all of it.
            while watcher.mirror.poll().is_some() {}
        }
        b.watchers.push(watcher);
        rx
    }

    #[test]
    fn consumers_gone_without_unregistering_are_dropped_on_the_next_send() {
        let c = MemoryCoordinator::new();
        let live = c.subscribe("t").unwrap();
        drop(bare_subscription(&c, "t"));
        drop(bare_subscription(&c, "lonely"));
        drop(bare_reader(&c, "s"));
        drop(bare_watch(&c, "b", true));
        assert_eq!(counts(&c), (3, 1, 1));
        c.publish("t", b"x").unwrap();
        c.publish("lonely", b"x").unwrap();
        c.append_stream("s", b"x").unwrap();
        c.kv_set("b", "k", b"x").unwrap();
        assert_eq!(counts(&c), (1, 0, 0));
        assert!(!c.hub.state.lock().topics.contains_key("lonely"));
        assert_eq!(live.recv_timeout(T).unwrap().payload, b"x");
        assert!(!catching_up(&c), "nothing is behind");
    }

    #[test]
    fn consumers_gone_while_behind_are_dropped_by_the_catch_up() {
        let c = capped(2);
        let sub = bare_subscription(&c, "t");
        let reader = bare_reader(&c, "s");
        let told = bare_watch(&c, "told", true);
        for k in ["k1", "k2", "k3"] {
            c.kv_set("snapshot", k, b"v").unwrap();
        }
        c.kv_set("synced", "k1", b"v").unwrap();
        c.kv_set("synced", "k2", b"v").unwrap();
        let snapshot = bare_watch(&c, "snapshot", false);
        let synced = bare_watch(&c, "synced", false);
        for i in 0..3u8 {
            c.publish("t", &[i]).unwrap();
            c.append_stream("s", &[i]).unwrap();
            c.kv_set("told", &format!("k{i}"), &[i]).unwrap();
        }
        // A rewrite sends the unwatched snapshots what fits: two Puts, and
        // `synced` then misses its Synced, `snapshot` its third Put.
        c.kv_set("snapshot", "k1", b"v").unwrap();
        c.kv_set("synced", "k1", b"v").unwrap();
        assert_eq!(counts(&c), (1, 1, 3));
        assert!(catching_up(&c));
        {
            // Under the hub's lock, so that the catch-up thread cannot
            // deliver before the consumers go: each read its channel
            // empty, which lets the hub send again, and then vanished.
            let _state = c.hub.state.lock();
            for _ in 0..2 {
                sub.try_recv().unwrap();
                reader.try_recv().unwrap();
                told.try_recv().unwrap();
                snapshot.try_recv().unwrap();
                synced.try_recv().unwrap();
            }
            drop((sub, reader, told, snapshot, synced));
        }
        settle(&c);
        assert_eq!(counts(&c), (0, 0, 0));
    }
}
