//! Many leases renewed on one etcd `LeaseKeepAlive` stream.
//!
//! etcd's renewal stream takes any lease id in each request and answers
//! every request, in order, with that id and the TTL it granted (0 for a
//! lease it does not have). So the leases a driver keeps alive share one
//! stream, and [`Renewals`] decides everything about it: when a stream is
//! opened, which renewal is written when, which reply answers which
//! renewal, and when a stream is given up. The driver only does the I/O:
//! it opens the stream, writes what [`Renewals::poll_write`] hands out,
//! reads replies, and feeds what happened back as [`RenewalsInput`]s. Each
//! renewal carries a token of the driver's (`T`), handed back with its
//! answer.
//!
//! # Guarantees
//!
//! 1. Every renewal taken is answered exactly once
//!    ([`RenewalsCommand::Answer`]): with the TTL etcd replied (0 for a
//!    lease etcd does not have), or with an error.
//! 2. A renewal is answered by its deadline, one request timeout after it
//!    was taken, and by no other timer: a renewal has exactly one deadline.
//! 3. A renewal of a lease that is forgotten before it was written is never
//!    written: [`RenewalsInput::Forget`] comes before the revoke, so no
//!    renewal reaches etcd after it.
//! 4. At most one stream exists at a time, open or being opened; every
//!    stream given up is dropped ([`RenewalsCommand::Drop`]), and a stream
//!    that answered nothing for a whole request timeout is given up.
//! 5. The health monitor is told ([`RenewalsCommand::Suspect`]) whenever a
//!    renewal missed its deadline or a stream broke while reading: both
//!    may mean a member went away.
//! 6. **No stale renewal.** A renewal of a lease taken before that lease
//!    is forgotten (its revoke) is never answered with a TTL: etcd may
//!    have answered it before the revoke, and that answer can arrive
//!    after it (etcd-io/etcd#21638), when a positive TTL proves nothing
//!    about the lease any more (rule 10).
//! 7. **No herd.** A stream given up for a fault is not opened again at
//!    once but after a pick from the reopen window, seeded per machine
//!    (rule 12): the handles of a fleet whose streams one member restart
//!    broke together come back spread over the window, not in one burst.
//!
//! # Rules
//!
//! *Unsent* renewals are taken and not yet written; *sent* ones are written
//! to the open stream, in the order etcd replies to them. Both queues are in
//! the order the renewals were taken, so the front of each has the earliest
//! deadline.
//!
//! 1. **Take.** A renewal ([`RenewalsInput::Renew`]) gets its deadline,
//!    `now` plus the request timeout, and joins the unsent queue.
//! 2. **Open.** After every input and timer, if no stream is open or being
//!    opened, a renewal is unsent and no reopen wait runs (rule 12), a
//!    stream is opened
//!    ([`RenewalsCommand::Open`]) whose opening request renews the lease of
//!    the oldest unsent renewal (etcd-client reads that reply itself; it
//!    answers no renewal taken here). The opening gets a deadline of one
//!    request timeout.
//! 3. **Write.** While a stream is open, [`Renewals::poll_write`] hands out
//!    the unsent renewals, oldest first, each moving to the sent queue. The
//!    driver calls it only while the stream can take one more request, so
//!    a full stream keeps renewals unsent (their deadlines still run). The
//!    first lease's renewal is written again on the open stream and answered
//!    by that write.
//! 4. **Reply.** A reply for a lease answers the oldest sent renewal of
//!    that lease with its TTL (unless that renewal was forgotten, rule 10:
//!    then the reply is consumed and answers nothing); a reply that
//!    matches no sent renewal is ignored.
//! 5. **Missing first lease.** An opening refused with
//!    [`RpcError::LeaseNotFound`] answers every unsent renewal of its first
//!    lease with TTL 0, as etcd would on an open stream; the others wait
//!    for the next stream (rule 2).
//! 6. **Open failure.** Any other refusal answers every unsent renewal
//!    with that error; nothing waits, so nothing is opened until the next
//!    renewal.
//! 7. **Silence.** When renewals reach their deadline (checked before the
//!    opening's): if the oldest sent renewal is among them, the stream
//!    replies nothing (replies come in order). Then, in this order: the
//!    monitor is told; the unsent renewals past their deadline are answered
//!    `Unavailable("no renewal answer within {timeout:?}")`; if the stream
//!    is silent, it is dropped and every sent renewal is answered with the
//!    same error. Otherwise, if no renewal is left unsent while a stream is
//!    being opened, the opening is dropped: nobody waits for it. What is
//!    still unsent goes to a new stream (rule 2).
//! 8. **Opening deadline.** An opening still not done at its deadline is
//!    dropped and fails as in rule 6, with the error of rule 7.
//! 9. **Broken stream.** A stream that ends or fails while reading
//!    ([`RenewalsInput::Ended`], [`RenewalsInput::Failed`]) tells the
//!    monitor, is dropped, and answers every sent renewal with
//!    `Unavailable("renewal stream ended")` or its error. One that refuses a
//!    write ([`RenewalsInput::Closed`]) is dropped and answers every sent
//!    renewal `Unavailable("renewal stream closed")`, without telling the
//!    monitor (reading finds out). Unsent renewals wait for a new stream
//!    (rule 2).
//! 10. **Forget.** Every renewal of the lease is answered
//!     `Unavailable("the lease is being revoked")`: unsent ones are never
//!     written; sent ones are already on the wire, so each keeps its place
//!     in the sent queue, answered, and the reply etcd sends for it is
//!     consumed there in order (rule 4) and answers nothing. Whatever TTL
//!     that reply carries was granted before the revoke, or is a server's
//!     mistake (etcd before 3.5.23 / 3.6.5 could answer a renewal of a
//!     revoked lease with a positive TTL, etcd-io/etcd PR #20590): it
//!     reaches nobody. A forgotten renewal has no deadline of its own; the
//!     silence of its stream is judged by the renewals still waiting.
//! 11. **Stop.** Every renewal, sent ones first, is answered
//!     `Unavailable("the driver is shutting down")` and the stream is
//!     dropped; renewals taken afterwards are answered the same at once, and
//!     no stream is opened again.
//! 12. **Reopen after a fault.** With a reopen window
//!     ([`Renewals::with_reopen_spread`]), a stream given up for a fault —
//!     an opening refused (rule 6) or past its deadline (rule 8), a silent
//!     stream (rule 7), a broken one (rule 9) — is opened again (rule 2) no
//!     earlier than a pick uniform in `0..=window` after the fault, a new
//!     pick for every fault from the machine's seed; renewals taken
//!     meanwhile wait unsent, their deadlines running. The window is capped
//!     at a quarter of the request timeout, so the wait alone never costs a
//!     renewal its deadline. Without a window (the default) a stream opens
//!     at once, as rule 2 says.
//!
//! Stream inputs are those of the current stream: the driver discards a
//! stream and everything still coming from it at `Drop`. An input for a
//! stream in another state (a reply while none is open, an open result
//! while none is being opened) is ignored.
//!
//! # One deadline per renewal
//!
//! Each renewal has one deadline here; the keepalive machine's give-up
//! (half-way to its lease's local deadline, `crate::keepalive`) is not a
//! second deadline of the renewal but the keepalive's own decision to retry:
//! it cancels its request there, and a reply that comes later is ignored.
//! The two stay apart on purpose. Giving the renewal up on the stream at
//! the keepalive's instant would drop a stream that is merely slow while
//! etcd elects a new raft leader (it replies once the leader is back, where
//! a fresh stream may be routed to the dead member), and telling the monitor
//! then would probe members for a renewal that was never late by the request
//! timeout every other request is held to.
//!
//! Like every machine of this crate it reads no clock and keeps the
//! contract of [`crate::Machine`]: `handle` never fires a timer, only
//! `handle_timeout` does; after every `handle*` the driver drains
//! [`Renewals::poll_command`], writes what [`Renewals::poll_write`] gives
//! while the stream has room, and sleeps until [`Renewals::poll_timeout`].
//! It does not implement that trait: its commands drive one stream, not
//! requests with ids.

