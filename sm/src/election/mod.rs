//! Leader election on a key prefix, compatible with Go's
//! `clientv3/concurrency` election and `etcdctl elect`.
//!
//! An [`Election`] is the election protocol plus its own session: a lease
//! kept alive by a lease-only [`Keepalive`], or, made with
//! [`Election::on_session`], a session kept by someone else that several
//! elections, semaphores and a host registration share (its facts come in
//! as [`SessionInput`]s, the protocol's requests for the lease leave as
//! [`ElectionNotice::SessionRequest`]; rules in `shared.rs`). Candidates queue up as keys
//! `<prefix><lease id in lowercase hex>`; the key with the lowest create
//! revision leads, and that create revision is the leader's fencing token.
//!
//! Guarantees:
//! * [`Election::is_leader`] is true only between an
//!   [`ElectionNotice::Elected`] and the first of: resign, stop, deletion of
//!   the own key (seen on the machine's watch, or told by
//!   [`ElectionInput::FenceRefused`]), or the session's *local deadline*. That deadline is
//!   measured from the send time of the last acknowledged renewal and
//!   trusts the lease for its TTL shortened by the configured clock drift
//!   allowance, minus the configured safety margin
//!   ([`trusted_lifetime`](crate::keepalive::trusted_lifetime)). So while
//!   this machine's clock runs no slower than the allowance permits, the
//!   deadline passes at least the safety margin before etcd can expire the
//!   lease and let the next candidate in: two holders never believe they
//!   lead at once, and no holder believes it leads once etcd has expired
//!   its lease — whatever the delay before etcd's expiry loop runs.
//! * Every user operation but `Resign` and `Stop` carries an [`OpId`] of
//!   the caller's choosing, and each answer names the operation it
//!   answers: `Campaign`/`TryCampaign` are answered exactly once
//!   (`Elected`, `NotElected` or `CampaignFailed`), `Proclaim` exactly once
//!   (`Proclaimed` or `ProclaimFailed`). A driver that gave up on an
//!   operation can never take its late answer for the next operation's.
//! * `CancelCampaign { op }` acts on campaign `op` only: a campaign still
//!   running is withdrawn (`CampaignFailed { op, Canceled }`), and one that
//!   already won is resigned (`Resigned { token }`), so a canceled campaign
//!   never leaves a leadership behind, even when its `Elected` crossed the
//!   cancel. A cancel of anything else changes nothing.
//! * `Elected` is only reported once etcd showed, at one revision, the own
//!   key with its create revision and no older candidate (Go skips the own
//!   key, etcd #19597), so a candidate whose key vanished while it waited
//!   never claims leadership. That revision's state comes from one read
//!   (the create txn itself, or a read of the newest older keys and the own
//!   key together), or, for the candidate second in line, from such a read
//!   followed by its watch of the whole prefix: etcd delivers those events
//!   in revision order without gaps, so the delete of the one older key,
//!   with no change of the own key before it, shows that state at the
//!   delete's revision.
//! * A campaign never reports `Elected` on a lease it lost: when the session
//!   lease is lost (its local deadline passed, or etcd refused a campaign
//!   request with `LeaseNotFound`, which the session is told at once), a
//!   running campaign starts over on the session's next lease, as
//!   `HostLiveness` re-registers. Only a session etcd refused for good
//!   (`Session(Refused)`) fails the campaign.
//! * A withdraw (resign, or a campaign given up) not confirmed within one
//!   TTL gives the session lease up (revoked, a new one granted): the key
//!   then goes with its lease instead of holding the queue while the
//!   session's renewals get through and its deletes do not.
//! * A create of the own key given up without an answer (sent again after
//!   the attempt timeout, canceled, or answered `Unavailable`) may still
//!   land later — after a withdraw, and make the key again while no
//!   campaign runs. Once nothing runs on the session's lease (no campaign,
//!   leadership or withdraw), such a lease is given up (revoked, a new one
//!   granted): etcd refuses a put on a revoked lease, so the create can
//!   never land, and no key of this machine holds the queue unasked.
//! * Every request is sent again when unanswered for
//!   [`ElectionConfig::attempt_timeout`]: a write lost in a raft leader
//!   change costs one attempt, not the driver's request timeout.
//! * The session outlives campaigns: resign and campaign again reuse it.
//! * A campaign never fails for coming before the machine learnt that the
//!   previous leadership ended: asked while this machine still leads (its
//!   driver saw the end first: a shared session ends every belief before
//!   it tells its primitives, a caller's clock can pass the deadline before
//!   the session's timer fires here), it waits for that end (loss, resign,
//!   refused fence, stop) and then runs, answered as every campaign.
//! * On a shared session every guarantee above holds with "the session's
//!   local deadline" read as the deadline its owner last told
//!   ([`SessionInput::Trusted`]; a stale, earlier one ends belief sooner,
//!   never later), and nothing is believed before one is told. A lease
//!   etcd answers "not found", or one the protocol gives up, is lost here
//!   at once and reported to the owner; later facts about it are ignored.
//!   A stop deletes the own keys instead of revoking the owner's lease.
//! * With [`ElectionConfig::permits`] = N > 1 (a semaphore), "leads" reads
//!   "holds": a candidate holds once one read, at one revision, showed its
//!   key with its token and fewer than N older keys (the create txn reads
//!   the newest N + 1 keys, a later read the newest N created before the
//!   own key, counted from the keys returned under the limit). So at most
//!   N candidates believe they hold at once, under the same deadline rule.
//!   A waiter watches each of the N older keys that read returned, from
//!   the read's revision + 1: only their deletes can bring it below N
//!   older keys, so a release wakes only the waiters whose rank it
//!   changes; any such delete or a broken watch cancels the others and
//!   reads again. A token is never handed out twice, but holders of N > 1
//!   may report tokens out of order. With N = 1 every request is the
//!   election's, Go-compatible as above.
//! * Watches are bounded: a waiter holds one (with N permits, at most N,
//!   one per older key it waits on), a leader one of its own key, and a
//!   ranked leader one more, of the priorities (ranked campaigns run with
//!   N = 1 only). Whatever ends a wait or a leadership (for a yield: the
//!   end of its hand-over) cancels its watches.

