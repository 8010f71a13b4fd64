//! A double barrier on the key layout of Go's `recipes.DoubleBarrier`
//! (etcd's `client/v3/experimental/recipes/double_barrier.go`): `count`
//! participants enter, wait until all have, work, and leave, waiting until
//! all have left.
//!
//! Keys, under the barrier's `key`:
//! * `<key>/waiters/<lease hex>`: one per participant, value empty, on the
//!   participant's lease (so a participant that dies gives its place up
//!   when etcd expires the lease). Go's last segment is a timestamp; both
//!   order participants by create revision only, so they share a barrier.
//! * `<key>/ready`: put (without a lease) by the participant that made the
//!   count; every participant waits for a put of it after its own key.
//!
//! Rules (each kept by the code that cites it):
//! 1. **Join in one read.** Enter is one txn: create my key unless it
//!    exists (else read it back), and read, at that one revision, the
//!    oldest `count` waiter keys (keys only) and the ready key. My token is
//!    my key's create revision.
//! 2. **Only the `count`-th readies.** If my key is the `count`-th oldest
//!    at that revision, `count` participants were present at once: I put
//!    the ready key, guarded by its mod revision as read in rule 1 and by
//!    my key still having my token, and I have entered. A put that lost
//!    the guard reads again: a ready put after my token means someone
//!    readied after I joined (entered); my key gone fails the enter.
//!    So a ready put can only land while the state its writer read (the
//!    ready key unchanged, the writer present) still holds: a delayed or
//!    resent copy never readies a later round.
//! 3. **Nobody enters early.** With fewer than `count` keys up to mine I
//!    watch the ready key from my join's revision + 1, and enter at the
//!    first put of it (its mod revision above my token, by construction).
//!    A broken watch reads the ready key (a put after my token: entered)
//!    and watches again from that read's revision + 1.
//! 4. **Too many.** When `count` keys are older than mine the barrier is
//!    full (Go's `ErrTooManyClients`): my key is deleted (guarded by my
//!    token) and the enter fails with [`BarrierError::TooMany`].
//! 5. **Leave deletes first.** Leave deletes my key (guarded by my token)
//!    and, in the same txn, reads whether any waiter key is left and the
//!    ready key. None left: the ready key is deleted, guarded by the mod
//!    revision read, and I have left. Some left: I watch the waiters from
//!    the read's revision + 1 and read again at each delete. Go's `Leave`
//!    differs: the lowest participant waits for the highest and deletes
//!    last, the others delete and wait for the lowest; a Go participant
//!    that is lowest waits for ours to delete, which they do at once, so
//!    mixed barriers still drain. Go's version can wait forever when the
//!    lowest dies holding its key until its lease expires; ours waits for
//!    that expiry too (the key goes with the lease), never longer.
//! 6. **Retries.** A request that fails retryably is sent again after a
//!    backoff; `LeaseNotFound` fails the operation with
//!    [`BarrierError::SessionLost`] (the session gets a new lease, the
//!    participant enters again); any other error fails it with
//!    [`BarrierError::Rejected`], after deleting my key if it exists.
//! 7. **One operation at a time.** `Enter` while joined, or `Leave` while
//!    not entered, is answered at once with [`BarrierError::Busy`] or
//!    [`BarrierError::NotEntered`], and nothing is sent.

use crate::backoff::{Backoff, BackoffConfig};
use crate::clock::Clock;
use crate::outbox::Outbox;
use crate::rpc::{
    Command, Compare, EventKind, KeyRange, KeyValue, LeaseId, RangeRequest, Request, Response,
    Revision, RpcError, RpcId, RpcReply, SortOrder, Txn, TxnOp, TxnOpResponse,
};
use crate::timer::TimerTable;
use crate::Machine;
use std::time::Instant;

/// What a [`DoubleBarrier`] coordinates on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BarrierConfig {
    /// The barrier's key (no trailing `/`): keys live at
    /// `<key>/waiters/...` and `<key>/ready`, as Go's.
    pub key: Vec<u8>,
    /// How many participants enter together; 0 counts as 1.
    pub count: u32,
    /// Delays between failed attempts.
    pub backoff: BackoffConfig,
}

/// Inputs of a [`DoubleBarrier`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum BarrierInput {
    /// The reply to one of the machine's requests (others are ignored).
    Rpc(RpcReply),
    /// Enter with a key on `lease`; answered by `Entered` or `Failed`.
    Enter {
        /// The participant's session lease.
        lease: LeaseId,
    },
    /// Leave after entering; answered by `Left` or `Failed`.
    Leave,
    /// Stop: cancel what runs and delete my key (one attempt).
    Stop,
}

