//! A connection its callers drive: a client on a tokio `current_thread`
//! runtime that has no thread of its own, for request/response calls from
//! blocking threads.
//!
//! Through a [`crate::runtime`] thread a blocking call costs two wake-ups
//! of another thread: the runtime's, to write the request, and the
//! caller's, for the answer (tens of microseconds each on a virtual
//! machine; BENCHMARKS.md, "Issue 45"). Here the calling thread writes,
//! reads and polls its call itself, as a raw client on the calling thread
//! does. The etcd driver's unary calls (`driver::direct`) and the Redis
//! bus's commands use it; whatever needs progress between calls (renewals,
//! watches, subscriptions, stream readers) stays on the runtime thread.
//!
//! What it guarantees, for every user of it:
//!
//! * **A lone call never crosses a thread.** [`Taken::run`] runs
//!   the call in `Runtime::block_on` on the calling thread. Concurrent
//!   callers take turns driving the connection (tokio hands the runtime's
//!   core from one `block_on` to the next) and each polls its own call, so
//!   they pipeline on the one connection.
//! * **Nothing runs between calls.** Nobody drives the connection while no
//!   call runs, so its client must not depend on background progress
//!   (no pings it would have to answer in time). A connection that died
//!   while idle is found by the next call: when a call's answer says the
//!   connection is suspect ([`Health::Suspect`]: no answer in time, a
//!   broken connection), or the call panicked, the connection is dropped
//!   and the next call builds a new one.
//! * **One connection per call.** A call runs on one connection, and
//!   whatever it answers is the caller's: it is never run again on another.
//! * **Building never fails a call.** A connection is built lazily by the
//!   first call that needs it (or whose `epoch` is newer than the one it
//!   was built for), on that call's thread, within the connect timeout.
//!   While none is ready (another caller is building it, building failed
//!   within the last [`RETRY_AFTER`], the handle is closed, the caller is
//!   inside a tokio runtime), the call is not taken ([`CallerDriven::take`] is `None`) and the caller takes
//!   its runtime thread's path instead: the same server and answers, two
//!   wake-ups more.
//! * **Closing ends it.** After [`CallerDriven::close`] no call is taken,
//!   and the runtime ends when the last call on it has, without blocking
//!   (`shutdown_background`), so it may end on any thread.

use parking_lot::Mutex;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long after a failed build calls are not taken before one tries
/// again.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What a call's answer says of its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Health {
    /// An answer came (an error of the server's own included).
    Sound,
    /// No answer in time, or the connection broke: drop it.
    Suspect,
}

/// How a taken call ended.
#[derive(Debug)]
pub(crate) enum Ran<T> {
    /// The call's own output.
    Answer(T),
    /// The caller's `wait` passed first; the call was dropped (what it
    /// sent may have reached the server).
    Waited,
    /// The call panicked (the panic hook has reported it); as a task's
    /// panic on a runtime, it ends this call only.
    Panicked,
}

/// A runtime that ends without blocking when the last call on it is done.
struct Driven(Option<tokio::runtime::Runtime>);

impl Drop for Driven {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// One built connection: its runtime, its client, and the epoch it was
/// built for.
struct Conn<C> {
    epoch: u64,
    rt: Arc<Driven>,
    client: C,
}

impl<C: Clone> Clone for Conn<C> {
    fn clone(&self) -> Self {
        Conn {
            epoch: self.epoch,
            rt: self.rt.clone(),
            client: self.client.clone(),
        }
    }
}

enum State<C> {
    /// No connection; the next call may build one (from `not_before`).
    Idle {
        not_before: Option<Instant>,
    },
    /// A caller is building one; the others are not taken meanwhile.
    Building,
    Ready(Conn<C>),
    Closed,
}

/// A lazily built client `C` on a runtime its callers drive.
pub(crate) struct CallerDriven<C> {
    connect_timeout: Duration,
    state: Mutex<State<C>>,
}

impl<C: Clone> CallerDriven<C> {
    /// Nothing built yet; a build may take `connect_timeout`.
    pub(crate) fn new(connect_timeout: Duration) -> CallerDriven<C> {
        CallerDriven {
            connect_timeout,
            state: Mutex::new(State::Idle { not_before: None }),
        }
    }

    /// The connection built for `epoch`, built now with `build` when there
    /// is none (or only one for an older epoch); `None` when none can be
    /// had now (see the module docs): the call then takes its runtime
    /// thread's path.
    pub(crate) fn take<B, BFut>(&self, epoch: u64, build: B) -> Option<Taken<'_, C>>
    where
        B: FnOnce() -> BFut,
        BFut: Future<Output = Result<C, String>>,
    {
        // A runtime of our own may not be entered from inside another's
        // context (its workers, `block_in_place`, `spawn_blocking`).
        if tokio::runtime::Handle::try_current().is_ok() {
            return None;
        }
        let conn = self.conn(epoch, build)?;
        Some(Taken { owner: self, conn })
    }

