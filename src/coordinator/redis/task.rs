//! What every feed task shares: how it starts (the caller waits until it
//! is live), how it learns to stop (its feed was dropped, or the
//! coordinator closed), and how it waits between reconnects.

use super::client::Target;
use crate::coordinator::bridge::{feed_channel, Bridge, FeedSender, Stopping};
use crate::coordinator::Feed;
use crate::error::{Error, Result};
use std::future::Future;
use std::time::Duration;

/// How long `subscribe`, `read_stream` and `kv_watch` wait for their feed to
/// be live (connected, subscribed, positioned) on top of the connect and
/// request timeouts.
const START_SLACK: Duration = Duration::from_secs(2);

/// A feed task's inputs.
pub(crate) struct FeedCtx<T> {
    pub(crate) tx: FeedSender<T>,
    pub(crate) target: Target,
    started: Option<crossbeam_channel::Sender<Result<()>>>,
    stopping: Stopping,
}

impl<T> FeedCtx<T> {
    /// Tells the caller the feed is live (`Ok`) or cannot be (`Err`); only
    /// the first report counts. Returns whether someone was told.
    pub(crate) fn started(&mut self, outcome: Result<()>) -> bool {
        match self.started.take() {
            Some(tx) => tx.send(outcome).is_ok(),
            None => false,
        }
    }

    /// Whether the caller is still waiting for [`FeedCtx::started`].
    pub(crate) fn starting(&self) -> bool {
        self.started.is_some()
    }

    /// Resolves once the feed should end: it was dropped, or the
    /// coordinator is closing.
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

    /// Waits `backoff.next()` unless halted first; `false` when halted.
    pub(crate) async fn pause(&self, backoff: &mut Backoff) -> bool {
        let wait = backoff.next();
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

/// Exponential backoff between reconnect attempts: 50 ms doubling to 2 s.
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff(Duration::from_millis(50))
    }

    pub(crate) fn next(&mut self) -> Duration {
        let now = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(2));
        now
    }

    pub(crate) fn reset(&mut self) {
        *self = Backoff::new();
    }
}

/// Starts `task` on `bridge` behind a feed of `capacity` and returns once
/// the task reported it live (or why it cannot be).
pub(crate) fn open<T, F>(
    bridge: &Bridge,
    target: &Target,
    capacity: usize,
    task: impl FnOnce(FeedCtx<T>) -> F + Send + 'static,
) -> Result<Feed<T>>
where
    T: Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let (tx, feed) = feed_channel(capacity);
    let (started_tx, started_rx) = crossbeam_channel::bounded(1);
    let target = target.clone();
    let wait = target
        .connect_timeout
        .saturating_add(target.request_timeout.saturating_mul(2))
        .saturating_add(START_SLACK);
    bridge
        .spawn(move |stopping| {
            task(FeedCtx {
                tx,
                target,
                started: Some(started_tx),
                stopping,
            })
        })
        // The bridge thread has stopped: `DriverGone` here, which the handle
        // turns into `Closed` when its user closed it (`RedisCoordinator::gone`).
        .map_err(|_| Error::DriverGone)?;
    match started_rx.recv_timeout(wait) {
        Ok(Ok(())) => Ok(feed),
        Ok(Err(e)) => Err(e),
        // Dropping `feed` cancels the task.
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(Error::Timeout(wait)),
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(Error::DriverGone),
    }
}
