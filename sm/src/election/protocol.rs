//! The election protocol proper, with the session reduced to two facts
//! ("up with lease L", "lost"). Keeping the lease machinery out makes every
//! step here testable with hand-written replies. User requests are taken
//! in [`user`], one function per phase.

use super::requests;
use super::{ElectionError, ElectionNotice, OpId, Rank, RwRole};
use crate::backoff::{Backoff, BackoffConfig};
use crate::clock::Clock;
use crate::outbox::Outbox;
use crate::rpc::{
    Command, EventKind, KeyValue, LeaseId, Response, Revision, RpcError, RpcId, RpcReply,
    TxnOpResponse,
};
use crate::timer::TimerTable;
use std::time::{Duration, Instant};

mod permits;
mod ranked;
mod user;

/// What the protocol needs to know about its session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SessionFact {
    /// The lease is registered and renewing.
    Up { lease: LeaseId },
    /// Renewals of `lease` fail; it may still be alive.
    Suspended { lease: LeaseId },
    /// The lease is gone (or presumed gone): every key of it is gone too.
    Lost,
    /// etcd refused the session for good (a grant refused with permission
    /// denied): no lease will ever come, so nothing may wait for one.
    Refused(RpcError),
}

pub use crate::session::SessionRequest;

/// User requests, without the RPC replies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum UserRequest {
    Campaign {
        op: OpId,
        value: Vec<u8>,
        try_only: bool,
        /// `Some` for a ranked campaign (see `ranked.rs`).
        rank: Option<Rank>,
    },
    HandOver {
        op: OpId,
        token: Revision,
        to: Vec<u8>,
    },
    Resign {
        token: Revision,
    },
    Proclaim {
        op: OpId,
        value: Vec<u8>,
    },
    CancelCampaign {
        op: OpId,
    },
    /// etcd refused a transaction fenced on the own key with `token`.
    FenceRefused {
        token: Revision,
    },
    Stop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// The next attempt after a failed one (backoff).
    Retry,
    /// The unary request of the operation (a campaign step, a withdraw, a
    /// leader's check of its key) has gone unanswered for one attempt
    /// timeout: send it again. etcd never answers a write that a follower
    /// forwarded to a leader that died (the proposal is dropped, not
    /// re-proposed), so waiting for the driver's request timeout would
    /// cost the whole timeout on every such write; every request sent here
    /// is a read or compare-guarded, so a second copy applies at most once.
    Attempt,
    ProclaimRetry,
    /// As [`Timer::Attempt`], for the proclaim in flight.
    ProclaimAttempt,
    /// A withdraw (of a resign or a given-up campaign) still unconfirmed
    /// this long after it began: give the session up, so the key goes with
    /// its lease instead of holding the queue for as long as the session
    /// lives (its renewals may get through while the deletes do not).
    WithdrawLimit,
    /// A ranked leader's read or watch of the priorities failed: read again.
    RankRetry,
    /// A hand-over request failed: send it again after a backoff.
    HandOverRetry,
    /// As [`Timer::Attempt`], for the hand-over request in flight.
    HandOverAttempt,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Session {
    Down,
    Up(LeaseId),
    Suspended(LeaseId),
}

impl Session {
    fn lease(self) -> Option<LeaseId> {
        match self {
            Session::Down => None,
            Session::Up(l) | Session::Suspended(l) => Some(l),
        }
    }
}

#[derive(Clone, Debug)]
enum Step {
    /// Create my key and read who is ahead ([`requests::create`]).
    Create,
    FixValue,
    /// Read who is ahead and my own key ([`requests::older_and_mine`]).
    FindOlder,
    /// Wait for the delete of `key`, the newest key older than mine, from
    /// `from` (the revision of the read that found it, plus one), where
    /// that read also saw my key with my token.
    WatchOlder {
        key: Vec<u8>,
        from: Revision,
        /// `key` was the only key older than mine: nothing older can appear
        /// later, so its delete leaves me first in line. The watch then
        /// covers the whole prefix, so it also carries every change of my
        /// own key, in revision order, without gaps: at the delete's
        /// revision my key is still the one the read saw unless an event
        /// up to it said otherwise, and no read needs to follow.
        only: bool,
    },
    /// With more than one permit: wait for the delete of any of `keys`,
    /// the `permits` newest keys older than mine, each watched on its own
    /// from `from` (the read's revision plus one). Only their deletes can
    /// bring me below `permits` older keys (a farther key's delete leaves
    /// at least `permits` older), so a waiter wakes only for changes of
    /// its own rank, and any of them (or a broken watch) means a new read
    /// ([`Step::FindOlder`]). `ids` are the watches, in `keys` order; the
    /// first is also the campaign's `pending`.
    WatchOlders {
        keys: Vec<Vec<u8>>,
        from: Revision,
        ids: Vec<RpcId>,
        /// `keys` were all the keys older than mine (the read was not cut
        /// by its limit): nothing older can appear later, so the delete of
        /// any of them leaves fewer than `permits` older. One watch of the
        /// whole prefix then replaces the per-key watches (its one id is
        /// `ids`), so that every change of my own key arrives on the same
        /// ordered stream and the delete alone decides, without the read
        /// that would make etcd 3.4-3.6 read the whole queue.
        only: bool,
    },
    /// A ranked campaign deletes waiting keys of a lower priority ahead of
    /// it ([`requests::bump`]), while the leader `oldest` holds.
    Bump {
        oldest: (Vec<u8>, Revision),
        victims: Vec<(Vec<u8>, Revision)>,
    },
}

/// A campaign asked for while the session had no lease: it starts
/// ([`Step::Create`]) once one is up.
#[derive(Clone, Debug)]
struct Waiting {
    op: OpId,
    value: Vec<u8>,
    try_only: bool,
    rank: Option<Rank>,
    /// How often this campaign joined the queue so far (0 before the first).
    attempts: u32,
}

