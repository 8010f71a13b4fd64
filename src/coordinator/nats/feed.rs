//! What every feed task on the driver shares: knowing when to stop.

use crate::driver::bridge::Stopping;
use tokio::sync::oneshot;

/// Ends when the consumer drops its feed or the handle closes.
pub(super) struct Lifeline {
    cancel: oneshot::Receiver<()>,
    stopping: Stopping,
    over: bool,
}

impl Lifeline {
    /// `cancel` resolves (with an error) when the feed's drop hook drops
    /// its sender.
    pub(super) fn new(cancel: oneshot::Receiver<()>, stopping: Stopping) -> Self {
        Lifeline {
            cancel,
            stopping,
            over: false,
        }
    }

    /// Resolves once the feed is over; at once after that. Cancel-safe.
    pub(super) async fn ended(&mut self) {
        if self.over {
            return;
        }
        tokio::select! {
            _ = &mut self.cancel => {}
            _ = self.stopping.wait() => {}
        }
        self.over = true;
    }

    /// Waits until the consumer has read its queue down to half; `false`
    /// when the feed is over instead.
    pub(super) async fn relieved<T>(&mut self, tx: &crate::driver::bridge::FeedSender<T>) -> bool {
        tokio::select! {
            relieved = tx.relieved() => relieved,
            _ = self.ended() => false,
        }
    }
}
