//! A fenced shard map: `shards` numbered shards spread over the live
//! members of a fleet by rendezvous hashing, each owned by at most one
//! member at a time, the owner's fencing token rising with every new owner.
//!
//! [`ShardMap`] is one member's protocol. It is driven by a session lease
//! it does not keep itself ([`ShardInput::SessionUp`],
//! [`ShardInput::SessionLost`]), so one lease can serve it and other
//! primitives of the same process; it never grants, renews or revokes a
//! lease. A driver with a lease-only [`Keepalive`](crate::keepalive::Keepalive)
//! that announces trust feeds every `KeepaliveNotice::Trusted { lease,
//! until }` as `SessionUp { lease, trusted_until: until }` and every
//! `Lost`, `Refused` or `Stopped` state as `SessionLost`; once the map
//! [is finished](crate::Machine::is_finished) after a
//! [`ShardInput::Leave`], it stops the session (see `tests/sim/shard.rs`).
//!
//! # Key layout
//!
//! Under the map's prefix (ending with `/`), and nothing else under it:
//! * `<prefix>members/<member id>` — one per live member, on its session
//!   lease; the value is the member's weight in decimal ASCII (empty: 1;
//!   0: a member that is never placed).
//! * `<prefix>shards/<shard>` — `<shard>` in decimal (`0` to `shards − 1`,
//!   no leading zeros); one per owned shard, on its owner's lease; the
//!   value is the owner's member id. The key's create revision is the
//!   owner's fencing token.
//!
//! `etcdctl get --prefix <prefix>` shows the whole map. Placement (who
//! *should* own a shard) is [`placement::owner`]; ownership (who does) is
//! the shard key.
//!
//! # Rules
//!
//! 1. **Trust.** The session is trusted from a `SessionUp { lease,
//!    trusted_until }` until the first of `SessionLost`, another lease, or
//!    `trusted_until` (renewals move it on). `trusted_until` is the
//!    session's local deadline, which passes before etcd can expire the
//!    lease (see [`trusted_lifetime`](crate::keepalive::trusted_lifetime)).
//!    Kept by `ShardMap::trusted`.
//! 2. **View.** The member reads the whole prefix once and watches it from
//!    that read's revision + 1; etcd delivers the changes in revision order
//!    without gaps, so the view is the map at one revision. A failed read
//!    or a broken or canceled watch is retried with backoff by reading
//!    again; the new read replaces the view. Kept by `ShardMap::on_read`,
//!    `ShardMap::on_events` and `ShardMap::reread`.
//! 3. **Membership.** While trusted, the member keeps its key on the
//!    current lease, written by a txn guarded on the key as the view shows
//!    it (absent, or its mod revision), so a copy that lands late never
//!    overwrites a newer write. No key is written again before the view
//!    shows this member's last successful write to it (until then the view
//!    shows the key as it was before). A failed guard reads the key (the
//!    txn's failure branch): the view is behind etcd, so the next put is
//!    guarded on what was read, at once, until the view reaches that
//!    read's revision; a key read on a lease this member never held is
//!    not written over (rule 12 decides once the view shows it). Guarded
//!    on the view again, the put failed for as long as the view stood
//!    still (a lost lease revoked the key, and the watch was on a member
//!    that had stopped answering): a soak member went 8 s without its key.
//!    Kept by `ShardMap::register`, `ShardMap::unseen_write` and
//!    `ShardMap::on_failed_guard`.
//! 4. **Placement.** A shard belongs to the member [`placement::owner`]
//!    names among the members of the view; a leaving member counts itself
//!    out. Kept by `ShardMap::placed_here`.
//! 5. **Create.** A member creates a shard key only while trusted, with a
//!    live view, when placement names it, the view shows the key absent
//!    and it is not leaving — by a txn guarded on the key being absent
//!    (create revision 0), on the current lease. Kept by
//!    `ShardMap::acquire`.
//! 6. **Acquired.** `Acquired { shard, token }` is told only when the
//!    create txn succeeded on the lease still current and trusted, and the
//!    view has not already seen that key deleted or re-created (token = the
//!    txn's revision, the key's create revision); or when the view shows a
//!    key of this member on the current lease that it does not believe in
//!    (a create whose answer was lost), while trusted and placement names
//!    it. Never for a key incarnation this member has sent a delete for
//!    (a copy of that delete may still land). Kept by `ShardMap::on_create`
//!    and `ShardMap::acquire`.
//! 7. **Loss.** On `SessionLost`, a new lease, or `trusted_until` passing,
//!    every owned shard is told `Lost` at once and belief ends. A shard
//!    whose key the view shows deleted, or re-created with another create
//!    revision, is told `Lost` and belief ends. Kept by
//!    `ShardMap::lose_all` and `ShardMap::check_keys`.
//! 8. **Release.** An owned shard that placement no longer names this
//!    member for is told `Release { shard, deadline }` once, with
//!    `deadline = now + min(drain, lifetime)` where `lifetime` is the
//!    session's trusted lifetime at its last `SessionUp`
//!    (`trusted_until − then`). Belief ends at [`ShardInput::Release`] or
//!    at the deadline, whichever is first, and only then is the key
//!    deleted, guarded on its own create revision. Kept by
//!    `ShardMap::start_releases`, `ShardMap::finish_release`.
//! 9. **Sweep.** Keys of this member it does not believe in are deleted,
//!    guarded on their create revision: those on a lease it held before
//!    (remembered, the last 8), and those on its current lease that
//!    placement does not name it for or whose delete failed. No other
//!    member's key is ever deleted. A delete whose guard fails reads the
//!    key: the incarnation it named is gone already, and nothing more is
//!    written to that key before the view reaches the read's revision (as
//!    after a write of this member's, rule 3). Kept by `ShardMap::sweep`
//!    and `ShardMap::on_failed_guard`.
//! 10. **Attempts.** A request unanswered for `attempt_timeout` is
//!     canceled and counts as failed (those given up together as one); a
//!     failure (or a create's failed guard) holds back every read and write
//!     for one backoff delay, reset by the next success. The failed guard
//!     of a member key write or of a delete is no failure: etcd answered,
//!     with the key as it is (rules 3 and 9). An adoption (rule 6) sends
//!     nothing and is never held back. A failure of a request sent no
//!     later than the failure that last advanced the backoff is that same
//!     outage told again (a broken connection or a lost lease fails every
//!     request on it at once): it neither advances the backoff nor moves
//!     the hold. Counted one by one, the 16 creates and deletes of a member
//!     that lost its lease took the delay to its cap in one instant, and a
//!     few such losses in a row kept a member without its key for longer
//!     than 20 s. Every write is guarded, so a copy applies at most once.
//!     Kept by `ShardMap::expire_attempts` and `ShardMap::fail`.
//! 11. **Leave.** [`ShardInput::Leave`] deletes the member key (guarded)
//!     and releases every owned shard as in rule 8, at once even while an
//!     earlier failure holds writes back (rule 10): the others take the
//!     leaver's shards only once its member key is gone, and a hold of up
//!     to the backoff's cap would delay that for as long (later attempts
//!     are held back as rule 10 says); the machine is
//!     finished once nothing is owned, no write is in flight and, while the
//!     session is trusted, the view shows no key of this member. The
//!     session lease is the driver's to revoke then. Kept by
//!     `ShardMap::reconcile` and `ShardMap::left`.
//! 12. **Another holder.** A member key the view shows on a lease this
//!     member never held (the current one or the last 8) is another
//!     process's with the same member id: a crashed predecessor's, or a
//!     live duplicate's. It is never written over nor deleted, and no
//!     shard is created meanwhile; [`ShardNotice::Waiting`] says so and
//!     the holder's lease is looked at as [`crate::holder`] rules. A
//!     crashed predecessor's key goes with its lease, the view shows the
//!     delete, and rule 3 writes the key; a lease renewed past its
//!     remaining TTL is a live duplicate: [`ShardNotice::Duplicate`],
//!     every belief ends and the map is finished (rule 7's `Lost` for
//!     anything owned). Kept by `ShardMap::held_elsewhere` and
//!     `ShardMap::on_look`.
//!
//! # Guarantees
//!
//! * Per shard, no two members believe they own it at once: a key is
//!   created only while absent (5); its owner's belief ends before it
//!   deletes the key (8) and, when its lease expires instead, at its local
//!   deadline, before etcd can expire the lease (1, 7).
//! * Every new owner's token is greater than every earlier owner's: the
//!   token is the create revision of a key created after the previous one
//!   was deleted, and etcd's revisions only rise.
//! * Once membership and sessions stay stable and etcd answers, every
//!   shard is owned by its placed member within the old owner's drain (8)
//!   or its lease's expiry, plus a round trip and a backoff delay; a
//!   shard whose placed owner holds it never moves.
//! * A join moves only shards to the joiner and a leave only the leaver's
//!   shards ([`placement`]); how many is binomially spread around
//!   `shards / members` (no per-event bound: the hash decides).
//! * Member ids must be unique among live members: the map tells members
//!   apart by id alone. A second live member with an id in use is refused
//!   within about one TTL of the first's lease (rule 12).

