//! The world steps in the required order and is a function of its seed.

use crate::fixtures::*;
use fleetcoord_sm::*;
use fleetcoord_test_support::*;
use std::time::{Duration, Instant};

#[test]
fn timeouts_fire_before_deliveries_at_the_same_instant() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let faults = Faults {
        latency: (ms(4), ms(4)),
        ..Faults::none()
    };
    let mut rng = rng(8);
    let mut a = Harness::new(Probe::default());
    let mut b = Harness::new(Probe::default());
    b.machine.send(put("k", "", 0));
    b.pump(&mut etcd, t0, &mut rng, &faults);
    a.machine.timer = Some(t0 + ms(4));
    b.machine.timer = Some(t0 + ms(4));
    run_until(
        &mut etcd,
        &mut [&mut b, &mut a],
        t0 + ms(10),
        &mut rng,
        &faults,
    );
    let log: Vec<&str> = b.machine.log.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(log, ["timeout", "reply 0"]);
    assert_eq!(a.notifications, [(t0 + ms(4), "timed out".to_string())]);
}

#[test]
fn next_time_is_the_minimum() {
    let t0 = Instant::now();
    assert_eq!(
        next_time(&[None, Some(t0 + ms(2)), Some(t0 + ms(1)), None]),
        Some(t0 + ms(1))
    );
    assert_eq!(next_time(&[None, None]), None);
}

/// Everything is a function of the seed: two runs with the same seed
/// under faults give the same replies at the same instants.
#[test]
fn same_seed_same_run() {
    fn run(seed: u64) -> Vec<(Duration, RpcReply)> {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let faults = Faults::moderate();
        let mut rng = rng(seed);
        let mut h = Harness::new(Probe::default());
        h.machine.send(Request::Watch {
            range: KeyRange::Prefix(Vec::new()),
            start_revision: 0,
        });
        let mut now = t0;
        for i in 0..50 {
            now += ms(7);
            h.machine.send(put(&format!("k{}", i % 5), "", 0));
            step(&mut etcd, &mut [&mut h], now, &mut rng, &faults);
        }
        run_until(&mut etcd, &mut [&mut h], now + ms(100), &mut rng, &faults);
        h.machine
            .replies
            .iter()
            .map(|(t, r)| (*t - t0, r.clone()))
            .collect()
    }
    let a = run(21);
    assert_eq!(a, run(21));
    assert_ne!(a, run(22));
    assert!(
        a.iter().any(|(_, r)| r.result.is_err()),
        "moderate faults inject something"
    );
}
