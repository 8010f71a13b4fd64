//! What the protocol does with a user request, one function per phase
//! ([`Op`]): each says what that phase makes of a campaign, a cancel, a
//! resign and a proclaim, and hands the rest to [`Protocol::user_otherwise`],
//! the rules every running phase shares. Split this way, a phase's
//! behaviour reads in one place instead of as arms spread over one match on
//! (phase, request).

use super::{ranked, requests, Op, Proclaim, Protocol, Session, Timer, UserRequest, Waiting};
use super::{Campaign, ElectionError, ElectionNotice, Leading, Withdraw};
use std::time::Instant;

impl Protocol {
    pub(crate) fn user(&mut self, now: Instant, request: UserRequest) {
        self.clock.observe(now);
        let op = std::mem::replace(&mut self.op, Op::Idle);
        self.op = match op {
            Op::Idle => self.user_idle(request),
            Op::WaitingForSession(w) => self.user_waiting(w, request),
            Op::Campaigning(c) => self.user_campaigning(c, request),
            Op::Leading(l) => self.user_leading(l, request),
            Op::Withdrawing(w) => self.user_withdrawing(w, request),
            Op::Stopped => self.user_stopped(request),
        };
        // A request that ended a leadership (a refused fence) lets the
        // campaign queued behind it start.
        self.start_queued();
        self.settle_watches();
        self.settle_doubt();
    }

    /// Nothing runs: a campaign starts (or waits for the session's lease).
    fn user_idle(&mut self, request: UserRequest) -> Op {
        match request {
            UserRequest::Campaign {
                op,
                value,
                try_only,
                rank,
            } => {
                if rank.is_some() && !self.single_kind_leader() {
                    self.outbox.notify(ElectionNotice::CampaignFailed {
                        op,
                        error: ElectionError::NotWithPermits,
                    });
                    return Op::Idle;
                }
                self.backoff.reset();
                self.timers.stop(Timer::Retry);
                let w = Waiting {
                    op,
                    value,
                    try_only,
                    rank,
                    attempts: 0,
                };
                match (self.session, &self.refused) {
                    (Session::Up(lease), _) => self.start_campaign(w, lease),
                    (_, Some(error)) => {
                        self.outbox.notify(ElectionNotice::CampaignFailed {
                            op,
                            error: ElectionError::Rejected(error.clone()),
                        });
                        Op::Idle
                    }
                    _ => Op::WaitingForSession(w),
                }
            }
            other => self.user_otherwise(Op::Idle, other),
        }
    }

    /// A campaign waits for the session's lease.
    fn user_waiting(&mut self, w: Waiting, request: UserRequest) -> Op {
        match request {
            // A cancel names its campaign: a late cancel of an earlier one
            // must not end a newer campaign.
            UserRequest::CancelCampaign { op } if w.op == op => {
                self.outbox.notify(ElectionNotice::CampaignFailed {
                    op,
                    error: ElectionError::Canceled,
                });
                Op::Idle
            }
            other => self.user_otherwise(Op::WaitingForSession(w), other),
        }
    }

    /// A campaign is in the queue.
    fn user_campaigning(&mut self, c: Campaign, request: UserRequest) -> Op {
        match request {
            // As for a waiting campaign, only its own cancel withdraws it.
            UserRequest::CancelCampaign { op } if c.op == op => {
                let then = vec![ElectionNotice::CampaignFailed {
                    op,
                    error: ElectionError::Canceled,
                }];
                self.abandon(c, then)
            }
            other => self.user_otherwise(Op::Campaigning(c), other),
        }
    }

    /// This candidate leads.
    fn user_leading(&mut self, mut l: Leading, request: UserRequest) -> Op {
        match request {
            // A campaign while leading comes from a user who no longer
            // believes in this leadership: its end was seen first outside
            // the machine (a shared session ends every belief before it
            // tells its primitives; a caller's clock passes the deadline
            // before the session's timer fires here). The machine hears of
            // that end next, so the campaign waits for it, as one asked
            // during a withdraw does, instead of failing with `Busy`.
            request @ UserRequest::Campaign { .. } if self.queued.is_none() => {
                self.queued = Some(request);
                Op::Leading(l)
            }
            // The campaign won before the cancel arrived (its `Elected` may
            // still be on its way to a user who gave up on it): resign, so
            // a canceled campaign never leaves a leadership behind.
            UserRequest::CancelCampaign { op } if l.op == op => self.resign(l),
            // Only the leadership with this token may resign: a stale handle
            // (its leadership lost, a newer campaign running or won) must not
            // end what came after it.
            UserRequest::Resign { token } if l.token == token => self.resign(l),
            UserRequest::HandOver { op, .. } if !self.single_kind_leader() => {
                self.outbox.notify(ElectionNotice::HandOverFailed {
                    op,
                    error: ElectionError::NotWithPermits,
                });
                Op::Leading(l)
            }
            UserRequest::HandOver { op, token, to } if l.token == token => {
                self.begin_hand_over(l, op, to)
            }
            // etcd answered that the key with this token is gone: the
            // leadership is over now, whatever the watch has shown so far.
            // A hand-over deletes the key itself; its answer says how the
            // leadership ended (belief already has), as for a delete seen
            // on the watch.
            UserRequest::FenceRefused { token } if l.token == token => {
                if ranked::handing_over(&l) {
                    Op::Leading(l)
                } else {
                    self.lose_leadership(l, ElectionError::NotLeader);
                    Op::Idle
                }
            }
            UserRequest::Proclaim { op, value } => {
                // A hand-over may already be deleting the key: no new write.
                if l.proclaim.is_some() || l.hand_over.is_some() {
                    self.outbox.notify(ElectionNotice::ProclaimFailed {
                        op,
                        error: ElectionError::Busy,
                    });
                } else {
                    self.proclaim_backoff.reset();
                    self.arm_attempt(Timer::ProclaimAttempt);
                    let id = self
                        .outbox
                        .rpc(requests::guarded_put(&l.key, &value, l.lease, l.token));
                    l.proclaim = Some(Proclaim {
                        op,
                        value,
                        pending: Some(id),
                    });
                }
                Op::Leading(l)
            }
            other => self.user_otherwise(Op::Leading(l), other),
        }
    }

