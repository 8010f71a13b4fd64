//! Appends of one etcd coordinator to one stream, fed to one machine.
//!
//! Threads of one handle appending to one stream would otherwise each run
//! their own append machine and race each other for the stream's head: at
//! 4 threads per stream most transactions lost, and appends failed as
//! `Contended`. Instead a stream has at most one machine per handle at a
//! time, its *lane*. The first append starts the machine; every append
//! while the lane is open is fed to that machine at once, and the machine
//! puts whatever queued while a transaction was in flight into the next
//! one (see `fleetcoord_sm::stream`). Nobody waits for a hand-over: a
//! busy stream costs one transaction per round trip, on the driver alone.
//!
//! Invariants, each kept in one place:
//! * every payload fed to the machine has its waiter queued in the same
//!   critical section ([`Lanes::join`]), and the machine answers in the
//!   order fed, so the n-th notice is the n-th waiter's
//!   ([`Dispatch::answer`]);
//! * a lane closes exactly when it has nothing left to answer (its last
//!   answer, under the lane map's lock, so no append can join it after) or
//!   when its machine is gone ([`Dispatch`]'s drop: the waiters left see
//!   their channel close); a closed lane is never in the map, so the next
//!   append starts a new one;
//! * a waiter that gives up stops the machine ([`Lanes::give_up`]): every
//!   append still in it is answered with what the stop knows (nothing
//!   sent, or in doubt), flagged [`LaneMsg::GaveUp`].

use fleetcoord_sm::stream::{AppendNotice, StreamError};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// What a waiting append hears.
pub(crate) enum LaneMsg {
    /// Its outcome.
    Done(AppendNotice),
    /// Its outcome after a waiter of the lane gave up and stopped the
    /// machine: `Stopped` means never sent.
    GaveUp(AppendNotice),
}

/// What runs a lane's appends, as the lane uses it: a handle to the
/// stream's append machine on the driver. Not a machine itself: every
/// decision about an append (which payloads share a transaction, their
/// sequence numbers, when one is in doubt) is the append machine's
/// (`fleetcoord_sm::stream`, `sm/src/stream/append.rs`); the lane only
/// feeds it and hands its answers to the waiters in the order fed.
pub(crate) trait LaneEngine: Send {
    /// Queue one more append; `false` if the machine is gone.
    fn append(&self, payload: Vec<u8>) -> bool;
    /// Stop: the machine answers every queued append.
    fn stop(&self);
}

/// One stream's machine and the appends it has yet to answer.
pub(crate) struct Lane {
    state: Mutex<LaneState>,
}

#[derive(Default)]
struct LaneState {
    /// One per payload fed (or to be fed), in the same order.
    waiting: VecDeque<crossbeam_channel::Sender<LaneMsg>>,
    /// Set once the starter has the machine running; owning it keeps it.
    machine: Option<Box<dyn LaneEngine>>,
    /// Payloads that joined before the machine was running.
    early: Vec<Vec<u8>>,
    closed: bool,
    gave_up: bool,
}

/// The open lanes of one coordinator, by stream.
#[derive(Default)]
pub(crate) struct Lanes {
    open: Mutex<HashMap<String, Arc<Lane>>>,
}

/// What [`Lanes::join`] tells the caller.
pub(crate) struct Joined {
    /// Where its answer arrives.
    pub(crate) rx: crossbeam_channel::Receiver<LaneMsg>,
    /// The lane it joined.
    pub(crate) lane: Arc<Lane>,
    /// The lane is new: start its machine with this payload first, then
    /// call [`Lanes::started`].
    pub(crate) start: Option<Vec<u8>>,
}

impl Lanes {
    /// Queue `payload` on `stream`'s open lane, or open one.
    pub(crate) fn join(&self, stream: &str, payload: Vec<u8>) -> Joined {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut open = self.open.lock();
        if let Some(lane) = open.get(stream) {
            let mut state = lane.state.lock();
            state.waiting.push_back(tx);
            match &state.machine {
                // A machine gone is noticed by its dispatch, whose drop
                // closes the lane and this waiter's channel.
                Some(machine) => {
                    machine.append(payload);
                }
                None => state.early.push(payload),
            }
            return Joined {
                rx,
                lane: lane.clone(),
                start: None,
            };
        }
        let lane = Arc::new(Lane {
            state: Mutex::new(LaneState {
                waiting: VecDeque::from([tx]),
                ..LaneState::default()
            }),
        });
        open.insert(stream.to_string(), lane.clone());
        Joined {
            rx,
            lane,
            start: Some(payload),
        }
    }

