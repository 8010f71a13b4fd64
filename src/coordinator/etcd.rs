//! The etcd backend: pub/sub, streams and KV on keys under one root. Pub/sub
//! and KV are watched with the same sm `Watch` machine that powers
//! [`crate::HostWatcher`]; streams are sm's `Append` and `Reader` machines.
//! All of them run on the driver; this file only maps names and notices.

use super::lane::{Dispatch, Lane, LaneEngine, LaneMsg, Lanes};
use super::lifecycle::Lifecycle;
use super::{
    check_key, check_name, check_payload, check_set, pattern, refused, Capabilities, Coordinator,
    Feed, KvEntry, KvEvent, KvSetOptions, KvWatcher, Message, StreamEntry, StreamId,
    StreamPosition, StreamReader, Subscription,
};
use crate::deadline::deadline_after;
use crate::driver::{self, rand_seed, FeedItem, MachineHandle, Notify, StopHandle};
use crate::endpoints::Endpoints;
use crate::error::{Error, ErrorKind, Result};
use crate::etcd::{Etcd, EtcdOptions};
use crate::validate;
use fleetcoord_sm::stream::{
    Append, AppendConfig, AppendInput, AppendNotice, Head, Reader, ReaderConfig, ReaderNotice,
    StreamError, StreamKeys,
};
use fleetcoord_sm::watch::{KeyRule, Watch, WatchConfig, WatchNotice, DEFAULT_PAGE_SIZE};
use fleetcoord_sm::{
    BackoffConfig, Compare, KeyRange, Machine, RangeRequest, Request, Response, Txn, TxnOp,
    TxnOpResponse,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Settings of an [`EtcdCoordinator`].
///
/// Start from [`EtcdCoordinatorOptions::default`] and change what you need
/// with the `with_*` methods; the fields are public for reading.
/// `#[non_exhaustive]` so that new settings are not a breaking change.
///
/// ```
/// use fleetcoord::coordinator::EtcdCoordinatorOptions;
///
/// let options = EtcdCoordinatorOptions::default().with_root("/myapp").with_stream_max_len(1000);
/// assert_eq!(options.stream_max_len, Some(1000));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EtcdCoordinatorOptions {
    /// Every key lives under this root (`<root>/kv/…`, `<root>/topic/…`,
    /// `<root>/stream/…`). Starts with `/`, no trailing `/`. Default `/coord`.
    pub root: String,
    /// Keep only the newest `n` entries of each stream (each append deletes
    /// the entry that falls out). `None` keeps everything. Default `None`.
    pub stream_max_len: Option<u64>,
    /// How many items every feed's channel (subscriptions, stream readers,
    /// KV watches) holds at most: 2 to 1,048,576; see "Slow consumers" on
    /// [`EtcdCoordinator`]. Default 4,096. Memory is taken as items queue
    /// up, not for the whole capacity up front.
    pub feed_capacity: usize,
    /// How [`EtcdCoordinator::connect`] and [`EtcdCoordinator::with_options`]
    /// connect to etcd (timeouts, TLS, user). Not used by
    /// [`EtcdCoordinator::on_etcd_with_options`]: a handle has its own.
    /// Default [`EtcdOptions::default`].
    pub etcd_options: EtcdOptions,
}

impl Default for EtcdCoordinatorOptions {
    fn default() -> Self {
        EtcdCoordinatorOptions {
            root: "/coord".into(),
            stream_max_len: None,
            feed_capacity: crate::coordinator::DEFAULT_FEED_CAPACITY,
            etcd_options: EtcdOptions::default(),
        }
    }
}

impl EtcdCoordinatorOptions {
    /// These options with [`EtcdCoordinatorOptions::etcd_options`] set
    /// (checked by [`EtcdCoordinator::with_options`]).
    #[must_use]
    pub fn with_etcd_options(mut self, etcd_options: EtcdOptions) -> Self {
        self.etcd_options = etcd_options;
        self
    }

    /// Every coordinator setting within its documented range, or the
    /// first one that is not, named. The connection's are checked by
    /// [`Etcd::with_options`].
    fn check(&self) -> Result<()> {
        let root = &self.root;
        if !root.starts_with('/') || root.ends_with('/') || root.len() < 2 {
            return Err(Error::invalid(
                "root",
                format!("{root:?} must start with '/' and not end with '/'"),
            ));
        }
        validate::key("root", root)?;
        if self.stream_max_len == Some(0) {
            return Err(Error::invalid("stream_max_len", "must be at least 1"));
        }
        validate::capacity("feed_capacity", self.feed_capacity)
    }

