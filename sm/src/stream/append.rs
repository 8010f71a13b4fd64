//! The append machine: head-guarded transactions, retried with backoff.

use super::requests::{self, Resent};
use super::{Head, StreamError, StreamKeys};
use crate::backoff::{Backoff, BackoffConfig};
use crate::clock::Clock;
use crate::outbox::Outbox;
use crate::rpc::{Command, Response, Revision, RpcError, RpcId, RpcReply, TxnOpResponse};
use crate::timer::TimerTable;
use crate::Machine;
use std::collections::VecDeque;
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

/// How an [`Append`] machine appends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendConfig {
    /// The stream's keys.
    pub keys: StreamKeys,
    /// Keep only the newest `n` entries: each append deletes the entry that
    /// falls out. `None` keeps everything.
    pub max_len: Option<NonZeroU64>,
    /// Delays between attempts that lost the race for the head.
    pub backoff: BackoffConfig,
    /// Transactions tried per append before it fails with
    /// [`StreamError::Contended`]; 0 counts as 1. Resends of a transaction
    /// whose answer was lost are counted apart, against the same bound:
    /// past it the append fails with [`StreamError::Indeterminate`].
    pub max_attempts: u32,
    /// No retry starts later than this after the append began: a lost race
    /// whose backoff would end beyond it fails the append with
    /// [`StreamError::Contended`]. With each request bounded by the driver,
    /// this bounds how long one append takes, however slow etcd answers.
    pub patience: Duration,
    /// The head as an earlier append left it ([`AppendNotice::Appended`]
    /// says which), if the caller kept it. The first attempt then trusts it
    /// and skips the head read: one round trip while it is current. A stale
    /// one costs a failed transaction, whose answer carries the current
    /// head, so never more round trips than reading first. `None` reads the
    /// head first. It must be a head etcd showed, as a pair: the guard
    /// compares only the mod revision, so a real revision with a made-up
    /// `seq` would write the entry under the wrong ID.
    pub head: Option<Head>,
    /// At most this many queued appends go into one transaction (0 counts
    /// as 1); never more than `max_len`.
    pub max_group: usize,
    /// Payload bytes one transaction carries at most, unless its first
    /// payload alone is larger (it then goes alone). Keeps a group within
    /// etcd's request limit (1.5 MiB by default).
    pub max_group_bytes: usize,
}

impl AppendConfig {
    /// Appends to `keys` with the defaults: no trimming, retries for up to
    /// 10 s (at most 1,024 attempts), backoff from 1 ms doubling to 100 ms
    /// with full jitter, up to 32 appends and 1 MiB of payload per
    /// transaction.
    ///
    /// The loser of a race knows the winner is done, so the first retry is
    /// almost immediate; full jitter spreads a crowd of appenders over the
    /// whole delay instead of re-colliding in lockstep; the cap keeps one
    /// append's latency in the tens of milliseconds under ordinary
    /// contention. The patience, not the count, is what bounds an append:
    /// 64 attempts (about three seconds of delays) absorbed dozens of
    /// appenders writing one stream in tight loops on a local etcd (32 such
    /// appenders never failed an append, 64 failed about one in six
    /// thousand), but a slow client (the library's etcd suites under
    /// qemu-user, `make qemu-lib`) lost 64 races in a row against three
    /// faster ones while they all still made progress. 1,024 attempts take
    /// longer than 10 s of capped delays, so the 10 s decide; past them the
    /// stream is over capacity, and an error says so better than an
    /// unbounded wait.
    ///
    /// Appends queued on one machine while a transaction is in flight go
    /// together in the next one, so writers sharing a machine never race
    /// each other; 32 entries (65 operations) stay well under etcd's
    /// default of 128 operations per transaction.
    pub fn new(keys: StreamKeys) -> Self {
        AppendConfig {
            keys,
            max_len: None,
            backoff: BackoffConfig {
                initial: Duration::from_millis(1),
                max: Duration::from_millis(100),
                multiplier: 2,
                jitter_percent: 100,
            },
            max_attempts: 1024,
            patience: Duration::from_secs(10),
            head: None,
            max_group: 32,
            max_group_bytes: 1024 * 1024,
        }
    }
}

