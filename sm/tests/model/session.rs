//! The shared-session world (`fleetcoord_test_support::model::session`,
//! whose docs list the properties): an election, a shard member and a
//! host registration on one session lease, fanned out by the production
//! session hub, with the lease lost, revoked early by etcd and granted
//! anew, and requests landing late.
//!
//! Each passing world pins its state count within ±20 % and requires its
//! vacuity marks. Each `teeth_*` test bends the hub and must find the
//! violation it names.

use fleetcoord_test_support::model::session::{Budget, Mutant, SessionSetup, SessionWorld};
use fleetcoord_test_support::model::{check_fails, check_pinned, Report};
use std::time::Duration;

fn world(horizon_ms: u64, budget: Budget) -> SessionSetup {
    let mut setup = SessionSetup::new();
    setup.horizon = Duration::from_millis(horizon_ms);
    setup.budget = budget;
    setup
}

/// Explores `setup`: see [`check_pinned`].
fn passes(name: &str, setup: SessionSetup, pinned: usize, marks: &[&str]) -> Report {
    check_pinned(name, SessionWorld::new(setup), pinned, marks)
}

fn revoke(late: u32) -> Budget {
    Budget {
        revoke: 1,
        late,
        ..Budget::default()
    }
}

// ----- the quick set (make test) ------------------------------------------

/// Without faults the three settle on the one lease, renewed.
#[test]
fn three_primitives_settle_on_one_lease() {
    passes(
        "election + shard + host, no faults",
        world(1_000, Budget::default()),
        PIN_QUIET,
        &["elected", "acquired", "registered"],
    );
}

/// etcd revokes the lease early at any point, one machine a step behind
/// its session: the first "lease not found" (or renewal) ends every
/// belief before the new lease is told, a win on the old lease still on
/// its way is handed out over, and all three are back on the new lease
/// within the bound.
#[test]
fn a_lease_revoked_early() {
    passes(
        "revoked early, 1 late step",
        world(1_000, revoke(1)),
        PIN_REVOKED,
        &[
            "elected",
            "acquired",
            "registered",
            "revoked early",
            "lease not found",
            "granted anew",
            "late win not believed",
            "reply before a fact",
            "liveness checked",
        ],
    );
}

// ----- teeth ----------------------------------------------------------------

/// The hub's `EndBeliefs` are dropped: beliefs on a revoked lease last
/// until each machine hears the loss, so the next lease is told while one
/// is still believed.
#[test]
fn teeth_without_ending_beliefs_first_is_caught() {
    let mut setup = world(1_000, revoke(1));
    setup.mutant = Mutant::NoEndFirst;
    check_fails("no end first", SessionWorld::new(setup), "believed");
}

/// The hub's `EndBeliefs` carry no lease: a win on the revoked lease that
/// was on its way when the beliefs ended is believed.
#[test]
fn teeth_without_the_dead_lease_mark_is_caught() {
    let mut setup = world(1_000, revoke(1));
    setup.mutant = Mutant::NoDeadMark;
    check_fails("no dead mark", SessionWorld::new(setup), "believed");
}

// ----- the long set (make model-check) --------------------------------------

/// Revoked early with machines two steps behind their session and a
/// given-up request landing late (on the dead lease, or on the new one).
#[test]
#[ignore = "long: make model-check"]
fn long_revoked_early_with_late_facts_and_a_late_landing() {
    passes(
        "revoked early, 2 late steps, 1 late landing",
        world(
            1_500,
            Budget {
                land: 1,
                ..revoke(2)
            },
        ),
        PIN_LONG_REVOKED,
        &[
            "revoked early",
            "lease not found",
            "granted anew",
            "late win not believed",
            "reply before a fact",
            "liveness checked",
        ],
    );
}

/// The session cut off at any point: every belief ends at its local
/// deadline, before etcd expires the lease, and the lease is granted anew
/// (machines two steps behind their session).
#[test]
#[ignore = "long: make model-check"]
fn long_cut_off() {
    passes(
        "cut, 2 late steps",
        world(
            2_500,
            Budget {
                cut: 1,
                late: 2,
                ..Budget::default()
            },
        ),
        PIN_LONG_CUT,
        &["session cut", "granted anew", "liveness checked"],
    );
}

const PIN_QUIET: usize = 9;
// The two revoked-early worlds were 6,923 and 21,380 states while a shard
// member's failed guard held it back a backoff delay; since it reads the key
// and goes on at once (shard rules 3, 9, 10), more schedules get as far as
// acquiring within the horizon (acquired 111 -> 789 in the first). The same
// counts come back with the failure-branch read ignored.
const PIN_REVOKED: usize = 13_583;
const PIN_LONG_REVOKED: usize = 35_074;
const PIN_LONG_CUT: usize = 7_168;
