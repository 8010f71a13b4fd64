//! The NATS JetStream backend (cargo feature `nats`): [`NatsCoordinator`].
//!
//! * **pub/sub** on core NATS subjects `coord.topic.<topic>`;
//! * **streams** on JetStream streams, one per coordinator stream
//!   (`COORD_S_<stream>`, subject `coord.stream.<stream>`), so entry IDs are
//!   the stream's own sequence numbers;
//! * **KV** on JetStream KV buckets (stream `KV_<bucket>`, history 1), so
//!   `nats kv` tools see the same keys.
//!
//! Topic, stream and bucket names are encoded into NATS' alphabets
//! reversibly (letters, digits and `-` as they are, every other byte as
//! `_XX`), so every name fleetcoord accepts works and two names never
//! share a subject.
//!
//! **KV keys** are the keys other NATS clients use (the default,
//! [`NatsKeyEncoding::Nats`]): a key made only of NATS' key alphabet
//! `[-/_=.A-Za-z0-9]`, neither starting nor ending with `.`, without `..`
//! and not starting with `=` is stored as it is, so `kv_set("svc", "web.a_1",
//! ..)` is `nats kv get svc web.a_1`, and every such key another client
//! writes is seen by `kv_get` and `kv_watch`. Every other key is stored as
//! `=` followed by its `_XX` encoding (`"a b"` as `=a_20b`, `"=x"` as
//! `=_3Dx`), which no plain key can equal. An entry starting with `=` that
//! does not decode (`=abc`, written by another client) is skipped by a
//! watch, with a warning logged once per key. Keys another client wrote
//! that fleetcoord does not accept as arguments (with `/`, or longer than
//! 255 bytes) are reported by a watch as they are, though `kv_get` refuses
//! them.
//!
//! **Buckets written before this encoding** (fleetcoord stored every key
//! `_XX`-encoded, `web.a` as `web_2Ea`): keys of only ASCII letters,
//! digits and `-` are stored alike by both encodings; the others read as
//! their stored text (`web_2Ea`) under the default. A deployment with such
//! buckets either stays on [`NatsKeyEncoding::Legacy`], set on every one of
//! its handles with [`NatsOptions::with_key_encoding`], or moves each
//! bucket to a new one: read the old bucket's snapshot with a legacy handle
//! (`kv_watch(old, "*")` up to `Synced`), `kv_set` every key into the new
//! bucket with a default handle, and switch the deployment to the new
//! bucket. Copying in place is not offered: a legacy bucket may hold both
//! `a_b` (stored `a_5Fb`) and `a_5Fb` (stored `a_5F5Fb`), and the default
//! stores `a_5Fb` where the legacy `a_b` lives.
//!
//! It runs like the etcd backend: one driver thread per handle with a tokio
//! runtime and the official `async-nats` client; callers block, feeds are
//! crossbeam receivers.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let server = fleetcoord::testing::NatsServer::start()?;
//! use fleetcoord::coordinator::{Coordinator, KvEvent, NatsCoordinator, StreamPosition};
//! use std::time::Duration;
//!
//! let coord = NatsCoordinator::connect(&server.url())?;
//! let watch = coord.kv_watch("config", "*")?;
//! assert_eq!(watch.recv_timeout(Duration::from_secs(5))?, KvEvent::Synced);
//! coord.kv_set("config", "mode", b"on")?;
//! assert!(matches!(watch.recv_timeout(Duration::from_secs(5))?, KvEvent::Put { .. }));
//!
//! let id = coord.append_stream("audit", b"login")?;
//! let reader = coord.read_stream("audit", StreamPosition::Start)?;
//! assert_eq!(reader.recv_timeout(Duration::from_secs(5))?.id, id);
//! coord.close()?;
//! # Ok(()) }
//! ```
//!
//! **Server requirements.** nats-server 2.9 or newer with JetStream on.
//! fleetcoord accepts payloads up to [`MAX_PAYLOAD`] (~1.5 MiB); the
//! server's default `max_payload` is 1 MiB, and larger payloads are then
//! rejected with [`Error::InvalidArgument`] before anything is sent. Set
//! `max_payload: 2MB` (or more) in the server's configuration to accept
//! every payload fleetcoord does.
//!
//! **TLS.** [`NatsOptions::with_tls`] takes the same [`Tls`] as etcd: the
//! servers' certificates must be signed by its CA bundle and valid for
//! its server name (else the URL's host), and its client certificate, if
//! any, is presented (nats-server's `tls { verify: true }`). Every URL
//! then uses TLS, `nats://` ones too. A `tls://` URL without
//! `with_tls` still requires TLS and trusts the platform's roots.
//!
//! **Logins.** [`NatsOptions::with_user_password`],
//! [`NatsOptions::with_token`], [`NatsOptions::with_nkey`] (an NKey user,
//! `authorization { users: [ { nkey: U... } ] }`) and
//! [`NatsOptions::with_credentials_file`] (a `.creds` file with a user JWT
//! and its seed, for a server in operator mode). Seeds and `.creds` files
//! are read and checked before anything is dialled. No password, token or
//! seed appears in `Debug` output or an error.
//!
//! **Refusals** are an [`Error::Backend`] of one line naming the cause: a
//! server certificate not signed by the CA, or not valid for the name; a
//! server that wants a client certificate and got none, or refused it
//! (an expired one says when it expired); a plain-text server; a refused
//! user, named by its user name or NKey public key (never its secret).
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use fleetcoord::coordinator::{Coordinator, NatsCoordinator, NatsOptions};
//! use fleetcoord::testing::NatsBuilder;
//! use fleetcoord::Tls;
//!
//! // A test server in operator mode (JWT accounts) that wants TLS.
//! let server = NatsBuilder::new().tls().jwt_auth().start()?;
//! let ca = server.pki().expect("a TLS server has test certificates").ca_path();
//! let coord = NatsCoordinator::with_options(
//!     &server.url(), // tls://127.0.0.1:...
//!     NatsOptions::default()
//!         .with_tls(Tls::from_ca_file(ca)?)
//!         .with_credentials_file(server.creds_path().expect("a creds file")),
//! )?;
//! coord.kv_set("config", "mode", b"on")?;
//!
//! // The wrong CA: refused before any request, saying why.
//! let stranger = fleetcoord::testing::TestPki::generate()?;
//! let err = NatsCoordinator::with_options(
//!     &server.url(),
//!     NatsOptions::default()
//!         .with_tls(Tls::from_ca_file(stranger.ca_path())?)
//!         .with_credentials_file(server.creds_path().expect("a creds file")),
//! )
//! .unwrap_err();
//! assert!(err.to_string().contains("not signed by the given CA"), "{err}");
//! # Ok(()) }
//! ```

