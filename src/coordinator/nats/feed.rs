//! What every feed task on the driver holds: the sending end of its feed
//! and the bridge's shutdown signal, which together say when to stop.

use crate::coordinator::bridge::{FeedSender, Stopping};

/// A feed task's sender, ending when the consumer drops its feed or the
/// handle closes.
pub(super) struct Lifeline<T> {
    tx: FeedSender<T>,
    stopping: Stopping,
}

impl<T> Lifeline<T> {
    pub(super) fn new(tx: FeedSender<T>, stopping: Stopping) -> Self {
        Lifeline { tx, stopping }
    }

    /// Where items go.
    pub(super) fn tx(&self) -> &FeedSender<T> {
        &self.tx
    }

    /// Resolves once the feed is over (at once if it already is).
    /// Cancel-safe.
    pub(super) async fn ended(&self) {
        tokio::select! {
            _ = self.tx.gone() => {}
            _ = self.stopping.wait() => {}
        }
    }

    /// Waits until the consumer has read its queue down to half; `false`
    /// when the feed is over instead.
    pub(super) async fn relieved(&self) -> bool {
        tokio::select! {
            relieved = self.tx.relieved() => relieved,
            _ = self.stopping.wait() => false,
        }
    }
}