impl From<RpcReply> for BarrierInput {
    fn from(reply: RpcReply) -> Self {
        BarrierInput::Rpc(reply)
    }
}

/// Why an enter or a leave did not succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BarrierError {
    /// `count` participants are in the barrier already (rule 4).
    TooMany,
    /// The lease the key was on is gone (rule 6).
    SessionLost,
    /// An enter asked while joined (rule 7).
    Busy,
    /// A leave asked while not entered (rule 7).
    NotEntered,
    /// The machine was stopped.
    Stopped,
    /// etcd refused a request for good (rule 6).
    Rejected(RpcError),
}

/// What a [`DoubleBarrier`] tells its user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BarrierNotice {
    /// `count` participants were in the barrier at once, after my key was
    /// made at `token` (its create revision).
    Entered {
        /// My key's create revision.
        token: Revision,
    },
    /// No participant's key was left after mine was deleted.
    Left,
    /// The enter or leave failed; nothing of mine is left in the barrier
    /// but, after `SessionLost`, a key that goes with its lease.
    Failed(BarrierError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    Retry,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    /// Rule 1.
    Joining {
        lease: LeaseId,
    },
    /// Rule 2: the guarded put of the ready key.
    Readying {
        token: Revision,
        ready_mod: Revision,
    },
    /// Rule 3: watching the ready key from `from`.
    Waiting {
        token: Revision,
        from: Revision,
    },
    /// Rule 3: a read of the ready key after a broken watch.
    Checking {
        token: Revision,
    },
    Entered {
        token: Revision,
    },
    /// Rule 4 / 6: deleting my key, then `then`.
    Withdrawing {
        token: Revision,
        then: BarrierError,
    },
    /// Rule 5: my key deleted (or being deleted), reading who is left.
    Leaving {
        token: Revision,
    },
    /// Rule 5: watching the waiters from `from`.
    Draining {
        token: Revision,
        from: Revision,
    },
    /// Rule 5: deleting the ready key, guarded by `ready_mod`.
    Closing {
        ready_mod: Revision,
    },
    Stopped,
}

/// The double-barrier machine; see the [module docs](self).
#[derive(Clone, Debug)]
pub struct DoubleBarrier {
    key: Vec<u8>,
    count: u32,
    mine: Vec<u8>,
    phase: Phase,
    /// The request the phase waits for (a watch, in the watching phases).
    pending: Option<RpcId>,
    backoff: Backoff,
    timers: TimerTable<Timer>,
    outbox: Outbox<BarrierNotice>,
    clock: Clock,
}

fn waiters(key: &[u8]) -> Vec<u8> {
    [key, b"/waiters/"].concat()
}

fn ready(key: &[u8]) -> Vec<u8> {
    [key, b"/ready"].concat()
}

/// `<key>/waiters/<lease hex>`: the participant key of `lease`.
pub fn participant_key(key: &[u8], lease: LeaseId) -> Vec<u8> {
    let mut k = waiters(key);
    k.extend_from_slice(format!("{lease:x}").as_bytes());
    k
}

fn kvs_of(r: Option<&TxnOpResponse>) -> Option<&[KeyValue]> {
    match r {
        Some(TxnOpResponse::Range { kvs }) => Some(kvs),
        _ => None,
    }
}

impl DoubleBarrier {
    /// A machine that has not entered; nothing is sent until `Enter`.
    pub fn new(config: BarrierConfig, now: Instant, seed: u64) -> Self {
        DoubleBarrier {
            key: config.key,
            count: config.count.max(1),
            mine: Vec::new(),
            phase: Phase::Idle,
            pending: None,
            backoff: Backoff::new(config.backoff, seed),
            timers: TimerTable::new(),
            outbox: Outbox::default(),
            clock: Clock::new(now),
        }
    }

    /// My key's create revision while entered; `None` otherwise.
    pub fn entered(&self) -> Option<Revision> {
        match self.phase {
            Phase::Entered { token } => Some(token),
            _ => None,
        }
    }

    /// My participant key (empty before the first enter).
    pub fn my_key(&self) -> &[u8] {
        &self.mine
    }

    fn oldest_waiters(&self) -> TxnOp {
        TxnOp::Range(RangeRequest {
            range: KeyRange::Prefix(waiters(&self.key)),
            sort: SortOrder::CreateAscending,
            limit: i64::from(self.count),
            max_create_revision: 0,
            revision: 0,
            keys_only: true,
        })
    }

    fn any_waiter(&self) -> TxnOp {
        TxnOp::Range(RangeRequest {
            limit: 1,
            keys_only: true,
            ..RangeRequest::all(KeyRange::Prefix(waiters(&self.key)))
        })
    }

