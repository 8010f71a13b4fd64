//! The Redis backend (cargo feature `redis`): a standalone server or a
//! Redis Cluster, through the `redis` crate on a runtime thread of its own.
//! The API is blocking; nothing async is public.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let server = fleetcoord::testing::RedisServer::start()?;
//! # let url = server.url();
//! use fleetcoord::coordinator::{Coordinator, KvEvent, RedisCoordinator, StreamPosition};
//! use std::time::Duration;
//!
//! // One redis:// URL: standalone; a comma-separated list: a cluster.
//! let coord = RedisCoordinator::connect(&url)?;
//! coord.kv_set("config", "rollout", b"50%")?;
//! let watch = coord.kv_watch("config", "*")?;
//! assert!(matches!(watch.recv_timeout(Duration::from_secs(5))?, KvEvent::Put { .. }));
//! assert_eq!(watch.recv_timeout(Duration::from_secs(5))?, KvEvent::Synced);
//!
//! let id = coord.append_stream("audit", b"login")?;
//! let reader = coord.read_stream("audit", StreamPosition::Start)?;
//! assert_eq!(reader.recv_timeout(Duration::from_secs(5))?.id, id);
//! coord.close()?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! Every name is escaped into a Redis hash tag (bytes outside
//! `[A-Za-z0-9._-]` as `%XX`, so `{`, `}` and `:` never appear in it), and
//! all keys of one name share that tag, hence one cluster slot:
//!
//! | what | keys |
//! |---|---|
//! | KV bucket `b` | hash `coord:kv:{b}` (field = key), version `coord:kvv:{b}`, channel `coord:kvn:{b}`; each key's revision in hash `coord:kvr:{b}`, TTL deadlines (the server's clock, in ms) in sorted set `coord:kvx:{b}`, the token of each key's last conditional write in hash `coord:kvw:{b}` |
//! | stream `s` | Redis stream `coord:stream:{s}`, epoch `coord:streame:{s}`, append tokens `coord:streamt:{s}` (hash) and `coord:streamto:{s}` (their order) |
//! | topic `t` | channel `coord:topic:{t}` |
//!
//! A KV write is one Lua script declaring the hash, the version and the
//! channel in `KEYS`, so on a cluster it runs on the one shard that owns
//! them and never raises `CROSSSLOT`.
//!
//! # Semantics beyond the trait's
//!
//! * **pub/sub** — sharded `SPUBLISH`/`SSUBSCRIBE` on a cluster (the
//!   message stays on the shard owning the channel instead of crossing the
//!   cluster bus to every node), plain `PUBLISH`/`SUBSCRIBE` standalone.
//!   Live-only and at-most-once: messages published while a subscriber is
//!   disconnected are lost (it reconnects, resubscribes and logs a
//!   warning).
//! * **streams** — `XADD key 0-* …`: Redis 7 numbers entries `0-1`, `0-2`,
//!   … within milliseconds-part 0, gap-free and increasing also after
//!   `MAXLEN` trims, so the Redis id `0-N` is exactly `StreamId(N)`. An
//!   entry whose id is not `0-N` (appended by hand with `*`) is reported,
//!   not mangled: a reader that meets it logs an error and ends its feed,
//!   and appends fail with an error saying why. Readers deliver every entry
//!   exactly once, in order, across reconnects, resuming after the last
//!   delivered id; with [`RedisOptions::stream_max_len`] each append trims
//!   exactly (`MAXLEN n`), and entries trimmed before a reader got to them
//!   are skipped. A restart that loses the data (no persistence) starts a
//!   stream over at ID 1; readers notice (each entry carries the stream's
//!   epoch), log a warning and read the new stream from its first entry.
//! * **appends are stored at most once** — each `append_stream` draws a
//!   random token and passes it to the append script with every attempt;
//!   the script records token → id in the hash `coord:streamt:{s}` (the
//!   newest 4,096 tokens, listed in order in `coord:streamto:{s}`; both
//!   expire 10 minutes, at least twice the request timeout, after the
//!   stream's last append) and answers a token it has seen with the id it
//!   stored. So an attempt whose answer was lost (a server restart, a
//!   dropped connection, a master failing over) is repeated
//!   without appending twice; transient failures are retried until
//!   [`RedisOptions::request_timeout`]. `Ok(id)` is stored once; an error
//!   means nothing was stored, except [`Error::Indeterminate`], returned
//!   when an attempt may have run and none answered before the timeout.
//!   A retry finds its token unless 4,096 other appends to the stream came
//!   in between. Durability across a restart is the server's: with
//!   `appendfsync always` every acknowledged append survives.
//! * **KV watches** — subscribe, then snapshot the hash and its version in
//!   one script; notifications at or below the snapshot version are
//!   skipped, each later one must be the next version. A gap, a lost
//!   connection or a full consumer queue leads to a new snapshot and the
//!   consumer is told the difference, so the watcher's view always
//!   converges on the hash; intermediate values may be coalesced.
//! * **Slow consumers** (the crate's one contract, with a rule for each
//!   kind of feed: [`crate::coordinator`], "Slow consumers") — every feed
//!   is a bounded channel of [`RedisOptions::feed_capacity`]; the runtime
//!   never blocks on it. When it is full the feed holds its next item
//!   until the consumer has read half the queue: a stream reader stops
//!   reading meanwhile, then continues after the last entry it delivered;
//!   a KV watch keeps reading, tells the consumer at most a queue's worth
//!   of changes, then the difference to a new snapshot; a subscription
//!   keeps reading, keeps only the newest message and logs how many it
//!   dropped.
//! * **Connections** — one multiplexed connection serves every command of
//!   a handle; each feed has a connection of its own (one per node it
//!   needs on a cluster), which it rebuilds with backoff after any failure.
//! * **TLS** — `rediss://` URLs (see [TLS](#tls)); **ACL users** — see
//!   [ACL users](#acl-users).
//!
//! # TLS
//!
//! `rediss://` URLs speak TLS (rustls with ring, the same stack the etcd
//! backend uses; no OpenSSL), standalone and on a Cluster.
//! [`RedisOptions::with_tls`] gives a [`Tls`](crate::Tls): its CA bundle is
//! then the only trust anchor, and its client certificate, when it has one,
//! is presented to servers with `tls-auth-clients yes`. Without `with_tls`
//! a `rediss://` server must present a certificate from a public CA
//! (Mozilla's root list, compiled in; the platform's store is not read).
//! The server's certificate is always verified, chain and name: there is
//! no insecure mode, and a URL's `#insecure` is refused. The name checked
//! is the URL's host and, on a Cluster, the address each node announces in
//! `CLUSTER SLOTS` (with `tls-cluster yes` Redis announces the TLS ports to
//! TLS clients), so node certificates must name those addresses (an IP
//! address SAN for nodes announced by IP). [`Tls::with_server_name`](crate::Tls::with_server_name)
//! is refused with [`Error::Unsupported`]. A `redis://` URL with
//! `with_tls` set is refused rather than dialled in the clear.
//!
//! A refused handshake fails `connect` with one line naming the cause:
//! `TLS: the server's certificate is not trusted: it is not signed by the
//! given CA (RedisOptions::with_tls) (… UnknownIssuer)`; `… is not valid
//! for the host in the URL …`; `… it most likely requires a client
//! certificate (tls-auth-clients), and none was given …`.
//!
//! The `redis` crate builds its TLS configuration with rustls'
//! process-level `CryptoProvider`; before the first TLS connection this
//! backend installs ring as that provider unless the application installed
//! one (rustls would otherwise panic in a program whose dependencies enable
//! both ring and aws-lc-rs).
//!
//! # ACL users
//!
//! [`RedisOptions::with_username`] and [`RedisOptions::with_password`] log
//! every connection (commands, feeds, every node of a cluster) in with
//! `HELLO 3 AUTH user password`. A wrong password or a disabled user fails
//! `connect` with [`Error::Backend`] of kind
//! [`PermissionDenied`](ErrorKind::PermissionDenied) (`WRONGPASS`, not
//! retryable; the password is never quoted); a command the user may not
//! run fails with `NOPERM`, also `PermissionDenied`.
//!
//! Everything fleetcoord stores or publishes is under `coord:` (see
//! [Layout](#layout)), so a user needs keys `~coord:*` and channels
//! `&coord:*`, and these commands (Redis checks the commands the Lua
//! scripts call too):
//!
//! | for | commands |
//! |---|---|
//! | connecting, `ping` | `PING` (`HELLO` and `AUTH` need no right; the crate's `CLIENT SETINFO` after login may be refused, it ignores the answer) |
//! | Cluster only | `CLUSTER SLOTS` (the slot map), `SPUBLISH`, `SSUBSCRIBE` |
//! | standalone only | `PUBLISH`, `SUBSCRIBE` (not `UNSUBSCRIBE`: a feed ends by closing its connection) |
//! | scripts (KV writes and watch snapshots, appends) | `EVALSHA`, `SCRIPT LOAD` |
//! | KV (in scripts) | `HGET`, `HGETALL`, `HSET`, `HDEL`, `HEXISTS`, `GET`, `INCR`, `TIME`, `ZADD`, `ZREM`, `ZRANGE`, `ZRANGEBYSCORE` |
//! | streams (in the append script and readers) | `XADD`, `XREAD`, `XREVRANGE`, `GET`, `SET`, `HGET`, `HSET`, `HDEL`, `RPUSH`, `LPOP`, `PEXPIRE` |
//! | [`RedisOptions::with_min_replicas`] | `WAIT` |
//!
//! Ready to paste (Redis 7; one line, both deployments; the test suite
//! runs the conformance suite as exactly this user, on a standalone server
//! and on a TLS Cluster):
//!
//! ```text
//! ACL SETUSER fleet reset on >CHANGE-ME ~coord:* &coord:* -@all +ping +cluster|slots +evalsha +script|load +hget +hgetall +hset +hdel +hexists +get +set +incr +time +zadd +zrem +zrange +zrangebyscore +rpush +lpop +pexpire +xadd +xread +xrevrange +publish +spublish +subscribe +ssubscribe +wait
//! ```
//!
//! (In a `users.acl` file or `redis.conf` the same rules follow `user
//! fleet`.) Nothing is needed outside `coord:`: no `KEYS`, `SCAN`,
//! `FLUSH*`, `CONFIG` or `@dangerous` command.
//!
//! # Failover (Redis Cluster)
//!
//! When a master dies, its replica takes over after the cluster marked the
//! master failed (`cluster-node-timeout`, then an election). Meanwhile the
//! dead master's slots answer `MOVED` to its address (which refuses
//! connections), and with `cluster-require-full-coverage yes` (Redis'
//! default) *every* node answers `CLUSTERDOWN` for *every* slot for a
//! while, so writes to healthy masters are refused too: the server's
//! rule, not the client's. Each request is retried through this with
//! jittered backoff (20 ms doubling to 400 ms) until
//! [`RedisOptions::request_timeout`], and the slot map is refreshed on
//! every `MOVED`. Measured on 3 masters with a replica each and a 1 s
//! `cluster-node-timeout`, a master SIGKILLed under a 5 s timeout: no call
//! failed in six runs; calls to the dead master's slots waited up to
//! 3.3 s, calls to the other masters' slots up to 1.5 s (the `CLUSTERDOWN`
//! window). Before, the dead master's slots failed for 2.3 s and the
//! others for 0.85 s.
//! Setting `cluster-require-full-coverage no` on the servers keeps the
//! other masters' slots available throughout.
//!
//! What is retried: answers proving the command did not run (`MOVED`,
//! `ASK`, `CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`, `READONLY`, `LOADING`,
//! connection refused), for every request; a connection lost mid-request
//! only for requests that may run twice (reads, KV sets and deletes, ping,
//! and appends, whose token makes a repeat return the first attempt's id).
//! A publish whose connection broke fails at once, saying that it may or
//! may not have been delivered. When the request timeout passes first, the
//! error ([`Error::Backend`], kind [`Unavailable`](ErrorKind::Unavailable),
//! retryable) says it in one line, e.g. `set "k" in bucket "b": slot 5076's
//! master 127.0.0.1:39195 is unreachable: failover in progress (gave up
//! after 5.0s)`. A standalone server has no failover: its requests are not
//! retried, except appends, retried the same way through a restart. The
//! pauses and when to stop are sm's one retry policy (`fleetcoord_sm::retry`)
//! for every request: jittered backoff from 20 ms to 400 ms, no attempt
//! begun in the last tenth of the request timeout (at most 100 ms) so that
//! the last one has time to hear its answer.
//!
//! # Replication
//!
//! Redis replicates asynchronously: a write is answered once the master
//! applied it, and reaches its replicas a moment later. A master that dies
//! before its replica has a write loses that write *although it was
//! acknowledged*: the replica that takes over never had it (a KV value goes
//! back to its previous value, a stream has no entry at that id, and the
//! next append may be given the same id). No loss was seen in two failover
//! runs of the tests, but it is possible whenever a master fails under
//! load; etcd and NATS JetStream with replicas do not have this window.
//!
//! [`RedisOptions::with_min_replicas`] narrows it: every KV set and delete
//! and every stream append is followed by `WAIT n timeout` on the same
//! connection, and a write fewer than `n` replicas confirmed in time fails
//! with [`Error::Backend`] of kind
//! [`Unreplicated`](ErrorKind::Unreplicated) saying that it *was
//! applied on the master but not confirmed* (stored; durability
//! unconfirmed), with the entry's id for an append. `WAIT` does not make
//! Redis strongly consistent (a failover can still pick a replica that
//! lacks a confirmed write while another replica has it, and a write
//! confirmed by fewer replicas stays stored), but a confirmed write
//! survives the loss of its master when `n` replicas had it. `publish` is
//! never followed by `WAIT`: pub/sub messages are delivered to the
//! subscribers connected at that moment and not stored, so there is no
//! write for a replica to keep.

