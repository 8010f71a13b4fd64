//! The one runtime thread: a named OS thread running a tokio
//! `current_thread` runtime, reached from user threads by a command
//! channel. The etcd driver (its machines, renewer and health monitor
//! included) and every async bus client (NATS, Redis) run on one of these;
//! nothing else in the crate starts a runtime.
//!
//! What it guarantees, for every user of it:
//!
//! * **Connecting is part of starting.** [`start`] runs the caller's
//!   `connect` future on the new runtime and returns only once it has
//!   answered, so a bad endpoint is reported to the caller of `connect()`,
//!   not later. If the thread does not answer within `connect_timeout`
//!   plus [`REPORT_SLACK`] (a `connect` that blocks its thread), `start`
//!   gives up; the thread ends on its own once `connect` returns.
//! * **Sending never blocks and needs no runtime**: [`RuntimeThread::send`]
//!   is an unbounded tokio channel send, callable from any thread.
//! * **Every command becomes one task**, made by the caller's `dispatch`
//!   from the command and the state `connect` produced; finished tasks are
//!   reaped as commands arrive, so a long-lived handle does not accumulate
//!   them.
//! * **A call can run on its caller's thread**: [`RuntimeThread::block_on`]
//!   polls a future on the calling thread inside the runtime's context,
//!   while the runtime thread drives the I/O and timers it waits on. No
//!   task is spawned and no answer crosses back, so concurrent callers do
//!   their own polling instead of queueing behind one thread. The runtime
//!   outlives every such poll (tokio panics when a timer is polled after
//!   its runtime is gone): shutdown refuses new calls, gives running ones
//!   the same grace as tasks, then makes them give up and waits until
//!   they have.
//! * **Shutdown is bounded.** [`RuntimeThread::shutdown`] raises
//!   [`Stopping`], gives the tasks `grace` to wind down (revoke a lease,
//!   resign, unsubscribe), aborts the rest and joins the thread — unless
//!   it is called from the runtime thread itself, where joining would
//!   deadlock; the thread then ends on its own. Idempotent.
//!
//! Nothing here knows etcd, NATS, Redis or the facade: commands, state and
//! errors are the caller's.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// A task for the runtime.
pub(crate) type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How long past its own `connect_timeout` [`start`] waits for a thread to
/// report: `connect` bounds itself, so this only covers a thread too slow
/// (or too blocked) to say so.
pub(crate) const REPORT_SLACK: Duration = Duration::from_secs(5);

/// Why a runtime thread could not be started.
#[derive(Debug)]
pub(crate) enum StartError {
    /// The thread or its runtime could not be created.
    Io(std::io::Error),
    /// The server did not answer; one line for an operator.
    Connect(String),
}

/// The runtime thread has stopped; nothing more can be done through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Gone;

/// Why a call on a runtime thread ([`RuntimeThread::block_on`], a bus
/// client's `Bridge::call`) has no output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The caller's timeout passed first; the future was dropped, but what
    /// it sent may have reached the server (the outcome is unknown).
    Timeout,
    /// The runtime is shutting down (or gone), the future panicked, or the
    /// call was made from the runtime thread itself, where waiting would
    /// deadlock.
    Gone,
    /// The caller's thread runs an async runtime's tasks, where blocking
    /// is refused (`crate::blocking`); nothing was polled.
    InsideAsyncRuntime,
}

/// How often shutdown looks whether the calls polled on their callers'
/// threads have ended. Shutdown only; a call ends at its next wake-up once
/// told to.
const CALLS_POLL: Duration = Duration::from_millis(1);

/// The calls being polled on their callers' threads, and the signals that
/// end them at shutdown.
struct Calls {
    /// Calls between their start and the drop of their future.
    running: AtomicUsize,
    /// Set at shutdown: no call starts any more.
    closed: AtomicBool,
    /// Raised when the shutdown grace is over: running calls give up.
    abort: watch::Sender<bool>,
    /// How long a call that got its answer typically took, in
    /// nanoseconds: a moving average (weight 1/8) that decides whether
    /// calls spin ([`may_spin`]).
    typical: AtomicU64,
}

impl Calls {
    fn typical(&self) -> Duration {
        Duration::from_nanos(self.typical.load(Ordering::Relaxed))
    }

    /// Counts `took` into the moving average. Racing updates may lose
    /// one sample: it only steers spinning.
    fn took(&self, took: Duration) {
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let old = self.typical.load(Ordering::Relaxed);
        let new = old - old / 8 + took / 8;
        self.typical.store(new, Ordering::Relaxed);
    }
}