    /// These options with [`EtcdCoordinatorOptions::root`] set (checked by
    /// [`EtcdCoordinator::on_etcd_with_options`]).
    #[must_use]
    pub fn with_root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// These options keeping only the newest `max_len` entries of each
    /// stream (at least 1, checked by [`EtcdCoordinator::on_etcd_with_options`]).
    #[must_use]
    pub const fn with_stream_max_len(mut self, max_len: u64) -> Self {
        self.stream_max_len = Some(max_len);
        self
    }

    /// These options with [`EtcdCoordinatorOptions::feed_capacity`] set
    /// (checked by [`EtcdCoordinator::on_etcd_with_options`]).
    #[must_use]
    pub const fn with_feed_capacity(mut self, capacity: usize) -> Self {
        self.feed_capacity = capacity;
        self
    }
}

/// A [`Coordinator`] on etcd.
///
/// Layout under the root: KV keys at `<root>/kv/<bucket>/<key>`; one key per
/// topic at `<root>/topic/<topic>`, overwritten by each publish; streams as
/// `<root>/stream/<name>/head` (the last sequence number) plus entries at
/// `<root>/stream/<name>/e/<sequence, 20 digits>`.
///
/// Semantics beyond the trait's:
/// * **pub/sub** is live-only and ordered per topic. A subscription is
///   live when `subscribe` returns. Delivery is at-most-once across
///   connection failures: after a reconnect the subscriber resumes with the
///   topic's latest message if it changed meanwhile, and messages published
///   in between are not replayed.
/// * **streams**: IDs are sequence numbers, assigned by a transaction guarded
///   on the head key, so concurrent appenders from any number of processes
///   get unique, increasing IDs. Appends of one coordinator to one stream,
///   from any number of its threads, go to one machine, which writes
///   whatever queued while a transaction was in flight in the next one
///   (up to 32 entries, consecutive IDs): they never race each other, and
///   a busy stream costs one transaction per round trip. An append that
///   loses the race to another process retries after
///   a short jittered backoff, a bounded number of times, then fails. An
///   append whose transaction fails in flight (etcd restarting, a leader
///   change) sends the identical guarded transaction again, which can apply
///   only if the first did not, and reads back the entry it would have
///   written to tell which: an `Ok(id)` is stored exactly once, an error
///   other than [`Error::Indeterminate`] means nothing was stored, and
///   `Indeterminate` (only when the outcome stays unknown for the whole
///   append patience, 10 s) names the one ID it may be stored under.
///   Concurrent appenders of byte-identical payloads should make them
///   unique: a resend takes an identical entry at its ID for its own. Readers
///   deliver each entry exactly once, in order, across reconnects and
///   compactions; with `stream_max_len`, entries trimmed before a reader
///   got to them are skipped.
/// * **KV watches** resync after reconnects and compaction by re-reading the
///   bucket and reporting the difference; no change is lost, intermediate
///   values of a key may be coalesced.
/// * **Slow consumers**: every feed's channel holds at most
///   `feed_capacity` items and the driver never blocks on it. When it is full the
///   feed's watch pauses; once half of it was read, a subscription or KV
///   watch re-reads its keys and reports the difference (a subscription:
///   the topic's latest message if it changed; a KV watch: the keys'
///   current values and deletions), and a stream reader continues after the
///   last entry it delivered, so a stream still delivers every entry
///   exactly once. Memory stays bounded by the channel plus one etcd
///   response.
pub struct EtcdCoordinator {
    etcd: Etcd,
    root: String,
    stream_max_len: Option<u64>,
    feed_capacity: usize,
    life: Lifecycle,
    /// The machines behind open feeds, kept so that `close` can stop them.
    feeds: Mutex<Vec<Arc<dyn StopHandle>>>,
    /// The head each stream had after this coordinator's last append to
    /// it, so the next append writes at once instead of reading the head
    /// first (one round trip instead of two; a stale head costs the read
    /// it saved, never correctness: the write is guarded on it).
    heads: Arc<Mutex<HashMap<String, Head>>>,
    /// Each stream's append machine and the appends it has yet to answer
    /// (see lane.rs).
    lanes: Arc<Lanes>,
    /// How long one append's group can take ([`append_wait`]): the same
    /// for every stream, so computed once, not per append.
    append_wait: Duration,
}

/// Streams whose head [`EtcdCoordinator`] remembers; past it the memory is
/// dropped (a coordinator appending to ever new streams must not grow
/// without bound), costing each stream one head read.
const REMEMBERED_HEADS: usize = 1024;

