use fleetcoord_sm::TimerTable;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum T {
    A,
    B,
}

#[test]
fn expired_timers_come_out_in_deadline_order_and_once() {
    let t0 = Instant::now();
    let mut table = TimerTable::new();
    table.set(T::B, t0 + Duration::from_secs(2));
    table.set(T::A, t0 + Duration::from_secs(1));
    assert_eq!(table.next(), Some(t0 + Duration::from_secs(1)));
    assert_eq!(table.pop_expired(t0), None);
    let now = t0 + Duration::from_secs(3);
    assert_eq!(table.pop_expired(now), Some(T::A));
    assert_eq!(table.pop_expired(now), Some(T::B));
    assert_eq!(table.pop_expired(now), None);
    assert_eq!(table.next(), None);
}

#[test]
fn setting_again_replaces_the_deadline() {
    let t0 = Instant::now();
    let mut table = TimerTable::new();
    table.set(T::A, t0 + Duration::from_secs(5));
    table.set(T::A, t0 + Duration::from_secs(1));
    assert_eq!(table.get(T::A), Some(t0 + Duration::from_secs(1)));
    table.stop(T::A);
    assert!(!table.is_armed(T::A));
}
