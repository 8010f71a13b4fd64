//! What an election does with its machine's notices, on the driver, in
//! order: it keeps the leadership the machine last reported (and its
//! belief) and the session's state, routes answers to the operation that
//! waits ([`super::ops`]), and resigns every win that no operation will
//! hand to a user. This runs before the waiting user thread sees a notice,
//! which is what makes a loss right behind a win impossible to miss.

use super::belief::Belief;
use super::ops::{Answer, Router};
use crate::driver::holdings::{Holdings, Registration};
use crate::driver::WeakInput;
use fleetcoord_sm::election::{Election as ElectionMachine, ElectionInput, ElectionNotice, OpId};
use fleetcoord_sm::keepalive::LivenessState;
use fleetcoord_sm::session::SessionBelief;
use fleetcoord_sm::LeaseId;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Instant;

/// An election's state as its notices leave it, shared by the handler and
/// the user threads.
#[derive(Default)]
pub(super) struct State {
    /// Resigns a leadership nobody waits for (see [`handle_notice`]); set
    /// once the machine runs. Weak, so that it does not keep the machine
    /// running after the last handle is gone.
    pub(super) resigner: Option<WeakInput<ElectionMachine>>,
    pub(super) held: Option<Held>,
    pub(super) session: Option<LivenessState>,
    /// The session lease last told trusted, and until when.
    pub(super) session_trust: Option<(i64, Instant)>,
    /// The last failed grant of the election's own session, until a grant
    /// is answered: what a campaign that times out meanwhile waited on.
    pub(super) grant_failure: Option<fleetcoord_sm::RpcError>,
    /// What may be believed on the session, as its hub's ending of
    /// beliefs leaves it (`fleetcoord_sm::session::belief`): a win on a
    /// lease the session ended every belief on arrives over.
    pub(super) session_belief: SessionBelief,
    /// Where a leadership registers its key, so that another watch of the
    /// same `Etcd` seeing it deleted ends it (`crate::driver::holdings`);
    /// set once the machine runs.
    pub(super) holdings: Option<Arc<Holdings>>,
}

/// The leadership the machine last reported, registered by the driver's
/// notification handler the moment `Elected` arrives — before the waiting
/// user thread sees it — so a `LeadershipLost` that follows at once is
/// never missed.
pub(super) struct Held {
    pub(super) token: i64,
    pub(super) belief: Arc<Belief>,
    lost: crossbeam_channel::Sender<()>,
    pub(super) lost_rx: crossbeam_channel::Receiver<()>,
    step_down: crossbeam_channel::Sender<()>,
    pub(super) step_down_rx: crossbeam_channel::Receiver<()>,
    /// Its key in the handle's holdings, taken out when this is dropped
    /// (the leadership ended, or a newer one replaced it).
    _registered: Option<Registration>,
}

/// Every answer names its operation; a `Resigned` names its token instead,
/// and reaches whichever operation waits (resigns match by token).
impl Answer for ElectionNotice {
    fn answers(&self) -> Option<OpId> {
        match self {
            ElectionNotice::Elected { op, .. }
            | ElectionNotice::NotElected { op, .. }
            | ElectionNotice::CampaignFailed { op, .. }
            | ElectionNotice::Proclaimed { op }
            | ElectionNotice::ProclaimFailed { op, .. }
            | ElectionNotice::HandedOver { op, .. }
            | ElectionNotice::HandOverFailed { op, .. } => Some(*op),
            _ => None,
        }
    }
}

