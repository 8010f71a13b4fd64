//! Whether the calling thread may block: the one rule every blocking entry
//! point of the crate applies, in every build.
//!
//! fleetcoord's API blocks its caller (on an answer from the driver thread,
//! on a join). A thread that is running an async runtime's tasks must not
//! block: it would stall every other task of that runtime, and on a
//! current-thread runtime it deadlocks when what the call waits for needs
//! that runtime (a leader to resign in another task of it, say). So a
//! blocking call from such a thread fails at once with
//! [`Error::InsideAsyncRuntime`] instead of blocking, and never panics;
//! anywhere else it works:
//!
//! | calling thread | outcome |
//! |---|---|
//! | a plain thread (no runtime entered) | works |
//! | `tokio::task::spawn_blocking` (any runtime flavour) | works |
//! | `tokio::task::block_in_place` (multi-thread runtime) | works |
//! | a thread inside `Handle::enter` but not running tasks | works |
//! | the thread of a multi-thread runtime's `block_on` | works: the runtime's tasks run on its workers (it stalls only that future, and a `LocalSet` it drives) |
//! | a multi-thread runtime's worker, running a task | refused |
//! | a current-thread runtime's `block_on` or one of its tasks | refused |
//! | a `LocalSet`'s tasks on a current-thread runtime | refused |
//!
//! How it is told: a thread may block unless it is inside a tokio
//! scheduler's context. tokio exposes no query for that, but
//! `tokio::task::yield_now` behaves by it, and says so in its source: inside
//! a scheduler the waker is handed to the scheduler (deferred until it has
//! run out of work), outside one — no runtime, a blocking-pool thread, a
//! worker inside `block_in_place`, which has given its core away — it is
//! woken at once. [`may_block`] polls `yield_now` once with a waker of its
//! own and looks whether it was woken during that poll. The first look,
//! `Handle::try_current`, is a thread-local read; only a thread with a
//! runtime entered pays for the poll. `tests/tokio_callers.rs` checks every
//! row of the table against the tokio version in use, so an upgrade that
//! changed the behaviour would fail there, not in users' programs.
//!
//! Other async runtimes (async-std, smol) are not detected: their threads
//! are plain threads here.

use crate::error::{Error, Result};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Wake, Waker};

/// A waker that only records that it was woken.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Whether the calling thread may block (see the module docs): false only
/// on a thread that is running a tokio runtime's tasks.
pub(crate) fn may_block() -> bool {
    if tokio::runtime::Handle::try_current().is_err() {
        return true;
    }
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let mut yielding = pin!(tokio::task::yield_now());
    // The first poll yields: it either wakes `waker` now (no scheduler
    // here) or hands it to the scheduler, which wakes it later, harmlessly.
    let _ = yielding.as_mut().poll(&mut cx);
    flag.0.load(Ordering::SeqCst)
}

/// `Ok` when the calling thread may block, else
/// [`Error::InsideAsyncRuntime`]: the first line of every blocking entry
/// point, before anything is sent or started.
pub(crate) fn check() -> Result<()> {
    if may_block() {
        Ok(())
    } else {
        Err(Error::InsideAsyncRuntime)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_thread_may_block() {
        assert!(may_block());
        assert!(check().is_ok());
    }

    #[test]
    fn a_current_thread_runtime_may_not_but_its_blocking_pool_may() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(!may_block(), "block_on's future");
            let task = tokio::spawn(async { may_block() });
            assert!(!task.await.unwrap(), "a task");
            let blocking = tokio::task::spawn_blocking(may_block);
            assert!(blocking.await.unwrap(), "spawn_blocking");
            assert!(matches!(check(), Err(Error::InsideAsyncRuntime)));
        });
        let local = tokio::task::LocalSet::new();
        let in_local_set = local.block_on(&rt, async {
            tokio::task::spawn_local(async { may_block() })
                .await
                .unwrap()
        });
        assert!(!in_local_set, "a LocalSet's task");
        let _entered = rt.enter();
        assert!(may_block(), "entered, running no tasks");
    }

    #[test]
    fn a_multi_thread_worker_may_not_unless_in_block_in_place() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        assert!(rt.block_on(async { may_block() }), "block_on's thread");
        let (worker, in_place, pool) = rt.block_on(async {
            let worker = tokio::spawn(async { may_block() }).await.unwrap();
            let in_place = tokio::spawn(async { tokio::task::block_in_place(may_block) })
                .await
                .unwrap();
            let pool = tokio::task::spawn_blocking(may_block).await.unwrap();
            (worker, in_place, pool)
        });
        assert!(!worker, "a worker running a task");
        assert!(in_place, "block_in_place");
        assert!(pool, "spawn_blocking");
    }
}
