//! The one error type of fleetcoord.

use crate::coordinator::stream_id::StreamId;
use fleetcoord_sm::RpcError;
use std::time::Duration;

/// Everything that can go wrong in fleetcoord.
///
/// Variants name the field or endpoint involved so the message alone says
/// what to fix. One variant per failure class, the same on every backend:
/// a failed connect is [`Error::Connect`] on etcd, Redis and NATS alike, a
/// failed request [`Error::Backend`]. The enum is `#[non_exhaustive]`:
/// match the variants you act on and log the rest, or act on
/// [`Error::kind`], which classifies every error in one [`ErrorKind`].
/// [`Error::is_retryable`] says whether making the same call again may
/// succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was rejected before anything was sent or written.
    #[error("invalid {what}: {why}")]
    InvalidArgument {
        /// The argument, e.g. `"host_id"` or `"payload"`.
        what: &'static str,
        /// Why it was rejected.
        why: String,
    },
    /// A backend (etcd, Redis, NATS) could not be connected to: no server
    /// answered within the connect timeout, the TLS handshake failed, or
    /// the credentials were refused. Every backend's connecting
    /// constructor fails this way.
    #[error("cannot connect to {backend} at {endpoints}: {reason}")]
    Connect {
        /// The backend, e.g. `"etcd"`.
        backend: &'static str,
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// What kind of failure: [`ErrorKind::Unavailable`] when no server
        /// answered (retryable), [`ErrorKind::PermissionDenied`] when the
        /// server refused the credentials and says so in a structured form
        /// (Redis).
        kind: ErrorKind,
        /// What failed, one line, never a secret.
        reason: String,
    },
    /// The operation did not finish in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The operation was canceled before it finished.
    #[error("canceled")]
    Canceled,
    /// The background thread behind this handle (an [`Etcd`](crate::Etcd)'s
    /// driver, a Redis or NATS coordinator's runtime) stopped although
    /// nobody closed the handle: it panicked or its runtime failed. Nothing
    /// more can be done with the handle; a new connection is needed. Every
    /// backend follows one rule: a stopped thread is `DriverGone` unless the
    /// user closed the handle, which is [`Error::Closed`].
    #[error("the fleetcoord driver thread has stopped")]
    DriverGone,
    /// The key, or whatever was asked for, does not exist.
    #[error("not found")]
    NotFound,
    /// The user closed this object, or the handle it was made from: a call
    /// after `close` on it, after [`Etcd::close`](crate::Etcd::close) on
    /// the connection a primitive or coordinator uses, after
    /// [`ElectionPool::close`](crate::ElectionPool::close). Create a new
    /// one. Every backend returns this, and not [`Error::DriverGone`], once
    /// its handle was closed, whatever its thread is doing.
    #[error("closed")]
    Closed,
    /// The session behind an election or campaign was lost (its lease
    /// expired or could not be renewed before its deadline).
    #[error("session lost: the lease could not be kept alive")]
    SessionLost,
    /// The campaign was superseded or the leadership no longer held.
    #[error("not the leader")]
    NotLeader,
    /// The backend does not offer this operation.
    #[error("not supported by this backend: {0}")]
    Unsupported(&'static str),
    /// A blocking call was made from a thread that is running an async
    /// runtime's tasks (a tokio worker, a current-thread runtime's
    /// `block_on` or task, its `LocalSet`s), where blocking would stall that
    /// runtime or deadlock it. Refused at once, before anything was sent,
    /// in debug and release builds alike; nothing panics. Make the call
    /// from `tokio::task::spawn_blocking`, inside
    /// `tokio::task::block_in_place` (multi-thread runtime), or from a
    /// plain thread: those work. A consuming method refused this way
    /// (`close(self)`, `resign`, `unlock`, `release`, `leave`, `detach`)
    /// has dropped its object, which does what a drop does: stop, resign
    /// or release in the background, without waiting.
    #[error(
        "fleetcoord's blocking API was called from a thread running an async runtime's tasks, \
         where blocking would stall or deadlock that runtime; call it through \
         tokio::task::spawn_blocking or tokio::task::block_in_place, or from a plain thread"
    )]
    InsideAsyncRuntime,
    /// A local I/O failure (spawning processes, sockets of the test harness).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A backend (etcd, Redis, NATS) answered a request with an error, the
    /// connection broke mid-request, or its answer made no sense; `kind`
    /// says which, for code that acts on it, with one policy on every
    /// backend ([`Error::is_retryable`]), and `message` says it for people.
    #[error("{}", backend_text(.backend, .endpoints, .message))]
    Backend {
        /// The backend, e.g. `"redis"`.
        backend: &'static str,
        /// The server URLs it was given, comma-separated: for etcd, every
        /// endpoint of the handle (a request goes to whichever member
        /// answers). Empty only for an etcd failure decided inside a
        /// primitive's protocol rather than by a request of the caller's
        /// (a campaign etcd refused, say).
        endpoints: String,
        /// What kind of failure.
        kind: ErrorKind,
        /// What failed, for people.
        message: String,
    },
    /// A stream append whose outcome is unknown: the backend kept trying
    /// until its deadline and could not learn whether the entry was stored.
    /// It is stored at most once, and if it was, at `id` when `id` is
    /// given. Not retryable: appending again could store the payload twice;
    /// read the stream (from before `id`) to find out.
    #[error(
        "{backend}: append to stream {stream:?}: {message} (the append may or may not have \
         been applied{})",
        at_id(.id)
    )]
    Indeterminate {
        /// The backend, e.g. `"etcd"`.
        backend: &'static str,
        /// The stream appended to.
        stream: String,
        /// The only ID the entry can have if it was stored, when the
        /// backend can know it before the server answers (etcd assigns IDs
        /// client-side; NATS and Redis assign them on the server: `None`).
        id: Option<StreamId>,
        /// Why the outcome is unknown, for people.
        message: String,
    },
    /// A conditional KV write ([`Coordinator::kv_set_if`](crate::coordinator::Coordinator::kv_set_if))
    /// that lost: the key was not at the expected revision (or, for an
    /// expected revision of 0, not absent). Nothing was written. `current`
    /// is the revision the key had when the condition was checked (`None`:
    /// absent), so a caller can re-read, decide again and retry with it.
    #[error(
        "conditional set of {key:?} in bucket {bucket:?} lost: the key is {}",
        at_revision(.current)
    )]
    Conflict {
        /// The bucket written to.
        bucket: String,
        /// The key written to.
        key: String,
        /// The key's revision when the condition was checked; `None` when
        /// it was absent.
        current: Option<u64>,
    },
    /// Another live process holds this id's key: a host id
    /// ([`HostLiveness`](crate::HostLiveness)) or a shard map member id
    /// registered twice, typically two machines cloned from one image that
    /// share `/etc/machine-id`. Its lease `holder` was seen renewed past
    /// its TTL, so it is not a crashed predecessor (whose key is waited
    /// for, never failed), or it took the key over from this process.
    /// Not retryable: give each process its own id, or
    /// take the key over on purpose
    /// ([`LivenessOptions::take_over`](crate::LivenessOptions::take_over)).
    #[error(
        "duplicate id: {key} is held by another live process (lease {holder:x}); give each \
         process its own id (clones sharing /etc/machine-id must regenerate it), or take the \
         key over explicitly"
    )]
    DuplicateId {
        /// The key both processes claim.
        key: String,
        /// The other process's lease, as etcd numbers it (printed in hex,
        /// as `etcdctl` does).
        holder: i64,
    },
    /// A conditional KV write whose outcome is unknown: the request was
    /// sent and its answer lost (a connection cut, a server gone), and the
    /// backend could not learn whether it applied. Never reported as a
    /// win; read the key ([`Coordinator::kv_get_entry`](crate::coordinator::Coordinator::kv_get_entry))
    /// to find out. Not retryable: retrying with the same expected
    /// revision would report a conflict against the write that did apply.
    #[error(
        "{backend}: conditional set of {key:?} in bucket {bucket:?}: {message} (the write may \
         or may not have been applied)"
    )]
    KvIndeterminate {
        /// The backend, e.g. `"redis"`.
        backend: &'static str,
        /// The bucket written to.
        bucket: String,
        /// The key written to.
        key: String,
        /// Why the outcome is unknown, for people.
        message: String,
    },
}