pub mod keys;
pub mod member;
pub mod placement;
mod protocol;
mod view;

use crate::backoff::BackoffConfig;
use crate::rpc::{LeaseId, Revision, RpcReply};
use std::time::{Duration, Instant};

pub use protocol::ShardMap;

/// How a [`ShardMap`] member behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardConfig {
    /// The map's key prefix, ending with `/` (e.g. `b"/coord/shards/jobs/"`).
    pub prefix: Vec<u8>,
    /// This member's id: unique among live members, the last segment of
    /// its member key and the value of its shard keys.
    pub member: Vec<u8>,
    /// This member's weight: its share of the shards is proportional to it;
    /// 0 joins without ever being placed (an observer).
    pub weight: u32,
    /// How many shards the map has (numbered `0..shards`); every member
    /// must use the same number.
    pub shards: u32,
    /// Delays after a failed request.
    pub backoff: BackoffConfig,
    /// How long a request may go unanswered before it is given up and
    /// counted as failed (rule 10). `Duration::ZERO` never gives up.
    pub attempt_timeout: Duration,
    /// How long the user may drain a shard after `Release` before the map
    /// releases it itself (never longer than the session's trusted
    /// lifetime, rule 8).
    pub drain: Duration,
}

/// Inputs of a [`ShardMap`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardInput {
    /// The reply to one of the machine's requests (others are ignored).
    Rpc(RpcReply),
    /// The session holds `lease`, trusted until `trusted_until` (its local
    /// deadline). Sent at the session's grant and at every renewal; a new
    /// lease ends every belief on the previous one.
    SessionUp {
        /// The session lease.
        lease: LeaseId,
        /// Its local deadline.
        trusted_until: Instant,
    },
    /// The session lease is gone (or presumed gone): every belief ends.
    SessionLost,
    /// The user has drained `shard` after `Release`: belief ends now and
    /// the key is deleted. Anything else (a shard not being released)
    /// changes nothing.
    Release {
        /// The shard handed back.
        shard: u32,
    },
    /// Leave the map: member key deleted, every shard released (rule 11).
    Leave,
}

