//! Operation routing between user threads and a running machine: a user
//! call becomes an input numbered with an operation id ([`OpId`]), and the
//! caller waits, up to its timeout, for the notices that answer it.
//!
//! The numbering is what lets a caller give up safely: an answer that
//! arrives after its caller timed out names that caller's operation, so it
//! is never taken for the answer to the next one. The routing knows nothing
//! of elections beyond [`Answer`]; every operation of an [`Election`], its
//! [`Leadership`]s, and of the [`Mutex`] and [`ElectionPool`] built on it
//! goes through [`Ops::call`].
//!
//! Two ends share one [`Routes`] table: [`Ops::call`] on the user thread
//! registers the one operation that waits, and the machine's notice handler
//! on the driver holds the [`Router`], through which it asks
//! [`Routes::is_stale`] and [`Routes::deliver`].
//!
//! [`Election`]: super::Election
//! [`Leadership`]: super::Leadership
//! [`Mutex`]: super::mutex::Mutex
//! [`ElectionPool`]: super::ElectionPool

use crate::deadline::deadline_after;
use crate::driver::{Gone, MachineHandle};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use fleetcoord_sm::election::OpId;
use fleetcoord_sm::Machine;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::sync::Arc;
use std::time::Duration;

/// A notice that may answer an operation.
pub(super) trait Answer {
    /// The operation this notice answers; `None` for a notice that answers
    /// none by id (a resign's answer names its token), which goes to
    /// whichever operation waits.
    fn answers(&self) -> Option<OpId>;
}

/// Which operation waits for answers, shared by the user threads and the
/// notice handler.
pub(super) struct Routes<N> {
    /// The operation waiting for its answer: only answers naming it (and
    /// notices that name no operation) reach it.
    waiter: Option<(OpId, Sender<N>)>,
    /// The id of the last operation begun.
    last_op: u64,
    /// The machine task has ended; no answer will ever come.
    ended: bool,
}

impl<N> Routes<N> {
    /// Number the next operation and register it as the one waiting;
    /// `None` once the machine task has ended.
    fn begin(&mut self) -> Option<(OpId, Receiver<N>)> {
        if self.ended {
            return None;
        }
        self.last_op = self.last_op.wrapping_add(1);
        let op = OpId(self.last_op);
        Some((op, self.wait_for(op)))
    }

    /// Register `op` as the operation waiting, replacing any other; its
    /// notices arrive on the receiver.
    pub(super) fn wait_for(&mut self, op: OpId) -> Receiver<N> {
        let (tx, answers) = crossbeam_channel::unbounded();
        self.waiter = Some((op, tx));
        answers
    }

    /// Nobody waits for `op`'s answers any more.
    fn unregister(&mut self, op: OpId) {
        if self.waiter.as_ref().is_some_and(|(w, _)| *w == op) {
            self.waiter = None;
        }
    }
}

impl<N: Answer> Routes<N> {
    /// Whether `notice` answers an operation other than the one waiting:
    /// one whose caller gave up on it. Nothing will hand it to a user.
    pub(super) fn is_stale(&self, notice: &N) -> bool {
        let answer = notice.answers();
        answer.is_some() && answer != self.waiter.as_ref().map(|(op, _)| *op)
    }

    /// Hand `notice` to the operation waiting; `false` when none waits or
    /// its caller has just returned.
    pub(super) fn deliver(&self, notice: N) -> bool {
        self.waiter
            .as_ref()
            .is_some_and(|(_, tx)| tx.send(notice).is_ok())
    }
}

/// The notice handler's end of the routes. Owned by the handler, so it is
/// dropped exactly when the machine task ends: it then drops the waiter's
/// sender, and a blocked call wakes with [`Gone`] instead of polling for
/// it.
pub(super) struct Router<N>(Arc<Mutex<Routes<N>>>);

impl<N> Router<N> {
    /// The routes, for one notice's decisions.
    pub(super) fn lock(&self) -> MutexGuard<'_, Routes<N>> {
        self.0.lock()
    }
}

impl<N> Drop for Router<N> {
    fn drop(&mut self) {
        let mut routes = self.0.lock();
        routes.ended = true;
        routes.waiter = None;
    }
}

/// A fresh routing table: the notice handler's end, and the one for
/// [`Ops::new`] once the machine runs.
pub(super) fn routes<N>() -> (Router<N>, Arc<Mutex<Routes<N>>>) {
    let routes = Arc::new(Mutex::new(Routes {
        waiter: None,
        last_op: 0,
        ended: false,
    }));
    (Router(routes.clone()), routes)
}

/// A primitive's hold on its running machine, with its operations routed.
pub(super) struct Ops<M: Machine> {
    machine: MachineHandle<M>,
    routes: Arc<Mutex<Routes<M::Notice>>>,
    /// One operation at a time: a second would take the first's route (and
    /// the machine would answer it `Busy`).
    turn: Mutex<TurnState>,
    /// Signalled when the turn is given back.
    turn_free: Condvar,
}