mod protocol;
mod requests;
mod shared;

pub use crate::session::SessionInput;
pub use protocol::SessionRequest;

pub use requests::{
    fenced_txn, hand_over_refusal_key, hand_over_request_key, leader_query, leader_value_query,
    priority_prefix,
};

use crate::backoff::BackoffConfig;
use crate::clock::Clock;
use crate::keepalive::{
    Keepalive, KeepaliveConfig, KeepaliveInput, KeepaliveNotice, LivenessState,
};
use crate::outbox::Outbox;
use crate::rpc::{Command, Compare, KeyValue, LeaseId, Revision, RpcError, RpcReply};
use crate::Machine;
use protocol::{Protocol, SessionFact, UserRequest};
use shared::{SharedSession, SHARED_ID_SPAN};
use std::time::{Duration, Instant};

/// RPC ids of the protocol start here; the session's start at 0, so a reply
/// id alone tells which part it belongs to (see [`Outbox`]): the session
/// would have to issue 2^40 requests to reach the protocol's range.
const PROTOCOL_FIRST_RPC_ID: u64 = 1 << 40;

/// Whether the watch `event` shows that the holding of `key` with fencing
/// `token` (its create revision) is over: a delete of `key`, or a put that
/// made it again (another create revision), at a revision after `token`.
///
/// The rule for every watch that is not the holder's own (an observer, a
/// host watcher, a bus watch of the same process covering the key: the
/// driver ends the holding when one of them sees this, before that
/// watch's consumer hears of it). The holder's own watch starts after
/// `token` and applies the same rule without the revision test, which
/// only ever passes there. The revision test keeps a lagging watch from
/// ending a holding with an older incarnation's delete: a session that
/// resigned and won again holds the same key name.
pub fn ends_holding(key: &[u8], token: Revision, event: &crate::rpc::WatchEvent) -> bool {
    event.kv.key == key
        && event.kv.mod_revision > token
        && (event.kind == crate::rpc::EventKind::Delete || event.kv.create_revision != token)
}

/// Names one user operation, so its answer can be told from the answers to
/// other operations. Chosen by the caller (a counter serves); the machine
/// only copies it into the answer and compares it in `CancelCampaign`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub struct OpId(pub u64);

/// How a ranked campaign ([`ElectionInput::CampaignRanked`]) wants to be
/// ordered. The leader is still the oldest candidate key, so fencing and
/// the one-leader rule are those of every campaign; a rank only changes
/// which waiting key becomes the oldest, by bumping (deleting, guarded)
/// waiting keys of a lower rank, whose candidates join again at the back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub struct Rank {
    /// Higher leads first among waiting ranked candidates; equal
    /// priorities keep their order (first come). Published in a side key
    /// ([`priority_prefix`]) on the candidate's lease.
    pub priority: u32,
    /// While leading, resign at once when a candidate of a higher priority
    /// waits (after [`ElectionNotice::StepDownRequested`]).
    pub yield_to_higher: bool,
}