use crate::backoff::{Backoff, BackoffConfig};
use crate::clock::Clock;
use crate::rpc::{LeaseId, RpcError};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What happened, fed to [`Renewals::handle`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum RenewalsInput<T> {
    /// Renew `lease`; the answer comes back with `token` (rule 1).
    Renew {
        /// The lease to renew.
        lease: LeaseId,
        /// The driver's name for this renewal.
        token: T,
    },
    /// `lease` is about to be revoked: write no renewal of it (rule 10).
    Forget {
        /// The lease.
        lease: LeaseId,
    },
    /// The stream being opened is open: renewals may be written.
    Opened,
    /// Opening the stream failed with `error` (rules 5 and 6).
    OpenFailed {
        /// Why; [`RpcError::LeaseNotFound`] when etcd has no first lease.
        error: RpcError,
    },
    /// The open stream replied for `lease` (rule 4).
    Reply {
        /// The lease etcd replied for.
        lease: LeaseId,
        /// The TTL it granted; 0 when it has no such lease.
        ttl_secs: i64,
    },
    /// The open stream ended: etcd will reply to nothing more (rule 9).
    Ended,
    /// Reading the open stream failed with `error` (rule 9).
    Failed {
        /// Why.
        error: RpcError,
    },
    /// The open stream refused a write: it is closed (rule 9).
    Closed,
    /// The driver is shutting down (rule 11).
    Stop,
}

/// What the driver does next, from [`Renewals::poll_command`], in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenewalsCommand<T> {
    /// Open a stream, its opening request renewing `lease`; feed
    /// [`RenewalsInput::Opened`] or [`RenewalsInput::OpenFailed`] when done.
    Open {
        /// The lease the opening request renews.
        lease: LeaseId,
    },
    /// Drop the stream, or the opening under way, and everything still to
    /// come from it.
    Drop,
    /// The answer to the renewal named `token`: the TTL etcd replied, or why
    /// there is none.
    Answer {
        /// The driver's name for the renewal.
        token: T,
        /// The TTL in seconds (0: etcd has no such lease), or the error.
        ttl: Result<i64, RpcError>,
    },
    /// Tell the health monitor: a member may have gone away.
    Suspect,
}