/// Inputs of [`Append`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum AppendInput {
    /// The reply to one of the machine's requests (others are ignored).
    Rpc(RpcReply),
    /// Append this payload. Appends are answered in the order asked, each
    /// by exactly one notice. Appends queued while a transaction is in
    /// flight go together in the next transaction (up to the configured
    /// group size): they get consecutive IDs and one outcome.
    Append(Vec<u8>),
    /// Cancel everything: the running and the queued appends fail; the
    /// machine issues nothing afterwards and answers later appends with
    /// [`StreamError::Stopped`].
    Stop,
}

impl From<RpcReply> for AppendInput {
    fn from(reply: RpcReply) -> Self {
        AppendInput::Rpc(reply)
    }
}

/// The outcome of one append, in the order the appends were asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AppendNotice {
    /// The entry is written with this sequence number (its ID).
    Appended {
        /// The ID.
        seq: u64,
        /// The revision of the write, which is the head key's new mod
        /// revision. Appends of one group share it; the head the group left,
        /// for the next machine's [`AppendConfig::head`], is
        /// `Head { seq, mod_revision: revision }` of the highest `seq` with
        /// this revision (any other pair would name a head etcd never held).
        revision: Revision,
    },
    /// The append failed; the error says whether anything may be written.
    Failed(StreamError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// Backoff after a lost race or a lost answer, before trying again.
    Retry,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing to do.
    Idle,
    /// The head read of the current append is outstanding.
    ReadingHead(RpcId),
    /// The transaction guarded on `guard` that would give the current
    /// append `seq` is outstanding.
    Committing { id: RpcId, seq: u64, guard: Head },
    /// Waiting for [`Timer::Retry`].
    Waiting,
    /// Stopped for good.
    Stopped,
}

/// The append machine: see the [module docs](super).
///
/// At most one request is outstanding at any time. The payloads being
/// appended (the running group) are the front `group` of the queue until
/// their notices are emitted. Each fresh transaction takes in what queued
/// meanwhile (the appends joining share the group's attempts and
/// patience); a resend carries exactly the payloads of the transaction in
/// doubt.
#[derive(Clone, Debug)]
pub struct Append {
    keys: StreamKeys,
    max_len: Option<NonZeroU64>,
    max_attempts: u32,
    patience: Duration,
    backoff: Backoff,
    timers: TimerTable<Timer>,
    outbox: Outbox<AppendNotice>,
    /// Payloads asked for and not yet answered; the front `group` run.
    pending: VecDeque<Vec<u8>>,
    /// How many of `pending` the last transaction sent carries (0: none
    /// sent yet for the running appends).
    group: usize,
    max_group: usize,
    max_group_bytes: usize,
    /// Races the running group has lost.
    lost: u32,
    /// When the running group began.
    started: Instant,
    /// The head as of the last answer that showed it (a read, our own
    /// write, or a lost race's failure branch); the next attempt is guarded
    /// on it without reading first. `None`: read before writing.
    head: Option<Head>,
    /// The running attempt is guarded on a head known from before this
    /// append began: its failure is news about the head, not a lost race.
    on_old_head: bool,
    /// A transaction of the running append whose answer was lost: until it
    /// is settled, every attempt resends it unchanged.
    doubt: Option<Doubt>,
    /// Resends of the transaction in doubt so far.
    resends: u32,
    phase: Phase,
    clock: Clock,
}

/// [`requests::append`] or [`requests::resend`].
type BuildTxn = fn(
    &StreamKeys,
    Head,
    &[Vec<u8>],
    Option<NonZeroU64>,
) -> Result<(u64, crate::rpc::Request), StreamError>;

/// A transaction whose answer was lost, so it may or may not have applied.
#[derive(Clone, Debug)]
struct Doubt {
    /// Its guard: each resend is guarded on it too, so at most one copy
    /// applies.
    guard: Head,
    /// The sequence number its first entry gets.
    seq: u64,
    /// The last failure, for the error if it is never settled.
    error: RpcError,
}

