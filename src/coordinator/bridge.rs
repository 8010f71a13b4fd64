//! The runtime thread of an async bus client (NATS, Redis): a
//! [`crate::runtime`] thread used in exactly two ways — "run this call
//! and answer me" ([`Bridge::call`], polled on the caller's thread) and
//! "run this task until shutdown" ([`Bridge::spawn`], on the runtime
//! thread) — plus [`FeedSender`], the async face of the one feed queue
//! (`feed_queue.rs`).
//!
//! A call runs on its caller's thread and is cancelled (its future
//! dropped) when the caller gives up, as reqwest's blocking client cancels
//! on a dropped receiver.

use super::Feed;
use crate::feed_queue::{FeedQueue, Offer, RELIEF_POLL};
pub(crate) use crate::runtime::CallError;
use crate::runtime::{self, Job, Launch, RuntimeThread};
pub(crate) use crate::runtime::{StartError, Stopping};
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;

/// How long tasks get to wind down after [`Bridge::shutdown`] before they
/// are aborted: enough to unsubscribe or close a server-side consumer, short
/// enough that `close()` never feels stuck.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The user-side end of a bus client's runtime thread. Dropping it shuts
/// the thread down.
pub(crate) struct Bridge(RuntimeThread<Job>);

/// Starts a thread named `name` with its runtime, runs `connect` on it
/// within `connect_timeout`, and returns the bridge with what `connect`
/// produced (typically a cloneable async client). `connect`'s error is one
/// line for an operator; it becomes [`StartError::Connect`].
pub(crate) fn start<C, Fut, F>(
    name: &str,
    connect_timeout: Duration,
    connect: F,
) -> Result<(Bridge, C), StartError>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<C, String>> + 'static,
    C: Send + 'static,
{
    let (thread, client) = runtime::start(
        name,
        connect_timeout,
        SHUTDOWN_GRACE,
        move |_| async move {
            match tokio::time::timeout(connect_timeout, connect()).await {
                Ok(Ok(client)) => Ok(Launch {
                    state: (),
                    answer: client,
                    tasks: Vec::new(),
                }),
                Ok(Err(reason)) => Err(reason),
                Err(_) => Err(format!("no answer within {connect_timeout:?}")),
            }
        },
        |_: &(), job: Job| job,
    )?;
    Ok((Bridge(thread), client))
}

impl Bridge {
    /// Runs `fut` and blocks the caller until its output, at most `timeout`
    /// (saturating: `Duration::MAX` waits for ever). The caller's thread
    /// polls `fut` itself, in the runtime's context, while the runtime
    /// thread drives the connection (see `crate::runtime`,
    /// [`RuntimeThread::block_on`]): concurrent callers each poll their own
    /// call and pipeline on the one connection, instead of queueing behind
    /// the runtime thread for a task and an answer each. On timeout the
    /// future is dropped before this returns.
    pub(crate) fn call<T, Fut>(&self, timeout: Duration, fut: Fut) -> Result<T, CallError>
    where
        Fut: Future<Output = T>,
    {
        if self.0.is_current() {
            log::error!("fleetcoord: a blocking call from the runtime thread itself was refused");
            return Err(CallError::Gone);
        }
        self.0.block_on(timeout, fut)
    }

    /// Runs `task` on the runtime until it ends or, after shutdown, its
    /// grace period is over. `task` gets the [`Stopping`] signal to select
    /// on.
    pub(crate) fn spawn<Fut, F>(&self, task: F) -> Result<(), CallError>
    where
        F: FnOnce(Stopping) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let stopping = self.0.stopping();
        if stopping.is_stopping() {
            return Err(CallError::Gone);
        }
        let job = task(stopping.clone());
        self.0.send(Box::pin(job)).map_err(|_| CallError::Gone)
    }

    /// Signals every task to stop, gives them [`SHUTDOWN_GRACE`], aborts
    /// the rest and joins the thread (unless called from it). Idempotent.
    pub(crate) fn shutdown(&self) {
        self.0.shutdown();
    }
}

/// The sending end of a [`Feed`] for async tasks: its [`FeedQueue`],
/// never blocking the runtime, and the drop of the [`Feed`] seen at once.
/// The policy is the one of every feed (`feed_queue.rs`): when the queue
/// is full the task pauses its source, waits until the consumer has read
/// the queue down to half, then resumes — a stream after the last entry
/// delivered, a KV watch with a diff against what the consumer was told.
pub(crate) struct FeedSender<T> {
    queue: FeedQueue<T>,
    gone: watch::Receiver<bool>,
}