/// How an [`Election`] behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionConfig {
    /// The election's key prefix, ending with `/` (e.g. `b"/coord/election/db/"`).
    /// Candidate keys are this prefix plus the lease id in lowercase hex.
    pub prefix: Vec<u8>,
    /// TTL of the session lease, in seconds.
    pub ttl_secs: i64,
    /// Delays between failed attempts (session and protocol alike).
    pub backoff: BackoffConfig,
    /// The session's safety margin: leadership ends this long before etcd
    /// can expire the session lease. See
    /// [`KeepaliveConfig::safety_margin`].
    pub safety_margin: Duration,
    /// How much slower than etcd's this clock may run, in parts per
    /// million. See [`KeepaliveConfig::drift_allowance_ppm`].
    pub drift_allowance_ppm: u32,
    /// How long a campaign step, withdraw, resign, proclaim, leader's check
    /// or the session's grant or revoke may go unanswered before the
    /// machine sends the same request
    /// again (and gives the first copy up). etcd drops, without an answer,
    /// writes that reach it while its raft leader is changing; every
    /// request the protocol sends is a read or compare-guarded, so a second
    /// copy applies at most once. A second or so is enough for etcd to
    /// elect a new leader; keep it below the driver's request timeout.
    /// `Duration::ZERO` sends no copies.
    pub attempt_timeout: Duration,
    /// Tell every move of the session's local deadline, leading or not
    /// ([`ElectionNotice::SessionTrusted`]): one notice per answered
    /// renewal, for a user that proves progress to a watchdog.
    pub announce_session_trust: bool,
    /// How many candidates hold at once: 1 for an election (the oldest
    /// candidate leads, requests exactly Go's), N for a semaphore of N
    /// permits (a candidate holds while fewer than N keys are older than
    /// its own). 0 counts as 1.
    pub permits: u32,
    /// `None` for an election or a semaphore. `Some(role)`: a reader or a
    /// writer of the read-write lock whose root is `prefix` (`<name>/`),
    /// on the key layout of Go's `recipes.RWMutex` (see the module docs);
    /// `permits` is then ignored (one holder per key, as an election).
    pub rw: Option<RwRole>,
}

/// Which side of a read-write lock an [`Election`] queues on (see
/// [`ElectionConfig::rw`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum RwRole {
    /// Key `<root>read/<lease hex>`; holds once no writer key is older.
    Read,
    /// Key `<root>write/<lease hex>`; holds once no key at all is older.
    Write,
}

/// Inputs of an [`Election`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum ElectionInput {
    /// The reply to one of the machine's requests (others are ignored).
    Rpc(RpcReply),
    /// Queue up and wait until leader; answered by `Elected` or
    /// `CampaignFailed` carrying `op`. Asked while a key of this machine
    /// is being withdrawn, or while it still leads (its user saw that
    /// leadership end before the machine did: a shared session ends
    /// beliefs before it tells its primitives), it starts once that is
    /// over; only a campaign asked while another one runs fails (`Busy`).
    Campaign {
        /// Names this operation in its answer.
        op: OpId,
        /// The leader's value (what observers see).
        value: Vec<u8>,
    },
    /// Become leader only if nobody else is; answered by `Elected`,
    /// `NotElected` or `CampaignFailed` carrying `op`. Never waits for other
    /// candidates.
    TryCampaign {
        /// Names this operation in its answer.
        op: OpId,
        /// The leader's value.
        value: Vec<u8>,
    },
    /// Stop leading and delete the own key, if this machine leads with
    /// fencing token `token`; answered by `Resigned { token }` either way.
    /// A resign for any other token (a stale handle whose leadership was
    /// lost, while a newer campaign runs or leads) changes nothing. The
    /// session stays up for later campaigns; a campaign asked for while the
    /// key is still being deleted starts once it is gone. It carries no
    /// [`OpId`]: the token already names what it acts on and its answer.
    Resign {
        /// The fencing token of the leadership to end.
        token: Revision,
    },
    /// Replace the leader's value; answered by `Proclaimed` or
    /// `ProclaimFailed` carrying `op`.
    Proclaim {
        /// Names this operation in its answer.
        op: OpId,
        /// The new value.
        value: Vec<u8>,
    },
    /// Give up campaign `op`. Still running (or waiting for a resign): it
    /// is withdrawn and answered by `CampaignFailed { op, Canceled }`.
    /// Already won and still leading: that leadership is resigned
    /// (`Resigned { token }`), since whoever cancels no longer wants it.
    /// Anything else (another campaign, one already answered otherwise)
    /// changes nothing and is not answered.
    CancelCampaign {
        /// The campaign to give up.
        op: OpId,
    },
    /// [`ElectionInput::Campaign`] with a [`Rank`]: the key is queued as
    /// a plain campaign's, the priority is published beside it, waiting
    /// ranked candidates of a lower priority ahead of it are bumped behind
    /// it, and while leading it watches for higher priorities. Answered as
    /// `Campaign`.
    CampaignRanked {
        /// Names this operation in its answer.
        op: OpId,
        /// The leader's value.
        value: Vec<u8>,
        /// Its priority and whether it yields.
        rank: Rank,
    },
    /// While leading with `token`: make the waiting candidate whose key or
    /// value is `to` lead next. Belief ends before the deleting txn is
    /// sent; answered by `HandedOver` (this leadership is over) or
    /// `HandOverFailed` (it is kept, unless the error is `NotLeader`).
    HandOver {
        /// Names this operation in its answer.
        op: OpId,
        /// The leadership to hand over.
        token: Revision,
        /// The target's candidate key or value.
        to: Vec<u8>,
    },
    /// Evidence from outside the machine that the own key of the
    /// leadership `token` is gone: etcd refused a transaction fenced on it
    /// (`create_revision(my_key) == token`, see [`fenced_txn`]). While
    /// leading with `token`, the leadership ends at once
    /// (`LeadershipLost { token }`), as a delete seen on the machine's own
    /// watch would end it; the watch may lag behind etcd's answer (it can
    /// be served by a member still catching up). During a hand-over the
    /// refusal is most likely the hand-over's own delete, whose answer
    /// decides. Anything else (another token, not leading) changes nothing
    /// and is not answered.
    FenceRefused {
        /// The fencing token the refused transaction carried.
        token: Revision,
    },
    /// Leave for good: stop believing at once, revoke the session lease
    /// (which deletes the own key), then `Session(Stopped{..})`. On a shared
    /// session ([`Election::on_session`]) the lease is the owner's: the
    /// own keys are deleted instead (see [`SessionInput`]).
    Stop,
    /// A fact from the owner of a shared session ([`Election::on_session`]);
    /// ignored by an election with its own session.
    #[cfg_attr(feature = "fuzzing", arbitrary(skip))]
    Session(SessionInput),
}

