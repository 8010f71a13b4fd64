//! A lease handed from one process to the next: detach and resume
//! (rules 8 and 9 of the [module docs](super)).

use super::{
    Keepalive, KeepaliveConfig, KeepaliveNotice, Lease, LivenessState, Phase, ResumePoint, Timer,
};
use crate::rpc::{Request, Response, RpcError};
use std::time::Instant;

impl Keepalive {
    /// Starts at `now` by resuming the lease `point` that an earlier
    /// machine detached ([`KeepaliveInput::Detach`](super::KeepaliveInput::Detach)): the first commands
    /// are `Notify(Registering)` and `Rpc(KeepAlive)` on `point.lease`;
    /// answered with a TTL above zero, the machine is `Registered` on it,
    /// and on any refusal it registers afresh (see "Resume" in the module
    /// docs). A point without a lease starts as
    /// [`Keepalive::with_first_rpc_id`] does.
    pub fn resume(
        config: KeepaliveConfig,
        now: Instant,
        seed: u64,
        first_rpc_id: u64,
        point: ResumePoint,
    ) -> Self {
        if point.lease == 0 {
            return Self::with_first_rpc_id(config, now, seed, first_rpc_id);
        }
        let mut machine = Self::idle(config, now, seed, first_rpc_id);
        machine
            .outbox
            .notify(KeepaliveNotice::State(LivenessState::Registering));
        let renewal = machine
            .outbox
            .rpc(Request::KeepAlive { lease: point.lease });
        machine.phase = Phase::Resuming {
            point,
            renewal: (renewal, now),
        };
        // Unanswered for one requested TTL: the lease cannot be proven in
        // time, and a fresh registration is the only way forward.
        let at = now.checked_add(machine.request_timeout()).unwrap_or(now);
        machine.arm(Timer::Retry, at);
        machine
    }

    /// What a later machine needs to resume this lease
    /// ([`Keepalive::resume`]): `Some` while a lease is held, never once a
    /// stop is under way.
    pub fn resume_point(&self) -> Option<ResumePoint> {
        match &self.phase {
            Phase::Leased(l) => Some(ResumePoint { lease: l.id }),
            _ => None,
        }
    }

    /// The answer to the renewal that opens a resume: a TTL above zero
    /// proves the lease, held from then on as if just granted; anything
    /// else registers afresh (rule 9).
    pub(super) fn on_resume_renewal(
        &mut self,
        now: Instant,
        point: ResumePoint,
        sent: Instant,
        result: Result<Response, RpcError>,
    ) {
        self.timers.stop(Timer::Retry);
        let proven = match result {
            Ok(Response::KeptAlive { ttl_secs }) if ttl_secs > 0 => {
                let trusted = self.trusted(ttl_secs);
                sent.checked_add(trusted)
                    .filter(|d| *d > now)
                    .map(|d| (trusted, d))
            }
            _ => None,
        };
        let gone = matches!(
            result,
            Ok(Response::KeptAlive { ttl_secs: ..=0 }) | Err(RpcError::LeaseNotFound)
        );
        let Some((trusted, deadline)) = proven else {
            self.phase = Phase::Granting { grant: None };
            if !gone {
                // Maybe alive still (rule 6).
                self.retire(point.lease);
            }
            self.send_grant(now);
            return;
        };
        self.phase = Phase::Leased(Lease::fresh(point.lease, trusted, deadline, sent, true));
        self.arm(Timer::Deadline, deadline);
        self.register_backoff.reset();
        self.schedule_renewal(now);
        self.sync_state();
        self.announce_trust();
    }

    /// Stops for good without revoking (rule 8).
    pub(super) fn detach(&mut self, now: Instant) {
        if self.phase.is_stopping() {
            return;
        }
        let Some(point) = self.resume_point() else {
            return self.stop(now);
        };
        if let Phase::Leased(Lease {
            renewal: Some((id, _)),
            ..
        }) = &self.phase
        {
            let id = *id;
            self.outbox.cancel(id);
        }
        // Leases given up earlier hold nothing the next machine resumes.
        self.last_retired_revokes();
        self.outbox.notify(KeepaliveNotice::Detached(point));
        self.finish(false);
    }
}
