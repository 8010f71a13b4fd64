//! Priorities and hand-over: what a ranked campaign, a ranked leader and a
//! hand-over do. Plain campaigns never reach this file, so their requests
//! stay those of Go's `concurrency` package.
//!
//! The safety argument is the plain one: the leader is the candidate key
//! with the lowest create revision, and its token is that revision. A rank
//! only changes which key becomes the oldest, by deleting waiting keys
//! (each guarded by its create revision) while a key older than all of
//! them is known to exist (the leader's, guarded too): a deleted key was
//! never the oldest, so its owner never believed it led, and it can only
//! lose its place. A ranked waiter watches the whole prefix, so it sees
//! that its key went and joins again at the back.

use super::{
    kvs_of, requests, Campaign, ElectionError, ElectionNotice, Leading, Op, OpId, Protocol, Rank,
    SessionRequest, Step, Timer,
};
use crate::rpc::{EventKind, KeyValue, Response, Revision, RpcError, RpcId, RpcReply};
use std::collections::BTreeMap;

/// A ranked leader's view of the published priorities.
#[derive(Clone, Debug)]
pub(crate) struct Ranks {
    rank: Rank,
    /// My own priority key, which never asks me to step down.
    pub(super) side_key: Vec<u8>,
    phase: RankPhase,
    /// Priority key → priority, as of the read and the watch since.
    known: BTreeMap<Vec<u8>, u32>,
    /// `StepDownRequested` was sent for this leadership.
    told: bool,
}

#[derive(Clone, Copy, Debug)]
enum RankPhase {
    Reading(RpcId),
    Watching(RpcId),
    /// After a failure, until [`Timer::RankRetry`].
    Waiting,
}

impl RankPhase {
    fn pending(self) -> Option<RpcId> {
        match self {
            RankPhase::Reading(id) | RankPhase::Watching(id) => Some(id),
            RankPhase::Waiting => None,
        }
    }
}

/// Keys with their create revisions: what a guarded delete names.
type Guarded = Vec<(Vec<u8>, Revision)>;

/// A hand-over in progress: the read of the queue, then (`deleting`) the
/// txn that deletes my key and the keys ahead of the target.
#[derive(Clone, Debug)]
pub(crate) struct HandOver {
    op: OpId,
    to: Vec<u8>,
    pending: Option<RpcId>,
    /// The target as read and the keys ahead of it, once the txn is due.
    deleting: Option<(KeyValue, Guarded)>,
    /// A yield to a higher priority, not a user's request: belief ended
    /// when it began, and a failure resigns instead of keeping the lead.
    yielding: bool,
}

/// Whether `l`'s hand-over has reached its deleting txn, which may apply
/// at any moment now: from then on, nothing may believe in `l`.
pub(crate) fn handing_over(l: &Leading) -> bool {
    l.hand_over
        .as_ref()
        .is_some_and(|h| h.deleting.is_some() || h.yielding)
}

/// Whether `id` is the priorities' or the hand-over's request of `l`.
pub(crate) fn answers(l: &Leading, id: RpcId) -> bool {
    l.ranks.as_ref().and_then(|r| r.phase.pending()) == Some(id)
        || l.hand_over.as_ref().and_then(|h| h.pending) == Some(id)
}

/// The queue (oldest first) and the priorities, the last two results of
/// every ranked txn.
fn queue_and_priorities(
    responses: &[crate::rpc::TxnOpResponse],
) -> Option<(&[KeyValue], &[KeyValue])> {
    let n = responses.len();
    let queue = responses.get(n.checked_sub(2)?).and_then(kvs_of)?;
    let priorities = responses.get(n.checked_sub(1)?).and_then(kvs_of)?;
    Some((queue, priorities))
}

impl Protocol {
    /// The published priority of the candidate `kv`; `None` when it
    /// published none (a plain or foreign candidate, which is never bumped).
    fn priority_of(&self, kv: &KeyValue, priorities: &[KeyValue]) -> Option<u32> {
        let lease_hex = kv.key.strip_prefix(self.prefix.as_slice())?;
        let mut side = requests::priority_prefix(&self.prefix);
        side.extend_from_slice(lease_hex);
        priorities
            .iter()
            .find(|p| p.key == side)
            .and_then(|p| requests::parse_priority(&p.value))
    }