impl From<RpcReply> for ElectionInput {
    fn from(reply: RpcReply) -> Self {
        ElectionInput::Rpc(reply)
    }
}

/// Why a campaign or proclaim did not succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ElectionError {
    /// The session lease was lost (or presumed lost): a proclaim, or a
    /// leadership, ends with it. (A campaign does not: it starts over on
    /// the next lease.)
    SessionLost,
    /// The user canceled the campaign.
    Canceled,
    /// Another operation of the same kind is still running: a campaign
    /// asked while another campaign waits or runs, a proclaim or hand-over
    /// asked while an earlier proclaim or hand-over of the leadership is
    /// still waiting for etcd's answer. (A campaign asked while this
    /// machine leads is not refused: it waits for that leadership to end.)
    Busy,
    /// Not the leader (any more).
    NotLeader,
    /// The election was stopped.
    Stopped,
    /// A hand-over named no waiting candidate (or the target left before
    /// the hand-over could be done); the leadership is kept.
    NoSuchCandidate,
    /// A hand-over target has a candidate ahead of it that did not join
    /// ranked (it may be a Go or `etcdctl elect` client, which would not
    /// notice losing its place): nothing was deleted, the leadership is
    /// kept. Holds that candidate's key.
    NotRanked(Vec<u8>),
    /// More candidates wait ahead of a hand-over target than one txn can
    /// move; the leadership is kept.
    TooManyAhead,
    /// A ranked campaign or a hand-over asked of a semaphore
    /// ([`ElectionConfig::permits`] > 1): priorities and hand-overs order a
    /// single leader, so a semaphore refuses them; nothing was sent.
    NotWithPermits,
    /// A request failed in a way retrying would not help (see
    /// [`RpcError::is_retryable`]); the error says how, for the user.
    Rejected(RpcError),
}

