//! Appends on etcd cost one round trip once the coordinator knows the
//! stream's head, and a head another writer moved costs a failed
//! transaction (whose answer shows the new head), never a wrong ID. The
//! request counts are etcd's own (`/metrics`), not the client's word.
//! Threads and handles sharing a stream never fail for contention.

mod common;

use fleetcoord::coordinator::{Coordinator, EtcdCoordinator, StreamPosition};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn a_writer_appending_in_turn_reads_the_head_once() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let coordinator = EtcdCoordinator::on_etcd(&etcd).expect("coordinator");
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
    let a = EtcdCoordinator::on_etcd(&etcd).expect("coordinator a");
    // Another process, as far as the head cache goes.
    let b = EtcdCoordinator::on_etcd(&common::connect(&server.endpoint())).expect("coordinator b");
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

/// Threads of one handle appending to one stream are batched (one
/// transaction carries what queued while the previous was in flight), so
/// they never lose races to each other: every append succeeds, IDs are
/// 1..=n without a gap or a repeat, each payload is stored once, and etcd
/// serves fewer transactions than appends.
#[test]
fn threads_of_one_handle_on_one_stream_never_contend() {
    const THREADS: usize = 16;
    const EACH: usize = 40;
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let coordinator = EtcdCoordinator::on_etcd(&etcd).expect("coordinator");
    let txns = common::etcd_calls(&server.endpoint(), "Txn");
    let ids: Vec<(u64, String)> = on_threads(THREADS, |t| {
        (0..EACH)
            .map(|i| {
                let payload = format!("t{t}-{i}");
                let id = coordinator
                    .append_stream("busy", payload.as_bytes())
                    .unwrap_or_else(|e| panic!("append {payload}: {e}"));
                (id.0, payload)
            })
            .collect()
    });
    let txns = common::etcd_calls(&server.endpoint(), "Txn") - txns;
    let total = (THREADS * EACH) as u64;
    let mut seen: Vec<u64> = ids.iter().map(|(id, _)| *id).collect();
    seen.sort_unstable();
    assert_eq!(seen, (1..=total).collect::<Vec<_>>(), "every ID once");
    let stored = read_all(&coordinator, "busy", total as usize);
    for (id, payload) in &ids {
        assert_eq!(
            stored.get(id).map(String::as_str),
            Some(payload.as_str()),
            "entry {id}"
        );
    }
    assert!(
        txns < total,
        "{txns} transactions for {total} appends: nothing was batched"
    );
    println!("{total} appends from {THREADS} threads in {txns} transactions");
}

/// Four handles (as four processes would) with four threads each on one
/// stream: the handles race, but as four appenders, which the retry
/// absorbs: no append fails.
#[test]
fn four_handles_with_four_threads_each_on_one_stream_never_fail() {
    const HANDLES: usize = 4;
    const THREADS: usize = 4;
    const EACH: usize = 25;
    let server = common::start_etcd();
    let coordinators: Vec<EtcdCoordinator> = (0..HANDLES)
        .map(|_| EtcdCoordinator::on_etcd(&common::connect(&server.endpoint())).expect("coordinator"))
        .collect();
    let ids: Vec<u64> = on_threads(HANDLES * THREADS, |w| {
        let coordinator = &coordinators[w % HANDLES];
        (0..EACH)
            .map(|i| {
                coordinator
                    .append_stream("shared", format!("w{w}-{i}").as_bytes())
                    .unwrap_or_else(|e| panic!("append w{w}-{i}: {e}"))
                    .0
            })
            .collect()
    });
    let total = (HANDLES * THREADS * EACH) as u64;
    let mut ids = ids;
    ids.sort_unstable();
    assert_eq!(ids, (1..=total).collect::<Vec<_>>(), "every ID once");
    assert_eq!(
        read_all(&coordinators[0], "shared", total as usize).len() as u64,
        total
    );
}

/// What `work(i)` returns on each of `n` threads, concatenated.
fn on_threads<T: Send>(n: usize, work: impl Fn(usize) -> Vec<T> + Sync) -> Vec<T> {
    std::thread::scope(|scope| {
        let work = &work;
        let workers: Vec<_> = (0..n).map(|i| scope.spawn(move || work(i))).collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect()
    })
}

/// The first `n` entries of `stream`, by ID.
fn read_all(
    coordinator: &EtcdCoordinator,
    stream: &str,
    n: usize,
) -> std::collections::BTreeMap<u64, String> {
    let reader = coordinator
        .read_stream(stream, StreamPosition::Start)
        .expect("reader");
    let mut stored = std::collections::BTreeMap::new();
    while stored.len() < n {
        let entry = reader.recv_timeout(WAIT).expect("entry");
        stored.insert(entry.id.0, String::from_utf8(entry.payload).expect("utf-8"));
    }
    stored
}