impl std::fmt::Debug for EtcdCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCoordinator")
            .field("root", &self.root)
            .finish()
    }
}

/// How long `subscribe`, `read_stream` and `kv_watch` wait for their
/// initial snapshot before failing.
const FEED_START_TIMEOUT: Duration = Duration::from_secs(10);

/// Beyond the longest an append machine can take, how long `append_stream`
/// still waits for its answer: the machine bounds every attempt, so this only
/// covers a driver too busy to answer.
const APPEND_SLACK: Duration = Duration::from_secs(1);

impl EtcdCoordinator {
    /// Connects to etcd at `endpoints` (see [`Endpoints`]) and builds a
    /// coordinator with default options on its own connection; see
    /// [`EtcdCoordinator::with_options`].
    pub fn connect(endpoints: &(impl Endpoints + ?Sized)) -> Result<EtcdCoordinator> {
        crate::blocking::check()?;
        Self::with_options(endpoints, EtcdCoordinatorOptions::default())
    }

    /// Connects to etcd at `endpoints` with
    /// [`EtcdCoordinatorOptions::etcd_options`] (as
    /// [`Etcd::with_options`], failing alike) and builds a coordinator with
    /// `options` on that connection, its own: dropping the coordinator
    /// closes it.
    /// The options are checked before anything is dialled.
    pub fn with_options(
        endpoints: &(impl Endpoints + ?Sized),
        options: EtcdCoordinatorOptions,
    ) -> Result<EtcdCoordinator> {
        crate::blocking::check()?;
        options.check()?;
        let etcd = Etcd::with_options(endpoints, options.etcd_options.clone())?;
        Self::on_etcd_with_options(&etcd, options)
    }

    /// A coordinator with default options on `etcd`, a connection the
    /// process already has, so it keeps one etcd connection and one
    /// driver thread. Closing the coordinator does not close `etcd`.
    pub fn on_etcd(etcd: &Etcd) -> Result<EtcdCoordinator> {
        crate::blocking::check()?;
        Self::on_etcd_with_options(etcd, EtcdCoordinatorOptions::default())
    }

    /// [`EtcdCoordinator::on_etcd`] with `options`;
    /// [`EtcdCoordinatorOptions::etcd_options`] is not used (the handle
    /// has its own).
    pub fn on_etcd_with_options(
        etcd: &Etcd,
        options: EtcdCoordinatorOptions,
    ) -> Result<EtcdCoordinator> {
        crate::blocking::check()?;
        options.check()?;
        let root = options.root;
        Ok(EtcdCoordinator {
            etcd: etcd.clone(),
            stream_max_len: options.stream_max_len,
            feed_capacity: options.feed_capacity,
            life: Lifecycle::new(),
            feeds: Mutex::new(Vec::new()),
            heads: Arc::default(),
            lanes: Arc::default(),
            append_wait: append_wait(
                &AppendConfig::new(StreamKeys::new(&root, "-")),
                etcd.options().request_timeout,
            ),
            root,
        })
    }

    fn append_config(&self, stream: &str) -> AppendConfig {
        AppendConfig {
            max_len: self.stream_max_len.and_then(NonZeroU64::new),
            head: self.heads.lock().get(stream).copied(),
            ..AppendConfig::new(self.stream_keys(stream))
        }
    }

    /// Starts `lane`'s machine on the driver with `first`, whose timer does
    /// the backoff between lost races, so no thread sleeps or spins here.
    /// The lane owns the machine's handle from then on.
    fn start_lane(&self, stream: &str, lane: &Arc<Lane>, first: Vec<u8>) -> Result<()> {
        let mut dispatch = Dispatch::new(self.lanes.clone(), stream, lane.clone());
        let now = Instant::now();
        let mut machine = Append::new(self.append_config(stream), now, rand_seed());
        machine.handle(now, AppendInput::Append(first));
        let heads = self.heads.clone();
        let name = stream.to_string();
        // If the driver is gone, the dispatch is dropped with the closure:
        // the lane closes and its callers see `DriverGone`.
        let machine = self.etcd.run(
            machine,
            Notify(move |notice| {
                if let AppendNotice::Appended { seq, revision } = notice {
                    let head = Head {
                        seq,
                        mod_revision: revision,
                    };
                    remember_head(&heads, &name, head);
                }
                dispatch.answer(notice)
            }),
        )?;
        self.lanes.started(lane, Box::new(LaneAppend(machine)));
        Ok(())
    }

