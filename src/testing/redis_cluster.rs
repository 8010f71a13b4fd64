//! A Redis Cluster of real `redis-server` processes, created with
//! `redis-cli --cluster create`.

use std::io;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use super::net;
use super::pki::TestPki;
use super::redis::{command, find_bin, RedisBuilder, RedisServer};
use crate::{Error, Result};

/// How long a new cluster may take to report `cluster_state:ok` on every
/// node.
const OK_TIMEOUT: Duration = Duration::from_secs(60);

// Starting a cluster from the builder's options lives with the cluster, so
// that the server module needs nothing from this one.
impl RedisBuilder {
    /// Starts a cluster of `masters` masters (at least 3) with `replicas`
    /// replicas each (0 to 2), every node with these options and one
    /// [`TestPki`] for all, and waits as [`RedisCluster::start_with_replicas`].
    pub fn start_cluster(&self, masters: usize, replicas: usize) -> Result<RedisCluster> {
        RedisCluster::start_built(self, masters, replicas)
    }
}

/// A Redis Cluster of `n` masters, optionally each with replicas, on free
/// loopback ports, each node a [`RedisServer`] with cluster mode on and no
/// persistence.
///
/// Guarantees: after [`RedisCluster::start`] (or
/// [`start_with_replicas`](RedisCluster::start_with_replicas)) returns
/// `Ok`, every node reports `cluster_state:ok`, all 16,384 slots are
/// assigned and every replica's link to its master is up, so a killed
/// master can fail over. A short `cluster-node-timeout` (1 s) keeps failure
/// detection and failover quick; the other settings are Redis' defaults
/// (`cluster-require-full-coverage yes`: the whole cluster refuses
/// commands while a slot has no reachable master). Dropping the cluster
/// kills every node and removes its directory.
///
/// `redis-cli` comes from `$REDIS_CLI_BIN`, else `PATH`.
///
/// ```
/// use fleetcoord::testing::RedisCluster;
///
/// let cluster = RedisCluster::start(3)?;
/// assert_eq!(cluster.urls().split(',').count(), 3);
/// assert_eq!(cluster.node(0).command(&["CLUSTER", "KEYSLOT", "{a}x"])?, "15495");
/// # Ok::<(), fleetcoord::Error>(())
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `n` masters (at least 3, Redis' minimum) and waits until the
    /// cluster is ok on every node.
    pub fn start(n: usize) -> Result<RedisCluster> {
        RedisCluster::start_with_replicas(n, 0)
    }

    /// Starts `masters` masters (at least 3) with `replicas` replicas each
    /// (0 to 2), `masters * (1 + replicas)` nodes in all, and waits until
    /// the cluster is ok on every node and every replica is in sync with
    /// its master.
    pub fn start_with_replicas(masters: usize, replicas: usize) -> Result<RedisCluster> {
        RedisCluster::start_built(&RedisBuilder::new(), masters, replicas)
    }

    /// [`start`](RedisCluster::start) with every node keeping its data
    /// across restarts, as [`RedisServer::start_persistent`] does.
    pub fn start_persistent(n: usize) -> Result<RedisCluster> {
        RedisCluster::start_built(&RedisBuilder::new().persistent(), n, 0)
    }

    /// The certificates every node of a TLS cluster shares
    /// ([`RedisBuilder::tls`]).
    pub fn pki(&self) -> Option<&TestPki> {
        self.nodes.first().and_then(RedisServer::pki)
    }

    /// Kills every node, starts each again on its port with its data
    /// (when persistent) and its slots, and waits until the cluster is ok.
    pub fn restart(&mut self) -> Result<()> {
        for node in &mut self.nodes {
            node.kill()?;
        }
        for node in &mut self.nodes {
            node.restart()?;
        }
        self.wait_ok()
    }

    /// The cluster [`RedisBuilder::start_cluster`] starts.
    pub(crate) fn start_built(
        options: &RedisBuilder,
        masters: usize,
        replicas: usize,
    ) -> Result<RedisCluster> {
        if masters < 3 {
            return Err(Error::invalid(
                "masters",
                "a Redis Cluster needs at least 3 masters",
            ));
        }
        if replicas > 2 {
            return Err(Error::invalid("replicas", "at most 2 per master"));
        }
        let n = masters.saturating_mul(replicas.saturating_add(1));
        let cli = find_bin("REDIS_CLI_BIN", "redis-cli")?;
        let pki = options.pki()?;
        let configured = options.args(&pki, true);
        let mut nodes = Vec::with_capacity(n);
        for _ in 0..n {
            let bus = net::free_port()?;
            let mut args: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--cluster-port",
                &bus.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend(configured.iter().cloned());
            nodes.push(RedisServer::start_configured(&args, pki.clone())?);
        }
        let cluster = RedisCluster { nodes };
        let mut create = Command::new(&cli);
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        let output = create
            .arg("--cluster-replicas")
            .arg(replicas.to_string())
            .arg("--cluster-yes")
            .output()
            .map_err(|e| io::Error::other(format!("cannot run {}: {e}", cli.display())))?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed ({}): {}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
            .into());
        }
        cluster.wait_ok()?;
        cluster.wait_replicas_synced()?;
        Ok(cluster)
    }

    /// Polls every replica until its link to its master is up, so that a
    /// master killed right after start can fail over.
    fn wait_replicas_synced(&self) -> Result<()> {
        let deadline = Instant::now() + OK_TIMEOUT;
        for node in &self.nodes {
            loop {
                let info = command(node.port(), &["INFO", "replication"])?;
                if info.contains("role:master") || info.contains("master_link_status:up") {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(io::Error::other(format!(
                        "the replica on port {} did not sync within {OK_TIMEOUT:?}",
                        node.port()
                    ))
                    .into());
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// The index of the node that serves `slot` as a master (not marked
    /// failed), as the first node that answers `CLUSTER NODES` sees it;
    /// `None` when no live node knows one.
    pub fn master_of_slot(&self, slot: u16) -> Option<usize> {
        let nodes = self
            .nodes
            .iter()
            .filter(|n| n.pid().is_some())
            .find_map(|n| command(n.port(), &["CLUSTER", "NODES"]).ok())?;
        let owner = nodes.lines().find_map(|line| {
            // <id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if !flags.contains("master") || flags.contains("fail") {
                return None;
            }
            let serves = fields.iter().skip(8).any(|range| {
                let mut bounds = range.splitn(2, '-').map(|b| b.parse::<u16>().ok());
                match (bounds.next().flatten(), bounds.next()) {
                    (Some(lo), None) => lo == slot,
                    (Some(lo), Some(Some(hi))) => (lo..=hi).contains(&slot),
                    _ => false,
                }
            });
            let port = fields.get(1)?.split('@').next()?.rsplit(':').next()?;
            serves.then(|| port.parse::<u16>().ok()).flatten()
        })?;
        self.nodes.iter().position(|n| n.port() == owner)
    }

    /// The indices of the running nodes that replicate node `master` (by
    /// its `INFO replication`).
    pub fn replicas_of(&self, master: usize) -> Vec<usize> {
        let Some(node) = self.nodes.get(master) else {
            return Vec::new();
        };
        let Ok(info) = command(node.port(), &["INFO", "replication"]) else {
            return Vec::new();
        };
        // slave0:ip=127.0.0.1,port=7001,state=online,offset=...,lag=0
        info.lines()
            .filter(|line| line.starts_with("slave"))
            .filter_map(|line| {
                let port = line.split(',').find_map(|f| f.strip_prefix("port="))?;
                let port: u16 = port.trim().parse().ok()?;
                self.nodes.iter().position(|n| n.port() == port)
            })
            .collect()
    }

    /// The indices of the nodes that are masters now (by `INFO
    /// replication` of each running node).
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                command(self.nodes[i].port(), &["INFO", "replication"])
                    .is_ok_and(|info| info.contains("role:master"))
            })
            .collect()
    }

    /// Polls `CLUSTER INFO` on every node until all say
    /// `cluster_state:ok` with every slot assigned.
    pub fn wait_ok(&self) -> Result<()> {
        let deadline = Instant::now() + OK_TIMEOUT;
        loop {
            if self.is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::other(format!(
                    "the cluster did not reach cluster_state:ok within {OK_TIMEOUT:?}"
                ))
                .into());
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether every node reports `cluster_state:ok` and all slots
    /// assigned.
    pub fn is_ok(&self) -> bool {
        self.nodes.iter().all(|node| {
            command(node.port(), &["CLUSTER", "INFO"]).is_ok_and(|info| {
                info.contains("cluster_state:ok") && info.contains("cluster_slots_assigned:16384")
            })
        })
    }

    /// The nodes' URLs, comma-separated: what `RedisCoordinator::connect`
    /// (feature `redis`) takes for a cluster.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Node `i` (0-based), for commands and faults.
    ///
    /// # Panics
    /// If `i` is out of range (a test bug).
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Node `i`, mutably (to kill or restart it).
    ///
    /// # Panics
    /// If `i` is out of range (a test bug).
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Never true: a cluster has at least 3 nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}
