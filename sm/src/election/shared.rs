//! An election on a session it does not keep itself
//! ([`Election::on_session`]): the session's owner tells it what the lease
//! does ([`SessionInput`]), and it tells the owner what the protocol needs
//! done to the lease ([`ElectionNotice::SessionRequest`]). Several
//! elections, semaphores and a host registration can then share one lease,
//! as Go's `concurrency.Session` lets them.
//!
//! Rules (beside those of the module docs, which all hold):
//! * **Trust.** The lease is believed from `Up`/`Trusted` until the first of
//!   `Lost`, `Refused`, `Closed`, another lease, or the deadline last told
//!   by `Trusted` (an earlier, stale deadline only ends belief sooner).
//!   Without a `Trusted` for the current lease nothing is believed.
//! * **Loss at once.** When etcd answers a request of this election with
//!   "lease not found", or the protocol gives the lease up, the lease is
//!   lost *here* at once (belief ends, a campaign waits for the next lease)
//!   and the owner is asked (`SessionRequest(Gone | Replace)`); later facts
//!   about that lease are ignored, so a renewal answer the owner handled
//!   before the request cannot bring it back.
//! * **Stop** deletes this election's own keys (candidate and priority
//!   key) on the current lease, since the owner does not revoke it; a
//!   delete not confirmed within one TTL, or a create of the own key that
//!   may still land, asks the owner to replace the lease instead, so no key
//!   of a stopped election holds a queue. `Closed` (the owner revokes the
//!   lease) stops without deleting: the keys go with the lease.

use super::protocol::{SessionFact, SessionRequest, UserRequest};
use super::{requests, Election, ElectionNotice, Part};
use crate::keepalive::LivenessState;
use crate::outbox::Outbox;
use crate::rpc::{KeyRange, LeaseId, RpcId, RpcReply, Txn, TxnOp};
use crate::session::SessionInput;
use crate::timer::TimerTable;
use std::time::{Duration, Instant};

/// How many request ids a shared session part may issue before the
/// protocol's range begins (it issues one delete per attempt of one stop).
pub(super) const SHARED_ID_SPAN: u64 = 1 << 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// The stop's delete is sent again.
    Resend,
    /// The stop's delete went unconfirmed for one TTL: replace the lease.
    GiveUp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Stop {
    Running,
    /// Deleting the own keys of `lease` (request `id` in flight, if any).
    Deleting {
        lease: LeaseId,
        id: Option<RpcId>,
    },
    Done,
}

/// The session part of an election on a shared session.
#[derive(Clone, Debug)]
pub(super) struct SharedSession {
    lease: Option<LeaseId>,
    suspended: bool,
    until: Option<Instant>,
    /// The last lease this election learnt was gone (from etcd, or given
    /// up): facts about it that were on their way are ignored.
    gone: Option<LeaseId>,
    stop: Stop,
    pub(super) outbox: Outbox<ElectionNotice>,
    timers: TimerTable<Timer>,
    first_id: u64,
    attempt_timeout: Duration,
    withdraw_limit: Duration,
}

impl SharedSession {
    pub(super) fn new(first_id: u64, attempt_timeout: Duration, withdraw_limit: Duration) -> Self {
        SharedSession {
            lease: None,
            suspended: false,
            until: None,
            gone: None,
            stop: Stop::Running,
            outbox: Outbox::new(first_id),
            timers: TimerTable::new(),
            first_id,
            attempt_timeout,
            withdraw_limit,
        }
    }

    pub(super) fn lease(&self) -> Option<LeaseId> {
        self.lease
    }

    pub(super) fn local_deadline(&self) -> Option<Instant> {
        self.lease.and(self.until)
    }

    pub(super) fn owns(&self, id: RpcId) -> bool {
        self.first_id <= id.0 && id.0 - self.first_id < SHARED_ID_SPAN
    }

    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    pub(super) fn is_finished(&self) -> bool {
        self.stop == Stop::Done && self.outbox.is_empty()
    }
}

impl Election {
    fn shared(&mut self) -> Option<&mut SharedSession> {
        match &mut self.session {
            Part::Shared(s) => Some(s),
            Part::Own(_) => None,
        }
    }

