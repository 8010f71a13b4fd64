//! The watch world (`fleetcoord_test_support::model::watch`, whose docs
//! list the properties): a real `Watch` machine and a writer, every
//! schedule.
//!
//! Each passing world pins its state count within ±20 % (a collapse means
//! the world stopped exploring, a blow-up that a change multiplied the
//! schedules) and requires its vacuity marks. Each `teeth_*` test bends
//! the world and must find the violation it names.

use fleetcoord_test_support::model::watch::{Budget, WatchSetup, WatchWorld};
use fleetcoord_test_support::model::{check_fails, check_pinned, Report};

/// The writer on `keys` keys, `initial` of them there before the watch,
/// pages of one key, writes and faults `budget`.
fn world(keys: usize, initial: usize, budget: Budget) -> WatchSetup {
    let mut setup = WatchSetup::new(keys, initial);
    setup.budget = budget;
    setup
}

/// Explores `setup`: see [`check_pinned`].
fn passes(name: &str, setup: WatchSetup, pinned: usize, marks: &[&str]) -> Report {
    check_pinned(name, WatchWorld::new(setup), pinned, marks)
}

/// Explores `setup`, which must fail: see [`check_fails`].
fn fails(name: &str, setup: WatchSetup, expected: &str) {
    check_fails(name, WatchWorld::new(setup), expected)
}

// ----- the quick set (make test) ------------------------------------------

/// Writes between the pages of the first snapshot, between the snapshot
/// and its watch, and while the watch runs; a neighbour just past the
/// prefix is never reported.
#[test]
fn writes_at_every_point_of_snapshot_and_watch() {
    passes(
        "3 keys, 2 there, 3 writes",
        world(
            3,
            2,
            Budget {
                writes: 3,
                ..Budget::default()
            },
        ),
        6_279,
        &["up", "updated", "down", "synced", "quiet checked"],
    );
    let mut setup = world(
        2,
        1,
        Budget {
            writes: 3,
            ..Budget::default()
        },
    );
    setup.neighbour = true;
    passes(
        "2 keys and a neighbour, 1 there, 3 writes",
        setup,
        3_106,
        &["up", "updated", "down", "quiet checked"],
    );
    let mut setup = world(
        3,
        3,
        Budget {
            writes: 3,
            compact: 1,
            ..Budget::default()
        },
    );
    setup.page_size = 2;
    passes(
        "3 keys, all there, pages of 2, 3 writes, 1 compaction",
        setup,
        41_558,
        &["up", "updated", "down", "page compacted", "quiet checked"],
    );
}

/// A lost page read, reply or watch stream: a retry after a backoff, and a
/// resync that tells only the difference.
#[test]
fn a_lost_request_or_stream_resyncs() {
    passes(
        "2 keys, 2 there, 3 writes, 1 lost",
        world(
            2,
            2,
            Budget {
                writes: 3,
                lose: 1,
                ..Budget::default()
            },
        ),
        12_676,
        &["lost", "resynced", "down", "liveness checked"],
    );
}

#[test]
fn a_compaction_resyncs() {
    passes(
        "2 keys, 2 there, 3 writes, 1 compaction",
        world(
            2,
            2,
            Budget {
                writes: 3,
                compact: 1,
                ..Budget::default()
            },
        ),
        21_551,
        &[
            "watch compacted",
            "page compacted",
            "resynced",
            "quiet checked",
        ],
    );
}

#[test]
fn a_stalled_consumer_catches_up() {
    passes(
        "2 keys, 1 there, 3 writes, 1 stall",
        world(
            2,
            1,
            Budget {
                writes: 3,
                stall: 1,
                ..Budget::default()
            },
        ),
        6_486,
        &["stalled", "resynced", "liveness checked"],
    );
}

// ----- teeth ----------------------------------------------------------------

/// Watches skip the revision of the writer's first write (a put of a key
/// already there): the view keeps the old state while etcd moved on.
#[test]
fn teeth_a_revision_watches_skip_is_caught() {
    let mut setup = world(
        2,
        1,
        Budget {
            writes: 2,
            ..Budget::default()
        },
    );
    setup.hide_write = Some(1);
    fails(
        "first write hidden from watches",
        setup,
        "the view differs from etcd",
    );
}

/// A consumer that stalls and never drains: nothing converges.
#[test]
fn teeth_a_consumer_that_never_drains_is_a_liveness_failure() {
    let mut setup = world(
        2,
        1,
        Budget {
            writes: 1,
            stall: 1,
            ..Budget::default()
        },
    );
    setup.consumer_never_ready = true;
    fails("consumer never ready", setup, "liveness:");
}

// ----- the long set (make model-check) --------------------------------------

#[test]
#[ignore = "long: make model-check"]
fn long_three_keys_with_a_loss_and_a_compaction() {
    passes(
        "3 keys, 2 there, 3 writes, 1 lost, 1 compaction",
        world(
            3,
            2,
            Budget {
                writes: 3,
                lose: 1,
                compact: 1,
                ..Budget::default()
            },
        ),
        333_555,
        &["lost", "watch compacted", "page compacted", "resynced"],
    );
}

#[test]
#[ignore = "long: make model-check"]
fn long_two_keys_with_every_fault() {
    passes(
        "2 keys, 2 there, 4 writes, 1 lost, 1 compaction, 1 stall",
        world(
            2,
            2,
            Budget {
                writes: 4,
                lose: 1,
                compact: 1,
                stall: 1,
            },
        ),
        3_872_427,
        &[
            "lost",
            "watch compacted",
            "stalled",
            "resynced",
            "liveness checked",
        ],
    );
}