    /// A lease of `secs` for one TTL write. etcd grants at least its
    /// minimum TTL (1.5 election timeouts): a longer grant than asked for
    /// would keep the key past its TTL, so it is revoked and refused.
    fn kv_lease(&self, secs: u64) -> Result<i64> {
        let ttl_secs = i64::try_from(secs).map_err(|_| {
            Error::invalid("ttl", format!("{secs} s does not fit etcd's lease TTL"))
        })?;
        let (lease, granted) = match self.etcd.request(Request::Grant { ttl_secs })? {
            Response::Granted { lease, ttl_secs } => (lease, ttl_secs),
            other => return Err(Error::unexpected(other)),
        };
        if granted > ttl_secs {
            self.drop_lease(lease);
            return Err(Error::invalid(
                "ttl",
                format!(
                    "{secs} s is below this etcd's shortest lease ({granted} s, 1.5 times its \
                     election timeout); the allowed range here is {granted} s ..= {} s",
                    super::MAX_KV_TTL.as_secs()
                ),
            ));
        }
        Ok(lease)
    }

    /// Revokes a lease no key was bound to; on failure it expires by
    /// itself after its TTL, holding nothing.
    fn drop_lease(&self, lease: i64) {
        if lease == 0 {
            return;
        }
        if let Err(e) = self.etcd.request(Request::Revoke { lease }) {
            log::debug!("fleetcoord: revoking an unused KV lease: {e}; it expires by itself");
        }
    }

    fn kv_key(&self, bucket: &str, key: &str) -> Vec<u8> {
        format!("{}/kv/{bucket}/{key}", self.root).into_bytes()
    }

    fn topic_key(&self, topic: &str) -> Vec<u8> {
        format!("{}/topic/{topic}", self.root).into_bytes()
    }

    fn stream_keys(&self, stream: &str) -> StreamKeys {
        StreamKeys::new(&self.root, stream)
    }

    /// Start a Watch machine on `prefix`; `on_notice(notice, synced)` turns
    /// its notices into feed items. Returns once the snapshot's revision is
    /// fixed (its first page was delivered, or `Synced` for an empty
    /// prefix), so the feed is live: anything written later has a higher
    /// revision and will come. It does not wait for the last page: a
    /// snapshot larger than the feed's capacity can only be delivered
    /// while the caller reads.
    fn start_feed<T: Send + 'static>(
        &self,
        prefix: Vec<u8>,
        mut on_notice: impl FnMut(WatchNotice, bool) -> FeedItem<T> + Send + 'static,
    ) -> Result<Feed<T>> {
        let config = WatchConfig {
            prefix,
            keys: KeyRule::Any,
            backoff: BackoffConfig::default(),
            page_size: DEFAULT_PAGE_SIZE,
        };
        let what = String::from_utf8_lossy(&config.prefix).into_owned();
        let machine = Watch::new(config, Instant::now(), rand_seed());
        let mut synced = false;
        self.run_feed(machine, move |notice, started| {
            match &notice {
                WatchNotice::Synced => {
                    synced = true;
                    let _ = started.try_send(Ok(()));
                }
                WatchNotice::Up(_) => {
                    let _ = started.try_send(Ok(()));
                }
                WatchNotice::Failed(e) => {
                    // Before the feed is live this fails the call that
                    // started it; afterwards the feed ends.
                    log::warn!("watch of {what:?} gave up: {e}");
                    let _ = started
                        .try_send(Err(Error::rpc_in(format!("watch of {what:?}"), e.clone())));
                    return FeedItem::End;
                }
                _ => {}
            }
            on_notice(notice, synced)
        })
    }

    /// Run `machine` behind a feed: `translate(notice, started)` turns its
    /// notices into feed items and reports on `started` when the feed is
    /// live, or why it cannot be. Returns once it is live, so nothing
    /// written afterwards is missed.
    fn run_feed<M, T>(
        &self,
        machine: M,
        mut translate: impl FnMut(M::Notice, &crossbeam_channel::Sender<Result<()>>) -> FeedItem<T>
            + Send
            + 'static,
    ) -> Result<Feed<T>>
    where
        M: Machine + Send + 'static,
        M::Input: Send + 'static,
        M::Notice: Send + 'static,
        T: Send + 'static,
    {
        let mut feeds = self.feeds.lock();
        self.life.check_open()?;
        let (started_tx, started_rx) = crossbeam_channel::bounded::<Result<()>>(1);
        let (sink, rx) = driver::FeedSink::new(self.feed_capacity, move |notice| {
            translate(notice, &started_tx)
        });
        let handle: Arc<dyn StopHandle> = Arc::new(self.etcd.run(machine, sink)?);
        feeds.retain(|f| !f.is_finished());
        feeds.push(handle.clone());
        drop(feeds);
        let stop = handle.clone();
        let feed = Feed::new(rx, move || stop.stop());
        match started_rx.recv_timeout(FEED_START_TIMEOUT) {
            Ok(Ok(())) => Ok(feed),
            Ok(Err(e)) => Err(self.etcd.or_gone(e)),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                handle.stop();
                Err(Error::Timeout(FEED_START_TIMEOUT))
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(self.etcd.gone()),
        }
    }
}

