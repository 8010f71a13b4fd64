//! The renewals world (`fleetcoord_test_support::model::renewals`, whose
//! docs list the properties): the real `Renewals` machine, its one stream
//! played action by action, every schedule.
//!
//! Each passing world pins its state count within ±20 % and requires its
//! vacuity marks. Each `teeth_*` test bends the world and must find the
//! violation it names.

use fleetcoord_test_support::model::renewals::{Budget, RenewalsSetup, RenewalsWorld};
use fleetcoord_test_support::model::{check_fails, check_pinned, Report};

/// States of [`stale_replies_after_a_revoke_and_reopens_spread_over_a_window`].
const PINNED_STALE: usize = 20_120;

fn world(leases: usize, budget: Budget) -> RenewalsSetup {
    let mut setup = RenewalsSetup::new(leases);
    setup.budget = budget;
    setup
}

/// Explores `setup`: see [`check_pinned`].
fn passes(name: &str, setup: RenewalsSetup, pinned: usize, marks: &[&str]) -> Report {
    check_pinned(name, RenewalsWorld::new(setup), pinned, marks)
}

// ----- the quick set (make test) ------------------------------------------

/// Renewals of two live leases and a missing one, a revoke, silence and
/// hung or refused openings: every renewal answered once by its deadline
/// with etcd's TTL, the missing lease's with TTL 0, a silent stream reset.
#[test]
fn renewals_through_silence_and_refused_openings() {
    passes(
        "2 leases + 1 missing, 4 renewals, 1 revoke, 1 silence, 1 open fault",
        world(
            2,
            Budget {
                renew: 4,
                revoke: 1,
                silence: 1,
                open_fault: 1,
                ..Budget::default()
            },
        ),
        18_715,
        &[
            "TTL answered",
            "TTL 0 at opening",
            "forgotten unwritten",
            "silent stream reset",
            "opening given up",
            "liveness checked",
        ],
    );
}

/// Streams that break every way, renewals held back by a full stream, a
/// stop at any point.
#[test]
fn broken_streams_full_streams_and_a_stop() {
    passes(
        "1 lease + 1 missing, 4 renewals, 1 break, 2 delays, 1 stop",
        world(
            1,
            Budget {
                renew: 4,
                breaks: 1,
                delay: 2,
                stop: 1,
                ..Budget::default()
            },
        ),
        3_072,
        &[
            "TTL answered",
            "stream broken",
            "monitor told",
            "stopped",
            "unwritten renewal late",
            "liveness checked",
        ],
    );
}

/// A lease revoked while its renewals are on the stream (their replies,
/// TTL above zero, come after the revoke), streams that break and
/// reopen after a pick from a 100 ms window: no renewal taken before the
/// revoke is answered with a TTL, and no renewal waits unsent past the
/// window of the last fault.
#[test]
fn stale_replies_after_a_revoke_and_reopens_spread_over_a_window() {
    let mut setup = world(
        2,
        Budget {
            renew: 4,
            revoke: 1,
            breaks: 1,
            open_fault: 1,
            ..Budget::default()
        },
    );
    setup.missing = false;
    setup.reopen_spread = std::time::Duration::from_millis(100);
    passes(
        "2 leases, 4 renewals, 1 revoke, 1 break, 1 open fault, reopen window 100 ms",
        setup,
        PINNED_STALE,
        &[
            "TTL answered",
            "forgotten unwritten",
            "stale reply consumed",
            "reopen waited",
            "stream broken",
            "liveness checked",
        ],
    );
}

// ----- teeth ----------------------------------------------------------------

/// The stream answers a lease's renewals newest first: the machine (which
/// relies on etcd's order) hands a renewal another write's TTL.
#[test]
fn teeth_replies_out_of_order_are_caught() {
    let mut setup = world(
        1,
        Budget {
            renew: 2,
            ..Budget::default()
        },
    );
    setup.missing = false;
    setup.reorder_replies = true;
    check_fails(
        "replies reordered",
        RenewalsWorld::new(setup),
        "but what came is",
    );
}

/// Openings never answered, also without faults: nothing is ever renewed.
#[test]
fn teeth_openings_that_always_hang_are_a_liveness_failure() {
    let mut setup = world(1, Budget::default());
    setup.missing = false;
    setup.openings_hang = true;
    check_fails("openings hang", RenewalsWorld::new(setup), "liveness:");
}

// ----- the long set (make model-check) --------------------------------------

#[test]
#[ignore = "long: make model-check"]
fn long_renewals_with_every_fault() {
    passes(
        "2 leases + 1 missing, 5 renewals, 1 revoke, 1 silence, 1 open fault, 1 break, 2 \
         delays, 1 stop",
        world(
            2,
            Budget {
                renew: 5,
                revoke: 1,
                silence: 1,
                open_fault: 1,
                breaks: 1,
                delay: 2,
                stop: 1,
            },
        ),
        589_925,
        &[
            "TTL answered",
            "TTL 0 replied",
            "TTL 0 at opening",
            "forgotten unwritten",
            "silent stream reset",
            "opening given up",
            "stream broken",
            "monitor told",
            "stopped",
            "unwritten renewal late",
            "liveness checked",
        ],
    );
}

/// A larger world with stale replies and a reopen window: a revoke whose
/// renewals are on the stream, a break, a refused opening, a delay and a
/// stop, reopens spread over 100 ms.
#[test]
#[ignore = "long: make model-check"]
fn long_stale_replies_and_spread_reopens() {
    let mut setup = world(
        2,
        Budget {
            renew: 5,
            revoke: 1,
            open_fault: 1,
            breaks: 1,
            delay: 1,
            stop: 1,
            ..Budget::default()
        },
    );
    setup.missing = false;
    setup.reopen_spread = std::time::Duration::from_millis(100);
    passes(
        "2 leases, 5 renewals, 1 revoke, 1 open fault, 1 break, 1 delay, 1 stop, reopen \
         window 100 ms",
        setup,
        289_979,
        &[
            "TTL answered",
            "forgotten unwritten",
            "stale reply consumed",
            "reopen waited",
            "stream broken",
            "stopped",
            "liveness checked",
        ],
    );
}