    fn ready_read(&self) -> TxnOp {
        TxnOp::Range(RangeRequest::all(KeyRange::Key(ready(&self.key))))
    }

    fn mine_is(&self, token: Revision) -> Compare {
        Compare::CreateRevisionEquals {
            key: self.mine.clone(),
            revision: token,
        }
    }

    /// The request of the current phase.
    fn request(&self) -> Option<Request> {
        let mine = || TxnOp::Range(RangeRequest::all(KeyRange::Key(self.mine.clone())));
        Some(match self.phase {
            // Rule 1.
            Phase::Joining { lease } => Request::Txn(Txn {
                compare: vec![self.mine_is(0)],
                success: vec![
                    TxnOp::Put {
                        key: self.mine.clone(),
                        value: Vec::new(),
                        lease,
                    },
                    self.oldest_waiters(),
                    self.ready_read(),
                ],
                failure: vec![mine(), self.oldest_waiters(), self.ready_read()],
            }),
            // Rule 2.
            Phase::Readying { token, ready_mod } => Request::Txn(Txn {
                compare: vec![
                    Compare::ModRevisionEquals {
                        key: ready(&self.key),
                        revision: ready_mod,
                    },
                    self.mine_is(token),
                ],
                success: vec![TxnOp::Put {
                    key: ready(&self.key),
                    value: Vec::new(),
                    lease: 0,
                }],
                failure: vec![self.ready_read(), mine()],
            }),
            // Rule 3.
            Phase::Waiting { from, .. } => Request::Watch {
                range: KeyRange::Key(ready(&self.key)),
                start_revision: from,
            },
            Phase::Checking { .. } => {
                Request::Range(RangeRequest::all(KeyRange::Key(ready(&self.key))))
            }
            // Rules 4 and 6.
            Phase::Withdrawing { token, .. } => Request::Txn(Txn {
                compare: vec![self.mine_is(token)],
                success: vec![TxnOp::Delete(KeyRange::Key(self.mine.clone()))],
                failure: vec![],
            }),
            // Rule 5.
            Phase::Leaving { token } => Request::Txn(Txn {
                compare: vec![self.mine_is(token)],
                success: vec![
                    TxnOp::Delete(KeyRange::Key(self.mine.clone())),
                    self.any_waiter(),
                    self.ready_read(),
                ],
                failure: vec![self.any_waiter(), self.ready_read()],
            }),
            Phase::Draining { from, .. } => Request::Watch {
                range: KeyRange::Prefix(waiters(&self.key)),
                start_revision: from,
            },
            Phase::Closing { ready_mod } => Request::Txn(Txn {
                compare: vec![Compare::ModRevisionEquals {
                    key: ready(&self.key),
                    revision: ready_mod,
                }],
                success: vec![TxnOp::Delete(KeyRange::Key(ready(&self.key)))],
                failure: vec![],
            }),
            Phase::Idle | Phase::Entered { .. } | Phase::Stopped => return None,
        })
    }

    /// Moves to `phase` and sends its request.
    fn go(&mut self, phase: Phase) {
        if let Some(id) = self.pending.take() {
            self.outbox.cancel(id);
        }
        self.timers.stop(Timer::Retry);
        self.phase = phase;
        if let Some(request) = self.request() {
            self.pending = Some(self.outbox.rpc(request));
        }
    }

    /// The phase's request failed retryably: the same again after a pause.
    fn retry(&mut self) {
        if let Some(id) = self.pending.take() {
            self.outbox.cancel(id);
        }
        let delay = self.backoff.next_delay();
        let now = self.clock.now();
        self.timers
            .set(Timer::Retry, now.checked_add(delay).unwrap_or(now));
    }

    fn finish(&mut self, notice: BarrierNotice) {
        if let Some(id) = self.pending.take() {
            self.outbox.cancel(id);
        }
        self.timers.stop(Timer::Retry);
        self.backoff.reset();
        self.phase = Phase::Idle;
        self.outbox.notify(notice);
    }

    fn enter(&mut self, token: Revision) {
        self.finish(BarrierNotice::Entered { token });
        self.phase = Phase::Entered { token };
    }