/// Who has the turn to run operations.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum TurnState {
    Free,
    /// A call runs (and holds a [`Turn`]).
    Taken,
    /// An operation answered over several calls keeps it ([`KeptTurn`]).
    Kept,
}

/// The caller's turn to run operations; see [`Ops::turn`]. Given back when
/// dropped, unless [`Turn::keep`] made it outlive the borrow.
pub(super) struct Turn<'a> {
    ops_turn: &'a Mutex<TurnState>,
    turn_free: &'a Condvar,
    kept: bool,
}

impl Turn<'_> {
    /// Keep the turn past this borrow, for an operation answered over
    /// several calls (a pending campaign): nothing else runs until
    /// [`Ops::give_back`] is called with the token returned.
    pub(super) fn keep(mut self) -> KeptTurn {
        self.kept = true;
        *self.ops_turn.lock() = TurnState::Kept;
        KeptTurn(())
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.kept {
            *self.ops_turn.lock() = TurnState::Free;
            self.turn_free.notify_all();
        }
    }
}

/// A turn kept by [`Turn::keep`]; only [`Ops::give_back`] ends it, so
/// whoever holds one must give it back exactly once.
#[must_use = "a kept turn blocks every other operation until given back"]
pub(super) struct KeptTurn(());

/// What came of [`Ops::call`].
pub(super) enum Outcome<T, N> {
    /// The answer, as the caller's function made it of a notice.
    Answered(T),
    /// The timeout passed first. Nothing waits for `op` any more, so its
    /// late answers are stale; `unread` are notices that reached it but
    /// were not read yet (the caller may have to undo what they report).
    TimedOut { op: OpId, unread: Vec<N> },
}

impl<M: Machine> Ops<M> {
    /// `machine`, with the routes its notice handler delivers to.
    pub(super) fn new(machine: MachineHandle<M>, routes: Arc<Mutex<Routes<M::Notice>>>) -> Self {
        Ops {
            machine,
            routes,
            turn: Mutex::new(TurnState::Free),
            turn_free: Condvar::new(),
        }
    }

    /// The machine, for inputs that are not operations (a stop, a resign
    /// nobody waits for).
    pub(super) fn machine(&self) -> &MachineHandle<M> {
        &self.machine
    }

