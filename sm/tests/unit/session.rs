//! The two belief rules of a session (`fleetcoord_sm::session`), which
//! every driver applies instead of writing its own.

use fleetcoord_sm::session::{is_dead, trust_left};
use std::time::{Duration, Instant};

/// Belief by the caller's clock: what is left before the deadline, and
/// nothing at or past it.
#[test]
fn trust_ends_at_the_deadline_not_after_it() {
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(3);
    assert_eq!(trust_left(t0, until), Some(Duration::from_secs(3)));
    assert_eq!(
        trust_left(until - Duration::from_nanos(1), until),
        Some(Duration::from_nanos(1))
    );
    assert_eq!(trust_left(until, until), None, "the deadline itself");
    assert_eq!(trust_left(until + Duration::from_secs(1), until), None);
}

/// The dead-lease rule: only the marked lease is dead, and no mark (0)
/// marks nothing.
#[test]
fn only_the_marked_lease_is_dead() {
    assert!(is_dead(0x2a, 0x2a));
    assert!(!is_dead(0x2b, 0x2a), "a newer lease lives");
    assert!(!is_dead(0x2a, 0), "no lease marked yet");
    assert!(!is_dead(0, 0), "0 is no lease, and no mark");
}