    /// Rule 6 for a failure of the phase's request.
    fn failed(&mut self, error: RpcError) {
        if error.is_retryable() && error != RpcError::LeaseNotFound {
            return self.retry();
        }
        let then = if error == RpcError::LeaseNotFound {
            BarrierError::SessionLost
        } else {
            BarrierError::Rejected(error)
        };
        match self.phase.clone() {
            // My key may exist: delete it first (not on a lost lease: it
            // goes with the lease, and etcd refuses nothing there).
            Phase::Readying { token, .. }
            | Phase::Waiting { token, .. }
            | Phase::Checking { token }
                if then != BarrierError::SessionLost =>
            {
                self.go(Phase::Withdrawing { token, then });
            }
            Phase::Withdrawing { then, .. } => self.finish(BarrierNotice::Failed(then)),
            _ => self.finish(BarrierNotice::Failed(then)),
        }
    }

    fn reply(&mut self, reply: RpcReply) {
        if self.pending != Some(reply.id) {
            return;
        }
        if self.phase == Phase::Stopped {
            // The stop's delete, answered either way: nothing left to do.
            self.pending = None;
            return;
        }
        // A unary request is answered once: nothing to cancel. A watch
        // stays open until the phase moves on (which cancels it).
        if !matches!(self.phase, Phase::Waiting { .. } | Phase::Draining { .. })
            || reply.result.is_err()
        {
            self.pending = None;
        }
        let response = match reply.result {
            Ok(r) => r,
            Err(e) => {
                // A watch that broke: read, then watch again (rules 3, 5).
                match self.phase {
                    Phase::Waiting { token, .. } if e.is_retryable() => {
                        self.pending = None;
                        self.phase = Phase::Checking { token };
                        return self.retry();
                    }
                    Phase::Draining { token, .. } if e.is_retryable() => {
                        self.pending = None;
                        self.phase = Phase::Leaving { token };
                        return self.retry();
                    }
                    _ => {}
                }
                return self.failed(e);
            }
        };
        match (self.phase.clone(), response) {
            (
                Phase::Joining { .. },
                Response::Txn {
                    revision,
                    succeeded,
                    responses,
                },
            ) => self.joined(revision, succeeded, &responses),
            (
                Phase::Readying { token, .. },
                Response::Txn {
                    succeeded,
                    responses,
                    revision,
                },
            ) => {
                if succeeded {
                    return self.enter(token);
                }
                let ready_mod = kvs_of(responses.first())
                    .and_then(|kvs| kvs.first())
                    .map_or(0, |kv| kv.mod_revision);
                let mine = kvs_of(responses.get(1))
                    .is_some_and(|kvs| kvs.iter().any(|kv| kv.create_revision == token));
                if ready_mod > token {
                    self.enter(token);
                } else if !mine {
                    self.finish(BarrierNotice::Failed(BarrierError::SessionLost));
                } else {
                    // The ready key changed back to an older state? Only a
                    // delete can do that (a leaver's rule 5): watch for the
                    // next put as a waiter does.
                    self.backoff.reset();
                    self.go(Phase::Waiting {
                        token,
                        from: revision.saturating_add(1),
                    });
                }
            }
            (Phase::Waiting { token, .. }, Response::WatchEvents { events }) => {
                let put = events
                    .iter()
                    .any(|e| e.kind == EventKind::Put && e.kv.mod_revision > token);
                if put {
                    self.enter(token);
                }
            }
            (Phase::Waiting { token, .. }, Response::WatchCanceled { .. }) => {
                self.pending = None;
                self.go(Phase::Checking { token });
            }
            (Phase::Checking { token }, Response::Range { revision, kvs }) => {
                if kvs.iter().any(|kv| kv.mod_revision > token) {
                    self.enter(token);
                } else {
                    self.backoff.reset();
                    self.go(Phase::Waiting {
                        token,
                        from: revision.saturating_add(1),
                    });
                }
            }
            (Phase::Withdrawing { then, .. }, Response::Txn { .. }) => {
                self.finish(BarrierNotice::Failed(then));
            }
            (
                Phase::Leaving { token },
                Response::Txn {
                    revision,
                    succeeded,
                    responses,
                },
            ) => {
                self.backoff.reset();
                let (left, ready_at) = if succeeded { (1, 2) } else { (0, 1) };
                let anyone = kvs_of(responses.get(left)).map(|kvs| !kvs.is_empty());
                let ready_mod = kvs_of(responses.get(ready_at))
                    .and_then(|kvs| kvs.first())
                    .map(|kv| kv.mod_revision);
                match (anyone, ready_mod) {
                    (None, _) => self.retry(),
                    (Some(true), _) => self.go(Phase::Draining {
                        token,
                        from: revision.saturating_add(1),
                    }),
                    (Some(false), Some(ready_mod)) => self.go(Phase::Closing { ready_mod }),
                    (Some(false), None) => self.finish(BarrierNotice::Left),
                }
            }
            (Phase::Draining { token, .. }, Response::WatchEvents { events }) => {
                if events.iter().any(|e| e.kind == EventKind::Delete) {
                    self.go(Phase::Leaving { token });
                }
            }
            (Phase::Draining { token, .. }, Response::WatchCanceled { .. }) => {
                self.pending = None;
                self.go(Phase::Leaving { token });
            }
            (Phase::Closing { .. }, Response::Txn { .. }) => self.finish(BarrierNotice::Left),
            // An answer of an unexpected shape: ask again.
            _ => self.retry(),
        }
    }

