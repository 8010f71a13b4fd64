//! A world: harnesses of any machine types around one model etcd, advanced
//! together on a virtual clock. Time only moves when a test says so, to the
//! next instant anything is due, so a run is as fast as its events and the
//! same for every seed.

use crate::faults::Faults;
use crate::harness::{next_time, Harness};
use crate::random::ChaCha8Rng;
use crate::{ModelEtcd, LIVELOCK_LIMIT};
use fleetcoord_sm::Machine;
use std::time::{Duration, Instant};

/// `n` milliseconds of virtual time.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The object-safe face of a [`Harness`], so harnesses of different machine
/// types can be stepped together by [`step`].
pub trait Node {
    /// See [`Harness::next_event_time`].
    fn next_event_time(&self) -> Option<Instant>;
    /// See [`Harness::fire_timeout`].
    fn fire_timeout(
        &mut self,
        etcd: &mut ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
    );
    /// See [`Harness::deliver_due`].
    fn deliver_due(
        &mut self,
        etcd: &mut ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
    );
    /// See [`Harness::pump`].
    fn pump(&mut self, etcd: &mut ModelEtcd, now: Instant, rng: &mut ChaCha8Rng, faults: &Faults);
}

impl<M: Machine> Node for Harness<M> {
    fn next_event_time(&self) -> Option<Instant> {
        Harness::next_event_time(self)
    }
    fn fire_timeout(
        &mut self,
        etcd: &mut ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
    ) {
        Harness::fire_timeout(self, etcd, now, rng, faults)
    }
    fn deliver_due(
        &mut self,
        etcd: &mut ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
    ) {
        Harness::deliver_due(self, etcd, now, rng, faults)
    }
    fn pump(&mut self, etcd: &mut ModelEtcd, now: Instant, rng: &mut ChaCha8Rng, faults: &Faults) {
        Harness::pump(self, etcd, now, rng, faults)
    }
}

/// The next instant anything happens: a node's delivery, late landing or
/// deadline, or a lease expiry.
pub fn world_next_time(etcd: &ModelEtcd, nodes: &[&mut dyn Node]) -> Option<Instant> {
    let nodes_next = nodes.iter().filter_map(|n| n.next_event_time()).min();
    next_time(&[nodes_next, etcd.next_deadline()])
}

/// The next instant anything happens in a world of one node, when it is
/// no later than `until`.
pub fn next_due(etcd: &ModelEtcd, node: &mut dyn Node, until: Instant) -> Option<Instant> {
    let nodes: [&mut dyn Node; 1] = [node];
    world_next_time(etcd, &nodes).filter(|t| *t <= until)
}

/// Pumps every node until a whole round writes nothing, so every watch has
/// seen every write made at this instant.
pub fn settle(
    etcd: &mut ModelEtcd,
    nodes: &mut [&mut dyn Node],
    now: Instant,
    rng: &mut ChaCha8Rng,
    faults: &Faults,
) {
    for _ in 0..LIVELOCK_LIMIT {
        let before = etcd.revision();
        for n in nodes.iter_mut() {
            n.pump(etcd, now, rng, faults);
        }
        if etcd.revision() == before {
            return;
        }
    }
    panic!("livelock: writes keep happening at one instant");
}

/// Processes everything due at `now`, in the required order: lease expiry,
/// then machine timeouts, then late landings and reply deliveries (each
/// node's landings before its replies), then [`settle`]; repeated until
/// nothing is due at `now` any more.
///
/// # Panics
/// When work keeps coming due at `now` without end (a machine livelock).
pub fn step(
    etcd: &mut ModelEtcd,
    nodes: &mut [&mut dyn Node],
    now: Instant,
    rng: &mut ChaCha8Rng,
    faults: &Faults,
) {
    for _ in 0..LIVELOCK_LIMIT {
        etcd.advance(now);
        for n in nodes.iter_mut() {
            n.fire_timeout(etcd, now, rng, faults);
        }
        for n in nodes.iter_mut() {
            n.deliver_due(etcd, now, rng, faults);
        }
        settle(etcd, nodes, now, rng, faults);
        let due = world_next_time(etcd, nodes).is_some_and(|t| t <= now);
        if !due {
            return;
        }
    }
    panic!("livelock: work keeps coming due at one instant");
}

/// Steps through every event instant up to and including `until`; returns
/// `until`. Use `world_next_time` + `step` directly to check invariants
/// between steps.
pub fn run_until(
    etcd: &mut ModelEtcd,
    nodes: &mut [&mut dyn Node],
    until: Instant,
    rng: &mut ChaCha8Rng,
    faults: &Faults,
) -> Instant {
    while let Some(t) = world_next_time(etcd, nodes) {
        if t > until {
            break;
        }
        step(etcd, nodes, t, rng, faults);
    }
    until
}
