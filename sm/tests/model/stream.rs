//! The stream world (`fleetcoord_test_support::model::stream`, whose docs
//! list the properties): real `Append` and `Reader` machines, every
//! schedule.
//!
//! Each passing world pins its state count within ±20 % (a collapse means
//! the world stopped exploring, a blow-up that a change multiplied the
//! schedules) and requires its vacuity marks. Each `teeth_*` test bends
//! the world or the check and must find the violation it names.

use fleetcoord_test_support::model::stream::{Budget, StreamSetup, StreamWorld};
use fleetcoord_test_support::model::{check_fails, check_pinned, Report};

/// `appenders` appending `appends` entries each, faults `budget`.
fn world(appenders: usize, appends: u32, budget: Budget) -> StreamSetup {
    let mut setup = StreamSetup::new(appenders, appends);
    setup.budget = Budget { appends, ..budget };
    setup
}

/// Explores `setup`: see [`check_pinned`].
fn passes(name: &str, setup: StreamSetup, pinned: usize, marks: &[&str]) -> Report {
    check_pinned(name, StreamWorld::new(setup), pinned, marks)
}

/// Explores `setup`, which must fail: see [`check_fails`].
fn fails(name: &str, setup: StreamSetup, expected: &str) {
    check_fails(name, StreamWorld::new(setup), expected)
}

// ----- the quick set (make test) ------------------------------------------

/// The duplicate a retry could make: a lost request is resent on the same
/// guard, and the lost copy may land before or after the resend.
#[test]
fn two_appenders_a_lost_message_and_a_late_landing() {
    passes(
        "2 appenders of 1, 1 lost, 1 late landing",
        world(
            2,
            1,
            Budget {
                lose: 1,
                land: 1,
                ..Budget::default()
            },
        ),
        7_402,
        &[
            "acknowledged",
            "race lost",
            "settled by a resend",
            "landed late",
            "landed late and applied",
            "read",
            "liveness checked",
        ],
    );
}

#[test]
fn one_appender_with_two_lost_messages() {
    passes(
        "1 appender of 2, 2 lost",
        world(
            1,
            2,
            Budget {
                lose: 2,
                ..Budget::default()
            },
        ),
        2_906,
        &[
            "acknowledged",
            "settled by a resend",
            "read",
            "liveness checked",
        ],
    );
}

/// One attempt per append: a lost race fails it `Contended`; users ask
/// while their appender's transaction is in flight, so appends go
/// together.
#[test]
fn two_appenders_of_two_racing_for_the_head() {
    let mut setup = world(2, 2, Budget::default());
    setup.max_attempts = 1;
    setup.user_races = true;
    passes(
        "2 appenders of 2, racing users, 1 attempt each",
        setup,
        10_576,
        &["acknowledged", "grouped", "race lost", "contended", "read"],
    );
}

#[test]
fn a_compaction_and_a_paused_consumer_under_the_reader() {
    passes(
        "2 appenders of 1, 1 compaction, 1 pause",
        world(
            2,
            1,
            Budget {
                compact: 1,
                pause: 1,
                ..Budget::default()
            },
        ),
        8_604,
        &["acknowledged", "watch compacted", "paused", "read"],
    );
}

/// A stopped appender's transaction may still land: its answer
/// (`Indeterminate`) names the only entry it can become.
#[test]
fn an_appender_stopped_in_flight() {
    passes(
        "2 appenders of 1, 1 lost, 1 stop, 1 late landing",
        world(
            2,
            1,
            Budget {
                lose: 1,
                stop: 1,
                land: 1,
                ..Budget::default()
            },
        ),
        21_352,
        &[
            "acknowledged",
            "stopped",
            "indeterminate",
            "landed late and applied",
        ],
    );
}

// ----- teeth ----------------------------------------------------------------

/// The append transaction run without its head guard: a lost copy landing
/// after its resend writes the entry again, at a later revision than the
/// one acknowledged (or over another appender's entry).
#[test]
fn teeth_appends_without_their_guard_are_caught() {
    let mut setup = world(
        2,
        1,
        Budget {
            lose: 1,
            land: 1,
            ..Budget::default()
        },
    );
    setup.strip_put_guards = true;
    fails("appends unguarded", setup, "but etcd has that entry as");
}

/// Watches that never deliver appended entries: the reader, once live,
/// never reads them.
#[test]
fn teeth_withheld_watch_events_are_a_liveness_failure() {
    let mut setup = world(1, 1, Budget::default());
    setup.withhold_appends = true;
    fails("appends withheld from watches", setup, "liveness:");
}

// ----- the long set (make model-check) --------------------------------------

#[test]
#[ignore = "long: make model-check"]
fn long_two_appenders_of_two_racing_users_a_loss_and_a_landing() {
    let mut setup = world(
        2,
        2,
        Budget {
            lose: 1,
            land: 1,
            ..Budget::default()
        },
    );
    setup.user_races = true;
    passes(
        "2 appenders of 2, racing users, 1 lost, 1 late landing",
        setup,
        199_668,
        &[
            "acknowledged",
            "grouped",
            "race lost",
            "settled by a resend",
            "landed late and applied",
            "read",
            "liveness checked",
        ],
    );
}
