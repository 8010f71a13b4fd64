//! Leases of the model etcd: granted TTLs, renewal, expiry on the virtual
//! clock, revocation. A lease's keys go with it in one revision, which is
//! what a watcher of a host prefix sees when a host dies.

use super::ModelEtcd;
use fleetcoord_sm::{LeaseId, Response, RpcError};
use std::time::{Duration, Instant};

/// etcd's largest lease TTL in seconds.
pub const MAX_LEASE_TTL_SECS: i64 = 9_000_000_000;

/// A TTL as a duration; a negative one is none.
fn secs(ttl: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl).unwrap_or(0))
}

/// One live lease: what it was granted and when it runs out.
#[derive(Clone, Debug)]
pub(super) struct Lease {
    pub(super) ttl_secs: i64,
    pub(super) deadline: Instant,
}

impl ModelEtcd {
    /// `Request::Grant`: etcd's minimum TTL applies, and its maximum.
    pub(super) fn grant(&mut self, now: Instant, ttl_secs: i64) -> Result<Response, RpcError> {
        if ttl_secs > MAX_LEASE_TTL_SECS {
            return Err(RpcError::Rejected("too large lease TTL".into()));
        }
        let ttl = ttl_secs.max(self.min_ttl_secs).max(1);
        let lease = self.next_lease;
        self.next_lease += 1;
        self.leases.insert(
            lease,
            Lease {
                ttl_secs: ttl,
                deadline: now + secs(ttl),
            },
        );
        Ok(Response::Granted {
            lease,
            ttl_secs: ttl,
        })
    }

    /// A put needs a live lease (or none: 0).
    pub(super) fn check_lease(&self, lease: LeaseId) -> Result<(), RpcError> {
        if lease == 0 || self.leases.contains_key(&lease) {
            Ok(())
        } else {
            Err(RpcError::LeaseNotFound)
        }
    }

    /// `Request::Revoke`: the lease and its keys go now.
    pub(super) fn revoke(&mut self, lease: LeaseId) -> Result<Response, RpcError> {
        if self.expire_lease(lease) {
            Ok(Response::Revoked)
        } else {
            Err(RpcError::LeaseNotFound)
        }
    }

    /// `Request::KeepAlive`: a full TTL from `now`; TTL 0 says the lease is
    /// gone, as etcd's renewal stream does.
    pub(super) fn renew(&mut self, now: Instant, lease: LeaseId) -> Response {
        let ttl_secs = match self.leases.get_mut(&lease) {
            Some(l) => {
                l.deadline = now + secs(l.ttl_secs);
                l.ttl_secs
            }
            None => 0,
        };
        Response::KeptAlive { ttl_secs }
    }

    /// `Request::LeaseTimeToLive`: whole seconds left (rounded down, as
    /// etcd does) and the granted TTL; -1 and 0 for a lease etcd does not
    /// know. No machine asks; an operator's question answered like etcd.
    pub(super) fn time_to_live(&self, now: Instant, lease: LeaseId) -> Response {
        match self.leases.get(&lease) {
            Some(l) => Response::LeaseTimeToLive {
                ttl_secs: i64::try_from(l.deadline.saturating_duration_since(now).as_secs())
                    .unwrap_or(i64::MAX),
                granted_secs: l.ttl_secs,
            },
            None => Response::LeaseTimeToLive {
                ttl_secs: -1,
                granted_secs: 0,
            },
        }
    }

    /// Expires or revokes `lease` now: its keys go in one revision (none if
    /// it had no keys). Returns whether the lease existed.
    pub fn expire_lease(&mut self, lease: LeaseId) -> bool {
        if self.leases.remove(&lease).is_none() {
            return false;
        }
        let revision = self.revision + 1;
        if self.delete_where(revision, |kv| kv.lease == lease) > 0 {
            self.revision = revision;
        }
        true
    }

    /// Expires every lease whose deadline is at or before `now`, in deadline
    /// order (ties by id). Does nothing while paused.
    pub fn advance(&mut self, now: Instant) {
        if self.paused {
            return;
        }
        while let Some((&lease, _)) = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .min_by_key(|(id, l)| (l.deadline, **id))
        {
            self.expire_lease(lease);
        }
    }

    /// An etcd leader change or restart: every lease gets a full TTL from `now`.
    pub fn extend_all_leases(&mut self, now: Instant) {
        for l in self.leases.values_mut() {
            l.deadline = now + secs(l.ttl_secs);
        }
    }

    /// Gives `lease` a TTL of `ttl_secs` from `now`, as an etcd with other
    /// lease settings would have granted or renewed it; a TTL of 0 or less
    /// expires it now, with its keys. For a target that has the model report
    /// a TTL of its choosing and must keep the model true to that report.
    /// Returns whether the lease existed.
    pub fn retime_lease(&mut self, now: Instant, lease: LeaseId, ttl_secs: i64) -> bool {
        if ttl_secs <= 0 {
            return self.expire_lease(lease);
        }
        match self.leases.get_mut(&lease) {
            Some(l) => {
                l.ttl_secs = ttl_secs;
                l.deadline = now + secs(ttl_secs);
                true
            }
            None => false,
        }
    }

    /// Whether `lease` is alive.
    pub fn lease_exists(&self, lease: LeaseId) -> bool {
        self.leases.contains_key(&lease)
    }

    /// When `lease` expires unless renewed.
    pub fn lease_deadline(&self, lease: LeaseId) -> Option<Instant> {
        self.leases.get(&lease).map(|l| l.deadline)
    }

    /// The granted TTL of `lease`.
    pub fn lease_ttl(&self, lease: LeaseId) -> Option<i64> {
        self.leases.get(&lease).map(|l| l.ttl_secs)
    }

    /// Every live lease, ascending.
    pub fn leases(&self) -> Vec<LeaseId> {
        self.leases.keys().copied().collect()
    }

    /// The next lease expiry; `None` when there is no lease or while paused.
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.paused {
            return None;
        }
        self.leases.values().map(|l| l.deadline).min()
    }
}