/// Keep the newest head this handle saw on `stream`. It runs on the
/// driver for every `Appended`, in order and before the lane can close, so
/// the stream's next machine starts from the head the last group left:
/// appends of a group share one revision, and a pair of that revision with
/// an earlier member's `seq` would name a head etcd never held (the guard
/// compares the head's value too, so such a pair would cost a failed
/// transaction, never an overwrite).
/// A revision etcd handed out (never 0 for a key that exists, never
/// negative) as the bus's `u64`.
fn revision_of(revision: i64) -> Result<u64> {
    u64::try_from(revision)
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(|| Error::unexpected(format!("a key at revision {revision}")))
}

fn remember_head(heads: &Mutex<HashMap<String, Head>>, stream: &str, head: Head) {
    let mut heads = heads.lock();
    if heads.len() >= REMEMBERED_HEADS && !heads.contains_key(stream) {
        heads.clear();
    }
    let newest = heads.entry(stream.to_string()).or_insert(head);
    if (newest.mod_revision, newest.seq) < (head.mod_revision, head.seq) {
        *newest = head;
    }
}

/// A lane's machine: an [`Append`] on the driver.
struct LaneAppend(MachineHandle<Append>);

impl LaneEngine for LaneAppend {
    fn append(&self, payload: Vec<u8>) -> bool {
        self.0.send(AppendInput::Append(payload)).is_ok()
    }

    fn stop(&self) {
        self.0.stop();
    }
}

fn stream_error(stream: &str, error: StreamError) -> Error {
    let context = format!("stream {stream:?}");
    match error {
        // Only the runner stops an append early: the driver is shutting down.
        StreamError::Stopped => Error::DriverGone,
        StreamError::Contended { attempts } => Error::etcd(
            ErrorKind::Contended,
            format!("append to {stream:?} lost {attempts} races in a row"),
        ),
        StreamError::Rpc(e) => Error::rpc_in(context, e),
        // The machine resent the transaction until its patience ran out;
        // only the caller can look further, and only at this one ID.
        StreamError::Indeterminate { seq, error } => Error::Indeterminate {
            backend: "etcd",
            stream: stream.to_string(),
            id: Some(StreamId(seq)),
            message: error.to_string(),
        },
        StreamError::Exhausted => Error::etcd(ErrorKind::Rejected, format!("{context}: {error}")),
        other => Error::etcd(ErrorKind::Unexpected, format!("{context}: {other}")),
    }
}

/// The longest an append machine can take: its last attempt starts within
/// its patience, and an attempt is a head read and a transaction, each
/// bounded by the request timeout.
fn append_wait(config: &AppendConfig, request_timeout: Duration) -> Duration {
    config
        .patience
        .saturating_add(request_timeout.saturating_mul(2))
        .saturating_add(APPEND_SLACK)
}

impl Coordinator for EtcdCoordinator {
    fn publish(&self, topic: &str, payload: &[u8]) -> Result<()> {
        crate::blocking::check()?;
        self.life.check_open()?;
        check_name("topic", topic)?;
        check_payload("etcd", "payload", payload)?;
        self.etcd.request(Request::Put {
            key: self.topic_key(topic),
            value: payload.to_vec(),
            lease: 0,
        })?;
        Ok(())
    }

    fn subscribe(&self, topic: &str) -> Result<Subscription> {
        crate::blocking::check()?;
        self.life.check_open()?;
        check_name("topic", topic)?;
        let key = self.topic_key(topic);
        let topic = topic.to_string();
        // Watching the key as a prefix also matches longer topic names; keep
        // the exact key only.
        self.start_feed(key.clone(), move |notice, synced| match notice {
            WatchNotice::Up(kv) | WatchNotice::Updated(kv) if synced && kv.key == key => {
                FeedItem::Item(Message {
                    topic: topic.clone(),
                    payload: kv.value,
                })
            }
            _ => FeedItem::Skip,
        })
    }

