//! Host liveness: graceful leave → Down, crash (SIGKILL) → Down, and the
//! standing cost (CPU, memory) of N hosts kept alive on one connection.

use crate::process::{self, Spawned};
use crate::raw::{self, Raw, RawEvent};
use crate::report::{latency_row, Row, Side};
use crate::stats::{self, interleave};
use crate::{BoxError, Config, Res};
use crossbeam_channel::Receiver;
use etcd_client::PutOptions;
use fleetcoord::{
    ElectionOptions, ElectionPool, Etcd, EtcdOptions, HostEvent, HostLiveness, HostWatcher,
    LivenessOptions, WatcherOptions,
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
    let etcd = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
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
    let etcd = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
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

/// N hosts on one connection, at TTL 3 s and 5 s. CPU: fleetcoord's N
/// `HostLiveness` on one `Etcd` and the cheapest raw loop a user would
/// write instead (one etcd-client `Client` driven by `block_on` on the
/// calling thread, one task per lease with its own `lease_keep_alive`
/// stream, renewing every TTL/3), as alternating phases A B A B of one
/// child process. Memory and registration time: each side in a child
/// process of its own (so heaps do not mix), alternating.
pub fn many(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(1000, 20);
    let secs = if cfg.quick { 1 } else { 10 };
    let rounds = if cfg.quick { 1 } else { 2 };
    let raw = Raw::connect(&cfg.endpoint)?;
    let label = format!("{n} HostLiveness on one Etcd");
    let raw_label = format!("{n} raw leases, a keepalive task each, one client");
    let stream_label = format!(
        "{n} raw leases on one keepalive stream, one timer per TTL/3 renewing all, one client"
    );
    let mut rows = Vec::new();
    for ttl in [3u64, 5] {
        let prefix = format!("/bench/many-cpu/ttl{ttl}/");
        let r = process::run_child(&[
            "child-liveness-cpu".into(),
            cfg.endpoint.clone(),
            n.to_string(),
            ttl.to_string(),
            secs.to_string(),
            rounds.to_string(),
            prefix.clone(),
            "fleetcoord,stream,raw".into(),
        ])?;
        raw.delete_prefix(&prefix)?;
        let window_s = (secs * rounds) as f64;
        // µs of CPU per host per second of wall time.
        let per_host = |ms: f64| ms * 1000.0 / window_s / n as f64;
        let ours = per_host(process::field(&r, "fleetcoord_cpu_ms")?);
        rows.push(Row::new(
            format!("{n} hosts, TTL {ttl} s: CPU per host"),
            Side::amount(label.clone(), ours, "µs CPU/s"),
            Some(Side::amount(
                stream_label.clone(),
                per_host(process::field(&r, "stream_cpu_ms")?),
                "µs CPU/s",
            )),
        ));
        rows.push(Row::new(
            format!("{n} hosts, TTL {ttl} s: CPU per host, anchor a stream per lease"),
            Side::amount(label.clone(), ours, "µs CPU/s"),
            Some(Side::amount(
                raw_label.clone(),
                per_host(process::field(&r, "raw_cpu_ms")?),
                "µs CPU/s",
            )),
        ));
    }
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
                prefix.clone(),
            ])?;
            mem[side] += process::field(&r, "rss_delta")?;
            setup[side].push(Duration::from_secs_f64(
                process::field(&r, "setup_ms")? / 1000.0,
            ));
            raw.delete_prefix(&prefix)?;
        }
    }
    let per_host_mem = |side: usize| mem[side] / rounds as f64 / n as f64 / 1024.0;
    rows.push(Row::new(
        format!("{n} hosts, TTL 5 s: memory per host (VmRSS delta)"),
        Side::amount(label.clone(), per_host_mem(0), "KiB"),
        Some(Side::amount(raw_label.clone(), per_host_mem(1), "KiB")),
    ));
    rows.push(latency_row(
        &format!("{n} hosts: time to register all"),
        &label,
        &setup[0],
        &raw_label,
        &setup[1],
    )?);
    Ok(rows)
}

/// How long a phase waits after registering before its CPU window opens:
/// past every lease's first renewal (a third of the TTL), and past
/// registration's bursts.
fn settle(ttl_secs: u64) -> Duration {
    Duration::from_millis(ttl_secs * 1000 / 3) + Duration::from_secs(1)
}

