//! Who else holds a key this machine is about to write: a crashed
//! predecessor, whose lease runs out by itself, or a live twin, whose lease
//! someone keeps renewing.
//!
//! A host key (or a shard map's member key) names one process. Before a
//! registration writes it over a copy on a lease that is not its own, it
//! must know which of the two wrote that copy: the same host restarted
//! after a crash (systemd's `Restart=`), which must register once the old
//! lease is gone and never fail, or a second process started with the
//! same id (cloned virtual machines sharing `/etc/machine-id`), which must
//! not silently take the key away from the first.
//!
//! [`HolderCheck`] is the judge; the machine that embeds it sends the
//! looks (each a [`Request::LeaseTimeToLive`](crate::rpc::Request) of the
//! holder's lease) and arms the timer. Rules:
//!
//! 1. **A look** asks etcd for the holder lease's remaining TTL. etcd
//!    answers whole seconds, rounded down, so an answer `t` means at most
//!    `t + 1` s were left when etcd computed it, no earlier than the look
//!    was sent.
//! 2. **Gone.** An answer below zero (etcd's -1: no such lease) is
//!    [`Step::Gone`]: the key went with the lease (or is going, in the same
//!    revision), and the registration writes it again, guarded as always.
//! 3. **Expiry bound.** The first answer `t ≥ 0` fixes the *expiry bound*:
//!    the answer's arrival plus `t` s, stretched by [`DRIFT_PERCENT`] and
//!    plus [`LOOK_MARGIN`]. A lease nobody renews has less than one second
//!    left there, so etcd answers it 0 or not at all. The next look goes at
//!    the expiry bound.
//! 4. **Live.** An answer `t ≥ 1` to a look *sent at or after* the expiry
//!    bound is [`Step::Live`]: the lease was renewed after the first look,
//!    so a live process holds it. This is one full TTL of that lease at
//!    most (its remaining TTL at the first look), plus the margin and a
//!    round trip.
//! 5. **Expiring.** An answer 0 (the lease is at its end, or expired and
//!    waiting for etcd's expiry loop, which runs every 500 ms), and any
//!    answer `t ≥ 1` before the bound, looks again: at the bound, or after
//!    [`POLL`] once past it. A failed or unanswered look is looked again
//!    after the embedding machine's backoff delay. None of these ever
//!    fails the registration: a crashed predecessor is waited for.
//!
//! What an answer proves: a look is a unary request answered by etcd's
//! raft leader from its lessor, not a renewal answer, so no keepalive
//! response buffered before a revoke can stand in for it (etcd-io/etcd
//! #21638 is about those). Two limits remain (docs/etcd-notes.md, "Server
//! behaviour"): etcd extends every lease to a full TTL when its raft
//! leader changes, so a crashed predecessor's lease seen across a leader
//! change can read as renewed (the registration then fails as a
//! duplicate; run again, it finds the lease gone); and the expiry bound
//! trusts this machine's clock to run no more than [`DRIFT_PERCENT`]
//! faster than etcd's.

use crate::rpc::LeaseId;
use std::time::{Duration, Instant};

/// Added to every expiry bound (rule 3): room for a look that reached etcd
/// a little after it was sent.
pub const LOOK_MARGIN: Duration = Duration::from_millis(100);

/// How much faster than etcd's clock this machine's clock may run, in
/// percent of the remaining TTL, before rule 4 could take an unrenewed
/// lease for a renewed one.
pub const DRIFT_PERCENT: u32 = 1;

/// The interval between looks at a lease past its expiry bound that etcd
/// still answers with 0 s left (rule 5): its expiry loop runs every 500 ms.
pub const POLL: Duration = Duration::from_millis(250);

/// What the embedding machine does after an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The holder's lease is gone: write the key again.
    Gone,
    /// A live process renews the holder's lease: a duplicate.
    Live,
    /// Look again at this instant.
    LookAt(Instant),
}

/// The judge of one foreign holder of a key; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderCheck {
    holder: LeaseId,
    /// Rule 3's expiry bound, once the first answer fixed it.
    expiry_bound: Option<Instant>,
}

impl HolderCheck {
    /// A check of the key's holder `holder` (a lease that is not the
    /// embedding machine's); the first look goes at once.
    pub fn new(holder: LeaseId) -> Self {
        HolderCheck {
            holder,
            expiry_bound: None,
        }
    }

    /// The holder's lease.
    pub fn holder(&self) -> LeaseId {
        self.holder
    }

    /// The answer `ttl_secs` to a look sent at `sent`, arrived at `now`
    /// (rules 2 to 5).
    pub fn on_answer(&mut self, sent: Instant, now: Instant, ttl_secs: i64) -> Step {
        if ttl_secs < 0 {
            return Step::Gone;
        }
        match self.expiry_bound {
            Some(bound) if sent >= bound && ttl_secs >= 1 => Step::Live,
            Some(bound) if now >= bound => Step::LookAt(now.checked_add(POLL).unwrap_or(now)),
            Some(bound) => Step::LookAt(bound),
            None => {
                let bound = expiry_bound(now, ttl_secs);
                self.expiry_bound = Some(bound);
                Step::LookAt(bound)
            }
        }
    }
}

/// Rule 3: when a lease etcd said has `ttl_secs` left, answered at `now`,
/// has less than one second left unless renewed.
fn expiry_bound(now: Instant, ttl_secs: i64) -> Instant {
    // Whole seconds, so no rounding; the largest TTL etcd grants is far
    // below what a Duration holds.
    let secs = u64::try_from(ttl_secs).unwrap_or(0);
    let stretched = secs
        .saturating_mul(1000)
        .saturating_mul(100 + u64::from(DRIFT_PERCENT))
        / 100;
    let wait = Duration::from_millis(stretched).saturating_add(LOOK_MARGIN);
    now.checked_add(wait).unwrap_or(now)
}