impl Calls {
    /// Counts a call in, unless shutdown has begun. Counting before
    /// looking (both sequentially consistent) means that shutdown, which
    /// closes before it counts, either sees this call or is seen by it.
    fn enter(self: &Arc<Self>) -> Option<Running> {
        self.running.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.running.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Running(self.clone()))
    }

    /// Waits until no call is running.
    async fn idle(&self) {
        while self.running.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(CALLS_POLL).await;
        }
    }
}

/// One running call; counts it out when dropped.
struct Running(Arc<Calls>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Wakes a thread waiting in [`RuntimeThread::block_on`]: raises a flag
/// that a spinning waiter sees without a system call, then unparks it,
/// which costs a system call only when the waiter is parked (std's
/// parker swaps a state and calls the kernel only for a parked thread).
struct Signal {
    woken: AtomicBool,
    thread: std::thread::Thread,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// How long a call waits for its answer by spinning before it parks, and
/// the most a runtime's typical call may take for its calls to spin at
/// all: about a loopback round trip of Redis or NATS through the runtime
/// thread. An answer within it reaches the caller without the kernel
/// waking a parked thread (a futex call on the runtime thread and a
/// scheduler wake-up on the caller's side, tens of microseconds on a
/// virtual machine whose idle core has halted). Calls that typically take
/// longer (etcd's answers take 350 us and more on loopback, its writes
/// wait on the disk) never spin: measured on 2 cores, spinning for them
/// took the core etcd itself needed and made a get 60 us slower.
const SPIN: Duration = Duration::from_micros(200);

/// Whether a waiting call spins before parking: only while the running
/// calls leave a core idle beside the runtime thread's, so that spinning
/// never takes the core the answer needs, and only when the runtime's
/// calls typically end within [`SPIN`].
fn may_spin(running: usize, typical: Duration) -> bool {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    running < cores && typical <= SPIN
}

/// Resolves when the runtime thread shuts down; every task can select on
/// it and should end within the thread's grace once it fires.
#[derive(Clone)]
pub(crate) struct Stopping(watch::Receiver<bool>);

impl Stopping {
    /// Waits until the thread is shutting down.
    // The etcd driver's tasks watch `receiver()`; the bus bridges use these.
    #[cfg_attr(not(any(feature = "nats", feature = "redis")), allow(dead_code))]
    pub(crate) async fn wait(&self) {
        let mut rx = self.0.clone();
        // An error means the sender is gone: the runtime is ending anyway.
        let _ = rx.wait_for(|stopping| *stopping).await;
    }

    /// Whether the thread is shutting down.
    #[cfg_attr(not(any(feature = "nats", feature = "redis")), allow(dead_code))]
    pub(crate) fn is_stopping(&self) -> bool {
        *self.0.borrow()
    }

    /// The underlying flag, for loops that `changed()` on it among other
    /// branches of a `select!`.
    pub(crate) fn receiver(&self) -> watch::Receiver<bool> {
        self.0.clone()
    }
}

/// What `connect` hands back once connected: the `state` every dispatched
/// task is made from, the `answer` [`start`] returns to its caller, and
/// tasks to run from the start (until shutdown, like any other).
pub(crate) struct Launch<S, C> {
    pub state: S,
    pub answer: C,
    pub tasks: Vec<Job>,
}

enum Cmd<M> {
    Do(M),
    Shutdown,
}

/// The user-side end of a runtime thread. Dropping it shuts the thread
/// down.
pub(crate) struct RuntimeThread<M> {
    tx: mpsc::UnboundedSender<Cmd<M>>,
    handle: tokio::runtime::Handle,
    calls: Arc<Calls>,
    #[cfg_attr(not(any(feature = "nats", feature = "redis")), allow(dead_code))]
    stopping: Stopping,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
    thread_id: std::thread::ThreadId,
    name: String,
}

/// Starts a thread named `name` with its runtime and runs `connect` on it.
/// On success every later [`RuntimeThread::send`] becomes the task
/// `dispatch(&state, command)`; after shutdown tasks get `grace` before
/// they are aborted. `connect` gets the thread's [`Stopping`] (to hand to
/// long-lived tasks) and must bound itself by `connect_timeout`; its error
/// is one line for an operator and becomes [`StartError::Connect`].
pub(crate) fn start<M, S, C, F, Fut, D>(
    name: &str,
    connect_timeout: Duration,
    grace: Duration,
    connect: F,
    mut dispatch: D,
) -> Result<(RuntimeThread<M>, C), StartError>
where
    M: Send + 'static,
    S: 'static,
    C: Send + 'static,
    F: FnOnce(Stopping) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Launch<S, C>, String>> + 'static,
    D: FnMut(&S, M) -> Job + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<Cmd<M>>();
    type Ready<C> = Result<(C, tokio::runtime::Handle), StartError>;
    let (ready_tx, ready_rx) = crossbeam_channel::bounded::<Ready<C>>(1);
    let (stop_tx, stop_rx) = watch::channel(false);
    let calls = Arc::new(Calls {
        running: AtomicUsize::new(0),
        closed: AtomicBool::new(false),
        abort: watch::channel(false).0,
        typical: AtomicU64::new(0),
    });
    let calls_here = calls.clone();
    let stopping = Stopping(stop_rx);
    let for_connect = stopping.clone();
    let thread_name = name.to_string();
    let thread = std::thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(StartError::Io(e)));
                    return;
                }
            };
            let handle = runtime.handle().clone();
            runtime.block_on(async move {
                let launch = match connect(for_connect).await {
                    Ok(launch) => launch,
                    Err(reason) => {
                        let _ = ready_tx.send(Err(StartError::Connect(reason)));
                        return;
                    }
                };
                let Launch {
                    state,
                    answer,
                    tasks: first,
                } = launch;
                if ready_tx.send(Ok((answer, handle))).is_err() {
                    // `start` gave up waiting: nobody will send commands.
                    return;
                }
                let mut tasks = tokio::task::JoinSet::new();
                for job in first {
                    tasks.spawn(job);
                }
                while let Some(cmd) = rx.recv().await {
                    match cmd {
                        Cmd::Do(command) => {
                            tasks.spawn(dispatch(&state, command));
                        }
                        Cmd::Shutdown => break,
                    }
                    while tasks.try_join_next().is_some() {}
                }
                let _ = stop_tx.send(true);
                calls_here.closed.store(true, Ordering::SeqCst);
                let drained = tokio::time::timeout(grace, async {
                    while tasks.join_next().await.is_some() {}
                    calls_here.idle().await;
                })
                .await;
                if drained.is_err() {
                    log::warn!(
                        "fleetcoord {thread_name}: tasks or calls still running {grace:?} after close; aborting them"
                    );
                    tasks.abort_all();
                }
                // The runtime must outlive every poll of a call: they end
                // at their next wake-up, which the abort causes.
                calls_here.abort.send_replace(true);
                calls_here.idle().await;
            });
        })
        .map_err(StartError::Io)?;
    let thread_id = thread.thread().id();
    let wait = connect_timeout.saturating_add(REPORT_SLACK);
    match ready_rx.recv_timeout(wait) {
        Ok(Ok((answer, handle))) => Ok((
            RuntimeThread {
                tx,
                handle,
                calls,
                stopping,
                thread: parking_lot::Mutex::new(Some(thread)),
                thread_id,
                name: name.to_string(),
            },
            answer,
        )),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
            // The thread ends on its own once `connect` returns: its ready
            // sender then finds nobody listening, and `tx` is dropped here.
            Err(StartError::Connect(format!(
                "no answer within {connect_timeout:?}"
            )))
        }
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
            let _ = thread.join();
            Err(StartError::Connect(format!(
                "the {name} thread ended before connecting"
            )))
        }
    }
}

