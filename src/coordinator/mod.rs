//! A transport-agnostic bus for temporarily-synced state.
//!
//! [`Coordinator`] offers three things every process of a deployment must
//! see within tens of milliseconds — it is neither an event store nor a
//! database:
//!
//! * **pub/sub** on exact topics ([`Coordinator::publish`],
//!   [`Coordinator::subscribe`]): live-only, ordered per topic;
//! * **streams** ([`Coordinator::append_stream`], [`Coordinator::read_stream`]):
//!   append-only, sequence-numbered, replayable from the start, the end or
//!   strictly after an ID;
//! * **KV buckets** ([`Coordinator::kv_set`], [`Coordinator::kv_get`],
//!   [`Coordinator::kv_delete`], [`Coordinator::kv_watch`]) with pattern
//!   watches that deliver a snapshot, then [`KvEvent::Synced`], then changes;
//!   compare-and-set ([`Coordinator::kv_get_entry`] reads the revision
//!   [`Coordinator::kv_set_if`] expects) and keys that expire by themselves
//!   ([`Coordinator::kv_set_with_ttl`]), alone or together
//!   ([`Coordinator::kv_set_with`]).
//!
//! Backends: [`MemoryCoordinator`] (one process, the embedded default),
//! [`NoopCoordinator`] (accepts everything, delivers nothing), the etcd
//! backend, with the `redis` feature `RedisCoordinator` (standalone Redis
//! or Redis Cluster, see the `redis` module), and with the `nats` feature
//! `NatsCoordinator` on NATS JetStream (see the `nats` module).
//! [`from_env`] picks one from the `COORD` environment variable (unset:
//! etcd), falling back to a noop that says why ([`Coordinator::describe`]);
//! [`try_from_env`] returns the error instead; [`from_vars`] and
//! [`try_from_vars`] take the variables from a lookup function and can put
//! the etcd backend on an [`Etcd`](crate::Etcd) handle the process already
//! has.
//! Every backend passes the public `conformance` suite (feature `conformance`,
//! implied by `testing`), which third-party
//! backends can run from their own tests.
//!
//! The API is blocking; receivers are crossbeam channels wrapped in a
//! [`Feed`] that cancels its subscription when dropped.
//!
//! # Slow consumers
//!
//! Every feed ([`Subscription`], [`StreamReader`], [`KvWatcher`]) is a
//! bounded queue of `feed_capacity` items: [`DEFAULT_FEED_CAPACITY`] unless
//! the backend's options say otherwise, within [`MIN_FEED_CAPACITY`] ..=
//! [`MAX_FEED_CAPACITY`] — every backend refuses other values alike, with
//! [`crate::Error::InvalidArgument`] naming
//! `feed_capacity`. Filling it never blocks the backend. A feed whose queue
//! is full falls *behind*; once its consumer has read the queue down to
//! half, it catches up. Every backend that delivers follows the same rule
//! (the conformance suite's `run_slow_consumers` checks it):
//!
//! * **a subscription** is at-most-once: of the messages published while
//!   it is behind, all but the newest are dropped (counted in a logged
//!   warning), and the newest is delivered when it catches up, so a
//!   consumer always ends with the latest message of its topic;
//! * **a stream reader** loses nothing: it goes on after the last entry it
//!   delivered, every entry once and in order (entries a trimmed stream no
//!   longer holds are skipped);
//! * **a KV watch** ends with the bucket as it is: it is told at most a
//!   queue's worth of the changes made while it was behind, then the
//!   difference between what it was told and the bucket (`Put` for keys
//!   new or changed, `Deleted` for keys gone; intermediate values are
//!   coalesced, final ones never are).
//!
//! ```
//! use fleetcoord::coordinator::{Coordinator, KvEvent, MemoryCoordinator, StreamPosition};
//! use std::time::Duration;
//!
//! let coord = MemoryCoordinator::new();
//!
//! // pub/sub: a subscription is live as soon as `subscribe` returns.
//! let sub = coord.subscribe("deploys")?;
//! coord.publish("deploys", b"v42")?;
//! let msg = sub.recv_timeout(Duration::from_secs(1)).unwrap();
//! assert_eq!((msg.topic.as_str(), msg.payload.as_slice()), ("deploys", &b"v42"[..]));
//!
//! // streams: IDs count from 1; a reader from the start replays, then tails.
//! let first = coord.append_stream("audit", b"login")?;
//! let reader = coord.read_stream("audit", StreamPosition::Start)?;
//! assert_eq!(reader.recv_timeout(Duration::from_secs(1)).unwrap().id, first);
//!
//! // KV: a watch sends the matching snapshot, then `Synced`, then changes.
//! coord.kv_set("config", "feature.a", b"on")?;
//! let watch = coord.kv_watch("config", "feature.*")?;
//! let events: Vec<KvEvent> = watch.iter().take(2).collect();
//! assert_eq!(events[1], KvEvent::Synced);
//!
//! coord.close()?;
//! assert!(coord.ping().is_err());
//! # Ok::<(), fleetcoord::Error>(())
//! ```