#[derive(Clone, Debug)]
struct Campaign {
    /// The operation this campaign answers.
    op: OpId,
    value: Vec<u8>,
    try_only: bool,
    rank: Option<Rank>,
    lease: LeaseId,
    key: Vec<u8>,
    /// My key's create revision; 0 while unknown.
    token: Revision,
    /// Whether a key ahead of mine was found and waited for: the
    /// contention [`ElectionNotice::Elected`] reports.
    waited: bool,
    /// How often this campaign joined the queue: 1, plus one for each
    /// start over (on a new lease, or after its key vanished while it
    /// waited). [`ElectionNotice::Elected`] reports it.
    attempts: u32,
    step: Step,
    /// The request of `step` in flight; `None` while waiting for the backoff.
    pending: Option<RpcId>,
}

#[derive(Clone, Debug)]
enum Guard {
    Watching(RpcId),
    Checking(RpcId),
    Waiting,
}

#[derive(Clone, Debug)]
struct Leading {
    /// The campaign that won: canceling it resigns.
    op: OpId,
    key: Vec<u8>,
    lease: LeaseId,
    token: Revision,
    guard: Guard,
    proclaim: Option<Proclaim>,
    /// A ranked leader's watch of the priorities.
    ranks: Option<ranked::Ranks>,
    /// A hand-over in progress.
    hand_over: Option<ranked::HandOver>,
}

/// A proclaim in progress: its operation, the value, and the request in
/// flight (`None` while waiting to retry).
#[derive(Clone, Debug)]
struct Proclaim {
    op: OpId,
    value: Vec<u8>,
    pending: Option<RpcId>,
}

#[derive(Clone, Debug)]
struct Withdraw {
    key: Vec<u8>,
    /// A ranked candidate's priority key, deleted with the candidate key.
    side: Option<Vec<u8>>,
    token: Option<Revision>,
    pending: Option<RpcId>,
    then: Vec<ElectionNotice>,
}

#[derive(Clone, Debug)]
enum Op {
    Idle,
    WaitingForSession(Waiting),
    Campaigning(Campaign),
    Leading(Leading),
    Withdrawing(Withdraw),
    Stopped,
}

/// The protocol state machine; `Election` wraps it with its session.
#[derive(Clone, Debug)]
pub(crate) struct Protocol {
    prefix: Vec<u8>,
    /// How long a unary request may go unanswered before it is sent again
    /// ([`Timer::Attempt`]). The first three copies wait one attempt
    /// timeout each (a raft election takes one to two of them, and the
    /// copies sent meanwhile are dropped too); from the fourth on the wait
    /// doubles, up to 16 attempt timeouts, so a server that is merely slow
    /// still gets to answer one.
    attempt_timeout: Duration,
    /// How long a withdraw may take before the session is given up
    /// ([`Timer::WithdrawLimit`]).
    withdraw_limit: Duration,
    /// Copies sent again in a row since the last answer, per timer
    /// ([`Timer::Attempt`], [`Timer::ProclaimAttempt`]).
    resent: u32,
    proclaim_resent: u32,
    /// What the session must hear from the protocol, for the wrapper to
    /// hand over: a lease etcd said does not exist, or one to give up.
    session_request: Option<SessionRequest>,
    backoff: Backoff,
    proclaim_backoff: Backoff,
    hand_over_backoff: Backoff,
    timers: TimerTable<Timer>,
    outbox: Outbox<ElectionNotice>,
    session: Session,
    /// Why the session will never come up, once etcd refused it: every
    /// campaign then fails with it instead of waiting for a lease.
    refused: Option<RpcError>,
    op: Op,
    /// A campaign asked for while a withdraw was still deleting the previous
    /// key (a dropped leadership resigns without waiting), or while a
    /// leadership whose end the user saw first was still held here: it
    /// starts once the machine is idle instead of failing with `Busy`.
    queued: Option<UserRequest>,
    clock: Clock,
    /// How many candidates hold at once: 1 for an election, more for a
    /// semaphore ([`Protocol::set_permits`]).
    permits: u32,
    /// The side of a read-write lock this machine queues on, `None` for an
    /// election or a semaphore ([`Protocol::set_rw`]).
    rw: Option<RwRole>,
    /// The keys that may keep mine from holding ([`requests::queue_prefix`]):
    /// the prefix itself but for a read-write lock's reader.
    queue: Vec<u8>,
    /// The watches of a [`Step::WatchOlders`] but its first (which is the
    /// campaign's `pending`, canceled wherever a campaign ends): whatever
    /// ends that step elsewhere, [`Protocol::settle_watches`] cancels these.
    extra_watches: Vec<RpcId>,
    /// The lease of a create of my key that was given up without an
    /// answer (its copy resent or canceled, or answered `Unavailable`): it
    /// may still land, after any withdraw, and make my key again on a live
    /// session while no campaign runs — first in line for as long as the
    /// session lives. [`Protocol::settle_doubt`] gives that lease up once
    /// nothing runs on it.
    create_doubt: Option<LeaseId>,
}

fn kvs_of(response: &TxnOpResponse) -> Option<&[KeyValue]> {
    match response {
        TxnOpResponse::Range { kvs } => Some(kvs),
        _ => None,
    }
}

impl Protocol {
    pub(crate) fn new(
        prefix: Vec<u8>,
        backoff: BackoffConfig,
        attempt_timeout: Duration,
        withdraw_limit: Duration,
        now: Instant,
        seed: u64,
        first_id: u64,
    ) -> Self {
        Protocol {
            queue: prefix.clone(),
            rw: None,
            prefix,
            attempt_timeout,
            withdraw_limit,
            resent: 0,
            proclaim_resent: 0,
            session_request: None,
            backoff: Backoff::new(backoff.clone(), seed),
            proclaim_backoff: Backoff::new(backoff.clone(), seed.rotate_left(17) ^ 0x5bd1_e995),
            hand_over_backoff: Backoff::new(backoff, seed.rotate_left(41) ^ 0x2545_f491),
            timers: TimerTable::new(),
            outbox: Outbox::new(first_id),
            session: Session::Down,
            refused: None,
            op: Op::Idle,
            queued: None,
            clock: Clock::new(now),
            permits: 1,
            extra_watches: Vec::new(),
            create_doubt: None,
        }
    }