mod auth;
mod conn;
mod kv;
mod names;
mod options;
mod ordered;
mod pubsub;
mod stream;
mod streams;

use super::{
    check_key, check_name, check_payload, check_set, pattern, Capabilities, Coordinator, Feed,
    KvEntry, KvSetOptions, KvWatcher, StreamId, StreamPosition, StreamReader, Subscription,
    MAX_PAYLOAD,
};
use crate::caller_driven::{CallerDriven, Health, Ran};
use crate::coordinator::bridge::{self, Bridge, CallError};
use crate::coordinator::feed_task::FeedTask;
use crate::coordinator::lifecycle::Lifecycle;
use crate::endpoints::Endpoints;
use crate::error::{one_line, Error, ErrorKind, Result};
use crate::runtime::StartError;
use crate::tls::Tls;
use auth::Login;
use conn::{Conn, Settings};
pub use options::{NatsCredentials, NatsKeyEncoding, NatsOptions};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The URL used when none is given.
pub const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

/// How long a caller waits beyond the request timeout for the driver to
/// answer: every request bounds its own retries by the request timeout, so
/// this only covers a driver too busy to answer.
const CALL_SLACK: Duration = Duration::from_secs(2);

/// A [`Coordinator`] on NATS JetStream.
///
/// Semantics beyond the trait's:
/// * **pub/sub** is live-only and ordered per topic. `publish` returns once
///   the server has processed the message (a round trip after it), so every
///   subscriber subscribed by then gets it; `subscribe` returns once the
///   server has processed the subscription. Messages published while the client is disconnected
///   from every server are not delivered (at-most-once across reconnects).
/// * **streams**: entry IDs are the JetStream stream's sequence numbers
///   (1, 2, 3, ... without gaps, also under concurrent appenders). An append
///   is retried across reconnects, server restarts and cluster leader
///   changes until the request timeout (never past the stream's duplicate
///   window), with one message ID, so it is stored at most once: `Ok` is
///   stored once, an error means it was not stored, except
///   [`Error::Indeterminate`], when an attempt may have landed unanswered.
///   Without JetStream quorum (most of a cluster's nodes gone) appends and
///   KV writes fail at the request timeout with a retryable
///   [`Error::Backend`] saying `JetStream has no quorum for stream "…"`
///   (nothing is created meanwhile, nothing was stored unless it says it
///   may have been), and work again once a quorum is back. A
///   reader delivers each entry exactly once, in order, across reconnects
///   and server restarts; with `stream_max_len`/`stream_max_age`, entries
///   trimmed before a reader got to them are skipped.
/// * **KV**: each bucket keeps one entry per key. A watch resumes after a
///   reconnect from the first change it has not applied; no change is lost
///   and none is reported twice, but several changes of one key during an
///   outage arrive as its newest value.
/// * **Slow consumers**: every feed is a bounded channel of
///   `feed_capacity`; the driver never blocks on it. When it is full a
///   stream reader or KV watch stops reading from the server, and once
///   half of the queue was read it continues after the last entry it
///   delivered (a watch: with every key changed since, at its newest
///   value). A subscription drops the messages that arrive while its queue
///   is full and logs a warning with their number.
pub struct NatsCoordinator {
    bridge: Bridge,
    conn: Conn,
    /// A second connection that callers drive themselves
    /// (`crate::caller_driven`) for requests: a publish, append or KV
    /// call from a lone caller crosses no thread. Subscriptions and
    /// consumers stay on `conn`, which the runtime thread drives; `conn`
    /// also serves requests while this one is not ready.
    direct: Arc<CallerDriven<Conn>>,
    /// How `direct` is dialled.
    dial: Dial,
    urls: String,
    feed_capacity: usize,
    life: Lifecycle,
}

