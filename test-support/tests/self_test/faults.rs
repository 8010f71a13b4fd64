//! Faults happen as configured: latency within its range, failed requests
//! that never ran, lost replies whose writes did, held-up requests that run
//! after their client was told they failed.

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

/// Every unary request held up, landing 200 ms after its send; replies in 5 ms.
fn held_up() -> Faults {
    Faults {
        latency: (ms(5), ms(5)),
        land_late: 1.0,
        late_by: (ms(200), ms(200)),
        ..Faults::none()
    }
}

#[test]
fn a_held_up_request_fails_now_and_lands_later_even_when_canceled() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let faults = held_up();
    let mut rng = rng(12);
    let mut h = Harness::new(Probe::default());
    let id = h.machine.send(put("k", "v", 0));
    h.pump(&mut etcd, t0, &mut rng, &faults);
    assert!(etcd.get(b"k").is_none(), "held up, not run at the send");
    assert_eq!(h.held(), 1);
    run_until(&mut etcd, &mut [&mut h], t0 + ms(50), &mut rng, &faults);
    assert_eq!(
        h.machine.replies_for(id),
        [(
            t0 + ms(5),
            Err(RpcError::Unavailable("injected: request held up".into()))
        )]
    );
    // The client gives up on it; that does not reach the request.
    h.machine.out.push_back(Command::Cancel { id });
    h.pump(&mut etcd, t0 + ms(50), &mut rng, &faults);
    assert_eq!(
        h.next_event_time(),
        Some(t0 + ms(200)),
        "the landing is an event"
    );
    run_until(&mut etcd, &mut [&mut h], t0 + ms(199), &mut rng, &faults);
    assert!(etcd.get(b"k").is_none());
    run_until(&mut etcd, &mut [&mut h], t0 + ms(200), &mut rng, &faults);
    assert_eq!(etcd.get(b"k").map(|kv| kv.mod_revision), Some(2));
    assert_eq!((h.late_landed, h.held(), h.faults_injected), (1, 0, 1));
    assert_eq!(h.machine.replies.len(), 1, "its result goes nowhere");
    assert_eq!(h.next_event_time(), None);
}

#[test]
fn watches_and_keepalives_are_never_held_up() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let faults = held_up();
    let mut rng = rng(13);
    let (lease, _) = grant(&mut etcd, t0, 2);
    let mut h = Harness::new(Probe::default());
    let w = h.machine.send(Request::Watch {
        range: KeyRange::Prefix(Vec::new()),
        start_revision: 0,
    });
    let k = h.machine.send(Request::KeepAlive { lease });
    h.pump(&mut etcd, t0 + ms(500), &mut rng, &faults);
    h.deliver_due(&mut etcd, t0 + ms(505), &mut rng, &faults);
    assert_eq!(h.held(), 0);
    assert_eq!(
        etcd.lease_deadline(lease),
        Some(t0 + ms(2_500)),
        "the renewal ran at its send"
    );
    assert!(matches!(
        h.machine.replies_for(k)[0].1,
        Ok(Response::KeptAlive { .. })
    ));
    assert_eq!(
        h.machine.replies_for(w),
        [(t0 + ms(505), Ok(Response::WatchEvents { events: vec![] }))]
    );
}

#[test]
fn a_held_up_request_due_during_a_pause_lands_once_etcd_resumes() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let faults = held_up();
    let mut rng = rng(14);
    let mut h = Harness::new(Probe::default());
    h.machine.send(put("k", "late", 0));
    h.pump(&mut etcd, t0, &mut rng, &faults);
    etcd.pause();
    run_until(&mut etcd, &mut [&mut h], t0 + ms(300), &mut rng, &faults);
    assert_eq!(h.held(), 1, "stalled behind the pause");
    assert_eq!(
        h.next_event_time(),
        None,
        "not an event while it cannot land"
    );
    // Queued during the pause, after the held-up request came due.
    let queued = h.machine.send(put("k", "queued", 0));
    let no_more = Faults {
        land_late: 0.0,
        ..faults
    };
    h.pump(&mut etcd, t0 + ms(300), &mut rng, &no_more);
    etcd.resume(t0 + ms(400));
    h.pump(&mut etcd, t0 + ms(400), &mut rng, &no_more);
    assert_eq!((h.late_landed, h.held()), (1, 0));
    assert_eq!(
        etcd.get(b"k").map(|kv| kv.value),
        Some(b"queued".to_vec()),
        "the held-up request came due first, so it lands first"
    );
    run_until(&mut etcd, &mut [&mut h], t0 + ms(500), &mut rng, &no_more);
    assert_eq!(
        h.machine.replies_for(queued),
        [(t0 + ms(405), Ok(Response::Put { revision: 3 }))]
    );
}

#[test]
fn held_up_requests_passed_to_a_replacement_still_land() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let faults = held_up();
    let mut rng = rng(15);
    let mut old = Harness::new(Probe::default());
    old.machine.send(put("k", "old", 0));
    old.pump(&mut etcd, t0, &mut rng, &faults);
    let mut new = Harness::new(Probe::default());
    old.pass_held_to(&mut new);
    assert_eq!((old.held(), new.held()), (0, 1));
    run_until(&mut etcd, &mut [&mut new], t0 + ms(200), &mut rng, &faults);
    assert_eq!(etcd.get(b"k").map(|kv| kv.value), Some(b"old".to_vec()));
    assert_eq!((old.late_landed, new.late_landed), (0, 1));
}