/// What an [`Election`] tells its user, in order, via [`Command::Notify`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ElectionNotice {
    /// This candidate leads, verified against etcd.
    Elected {
        /// The campaign this answers.
        op: OpId,
        /// The own candidate key.
        key: Vec<u8>,
        /// The key's create revision: the fencing token, strictly greater
        /// than that of every earlier leader of this election.
        token: Revision,
        /// The session lease the key is bound to.
        lease: LeaseId,
        /// Whether the campaign found a candidate (a leader, or a holder of
        /// a permit) ahead of it and waited for it to go: the contention
        /// that a lock's or an election's metrics count. `false` when it
        /// led on its first look at the queue.
        waited: bool,
        /// How often the campaign joined the queue before it won: 1, plus
        /// one for each time it started over (its session's lease was lost
        /// while it waited, or its key vanished before it led).
        attempts: u32,
        /// The user may believe it leads until this instant (the session's
        /// local deadline when elected); [`ElectionNotice::Trusted`] moves it
        /// later. Compared with the user's own clock, belief ends on time
        /// even if no later notice is handled in time.
        trusted_until: Instant,
    },
    /// The leadership `token` may be believed until `until`: sent whenever
    /// the session's local deadline moves (a renewal was answered) while
    /// this candidate leads, so that belief is bounded by the caller's
    /// clock, not by how soon the driver gets to report the loss.
    Trusted {
        /// The leadership this is for.
        token: Revision,
        /// The session's local deadline now.
        until: Instant,
    },
    /// Answer to `TryCampaign` when someone else leads (`None` if the
    /// queue emptied meanwhile); the own key was removed again.
    NotElected {
        /// The campaign this answers.
        op: OpId,
        /// The current leader's key and value.
        leader: Option<KeyValue>,
    },
    /// A campaign ended without leadership.
    CampaignFailed {
        /// The campaign this answers.
        op: OpId,
        /// Why.
        error: ElectionError,
    },
    /// Leadership ended without a resign: session lost, local deadline
    /// passed, own key deleted, or stop.
    LeadershipLost {
        /// The token of the leadership that ended.
        token: Revision,
    },
    /// The resign of the leadership with `token` finished: that key is
    /// gone (or this machine never led with that token).
    Resigned {
        /// The token the resign was asked for.
        token: Revision,
    },
    /// The proclaimed value is written.
    Proclaimed {
        /// The proclaim this answers.
        op: OpId,
    },
    /// The proclaim did not happen.
    ProclaimFailed {
        /// The proclaim this answers.
        op: OpId,
        /// Why.
        error: ElectionError,
    },
    /// A ranked leader learnt that a candidate of a higher priority waits.
    /// Told once per leadership. With `yielding`, the leadership ends now:
    /// belief first, then the leadership is handed over to that candidate
    /// (`HandedOver` naming the campaign that won), or resigned when it
    /// cannot be (`Resigned { token }`); a loss meanwhile (session, key)
    /// ends it with `LeadershipLost { token }`. A yield is no user's
    /// hand-over: it is never answered by `HandOverFailed`.
    StepDownRequested {
        /// The leadership asked to step down.
        token: Revision,
        /// The priority key of the higher candidate.
        by: Vec<u8>,
        /// Its priority.
        priority: u32,
        /// This leader resigns at once (`Rank::yield_to_higher`).
        yielding: bool,
    },
    /// The hand-over `op` is done: the leadership `token` is over and the
    /// target (`to`, as read) is the oldest candidate.
    HandedOver {
        /// The hand-over this answers; after a yield
        /// ([`ElectionNotice::StepDownRequested`]), the campaign that won.
        op: OpId,
        /// The leadership that ended.
        token: Revision,
        /// The target's candidate key as it was read.
        to: KeyValue,
    },
    /// The hand-over `op` did not happen; the leadership is kept unless
    /// `error` is `NotLeader`.
    ///
    /// Order: when the hand-over fails because the leadership ended while
    /// it ran (the session was lost, the own key was deleted, the machine
    /// stopped), `LeadershipLost { token }` comes first and this
    /// `HandOverFailed { op, NotLeader }` right behind it, with nothing in
    /// between: whoever waits for the hand-over's answer finds the
    /// leadership already ended. A hand-over asked when this machine does
    /// not lead is answered `NotLeader` alone (no leadership to lose).
    HandOverFailed {
        /// The hand-over this answers.
        op: OpId,
        /// Why.
        error: ElectionError,
    },
    /// The session changed state. On a shared session: `Registered` at
    /// `Up` (or the end of a suspension), `Suspended`, `Lost`, `Refused`
    /// as told, and `Stopped { revoked: false }` once this election's
    /// stop is done (the lease is the owner's).
    Session(LivenessState),
    /// Only on a shared session ([`Election::on_session`]): what its owner
    /// must do to the lease. The election already treats that lease as
    /// lost. A `Replace` gives the lease up for everything on the session.
    SessionRequest(SessionRequest),
    /// The session's lease `lease` is trusted until `until` (a grant or an
    /// answered renewal moved its local deadline), whether this candidate
    /// leads or not. Only with [`ElectionConfig::announce_session_trust`].
    SessionTrusted {
        /// The session lease.
        lease: LeaseId,
        /// Its local deadline now.
        until: Instant,
    },
    /// On a session of its own: a lease grant failed and is tried again
    /// (the keepalive's [`KeepaliveNotice::GrantFailed`]), so a campaign
    /// that times out meanwhile can say why (etcd out of space, say)
    /// instead of only that it waited. Cleared by the next
    /// [`ElectionNotice::SessionTrusted`] or `Session(Registered)`.
    GrantFailed {
        /// Why etcd refused the grant, or why it could not be sent.
        error: RpcError,
    },
}

