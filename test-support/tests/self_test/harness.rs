//! The harness serves the wire as etcd would: watch history then live
//! events in revision order, cancellation on compaction, broken streams,
//! cancels, lost replies.

use crate::fixtures::*;
use fleetcoord_sm::*;
use fleetcoord_test_support::*;
use std::time::{Duration, Instant};

fn watch_batches(h: &Harness<Probe>, id: RpcId) -> Vec<Vec<(EventKind, String, Revision)>> {
    h.machine
        .replies_for(id)
        .into_iter()
        .map(|(_, r)| match r {
            Ok(Response::WatchEvents { events }) => events
                .iter()
                .map(|e| {
                    (
                        e.kind,
                        String::from_utf8(e.kv.key.clone()).unwrap(),
                        e.kv.mod_revision,
                    )
                })
                .collect(),
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

#[test]
fn harness_delivers_watch_history_then_live_events_in_order() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let faults = Faults {
        latency: (ms(1), ms(30)),
        ..Faults::none()
    };
    let mut rng = rng(11);
    let (lease, _) = grant(&mut etcd, t0, 2);
    etcd.execute(t0, &put("/w/a", "", 0)).unwrap(); // 2
    etcd.execute(t0, &put("/x", "", 0)).unwrap(); // 3, outside the range
    etcd.execute(t0, &put("/w/b", "", lease)).unwrap(); // 4
    let mut h = Harness::new(Probe::default());
    let id = h.machine.send(Request::Watch {
        range: KeyRange::Prefix(b"/w/".to_vec()),
        start_revision: 2,
    });
    h.pump(&mut etcd, t0, &mut rng, &faults);
    let mut other = Harness::new(Probe::default());
    let mut now = t0;
    // Writes by another harness and the lease expiring, each picked up
    // with random latency; batches must still arrive in revision order.
    for i in 0..20 {
        now += ms(3);
        other.machine.send(put(&format!("/w/k{i}"), "", 0));
        step(&mut etcd, &mut [&mut h, &mut other], now, &mut rng, &faults);
    }
    let until = t0 + Duration::from_secs(3);
    run_until(
        &mut etcd,
        &mut [&mut h, &mut other],
        until,
        &mut rng,
        &faults,
    );
    let batches = watch_batches(&h, id);
    assert!(batches[0].is_empty(), "the created notice comes first");
    let revs: Vec<Revision> = batches[1..].iter().map(|b| b[0].2).collect();
    assert_eq!(revs[..2], [2, 4]);
    assert!(revs.windows(2).all(|w| w[0] < w[1]), "{revs:?}");
    assert_eq!(revs.len(), 2 + 20 + 1);
    let last = batches.last().unwrap();
    assert_eq!(last[0].0, EventKind::Delete);
    assert_eq!(last[0].1, "/w/b");
    let times: Vec<Instant> = h.machine.replies_for(id).iter().map(|(t, _)| *t).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn compaction_cancels_a_lagging_watch() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let faults = Faults::none();
    let mut rng = rng(2);
    for v in ["1", "2", "3"] {
        etcd.execute(t0, &put("k", v, 0)).unwrap();
    }
    etcd.compact(3);
    let mut h = Harness::new(Probe::default());
    let old = h.machine.send(Request::Watch {
        range: KeyRange::Key(b"k".to_vec()),
        start_revision: 2,
    });
    h.pump(&mut etcd, t0, &mut rng, &faults);
    h.deliver_due(&mut etcd, t0 + ms(1), &mut rng, &faults);
    let replies: Vec<_> = h
        .machine
        .replies_for(old)
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    assert_eq!(
        replies,
        [
            Ok(Response::WatchEvents { events: vec![] }),
            Ok(Response::WatchCanceled {
                compact_revision: 3
            })
        ]
    );
    assert_eq!(h.active_watches(), 0);
    // A live watch that has not yet been told about revision 5 when 5 is
    // compacted is cancelled too.
    let live = h.machine.send(Request::Watch {
        range: KeyRange::Key(b"k".to_vec()),
        start_revision: 0,
    });
    h.pump(&mut etcd, t0, &mut rng, &faults);
    etcd.execute(t0, &put("k", "4", 0)).unwrap();
    etcd.execute(t0, &put("k", "5", 0)).unwrap();
    etcd.compact(6);
    h.pump(&mut etcd, t0, &mut rng, &faults);
    h.deliver_due(&mut etcd, t0 + ms(1), &mut rng, &faults);
    let last = h.machine.replies_for(live).pop().unwrap().1;
    assert_eq!(
        last,
        Ok(Response::WatchCanceled {
            compact_revision: 6
        })
    );
}

#[test]
fn drop_streams_fails_watches_and_outstanding_keepalives() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let faults = Faults {
        latency: (ms(10), ms(10)),
        ..Faults::none()
    };
    let mut rng = rng(4);
    let (lease, _) = grant(&mut etcd, t0, 2);
    let mut h = Harness::new(Probe::default());
    let w = h.machine.send(Request::Watch {
        range: KeyRange::Prefix(Vec::new()),
        start_revision: 0,
    });
    let k = h.machine.send(Request::KeepAlive { lease });
    let p = h.machine.send(put("k", "", 0));
    h.pump(&mut etcd, t0, &mut rng, &faults);
    h.drop_streams(t0 + ms(2));
    run_until(&mut etcd, &mut [&mut h], t0 + ms(50), &mut rng, &faults);
    let dropped = Err(RpcError::Unavailable("stream dropped".into()));
    assert_eq!(h.machine.replies_for(w), [(t0 + ms(3), dropped.clone())]);
    assert_eq!(h.machine.replies_for(k), [(t0 + ms(10), dropped)]);
    assert_eq!(
        h.machine.replies_for(p),
        [(t0 + ms(10), Ok(Response::Put { revision: 2 }))]
    );
    assert_eq!(
        etcd.lease_deadline(lease),
        Some(t0 + Duration::from_secs(2)),
        "the renewal ran"
    );
    assert_eq!(h.active_watches(), 0);
}

#[test]
fn cancel_forgets_replies_and_watches() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let faults = Faults::none();
    let mut rng = rng(6);
    let mut h = Harness::new(Probe::default());
    let w = h.machine.send(Request::Watch {
        range: KeyRange::Prefix(Vec::new()),
        start_revision: 0,
    });
    let p = h.machine.send(put("k", "", 0));
    h.machine.out.push_back(Command::Cancel { id: w });
    h.machine.out.push_back(Command::Cancel { id: p });
    h.pump(&mut etcd, t0, &mut rng, &faults);
    run_until(&mut etcd, &mut [&mut h], t0 + ms(50), &mut rng, &faults);
    assert!(h.machine.replies.is_empty());
    assert_eq!((h.active_watches(), h.in_flight()), (0, 0));
}

#[test]
fn lose_all_inflight_hides_results_of_requests_that_ran() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let faults = Faults::none();
    let mut rng = rng(9);
    let mut h = Harness::new(Probe::default());
    let w = h.machine.send(Request::Watch {
        range: KeyRange::Prefix(Vec::new()),
        start_revision: 0,
    });
    let p = h.machine.send(put("k", "", 0));
    h.pump(&mut etcd, t0, &mut rng, &faults);
    h.lose_all_inflight();
    run_until(&mut etcd, &mut [&mut h], t0 + ms(10), &mut rng, &faults);
    assert!(etcd.get(b"k").is_some());
    let lost = Err(RpcError::Unavailable("connection lost".into()));
    assert_eq!(h.machine.replies_for(p), [(t0 + ms(1), lost)]);
    assert_eq!(
        h.machine.replies_for(w).len(),
        2,
        "the watch is untouched and sees the put"
    );
}