impl fmt::Debug for NatsCoordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsCoordinator")
            .field("urls", &self.urls)
            .finish()
    }
}

impl NatsCoordinator {
    /// Connects to the servers `urls` (see [`Endpoints`]: `nats://host:port`,
    /// `tls://host:port` to require TLS, or `host:port`) with default
    /// options; the client connects to one and fails over to the others.
    /// Fails with [`Error::Connect`] naming the URLs when no server
    /// answers within the connect timeout.
    pub fn connect(urls: &(impl Endpoints + ?Sized)) -> Result<Self> {
        crate::blocking::check()?;
        Self::with_options(urls, NatsOptions::default())
    }

    /// Connects to `urls` (as [`connect`](Self::connect)) with explicit
    /// options (see [`NatsOptions`]). Credentials
    /// files and TLS settings are read and checked first, so a bad one is
    /// an [`Error::InvalidArgument`] before anything is dialled; a failed
    /// connection is an [`Error::Backend`] whose one-line message names
    /// the cause (a server certificate the CA did not sign, a missing or
    /// refused client certificate, a refused user).
    pub fn with_options(urls: &(impl Endpoints + ?Sized), options: NatsOptions) -> Result<Self> {
        crate::blocking::check()?;
        let addrs = urls.endpoint_list();
        if addrs.is_empty() {
            return Err(Error::invalid("urls", "at least one server URL is needed"));
        }
        for url in &addrs {
            url.parse::<async_nats::ServerAddr>()
                .map_err(|e| Error::invalid("urls", format!("{url:?}: {e}")))?;
        }
        options.check()?;
        let login = Login::resolve(&options.credentials)?;
        let who = login.who();
        let tls_config = options.tls.as_ref().map(Tls::to_rustls).transpose()?;
        let tls = options.tls.clone();
        let urls = addrs.join(",");
        let dial = Dial {
            addrs,
            login,
            who,
            tls_config,
            tls,
            connect_timeout: options.connect_timeout,
            request_timeout: options.request_timeout,
        };
        let connecting = dial.clone();
        let started = bridge::start("fleetcoord-nats", dial.connect_timeout, move || {
            connecting.dial()
        });
        let (bridge, (client, js)) = started.map_err(|e| match e {
            StartError::Io(e) => Error::Io(e),
            StartError::Connect(reason) => Error::Connect {
                backend: "nats",
                endpoints: urls.clone(),
                kind: ErrorKind::Unavailable,
                reason,
            },
        })?;
        let settings = Settings {
            kv_replicas: options.kv_replicas,
            stream_replicas: options.stream_replicas,
            stream_max_len: options.stream_max_len,
            stream_max_age: options.stream_max_age,
            request_timeout: options.request_timeout,
            key_encoding: options.key_encoding,
            server_version: client.server_info().version,
        };
        let direct = Arc::new(CallerDriven::new(dial.connect_timeout));
        // The server drops a client that leaves its pings unanswered
        // (twice its 2-minute interval by default).
        if let Err(e) = CallerDriven::tend(&direct, TEND_EVERY) {
            log::debug!("no tender for the caller-driven NATS connection: {e}");
        }
        Ok(NatsCoordinator {
            bridge,
            conn: Conn::new(client, js, settings),
            direct,
            dial,
            urls,
            feed_capacity: options.feed_capacity,
            life: Lifecycle::new(),
        })
    }