/// The election state machine. See the module docs for its guarantees.
///
/// `Clone` copies the whole machine, timers and queued commands included:
/// the model checker forks a world at every choice.
#[derive(Clone, Debug)]
pub struct Election {
    prefix: Vec<u8>,
    rw: Option<RwRole>,
    session: Part,
    announce_session_trust: bool,
    protocol: Protocol,
    /// The commands of both parts, forwarded in order; it issues no ids.
    outbox: Outbox<ElectionNotice>,
    clock: Clock,
    /// The leadership and deadline the user was last told it may believe
    /// in (see [`Election::announce_trust`]).
    announced: Option<(Revision, Instant)>,
}

/// Where an election's session lives.
#[derive(Clone, Debug)]
enum Part {
    /// Its own lease-only keepalive (boxed: the shared part is a third of
    /// its size).
    Own(Box<Keepalive>),
    /// A session kept by someone else, told by [`SessionInput`]s.
    Shared(SharedSession),
}

impl Part {
    fn lease(&self) -> Option<LeaseId> {
        match self {
            Part::Own(k) => k.lease(),
            Part::Shared(s) => s.lease(),
        }
    }

    fn local_deadline(&self) -> Option<Instant> {
        match self {
            Part::Own(k) => k.local_deadline(),
            Part::Shared(s) => s.local_deadline(),
        }
    }

    fn owns(&self, id: crate::rpc::RpcId) -> bool {
        match self {
            Part::Own(k) => k.owns(id),
            Part::Shared(s) => s.owns(id),
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Part::Own(k) => k.poll_timeout(),
            Part::Shared(s) => s.poll_timeout(),
        }
    }

    fn is_finished(&self) -> bool {
        match self {
            Part::Own(k) => k.is_finished(),
            Part::Shared(s) => s.is_finished(),
        }
    }
}

impl Election {
    /// Starts the session at `now` (its first commands are
    /// `Notify(Session(Registering))` and a lease grant). No campaign runs
    /// until one is asked for.
    pub fn new(config: ElectionConfig, now: Instant, seed: u64) -> Self {
        let session_config = KeepaliveConfig {
            ttl_secs: config.ttl_secs,
            backoff: config.backoff.clone(),
            safety_margin: config.safety_margin,
            drift_allowance_ppm: config.drift_allowance_ppm,
            attempt_timeout: config.attempt_timeout,
            announce_trust: config.announce_session_trust,
        };
        let mut session = Keepalive::with_first_rpc_id(session_config, now, seed, 0);
        session.set_announce_failures(true);
        Self::with_part(
            config,
            Part::Own(Box::new(session)),
            now,
            seed,
            PROTOCOL_FIRST_RPC_ID,
        )
    }

    /// An election on a session it does not keep: no lease is granted,
    /// renewed or revoked by this machine. The session's owner feeds every
    /// fact of its lease as [`ElectionInput::Session`] (for a lease-only
    /// [`Keepalive`] that announces trust: `Trusted { lease, until }` as
    /// `Trusted`, the `Registered`, `Suspended`, `Lost` and `Refused`
    /// states as `Up`, `Suspended`, `Lost`, `Refused`, and `Closed` before
    /// it revokes the lease) and acts on every
    /// [`ElectionNotice::SessionRequest`]. Nothing is believed before the
    /// first `Trusted`. `config.ttl_secs` is the lease's TTL (it bounds a
    /// withdraw); the safety margin and drift allowance are the owner's,
    /// already in the deadlines it tells. Request ids start at
    /// `first_rpc_id` (and use the next 2^41), so machines sharing one id
    /// space stay apart. All guarantees of the module docs hold, with "the
    /// session's local deadline" meaning the deadline last told.
    pub fn on_session(config: ElectionConfig, now: Instant, seed: u64, first_rpc_id: u64) -> Self {
        let limit = withdraw_limit(config.ttl_secs);
        let part = Part::Shared(SharedSession::new(
            first_rpc_id,
            config.attempt_timeout,
            limit,
        ));
        let protocol_first = first_rpc_id.saturating_add(SHARED_ID_SPAN);
        Self::with_part(config, part, now, seed, protocol_first)
    }

    fn with_part(
        config: ElectionConfig,
        session: Part,
        now: Instant,
        seed: u64,
        protocol_first_rpc_id: u64,
    ) -> Self {
        let protocol_seed = seed.rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15;
        let protocol = Protocol::new(
            config.prefix.clone(),
            config.backoff,
            config.attempt_timeout,
            withdraw_limit(config.ttl_secs),
            now,
            protocol_seed,
            protocol_first_rpc_id,
        );
        let mut protocol = protocol;
        match config.rw {
            Some(rw) => protocol.set_rw(Some(rw)),
            None => protocol.set_permits(config.permits),
        }
        let mut election = Election {
            prefix: config.prefix,
            rw: config.rw,
            session,
            announce_session_trust: config.announce_session_trust,
            protocol,
            outbox: Outbox::default(),
            clock: Clock::new(now),
            announced: None,
        };
        election.drain();
        election
    }

