//! The election world (`fleetcoord_test_support::model::election`, whose
//! docs list the properties): real `Election` machines, every schedule.
//!
//! Each passing world pins its state count within ±20 % (a collapse means
//! the world stopped exploring, a blow-up that a change multiplied the
//! schedules) and requires its vacuity marks. Each `teeth_*` test bends
//! the world or the check and must find the violation it names.

use fleetcoord_sm::RpcId;
use fleetcoord_test_support::model::election::{
    Budget, ElectionAction, ElectionSetup, ElectionWorld,
};
use fleetcoord_test_support::model::{
    check_fails, check_pinned, explore, replay, Limits, Report, WireAction,
};
use std::time::Duration;

/// A world of `candidates` for `permits`, a 3 s horizon, faults `budget`.
fn world(candidates: usize, permits: u32, budget: Budget) -> ElectionSetup {
    let mut setup = ElectionSetup::new(candidates, permits);
    setup.horizon = Duration::from_secs(3);
    setup.budget = budget;
    setup
}

/// Explores `setup`: see [`check_pinned`].
fn passes(name: &str, setup: ElectionSetup, pinned: usize, marks: &[&str]) -> Report {
    check_pinned(name, ElectionWorld::new(setup), pinned, marks)
}

/// Explores `setup`, which must fail: see [`check_fails`].
fn fails(name: &str, setup: ElectionSetup, expected: &str) {
    check_fails(name, ElectionWorld::new(setup), expected)
}

/// Users resign and campaign again; a request held up past its attempt
/// timeout (one delay) is resent, and the given-up copy may land late.
fn late(horizon_ms: u64) -> ElectionSetup {
    let mut setup = world(
        2,
        1,
        Budget {
            user: 2,
            land: 1,
            delay: 1,
            ..Budget::default()
        },
    );
    setup.horizon = Duration::from_millis(horizon_ms);
    setup
}

// ----- the quick set (make test) ------------------------------------------

#[test]
fn three_candidates_with_a_lost_message() {
    passes(
        "3 candidates, 1 lost",
        world(
            3,
            1,
            Budget {
                lose: 1,
                ..Budget::default()
            },
        ),
        18_122,
        &["elected"],
    );
}

#[test]
fn a_given_up_request_landing_late_after_resigns_and_campaigns() {
    passes(
        "2 candidates, 2 user requests, 1 delay, 1 late landing",
        late(1_500),
        150_110,
        &["elected", "resigned", "landed late"],
    );
}

#[test]
fn a_restarted_candidate_and_a_lost_message() {
    passes(
        "2 candidates, 1 restart, 1 lost",
        world(
            2,
            1,
            Budget {
                restart: 1,
                lose: 1,
                ..Budget::default()
            },
        ),
        50_252,
        &["elected", "restarted", "lease expired", "liveness checked"],
    );
}

#[test]
fn a_semaphore_of_two_permits() {
    passes(
        "3 candidates for 2 permits, 1 user request",
        world(
            3,
            2,
            Budget {
                user: 1,
                ..Budget::default()
            },
        ),
        11_342,
        &["elected", "resigned"],
    );
    passes(
        "2 candidates for 2 permits, 1 user request, 1 lost",
        world(
            2,
            2,
            Budget {
                user: 1,
                lose: 1,
                ..Budget::default()
            },
        ),
        9_820,
        &["elected", "liveness checked"],
    );
}

#[test]
fn a_compaction_under_waiting_candidates() {
    passes(
        "2 candidates, 1 compaction, 1 user request",
        world(
            2,
            1,
            Budget {
                compact: 1,
                user: 1,
                ..Budget::default()
            },
        ),
        4_595,
        &["elected", "watch compacted"],
    );
}

/// A leader observer beside the candidates: once quiet, it reports the
/// leader etcd has (part of every liveness check of the world).
#[test]
fn an_observer_follows_the_leader() {
    let mut setup = world(
        2,
        1,
        Budget {
            user: 1,
            lose: 1,
            ..Budget::default()
        },
    );
    setup.observers = 1;
    passes(
        "2 candidates, 1 observer, 1 user request, 1 lost",
        setup,
        52_950,
        &["elected", "resigned", "liveness checked"],
    );
}

