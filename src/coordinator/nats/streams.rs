//! Stream provisioning: what the JetStream API says about a stream (its
//! leader and quorum), and the streams fleetcoord creates on demand
//! (coordinator streams and KV buckets' streams) found or created once.

use super::conn::{failed, pause, refused, retries, Conn, Settings, ATTEMPT_TIMEOUT};
use super::names;
use crate::coordinator::retry::{self, Sign};
use crate::error::{Error, Result};
use async_nats::jetstream::{self, stream, ErrorCode};
use std::time::Duration;
use tokio::time::Instant;

/// Longest one look at a stream's status may take: a JetStream without
/// quorum does not answer at all for its first ~10 s (measured on
/// nats-server 2.9, 2 of 3 nodes killed), then answers 10008.
const LOOK_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the server keeps the delete marker it writes when a key's TTL
/// ends (nats-server 2.11+): the marker is how watchers hear the expiry,
/// and one that resumes from a sequence within this hour still does.
const DELETE_MARKER_TTL: Duration = Duration::from_secs(60 * 60);
/// A replica its stream's leader has not heard from for this long is
/// taken as gone: a following replica answers the leader's heartbeat,
/// sent every second while the stream is idle. The replicas' `current`
/// flag is no such signal: it stays true for about 6 s after the leader
/// lost contact.
const PEER_SILENT: Duration = Duration::from_millis(1500);

impl Conn {
    /// What the JetStream API says about stream `name`, asked within
    /// [`LOOK_TIMEOUT`] (and `deadline`).
    pub(super) async fn look(&self, name: &str, deadline: Instant) -> StreamStatus {
        use jetstream::context::GetStreamErrorKind as K;
        let bound = LOOK_TIMEOUT.min(deadline.saturating_duration_since(Instant::now()));
        match tokio::time::timeout(bound, self.js.get_stream(name)).await {
            Err(_) => StreamStatus::MetaUnavailable("the JetStream API did not answer".to_string()),
            Ok(Ok(found)) => match &found.cached_info().cluster {
                // A replicated stream's info lists its leader, and every
                // peer as a replica while it has none.
                Some(cluster)
                    if cluster.leader.as_deref().is_none_or(str::is_empty)
                        && !cluster.replicas.is_empty() =>
                {
                    StreamStatus::Leaderless(cluster.replicas.len())
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
                        StreamStatus::Led
                    } else {
                        StreamStatus::Outvoted {
                            reachable,
                            replicas,
                        }
                    }
                }
                None => StreamStatus::Led,
            },
            Ok(Err(e)) => match e.kind() {
                K::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                    StreamStatus::Missing
                }
                K::JetStream(js) if js.error_code() == ErrorCode::CLUSTER_NOT_AVAILABLE => {
                    StreamStatus::MetaUnavailable(js.to_string())
                }
                // No responders, or no answer in the context's timeout.
                K::Request => StreamStatus::MetaUnavailable(super::one_line(&e)),
                _ => StreamStatus::Unknown(super::one_line(&e)),
            },
        }
    }

    /// The one line for a stream JetStream cannot write to for lack of
    /// quorum, as [`Conn::look`] saw it.
    pub(super) fn no_quorum(&self, spec: &StreamSpec, status: Option<&StreamStatus>) -> String {
        let clustered = self.client.server_info().cluster.is_some();
        no_quorum(&spec.shown, status, clustered)
    }

    pub(super) fn forget(&self, stream: &str) {
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
            match self.look(&spec.name, deadline).await {
                StreamStatus::Led | StreamStatus::Leaderless(_) | StreamStatus::Outvoted { .. } => {
                    self.known.lock().insert(spec.name.clone(), ());
                    return Ok(());
                }
                StreamStatus::Missing | StreamStatus::Unknown(_) => {
                    return self.create_stream(spec).await.map(|_| ());
                }
                look @ StreamStatus::MetaUnavailable(_) => {
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
    pub(super) async fn create_stream_once(
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
                    self.no_quorum(spec, Some(&StreamStatus::MetaUnavailable(js.to_string()))),
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
                    let status = StreamStatus::MetaUnavailable(js.to_string());
                    let why = no_quorum(&format!("stream {name}"), Some(&status), clustered);
                    Err(failed(format!("reading stream {name}"), why))
                }
                _ => Err(failed(format!("reading stream {name}"), e)),
            },
        }
    }
}

/// What [`Conn::no_quorum`] says about `shown` (`stream "jobs"`).
fn no_quorum(shown: &str, status: Option<&StreamStatus>, clustered: bool) -> String {
    let why = match status {
        Some(StreamStatus::Leaderless(replicas)) => {
            format!("no leader among its {replicas} replicas")
        }
        Some(StreamStatus::Outvoted {
            reachable,
            replicas,
        }) => format!("its leader reaches {reachable} of its {replicas} replicas"),
        // A single server has no meta leader to lose: say what it did.
        Some(StreamStatus::MetaUnavailable(why)) if !clustered => why.clone(),
        Some(StreamStatus::MetaUnavailable(why)) => format!("meta leader unavailable: {why}"),
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

/// What the JetStream API says about a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum StreamStatus {
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
pub(super) enum Attempt {
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
        if settings.msg_ttl() {
            // Per-key TTLs, and the delete marker every watcher hears
            // when one expires (kept for an hour, so that a watch that
            // resumes from a sequence within the hour still hears it).
            config.allow_message_ttl = true;
            config.subject_delete_marker_ttl = Some(DELETE_MARKER_TTL);
        }
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
    fn lack_of_quorum_is_said_in_one_line() {
        assert_eq!(
            no_quorum(r#"stream "jobs""#, Some(&StreamStatus::Leaderless(3)), true),
            r#"JetStream has no quorum for stream "jobs" (no leader among its 3 replicas)"#
        );
        let meta = StreamStatus::MetaUnavailable("JetStream system temporarily unavailable".into());
        assert_eq!(
            no_quorum(r#"bucket "cfg""#, Some(&meta), true),
            r#"JetStream has no quorum for bucket "cfg" (meta leader unavailable: JetStream system temporarily unavailable)"#
        );
        let outvoted = StreamStatus::Outvoted {
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
        let silent = StreamStatus::MetaUnavailable("the JetStream API did not answer".into());
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
            server_version: "2.9.10".into(),
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
}
