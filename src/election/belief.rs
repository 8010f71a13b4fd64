//! [`Belief`]: whether a leadership may still be believed, judged by the
//! caller's own clock.
//!
//! The driver thread reports a leadership's end, but a driver starved of
//! CPU (or a process paused) reports it late; a flag it flips would let a
//! caller believe past the session's local deadline, after which etcd may
//! already have let another candidate win. So belief is two facts: the
//! leadership has not ended (resign, drop, loss, a newer leadership), and
//! the calling thread's `Instant::now()` is before the deadline the
//! election machine last announced (`ElectionNotice::Elected`'s
//! `trusted_until`, moved by `ElectionNotice::Trusted`). The deadline
//! only ever comes from an answered renewal, so a late notice can only
//! make belief end early, never late.

use fleetcoord_sm::session::trust_left;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Shared by the election's notice handler (which moves and ends it) and
/// every handle of one leadership (which reads it).
#[derive(Debug)]
pub(crate) struct Belief {
    ended: AtomicBool,
    /// A hand-over is under way: not believed until it failed.
    paused: AtomicBool,
    until: Mutex<Instant>,
}

impl Belief {
    /// A leadership that may be believed until `until`.
    pub(crate) fn until(until: Instant) -> Self {
        Belief {
            ended: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            until: Mutex::new(until),
        }
    }

    /// A leadership that was over before anyone could hold it.
    pub(crate) fn over() -> Self {
        let belief = Belief::until(Instant::now());
        belief.end();
        belief
    }

    /// Whether the leadership may be believed at this instant.
    pub(crate) fn holds(&self) -> bool {
        self.remaining().is_some()
    }

    /// How long the leadership may still be believed from now, judged as
    /// [`Belief::holds`] judges; `None` when it may not be believed now.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        if self.ended.load(Ordering::SeqCst) || self.paused.load(Ordering::SeqCst) {
            return None;
        }
        trust_left(Instant::now(), *self.until.lock())
    }

    /// Not believed until [`Belief::resume`]: a hand-over's delete may
    /// apply from now on.
    pub(crate) fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }

    /// The hand-over failed with nothing deleted: believed again (unless
    /// ended meanwhile, or its deadline passed).
    pub(crate) fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Belief now lasts until `until` (a renewal was answered). Earlier
    /// than before is taken too: the machine's word is the bound.
    pub(crate) fn trust_until(&self, until: Instant) {
        *self.until.lock() = until;
    }

    /// The leadership is over; final.
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn belief_ends_at_the_deadline_without_anyone_saying_so() {
        let belief = Belief::until(Instant::now() + Duration::from_millis(30));
        assert!(belief.holds());
        std::thread::sleep(Duration::from_millis(40));
        assert!(!belief.holds(), "the caller's clock ends it");
    }

    #[test]
    fn a_moved_deadline_extends_and_an_end_is_final() {
        let belief = Belief::until(Instant::now());
        assert!(!belief.holds());
        let later = Instant::now() + Duration::from_secs(60);
        belief.trust_until(later);
        assert!(belief.holds());
        belief.end();
        belief.trust_until(later + Duration::from_secs(60));
        assert!(!belief.holds());
        assert!(!Belief::over().holds());
    }

    #[test]
    fn what_remains_is_judged_as_belief_is() {
        let belief = Belief::until(Instant::now() + Duration::from_secs(60));
        let left = belief.remaining().expect("believed");
        assert!(left > Duration::from_secs(59) && left <= Duration::from_secs(60));
        belief.pause();
        assert_eq!(belief.remaining(), None, "a hand-over under way");
        belief.resume();
        assert!(belief.remaining().is_some());
        belief.trust_until(Instant::now());
        assert_eq!(belief.remaining(), None, "the deadline passed");
        belief.trust_until(Instant::now() + Duration::from_secs(60));
        belief.end();
        assert_eq!(belief.remaining(), None, "ended");
    }
}