/// How a conflict describes the key's state.
fn at_revision(current: &Option<u64>) -> String {
    match current {
        Some(revision) => format!("at revision {revision}"),
        None => "absent".to_string(),
    }
}

/// An error as one line for an operator: its text, then what its sources
/// add beyond it, with every run of whitespace (line breaks included) as
/// one space. The bus clients' errors (redis, async-nats) come through it.
#[cfg(any(feature = "nats", feature = "redis"))]
pub(crate) fn one_line(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = s.source();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An [`Error::Backend`]'s text: `etcd request failed: ...` without
/// endpoints, `redis at redis://...: ...` with.
fn backend_text(backend: &str, endpoints: &str, message: &str) -> String {
    if endpoints.is_empty() {
        format!("{backend} request failed: {message}")
    } else {
        format!("{backend} at {endpoints}: {message}")
    }
}

fn at_id(id: &Option<StreamId>) -> String {
    id.map(|id| format!("; if it was, it is entry {id}"))
        .unwrap_or_default()
}

/// What kind of failure an [`Error`] is ([`Error::kind`]), on every
/// backend: one classification, so code that acts on a failure (retry it,
/// re-authenticate, give up) works unchanged whichever backend it runs on,
/// and one retry policy ([`ErrorKind::is_retryable`]).
///
/// The kinds of [`Error::Backend`] and [`Error::Connect`] are decided per
/// failure, as below; every other variant has a kind of its own, named
/// after it ([`ErrorKind::InvalidArgument`], [`ErrorKind::Closed`], ...).
///
/// Decided once per failure, from what the backend reports in a structured
/// form (etcd's gRPC status code, Redis' error kind and code, NATS' error
/// kinds), never from free-form text. Exact, fixed texts are compared only
/// where that is all there is: etcd errors that share a code (a compacted
/// revision and a future one are both `OutOfRange`), a refused watch's
/// `cancel_reason`, etcd-client's word for a keepalive on a lost lease.
/// A variant that names one backend's concept says which backends can
/// produce it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The server could not be reached, the connection or a stream broke,
    /// the request timed out, or the server could not serve it for now
    /// (etcd without a leader or changing it; Redis loading, failing over
    /// or redirecting; NATS without an answer). A write that failed this
    /// way may or may not have been applied.
    Unavailable,
    /// The server refused the request and will refuse it again (an invalid
    /// or too large request, a lease TTL too large, a Redis cross-slot
    /// command, ...).
    Rejected,
    /// etcd's database is full (its `NOSPACE` alarm is raised): the write
    /// was refused and not applied, like every write that would grow the
    /// database, until an operator compacts, defragments and disarms the
    /// alarm (README, "When etcd is full"). Reads, deletes and lease
    /// renewals are still served, so registered hosts, leaderships and
    /// watches stay. Retryable: the same call succeeds once the alarm is
    /// disarmed. etcd only.
    NoSpace,
    /// The lease named does not exist any more: it expired or was revoked.
    /// etcd only.
    LeaseNotFound,
    /// The revision asked for has been compacted away. etcd only.
    Compacted,
    /// The authenticated user lacks the permission (etcd's RBAC, a Redis
    /// ACL, a failed Redis `AUTH`).
    PermissionDenied,
    /// etcd refused the authentication token (expired or invalidated).
    Unauthenticated,
    /// Concurrent writers kept winning the race for the same key (a stream
    /// append); nothing was written.
    Contended,
    /// The server's answer did not fit the request, or the data under
    /// fleetcoord's keys was not written by fleetcoord: a bug or a foreign
    /// writer, not a transient condition.
    Unexpected,
    /// The write was applied, but fewer replicas than asked confirmed it
    /// in time (Redis' `WAIT`, see `RedisOptions::with_min_replicas`): it
    /// is stored, and may still be lost if the server that applied it
    /// fails before a replica has it. Redis only: etcd's writes are
    /// confirmed by a quorum before they are answered.
    Unreplicated,
    /// [`Error::InvalidArgument`]: an argument was rejected before anything
    /// was sent.
    InvalidArgument,
    /// [`Error::Timeout`]: the operation did not finish in time.
    Timeout,
    /// [`Error::Canceled`]: the caller canceled the operation.
    Canceled,
    /// [`Error::DriverGone`]: the handle's background thread stopped by
    /// itself.
    DriverGone,
    /// [`Error::NotFound`]: the key does not exist.
    NotFound,
    /// [`Error::Closed`]: the user closed the object or its handle.
    Closed,
    /// [`Error::SessionLost`]: the session's lease was lost.
    SessionLost,
    /// [`Error::NotLeader`]: the leadership is no longer held.
    NotLeader,
    /// [`Error::Unsupported`]: the backend does not offer the operation.
    Unsupported,
    /// [`Error::Io`]: a local I/O failure.
    Io,
    /// [`Error::InsideAsyncRuntime`]: a blocking call from a thread
    /// running an async runtime's tasks.
    InsideAsyncRuntime,
    /// [`Error::Indeterminate`]: an append whose outcome is unknown, and
    /// [`Error::KvIndeterminate`]: a conditional KV write whose outcome is
    /// unknown.
    Indeterminate,
    /// [`Error::Conflict`]: a conditional KV write lost to another write.
    Conflict,
    /// [`Error::DuplicateId`]: another live process holds the same host
    /// or member id.
    DuplicateId,
}