/// `child-liveness-cpu ENDPOINT N TTL_SECS SECS ROUNDS PREFIX SIDES`: for
/// each of ROUNDS rounds, one phase per side of the comma-separated SIDES
/// (the order reversed every other round), each holding N hosts at TTL_SECS
/// for a CPU window of SECS, on a connection of its own opened and closed
/// within the phase. Reports each side's summed CPU as `<side>_cpu_ms`.
/// Sides: `fleetcoord` (N `HostLiveness` on one `Etcd`), `pool` (an
/// `ElectionPool` holding the sessions of N names, each campaigned on and
/// resigned once), `stream` (the cheapest raw loop: one etcd-client
/// `Client` on a current-thread runtime driven by `block_on` on this
/// thread, every lease on one `LeaseKeepAlive` stream, one timer that
/// every TTL/3 sends a renewal for each lease, one reader that checks
/// each answer), `raw` (one
/// etcd-client `Client` on a current-thread runtime driven by `block_on`
/// on this thread; a task per lease with its own `lease_keep_alive`
/// stream: what etcd-client's public API offers; sharing one stream needs
/// its non-default `pub-response-field` feature and a request type it does
/// not export).
pub fn child_liveness_cpu(args: &[String]) -> Res<()> {
    let [endpoint, n, ttl, secs, rounds, prefix, sides] = args else {
        return Err(
            "usage: child-liveness-cpu ENDPOINT N TTL_SECS SECS ROUNDS PREFIX SIDE,SIDE..".into(),
        );
    };
    let n: usize = n.parse()?;
    let ttl: u64 = ttl.parse()?;
    let window = Duration::from_secs(secs.parse()?);
    let rounds: usize = rounds.parse()?;
    let sides: Vec<&str> = sides.split(',').collect();
    let mut cpu = vec![Duration::ZERO; sides.len()];
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..sides.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let used = match sides[i] {
                "fleetcoord" => fleetcoord_phase(endpoint, n, ttl, window, prefix)?,
                "pool" => pool_phase(endpoint, n, ttl, window, prefix)?,
                "raw" => raw_phase(endpoint, n, ttl, window, prefix)?,
                "stream" => stream_phase(endpoint, n, ttl, window, prefix)?,
                other => return Err(format!("unknown side {other:?}").into()),
            };
            eprintln!(
                "liveness cpu: {} ttl {ttl}s round {round}: {:.1} µs/host/s",
                sides[i],
                used.as_secs_f64() * 1e6 / window.as_secs_f64() / n as f64
            );
            cpu[i] += used;
        }
    }
    let keys: Vec<String> = sides.iter().map(|s| format!("{s}_cpu_ms")).collect();
    let pairs: Vec<(&str, f64)> = keys
        .iter()
        .zip(&cpu)
        .map(|(k, c)| (k.as_str(), c.as_secs_f64() * 1000.0))
        .collect();
    process::print_result(&pairs);
    Ok(())
}

/// `n` hosts registered on `etcd` under `prefix`, each with a lease of
/// `ttl` seconds.
fn register(etcd: &Etcd, n: usize, prefix: &str, ttl: u64) -> Res<Vec<HostLiveness>> {
    let options = LivenessOptions::default()
        .with_prefix(prefix)
        .with_ttl(Duration::from_secs(ttl));
    let mut hosts = Vec::with_capacity(n);
    for _ in 0..n {
        hosts.push(HostLiveness::with_options(
            etcd,
            Uuid::new_v4(),
            b"{}",
            options.clone(),
        )?);
    }
    Ok(hosts)
}

fn fleetcoord_phase(
    endpoint: &str,
    n: usize,
    ttl: u64,
    window: Duration,
    prefix: &str,
) -> Res<Duration> {
    let etcd = Etcd::with_options(&[endpoint], EtcdOptions::default())?;
    let hosts = register(&etcd, n, prefix, ttl)?;
    std::thread::sleep(settle(ttl));
    let cpu0 = stats::cpu_time()?;
    std::thread::sleep(window);
    let used = stats::cpu_time()?.saturating_sub(cpu0);
    for h in hosts {
        h.close()?;
    }
    etcd.close()?;
    Ok(used)
}

fn pool_phase(endpoint: &str, n: usize, ttl: u64, window: Duration, prefix: &str) -> Res<Duration> {
    let etcd = Etcd::with_options(&[endpoint], EtcdOptions::default())?;
    let options = ElectionOptions::default()
        .with_prefix(prefix)
        .with_ttl(Duration::from_secs(ttl));
    let pool = ElectionPool::with_options(&etcd, options);
    for i in 0..n {
        pool.campaign(&format!("pool-{i}"), b"me")?.resign()?;
    }
    std::thread::sleep(settle(ttl));
    let cpu0 = stats::cpu_time()?;
    std::thread::sleep(window);
    let used = stats::cpu_time()?.saturating_sub(cpu0);
    pool.close()?;
    etcd.close()?;
    Ok(used)
}