#[cfg(any(feature = "nats", feature = "redis"))]
pub(crate) mod bridge;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
#[cfg(any(feature = "nats", feature = "redis"))]
mod escape;
mod etcd;
mod feed;
#[cfg(any(feature = "nats", feature = "redis"))]
mod feed_task;
mod from_env;
mod kv_mirror;
mod lane;
mod lifecycle;
mod memory;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
mod noop;
pub mod pattern;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(any(feature = "nats", feature = "redis"))]
mod retry;
pub(crate) mod stream_id;
#[cfg(any(feature = "nats", feature = "redis"))]
pub(crate) mod write_ids;

pub use etcd::{EtcdCoordinator, EtcdCoordinatorOptions};
pub use feed::Feed;

/// The capacity of a feed's queue unless a backend's options set another
/// (see "Slow consumers" above).
pub const DEFAULT_FEED_CAPACITY: usize = crate::validate::DEFAULT_CAPACITY;
/// The smallest feed capacity any backend accepts: room for the item a
/// consumer is reading and one more.
pub const MIN_FEED_CAPACITY: usize = 2;
/// The largest feed capacity any backend accepts: a bound on what one slow
/// consumer may hold.
pub const MAX_FEED_CAPACITY: usize = crate::validate::MAX_CAPACITY;
pub use from_env::{
    connect, from_env, from_vars, try_from_env, try_from_vars, ConnectSettings,
    DEFAULT_ETCD_ENDPOINT,
};
pub use memory::{MemoryCoordinator, MemoryOptions};
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use nats::{NatsCoordinator, NatsCredentials, NatsKeyEncoding, NatsOptions};
pub use noop::NoopCoordinator;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisCoordinator, RedisOptions};
pub use stream_id::StreamId;

use crate::error::{Error, Result};
use std::str::FromStr;

/// A coordination backend. Blocking, `Send + Sync` and object-safe, so it can
/// be shared as `Arc<dyn Coordinator>` or chosen at run time as
/// `Box<dyn Coordinator>`.
///
/// Shared guarantees of every backend:
/// * names (`topic`, `stream`, `bucket`) and KV keys are single segments:
///   non-empty, at most 255 bytes, no `/`, no NUL or control characters;
///   payloads and values are at most [`MAX_PAYLOAD`] bytes. Anything else is
///   rejected with [`Error::InvalidArgument`] naming the field (`"topic"`,
///   `"stream"`, `"bucket"`, `"key"`, `"pattern"`, `"payload"`, `"value"`)
///   before anything is written;
/// * a [`Feed`] returned by `subscribe`, `read_stream` or `kv_watch` is live
///   when the call returns: nothing sent afterwards is missed;
/// * after [`close`](Coordinator::close) every call except `close` returns
///   [`Error::Closed`], and every feed opened through this handle ends (its
///   channel disconnects once the items already queued are read);
/// * a backend whose background thread stopped by itself (a panic) fails
///   every call with [`Error::DriverGone`]; one whose handle, or the
///   [`Etcd`](crate::Etcd) connection it runs on, was closed by the user
///   fails with [`Error::Closed`].
pub trait Coordinator: Send + Sync {
    /// Sends `payload` to every current subscriber of exactly `topic`.
    /// Live-only: subscribers that join later never see it.
    fn publish(&self, topic: &str, payload: &[u8]) -> Result<()>;

