//! The session hub (`fleetcoord_sm::session::hub`) and one primitive's
//! belief (`fleetcoord_sm::session::belief`), as exact command sequences:
//! each test names the invariant of the module docs it pins.

use fleetcoord_sm::keepalive::{KeepaliveInput, KeepaliveNotice, LivenessState, ResumePoint};
use fleetcoord_sm::session::{
    AttachError, DetachError, HubCommand, MemberId, SessionBelief, SessionHub, SessionInput,
    SessionRequest,
};
use fleetcoord_sm::RpcError;
use std::time::{Duration, Instant};

fn drain(hub: &mut SessionHub) -> Vec<HubCommand> {
    std::iter::from_fn(|| hub.poll_command()).collect()
}

fn state(hub: &mut SessionHub, state: LivenessState) {
    hub.keepalive(KeepaliveNotice::State(state));
}

fn end(member: u64, lease: Option<i64>, for_good: bool) -> HubCommand {
    HubCommand::EndBeliefs {
        member: MemberId(member),
        lease,
        for_good,
    }
}

fn tell(member: u64, fact: SessionInput) -> HubCommand {
    HubCommand::Tell {
        member: MemberId(member),
        fact,
    }
}

/// Two members (0 and 1) on lease 1, trusted until `until`; the queue
/// drained.
fn two_on_lease_1(until: Instant) -> SessionHub {
    let mut hub = SessionHub::new();
    assert_eq!(hub.attach("/e/a/"), Ok(MemberId(0)));
    assert_eq!(hub.attach("/s/b/"), Ok(MemberId(1)));
    assert_eq!(drain(&mut hub), vec![], "nothing to replay yet");
    state(&mut hub, LivenessState::Registered { lease: 1 });
    hub.keepalive(KeepaliveNotice::Trusted { lease: 1, until });
    drain(&mut hub);
    hub
}

/// Invariants 1, 3, 6: a loss ends every member's beliefs (marking the
/// lease) before anyone hears it, the state follows, and the next lease is
/// told to each member in the order they joined.
#[test]
fn a_loss_ends_every_belief_before_anything_is_told() {
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(9);
    let mut hub = SessionHub::new();
    hub.attach("/e/a/").unwrap();
    hub.attach("/s/b/").unwrap();
    state(&mut hub, LivenessState::Registered { lease: 1 });
    hub.keepalive(KeepaliveNotice::Trusted { lease: 1, until });
    assert_eq!(
        drain(&mut hub),
        vec![
            tell(0, SessionInput::Up { lease: 1 }),
            tell(1, SessionInput::Up { lease: 1 }),
            HubCommand::State(LivenessState::Registered { lease: 1 }),
            tell(0, SessionInput::Trusted { lease: 1, until }),
            tell(1, SessionInput::Trusted { lease: 1, until }),
        ]
    );
    assert_eq!(hub.lease(), Some(1));
    assert_eq!(hub.trusted_until(), Some(until));
    state(&mut hub, LivenessState::Lost { lease: 1 });
    assert_eq!(
        drain(&mut hub),
        vec![
            end(0, Some(1), false),
            end(1, Some(1), false),
            tell(0, SessionInput::Lost { lease: 1 }),
            tell(1, SessionInput::Lost { lease: 1 }),
            HubCommand::State(LivenessState::Lost { lease: 1 }),
        ]
    );
    assert_eq!(hub.dead_lease(), 1);
    assert_eq!(hub.lease(), None);
    state(&mut hub, LivenessState::Registering);
    state(&mut hub, LivenessState::Registered { lease: 2 });
    assert_eq!(
        drain(&mut hub),
        vec![
            HubCommand::State(LivenessState::Registering),
            tell(0, SessionInput::Up { lease: 2 }),
            tell(1, SessionInput::Up { lease: 2 }),
            HubCommand::State(LivenessState::Registered { lease: 2 }),
        ]
    );
}

/// Invariant 1: a new lease reported with no loss in between still ends
/// every belief on the old one first.
#[test]
fn a_new_lease_without_a_loss_ends_the_old_one_first() {
    let t0 = Instant::now();
    let mut hub = two_on_lease_1(t0 + Duration::from_secs(9));
    state(&mut hub, LivenessState::Registered { lease: 2 });
    assert_eq!(
        drain(&mut hub),
        vec![
            end(0, Some(1), false),
            end(1, Some(1), false),
            tell(0, SessionInput::Up { lease: 2 }),
            tell(1, SessionInput::Up { lease: 2 }),
            HubCommand::State(LivenessState::Registered { lease: 2 }),
        ]
    );
    assert_eq!(hub.dead_lease(), 1);
}