    /// Wait for the turn to run operations; held across a check and the
    /// call it decides on, so nothing runs in between.
    pub(super) fn turn(&self) -> Turn<'_> {
        let mut state = self.turn.lock();
        while *state != TurnState::Free {
            self.turn_free.wait(&mut state);
        }
        *state = TurnState::Taken;
        self.taken_turn()
    }

    /// [`Ops::turn`], unless an operation keeps the turn ([`Turn::keep`]):
    /// `None` then, at once. For a campaign, which could only be refused
    /// while another one is pending, and could wait for ever if the thread
    /// that should end the pending one is the caller.
    pub(super) fn turn_unless_kept(&self) -> Option<Turn<'_>> {
        let mut state = self.turn.lock();
        loop {
            match *state {
                TurnState::Free => break,
                TurnState::Kept => return None,
                TurnState::Taken => self.turn_free.wait(&mut state),
            }
        }
        *state = TurnState::Taken;
        Some(self.taken_turn())
    }

    /// The handle of a turn just marked taken.
    fn taken_turn(&self) -> Turn<'_> {
        Turn {
            ops_turn: &self.turn,
            turn_free: &self.turn_free,
            kept: false,
        }
    }

    /// End a turn kept by [`Turn::keep`]: the next operation may run.
    pub(super) fn give_back(&self, kept: KeptTurn) {
        let KeptTurn(()) = kept;
        *self.turn.lock() = TurnState::Free;
        self.turn_free.notify_all();
    }

    /// Begin one operation without waiting for its answer: number it,
    /// register it as the one waiting, send the machine `make_input(op)`.
    /// Its notices arrive on the receiver until [`Ops::forget`]. `Err(Gone)`
    /// once the machine task has ended.
    pub(super) fn begin(
        &self,
        _turn: &Turn<'_>,
        make_input: impl FnOnce(OpId) -> M::Input,
    ) -> Result<(OpId, Receiver<M::Notice>), Gone> {
        let (op, answers) = self.routes.lock().begin().ok_or(Gone)?;
        if let Err(gone) = self.machine.send(make_input(op)) {
            self.routes.lock().unregister(op);
            return Err(gone);
        }
        Ok((op, answers))
    }

    /// Nobody waits for `op`'s answers any more: from now on they are
    /// stale (see [`Routes::is_stale`]).
    pub(super) fn forget(&self, op: OpId) {
        self.routes.lock().unregister(op);
    }

    /// Run one operation: number it, register it as the one waiting, send
    /// the machine `make_input(op)`, then give each notice that reaches it
    /// to `answer` until that makes something of one (`Some`), or until
    /// `timeout` (counted from the send) passes. `None`, or a timeout too
    /// long to add to the current time (`Duration::MAX`), waits for ever.
    /// `Err(Gone)` once the machine task has ended, before or during the
    /// wait.
    pub(super) fn call<T>(
        &self,
        turn: &Turn<'_>,
        make_input: impl FnOnce(OpId) -> M::Input,
        timeout: Option<Duration>,
        mut answer: impl FnMut(M::Notice) -> Option<T>,
    ) -> Result<Outcome<T, M::Notice>, Gone> {
        let (op, answers) = self.begin(turn, make_input)?;
        let deadline = timeout.and_then(deadline_after);
        loop {
            let received = match deadline {
                Some(d) => answers.recv_deadline(d),
                None => answers.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match received {
                Ok(notice) => {
                    if let Some(answered) = answer(notice) {
                        return Ok(Outcome::Answered(answered));
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    // Unregistered first, so that nothing arrives after the
                    // notices read here.
                    self.routes.lock().unregister(op);
                    let unread = answers.try_iter().collect();
                    return Ok(Outcome::TimedOut { op, unread });
                }
                Err(RecvTimeoutError::Disconnected) => return Err(Gone),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::handle::Control;
    use fleetcoord_sm::election::{Election as ElectionMachine, ElectionInput, ElectionNotice};

    const SHORT: Duration = Duration::from_millis(20);

    fn ops() -> (
        Ops<ElectionMachine>,
        Router<ElectionNotice>,
        tokio::sync::mpsc::UnboundedReceiver<Control<ElectionInput>>,
    ) {
        let (input, inputs) = tokio::sync::mpsc::unbounded_channel();
        let (_finished_tx, finished) = crossbeam_channel::bounded(1);
        let (router, routes) = routes();
        (
            Ops::new(MachineHandle::new(input, finished), routes),
            router,
            inputs,
        )
    }

    fn proclaim(op: OpId) -> ElectionInput {
        ElectionInput::Proclaim {
            op,
            value: Vec::new(),
        }
    }

    #[test]
    fn a_timed_out_call_leaves_its_late_answers_stale() {
        let (ops, router, mut inputs) = ops();
        let outcome = ops.call(&ops.turn(), proclaim, Some(SHORT), |_| Some(()));
        let Ok(Outcome::TimedOut { op, unread }) = outcome else {
            panic!("no answer came")
        };
        assert_eq!(op, OpId(1));
        assert!(unread.is_empty());
        assert!(matches!(
            inputs.try_recv(),
            Ok(Control::Input(ElectionInput::Proclaim { op: OpId(1), .. }))
        ));
        let late = ElectionNotice::Proclaimed { op: OpId(1) };
        assert!(router.lock().is_stale(&late));
        assert!(!router.lock().deliver(late), "nobody waits");
    }

    #[test]
    fn a_call_takes_only_what_its_function_accepts() {
        let (ops, router, _inputs) = ops();
        // The handler answers from the driver, while the caller waits.
        let handler = std::thread::spawn(move || {
            for _ in 0..1000 {
                let routes = router.lock();
                let answers = [
                    ElectionNotice::Resigned { token: 4 },
                    ElectionNotice::Proclaimed { op: OpId(1) },
                ];
                if routes.waiter.is_some() {
                    for notice in answers {
                        assert!(!routes.is_stale(&notice));
                        assert!(routes.deliver(notice));
                    }
                    return;
                }
                drop(routes);
                std::thread::sleep(Duration::from_millis(1));
            }
            panic!("the call never waited");
        });
        let mut seen = Vec::new();
        let outcome = ops.call(&ops.turn(), proclaim, None, |notice| {
            seen.push(notice.clone());
            matches!(notice, ElectionNotice::Proclaimed { .. }).then_some("proclaimed")
        });
        handler.join().expect("handler");
        assert!(matches!(outcome, Ok(Outcome::Answered("proclaimed"))));
        assert_eq!(seen.len(), 2, "the resign's answer was offered too");
    }

    /// A pending campaign keeps the turn across calls: campaigns are
    /// refused at once (not left waiting on a turn their own thread may
    /// hold), other operations wait until it is given back.
    #[test]
    fn a_kept_turn_refuses_campaigns_and_holds_other_operations() {
        let (ops, _router, _inputs) = ops();
        let kept = ops.turn().keep();
        assert!(ops.turn_unless_kept().is_none(), "refused while kept");
        std::thread::scope(|s| {
            let waiting = s.spawn(|| {
                let _turn = ops.turn();
                std::time::Instant::now()
            });
            std::thread::sleep(SHORT);
            assert!(!waiting.is_finished(), "waits while kept");
            let given_back = std::time::Instant::now();
            ops.give_back(kept);
            assert!(waiting.join().expect("waiter") >= given_back);
        });
        let turn = ops.turn_unless_kept().expect("free again");
        drop(turn);
        drop(ops.turn());
    }

    #[test]
    fn a_call_knows_a_machine_that_ended() {
        let (ops, router, _inputs) = ops();
        drop(router);
        assert!(matches!(
            ops.call(&ops.turn(), proclaim, None, |_| Some(())),
            Err(Gone)
        ));
    }
}