/// A feed of `capacity` items (at least 1): the sender for a task, and the
/// [`Feed`] for the user, whose drop the sender observes at once
/// ([`FeedSender::gone`]) so that the task can release server resources.
pub(crate) fn feed_channel<T: Send + 'static>(capacity: usize) -> (FeedSender<T>, Feed<T>) {
    let (queue, rx) = FeedQueue::new(capacity);
    let (gone_tx, gone_rx) = watch::channel(false);
    let feed = Feed::new(rx, move || {
        let _ = gone_tx.send(true);
    });
    (
        FeedSender {
            queue,
            gone: gone_rx,
        },
        feed,
    )
}

impl<T> FeedSender<T> {
    /// How many items the consumer's queue holds.
    pub(crate) fn capacity(&self) -> usize {
        self.queue.capacity()
    }

    /// Queues `item` for the consumer without waiting.
    /// `Gone` as soon as the feed's drop began: its hook runs before its
    /// receiver is dropped, and an item sent in between would be lost
    /// without anyone knowing.
    pub(crate) fn offer(&self, item: T) -> Offer<T> {
        if self.is_gone() {
            return Offer::Gone;
        }
        self.queue.offer(item)
    }

    /// Waits until the consumer has read its queue down to half (`true`)
    /// or dropped the feed (`false`).
    pub(crate) async fn relieved(&self) -> bool {
        loop {
            if self.is_gone() {
                return false;
            }
            if self.queue.has_room() {
                return true;
            }
            tokio::time::sleep(RELIEF_POLL).await;
        }
    }

    /// Resolves once the consumer has dropped the feed.
    pub(crate) async fn gone(&self) {
        let mut rx = self.gone.clone();
        // An error means the hook's sender is gone, i.e. the feed dropped.
        let _ = rx.wait_for(|gone| *gone).await;
    }