    /// Lets `permits` candidates hold at once (0 counts as 1). With 1 the
    /// protocol is the election, request for request.
    pub(crate) fn set_permits(&mut self, permits: u32) {
        self.permits = permits.max(1);
    }

    /// Queue as a reader or a writer of the read-write lock whose root is
    /// the prefix (see the module docs); `None` is the election.
    pub(crate) fn set_rw(&mut self, rw: Option<RwRole>) {
        self.rw = rw;
        self.queue = requests::queue_prefix(&self.prefix, rw);
    }

    /// Whether a ranked campaign or a hand-over may run: they order one
    /// leader among candidates of one kind, so a semaphore and a
    /// read-write lock refuse them.
    pub(crate) fn single_kind_leader(&self) -> bool {
        self.permits <= 1 && self.rw.is_none()
    }

    /// Cancels the extra watches of a [`Step::WatchOlders`] that is no
    /// longer the campaign's step (it was withdrawn, requeued, stopped, or
    /// moved on). Called after every input, so no path that ends a
    /// campaign needs to know about them.
    fn settle_watches(&mut self) {
        if self.extra_watches.is_empty() {
            return;
        }
        let current = match &self.op {
            Op::Campaigning(Campaign {
                step: Step::WatchOlders { ids, .. },
                ..
            }) => ids.get(1..).unwrap_or_default().to_vec(),
            _ => Vec::new(),
        };
        if current != self.extra_watches {
            for id in std::mem::take(&mut self.extra_watches) {
                if !current.contains(&id) {
                    self.outbox.cancel(id);
                }
            }
            self.extra_watches = current;
        }
    }

    /// The lease and token of the leadership, while leader as far as the
    /// protocol knows; the session deadline is checked by the wrapper, which
    /// owns the clock of the lease.
    pub(crate) fn leadership(&self) -> Option<(LeaseId, Revision)> {
        match &self.op {
            // A hand-over's deleting txn may already apply: not believed.
            Op::Leading(l) if !ranked::handing_over(l) => Some((l.lease, l.token)),
            _ => None,
        }
    }

    /// The lease of a create of the own key that may still land (see
    /// [`Protocol::settle_doubt`]).
    pub(crate) fn create_doubt(&self) -> Option<LeaseId> {
        self.create_doubt
    }

    /// Stopped for good (the `Stop` request was handled).
    pub(crate) fn is_stopped(&self) -> bool {
        matches!(self.op, Op::Stopped) && self.outbox.is_empty()
    }

    pub(crate) fn poll_command(&mut self) -> Option<Command<ElectionNotice>> {
        self.outbox.pop()
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next().map(|at| self.clock.clamp(at))
    }

    /// What the session must be told since the last call, if anything.
    pub(crate) fn take_session_request(&mut self) -> Option<SessionRequest> {
        self.session_request.take()
    }

    /// Cancels the outstanding request, if there is one.
    fn cancel(&mut self, id: Option<RpcId>) {
        if let Some(id) = id {
            self.outbox.cancel(id);
        }
    }

    /// Sends `request`, the operation's unary request, and arms its
    /// [`Timer::Attempt`].
    fn send_unary(&mut self, request: crate::rpc::Request) -> RpcId {
        self.arm_attempt(Timer::Attempt);
        self.outbox.rpc(request)
    }

    fn arm_attempt(&mut self, timer: Timer) {
        if self.attempt_timeout.is_zero() {
            // Configured off: a request waits for the driver's answer.
            return;
        }
        let resent = match timer {
            Timer::ProclaimAttempt => self.proclaim_resent,
            _ => self.resent,
        };
        let wait = self
            .attempt_timeout
            .saturating_mul(1 << resent.saturating_sub(2).min(4));
        // A wait too long to represent is no timer at all (falling back to
        // `now` would resend at the same instant, forever).
        match self.clock.now().checked_add(wait) {
            Some(at) => self.timers.set(timer, at),
            None => self.timers.stop(timer),
        }
    }

    /// The request of `timer` was answered or given up: no copy is due,
    /// and the next request waits one attempt timeout again.
    fn end_attempt(&mut self, timer: Timer) {
        self.timers.stop(timer);
        match timer {
            Timer::ProclaimAttempt => self.proclaim_resent = 0,
            _ => self.resent = 0,
        }
    }

    fn arm_retry(&mut self) {
        // An absurd configured delay must not panic: fall back to now.
        let now = self.clock.now();
        let at = now.checked_add(self.backoff.next_delay()).unwrap_or(now);
        self.timers.set(Timer::Retry, at);
    }

    // ----- session -------------------------------------------------------

    pub(crate) fn session(&mut self, now: Instant, fact: SessionFact) {
        self.clock.observe(now);
        let previous = self.session.lease();
        self.session = match &fact {
            SessionFact::Up { lease } => Session::Up(*lease),
            SessionFact::Suspended { lease } => Session::Suspended(*lease),
            SessionFact::Lost | SessionFact::Refused(_) => Session::Down,
        };
        let current = self.session.lease();
        if let SessionFact::Refused(error) = fact {
            // Also a campaign still waiting for its first lease, which a
            // loss (there was no lease to lose) would leave waiting forever.
            self.refused = Some(error.clone());
            self.session_ended(ElectionError::Rejected(error));
        } else if previous.is_some() && previous != current {
            // A new lease without a "lost" in between still means the old one is gone.
            self.session_lost();
        }
        let op = std::mem::replace(&mut self.op, Op::Idle);
        self.op = match (self.session, op) {
            (Session::Up(lease), Op::WaitingForSession(w)) => self.start_campaign(w, lease),
            (_, op) => op,
        };
        self.start_queued();
        self.settle_watches();
        self.settle_doubt();
    }

    /// `c`'s request is given up without an answer: if it is a create, it
    /// may still land (see [`Protocol::create_doubt`]).
    fn give_up(&mut self, c: &Campaign) {
        if matches!(c.step, Step::Create) && c.pending.is_some() {
            self.create_doubt = Some(c.lease);
        }
    }

