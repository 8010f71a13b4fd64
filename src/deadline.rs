//! Deadlines from durations a user chose, without overflow.
//!
//! `Instant + Duration` panics when the sum does not fit, and user
//! durations can be anything up to `Duration::MAX`. Every deadline built
//! from one goes through [`deadline_after`].

use std::time::{Duration, Instant};

/// `now + after`, or `None` when that instant cannot be represented (it
/// lies centuries ahead, e.g. for `Duration::MAX`). Callers treat `None` as
/// "no deadline", which is what such a duration means.
pub(crate) fn deadline_after(after: Duration) -> Option<Instant> {
    Instant::now().checked_add(after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_durations_mean_no_deadline() {
        assert!(deadline_after(Duration::MAX).is_none());
        let soon = deadline_after(Duration::from_secs(1)).expect("representable");
        assert!(soon > Instant::now());
    }
}