    /// The answer to a ranked campaign's create, read or bump: the whole
    /// queue and every priority at one revision.
    pub(super) fn ranked_reply(&mut self, mut c: Campaign, response: Response) -> Op {
        let Response::Txn {
            revision,
            succeeded,
            responses,
        } = response
        else {
            return self.retry_step(c);
        };
        let Some((queue, priorities)) = queue_and_priorities(&responses) else {
            return self.retry_step(c);
        };
        let mine = queue.iter().find(|kv| kv.key == c.key).cloned();
        if matches!(c.step, Step::Create) {
            // Created now, or there already (the failure branch): either
            // way the read shows it.
            let Some(mine) = mine else {
                return self.retry_step(c);
            };
            c.token = mine.create_revision;
            if !succeeded && mine.value != c.value {
                self.backoff.reset();
                c.step = Step::FixValue;
                return self.send_step(c);
            }
        } else if mine.as_ref().is_none_or(|kv| kv.create_revision != c.token) {
            // Bumped (or gone otherwise): join again at the back, never claim.
            c.token = 0;
            c.step = Step::Create;
            return self.send_step(c);
        }
        if c.token <= 0 {
            return self.retry_step(c);
        }
        self.backoff.reset();
        let Some(rank) = c.rank else {
            return self.retry_step(c);
        };
        let older: Vec<&KeyValue> = queue
            .iter()
            .filter(|kv| kv.create_revision < c.token && kv.key != c.key)
            .collect();
        let Some(oldest) = older.first() else {
            return self.elect(c, revision);
        };
        // The leader (the oldest) is never bumped; waiters that published
        // a lower priority are.
        let victims: Vec<(Vec<u8>, Revision)> = older
            .iter()
            .skip(1)
            .filter(|kv| {
                self.priority_of(kv, priorities)
                    .is_some_and(|p| p < rank.priority)
            })
            .take(requests::HAND_OVER_MAX_AHEAD)
            .map(|kv| (kv.key.clone(), kv.create_revision))
            .collect();
        if !victims.is_empty() {
            c.step = Step::Bump {
                oldest: (oldest.key.clone(), oldest.create_revision),
                victims,
            };
            return self.send_step(c);
        }
        let Some(newest_older) = older.last() else {
            return self.elect(c, revision);
        };
        c.waited = true;
        c.step = Step::WatchOlder {
            key: newest_older.key.clone(),
            from: revision.saturating_add(1),
            // The whole queue was read: nothing older was left out.
            only: older.len() == 1,
        };
        self.send_step(c)
    }

    /// A ranked leader reads the priorities once, then watches them.
    pub(super) fn start_ranks(&mut self, l: &mut Leading, rank: Rank) {
        let id = self.outbox.rpc(requests::read_priorities(&self.prefix));
        l.ranks = Some(Ranks {
            rank,
            side_key: requests::priority_key(&self.prefix, l.lease),
            phase: RankPhase::Reading(id),
            known: BTreeMap::new(),
            told: false,
        });
    }

    /// Everything ranked about `l` ends (it resigns, hands over or is
    /// lost): requests canceled, timers stopped. Returns the user's
    /// hand-over still open, for its caller to answer; a yield's is no
    /// user's operation (its op is the campaign's, answered by `Elected`
    /// already), so it ends unanswered: the leadership's own end
    /// (`Resigned`, `LeadershipLost`) is the answer to the yield.
    pub(super) fn end_ranked(&mut self, l: &mut Leading) -> Option<OpId> {
        if let Some(r) = l.ranks.as_mut() {
            self.cancel(r.phase.pending());
            r.phase = RankPhase::Waiting;
        }
        self.timers.stop(Timer::RankRetry);
        self.timers.stop(Timer::HandOverRetry);
        self.timers.stop(Timer::HandOverAttempt);
        let h = l.hand_over.take()?;
        self.cancel(h.pending);
        (!h.yielding).then_some(h.op)
    }

