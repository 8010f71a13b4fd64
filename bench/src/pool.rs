//! ElectionPool with 1,000 names vs a naive loop that grants a lease per
//! campaign: campaign+resign cycle time, CPU, leases; and the idle cost
//! (CPU, memory) of the pool's 1,000 sessions vs 1,000 raw leases kept
//! alive by the cheapest loop. Cycling and memory: each side in a child
//! process of its own, alternating; idle CPU: alternating phases of one
//! child (`child-liveness-cpu`).

use crate::process;
use crate::raw::{self, Raw};
use crate::report::{latency_row, Row, Side};
use crate::stats;
use crate::{Config, Res};
use etcd_client::ResignOptions;
use fleetcoord::{ElectionOptions, ElectionPool, Etcd, EtcdOptions};
use std::time::{Duration, Instant};

const TTL: u64 = 10;

pub fn run(cfg: &Config) -> Res<Vec<Row>> {
    let names = cfg.samples(1000, 20);
    let window = if cfg.quick { 2 } else { cfg.pool_secs };
    let rounds = if cfg.quick { 1 } else { 2 };
    // The window is split over the rounds.
    let busy_ms = window * 1000 / rounds;
    let mut cycles = [Vec::new(), Vec::new()];
    // cpu_ms, cycles, grants, leases alive
    let mut acc = [[0.0f64; 2]; 4];
    for round in 0..rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let out = process::run_child(&[
                "child-pool".into(),
                cfg.endpoint.clone(),
                ["fleetcoord", "naive"][side].into(),
                names.to_string(),
                busy_ms.to_string(),
            ])?;
            for (i, key) in ["cpu_ms", "cycles", "grants", "leases"].iter().enumerate() {
                acc[i][side] += process::field(&out, key)?;
            }
            cycles[side].extend(out.samples);
        }
    }
    // Memory per name: a fresh process per side, so that neither the
    // cycling nor the other side's heap mixes in.
    let mut mem = [0.0f64; 2];
    for round in 0..rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let out = process::run_child(&[
                "child-pool-memory".into(),
                cfg.endpoint.clone(),
                ["fleetcoord", "raw"][side].into(),
                names.to_string(),
            ])?;
            mem[side] += process::field(&out, "rss_delta")?;
        }
    }
    let pct = |cpu: f64, ms: f64| cpu / ms * 100.0;
    let per_name_mem = |side: usize| mem[side] / rounds as f64 / names as f64 / 1024.0;
    // Idle CPU: the pool and the cheapest raw loop (one client driven by
    // `block_on` on the calling thread, a keepalive task per lease), as
    // alternating phases A B A B of one child process.
    let idle_secs = if cfg.quick { 1 } else { 10 };
    let mut idle_rows = Vec::new();
    let raw = Raw::connect(&cfg.endpoint)?;
    for ttl in [3u64, 5] {
        let prefix = format!("/bench/pool-idle/ttl{ttl}/");
        let out = process::run_child(&[
            "child-liveness-cpu".into(),
            cfg.endpoint.clone(),
            names.to_string(),
            ttl.to_string(),
            idle_secs.to_string(),
            rounds.to_string(),
            prefix.clone(),
            "pool,raw".into(),
        ])?;
        raw.delete_prefix(&prefix)?;
        let window_ms = (idle_secs * rounds * 1000) as f64;
        idle_rows.push(Row::new(
            format!("{names} names, TTL {ttl} s: idle CPU holding {names} sessions"),
            Side::amount(
                format!("ElectionPool, {names} names"),
                pct(process::field(&out, "pool_cpu_ms")?, window_ms),
                "% of a core",
            ),
            Some(Side::amount(
                format!("{names} raw leases, a keepalive task each, one client"),
                pct(process::field(&out, "raw_cpu_ms")?, window_ms),
                "% of a core",
            )),
        ));
    }
    let busy_total = (busy_ms * rounds) as f64;
    let ours = format!("ElectionPool, {names} names");
    let naive = "naive: grant, campaign, resign, revoke";
    let k = format!("{names} names");
    let mut rows = vec![
        latency_row(
            &format!("{k}: campaign + resign cycle"),
            &ours,
            &cycles[0],
            naive,
            &cycles[1],
        )?,
        Row::new(
            format!("{k}: CPU while cycling ({} s)", busy_total / 1000.0),
            Side::amount(&ours, pct(acc[0][0], busy_total), "% of a core"),
            Some(Side::amount(
                naive,
                pct(acc[0][1], busy_total),
                "% of a core",
            )),
        ),
        Row::new(
            format!("{k}: CPU per cycle"),
            Side::amount(&ours, acc[0][0] * 1000.0 / acc[1][0].max(1.0), "µs"),
            Some(Side::amount(
                naive,
                acc[0][1] * 1000.0 / acc[1][1].max(1.0),
                "µs",
            )),
        ),
        Row::new(
            format!("{k}: cycles completed ({} s)", busy_total / 1000.0),
            Side::amount(&ours, acc[1][0], "cycles"),
            Some(Side::amount(naive, acc[1][1], "cycles")),
        ),
        Row::new(
            format!("{k}: leases granted while cycling"),
            Side::amount(&ours, acc[2][0], "grants"),
            Some(Side::amount(naive, acc[2][1], "grants")),
        ),
        Row::new(
            format!("{k}: distinct leases used per run (warm-up sweep + window)"),
            Side::amount(&ours, acc[3][0] / rounds as f64, "leases"),
            Some(Side::amount(naive, acc[3][1] / rounds as f64, "leases")),
        ),
        Row::new(
            format!("{k}: memory per name holding its session (VmRSS delta)"),
            Side::amount(&ours, per_name_mem(0), "KiB"),
            Some(Side::amount(
                format!("{names} raw leases, a keepalive task each, one client"),
                per_name_mem(1),
                "KiB",
            )),
        ),
    ];
    rows.extend(idle_rows);
    Ok(rows)
}