mod conn;
mod failover;
mod kv;
mod names;
mod options;
mod pubsub;
mod stream;
mod target;
mod task;
#[cfg(test)]
mod test_util;
mod tls;

pub use options::{RedisOptions, MAX_MIN_REPLICAS};

use crate::caller_driven::{CallerDriven, Health, Ran};
use crate::coordinator::bridge::{self, Bridge, CallError};
use crate::coordinator::lifecycle::Lifecycle;
use crate::coordinator::write_ids::WriteIds;
use crate::coordinator::{
    check_key, check_name, check_payload, check_set, pattern, refused, Capabilities, Coordinator,
    KvEntry, KvSetOptions, KvWatcher, StreamId, StreamPosition, StreamReader, Subscription,
};
use crate::endpoints::Endpoints;
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::StartError;
use conn::Conn;
use failover::{retried, with_failover, Repeat, Through};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use target::Target;

/// The URL used when none is given.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// How long a caller waits beyond the request timeout for the runtime's
/// answer: each request bounds its own retries by the request timeout, so
/// this only covers a runtime too busy to answer at once.
const CALL_SLACK: Duration = Duration::from_secs(1);

/// A [`Coordinator`] on Redis, standalone or Cluster (see the [module
/// docs](self) for the layout and the guarantees).
///
/// `connect` returns once the server answered a `PING`; after
/// [`close`](Coordinator::close) every call returns [`Error::Closed`] and
/// every feed it opened ends. Dropping the handle closes it.
pub struct RedisCoordinator {
    bridge: Bridge,
    conn: Conn,
    /// A second command connection that callers drive themselves
    /// (`crate::caller_driven`): a command from a lone caller crosses no
    /// thread. `conn` serves while it is not ready.
    direct: Arc<CallerDriven<Conn>>,
    target: Target,
    stream_max_len: Option<u64>,
    feed_capacity: usize,
    life: Lifecycle,
    /// Every append's token.
    ids: WriteIds,
}