    /// Receives every message published on exactly `topic` (no prefix or
    /// pattern matching) from now on, in publish order. Dropping the
    /// subscription unsubscribes.
    fn subscribe(&self, topic: &str) -> Result<Subscription>;

    /// Appends `payload` to `stream` and returns its ID. IDs are sequence
    /// numbers per stream, starting at 1 and strictly increasing, also under
    /// concurrent appenders.
    ///
    /// `Ok(id)` means the payload is stored exactly once, at `id` (noop
    /// stores nothing, by design); an error means it was not stored, so
    /// appending again is safe, except
    /// [`Error::Indeterminate`]: the outcome
    /// stayed unknown, and the payload may be stored (once). Backends retry
    /// lost answers internally in ways that cannot store twice; the
    /// conformance suite checks this across server restarts.
    fn append_stream(&self, stream: &str, payload: &[u8]) -> Result<StreamId>;

    /// Reads `stream` from `from` (see [`StreamPosition`]), then tails it.
    /// Entries arrive in ID order, each exactly once.
    fn read_stream(&self, stream: &str, from: StreamPosition) -> Result<StreamReader>;

    /// Sets `key` in `bucket` to `value`.
    fn kv_set(&self, bucket: &str, key: &str, value: &[u8]) -> Result<()>;

    /// Reads `key` in `bucket`; [`Error::NotFound`] when it is not set.
    fn kv_get(&self, bucket: &str, key: &str) -> Result<Vec<u8>>;

    /// Deletes `key` in `bucket`. Deleting a missing key succeeds and tells
    /// no watcher anything.
    fn kv_delete(&self, bucket: &str, key: &str) -> Result<()>;

    /// Reads `key` in `bucket` with its revision: the number
    /// [`kv_set_if`](Coordinator::kv_set_if) expects to change it only if
    /// nobody else did. [`Error::NotFound`] when it is not set (an
    /// expected revision of 0 then means "only if still absent").
    ///
    /// A revision identifies one write of the key: it is never 0, and
    /// every later write of the same key (set, conditional set, delete,
    /// expiry) leaves it at a larger one, so a revision read once is
    /// never current again after the key changed. Revisions are not
    /// contiguous, and not comparable across backends; within a bucket,
    /// a later write has a larger revision on every backend. `kv_get`
    /// stays the plain read of the value.
    ///
    /// The default answers [`Error::Unsupported`], for backends written
    /// before conditional writes existed; every backend of this crate
    /// implements it.
    fn kv_get_entry(&self, bucket: &str, key: &str) -> Result<KvEntry> {
        let _ = (bucket, key);
        Err(Error::Unsupported("kv_get_entry (revisions)"))
    }

