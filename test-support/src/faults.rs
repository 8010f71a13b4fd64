//! What the wire does to requests: failures, lost replies, latency, and
//! requests held up on their way to etcd that land after their client gave
//! up. The harness draws from these on every request, so a seed fixes them
//! all.

use crate::random::ChaCha8Rng;
use rand_core::RngCore;
use std::time::Duration;

/// What can go wrong on the wire, and how slow it is.
#[derive(Clone, Debug, PartialEq)]
pub struct Faults {
    /// Probability that a request fails with `Unavailable` without running.
    pub fail_request: f64,
    /// Probability that a request runs but its reply is replaced by
    /// `Unavailable` (the write happened; the client does not know).
    pub lose_reply: f64,
    /// Reply latency, drawn uniformly from `min..=max`.
    pub latency: (Duration, Duration),
    /// Probability that a unary request (not a watch, not a keepalive) is
    /// held up on its way to etcd, as behind a paused member or a stuck
    /// proxy: its client is answered `Unavailable` after the usual latency,
    /// and the request runs at etcd `late_by` after it was sent, whatever
    /// the client did since (retried, canceled, stopped). Its result goes
    /// nowhere.
    pub land_late: f64,
    /// How long after its send instant a held-up request lands, drawn
    /// uniformly from `min..=max`.
    pub late_by: (Duration, Duration),
}

impl Faults {
    /// No faults, a fixed 1 ms latency (non-zero so an instant's work ends).
    /// `late_by` is the `moderate` range, so a test that only raises
    /// `land_late` gets late landings that outlive a reply.
    pub fn none() -> Self {
        Faults {
            fail_request: 0.0,
            lose_reply: 0.0,
            latency: (Duration::from_millis(1), Duration::from_millis(1)),
            land_late: 0.0,
            late_by: (Duration::from_millis(50), Duration::from_secs(3)),
        }
    }

    /// 5 % failed requests, 2 % lost replies, 1–20 ms latency, 3 % of unary
    /// requests held up to land 50 ms–3 s late: late enough to come after
    /// the client's retry, and up to longer than a short lease's TTL.
    pub fn moderate() -> Self {
        Faults {
            fail_request: 0.05,
            lose_reply: 0.02,
            latency: (Duration::from_millis(1), Duration::from_millis(20)),
            land_late: 0.03,
            late_by: (Duration::from_millis(50), Duration::from_secs(3)),
        }
    }

    /// One latency draw.
    pub fn sample_latency(&self, rng: &mut ChaCha8Rng) -> Duration {
        uniform(self.latency, rng)
    }

    /// One draw of how late a held-up request lands, counted from its
    /// send instant.
    pub fn sample_late_by(&self, rng: &mut ChaCha8Rng) -> Duration {
        uniform(self.late_by, rng)
    }
}

/// A uniform draw from `min..=max`; `min`, without a draw, when the range is
/// empty or a point.
fn uniform((min, max): (Duration, Duration), rng: &mut ChaCha8Rng) -> Duration {
    if max <= min {
        return min;
    }
    let span = u64::try_from((max - min).as_nanos()).unwrap_or(u64::MAX);
    min + Duration::from_nanos(rng.next_u64() % span.saturating_add(1))
}