fn stream_phase(
    endpoint: &str,
    n: usize,
    ttl: u64,
    window: Duration,
    prefix: &str,
) -> Res<Duration> {
    let raw = Raw::connect_on_caller(endpoint)?;
    let mut c = raw.client();
    let ttl_i = i64::try_from(ttl)?;
    let every = Duration::from_millis(ttl.saturating_mul(1000) / 3);
    raw.block_on(async {
        let mut leases = Vec::with_capacity(n);
        for _ in 0..n {
            let key = format!("{prefix}{}", Uuid::new_v4());
            let lease = c.lease_grant(ttl_i, None).await?.id();
            c.put(key, "{}", Some(PutOptions::new().with_lease(lease)))
                .await?;
            leases.push(lease);
        }
        let first = *leases.first().ok_or("no lease")?;
        let (keeper, mut answers) = c.lease_keep_alive(first).await?;
        let sender = keeper.sender.clone();
        // Every answer must renew: a lost lease would make the anchor cheap.
        let reader = tokio::spawn(async move {
            while let Some(answer) = answers.message().await? {
                if answer.ttl() <= 0 {
                    return Err::<(), BoxError>(format!("lease {:x} lost", answer.id()).into());
                }
            }
            Ok(())
        });
        let renewing = leases.clone();
        let timer = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                for &lease in &renewing {
                    let mut request = blank(&sender);
                    request.id = lease;
                    if sender.send(request).await.is_err() {
                        return;
                    }
                }
            }
        });
        tokio::time::sleep(settle(ttl)).await;
        let cpu0 = stats::cpu_time()?;
        tokio::time::sleep(window).await;
        let used = stats::cpu_time()?.saturating_sub(cpu0);
        if reader.is_finished() || timer.is_finished() {
            return Err("the raw keepalive stream ended during the phase".into());
        }
        for lease in leases {
            c.lease_revoke(lease).await?;
        }
        timer.abort();
        reader.abort();
        drop(keeper);
        Ok(used)
    })
}

/// A default request of the stream's own message type, which etcd-client
/// does not export (it is only named through the sender).
fn blank<T: Default>(_: &tokio::sync::mpsc::Sender<T>) -> T {
    T::default()
}

fn raw_phase(endpoint: &str, n: usize, ttl: u64, window: Duration, prefix: &str) -> Res<Duration> {
    let raw = Raw::connect_on_caller(endpoint)?;
    let mut c = raw.client();
    let ttl_i = i64::try_from(ttl)?;
    raw.block_on(async {
        let mut leases = Vec::with_capacity(n);
        let mut tasks = Vec::with_capacity(n);
        for _ in 0..n {
            let key = format!("{prefix}{}", Uuid::new_v4());
            let lease = c.lease_grant(ttl_i, None).await?.id();
            c.put(key, "{}", Some(PutOptions::new().with_lease(lease)))
                .await?;
            leases.push(lease);
            // Kept alive from here on, as fleetcoord's are once registered.
            tasks.push(tokio::spawn(raw::keep_alive(c.clone(), lease, ttl_i)));
        }
        tokio::time::sleep(settle(ttl)).await;
        let cpu0 = stats::cpu_time()?;
        tokio::time::sleep(window).await;
        let used = stats::cpu_time()?.saturating_sub(cpu0);
        // A task that ended (its lease lost) would make the anchor cheap.
        if tasks.iter().any(|t| t.is_finished()) {
            return Err("a raw keepalive task ended during the phase".into());
        }
        // Revoked while still kept alive, so that none expires first.
        for lease in leases {
            c.lease_revoke(lease).await?;
        }
        for t in &tasks {
            t.abort();
        }
        Ok(used)
    })
}

/// `child-liveness ENDPOINT SIDE N PREFIX`: registers N hosts at TTL 5 s,
/// then reports the VmRSS growth since before the first one, once every
/// lease has renewed, and the time registration took.
pub fn child_liveness(args: &[String]) -> Res<()> {
    let [endpoint, side, n, prefix] = args else {
        return Err("usage: child-liveness ENDPOINT fleetcoord|raw N PREFIX".into());
    };
    let n: usize = n.parse()?;
    let ttl = 5u64;
    let report = |rss0: u64, setup: Duration| -> Res<()> {
        let rss = stats::status_bytes("VmRSS")?;
        process::print_result(&[
            ("rss_delta", rss.saturating_sub(rss0) as f64),
            ("setup_ms", setup.as_secs_f64() * 1000.0),
        ]);
        Ok(())
    };
    match side.as_str() {
        "fleetcoord" => {
            let etcd = Etcd::with_options(&[endpoint.as_str()], EtcdOptions::default())?;
            let rss0 = stats::status_bytes("VmRSS")?;
            let t = Instant::now();
            let _hosts = register(&etcd, n, prefix.as_str(), ttl)?;
            let setup = t.elapsed();
            std::thread::sleep(settle(ttl));
            report(rss0, setup)?;
            etcd.close()?;
        }
        "raw" => {
            let raw = Raw::connect_on_caller(endpoint)?;
            let mut c = raw.client();
            let ttl = i64::try_from(ttl)?;
            let rss0 = stats::status_bytes("VmRSS")?;
            raw.block_on(async {
                let t = Instant::now();
                let mut tasks = Vec::with_capacity(n);
                for _ in 0..n {
                    let key = format!("{prefix}{}", Uuid::new_v4());
                    let lease = c.lease_grant(ttl, None).await?.id();
                    c.put(key, "{}", Some(PutOptions::new().with_lease(lease)))
                        .await?;
                    tasks.push(tokio::spawn(raw::keep_alive(c.clone(), lease, ttl)));
                }
                let setup = t.elapsed();
                tokio::time::sleep(settle(ttl as u64)).await;
                report(rss0, setup)?;
                for t in &tasks {
                    t.abort();
                }
                Ok::<(), crate::BoxError>(())
            })?;
        }
        other => return Err(format!("unknown side {other:?}").into()),
    }
    Ok(())
}
