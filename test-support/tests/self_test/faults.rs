//! Faults happen as configured: latency within its range, failed requests
//! that never ran, lost replies whose writes did.

use crate::fixtures::*;
use fleetcoord_sm::*;
use fleetcoord_test_support::*;
use std::time::{Duration, Instant};

#[test]
fn replies_arrive_after_the_latency_and_not_before() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let faults = Faults {
        latency: (ms(5), ms(9)),
        ..Faults::none()
    };
    let mut rng = rng(7);
    let mut h = Harness::new(Probe::default());
    let id = h.machine.send(put("k", "v", 0));
    h.pump(&mut etcd, t0, &mut rng, &faults);
    assert!(etcd.get(b"k").is_some(), "executed at the send instant");
    let due = h.next_event_time().unwrap();
    assert!(due >= t0 + ms(5) && due <= t0 + ms(9), "{:?}", due - t0);
    h.deliver_due(&mut etcd, due - Duration::from_nanos(1), &mut rng, &faults);
    assert!(h.machine.replies.is_empty());
    h.deliver_due(&mut etcd, due, &mut rng, &faults);
    assert_eq!(
        h.machine.replies_for(id),
        [(due, Ok(Response::Put { revision: 2 }))]
    );
    assert_eq!(h.next_event_time(), None);
}

#[test]
fn latency_draws_cover_the_range() {
    let faults = Faults::moderate();
    let mut rng = rng(3);
    let draws: Vec<Duration> = (0..1000).map(|_| faults.sample_latency(&mut rng)).collect();
    assert!(draws
        .iter()
        .all(|d| *d >= faults.latency.0 && *d <= faults.latency.1));
    assert!(draws.iter().any(|d| *d < ms(5)) && draws.iter().any(|d| *d > ms(15)));
    let hits = (0..10_000).filter(|_| chance(&mut rng, 0.25)).count();
    assert!((2200..2800).contains(&hits), "{hits}");
}

#[test]
fn injected_faults_fail_or_hide_writes() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let mut rng = rng(5);
    let mut h = Harness::new(Probe::default());
    let fail = Faults {
        fail_request: 1.0,
        ..Faults::none()
    };
    let a = h.machine.send(put("a", "", 0));
    h.pump(&mut etcd, t0, &mut rng, &fail);
    let lose = Faults {
        lose_reply: 1.0,
        ..Faults::none()
    };
    let b = h.machine.send(put("b", "", 0));
    h.pump(&mut etcd, t0, &mut rng, &lose);
    h.deliver_due(&mut etcd, t0 + ms(1), &mut rng, &lose);
    assert!(etcd.get(b"a").is_none(), "a failed request does not run");
    assert!(etcd.get(b"b").is_some(), "a lost reply's write happened");
    for id in [a, b] {
        assert!(matches!(
            h.machine.replies_for(id)[0].1,
            Err(RpcError::Unavailable(_))
        ));
    }
    assert_eq!(h.faults_injected, 2);
}