    /// Runs `op` on the connection callers drive (`direct`), or while that
    /// one is not ready, on the runtime thread's. An answer on `direct`
    /// that says the connection failed ([`ErrorKind::Unavailable`],
    /// [`ErrorKind::Timeout`], an append whose outcome is unknown) drops
    /// it; the next call dials anew.
    fn request<T, F, Fut>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        self.life.check_open()?;
        let wait = self
            .conn
            .settings
            .request_timeout
            .saturating_add(CALL_SLACK);
        let (dial, shared) = (self.dial.clone(), self.conn.clone());
        let build = move || async move {
            let (client, js) = dial.dial().await?;
            Ok(shared.on(client, js))
        };
        let Some(taken) = CallerDriven::take(&self.direct, 0, build) else {
            return self.run(op(self.conn.clone()));
        };
        let ran = taken.run(wait, |conn| {
            let call = op(conn);
            async move {
                let out = call.await;
                let health = Health::of(&out);
                (out, health)
            }
        });
        match ran {
            Ran::Answer(out) => out.map_err(|e| self.with_urls(e)),
            Ran::Waited => Err(Error::Timeout(wait)),
            Ran::Panicked => Err(self.life.gone()),
        }
    }

    /// `e`, naming this handle's URLs where it was made without them.
    fn with_urls(&self, e: Error) -> Error {
        match e {
            // Errors made on the driver name no URLs; this handle's go in.
            Error::Backend {
                backend,
                endpoints,
                kind,
                message,
            } if endpoints.is_empty() => Error::Backend {
                backend,
                endpoints: self.urls.clone(),
                kind,
                message,
            },
            other => other,
        }
    }

    /// Runs `fut` on the driver and waits for its answer.
    fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.life.check_open()?;
        let wait = self
            .conn
            .settings
            .request_timeout
            .saturating_add(CALL_SLACK);
        match self.bridge.call(wait, fut) {
            Ok(result) => result.map_err(|e| self.with_urls(e)),
            Err(CallError::Timeout) => Err(Error::Timeout(wait)),
            Err(CallError::Gone) => Err(self.life.gone()),
            Err(CallError::InsideAsyncRuntime) => Err(Error::InsideAsyncRuntime),
        }
    }

    /// Opens a feed: the task gets a lifeline that ends when the user drops
    /// the feed or the handle closes.
    fn start_feed<T: Send + 'static, F>(
        &self,
        task: impl FnOnce(FeedTask<T>) -> F + Send + 'static,
    ) -> Result<Feed<T>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (tx, feed) = bridge::feed_channel(self.feed_capacity);
        self.bridge
            .spawn(move |stopping| task(FeedTask::new(tx, stopping)))
            .map_err(|_| self.life.gone())?;
        Ok(feed)
    }
}

