//! Host liveness: graceful leave → Down, crash (SIGKILL) → Down, and the
//! standing cost (CPU, memory) of N hosts kept alive on one connection.

use crate::process::{self, Spawned};
use crate::raw::{self, Raw, RawEvent};
use crate::report::{latency_row, Row, Side};
use crate::stats::{self, interleave};
use crate::{Config, Res};
use crossbeam_channel::Receiver;
use etcd_client::PutOptions;
use fleetcoord::{
    Etcd, EtcdOptions, HostEvent, HostLiveness, HostWatcher, LivenessOptions, WatcherOptions,
};
use std::process::Command;
use std::time::{Duration, Instant};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(30);

/// Waits for the watcher's first event that `want` accepts.
pub fn wait_host(events: &Receiver<HostEvent>, want: impl Fn(&HostEvent) -> bool) -> Res<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = events
            .recv_timeout(left)
            .map_err(|_| "no expected host event within 30 s")?;
        if want(&e) {
            return Ok(());
        }
    }
}

/// Waits for the raw watch's event `want`.
pub fn wait_raw(events: &Receiver<RawEvent>, want: &RawEvent) -> Res<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = events
            .recv_timeout(left)
            .map_err(|_| format!("no {want:?} within 30 s"))?;
        if &e == want {
            return Ok(());
        }
    }
}

fn up(id: Uuid) -> impl Fn(&HostEvent) -> bool {
    move |e| matches!(e, HostEvent::Up(h) if h.id == id)
}

fn down(id: Uuid) -> impl Fn(&HostEvent) -> bool {
    move |e| matches!(e, HostEvent::Down(h, _) if h.id == id)
}

