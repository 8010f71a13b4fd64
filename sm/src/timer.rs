//! One table for all of a machine's timers.
//!
//! Each machine names its timers with a private `Copy` enum and keeps them in
//! a [`TimerTable`], so `poll_timeout` is simply [`TimerTable::next`] and no
//! deadline can be forgotten in some field.

use std::time::Instant;

/// Deadlines indexed by a machine's own timer names. At most one deadline per
/// name; setting a name again replaces its deadline.
#[derive(Clone, Debug)]
pub struct TimerTable<T> {
    slots: Vec<(T, Instant)>,
}

impl<T> Default for TimerTable<T> {
    fn default() -> Self {
        TimerTable { slots: Vec::new() }
    }
}

impl<T: Copy + Eq> TimerTable<T> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Arm `timer` to fire at `at`, replacing any earlier deadline.
    pub fn set(&mut self, timer: T, at: Instant) {
        match self.slots.iter_mut().find(|(t, _)| *t == timer) {
            Some(slot) => slot.1 = at,
            None => self.slots.push((timer, at)),
        }
    }

    /// Disarm `timer`; a no-op when it is not armed.
    pub fn stop(&mut self, timer: T) {
        self.slots.retain(|(t, _)| *t != timer);
    }

    /// Disarm every timer.
    pub fn clear(&mut self) {
        self.slots.clear();
    }

    /// The deadline of `timer`, if armed.
    pub fn get(&self, timer: T) -> Option<Instant> {
        self.slots
            .iter()
            .find(|(t, _)| *t == timer)
            .map(|(_, at)| *at)
    }

    /// Whether `timer` is armed.
    pub fn is_armed(&self, timer: T) -> bool {
        self.get(timer).is_some()
    }

    /// The earliest deadline of all armed timers.
    pub fn next(&self) -> Option<Instant> {
        self.slots.iter().map(|(_, at)| *at).min()
    }

    /// Disarm and return the earliest timer due at `now`, if any. Call in a
    /// loop to handle every expired timer in deadline order.
    pub fn pop_expired(&mut self, now: Instant) -> Option<T> {
        let (index, _) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, (_, at))| *at <= now)
            .min_by_key(|(_, (_, at))| *at)?;
        Some(self.slots.swap_remove(index).0)
    }
}