/// One renewal taken and not yet answered, or (sent, `token` `None`)
/// answered at its lease's forget and still owed a reply by the stream.
#[derive(Clone, Debug)]
struct Renewal<T> {
    lease: LeaseId,
    token: Option<T>,
    /// Taken + one request timeout; `None` if that is beyond what an
    /// `Instant` can hold (never reached), and for a forgotten renewal.
    deadline: Option<Instant>,
}

impl<T> Renewal<T> {
    /// Whether someone still waits for this renewal's answer.
    fn waits(&self) -> bool {
        self.token.is_some()
    }
}

/// Where the stream is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    None,
    /// Being opened, its opening request renewing `first`.
    Opening {
        first: LeaseId,
        deadline: Option<Instant>,
    },
    Open,
    /// Stopped for good (rule 11).
    Stopped,
}

/// The renewals of every lease on one stream. See the module docs for its
/// guarantees and rules.
#[derive(Clone, Debug)]
pub struct Renewals<T> {
    timeout: Duration,
    clock: Clock,
    stream: Stream,
    unsent: VecDeque<Renewal<T>>,
    sent: VecDeque<Renewal<T>>,
    commands: VecDeque<RenewalsCommand<T>>,
    /// Picks the wait before a stream is opened again after a fault (rule
    /// 12); `None` without a reopen window.
    reopen: Option<Backoff>,
    /// No stream is opened before this instant (rule 12).
    reopen_at: Option<Instant>,
}

impl<T> Renewals<T> {
    /// No stream and no renewal yet, at `now`; each renewal and each opening
    /// gets `timeout` (the driver's request timeout).
    pub fn new(timeout: Duration, now: Instant) -> Self {
        Renewals {
            timeout,
            clock: Clock::new(now),
            stream: Stream::None,
            unsent: VecDeque::new(),
            sent: VecDeque::new(),
            commands: VecDeque::new(),
            reopen: None,
            reopen_at: None,
        }
    }

    /// Spreads the reopening of a stream given up for a fault over
    /// `0..=window` (rule 12), capped at a quarter of the request timeout;
    /// each pick is a pure function of `seed` and how many faults came
    /// before, so a driver seeds each machine apart (never one seed for a
    /// fleet) and a test replays any schedule. A zero window opens at once.
    #[must_use]
    pub fn with_reopen_spread(mut self, window: Duration, seed: u64) -> Self {
        let window = window.min(self.timeout / 4);
        self.reopen = (!window.is_zero()).then(|| {
            Backoff::new(
                BackoffConfig {
                    initial: window,
                    max: window,
                    multiplier: 1,
                    jitter_percent: 100,
                },
                seed,
            )
        });
        self
    }

    /// Feeds one input observed at `now`. Never fires a timer.
    pub fn handle(&mut self, now: Instant, input: RenewalsInput<T>) {
        let now = self.clock.observe(now);
        match input {
            RenewalsInput::Renew { lease, token } => self.take(now, lease, token),
            RenewalsInput::Forget { lease } => self.forget(lease),
            RenewalsInput::Opened => {
                if matches!(self.stream, Stream::Opening { .. }) {
                    self.stream = Stream::Open;
                }
            }
            RenewalsInput::OpenFailed { error } => self.open_failed(now, error),
            RenewalsInput::Reply { lease, ttl_secs } => self.reply(lease, ttl_secs),
            RenewalsInput::Ended => self.broken(
                now,
                true,
                RpcError::Unavailable("renewal stream ended".into()),
            ),
            RenewalsInput::Failed { error } => self.broken(now, true, error),
            RenewalsInput::Closed => self.broken(
                now,
                false,
                RpcError::Unavailable("renewal stream closed".into()),
            ),
            RenewalsInput::Stop => self.stop(),
        }
        self.open_if_waiting(now);
    }

