//! Throughput under concurrency on one etcd coordinator handle: T threads
//! calling `kv_set`, `publish`, and `append_stream` (to one stream, and
//! spread over four), T = 1, 4, 16, each for a fixed window, beside
//! etcd-client `put` from T tasks on one client (a two-worker runtime, one
//! per core: the fastest the raw client goes here). Sides alternate per T
//! so machine noise hits both. Every error is counted and reported in the
//! row's label; a contended append is an error.

use crate::raw::Raw;
use crate::report::{Row, Side};
use crate::{Config, Res};
use fleetcoord::coordinator::{Coordinator, EtcdCoordinator};
use fleetcoord::{Etcd, EtcdOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const THREADS: [usize; 3] = [1, 4, 16];

/// One operation of a row, given the thread's number and its count so far.
type Op<'a> = Box<dyn Fn(usize, u64) -> fleetcoord::Result<()> + Sync + 'a>;

/// ops/s and errors of T threads each running `op(thread, i)` for `window`.
fn threads(
    t: usize,
    window: Duration,
    op: &(dyn Fn(usize, u64) -> fleetcoord::Result<()> + Sync),
) -> (f64, u64) {
    let done = AtomicU64::new(0);
    let errors = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..t {
            let (done, errors) = (&done, &errors);
            scope.spawn(move || {
                let mut i = 0u64;
                while start.elapsed() < window {
                    i += 1;
                    match op(thread, i) {
                        Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    (
        done.load(Ordering::Relaxed) as f64 / secs,
        errors.load(Ordering::Relaxed),
    )
}

/// etcd-client `put` ops/s from `t` tasks on one client for `window`.
fn raw_puts(raw: &Raw, t: usize, window: Duration) -> Res<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..t)
        .map(|task| {
            let mut client = raw.client();
            let done = done.clone();
            raw.spawn(async move {
                let mut i = 0u64;
                while start.elapsed() < window {
                    i += 1;
                    let key = format!("/bench/conc-raw/{task}");
                    if client.put(key, i.to_string(), None).await.is_ok() {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        raw.block_on(task)?;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

pub fn run(cfg: &Config) -> Res<Vec<Row>> {
    let window = if cfg.quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(3)
    };
    let raw = Raw::connect_workers(&cfg.endpoint, 2)?;
    let etcd = Etcd::connect(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let coord = EtcdCoordinator::new(&etcd)?;
    let coord = &coord;
    let run_id = std::process::id();
    let mut rows = Vec::new();
    for t in THREADS {
        let anchor = raw_puts(&raw, t, window)?;
        let anchor_side = || {
            Some(Side::amount(
                format!("etcd-client put, {t} tasks"),
                anchor,
                "ops/s",
            ))
        };
        let ops: [(&str, Op<'_>); 4] = [
            (
                "kv_set",
                Box::new(move |thread, i| {
                    coord.kv_set("conc", &format!("k{thread}"), i.to_string().as_bytes())
                }),
            ),
            (
                "publish",
                Box::new(move |thread, i| {
                    coord.publish(&format!("conc-{thread}"), i.to_string().as_bytes())
                }),
            ),
            (
                "append_stream, 1 stream",
                Box::new(move |thread, i| {
                    coord
                        .append_stream(
                            &format!("conc-{run_id}-{t}-one"),
                            format!("{thread}-{i}").as_bytes(),
                        )
                        .map(|_| ())
                }),
            ),
            (
                "append_stream, 4 streams",
                Box::new(move |thread, i| {
                    coord
                        .append_stream(
                            &format!("conc-{run_id}-{t}-four-{}", thread % 4),
                            format!("{thread}-{i}").as_bytes(),
                        )
                        .map(|_| ())
                }),
            ),
        ];
        for (what, op) in ops.iter() {
            let (ours, errors) = threads(t, window, op.as_ref());
            eprintln!(
                "concurrency: {what} ×{t}: {ours:.0} ops/s, {errors} errors (raw {anchor:.0})"
            );
            rows.push(Row::new(
                format!("{what}, {t} thread(s)"),
                Side::amount(
                    format!("fleetcoord {what}, {t} threads, {errors} errors"),
                    ours,
                    "ops/s",
                ),
                anchor_side(),
            ));
        }
    }
    Ok(rows)
}
