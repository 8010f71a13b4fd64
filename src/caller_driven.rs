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
//!   the call in `Runtime::block_on` on the calling thread.
//! * **A connection per overlapping caller, up to [`MAX_CONNS`]; never
//!   a queue.** A call takes a built connection no other call is running
//!   on. When every one is busy it takes its runtime thread's path, and
//!   one more connection starts being built for the next. Callers never
//!   share one: on a shared connection every answer the driving thread
//!   reads for another caller costs that caller a wake-up, and the
//!   connection stalls while its core changes hands (BENCHMARKS.md,
//!   "Fourth round": from 4 threads, a connection each went 1.6x faster
//!   than one shared; past four, the runtime thread, which keeps driving
//!   its connection, does better than sharing). A busy connection costs a
//!   caller one atomic load, never a lock. An extra connection unused for
//!   [`IDLE_FOR`] is ended when a call on the first one ends, so the pool
//!   shrinks to one once callers stop overlapping.
//! * **Nothing runs between calls.** Nobody drives the connection while no
//!   call runs, so its client must not depend on background progress
//!   (no pings it would have to answer in time). A connection that died
//!   while idle is found by the next call: when a call's answer says the
//!   connection is suspect ([`Health::Suspect`]: no answer in time, a
//!   broken connection), or the call panicked, the connection is dropped
//!   and the next call builds a new one.
//! * **One connection per call.** A call runs on one connection, and
//!   whatever it answers is the caller's: it is never run again on another.
//!   Two calls of one thread may run on two connections; the second is
//!   sent only after the first was answered, so the server has applied the
//!   first before it reads the second.
//! * **No call waits for a build.** The first call that finds no
//!   connection (or one built for an older `epoch`) starts building one on
//!   a thread of its own, within the connect timeout, and takes its
//!   runtime thread's path, as every call does while none is ready (being
//!   built, building failed within the last [`RETRY_AFTER`], the handle
//!   closed, the caller inside a tokio runtime): [`CallerDriven::take`] is
//!   `None`. That path reaches the same server with the same answers, at
//!   two wake-ups more; a server that is down costs a call its own request
//!   timeout, never a connect timeout on top.
//! * **Tended, where the server insists.** A server that pings its clients
//!   and drops those that do not answer (NATS) gets its answers from
//!   [`CallerDriven::tend`]: a thread of its own that drives each
//!   connection for [`TEND_FOR`] once per interval in which no call ran on
//!   it (calls drive it anyway). Between those moments it sleeps, and a call
//!   that arrives during one is driven by the tender, at one wake-up more.
//! * **Closing ends it.** After [`CallerDriven::close`] no call is taken,
//!   and the runtime ends when the last call on it has, without blocking
//!   (`shutdown_background`), so it may end on any thread.

use crate::error::ErrorKind;
use parking_lot::Mutex;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long after a failed build calls are not taken before one tries
/// again.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long [`CallerDriven::tend`] drives the connection each time: one
/// pass over what arrived (a server's ping, the answer to the client's
/// own), short enough that a call rarely finds the tender driving.
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub(crate) const TEND_FOR: Duration = Duration::from_millis(2);

/// The most connections one handle's callers drive at once: one per
/// caller up to this many overlapping callers; more go through the
/// runtime thread.
pub(crate) const MAX_CONNS: usize = 4;

/// How long an extra connection (any but the first) may go without a
/// call before the next call ends it.
pub(crate) const IDLE_FOR: Duration = Duration::from_secs(30);

/// What a call's answer says of its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Health {
    /// An answer came (an error of the server's own included).
    Sound,
    /// No answer in time, or the connection broke: drop it.
    Suspect,
}