impl std::fmt::Debug for RedisCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCoordinator")
            .field("urls", &self.target.urls)
            .field("cluster", &self.target.cluster)
            .finish()
    }
}

impl RedisCoordinator {
    /// Connects with default options to `urls` (see [`Endpoints`]): one
    /// URL is a standalone server, several the seed nodes of a cluster.
    /// Each is `redis://host:port`, `rediss://host:port` (TLS), or
    /// `host:port`, which means `redis://host:port` (`rediss://` with
    /// [`RedisOptions::with_tls`]). Fails with [`Error::Connect`] naming
    /// the URLs when no server answers within the connect timeout.
    pub fn connect(urls: &(impl Endpoints + ?Sized)) -> Result<Self> {
        crate::blocking::check()?;
        Self::with_options(urls, RedisOptions::default())
    }

    /// Connects to `urls` (as [`connect`](Self::connect)) with `options`,
    /// every value of which is checked first ([`Error::InvalidArgument`]
    /// names the one out of range).
    pub fn with_options(urls: &(impl Endpoints + ?Sized), options: RedisOptions) -> Result<Self> {
        crate::blocking::check()?;
        let target = Target::parse(urls, &options)?;
        let wait = target
            .connect_timeout
            .saturating_add(target.request_timeout);
        let connecting = target.clone();
        // The bridge reports a failed connect in words; its kind travels
        // here, so that bad credentials are not called retryable.
        let failed_kind = Arc::new(OnceLock::new());
        let kind_out = failed_kind.clone();
        let started = bridge::start("fleetcoord-redis", wait, move || async move {
            connecting.command_conn().await.map_err(|e| {
                let _ = kind_out.set(target::kind_of(&e));
                connecting.explain(&e, true)
            })
        });
        let (bridge, conn) = match started {
            Ok(started) => started,
            Err(StartError::Io(e)) => return Err(Error::Io(e)),
            Err(StartError::Connect(reason)) => {
                let kind = failed_kind.get().copied().unwrap_or(ErrorKind::Unavailable);
                return Err(Error::Connect {
                    backend: "redis",
                    endpoints: target.urls.clone(),
                    kind,
                    reason,
                });
            }
        };
        Ok(RedisCoordinator {
            bridge,
            conn,
            direct: Arc::new(CallerDriven::new(target.connect_timeout)),
            stream_max_len: options.stream_max_len,
            feed_capacity: options.feed_capacity,
            target,
            life: Lifecycle::new(),
            ids: WriteIds::new(),
        })
    }

