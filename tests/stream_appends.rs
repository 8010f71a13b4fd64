//! Appends on etcd cost one round trip once the coordinator knows the
//! stream's head, and a head another writer moved costs a failed
//! transaction (whose answer shows the new head), never a wrong ID. The
//! request counts are etcd's own (`/metrics`), not the client's word.

mod common;

use fleetcoord::coordinator::{Coordinator, EtcdCoordinator, StreamPosition};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn a_writer_appending_in_turn_reads_the_head_once() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let coordinator = EtcdCoordinator::new(&etcd).expect("coordinator");
    let (ranges, txns) = (
        common::etcd_calls(&server.endpoint(), "Range"),
        common::etcd_calls(&server.endpoint(), "Txn"),
    );
    for i in 1..=100u64 {
        let id = coordinator
            .append_stream("turns", format!("p{i}").as_bytes())
            .expect("append");
        assert_eq!(id.0, i);
    }
    let ranges = common::etcd_calls(&server.endpoint(), "Range") - ranges;
    let txns = common::etcd_calls(&server.endpoint(), "Txn") - txns;
    assert_eq!((ranges, txns), (1, 100), "(head reads, transactions)");
}

#[test]
fn two_writers_taking_turns_get_every_id_once_in_order() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let a = EtcdCoordinator::new(&etcd).expect("coordinator a");
    // Another process, as far as the head cache goes.
    let b = EtcdCoordinator::new(&common::connect(&server.endpoint())).expect("coordinator b");
    let reader = a
        .read_stream("shared", StreamPosition::Start)
        .expect("reader");
    let (ranges, txns) = (
        common::etcd_calls(&server.endpoint(), "Range"),
        common::etcd_calls(&server.endpoint(), "Txn"),
    );
    let mut ids = Vec::new();
    for i in 0..50 {
        // Each writer's remembered head is stale after the other's append.
        ids.push(
            a.append_stream("shared", format!("a{i}").as_bytes())
                .expect("a"),
        );
        ids.push(
            b.append_stream("shared", format!("b{i}").as_bytes())
                .expect("b"),
        );
    }
    let ids: Vec<u64> = ids.iter().map(|id| id.0).collect();
    assert_eq!(ids, (1..=100).collect::<Vec<_>>());
    // Only each writer's first append reads; a stale head costs one more
    // transaction per append (two in all), still fewer calls than a read
    // before every write would take.
    let ranges = common::etcd_calls(&server.endpoint(), "Range") - ranges;
    let txns = common::etcd_calls(&server.endpoint(), "Txn") - txns;
    assert!(ranges <= 2, "{ranges} head reads");
    assert!(txns <= 200, "{txns} transactions");
    for (n, want) in (1..=100u64).zip((0..50).flat_map(|i| [format!("a{i}"), format!("b{i}")])) {
        let entry = reader.recv_timeout(WAIT).expect("an entry");
        assert_eq!((entry.id.0, entry.payload), (n, want.into_bytes()));
    }
}