    /// No call is taken any more; the connection ends with the last call
    /// running on it.
    pub(crate) fn close(&self) {
        *self.state.lock() = State::Closed;
    }

    /// Whether a connection is ready (for tests and metrics).
    #[cfg(test)]
    pub(crate) fn is_ready(&self) -> bool {
        matches!(*self.state.lock(), State::Ready(_))
    }

    /// The connection for `epoch`, built now when there is none (or one
    /// for an older epoch) and nobody else is building one.
    fn conn<B, BFut>(&self, epoch: u64, build: B) -> Option<Conn<C>>
    where
        B: FnOnce() -> BFut,
        BFut: Future<Output = Result<C, String>>,
    {
        {
            let mut state = self.state.lock();
            match &*state {
                State::Ready(conn) if conn.epoch >= epoch => return Some(conn.clone()),
                State::Ready(_) => *state = State::Building,
                State::Idle { not_before } => {
                    if not_before.is_some_and(|at| Instant::now() < at) {
                        return None;
                    }
                    *state = State::Building;
                }
                State::Building | State::Closed => return None,
            }
        }
        // Built outside the lock: it may take round trips (a login), and
        // the other callers meanwhile take the runtime thread's path.
        let built = self.build(epoch, build);
        let mut state = self.state.lock();
        if matches!(*state, State::Closed) {
            return None;
        }
        match built {
            Ok(conn) => {
                *state = State::Ready(conn.clone());
                Some(conn)
            }
            Err(why) => {
                log::debug!("calls stay on the runtime thread for now: {why}");
                *state = State::Idle {
                    not_before: Instant::now().checked_add(RETRY_AFTER),
                };
                None
            }
        }
    }

    /// Forgets `conn` (not a newer one another caller built since).
    fn forget(&self, conn: &Conn<C>) {
        let mut state = self.state.lock();
        if matches!(&*state, State::Ready(ready) if Arc::ptr_eq(&ready.rt, &conn.rt)) {
            *state = State::Idle { not_before: None };
        }
    }

    fn build<B, BFut>(&self, epoch: u64, build: B) -> Result<Conn<C>, String>
    where
        B: FnOnce() -> BFut,
        BFut: Future<Output = Result<C, String>>,
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("no runtime: {e}"))?;
        let timeout = self.connect_timeout;
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(async {
                match tokio::time::timeout(timeout, build()).await {
                    Ok(built) => built,
                    Err(_) => Err(format!("no answer within {timeout:?}")),
                }
            })
        }))
        .unwrap_or_else(|_| Err("building the connection panicked".to_string()));
        let rt = Arc::new(Driven(Some(rt)));
        built.map(|client| Conn { epoch, rt, client })
    }
}

/// A connection taken for one call.
pub(crate) struct Taken<'a, C> {
    owner: &'a CallerDriven<C>,
    conn: Conn<C>,
}

