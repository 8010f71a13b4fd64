//! A fleet on one 3-member cluster, measured (issue 47, item 5): what it
//! costs the raft leader, and what a member restart does to it.
//!
//! `PROCS` child processes each hold `HOSTS` `HostLiveness` (a lease and a
//! host key on it each, TTL 5 s) on one `Etcd` given all three endpoints;
//! a `HostWatcher` in this process counts every `Down`. Measured:
//!
//! * steady state, over `window`: the leader's CPU (its `/proc` utime +
//!   stime) per host, the renewals the leader applies
//!   (`etcd_debugging_lease_renewed_total`, counted only where leases
//!   live: followers forward renewals to the leader), and every call and
//!   stream message the cluster served, per host — beside the pace a TTL
//!   asks, three renewals per TTL and host;
//! * a follower killed and restarted 2 s later, then the raft leader the
//!   same way: the leader's renewals in every 1 s window from the kill to
//!   3 TTLs after the restart, the busiest against the steady rate (a herd
//!   of reopened streams all renewing at once would show here);
//! * `Down` events seen by the watcher from the first registration on:
//!   every host stays alive throughout, so each one is spurious.
//!
//! How it differs from a real fleet: a real fleet runs one agent (one
//! process, one connection) per host. Here a thousand hosts share a
//! process and its connection, so the leader sees the same leases,
//! renewals and keys, but `PROCS` connections and keepalive streams
//! instead of one per host; what a connection itself costs etcd (its TCP
//! and HTTP/2 state, pings) is not in these numbers.

use crate::process::{self, Spawned};
use crate::report::{Row, Side};
use crate::{stats, Config, Res};
use fleetcoord::testing::EtcdCluster;
use fleetcoord::{
    Etcd, EtcdOptions, HostEvent, HostLiveness, HostWatcher, LivenessOptions, WatcherOptions,
};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use uuid::Uuid;

const TTL_SECS: u64 = 5;
const RENEWED: &str = "etcd_debugging_lease_renewed_total";

/// `child-fleet ENDPOINTS N TTL_SECS PREFIX`: register N hosts on one
/// `Etcd`, say `registered`, and hold them until killed.
pub fn child_fleet(args: &[String]) -> Res<()> {
    let [endpoints, n, ttl, prefix] = args else {
        return Err("usage: child-fleet ENDPOINTS N TTL_SECS PREFIX".into());
    };
    let endpoints: Vec<&str> = endpoints.split(',').collect();
    let n: usize = n.parse()?;
    let options = LivenessOptions::default()
        .with_prefix(prefix.as_str())
        .with_ttl(Duration::from_secs(ttl.parse()?));
    let etcd = Etcd::with_options(&endpoints, EtcdOptions::default())?;
    let mut hosts = Vec::with_capacity(n);
    for _ in 0..n {
        hosts.push(HostLiveness::with_options(
            &etcd,
            Uuid::new_v4(),
            b"{}",
            options.clone(),
        )?);
    }
    println!("registered {n}");
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}

/// What the watcher saw: `Up`s and `Down`s (every `Down` is spurious here).
#[derive(Default)]
struct Seen {
    up: AtomicU64,
    down: AtomicU64,
}

fn count(watcher: HostWatcher, seen: Arc<Seen>) {
    for event in watcher.events().iter() {
        match event {
            HostEvent::Up(_) => {
                seen.up.fetch_add(1, Ordering::Relaxed);
            }
            HostEvent::Down(host, reason) => {
                let n = seen.down.fetch_add(1, Ordering::Relaxed);
                if n < 5 {
                    eprintln!("   fleet: spurious Down of {} ({reason:?})", host.id);
                }
            }
            _ => {}
        }
    }
}

/// The leader's applied renewals so far.
fn renewed(cluster: &EtcdCluster, leader: usize) -> Res<f64> {
    Ok(cluster
        .member(leader)
        .metric(RENEWED)?
        .ok_or("etcd's /metrics has no lease renewal count")?)
}

/// Every call started and stream message received, summed over members.
fn served(cluster: &EtcdCluster) -> Res<u64> {
    let total = cluster.grpc_counts()?;
    let calls: u64 = total.started_by_method().map(|(_, n)| n).sum();
    Ok(calls + total.received("LeaseKeepAlive") + total.received("Watch"))
}

fn leader_cpu(cluster: &EtcdCluster, leader: usize) -> Res<Duration> {
    let pid = cluster
        .member(leader)
        .pid()
        .ok_or("the leader is not running")?;
    stats::cpu_time_of(&pid.to_string())
}

/// Member `m` killed and restarted after 2 s; the leader's renewals in
/// every 1 s window from the kill until `after` past the restart. Returns
/// the busiest window's renewals per second.
fn restart_peak(cluster: &mut EtcdCluster, m: usize, after: Duration) -> Res<f64> {
    let was_leader = cluster.leader_index()?;
    cluster.kill(m)?;
    let killed = Instant::now();
    // (time, leader index, its count): a new leader counts from its own
    // zero-based history, so windows only compare samples of one leader.
    let mut samples: Vec<(Instant, usize, f64)> = Vec::new();
    let mut restarted = None;
    let mut leader = if m == was_leader {
        None
    } else {
        Some(was_leader)
    };
    loop {
        let now = Instant::now();
        if restarted.is_none() && now.duration_since(killed) >= Duration::from_secs(2) {
            cluster.restart(m)?;
            restarted = Some(Instant::now());
        }
        if let Some(r) = restarted {
            if now.duration_since(r) >= after {
                break;
            }
        }
        if leader.is_none() {
            leader = cluster.leader_index().ok().filter(|l| *l != m);
        }
        if let Some(l) = leader {
            match renewed(cluster, l) {
                Ok(n) => samples.push((Instant::now(), l, n)),
                // The leader changed under the sample: find it again.
                Err(_) => leader = None,
            }
        }
        thread::sleep(Duration::from_millis(250));
    }
    let mut peak: f64 = 0.0;
    for (i, (t0, l0, n0)) in samples.iter().enumerate() {
        if let Some((t1, _, n1)) = samples[i..]
            .iter()
            .find(|(t1, l1, _)| l1 == l0 && t1.duration_since(*t0) >= Duration::from_secs(1))
        {
            let rate = (n1 - n0).max(0.0) / t1.duration_since(*t0).as_secs_f64();
            peak = peak.max(rate);
        }
    }
    Ok(peak)
}