    /// Tells the protocol `fact`, right behind the notice that says it.
    fn tell(&mut self, now: Instant, notice: ElectionNotice, fact: SessionFact) {
        if let Some(s) = self.shared() {
            s.outbox.notify(notice);
        }
        self.drain();
        self.protocol.session(now, fact);
        self.drain();
    }

    /// One fact from the session's owner.
    pub(super) fn shared_input(&mut self, now: Instant, input: SessionInput) {
        let Some(s) = self.shared() else {
            // An election with its own session takes no facts from outside.
            return;
        };
        if s.stop == Stop::Done {
            return;
        }
        let stale = |lease: LeaseId| s.gone == Some(lease);
        match input {
            SessionInput::Up { lease } | SessionInput::Trusted { lease, .. } if stale(lease) => {}
            SessionInput::Suspended { lease } | SessionInput::Lost { lease } if stale(lease) => {}
            SessionInput::Up { lease } => self.shared_up(now, lease),
            SessionInput::Trusted { lease, until } => {
                self.shared_up(now, lease);
                let announce = self.announce_session_trust;
                if let Some(s) = self.shared() {
                    s.until = Some(until);
                    if announce {
                        s.outbox
                            .notify(ElectionNotice::SessionTrusted { lease, until });
                    }
                }
            }
            SessionInput::Suspended { lease } => {
                if s.lease == Some(lease) && !s.suspended {
                    s.suspended = true;
                    self.tell(
                        now,
                        ElectionNotice::Session(LivenessState::Suspended { lease }),
                        SessionFact::Suspended { lease },
                    );
                }
            }
            SessionInput::Lost { lease } => self.shared_lost(now, lease),
            SessionInput::Refused(error) => {
                s.lease = None;
                s.until = None;
                self.tell(
                    now,
                    ElectionNotice::Session(LivenessState::Refused {
                        error: error.clone(),
                    }),
                    SessionFact::Refused(error),
                );
            }
            SessionInput::Closed => {
                s.lease = None;
                s.until = None;
                s.stop = Stop::Done;
                s.timers.clear();
                self.protocol.user(now, UserRequest::Stop);
                self.drain();
                if let Some(s) = self.shared() {
                    s.outbox
                        .notify(ElectionNotice::Session(LivenessState::Stopped {
                            revoked: false,
                        }));
                }
            }
        }
    }

    fn shared_up(&mut self, now: Instant, lease: LeaseId) {
        let Some(s) = self.shared() else { return };
        if s.lease == Some(lease) {
            if s.suspended {
                s.suspended = false;
                self.tell(
                    now,
                    ElectionNotice::Session(LivenessState::Registered { lease }),
                    SessionFact::Up { lease },
                );
            }
            return;
        }
        if let Some(old) = s.lease {
            // A new lease without a loss told in between: the old one is
            // gone all the same.
            self.shared_lost(now, old);
        }
        let Some(s) = self.shared() else { return };
        if matches!(s.stop, Stop::Deleting { .. }) {
            // The keys to delete went with the old lease.
            self.shared_stopped();
            return;
        }
        s.lease = Some(lease);
        s.until = None;
        s.suspended = false;
        self.tell(
            now,
            ElectionNotice::Session(LivenessState::Registered { lease }),
            SessionFact::Up { lease },
        );
    }

    fn shared_lost(&mut self, now: Instant, lease: LeaseId) {
        let Some(s) = self.shared() else { return };
        if s.lease != Some(lease) {
            return;
        }
        s.lease = None;
        s.until = None;
        s.suspended = false;
        if matches!(s.stop, Stop::Deleting { .. }) {
            self.shared_stopped();
            return;
        }
        self.tell(
            now,
            ElectionNotice::Session(LivenessState::Lost { lease }),
            SessionFact::Lost,
        );
    }

    /// What the protocol asked of the session: the lease is lost here at
    /// once, and the owner is asked to act on it.
    pub(super) fn shared_request(&mut self, now: Instant, request: SessionRequest) {
        let lease = match request {
            SessionRequest::Gone(lease) | SessionRequest::Replace(lease) => lease,
        };
        let Some(s) = self.shared() else { return };
        s.outbox.notify(ElectionNotice::SessionRequest(request));
        s.gone = Some(lease);
        self.shared_lost(now, lease);
    }