    /// Whether this handle talks to a cluster.
    pub fn is_cluster(&self) -> bool {
        self.target.cluster
    }

    /// Runs `op` on a command connection; `op` bounds itself by the
    /// request timeout ([`with_failover`]). The call runs on the caller's
    /// thread and ends before this returns, so `op` may borrow from the
    /// handle and the caller's arguments instead of copying them: on the
    /// connection callers drive (`direct`), or, while that one is not
    /// ready, polled while the runtime thread drives `conn`. An answer on
    /// `direct` that says the connection failed ([`ErrorKind::Unavailable`],
    /// [`ErrorKind::Timeout`], an append whose outcome is unknown) drops it:
    /// nobody reads it between calls, so it may have died idle.
    fn run<T, F>(&self, op: impl FnOnce(Conn) -> F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        self.life.check_open()?;
        let timeout = self.target.request_timeout;
        let wait = timeout.saturating_add(CALL_SLACK);
        let target = self.target.clone();
        let build = move || async move {
            target
                .command_conn()
                .await
                .map_err(|e| target.explain(&e, true))
        };
        if let Some(taken) = CallerDriven::take(&self.direct, 0, build) {
            let ran = taken.run(wait, |conn| {
                let call = op(conn);
                async move {
                    let out = call.await;
                    let health = Health::of(&out);
                    (out, health)
                }
            });
            return match ran {
                Ran::Answer(out) => out,
                Ran::Waited => Err(Error::Timeout(timeout)),
                Ran::Panicked => Err(self.life.gone()),
            };
        }
        match self.bridge.call(wait, op(self.conn.clone())) {
            Ok(result) => result,
            Err(CallError::Timeout) => Err(Error::Timeout(timeout)),
            Err(CallError::Gone) => Err(self.life.gone()),
            Err(CallError::InsideAsyncRuntime) => Err(Error::InsideAsyncRuntime),
        }
    }
}