pub fn run(cfg: &Config) -> Res<Vec<Row>> {
    let (procs, hosts_each, window) = if cfg.quick {
        (2, 50, Duration::from_secs(3))
    } else {
        (4, 1_000, Duration::from_secs(30))
    };
    let hosts = procs * hosts_each;
    let ttl = Duration::from_secs(TTL_SECS);
    let prefix = format!("/bench/fleet/{}/", std::process::id());
    let mut cluster = EtcdCluster::start(3)?;
    let endpoints = cluster.endpoints();

    let watching = Etcd::with_options(&endpoints, EtcdOptions::default())?;
    let watcher = HostWatcher::with_options(
        &watching,
        WatcherOptions::default().with_prefix(prefix.as_str()),
    )?;
    let seen = Arc::new(Seen::default());
    let counter = {
        let seen = seen.clone();
        thread::spawn(move || count(watcher, seen))
    };

    let mut children = Vec::with_capacity(procs);
    for _ in 0..procs {
        let mut cmd = Command::new(process::self_bin()?);
        cmd.args(["child-fleet", &endpoints.join(","), &hosts_each.to_string()])
            .args([&TTL_SECS.to_string(), &prefix]);
        children.push(Spawned::start(cmd)?);
    }
    let started = Instant::now();
    for child in &children {
        child.wait_line("registered", Duration::from_secs(300))?;
    }
    let registering = started.elapsed();
    // Past every host's first renewal.
    thread::sleep(ttl);

    let leader = cluster.leader_index()?;
    let (cpu0, renewed0, served0) = (
        leader_cpu(&cluster, leader)?,
        renewed(&cluster, leader)?,
        served(&cluster)?,
    );
    let t0 = Instant::now();
    thread::sleep(window);
    let (cpu1, renewed1, served1) = (
        leader_cpu(&cluster, leader)?,
        renewed(&cluster, leader)?,
        served(&cluster)?,
    );
    let secs = t0.elapsed().as_secs_f64();
    let cpu_per_host = cpu1.saturating_sub(cpu0).as_secs_f64() * 1e6 / secs / hosts as f64;
    let steady = (renewed1 - renewed0) / secs;
    let served_per_host = served1.saturating_sub(served0) as f64 / secs / hosts as f64;
    let pace = 3.0 / TTL_SECS as f64;

    let follower = (0..3).find(|m| *m != leader).ok_or("no follower")?;
    // Three TTLs: every stream reopened and every lease renewed twice over
    // (one in quick mode, which only checks that the rows yield numbers).
    let settle = if cfg.quick {
        ttl
    } else {
        ttl.saturating_mul(3)
    };
    let follower_peak = restart_peak(&mut cluster, follower, settle)?;
    let leader_now = cluster.leader_index()?;
    let leader_peak = restart_peak(&mut cluster, leader_now, settle)?;
    // Every host alive throughout: give the watcher a TTL to report what
    // it would, then read the count.
    thread::sleep(ttl);
    let down = seen.down.load(Ordering::Relaxed);
    let up = seen.up.load(Ordering::Relaxed);
    eprintln!(
        "   fleet: {hosts} hosts in {procs} processes registered in {:.1} s; \
         watcher saw {up} Up, {down} Down",
        registering.as_secs_f64()
    );

    for mut child in children {
        child.kill()?;
    }
    watching.close()?;
    let _ = counter.join();

    let label = format!("{procs}×{hosts_each} HostLiveness, TTL {TTL_SECS} s, 3 members");
    let steady_side = || Side::amount("steady state at the leader", steady, "renewals/s");
    Ok(vec![
        Row::new(
            format!("fleet: raft leader CPU per host ({label})"),
            Side::amount("etcd leader", cpu_per_host, "µs/host/s"),
            None,
        ),
        Row::new(
            format!("fleet: calls + stream messages per host, cluster ({label})"),
            Side::amount("served", served_per_host, "/host/s"),
            Some(Side::amount(
                "the TTL's pace, 3 renewals per TTL",
                pace,
                "/host/s",
            )),
        ),
        Row::new(
            format!("fleet: renewals applied at the leader ({label})"),
            Side::amount("steady", steady, "renewals/s"),
            Some(Side::amount(
                "hosts × the TTL's pace",
                hosts as f64 * pace,
                "renewals/s",
            )),
        ),
        Row::new(
            format!("fleet: busiest 1 s of renewals, follower restarted ({label})"),
            Side::amount("peak", follower_peak, "renewals/s"),
            Some(steady_side()),
        ),
        Row::new(
            format!("fleet: busiest 1 s of renewals, raft leader restarted ({label})"),
            Side::amount("peak", leader_peak, "renewals/s"),
            Some(steady_side()),
        ),
        Row::new(
            format!("fleet: spurious Down events over both restarts ({label})"),
            Side::amount("Down", down as f64, "events"),
            None,
        ),
    ])
}