    /// Stop on a shared session: the protocol stops (belief ends, every
    /// open operation is answered), then the own keys are deleted.
    pub(super) fn shared_stop(&mut self, now: Instant) {
        let doubt = self.protocol.create_doubt();
        self.protocol.user(now, UserRequest::Stop);
        self.drain();
        let Some(s) = self.shared() else { return };
        if s.stop != Stop::Running {
            return;
        }
        let Some(lease) = s.lease else {
            self.shared_stopped();
            return;
        };
        if doubt == Some(lease) {
            // A create of the own key may still land after any delete:
            // only a new lease makes sure it cannot.
            self.shared_request(now, SessionRequest::Replace(lease));
            self.shared_stopped();
            return;
        }
        let Some(s) = self.shared() else { return };
        s.stop = Stop::Deleting { lease, id: None };
        let limit = self.withdraw_limit();
        if let Some(s) = self.shared() {
            if let Some(at) = now.checked_add(limit) {
                s.timers.set(Timer::GiveUp, at);
            }
        }
        self.send_stop_delete(now);
    }

    fn withdraw_limit(&self) -> Duration {
        match &self.session {
            Part::Shared(s) => s.withdraw_limit,
            Part::Own(_) => Duration::ZERO,
        }
    }

    fn send_stop_delete(&mut self, now: Instant) {
        let (prefix, rw) = (self.prefix.clone(), self.rw);
        let Some(s) = self.shared() else { return };
        let Stop::Deleting { lease, id } = &mut s.stop else {
            return;
        };
        let lease = *lease;
        if let Some(old) = id.take() {
            s.outbox.cancel(old);
        }
        let request = crate::rpc::Request::Txn(Txn {
            compare: vec![],
            success: vec![
                TxnOp::Delete(KeyRange::Key(requests::own_key(&prefix, rw, lease))),
                TxnOp::Delete(KeyRange::Key(requests::priority_key(&prefix, lease))),
            ],
            failure: vec![],
        });
        let new_id = s.outbox.rpc(request);
        if let Stop::Deleting { id, .. } = &mut s.stop {
            *id = Some(new_id);
        }
        if !s.attempt_timeout.is_zero() {
            if let Some(at) = now.checked_add(s.attempt_timeout) {
                s.timers.set(Timer::Resend, at);
            }
        }
    }

    /// The reply to the stop's delete.
    pub(super) fn shared_reply(&mut self, now: Instant, reply: RpcReply) {
        let Some(s) = self.shared() else { return };
        let Stop::Deleting { id, .. } = &s.stop else {
            return;
        };
        if *id != Some(reply.id) {
            return;
        }
        match reply.result {
            Ok(_) => {
                if let Stop::Deleting { id, .. } = &mut s.stop {
                    *id = None;
                }
                self.shared_stopped();
            }
            Err(_) => {
                // Sent again after one attempt timeout (or right away when
                // copies are configured off), until the give-up limit.
                if let Stop::Deleting { id, .. } = &mut s.stop {
                    *id = None;
                }
                let at = now.checked_add(s.attempt_timeout).unwrap_or(now);
                s.timers.set(Timer::Resend, at);
            }
        }
    }

    pub(super) fn shared_timeout(&mut self, now: Instant) {
        loop {
            let Some(s) = self.shared() else { return };
            let Some(timer) = s.timers.pop_expired(now) else {
                return;
            };
            match timer {
                Timer::Resend => self.send_stop_delete(now),
                Timer::GiveUp => {
                    let Some(s) = self.shared() else { return };
                    if let Stop::Deleting { lease, id } = &mut s.stop {
                        let lease = *lease;
                        if let Some(id) = id.take() {
                            s.outbox.cancel(id);
                        }
                        self.shared_request(now, SessionRequest::Replace(lease));
                        self.shared_stopped();
                    }
                }
            }
        }
    }

    fn shared_stopped(&mut self) {
        let Some(s) = self.shared() else { return };
        if s.stop == Stop::Done {
            return;
        }
        if let Stop::Deleting { id: Some(id), .. } = s.stop {
            s.outbox.cancel(id);
        }
        s.stop = Stop::Done;
        s.timers.clear();
        s.outbox
            .notify(ElectionNotice::Session(LivenessState::Stopped {
                revoked: false,
            }));
    }
}
