//! Appends of one etcd coordinator to one stream, combined into batches.
//!
//! Threads of one handle appending to one stream would otherwise each run
//! their own append machine and race each other for the stream's head: at
//! 4 threads per stream most transactions lost, and appends failed as
//! `Contended`. Instead, a stream has at most one machine per handle at a
//! time (its lane is *busy*). An append that finds its lane idle runs the
//! machine for itself and everything that queued before it started (a
//! batch; the machine puts what fits into one transaction, see
//! `fleetcoord_sm::stream`). One that finds it busy queues. When a batch
//! has its last answer, the queued appends become the next batch, run by
//! the first of their callers, which is woken with [`LaneMsg::Run`].
//!
//! Invariants, each kept in one place:
//! * every waiter gets exactly one answer: its batch's notice
//!   ([`Dispatch::answer`]), or a closed channel if the machine ended
//!   without answering (the driver is gone);
//! * a busy lane always has a batch running or being handed over, so no
//!   waiter is stranded: [`Dispatch`] hands over on its last answer and,
//!   failing that, when it is dropped;
//! * a waiter that gives up before its batch starts leaves the queue
//!   ([`Lanes::leave`]), so an append reported as failed is never sent.

use fleetcoord_sm::stream::{AppendNotice, StreamError};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What a waiting append hears.
pub(crate) enum LaneMsg {
    /// Its outcome.
    Done(AppendNotice),
    /// Its batch was stopped because the batch's runner gave up waiting:
    /// nothing of it was sent, or the notice says what may have been.
    GaveUp(AppendNotice),
    /// Run this batch (it is first in it).
    Run(Batch),
}

/// One queued append.
pub(crate) struct Waiter {
    id: u64,
    /// The payload to append.
    pub(crate) payload: Vec<u8>,
    tx: crossbeam_channel::Sender<LaneMsg>,
}

/// Appends that run together, in the order they queued.
pub(crate) type Batch = Vec<Waiter>;

/// The busy lanes of one coordinator: stream → appends queued behind the
/// running batch. A stream absent from the map is idle.
pub(crate) struct Lanes {
    busy: Mutex<HashMap<String, Vec<Waiter>>>,
    next_id: Mutex<u64>,
    /// A batch is at most what the machine puts into one transaction, so
    /// that it is bounded like one append (see `append_wait` in etcd.rs).
    max_batch: usize,
    max_batch_bytes: usize,
}

/// What [`Lanes::join`] tells the caller to do.
pub(crate) struct Joined {
    /// Identifies the append for [`Lanes::leave`].
    pub(crate) id: u64,
    /// Where its answer (or its turn to run a batch) arrives.
    pub(crate) rx: crossbeam_channel::Receiver<LaneMsg>,
    /// The lane was idle: run this batch (just this append) now.
    pub(crate) run: Option<Batch>,
}

impl Lanes {
    /// Lanes whose batches hold at most `max_batch` appends and
    /// `max_batch_bytes` of payload (a larger first payload goes alone).
    pub(crate) fn new(max_batch: usize, max_batch_bytes: usize) -> Lanes {
        Lanes {
            busy: Mutex::new(HashMap::new()),
            next_id: Mutex::new(0),
            max_batch: max_batch.max(1),
            max_batch_bytes,
        }
    }

    /// Queue `payload` on `stream`'s lane.
    pub(crate) fn join(&self, stream: &str, payload: Vec<u8>) -> Joined {
        let id = {
            let mut next = self.next_id.lock();
            *next = next.wrapping_add(1);
            *next
        };
        // Room for both messages a waiter can get: its turn, then its answer.
        let (tx, rx) = crossbeam_channel::bounded(2);
        let waiter = Waiter { id, payload, tx };
        let mut busy = self.busy.lock();
        let run = match busy.get_mut(stream) {
            Some(queued) => {
                queued.push(waiter);
                None
            }
            None => {
                busy.insert(stream.to_string(), Vec::new());
                Some(vec![waiter])
            }
        };
        Joined { id, rx, run }
    }