    /// Once nothing runs on the session's lease (idle), a create in doubt
    /// on it is made harmless: the lease is given up (revoked, a new one
    /// granted), and etcd refuses a put on a revoked lease, so the create
    /// can never land. Called after every input, so no path that ends a
    /// campaign, withdraw or leadership needs to know about it. A doubt on
    /// another lease is moot: that lease is gone, and its creates with it.
    fn settle_doubt(&mut self) {
        let Some(lease) = self.create_doubt else {
            return;
        };
        if self.session.lease() != Some(lease) {
            self.create_doubt = None;
            return;
        }
        if matches!(self.op, Op::Idle) && self.session_request.is_none() {
            self.session_request = Some(SessionRequest::Replace(lease));
            self.create_doubt = None;
        }
    }

    /// Starts the campaign that waited for a withdraw, once the machine is
    /// idle again. Its answer follows the withdraw's own notices.
    fn start_queued(&mut self) {
        if matches!(self.op, Op::Idle) {
            if let Some(request) = self.queued.take() {
                let now = self.clock.now();
                self.user(now, request);
            }
        }
    }

    /// The session's lease is gone, and a new one is being granted: a
    /// leadership on it ends, a campaign starts over on the next lease
    /// (its key died with the old one, so nothing is left to withdraw).
    fn session_lost(&mut self) {
        let op = std::mem::replace(&mut self.op, Op::Idle);
        self.op = match op {
            Op::Campaigning(c) => self.requeue(c),
            other => other,
        };
        self.session_ended(ElectionError::SessionLost);
    }

    /// Campaign `c` waits for the next lease, to join the queue again on it.
    fn requeue(&mut self, c: Campaign) -> Op {
        self.cancel(c.pending);
        self.timers.stop(Timer::Retry);
        self.end_attempt(Timer::Attempt);
        Op::WaitingForSession(Waiting {
            op: c.op,
            value: c.value,
            try_only: c.try_only,
            rank: c.rank,
            attempts: c.attempts,
        })
    }

    /// The session's lease is gone (or will never be): what ran on it ends
    /// with `error`. A campaign still waiting ends only when no lease will
    /// ever come; a lost lease is followed by a new one.
    fn session_ended(&mut self, error: ElectionError) {
        let op = std::mem::replace(&mut self.op, Op::Idle);
        self.op = match op {
            Op::WaitingForSession(w) if error != ElectionError::SessionLost => {
                self.outbox
                    .notify(ElectionNotice::CampaignFailed { op: w.op, error });
                Op::Idle
            }
            Op::Campaigning(c) => {
                // The key dies with the lease.
                self.cancel(c.pending);
                self.timers.stop(Timer::Retry);
                self.end_attempt(Timer::Attempt);
                self.outbox
                    .notify(ElectionNotice::CampaignFailed { op: c.op, error });
                Op::Idle
            }
            Op::Leading(l) => {
                self.lose_leadership(l, error);
                Op::Idle
            }
            Op::Withdrawing(w) => {
                // The key dies with the lease; nothing is left to delete.
                self.cancel(w.pending);
                self.timers.stop(Timer::Retry);
                self.timers.stop(Timer::WithdrawLimit);
                self.end_attempt(Timer::Attempt);
                for n in w.then {
                    self.outbox.notify(n);
                }
                Op::Idle
            }
            other => other,
        };
    }

    fn lose_leadership(&mut self, mut l: Leading, proclaim_error: ElectionError) {
        match l.guard {
            Guard::Watching(id) | Guard::Checking(id) => self.cancel(Some(id)),
            Guard::Waiting => {}
        }
        let hand_over = self.end_ranked(&mut l);
        self.timers.stop(Timer::Retry);
        self.end_attempt(Timer::Attempt);
        self.timers.stop(Timer::ProclaimRetry);
        self.end_attempt(Timer::ProclaimAttempt);
        // Belief's end first, then the answers it decides: a user woken by
        // `HandOverFailed { NotLeader }` (or `ProclaimFailed`) finds the
        // leadership already over (documented on `HandOverFailed`).
        self.outbox
            .notify(ElectionNotice::LeadershipLost { token: l.token });
        if let Some(op) = hand_over {
            self.outbox.notify(ElectionNotice::HandOverFailed {
                op,
                error: ElectionError::NotLeader,
            });
        }
        if let Some(p) = l.proclaim {
            self.cancel(p.pending);
            self.outbox.notify(ElectionNotice::ProclaimFailed {
                op: p.op,
                error: proclaim_error,
            });
        }
    }

    /// Ends the leadership `l` at the user's request: belief ends now, the
    /// key is deleted (guarded by its token), then `Resigned { token }`.
    fn resign(&mut self, mut l: Leading) -> Op {
        match l.guard {
            Guard::Watching(id) | Guard::Checking(id) => self.cancel(Some(id)),
            Guard::Waiting => {}
        }
        let side = l.ranks.as_ref().map(|r| r.side_key.clone());
        if let Some(op) = self.end_ranked(&mut l) {
            self.outbox.notify(ElectionNotice::HandOverFailed {
                op,
                error: ElectionError::NotLeader,
            });
        }
        self.timers.stop(Timer::Retry);
        self.end_attempt(Timer::Attempt);
        self.timers.stop(Timer::ProclaimRetry);
        self.end_attempt(Timer::ProclaimAttempt);
        if let Some(p) = l.proclaim {
            self.cancel(p.pending);
            self.outbox.notify(ElectionNotice::ProclaimFailed {
                op: p.op,
                error: ElectionError::NotLeader,
            });
        }
        self.backoff.reset();
        self.start_withdraw(Withdraw {
            key: l.key,
            side,
            token: Some(l.token),
            pending: None,
            then: vec![ElectionNotice::Resigned { token: l.token }],
        })
    }

    /// Leave the queue: stop waiting and delete my key (if it may exist),
    /// then tell the user `then`.
    fn abandon(&mut self, c: Campaign, then: Vec<ElectionNotice>) -> Op {
        self.give_up(&c);
        self.cancel(c.pending);
        self.timers.stop(Timer::Retry);
        self.end_attempt(Timer::Attempt);
        let token = (c.token != 0).then_some(c.token);
        self.backoff.reset();
        let side = c
            .rank
            .map(|_| requests::priority_key(&self.prefix, c.lease));
        self.start_withdraw(Withdraw {
            key: c.key,
            side,
            token,
            pending: None,
            then,
        })
    }

