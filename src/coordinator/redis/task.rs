//! How a Redis feed task starts: behind a feed, with the target to connect
//! to, and with the caller waiting until it is live. What it holds and how
//! it lives is the bus's one feed task type (`coordinator/feed_task.rs`).

use super::target::Target;
use crate::coordinator::bridge::{feed_channel, Bridge};
use crate::coordinator::feed_task::FeedTask;
use crate::coordinator::Feed;
use crate::error::{Error, Result};
use std::future::Future;
use std::time::Duration;

/// How long `subscribe`, `read_stream` and `kv_watch` wait for their feed to
/// be live (connected, subscribed, positioned) on top of the connect and
/// request timeouts.
const START_SLACK: Duration = Duration::from_secs(2);

/// A feed task's inputs: the one feed task type, the Redis target it
/// connects to, and the caller waiting until it is live.
pub(crate) struct FeedCtx<T> {
    feed: FeedTask<T>,
    pub(crate) target: Target,
    started: Option<crossbeam_channel::Sender<Result<()>>>,
}

impl<T> FeedCtx<T> {
    /// Tells the caller the feed is live (subscribed, positioned, its
    /// snapshot read: `Ok`) or cannot be (`Err`); only the first report
    /// counts. Returns whether someone was told.
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
}

impl<T> std::ops::Deref for FeedCtx<T> {
    type Target = FeedTask<T>;

    fn deref(&self) -> &FeedTask<T> {
        &self.feed
    }
}

impl<T> std::ops::DerefMut for FeedCtx<T> {
    fn deref_mut(&mut self) -> &mut FeedTask<T> {
        &mut self.feed
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
                feed: FeedTask::new(tx, stopping),
                target,
                started: Some(started_tx),
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
