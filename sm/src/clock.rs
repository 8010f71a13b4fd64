//! The last `now` a machine has seen.
//!
//! Machines read no clock: time comes in with every `handle*` call. The
//! contract says that `now` never goes backwards and that a deadline a
//! machine returns is never earlier than the last `now` it was given.
//! [`Clock`] keeps that last `now` and enforces both rules in one place:
//! [`Clock::observe`] debug-asserts monotonic time and never moves back
//! (a release build that is fed an earlier `now` keeps the later one), and
//! [`Clock::clamp`] lifts a deadline to the last `now`.

use std::time::Instant;

/// The latest instant a machine has been told about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    now: Instant,
}

impl Clock {
    /// A clock that has seen `now` (a machine's creation time).
    pub fn new(now: Instant) -> Self {
        Clock { now }
    }

    /// Records `now` and returns the last `now`: `now` itself, unless it is
    /// earlier than an instant seen before (a driver bug, asserted in debug
    /// builds), in which case time does not go back.
    pub fn observe(&mut self, now: Instant) -> Instant {
        debug_assert!(now >= self.now, "time went backwards");
        self.now = self.now.max(now);
        self.now
    }

    /// The last `now` seen.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// `at`, or the last `now` if `at` is earlier: a deadline handed to a
    /// driver (or armed) is never in the past of what the machine has seen.
    pub fn clamp(&self, at: Instant) -> Instant {
        at.max(self.now)
    }
}