/// Runs on the driver for every notice, in order. Answers go to the
/// operation they name only; an answer to any other operation is one that
/// operation gave up on. Such an `Elected` (a campaign that timed out, its
/// cancel unconfirmed, winning after all) is resigned here, so the machine
/// never leads for nobody.
pub(super) fn handle_notice(
    state: &Mutex<State>,
    router: &Router<ElectionNotice>,
    notice: ElectionNotice,
) {
    let mut state = state.lock();
    match &notice {
        ElectionNotice::LeadershipLost { token } => {
            lose(&mut state, *token);
            return;
        }
        ElectionNotice::Trusted { token, until } => {
            if let Some(held) = state.held.as_ref().filter(|h| h.token == *token) {
                held.belief.trust_until(*until);
            }
            return;
        }
        ElectionNotice::StepDownRequested {
            token, yielding, ..
        } => {
            if let Some(held) = state.held.as_ref().filter(|h| h.token == *token) {
                let _ = held.step_down.try_send(());
                if *yielding {
                    // The machine hands over (or resigns) right behind this
                    // notice: belief ends before its delete is sent.
                    held.belief.end();
                    let _ = held.lost.try_send(());
                }
            }
            return;
        }
        ElectionNotice::SessionTrusted { lease, until } => {
            state.session_trust = Some((*lease, *until));
            state.grant_failure = None;
            return;
        }
        ElectionNotice::GrantFailed { error } => {
            state.grant_failure = Some(error.clone());
            return;
        }
        ElectionNotice::Session(s) => {
            if let LivenessState::Registered { .. } = s {
                state.grant_failure = None;
            }
            if let LivenessState::Stopped { .. } = s {
                if let Some(held) = state.held.take() {
                    held.belief.end();
                    let _ = held.lost.try_send(());
                }
            }
            state.session = Some(s.clone());
            return;
        }
        // Only the resigned leadership ends: a dropped handle's late resign
        // is answered even when a newer leadership holds.
        ElectionNotice::Resigned { token } | ElectionNotice::HandedOver { token, .. }
            if state.held.as_ref().is_some_and(|h| h.token == *token) =>
        {
            if let Some(held) = state.held.take() {
                held.belief.end();
            }
        }
        _ => {}
    }
    // Held from the routing decision to the delivery, so that the operation
    // waiting cannot change in between.
    let routes = router.lock();
    if routes.is_stale(&notice) {
        if let ElectionNotice::Elected { token, .. } = notice {
            resign_unwanted(&mut state, token);
        }
        return;
    }
    if let ElectionNotice::Elected {
        token,
        trusted_until,
        lease,
        ..
    } = &notice
    {
        // Read under the state lock, which the session's ending of every
        // belief takes to mark the lease: either that ended this
        // leadership, or this sees the mark.
        let dead = !state.session_belief.admits(*lease);
        // Registered before the waiter sees it, so a `LeadershipLost`
        // right behind it is never missed.
        if let Some(old) = state.held.take() {
            old.belief.end();
        }
        let (lost, lost_rx) = crossbeam_channel::bounded(1);
        let (step_down, step_down_rx) = crossbeam_channel::bounded(1);
        let belief = Arc::new(if dead {
            Belief::over()
        } else {
            Belief::until(*trusted_until)
        });
        let registered = match (&state.holdings, &notice) {
            (Some(holdings), ElectionNotice::Elected { key, .. }) if !dead => {
                Some(register(holdings, key, *token, &belief, &lost, &state))
            }
            _ => None,
        };
        state.held = Some(Held {
            token: *token,
            belief,
            lost,
            lost_rx,
            step_down,
            step_down_rx,
            _registered: registered,
        });
    }
    let token = match &notice {
        ElectionNotice::Elected { token, .. } => Some(*token),
        _ => None,
    };
    let delivered = routes.deliver(notice);
    // The waiting operation gave up just now (its caller returned): the
    // win is nobody's.
    if let (Some(token), false) = (token, delivered) {
        resign_unwanted(&mut state, token);
    }
}

/// Registers the leadership `token` on `key` in the handle's holdings:
/// when another watch of the handle shows the key deleted, belief ends and
/// `lost()` fires at once, on the driver thread, before that watch's
/// consumer hears of it; the machine is then told, as for a refused fenced
/// write, and its `LeadershipLost` finds nothing left to end.
fn register(
    holdings: &Arc<Holdings>,
    key: &[u8],
    token: i64,
    belief: &Arc<Belief>,
    lost: &crossbeam_channel::Sender<()>,
    state: &State,
) -> Registration {
    let belief = belief.clone();
    let lost = lost.clone();
    let machine = state.resigner.clone();
    holdings.register(key, token, move || {
        belief.end();
        let _ = lost.try_send(());
        if let Some(machine) = machine {
            let _ = machine.send(ElectionInput::FenceRefused { token });
        }
    })
}

/// Ends the leadership `token`, if it is the one held, as lost: belief
/// first, then `lost()` fires. Called on the driver for the machine's
/// `LeadershipLost`, and on a user thread for evidence the machine has not
/// seen yet (a refused fenced write), so whichever comes first ends it and
/// the other finds nothing held.
pub(super) fn lose(state: &mut State, token: i64) {
    if let Some(held) = state.held.take_if(|h| h.token == token) {
        held.belief.end();
        let _ = held.lost.try_send(());
    }
}