/// etcd revoking a renewed lease early (its own bug when a paused raft
/// leader resumes, see docs/etcd-notes.md) is the one cause of two
/// believers fleetcoord cannot prevent: the world shows the overlap
/// happening ("overlap after early revocation" > 0) while rule 6 — belief
/// ends at the first evidence, a watched delete or a refused fenced write
/// — holds in every schedule.
#[test]
fn an_early_revocation_is_detected_not_prevented() {
    let mut setup = world(
        3,
        1,
        Budget {
            revoke_early: 1,
            ..Budget::default()
        },
    );
    setup.fence_refusals = true;
    passes(
        "3 candidates, 1 early revocation, refused fences",
        setup,
        14_473,
        &[
            "elected",
            "revoked early",
            "overlap after early revocation",
            "fence refused",
        ],
    );
}

// ----- replays of counterexamples ------------------------------------------

/// Found by this model check, in the election as it shipped: candidate 0's
/// create is held up past its attempt timeout and sent again; the copy
/// wins, the user resigns, and then the first copy lands — making the key
/// again on a session that lives on, campaign-less, at the head of the
/// queue: candidate 1 waited for as long as candidate 0's process lived.
/// Fixed by giving up a lease with a create in doubt once nothing runs on
/// it (`Protocol::settle_doubt` in sm/src/election/protocol.rs).
#[test]
fn a_create_landing_after_a_resign_does_not_block_the_queue() {
    use ElectionAction::*;
    use WireAction::*;
    let trace = [
        Wire(0, Run(RpcId(0))),                 // +0 ms
        Wire(0, Deliver(RpcId(0))),             // +0 ms
        Wire(1, Run(RpcId(0))),                 // +0 ms
        Wire(1, Deliver(RpcId(0))),             // +0 ms
        Delay,                                  // +400 ms
        Wire(0, Run(RpcId(1099511627777))),     // +400 ms
        Wire(0, Deliver(RpcId(1099511627777))), // +400 ms
        Wire(0, Run(RpcId(1099511627778))),     // +400 ms
        Wire(0, Deliver(RpcId(1099511627778))), // +400 ms
        Resign(0),                              // +400 ms
        Wire(0, Run(RpcId(1099511627779))),     // +400 ms
        Wire(0, Deliver(RpcId(1099511627779))), // +400 ms
        Wire(0, Land(RpcId(1099511627776))),    // +400 ms
        Wire(1, Run(RpcId(1099511627777))),     // +400 ms
        Wire(1, Deliver(RpcId(1099511627777))), // +400 ms
        Wire(1, Run(RpcId(1099511627778))),     // +400 ms
        Wire(1, Deliver(RpcId(1099511627778))), // +400 ms
    ];
    if let Err((at, message)) = replay(ElectionWorld::new(late(1_500)), &trace) {
        panic!("action {at}: {message}");
    }
}

// ----- teeth ----------------------------------------------------------------

/// Guarded deletes run unguarded: a withdraw's delete held up and landing
/// late removes the key of the candidate's next campaign while it leads.
#[test]
fn teeth_deletes_without_their_guard_are_caught() {
    let mut setup = late(1_500);
    setup.strip_delete_guards = true;
    fails("deletes unguarded", setup, "but etcd has its key as None");
}

#[test]
fn teeth_one_permit_too_many_is_caught() {
    let mut setup = world(3, 2, Budget::default());
    setup.allowed_holders = 1;
    fails("2 permits checked as 1", setup, "2 candidates hold at once");
}

#[test]
fn teeth_a_lease_trusted_to_its_expiry_is_caught() {
    let mut setup = world(2, 1, Budget::default());
    setup.safety_margin = Duration::ZERO;
    fails("safety margin 0", setup, "margin 100ms required");
}

#[test]
fn teeth_withheld_expiry_deletes_are_a_liveness_failure() {
    let mut setup = world(
        2,
        1,
        Budget {
            restart: 1,
            ..Budget::default()
        },
    );
    setup.withhold_expiry_deletes = true;
    fails("expiry deletes withheld", setup, "liveness:");
}