    /// The hand-over `op` to `to` begins with a read of the queue; belief
    /// in `l` lasts until the deleting txn is due.
    pub(super) fn begin_hand_over(&mut self, mut l: Leading, op: OpId, to: Vec<u8>) -> Op {
        if l.hand_over.is_some() || l.proclaim.is_some() {
            self.outbox.notify(ElectionNotice::HandOverFailed {
                op,
                error: ElectionError::Busy,
            });
            return Op::Leading(l);
        }
        self.hand_over_backoff.reset();
        l.hand_over = Some(HandOver {
            op,
            to,
            pending: None,
            deleting: None,
            yielding: false,
        });
        self.send_hand_over(&mut l);
        Op::Leading(l)
    }

    fn send_hand_over(&mut self, l: &mut Leading) {
        let side = l.ranks.as_ref().map(|r| r.side_key.clone());
        let Some(h) = l.hand_over.as_mut() else {
            return;
        };
        let request = match &h.deleting {
            None => requests::hand_over_read(&self.prefix),
            Some((target, ahead)) => requests::hand_over(
                &l.key,
                l.token,
                side.as_deref(),
                (&target.key, target.create_revision),
                ahead,
            ),
        };
        h.pending = Some(self.outbox.rpc(request));
        if !self.attempt_timeout.is_zero() {
            match self.clock.now().checked_add(self.attempt_timeout) {
                Some(at) => self.timers.set(Timer::HandOverAttempt, at),
                None => self.timers.stop(Timer::HandOverAttempt),
            }
        }
    }

    /// Ends the hand-over of `l` with `error`, keeping the leadership.
    fn hand_over_failed(&mut self, mut l: Leading, error: ElectionError) -> Op {
        self.timers.stop(Timer::HandOverRetry);
        self.timers.stop(Timer::HandOverAttempt);
        if l.hand_over.as_ref().is_some_and(|h| h.yielding) {
            // The higher candidate cannot be handed to (gone, or behind a
            // plain candidate): yield the plain way.
            if let Some(h) = l.hand_over.take() {
                self.cancel(h.pending);
            }
            return self.resign(l);
        }
        if let Some(h) = l.hand_over.take() {
            self.cancel(h.pending);
            self.outbox
                .notify(ElectionNotice::HandOverFailed { op: h.op, error });
        }
        Op::Leading(l)
    }

    /// My key is not what it was: the leadership is lost, then the
    /// hand-over fails (`LeadershipLost` before `HandOverFailed`, the
    /// order every loss keeps: [`Protocol::lose_leadership`] answers the
    /// open hand-over). A yield's hand-over is not answered (see
    /// [`Protocol::end_ranked`]): `LeadershipLost` ends it.
    fn hand_over_lost(&mut self, mut l: Leading) -> Op {
        // Called with the hand-over's answer: nothing of it to cancel.
        if let Some(h) = l.hand_over.as_mut() {
            h.pending = None;
        }
        self.lose_leadership(l, ElectionError::NotLeader);
        Op::Idle
    }

    pub(super) fn ranked_leading_reply(&mut self, l: Leading, reply: RpcReply) -> Op {
        if l.hand_over.as_ref().and_then(|h| h.pending) == Some(reply.id) {
            return self.hand_over_reply(l, reply.result);
        }
        self.ranks_reply(l, reply.result)
    }

