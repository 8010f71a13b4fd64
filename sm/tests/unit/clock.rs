use fleetcoord_sm::Clock;
use std::time::{Duration, Instant};

#[test]
fn observe_moves_forward_and_clamp_never_returns_the_past() {
    let t0 = Instant::now();
    let mut clock = Clock::new(t0);
    assert_eq!(clock.now(), t0);
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(clock.observe(t1), t1);
    assert_eq!(clock.observe(t1), t1, "the same instant again is fine");
    assert_eq!(clock.now(), t1);
    assert_eq!(clock.clamp(t0), t1);
    let t2 = t1 + Duration::from_secs(1);
    assert_eq!(clock.clamp(t2), t2);
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "time went backwards")]
fn observing_an_earlier_instant_is_a_driver_bug() {
    let t0 = Instant::now();
    let mut clock = Clock::new(t0 + Duration::from_secs(1));
    clock.observe(t0);
}