    /// Sets `key` in `bucket` to `value` as `options` say: only if it is
    /// at an expected revision or absent, and/or expiring after a TTL.
    /// Returns the revision of the write. One method for both, so that
    /// the common combinations — a claim that expires (create-if-absent
    /// with a TTL), a presence marker refreshed only by its owner — are
    /// one atomic write, not two that can interleave with others.
    ///
    /// * **Condition** ([`KvSetOptions::if_revision`]): the write applies
    ///   only if the key is at exactly that revision, or for 0 only if it
    ///   is absent (never set, deleted or expired); otherwise nothing is
    ///   written and the answer is [`Error::Conflict`] carrying the key's
    ///   revision (`None`: absent). Of several writers racing on one
    ///   revision exactly one wins. An expected revision newer than the
    ///   key's current one cannot have been read from this key (a key's
    ///   revision only grows): [`Error::InvalidArgument`] naming
    ///   `"expected_revision"`. A conditional write whose answer was lost
    ///   is never reported as a win unless it applied: the backend finds
    ///   out, or answers [`Error::KvIndeterminate`].
    /// * **TTL** ([`KvSetOptions::with_ttl`]): the key is gone from
    ///   `kv_get` once `ttl` (rounded up to whole seconds) has passed, and
    ///   every watcher hears a [`KvEvent::Deleted`] within a second after
    ///   that. A TTL outside [`MIN_KV_TTL`] ..= [`MAX_KV_TTL`] is refused
    ///   with [`Error::InvalidArgument`] naming `"ttl"` and the range.
    ///   A later write without a TTL ([`kv_set`](Coordinator::kv_set),
    ///   or this method without one) makes the key permanent again; a
    ///   later write with a TTL restarts the clock. A backend that cannot
    ///   expire single keys fails at once, writing nothing, with an error
    ///   of kind [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported)
    ///   naming what it needs.
    ///
    /// Watches see the write as any other put. The default answers
    /// [`Error::Unsupported`] (see [`kv_get_entry`](Coordinator::kv_get_entry)).
    fn kv_set_with(
        &self,
        bucket: &str,
        key: &str,
        value: &[u8],
        options: KvSetOptions,
    ) -> Result<u64> {
        let _ = (bucket, key, value, options);
        Err(Error::Unsupported(
            "kv_set_with (conditional and expiring sets)",
        ))
    }

    /// Compare-and-set: sets `key` only if it is at `expected_revision`
    /// (from [`kv_get_entry`](Coordinator::kv_get_entry) or an earlier
    /// write), or, for 0, only if it is absent. Returns the new revision;
    /// a lost race is [`Error::Conflict`] with the key's revision. See
    /// [`kv_set_with`](Coordinator::kv_set_with).
    fn kv_set_if(
        &self,
        bucket: &str,
        key: &str,
        value: &[u8],
        expected_revision: u64,
    ) -> Result<u64> {
        self.kv_set_with(
            bucket,
            key,
            value,
            KvSetOptions::new().if_revision(expected_revision),
        )
    }

    /// Sets `key` to `value` for `ttl`: afterwards the key is gone, and
    /// watchers hear it deleted. Returns the new revision. See
    /// [`kv_set_with`](Coordinator::kv_set_with).
    fn kv_set_with_ttl(
        &self,
        bucket: &str,
        key: &str,
        value: &[u8],
        ttl: std::time::Duration,
    ) -> Result<u64> {
        self.kv_set_with(bucket, key, value, KvSetOptions::new().with_ttl(ttl))
    }

    /// Watches the keys of `bucket` that match `pattern` (see [`pattern`]):
    /// one [`KvEvent::Put`] per matching key (the snapshot), then exactly one
    /// [`KvEvent::Synced`] (also for an empty bucket), then every later put
    /// and delete in the order they happened.
    fn kv_watch(&self, bucket: &str, pattern: &str) -> Result<KvWatcher>;

    /// Checks that the backend answers.
    fn ping(&self) -> Result<()>;

    /// Closes this handle. Idempotent and safe to call from several threads
    /// at once; afterwards every other call returns [`Error::Closed`].
    fn close(&self) -> Result<()>;

    /// What this backend does; the `conformance` suite skips, visibly, the
    /// cases a backend declares it does not support.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// What this coordinator is, in one line for people and logs: the
    /// backend and its servers (`etcd at http://127.0.0.1:2379`,
    /// `memory`), and for a noop that [`from_env`] fell back to, why:
    /// `noop (fallback: <the error>)`. Never a secret (URLs are shown
    /// without passwords). The default is the type's name.
    fn describe(&self) -> String {
        std::any::type_name::<Self>().to_string()
    }
}

/// The largest payload or value any backend accepts, in bytes (etcd caps
/// requests at 1.5 MiB; this leaves room for the key and the envelope).
pub const MAX_PAYLOAD: usize = crate::validate::MAX_PAYLOAD;

/// What a backend declares about itself. Construct with
/// [`Capabilities::default`] (a complete backend) and adjust it with
/// [`Capabilities::without_delivery`] and
/// [`Capabilities::with_stream_max_len`]. `#[non_exhaustive]` so that new
/// declarations are not a breaking change; the fields are public for
/// reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Published messages, stream entries and KV values are stored and
    /// delivered. `false` for a backend that accepts everything and delivers
    /// nothing (noop).
    pub delivers: bool,
    /// Streams keep at most this many newest entries; older ones are
    /// trimmed. `None`: nothing is trimmed.
    pub stream_max_len: Option<u64>,
}