    fn hand_over_reply(&mut self, mut l: Leading, result: Result<Response, RpcError>) -> Op {
        self.timers.stop(Timer::HandOverAttempt);
        let response = match result {
            Ok(response) => response,
            Err(RpcError::LeaseNotFound) => {
                self.session_request = Some(SessionRequest::Gone(l.lease));
                return self.hand_over_lost(l);
            }
            // Refused: not applied, the leadership stands.
            Err(e) if !e.is_retryable() => {
                return self.hand_over_failed(l, ElectionError::Rejected(e))
            }
            Err(_) => return self.retry_hand_over(l),
        };
        let Response::Txn {
            succeeded,
            responses,
            ..
        } = response
        else {
            return self.retry_hand_over(l);
        };
        let Some(h) = l.hand_over.as_mut() else {
            return Op::Leading(l);
        };
        h.pending = None;
        match h.deleting.clone() {
            None => {
                let Some((queue, priorities)) = queue_and_priorities(&responses) else {
                    return self.retry_hand_over(l);
                };
                let mine_first = queue
                    .first()
                    .is_some_and(|kv| kv.key == l.key && kv.create_revision == l.token);
                if !mine_first {
                    return self.hand_over_lost(l);
                }
                let to = h.to.clone();
                let Some(at) = queue
                    .iter()
                    .skip(1)
                    .position(|kv| kv.key == to || kv.value == to)
                else {
                    return self.hand_over_failed(l, ElectionError::NoSuchCandidate);
                };
                // `at` counts from the second key: these are ahead of it.
                let ahead = &queue[1..=at];
                let target = queue[at + 1].clone();
                if let Some(plain) = ahead
                    .iter()
                    .find(|kv| self.priority_of(kv, priorities).is_none())
                {
                    let key = plain.key.clone();
                    return self.hand_over_failed(l, ElectionError::NotRanked(key));
                }
                if ahead.len() > requests::HAND_OVER_MAX_AHEAD {
                    return self.hand_over_failed(l, ElectionError::TooManyAhead);
                }
                let ahead = ahead
                    .iter()
                    .map(|kv| (kv.key.clone(), kv.create_revision))
                    .collect();
                if let Some(h) = l.hand_over.as_mut() {
                    h.deleting = Some((target, ahead));
                }
                // From here `leadership()` is `None`: belief ends before
                // the delete can apply.
                self.send_hand_over(&mut l);
                Op::Leading(l)
            }
            Some((target, _)) if succeeded => {
                let op = h.op;
                l.hand_over = None;
                self.end_ranked(&mut l);
                self.end_leading(&mut l);
                self.outbox.notify(ElectionNotice::HandedOver {
                    op,
                    token: l.token,
                    to: target,
                });
                Op::Idle
            }
            Some((target, _)) => {
                let has = |i: usize, key: &[u8], rev: Revision| {
                    responses.get(i).and_then(kvs_of).is_some_and(|kvs| {
                        kvs.iter()
                            .any(|kv| kv.key == key && kv.create_revision == rev)
                    })
                };
                if !has(1, &l.key, l.token) {
                    return self.hand_over_lost(l);
                }
                if !has(0, &target.key, target.create_revision) {
                    return self.hand_over_failed(l, ElectionError::NoSuchCandidate);
                }
                // Someone ahead of the target moved: read the queue again
                // (belief resumes meanwhile: nothing was deleted).
                h.deleting = None;
                self.send_hand_over(&mut l);
                Op::Leading(l)
            }
        }
    }

    fn retry_hand_over(&mut self, mut l: Leading) -> Op {
        if let Some(h) = l.hand_over.as_mut() {
            h.pending = None;
        }
        let now = self.clock.now();
        let at = now
            .checked_add(self.hand_over_backoff.next_delay())
            .unwrap_or(now);
        self.timers.set(Timer::HandOverRetry, at);
        Op::Leading(l)
    }

    /// What a leadership's own requests leave behind when it ends by a
    /// hand-over: the guard's watch, the proclaim, their timers.
    fn end_leading(&mut self, l: &mut Leading) {
        match l.guard {
            super::Guard::Watching(id) | super::Guard::Checking(id) => self.cancel(Some(id)),
            super::Guard::Waiting => {}
        }
        l.guard = super::Guard::Waiting;
        self.timers.stop(Timer::Retry);
        self.end_attempt(Timer::Attempt);
        self.timers.stop(Timer::ProclaimRetry);
        self.end_attempt(Timer::ProclaimAttempt);
        if let Some(p) = l.proclaim.take() {
            self.cancel(p.pending);
            self.outbox.notify(ElectionNotice::ProclaimFailed {
                op: p.op,
                error: ElectionError::NotLeader,
            });
        }
    }