impl Coordinator for NatsCoordinator {
    fn publish(&self, topic: &str, payload: &[u8]) -> Result<()> {
        crate::blocking::check()?;
        check_name("topic", topic)?;
        check_payload("nats", "payload", payload)?;
        self.life.check_open()?;
        self.conn.check_fits("payload", payload.len(), 0)?;
        let subject = names::topic_subject(topic);
        let payload = bytes::Bytes::copy_from_slice(payload);
        let topic = topic.to_owned();
        self.request(|conn| async move {
            let client = conn.client;
            client
                .publish(subject, payload)
                .await
                .map_err(|e| conn::failed(format!("publishing on {topic:?}"), e))?;
            // Once the server answered a request sent after the message it
            // has routed the message to every subscription it knew.
            conn::round_trip(&client)
                .await
                .map_err(|e| conn::failed(format!("publishing on {topic:?}"), e))
        })
    }

    fn subscribe(&self, topic: &str) -> Result<Subscription> {
        crate::blocking::check()?;
        check_name("topic", topic)?;
        let client = self.conn.client.clone();
        let subject = names::topic_subject(topic);
        let what = format!("subscribing to {topic:?}");
        let sub = self.run(async move {
            let sub = client
                .subscribe(subject)
                .await
                .map_err(|e| conn::failed(&what, e))?;
            // Live when this returns: the server has processed the SUB.
            conn::round_trip(&client)
                .await
                .map_err(|e| conn::failed(&what, e))?;
            Ok(sub)
        })?;
        let topic = topic.to_owned();
        self.start_feed(move |life| pubsub::feed(sub, topic, life))
    }

    fn append_stream(&self, stream: &str, payload: &[u8]) -> Result<StreamId> {
        crate::blocking::check()?;
        check_name("stream", stream)?;
        check_payload("nats", "payload", payload)?;
        self.life.check_open()?;
        // The message ID header travels with the payload.
        self.conn.check_fits("payload", payload.len(), 64)?;
        let (stream, payload) = (stream.to_owned(), payload.to_vec());
        self.request(|conn| stream::append(conn, stream, payload))
    }

    fn read_stream(&self, stream: &str, from: StreamPosition) -> Result<StreamReader> {
        crate::blocking::check()?;
        check_name("stream", stream)?;
        let opened = self.run(stream::open(self.conn.clone(), stream.to_owned(), from))?;
        let conn = self.conn.clone();
        self.start_feed(move |life| stream::feed(conn, opened, life))
    }

    fn kv_set(&self, bucket: &str, key: &str, value: &[u8]) -> Result<()> {
        crate::blocking::check()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        check_payload("nats", "value", value)?;
        self.life.check_open()?;
        self.conn.check_fits("value", value.len(), 64)?;
        let (bucket, key, value) = (bucket.to_owned(), key.to_owned(), value.to_vec());
        self.request(|conn| kv::set(conn, bucket, key, value))
    }

    fn kv_get(&self, bucket: &str, key: &str) -> Result<Vec<u8>> {
        self.kv_get_entry(bucket, key).map(|entry| entry.value)
    }

    fn kv_get_entry(&self, bucket: &str, key: &str) -> Result<KvEntry> {
        crate::blocking::check()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        let (bucket, key) = (bucket.to_owned(), key.to_owned());
        let (value, revision) = self.request(|conn| kv::get(conn, bucket, key))?;
        Ok(KvEntry { value, revision })
    }

    fn kv_set_with(
        &self,
        bucket: &str,
        key: &str,
        value: &[u8],
        options: KvSetOptions,
    ) -> Result<u64> {
        crate::blocking::check()?;
        let plan = check_set("nats", bucket, key, value, options)?;
        self.life.check_open()?;
        // Room for the TTL and expected-sequence headers too.
        self.conn.check_fits("value", value.len(), 160)?;
        let (bucket, key, value) = (bucket.to_owned(), key.to_owned(), value.to_vec());
        self.request(|conn| kv::set_with(conn, bucket, key, value, plan))
    }

    fn kv_delete(&self, bucket: &str, key: &str) -> Result<()> {
        crate::blocking::check()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        let (bucket, key) = (bucket.to_owned(), key.to_owned());
        self.request(|conn| kv::delete(conn, bucket, key))
    }