impl Coordinator for RedisCoordinator {
    fn publish(&self, topic: &str, payload: &[u8]) -> Result<()> {
        crate::blocking::check()?;
        check_name("topic", topic)?;
        check_payload("redis", "payload", payload)?;
        let channel = names::topic_channel(topic);
        let mut publish = redis::cmd(conn::publish_command(self.target.cluster));
        publish.arg(&channel).arg(payload);
        let target = &self.target;
        let context = format!("publish on {topic:?}");
        self.run(move |conn| async move {
            // Sent twice it may be delivered twice: retried only when it
            // was not sent.
            let attempt = || {
                let (mut conn, publish) = (conn.clone(), publish.clone());
                async move { conn.query::<redis::Value>(&publish).await }
            };
            let describe = |e: &redis::RedisError| target.error(&context, e);
            with_failover(
                target,
                &context,
                Some(&channel),
                Repeat::Unsafe("the message may or may not have been delivered"),
                attempt,
                describe,
            )
            .await
            .map(|_| ())
        })
    }

    fn subscribe(&self, topic: &str) -> Result<Subscription> {
        crate::blocking::check()?;
        self.life.check_open()?;
        check_name("topic", topic)?;
        let topic = topic.to_string();
        task::open(&self.bridge, &self.target, self.feed_capacity, move |ctx| {
            pubsub::subscribe_task(ctx, topic)
        })
        .map_err(|e| self.life.or_gone(e))
    }