    fn ranks_reply(&mut self, mut l: Leading, result: Result<Response, RpcError>) -> Op {
        let Some(r) = l.ranks.as_mut() else {
            return Op::Leading(l);
        };
        match (r.phase, result) {
            (RankPhase::Reading(_), Ok(Response::Range { revision, kvs })) => {
                r.known = kvs
                    .iter()
                    .filter_map(|kv| Some((kv.key.clone(), requests::parse_priority(&kv.value)?)))
                    .collect();
                r.phase = RankPhase::Watching(self.outbox.rpc(requests::watch_priorities(
                    &self.prefix,
                    revision.saturating_add(1),
                )));
            }
            (RankPhase::Watching(_), Ok(Response::WatchEvents { events })) => {
                for e in events {
                    match (e.kind, requests::parse_priority(&e.kv.value)) {
                        (EventKind::Put, Some(p)) => {
                            r.known.insert(e.kv.key, p);
                        }
                        _ => {
                            r.known.remove(&e.kv.key);
                        }
                    }
                }
            }
            // Failed, canceled or compacted: read again after a pause (a
            // higher priority published meanwhile is in that read).
            (phase, _) => {
                self.cancel(phase.pending());
                r.phase = RankPhase::Waiting;
                let now = self.clock.now();
                let at = now.checked_add(self.backoff.next_delay()).unwrap_or(now);
                self.timers.set(Timer::RankRetry, at);
                return Op::Leading(l);
            }
        }
        self.check_ranks(l)
    }

    /// Tell (once) that a higher priority waits; yield if asked to.
    fn check_ranks(&mut self, mut l: Leading) -> Op {
        let Some(r) = l.ranks.as_mut() else {
            return Op::Leading(l);
        };
        if r.told {
            return Op::Leading(l);
        }
        let higher = r
            .known
            .iter()
            .filter(|(key, p)| **key != r.side_key && **p > r.rank.priority)
            .max_by_key(|(_, p)| **p)
            .map(|(key, p)| (key.clone(), *p));
        let Some((by, priority)) = higher else {
            return Op::Leading(l);
        };
        r.told = true;
        // A user's hand-over under way already steps down.
        let yielding = r.rank.yield_to_higher && l.hand_over.is_none();
        let higher_key = by.clone();
        self.outbox.notify(ElectionNotice::StepDownRequested {
            token: l.token,
            by,
            priority,
            yielding,
        });
        if yielding {
            // Hand over to that candidate rather than resign: a resign
            // would let the next key in line lead, which may be a lower
            // priority the higher one has not bumped yet. The notice goes
            // first, so belief ends before anything is deleted.
            let prefix = requests::priority_prefix(&self.prefix);
            let lease_hex = higher_key
                .strip_prefix(prefix.as_slice())
                .unwrap_or_default();
            let to = [self.prefix.as_slice(), lease_hex].concat();
            if let Some(p) = l.proclaim.take() {
                self.cancel(p.pending);
                self.timers.stop(Timer::ProclaimRetry);
                self.end_attempt(Timer::ProclaimAttempt);
                self.outbox.notify(ElectionNotice::ProclaimFailed {
                    op: p.op,
                    error: ElectionError::NotLeader,
                });
            }
            self.hand_over_backoff.reset();
            l.hand_over = Some(HandOver {
                op: l.op,
                to,
                pending: None,
                deleting: None,
                yielding: true,
            });
            self.send_hand_over(&mut l);
        }
        Op::Leading(l)
    }

    pub(super) fn ranked_timeout(&mut self, timer: Timer, mut l: Leading) -> Op {
        match timer {
            Timer::RankRetry => {
                if let Some(r) = l.ranks.as_mut() {
                    if matches!(r.phase, RankPhase::Waiting) {
                        r.phase = RankPhase::Reading(
                            self.outbox.rpc(requests::read_priorities(&self.prefix)),
                        );
                    }
                }
            }
            Timer::HandOverRetry if l.hand_over.as_ref().is_some_and(|h| h.pending.is_none()) => {
                self.send_hand_over(&mut l);
            }
            Timer::HandOverAttempt => {
                if let Some(id) = l.hand_over.as_mut().and_then(|h| h.pending.take()) {
                    // Every hand-over request is a read or fully guarded:
                    // a second copy applies at most once.
                    self.outbox.cancel(id);
                    self.send_hand_over(&mut l);
                }
            }
            _ => {}
        }
        Op::Leading(l)
    }
}
