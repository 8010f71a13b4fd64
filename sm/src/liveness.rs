//! The states a lease, and whatever is kept on it, go through, as their
//! user is told them: one vocabulary for the keepalive ([`crate::keepalive`],
//! the lease alone) and the machines that keep something on a lease
//! ([`crate::registration`], [`crate::host`], [`crate::session`]), which
//! add the states of a key bound to it (`Waiting`, `Duplicate`). Here, not
//! in the keepalive, so that the lease's machine names no key.

use crate::rpc::{LeaseId, RpcError};

/// A lease's life as its user sees it, told in order via
/// [`Command::Notify`](crate::Command::Notify); consecutive notifications always differ. The
/// vocabulary is shared with the machines that keep something on the
/// lease ([`crate::registration`], [`crate::host`], [`crate::session`]):
/// a [`Keepalive`](crate::keepalive::Keepalive) tells every state but `Waiting` and `Duplicate`, which
/// are a registration's alone.
///
/// Exhaustive on purpose: `fleetcoord` shows each state in a public type of
/// its own, and a new state must break that conversion's build rather than
/// be reported as another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LivenessState {
    /// Nothing is held yet: a lease is being granted (or resumed), or,
    /// for a registration, its key written.
    Registering,
    /// The lease is held (a registration: and its key written).
    Registered {
        /// The lease.
        lease: LeaseId,
    },
    /// Renewals are failing; the lease may still be alive and renewals are
    /// retried until the local deadline.
    Suspended {
        /// The lease.
        lease: LeaseId,
    },
    /// The lease is gone (local deadline passed or etcd said so); a new one
    /// is being granted.
    Lost {
        /// The lease that was lost.
        lease: LeaseId,
    },
    /// A registration only ([`crate::registration`]): what it holds is
    /// held by another lease, `holder`, which it never held; it waits
    /// until that lease is gone (then registers) or proven renewed (then
    /// `Duplicate`).
    Waiting {
        /// The other lease.
        holder: LeaseId,
    },
    /// A registration only ([`crate::registration`]): another
    /// registration holds what it registers, on `holder`, which is alive.
    /// No retry fixes it; the registration is stopping and `Stopped`
    /// follows.
    Duplicate {
        /// The other registration's lease.
        holder: LeaseId,
    },
    /// etcd refused a request with permission denied, which no retry
    /// fixes; the machine is stopping and `Stopped` follows.
    Refused {
        /// What etcd said.
        error: RpcError,
    },
    /// Final. `revoked` is false when there was no lease to revoke or the
    /// revoke failed (the lease then expires on its own).
    Stopped {
        /// Whether etcd confirmed the revoke.
        revoked: bool,
    },
}
