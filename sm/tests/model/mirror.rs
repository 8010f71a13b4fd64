//! The mirror world (`fleetcoord_test_support::model::mirror`, whose docs
//! list the properties): the real KV-watch `Mirror`, every order of what
//! its source, its backend and its consumer can do.
//!
//! Each passing world pins its state count within ±20 % (a collapse means
//! the world stopped exploring, a blow-up that a change multiplied the
//! schedules) and requires its vacuity marks. Each `teeth_*` test bends
//! the world and must find the violation it names.

use fleetcoord_sm::mirror::Order;
use fleetcoord_test_support::model::mirror::{Budget, MirrorSetup, MirrorWorld};
use fleetcoord_test_support::model::{check_fails, check_pinned, Report};

/// A mirror of a source with `order`, `limit` live notices, events
/// `budget`.
fn world(order: Order, limit: usize, budget: Budget) -> MirrorSetup {
    let mut setup = MirrorSetup::new(order, limit);
    setup.budget = budget;
    setup
}

/// Explores `setup`: see [`check_pinned`].
fn passes(name: &str, setup: MirrorSetup, pinned: usize, marks: &[&str]) -> Report {
    check_pinned(name, MirrorWorld::new(setup), pinned, marks)
}

/// Explores `setup`, which must fail: see [`check_fails`].
fn fails(name: &str, setup: MirrorSetup, expected: &str) {
    check_fails(name, MirrorWorld::new(setup), expected)
}

// ----- the quick set (make test) ------------------------------------------

/// Changes lost: under `Contiguous` a skipped version is a gap the mirror
/// sees; under `Increasing` the backend says so. A consumer of one live
/// notice falls behind at the second.
#[test]
fn a_lost_change_under_either_order() {
    for (name, order, pinned) in [
        ("contiguous, 3 changes, 1 lost", Order::Contiguous, 22_851),
        ("increasing, 3 changes, 1 lost", Order::Increasing, 23_019),
    ] {
        passes(
            name,
            world(
                order,
                1,
                Budget {
                    changes: 3,
                    lose: 1,
                    ..Budget::default()
                },
            ),
            pinned,
            &[
                "synced",
                "applied",
                "consumer behind",
                "resync diff",
                "deleted",
            ],
        );
    }
}

#[test]
fn an_old_change_again_and_a_missed_connection() {
    passes(
        "contiguous, limit 2, 3 changes, 1 redelivered, 1 missed",
        world(
            Order::Contiguous,
            2,
            Budget {
                changes: 3,
                redeliver: 1,
                missed: 1,
                ..Budget::default()
            },
        ),
        50_750,
        &["synced", "applied", "stale ignored", "resync diff"],
    );
}

/// A snapshot in entries with a change landing between them, as a NATS
/// consumer reads one.
#[test]
fn a_snapshot_in_entries_with_a_change_between() {
    passes(
        "increasing, 2 changes, 1 split snapshot",
        world(
            Order::Increasing,
            1,
            Budget {
                changes: 2,
                resync: 1,
                split: 1,
                ..Budget::default()
            },
        ),
        17_395,
        &["synced", "applied", "snapshot in entries", "resync diff"],
    );
}

// ----- teeth ----------------------------------------------------------------

/// Under `Increasing` a hole means nothing, so only the backend can say a
/// change was lost: one that does not leaves the consumer with a value the
/// source no longer holds once the next change applies.
#[test]
fn teeth_a_loss_not_said_under_increasing_is_caught() {
    let mut setup = world(
        Order::Increasing,
        1,
        Budget {
            changes: 3,
            lose: 1,
            ..Budget::default()
        },
    );
    setup.silent_losses = true;
    fails("losses not said", setup, "the told view");
}

/// Under `Contiguous` a lost last change shows only when a later one
/// arrives: without it the consumer never converges.
#[test]
fn teeth_a_trailing_loss_needs_a_later_change() {
    let mut setup = world(
        Order::Contiguous,
        1,
        Budget {
            changes: 2,
            lose: 1,
            ..Budget::default()
        },
    );
    setup.no_heartbeat = true;
    fails("no later change", setup, "liveness:");
}

// ----- the long set (make model-check) --------------------------------------

#[test]
#[ignore = "long: make model-check"]
fn long_every_fault_together() {
    passes(
        "contiguous, 3 changes, 1 lost, 1 redelivered, 1 missed, 1 resync, 1 split",
        world(
            Order::Contiguous,
            1,
            Budget {
                changes: 3,
                lose: 1,
                redeliver: 1,
                missed: 1,
                resync: 1,
                split: 1,
            },
        ),
        3_870_076,
        &[
            "synced",
            "applied",
            "stale ignored",
            "gap",
            "consumer behind",
            "resync diff",
            "snapshot in entries",
            "deleted",
        ],
    );
}