impl Health {
    /// What a bus request's answer says of the connection it came on:
    /// suspect when the connection failed ([`ErrorKind::Unavailable`],
    /// [`ErrorKind::Timeout`], a write whose outcome is unknown,
    /// [`ErrorKind::Indeterminate`]), sound for anything the server
    /// answered itself.
    #[cfg_attr(not(any(feature = "nats", feature = "redis")), allow(dead_code))]
    pub(crate) fn of<T>(answer: &crate::error::Result<T>) -> Health {
        match answer {
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::Indeterminate
                ) =>
            {
                Health::Suspect
            }
            _ => Health::Sound,
        }
    }
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

/// One connection of the pool and the calls running on it.
struct Slot<C> {
    state: Mutex<State<C>>,
    /// Calls running on this slot's connection (claimed in
    /// [`CallerDriven::take`], given back when the [`Taken`] drops).
    running: AtomicUsize,
    /// When a call on it last ended, in milliseconds since `born`.
    last_call: AtomicU64,
}

impl<C> Slot<C> {
    fn new() -> Slot<C> {
        Slot {
            state: Mutex::new(State::Idle { not_before: None }),
            running: AtomicUsize::new(0),
            last_call: AtomicU64::new(0),
        }
    }
}

/// A lazily built pool of up to [`MAX_CONNS`] clients `C`, each on a
/// runtime its callers drive.
pub(crate) struct CallerDriven<C> {
    connect_timeout: Duration,
    /// `slots[0]` is built at the first call and kept; the others only
    /// while callers overlap (see "A connection per concurrent caller").
    slots: Vec<Slot<C>>,
    /// Whether a slot is being built: one build at a time.
    building: AtomicBool,
    /// How many slots but the first hold a connection, so that a call on
    /// the first one ending looks for idle extras only when there are any.
    extras: AtomicUsize,
    /// [`IDLE_FOR`], shorter in tests.
    idle_for: Duration,
    closed: AtomicBool,
    /// The thread [`CallerDriven::tend`] started, woken at close.
    tender: std::sync::OnceLock<std::thread::Thread>,
    born: Instant,
}

impl<C: Clone> CallerDriven<C> {
    /// Nothing built yet; a build may take `connect_timeout`.
    pub(crate) fn new(connect_timeout: Duration) -> CallerDriven<C> {
        CallerDriven {
            connect_timeout,
            slots: (0..MAX_CONNS).map(|_| Slot::new()).collect(),
            building: AtomicBool::new(false),
            extras: AtomicUsize::new(0),
            idle_for: IDLE_FOR,
            closed: AtomicBool::new(false),
            tender: std::sync::OnceLock::new(),
            born: Instant::now(),
        }
    }

