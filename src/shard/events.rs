//! What a [`ShardMap`](super::ShardMap) tells its user, and what a read of
//! the map returns.

use std::time::Instant;

/// An ownership change of this member, in the order they happened, on
/// [`ShardMap::events`](super::ShardMap::events).
///
/// Per shard the events alternate: `Acquired`, then (optionally `Release`,
/// then) the end of that ownership, which is a `Lost`, or your own
/// [`ShardMap::release`](super::ShardMap::release), or the `Release`
/// deadline passing. `#[non_exhaustive]`: match the events you act on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShardEvent {
    /// This member owns `shard` from now on, with fencing token `token`:
    /// the create revision of the shard key, greater than every earlier
    /// owner's token of that shard. Start its work.
    Acquired {
        /// The shard.
        shard: u32,
        /// Its fencing token (see [`ShardMap::txn_if_owner`](super::ShardMap::txn_if_owner)).
        token: i64,
    },
    /// `shard` is placed on another member now: finish or hand off its
    /// work, then call [`ShardMap::release`](super::ShardMap::release). At
    /// `deadline` ownership ends anyway (the map releases it itself); the
    /// deadline is never later than the session's trusted lifetime from
    /// now, so stop the work by then whatever happens.
    Release {
        /// The shard.
        shard: u32,
        /// When ownership ends at the latest (this process's clock).
        deadline: Instant,
    },
    /// Ownership of `shard` ended without a hand-back: the session was lost
    /// (etcd unreachable past its local deadline, or the lease expired),
    /// its key was deleted or replaced, or a fenced transaction was
    /// refused. Stop its work at once; its writes are refused from now on
    /// by [`ShardMap::txn_if_owner`](super::ShardMap::txn_if_owner).
    Lost {
        /// The shard.
        shard: u32,
    },
    /// This member's key is held on `holder`, a lease of another process
    /// with the same member id: a crashed predecessor's (its key goes when
    /// the lease expires, then this member joins) or a live duplicate's
    /// (then [`ShardEvent::Duplicate`]). No shard is taken meanwhile.
    Waiting {
        /// The other process's lease.
        holder: i64,
    },
    /// Another live process joined with this member id (its lease
    /// `holder` was renewed past its TTL): this member owns nothing and
    /// has stopped, leaving that process's keys alone;
    /// [`ShardMap::leave`](super::ShardMap::leave) returns
    /// [`Error::DuplicateId`](crate::Error::DuplicateId). Give each member
    /// its own id.
    Duplicate {
        /// The other process's lease.
        holder: i64,
    },
}

/// The owner of one shard as etcd has it (one read, no membership).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardOwner {
    /// The shard.
    pub shard: u32,
    /// The owning member's id (the shard key's value).
    pub member: String,
    /// The owner's fencing token: the shard key's create revision.
    pub token: i64,
    /// The owner's session lease, which the key is bound to.
    pub lease: i64,
}

/// A member of a shard map as etcd has it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardMember {
    /// Its id (the last segment of its member key).
    pub member: String,
    /// Its weight (its member key's value; 0: never placed).
    pub weight: u32,
    /// Its session lease.
    pub lease: i64,
}