impl Append {
    /// An idle machine; feed [`AppendInput::Append`] to start. Retry jitter
    /// is derived from `seed` alone.
    pub fn new(config: AppendConfig, now: Instant, seed: u64) -> Self {
        Append {
            keys: config.keys,
            max_len: config.max_len,
            max_attempts: config.max_attempts.max(1),
            patience: config.patience,
            backoff: Backoff::new(config.backoff, seed),
            timers: TimerTable::new(),
            outbox: Outbox::default(),
            pending: VecDeque::new(),
            group: 0,
            max_group: config.max_group.max(1),
            max_group_bytes: config.max_group_bytes,
            lost: 0,
            started: now,
            head: config.head,
            on_old_head: false,
            doubt: None,
            resends: 0,
            phase: Phase::Idle,
            clock: Clock::new(now),
        }
    }

    /// Appends asked for and not yet answered, the running one included.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// How many queued appends the next transaction takes: as many as the
    /// group limits allow, at least one.
    fn next_group(&self) -> usize {
        let limit = match self.max_len.map(|max| usize::try_from(max.get())) {
            Some(Ok(max)) => self.max_group.min(max),
            _ => self.max_group,
        };
        let mut bytes = 0usize;
        let mut count = 0usize;
        for payload in self.pending.iter().take(limit) {
            bytes = bytes.saturating_add(payload.len());
            if count > 0 && bytes > self.max_group_bytes {
                break;
            }
            count += 1;
        }
        count
    }

    /// Start the next group of queued appends, if any and if nothing runs.
    fn start_next(&mut self) {
        if self.phase != Phase::Idle || self.pending.is_empty() {
            return;
        }
        self.lost = 0;
        self.resends = 0;
        self.doubt = None;
        self.started = self.clock.now();
        // Each append has its own schedule: an earlier append's lost races
        // say nothing about the contention now.
        self.backoff.reset();
        self.on_old_head = self.head.is_some();
        self.attempt();
    }

    /// Resend the transaction in doubt; else write on the head we know, or
    /// read it first if we know none.
    fn attempt(&mut self) {
        if let Some(guard) = self.doubt.as_ref().map(|d| d.guard) {
            return self.send(guard, requests::resend);
        }
        match self.head {
            Some(head) => self.commit(head),
            None => {
                let id = self.outbox.rpc(requests::read_head(&self.keys));
                self.phase = Phase::ReadingHead(id);
            }
        }
    }

    /// Send the transaction guarded on `head`, for as many queued appends
    /// as fit in one: a first attempt, or one after a failed guard (which
    /// wrote nothing), takes in whatever queued meanwhile. A resend never
    /// comes here; it keeps its group.
    fn commit(&mut self, head: Head) {
        self.group = self.next_group();
        self.send(head, requests::append);
    }

    /// Send the transaction `build` makes for the running group on
    /// `guard`.
    fn send(&mut self, guard: Head, build: BuildTxn) {
        let group = self.group.min(self.pending.len());
        let payloads = &self.pending.make_contiguous()[..group];
        match build(&self.keys, guard, payloads, self.max_len) {
            Ok((seq, request)) => {
                let id = self.outbox.rpc(request);
                self.phase = Phase::Committing { id, seq, guard };
            }
            Err(e) => self.finish(AppendNotice::Failed(e)),
        }
    }

    /// Answer every append of the running group, `notice` being the first
    /// one's answer, and move on to the next group.
    fn finish(&mut self, notice: AppendNotice) {
        self.doubt = None;
        self.answer_group(&notice);
        self.phase = Phase::Idle;
        self.start_next();
    }

    /// The one place a group is answered: its appends share one outcome,
    /// and each is told its own sequence number (the first one's plus its
    /// place in the group).
    fn answer_group(&mut self, first: &AppendNotice) {
        let group = std::mem::take(&mut self.group).clamp(1, self.pending.len().max(1));
        for offset in 0..group {
            if self.pending.pop_front().is_none() {
                break;
            }
            let offset = u64::try_from(offset).unwrap_or(u64::MAX);
            let notice = match first {
                AppendNotice::Appended { seq, revision } => AppendNotice::Appended {
                    seq: seq.saturating_add(offset),
                    revision: *revision,
                },
                AppendNotice::Failed(StreamError::Indeterminate { seq, error }) => {
                    AppendNotice::Failed(StreamError::Indeterminate {
                        seq: seq.saturating_add(offset),
                        error: error.clone(),
                    })
                }
                other => other.clone(),
            };
            self.outbox.notify(notice);
        }
    }