impl Capabilities {
    /// These capabilities, declaring that nothing is stored or delivered.
    pub const fn without_delivery(self) -> Self {
        Capabilities {
            delivers: false,
            ..self
        }
    }

    /// These capabilities, declaring that streams keep their newest
    /// `max_len` entries.
    pub const fn with_stream_max_len(self, max_len: u64) -> Self {
        Capabilities {
            stream_max_len: Some(max_len),
            ..self
        }
    }
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            delivers: true,
            stream_max_len: None,
        }
    }
}

/// A KV value with its revision, from
/// [`Coordinator::kv_get_entry`]. `#[non_exhaustive]` so that more
/// metadata (an expiry) can be added.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvEntry {
    /// The value.
    pub value: Vec<u8>,
    /// The revision of the write that set it: what
    /// [`Coordinator::kv_set_if`] expects to replace exactly this value.
    pub revision: u64,
}

impl KvEntry {
    /// An entry, for backends outside this crate.
    pub fn new(value: Vec<u8>, revision: u64) -> Self {
        KvEntry { value, revision }
    }
}

/// The shortest TTL [`Coordinator::kv_set_with`] accepts on every backend:
/// 2 s, the shortest lease etcd grants with its default settings (so a
/// TTL that works on one backend works on all).
pub const MIN_KV_TTL: std::time::Duration = fleetcoord_sm::kv::MIN_TTL;
/// The longest TTL [`Coordinator::kv_set_with`] accepts: 365 days.
pub const MAX_KV_TTL: std::time::Duration = fleetcoord_sm::kv::MAX_TTL;

/// How [`Coordinator::kv_set_with`] writes: the default is a plain,
/// permanent set (what [`Coordinator::kv_set`] does).
///
/// ```
/// use fleetcoord::coordinator::KvSetOptions;
/// use std::time::Duration;
///
/// // A claim that lapses unless renewed: only if nobody holds it, for 10 s.
/// let claim = KvSetOptions::new().if_absent().with_ttl(Duration::from_secs(10));
/// assert_eq!(claim.expected_revision(), Some(0));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KvSetOptions {
    expected: Option<u64>,
    ttl: Option<std::time::Duration>,
}

impl KvSetOptions {
    /// A plain, permanent set.
    pub const fn new() -> Self {
        KvSetOptions {
            expected: None,
            ttl: None,
        }
    }

    /// These options, writing only if the key is at `revision` (0: only
    /// if it is absent).
    #[must_use]
    pub const fn if_revision(mut self, revision: u64) -> Self {
        self.expected = Some(revision);
        self
    }

    /// These options, writing only if the key is absent: `if_revision(0)`.
    #[must_use]
    pub const fn if_absent(self) -> Self {
        self.if_revision(0)
    }

    /// These options, with the key expiring `ttl` after the write.
    #[must_use]
    pub const fn with_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The revision the write expects (0: absent); `None` for an
    /// unconditional write.
    pub const fn expected_revision(&self) -> Option<u64> {
        self.expected
    }

    /// The TTL; `None` for a permanent key.
    pub const fn ttl(&self) -> Option<std::time::Duration> {
        self.ttl
    }
}

/// A [`KvSetOptions`] checked, in the words the backends use: the
/// condition, and the TTL in whole seconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SetPlan {
    pub(crate) condition: fleetcoord_sm::kv::Condition,
    pub(crate) ttl_secs: Option<u64>,
}