impl<M> RuntimeThread<M> {
    /// Hands `command` to the runtime; [`Gone`] once it has shut down.
    pub(crate) fn send(&self, command: M) -> Result<(), Gone> {
        self.tx.send(Cmd::Do(command)).map_err(|_| Gone)
    }

    /// Polls `fut` on the calling thread, inside the runtime's context (its
    /// timers, I/O and spawns are the runtime thread's), until its output,
    /// at most `timeout` (saturating: `Duration::MAX` waits for ever). On
    /// timeout, or when the runtime's shutdown grace is over, the future is
    /// dropped here before this returns. A panic of the future ends only
    /// this call ([`CallError::Gone`]), as it would end only its task on
    /// the runtime. Called from the runtime thread itself, where nothing
    /// would drive the future, it refuses ([`CallError::Gone`]).
    pub(crate) fn block_on<F: Future>(
        &self,
        timeout: Duration,
        fut: F,
    ) -> Result<F::Output, CallError> {
        if self.is_current() {
            return Err(CallError::Gone);
        }
        if !crate::blocking::may_block() {
            return Err(CallError::InsideAsyncRuntime);
        }
        let Some(running) = self.calls.enter() else {
            return Err(CallError::Gone);
        };
        let out = {
            let _context = self.handle.enter();
            let mut abort = self.calls.abort.subscribe();
            let mut aborted = pin!(async move {
                // An error means the sender is gone: so is the runtime.
                let _ = abort.wait_for(|abort| *abort).await;
            });
            let started = Instant::now();
            let deadline = started.checked_add(timeout);
            let signal = Arc::new(Signal {
                woken: AtomicBool::new(false),
                thread: std::thread::current(),
            });
            let waker = Waker::from(signal.clone());
            let mut cx = Context::from_waker(&waker);
            let mut fut = pin!(fut);
            loop {
                // Cleared before polling: a wake during the poll is seen.
                signal.woken.store(false, Ordering::Release);
                let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    fut.as_mut().poll(&mut cx)
                }));
                match polled {
                    Ok(Poll::Ready(out)) => {
                        self.calls.took(started.elapsed());
                        break Ok(out);
                    }
                    Ok(Poll::Pending) => {}
                    // The panic hook has reported it; as a task's panic
                    // on the runtime, it ends this call only.
                    Err(_) => break Err(CallError::Gone),
                }
                if aborted.as_mut().poll(&mut cx).is_ready() {
                    break Err(CallError::Gone);
                }
                let left = match deadline {
                    Some(deadline) => {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break Err(CallError::Timeout);
                        }
                        Some(left)
                    }
                    None => None,
                };
                let running = self.calls.running.load(Ordering::Relaxed);
                if may_spin(running, self.calls.typical()) {
                    let spun = Instant::now();
                    while !signal.woken.load(Ordering::Acquire) && spun.elapsed() < SPIN {
                        std::hint::spin_loop();
                    }
                }
                if signal.woken.load(Ordering::Acquire) {
                    // The unpark left a token: a later park returns at
                    // once, a spurious wake-up the loop tolerates.
                    continue;
                }
                match left {
                    Some(left) => std::thread::park_timeout(left),
                    None => std::thread::park(),
                }
            }
            // `fut` is dropped here, inside the context and while counted.
        };
        drop(running);
        out
    }

    /// The thread's shutdown signal.
    #[cfg_attr(not(any(feature = "nats", feature = "redis")), allow(dead_code))]
    pub(crate) fn stopping(&self) -> &Stopping {
        &self.stopping
    }

    /// Whether the caller is the runtime thread itself, where blocking on
    /// an answer from the runtime would deadlock.
    pub(crate) fn is_current(&self) -> bool {
        std::thread::current().id() == self.thread_id
    }

    /// Raises [`Stopping`], gives tasks their grace, aborts the rest and
    /// joins the thread (unless called from it). Idempotent; concurrent
    /// callers do not wait on each other's join.
    ///
    /// From a thread that may not block (`crate::blocking`: one running an
    /// async runtime's tasks, which reaches here through a drop) it does
    /// not join either: the thread winds down and ends on its own, within
    /// the same grace, and nothing waits for it.
    pub(crate) fn shutdown(&self) {
        let _ = self.tx.send(Cmd::Shutdown);
        let thread = self.thread.lock().take();
        if let Some(thread) = thread {
            if self.is_current() || !crate::blocking::may_block() {
                return;
            }
            if thread.join().is_err() {
                log::error!("fleetcoord {} thread panicked", self.name);
            }
        }
    }
}