    /// Take the append `id` out of the queue, if no batch has taken it
    /// yet: `true` means it was never sent and never will be.
    pub(crate) fn leave(&self, stream: &str, id: u64) -> bool {
        let mut busy = self.busy.lock();
        let Some(queued) = busy.get_mut(stream) else {
            return false;
        };
        let before = queued.len();
        queued.retain(|w| w.id != id);
        queued.len() != before
    }

    /// The first queued appends of `stream` (as many as a batch holds)
    /// become the next batch, handed to the first caller still waiting;
    /// with none, the lane turns idle.
    fn hand_over(&self, stream: &str) {
        let mut busy = self.busy.lock();
        let mut batch = match busy.get_mut(stream) {
            Some(queued) if !queued.is_empty() => {
                let mut bytes = 0usize;
                let mut take = 0usize;
                for w in queued.iter().take(self.max_batch) {
                    bytes = bytes.saturating_add(w.payload.len());
                    if take > 0 && bytes > self.max_batch_bytes {
                        break;
                    }
                    take += 1;
                }
                queued.drain(..take).collect::<Batch>()
            }
            _ => {
                busy.remove(stream);
                return;
            }
        };
        // Waiters only go away through `leave` (under this lock) or by
        // unwinding; skip a caller that is gone rather than strand the rest.
        while !batch.is_empty() {
            let runner = batch[0].tx.clone();
            match runner.try_send(LaneMsg::Run(batch)) {
                Ok(()) => return,
                Err(crossbeam_channel::TrySendError::Full(LaneMsg::Run(b)))
                | Err(crossbeam_channel::TrySendError::Disconnected(LaneMsg::Run(b))) => {
                    batch = b;
                    batch.remove(0);
                }
                Err(_) => return,
            }
        }
        busy.remove(stream);
    }
}

/// Where a batch's machine handle is kept until the batch's last answer:
/// its runner is only the first waiter, and returns with its own answer,
/// but dropping the handle would stop the machine under the others.
pub(crate) type Keep = Arc<Mutex<Option<Box<dyn Send>>>>;

/// Sends a running batch's notices to its waiters, in order, and hands
/// the lane over once the last is answered (or when dropped unanswered).
pub(crate) struct Dispatch {
    lanes: Arc<Lanes>,
    stream: String,
    waiting: VecDeque<crossbeam_channel::Sender<LaneMsg>>,
    gave_up: Arc<AtomicBool>,
    keep: Keep,
    handed_over: bool,
}

impl Dispatch {
    /// The dispatcher of `batch` on `stream`'s lane; its payloads go to
    /// the machine in the same order. `gave_up` is set by the runner before
    /// it stops the machine for taking too long.
    pub(crate) fn new(
        lanes: Arc<Lanes>,
        stream: &str,
        batch: Batch,
        gave_up: Arc<AtomicBool>,
        keep: Keep,
    ) -> (Dispatch, Vec<Vec<u8>>) {
        let mut waiting = VecDeque::with_capacity(batch.len());
        let mut payloads = Vec::with_capacity(batch.len());
        for w in batch {
            waiting.push_back(w.tx);
            payloads.push(w.payload);
        }
        let dispatch = Dispatch {
            lanes,
            stream: stream.to_string(),
            waiting,
            gave_up,
            keep,
            handed_over: false,
        };
        (dispatch, payloads)
    }

    /// Deliver the machine's next notice; `false` once every waiter of the
    /// batch is answered (the machine then retires).
    pub(crate) fn answer(&mut self, notice: AppendNotice) -> bool {
        if let Some(tx) = self.waiting.pop_front() {
            let stopped = matches!(
                notice,
                AppendNotice::Failed(StreamError::Stopped | StreamError::Indeterminate { .. })
            );
            let msg = if stopped && self.gave_up.load(Ordering::SeqCst) {
                LaneMsg::GaveUp(notice)
            } else {
                LaneMsg::Done(notice)
            };
            // A waiter is answered once; its channel has room for it.
            let _ = tx.try_send(msg);
        }
        if self.waiting.is_empty() {
            // Every answer is out: the machine may go.
            drop(self.keep.lock().take());
            self.hand_over();
            return false;
        }
        true
    }

