//! A machine whose clock runs at another rate than the world's.
//!
//! The world's virtual clock is etcd's: the model expires leases on it.
//! [`Drifting`] wraps a machine so that every `now` it is given is the
//! world's instant seen through a [`DriftClock`] (`rate` times as much time
//! has passed since the origin), and every deadline it returns is turned
//! back into the earliest world instant at which its own clock reaches it.
//! A harness drives the wrapper like any machine; a checker compares the
//! machine's beliefs with the model through [`Drifting::clock`].

use fleetcoord_sm::{Command, Machine};
use std::time::{Duration, Instant};

const MILLION: u128 = 1_000_000;

/// A clock that ran at `1 + ppm / 1_000_000` times the world's rate since
/// `origin` (where both read the same): negative `ppm` is slow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriftClock {
    origin: Instant,
    ppm: i32,
}

impl DriftClock {
    /// A clock agreeing with the world at `origin` and running `ppm` parts
    /// per million fast (negative: slow) from then on. `ppm` is clamped to
    /// ±50 %, beyond any clock worth simulating.
    pub fn new(origin: Instant, ppm: i32) -> Self {
        DriftClock {
            origin,
            ppm: ppm.clamp(-500_000, 500_000),
        }
    }

    /// A clock that keeps the world's time.
    pub fn exact(origin: Instant) -> Self {
        DriftClock::new(origin, 0)
    }

    /// The rate error, in parts per million.
    pub fn ppm(&self) -> i32 {
        self.ppm
    }

    fn rate(&self) -> u128 {
        // `ppm` is within ±500,000, so this is positive.
        (1_000_000 + i64::from(self.ppm)).unsigned_abs().into()
    }

    /// What this clock reads at world instant `world` (rounded down; the
    /// origin for instants before it).
    pub fn local(&self, world: Instant) -> Instant {
        let elapsed = world.saturating_duration_since(self.origin).as_nanos();
        self.origin + nanos(elapsed * self.rate() / MILLION)
    }

    /// The earliest world instant at which this clock reads `local` or
    /// later (the origin for instants before it).
    pub fn world(&self, local: Instant) -> Instant {
        let elapsed = local.saturating_duration_since(self.origin).as_nanos();
        let mut world = self.origin + nanos((elapsed * MILLION).div_ceil(self.rate()));
        // Rounding in `local` may leave it a nanosecond short.
        while self.local(world) < local {
            world += Duration::from_nanos(1);
        }
        world
    }
}

fn nanos(n: u128) -> Duration {
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

/// `machine`, living by `clock` in a world that lives by another.
#[derive(Debug)]
pub struct Drifting<M> {
    /// The machine; it sees only its own clock's instants.
    pub machine: M,
    clock: DriftClock,
    /// The latest world instant handed in, so a deadline handed out is
    /// never before it (the machine contract, in world time).
    last: Instant,
}

impl<M> Drifting<M> {
    /// Wraps a machine built by `build` at `now` (world time), which it is
    /// given as its own clock's reading.
    pub fn new(clock: DriftClock, now: Instant, build: impl FnOnce(Instant) -> M) -> Self {
        Drifting {
            machine: build(clock.local(now)),
            clock,
            last: now,
        }
    }

    /// The machine's clock.
    pub fn clock(&self) -> DriftClock {
        self.clock
    }

    fn observe(&mut self, now: Instant) -> Instant {
        self.last = self.last.max(now);
        self.clock.local(self.last)
    }
}

impl<M: Machine> Machine for Drifting<M> {
    type Input = M::Input;
    type Notice = M::Notice;

    fn handle(&mut self, now: Instant, input: M::Input) {
        let local = self.observe(now);
        self.machine.handle(local, input);
    }

    fn handle_timeout(&mut self, now: Instant) {
        let local = self.observe(now);
        self.machine.handle_timeout(local);
    }

    fn poll_command(&mut self) -> Option<Command<M::Notice>> {
        self.machine.poll_command()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.machine
            .poll_timeout()
            .map(|at| self.clock.world(at).max(self.last))
    }

    fn stop_input() -> M::Input {
        M::stop_input()
    }

    fn is_finished(&self) -> bool {
        self.machine.is_finished()
    }

    fn consumer_full_input() -> Option<M::Input> {
        M::consumer_full_input()
    }

    fn consumer_ready_input() -> Option<M::Input> {
        M::consumer_ready_input()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_and_world_round_trip_at_any_rate() {
        let t0 = Instant::now();
        for ppm in [-500_000, -30_000, -1, 0, 1, 7_777, 500_000] {
            let c = DriftClock::new(t0, ppm);
            for ns in [0u64, 1, 3, 999, 1_000_000_007, 86_400_000_000_000] {
                let world = t0 + Duration::from_nanos(ns);
                let local = c.local(world);
                // The earliest world instant reading `local` is not later.
                assert!(c.world(local) <= world, "{ppm} {ns}");
                assert!(c.local(c.world(local)) >= local, "{ppm} {ns}");
                let back = c.world(t0 + Duration::from_nanos(ns));
                assert!(c.local(back) >= t0 + Duration::from_nanos(ns));
                if back > t0 {
                    let before = back - Duration::from_nanos(1);
                    assert!(
                        c.local(before) < t0 + Duration::from_nanos(ns),
                        "{ppm} {ns}"
                    );
                }
            }
        }
        let slow = DriftClock::new(t0, -10_000);
        assert_eq!(
            slow.local(t0 + Duration::from_secs(100)),
            t0 + Duration::from_secs(99)
        );
        assert_eq!(
            slow.world(t0 + Duration::from_secs(99)),
            t0 + Duration::from_secs(100)
        );
    }
}