/// A HostWatcher on its own connection (the observer is another host),
/// past its Synced.
fn watcher(cfg: &Config, prefix: &str) -> Res<(Etcd, HostWatcher)> {
    let etcd = Etcd::connect(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let w = HostWatcher::with_options(&etcd, WatcherOptions::default().with_prefix(prefix))?;
    wait_host(w.events(), |e| *e == HostEvent::Synced)?;
    Ok((etcd, w))
}

/// `HostLiveness::close` (revoke) until a HostWatcher sees Down, vs a raw
/// `lease_revoke` until a raw watch sees the DELETE.
pub fn leave(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(200, 5);
    let ttl = Duration::from_secs(5);
    let prefix = "/bench/leave/fc/";
    let raw_prefix = "/bench/leave/raw/";
    let etcd = Etcd::connect(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let (_observer, watch) = watcher(cfg, prefix)?;
    let raw = Raw::connect(&cfg.endpoint)?;
    let raw_observer = Raw::connect(&cfg.endpoint)?;
    let raw_events = raw_observer.watch_prefix(raw_prefix)?;
    let options = LivenessOptions::default().with_prefix(prefix).with_ttl(ttl);
    let (ours, anchor) = interleave(
        n,
        |_| {
            let id = Uuid::new_v4();
            let live = HostLiveness::with_options(&etcd, id, b"{}", options.clone())?;
            wait_host(watch.events(), up(id))?;
            let t = Instant::now();
            live.close()?;
            wait_host(watch.events(), down(id))?;
            Ok(t.elapsed())
        },
        |_| {
            let key = format!("{raw_prefix}{}", Uuid::new_v4()).into_bytes();
            let mut c = raw.client();
            let lease = raw.block_on(c.lease_grant(5, None))?.id();
            raw.block_on(c.put(key.clone(), "{}", Some(PutOptions::new().with_lease(lease))))?;
            wait_raw(&raw_events, &RawEvent::Put(key.clone()))?;
            let t = Instant::now();
            raw.block_on(c.lease_revoke(lease))?;
            wait_raw(&raw_events, &RawEvent::Delete(key))?;
            Ok(t.elapsed())
        },
    )?;
    etcd.close()?;
    Ok(vec![latency_row(
        "graceful leave → Down",
        "HostLiveness::close → HostWatcher Down",
        &ours,
        "lease_revoke → watch DELETE",
        &anchor,
    )?])
}

/// SIGKILL of a `fleetcoord agent` until Down, vs SIGKILL of a raw child
/// (grant, put, keepalive every TTL/3) until the DELETE; TTL 2 s both.
/// The kill lands at the same spread of phases in the renewal cycle on
/// both sides.
pub fn crash(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(8, 1);
    let ttl_secs = 2u64;
    let prefix = "/bench/crash/fc/";
    let raw_prefix = "/bench/crash/raw/";
    let bin = process::fleetcoord_bin()?;
    let me = process::self_bin()?;
    let (_observer, watch) = watcher(cfg, prefix)?;
    let raw_observer = Raw::connect(&cfg.endpoint)?;
    let raw_events = raw_observer.watch_prefix(raw_prefix)?;
    let phase = |i: usize| Duration::from_millis(ttl_secs * 1000 / 3 * ((i * 7) % 10) as u64 / 10);
    let (ours, anchor) = interleave(
        n,
        |i| {
            let id = Uuid::new_v4();
            let mut cmd = Command::new(&bin);
            cmd.args(["--endpoints", &cfg.endpoint, "agent", "--host-id"])
                .arg(id.to_string())
                .args(["--ttl", &format!("{ttl_secs}s"), "--prefix", prefix]);
            let mut child = Spawned::start(cmd)?;
            wait_host(watch.events(), up(id))?;
            std::thread::sleep(Duration::from_millis(700) + phase(i));
            let t = Instant::now();
            child.kill()?;
            wait_host(watch.events(), down(id))?;
            Ok(t.elapsed())
        },
        |i| {
            let key = format!("{raw_prefix}{}", Uuid::new_v4());
            let mut cmd = Command::new(&me);
            cmd.args([
                "child-raw-agent",
                &cfg.endpoint,
                &key,
                &ttl_secs.to_string(),
            ]);
            let mut child = Spawned::start(cmd)?;
            wait_raw(&raw_events, &RawEvent::Put(key.clone().into_bytes()))?;
            std::thread::sleep(Duration::from_millis(700) + phase(i));
            let t = Instant::now();
            child.kill()?;
            wait_raw(&raw_events, &RawEvent::Delete(key.into_bytes()))?;
            Ok(t.elapsed())
        },
    )?;
    Ok(vec![latency_row(
        "crash (SIGKILL) → Down, TTL 2 s",
        "`fleetcoord agent` → HostWatcher Down",
        &ours,
        "raw child (grant, put, keepalive) → watch DELETE",
        &anchor,
    )?])
}

/// `child-raw-agent ENDPOINT KEY TTL`: a raw host that lives until killed.
pub fn child_raw_agent(args: &[String]) -> Res<()> {
    let [endpoint, key, ttl] = args else {
        return Err("usage: child-raw-agent ENDPOINT KEY TTL_SECS".into());
    };
    let ttl: i64 = ttl.parse()?;
    let raw = Raw::connect(endpoint)?;
    let mut c = raw.client();
    let lease = raw.block_on(c.lease_grant(ttl, None))?.id();
    raw.block_on(c.put(
        key.as_str(),
        "{}",
        Some(PutOptions::new().with_lease(lease)),
    ))?;
    raw.block_on(raw::keep_alive(c, lease, ttl))?;
    Ok(())
}

/// N hosts on one connection: fleetcoord's N HostLiveness on one `Etcd`
/// vs N raw leases each with a keepalive task, each side in its own child
/// process (so memory does not mix), alternating.
pub fn many(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(1000, 20);
    let secs = if cfg.quick { 1 } else { 10 };
    let rounds = if cfg.quick { 1 } else { 2 };
    let raw = Raw::connect(&cfg.endpoint)?;
    let mut cpu = [0.0f64; 2];
    let mut mem = [0.0f64; 2];
    let mut setup = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let name = ["fleetcoord", "raw"][side];
            let prefix = format!("/bench/many/{name}/");
            let r = process::run_child(&[
                "child-liveness".into(),
                cfg.endpoint.clone(),
                name.into(),
                n.to_string(),
                secs.to_string(),
                prefix.clone(),
            ])?;
            cpu[side] += process::field(&r, "cpu_ms")?;
            mem[side] += process::field(&r, "rss_delta")?;
            setup[side].push(Duration::from_secs_f64(
                process::field(&r, "setup_ms")? / 1000.0,
            ));
            raw.delete_prefix(&prefix)?;
        }
    }
    let window_ms = (secs * rounds * 1000) as f64;
    // CPU per host as µs of CPU per second of wall time.
    let per_host_cpu = |side: usize| cpu[side] * 1000.0 / window_ms * 1000.0 / n as f64;
    let per_host_mem = |side: usize| mem[side] / rounds as f64 / n as f64 / 1024.0;
    let label = format!("{n} HostLiveness on one Etcd");
    let raw_label = format!("{n} raw leases + keepalive tasks, one client");
    Ok(vec![
        Row::new(
            format!("{n} hosts, TTL 5 s: CPU per host"),
            Side::amount(label.clone(), per_host_cpu(0), "µs CPU/s"),
            Some(Side::amount(raw_label.clone(), per_host_cpu(1), "µs CPU/s")),
        ),
        Row::new(
            format!("{n} hosts, TTL 5 s: memory per host (VmRSS delta)"),
            Side::amount(label.clone(), per_host_mem(0), "KiB"),
            Some(Side::amount(raw_label.clone(), per_host_mem(1), "KiB")),
        ),
        latency_row(
            &format!("{n} hosts: time to register all"),
            &label,
            &setup[0],
            &raw_label,
            &setup[1],
        )?,
    ])
}