    fn append_stream(&self, stream: &str, payload: &[u8]) -> Result<StreamId> {
        crate::blocking::check()?;
        check_name("stream", stream)?;
        check_payload("redis", "payload", payload)?;
        let target = &self.target;
        let stream = stream.to_string();
        let payload: Arc<[u8]> = payload.into();
        let (max_len, ids) = (self.stream_max_len, &self.ids);
        self.run(move |mut conn| async move {
            stream::append(&mut conn, target, &stream, &payload, max_len, ids).await
        })
    }

    fn read_stream(&self, stream: &str, from: StreamPosition) -> Result<StreamReader> {
        crate::blocking::check()?;
        self.life.check_open()?;
        check_name("stream", stream)?;
        let stream = stream.to_string();
        task::open(&self.bridge, &self.target, self.feed_capacity, move |ctx| {
            stream::read_task(ctx, stream, from)
        })
        .map_err(|e| self.life.or_gone(e))
    }

    fn kv_set(&self, bucket: &str, key: &str, value: &[u8]) -> Result<()> {
        crate::blocking::check()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        check_payload("redis", "value", value)?;
        self.kv_write(bucket, key, Some(value.to_vec()))
    }

    fn kv_get(&self, bucket: &str, key: &str) -> Result<Vec<u8>> {
        self.kv_get_entry(bucket, key).map(|entry| entry.value)
    }

