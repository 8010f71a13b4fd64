//! What every operation on the driver thread shares: the client, the
//! JetStream context, which streams are known to exist, and the two
//! write paths that survive a reconnect (publish with dedupe, ensure a
//! stream exists).

use super::names;
use crate::coordinator::MAX_PAYLOAD;
use crate::error::{Error, ErrorKind, Result};
use async_nats::jetstream::{self, stream, ErrorCode};
use crate::coordinator::retry::{self, Decision, LastPause, Repeat, Retry, Sign};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Longest a single JetStream attempt (publish and ack, a stream or
/// consumer create, a reader's look at its stream's state) may take before
/// it is retried; retries run until the request timeout.
pub(super) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// First pause between attempts; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(25);
const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// "No stream" answers (no responder on the stream's subject) between two
/// looks at the stream's health (about 3 s of backoff).
const LOOK_EVERY: u32 = 8;
/// Longest one look at a stream's health may take: a JetStream without
/// quorum does not answer at all for its first ~10 s (measured on
/// nats-server 2.9, 2 of 3 nodes killed), then answers 10008.
const LOOK_TIMEOUT: Duration = Duration::from_secs(1);
/// A replica its stream's leader has not heard from for this long is
/// taken as gone: a following replica answers the leader's heartbeat,
/// sent every second while the stream is idle. The replicas' `current`
/// flag is no such signal: it stays true for about 6 s after the leader
/// lost contact.
const PEER_SILENT: Duration = Duration::from_millis(1500);
/// JetStream's "duplicate message id is in process" (nats-server 2.10+):
/// an earlier attempt with this `Nats-Msg-Id` was accepted and is still
/// waiting for its replicas.
const DUPLICATE_IN_PROCESS: ErrorCode = ErrorCode(10158);

/// The settings the driver side needs, in plain data.
#[derive(Clone, Debug)]
pub(super) struct Settings {
    pub kv_replicas: usize,
    pub stream_replicas: usize,
    pub stream_max_len: Option<u64>,
    pub stream_max_age: Option<Duration>,
    pub request_timeout: Duration,
    /// How KV keys are stored.
    pub key_encoding: super::NatsKeyEncoding,
}

/// Cloned into every future run on the driver.
#[derive(Clone)]
pub(super) struct Conn {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub settings: Arc<Settings>,
    /// JetStream streams (coordinator streams and bucket streams) this
    /// handle created or found, so later calls skip the round trip.
    known: Arc<Mutex<HashMap<String, ()>>>,
    /// KV stores by bucket name, for reads.
    stores: Arc<Mutex<HashMap<String, jetstream::kv::Store>>>,
    /// Where every write's message id comes from.
    ids: Arc<MessageIds>,
}

/// Message ids for JetStream's duplicate detection: the server drops a
/// publish whose id it saw within the stream's duplicate window, so an id
/// must never repeat across writers, or a write is lost. Each is 128 random
/// bits drawn once per handle and a count of the handle's writes: as unique
/// as a fresh UUID per write, without a system call per write for its
/// randomness.
pub(super) struct MessageIds {
    prefix: String,
    next: std::sync::atomic::AtomicU64,
}

impl MessageIds {
    fn new() -> Self {
        MessageIds {
            prefix: uuid::Uuid::new_v4().simple().to_string(),
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// An id no other write (of this handle or any other) gets.
    pub(super) fn next(&self) -> String {
        // 2^64 writes of one handle would take longer than any duplicate
        // window by far; wrapping there could not meet an id still held.
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{}-{n:x}", self.prefix)
    }
}

/// A round trip to the server: once it is answered, the server has
/// processed everything this connection sent before it (NATS handles one
/// connection's messages in order). `Client::flush` is no such thing: it
/// only writes the client's buffer to the socket, and succeeds against a
/// paused server. The JetStream API's account info is the cheapest request
/// every server this backend works with answers; its reply is not read.
pub(super) async fn round_trip(client: &async_nats::Client) -> std::result::Result<(), String> {
    client
        .request("$JS.API.INFO", bytes::Bytes::new())
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A failed NATS request (the connection broke, no answer before the
/// retries ran out) as the user's error. The handle fills in its URLs
/// (`endpoints` is left empty here) when the error reaches the caller.
pub(super) fn failed(context: impl std::fmt::Display, e: impl std::fmt::Display) -> Error {
    Error::Backend {
        backend: "nats",
        endpoints: String::new(),
        kind: ErrorKind::Unavailable,
        message: format!("{context}: {e}"),
    }
}

/// A request NATS refused and will refuse again.
pub(super) fn refused(context: impl std::fmt::Display, e: impl std::fmt::Display) -> Error {
    Error::Backend {
        backend: "nats",
        endpoints: String::new(),
        kind: ErrorKind::Rejected,
        message: format!("{context}: {e}"),
    }
}

/// The retries of one request of `budget`: pauses from [`FIRST_BACKOFF`]
/// doubling to [`MAX_BACKOFF`], half of each jittered; no pause that
/// would reach the deadline (each attempt is bounded by what is left of it
/// instead); every request repeatable (a publish carries its message id,
/// the rest are reads and idempotent creates).
pub(super) fn retries(budget: Duration) -> Retry {
    retry::policy(
        budget,
        Duration::ZERO,
        (FIRST_BACKOFF, MAX_BACKOFF),
        LastPause::GiveUp,
        Repeat::Safe,
    )
}

/// Waits out the pause `policy` gives after a failure of `sign`; `false`
/// when it gives up instead.
pub(super) async fn pause(policy: &mut Retry, sign: Sign) -> bool {
    match policy.on_error(retry::now(), sign) {
        Decision::Retry(pause) => {
            tokio::time::sleep(pause).await;
            true
        }
        Decision::GiveUp(_) => false,
    }
}

impl Conn {
    pub(super) fn new(
        client: async_nats::Client,
        js: jetstream::Context,
        settings: Settings,
    ) -> Self {
        Conn {
            client,
            js,
            settings: Arc::new(settings),
            known: Arc::new(Mutex::new(HashMap::new())),
            stores: Arc::new(Mutex::new(HashMap::new())),
            ids: Arc::new(MessageIds::new()),
        }
    }

    /// Fails with `InvalidArgument` naming `what` when `len` bytes (plus
    /// `headers` bytes of headers) do not fit the server's `max_payload`,
    /// which defaults to 1 MiB, below fleetcoord's [`MAX_PAYLOAD`].
    pub(super) fn check_fits(&self, what: &'static str, len: usize, headers: usize) -> Result<()> {
        fits(what, len, headers, self.client.server_info().max_payload)
    }

    /// Publishes `payload` to a JetStream `subject` and returns the stored
    /// sequence. A publish whose ack did not arrive may have been stored
    /// (docs/backend-notes.md, "Restart"), so every retry carries the same
    /// `Nats-Msg-Id`: the stream's duplicate window (2 min) answers a retry
    /// of a stored message with the original sequence instead of storing
    /// it twice.
    ///
    /// When nobody answers on the subject (no responders), the stream's
    /// health says why ([`Conn::health`]): a leader election (retrying is
    /// enough: measured 4-9 s of these after a leader's node was killed),
    /// no quorum (retried until the deadline, and said when giving up; the
    /// stream is never created then, since it exists), or a stream deleted
    /// behind this handle's back, which only the meta leader can say and
    /// which is created again. When an attempt goes unacknowledged (no ack
    /// in time, or 10158 for its retry), the stream's info says whether its
    /// leader hears from a majority of the replicas ([`Health::Outvoted`]):
    /// a leader without quorum accepts publishes and never acknowledges
    /// them, and the error then says that the quorum is lacking.
    ///
    /// Retries stop at the request timeout, and never later than the
    /// stream's duplicate window after the first attempt (a shorter
    /// `stream_max_age` shortens it): a retry past the window would be
    /// stored again. Every attempt, the client's own resend of a message
    /// buffered during a reconnect included, carries the one id, so the
    /// whole call stores it at most once. When it ends in an error after an
    /// attempt that went unanswered, the error is `unknown(why)`.
    pub(super) async fn publish_once(
        &self,
        what: &str,
        stream: Option<&StreamSpec>,
        subject: String,
        header: Option<(&'static str, &'static str)>,
        payload: bytes::Bytes,
        unknown: &(dyn Fn(String) -> Error + Send + Sync),
    ) -> Result<u64> {
        let id = self.ids.next();
        let budget = match stream {
            Some(spec) => self
                .settings
                .request_timeout
                .min(spec.config.duplicate_window),
            None => self.settings.request_timeout,
        };
        // Every attempt carries the one id: repeating it is safe.
        let mut policy = retries(budget);
        let deadline = retry::on_runtime(policy.deadline());
        let mut not_found: u32 = 0;
        // The last look at the stream, while publishes find no responder.
        let mut health: Option<Health> = None;
        // The error to end with: `e`, unless an earlier attempt may have
        // been stored, which the caller must hear instead.
        let give_up = |in_doubt: bool, why: String, e: Error| {
            if in_doubt {
                unknown(why)
            } else {
                e
            }
        };
        loop {
            let mut message = jetstream::message::PublishMessage::build()
                .payload(payload.clone())
                .message_id(&id);
            if let Some((name, value)) = header {
                message = message.header(name, value);
            }
            let attempt = async {
                let ack = self.js.send_publish(subject.clone(), message).await?;
                ack.await
            };
            let bound = ATTEMPT_TIMEOUT.min(deadline.saturating_duration_since(Instant::now()));
            // What the failure says, and in words; or the error it ends with.
            let (sign, last_error) = match tokio::time::timeout(bound, attempt).await {
                Ok(Ok(ack)) => return Ok(ack.sequence),
                Ok(Err(e)) => {
                    use jetstream::context::PublishErrorKind as K;
                    match e.kind() {
                        K::MaxPayloadExceeded => {
                            (Err(Error::invalid("payload", e.to_string())), e.to_string())
                        }
                        K::WrongLastMessageId | K::WrongLastSequence => {
                            (Err(refused(what, &e)), e.to_string())
                        }
                        K::StreamNotFound => {
                            not_found = not_found.saturating_add(1);
                            match stream {
                                Some(spec)
                                    if health.is_none() || not_found.is_multiple_of(LOOK_EVERY) =>
                                {
                                    let look = self.health(&spec.name, deadline).await;
                                    let created = if look == Health::Missing {
                                        self.forget(&spec.name);
                                        match self.create_stream_once(spec).await {
                                            Ok(_) => Ok(None),
                                            Err(Attempt::Refused(e)) => Err(e),
                                            Err(Attempt::Failed(why)) => Ok(Some(why)),
                                        }
                                    } else {
                                        Ok(None)
                                    };
                                    health = Some(look);
                                    match created {
                                        Ok(why) => {
                                            (Ok(Sign::NotRun), why.unwrap_or_else(|| e.to_string()))
                                        }
                                        Err(refusal) => {
                                            let why = refusal.to_string();
                                            (Err(refusal), why)
                                        }
                                    }
                                }
                                _ => (Ok(Sign::NotRun), e.to_string()),
                            }
                        }
                        _ => {
                            // Accepted, or perhaps accepted, and not
                            // acknowledged: a stream leader that lost its
                            // quorum does that, so look at its replicas.
                            let pending = e.kind() == K::TimedOut || in_process(&e);
                            health = match stream {
                                Some(spec) if pending => {
                                    Some(self.health(&spec.name, deadline).await)
                                }
                                _ => None,
                            };
                            let sign = if pending {
                                Sign::MaybeRun
                            } else {
                                Sign::NotRun
                            };
                            (Ok(sign), e.to_string())
                        }
                    }
                }
                Err(_) => {
                    health = match stream {
                        Some(spec) => Some(self.health(&spec.name, deadline).await),
                        None => None,
                    };
                    (Ok(Sign::MaybeRun), format!("no ack within {bound:?}"))
                }
            };
            let decision = match sign {
                Ok(sign) => policy.on_error(retry::now(), sign),
                Err(e) => return Err(give_up(policy.in_doubt(), last_error, e)),
            };
            match decision {
                Decision::Retry(pause) => {
                    tokio::time::sleep(pause).await;
                    continue;
                }
                Decision::GiveUp(_) => {}
            }
            let in_doubt = policy.in_doubt();
            let elapsed = retry::now().saturating_duration_since(policy.started());
            return Err(match (&health, stream) {
                (
                    Some(
                        Health::Leaderless(_) | Health::Outvoted { .. } | Health::MetaUnavailable(_),
                    ),
                    Some(spec),
                ) => {
                    // Not stored while the quorum is lacking; but a
                    // leader that accepted an attempt keeps it, and
                    // commits it once its replicas are back (seen with
                    // 2 of 3 nodes killed and restarted): after an
                    // unanswered attempt the outcome is unknown.
                    let why = format!(
                        "not acknowledged: {} (gave up after {elapsed:.1?})",
                        self.no_quorum(spec, health.as_ref()),
                    );
                    give_up(in_doubt, why.clone(), failed(what, why))
                }
                _ => {
                    let why = format!(
                        "not acknowledged within {:?} ({last_error})",
                        self.settings.request_timeout
                    );
                    // `unknown` says that it may have been stored.
                    give_up(
                        in_doubt,
                        why.clone(),
                        failed(what, format!("{why}; it was not stored")),
                    )
                }
            });
        }
    }

    /// What the JetStream API says about stream `name`, asked within
    /// [`LOOK_TIMEOUT`] (and `deadline`).
    pub(super) async fn health(&self, name: &str, deadline: Instant) -> Health {
        use jetstream::context::GetStreamErrorKind as K;
        let bound = LOOK_TIMEOUT.min(deadline.saturating_duration_since(Instant::now()));
        match tokio::time::timeout(bound, self.js.get_stream(name)).await {
            Err(_) => Health::MetaUnavailable("the JetStream API did not answer".to_string()),
            Ok(Ok(found)) => match &found.cached_info().cluster {
                // A replicated stream's info lists its leader, and every
                // peer as a replica while it has none.
                Some(cluster)
                    if cluster.leader.as_deref().is_none_or(str::is_empty)
                        && !cluster.replicas.is_empty() =>
                {
                    Health::Leaderless(cluster.replicas.len())
                }
                // The leader answers, with the replicas it follows: it
                // commits nothing without a majority of them all.
                Some(cluster) => {
                    let replicas = cluster.replicas.len() + 1;
                    let reachable = 1 + cluster
                        .replicas
                        .iter()
                        .filter(|peer| !peer.offline && peer.active < PEER_SILENT)
                        .count();
                    if reachable * 2 > replicas {
                        Health::Led
                    } else {
                        Health::Outvoted {
                            reachable,
                            replicas,
                        }
                    }
                }
                None => Health::Led,
            },
            Ok(Err(e)) => match e.kind() {
                K::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                    Health::Missing
                }
                K::JetStream(js) if js.error_code() == ErrorCode::CLUSTER_NOT_AVAILABLE => {
                    Health::MetaUnavailable(js.to_string())
                }
                // No responders, or no answer in the context's timeout.
                K::Request => Health::MetaUnavailable(super::one_line(&e)),
                _ => Health::Unknown(super::one_line(&e)),
            },
        }
    }

    /// The one line for a stream JetStream cannot write to for lack of
    /// quorum, as `health` saw it.
    fn no_quorum(&self, spec: &StreamSpec, health: Option<&Health>) -> String {
        let clustered = self.client.server_info().cluster.is_some();
        no_quorum(&spec.shown, health, clustered)
    }

    fn forget(&self, stream: &str) {
        self.known.lock().remove(stream);
    }

    /// Makes sure the JetStream stream of `spec` exists, unless this handle
    /// already knows it does. It looks first and creates only a stream the
    /// meta leader says is missing: a JetStream without quorum refuses
    /// every create, and a stream that exists is then only waiting for its
    /// quorum (waited for until the request timeout, and said). Creating is
    /// idempotent for an identical config; a stream that exists with
    /// another config (made by a process with other options) is used as it
    /// is.
    pub(super) async fn ensure_stream(&self, spec: &StreamSpec) -> Result<()> {
        if self.known.lock().contains_key(&spec.name) {
            return Ok(());
        }
        let mut policy = retries(self.settings.request_timeout);
        let deadline = retry::on_runtime(policy.deadline());
        loop {
            match self.health(&spec.name, deadline).await {
                Health::Led | Health::Leaderless(_) | Health::Outvoted { .. } => {
                    self.known.lock().insert(spec.name.clone(), ());
                    return Ok(());
                }
                Health::Missing | Health::Unknown(_) => {
                    return self.create_stream(spec).await.map(|_| ());
                }
                look @ Health::MetaUnavailable(_) => {
                    if !pause(&mut policy, Sign::NotRun).await {
                        let elapsed = retry::now().saturating_duration_since(policy.started());
                        return Err(failed(
                            format!("looking up stream {}", spec.name),
                            format!(
                                "{} (gave up after {elapsed:.1?})",
                                self.no_quorum(spec, Some(&look)),
                            ),
                        ));
                    }
                }
            }
        }
    }

    /// Creates (or finds) the stream of `spec` and returns its state,
    /// retrying until the request timeout.
    pub(super) async fn create_stream(&self, spec: &StreamSpec) -> Result<stream::State> {
        let mut policy = retries(self.settings.request_timeout);
        loop {
            let error = match self.create_stream_once(spec).await {
                Ok(state) => return Ok(state),
                Err(Attempt::Refused(e)) => return Err(e),
                Err(Attempt::Failed(e)) => e,
            };
            if !pause(&mut policy, Sign::NotRun).await {
                return Err(failed(format!("creating stream {}", spec.name), error));
            }
        }
    }

    /// One attempt of [`Conn::create_stream`].
    async fn create_stream_once(
        &self,
        spec: &StreamSpec,
    ) -> std::result::Result<stream::State, Attempt> {
        let attempt =
            tokio::time::timeout(ATTEMPT_TIMEOUT, self.js.create_stream(spec.config.clone()));
        let e = match attempt.await {
            Ok(Ok(created)) => {
                self.known.lock().insert(spec.name.clone(), ());
                return Ok(created.cached_info().state.clone());
            }
            Ok(Err(e)) => e,
            Err(_) => {
                return Err(Attempt::Failed(format!(
                    "no answer within {ATTEMPT_TIMEOUT:?}"
                )))
            }
        };
        use jetstream::context::CreateStreamErrorKind as K;
        // Two creates of one stream racing (concurrent first appends) can
        // answer the loser "subjects overlap" instead of "name in use": the
        // overlap is with the stream just made, so look it up as well.
        let raced = |js: &jetstream::Error| {
            js.error_code() == ErrorCode::STREAM_NAME_EXIST
                || js.error_code() == ErrorCode::STREAM_SUBJECT_OVERLAP
        };
        match e.kind() {
            K::JetStream(js) if raced(&js) => {
                match self.stream_state(&spec.name).await {
                    Ok(Some(state)) => {
                        self.known.lock().insert(spec.name.clone(), ());
                        Ok(state)
                    }
                    // The overlap is with another stream: a bad config.
                    Ok(None) if js.error_code() == ErrorCode::STREAM_SUBJECT_OVERLAP => Err(
                        Attempt::Refused(refused(format!("creating stream {}", spec.name), js)),
                    ),
                    Ok(None) => Err(Attempt::Failed("deleted while being created".into())),
                    Err(e) => Err(Attempt::Failed(e.to_string())),
                }
            }
            // A bad config stays bad: subjects another stream holds (400),
            // replicas on a server outside a cluster and invalid configs
            // (code 500 on nats-server 2.9: 10074, 10052), which retrying
            // would only repeat until the request timeout.
            K::JetStream(js)
                if js.code() == 400
                    || js.error_code() == ErrorCode::STREAM_REPLICAS_NOT_SUPPORTED
                    || js.error_code() == ErrorCode::STREAM_INVALID_CONFIG =>
            {
                Err(Attempt::Refused(refused(
                    format!("creating stream {}", spec.name),
                    js,
                )))
            }
            K::JetStream(js) if js.error_code() == ErrorCode::CLUSTER_NOT_AVAILABLE => Err(
                Attempt::Failed(
                    self.no_quorum(spec, Some(&Health::MetaUnavailable(js.to_string()))),
                ),
            ),
            _ => Err(Attempt::Failed(e.to_string())),
        }
    }

    /// The state of stream `name`; `None` when it does not exist.
    pub(super) async fn stream_state(&self, name: &str) -> Result<Option<stream::State>> {
        match self.js.get_stream(name).await {
            Ok(s) => Ok(Some(s.cached_info().state.clone())),
            Err(e) => match e.kind() {
                jetstream::context::GetStreamErrorKind::JetStream(js)
                    if js.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                {
                    Ok(None)
                }
                jetstream::context::GetStreamErrorKind::JetStream(js)
                    if js.error_code() == ErrorCode::CLUSTER_NOT_AVAILABLE =>
                {
                    let clustered = self.client.server_info().cluster.is_some();
                    let health = Health::MetaUnavailable(js.to_string());
                    let why = no_quorum(&format!("stream {name}"), Some(&health), clustered);
                    Err(failed(format!("reading stream {name}"), why))
                }
                _ => Err(failed(format!("reading stream {name}"), e)),
            },
        }
    }

    /// The KV store of a bucket; `None` when the bucket does not exist.
    pub(super) async fn store(&self, bucket_name: &str) -> Result<Option<jetstream::kv::Store>> {
        if let Some(store) = self.stores.lock().get(bucket_name) {
            return Ok(Some(store.clone()));
        }
        let stream = names::bucket_stream(bucket_name);
        if self.stream_state(&stream).await?.is_none() {
            return Ok(None);
        }
        let store = self
            .js
            .get_key_value(bucket_name)
            .await
            .map_err(|e| failed(format!("opening bucket {bucket_name}"), e))?;
        self.stores
            .lock()
            .insert(bucket_name.to_owned(), store.clone());
        Ok(Some(store))
    }
}

/// What [`Conn::no_quorum`] says about `shown` (`stream "jobs"`).
fn no_quorum(shown: &str, health: Option<&Health>, clustered: bool) -> String {
    let why = match health {
        Some(Health::Leaderless(replicas)) => format!("no leader among its {replicas} replicas"),
        Some(Health::Outvoted {
            reachable,
            replicas,
        }) => format!("its leader reaches {reachable} of its {replicas} replicas"),
        // A single server has no meta leader to lose: say what it did.
        Some(Health::MetaUnavailable(why)) if !clustered => why.clone(),
        Some(Health::MetaUnavailable(why)) => format!("meta leader unavailable: {why}"),
        _ if !clustered => "the JetStream API did not answer".to_string(),
        _ => "meta leader unavailable".to_string(),
    };
    // A single server has no quorum to lose: it is down or frozen.
    if clustered {
        format!("JetStream has no quorum for {shown} ({why})")
    } else {
        format!("JetStream is unavailable for {shown} ({why})")
    }
}

/// Whether a publish failed with [`DUPLICATE_IN_PROCESS`].
fn in_process(e: &jetstream::context::PublishError) -> bool {
    std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<jetstream::Error>())
        .is_some_and(|js| js.error_code() == DUPLICATE_IN_PROCESS)
}

/// [`Conn::check_fits`] against a server's `max_payload` of `max` bytes.
fn fits(what: &'static str, len: usize, headers: usize, max: usize) -> Result<()> {
    if len.saturating_add(headers) > max {
        return Err(Error::invalid(
            what,
            format!(
                "{len} bytes do not fit the NATS server's max_payload of {max} bytes \
                 (fleetcoord accepts up to {MAX_PAYLOAD}: set max_payload to at least 2MB \
                 in the server's configuration)"
            ),
        ));
    }
    Ok(())
}

/// What the JetStream API says about a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Health {
    /// It exists and has a leader (or is not replicated).
    Led,
    /// It exists, and its replicas (this many) elect no leader: no quorum
    /// among them.
    Leaderless(usize),
    /// It exists and has a leader, which hears from `reachable` of the
    /// `replicas` (itself included), no majority: it accepts publishes and
    /// never acknowledges them.
    Outvoted { reachable: usize, replicas: usize },
    /// The meta leader said it does not exist.
    Missing,
    /// The JetStream API did not answer, or answered 10008 ("JetStream
    /// system temporarily unavailable"): no meta leader, so no quorum.
    MetaUnavailable(String),
    /// Another failure; retrying may help.
    Unknown(String),
}

/// Why one attempt failed.
enum Attempt {
    /// Retrying may help.
    Failed(String),
    /// The server refused; it will again.
    Refused(Error),
}

/// A JetStream stream fleetcoord creates on demand: its name and config.
#[derive(Clone, Debug)]
pub(super) struct StreamSpec {
    pub name: String,
    /// What it is to the user, for messages: `stream "jobs"`, `bucket "b"`.
    pub shown: String,
    pub config: stream::Config,
}

/// Common to both kinds: file storage, no size limits beyond the ones
/// asked for, the 2 minute dedupe window the retry path relies on.
fn base(name: String, subject: String, replicas: usize) -> stream::Config {
    stream::Config {
        name,
        subjects: vec![subject],
        max_bytes: -1,
        max_messages: -1,
        max_messages_per_subject: -1,
        max_message_size: -1,
        num_replicas: replicas,
        duplicate_window: Duration::from_secs(120),
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

impl StreamSpec {
    /// The stream behind coordinator stream `stream`: one subject, so its
    /// sequence numbers are the entries' IDs (1, 2, 3, ... gap-free).
    pub(super) fn for_stream(settings: &Settings, stream: &str) -> StreamSpec {
        let name = names::stream_name(stream);
        let mut config = base(
            name.clone(),
            names::stream_subject(stream),
            settings.stream_replicas,
        );
        if let Some(max) = settings.stream_max_len {
            config.max_messages = i64::try_from(max).unwrap_or(i64::MAX);
        }
        if let Some(age) = settings.stream_max_age {
            config.max_age = age;
            // nats-server refuses a dedupe window longer than max_age
            // (10052 on 2.9, for every max_age below 2 min); a retry can
            // only repeat an entry the stream still holds anyway.
            config.duplicate_window = config.duplicate_window.min(age);
        }
        config.discard = stream::DiscardPolicy::Old;
        StreamSpec {
            name,
            shown: format!("stream {stream:?}"),
            config,
        }
    }

    /// The stream of a KV bucket, exactly as JetStream KV lays it out
    /// (docs/backend-notes.md, "Versions": async-nats 0.51 cannot create buckets on
    /// nats-server 2.9 itself), history 1.
    pub(super) fn for_bucket(settings: &Settings, bucket: &str) -> StreamSpec {
        let bucket_name = names::bucket_name(bucket);
        let name = names::bucket_stream(&bucket_name);
        let mut config = base(
            name.clone(),
            format!("$KV.{bucket_name}.>"),
            settings.kv_replicas,
        );
        config.max_messages_per_subject = 1;
        config.allow_rollup = true;
        config.deny_delete = true;
        config.deny_purge = false;
        config.allow_direct = true;
        config.discard = stream::DiscardPolicy::New;
        StreamSpec {
            name,
            shown: format!("bucket {bucket:?}"),
            config,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_never_repeat_within_or_across_handles() {
        let (a, b) = (MessageIds::new(), MessageIds::new());
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            assert!(seen.insert(a.next()));
            assert!(seen.insert(b.next()));
        }
        assert_ne!(a.prefix, b.prefix, "each handle draws its own");
    }

    #[test]
    fn lack_of_quorum_is_said_in_one_line() {
        assert_eq!(
            no_quorum(r#"stream "jobs""#, Some(&Health::Leaderless(3)), true),
            r#"JetStream has no quorum for stream "jobs" (no leader among its 3 replicas)"#
        );
        let meta = Health::MetaUnavailable("JetStream system temporarily unavailable".into());
        assert_eq!(
            no_quorum(r#"bucket "cfg""#, Some(&meta), true),
            r#"JetStream has no quorum for bucket "cfg" (meta leader unavailable: JetStream system temporarily unavailable)"#
        );
        let outvoted = Health::Outvoted {
            reachable: 1,
            replicas: 3,
        };
        assert_eq!(
            no_quorum(r#"stream "jobs""#, Some(&outvoted), true),
            r#"JetStream has no quorum for stream "jobs" (its leader reaches 1 of its 3 replicas)"#
        );
        assert_eq!(
            no_quorum(r#"stream "s""#, None, false),
            r#"JetStream is unavailable for stream "s" (the JetStream API did not answer)"#
        );
        // A single server has no meta leader: what it did is said plainly.
        let silent = Health::MetaUnavailable("the JetStream API did not answer".into());
        assert_eq!(
            no_quorum(r#"stream "s""#, Some(&silent), false),
            r#"JetStream is unavailable for stream "s" (the JetStream API did not answer)"#
        );
        let settings = Settings {
            kv_replicas: 1,
            stream_replicas: 1,
            stream_max_len: None,
            stream_max_age: None,
            request_timeout: Duration::from_secs(1),
            key_encoding: super::super::NatsKeyEncoding::default(),
        };
        assert_eq!(
            StreamSpec::for_stream(&settings, "jobs").shown,
            r#"stream "jobs""#
        );
        assert_eq!(
            StreamSpec::for_bucket(&settings, "a b").shown,
            r#"bucket "a b""#
        );
    }

    #[test]
    fn payload_and_headers_must_fit_the_servers_max_payload() {
        // The server's default max_payload of 1 MiB.
        let max = 1024 * 1024;
        assert!(fits("value", max - 64, 64, max).is_ok());
        match fits("value", max - 63, 64, max) {
            Err(Error::InvalidArgument { what, why }) => {
                assert_eq!(what, "value");
                assert!(why.contains("max_payload of 1048576 bytes"), "{why}");
                assert!(why.contains("at least 2MB"), "{why}");
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        // No overflow on absurd sizes.
        assert!(fits("payload", usize::MAX, 64, max).is_err());
    }
}