impl ErrorKind {
    /// Whether the same call may succeed if made again; see
    /// [`Error::is_retryable`].
    pub fn is_retryable(self) -> bool {
        match self {
            ErrorKind::Unavailable
            | ErrorKind::Unauthenticated
            | ErrorKind::Contended
            | ErrorKind::Timeout
            | ErrorKind::SessionLost
            // Refused, not applied: the same call works once disarmed.
            | ErrorKind::NoSpace => true,
            // Applied already: making the call again applies it again
            // (an append twice); likewise an append that may be stored.
            ErrorKind::Unreplicated | ErrorKind::Indeterminate => false,
            ErrorKind::Rejected
            | ErrorKind::LeaseNotFound
            | ErrorKind::Compacted
            | ErrorKind::PermissionDenied
            | ErrorKind::Unexpected
            | ErrorKind::InvalidArgument
            | ErrorKind::Canceled
            | ErrorKind::DriverGone
            | ErrorKind::NotFound
            | ErrorKind::Closed
            | ErrorKind::NotLeader
            | ErrorKind::Unsupported
            | ErrorKind::Io
            | ErrorKind::InsideAsyncRuntime
            // The same condition fails the same way: re-read the key first.
            | ErrorKind::Conflict
            // The other process keeps its key until it stops.
            | ErrorKind::DuplicateId => false,
        }
    }
}