    /// Rule 1's answer: rules 2 to 4.
    fn joined(&mut self, revision: Revision, succeeded: bool, responses: &[TxnOpResponse]) {
        let (waiters_at, ready_at) = (1, 2);
        let token = if succeeded {
            revision
        } else {
            match kvs_of(responses.first()).and_then(|kvs| kvs.first()) {
                Some(kv) => kv.create_revision,
                None => return self.retry(),
            }
        };
        let (Some(oldest), Some(ready)) = (
            kvs_of(responses.get(waiters_at)),
            kvs_of(responses.get(ready_at)),
        ) else {
            return self.retry();
        };
        self.backoff.reset();
        let ready_mod = ready.first().map_or(0, |kv| kv.mod_revision);
        if ready_mod > token {
            // Readied after I joined (a retried join).
            return self.enter(token);
        }
        let count = usize::try_from(self.count).unwrap_or(usize::MAX);
        let place = oldest
            .iter()
            .position(|kv| kv.key == self.mine && kv.create_revision == token);
        match place {
            // Rule 4: `count` keys older than mine.
            None => self.go(Phase::Withdrawing {
                token,
                then: BarrierError::TooMany,
            }),
            Some(i) if i.saturating_add(1) >= count => {
                self.go(Phase::Readying { token, ready_mod })
            }
            Some(_) => self.go(Phase::Waiting {
                token,
                from: revision.saturating_add(1),
            }),
        }
    }

    fn user(&mut self, input: BarrierInput) {
        match (input, &self.phase) {
            (_, Phase::Stopped) => {}
            (BarrierInput::Enter { lease }, Phase::Idle) => {
                self.mine = participant_key(&self.key, lease);
                self.backoff.reset();
                self.go(Phase::Joining { lease });
            }
            (BarrierInput::Enter { .. }, _) => {
                self.outbox
                    .notify(BarrierNotice::Failed(BarrierError::Busy));
            }
            (BarrierInput::Leave, Phase::Entered { token }) => {
                let token = *token;
                self.backoff.reset();
                self.go(Phase::Leaving { token });
            }
            (BarrierInput::Leave, _) => {
                self.outbox
                    .notify(BarrierNotice::Failed(BarrierError::NotEntered));
            }
            (BarrierInput::Stop, _) => self.stop(),
            (BarrierInput::Rpc(_), _) => {}
        }
    }

    fn stop(&mut self) {
        let running = !matches!(self.phase, Phase::Idle | Phase::Stopped);
        if let Some(id) = self.pending.take() {
            self.outbox.cancel(id);
        }
        self.timers.stop(Timer::Retry);
        let had_key =
            !matches!(self.phase, Phase::Idle | Phase::Closing { .. }) && !self.mine.is_empty();
        if running && !matches!(self.phase, Phase::Entered { .. }) {
            self.outbox
                .notify(BarrierNotice::Failed(BarrierError::Stopped));
        }
        if had_key {
            // One attempt: the key is mine (on my lease), and a failure
            // leaves it to the lease.
            self.pending = Some(
                self.outbox
                    .rpc(Request::Delete(KeyRange::Key(self.mine.clone()))),
            );
        }
        self.phase = Phase::Stopped;
    }
}

impl Machine for DoubleBarrier {
    type Input = BarrierInput;
    type Notice = BarrierNotice;

    fn handle(&mut self, now: Instant, input: BarrierInput) {
        self.clock.observe(now);
        match input {
            BarrierInput::Rpc(reply) => self.reply(reply),
            other => self.user(other),
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        while let Some(Timer::Retry) = self.timers.pop_expired(now) {
            if self.pending.is_none() {
                if let Some(request) = self.request() {
                    self.pending = Some(self.outbox.rpc(request));
                }
            }
        }
    }

    fn poll_command(&mut self) -> Option<Command<BarrierNotice>> {
        self.outbox.pop()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    fn stop_input() -> BarrierInput {
        BarrierInput::Stop
    }

    fn is_finished(&self) -> bool {
        self.phase == Phase::Stopped && self.pending.is_none() && self.outbox.is_empty()
    }
}
