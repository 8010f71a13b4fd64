//! The connection every operation on the driver thread shares (the
//! client, the JetStream context, which streams are known to exist) and
//! its write that survives a reconnect: publishing with dedupe, retried by
//! sm's retry policy. Streams are found or created in `streams.rs`.

use super::names;
use super::streams::{Attempt, StreamSpec, StreamStatus};
use crate::coordinator::retry::{self, Decision, LastPause, Repeat, Retry, Sign};
use crate::coordinator::write_ids::WriteIds;
use crate::coordinator::MAX_PAYLOAD;
use crate::error::{Error, ErrorKind, Result};
use async_nats::jetstream::{self, ErrorCode};
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
/// looks at the stream's status (about 3 s of backoff).
const LOOK_EVERY: u32 = 8;
/// JetStream's "duplicate message id is in process" (nats-server 2.10+):
/// an earlier attempt with this `Nats-Msg-Id` was accepted and is still
/// waiting for its replicas.
const DUPLICATE_IN_PROCESS: ErrorCode = ErrorCode(10158);
/// JetStream's "per-message TTL is disabled" (nats-server 2.11+): the
/// stream was created without `allow_msg_ttl`.
const MSG_TTL_DISABLED: ErrorCode = ErrorCode(10166);

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
    /// The version the server said at connect, e.g. `2.11.0`.
    pub server_version: String,
}

impl Settings {
    /// Whether the server expires single messages (per-message TTL and
    /// subject delete markers: nats-server 2.11 and newer).
    pub(super) fn msg_ttl(&self) -> bool {
        version_at_least(&self.server_version, (2, 11))
    }
}