impl<C: Clone> Taken<'_, C> {
    /// Runs `op` on the connection, on the calling thread, for at most
    /// `wait`; `op` says with its output whether the connection is still
    /// sound.
    pub(crate) fn run<T, F, Fut>(self, wait: Duration, op: F) -> Ran<T>
    where
        F: FnOnce(C) -> Fut,
        Fut: Future<Output = (T, Health)>,
    {
        let Some(rt) = self.conn.rt.0.as_ref() else {
            return Ran::Panicked;
        };
        let call = op(self.conn.client.clone());
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(async { tokio::time::timeout(wait, call).await })
        }));
        match ran {
            Ok(Ok((out, health))) => {
                if health == Health::Suspect {
                    self.owner.forget(&self.conn);
                }
                Ran::Answer(out)
            }
            // The caller's own patience ran out: no evidence against the
            // connection (the call bounds itself by its request timeout).
            Ok(Err(_)) => Ran::Waited,
            Err(_) => {
                self.owner.forget(&self.conn);
                Ran::Panicked
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const WAIT: Duration = Duration::from_secs(5);

    /// A "client" that is the number of the build that made it.
    fn counting(builds: &AtomicUsize) -> impl Future<Output = Result<usize, String>> + '_ {
        async move { Ok(builds.fetch_add(1, Ordering::SeqCst)) }
    }

    fn sound<T>(out: T) -> impl Future<Output = (T, Health)> {
        async move { (out, Health::Sound) }
    }

    fn answer<T: std::fmt::Debug>(ran: Option<Ran<T>>) -> T {
        match ran {
            Some(Ran::Answer(out)) => out,
            other => panic!("no answer: {other:?}"),
        }
    }

    /// `take` then `run`: `None` when not taken.
    fn call<C, T, B, BFut, F, Fut>(
        cd: &CallerDriven<C>,
        epoch: u64,
        build: B,
        wait: Duration,
        op: F,
    ) -> Option<Ran<T>>
    where
        C: Clone,
        B: FnOnce() -> BFut,
        BFut: Future<Output = Result<C, String>>,
        F: FnOnce(C) -> Fut,
        Fut: Future<Output = (T, Health)>,
    {
        Some(cd.take(epoch, build)?.run(wait, op))
    }

    #[test]
    fn a_call_runs_on_its_callers_thread_on_the_connection_built_once() {
        let builds = AtomicUsize::new(0);
        let cd = CallerDriven::new(WAIT);
        for _ in 0..3 {
            let here = std::thread::current().id();
            let (client, thread) = answer(call(
                &cd,
                0,
                || counting(&builds),
                WAIT,
                |c| sound((c, std::thread::current().id())),
            ));
            assert_eq!(client, 0, "built once, then reused");
            assert_eq!(thread, here);
        }
        assert_eq!(builds.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_suspect_answer_or_a_panic_drops_the_connection_and_a_newer_epoch_rebuilds() {
        let builds = AtomicUsize::new(0);
        let cd = CallerDriven::new(WAIT);
        let first = answer(call(
            &cd,
            0,
            || counting(&builds),
            WAIT,
            |c| async move { (c, Health::Suspect) },
        ));
        assert!(!cd.is_ready(), "dropped");
        let second = answer(call(&cd, 0, || counting(&builds), WAIT, sound));
        assert_ne!(first, second, "built anew");
        let panicked = call(
            &cd,
            0,
            || counting(&builds),
            WAIT,
            |_| async {
                if true {
                    panic!("a call that panics (expected in this test)");
                }
                ((), Health::Sound)
            },
        );
        assert!(matches!(panicked, Some(Ran::Panicked)));
        let third = answer(call(&cd, 0, || counting(&builds), WAIT, sound));
        assert_ne!(second, third, "built anew after the panic");
        let fourth = answer(call(&cd, 1, || counting(&builds), WAIT, sound));
        assert_ne!(third, fourth, "a newer epoch builds anew");
        assert_eq!(
            answer(call(&cd, 0, || counting(&builds), WAIT, sound)),
            fourth
        );
    }

    #[test]
    fn a_failed_build_is_not_retried_within_retry_after_and_closed_takes_nothing() {
        let cd: CallerDriven<usize> = CallerDriven::new(WAIT);
        let failed = call(&cd, 0, || async { Err("refused".to_string()) }, WAIT, sound);
        assert!(failed.is_none());
        let builds = AtomicUsize::new(0);
        assert!(call(&cd, 0, || counting(&builds), WAIT, sound).is_none());
        assert_eq!(builds.load(Ordering::SeqCst), 0, "not even tried");
        std::thread::sleep(RETRY_AFTER);
        answer(call(&cd, 0, || counting(&builds), WAIT, sound));
        cd.close();
        assert!(call(&cd, 0, || counting(&builds), WAIT, sound).is_none());
    }

    #[test]
    fn a_build_or_call_past_its_time_ends_in_time() {
        let cd: CallerDriven<usize> = CallerDriven::new(Duration::from_millis(100));
        let started = Instant::now();
        let never = call(&cd, 0, std::future::pending, WAIT, sound);
        assert!(never.is_none());
        assert!(started.elapsed() < Duration::from_secs(2));

        let cd: CallerDriven<usize> = CallerDriven::new(WAIT);
        let builds = AtomicUsize::new(0);
        let started = Instant::now();
        let slow = call(
            &cd,
            0,
            || counting(&builds),
            Duration::from_millis(100),
            |_| std::future::pending::<((), Health)>(),
        );
        assert!(matches!(slow, Some(Ran::Waited)));
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(cd.is_ready(), "impatience is no evidence against it");
    }

    #[test]
    fn inside_a_tokio_runtime_nothing_is_taken() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let cd: CallerDriven<usize> = CallerDriven::new(WAIT);
        let builds = AtomicUsize::new(0);
        let _inside = rt.enter();
        assert!(call(&cd, 0, || counting(&builds), WAIT, sound).is_none());
    }
}
