//! Prefixes far larger than the client's 4 MiB answer limit: every prefix
//! read (HostWatcher's snapshot, `kv_watch`'s, `list_hosts`) is paginated
//! at one revision, so each of them sees every key. Before pagination the
//! one big read was refused ("decoded message length too large") and the
//! watch retried it forever without a word.

mod common;

use fleetcoord::coordinator::{Coordinator, EtcdCoordinator, KvEvent, StreamPosition};
use fleetcoord::{list_hosts, Election, HostEvent, HostInfo, HostWatcher, TxnOp};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// 12,000 × 512 B = 6 MiB of values (plus keys) per prefix, unless
/// `FLEETCOORD_SCALE_KEYS` says otherwise (`make scale`: 50,000 hosts =
/// 25 MB, and as many KV keys and stream entries).
fn keys() -> usize {
    std::env::var("FLEETCOORD_SCALE_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12_000)
}
const VALUE_LEN: usize = 512;
const OPS_PER_TXN: usize = 128;
const WAIT: Duration = Duration::from_secs(60);

fn peak_rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(str::to_string)
        })
        .unwrap_or_else(|| "VmHWM: unknown".into())
}

/// Host `i`'s incarnation, written with its key (as `HostLiveness` does,
/// at one revision) for two hosts in three, so that page boundaries fall
/// between hosts with and without one: 0 for the others.
fn incarnation(i: usize) -> u64 {
    if i.is_multiple_of(3) {
        0
    } else {
        (i % 7) as u64 + 1
    }
}

fn value(i: usize) -> Vec<u8> {
    let mut v = format!("{i:08}:").into_bytes();
    v.resize(VALUE_LEN, b'x');
    v
}