    fn append_stream(&self, stream: &str, payload: &[u8]) -> Result<StreamId> {
        crate::blocking::check()?;
        self.life.check_open()?;
        check_name("stream", stream)?;
        check_payload("etcd", "payload", payload)?;
        let wait = self.append_wait;
        // Appends of this handle to one stream are fed to one machine (see
        // lane.rs), so its threads never race each other for the head.
        let joined = self.lanes.join(stream, payload.to_vec());
        if let Some(first) = joined.start {
            self.start_lane(stream, &joined.lane, first)?;
        }
        // Groups ahead of this append each end within one wait, and at most
        // a group's worth of appends is ahead of it unless the stream is
        // busier than a transaction per round trip carries.
        let mut deadline = deadline_after(wait.saturating_mul(2));
        let mut gave_up = false;
        let notice = loop {
            let received = match deadline {
                Some(at) => joined.rx.recv_deadline(at),
                None => joined
                    .rx
                    .recv()
                    .map_err(|_| crossbeam_channel::RecvTimeoutError::Disconnected),
            };
            match received {
                Ok(LaneMsg::Done(notice)) => break notice,
                // Stopped because a waiter gave up: never sent.
                Ok(LaneMsg::GaveUp(AppendNotice::Failed(StreamError::Stopped))) => {
                    return Err(Error::Timeout(wait))
                }
                Ok(LaneMsg::GaveUp(notice)) => break notice,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) if !gave_up => {
                    // Too busy a driver: stopping the machine makes it say,
                    // for every append in it, whether a transaction was in
                    // flight (Indeterminate) or nothing was written.
                    gave_up = true;
                    self.lanes.give_up(stream, &joined.lane);
                    deadline = deadline_after(APPEND_SLACK);
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    return Err(Error::Indeterminate {
                        backend: "etcd",
                        stream: stream.to_string(),
                        id: None,
                        message: format!("no answer from the driver within {wait:?}"),
                    })
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err(self.etcd.gone())
                }
            }
        };
        match notice {
            AppendNotice::Appended { seq, .. } => Ok(StreamId(seq)),
            AppendNotice::Failed(e) => Err(self
                .etcd
                .or_gone(stream_error(stream, e))
                .with_endpoints(self.etcd.endpoints())),
            other => Err(Error::etcd(
                ErrorKind::Unexpected,
                format!("append to {stream:?}: unknown outcome {other:?}"),
            )
            .with_endpoints(self.etcd.endpoints())),
        }
    }

    fn read_stream(&self, stream: &str, from: StreamPosition) -> Result<StreamReader> {
        crate::blocking::check()?;
        self.life.check_open()?;
        check_name("stream", stream)?;
        let from = super::read_from(from);
        let config = ReaderConfig {
            keys: self.stream_keys(stream),
            from,
            backoff: BackoffConfig::default(),
        };
        let machine = Reader::new(config, Instant::now(), rand_seed());
        let name = stream.to_string();
        self.run_feed(machine, move |notice, started| match notice {
            ReaderNotice::Entry(entry) => FeedItem::Item(StreamEntry {
                id: StreamId(entry.seq),
                payload: entry.payload,
            }),
            ReaderNotice::Live => {
                let _ = started.try_send(Ok(()));
                FeedItem::Skip
            }
            ReaderNotice::InvalidKey(key) => {
                log::warn!(
                    "stream {name:?}: ignoring {:?}, which is not an entry key",
                    String::from_utf8_lossy(&key)
                );
                FeedItem::Skip
            }
            ReaderNotice::Failed(e) => {
                // Before the feed is live this fails `read_stream`;
                // afterwards the feed ends.
                log::warn!("stream {name:?}: reader gave up: {e}");
                let _ = started.try_send(Err(stream_error(&name, e)));
                FeedItem::End
            }
            _ => FeedItem::Skip,
        })
    }

    fn kv_set(&self, bucket: &str, key: &str, value: &[u8]) -> Result<()> {
        crate::blocking::check()?;
        self.life.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        check_payload("etcd", "value", value)?;
        // Lease 0 detaches the key from any lease an earlier TTL write
        // bound it to: the key is permanent again.
        self.etcd.request(Request::Put {
            key: self.kv_key(bucket, key),
            value: value.to_vec(),
            lease: 0,
        })?;
        Ok(())
    }

    fn kv_get(&self, bucket: &str, key: &str) -> Result<Vec<u8>> {
        self.kv_get_entry(bucket, key).map(|entry| entry.value)
    }

    fn kv_get_entry(&self, bucket: &str, key: &str) -> Result<KvEntry> {
        crate::blocking::check()?;
        self.life.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        match self
            .etcd
            .request(Request::Range(RangeRequest::all(KeyRange::Key(
                self.kv_key(bucket, key),
            ))))? {
            Response::Range { mut kvs, .. } => match kvs.pop() {
                Some(kv) => Ok(KvEntry {
                    revision: revision_of(kv.mod_revision)?,
                    value: kv.value,
                }),
                None => Err(Error::NotFound),
            },
            other => Err(Error::unexpected(other)),
        }
    }

    fn kv_set_with(
        &self,
        bucket: &str,
        key: &str,
        value: &[u8],
        options: KvSetOptions,
    ) -> Result<u64> {
        crate::blocking::check()?;
        self.life.check_open()?;
        let plan = check_set("etcd", bucket, key, value, options)?;
        // An expected revision beyond etcd's (which are i64s) was not read
        // from etcd: sm's rule for a revision newer than the key's.
        let expected = match plan.condition.expected() {
            Some(n) => Some(i64::try_from(n).map_err(|_| {
                Error::invalid(
                    "expected_revision",
                    format!(
                        "{n} is beyond every etcd revision, so it was not read from \
                         {key:?}; the allowed range is 0 (absent) ..= {}",
                        i64::MAX
                    ),
                )
            })?),
            None => None,
        };
        let lease = match plan.ttl_secs {
            Some(secs) => self.kv_lease(secs)?,
            None => 0,
        };
        let etcd_key = self.kv_key(bucket, key);
        let put = TxnOp::Put {
            key: etcd_key.clone(),
            value: value.to_vec(),
            lease,
        };
        let written = match expected {
            None => self.etcd.request(Request::Put {
                key: etcd_key,
                value: value.to_vec(),
                lease,
            }),
            // The failure branch reads the key in the same transaction,
            // so a conflict names the revision that beat this write.
            Some(revision) => self.etcd.request(Request::Txn(Txn {
                compare: vec![Compare::ModRevisionEquals {
                    key: etcd_key.clone(),
                    revision,
                }],
                success: vec![put],
                failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(etcd_key)))],
            })),
        };
        let answer = match written {
            Ok(answer) => answer,
            Err(e) => {
                // A lease nobody got is left to expire by itself.
                let in_doubt = matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Timeout);
                return Err(match expected {
                    Some(_) if in_doubt => Error::KvIndeterminate {
                        backend: "etcd",
                        bucket: bucket.to_owned(),
                        key: key.to_owned(),
                        message: e.to_string(),
                    },
                    _ => e,
                });
            }
        };
        match answer {
            Response::Put { revision } => revision_of(revision),
            Response::Txn {
                revision,
                succeeded: true,
                ..
            } => revision_of(revision),
            Response::Txn {
                succeeded: false,
                mut responses,
                ..
            } => {
                self.drop_lease(lease);
                let current = match responses.pop() {
                    Some(TxnOpResponse::Range { mut kvs }) => match kvs.pop() {
                        Some(kv) => Some(revision_of(kv.mod_revision)?),
                        None => None,
                    },
                    other => return Err(Error::unexpected(other)),
                };
                let verdict = fleetcoord_sm::kv::refusal(plan.condition, current);
                Err(refused(bucket, key, plan.condition, verdict)
                    .unwrap_or_else(|| Error::unexpected("a refusal decided as a win")))
            }
            other => Err(Error::unexpected(other)),
        }
    }

    fn kv_delete(&self, bucket: &str, key: &str) -> Result<()> {
        crate::blocking::check()?;
        self.life.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        self.etcd
            .request(Request::Delete(KeyRange::Key(self.kv_key(bucket, key))))?;
        Ok(())
    }

    fn kv_watch(&self, bucket: &str, pattern: &str) -> Result<KvWatcher> {
        crate::blocking::check()?;
        self.life.check_open()?;
        check_name("bucket", bucket)?;
        pattern::validate(pattern)?;
        let prefix = format!("{}/kv/{bucket}/", self.root).into_bytes();
        let prefix_len = prefix.len();
        let pattern = pattern.to_string();
        self.start_feed(prefix, move |notice, _synced| {
            let (kv, deleted) = match notice {
                WatchNotice::Synced => return FeedItem::Item(KvEvent::Synced),
                WatchNotice::Up(kv) | WatchNotice::Updated(kv) => (kv, false),
                WatchNotice::Down(kv) => (kv, true),
                _ => return FeedItem::Skip,
            };
            let Some(key) = kv
                .key
                .get(prefix_len..)
                .and_then(|k| std::str::from_utf8(k).ok())
            else {
                return FeedItem::Skip;
            };
            if !pattern::matches(&pattern, key) {
                return FeedItem::Skip;
            }
            let event = if deleted {
                KvEvent::Deleted {
                    key: key.to_string(),
                }
            } else {
                KvEvent::Put {
                    key: key.to_string(),
                    value: kv.value,
                }
            };
            FeedItem::Item(event)
        })
    }

    fn ping(&self) -> Result<()> {
        crate::blocking::check()?;
        self.life.check_open()?;
        let probe = RangeRequest {
            limit: 1,
            ..RangeRequest::all(KeyRange::Key(self.root.clone().into_bytes()))
        };
        match self.etcd.request(Request::Range(probe))? {
            Response::Range { .. } => Ok(()),
            other => Err(Error::unexpected(other)),
        }
    }

    fn close(&self) -> Result<()> {
        // Never blocks (the feeds are told to stop), so it works anywhere.
        let feeds = {
            let mut feeds = self.feeds.lock();
            self.life.close();
            std::mem::take(&mut *feeds)
        };
        for feed in feeds {
            feed.stop();
        }
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            stream_max_len: self.stream_max_len,
            ..Capabilities::default()
        }
    }

    fn describe(&self) -> String {
        format!("etcd at {}", self.etcd.endpoints().join(","))
    }
}

