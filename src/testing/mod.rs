//! Real etcd processes and network faults for tests (cargo feature `testing`).
//!
//! * [`EtcdServer`] — one `etcd` on free loopback ports in a temp dir;
//!   [`kill`](EtcdServer::kill), [`restart`](EtcdServer::restart) (same
//!   ports, same data), [`pause`](EtcdServer::pause) /
//!   [`resume`](EtcdServer::resume) (SIGSTOP / SIGCONT).
//! * [`EtcdCluster`] — `n` members with a static initial cluster, the same
//!   faults per member, and [`leader_index`](EtcdCluster::leader_index).
//! * [`RedisServer`] — one `redis-server` without persistence on a free
//!   loopback port; [`RedisCluster`] — `n` of them made a Redis Cluster
//!   (masters, optionally with replicas) with `redis-cli --cluster create` (binaries from `$REDIS_SERVER_BIN` /
//!   `$REDIS_CLI_BIN` or `PATH`; `make deps-redis` installs them).
//!   [`RedisBuilder`] starts either with TLS (a [`TestPki`]), clients
//!   required to present a certificate, and ACL users.
//! * [`NatsServer`], [`NatsCluster`] — real `nats-server -js` processes (one,
//!   or `n` joined by routes) on free loopback ports with temp stores; the
//!   same faults. The binary comes from `$NATS_SERVER_BIN`, else `PATH`
//!   (`make deps-nats`, Debian: `apt-get install nats-server`).
//! * [`FaultProxy`] — an in-process TCP proxy between a client and etcd that
//!   can [blackhole](Mode::Blackhole), [delay](Mode::Delay) and
//!   [reset](FaultProxy::reset_all) connections.
//! * Secured etcd: [`EtcdBuilder::tls`] and [`EtcdBuilder::client_cert_auth`]
//!   serve the client URLs over TLS with a [`TestPki`] made at start;
//!   [`EtcdBuilder::auth`] creates `root` and enables authentication, and
//!   [`EtcdServer::create_user`] adds a user limited to one key prefix.
//!
//! Everything is cleaned up on drop: processes are killed, temp dirs
//! removed, proxy connections closed.
//!
//! The `etcd` binary comes from `$ETCD_BIN`, else from `PATH` (Debian:
//! `apt-get install etcd-server`; in this repository `make test` installs
//! it). When it is missing, starting fails with an error that says so:
//! tests built on this module fail rather than skip.
//!
//! ```
//! use fleetcoord::testing::{EtcdServer, FaultProxy, Mode};
//!
//! let mut etcd = EtcdServer::start()?;
//! let proxy = FaultProxy::start(&etcd.endpoint())?;
//! // Give the client under test `proxy.endpoints()`, then inject faults:
//! proxy.set_mode(Mode::Blackhole); // a partition
//! proxy.set_mode(Mode::Pass);
//! proxy.reset_all(); // every connection closed
//! etcd.pause()?; // a stalled server
//! etcd.resume()?;
//! etcd.kill()?; // a crash...
//! etcd.restart()?; // ...and recovery, with the data intact
//! assert!(etcd.is_healthy());
//! # Ok::<(), fleetcoord::Error>(())
//! ```

mod admin;
mod cluster;
mod nats;
mod nats_jwt;
mod net;
mod pki;
mod process;
mod proxy;
mod redis;
mod redis_cluster;
mod server;

use std::time::Duration;

pub use cluster::{EtcdCluster, MemberHash};
pub use nats::{NatsBuilder, NatsCluster, NatsServer, TEST_MAX_PAYLOAD};
pub use pki::{ServerNames, TestPki};
pub use proxy::{FaultProxy, Mode};
pub use redis::{RedisBuilder, RedisServer};
pub use redis_cluster::RedisCluster;
pub use server::{EtcdServer, GrpcCounts};

use crate::Result;

/// Options for starting an [`EtcdServer`] or [`EtcdCluster`].
///
/// ```
/// use std::time::Duration;
/// use fleetcoord::testing::EtcdBuilder;
///
/// let etcd = EtcdBuilder::new()
///     .arg("--auto-compaction-retention=1")
///     .health_timeout(Duration::from_secs(30))
///     .start()?;
/// assert!(etcd.is_healthy());
/// # Ok::<(), fleetcoord::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct EtcdBuilder {
    extra_args: Vec<String>,
    health_timeout: Duration,
    tls: Option<ServerNames>,
    client_cert_auth: bool,
    auth: bool,
}

impl Default for EtcdBuilder {
    fn default() -> Self {
        EtcdBuilder::new()
    }
}

impl EtcdBuilder {
    /// No extra flags; 20 s to become healthy.
    pub fn new() -> Self {
        EtcdBuilder {
            extra_args: Vec::new(),
            health_timeout: Duration::from_secs(20),
            tls: None,
            client_cert_auth: false,
            auth: false,
        }
    }

    /// Serve the client URLs over TLS with a [`TestPki`] generated at
    /// start (see [`EtcdServer::pki`]); the server certificate is valid for
    /// `127.0.0.1` and `localhost`. Health checks and `/metrics` move to a
    /// plain-HTTP metrics port. Peers still talk plain HTTP.
    ///
    /// ```
    /// use fleetcoord::testing::EtcdBuilder;
    /// use fleetcoord::{Etcd, EtcdOptions};
    ///
    /// let server = EtcdBuilder::new().tls().start()?;
    /// let tls = server.pki().expect("TLS server").server_tls()?;
    /// let etcd = Etcd::with_options(&server.endpoints(), EtcdOptions::default().with_tls(tls))?;
    /// # Ok::<(), fleetcoord::Error>(())
    /// ```
    pub fn tls(self) -> Self {
        self.tls_for(ServerNames::Loopback)
    }

    /// [`EtcdBuilder::tls`] with a server certificate valid for `names`
    /// only, e.g. [`ServerNames::LocalhostOnly`] to test a name mismatch.
    pub fn tls_for(mut self, names: ServerNames) -> Self {
        self.tls = Some(names);
        self
    }

    /// TLS (as [`EtcdBuilder::tls`] unless set already) and etcd's
    /// `--client-cert-auth`: clients must present a certificate signed by
    /// the test CA ([`TestPki::client_tls`]).
    pub fn client_cert_auth(mut self) -> Self {
        self.tls.get_or_insert(ServerNames::Loopback);
        self.client_cert_auth = true;
        self
    }

    /// Once healthy, create the user `root` (password
    /// [`EtcdServer::ROOT_PASSWORD`]) with the `root` role and enable
    /// authentication. Add users with [`EtcdServer::create_user`].
    pub fn auth(mut self) -> Self {
        self.auth = true;
        self
    }

    /// Appends one command-line argument for etcd, e.g.
    /// `"--auto-compaction-retention=1"`. Flags the harness sets itself
    /// (names, URLs, data dir, initial cluster) must not be repeated.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// How long a start or restart waits for `/health` to say true, and how
    /// long [`EtcdCluster::leader_index`] waits for a leader. A duration too
    /// long to add to the current time (`Duration::MAX`) means no limit.
    pub fn health_timeout(mut self, timeout: Duration) -> Self {
        self.health_timeout = timeout;
        self
    }

    /// Starts a single-member etcd and waits until it is healthy.
    pub fn start(&self) -> Result<EtcdServer> {
        EtcdServer::start_with(self)
    }

    /// Starts an `n`-member cluster and waits until every member is healthy.
    pub fn start_cluster(&self, n: usize) -> Result<EtcdCluster> {
        EtcdCluster::start_with(self, n)
    }
}