/// `Result` with fleetcoord's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn invalid(what: &'static str, why: impl Into<String>) -> Self {
        Error::InvalidArgument {
            what,
            why: why.into(),
        }
    }

    /// An etcd [`Error::Backend`] of `kind`.
    pub(crate) fn etcd(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error::Backend {
            backend: "etcd",
            endpoints: String::new(),
            kind,
            message: message.into(),
        }
    }

    /// An etcd [`Error::Backend`] of kind [`ErrorKind::Unexpected`]: etcd
    /// answered `answer` where it could not have.
    pub(crate) fn unexpected(answer: impl std::fmt::Debug) -> Self {
        Error::etcd(
            ErrorKind::Unexpected,
            format!("unexpected answer from etcd: {answer:?}"),
        )
    }

    /// A failed request as the user sees it, its message prefixed with
    /// `context` (what was being done).
    pub(crate) fn rpc_in(context: impl std::fmt::Display, e: RpcError) -> Self {
        Error::etcd(etcd_kind(&e), format!("{context}: {e}"))
    }

    /// A wait of `bound` for a lease grant that never came: when etcd
    /// refused the last grant for want of space (`failure`), an error of
    /// kind [`ErrorKind::NoSpace`] saying `doing` got no lease within
    /// `bound` and why, naming `endpoints`; otherwise [`Error::Timeout`].
    /// Out of space is not a slow etcd, and must not read as one.
    pub(crate) fn no_lease_within(
        doing: impl std::fmt::Display,
        bound: std::time::Duration,
        failure: Option<RpcError>,
        endpoints: &[String],
    ) -> Self {
        match failure {
            Some(e @ RpcError::NoSpace(_)) => Error::rpc_in(
                format_args!("{doing}: no lease granted within {bound:?}"),
                e,
            )
            .with_endpoints(endpoints),
            _ => Error::Timeout(bound),
        }
    }

    /// Whether making the same call again, unchanged, may succeed.
    ///
    /// It does not say whether the failed call had an effect: a write that
    /// failed with [`ErrorKind::Unavailable`] or timed out may have been
    /// applied. Stream appends are the exception: they retry internally
    /// without ever storing twice, so an append that fails with a retryable
    /// error was not stored, and one whose outcome stayed unknown fails with
    /// [`Error::Indeterminate`], which is not retryable.
    ///
    /// It is [`ErrorKind::is_retryable`] of [`Error::kind`]:
    ///
    /// | error | retryable | why |
    /// |---|---|---|
    /// | [`Error::Timeout`] | yes | the server was slow or unreachable for a while |
    /// | [`Error::Connect`] `Unavailable` | yes | the server may be reachable later |
    /// | [`Error::Connect`] `PermissionDenied` | no | the credentials must change |
    /// | [`Error::SessionLost`] | yes | the session re-grants its lease by itself |
    /// | [`Error::Backend`] `Unavailable` | yes | network, leader change, overload |
    /// | [`Error::Backend`] `Unauthenticated` | yes | the client logs in again on the next call |
    /// | [`Error::Backend`] `Contended` | yes | another writer won this time |
    /// | [`Error::Backend`] `Rejected`, `PermissionDenied`, `Unexpected` | no | the same request fails the same way |
    /// | [`Error::Backend`] `LeaseNotFound` | no | the lease is gone; a new one is needed |
    /// | [`Error::Backend`] `Compacted` | no | read again from the current revision |
    /// | [`Error::Backend`] `Unreplicated` | no | the write is applied; repeating it applies it again |
    /// | [`Error::InvalidArgument`], [`Error::Unsupported`] | no | the input or backend must change |
    /// | [`Error::NotFound`] | no | the key is absent until someone writes it |
    /// | [`Error::NotLeader`] | no | campaign again instead |
    /// | [`Error::Canceled`] | no | the caller canceled it |
    /// | [`Error::Closed`] | no | closed by its user: make a new object or connection |
    /// | [`Error::DriverGone`] | no | its thread died: make a new connection |
    /// | [`Error::Io`] | no | a local failure to look at |
    /// | [`Error::InsideAsyncRuntime`] | no | the same thread is refused again: call from `spawn_blocking` |
    /// | [`Error::Indeterminate`] | no | the append may be stored: appending again could store it twice |
    /// | [`Error::Conflict`] | no | the key moved on: re-read it, decide again |
    /// | [`Error::KvIndeterminate`] | no | the write may have applied: re-read the key |
    /// | [`Error::DuplicateId`] | no | another live process holds the id: give this one its own |
    ///
    /// ```
    /// use fleetcoord::Error;
    /// use std::time::Duration;
    ///
    /// assert!(Error::Timeout(Duration::from_secs(5)).is_retryable());
    /// assert!(!Error::Closed.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        self.kind().is_retryable()
    }

    /// What kind of failure this is, the same on every backend: code
    /// behind a `dyn Coordinator` (or any primitive) acts on this one
    /// value instead of matching variants per backend. A failed connect
    /// is [`ErrorKind::Unavailable`] on every backend (or
    /// [`ErrorKind::PermissionDenied`] where the server refused the
    /// credentials in a structured form); a payload over the limit is
    /// [`ErrorKind::InvalidArgument`]; a call after `close` is
    /// [`ErrorKind::Closed`].
    ///
    /// ```
    /// use fleetcoord::coordinator::{Coordinator, MemoryCoordinator};
    /// use fleetcoord::ErrorKind;
    ///
    /// let coord = MemoryCoordinator::new();
    /// coord.close()?;
    /// assert_eq!(coord.ping().unwrap_err().kind(), ErrorKind::Closed);
    /// # Ok::<(), fleetcoord::Error>(())
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Connect { kind, .. } | Error::Backend { kind, .. } => *kind,
            Error::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            Error::Timeout(_) => ErrorKind::Timeout,
            Error::Canceled => ErrorKind::Canceled,
            Error::DriverGone => ErrorKind::DriverGone,
            Error::NotFound => ErrorKind::NotFound,
            Error::Closed => ErrorKind::Closed,
            Error::SessionLost => ErrorKind::SessionLost,
            Error::NotLeader => ErrorKind::NotLeader,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::Io(_) => ErrorKind::Io,
            Error::InsideAsyncRuntime => ErrorKind::InsideAsyncRuntime,
            Error::Indeterminate { .. } | Error::KvIndeterminate { .. } => ErrorKind::Indeterminate,
            Error::Conflict { .. } => ErrorKind::Conflict,
            Error::DuplicateId { .. } => ErrorKind::DuplicateId,
        }
    }
}