    /// Whether the consumer has dropped the feed.
    pub(crate) fn is_gone(&self) -> bool {
        *self.gone.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started() -> Bridge {
        let (bridge, answer) = start("test-bridge", Duration::from_secs(5), || async {
            Ok::<u32, String>(42)
        })
        .unwrap();
        assert_eq!(answer, 42);
        bridge
    }

    #[test]
    fn a_failed_connect_is_reported_by_start() {
        let err = start("test-bridge", Duration::from_secs(5), || async {
            Err::<(), _>("refused at nats://127.0.0.1:1".to_string())
        })
        .err()
        .unwrap();
        assert!(matches!(err, StartError::Connect(ref m) if m.contains("127.0.0.1:1")));
        let err = start("test-bridge", Duration::from_millis(50), || async {
            std::future::pending::<Result<(), String>>().await
        })
        .err()
        .unwrap();
        assert!(matches!(err, StartError::Connect(ref m) if m.contains("no answer")));
    }

    #[test]
    fn the_runtime_thread_cannot_block_on_itself() {
        let bridge = std::sync::Arc::new(started());
        let (out_tx, out_rx) = crossbeam_channel::bounded(1);
        let inner = bridge.clone();
        bridge
            .spawn(move |_| async move {
                let _ = out_tx.send(inner.call(Duration::from_secs(5), async { 1 }));
            })
            .unwrap();
        assert_eq!(
            out_rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            Err(CallError::Gone)
        );
        // The bridge still serves other threads.
        assert_eq!(bridge.call(Duration::from_secs(5), async { 2 }), Ok(2));
    }

    #[test]
    fn a_call_whose_future_panics_has_no_answer() {
        let bridge = started();
        let panicking = async {
            if true {
                panic!("the call blew up (expected by this test)");
            }
            3
        };
        assert_eq!(
            bridge.call(Duration::from_secs(5), panicking),
            Err(CallError::Gone)
        );
        // Only that task died: the runtime goes on.
        assert_eq!(bridge.call(Duration::from_secs(5), async { 4 }), Ok(4));
    }

    #[test]
    fn a_bridge_dropped_on_its_own_thread_stops_without_deadlock() {
        let bridge = started();
        let (stopped_tx, stopped_rx) = crossbeam_channel::bounded(1);
        bridge
            .spawn(move |stopping| async move {
                stopping.wait().await;
                let _ = stopped_tx.send(());
            })
            .unwrap();
        let (owner_tx, owner_rx) = tokio::sync::oneshot::channel::<Bridge>();
        bridge
            .spawn(move |_| async move {
                // The last handle ends here, on the runtime thread.
                if let Ok(bridge) = owner_rx.await {
                    drop(bridge);
                }
            })
            .unwrap();
        let _ = owner_tx.send(bridge);
        assert!(stopped_rx.recv_timeout(Duration::from_secs(5)).is_ok());
    }

    #[test]
    fn call_answers_and_cancels_on_timeout() {
        let bridge = started();
        assert_eq!(bridge.call(Duration::from_secs(5), async { 7 }), Ok(7));
        let (dropped_tx, dropped_rx) = crossbeam_channel::bounded::<()>(1);
        struct OnDrop(crossbeam_channel::Sender<()>);
        impl Drop for OnDrop {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        let guard = OnDrop(dropped_tx);
        let slow = async move {
            let _guard = guard;
            std::future::pending::<()>().await
        };
        assert_eq!(
            bridge.call(Duration::from_millis(20), slow),
            Err(CallError::Timeout)
        );
        // The abandoned future is dropped, not left running.
        assert!(dropped_rx.recv_timeout(Duration::from_secs(5)).is_ok());
        assert_eq!(bridge.call(Duration::MAX, async { 8 }), Ok(8));
        bridge.shutdown();
        bridge.shutdown();
        assert_eq!(
            bridge.call(Duration::from_secs(1), async { 9 }),
            Err(CallError::Gone)
        );
        assert!(bridge.spawn(|_| async {}).is_err());
    }

    #[test]
    fn calls_run_on_their_callers_threads_and_pipeline() {
        let bridge = std::sync::Arc::new(started());
        let runtime_thread = bridge
            .call(Duration::from_secs(5), async {
                // A spawn from a call runs on the runtime thread.
                tokio::spawn(async { std::thread::current().id() }).await
            })
            .unwrap()
            .unwrap();
        assert_ne!(runtime_thread, std::thread::current().id());
        let here = bridge
            .call(Duration::from_secs(5), async {
                std::thread::current().id()
            })
            .unwrap();
        assert_eq!(here, std::thread::current().id());
        // Sixteen calls each waiting 200 ms on a runtime timer overlap.
        let t = std::time::Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..16 {
                let bridge = bridge.clone();
                scope.spawn(move || {
                    let slept = bridge.call(Duration::from_secs(5), async {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    });
                    assert_eq!(slept, Ok(()));
                });
            }
        });
        assert!(
            t.elapsed() < Duration::from_millis(1500),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn shutdown_gives_running_calls_the_grace_then_ends_them_and_refuses_new_ones() {
        let bridge = std::sync::Arc::new(started());
        // One call ends within the grace, one never does; both keep using
        // the runtime's timers while it shuts down.
        let quick = {
            let bridge = bridge.clone();
            std::thread::spawn(move || {
                bridge.call(Duration::MAX, async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    5
                })
            })
        };
        let stuck = {
            let bridge = bridge.clone();
            std::thread::spawn(move || {
                bridge.call(Duration::MAX, async {
                    loop {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        let t = std::time::Instant::now();
        bridge.shutdown();
        let took = t.elapsed();
        assert!(took >= SHUTDOWN_GRACE, "{took:?}");
        assert!(took < SHUTDOWN_GRACE + Duration::from_secs(2), "{took:?}");
        assert_eq!(quick.join().unwrap(), Ok(5));
        assert_eq!(stuck.join().unwrap(), Err(CallError::Gone));
        assert_eq!(
            bridge.call(Duration::from_secs(1), async { 6 }),
            Err(CallError::Gone)
        );
    }

    #[test]
    fn tasks_see_stopping_and_end_within_the_grace() {
        let bridge = started();
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
        bridge
            .spawn(move |stopping| async move {
                stopping.wait().await;
                assert!(stopping.is_stopping());
                let _ = done_tx.send(());
            })
            .unwrap();
        let t = std::time::Instant::now();
        bridge.shutdown();
        assert!(done_rx.try_recv().is_ok(), "the task ran to its end");
        assert!(t.elapsed() < SHUTDOWN_GRACE);
    }

    #[test]
    fn feed_pauses_at_its_bound_and_resumes_at_half() {
        let bridge = started();
        let (tx, feed) = feed_channel::<u32>(4);
        for i in 0..4 {
            assert_eq!(tx.offer(i), Offer::Taken);
        }
        assert_eq!(tx.offer(4), Offer::Full(4));
        let (relieved_tx, relieved_rx) = crossbeam_channel::bounded(2);
        bridge
            .spawn(move |_| async move {
                let room = tx.relieved().await;
                let _ = relieved_tx.send((room, tx.offer(4).is_taken()));
                tx.gone().await;
                let refused = tx.offer(5) == Offer::Gone;
                let _ = relieved_tx.send((tx.is_gone(), refused));
            })
            .unwrap();
        assert_eq!(feed.recv().unwrap(), 0);
        // Three queued of four: above half, still paused.
        assert!(relieved_rx
            .recv_timeout(Duration::from_millis(100))
            .is_err());
        assert_eq!(feed.recv().unwrap(), 1);
        assert_eq!(
            relieved_rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            (true, true)
        );
        let rest: Vec<u32> = feed.receiver().try_iter().collect();
        assert_eq!(rest, [2, 3, 4]);
        drop(feed);
        // Dropping the feed wakes the task at once, and it sees it gone.
        assert_eq!(
            relieved_rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            (true, true)
        );
        bridge.shutdown();
    }
}
