//! The one feed task type of the bus backends (NATS, Redis): what a task
//! feeding a [`Feed`](super::Feed) holds and how it lives.
//!
//! * **started** the one way of every bus feed: spawned on the runtime by
//!   [`FeedTask::new`] with its sender and the runtime's stop signal (a
//!   backend whose caller waits until the feed is live, Redis, tells it so
//!   through its own task context, `redis/task.rs`);
//! * **halted**: it ends when the consumer drops the feed or the handle's
//!   runtime thread stops ([`FeedTask::halted`]);
//! * **paused**: between reconnects it waits out sm's seeded, jittered
//!   backoff ([`retry_backoff`], [`FeedTask::pause`]), so a fleet that lost
//!   its server together does not return in lockstep;
//! * **relieved**: a consumer whose queue filled up is waited for until it
//!   read half of it ([`FeedTask::relieved`]), the one backpressure rule of
//!   every feed (the coordinator docs, "Slow consumers").

use super::bridge::{FeedSender, Stopping};
use fleetcoord_sm::backoff::{Backoff, BackoffConfig};
use std::time::Duration;

/// A feed task's sender, signals and start handshake.
pub(crate) struct FeedTask<T> {
    /// Where items go.
    pub(crate) tx: FeedSender<T>,
    stopping: Stopping,
}

/// A bus retry schedule: `initial` doubling to `max`, half of each delay
/// jittered, seeded per call so that clients that failed together do not
/// retry together (sm's backoff, as for every retry of the crate).
pub(crate) fn doubling(initial: Duration, max: Duration) -> Backoff {
    Backoff::new(
        BackoffConfig {
            initial,
            max,
            multiplier: 2,
            jitter_percent: 50,
        },
        crate::driver::rand_seed(),
    )
}

/// The schedule between a feed task's reconnect attempts: 50 ms doubling
/// to 2 s.
pub(crate) fn retry_backoff() -> Backoff {
    doubling(Duration::from_millis(50), Duration::from_secs(2))
}

impl<T> FeedTask<T> {
    /// A task sending on `tx` until `stopping`.
    pub(crate) fn new(tx: FeedSender<T>, stopping: Stopping) -> Self {
        FeedTask { tx, stopping }
    }

    /// Resolves once the feed should end: it was dropped, or the runtime
    /// thread is stopping (at once if it already should). Cancel-safe.
    pub(crate) async fn halted(&self) {
        if self.is_halted() {
            return;
        }
        tokio::select! {
            _ = self.tx.gone() => {}
            _ = self.stopping.wait() => {}
        }
    }

    /// Whether the feed should end now.
    pub(crate) fn is_halted(&self) -> bool {
        self.stopping.is_stopping() || self.tx.is_gone()
    }

    /// Waits out `backoff`'s next delay unless halted first; `false` when
    /// halted.
    pub(crate) async fn pause(&self, backoff: &mut Backoff) -> bool {
        let wait = backoff.next_delay();
        tokio::select! {
            _ = tokio::time::sleep(wait) => !self.is_halted(),
            _ = self.halted() => false,
        }
    }

    /// Waits until the consumer read its queue down to half; `false` when
    /// the feed ended meanwhile.
    pub(crate) async fn relieved(&self) -> bool {
        let relieved = tokio::select! {
            r = self.tx.relieved() => r,
            _ = self.stopping.wait() => false,
        };
        relieved && !self.is_halted()
    }
}