    /// Begin withdrawing my key: the first delete, and the limit after which
    /// the session is given up instead ([`Timer::WithdrawLimit`]).
    fn start_withdraw(&mut self, w: Withdraw) -> Op {
        let now = self.clock.now();
        match now.checked_add(self.withdraw_limit) {
            Some(at) => self.timers.set(Timer::WithdrawLimit, at),
            None => self.timers.stop(Timer::WithdrawLimit),
        }
        self.send_withdraw(w)
    }

    fn send_withdraw(&mut self, mut w: Withdraw) -> Op {
        let request = match (&w.side, w.token) {
            // Whether my create landed, and at which revision, is unknown:
            // read my key, then delete only the incarnation found. A delete
            // of the key whatever its revision, held up somewhere (a paused
            // member that received it), can land after my next campaign
            // created the key again, and delete that one while it leads.
            (_, None) => requests::read_key(&w.key),
            (Some(side), Some(token)) => requests::withdraw_ranked(&w.key, token, side),
            (None, Some(token)) => requests::guarded_delete(&w.key, token),
        };
        w.pending = Some(self.send_unary(request));
        Op::Withdrawing(w)
    }

    /// Join the queue on the session's `lease`.
    fn start_campaign(&mut self, w: Waiting, lease: LeaseId) -> Op {
        self.send_step(Campaign {
            op: w.op,
            value: w.value,
            try_only: w.try_only,
            rank: w.rank,
            lease,
            key: requests::own_key(&self.prefix, self.rw, lease),
            token: 0,
            waited: false,
            attempts: w.attempts.saturating_add(1),
            step: Step::Create,
            pending: None,
        })
    }

    fn send_step(&mut self, mut c: Campaign) -> Op {
        if self.permits > 1 {
            if let Some(op) = self.send_step_n(&mut c) {
                return op;
            }
        }
        let request = match (&c.step, c.rank.filter(|_| !c.try_only)) {
            (Step::Create, Some(rank)) => {
                requests::create_ranked(&self.prefix, &c.key, &c.value, c.lease, rank.priority)
            }
            (Step::FindOlder, Some(_)) => requests::ranked_read(&self.prefix),
            // A ranked waiter watches the whole prefix: see `campaign_reply`.
            (Step::WatchOlder { from, .. }, Some(_)) => requests::watch_prefix(&self.prefix, *from),
            (Step::Bump { oldest, victims }, _) => {
                requests::bump(&self.prefix, (&oldest.0, oldest.1), victims)
            }
            (Step::Create, None) if c.try_only => {
                requests::try_create(&self.queue, &c.key, &c.value, c.lease)
            }
            (Step::Create, None) => requests::create(&self.queue, &c.key, &c.value, c.lease),
            (Step::FixValue, _) => requests::guarded_put(&c.key, &c.value, c.lease, c.token),
            (Step::FindOlder, None) => requests::older_and_mine(&self.queue, &c.key, c.token),
            // The prefix holds the queue and my key (a reader's key lies
            // outside its queue, beside it under the lock's root).
            (
                Step::WatchOlder {
                    from, only: true, ..
                },
                None,
            ) => requests::watch_prefix(&self.prefix, *from),
            (Step::WatchOlder { key, from, .. }, None) => requests::watch_key(key, *from),
            // Sent by `send_step_n`.
            (Step::WatchOlders { keys, from, .. }, _) => match keys.first() {
                Some(key) => requests::watch_key(key, *from),
                None => requests::older_and_mine(&self.prefix, &c.key, c.token),
            },
        };
        c.pending = Some(if matches!(c.step, Step::WatchOlder { .. }) {
            // A watch is answered when something happens, not in time.
            self.end_attempt(Timer::Attempt);
            self.outbox.rpc(request)
        } else {
            self.send_unary(request)
        });
        Op::Campaigning(c)
    }

    /// Sends the guarded put of `l`'s proclaim (its value, my key, lease and
    /// token) and arms its attempt timer.
    fn send_proclaim(&mut self, l: &mut Leading) {
        let Some(p) = l.proclaim.as_mut() else { return };
        let put = requests::guarded_put(&l.key, &p.value, l.lease, l.token);
        p.pending = Some(self.outbox.rpc(put));
        self.arm_attempt(Timer::ProclaimAttempt);
    }