    fn kv_get_entry(&self, bucket: &str, key: &str) -> Result<KvEntry> {
        crate::blocking::check()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        let hash = names::kv_hash(bucket);
        let target = &self.target;
        let cluster = self.target.cluster;
        let what = format!("get {key:?} in bucket {bucket:?}");
        let (bucket, key): (Arc<str>, Arc<str>) = (bucket.into(), key.into());
        self.run(move |conn| async move {
            // A read expires what is due (its delete is safe to repeat).
            let attempt = || {
                let (mut conn, bucket, key) = (conn.clone(), bucket.clone(), key.clone());
                async move { kv::read(&mut conn, cluster, &bucket, &key).await }
            };
            let describe = |e: &redis::RedisError| target.error(&what, e);
            let (value, revision) =
                with_failover(target, &what, Some(&hash), Repeat::Safe, attempt, describe)
                    .await?
                    .ok_or(Error::NotFound)?;
            Ok(KvEntry { value, revision })
        })
    }

    fn kv_set_with(
        &self,
        bucket: &str,
        key: &str,
        value: &[u8],
        options: KvSetOptions,
    ) -> Result<u64> {
        crate::blocking::check()?;
        let plan = check_set("redis", bucket, key, value, options)?;
        let ttl_ms = plan.ttl_secs.map(|secs| secs.saturating_mul(1000));
        let expected = plan.condition.expected();
        match self.kv_write_with(bucket, key, Some(value.to_vec()), expected, ttl_ms)? {
            kv::Written::Applied(revision) => Ok(revision),
            kv::Written::Refused(current) => {
                let verdict = fleetcoord_sm::kv::refusal(plan.condition, current);
                Err(
                    refused(bucket, key, plan.condition, verdict).unwrap_or_else(|| {
                        self.target
                            .failure(ErrorKind::Unexpected, "a refusal decided as a win")
                    }),
                )
            }
        }
    }

    fn kv_delete(&self, bucket: &str, key: &str) -> Result<()> {
        crate::blocking::check()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        self.kv_write(bucket, key, None)
    }

    fn kv_watch(&self, bucket: &str, pattern: &str) -> Result<KvWatcher> {
        crate::blocking::check()?;
        self.life.check_open()?;
        check_name("bucket", bucket)?;
        pattern::validate(pattern)?;
        let bucket = bucket.to_string();
        let pattern = pattern.to_string();
        task::open(&self.bridge, &self.target, self.feed_capacity, move |ctx| {
            kv::watch_task(ctx, bucket, pattern)
        })
        .map_err(|e| self.life.or_gone(e))
    }

    fn ping(&self) -> Result<()> {
        crate::blocking::check()?;
        let target = &self.target;
        self.run(move |conn| async move {
            let attempt = || {
                let mut conn = conn.clone();
                async move { conn.query::<()>(&redis::cmd("PING")).await }
            };
            let describe = |e: &redis::RedisError| target.error("ping", e);
            with_failover(target, "ping", None, Repeat::Safe, attempt, describe).await
        })
    }

    fn close(&self) -> Result<()> {
        crate::blocking::check()?;
        self.shut();
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        match self.stream_max_len {
            Some(n) => Capabilities::default().with_stream_max_len(n),
            None => Capabilities::default(),
        }
    }

    fn describe(&self) -> String {
        let cluster = if self.target.cluster {
            " (cluster)"
        } else {
            ""
        };
        format!("redis at {}{cluster}", self.target.urls)
    }
}

impl RedisCoordinator {
    fn kv_write(&self, bucket: &str, key: &str, value: Option<Vec<u8>>) -> Result<()> {
        self.kv_write_with(bucket, key, value, None, None)
            .map(|_| ())
    }