/// Checks `options` (the TTL's range; every backend refuses alike).
pub(crate) fn plan_set(options: KvSetOptions) -> Result<SetPlan> {
    use fleetcoord_sm::kv::{ttl_secs, Condition, TtlError};
    let ttl_secs = match options.ttl {
        None => None,
        Some(ttl) => Some(ttl_secs(ttl).map_err(|e| {
            let why = match e {
                TtlError::TooShort => "is too short",
                TtlError::TooLong => "is too long",
            };
            Error::invalid(
                "ttl",
                format!(
                    "{ttl:?} {why}: the allowed range is {} s ..= {} s (365 days), \
                     counted in whole seconds",
                    MIN_KV_TTL.as_secs(),
                    MAX_KV_TTL.as_secs()
                ),
            )
        })?),
    };
    Ok(SetPlan {
        condition: Condition::from_expected(options.expected),
        ttl_secs,
    })
}

/// The user's answer to a refused or undecided conditional write, from
/// sm's verdict; `None` for [`Verdict::Apply`](fleetcoord_sm::kv::Verdict::Apply).
pub(crate) fn refused(
    bucket: &str,
    key: &str,
    condition: fleetcoord_sm::kv::Condition,
    verdict: fleetcoord_sm::kv::Verdict,
) -> Option<Error> {
    use fleetcoord_sm::kv::Verdict;
    match verdict {
        Verdict::Apply => None,
        Verdict::Conflict { current } => Some(Error::Conflict {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            current,
        }),
        Verdict::NotThisKeys { current } => Some(Error::invalid(
            "expected_revision",
            format!(
                "{} is newer than the revision of {key:?} in bucket {bucket:?} ({current}), \
                 so it was not read from this key; the allowed range is 0 (absent) ..= \
                 {current}, a revision read with kv_get_entry",
                condition.expected().unwrap_or_default()
            ),
        )),
    }
}

/// One published message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The exact topic it was published on.
    pub topic: String,
    /// The bytes given to `publish`, unchanged.
    pub payload: Vec<u8>,
}

// The type is in a module of its own because `error.rs` names it (an
// indeterminate append's ID); parsing it yields an `Error`, so that part
// stays here, above `error.rs`.
impl FromStr for StreamId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        s.parse::<u64>().map(StreamId).map_err(|e| {
            Error::invalid(
                "stream id",
                format!("{s:?} is not a decimal sequence number: {e}"),
            )
        })
    }
}

/// Where a stream reader starts.
///
/// `#[non_exhaustive]`: more starting points (e.g. "the last n entries") may
/// be added; code that matches on a position needs a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamPosition {
    /// Replay every retained entry, then tail.
    Start,
    /// Only entries appended after `read_stream` returns.
    End,
    /// Entries with an ID strictly greater than this one, then tail. If the
    /// ID is older than the oldest retained entry (it was trimmed), reading
    /// starts at the oldest retained entry; if it is beyond the newest entry,
    /// reading starts with the next entry appended.
    After(StreamId),
}

/// One stream entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamEntry {
    /// Its sequence number.
    pub id: StreamId,
    /// The bytes given to `append_stream`, unchanged.
    pub payload: Vec<u8>,
}

/// What a KV watch reports.
///
/// Deliberately exhaustive (not `#[non_exhaustive]`): snapshot entries,
/// sets, deletes and the sync marker are everything a consumer needs to
/// mirror a bucket, so a new variant would change what correct handling is
/// and should break the build rather than fall into a wildcard arm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// `key` holds `value`: a snapshot entry before `Synced`, a set after it.
    Put {
        /// The key within the bucket.
        key: String,
        /// Its value.
        value: Vec<u8>,
    },
    /// `key` was deleted (only after `Synced`).
    Deleted {
        /// The key within the bucket.
        key: String,
    },
    /// The snapshot is complete; sent exactly once per watch.
    Synced,
}

/// A stream position in the machines' words: where every backend's reader
/// starts is one rule (`fleetcoord_sm::stream::Cursor::at`).
pub(crate) fn read_from(from: StreamPosition) -> fleetcoord_sm::stream::ReadFrom {
    use fleetcoord_sm::stream::ReadFrom;
    match from {
        StreamPosition::Start => ReadFrom::Start,
        StreamPosition::End => ReadFrom::End,
        StreamPosition::After(id) => ReadFrom::After(id.0),
    }
}