    /// A key is being deleted (a resign, or a campaign given up).
    fn user_withdrawing(&mut self, mut w: Withdraw, request: UserRequest) -> Op {
        match request {
            // A dropped leadership resigns without waiting, so the next
            // campaign often arrives here: it starts once the key is gone.
            request @ UserRequest::Campaign { .. } if self.queued.is_none() => {
                self.queued = Some(request);
                Op::Withdrawing(w)
            }
            UserRequest::Resign { token } => {
                w.then.push(ElectionNotice::Resigned { token });
                Op::Withdrawing(w)
            }
            other => self.user_otherwise(Op::Withdrawing(w), other),
        }
    }

    /// Stopped for good: every request is answered, none is acted on.
    fn user_stopped(&mut self, request: UserRequest) -> Op {
        match request {
            UserRequest::Campaign { op, .. } => {
                self.outbox.notify(ElectionNotice::CampaignFailed {
                    op,
                    error: ElectionError::Stopped,
                })
            }
            UserRequest::Proclaim { op, .. } => {
                self.outbox.notify(ElectionNotice::ProclaimFailed {
                    op,
                    error: ElectionError::Stopped,
                })
            }
            UserRequest::Resign { token } => self.outbox.notify(ElectionNotice::Resigned { token }),
            UserRequest::HandOver { op, .. } => {
                self.outbox.notify(ElectionNotice::HandOverFailed {
                    op,
                    error: ElectionError::Stopped,
                })
            }
            UserRequest::CancelCampaign { .. }
            | UserRequest::FenceRefused { .. }
            | UserRequest::Stop => {}
        }
        Op::Stopped
    }

    /// What every phase but [`Op::Stopped`] does with a request it has no
    /// rule of its own for; `state` is that phase, kept unless the request
    /// is `Stop`.
    fn user_otherwise(&mut self, state: Op, request: UserRequest) -> Op {
        match request {
            UserRequest::Stop => {
                self.stop(state);
                Op::Stopped
            }
            UserRequest::Campaign { op, .. } => {
                self.outbox.notify(ElectionNotice::CampaignFailed {
                    op,
                    error: ElectionError::Busy,
                });
                state
            }
            // Not the running campaign's cancel: it may still name the
            // campaign queued behind a withdraw.
            UserRequest::CancelCampaign { op } => {
                let queued = matches!(
                    self.queued,
                    Some(UserRequest::Campaign { op: q, .. }) if q == op
                );
                if queued {
                    self.queued = None;
                    self.outbox.notify(ElectionNotice::CampaignFailed {
                        op,
                        error: ElectionError::Canceled,
                    });
                }
                state
            }
            UserRequest::Resign { token } => {
                self.outbox.notify(ElectionNotice::Resigned { token });
                state
            }
            // Evidence about a leadership that is not this one (already
            // over, or never held): nothing to end.
            UserRequest::FenceRefused { .. } => state,
            UserRequest::Proclaim { op, .. } => {
                self.outbox.notify(ElectionNotice::ProclaimFailed {
                    op,
                    error: ElectionError::NotLeader,
                });
                state
            }
            UserRequest::HandOver { op, .. } => {
                self.outbox.notify(ElectionNotice::HandOverFailed {
                    op,
                    error: ElectionError::NotLeader,
                });
                state
            }
        }
    }

    /// Stop whatever `op` was doing: every open operation is answered
    /// `Stopped` (a leadership is lost), a withdraw's own notices go out.
    fn stop(&mut self, op: Op) {
        match op {
            Op::WaitingForSession(w) => {
                self.outbox.notify(ElectionNotice::CampaignFailed {
                    op: w.op,
                    error: ElectionError::Stopped,
                });
            }
            Op::Campaigning(c) => {
                self.cancel(c.pending);
                self.outbox.notify(ElectionNotice::CampaignFailed {
                    op: c.op,
                    error: ElectionError::Stopped,
                });
            }
            Op::Leading(l) => self.lose_leadership(l, ElectionError::Stopped),
            Op::Withdrawing(w) => {
                self.cancel(w.pending);
                for n in w.then {
                    self.outbox.notify(n);
                }
            }
            Op::Idle | Op::Stopped => {}
        }
        // Answered after the withdraw's own notices, in the order asked.
        if let Some(UserRequest::Campaign { op, .. }) = self.queued.take() {
            self.outbox.notify(ElectionNotice::CampaignFailed {
                op,
                error: ElectionError::Stopped,
            });
        }
        self.timers.clear();
    }
}