    /// Starts a thread that drives each built connection for [`TEND_FOR`]
    /// after each `every` in which no call ran on it, so that the server's
    /// pings are answered between calls. It ends at
    /// [`close`](Self::close), or once `this` is dropped (it holds it only
    /// while it drives). At most one per value; an error only when the OS
    /// refuses a thread (then calls still work, and the server may drop an
    /// idle connection, which the next call builds anew).
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub(crate) fn tend(this: &Arc<Self>, every: Duration) -> std::io::Result<()>
    where
        C: Send + 'static,
    {
        let weak = Arc::downgrade(this);
        let thread = std::thread::Builder::new()
            .name("fleetcoord-tender".to_string())
            .spawn(move || loop {
                std::thread::park_timeout(every);
                let Some(this) = weak.upgrade() else {
                    return;
                };
                if this.closed.load(Ordering::Acquire) {
                    return;
                }
                for slot in &this.slots {
                    let conn = match &*slot.state.lock() {
                        State::Ready(conn) => Some(conn.clone()),
                        State::Idle { .. } | State::Building | State::Closed => None,
                    };
                    if this.since(&slot.last_call) < every {
                        continue;
                    }
                    if let Some(rt) = conn.as_ref().and_then(|c| c.rt.0.as_ref()) {
                        // While a caller drives, this only waits out the sleep.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            rt.block_on(async { tokio::time::sleep(TEND_FOR).await })
                        }));
                    }
                }
            })?;
        let _ = this.tender.set(thread.thread().clone());
        Ok(())
    }

    /// A connection built for `epoch` that no other call is running on,
    /// claimed for one call; `None` when there is none (none built, only
    /// for an older epoch, or every one busy), the call then taking its
    /// runtime thread's path. When none was free and nobody is building
    /// one, a thread of its own starts building one more with `build` (up
    /// to [`MAX_CONNS`]; not within [`RETRY_AFTER`] of a failed build of
    /// that slot): no call ever waits for a connection to be built, nor
    /// queues behind another call's.
    pub(crate) fn take<B, BFut>(this: &Arc<Self>, epoch: u64, build: B) -> Option<Taken<'_, C>>
    where
        C: Send + 'static,
        B: FnOnce() -> BFut + Send + 'static,
        BFut: Future<Output = Result<C, String>>,
    {
        // A runtime of our own may not be entered from inside another's
        // context (its workers, `block_in_place`, `spawn_blocking`).
        if tokio::runtime::Handle::try_current().is_ok() || this.closed.load(Ordering::Acquire) {
            return None;
        }
        let mut to_build = None;
        for (at, slot) in this.slots.iter().enumerate() {
            // Claimed on the counter before its lock is taken, so that
            // overlapping callers never queue on a slot's lock: a busy
            // slot costs a caller one atomic load.
            if slot.running.load(Ordering::Relaxed) != 0
                || slot
                    .running
                    .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            match this.claimed(at, epoch) {
                Ok(taken) => return Some(taken),
                Err(true) if to_build.is_none() => to_build = Some(at),
                Err(_) => {}
            }
        }
        if let Some(at) = to_build {
            if !this.building.swap(true, Ordering::AcqRel) {
                Self::build_slot(this, at, epoch, build);
            }
        }
        None
    }

    /// The call counted in slot `at`'s `running`, on its connection if it
    /// has one for `epoch`. Otherwise the count is given back, and the
    /// error says whether the slot may be built; an extra slot idle for
    /// [`IDLE_FOR`] is emptied here (its connection ends with its last
    /// call), so a pool shrinks back once callers stop overlapping.
    fn claimed(&self, at: usize, epoch: u64) -> Result<Taken<'_, C>, bool> {
        let slot = &self.slots[at];
        let conn = {
            let state = slot.state.lock();
            match &*state {
                State::Ready(conn) if conn.epoch >= epoch => Ok(conn.clone()),
                State::Ready(_) => Err(true),
                State::Idle { not_before } => Err(not_before.is_none_or(|t| Instant::now() >= t)),
                State::Building | State::Closed => Err(false),
            }
        };
        match conn {
            Ok(conn) => Ok(Taken {
                owner: self,
                at,
                conn,
            }),
            Err(buildable) => {
                slot.running.fetch_sub(1, Ordering::AcqRel);
                Err(buildable)
            }
        }
    }

    /// Starts building slot `at` on a thread of its own, unless another
    /// caller started since.
    fn build_slot<B, BFut>(this: &Arc<Self>, at: usize, epoch: u64, build: B)
    where
        C: Send + 'static,
        B: FnOnce() -> BFut + Send + 'static,
        BFut: Future<Output = Result<C, String>>,
    {
        {
            let mut state = this.slots[at].state.lock();
            let buildable = match &*state {
                State::Ready(conn) if conn.epoch < epoch => {
                    this.emptied(at);
                    true
                }
                State::Ready(_) => false,
                State::Idle { not_before } => not_before.is_none_or(|t| Instant::now() >= t),
                State::Building | State::Closed => false,
            };
            if !buildable {
                this.building.store(false, Ordering::Release);
                return;
            }
            *state = State::Building;
        }
        let weak = Arc::downgrade(this);
        let timeout = this.connect_timeout;
        let started = std::thread::Builder::new()
            .name("fleetcoord-dial".to_string())
            .spawn(move || {
                let built = build_conn(epoch, timeout, build);
                if let Some(this) = weak.upgrade() {
                    this.install(at, built);
                }
            });
        if let Err(e) = started {
            this.install(at, Err(format!("no thread to build it on: {e}")));
        }
    }

    /// No call is taken any more; each connection ends with the last call
    /// running on it.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for slot in &self.slots {
            *slot.state.lock() = State::Closed;
        }
        if let Some(tender) = self.tender.get() {
            tender.unpark();
        }
    }

    /// Whether slot 0's connection is ready (for tests).
    #[cfg(test)]
    pub(crate) fn is_ready(&self) -> bool {
        self.ready() > 0
    }

    /// How many connections are ready (for tests).
    #[cfg(test)]
    pub(crate) fn ready(&self) -> usize {
        self.slots
            .iter()
            .filter(|slot| matches!(*slot.state.lock(), State::Ready(_)))
            .count()
    }

    /// Makes a finished build slot `at`'s connection (unless closed
    /// meanwhile).
    fn install(&self, at: usize, built: Result<Conn<C>, String>) {
        let _built = Building(&self.building);
        let slot = &self.slots[at];
        let mut state = slot.state.lock();
        if matches!(*state, State::Closed) || self.closed.load(Ordering::Acquire) {
            *state = State::Closed;
            return;
        }
        *state = match built {
            Ok(conn) => {
                // A fresh connection counts as just used, so that it is
                // not emptied as idle before its first call.
                slot.last_call.store(self.millis(), Ordering::Relaxed);
                if at > 0 {
                    self.extras.fetch_add(1, Ordering::AcqRel);
                }
                State::Ready(conn)
            }
            Err(why) => {
                log::debug!("calls stay on the runtime thread for now: {why}");
                State::Idle {
                    not_before: Instant::now().checked_add(RETRY_AFTER),
                }
            }
        };
    }

    /// Forgets `conn` of slot `at` (not a newer one built since).
    fn forget(&self, at: usize, conn: &Conn<C>) {
        let mut state = self.slots[at].state.lock();
        if matches!(&*state, State::Ready(ready) if Arc::ptr_eq(&ready.rt, &conn.rt)) {
            *state = State::Idle { not_before: None };
            self.emptied(at);
        }
    }
}