impl<M> Drop for RuntimeThread<M> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Reply = crossbeam_channel::Sender<u32>;

    /// A launch with no state, answer or first tasks.
    fn bare() -> Launch<(), ()> {
        Launch {
            state: (),
            answer: (),
            tasks: Vec::new(),
        }
    }

    fn started(grace: Duration) -> RuntimeThread<(u32, Reply)> {
        let (thread, answer) = start(
            "test-runtime",
            Duration::from_secs(5),
            grace,
            |_| async {
                Ok(Launch {
                    state: 100u32,
                    answer: 42u32,
                    tasks: Vec::new(),
                })
            },
            |base: &u32, (n, reply): (u32, Reply)| {
                let sum = base + n;
                Box::pin(async move {
                    let _ = reply.send(sum);
                })
            },
        )
        .unwrap();
        assert_eq!(answer, 42);
        thread
    }

    #[test]
    fn commands_become_tasks_made_from_the_state() {
        let thread = started(Duration::from_secs(1));
        let (tx, rx) = crossbeam_channel::bounded(1);
        thread.send((5, tx)).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(105));
        thread.shutdown();
        thread.shutdown();
        let (tx, _rx) = crossbeam_channel::bounded(1);
        assert_eq!(thread.send((1, tx)), Err(Gone));
    }

    #[test]
    fn first_tasks_run_until_stopping_and_shutdown_waits_for_them() {
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
        let (thread, ()) = start(
            "test-runtime",
            Duration::from_secs(5),
            Duration::from_secs(5),
            move |stopping: Stopping| async move {
                let task: Job = Box::pin(async move {
                    stopping.wait().await;
                    let _ = done_tx.send(());
                });
                Ok(Launch {
                    state: (),
                    answer: (),
                    tasks: vec![task],
                })
            },
            |_: &(), (): ()| -> Job { Box::pin(async {}) },
        )
        .unwrap();
        assert!(done_rx.try_recv().is_err(), "runs until stopping");
        let t = std::time::Instant::now();
        thread.shutdown();
        assert!(done_rx.try_recv().is_ok(), "it saw stopping and ended");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    #[test]
    fn a_failed_or_panicking_connect_is_reported_by_start() {
        let err = start(
            "test-runtime",
            Duration::from_secs(5),
            Duration::from_secs(1),
            |_| async { Err::<Launch<(), ()>, _>("refused at 127.0.0.1:1".to_string()) },
            |_: &(), (): ()| -> Job { Box::pin(async {}) },
        )
        .err()
        .unwrap();
        assert!(matches!(err, StartError::Connect(ref m) if m.contains("127.0.0.1:1")));
        let err = start(
            "test-runtime",
            Duration::from_secs(5),
            Duration::from_secs(1),
            |_| async {
                if true {
                    panic!("connect blew up (expected by this test)");
                }
                Ok(bare())
            },
            |_: &(), (): ()| -> Job { Box::pin(async {}) },
        )
        .err()
        .unwrap();
        assert!(
            matches!(err, StartError::Connect(ref m) if m.contains("test-runtime thread ended before connecting")),
            "{err:?}"
        );
    }

    #[test]
    fn a_connect_that_blocks_its_thread_past_the_slack_times_out() {
        let t = std::time::Instant::now();
        let err = start(
            "test-runtime",
            Duration::from_millis(1),
            Duration::from_secs(1),
            |_| async {
                std::thread::sleep(REPORT_SLACK + Duration::from_millis(500));
                Ok(bare())
            },
            |_: &(), (): ()| -> Job { Box::pin(async {}) },
        )
        .err()
        .unwrap();
        assert!(
            matches!(err, StartError::Connect(ref m) if m.contains("no answer within 1ms")),
            "{err:?}"
        );
        assert!(t.elapsed() >= REPORT_SLACK, "{:?}", t.elapsed());
    }

    #[test]
    fn tasks_that_ignore_stopping_are_aborted_after_the_grace() {
        let grace = Duration::from_millis(300);
        struct OnDrop(crossbeam_channel::Sender<()>);
        impl Drop for OnDrop {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        let (dropped_tx, dropped_rx) = crossbeam_channel::bounded::<()>(1);
        let (thread, ()) = start(
            "test-runtime",
            Duration::from_secs(5),
            grace,
            |_| async { Ok(bare()) },
            |_: &(), guard: OnDrop| -> Job {
                Box::pin(async move {
                    let _guard = guard;
                    std::future::pending::<()>().await
                })
            },
        )
        .unwrap();
        thread.send(OnDrop(dropped_tx)).unwrap();
        let t = std::time::Instant::now();
        thread.shutdown();
        assert!(t.elapsed() >= grace, "{:?}", t.elapsed());
        assert!(dropped_rx.try_recv().is_ok(), "the task was aborted");
    }

    #[test]
    fn calls_spin_only_beside_an_idle_core_and_when_answers_are_quick() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let quick = Duration::from_micros(90);
        assert!(may_spin(0, quick), "alone, quick answers: spin");
        assert!(may_spin(0, SPIN), "the bound itself still spins");
        assert!(!may_spin(cores, quick), "no core left idle: park");
        assert!(
            !may_spin(0, SPIN + Duration::from_micros(1)),
            "answers slower than the spin: park"
        );
    }

    #[test]
    fn the_typical_call_follows_the_calls_and_never_overflows() {
        let calls = Calls {
            running: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            abort: watch::channel(false).0,
            typical: AtomicU64::new(0),
        };
        for _ in 0..200 {
            calls.took(Duration::from_micros(100));
        }
        let typical = calls.typical();
        assert!(
            typical > Duration::from_micros(99) && typical <= Duration::from_micros(100),
            "{typical:?}"
        );
        for _ in 0..50 {
            calls.took(Duration::from_micros(800));
        }
        assert!(
            calls.typical() > SPIN,
            "a runtime whose calls got slow stops spinning"
        );
        calls.took(Duration::MAX);
        calls.took(Duration::MAX);
        assert!(calls.typical() > Duration::from_secs(3600));
    }
}