/// `child-pool-memory ENDPOINT SIDE NAMES`: the VmRSS growth of holding
/// NAMES idle sessions — a pool after one campaign + resign per name (what
/// the pool keeps per name: its election and session), or NAMES raw leases
/// each with a keepalive task — from before the first one until every
/// session has renewed at least once (half a TTL after the last: a session
/// renews after a third of it; its renewal stream is opened then).
pub fn child_pool_memory(args: &[String]) -> Res<()> {
    let [endpoint, side, names] = args else {
        return Err("usage: child-pool-memory ENDPOINT fleetcoord|raw NAMES".into());
    };
    let names: Vec<String> = (0..names.parse::<usize>()?)
        .map(|i| format!("pool-{i}"))
        .collect();
    let settle = Duration::from_secs(TTL / 2);
    match side.as_str() {
        "fleetcoord" => {
            let etcd = Etcd::with_options(&[endpoint.as_str()], EtcdOptions::default())?;
            let options = ElectionOptions::default()
                .with_prefix("/bench/pool-memory/")
                .with_ttl(Duration::from_secs(TTL));
            let rss0 = stats::status_bytes("VmRSS")?;
            let pool = ElectionPool::with_options(&etcd, options);
            for name in &names {
                pool.campaign(name, b"me")?.resign()?;
            }
            std::thread::sleep(settle);
            let rss = stats::status_bytes("VmRSS")?;
            process::print_result(&[("rss_delta", rss.saturating_sub(rss0) as f64)]);
            pool.close()?;
        }
        "raw" => {
            // The cheapest loop: one client driven by `block_on` on this
            // thread, a keepalive task per lease.
            let raw = Raw::connect_on_caller(endpoint)?;
            let mut c = raw.client();
            let rss0 = stats::status_bytes("VmRSS")?;
            raw.block_on(async {
                let mut keepers = Vec::with_capacity(names.len());
                for _ in &names {
                    let lease = c.lease_grant(TTL as i64, None).await?.id();
                    keepers.push(tokio::spawn(raw::keep_alive(c.clone(), lease, TTL as i64)));
                }
                tokio::time::sleep(settle).await;
                let rss = stats::status_bytes("VmRSS")?;
                process::print_result(&[("rss_delta", rss.saturating_sub(rss0) as f64)]);
                for k in &keepers {
                    k.abort();
                }
                Ok::<(), crate::BoxError>(())
            })?;
        }
        other => return Err(format!("unknown side {other:?}").into()),
    }
    Ok(())
}

