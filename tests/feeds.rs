//! A `Feed` as its users read it: iterated, printed, and ended by the
//! backend closing.

use fleetcoord::coordinator::{Coordinator, MemoryCoordinator, NoopCoordinator};
use std::time::Duration;

#[test]
fn a_feed_iterates_what_is_queued_and_its_debug_says_how_much() {
    let coord = MemoryCoordinator::new();
    let sub = coord.subscribe("t").unwrap();
    assert_eq!(format!("{sub:?}"), "Feed { queued: 0 }");
    for i in 0..3u8 {
        coord.publish("t", &[i]).unwrap();
    }
    assert_eq!(format!("{sub:?}"), "Feed { queued: 3 }");
    let first: Vec<u8> = sub.iter().take(2).map(|m| m.payload[0]).collect();
    assert_eq!(first, vec![0, 1]);
    let rest: Vec<u8> = (&sub).into_iter().take(1).map(|m| m.payload[0]).collect();
    assert_eq!(rest, vec![2]);
}

#[test]
fn iterating_a_feed_ends_when_its_backend_closes() {
    let coord = NoopCoordinator::new();
    let sub = coord.subscribe("t").unwrap();
    let reader = std::thread::spawn(move || sub.iter().count());
    std::thread::sleep(Duration::from_millis(50));
    coord.close().unwrap();
    assert_eq!(reader.join().unwrap(), 0);
    assert!(coord.subscribe("t").is_err(), "closed for good");
}