/// Whether `version` (`major.minor.patch`, perhaps with a suffix) is at
/// least `major.minor`; false for what does not parse.
pub(super) fn version_at_least(version: &str, (major, minor): (u64, u64)) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// Cloned into every future run on the driver.
#[derive(Clone)]
pub(super) struct Conn {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub settings: Arc<Settings>,
    /// JetStream streams (coordinator streams and bucket streams) this
    /// handle created or found, so later calls skip the round trip.
    pub(super) known: Arc<Mutex<HashMap<String, ()>>>,
    /// KV stores by bucket name, for reads.
    stores: Arc<Mutex<HashMap<String, jetstream::kv::Store>>>,
    /// Where every write's message id comes from.
    ids: Arc<WriteIds>,
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
            ids: Arc::new(WriteIds::new()),
        }
    }

    /// The same handle's view on another client: settings, known streams
    /// and write ids shared, KV stores its own (a store sends on the
    /// client it was made with).
    pub(super) fn on(&self, client: async_nats::Client, js: jetstream::Context) -> Self {
        Conn {
            client,
            js,
            settings: self.settings.clone(),
            known: self.known.clone(),
            stores: Arc::new(Mutex::new(HashMap::new())),
            ids: self.ids.clone(),
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
    /// status says why ([`Conn::look`]): a leader election (retrying is
    /// enough: measured 4-9 s of these after a leader's node was killed),
    /// no quorum (retried until the deadline, and said when giving up; the
    /// stream is never created then, since it exists), or a stream deleted
    /// behind this handle's back, which only the meta leader can say and
    /// which is created again. When an attempt goes unacknowledged (no ack
    /// in time, or 10158 for its retry), the stream's info says whether its
    /// leader hears from a majority of the replicas ([`StreamStatus::Outvoted`]):
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
        headers: &[(&'static str, String)],
        payload: bytes::Bytes,
        unknown: &(dyn Fn(String) -> Error + Send + Sync),
    ) -> Result<u64> {
        let id = self.next_id();
        self.publish_with_id(what, stream, subject, headers, payload, unknown, &id)
            .await
    }

    /// A new message id for [`Conn::publish_with_id`].
    pub(super) fn next_id(&self) -> String {
        self.ids.next()
    }

    /// [`Conn::publish_once`] with the message id `id`, which the caller
    /// keeps to recognise its message in the stream.
    ///
    /// A conditional publish (one carrying [`EXPECTED_SUBJECT_SEQUENCE`])
    /// whose condition failed ends with `condition_failed()` when every
    /// earlier attempt was answered, and with `unknown(why)` when one was
    /// not: nats-server 2.9 answers a repeat of a stored message as a
    /// duplicate, but 2.11 and later check the expected sequence first
    /// and refuse it, so the refusal may be the answer to our own write.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn publish_with_id(
        &self,
        what: &str,
        stream: Option<&StreamSpec>,
        subject: String,
        headers: &[(&'static str, String)],
        payload: bytes::Bytes,
        unknown: &(dyn Fn(String) -> Error + Send + Sync),
        id: &str,
    ) -> Result<u64> {
        let conditional = headers
            .iter()
            .any(|(name, _)| *name == EXPECTED_SUBJECT_SEQUENCE);
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
        let mut status: Option<StreamStatus> = None;
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
                .message_id(id);
            for (name, value) in headers {
                message = message.header(*name, value.as_str());
            }
            let attempt = async {
                let ack = self.js.send_publish(subject.clone(), message).await?;
                ack.await
            };
            let bound = ATTEMPT_TIMEOUT.min(deadline.saturating_duration_since(Instant::now()));
            // What the failure says to the retry policy (or the error it
            // ends with), and the failure in words.
            let (outcome, last_error) = match tokio::time::timeout(bound, attempt).await {
                Ok(Ok(ack)) => return Ok(ack.sequence),
                Ok(Err(e)) => {
                    use jetstream::context::PublishErrorKind as K;
                    match e.kind() {
                        _ if code_of(&e) == Some(MSG_TTL_DISABLED) => {
                            return Err(Error::Backend {
                                backend: "nats",
                                endpoints: String::new(),
                                kind: ErrorKind::Unsupported,
                                message: format!("{what}: {e}"),
                            })
                        }
                        K::MaxPayloadExceeded => {
                            (Err(Error::invalid("payload", e.to_string())), e.to_string())
                        }
                        // The condition of a conditional write failed: the
                        // outcome, unless an earlier attempt went unanswered
                        // (it may be what moved the sequence on).
                        K::WrongLastSequence if conditional => {
                            return Err(give_up(
                                policy.in_doubt(),
                                e.to_string(),
                                condition_failed(),
                            ))
                        }
                        K::WrongLastMessageId | K::WrongLastSequence => {
                            (Err(refused(what, &e)), e.to_string())
                        }
                        K::StreamNotFound => {
                            not_found = not_found.saturating_add(1);
                            match stream {
                                Some(spec)
                                    if status.is_none() || not_found.is_multiple_of(LOOK_EVERY) =>
                                {
                                    let look = self.look(&spec.name, deadline).await;
                                    let created = if look == StreamStatus::Missing {
                                        self.forget(&spec.name);
                                        match self.create_stream_once(spec).await {
                                            Ok(_) => Ok(None),
                                            Err(Attempt::Refused(e)) => Err(e),
                                            Err(Attempt::Failed(why)) => Ok(Some(why)),
                                        }
                                    } else {
                                        Ok(None)
                                    };
                                    status = Some(look);
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
                            status = match stream {
                                Some(spec) if pending => {
                                    Some(self.look(&spec.name, deadline).await)
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
                    status = match stream {
                        Some(spec) => Some(self.look(&spec.name, deadline).await),
                        None => None,
                    };
                    (Ok(Sign::MaybeRun), format!("no ack within {bound:?}"))
                }
            };
            let decision = match outcome {
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
            return Err(match (&status, stream) {
                (
                    Some(
                        StreamStatus::Leaderless(_)
                        | StreamStatus::Outvoted { .. }
                        | StreamStatus::MetaUnavailable(_),
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
                        self.no_quorum(spec, status.as_ref()),
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

/// Whether a publish failed with [`DUPLICATE_IN_PROCESS`].
fn in_process(e: &jetstream::context::PublishError) -> bool {
    code_of(e) == Some(DUPLICATE_IN_PROCESS)
}

/// The JetStream error code a publish failed with, if the server gave one.
fn code_of(e: &jetstream::context::PublishError) -> Option<ErrorCode> {
    std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<jetstream::Error>())
        .map(jetstream::Error::error_code)
}

/// The header that makes a publish conditional on its subject's last
/// sequence (0: the subject holds no message).
pub(super) const EXPECTED_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";

/// What [`Conn::publish_once`] answers when the condition of a conditional
/// publish failed: a conflict whose bucket, key and revision the caller
/// fills in after reading the key.
pub(super) fn condition_failed() -> Error {
    Error::Conflict {
        bucket: String::new(),
        key: String::new(),
        current: None,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions_compare_by_major_and_minor() {
        assert!(!version_at_least("2.9.10", (2, 11)));
        assert!(!version_at_least("2.10.22", (2, 11)));
        assert!(version_at_least("2.11.0", (2, 11)));
        assert!(version_at_least("2.15.1", (2, 11)));
        assert!(version_at_least("2.12.0-RC.1", (2, 11)));
        assert!(version_at_least("3.0.0", (2, 11)));
        assert!(!version_at_least("garbage", (2, 11)));
        assert!(!version_at_least("", (2, 11)));
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
