//! Whether a backend handle is open, and the one rule for the errors of a
//! closed handle and of one whose runtime thread is gone, shared by every
//! backend (etcd, memory, noop, NATS, Redis).

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};

/// Open until [`Lifecycle::close`]; then every call fails with
/// [`Error::Closed`].
#[derive(Debug, Default)]
pub(crate) struct Lifecycle {
    closed: AtomicBool,
}

impl Lifecycle {
    /// An open handle's.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// `Err(Closed)` once the handle was closed.
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    /// Whether the handle was closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Marks the handle closed; `true` for the call that closed it, `false`
    /// when it already was (so closing twice does its work once).
    pub(crate) fn close(&self) -> bool {
        !self.closed.swap(true, Ordering::SeqCst)
    }

    /// The error for a call that found the handle's runtime thread gone:
    /// `Closed` when the handle was closed, `DriverGone` when the thread
    /// stopped by itself.
    #[cfg(any(feature = "nats", feature = "redis"))]
    pub(crate) fn gone(&self) -> Error {
        if self.is_closed() {
            Error::Closed
        } else {
            Error::DriverGone
        }
    }

    /// `e`, with a `DriverGone` from plumbing that cannot know about
    /// `close` made to follow [`Lifecycle::gone`].
    #[cfg(feature = "redis")]
    pub(crate) fn or_gone(&self, e: Error) -> Error {
        match e {
            Error::DriverGone => self.gone(),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_once() {
        let life = Lifecycle::new();
        assert!(life.check_open().is_ok());
        assert!(life.close(), "the first close closes");
        assert!(!life.close(), "the second finds it closed");
        assert!(matches!(life.check_open(), Err(Error::Closed)));
    }

    #[cfg(any(feature = "nats", feature = "redis"))]
    #[test]
    fn gone_follows_close() {
        let life = Lifecycle::new();
        assert!(matches!(life.gone(), Error::DriverGone));
        assert!(matches!(life.or_gone(Error::DriverGone), Error::DriverGone));
        life.close();
        assert!(matches!(life.gone(), Error::Closed));
        assert!(matches!(life.or_gone(Error::DriverGone), Error::Closed));
        assert!(matches!(life.or_gone(Error::NotFound), Error::NotFound));
    }
}