    // ----- timers ----------------------------------------------------------

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        while let Some(timer) = self.timers.pop_expired(now) {
            let op = std::mem::replace(&mut self.op, Op::Idle);
            self.op = match (timer, op) {
                (Timer::Retry, Op::Campaigning(c)) if c.pending.is_none() => self.send_step(c),
                (Timer::Retry, Op::Withdrawing(w)) if w.pending.is_none() => self.send_withdraw(w),
                (Timer::Retry, Op::Leading(mut l)) if matches!(l.guard, Guard::Waiting) => {
                    l.guard = Guard::Checking(self.send_unary(requests::read_key(&l.key)));
                    Op::Leading(l)
                }
                // Unanswered for an attempt timeout: the same request again
                // (see `Timer::Attempt`); the first copy is given up.
                (Timer::Attempt, Op::Campaigning(c))
                    if c.pending.is_some() && !matches!(c.step, Step::WatchOlder { .. }) =>
                {
                    self.give_up(&c);
                    self.cancel(c.pending);
                    self.resent = self.resent.saturating_add(1);
                    self.send_step(c)
                }
                (Timer::WithdrawLimit, Op::Withdrawing(w)) => {
                    // The session's loss ends the withdraw (`session_ended`).
                    if let Some(lease) = self.session.lease() {
                        self.session_request = Some(SessionRequest::Replace(lease));
                    }
                    Op::Withdrawing(w)
                }
                (Timer::Attempt, Op::Withdrawing(w)) if w.pending.is_some() => {
                    self.cancel(w.pending);
                    self.resent = self.resent.saturating_add(1);
                    self.send_withdraw(w)
                }
                (Timer::Attempt, Op::Leading(mut l)) => {
                    if let Guard::Checking(id) = l.guard {
                        self.cancel(Some(id));
                        self.resent = self.resent.saturating_add(1);
                        l.guard = Guard::Checking(self.send_unary(requests::read_key(&l.key)));
                    }
                    Op::Leading(l)
                }
                (
                    Timer::RankRetry | Timer::HandOverRetry | Timer::HandOverAttempt,
                    Op::Leading(l),
                ) => self.ranked_timeout(timer, l),
                (Timer::ProclaimAttempt, Op::Leading(mut l)) => {
                    if let Some(id) = l.proclaim.as_mut().and_then(|p| p.pending.take()) {
                        self.outbox.cancel(id);
                        self.proclaim_resent = self.proclaim_resent.saturating_add(1);
                        self.send_proclaim(&mut l);
                    }
                    Op::Leading(l)
                }
                (Timer::ProclaimRetry, Op::Leading(mut l)) => {
                    if l.proclaim.as_ref().is_some_and(|p| p.pending.is_none()) {
                        self.send_proclaim(&mut l);
                    }
                    Op::Leading(l)
                }
                // A stale timer: unreachable today, as whatever ends the
                // state that armed one also stops it (`abandon`, `resign`,
                // `lose_leadership`, `session_ended`, `stop`).
                (_, op) => op,
            };
        }
        self.start_queued();
        self.settle_watches();
        self.settle_doubt();
    }

    // ----- replies ---------------------------------------------------------

    pub(crate) fn reply(&mut self, now: Instant, reply: RpcReply) {
        self.clock.observe(now);
        let op = std::mem::replace(&mut self.op, Op::Idle);
        self.op = match op {
            Op::Campaigning(c) if Self::watches_older(&c, reply.id) => {
                self.watch_older_reply(c, reply.result)
            }
            Op::Campaigning(c) if c.pending == Some(reply.id) => {
                self.end_attempt(Timer::Attempt);
                self.campaign_reply(c, reply.result)
            }
            Op::Withdrawing(w) if w.pending == Some(reply.id) => {
                self.end_attempt(Timer::Attempt);
                self.withdraw_reply(w, reply.result)
            }
            Op::Leading(l) => self.leading_reply(l, reply),
            other => other,
        };
        self.start_queued();
        self.settle_watches();
        self.settle_doubt();
    }

    fn fail_campaign(&mut self, c: Campaign, error: ElectionError) -> Op {
        // Leave no key behind to block the others, then tell the user.
        let then = vec![ElectionNotice::CampaignFailed { op: c.op, error }];
        self.abandon(Campaign { pending: None, ..c }, then)
    }

    fn retry_step(&mut self, mut c: Campaign) -> Op {
        c.pending = None;
        self.arm_retry();
        Op::Campaigning(c)
    }

    fn campaign_reply(&mut self, mut c: Campaign, result: Result<Response, RpcError>) -> Op {
        let response = match result {
            Ok(r) => r,
            // The session's lease is gone (etcd expired it, say, while a
            // raft leader change held up its renewals); the session learns
            // it from the wrapper, and the campaign goes on with the next
            // lease instead of failing, or retrying on the dead lease until
            // the session notices by itself.
            Err(RpcError::LeaseNotFound) => {
                self.session_request = Some(SessionRequest::Gone(c.lease));
                // Answered: nothing to cancel.
                return self.requeue(Campaign { pending: None, ..c });
            }
            Err(e) if !e.is_retryable() => {
                if matches!(c.step, Step::WatchOlder { .. }) {
                    return self.restart_wait(c);
                }
                return self.fail_campaign(c, ElectionError::Rejected(e));
            }
            Err(_) => {
                if matches!(c.step, Step::WatchOlder { .. }) {
                    return self.restart_wait(c);
                }
                // Unavailable: the request may have been applied, or may
                // still be.
                self.give_up(&c);
                return self.retry_step(c);
            }
        };
        if c.rank.is_some()
            && !c.try_only
            && matches!(c.step, Step::Create | Step::FindOlder | Step::Bump { .. })
        {
            return self.ranked_reply(c, response);
        }
        match c.step.clone() {
            // Only ranked campaigns bump, answered above.
            Step::Bump { .. } => self.retry_step(c),
            Step::Create => self.created(c, response),
            Step::FixValue => match response {
                Response::Txn {
                    succeeded: true,
                    revision,
                    ..
                } => {
                    self.backoff.reset();
                    if c.try_only {
                        self.elect(c, revision)
                    } else {
                        c.step = Step::FindOlder;
                        self.send_step(c)
                    }
                }
                Response::Txn {
                    succeeded: false, ..
                } => {
                    // My key vanished between the reads: join the queue again.
                    c.token = 0;
                    c.step = Step::Create;
                    self.send_step(c)
                }
                _ => self.retry_step(c),
            },
            Step::FindOlder => {
                let Response::Txn {
                    revision,
                    responses,
                    ..
                } = response
                else {
                    return self.retry_step(c);
                };
                let (Some(older), Some(mine)) = (
                    responses.first().and_then(kvs_of),
                    responses.get(1).and_then(kvs_of),
                ) else {
                    return self.retry_step(c);
                };
                self.backoff.reset();
                if !mine
                    .iter()
                    .any(|kv| kv.key == c.key && kv.create_revision == c.token)
                {
                    // Gone while we waited (etcd #19597): queue up again, never claim.
                    c.token = 0;
                    c.attempts = c.attempts.saturating_add(1);
                    c.step = Step::Create;
                    return self.send_step(c);
                }
                if self.permits > 1 {
                    let limit = requests::older_limit_n(self.permits);
                    return self.wait_or_hold(c, revision, older, limit);
                }
                self.wait_or_elect(c, revision, older, requests::OLDER_LIMIT)
            }
            Step::WatchOlder {
                key, from, only, ..
            } => match response {
                Response::WatchEvents { events } => {
                    let mine_changed = events.iter().any(|e| {
                        e.kv.key == c.key
                            && (e.kind == EventKind::Delete || e.kv.create_revision != c.token)
                    });
                    let gone = events
                        .iter()
                        .find(|e| e.kind == EventKind::Delete && e.kv.key == key)
                        .map(|e| e.kv.mod_revision);
                    // A ranked waiter watches the whole prefix, so that a
                    // bump of its own key is seen at once.
                    let whole_prefix = only || c.rank.is_some();
                    match (only, mine_changed, gone) {
                        // My key changed (only seen on the prefix watch):
                        // the read finds out how, and never claims.
                        (_, true, _) if whole_prefix => self.read_again(c),
                        // Every event up to the delete's revision has
                        // arrived and none touched my key: at that
                        // revision my key is the one the read saw, and
                        // nothing older is left.
                        (true, false, Some(at)) if at >= from => {
                            self.cancel(c.pending);
                            self.elect(c, at)
                        }
                        (_, _, Some(_)) => self.read_again(c),
                        (_, _, None) => Op::Campaigning(c),
                    }
                }
                _ => self.restart_wait(c),
            },
            // Its replies go to `watch_older_reply`.
            Step::WatchOlders { .. } => Op::Campaigning(c),
        }
    }

    /// Stop watching and read who is ahead of me (and my key) again.
    fn read_again(&mut self, mut c: Campaign) -> Op {
        self.cancel(c.pending);
        c.step = Step::FindOlder;
        self.send_step(c)
    }

    /// The watch on an older key broke: read again after a pause, since the
    /// key may have gone while nobody watched.
    fn restart_wait(&mut self, mut c: Campaign) -> Op {
        self.cancel(c.pending);
        c.step = Step::FindOlder;
        self.retry_step(c)
    }

    /// The answer to [`requests::create`] / [`requests::try_create`]: my
    /// key (created now, or found from an earlier attempt) and, in the same
    /// revision, who is ahead of it.
    fn created(&mut self, mut c: Campaign, response: Response) -> Op {
        let Response::Txn {
            revision,
            succeeded,
            responses,
        } = response
        else {
            return self.retry_step(c);
        };
        let existing = if succeeded {
            None
        } else {
            match responses
                .first()
                .and_then(kvs_of)
                .and_then(|kvs| kvs.first())
            {
                Some(kv) => Some(kv.clone()),
                None => return self.retry_step(c),
            }
        };
        let token = match &existing {
            Some(kv) => kv.create_revision,
            None => revision,
        };
        let Some(ahead) = responses.get(1).and_then(kvs_of) else {
            return self.retry_step(c);
        };
        if token <= 0 {
            return self.retry_step(c);
        }
        c.token = token;
        self.backoff.reset();
        if succeeded && !c.try_only {
            if self.permits > 1 {
                let limit = requests::newest_limit_n(self.permits);
                return self.wait_or_hold(c, revision, ahead, limit);
            }
            // The newest two at my create's revision: mine, then (if any)
            // the one just ahead of me.
            return self.wait_or_elect(c, revision, ahead, requests::NEWEST_LIMIT);
        }
        // The first-created key, read in the revision my key was seen in.
        let first = ahead.first().cloned();
        // With `permits` holders the read has the oldest `permits` keys of
        // the queue: fewer than `permits` of them older than mine means
        // fewer than `permits` are older at all (mine among them, or, for
        // a reader, whose key is not in its queue of writers, newer keys
        // among them). With one permit: the first key is mine, or (a
        // reader) no writer is older.
        let permits = usize::try_from(self.permits).unwrap_or(usize::MAX);
        let older = ahead
            .iter()
            .take(permits)
            .filter(|kv| kv.create_revision < c.token && kv.key != c.key)
            .count();
        let first_is_mine = older < permits;
        if c.try_only && !first_is_mine {
            let then = vec![ElectionNotice::NotElected {
                op: c.op,
                leader: first,
            }];
            return self.start_withdraw(Withdraw {
                key: c.key,
                side: None,
                token: Some(c.token),
                pending: None,
                then,
            });
        }
        let stale_value = existing.as_ref().is_some_and(|kv| kv.value != c.value);
        if stale_value {
            c.step = Step::FixValue;
            return self.send_step(c);
        }
        if first_is_mine {
            return self.elect(c, revision);
        }
        c.step = Step::FindOlder;
        self.send_step(c)
    }

    /// `read` is what a range with `limit` at `revision` found among the
    /// newest keys (those older than mine are what count), my key existing
    /// with my token at that revision: wait for the newest older one to
    /// go, or lead if there is none.
    fn wait_or_elect(
        &mut self,
        mut c: Campaign,
        revision: Revision,
        read: &[KeyValue],
        limit: i64,
    ) -> Op {
        let mut older = read
            .iter()
            .filter(|kv| kv.create_revision < c.token && kv.key != c.key);
        let Some(newest_older) = older.next() else {
            return self.elect(c, revision);
        };
        // A full answer may have left older keys out; a short one did not.
        let complete = i64::try_from(read.len()).is_ok_and(|n| n < limit);
        c.waited = true;
        c.step = Step::WatchOlder {
            key: newest_older.key.clone(),
            from: revision.saturating_add(1),
            only: complete && older.next().is_none(),
        };
        self.send_step(c)
    }

    /// My key exists with my revision as of `revision` and nothing older
    /// remains: no later key can get ahead of it, so I lead until it goes.
    fn elect(&mut self, c: Campaign, revision: Revision) -> Op {
        // Unreachable today (`session` fails every campaign once its lease
        // changes or goes); kept so that no future path can report
        // `Elected` for a key whose lease this machine no longer holds.
        if self.session.lease() != Some(c.lease) {
            self.outbox.notify(ElectionNotice::CampaignFailed {
                op: c.op,
                error: ElectionError::SessionLost,
            });
            return Op::Idle;
        }
        self.outbox.notify(ElectionNotice::Elected {
            op: c.op,
            key: c.key.clone(),
            token: c.token,
            lease: c.lease,
            waited: c.waited,
            attempts: c.attempts,
            // The protocol does not own the lease's clock: it trusts
            // nothing past now, and the wrapper, which does, moves this to
            // the session's local deadline before the notice leaves.
            trusted_until: self.clock.now(),
        });
        let rank = c.rank.filter(|_| !c.try_only);
        let watch = self
            .outbox
            .rpc(requests::watch_key(&c.key, revision.saturating_add(1)));
        let mut l = Leading {
            op: c.op,
            key: c.key,
            lease: c.lease,
            token: c.token,
            guard: Guard::Watching(watch),
            proclaim: None,
            ranks: None,
            hand_over: None,
        };
        if let Some(rank) = rank {
            self.start_ranks(&mut l, rank);
        }
        Op::Leading(l)
    }

    fn withdraw_reply(&mut self, mut w: Withdraw, result: Result<Response, RpcError>) -> Op {
        if w.token.is_none() {
            if let Ok(Response::Range { kvs, .. }) = &result {
                let found = kvs
                    .iter()
                    .find(|kv| kv.key == w.key)
                    .map(|kv| kv.create_revision);
                match (found, &w.side) {
                    (Some(token), _) => w.token = Some(token),
                    // No key: only the priority key may be left, and the
                    // guard "my key does not exist" keeps a key that a late
                    // create made from being deleted unguarded.
                    (None, Some(_)) => w.token = Some(0),
                    (None, None) => {
                        self.timers.stop(Timer::WithdrawLimit);
                        for n in w.then {
                            self.outbox.notify(n);
                        }
                        return Op::Idle;
                    }
                }
                return self.send_withdraw(w);
            }
        }
        let done = match &result {
            // Either way my key of that revision is gone (a failed guard means it already was).
            Ok(Response::Txn { .. }) | Ok(Response::Deleted { .. }) => true,
            // Resending would fail the same way: give up on the withdraw,
            // and on the session, whose lease would keep the key queued.
            Err(e) if !e.is_retryable() => {
                if let Some(lease) = self.session.lease() {
                    self.session_request = Some(SessionRequest::Replace(lease));
                }
                true
            }
            Err(_) => false,
            Ok(_) => false,
        };
        if done {
            self.timers.stop(Timer::WithdrawLimit);
            for n in w.then {
                self.outbox.notify(n);
            }
            Op::Idle
        } else {
            w.pending = None;
            self.arm_retry();
            Op::Withdrawing(w)
        }
    }

    fn leading_reply(&mut self, mut l: Leading, reply: RpcReply) -> Op {
        if ranked::answers(&l, reply.id) {
            return self.ranked_leading_reply(l, reply);
        }
        let answered = l
            .proclaim
            .as_ref()
            .filter(|p| p.pending == Some(reply.id))
            .map(|p| p.op);
        if let Some(op) = answered {
            self.end_attempt(Timer::ProclaimAttempt);
            return match reply.result {
                Ok(Response::Txn {
                    succeeded: true, ..
                }) => {
                    l.proclaim = None;
                    self.outbox.notify(ElectionNotice::Proclaimed { op });
                    Op::Leading(l)
                }
                Ok(Response::Txn {
                    succeeded: false, ..
                }) => {
                    l.proclaim = None;
                    self.outbox.notify(ElectionNotice::ProclaimFailed {
                        op,
                        error: ElectionError::NotLeader,
                    });
                    self.lose_leadership(l, ElectionError::NotLeader);
                    Op::Idle
                }
                // The lease, and with it my key, is gone: so is the
                // leadership, whatever the session has noticed so far.
                Err(RpcError::LeaseNotFound) => {
                    l.proclaim = None;
                    self.session_request = Some(SessionRequest::Gone(l.lease));
                    self.outbox.notify(ElectionNotice::ProclaimFailed {
                        op,
                        error: ElectionError::NotLeader,
                    });
                    self.lose_leadership(l, ElectionError::NotLeader);
                    Op::Idle
                }
                Err(e) if !e.is_retryable() => {
                    l.proclaim = None;
                    self.outbox.notify(ElectionNotice::ProclaimFailed {
                        op,
                        error: ElectionError::Rejected(e),
                    });
                    Op::Leading(l)
                }
                _ => {
                    if let Some(p) = l.proclaim.as_mut() {
                        p.pending = None;
                    }
                    let now = self.clock.now();
                    let at = now
                        .checked_add(self.proclaim_backoff.next_delay())
                        .unwrap_or(now);
                    self.timers.set(Timer::ProclaimRetry, at);
                    Op::Leading(l)
                }
            };
        }
        match l.guard.clone() {
            Guard::Watching(id) if id == reply.id => match reply.result {
                Ok(Response::WatchEvents { events }) => {
                    let gone = events.iter().any(|e| {
                        e.kv.key == l.key
                            && (e.kind == EventKind::Delete || e.kv.create_revision != l.token)
                    });
                    if gone && ranked::handing_over(&l) {
                        // Most likely the hand-over's own delete, whose
                        // answer is still on its way: that answer says
                        // how the leadership ended (belief already has).
                        self.cancel(Some(id));
                        l.guard = Guard::Waiting;
                        Op::Leading(l)
                    } else if gone {
                        self.lose_leadership(l, ElectionError::NotLeader);
                        Op::Idle
                    } else {
                        Op::Leading(l)
                    }
                }
                _ => {
                    self.cancel(Some(id));
                    l.guard = Guard::Waiting;
                    self.arm_retry();
                    Op::Leading(l)
                }
            },
            Guard::Checking(id) if id == reply.id => match reply.result {
                Ok(Response::Range { revision, kvs }) => {
                    self.end_attempt(Timer::Attempt);
                    self.backoff.reset();
                    if kvs
                        .iter()
                        .any(|kv| kv.key == l.key && kv.create_revision == l.token)
                    {
                        l.guard = Guard::Watching(
                            self.outbox
                                .rpc(requests::watch_key(&l.key, revision.saturating_add(1))),
                        );
                        Op::Leading(l)
                    } else {
                        // The read is answered: nothing to cancel.
                        l.guard = Guard::Waiting;
                        self.lose_leadership(l, ElectionError::NotLeader);
                        Op::Idle
                    }
                }
                _ => {
                    self.end_attempt(Timer::Attempt);
                    l.guard = Guard::Waiting;
                    self.arm_retry();
                    Op::Leading(l)
                }
            },
            _ => Op::Leading(l),
        }
    }
}