    /// One KV write: a set (`value`) or a delete, conditional on
    /// `expected` (0: absent), expiring after `ttl_ms`. Returns the
    /// revision written.
    fn kv_write_with(
        &self,
        bucket: &str,
        key: &str,
        value: Option<Vec<u8>>,
        expected: Option<u64>,
        ttl_ms: Option<u64>,
    ) -> Result<kv::Written> {
        let target = &self.target;
        let cluster = self.target.cluster;
        let op = match (&value, expected) {
            (None, _) => "delete",
            (Some(_), None) => "set",
            (Some(_), Some(_)) => "conditional set",
        };
        let context = format!("{op} {key:?} in bucket {bucket:?}");
        let hash = names::kv_hash(bucket);
        let (bucket, key): (Arc<str>, Arc<str>) = (bucket.into(), key.into());
        let value: Option<Arc<[u8]>> = value.map(Into::into);
        // A conditional write carries a token its retries share: the
        // script recognises a repeat of a write that applied (its answer
        // lost) and answers it as applied instead of as a conflict.
        let token = expected.map(|_| crate::driver::rand_seed());
        self.run(move |conn| async move {
            // Set again, a value is the same; deleted again, a key stays
            // gone; a conditional write is recognised by its token: a
            // write whose answer was lost is safe to repeat.
            let doubt = AtomicBool::new(false);
            let attempt = || {
                let (mut conn, bucket, key, value, doubt) = (
                    conn.clone(),
                    bucket.clone(),
                    key.clone(),
                    value.clone(),
                    &doubt,
                );
                async move {
                    let write = kv::Write {
                        key: &key,
                        value: value.as_deref(),
                        expected,
                        ttl_ms,
                        token,
                    };
                    let answer = kv::write(&mut conn, cluster, &bucket, &write).await;
                    if let Err(e) = &answer {
                        if kv::may_have_run(e) {
                            doubt.store(true, Ordering::Relaxed);
                        }
                    }
                    answer
                }
            };
            let describe = |e: &redis::RedisError| target.error(&context, e);
            // Plain writes keep their behaviour (a failover waited out);
            // a conditional one also waits out a standalone restart, as
            // the append does: its token makes every repeat safe.
            let through = if expected.is_some() {
                Through::Restart
            } else {
                Through::Failover
            };
            let answer = retried(
                target,
                &context,
                Some(&hash),
                Repeat::Safe,
                through,
                attempt,
                describe,
            )
            .await;
            let in_doubt = doubt.load(Ordering::Relaxed);
            match answer {
                // A refusal after an attempt that may have applied: the
                // write may have applied and been overwritten since, so
                // the token no longer speaks for it. Never a conflict the
                // caller would retry (and apply twice), never a win.
                Ok(kv::Written::Refused(_)) if in_doubt => Err(Error::KvIndeterminate {
                    backend: "redis",
                    bucket: bucket.to_string(),
                    key: key.to_string(),
                    message: "an earlier attempt's answer was lost, and the key has changed \
                              since"
                        .to_string(),
                }),
                Ok(written) => Ok(written),
                Err((e, maybe)) if expected.is_some() && (maybe || in_doubt) => {
                    Err(Error::KvIndeterminate {
                        backend: "redis",
                        bucket: bucket.to_string(),
                        key: key.to_string(),
                        message: e.to_string(),
                    })
                }
                Err((e, _)) => Err(e),
            }
        })
    }
}

impl RedisCoordinator {
    /// What `close` does once the caller may block, and all a drop does:
    /// mark the handle closed and stop the runtime thread (joined only by a
    /// caller that may block).
    fn shut(&self) {
        self.life.close();
        self.direct.close();
        self.bridge.shutdown();
    }
}

impl Drop for RedisCoordinator {
    fn drop(&mut self) {
        // Not `close`: a drop on a thread running an async runtime's tasks
        // must still stop everything (without waiting for the thread).
        self.shut();
    }
}
