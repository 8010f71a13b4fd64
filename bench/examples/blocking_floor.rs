//! What T blocking threads get from Redis `PUBLISH`, by approach, beside
//! fleetcoord's `publish` (BENCHMARKS.md, "Fourth round"): (a) fleetcoord;
//! (b) T tokio tasks on one multiplexed connection, two workers (the
//! concurrency figure's anchor); (c) T threads calling `block_on` on that
//! runtime; (d) a current-thread runtime and connection per thread; (e) a
//! blocking redis-rs connection per thread. Each row prints ops/s and this
//! process's CPU per operation. `T=1,4,16 W=3 WHICH=a,b,c,d,e` (defaults).
//!
//! `cargo run --release -p fleetcoord-bench --example blocking_floor`
use fleetcoord::coordinator::{Coordinator, RedisCoordinator};
use fleetcoord::testing::RedisServer;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn cpu() -> f64 {
    // utime and stime of this process, in clock ticks (100 a second).
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = &s[s.rfind(')').map_or(0, |i| i + 2)..];
    let f: Vec<&str> = rest.split(' ').collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn threads(t: usize, window: Duration, op: &(dyn Fn(usize, u64) -> bool + Sync)) -> f64 {
    let done = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for th in 0..t {
            let done = &done;
            s.spawn(move || {
                let mut i = 0;
                while start.elapsed() < window {
                    i += 1;
                    if op(th, i) {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = RedisServer::start()?;
    let url = server.url();
    let window = Duration::from_secs(
        std::env::var("W")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3),
    );
    let ts: Vec<usize> = std::env::var("T")
        .unwrap_or_else(|_| "1,4,16".into())
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let which = std::env::var("WHICH").unwrap_or_else(|_| "a,b,c,d,e".into());
    let coord = RedisCoordinator::connect(&url)?;
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?,
    );
    let client = redis::Client::open(url.as_str())?;
    let mux = rt.block_on(client.get_multiplexed_async_connection())?;
    for &t in &ts {
        for round in 0..2 {
            if which.contains('a') {
                let c0 = cpu();
                let w0 = Instant::now();
                let r = threads(t, window, &|th, i| {
                    coord
                        .publish(&format!("bench.topic.{th}"), i.to_string().as_bytes())
                        .is_ok()
                });
                println!(
                    "T={t} r{round} a fleetcoord publish        {r:>9.0}  cpu/op {:>6.2} us",
                    (cpu() - c0) / (r * w0.elapsed().as_secs_f64()) * 1e6
                );
            }
            if which.contains('b') {
                let c0 = cpu();
                let w0 = Instant::now();
                let done = Arc::new(AtomicU64::new(0));
                let start = Instant::now();
                let tasks: Vec<_> = (0..t)
                    .map(|th| {
                        let (done, mut c) = (done.clone(), mux.clone());
                        rt.spawn(async move {
                            let mut i = 0u64;
                            while start.elapsed() < window {
                                i += 1;
                                let mut cmd = redis::cmd("PUBLISH");
                                cmd.arg(format!("bench:topic:{th}")).arg(i.to_string());
                                if cmd.query_async::<redis::Value>(&mut c).await.is_ok() {
                                    done.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        })
                    })
                    .collect();
                for task in tasks {
                    rt.block_on(task)?;
                }
                let r = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
                println!(
                    "T={t} r{round} b raw tasks (anchor)        {r:>9.0}  cpu/op {:>6.2} us",
                    (cpu() - c0) / (r * w0.elapsed().as_secs_f64()) * 1e6
                );
            }
            if which.contains('c') {
                let c0 = cpu();
                let w0 = Instant::now();
                let r = threads(t, window, &|th, i| {
                    let mut c = mux.clone();
                    let mut cmd = redis::cmd("PUBLISH");
                    cmd.arg(format!("bench:topic:{th}")).arg(i.to_string());
                    rt.block_on(cmd.query_async::<redis::Value>(&mut c)).is_ok()
                });
                println!(
                    "T={t} r{round} c threads block_on shared   {r:>9.0}  cpu/op {:>6.2} us",
                    (cpu() - c0) / (r * w0.elapsed().as_secs_f64()) * 1e6
                );
            }
            if which.contains('d') {
                let c0 = cpu();
                let w0 = Instant::now();
                let conns = (0..t)
                    .map(|_| {
                        let crt = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()?;
                        let c = crt.block_on(client.get_multiplexed_async_connection())?;
                        Ok(std::sync::Mutex::new((crt, c)))
                    })
                    .collect::<Result<Vec<_>, Box<dyn std::error::Error>>>()?;
                let r = threads(t, window, &|th, i| {
                    let Ok(mut g) = conns[th].lock() else {
                        return false;
                    };
                    let (crt, c) = &mut *g;
                    let mut cmd = redis::cmd("PUBLISH");
                    cmd.arg(format!("bench:topic:{th}")).arg(i.to_string());
                    crt.block_on(cmd.query_async::<redis::Value>(c)).is_ok()
                });
                println!(
                    "T={t} r{round} d thread-own rt + conn      {r:>9.0}  cpu/op {:>6.2} us",
                    (cpu() - c0) / (r * w0.elapsed().as_secs_f64()) * 1e6
                );
            }
            if which.contains('e') {
                let c0 = cpu();
                let w0 = Instant::now();
                let conns: Vec<_> = (0..t)
                    .map(|_| client.get_connection().map(std::sync::Mutex::new))
                    .collect::<Result<Vec<_>, _>>()?;
                let r = threads(t, window, &|th, i| {
                    let Ok(mut c) = conns[th].lock() else {
                        return false;
                    };
                    let mut cmd = redis::cmd("PUBLISH");
                    cmd.arg(format!("bench:topic:{th}")).arg(i.to_string());
                    cmd.query::<redis::Value>(&mut *c).is_ok()
                });
                println!(
                    "T={t} r{round} e thread-own sync conn      {r:>9.0}  cpu/op {:>6.2} us",
                    (cpu() - c0) / (r * w0.elapsed().as_secs_f64()) * 1e6
                );
            }
        }
    }
    Ok(())
}