/// Invariant 3: a member joining late first hears what the others know:
/// the lease, its trust, and that renewals fail; then the same stream.
#[test]
fn a_late_joiner_hears_the_current_facts_first() {
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(9);
    let mut hub = two_on_lease_1(until);
    state(&mut hub, LivenessState::Suspended { lease: 1 });
    drain(&mut hub);
    assert_eq!(hub.attach("/h/c"), Ok(MemberId(2)));
    assert_eq!(
        drain(&mut hub),
        vec![
            tell(2, SessionInput::Up { lease: 1 }),
            tell(2, SessionInput::Trusted { lease: 1, until }),
            tell(2, SessionInput::Suspended { lease: 1 }),
        ]
    );
    // Trust of an earlier lease is not replayed for the next one.
    state(&mut hub, LivenessState::Lost { lease: 1 });
    state(&mut hub, LivenessState::Registered { lease: 2 });
    drain(&mut hub);
    assert_eq!(hub.attach("/h/d"), Ok(MemberId(3)));
    assert_eq!(
        drain(&mut hub),
        vec![tell(3, SessionInput::Up { lease: 2 })]
    );
    // A refused session replays its refusal.
    let error = RpcError::PermissionDenied("no".into());
    state(
        &mut hub,
        LivenessState::Refused {
            error: error.clone(),
        },
    );
    drain(&mut hub);
    assert_eq!(hub.attach("/h/e"), Ok(MemberId(4)));
    assert_eq!(drain(&mut hub), vec![tell(4, SessionInput::Refused(error))]);
}

/// Invariants 1, 2: a `Replace` of the current lease ends every belief on
/// it, marking it dead, before the keepalive is asked to revoke it; facts
/// about it still on their way are not told, its `Lost` is.
#[test]
fn a_replace_ends_beliefs_before_the_revoke_and_buries_the_lease() {
    let t0 = Instant::now();
    let mut hub = two_on_lease_1(t0 + Duration::from_secs(9));
    hub.request(SessionRequest::Replace(1));
    assert_eq!(
        drain(&mut hub),
        vec![
            end(0, Some(1), false),
            end(1, Some(1), false),
            HubCommand::Keepalive(KeepaliveInput::Replace { lease: 1 }),
        ]
    );
    assert_eq!(hub.lease(), None, "a dead lease is never current");
    // A renewal the keepalive answered before it took the replace.
    hub.keepalive(KeepaliveNotice::Trusted {
        lease: 1,
        until: t0 + Duration::from_secs(12),
    });
    state(&mut hub, LivenessState::Suspended { lease: 1 });
    assert_eq!(
        drain(&mut hub),
        vec![HubCommand::State(LivenessState::Suspended { lease: 1 })],
        "nothing founding belief on lease 1 is told"
    );
    assert_eq!(hub.attach("/h/c"), Ok(MemberId(2)));
    assert_eq!(drain(&mut hub), vec![], "nor replayed");
    state(&mut hub, LivenessState::Lost { lease: 1 });
    assert_eq!(
        drain(&mut hub),
        vec![
            end(0, Some(1), false),
            end(1, Some(1), false),
            end(2, Some(1), false),
            tell(0, SessionInput::Lost { lease: 1 }),
            tell(1, SessionInput::Lost { lease: 1 }),
            tell(2, SessionInput::Lost { lease: 1 }),
            HubCommand::State(LivenessState::Lost { lease: 1 }),
        ]
    );
}

/// Invariant 4: a `Replace` of a lease that is not the current one (given
/// up already, or an older one) queues nothing; `Gone` goes as it is.
#[test]
fn a_stale_replace_changes_nothing() {
    let t0 = Instant::now();
    let mut hub = two_on_lease_1(t0 + Duration::from_secs(9));
    hub.request(SessionRequest::Replace(1));
    drain(&mut hub);
    hub.request(SessionRequest::Replace(1));
    assert_eq!(drain(&mut hub), vec![], "given up already");
    state(&mut hub, LivenessState::Lost { lease: 1 });
    state(&mut hub, LivenessState::Registered { lease: 2 });
    drain(&mut hub);
    hub.request(SessionRequest::Replace(1));
    assert_eq!(drain(&mut hub), vec![], "lease 2 is left alone");
    assert_eq!(hub.lease(), Some(2));
    hub.request(SessionRequest::Gone(1));
    assert_eq!(
        drain(&mut hub),
        vec![HubCommand::Keepalive(KeepaliveInput::LeaseGone {
            lease: 1
        })]
    );
}

/// Invariant 5: a close ends every belief for good, then tells `Closed`;
/// nobody joins after; closing again queues nothing; the keepalive's
/// `Stopped` ends (again) and tells `Closed`.
#[test]
fn a_close_ends_beliefs_for_good_then_tells_closed() {
    let t0 = Instant::now();
    let mut hub = two_on_lease_1(t0 + Duration::from_secs(9));
    hub.close();
    assert_eq!(
        drain(&mut hub),
        vec![
            end(0, Some(1), true),
            end(1, Some(1), true),
            tell(0, SessionInput::Closed),
            tell(1, SessionInput::Closed),
        ]
    );
    assert_eq!(hub.attach("/h/c"), Err(AttachError::Closed));
    hub.close();
    assert_eq!(drain(&mut hub), vec![]);
    assert_eq!(hub.detach(), Err(DetachError::Closed));
    state(&mut hub, LivenessState::Stopped { revoked: true });
    assert_eq!(
        drain(&mut hub),
        vec![
            end(0, None, true),
            end(1, None, true),
            tell(0, SessionInput::Closed),
            tell(1, SessionInput::Closed),
            HubCommand::State(LivenessState::Stopped { revoked: true }),
        ]
    );
}