    /// What the user may believe right now: leader, with a session whose
    /// local deadline has not passed. Turns false at the deadline instant.
    pub fn is_leader(&self) -> bool {
        self.token().is_some()
    }

    /// The fencing token while [`Election::is_leader`] holds.
    pub fn token(&self) -> Option<Revision> {
        let (lease, token) = self.protocol.leadership()?;
        let trusted = Some(lease) == self.session.lease()
            && self
                .session
                .local_deadline()
                .is_some_and(|deadline| self.clock.now() < deadline);
        trusted.then_some(token)
    }

    /// While leader, the guard that fences a user's own etcd transaction:
    /// `create_revision(my_key) == token`. A transaction carrying it fails
    /// once this leadership has ended, whatever this process still believes.
    pub fn fence(&self) -> Option<Compare> {
        let token = self.token()?;
        let key = self.my_key()?;
        Some(Compare::CreateRevisionEquals {
            key,
            revision: token,
        })
    }

    /// When the session lease must be presumed gone (`None` without a lease).
    pub fn session_deadline(&self) -> Option<Instant> {
        self.session.local_deadline()
    }

    /// Renewals of the session on `grid`: see
    /// [`Keepalive::set_renewal_grid`].
    /// Does nothing on a shared session (its owner renews).
    pub fn set_session_renewal_grid(&mut self, grid: Option<crate::keepalive::RenewalGrid>) {
        if let Part::Own(session) = &mut self.session {
            session.set_renewal_grid(grid);
        }
    }

    /// Whether this election runs on a shared session
    /// ([`Election::on_session`]).
    pub fn is_on_shared_session(&self) -> bool {
        matches!(self.session, Part::Shared(_))
    }

    /// The candidate key of the current session: prefix + lowercase hex
    /// lease id (for a read-write lock, prefix + `read/` or `write/` +
    /// lowercase hex lease id).
    pub fn my_key(&self) -> Option<Vec<u8>> {
        self.session
            .lease()
            .map(|lease| requests::own_key(&self.prefix, self.rw, lease))
    }

    /// Hands the session what the protocol asked of it, if anything:
    /// notices of the protocol's step first, then the session's loss and
    /// what follows from it.
    fn session_request(&mut self, now: Instant) {
        if let Some(request) = self.protocol.take_session_request() {
            self.drain();
            let input = match request {
                SessionRequest::Gone(lease) => KeepaliveInput::LeaseGone { lease },
                SessionRequest::Replace(lease) => KeepaliveInput::Replace { lease },
            };
            match &mut self.session {
                Part::Own(session) => session.handle(now, input),
                Part::Shared(_) => self.shared_request(now, request),
            }
        }
    }

    /// Move everything both parts want done into the one ordered queue,
    /// telling the protocol about every session change on the way.
    fn drain(&mut self) {
        loop {
            let mut progressed = false;
            if let Part::Shared(s) = &mut self.session {
                while let Some(command) = s.outbox.pop() {
                    progressed = true;
                    self.outbox.push(command);
                }
            }
            while let Some(command) = match &mut self.session {
                Part::Own(session) => session.poll_command(),
                Part::Shared(_) => None,
            } {
                progressed = true;
                match command {
                    Command::Rpc { id, request } => self.outbox.push(Command::Rpc { id, request }),
                    Command::Cancel { id } => self.outbox.cancel(id),
                    Command::Notify(KeepaliveNotice::Trusted { lease, until }) => {
                        self.outbox
                            .notify(ElectionNotice::SessionTrusted { lease, until });
                    }
                    Command::Notify(KeepaliveNotice::GrantFailed { error }) => {
                        self.outbox.notify(ElectionNotice::GrantFailed { error });
                    }
                    // An election's own session is never detached.
                    Command::Notify(KeepaliveNotice::Detached(_)) => {}
                    Command::Notify(KeepaliveNotice::State(state)) => {
                        let fact = match &state {
                            LivenessState::Registered { lease } => {
                                Some(SessionFact::Up { lease: *lease })
                            }
                            LivenessState::Suspended { lease } => {
                                Some(SessionFact::Suspended { lease: *lease })
                            }
                            LivenessState::Lost { .. } | LivenessState::Stopped { .. } => {
                                Some(SessionFact::Lost)
                            }
                            LivenessState::Refused { error } => {
                                Some(SessionFact::Refused(error.clone()))
                            }
                            _ => None,
                        };
                        self.outbox.notify(ElectionNotice::Session(state));
                        if let Some(fact) = fact {
                            self.protocol.session(self.clock.now(), fact);
                            // Consequences (e.g. LeadershipLost) come right after the cause.
                            while let Some(command) = self.protocol.poll_command() {
                                self.forward(command);
                            }
                        }
                    }
                }
            }
            while let Some(command) = self.protocol.poll_command() {
                progressed = true;
                self.forward(command);
            }
            if !progressed {
                break;
            }
        }
        self.announce_trust();
    }