impl Error {
    /// `self`, naming `endpoints` if it is an etcd [`Error::Backend`] that
    /// names none: a user reading "Connection refused" must see where.
    pub(crate) fn with_endpoints(self, endpoints: &[String]) -> Self {
        match self {
            Error::Backend {
                backend: "etcd",
                endpoints: named,
                kind,
                message,
            } if named.is_empty() => Error::Backend {
                backend: "etcd",
                endpoints: endpoints.join(","),
                kind,
                message,
            },
            other => other,
        }
    }

    /// The one conversion of a failed request into the user's error. Not a
    /// `From` impl: a public trait impl would put `fleetcoord_sm`'s
    /// `RpcError` into the public API.
    pub(crate) fn rpc(e: RpcError) -> Self {
        Error::etcd(etcd_kind(&e), e.to_string())
    }
}

/// The kind of etcd [`Error::Backend`] a failed request becomes.
pub(crate) fn etcd_kind(e: &RpcError) -> ErrorKind {
    match e {
        RpcError::LeaseNotFound => ErrorKind::LeaseNotFound,
        RpcError::Compacted { .. } => ErrorKind::Compacted,
        RpcError::PermissionDenied(_) => ErrorKind::PermissionDenied,
        RpcError::Unauthenticated(_) => ErrorKind::Unauthenticated,
        RpcError::NoSpace(_) => ErrorKind::NoSpace,
        // `Unavailable` and `Rejected` are the two policies themselves, so a
        // variant newer than this mapping falls into the one it follows.
        _ if e.is_retryable() => ErrorKind::Unavailable,
        _ => ErrorKind::Rejected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_indeterminate_append_says_where_it_would_be() {
        let at = Error::Indeterminate {
            backend: "etcd",
            stream: "jobs".into(),
            id: Some(StreamId(4)),
            message: "connection reset".into(),
        };
        assert_eq!(
            at.to_string(),
            "etcd: append to stream \"jobs\": connection reset (the append may or may not \
             have been applied; if it was, it is entry 4)"
        );
        let nowhere = Error::Indeterminate {
            backend: "nats",
            stream: "jobs".into(),
            id: None,
            message: "no ack".into(),
        };
        assert!(
            nowhere
                .to_string()
                .ends_with("may or may not have been applied)"),
            "{nowhere}"
        );
    }

    #[test]
    fn every_rpc_error_keeps_its_kind_message_and_policy() {
        let cases = [
            (
                RpcError::Unavailable("Unavailable: etcdserver: leader changed".into()),
                ErrorKind::Unavailable,
                "etcd request failed: Unavailable: etcdserver: leader changed",
            ),
            (
                RpcError::Rejected("etcdserver: request is too large".into()),
                ErrorKind::Rejected,
                "etcd request failed: etcdserver: request is too large",
            ),
            (
                RpcError::LeaseNotFound,
                ErrorKind::LeaseNotFound,
                "etcd request failed: lease not found",
            ),
            (
                RpcError::Compacted {
                    compact_revision: 7,
                },
                ErrorKind::Compacted,
                "etcd request failed: the requested revision has been compacted \
                 (compaction revision 7)",
            ),
            (
                RpcError::PermissionDenied("etcdserver: permission denied".into()),
                ErrorKind::PermissionDenied,
                "etcd request failed: etcdserver: permission denied",
            ),
            (
                RpcError::Unauthenticated("etcdserver: invalid auth token".into()),
                ErrorKind::Unauthenticated,
                "etcd request failed: etcdserver: invalid auth token",
            ),
        ];
        for (rpc, kind, text) in cases {
            let retryable = rpc.is_retryable();
            let error = Error::rpc(rpc.clone());
            assert_eq!(error.to_string(), text);
            match &error {
                Error::Backend {
                    backend: "etcd",
                    kind: k,
                    ..
                } => assert_eq!(*k, kind, "{rpc:?}"),
                other => panic!("{rpc:?} became {other:?}"),
            }
            assert_eq!(error.kind(), kind, "{rpc:?}");
            // The facade and the machines follow one policy.
            assert_eq!(error.is_retryable(), retryable, "{rpc:?}");
        }
    }

    #[test]
    fn context_prefixes_the_message_and_keeps_the_kind() {
        match Error::rpc_in("stream \"jobs\"", RpcError::LeaseNotFound) {
            Error::Backend { kind, message, .. } => {
                assert_eq!(kind, ErrorKind::LeaseNotFound);
                assert_eq!(message, "stream \"jobs\": lease not found");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_transient_failures_are_retryable() {
        let retryable = [
            Error::Timeout(Duration::from_secs(1)),
            Error::Connect {
                backend: "redis",
                endpoints: "redis://127.0.0.1:6379".into(),
                kind: ErrorKind::Unavailable,
                reason: "connection refused".into(),
            },
            Error::SessionLost,
            Error::etcd(ErrorKind::Unavailable, "x"),
            Error::etcd(ErrorKind::Unauthenticated, "x"),
            Error::etcd(ErrorKind::Contended, "x"),
        ];
        for e in &retryable {
            assert!(e.is_retryable(), "{e:?}");
        }
        let permanent = [
            Error::invalid("name", "empty"),
            Error::etcd(ErrorKind::Rejected, "x"),
            Error::etcd(ErrorKind::LeaseNotFound, "x"),
            Error::etcd(ErrorKind::Compacted, "x"),
            Error::etcd(ErrorKind::PermissionDenied, "x"),
            Error::unexpected("Revoked"),
            Error::etcd(ErrorKind::Unreplicated, "x"),
            Error::Connect {
                backend: "redis",
                endpoints: "redis://127.0.0.1:6379".into(),
                kind: ErrorKind::PermissionDenied,
                reason: "WRONGPASS".into(),
            },
            Error::Canceled,
            Error::DriverGone,
            Error::NotFound,
            Error::Closed,
            Error::NotLeader,
            Error::Unsupported("streams"),
            Error::Io(std::io::Error::other("x")),
            Error::Indeterminate {
                backend: "etcd",
                stream: "jobs".into(),
                id: Some(StreamId(4)),
                message: "connection reset".into(),
            },
        ];
        for e in &permanent {
            assert!(!e.is_retryable(), "{e:?}");
        }
    }

    /// Every variant has its own kind unless it carries one: code acting
    /// on `kind()` never confuses two classes of failure.
    #[test]
    fn every_variant_has_its_kind() {
        let cases = [
            (Error::invalid("name", "empty"), ErrorKind::InvalidArgument),
            (Error::Timeout(Duration::from_secs(1)), ErrorKind::Timeout),
            (Error::Canceled, ErrorKind::Canceled),
            (Error::DriverGone, ErrorKind::DriverGone),
            (Error::NotFound, ErrorKind::NotFound),
            (Error::Closed, ErrorKind::Closed),
            (Error::SessionLost, ErrorKind::SessionLost),
            (Error::NotLeader, ErrorKind::NotLeader),
            (Error::Unsupported("streams"), ErrorKind::Unsupported),
            (Error::Io(std::io::Error::other("x")), ErrorKind::Io),
            (
                Error::Indeterminate {
                    backend: "nats",
                    stream: "jobs".into(),
                    id: None,
                    message: "no ack".into(),
                },
                ErrorKind::Indeterminate,
            ),
            (Error::etcd(ErrorKind::Compacted, "x"), ErrorKind::Compacted),
            (
                Error::Connect {
                    backend: "nats",
                    endpoints: "nats://127.0.0.1:4222".into(),
                    kind: ErrorKind::Unavailable,
                    reason: "refused".into(),
                },
                ErrorKind::Unavailable,
            ),
        ];
        for (error, kind) in cases {
            assert_eq!(error.kind(), kind, "{error:?}");
        }
    }

    #[test]
    fn backend_errors_name_their_endpoints_when_they_have_them() {
        assert_eq!(
            Error::etcd(ErrorKind::Rejected, "too large").to_string(),
            "etcd request failed: too large"
        );
        let redis = Error::Backend {
            backend: "redis",
            endpoints: "redis://127.0.0.1:6379".into(),
            kind: ErrorKind::Rejected,
            message: "CROSSSLOT".into(),
        };
        assert_eq!(
            redis.to_string(),
            "redis at redis://127.0.0.1:6379: CROSSSLOT"
        );
        let named = Error::etcd(ErrorKind::Unavailable, "refused")
            .with_endpoints(&["http://a:2379".into(), "http://b:2379".into()]);
        assert_eq!(
            named.to_string(),
            "etcd at http://a:2379,http://b:2379: refused"
        );
        // Endpoints already named, and other backends, are left as they are.
        assert_eq!(
            redis.with_endpoints(&["x".into()]).to_string(),
            "redis at redis://127.0.0.1:6379: CROSSSLOT"
        );
    }
}