impl From<RpcReply> for ShardInput {
    fn from(reply: RpcReply) -> Self {
        ShardInput::Rpc(reply)
    }
}

/// What a [`ShardMap`] tells its user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardNotice {
    /// This member owns `shard` from now on, with fencing token `token`
    /// (the shard key's create revision), until `Lost` or the end of a
    /// release.
    Acquired {
        /// The shard.
        shard: u32,
        /// Its fencing token.
        token: Revision,
    },
    /// `shard` is placed elsewhere now: finish or hand off its work and
    /// send [`ShardInput::Release`]; at `deadline` the map releases it
    /// itself and ownership ends.
    Release {
        /// The shard.
        shard: u32,
        /// When ownership ends at the latest.
        deadline: Instant,
    },
    /// Ownership of `shard` ended without a release: the session was lost
    /// or its key was deleted or replaced.
    Lost {
        /// The shard.
        shard: u32,
    },
    /// The member key is on `holder`, a lease this member never held: a
    /// crashed predecessor's with the same member id, expiring, or a live
    /// duplicate's. Nothing is written and no shard taken until that
    /// lease is gone or proven renewed (rule 12). Told once per holder.
    Waiting {
        /// The other process's lease.
        holder: LeaseId,
    },
    /// Another live process holds this member id (its lease `holder` was
    /// renewed past its TTL): every belief has ended and the map is
    /// finished, without touching that process's keys (rule 12).
    Duplicate {
        /// The other process's lease.
        holder: LeaseId,
    },
}