    fn hand_over(&mut self) {
        if !std::mem::replace(&mut self.handed_over, true) {
            self.lanes.hand_over(&self.stream);
        }
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        // Unanswered waiters see their channel close (the driver is gone);
        // the queue behind them still gets its turn.
        self.waiting.clear();
        self.hand_over();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn appended(seq: u64) -> AppendNotice {
        AppendNotice::Appended { seq, revision: 9 }
    }

    #[test]
    fn the_first_append_runs_the_rest_queue_and_the_next_batch_goes_to_the_first_of_them() {
        let lanes = Arc::new(Lanes::new(2, 1024));
        let a = lanes.join("s", b"a".to_vec());
        let batch = a.run.expect("an idle lane runs at once");
        let b = lanes.join("s", b"b".to_vec());
        let c = lanes.join("s", b"c".to_vec());
        assert!(b.run.is_none() && c.run.is_none(), "a busy lane queues");
        let (mut dispatch, payloads) =
            Dispatch::new(lanes.clone(), "s", batch, Arc::default(), Arc::default());
        assert_eq!(payloads, vec![b"a".to_vec()]);
        assert!(!dispatch.answer(appended(1)), "its only waiter is answered");
        assert!(matches!(a.rx.try_recv(), Ok(LaneMsg::Done(n)) if n == appended(1)));
        let Ok(LaneMsg::Run(next)) = b.rx.try_recv() else {
            panic!("b runs the next batch");
        };
        assert!(c.rx.try_recv().is_err(), "c waits in b's batch");
        let (mut dispatch, payloads) =
            Dispatch::new(lanes.clone(), "s", next, Arc::default(), Arc::default());
        assert_eq!(
            payloads,
            vec![b"b".to_vec(), b"c".to_vec()],
            "two per batch"
        );
        assert!(dispatch.answer(appended(2)));
        assert!(!dispatch.answer(appended(3)));
        assert!(matches!(c.rx.try_recv(), Ok(LaneMsg::Done(n)) if n == appended(3)));
        assert!(
            lanes.join("s", b"d".to_vec()).run.is_some(),
            "the lane is idle again"
        );
    }

    #[test]
    fn a_waiter_leaves_only_before_its_batch_starts() {
        let lanes = Arc::new(Lanes::new(2, 1024));
        let a = lanes.join("s", b"a".to_vec());
        let b = lanes.join("s", b"b".to_vec());
        let c = lanes.join("s", b"c".to_vec());
        assert!(lanes.leave("s", b.id), "b was still queued");
        assert!(!lanes.leave("s", b.id));
        let (dispatch, _) = Dispatch::new(
            lanes.clone(),
            "s",
            a.run.expect("runs"),
            Arc::default(),
            Arc::default(),
        );
        // The machine ended without answering: a hears a closed channel,
        // and c, not b, runs next.
        drop(dispatch);
        assert!(matches!(
            a.rx.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        ));
        let Ok(LaneMsg::Run(next)) = c.rx.try_recv() else {
            panic!("c runs next");
        };
        assert_eq!(next.len(), 1);
        assert!(!lanes.leave("s", c.id), "taken by its batch");
    }

    #[test]
    fn answers_of_a_batch_its_runner_gave_up_on_say_so() {
        let lanes = Arc::new(Lanes::new(2, 1024));
        let a = lanes.join("s", b"a".to_vec());
        let gave_up = Arc::new(AtomicBool::new(false));
        let (mut dispatch, _) = Dispatch::new(
            lanes.clone(),
            "s",
            a.run.expect("runs"),
            gave_up.clone(),
            Arc::default(),
        );
        gave_up.store(true, Ordering::SeqCst);
        dispatch.answer(AppendNotice::Failed(StreamError::Stopped));
        assert!(matches!(a.rx.try_recv(), Ok(LaneMsg::GaveUp(_))));
    }
}