// ----- the long set (make model-check) --------------------------------------

/// Explores a long world; with `MODEL_PROBE` set, only prints its size
/// (capped), for choosing a horizon and pinning.
fn long(name: &str, setup: ElectionSetup, horizon_ms: u64, pinned: usize, marks: &[&str]) {
    let setup = ElectionSetup {
        horizon: Duration::from_millis(horizon_ms),
        ..setup
    };
    if std::env::var_os("MODEL_PROBE").is_some() {
        match explore(
            ElectionWorld::new(setup),
            &Limits {
                max_states: 1_000_000,
            },
        ) {
            Ok(report) => println!("{name}: {report}"),
            Err(counterexample) => println!("{name}: FAILED {}", counterexample.message),
        }
        return;
    }
    passes(name, setup, pinned, marks);
}

#[test]
#[ignore = "long: make model-check"]
fn long_three_candidates_with_a_restart_and_a_lost_message() {
    long(
        "3 candidates, 1 restart, 1 lost",
        world(
            3,
            1,
            Budget {
                restart: 1,
                lose: 1,
                ..Budget::default()
            },
        ),
        2_000,
        703_867,
        &["elected", "restarted", "liveness checked"],
    );
}

#[test]
#[ignore = "long: make model-check"]
fn long_three_candidates_with_a_delay_and_a_lost_message() {
    long(
        "3 candidates, 1 delay, 1 lost",
        world(
            3,
            1,
            Budget {
                delay: 1,
                lose: 1,
                ..Budget::default()
            },
        ),
        2_000,
        926_530,
        &["elected"],
    );
}

/// Permits 2 with a restart (its lease holds a permit until it expires).
/// A restart and a delay together exceeded 1.2 M states even at a 600 ms
/// horizon; the delay is explored with three candidates and one permit.
#[test]
#[ignore = "long: make model-check"]
fn long_two_permits_with_a_restart() {
    long(
        "3 candidates for 2 permits, 1 restart",
        world(
            3,
            2,
            Budget {
                restart: 1,
                ..Budget::default()
            },
        ),
        1_500,
        // 166,077 until the queue reads became keys-only (issue 47): that
        // change alone took it to 77,077 (measured on the commits before
        // and after it). The likely reason is that a semaphore's rank read
        // no longer carries the waiters' values, so states that differed
        // only in those are one now. Elections, restarts and liveness
        // checks are still reached.
        77_077,
        // The old lease expires beyond the horizon, in the liveness checks.
        &["elected", "restarted", "liveness checked"],
    );
}

#[test]
#[ignore = "long: make model-check"]
fn long_late_landings_with_racing_users() {
    let setup = ElectionSetup {
        user_races: true,
        budget: Budget {
            user: 2,
            land: 1,
            lose: 1,
            ..Budget::default()
        },
        ..late(1_000)
    };
    long(
        "2 candidates, 2 racing user requests, 1 lost, 1 late landing",
        setup,
        1_000,
        280_528,
        &["elected", "resigned", "landed late"],
    );
}

/// Issue "two leaders acting at once", its first cause modelled: a paused
/// etcd member holds requests and answers late (a delay with requests in
/// flight, and given-up copies landing afterwards). Prevented: no schedule
/// makes two holders. Its second cause, etcd revoking a renewed lease
/// early, is `an_early_revocation_is_detected_not_prevented`.
#[test]
#[ignore = "long: make model-check"]
fn long_a_paused_member_answering_late() {
    long(
        "3 candidates, 1 delay, 1 late landing",
        world(
            3,
            1,
            Budget {
                delay: 1,
                land: 1,
                ..Budget::default()
            },
        ),
        2_000,
        215_006,
        &["elected", "landed late"],
    );
}

#[test]
#[ignore = "long: make model-check"]
fn long_compaction_with_three_candidates() {
    long(
        "3 candidates, 1 compaction, 1 user request",
        world(
            3,
            1,
            Budget {
                compact: 1,
                user: 1,
                ..Budget::default()
            },
        ),
        3_000,
        135_227,
        &["elected", "watch compacted"],
    );
}