impl Drop for EtcdCoordinator {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetcoord_sm::RpcError;

    /// The kind and message of an etcd [`Error::Backend`].
    fn etcd_error(error: Error) -> (ErrorKind, String) {
        match error {
            Error::Backend {
                backend: "etcd",
                kind,
                message,
                ..
            } => (kind, message),
            other => panic!("expected an etcd error, got {other:?}"),
        }
    }

    #[test]
    fn stream_errors_name_the_stream_and_keep_their_kind() {
        assert!(matches!(
            stream_error("jobs", StreamError::Stopped),
            Error::DriverGone
        ));
        let cases = [
            (
                StreamError::Contended { attempts: 7 },
                ErrorKind::Contended,
                "append to \"jobs\" lost 7 races in a row",
            ),
            (
                StreamError::Rpc(RpcError::PermissionDenied(
                    "etcdserver: permission denied".into(),
                )),
                ErrorKind::PermissionDenied,
                "stream \"jobs\": etcdserver: permission denied",
            ),
            (
                StreamError::BadHead {
                    value: b"oops".to_vec(),
                },
                ErrorKind::Unexpected,
                "stream \"jobs\": stream head holds \"oops\", not a sequence number",
            ),
            (
                StreamError::Unexpected("a Put answered a Range".into()),
                ErrorKind::Unexpected,
                "stream \"jobs\": ",
            ),
        ];
        for (error, kind, text) in cases {
            let (k, message) = etcd_error(stream_error("jobs", error.clone()));
            assert_eq!(k, kind, "{error:?}");
            assert!(message.starts_with(text), "{error:?}: {message}");
        }
        match stream_error(
            "jobs",
            StreamError::Indeterminate {
                seq: 9,
                error: RpcError::Unavailable("connection reset".into()),
            },
        ) {
            Error::Indeterminate {
                backend: "etcd",
                stream,
                id: Some(StreamId(9)),
                message,
            } => assert_eq!(
                (stream.as_str(), message.as_str()),
                ("jobs", "connection reset")
            ),
            other => panic!("{other:?}"),
        }
        // No sequence number is left: a refusal, and retrying cannot help.
        let exhausted = stream_error("jobs", StreamError::Exhausted);
        assert!(!exhausted.is_retryable());
        let (kind, message) = etcd_error(exhausted);
        assert_eq!(kind, ErrorKind::Rejected);
        assert!(message.starts_with("stream \"jobs\": "), "{message}");
    }

    #[test]
    fn append_wait_covers_patience_and_two_requests_without_overflow() {
        let config = AppendConfig::new(StreamKeys::new("/coord", "s"));
        let patience = config.patience;
        assert_eq!(
            append_wait(&config, Duration::from_secs(2)),
            patience + Duration::from_secs(4) + APPEND_SLACK
        );
        assert_eq!(append_wait(&config, Duration::MAX), Duration::MAX);
    }
}