/// `child-liveness ENDPOINT SIDE N SECS PREFIX`: registers N hosts, then
/// reports CPU over SECS and the VmRSS growth since before the first one.
pub fn child_liveness(args: &[String]) -> Res<()> {
    let [endpoint, side, n, secs, prefix] = args else {
        return Err("usage: child-liveness ENDPOINT fleetcoord|raw N SECS PREFIX".into());
    };
    let n: usize = n.parse()?;
    let secs: u64 = secs.parse()?;
    let ttl = 5i64;
    let measure = |rss0: u64, setup: Duration| -> Res<()> {
        // Let registration's bursts settle before the window opens.
        std::thread::sleep(Duration::from_secs(1));
        let cpu0 = stats::cpu_time()?;
        std::thread::sleep(Duration::from_secs(secs));
        let cpu = stats::cpu_time()?.saturating_sub(cpu0);
        let rss = stats::status_bytes("VmRSS")?;
        process::print_result(&[
            ("cpu_ms", cpu.as_secs_f64() * 1000.0),
            ("rss_delta", rss.saturating_sub(rss0) as f64),
            ("setup_ms", setup.as_secs_f64() * 1000.0),
        ]);
        Ok(())
    };
    match side.as_str() {
        "fleetcoord" => {
            let etcd = Etcd::connect(&[endpoint.as_str()], EtcdOptions::default())?;
            let options = LivenessOptions::default()
                .with_prefix(prefix.as_str())
                .with_ttl(Duration::from_secs(ttl as u64));
            let rss0 = stats::status_bytes("VmRSS")?;
            let t = Instant::now();
            let mut hosts = Vec::with_capacity(n);
            for _ in 0..n {
                hosts.push(HostLiveness::with_options(
                    &etcd,
                    Uuid::new_v4(),
                    b"{}",
                    options.clone(),
                )?);
            }
            measure(rss0, t.elapsed())?;
            etcd.close()?;
        }
        "raw" => {
            let raw = Raw::connect(endpoint)?;
            let rss0 = stats::status_bytes("VmRSS")?;
            let t = Instant::now();
            let mut tasks = Vec::with_capacity(n);
            for _ in 0..n {
                let mut c = raw.client();
                let key = format!("{prefix}{}", Uuid::new_v4());
                let lease = raw.block_on(c.lease_grant(ttl, None))?.id();
                raw.block_on(c.put(key, "{}", Some(PutOptions::new().with_lease(lease))))?;
                tasks.push(raw.spawn(raw::keep_alive(c, lease, ttl)));
            }
            measure(rss0, t.elapsed())?;
            for t in &tasks {
                t.abort();
            }
        }
        other => return Err(format!("unknown side {other:?}").into()),
    }
    Ok(())
}
