//! What the wire does to requests: failures, lost replies, latency. The
//! harness draws from these on every request, so a seed fixes them all.

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
}

impl Faults {
    /// No faults, a fixed 1 ms latency (non-zero so an instant's work ends).
    pub fn none() -> Self {
        Faults {
            fail_request: 0.0,
            lose_reply: 0.0,
            latency: (Duration::from_millis(1), Duration::from_millis(1)),
        }
    }

    /// 5 % failed requests, 2 % lost replies, 1–20 ms latency.
    pub fn moderate() -> Self {
        Faults {
            fail_request: 0.05,
            lose_reply: 0.02,
            latency: (Duration::from_millis(1), Duration::from_millis(20)),
        }
    }

    /// One latency draw.
    pub fn sample_latency(&self, rng: &mut ChaCha8Rng) -> Duration {
        let (min, max) = self.latency;
        if max <= min {
            return min;
        }
        let span = u64::try_from((max - min).as_nanos()).unwrap_or(u64::MAX);
        min + Duration::from_nanos(rng.next_u64() % span.saturating_add(1))
    }
}
