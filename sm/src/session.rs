//! The facts of a session lease, as its owner tells the machines that run
//! on it without keeping a lease of their own: elections
//! ([`Election::on_session`](crate::election::Election::on_session)) and
//! host registrations ([`Registration`](crate::registration::Registration)).
//! A driver with a lease-only [`Keepalive`](crate::keepalive::Keepalive)
//! that announces trust feeds its `Trusted { lease, until }` as
//! [`SessionInput::Trusted`] and its `Registered`, `Suspended`, `Lost`,
//! `Refused` states as `Up`, `Suspended`, `Lost`, `Refused`, and
//! [`SessionInput::Closed`] before it revokes the lease.

use crate::rpc::{LeaseId, RpcError};
use std::time::Instant;

/// What the owner of a shared session tells a machine running on it (an
/// [`Election`](crate::election::Election) or a
/// [`Registration`](crate::registration::Registration)), in the order it
/// learns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionInput {
    /// The lease `lease` is granted (a new lease means the previous one is
    /// gone, with every key on it).
    Up {
        /// The session lease.
        lease: LeaseId,
    },
    /// The lease `lease` may be believed until `until`, the session's local
    /// deadline (a grant or an answered renewal moved it). Implies `Up`.
    Trusted {
        /// The session lease.
        lease: LeaseId,
        /// Its local deadline now, on this machine's clock.
        until: Instant,
    },
    /// Renewals of `lease` fail; it may still be alive until its deadline.
    Suspended {
        /// The session lease.
        lease: LeaseId,
    },
    /// The lease is gone (or presumed gone): every key on it too. A new
    /// one is being granted.
    Lost {
        /// The lease that was lost.
        lease: LeaseId,
    },
    /// etcd refused the session for good: every campaign fails.
    Refused(RpcError),
    /// The owner closes the session and revokes its lease: stop, without
    /// deleting anything, since the revoke deletes every key of the lease.
    Closed,
}
