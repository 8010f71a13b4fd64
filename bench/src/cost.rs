//! What one idle agent costs etcd, counted by etcd itself: every call
//! started and every stream message received (a renewal is one), summed
//! over the members' `/metrics`, per minute of idling. `fleetcoord agent`
//! given all three endpoints of a 3-member cluster, vs a raw etcd-client
//! agent given the same endpoints (grant, put, a keepalive every TTL/3 on
//! one stream: the cheapest a user would write). TTL 6 s both; each side
//! alone on the cluster, past its first renewal before the window opens.

use crate::process::{self, Spawned};
use crate::report::{Row, Side};
use crate::{Config, Res};
use fleetcoord::testing::EtcdCluster;
use std::process::Command;
use std::time::{Duration, Instant};
use uuid::Uuid;

const TTL_SECS: u64 = 6;

/// Calls started plus messages received by all members.
fn served(cluster: &EtcdCluster) -> Res<u64> {
    let total = cluster.grpc_counts()?;
    let calls: u64 = total.started_by_method().map(|(_, n)| n).sum();
    let messages = total.received("LeaseKeepAlive") + total.received("Watch");
    Ok(calls + messages)
}

/// etcd's work per minute while `child` idles, counted after `settle`.
fn per_minute(cluster: &EtcdCluster, settle: Duration, window: Duration) -> Res<f64> {
    std::thread::sleep(settle);
    let before = served(cluster)?;
    let started = Instant::now();
    std::thread::sleep(window);
    let after = served(cluster)?;
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    Ok(after.saturating_sub(before) as f64 / minutes)
}

pub fn idle(cfg: &Config) -> Res<Vec<Row>> {
    let window = Duration::from_secs(if cfg.quick { 3 } else { 60 });
    // Past the first renewal (at a third of the TTL).
    let settle = Duration::from_secs(TTL_SECS / 3 + 1);
    let cluster = EtcdCluster::start(3)?;
    let endpoints = cluster.endpoints().join(",");

    let mut cmd = Command::new(process::fleetcoord_bin()?);
    cmd.args(["--endpoints", &endpoints, "agent", "--host-id"])
        .arg(Uuid::new_v4().to_string())
        .args(["--ttl", &format!("{TTL_SECS}s")]);
    let mut agent = Spawned::start(cmd)?;
    agent.wait_line("registered", Duration::from_secs(20))?;
    let ours = per_minute(&cluster, settle, window)?;
    agent.kill()?;

    let mut cmd = Command::new(process::self_bin()?);
    cmd.args(["child-raw-agent", &endpoints, "/bench/idle/raw"])
        .arg(TTL_SECS.to_string());
    let mut raw = Spawned::start(cmd)?;
    let raw_side = per_minute(&cluster, settle, window)?;
    raw.kill()?;

    Ok(vec![Row::new(
        "idle agent on 3 endpoints: etcd RPCs + stream messages per minute",
        Side::amount("`fleetcoord agent`, TTL 6 s", ours, "/min"),
        Some(Side::amount(
            "etcd-client grant + put + keepalive every TTL/3",
            raw_side,
            "/min",
        )),
    )])
}