    fn kv_watch(&self, bucket: &str, pattern: &str) -> Result<KvWatcher> {
        crate::blocking::check()?;
        check_name("bucket", bucket)?;
        pattern::validate(pattern)?;
        let opened = self.run(kv::open_watch(self.conn.clone(), bucket.to_owned()))?;
        let conn = self.conn.clone();
        let pattern = pattern.to_owned();
        self.start_feed(move |life| kv::feed(conn, opened, pattern, life))
    }

    fn ping(&self) -> Result<()> {
        crate::blocking::check()?;
        self.request(|conn| async move {
            conn::round_trip(&conn.client)
                .await
                .map_err(|e| conn::failed("ping", e))
        })
    }

    fn close(&self) -> Result<()> {
        crate::blocking::check()?;
        self.shut();
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        let caps = Capabilities::default();
        match self.conn.settings.stream_max_len {
            Some(n) => caps.with_stream_max_len(n),
            None => caps,
        }
    }

    fn describe(&self) -> String {
        format!("nats at {}", self.urls)
    }
}

impl NatsCoordinator {
    /// What `close` does once the caller may block, and all a drop does:
    /// mark the handle closed and stop the runtime thread (joined only by a
    /// caller that may block).
    fn shut(&self) {
        self.life.close();
        self.direct.close();
        // Ends every feed task (their senders drop, so feeds disconnect),
        // then the runtime and with it the connection.
        self.bridge.shutdown();
    }
}

impl Drop for NatsCoordinator {
    fn drop(&mut self) {
        // Not `close`: a drop on a thread running an async runtime's tasks
        // must still stop everything (without waiting for the thread).
        self.shut();
    }
}

// The payload limit of the trait is what the docs above promise.
const _: () = assert!(MAX_PAYLOAD < 2 * 1024 * 1024);

/// How long the caller-driven connection may sit undriven before its
/// tender drives it: far inside the server's default ping interval (2
/// minutes) and the client's own (1 minute), and inside the 1 s a server
/// may be configured with; two wake-ups a second of an idle handle.
const TEND_EVERY: Duration = Duration::from_millis(500);

/// Everything needed to dial the servers, kept so that the caller-driven
/// connection is dialled as the first one was.
#[derive(Clone)]
struct Dial {
    addrs: Vec<String>,
    login: Login,
    /// Who logs in, for messages.
    who: Option<String>,
    tls_config: Option<rustls::ClientConfig>,
    tls: Option<Tls>,
    connect_timeout: Duration,
    request_timeout: Duration,
}

/// A client and its JetStream context.
type Dialled = (async_nats::Client, async_nats::jetstream::Context);

impl Dial {
    /// A client on one of the servers, and its JetStream context; the
    /// error is one line for an operator.
    async fn dial(self) -> std::result::Result<Dialled, String> {
        let Dial {
            addrs,
            login,
            who,
            tls_config,
            tls,
            connect_timeout,
            request_timeout,
        } = self;
        let mut client_options = async_nats::ConnectOptions::new()
            .name("fleetcoord")
            .connection_timeout(connect_timeout)
            .request_timeout(Some(request_timeout))
            // Never give up on a server that went away: feeds resume
            // and calls fail with a timeout meanwhile.
            .max_reconnects(None);
        client_options = login.apply(client_options);
        if let Some(config) = tls_config {
            client_options = client_options.require_tls(true).tls_client_config(config);
        }
        // A list, not one comma-separated string (docs/backend-notes.md, "Connect").
        let addrs: Vec<async_nats::ServerAddr> = addrs
            .iter()
            .map(|u| u.parse())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e: std::io::Error| e.to_string())?;
        let client = client_options
            .connect(addrs)
            .await
            .map_err(|e| auth::explain(e.kind(), &one_line(&e), tls.as_ref(), who.as_deref()))?;
        let js = async_nats::jetstream::context::ContextBuilder::new()
            .timeout(request_timeout.min(Duration::from_secs(5)))
            .build(client.clone());
        Ok((client, js))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error whose source says more than its own text.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn one_line_adds_only_what_sources_say_beyond_the_error() {
        let e = Layer(
            "connect failed:\n  refused",
            Some(Box::new(Layer(
                "refused",
                Some(Box::new(Layer("os error 111", None))),
            ))),
        );
        // The first source repeats the text; the second adds to it.
        assert_eq!(one_line(&e), "connect failed: refused: os error 111");
    }
}
