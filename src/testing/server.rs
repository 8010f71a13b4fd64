//! One real `etcd` process: start, health, kill, restart, pause, resume.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::admin::Admin;
use super::net;
use super::process;
use super::{EtcdBuilder, TestPki};
use crate::deadline::deadline_after;
use crate::tls::EtcdUser;
use crate::{Error, Result};

/// How many times a start is retried when another process took one of the
/// ports between our probe and etcd's bind.
const PORT_ATTEMPTS: usize = 3;

/// A real `etcd` process on free loopback ports with its own temporary data
/// directory.
///
/// Guarantees: after [`EtcdServer::start`] returns `Ok`, etcd answered
/// `GET /health` with `"health":"true"`. Dropping the value SIGKILLs the
/// process (also when it is paused), waits for it and deletes the data
/// directory and the log. The ports stay the same across
/// [`restart`](EtcdServer::restart), so clients can reconnect to the same
/// endpoint.
///
/// ```
/// use fleetcoord::testing::EtcdServer;
///
/// let mut etcd = EtcdServer::start()?;
/// assert!(etcd.is_healthy());
/// etcd.kill()?;
/// assert!(!etcd.is_healthy());
/// etcd.restart()?; // same port, same data
/// assert!(etcd.is_healthy());
/// # Ok::<(), fleetcoord::Error>(())
/// ```
#[derive(Debug)]
pub struct EtcdServer {
    bin: PathBuf,
    args: Vec<String>,
    client_port: u16,
    /// The plain-HTTP port of `/health` and `/metrics` when the client
    /// port speaks TLS.
    metrics_port: Option<u16>,
    pki: Option<Arc<TestPki>>,
    client_cert_auth: bool,
    auth: bool,
    health_timeout: Duration,
    child: Option<Child>,
    log_path: PathBuf,
    // Last field: dropped after `Drop::drop` killed the process.
    dir: tempfile::TempDir,
}

/// What to pass to one etcd process; shared by single servers and cluster
/// members.
pub(crate) struct MemberSpec<'a> {
    pub(crate) name: String,
    pub(crate) client_port: u16,
    pub(crate) peer_port: u16,
    pub(crate) initial_cluster: String,
    pub(crate) token: String,
    pub(crate) builder: &'a EtcdBuilder,
    /// Certificates when the builder asked for TLS, shared by all members.
    pub(crate) pki: Option<Arc<TestPki>>,
}

/// The test certificates a builder asks for, made once per server or
/// cluster.
pub(crate) fn pki_for(builder: &EtcdBuilder) -> Result<Option<Arc<TestPki>>> {
    builder
        .tls
        .map(|names| TestPki::generate_for(names).map(Arc::new))
        .transpose()
}

impl EtcdServer {
    /// Starts a single-member etcd with default options and waits until it
    /// is healthy (at most 20 s).
    ///
    /// The binary is `$ETCD_BIN` if set, else `etcd` from `PATH`. A missing
    /// binary is an error telling how to install it; it is never a skip.
    pub fn start() -> Result<EtcdServer> {
        EtcdBuilder::new().start()
    }