    /// The starter's machine runs: feed it what joined meanwhile, in order,
    /// and every later append directly.
    pub(crate) fn started(&self, lane: &Lane, machine: Box<dyn LaneEngine>) {
        let mut state = lane.state.lock();
        if state.closed {
            // Already answered and closed (or gone): nothing more to feed.
            return;
        }
        for payload in std::mem::take(&mut state.early) {
            machine.append(payload);
        }
        if state.gave_up {
            machine.stop();
        }
        state.machine = Some(machine);
    }

    /// A waiter of `lane` gives up: the lane leaves the map (later appends
    /// open a new one) and its machine is stopped, which answers everything
    /// in it.
    pub(crate) fn give_up(&self, stream: &str, lane: &Arc<Lane>) {
        let mut open = self.open.lock();
        if open.get(stream).is_some_and(|l| Arc::ptr_eq(l, lane)) {
            open.remove(stream);
        }
        let mut state = lane.state.lock();
        state.gave_up = true;
        if let Some(machine) = &state.machine {
            machine.stop();
        }
    }
}

/// `lane` of `stream` is done: out of the map (whose lock the caller
/// holds, so no append can join it any more), its machine handle handed
/// back to be dropped outside the locks.
fn close(
    open: &mut HashMap<String, Arc<Lane>>,
    stream: &str,
    lane: &Arc<Lane>,
    state: &mut LaneState,
) -> Option<Box<dyn LaneEngine>> {
    state.closed = true;
    if open.get(stream).is_some_and(|l| Arc::ptr_eq(l, lane)) {
        open.remove(stream);
    }
    state.machine.take()
}

/// Delivers a lane's notices to its waiters, in order, and closes the
/// lane with the last one (or when dropped unanswered: the machine ended).
pub(crate) struct Dispatch {
    lanes: Arc<Lanes>,
    stream: String,
    lane: Arc<Lane>,
}

impl Dispatch {
    /// The dispatcher of `lane`, which serves `stream`.
    pub(crate) fn new(lanes: Arc<Lanes>, stream: &str, lane: Arc<Lane>) -> Dispatch {
        Dispatch {
            lanes,
            stream: stream.to_string(),
            lane,
        }
    }

