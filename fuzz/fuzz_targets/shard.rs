//! Fuzz the shard map (`fleetcoord_sm::shard::ShardMap`): two or three
//! real members on the shared model etcd, driven through the model
//! checker's shard world (`fleetcoord_test_support::model::shard`), whose
//! schedule the fuzzer picks step by step instead of exploring them all:
//! which request runs, which reply or watch batch arrives, which is lost
//! or lands late, when time passes, which session is cut off, which member
//! crashes or leaves, which released shard its user hands back or keeps.
//! The world sizes (up to 3 members, 4 shards, a 6 s horizon) and fault
//! budgets are larger than the exhaustive runs can afford.
//!
//! After every step the world checks the map's rules against the model
//! etcd (see that module): at most one member believes it owns a shard; a
//! belief is backed by the shard key with the believed token, the
//! member's id and its current lease; tokens rise per shard; `Acquired`
//! and creates only while the session is trusted, on its lease; a member
//! writes only its own keys and deletes only its own incarnations;
//! `Release` deadlines within the drain; `poll_timeout` never in the past.
//! From every quiescent state it checks liveness: without further faults
//! every shard settles on the member placement names.

#![no_main]

use arbitrary::Arbitrary;
use fleetcoord_test_support::model::shard::{Budget, ShardSetup, ShardWorld};
use fleetcoord_test_support::model::World;
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

#[derive(Arbitrary, Debug)]
struct Input {
    members: u8,
    shards: u8,
    horizon_ms: u16,
    lose: u8,
    land: u8,
    delay: u8,
    cut: u8,
    crash: u8,
    leave: u8,
    keep: u8,
    /// Each picks one of the actions enabled then, modulo their count.
    steps: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let mut setup = ShardSetup::new(
        2 + usize::from(input.members % 2),
        1 + u32::from(input.shards % 4),
    );
    setup.horizon = Duration::from_millis(u64::from(input.horizon_ms % 6_000));
    setup.land_within = 2;
    setup.budget = Budget {
        lose: u32::from(input.lose % 4),
        land: u32::from(input.land % 3),
        delay: u32::from(input.delay % 4),
        cut: u32::from(input.cut % 3),
        crash: u32::from(input.crash % 2),
        leave: u32::from(input.leave % 2),
        keep: u32::from(input.keep % 3),
    };
    let mut world = ShardWorld::new(setup);
    let mut actions = Vec::new();
    let mut trace = Vec::new();
    for pick in input.steps {
        actions.clear();
        world.actions(&mut actions);
        if actions.is_empty() {
            break;
        }
        let action = actions[usize::from(pick) % actions.len()].clone();
        trace.push(action.clone());
        if let Err(message) = world.apply(&action) {
            panic!("{message}\nafter {trace:?}\n{}", world.describe());
        }
        if let Err(message) = world.check_liveness() {
            panic!("{message}\nafter {trace:?}\n{}", world.describe());
        }
    }
});