    fn on_head(&mut self, result: Result<Response, RpcError>) {
        let kvs = match result {
            Ok(Response::Range { kvs, .. }) => kvs,
            Ok(other) => {
                return self.finish(AppendNotice::Failed(StreamError::Unexpected(format!(
                    "{other:?} to a head read"
                ))))
            }
            // Nothing was written; the caller decides whether to try again.
            Err(e) => return self.finish(AppendNotice::Failed(StreamError::Rpc(e))),
        };
        match requests::parse_head(&self.keys, &kvs) {
            Ok(head) => {
                self.head = Some(head);
                self.commit(head);
            }
            Err(e) => self.finish(AppendNotice::Failed(e)),
        }
    }

    fn on_commit(
        &mut self,
        now: Instant,
        seq: u64,
        guard: Head,
        result: Result<Response, RpcError>,
    ) {
        let resent = self.doubt.is_some();
        match result {
            Ok(Response::Txn {
                succeeded: true,
                revision,
                ..
            }) => {
                // The transaction wrote the head, at the group's last
                // entry: its mod revision is the write's revision. After a
                // lost answer, a guard that holds proves the lost attempt
                // did not apply.
                let last = u64::try_from(self.group.saturating_sub(1))
                    .ok()
                    .and_then(|more| seq.checked_add(more));
                self.head = last.map(|seq| Head {
                    seq,
                    mod_revision: revision,
                });
                self.finish(AppendNotice::Appended { seq, revision })
            }
            Ok(Response::Txn {
                succeeded: false,
                responses,
                ..
            }) if resent => self.on_resend_failed(now, seq, responses),
            Ok(Response::Txn {
                succeeded: false,
                responses,
                ..
            }) => match requests::head_of_failed_append(&self.keys, responses) {
                Ok(head) => {
                    self.head = head;
                    if std::mem::take(&mut self.on_old_head) {
                        // Someone appended since that head was seen; the
                        // answer shows the current one: try it at once.
                        return self.attempt();
                    }
                    self.lost_race(now)
                }
                Err(e) => self.finish(AppendNotice::Failed(e)),
            },
            // A resend refused for good settles nothing: the lost attempt
            // may still have applied.
            Err(error) if resent && !error.is_retryable() => {
                self.finish(AppendNotice::Failed(StreamError::Indeterminate {
                    seq,
                    error,
                }))
            }
            // etcd refused the transaction: it was not applied.
            Err(e) if !resent && e.is_refusal() => {
                self.head = None;
                self.finish(AppendNotice::Failed(StreamError::Rpc(e)))
            }
            // Anything else may have been applied: send the very same
            // transaction again later, which can apply only if this one did
            // not, and whose answer settles which.
            Err(error) => self.lost_answer(now, guard, seq, error),
            Ok(other) => self.finish(AppendNotice::Failed(StreamError::Unexpected(format!(
                "{other:?} to an append transaction"
            )))),
        }
    }

    /// The transaction guarded on `guard` writing `seq` got no answer:
    /// resend it after the backoff, or give up if that is too late.
    fn lost_answer(&mut self, now: Instant, guard: Head, seq: u64, error: RpcError) {
        self.head = None;
        self.on_old_head = false;
        let delay = self.backoff.next_delay();
        let retry_at = now.checked_add(delay).unwrap_or(now);
        if self.resends >= self.max_attempts || !self.in_time(retry_at) {
            return self.finish(AppendNotice::Failed(StreamError::Indeterminate {
                seq,
                error,
            }));
        }
        self.resends = self.resends.saturating_add(1);
        self.doubt = Some(Doubt { guard, seq, error });
        if delay.is_zero() {
            return self.attempt();
        }
        self.timers.set(Timer::Retry, retry_at);
        self.phase = Phase::Waiting;
    }

