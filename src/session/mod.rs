//! The session vocabulary every lease-holding primitive shares (host
//! registrations, elections, locks, watchers): what state a lease is in,
//! the default trust settings, how long a request or a close may take, and
//! what a close reports; and [`Session`], one lease shared by many
//! primitives ([`shared`]).

use crate::driver::handle::WaitError;
use crate::driver::Finished;
use crate::error::{etcd_kind, Error, ErrorKind, Result};
use fleetcoord_sm::keepalive as sm;
use std::time::Duration;

pub(crate) mod shared;

pub(crate) use shared::{Attachment, Departure};
pub use shared::{Session, SessionOptions};

/// Where a lease-bound registration stands: this host's
/// ([`HostLiveness::states`](crate::HostLiveness::states)) or an election's session
/// ([`crate::Election::session`]). Consecutive states reported on
/// [`HostLiveness::states`](crate::HostLiveness::states) always differ.
///
/// fleetcoord's own type, not the state machine's: what it shows is the
/// registration's life cycle, which stays put when the machines' internal
/// vocabulary changes. `#[non_exhaustive]`: match the states you act on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LivenessState {
    /// Granting a lease or writing the key; nothing is registered yet.
    Registering,
    /// The lease is held (and the key written, for a [`HostLiveness`](crate::HostLiveness)).
    Registered {
        /// The lease.
        lease: i64,
    },
    /// Renewals are failing; the lease may still be alive, and renewals are
    /// retried until the local deadline.
    Suspended {
        /// The lease.
        lease: i64,
    },
    /// The lease is gone (the local deadline passed, or etcd said so); a new
    /// one is being granted.
    Lost {
        /// The lease that was lost.
        lease: i64,
    },
    /// etcd refused the grant or the write in a way no retry fixes
    /// (permission denied); the registration is stopping and `Stopped`
    /// follows.
    Refused {
        /// What kind of refusal, as in [`Error::Backend`].
        kind: ErrorKind,
        /// What etcd said, for people.
        message: String,
    },
    /// Final. `revoked` is false when there was no lease to revoke or the
    /// revoke failed (the lease then expires on its own).
    Stopped {
        /// Whether etcd confirmed the revoke.
        revoked: bool,
    },
    /// A [`HostLiveness`](crate::HostLiveness) found its host key held on
    /// `holder`, a lease of another process (a crashed predecessor's, or a
    /// duplicate's with the same host id), and waits, writing nothing,
    /// until that lease expires (then it registers) or is seen renewed
    /// past its TTL (then [`LivenessState::Duplicate`]). A restart after a
    /// crash waits here for at most the old lease's remaining TTL plus
    /// about a second.
    Waiting {
        /// The other process's lease, as etcd numbers it.
        holder: i64,
    },
    /// Another live process holds this host's key on `holder`: it was
    /// renewed past its TTL while this registration waited, or it took
    /// the key over from this one ([`LivenessOptions::take_over`](crate::LivenessOptions::take_over)).
    /// The registration is stopping without touching that key, and
    /// `Stopped` follows; no retry fixes it: give each process its own
    /// host id ([`Error::DuplicateId`]).
    Duplicate {
        /// The other process's lease, as etcd numbers it.
        holder: i64,
    },
}

impl LivenessState {
    /// The machine's state as the user sees it. A crate-private function,
    /// not a `From` impl, so that the machine's type stays out of the
    /// public API. The match is exhaustive on purpose: a new machine state
    /// must fail this build rather than be reported as something else.
    pub(crate) fn from_sm(state: &sm::LivenessState) -> Self {
        match state {
            sm::LivenessState::Registering => LivenessState::Registering,
            sm::LivenessState::Registered { lease } => LivenessState::Registered { lease: *lease },
            sm::LivenessState::Suspended { lease } => LivenessState::Suspended { lease: *lease },
            sm::LivenessState::Lost { lease } => LivenessState::Lost { lease: *lease },
            sm::LivenessState::Refused { error } => LivenessState::Refused {
                kind: etcd_kind(error),
                message: error.to_string(),
            },
            sm::LivenessState::Stopped { revoked } => LivenessState::Stopped { revoked: *revoked },
            sm::LivenessState::Waiting { holder } => LivenessState::Waiting { holder: *holder },
            sm::LivenessState::Duplicate { holder } => LivenessState::Duplicate { holder: *holder },
        }
    }
}