/// `child-pool ENDPOINT SIDE NAMES BUSY_MS`: one warm-up sweep over the
/// names, then campaign+resign round-robin for BUSY_MS (CPU, cycles,
/// grants).
pub fn child_pool(args: &[String]) -> Res<()> {
    let [endpoint, side, names, busy_ms] = args else {
        return Err("usage: child-pool ENDPOINT fleetcoord|naive NAMES BUSY_MS".into());
    };
    let names: Vec<String> = (0..names.parse::<usize>()?)
        .map(|i| format!("pool-{i}"))
        .collect();
    let busy = Duration::from_millis(busy_ms.parse()?);
    let raw = Raw::connect(endpoint)?;
    let mut samples = Vec::new();
    let (cpu, grants) = match side.as_str() {
        "fleetcoord" => {
            let etcd = Etcd::with_options(&[endpoint.as_str()], EtcdOptions::default())?;
            let options = ElectionOptions::default()
                .with_prefix("/bench/pool/")
                .with_ttl(Duration::from_secs(TTL));
            let pool = ElectionPool::with_options(&etcd, options);
            // Every lease a campaign ran on: a lease not seen in the warm-up
            // sweep is one the pool granted while cycling.
            let mut seen = std::collections::HashSet::new();
            for name in &names {
                let l = pool.campaign(name, b"me")?;
                seen.insert(l.lease());
                l.resign()?;
            }
            let mut grants = 0usize;
            let cpu0 = stats::cpu_time()?;
            let end = Instant::now() + busy;
            for name in names.iter().cycle() {
                if Instant::now() >= end {
                    break;
                }
                let t = Instant::now();
                let l = pool.campaign(name, b"me")?;
                let lease = l.lease();
                l.resign()?;
                samples.push(t.elapsed());
                if seen.insert(lease) {
                    grants += 1;
                }
            }
            let cpu = stats::cpu_time()?.saturating_sub(cpu0);
            process::print_result(&[
                ("cpu_ms", cpu.as_secs_f64() * 1000.0),
                ("cycles", samples.len() as f64),
                ("grants", grants as f64),
                ("leases", seen.len() as f64),
            ]);
            process::print_samples(&samples);
            pool.close()?;
            return Ok(());
        }
        "naive" => {
            let cycle = |name: &str| -> Res<()> {
                let mut c = raw.client();
                raw.block_on(async {
                    let lease = c.lease_grant(TTL as i64, None).await?.id();
                    let mut resp = c
                        .campaign(format!("/bench/naive/{name}"), "me", lease)
                        .await?;
                    let leader = resp.take_leader().ok_or("campaign without a leader key")?;
                    c.resign(Some(ResignOptions::new().with_leader(leader)))
                        .await?;
                    c.lease_revoke(lease).await?;
                    Ok::<(), crate::BoxError>(())
                })
            };
            for name in &names {
                cycle(name)?;
            }
            let cpu0 = stats::cpu_time()?;
            let end = Instant::now() + busy;
            for name in names.iter().cycle() {
                if Instant::now() >= end {
                    break;
                }
                let t = Instant::now();
                cycle(name)?;
                samples.push(t.elapsed());
            }
            let cpu = stats::cpu_time()?.saturating_sub(cpu0);
            (cpu, samples.len())
        }
        other => return Err(format!("unknown side {other:?}").into()),
    };
    process::print_result(&[
        ("cpu_ms", cpu.as_secs_f64() * 1000.0),
        ("cycles", samples.len() as f64),
        ("grants", grants as f64),
        // Every cycle, warm-up included, granted its own lease.
        ("leases", (names.len() + grants) as f64),
    ]);
    process::print_samples(&samples);
    Ok(())
}
