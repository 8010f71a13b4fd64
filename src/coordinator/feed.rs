//! The receiving end of a subscription, stream reader or KV watch.

use crossbeam_channel::{Receiver, RecvError, RecvTimeoutError, TryRecvError};
use parking_lot::Mutex;
use std::fmt;
use std::time::Duration;

type Hook = Box<dyn FnOnce() + Send>;

/// A crossbeam receiver plus a cancel hook that runs exactly once, when the
/// feed is dropped. [`Subscription`](super::Subscription),
/// [`StreamReader`](super::StreamReader) and [`KvWatcher`](super::KvWatcher)
/// are feeds.
///
/// The feed ends (`recv` returns an error) when its backend stops sending:
/// after the coordinator handle that opened it is closed, or when the
/// backend gives up on it. Items already queued are still delivered first.
#[must_use = "dropping a Feed cancels its subscription, stream read or watch"]
pub struct Feed<T> {
    rx: Receiver<T>,
    // A Mutex only to make the feed `Sync`; the hook is taken once, on drop.
    on_drop: Mutex<Option<Hook>>,
}

impl<T> Feed<T> {
    /// Wraps `rx`; `on_drop` runs when the feed is dropped and should tell
    /// the backend to stop sending (for backend authors).
    pub fn new(rx: Receiver<T>, on_drop: impl FnOnce() + Send + 'static) -> Self {
        Feed {
            rx,
            on_drop: Mutex::new(Some(Box::new(on_drop))),
        }
    }

    /// The underlying receiver, e.g. for `crossbeam_channel::select!`.
    pub fn receiver(&self) -> &Receiver<T> {
        &self.rx
    }

    /// Blocks until the next item, or an error once the feed has ended.
    pub fn recv(&self) -> Result<T, RecvError> {
        self.rx.recv()
    }

    /// Waits at most `timeout` for the next item.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.rx.recv_timeout(timeout)
    }

    /// The next item if one is queued.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        self.rx.try_recv()
    }

    /// A blocking iterator that ends when the feed ends.
    pub fn iter(&self) -> crossbeam_channel::Iter<'_, T> {
        self.rx.iter()
    }
}

impl<'a, T> IntoIterator for &'a Feed<T> {
    type Item = T;
    type IntoIter = crossbeam_channel::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.rx.iter()
    }
}

impl<T> Drop for Feed<T> {
    fn drop(&mut self) {
        if let Some(hook) = self.on_drop.get_mut().take() {
            hook();
        }
    }
}

impl<T> fmt::Debug for Feed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Feed")
            .field("queued", &self.rx.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn hook_runs_once_on_drop() {
        let count = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = crossbeam_channel::unbounded::<u8>();
        let c = count.clone();
        let feed = Feed::new(rx, move || {
            c.fetch_add(1, Ordering::SeqCst);
        });
        tx.send(7).unwrap();
        assert_eq!(feed.recv().unwrap(), 7);
        assert_eq!(count.load(Ordering::SeqCst), 0);
        drop(feed);
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }
}