/// Invariant 5: a detach needs a lease (nothing changes without one),
/// ends every belief on it for good and returns the members in order; the
/// keepalive's hand-over point is passed on.
#[test]
fn a_detach_ends_beliefs_for_good_and_names_the_members() {
    let mut hub = SessionHub::new();
    hub.attach("/e/a/").unwrap();
    assert_eq!(hub.detach(), Err(DetachError::NoLease));
    assert!(!hub.is_closed());
    assert_eq!(drain(&mut hub), vec![]);
    hub.attach("/s/b/").unwrap();
    state(&mut hub, LivenessState::Registered { lease: 7 });
    drain(&mut hub);
    assert_eq!(hub.detach(), Ok(vec![MemberId(0), MemberId(1)]));
    assert_eq!(
        drain(&mut hub),
        vec![end(0, Some(7), true), end(1, Some(7), true)]
    );
    assert_eq!(hub.attach("/h/c"), Err(AttachError::Closed));
    let point = ResumePoint { lease: 7 };
    hub.keepalive(KeepaliveNotice::Detached(point));
    assert_eq!(drain(&mut hub), vec![HubCommand::Detached(point)]);
    // A refused session says so.
    let mut hub = SessionHub::new();
    let error = RpcError::PermissionDenied("no".into());
    state(
        &mut hub,
        LivenessState::Refused {
            error: error.clone(),
        },
    );
    assert_eq!(hub.detach(), Err(DetachError::Refused(error)));
}

/// Invariant 5: one member per key prefix; a member that left hears
/// nothing more, not even what was queued for it, and frees its prefix.
#[test]
fn one_member_per_prefix_and_a_member_that_left_hears_nothing() {
    let mut hub = SessionHub::new();
    hub.attach("/e/a/").unwrap();
    assert_eq!(hub.attach("/e/a/"), Err(AttachError::KeyInUse));
    hub.attach("/s/b/").unwrap();
    state(&mut hub, LivenessState::Registered { lease: 3 });
    hub.leave(MemberId(0));
    assert_eq!(
        drain(&mut hub),
        vec![
            tell(1, SessionInput::Up { lease: 3 }),
            HubCommand::State(LivenessState::Registered { lease: 3 }),
        ]
    );
    assert_eq!(hub.attach("/e/a/"), Ok(MemberId(2)), "ids are not reused");
}

/// `SessionBelief` invariants 1, 2: a win on a lease the session ended is
/// not admitted, whatever arrives later; a newer lease is; after an end
/// for good nothing is.
#[test]
fn a_belief_admits_nothing_on_a_dead_lease() {
    let t0 = Instant::now();
    let mut belief = SessionBelief::new();
    assert!(belief.admits(1) && belief.admits_current());
    belief.trusted(1, t0 + Duration::from_secs(9));
    assert_eq!(belief.until(), Some(t0 + Duration::from_secs(9)));
    belief.end(Some(1), false);
    assert!(!belief.admits(1));
    assert!(!belief.admits_current(), "the last lease told is dead");
    assert_eq!(belief.until(), None);
    belief.trusted(1, t0 + Duration::from_secs(12));
    assert_eq!(belief.until(), None, "a late renewal brings nothing back");
    assert!(belief.admits(2));
    belief.trusted(2, t0 + Duration::from_secs(20));
    assert!(belief.admits_current());
    assert_eq!(belief.until(), Some(t0 + Duration::from_secs(20)));
    belief.end(None, true);
    assert!(!belief.admits(3) && !belief.admits_current());
    belief.trusted(3, t0 + Duration::from_secs(30));
    assert_eq!(belief.until(), None, "for good");
}

/// `SessionBelief` invariants 3, 4: belief by the caller's clock, to the
/// earlier of the session's deadline and the primitive's own; a loss ends
/// it at once.
#[test]
fn a_belief_lasts_to_the_earliest_deadline_by_the_callers_clock() {
    let t0 = Instant::now();
    let mut belief = SessionBelief::new();
    assert_eq!(belief.left(t0, None), None, "nothing trusted yet");
    belief.trusted(1, t0 + Duration::from_secs(9));
    assert_eq!(belief.left(t0, None), Some(Duration::from_secs(9)));
    assert_eq!(
        belief.left(t0, Some(t0 + Duration::from_secs(2))),
        Some(Duration::from_secs(2)),
        "a release deadline before the session's"
    );
    assert_eq!(
        belief.left(t0, Some(t0 + Duration::from_secs(20))),
        Some(Duration::from_secs(9))
    );
    assert_eq!(belief.left(t0 + Duration::from_secs(9), None), None);
    belief.lost();
    assert_eq!(belief.left(t0, None), None);
}