/// Default safety margin of every session (liveness and election): how long
/// before etcd can expire a lease the local side gives it up. The
/// keepalive's deadline already counts from the *send* of the last
/// acknowledged renewal, which covers the network; the margin covers what
/// happens on this host after the deadline: the driver thread firing it
/// late (tens of milliseconds on a loaded 2-core machine, more under
/// memory pressure) and a user acting right after checking
/// `is_held()`. 250 ms is well above the first and leaves room for a short
/// second, while costing a 10 s session only 2.5 % of its lifetime; it is
/// also small enough for the 1 s minimum TTL (at most half the TTL may go).
/// It replaces what used to be an accident: etcd's expiry loop runs every
/// 500 ms, so leases die up to 0.5 s late, but nothing promises that.
pub(crate) const DEFAULT_SAFETY_MARGIN: Duration = Duration::from_millis(250);

/// Default clock drift allowance of every session, in parts per million
/// (1 %): a leader measures its lease on its own monotonic clock while etcd
/// expires it on etcd's, so a clock running slow would let a leader
/// believe past the expiry. The kernel's NTP discipline changes a clock's
/// rate by at most 500 ppm, so two disciplined hosts differ by at most
/// 1,000 ppm; 1 % is ten times that, for undisciplined clocks and virtual machines, at the cost of
/// 100 ms of a 10 s session (client-go's leader election is far more
/// cautious, giving up a third of its lease, because there the *followers'*
/// clocks time the lease; here etcd does).
pub(crate) const DEFAULT_DRIFT_ALLOWANCE_PPM: u32 = 10_000;

/// How long a grant, put, revoke or election request may go unanswered
/// before the machine sends it again (`attempt_timeout` of the `sm`
/// configs): etcd elects a new raft leader 0.9–2.7 s after losing one
/// (measured with default flags), and drops the writes forwarded meanwhile
/// without answering them. Half a second puts a copy out within that much
/// of the new leader; three copies later the wait doubles, so a slow server
/// is not flooded.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a close waits for its lease's revoke to be confirmed: the
/// revoke's request timeout plus the driver's stop slack, generously.
pub(crate) const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// What `close` reports once a lease-holding machine has stopped: `revoked`
/// is what its final `Stopped` state said, if it got that far, and `gone`
/// the error for a driver that stopped first (`Etcd::gone`).
pub(crate) fn close_outcome(
    finished: std::result::Result<Finished, WaitError>,
    revoked: Option<bool>,
    gone: impl FnOnce() -> Error,
    endpoints: &[String],
) -> Result<()> {
    match (finished, revoked) {
        (Ok(_), Some(true)) => Ok(()),
        // The machine does not say why; etcd being unreachable is the
        // usual reason, and the lease expires by itself either way.
        (Ok(_), Some(false)) => Err(Error::etcd(
            ErrorKind::Unavailable,
            "the lease could not be revoked; it will expire after its TTL",
        )
        .with_endpoints(endpoints)),
        // Cut short by the driver's shutdown before the revoke was answered.
        (Ok(_), None) => Err(gone()),
        (Err(WaitError::Timeout(after)), _) => Err(Error::Timeout(after)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::handle::WaitError;
    use crate::driver::Finished;
    use crate::error::ErrorKind;
    use std::time::Duration;

    #[test]
    fn close_reports_whether_the_revoke_was_confirmed() {
        assert!(close_outcome(Ok(Finished::Done), Some(true), || Error::DriverGone, &[]).is_ok());
        let endpoints = ["http://127.0.0.1:2379".to_string()];
        match close_outcome(
            Ok(Finished::Done),
            Some(false),
            || Error::DriverGone,
            &endpoints,
        ) {
            Err(e @ Error::Backend { .. }) => {
                // The error names where it came from (issue 51).
                assert!(e.to_string().contains("127.0.0.1:2379"), "{e}");
                let Error::Backend { kind, message, .. } = e else {
                    unreachable!()
                };
                assert_eq!(kind, ErrorKind::Unavailable);
                assert!(message.contains("expire after its TTL"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            close_outcome(Ok(Finished::Abandoned), None, || Error::DriverGone, &[]),
            Err(Error::DriverGone)
        ));
        let after = Duration::from_secs(10);
        assert!(matches!(
            close_outcome(Err(WaitError::Timeout(after)), Some(true), || Error::DriverGone, &[]),
            Err(Error::Timeout(t)) if t == after
        ));
    }
}