    /// Deliver the machine's next notice; `false` once nothing is left to
    /// answer (the lane is closed and the machine may retire).
    pub(crate) fn answer(&mut self, notice: AppendNotice) -> bool {
        // Lock order: the lane map, then a lane (as `join` takes them).
        let mut open = self.lanes.open.lock();
        let mut state = self.lane.state.lock();
        if let Some(tx) = state.waiting.pop_front() {
            let stopped = matches!(
                notice,
                AppendNotice::Failed(StreamError::Stopped | StreamError::Indeterminate { .. })
            );
            let msg = if stopped && state.gave_up {
                LaneMsg::GaveUp(notice)
            } else {
                LaneMsg::Done(notice)
            };
            // A waiter is answered once; its channel has room for it.
            let _ = tx.try_send(msg);
        }
        if !state.waiting.is_empty() || !state.early.is_empty() {
            return true;
        }
        let machine = close(&mut open, &self.stream, &self.lane, &mut state);
        drop(state);
        drop(open);
        // Dropped outside the locks: it tells a machine that is done anyway
        // to stop.
        drop(machine);
        false
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        let mut open = self.lanes.open.lock();
        let mut state = self.lane.state.lock();
        if state.closed {
            return;
        }
        // The machine ended with appends unanswered (the driver is gone):
        // their waiters see the channel close.
        state.waiting.clear();
        state.early.clear();
        let machine = close(&mut open, &self.stream, &self.lane, &mut state);
        drop(state);
        drop(open);
        drop(machine);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Records what the lane feeds it.
    #[derive(Clone, Default)]
    struct Recorder {
        fed: Arc<Mutex<Vec<Vec<u8>>>>,
        stopped: Arc<AtomicBool>,
    }

    impl LaneEngine for Recorder {
        fn append(&self, payload: Vec<u8>) -> bool {
            self.fed.lock().push(payload);
            true
        }
        fn stop(&self) {
            self.stopped.store(true, Ordering::SeqCst);
        }
    }

    fn appended(seq: u64) -> AppendNotice {
        AppendNotice::Appended { seq, revision: 9 }
    }

    fn done(rx: &crossbeam_channel::Receiver<LaneMsg>) -> Option<AppendNotice> {
        match rx.try_recv() {
            Ok(LaneMsg::Done(n)) => Some(n),
            _ => None,
        }
    }

    #[test]
    fn appends_join_the_open_lane_in_order_and_it_closes_with_its_last_answer() {
        let lanes = Arc::new(Lanes::default());
        let a = lanes.join("s", b"a".to_vec());
        assert_eq!(
            a.start.as_deref(),
            Some(&b"a"[..]),
            "a new lane: a starts it"
        );
        let b = lanes.join("s", b"b".to_vec());
        assert!(b.start.is_none());
        let mut dispatch = Dispatch::new(lanes.clone(), "s", a.lane.clone());
        let machine = Recorder::default();
        lanes.started(&a.lane, Box::new(machine.clone()));
        assert_eq!(*machine.fed.lock(), vec![b"b".to_vec()], "b joined early");
        let c = lanes.join("s", b"c".to_vec());
        assert_eq!(machine.fed.lock().len(), 2, "c is fed at once");
        assert!(dispatch.answer(appended(1)));
        assert!(dispatch.answer(appended(2)));
        assert_eq!(
            (done(&a.rx), done(&b.rx)),
            (Some(appended(1)), Some(appended(2)))
        );
        assert!(!dispatch.answer(appended(3)), "c was the last");
        assert_eq!(done(&c.rx), Some(appended(3)));
        assert!(
            lanes.join("s", b"d".to_vec()).start.is_some(),
            "closed: d opens a new lane"
        );
    }

    #[test]
    fn a_machine_that_ends_unanswered_closes_the_lane_and_every_waiter_hears_it() {
        let lanes = Arc::new(Lanes::default());
        let a = lanes.join("s", b"a".to_vec());
        let b = lanes.join("s", b"b".to_vec());
        let dispatch = Dispatch::new(lanes.clone(), "s", a.lane.clone());
        lanes.started(&a.lane, Box::new(Recorder::default()));
        drop(dispatch);
        for rx in [&a.rx, &b.rx] {
            assert!(matches!(
                rx.try_recv(),
                Err(crossbeam_channel::TryRecvError::Disconnected)
            ));
        }
        assert!(lanes.join("s", b"c".to_vec()).start.is_some());
    }

    #[test]
    fn giving_up_stops_the_machine_flags_its_answers_and_opens_a_new_lane_for_others() {
        let lanes = Arc::new(Lanes::default());
        let a = lanes.join("s", b"a".to_vec());
        let mut dispatch = Dispatch::new(lanes.clone(), "s", a.lane.clone());
        let machine = Recorder::default();
        lanes.started(&a.lane, Box::new(machine.clone()));
        let b = lanes.join("s", b"b".to_vec());
        lanes.give_up("s", &b.lane);
        assert!(machine.stopped.load(Ordering::SeqCst));
        assert!(lanes.join("s", b"c".to_vec()).start.is_some(), "a new lane");
        assert!(dispatch.answer(AppendNotice::Failed(StreamError::Stopped)));
        assert!(!dispatch.answer(AppendNotice::Failed(StreamError::Stopped)));
        assert!(matches!(a.rx.try_recv(), Ok(LaneMsg::GaveUp(_))));
        assert!(matches!(b.rx.try_recv(), Ok(LaneMsg::GaveUp(_))));
    }
}