    /// A resend's guard failed: its answer shows whether the lost attempt
    /// wrote the group from entry `seq` on.
    fn on_resend_failed(&mut self, now: Instant, seq: u64, responses: Vec<TxnOpResponse>) {
        let group = self.group.min(self.pending.len());
        let payloads = &self.pending.make_contiguous()[..group];
        match requests::resend_outcome(&self.keys, seq, payloads, responses) {
            Ok(Resent::Written { revision, head }) => {
                self.head = head;
                self.finish(AppendNotice::Appended { seq, revision })
            }
            Ok(Resent::Lost { head }) => {
                // Nothing of ours is stored: an ordinary lost race.
                self.doubt = None;
                self.head = head;
                self.lost_race(now)
            }
            Ok(Resent::Unknown) => {
                let error = match self.doubt.take() {
                    Some(doubt) => doubt.error,
                    None => RpcError::Unavailable("the answer to an append was lost".into()),
                };
                self.finish(AppendNotice::Failed(StreamError::Indeterminate {
                    seq,
                    error,
                }))
            }
            Err(e) => self.finish(AppendNotice::Failed(e)),
        }
    }

    /// Whether a retry at `at` still starts within the patience. An absurd
    /// configured patience must not panic: it means "no time limit".
    fn in_time(&self, at: Instant) -> bool {
        self.started
            .checked_add(self.patience)
            .is_none_or(|limit| at <= limit)
    }

    fn lost_race(&mut self, now: Instant) {
        self.lost = self.lost.saturating_add(1);
        let delay = self.backoff.next_delay();
        // An absurd configured delay must not panic: it means "retry at
        // once".
        let retry_at = now.checked_add(delay).unwrap_or(now);
        if self.lost >= self.max_attempts || !self.in_time(retry_at) {
            let attempts = self.lost;
            return self.finish(AppendNotice::Failed(StreamError::Contended { attempts }));
        }
        if delay.is_zero() {
            return self.attempt();
        }
        self.timers.set(Timer::Retry, retry_at);
        self.phase = Phase::Waiting;
    }

    fn on_reply(&mut self, now: Instant, reply: RpcReply) {
        match self.phase {
            Phase::ReadingHead(id) if id == reply.id => self.on_head(reply.result),
            Phase::Committing { id, seq, guard } if id == reply.id => {
                self.on_commit(now, seq, guard, reply.result)
            }
            _ => {}
        }
    }

    fn stop(&mut self) {
        let running = match self.phase {
            Phase::ReadingHead(id) => {
                self.outbox.cancel(id);
                StreamError::Stopped
            }
            Phase::Committing { id, seq, .. } => {
                self.outbox.cancel(id);
                StreamError::Indeterminate {
                    seq,
                    error: RpcError::Unavailable(
                        "stopped while the append transaction was in flight".into(),
                    ),
                }
            }
            Phase::Idle | Phase::Waiting | Phase::Stopped => match self.doubt.take() {
                // Waiting to resend a transaction whose answer was lost.
                Some(Doubt { seq, error, .. }) => StreamError::Indeterminate { seq, error },
                None => StreamError::Stopped,
            },
        };
        self.timers.clear();
        self.phase = Phase::Stopped;
        if !self.pending.is_empty() {
            self.answer_group(&AppendNotice::Failed(running));
        }
        for _ in self.pending.drain(..) {
            self.outbox
                .notify(AppendNotice::Failed(StreamError::Stopped));
        }
    }
}

impl Machine for Append {
    type Input = AppendInput;
    type Notice = AppendNotice;

    fn handle(&mut self, now: Instant, input: AppendInput) {
        self.clock.observe(now);
        match input {
            AppendInput::Append(_) if self.phase == Phase::Stopped => {
                self.outbox
                    .notify(AppendNotice::Failed(StreamError::Stopped));
            }
            AppendInput::Append(payload) => {
                self.pending.push_back(payload);
                self.start_next();
            }
            AppendInput::Rpc(reply) => self.on_reply(now, reply),
            AppendInput::Stop => {
                if self.phase != Phase::Stopped {
                    self.stop();
                }
            }
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.clock.observe(now);
        while let Some(timer) = self.timers.pop_expired(now) {
            match timer {
                Timer::Retry => {
                    if self.phase == Phase::Waiting {
                        self.attempt();
                    }
                }
            }
        }
    }

    fn poll_command(&mut self) -> Option<Command<AppendNotice>> {
        self.outbox.pop()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next().map(|at| self.clock.clamp(at))
    }

    fn stop_input() -> AppendInput {
        AppendInput::Stop
    }

    fn is_finished(&self) -> bool {
        self.phase == Phase::Stopped && self.outbox.is_empty()
    }
}