#[test]
fn snapshots_over_the_message_limit_are_read_in_pages() {
    // etcd's default 2 GiB backend quota holds the 50,000-key run easily.
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    #[allow(non_snake_case)]
    let KEYS = keys();
    let election = Election::new(&etcd, "large-snapshots-writer").expect("election");
    let leadership = election.campaign(b"writer").expect("campaign");
    let ids: Vec<Uuid> = (0..KEYS).map(|_| Uuid::new_v4()).collect();
    let started = Instant::now();
    // Up to two puts per host: half as many hosts per transaction.
    let hosts_per_txn = OPS_PER_TXN / 2;
    for (chunk_no, chunk) in ids.chunks(hosts_per_txn).enumerate() {
        let ops = chunk.iter().enumerate().flat_map(|(j, id)| {
            let i = chunk_no * hosts_per_txn + j;
            let key = format!("/coord/hosts/{id}");
            let joined = (incarnation(i) > 0).then(|| {
                TxnOp::put(
                    format!("{key}/incarnation"),
                    incarnation(i).to_string().into_bytes(),
                )
            });
            joined.into_iter().chain([TxnOp::put(key, value(i))])
        });
        assert!(leadership.txn_if_leader(ops).expect("txn").is_some());
    }
    for chunk_no in 0..KEYS / OPS_PER_TXN + 1 {
        let ops: Vec<TxnOp> = (chunk_no * OPS_PER_TXN..((chunk_no + 1) * OPS_PER_TXN).min(KEYS))
            .map(|i| TxnOp::put(format!("/coord/kv/big/k{i:06}"), value(i)))
            .collect();
        if !ops.is_empty() {
            assert!(leadership.txn_if_leader(ops).expect("txn").is_some());
        }
    }
    eprintln!(
        "wrote 2 × {KEYS} keys of {VALUE_LEN} B in {:?}",
        started.elapsed()
    );

    // HostWatcher: every host Up, then Synced; the default channel (4,096)
    // is smaller than the snapshot, so this also pauses and resumes it.
    let t = Instant::now();
    let watcher = HostWatcher::watch(&etcd).expect("watch");
    let mut view: HashMap<Uuid, HostInfo> = HashMap::new();
    loop {
        match watcher.events().recv_timeout(WAIT).expect("an event") {
            HostEvent::Synced => break,
            event => common::apply(&mut view, event),
        }
    }
    assert_eq!(view.len(), KEYS);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(view[id].metadata, value(i));
        assert_eq!(view[id].incarnation, incarnation(i), "host {i}");
    }
    eprintln!(
        "HostWatcher synced {} hosts in {:?}",
        view.len(),
        t.elapsed()
    );
    // Live after the snapshot.
    let late = Uuid::new_v4();
    assert!(leadership
        .txn_if_leader([TxnOp::put(format!("/coord/hosts/{late}"), b"late".to_vec())])
        .expect("txn")
        .is_some());
    match watcher.events().recv_timeout(WAIT).expect("an event") {
        HostEvent::Up(info) => assert_eq!(info.id, late),
        other => panic!("expected Up for the late host, got {other:?}"),
    }

    // list_hosts: all of them, at one revision.
    let t = Instant::now();
    let listed = list_hosts(&etcd, "/coord/hosts/").expect("list_hosts");
    assert_eq!(listed.len(), KEYS + 1);
    let by_id: HashMap<Uuid, u64> = listed.iter().map(|h| (h.id, h.incarnation)).collect();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(by_id[id], incarnation(i), "host {i}");
    }
    eprintln!(
        "list_hosts listed {} hosts in {:?}",
        listed.len(),
        t.elapsed()
    );

    // kv_watch over a > 5 MiB bucket returns, replays every key and syncs.
    let t = Instant::now();
    let coordinator = EtcdCoordinator::on_etcd(&etcd).expect("coordinator");
    let watch = coordinator.kv_watch("big", "*").expect("kv_watch");
    let mut kv: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    loop {
        match watch.recv_timeout(WAIT).expect("a kv event") {
            KvEvent::Synced => break,
            KvEvent::Put { key, value } => {
                assert!(kv.insert(key, value).is_none(), "a key twice");
            }
            other => panic!("unexpected {other:?} before Synced"),
        }
    }
    assert_eq!(kv.len(), KEYS);
    assert_eq!(kv["k000042"], value(42));
    eprintln!("kv_watch synced {} keys in {:?}", kv.len(), t.elapsed());
    coordinator.kv_set("big", "after", b"1").expect("kv_set");
    assert_eq!(
        watch.recv_timeout(WAIT).expect("a kv event"),
        KvEvent::Put {
            key: "after".into(),
            value: b"1".to_vec()
        }
    );

    // read_stream(Start) over a stream larger than one answer. Appends
    // go one at a time (each is a round trip), so the default run keeps the
    // stream at 1,000 entries (4 pages); `make scale` appends
    // 40,000 (20 MB).
    let entries = if KEYS > 12_000 { 40_000 } else { 1_000 };
    let t = Instant::now();
    for i in 0..entries {
        coordinator.append_stream("big", &value(i)).expect("append");
    }
    eprintln!("appended {entries} entries in {:?}", t.elapsed());
    let t = Instant::now();
    let reader = coordinator
        .read_stream("big", StreamPosition::Start)
        .expect("read_stream");
    for n in 1..=entries as u64 {
        let entry = reader.recv_timeout(WAIT).expect("an entry");
        assert_eq!(entry.id.0, n, "every entry once, in order");
        assert_eq!(entry.payload, value(n as usize - 1));
    }
    assert!(reader.recv_timeout(Duration::from_millis(200)).is_err());
    eprintln!(
        "read_stream replayed {entries} entries in {:?}",
        t.elapsed()
    );
    eprintln!("peak RSS: {}", peak_rss());
}