    /// Lets time pass: answers the renewals whose deadline is due at `now`
    /// (rule 7), then gives up an opening past its deadline (rule 8). Early
    /// or repeated calls do nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        let due = |r: &Renewal<T>| r.deadline.is_some_and(|d| d <= now);
        // The oldest renewal still waiting: a forgotten one (rule 10) has
        // no deadline, and the stream owes it nothing anyone waits for.
        let silent = self.sent.iter().find(|r| r.waits()).is_some_and(due);
        let late = self.unsent.iter().any(due);
        if silent || late {
            self.commands.push_back(RenewalsCommand::Suspect);
            let error = self.no_answer();
            let (late, keep): (VecDeque<_>, VecDeque<_>) = self.unsent.drain(..).partition(due);
            self.unsent = keep;
            self.answer_all(late, &error);
            if silent {
                self.drop_stream();
                self.fault(now);
                let sent = std::mem::take(&mut self.sent);
                self.answer_all(sent, &error);
            } else if self.unsent.is_empty() && matches!(self.stream, Stream::Opening { .. }) {
                self.drop_stream();
                self.fault(now);
            }
        }
        if let Stream::Opening {
            deadline: Some(at), ..
        } = self.stream
        {
            if at <= now {
                self.drop_stream();
                self.fault(now);
                let unsent = std::mem::take(&mut self.unsent);
                self.answer_all(unsent, &self.no_answer());
            }
        }
        self.open_if_waiting(now);
    }

    /// The next command, in order; `None` when there is none.
    #[must_use]
    pub fn poll_command(&mut self) -> Option<RenewalsCommand<T>> {
        self.commands.pop_front()
    }

    /// The lease of the next renewal to write to the open stream, which the
    /// driver writes at once; `None` when no stream is open or nothing is
    /// unsent (rule 3). Call only while the stream can take one more
    /// request: the renewal counts as written from here on.
    #[must_use]
    pub fn poll_write(&mut self) -> Option<LeaseId> {
        if self.stream != Stream::Open {
            return None;
        }
        let renewal = self.unsent.pop_front()?;
        let lease = renewal.lease;
        self.sent.push_back(renewal);
        Some(lease)
    }

    /// Whether [`Renewals::poll_write`] has something to write: a driver
    /// waits for room on the stream only then.
    pub fn wants_to_write(&self) -> bool {
        self.stream == Stream::Open && !self.unsent.is_empty()
    }

    /// When [`Renewals::handle_timeout`] is next needed: the earliest
    /// deadline of a renewal or of the opening, or the instant a stream
    /// may be opened again for the renewals waiting (rule 12), never
    /// earlier than the last `now`; `None` when nothing waits.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let opening = match self.stream {
            Stream::Opening { deadline, .. } => deadline,
            _ => None,
        };
        let reopen = self
            .reopen_at
            .filter(|_| self.stream == Stream::None && !self.unsent.is_empty());
        [
            self.sent
                .iter()
                .find(|r| r.waits())
                .and_then(|r| r.deadline),
            self.unsent.front().and_then(|r| r.deadline),
            opening,
            reopen,
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|at| self.clock.clamp(at))
    }

    /// How many renewals are waiting for an answer, written or not.
    pub fn waiting(&self) -> usize {
        self.sent.iter().filter(|r| r.waits()).count() + self.unsent.len()
    }

    fn take(&mut self, now: Instant, lease: LeaseId, token: T) {
        if self.stream == Stream::Stopped {
            self.commands.push_back(RenewalsCommand::Answer {
                token,
                ttl: Err(shutting_down()),
            });
            return;
        }
        self.unsent.push_back(Renewal {
            lease,
            token: Some(token),
            deadline: now.checked_add(self.timeout),
        });
    }

    /// Rule 10: every renewal of `lease` is answered now; the sent ones
    /// keep their place for the replies etcd still owes them.
    fn forget(&mut self, lease: LeaseId) {
        let error = RpcError::Unavailable("the lease is being revoked".into());
        let mut answered = VecDeque::new();
        for r in self.sent.iter_mut().filter(|r| r.lease == lease) {
            if let Some(token) = r.token.take() {
                answered.push_back(Renewal {
                    lease,
                    token: Some(token),
                    deadline: r.deadline,
                });
            }
            r.deadline = None;
        }
        let (gone, keep): (VecDeque<_>, VecDeque<_>) =
            self.unsent.drain(..).partition(|r| r.lease == lease);
        self.unsent = keep;
        answered.extend(gone);
        self.answer_all(answered, &error);
    }

    fn open_failed(&mut self, now: Instant, error: RpcError) {
        let Stream::Opening { first, .. } = self.stream else {
            return;
        };
        self.stream = Stream::None;
        if error == RpcError::LeaseNotFound {
            // etcd answered: the first lease is missing, the way to etcd
            // is fine, so nothing waits before the next opening.
            let (gone, keep): (VecDeque<_>, VecDeque<_>) =
                self.unsent.drain(..).partition(|r| r.lease == first);
            self.unsent = keep;
            for token in gone.into_iter().filter_map(|r| r.token) {
                self.commands
                    .push_back(RenewalsCommand::Answer { token, ttl: Ok(0) });
            }
        } else {
            self.fault(now);
            let unsent = std::mem::take(&mut self.unsent);
            self.answer_all(unsent, &error);
        }
    }

    /// Rule 4: the reply answers the oldest renewal of `lease` on the
    /// stream; one forgotten since (rule 10) consumes it and answers
    /// nothing.
    fn reply(&mut self, lease: LeaseId, ttl_secs: i64) {
        if self.stream != Stream::Open {
            return;
        }
        let Some(at) = self.sent.iter().position(|r| r.lease == lease) else {
            return;
        };
        if let Some(token) = self.sent.remove(at).and_then(|r| r.token) {
            self.commands.push_back(RenewalsCommand::Answer {
                token,
                ttl: Ok(ttl_secs),
            });
        }
    }

    /// Rule 9: the open stream broke.
    fn broken(&mut self, now: Instant, suspect: bool, error: RpcError) {
        if self.stream != Stream::Open {
            return;
        }
        if suspect {
            self.commands.push_back(RenewalsCommand::Suspect);
        }
        self.drop_stream();
        self.fault(now);
        let sent = std::mem::take(&mut self.sent);
        self.answer_all(sent, &error);
    }

    /// Rule 12: a stream was given up for a fault at `now`; the next one
    /// opens after a pick from the reopen window, if there is one.
    fn fault(&mut self, now: Instant) {
        if let Some(reopen) = &mut self.reopen {
            self.reopen_at = now.checked_add(reopen.next_delay());
        }
    }

    fn stop(&mut self) {
        if self.stream == Stream::Stopped {
            return;
        }
        let error = shutting_down();
        let sent = std::mem::take(&mut self.sent);
        self.answer_all(sent, &error);
        let unsent = std::mem::take(&mut self.unsent);
        self.answer_all(unsent, &error);
        self.drop_stream();
        self.stream = Stream::Stopped;
    }

    /// Rules 2 and 12.
    fn open_if_waiting(&mut self, now: Instant) {
        if self.stream != Stream::None {
            return;
        }
        if self.reopen_at.is_some_and(|at| now < at) {
            return;
        }
        if let Some(first) = self.unsent.front() {
            let lease = first.lease;
            self.reopen_at = None;
            self.stream = Stream::Opening {
                first: lease,
                deadline: now.checked_add(self.timeout),
            };
            self.commands.push_back(RenewalsCommand::Open { lease });
        }
    }

    /// Gives up the stream, open or being opened, if there is one.
    fn drop_stream(&mut self) {
        if matches!(self.stream, Stream::Open | Stream::Opening { .. }) {
            self.stream = Stream::None;
            self.commands.push_back(RenewalsCommand::Drop);
        }
    }

    /// Answers every renewal of `renewals` still waiting with `error`.
    fn answer_all(&mut self, renewals: VecDeque<Renewal<T>>, error: &RpcError) {
        for token in renewals.into_iter().filter_map(|r| r.token) {
            self.commands.push_back(RenewalsCommand::Answer {
                token,
                ttl: Err(error.clone()),
            });
        }
    }

    fn no_answer(&self) -> RpcError {
        RpcError::Unavailable(format!("no renewal answer within {:?}", self.timeout))
    }
}

fn shutting_down() -> RpcError {
    RpcError::Unavailable("the driver is shutting down".into())
}
