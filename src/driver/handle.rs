//! The user-thread side of a running machine, and where its notices go.
//! (A unary call needs none of this: its caller polls it, see
//! `DriverHandle::call`.)
//!
//! * [`MachineHandle`]: what a primitive holds of its running machine — the
//!   input sender and the "finished" signal. Dropping it stops the machine
//!   without waiting.
//! * Sinks ([`Notify`], [`FeedSink`]): what the runner does with notices. A
//!   [`FeedSink`] is the one backpressure policy for everything watch-fed: a
//!   channel of at most its capacity; when it is full the runner pauses
//!   the machine and resumes it once the consumer has read half of it.

use super::Gone;
use crate::feed_queue::{FeedQueue, Offer};
use crossbeam_channel::Receiver;
use fleetcoord_sm::{Machine, RpcError};
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::time::Duration;
use tokio::sync::mpsc;

/// Why a unary call has no response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum UnaryError {
    /// etcd answered with an error, or the connection failed.
    Rpc(RpcError),
    /// No answer within the request timeout.
    Timeout(Duration),
}

/// How a machine task ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Finished {
    /// The machine reported [`Machine::is_finished`]: its revoke/resign (if
    /// any) was answered, whatever the answer.
    Done,
    /// It did not finish within its stop grace, or the driver shut down
    /// first; whatever it was doing was cut short.
    Abandoned,
}

/// What a [`MachineHandle`] sends its machine's task.
pub(crate) enum Control<I> {
    /// An input for the machine.
    Input(I),
    /// Stop: the runner feeds the machine's stop input and gives it its
    /// grace period to finish (revoke, resign).
    Stop,
}

/// A primitive's hold on its running machine.
pub(crate) struct MachineHandle<M: Machine> {
    input: mpsc::UnboundedSender<Control<M::Input>>,
    finished: Receiver<Finished>,
    _machine: PhantomData<fn() -> M>,
}

impl<M: Machine> MachineHandle<M> {
    pub(crate) fn new(
        input: mpsc::UnboundedSender<Control<M::Input>>,
        finished: Receiver<Finished>,
    ) -> Self {
        MachineHandle {
            input,
            finished,
            _machine: PhantomData,
        }
    }

    /// Feed the machine one input.
    pub(crate) fn send(&self, input: M::Input) -> Result<(), Gone> {
        self.input.send(Control::Input(input)).map_err(|_| Gone)
    }

    /// An input sender that does not keep the machine running: for a
    /// machine's own notice handler, which must be able to answer a notice
    /// with an input but must not stop the machine from ending when every
    /// real handle is dropped.
    pub(crate) fn downgrade(&self) -> WeakInput<M> {
        WeakInput {
            input: self.input.downgrade(),
        }
    }

    /// Ask the machine to stop; returns at once.
    pub(crate) fn stop(&self) {
        let _ = self.input.send(Control::Stop);
    }

    /// Wait at most `wait` for a stop asked for earlier to finish. `Err`
    /// when it did not finish in time.
    pub(crate) fn wait_finished(&self, wait: Duration) -> Result<Finished, WaitError> {
        match self.finished.recv_timeout(wait) {
            Ok(f) => Ok(f),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(WaitError::Timeout(wait)),
            // The task ended without saying so: the driver aborted it.
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Ok(Finished::Abandoned),
        }
    }

    /// Where the task's end is signalled once (see
    /// [`MachineHandle::wait_finished`]), for a caller that waits on
    /// something else too.
    pub(crate) fn finished(&self) -> &Receiver<Finished> {
        &self.finished
    }

    /// Stop and wait at most `wait` for the machine to finish.
    pub(crate) fn stop_and_wait(&self, wait: Duration) -> Result<Finished, WaitError> {
        self.stop();
        self.wait_finished(wait)
    }
}

/// See [`MachineHandle::downgrade`].
pub(crate) struct WeakInput<M: Machine> {
    input: mpsc::WeakUnboundedSender<Control<M::Input>>,
}

impl<M: Machine> Clone for WeakInput<M> {
    fn clone(&self) -> Self {
        WeakInput {
            input: self.input.clone(),
        }
    }
}