/// One transaction of 6 × 1 MiB is one revision, and etcd sends all of a
/// revision's events in one watch response (it fragments only when the
/// client asks, which etcd-client cannot): ~6 MiB, over tonic's default
/// 4 MiB receive limit. The live watches of HostWatcher and `kv_watch`
/// must take it as it comes, not refuse it and fall back to a resync.
#[test]
fn a_single_watch_response_over_the_message_limit_is_delivered() {
    const BIG: usize = 1 << 20;
    const PER_TXN: usize = 6;
    // etcd refuses requests over 1.5 MiB by default; the txn is ~6 MiB.
    let server = fleetcoord::testing::EtcdBuilder::new()
        .arg("--max-request-bytes=33554432")
        .start()
        .expect("etcd (install with `make deps-etcd`)");
    let etcd = common::connect(&server.endpoint());
    let big = |i: usize| {
        let mut v = format!("{i:08}:").into_bytes();
        v.resize(BIG, b'y');
        v
    };

    let watcher = HostWatcher::watch(&etcd).expect("watch");
    assert_eq!(
        watcher.events().recv_timeout(WAIT).expect("Synced"),
        HostEvent::Synced
    );
    let coordinator = EtcdCoordinator::on_etcd(&etcd).expect("coordinator");
    let watch = coordinator.kv_watch("bigrev", "*").expect("kv_watch");
    assert_eq!(watch.recv_timeout(WAIT).expect("Synced"), KvEvent::Synced);

    // The live watch may open just after `Synced`: wait for both.
    let deadline = Instant::now() + WAIT;
    while common::etcd_calls(&server.endpoint(), "Watch") < 2 {
        assert!(Instant::now() < deadline, "the two watches never opened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ids: Vec<Uuid> = (0..PER_TXN).map(|_| Uuid::new_v4()).collect();
    // fleetcoord refuses requests over etcd's default limit, so the big
    // transactions go through etcd-client directly.
    let hosts = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (format!("/coord/hosts/{id}"), big(i)));
    let keys = (0..PER_TXN).map(|i| (format!("/coord/kv/bigrev/k{i}"), big(i)));
    raw_txn(&server.endpoint(), hosts.chain(keys).collect(), PER_TXN);

    let mut up = HashMap::new();
    while up.len() < PER_TXN {
        match watcher.events().recv_timeout(WAIT) {
            Ok(HostEvent::Up(info)) => {
                assert!(up.insert(info.id, info.metadata).is_none(), "Up twice");
            }
            other => panic!("expected {PER_TXN} × Up, got {other:?} after {}", up.len()),
        }
    }
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(up[id], big(i));
    }
    let mut kv = BTreeMap::new();
    while kv.len() < PER_TXN {
        match watch.recv_timeout(WAIT) {
            Ok(KvEvent::Put { key, value }) => {
                assert!(kv.insert(key, value).is_none(), "a key twice");
            }
            other => panic!("expected {PER_TXN} puts, got {other:?} after {}", kv.len()),
        }
    }
    assert_eq!(kv["k3"], big(3));
    // Delivered by the watches that were open, not by a resync: a refused
    // response ends the watch stream and the machines open a new one
    // after reading the prefix again, which the diff would hide.
    assert!(watcher
        .events()
        .recv_timeout(Duration::from_millis(500))
        .is_err());
    assert!(watch.recv_timeout(Duration::from_millis(500)).is_err());
    assert_eq!(
        common::etcd_calls(&server.endpoint(), "Watch"),
        2,
        "a watch stream was opened again"
    );
}

/// Puts `kvs` in transactions of `per_txn` puts each, with etcd-client.
fn raw_txn(endpoint: &str, kvs: Vec<(String, Vec<u8>)>, per_txn: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let options = etcd_client::ConnectOptions::new().with_connect_timeout(WAIT);
        let mut client = etcd_client::Client::connect([endpoint], Some(options))
            .await
            .expect("etcd-client connect");
        for chunk in kvs.chunks(per_txn) {
            let ops: Vec<etcd_client::TxnOp> = chunk
                .iter()
                .map(|(k, v)| etcd_client::TxnOp::put(k.as_str(), v.clone(), None))
                .collect();
            client
                .txn(etcd_client::Txn::new().and_then(ops))
                .await
                .expect("txn");
        }
    });
}
