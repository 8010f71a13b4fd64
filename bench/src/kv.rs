//! put / get: `EtcdCoordinator::kv_set` / `kv_get` (one etcd put / range
//! through the driver thread) vs etcd-client `put` / `get`, twice: on a
//! one-worker runtime (a thread hop, as the driver has) and on a
//! current-thread runtime driven by the caller's `block_on` (no hop: the
//! cheapest a plain-thread program would write). And a fenced write:
//! `Leadership::txn_if_leader` with one put vs the same transaction (the
//! leader key's create revision compared with the token, then the put)
//! through etcd-client on the calling thread.

use crate::raw::Raw;
use crate::report::{latency_row as row, Row};
use crate::stats::interleave;
use crate::{Config, Res};
use fleetcoord::coordinator::{Coordinator, EtcdCoordinator};
use fleetcoord::{Election, Etcd, EtcdOptions, TxnOp};
use std::time::Instant;

type Samples = Vec<std::time::Duration>;

/// `kv_set` and `kv_get` interleaved with etcd-client's `put` and `get` on
/// `anchor`: (ours put, anchor put, ours get, anchor get).
fn put_get(
    n: usize,
    coord: &EtcdCoordinator,
    anchor: &Raw,
    value: &[u8],
) -> Res<(Samples, Samples, Samples, Samples)> {
    let (ours_put, raw_put) = interleave(
        n,
        |_| {
            let t = Instant::now();
            coord.kv_set("bench", "k", value)?;
            Ok(t.elapsed())
        },
        |_| {
            let mut c = anchor.client();
            let t = Instant::now();
            anchor.block_on(c.put("/bench/raw/k", value.to_vec(), None))?;
            Ok(t.elapsed())
        },
    )?;
    let (ours_get, raw_get) = interleave(
        n,
        |_| {
            let t = Instant::now();
            let got = coord.kv_get("bench", "k")?;
            let d = t.elapsed();
            check(got.len() == value.len())?;
            Ok(d)
        },
        |_| {
            let mut c = anchor.client();
            let t = Instant::now();
            let got = anchor.block_on(c.get("/bench/raw/k", None))?;
            let d = t.elapsed();
            check(got.kvs().len() == 1)?;
            Ok(d)
        },
    )?;
    Ok((ours_put, raw_put, ours_get, raw_get))
}

/// `txn_if_leader` with one put, interleaved with the same transaction
/// through etcd-client on `anchor`: (ours, anchor).
fn fenced(n: usize, etcd: &Etcd, anchor: &Raw, value: &[u8]) -> Res<(Samples, Samples)> {
    let election = Election::new(etcd, "bench-fenced")?;
    let leadership = election.campaign(b"bench")?;
    let key = leadership.key().to_string();
    let token = leadership.fencing_token();
    let out = interleave(
        n,
        |_| {
            let t = Instant::now();
            let done = leadership.txn_if_leader([TxnOp::put("/bench/fenced/k", value.to_vec())])?;
            let d = t.elapsed();
            check(done.is_some())?;
            Ok(d)
        },
        |_| {
            use etcd_client::{Compare, CompareOp, Txn, TxnOp as RawOp};
            let mut c = anchor.client();
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    token,
                )])
                .and_then([RawOp::put("/bench/fenced/raw", value.to_vec(), None)]);
            let t = Instant::now();
            let r = anchor.block_on(c.txn(txn))?;
            let d = t.elapsed();
            check(r.succeeded())?;
            Ok(d)
        },
    )?;
    leadership.resign()?;
    Ok(out)
}

pub fn run(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(1000, 20);
    let etcd = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let coord = EtcdCoordinator::on_etcd(&etcd)?;
    let value = vec![b'v'; 100];
    let one_worker = Raw::connect(&cfg.endpoint)?;
    let (ours_put, raw_put, ours_get, raw_get) = put_get(n, &coord, &one_worker, &value)?;
    let caller = Raw::connect_on_caller(&cfg.endpoint)?;
    let (ours_put_c, caller_put, ours_get_c, caller_get) = put_get(n, &coord, &caller, &value)?;
    let (ours_txn, caller_txn) = fenced(n, &etcd, &caller, &value)?;
    coord.close()?;
    etcd.close()?;
    Ok(vec![
        row(
            "put (100 B), anchor on the calling thread",
            "kv_set",
            &ours_put_c,
            "etcd-client put, current-thread block_on",
            &caller_put,
        )?,
        row(
            "get (100 B), anchor on the calling thread",
            "kv_get",
            &ours_get_c,
            "etcd-client get, current-thread block_on",
            &caller_get,
        )?,
        row(
            "fenced put (100 B), anchor on the calling thread",
            "txn_if_leader",
            &ours_txn,
            "etcd-client txn (create revision = token, put), current-thread block_on",
            &caller_txn,
        )?,
        row(
            "put (100 B)",
            "kv_set",
            &ours_put,
            "etcd-client put",
            &raw_put,
        )?,
        row(
            "get (100 B)",
            "kv_get",
            &ours_get,
            "etcd-client get",
            &raw_get,
        )?,
    ])
}

fn check(ok: bool) -> Res<()> {
    if ok {
        Ok(())
    } else {
        Err("read back the wrong value".into())
    }
}
