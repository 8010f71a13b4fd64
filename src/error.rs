//! The one error type of fleetcoord.

use std::time::Duration;

/// Everything that can go wrong in fleetcoord.
///
/// Variants name the field or endpoint involved so the message alone says
/// what to fix. The enum is `#[non_exhaustive]`: match the variants you act
/// on and log the rest.
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
    /// etcd could not be reached when connecting.
    #[error("cannot connect to etcd at {endpoints}: {reason}")]
    Connect {
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// What failed.
        reason: String,
    },
    /// etcd answered with an error or the connection broke mid-request.
    #[error("etcd request failed: {0}")]
    Etcd(String),
    /// The operation did not finish in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The driver thread has stopped (closed, or it failed); nothing more
    /// can be done with this handle.
    #[error("the fleetcoord driver thread has stopped")]
    DriverGone,
    /// The key, or whatever was asked for, does not exist.
    #[error("not found")]
    NotFound,
    /// The object was closed; create a new one.
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
    /// A local I/O failure (spawning processes, sockets of the test harness).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
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
}