    /// Single-member start with retries on port collisions.
    pub(crate) fn start_with(builder: &EtcdBuilder) -> Result<EtcdServer> {
        let pki = pki_for(builder)?;
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let client_port = net::free_port()?;
            let peer_port = net::free_port()?;
            let spec = MemberSpec {
                name: "fleetcoord-test".to_string(),
                client_port,
                peer_port,
                initial_cluster: format!("fleetcoord-test=http://127.0.0.1:{peer_port}"),
                token: unique_token(),
                builder,
                pki: pki.clone(),
            };
            let mut server = EtcdServer::spawn(&spec)?;
            match server.wait_healthy() {
                Ok(()) => {
                    if builder.auth {
                        server.admin(None)?.enable_auth(Self::ROOT_PASSWORD)?;
                    }
                    return Ok(server);
                }
                Err(e) if server.lost_port_race() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io_error("no start attempt was made").into()))
    }

    /// Creates the temp dir and launches the process without waiting for it.
    pub(crate) fn spawn(spec: &MemberSpec<'_>) -> Result<EtcdServer> {
        let bin = find_etcd()?;
        let dir = tempfile::Builder::new()
            .prefix("fleetcoord-etcd-")
            .tempdir()?;
        let data_dir = dir.path().join("data");
        let scheme = if spec.pki.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{}", spec.client_port);
        let peer_url = format!("http://127.0.0.1:{}", spec.peer_port);
        let mut args: Vec<String> = [
            "--name",
            &spec.name,
            "--data-dir",
            &data_dir.to_string_lossy(),
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &spec.initial_cluster,
            "--initial-cluster-token",
            &spec.token,
            "--initial-cluster-state",
            "new",
            "--logger",
            "zap",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut metrics_port = None;
        if let Some(pki) = &spec.pki {
            let port = net::free_port()?;
            metrics_port = Some(port);
            args.extend([
                format!("--cert-file={}", pki.server_cert_path().display()),
                format!("--key-file={}", pki.server_key_path().display()),
                format!("--listen-metrics-urls=http://127.0.0.1:{port}"),
            ]);
            if spec.builder.client_cert_auth {
                args.extend([
                    "--client-cert-auth".to_string(),
                    format!("--trusted-ca-file={}", pki.ca_path().display()),
                ]);
            }
        }
        args.extend(spec.builder.extra_args.iter().cloned());
        let log_path = dir.path().join("etcd.log");
        let mut server = EtcdServer {
            bin,
            args,
            client_port: spec.client_port,
            metrics_port,
            pki: spec.pki.clone(),
            client_cert_auth: spec.builder.client_cert_auth,
            auth: spec.builder.auth,
            health_timeout: spec.builder.health_timeout,
            child: None,
            log_path,
            dir,
        };
        server.launch()?;
        Ok(server)
    }

    /// Runs the binary with the stored arguments, appending to the log so a
    /// restart keeps the history of earlier runs.
    fn launch(&mut self) -> Result<()> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)?;
        let child = Command::new(&self.bin)
            .args(&self.args)
            // etcd reads ETCD_* variables as flags and warns about unknown ones.
            .env_remove("ETCD_BIN")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| io_error(format!("cannot run {}: {e}", self.bin.display())))?;
        self.child = Some(child);
        Ok(())
    }

    /// Polls `/health` until it says true, the process exits, or the
    /// health timeout passes; errors carry the tail of etcd's log.
    pub(crate) fn wait_healthy(&mut self) -> Result<()> {
        let deadline = deadline_after(self.health_timeout);
        loop {
            let exited = match self.child.as_mut() {
                Some(child) => child.try_wait()?,
                None => return Err(self.start_error("etcd is not running (it was killed)")),
            };
            if let Some(status) = exited {
                self.child = None;
                return Err(self.start_error(&format!("etcd exited during start-up ({status})")));
            }
            if self.is_healthy() {
                return Ok(());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let why = format!("etcd not healthy after {:?}", self.health_timeout);
                return Err(self.start_error(&why));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn start_error(&self, what: &str) -> Error {
        Error::Connect {
            backend: "etcd",
            endpoints: self.endpoint(),
            kind: crate::ErrorKind::Unavailable,
            reason: format!("{what}; etcd's log:\n{}", self.log_excerpt()),
        }
    }

    /// The log's first lines (where etcd reports bad flags, followed by
    /// pages of usage) and its last lines (where it reports runtime trouble).
    fn log_excerpt(&self) -> String {
        const HEAD: usize = 5;
        const TAIL: usize = 20;
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() <= HEAD + TAIL {
            return lines.join("\n");
        }
        format!(
            "{}\n[...]\n{}",
            lines[..HEAD].join("\n"),
            lines[lines.len() - TAIL..].join("\n")
        )
    }

    fn log_text(&self) -> String {
        process::log_text(&self.log_path)
    }

    /// True when this start failed because another process took a port.
    pub(crate) fn lost_port_race(&self) -> bool {
        self.log_text().contains("address already in use")
    }

    /// `127.0.0.1:PORT`, the client endpoint. Stable across restarts.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// Where `/health` and `/metrics` answer plain HTTP: the client port,
    /// or the metrics port when the client port speaks TLS.
    pub(crate) fn http_addr(&self) -> std::net::SocketAddr {
        net::loopback(self.metrics_port.unwrap_or(self.client_port))
    }

    /// What etcd has served so far, per gRPC method, from its own
    /// `/metrics` page: calls started (unary calls and streams alike) and
    /// messages received (for a stream, one per request on it: a renewal
    /// on a keepalive stream, a watch request on a watch stream). Counts
    /// since the process started; take two and subtract.
    ///
    /// ```
    /// use fleetcoord::testing::EtcdServer;
    ///
    /// let etcd = EtcdServer::start()?;
    /// let before = etcd.grpc_counts()?;
    /// let _ = fleetcoord::Etcd::with_options(&etcd.endpoints(), Default::default())?;
    /// let after = etcd.grpc_counts()?;
    /// assert!(after.started("Status") > before.started("Status"));
    /// # Ok::<(), fleetcoord::Error>(())
    /// ```
    pub fn grpc_counts(&self) -> Result<GrpcCounts> {
        match net::http(
            self.http_addr(),
            "GET",
            "/metrics",
            "",
            Duration::from_secs(2),
        ) {
            Ok((200, body)) => Ok(GrpcCounts::parse(&body)),
            Ok((status, _)) => Err(Error::Io(std::io::Error::other(format!(
                "test etcd: /metrics answered HTTP {status}"
            )))),
            Err(e) => Err(Error::Io(e)),
        }
    }

    /// The value of one unlabelled sample on this server's `/metrics` page
    /// (e.g. `etcd_debugging_lease_renewed_total`, which only the raft
    /// leader counts: followers forward renewals to it), or `None` when the
    /// page has no such line.
    pub fn metric(&self, name: &str) -> Result<Option<f64>> {
        match net::http(
            self.http_addr(),
            "GET",
            "/metrics",
            "",
            Duration::from_secs(2),
        ) {
            Ok((200, body)) => Ok(body.lines().find_map(|line| {
                let (key, value) = line.split_once(' ')?;
                (key == name).then(|| value.trim().parse().ok()).flatten()
            })),
            Ok((status, _)) => Err(Error::Io(std::io::Error::other(format!(
                "test etcd: /metrics answered HTTP {status}"
            )))),
            Err(e) => Err(Error::Io(e)),
        }
    }

    /// The test certificates when this server speaks TLS.
    pub fn pki(&self) -> Option<&TestPki> {
        self.pki.as_deref()
    }

    pub(crate) fn auth_enabled(&self) -> bool {
        self.auth
    }

    /// Password of `root` on servers started with [`EtcdBuilder::auth`].
    pub const ROOT_PASSWORD: &'static str = "fleetcoord-test-root";

    /// `root` and [`EtcdServer::ROOT_PASSWORD`].
    pub fn root_user(&self) -> Result<EtcdUser> {
        EtcdUser::new("root", Self::ROOT_PASSWORD)
    }

    /// Create user `name` with `password` whose own role may read and write
    /// every key under `prefix` (e.g. `"/coord/"`) and nothing else; with
    /// `None`, a user with no role at all. Authenticates as `root` when the
    /// server runs with [`EtcdBuilder::auth`].
    pub fn create_user(
        &self,
        name: &str,
        password: &str,
        prefix: Option<&str>,
    ) -> Result<EtcdUser> {
        let root = if self.auth {
            Some(self.root_user()?)
        } else {
            None
        };
        self.admin(root)?.create_user(name, password, prefix)?;
        EtcdUser::new(name, password)
    }

    /// The harness's administrator on this server (root once auth is on).
    pub(crate) fn admin(&self, root: Option<EtcdUser>) -> Result<Admin> {
        let tls = match &self.pki {
            Some(pki) if self.client_cert_auth => Some(pki.client_tls()?),
            Some(pki) => Some(pki.server_tls()?),
            None => None,
        };
        Ok(Admin {
            endpoints: vec![self.endpoint()],
            tls,
            root,
        })
    }

    /// The client endpoint as a one-element list, the shape connect calls take.
    pub fn endpoints(&self) -> Vec<String> {
        vec![self.endpoint()]
    }

    /// The process id while the process runs (also while paused); `None`
    /// after [`kill`](EtcdServer::kill).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The data directory (inside the temp dir removed on drop).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// True if `GET /health` answers `"health":"true"` within one second.
    /// A paused or killed server is not healthy; neither is a cluster member
    /// without quorum.
    pub fn is_healthy(&self) -> bool {
        matches!(
            net::http(self.http_addr(), "GET", "/health", "", Duration::from_secs(1)),
            Ok((200, body)) if body.contains("\"health\":\"true\"")
        )
    }

    /// SIGKILLs the process and waits for it to be gone. The data directory
    /// stays, so [`restart`](EtcdServer::restart) finds the same data. Does
    /// nothing if it is already killed.
    pub fn kill(&mut self) -> Result<()> {
        process::kill(&mut self.child)
    }

    /// Kills the process if it runs, starts it again on the same ports with
    /// the same data directory and waits until it is healthy. A cluster
    /// member needs quorum to report healthy.
    pub fn restart(&mut self) -> Result<()> {
        self.kill()?;
        self.launch()?;
        self.wait_healthy()
    }

    /// Freezes the process with SIGSTOP: connections stay open, nothing is
    /// answered, leases stop being checked until [`resume`](EtcdServer::resume).
    pub fn pause(&self) -> Result<()> {
        self.signal("STOP")
    }

    /// Continues a paused process with SIGCONT.
    pub fn resume(&self) -> Result<()> {
        self.signal("CONT")
    }

    fn signal(&self, sig: &str) -> Result<()> {
        process::signal(self.pid(), sig, "etcd")
    }

    /// The last `n` lines of etcd's combined stdout and stderr (all runs).
    pub fn log_tail(&self, n: usize) -> String {
        process::log_tail(&self.log_path, n)
    }

    /// The path of the log file (inside the temp dir removed on drop).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// A token per cluster so members of two test clusters never talk to each
/// other even if a port is reused.
pub(crate) fn unique_token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "fleetcoord-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn io_error(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

const INSTALL_HINT: &str = "run `make test` (which installs it) or \
    `apt-get install etcd-server`, or set ETCD_BIN to the etcd binary";

/// `$ETCD_BIN`, else the first `etcd` file on `PATH`.
fn find_etcd() -> Result<PathBuf> {
    find_etcd_in(std::env::var_os("ETCD_BIN"), std::env::var_os("PATH"))
}

fn find_etcd_in(etcd_bin: Option<OsString>, path: Option<OsString>) -> Result<PathBuf> {
    process::find_bin_in("ETCD_BIN", "etcd", INSTALL_HINT, etcd_bin, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(r: Result<PathBuf>) -> String {
        match r {
            Err(Error::Io(e)) if e.kind() == io::ErrorKind::NotFound => e.to_string(),
            other => panic!("expected a not-found error, got {other:?}"),
        }
    }

    #[test]
    fn missing_binary_says_how_to_install() {
        let empty = tempfile::tempdir().unwrap();
        let msg = message(find_etcd_in(None, Some(empty.path().into())));
        assert!(msg.contains("etcd not found"), "{msg}");
        assert!(msg.contains("make test"), "{msg}");
        assert!(msg.contains("apt-get install etcd-server"), "{msg}");
        assert!(msg.contains("ETCD_BIN"), "{msg}");
    }

    #[test]
    fn etcd_bin_wins_and_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-etcd");
        let msg = message(find_etcd_in(Some(missing.clone().into()), None));
        assert!(msg.contains("ETCD_BIN="), "{msg}");
        assert!(msg.contains("make test"), "{msg}");

        let fake = dir.path().join("my-etcd");
        std::fs::write(&fake, b"").unwrap();
        let on_path = dir.path().join("etcd");
        std::fs::write(&on_path, b"").unwrap();
        assert_eq!(find_etcd_in(Some(fake.clone().into()), None).unwrap(), fake);
        assert_eq!(
            find_etcd_in(None, Some(dir.path().into())).unwrap(),
            on_path
        );
    }
}

/// etcd's gRPC counters, per method ([`EtcdServer::grpc_counts`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrpcCounts {
    started: std::collections::BTreeMap<String, u64>,
    received: std::collections::BTreeMap<String, u64>,
    handled: std::collections::BTreeMap<String, u64>,
}

impl GrpcCounts {
    /// Calls of `method` (e.g. `"Range"`, `"LeaseKeepAlive"`) started.
    pub fn started(&self, method: &str) -> u64 {
        self.started.get(method).copied().unwrap_or(0)
    }

    /// Messages received on calls of `method`.
    pub fn received(&self, method: &str) -> u64 {
        self.received.get(method).copied().unwrap_or(0)
    }

    /// Calls of `method` that have ended, whatever their status: a stream
    /// counts once either side closed or canceled it, so `started` less
    /// `handled` is how many streams of `method` are open.
    pub fn handled(&self, method: &str) -> u64 {
        self.handled.get(method).copied().unwrap_or(0)
    }

    /// Every method with a call started, and how many.
    pub fn started_by_method(&self) -> impl Iterator<Item = (&str, u64)> {
        self.started.iter().map(|(m, n)| (m.as_str(), *n))
    }

    /// These counts less `earlier`'s, per method (zero where a counter
    /// went backwards, as after a restart).
    #[must_use]
    pub fn since(&self, earlier: &GrpcCounts) -> GrpcCounts {
        let minus = |now: &std::collections::BTreeMap<String, u64>,
                     then: &std::collections::BTreeMap<String, u64>| {
            now.iter()
                .map(|(m, n)| {
                    (
                        m.clone(),
                        n.saturating_sub(then.get(m).copied().unwrap_or(0)),
                    )
                })
                .filter(|(_, n)| *n > 0)
                .collect()
        };
        GrpcCounts {
            started: minus(&self.started, &earlier.started),
            received: minus(&self.received, &earlier.received),
            handled: minus(&self.handled, &earlier.handled),
        }
    }

    /// Adds `other`'s counts to these (to sum over members).
    pub fn add(&mut self, other: &GrpcCounts) {
        for (m, n) in &other.started {
            let slot = self.started.entry(m.clone()).or_default();
            *slot = slot.saturating_add(*n);
        }
        for (m, n) in &other.received {
            let slot = self.received.entry(m.clone()).or_default();
            *slot = slot.saturating_add(*n);
        }
        for (m, n) in &other.handled {
            let slot = self.handled.entry(m.clone()).or_default();
            *slot = slot.saturating_add(*n);
        }
    }

    /// Reads `grpc_server_started_total`, `grpc_server_msg_received_total`
    /// and `grpc_server_handled_total` lines of a Prometheus text page.
    fn parse(page: &str) -> GrpcCounts {
        let mut counts = GrpcCounts::default();
        for line in page.lines() {
            let map = if line.starts_with("grpc_server_started_total{") {
                &mut counts.started
            } else if line.starts_with("grpc_server_msg_received_total{") {
                &mut counts.received
            } else if line.starts_with("grpc_server_handled_total{") {
                // One line per status code; they add up per method.
                &mut counts.handled
            } else {
                continue;
            };
            let method = line
                .split("grpc_method=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next());
            let value = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v >= 0.0);
            if let (Some(method), Some(value)) = (method, value) {
                // Counters are whole numbers; etcd prints them as floats.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let value = value as u64;
                let slot = map.entry(method.to_string()).or_default();
                *slot = slot.saturating_add(value);
            }
        }
        counts
    }
}

#[cfg(test)]
mod grpc_counts_tests {
    use super::GrpcCounts;

    #[test]
    fn parses_started_and_received_per_method_and_subtracts() {
        let page = "# HELP grpc_server_started_total x\n\
            grpc_server_started_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 7\n\
            grpc_server_started_total{grpc_method=\"Watch\",grpc_service=\"grpc.health.v1.Health\",grpc_type=\"server_stream\"} 1\n\
            grpc_server_started_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"} 2\n\
            grpc_server_msg_received_total{grpc_method=\"LeaseKeepAlive\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"} 1.5e+03\n\
            grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 7\n\
            grpc_server_started_total{grpc_method=\"Put\"} NaN\n";
        let c = GrpcCounts::parse(page);
        assert_eq!(c.started("Range"), 7);
        assert_eq!(c.started("Watch"), 3, "both services' Watch");
        assert_eq!(c.started("Put"), 0, "NaN is no count");
        assert_eq!(c.received("LeaseKeepAlive"), 1500);
        assert_eq!(c.handled("Range"), 7);
        let mut later = c.clone();
        later.add(&GrpcCounts::parse(
            "grpc_server_started_total{grpc_method=\"Range\"} 2\n",
        ));
        let d = later.since(&c);
        assert_eq!(d.started("Range"), 2);
        assert_eq!(d.started_by_method().count(), 1);
        assert_eq!(c.since(&later).started("Range"), 0, "never below zero");
    }
}