/// The shared session ended every belief on `lease` (for good or not: its
/// hub's `EndBeliefs`): whatever leadership is held ends, as lost.
pub(super) fn end_on_session(state: &mut State, lease: Option<LeaseId>, for_good: bool) {
    state.session_belief.end(lease, for_good);
    if let Some(held) = state.held.take() {
        held.belief.end();
        let _ = held.lost.try_send(());
    }
}

/// Ends the leadership `token` that no operation waits for: nothing will
/// hand it to a user, so it must not hold the election.
pub(super) fn resign_unwanted(state: &mut State, token: i64) {
    if let Some(held) = state.held.take_if(|h| h.token == token) {
        held.belief.end();
    }
    if let Some(resigner) = &state.resigner {
        // Gone: the election is closing and its stop revokes the session.
        let _ = resigner.send(ElectionInput::Resign { token });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::handle::Control;
    use crate::driver::MachineHandle;
    use crate::election::ops;
    use fleetcoord_sm::election::ElectionError;
    use std::time::{Duration, Instant};

    /// The handler's two halves, as `Election` wires them.
    struct Handler {
        state: Mutex<State>,
        router: Router<ElectionNotice>,
    }

    impl Handler {
        fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
            self.state.lock()
        }
    }

    fn handle_notice(handler: &Handler, notice: ElectionNotice) {
        super::handle_notice(&handler.state, &handler.router, notice);
    }

    /// A handler whose resigns land in the returned receiver.
    fn state() -> (
        Handler,
        MachineHandle<ElectionMachine>,
        tokio::sync::mpsc::UnboundedReceiver<Control<ElectionInput>>,
    ) {
        let (input, inputs) = tokio::sync::mpsc::unbounded_channel();
        let (_finished_tx, finished) = crossbeam_channel::bounded(1);
        let machine = MachineHandle::new(input, finished);
        let state = State {
            resigner: Some(machine.downgrade()),
            ..State::default()
        };
        let (router, _routes) = ops::routes();
        let handler = Handler {
            state: Mutex::new(state),
            router,
        };
        (handler, machine, inputs)
    }

    fn wait_for(handler: &Handler, op: u64) -> crossbeam_channel::Receiver<ElectionNotice> {
        handler.router.lock().wait_for(OpId(op))
    }

    /// One instant for every test notice, so that equal notices compare equal.
    static TRUSTED_UNTIL: std::sync::LazyLock<Instant> =
        std::sync::LazyLock::new(|| Instant::now() + Duration::from_secs(3600));

    fn elected(op: u64, token: i64) -> ElectionNotice {
        ElectionNotice::Elected {
            op: OpId(op),
            key: b"/e/1".to_vec(),
            token,
            lease: 1,
            waited: false,
            attempts: 1,
            trusted_until: *TRUSTED_UNTIL,
        }
    }

    fn resigned(
        inputs: &mut tokio::sync::mpsc::UnboundedReceiver<Control<ElectionInput>>,
    ) -> Vec<i64> {
        std::iter::from_fn(|| inputs.try_recv().ok())
            .filter_map(|c| match c {
                Control::Input(ElectionInput::Resign { token }) => Some(token),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn answers_reach_only_the_operation_they_name() {
        let (state, _machine, mut inputs) = state();
        let rx = wait_for(&state, 2);
        // Operation 1 gave up; its late answers go nowhere.
        handle_notice(
            &state,
            ElectionNotice::CampaignFailed {
                op: OpId(1),
                error: ElectionError::Canceled,
            },
        );
        handle_notice(&state, ElectionNotice::Proclaimed { op: OpId(1) });
        assert!(rx.try_recv().is_err());
        // Operation 2's answer arrives, with its leadership registered.
        handle_notice(&state, elected(2, 8));
        assert_eq!(rx.try_recv().ok(), Some(elected(2, 8)));
        assert_eq!(state.lock().held.as_ref().map(|h| h.token), Some(8));
        // Resigns match by token, so they always get through.
        handle_notice(&state, ElectionNotice::Resigned { token: 3 });
        assert_eq!(
            rx.try_recv().ok(),
            Some(ElectionNotice::Resigned { token: 3 })
        );
        assert!(resigned(&mut inputs).is_empty());
    }

    /// A win on a lease the shared session already gave up (its revoke
    /// may be freeing the key) is handed out as over, never believed.
    #[test]
    fn a_win_on_a_lease_the_session_gave_up_is_not_believed() {
        let (handler, _machine, _inputs) = state();
        let rx = wait_for(&handler, 2);
        handle_notice(&handler, elected(2, 8));
        assert!(rx.try_recv().is_ok());
        let believed = |h: &Handler| h.state.lock().held.as_ref().map(|h| h.belief.holds());
        assert_eq!(believed(&handler), Some(true), "a live lease is believed");
        end_on_session(&mut handler.state.lock(), Some(1), false);
        let rx = wait_for(&handler, 3);
        handle_notice(&handler, elected(3, 9));
        assert!(rx.try_recv().is_ok());
        assert_eq!(believed(&handler), Some(false), "lease 1 was given up");
    }

    #[test]
    fn a_win_nobody_waits_for_is_resigned_not_held() {
        let (state, _machine, mut inputs) = state();
        let rx = wait_for(&state, 2);
        // The win of operation 1, which timed out and was given up.
        handle_notice(&state, elected(1, 7));
        assert!(rx.try_recv().is_err());
        assert!(state.lock().held.is_none());
        assert_eq!(resigned(&mut inputs), vec![7]);
        // The operation waiting was abandoned just now (its caller returned).
        drop(rx);
        handle_notice(&state, elected(2, 9));
        assert!(state.lock().held.is_none());
        assert_eq!(resigned(&mut inputs), vec![9]);
    }

    #[test]
    fn a_stopped_session_ends_the_held_leadership() {
        let (state, _machine, _inputs) = state();
        let rx = wait_for(&state, 1);
        handle_notice(&state, elected(1, 5));
        assert_eq!(rx.try_recv().ok(), Some(elected(1, 5)));
        let (belief, lost) = {
            let s = state.lock();
            let held = s.held.as_ref().expect("held");
            (held.belief.clone(), held.lost_rx.clone())
        };
        assert!(belief.holds());
        handle_notice(
            &state,
            ElectionNotice::Session(LivenessState::Stopped { revoked: true }),
        );
        assert!(!belief.holds(), "is_held turns false");
        assert_eq!(lost.try_recv(), Ok(()), "lost() fires");
        assert!(state.lock().held.is_none());
        assert_eq!(
            state.lock().session,
            Some(LivenessState::Stopped { revoked: true })
        );
    }

    /// A driver that reports nothing after `Elected` (starved, or its
    /// loss notice not handled yet) cannot extend belief: it ends at the
    /// announced deadline by the reader's clock, and only a `Trusted` for
    /// the same token moves it.
    #[test]
    fn belief_ends_at_the_announced_deadline_unless_moved() {
        let (state, _machine, _inputs) = state();
        let rx = wait_for(&state, 1);
        let soon = Instant::now() + Duration::from_millis(50);
        let mut notice = elected(1, 5);
        if let ElectionNotice::Elected { trusted_until, .. } = &mut notice {
            *trusted_until = soon;
        }
        handle_notice(&state, notice);
        assert!(rx.try_recv().is_ok());
        let belief = state.lock().held.as_ref().expect("held").belief.clone();
        assert!(belief.holds());
        let later = Instant::now() + Duration::from_secs(60);
        handle_notice(
            &state,
            ElectionNotice::Trusted {
                token: 4,
                until: later,
            },
        );
        std::thread::sleep(Duration::from_millis(60));
        assert!(!belief.holds(), "another token's deadline moves nothing");
        handle_notice(
            &state,
            ElectionNotice::Trusted {
                token: 5,
                until: later,
            },
        );
        assert!(belief.holds(), "an answered renewal moves it");
    }

    #[test]
    fn a_newer_leadership_replaces_the_one_held() {
        let (state, _machine, mut inputs) = state();
        let _first = wait_for(&state, 1);
        handle_notice(&state, elected(1, 5));
        let old = state.lock().held.as_ref().expect("held").belief.clone();
        let second = wait_for(&state, 2);
        handle_notice(&state, elected(2, 9));
        assert_eq!(second.try_recv().ok(), Some(elected(2, 9)));
        assert!(!old.holds(), "the old belief ends");
        assert_eq!(state.lock().held.as_ref().map(|h| h.token), Some(9));
        assert!(resigned(&mut inputs).is_empty());
    }
}