    /// Queues one of the protocol's commands. An `Elected` leaves with the
    /// session's local deadline as its `trusted_until` (the protocol does
    /// not own the lease's clock), and that is what the user was told.
    fn forward(&mut self, mut command: Command<ElectionNotice>) {
        if let Command::Notify(ElectionNotice::Elected {
            token,
            lease,
            trusted_until,
            ..
        }) = &mut command
        {
            if self.session.lease() == Some(*lease) {
                if let Some(deadline) = self.session.local_deadline() {
                    *trusted_until = deadline;
                }
            }
            self.announced = Some((*token, *trusted_until));
        }
        self.outbox.push(command);
    }

    /// The one place the user learns how long to believe: while leading,
    /// every move of the session's local deadline is told as `Trusted`,
    /// after everything the step queued.
    fn announce_trust(&mut self) {
        let Some((lease, token)) = self.protocol.leadership() else {
            self.announced = None;
            return;
        };
        if self.session.lease() != Some(lease) {
            return;
        }
        let Some(until) = self.session.local_deadline() else {
            return;
        };
        let known = self
            .announced
            .is_some_and(|(t, at)| t == token && at == until);
        if !known {
            self.announced = Some((token, until));
            self.outbox.notify(ElectionNotice::Trusted { token, until });
        }
    }
}

impl Machine for Election {
    type Input = ElectionInput;
    type Notice = ElectionNotice;

    fn handle(&mut self, now: Instant, input: ElectionInput) {
        let now = self.clock.observe(now);
        match input {
            ElectionInput::Rpc(reply) => {
                if self.session.owns(reply.id) {
                    match &mut self.session {
                        Part::Own(session) => session.handle(now, KeepaliveInput::Rpc(reply)),
                        Part::Shared(_) => self.shared_reply(now, reply),
                    }
                } else {
                    self.protocol.reply(now, reply);
                    self.session_request(now);
                }
            }
            ElectionInput::Campaign { op, value } => self.protocol.user(
                now,
                UserRequest::Campaign {
                    op,
                    value,
                    try_only: false,
                    rank: None,
                },
            ),
            ElectionInput::TryCampaign { op, value } => self.protocol.user(
                now,
                UserRequest::Campaign {
                    op,
                    value,
                    try_only: true,
                    rank: None,
                },
            ),
            ElectionInput::CampaignRanked { op, value, rank } => self.protocol.user(
                now,
                UserRequest::Campaign {
                    op,
                    value,
                    try_only: false,
                    rank: Some(rank),
                },
            ),
            ElectionInput::HandOver { op, token, to } => self
                .protocol
                .user(now, UserRequest::HandOver { op, token, to }),
            ElectionInput::Resign { token } => {
                self.protocol.user(now, UserRequest::Resign { token })
            }
            ElectionInput::Proclaim { op, value } => {
                self.protocol.user(now, UserRequest::Proclaim { op, value })
            }
            ElectionInput::CancelCampaign { op } => {
                self.protocol.user(now, UserRequest::CancelCampaign { op })
            }
            ElectionInput::FenceRefused { token } => {
                self.protocol.user(now, UserRequest::FenceRefused { token })
            }
            ElectionInput::Stop => match &mut self.session {
                Part::Own(_) => {
                    self.protocol.user(now, UserRequest::Stop);
                    self.drain();
                    if let Part::Own(session) = &mut self.session {
                        session.handle(now, KeepaliveInput::Stop);
                    }
                }
                Part::Shared(_) => self.shared_stop(now),
            },
            ElectionInput::Session(input) => self.shared_input(now, input),
        }
        // A user request can end what ran on the lease, too (a cancel,
        // a refused fence): the session hears what follows from that.
        self.session_request(now);
        self.drain();
    }

    fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        match &mut self.session {
            Part::Own(session) => session.handle_timeout(now),
            Part::Shared(_) => self.shared_timeout(now),
        }
        self.drain();
        self.protocol.handle_timeout(now);
        self.session_request(now);
        self.drain();
    }

    fn poll_command(&mut self) -> Option<Command<ElectionNotice>> {
        self.outbox.pop()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let session = self.session.poll_timeout();
        let protocol = self.protocol.poll_timeout();
        let next = match (session, protocol) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        next.map(|at| self.clock.clamp(at))
    }

    fn stop_input() -> ElectionInput {
        ElectionInput::Stop
    }

    fn is_finished(&self) -> bool {
        self.protocol.is_stopped() && self.session.is_finished() && self.outbox.is_empty()
    }
}

/// One TTL: by then a key that could not be deleted is better off going
/// with its lease.
fn withdraw_limit(ttl_secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl_secs.max(1)).unwrap_or(1))
}