/// Messages of one topic; dropping it unsubscribes.
pub type Subscription = Feed<Message>;
/// Entries of one stream; dropping it stops the reader.
pub type StreamReader = Feed<StreamEntry>;
/// Events of one KV watch; dropping it stops the watch.
pub type KvWatcher = Feed<KvEvent>;

/// Checks a topic, stream or bucket name (`what` names it in the error)
/// as every backend does before sending anything: one key segment (no
/// `/`), not empty, at most 255 bytes, no control characters. Needs no
/// connection, so a tool can refuse a bad name before it connects.
pub fn check_name(what: &'static str, name: &str) -> Result<()> {
    crate::validate::segment(what, name)
}

/// Checks a KV key as every backend does before sending anything: a
/// single segment, so a bucket's keys never nest. Needs no connection.
pub fn check_key(key: &str) -> Result<()> {
    crate::validate::segment("key", key)
}

/// The checks of every backend's `kv_set_with` before anything is sent:
/// the bucket and key names, the value's size on `backend`
/// ([`check_payload`]) and the options ([`plan_set`]).
pub(crate) fn check_set(
    backend: &'static str,
    bucket: &str,
    key: &str,
    value: &[u8],
    options: KvSetOptions,
) -> Result<SetPlan> {
    check_name("bucket", bucket)?;
    check_key(key)?;
    check_payload(backend, "value", value)?;
    plan_set(options)
}

/// Checks a payload (`what` = `"payload"`) or a KV value (`"value"`)
/// for `backend`, whose limit the error names: [`MAX_PAYLOAD`] on every
/// backend, so that a payload one accepts works on all; etcd's says why
/// (its request limit).
pub(crate) fn check_payload(
    backend: &'static str,
    what: &'static str,
    payload: &[u8],
) -> Result<()> {
    if backend == "etcd" {
        return crate::validate::payload(what, payload);
    }
    if payload.len() > MAX_PAYLOAD {
        return Err(Error::invalid(
            what,
            format!(
                "is {} bytes; the {backend} backend accepts at most {MAX_PAYLOAD} bytes \
                 (the limit of every fleetcoord backend, so a payload works on any)",
                payload.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_id_text_round_trip() {
        let id: StreamId = "42".parse().unwrap();
        assert_eq!(id, StreamId(42));
        assert_eq!(id.to_string(), "42");
        assert!(matches!(
            "x".parse::<StreamId>(),
            Err(Error::InvalidArgument {
                what: "stream id",
                ..
            })
        ));
    }

    #[test]
    fn payload_errors_name_the_backends_own_limit() {
        let big = vec![0; MAX_PAYLOAD + 1];
        for backend in ["memory", "redis", "nats", "noop"] {
            let why = check_payload(backend, "payload", &big)
                .unwrap_err()
                .to_string();
            assert!(
                why.contains(&format!(
                    "the {backend} backend accepts at most {MAX_PAYLOAD}"
                )) && !why.contains("etcd"),
                "{why}"
            );
            assert!(check_payload(backend, "value", &big[1..]).is_ok());
        }
        let why = check_payload("etcd", "payload", &big)
            .unwrap_err()
            .to_string();
        assert!(why.contains("etcd caps requests at 1.5 MiB"), "{why}");
    }

    #[test]
    fn trait_is_object_safe() {
        let boxed: Box<dyn Coordinator> = Box::new(MemoryCoordinator::new());
        let shared: std::sync::Arc<dyn Coordinator> = std::sync::Arc::from(boxed);
        assert!(shared.ping().is_ok());
    }

    #[test]
    fn capabilities_builders_change_only_their_declaration() {
        let full = Capabilities::default();
        assert_eq!((full.delivers, full.stream_max_len), (true, None));
        let silent = full.without_delivery();
        assert_eq!((silent.delivers, silent.stream_max_len), (false, None));
        let trimmed = silent.with_stream_max_len(64);
        assert_eq!(
            (trimmed.delivers, trimmed.stream_max_len),
            (false, Some(64))
        );
        assert_eq!(
            full.with_stream_max_len(1),
            Capabilities {
                delivers: true,
                stream_max_len: Some(1),
            }
        );
    }
}
