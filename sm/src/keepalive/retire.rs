//! Leases given up while etcd may still hold them, revoked in the
//! background (rule 6 of the [module docs](super)).

use super::{Keepalive, Phase, Timer};
use crate::rpc::{LeaseId, Request, Response, RpcError, RpcId};

/// How many given-up leases are remembered for revoking at most; beyond
/// that the oldest is left to expire by itself.
const MAX_RETIRED: usize = 8;

/// Leases given up while etcd may still hold them (rule 6), revoked one
/// after another in the background, copy after copy, until etcd answers.
/// Nobody renews them, but etcd extends every lease to a full TTL at each
/// raft leader change: while leader changes come faster than the TTL, an
/// unrevoked lease lives on, and with it any key bound to it (an election
/// candidate's key at the front of the queue stalled an election for 30 s,
/// `tests/member_restarts.rs`).
#[derive(Clone, Debug, Default)]
pub(super) struct Retired {
    pub(super) leases: std::collections::VecDeque<LeaseId>,
    /// The revoke in flight, of `leases[0]`.
    pub(super) revoke: Option<RpcId>,
    /// Copies sent again in a row since the last answer.
    pub(super) resent: u32,
}

impl Keepalive {
    /// Revoke `lease` in the background ([`Retired`]).
    pub(super) fn retire(&mut self, lease: LeaseId) {
        if self.retired.leases.contains(&lease) {
            return;
        }
        if self.retired.leases.len() >= MAX_RETIRED {
            // The oldest, unless its revoke is under way: in flight, or
            // its next copy waiting on `Timer::RetireAttempt`. That copy
            // goes to the first lease without a new check, so the first
            // must stay the lease that passed `start_retiring`'s.
            let under_way =
                self.retired.revoke.is_some() || self.timers.is_armed(Timer::RetireAttempt);
            let at = usize::from(under_way);
            let _ = self.retired.leases.remove(at);
        }
        self.retired.leases.push_back(lease);
        self.start_retiring();
    }

    /// Starts revoking the first retired lease when nothing of it is under
    /// way and, when told to hold them, once the user settled on the
    /// current lease (another one): the revoke then never takes away what
    /// the user still keeps on the retired lease (a host key: a watcher
    /// would see the host `Down`, then `Up` again).
    pub(super) fn start_retiring(&mut self) {
        let busy = self.retired.revoke.is_some() || self.timers.is_armed(Timer::RetireAttempt);
        let first = self.retired.leases.front();
        let released = !self.hold_retired
            || matches!(&self.phase, Phase::Leased(l)
                if self.settled == Some(l.id) && Some(&l.id) != first);
        if !busy && released && !self.retired.leases.is_empty() {
            self.retired.resent = 0;
            self.send_retired_revoke();
        }
    }

    /// A copy of the revoke of the first retired lease, and its copy timer.
    pub(super) fn send_retired_revoke(&mut self) {
        let Some(&lease) = self.retired.leases.front() else {
            return;
        };
        self.retired.revoke = Some(self.outbox.rpc(Request::Revoke { lease }));
        self.arm_copy(Timer::RetireAttempt, self.retired.resent);
    }

    /// The answer to a retired lease's revoke: done with it when etcd
    /// revoked it, does not have it, or refuses for good; another copy
    /// (when its timer fires) after a broken connection.
    pub(super) fn on_retired_reply(&mut self, result: Result<Response, RpcError>) {
        self.retired.revoke = None;
        match result {
            Err(e) if e.is_retryable() && !self.attempt_timeout.is_zero() => {
                self.retired.resent = self.retired.resent.saturating_add(1);
                self.arm_copy(Timer::RetireAttempt, self.retired.resent);
            }
            _ => {
                self.timers.stop(Timer::RetireAttempt);
                self.retired.leases.pop_front();
                self.start_retiring();
            }
        }
    }

    /// One last revoke of every retired lease, answers not waited for: a
    /// stop or detach must not wait on leases given up earlier.
    pub(super) fn last_retired_revokes(&mut self) {
        if let Some(id) = self.retired.revoke.take() {
            self.outbox.cancel(id);
        }
        for lease in std::mem::take(&mut self.retired.leases) {
            let _ = self.outbox.rpc(Request::Revoke { lease });
        }
    }
}