impl<M: Machine> WeakInput<M> {
    /// Feed the machine one input; `Err(Gone)` once every
    /// [`MachineHandle`] is dropped or the machine task ended.
    pub(crate) fn send(&self, input: M::Input) -> Result<(), Gone> {
        let input_tx = self.input.upgrade().ok_or(Gone)?;
        input_tx.send(Control::Input(input)).map_err(|_| Gone)
    }

    /// Ask the machine to stop, as [`MachineHandle::stop`] does, without
    /// keeping it running: for an owner that must be able to end a
    /// primitive it does not hold (a session detaching).
    pub(crate) fn stop(&self) {
        if let Some(input_tx) = self.input.upgrade() {
            let _ = input_tx.send(Control::Stop);
        }
    }
}

/// A stop that was not confirmed in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitError {
    /// Still running after this long.
    Timeout(Duration),
}

// Dropping the handle stops the machine and does not wait (Drop never
// blocks on etcd); the runner lets a revoke or resign finish in the
// background.
impl<M: Machine> Drop for MachineHandle<M> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A machine handle of any type, for owners of several (a coordinator
/// closing all its feeds).
pub(crate) trait StopHandle: Send + Sync {
    /// Ask the machine to stop; returns at once.
    fn stop(&self);
    /// Whether the machine task has ended.
    fn is_finished(&self) -> bool;
}

impl<M> StopHandle for MachineHandle<M>
where
    M: Machine,
    M::Input: Send,
{
    fn stop(&self) {
        MachineHandle::stop(self);
    }

    fn is_finished(&self) -> bool {
        self.input.is_closed()
    }
}

/// Where the runner puts a machine's notices.
pub(crate) trait Sink<N>: Send {
    /// Take one notice. `false` once nobody listens any more: the runner
    /// then stops the machine.
    fn deliver(&mut self, notice: N) -> bool;

    /// The consumer's queue is at its bound: the runner pauses the machine.
    fn is_full(&self) -> bool {
        false
    }

    /// While paused: move held-back items on and say whether the machine
    /// may resume ([`Offer::Taken`]), must stay paused ([`Offer::Full`]) or
    /// must stop because the consumer is gone ([`Offer::Gone`]).
    fn relieve(&mut self) -> Offer {
        Offer::Taken
    }
}

/// A sink that hands every notice to a function, for machines whose notices
/// are few and answer the primitive itself (keepalive states, election
/// answers): they are never held back.
pub(crate) struct Notify<F>(pub F);

impl<N, F> Sink<N> for Notify<F>
where
    F: FnMut(N) -> bool + Send,
{
    fn deliver(&mut self, notice: N) -> bool {
        (self.0)(notice)
    }
}

/// What a feed makes of one notice.
pub(crate) enum FeedItem<T> {
    /// Give this to the consumer.
    Item(T),
    /// Nothing for the consumer (a marker handled on the side, a log line).
    Skip,
    /// The feed is over: stop the machine.
    End,
}

/// The one backpressure policy for watch-fed receivers: a [`FeedQueue`]
/// of at most `capacity` items. When it is full, items the machine still
/// produces (the rest of one etcd response) are held here and the runner
/// pauses the machine (its watch is cancelled); once the consumer has read
/// the queue down to half, the held items go out and the machine resumes —
/// a watch with a resync diff against what the consumer was told, a stream
/// reader after the last entry delivered. Nothing is dropped; memory stays
/// bounded by the queue plus one response or one diff.
pub(crate) struct FeedSink<N, T> {
    translate: Box<dyn FnMut(N) -> FeedItem<T> + Send>,
    queue: FeedQueue<T>,
    held: VecDeque<T>,
}

impl<N, T: Send> FeedSink<N, T> {
    /// A sink of `capacity` (at least 1) and the consumer's receiver.
    pub(crate) fn new(
        capacity: usize,
        translate: impl FnMut(N) -> FeedItem<T> + Send + 'static,
    ) -> (FeedSink<N, T>, Receiver<T>) {
        let (queue, rx) = FeedQueue::new(capacity);
        (
            FeedSink {
                translate: Box::new(translate),
                queue,
                held: VecDeque::new(),
            },
            rx,
        )
    }
}

impl<N, T: Send> Sink<N> for FeedSink<N, T> {
    fn deliver(&mut self, notice: N) -> bool {
        let item = match (self.translate)(notice) {
            FeedItem::Item(item) => item,
            FeedItem::Skip => return true,
            FeedItem::End => return false,
        };
        // Order: nothing overtakes what is already held back.
        if !self.held.is_empty() {
            self.held.push_back(item);
            return true;
        }
        match self.queue.offer(item) {
            Offer::Taken => true,
            Offer::Full(item) => {
                self.held.push_back(item);
                true
            }
            Offer::Gone => false,
        }
    }

    fn is_full(&self) -> bool {
        !self.held.is_empty() || self.queue.is_full()
    }

    fn relieve(&mut self) -> Offer {
        while let Some(item) = self.held.pop_front() {
            match self.queue.offer(item) {
                Offer::Taken => {}
                Offer::Full(item) => {
                    self.held.push_front(item);
                    return Offer::Full(());
                }
                Offer::Gone => return Offer::Gone,
            }
        }
        if self.queue.has_room() {
            Offer::Taken
        } else {
            Offer::Full(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetcoord_sm::election::{Election as ElectionMachine, ElectionInput};

    const SHORT: Duration = Duration::from_millis(20);

    #[test]
    fn a_machine_handle_reports_how_its_task_ended() {
        let (input, mut inputs) = mpsc::unbounded_channel();
        let (finished_tx, finished) = crossbeam_channel::bounded(1);
        let handle = MachineHandle::<ElectionMachine>::new(input, finished);
        let stop: &dyn StopHandle = &handle;
        assert_eq!(
            handle.stop_and_wait(SHORT),
            Err(WaitError::Timeout(SHORT)),
            "nothing confirmed the stop yet"
        );
        assert!(matches!(inputs.try_recv(), Ok(Control::Stop)));
        stop.stop();
        assert!(matches!(inputs.try_recv(), Ok(Control::Stop)));
        assert!(!stop.is_finished());
        finished_tx.try_send(Finished::Done).expect("room");
        assert_eq!(handle.wait_finished(SHORT), Ok(Finished::Done));
        // A task that ends without a word was aborted by the driver.
        drop(finished_tx);
        assert_eq!(handle.wait_finished(SHORT), Ok(Finished::Abandoned));
        drop(inputs);
        assert!(stop.is_finished(), "its inputs are gone with the task");
        assert_eq!(handle.send(ElectionInput::Resign { token: 1 }), Err(Gone));
    }

    #[test]
    fn a_notify_sink_is_never_held_back() {
        let mut seen = Vec::new();
        {
            let mut sink = Notify(|n: u32| {
                seen.push(n);
                n != 3
            });
            assert!(sink.deliver(1));
            assert!(!sink.is_full());
            assert_eq!(sink.relieve(), Offer::Taken);
            assert!(!sink.deliver(3), "the function says nobody listens");
        }
        assert_eq!(seen, [1, 3]);
    }

    #[test]
    fn a_feed_sink_holds_back_in_order_and_resumes_at_half() {
        let (mut sink, rx) = FeedSink::new(2, |n: u32| match n {
            0 => FeedItem::Skip,
            99 => FeedItem::End,
            n => FeedItem::Item(n),
        });
        assert!(sink.deliver(0), "skipped");
        assert!(!sink.is_full());
        for n in 1..=4 {
            assert!(sink.deliver(n), "held, not refused");
        }
        assert!(sink.is_full());
        assert_eq!(sink.relieve(), Offer::Full(()));
        assert_eq!(rx.try_recv(), Ok(1));
        // One of two queued: room, but 3 and 4 are still held; 3 goes out.
        assert_eq!(sink.relieve(), Offer::Full(()));
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), [2, 3]);
        assert_eq!(sink.relieve(), Offer::Taken);
        assert!(sink.deliver(5));
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), [4, 5]);
        assert!(!sink.deliver(99), "the translation ended the feed");
        drop(rx);
        assert!(!sink.deliver(6), "the consumer is gone");
        assert!(sink.deliver(0), "a skip needs no consumer");
    }
}
