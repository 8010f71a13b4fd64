//! The bus backends' retried requests: the shapes of sm's one retry policy
//! ([`fleetcoord_sm::retry`]) that Redis and NATS use, on the runtime's
//! clock, with cheap seeds for its jitter.

use fleetcoord_sm::backoff::BackoffConfig;
use fleetcoord_sm::retry::RetryConfig;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::time::Instant;

#[cfg(feature = "redis")]
pub(crate) use fleetcoord_sm::retry::GiveUp;
pub(crate) use fleetcoord_sm::retry::{Decision, LastPause, Repeat, Retry, Sign};

/// The retries of one request beginning now: `budget` in all, pauses
/// from `initial` doubling to `max` with half of each jittered.
pub(crate) fn policy(
    budget: Duration,
    reserve: Duration,
    (initial, max): (Duration, Duration),
    last_pause: LastPause,
    repeat: Repeat,
) -> Retry {
    let config = RetryConfig {
        budget,
        reserve,
        backoff: BackoffConfig {
            initial,
            max,
            multiplier: 2,
            jitter_percent: 50,
        },
        last_pause,
        repeat,
    };
    Retry::new(config, now(), seed())
}

/// The runtime's clock in the form sm takes.
pub(crate) fn now() -> std::time::Instant {
    Instant::now().into_std()
}

/// `at` (an instant of sm's) on the runtime's clock.
pub(crate) fn on_runtime(at: std::time::Instant) -> Instant {
    Instant::from_std(at)
}

/// A seed for one request's jitter: one random draw per process, then a
/// counter mixed into it (splitmix64), so a request that succeeds at once
/// pays no system call and two requests never share a schedule.
fn seed() -> u64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = *BASE.get_or_init(crate::driver::rand_seed);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut z = base.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_differ_between_requests() {
        let seeds: std::collections::HashSet<u64> = (0..1000).map(|_| seed()).collect();
        assert_eq!(seeds.len(), 1000);
    }
}