/// Clears a [`CallerDriven`]'s `building` flag when dropped.
struct Building<'a>(&'a AtomicBool);

impl Drop for Building<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<C> CallerDriven<C> {
    /// Ends the connections of extra slots no call has run on for
    /// [`IDLE_FOR`] (each ends with its last call), so that the pool
    /// shrinks back once callers stop overlapping.
    fn shrink(&self, now_ms: u64) {
        if self.extras.load(Ordering::Acquire) == 0 {
            return;
        }
        let idle_ms = u64::try_from(self.idle_for.as_millis()).unwrap_or(u64::MAX);
        for (at, slot) in self.slots.iter().enumerate().skip(1) {
            if slot.running.load(Ordering::Relaxed) != 0
                || now_ms.saturating_sub(slot.last_call.load(Ordering::Relaxed)) < idle_ms
                || slot
                    .running
                    .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            {
                let mut state = slot.state.lock();
                if matches!(*state, State::Ready(_)) {
                    *state = State::Idle { not_before: None };
                    self.emptied(at);
                }
            }
            slot.running.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Notes that slot `at` no longer holds a connection (its state lock
    /// held by the caller).
    fn emptied(&self, at: usize) {
        if at > 0 {
            self.extras.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// How long ago `last` (a slot's `last_call`) was, since creation when
    /// no call has ended.
    fn since(&self, last: &AtomicU64) -> Duration {
        let last = last.load(Ordering::Relaxed);
        self.born
            .elapsed()
            .saturating_sub(Duration::from_millis(last))
    }

    /// Milliseconds since creation.
    fn millis(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A runtime and, built on it within `timeout`, a client.
fn build_conn<C, B, BFut>(epoch: u64, timeout: Duration, build: B) -> Result<Conn<C>, String>
where
    B: FnOnce() -> BFut,
    BFut: Future<Output = Result<C, String>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("no runtime: {e}"))?;
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

/// A connection taken for one call.
pub(crate) struct Taken<'a, C> {
    owner: &'a CallerDriven<C>,
    /// The slot whose `running` counts this call, until it drops.
    at: usize,
    conn: Conn<C>,
}

impl<C> Drop for Taken<'_, C> {
    fn drop(&mut self) {
        let slot = &self.owner.slots[self.at];
        let now_ms = self.owner.millis();
        slot.last_call.store(now_ms, Ordering::Relaxed);
        slot.running.fetch_sub(1, Ordering::AcqRel);
        if self.at == 0 {
            self.owner.shrink(now_ms);
        }
    }
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
                    self.owner.forget(self.at, &self.conn);
                }
                Ran::Answer(out)
            }
            // The caller's own patience ran out: no evidence against the
            // connection (the call bounds itself by its request timeout).
            Ok(Err(_)) => Ran::Waited,
            Err(_) => {
                self.owner.forget(self.at, &self.conn);
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

    /// Builds "clients" that are the number of the build that made them.
    #[derive(Clone, Default)]
    struct Counting(Arc<AtomicUsize>);

    impl Counting {
        fn build(
            &self,
        ) -> impl FnOnce() -> std::future::Ready<Result<usize, String>> + Clone + Send + 'static
        {
            let builds = self.0.clone();
            move || std::future::ready(Ok(builds.fetch_add(1, Ordering::SeqCst)))
        }

        fn builds(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    async fn sound<T>(out: T) -> (T, Health) {
        (out, Health::Sound)
    }

    fn answer<T: std::fmt::Debug>(ran: Option<Ran<T>>) -> T {
        match ran {
            Some(Ran::Answer(out)) => out,
            other => panic!("no answer: {other:?}"),
        }
    }

    /// `take` then `run`, the first `take` starting a build and the next
    /// ones waiting for it: `None` when none is ready within a second.
    fn call<C, T, B, BFut, F, Fut>(
        cd: &Arc<CallerDriven<C>>,
        epoch: u64,
        build: B,
        wait: Duration,
        op: F,
    ) -> Option<Ran<T>>
    where
        C: Clone + Send + 'static,
        B: FnOnce() -> BFut + Send + Clone + 'static,
        BFut: Future<Output = Result<C, String>>,
        F: FnOnce(C) -> Fut,
        Fut: Future<Output = (T, Health)>,
    {
        let until = Instant::now() + Duration::from_secs(1);
        loop {
            if let Some(taken) = CallerDriven::take(cd, epoch, build.clone()) {
                return Some(taken.run(wait, op));
            }
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn the_first_call_is_not_taken_and_starts_a_build_that_the_next_ones_use() {
        let counting = Counting::default();
        let cd = Arc::new(CallerDriven::new(WAIT));
        assert!(
            CallerDriven::take(&cd, 0, counting.build()).is_none(),
            "no call waits for a build"
        );
        for _ in 0..3 {
            let here = std::thread::current().id();
            let (client, thread) = answer(call(&cd, 0, counting.build(), WAIT, |c| {
                sound((c, std::thread::current().id()))
            }));
            assert_eq!(client, 0, "built once, then reused");
            assert_eq!(thread, here, "run on the caller's thread");
        }
        assert_eq!(counting.builds(), 1);
    }

    #[test]
    fn a_suspect_answer_or_a_panic_drops_the_connection_and_a_newer_epoch_rebuilds() {
        let counting = Counting::default();
        let cd = Arc::new(CallerDriven::new(WAIT));
        let first = answer(call(&cd, 0, counting.build(), WAIT, |c| async move {
            (c, Health::Suspect)
        }));
        assert!(!cd.is_ready(), "dropped");
        let second = answer(call(&cd, 0, counting.build(), WAIT, sound));
        assert_ne!(first, second, "built anew");
        let panicked = call(&cd, 0, counting.build(), WAIT, |_| async {
            if true {
                panic!("a call that panics (expected in this test)");
            }
            ((), Health::Sound)
        });
        assert!(matches!(panicked, Some(Ran::Panicked)));
        let third = answer(call(&cd, 0, counting.build(), WAIT, sound));
        assert_ne!(second, third, "built anew after the panic");
        let fourth = answer(call(&cd, 1, counting.build(), WAIT, sound));
        assert_ne!(third, fourth, "a newer epoch builds anew");
        assert_eq!(answer(call(&cd, 0, counting.build(), WAIT, sound)), fourth);
    }

    #[test]
    fn a_failed_build_is_not_retried_within_retry_after_and_closed_takes_nothing() {
        let cd: Arc<CallerDriven<usize>> = Arc::new(CallerDriven::new(WAIT));
        let refused = || std::future::ready(Err("refused".to_string()));
        assert!(call(&cd, 0, refused, Duration::from_millis(200), sound).is_none());
        let counting = Counting::default();
        assert!(CallerDriven::take(&cd, 0, counting.build()).is_none());
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(counting.builds(), 0, "not even tried within RETRY_AFTER");
        std::thread::sleep(RETRY_AFTER);
        answer(call(&cd, 0, counting.build(), WAIT, sound));
        cd.close();
        assert!(call(&cd, 0, counting.build(), WAIT, sound).is_none());
    }

    #[test]
    fn a_build_or_call_past_its_time_ends_in_time() {
        let cd: Arc<CallerDriven<usize>> = Arc::new(CallerDriven::new(Duration::from_millis(100)));
        let started = Instant::now();
        assert!(CallerDriven::take(&cd, 0, std::future::pending).is_none());
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "the caller never waits"
        );
        std::thread::sleep(Duration::from_millis(500));
        assert!(!cd.is_ready(), "the build gave up at its timeout");

        let cd: Arc<CallerDriven<usize>> = Arc::new(CallerDriven::new(WAIT));
        let counting = Counting::default();
        let started = Instant::now();
        let slow = call(&cd, 0, counting.build(), Duration::from_millis(100), |_| {
            std::future::pending::<((), Health)>()
        });
        assert!(matches!(slow, Some(Ran::Waited)));
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(cd.is_ready(), "impatience is no evidence against it");
    }

    #[test]
    fn a_tended_connection_is_driven_between_calls_and_the_tender_ends_at_close() {
        type Tx = tokio::sync::mpsc::UnboundedSender<()>;
        let cd: Arc<CallerDriven<Tx>> = Arc::new(CallerDriven::new(WAIT));
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        // The "connection": a task on the runtime that reports each
        // message it gets, as a client's reader answers a ping.
        let build = move || async move {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
            tokio::spawn(async move {
                while rx.recv().await.is_some() {
                    let _ = seen_tx.send(());
                }
            });
            Ok(tx)
        };
        let built = answer(call(&cd, 0, build, WAIT, sound));
        CallerDriven::tend(&cd, Duration::from_millis(20)).expect("tender");
        // Sent with no call running: only the tender can drive the task.
        built.send(()).expect("send");
        assert!(
            seen_rx.recv_timeout(Duration::from_secs(5)).is_ok(),
            "nobody drove the connection between calls"
        );
        cd.close();
        drop(cd);
        // Closed and dropped, nothing holds the runtime: its task is gone
        // with it, and the channel it reported on closes.
        assert!(
            seen_rx.recv_timeout(Duration::from_secs(5)).is_err(),
            "the task ended with the runtime"
        );
    }

    /// `n` calls held running at once, each on its own thread, each
    /// answering the client it ran on; they end when `release` drops.
    fn overlapping(
        cd: &Arc<CallerDriven<usize>>,
        counting: &Counting,
        n: usize,
    ) -> (
        Vec<std::thread::JoinHandle<usize>>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = Arc::new(Mutex::new(held));
        let (started_tx, started) = std::sync::mpsc::channel();
        let calls = (0..n)
            .map(|_| {
                let (cd, build, held, started_tx) = (
                    cd.clone(),
                    counting.build(),
                    held.clone(),
                    started_tx.clone(),
                );
                std::thread::spawn(move || {
                    answer(call(&cd, 0, build, WAIT, move |c| async move {
                        let _ = started_tx.send(());
                        // Held until released: a tokio sleep loop, so the
                        // thread keeps driving its runtime meanwhile.
                        while held.lock().try_recv() == Err(std::sync::mpsc::TryRecvError::Empty) {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        (c, Health::Sound)
                    }))
                })
            })
            .collect::<Vec<_>>();
        for _ in 0..n {
            started.recv_timeout(WAIT).expect("every call started");
        }
        (calls, release)
    }

    #[test]
    fn overlapping_callers_get_a_connection_each_up_to_max_conns_and_no_more() {
        let counting = Counting::default();
        let cd: Arc<CallerDriven<usize>> = Arc::new(CallerDriven::new(WAIT));
        answer(call(&cd, 0, counting.build(), WAIT, sound));
        // Calls overlapping build the pool up, one connection per caller
        // that found every one busy, then take a free one each.
        let until = Instant::now() + Duration::from_secs(5);
        while cd.ready() < MAX_CONNS {
            let (calls, release) = overlapping(&cd, &counting, MAX_CONNS);
            drop(release);
            for c in calls {
                c.join().expect("call");
            }
            assert!(
                Instant::now() < until,
                "the pool never grew: {}",
                cd.ready()
            );
        }
        assert_eq!(counting.builds(), MAX_CONNS, "one build per slot");
        let (calls, release) = overlapping(&cd, &counting, MAX_CONNS);
        drop(release);
        let mut clients: Vec<usize> = calls.into_iter().map(|c| c.join().expect("call")).collect();
        clients.sort_unstable();
        assert_eq!(
            clients,
            (0..MAX_CONNS).collect::<Vec<_>>(),
            "overlapping callers each drove a connection of their own"
        );
        // One more than the pool, while every connection is busy: not
        // taken (the runtime thread's path), and nothing more is built.
        let (calls, release) = overlapping(&cd, &counting, MAX_CONNS);
        assert!(
            CallerDriven::take(&cd, 0, counting.build()).is_none(),
            "a caller never queues behind another's call"
        );
        drop(release);
        for c in calls {
            c.join().expect("call");
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(counting.builds(), MAX_CONNS, "never more than MAX_CONNS");
    }

    #[test]
    fn an_extra_connection_idle_for_idle_for_is_ended_by_the_next_call() {
        let counting = Counting::default();
        let mut cd: CallerDriven<usize> = CallerDriven::new(WAIT);
        cd.idle_for = Duration::from_millis(200);
        let cd = Arc::new(cd);
        answer(call(&cd, 0, counting.build(), WAIT, sound));
        let until = Instant::now() + Duration::from_secs(5);
        while cd.ready() < 2 {
            let (calls, release) = overlapping(&cd, &counting, 2);
            drop(release);
            for c in calls {
                c.join().expect("call");
            }
            assert!(Instant::now() < until, "no second connection");
        }
        answer(call(&cd, 0, counting.build(), WAIT, sound));
        assert_eq!(cd.ready(), 2, "not idle long enough yet");
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            answer(call(&cd, 0, counting.build(), WAIT, sound)),
            0,
            "the first stays"
        );
        assert_eq!(cd.ready(), 1, "the idle extra one was ended");
    }

    #[test]
    fn inside_a_tokio_runtime_nothing_is_taken() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let cd: Arc<CallerDriven<usize>> = Arc::new(CallerDriven::new(WAIT));
        let counting = Counting::default();
        let _inside = rt.enter();
        assert!(CallerDriven::take(&cd, 0, counting.build()).is_none());
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(counting.builds(), 0, "nor is a build started");
    }
}
