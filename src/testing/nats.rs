//! Real `nats-server -js` processes: one server, or a cluster with routes.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::nats_jwt::Decentralized;
use super::net;
use super::pki::{ServerNames, TestPki};
use super::process;
use super::server::unique_token;
use crate::deadline::deadline_after;
use crate::{Error, Result};

/// How many times a start is retried after another process took a port.
const PORT_ATTEMPTS: usize = 3;

/// How long a start or restart waits for `/healthz` (and, in a cluster,
/// for a JetStream meta leader).
const HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

/// The servers' `max_payload`: fleetcoord accepts payloads up to
/// [`MAX_PAYLOAD`](crate::coordinator::MAX_PAYLOAD) (~1.5 MiB), above the
/// server's 1 MiB default; 4 MiB leaves room for headers.
pub const TEST_MAX_PAYLOAD: usize = 4 * 1024 * 1024;

/// Optional authentication a test server requires.
#[derive(Clone, Debug, Default)]
enum Auth {
    #[default]
    None,
    UserPassword(String, String),
    Token(String),
    /// One user known by the public key of a fresh NKey.
    NKey,
    /// Operator mode: a fresh operator, account and user (JWTs).
    Jwt,
}

/// Whether clients must use TLS, and present a certificate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum TlsMode {
    #[default]
    Off,
    Server,
    VerifyClients,
}

/// Keys and certificates made for one start, shared by a cluster's nodes
/// and kept across restarts.
#[derive(Clone, Default)]
struct Secrets {
    pki: Option<Arc<TestPki>>,
    nkey: Option<Arc<nkeys::KeyPair>>,
    decentralized: Option<Arc<Decentralized>>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("pki", &self.pki)
            .field("nkey", &self.nkey.as_ref().map(|k| k.public_key()))
            .field(
                "user",
                &self.decentralized.as_ref().map(|d| d.user_public.clone()),
            )
            .finish()
    }
}

impl Secrets {
    fn generate(builder: &NatsBuilder) -> Result<Secrets> {
        Ok(Secrets {
            pki: match builder.tls {
                TlsMode::Off => None,
                TlsMode::Server | TlsMode::VerifyClients => Some(Arc::new(TestPki::generate_for(
                    builder.tls_names.unwrap_or(ServerNames::Loopback),
                )?)),
            },
            nkey: matches!(builder.auth, Auth::NKey).then(|| Arc::new(nkeys::KeyPair::new_user())),
            decentralized: match builder.auth {
                Auth::Jwt => Some(Arc::new(Decentralized::generate()?)),
                _ => None,
            },
        })
    }
}

/// Options for starting a [`NatsServer`] or [`NatsCluster`].
///
/// ```
/// use fleetcoord::testing::NatsBuilder;
///
/// let nats = NatsBuilder::new().user_password("app", "s3cret").start()?;
/// assert!(nats.is_healthy());
/// # Ok::<(), fleetcoord::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct NatsBuilder {
    auth: Auth,
    tls: TlsMode,
    /// The names of the server certificate; `None`: loopback.
    tls_names: Option<ServerNames>,
    /// The server's ping interval, in whole seconds; `None`: its default.
    ping_secs: Option<u64>,
}

impl NatsBuilder {
    /// No authentication, JetStream on, `max_payload` [`TEST_MAX_PAYLOAD`].
    pub fn new() -> Self {
        NatsBuilder::default()
    }

    /// Clients must log in with this user and password.
    pub fn user_password(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.auth = Auth::UserPassword(user.into(), password.into());
        self
    }

    /// Clients must present this token.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.auth = Auth::Token(token.into());
        self
    }

    /// Clients must log in as the one user of the server, known by the
    /// public key of an NKey made at start; its seed is
    /// [`NatsServer::nkey_seed`].
    pub fn nkey_user(mut self) -> Self {
        self.auth = Auth::NKey;
        self
    }

    /// The server runs in operator mode (decentralized JWT auth) with an
    /// operator, one account with JetStream and one user made at start,
    /// the account preloaded into a memory resolver. Clients log in with
    /// the user's `.creds` file, [`NatsServer::creds_path`].
    pub fn jwt_auth(mut self) -> Self {
        self.auth = Auth::Jwt;
        self
    }

    /// Clients must connect with TLS; the server's certificate is from a
    /// [`TestPki`] made at start ([`NatsServer::pki`]), valid for
    /// `127.0.0.1` and `localhost`, and [`NatsServer::url`] is `tls://`.
    pub fn tls(mut self) -> Self {
        if self.tls == TlsMode::Off {
            self.tls = TlsMode::Server;
        }
        self
    }

    /// [`NatsBuilder::tls`] with a server certificate valid for `names`
    /// only, e.g. [`ServerNames::LocalhostOnly`] to test a name mismatch
    /// (the URL still dials `127.0.0.1`).
    pub fn tls_for(mut self, names: ServerNames) -> Self {
        self.tls_names = Some(names);
        self.tls()
    }

    /// [`NatsBuilder::tls`], and clients must also present a certificate
    /// signed by the [`TestPki`]'s CA (the server's `verify: true`).
    pub fn tls_verify_clients(mut self) -> Self {
        self.tls = TlsMode::VerifyClients;
        self
    }

    /// The server pings each client every `interval` (whole seconds, at
    /// least 1) and closes a connection that leaves one ping unanswered
    /// (`ping_max: 1`) as stale; the server's log says `Stale Connection`.
    pub fn ping_interval(mut self, interval: Duration) -> Self {
        self.ping_secs = Some(interval.as_secs().max(1));
        self
    }

    /// Starts one server and waits until it is healthy.
    pub fn start(&self) -> Result<NatsServer> {
        NatsServer::start_with(self)
    }

    /// Starts an `n`-node cluster and waits until every node is healthy and
    /// JetStream has a meta leader.
    pub fn start_cluster(&self, n: usize) -> Result<NatsCluster> {
        NatsCluster::start_with(self, n)
    }
}

/// A real `nats-server` with JetStream on free loopback ports and its own
/// temporary store directory.
///
/// Guarantees: after a start returns `Ok`, the server answered
/// `GET /healthz` (which in 2.9 includes JetStream) with `ok`. The ports
/// and the store stay the same across [`restart`](NatsServer::restart).
/// Dropping the value SIGKILLs the process (also when paused), waits for
/// it and deletes the store and the log.
///
/// The binary is `$NATS_SERVER_BIN`, else `nats-server` from `PATH`; when
/// missing, starting fails with an error saying how to install it.
///
/// ```
/// use fleetcoord::testing::NatsServer;
///
/// let mut nats = NatsServer::start()?;
/// nats.kill()?;
/// assert!(!nats.is_healthy());
/// nats.restart()?; // same port, same store
/// assert!(nats.is_healthy());
/// # Ok::<(), fleetcoord::Error>(())
/// ```
#[derive(Debug)]
pub struct NatsServer {
    bin: PathBuf,
    secrets: Secrets,
    client_port: u16,
    http_port: u16,
    child: Option<Child>,
    config_path: PathBuf,
    log_path: PathBuf,
    // Last field: dropped after `Drop::drop` killed the process.
    dir: tempfile::TempDir,
}

/// Ports and names of one node.
struct NodeSpec<'a> {
    name: String,
    client_port: u16,
    http_port: u16,
    /// `(cluster name, own route port, every node's route port)`.
    cluster: Option<(String, u16, Vec<u16>)>,
    builder: &'a NatsBuilder,
    secrets: Secrets,
}

impl NatsServer {
    /// Starts one server with default options (see [`NatsBuilder::new`]).
    pub fn start() -> Result<NatsServer> {
        NatsBuilder::new().start()
    }

    fn start_with(builder: &NatsBuilder) -> Result<NatsServer> {
        let secrets = Secrets::generate(builder)?;
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let spec = NodeSpec {
                name: "fleetcoord-test".into(),
                client_port: net::free_port()?,
                http_port: net::free_port()?,
                cluster: None,
                builder,
                secrets: secrets.clone(),
            };
            let mut server = NatsServer::spawn(&spec)?;
            match server.wait_healthy() {
                Ok(()) => return Ok(server),
                Err(e) if server.lost_port_race() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io_error("no start attempt was made").into()))
    }

    fn spawn(spec: &NodeSpec<'_>) -> Result<NatsServer> {
        let bin = find_nats_server()?;
        let dir = tempfile::Builder::new()
            .prefix("fleetcoord-nats-")
            .tempdir()?;
        let store = dir.path().join("store");
        let mut config = format!(
            "server_name: \"{name}\"\nlisten: \"127.0.0.1:{client}\"\nhttp: \"127.0.0.1:{http}\"\n\
             max_payload: {TEST_MAX_PAYLOAD}\njetstream {{ store_dir: \"{store}\" }}\n",
            name = spec.name,
            client = spec.client_port,
            http = spec.http_port,
            store = store.display(),
        );
        if let Some(secs) = spec.builder.ping_secs {
            config.push_str(&format!("ping_interval: \"{secs}s\"\nping_max: 1\n"));
        }
        match &spec.builder.auth {
            Auth::None => {}
            Auth::UserPassword(user, password) => config.push_str(&format!(
                "authorization {{ user: {}, password: {} }}\n",
                quoted(user),
                quoted(password)
            )),
            Auth::Token(token) => {
                config.push_str(&format!("authorization {{ token: {} }}\n", quoted(token)))
            }
            Auth::NKey => {
                if let Some(key) = &spec.secrets.nkey {
                    config.push_str(&format!(
                        "authorization {{ users: [ {{ nkey: {} }} ] }}\n",
                        quoted(&key.public_key())
                    ));
                }
            }
            Auth::Jwt => {
                if let Some(d) = &spec.secrets.decentralized {
                    config.push_str(&format!(
                        "operator: {}\nsystem_account: {}\nresolver: MEMORY\n\
                         resolver_preload: {{ {}: {}, {}: {} }}\n",
                        quoted(&d.operator_jwt),
                        quoted(&d.system_public),
                        quoted(&d.system_public),
                        quoted(&d.system_jwt),
                        quoted(&d.account_public),
                        quoted(&d.account_jwt),
                    ));
                    std::fs::write(dir.path().join(CREDS_FILE), &d.creds)?;
                }
            }
        }
        if let Some(pki) = &spec.secrets.pki {
            // A generous handshake timeout: the default (half a second in
            // 2.9) is short for a loaded test machine.
            config.push_str(&format!(
                "tls {{ cert_file: {}, key_file: {}, ca_file: {}, verify: {}, timeout: 5 }}\n",
                quoted(&pki.server_cert_path().display().to_string()),
                quoted(&pki.server_key_path().display().to_string()),
                quoted(&pki.ca_path().display().to_string()),
                spec.builder.tls == TlsMode::VerifyClients,
            ));
        }
        if let Some((cluster, route_port, all)) = &spec.cluster {
            let routes = all
                .iter()
                .filter(|p| *p != route_port)
                .map(|p| format!("\"nats-route://127.0.0.1:{p}\""))
                .collect::<Vec<_>>()
                .join(", ");
            config.push_str(&format!(
                "cluster {{ name: \"{cluster}\", listen: \"127.0.0.1:{route_port}\", routes: [{routes}] }}\n"
            ));
        }
        let config_path = dir.path().join("nats.conf");
        std::fs::write(&config_path, config)?;
        let mut server = NatsServer {
            bin,
            secrets: spec.secrets.clone(),
            client_port: spec.client_port,
            http_port: spec.http_port,
            child: None,
            config_path,
            log_path: dir.path().join("nats.log"),
            dir,
        };
        server.launch()?;
        Ok(server)
    }

    fn launch(&mut self) -> Result<()> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)?;
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| io_error(format!("cannot run {}: {e}", self.bin.display())))?;
        self.child = Some(child);
        Ok(())
    }

    /// Polls `/healthz` until it says ok, the process exits, or the health
    /// timeout passes; errors carry the tail of the server's log.
    fn wait_healthy(&mut self) -> Result<()> {
        let deadline = deadline_after(HEALTH_TIMEOUT);
        loop {
            let exited = match self.child.as_mut() {
                Some(child) => child.try_wait()?,
                None => return Err(self.start_error("nats-server is not running (killed)")),
            };
            if let Some(status) = exited {
                self.child = None;
                return Err(self.start_error(&format!("nats-server exited ({status})")));
            }
            if self.is_healthy() {
                return Ok(());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(self.start_error(&format!("not healthy after {HEALTH_TIMEOUT:?}")));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn start_error(&self, what: &str) -> Error {
        Error::Io(io::Error::other(format!(
            "nats-server at {}: {what}; its log:\n{}",
            self.url(),
            self.log_tail(20)
        )))
    }

    fn lost_port_race(&self) -> bool {
        self.log_tail(50).contains("address already in use")
    }

    /// `nats://127.0.0.1:PORT`, the client URL (`tls://` for a server
    /// started with [`NatsBuilder::tls`]). Stable across restarts.
    pub fn url(&self) -> String {
        let scheme = if self.secrets.pki.is_some() {
            "tls"
        } else {
            "nats"
        };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The certificates of a server started with [`NatsBuilder::tls`] (or
    /// [`NatsBuilder::tls_verify_clients`]): its CA verifies the server,
    /// and its client certificate is one the server accepts. A cluster's
    /// nodes share one.
    pub fn pki(&self) -> Option<&TestPki> {
        self.secrets.pki.as_deref()
    }

    /// The seed of the one user of a server started with
    /// [`NatsBuilder::nkey_user`] (`SU...`, a secret).
    pub fn nkey_seed(&self) -> Option<String> {
        self.secrets.nkey.as_ref().and_then(|k| k.seed().ok())
    }

    /// The `.creds` file (user JWT and seed) of a server started with
    /// [`NatsBuilder::jwt_auth`], in the server's temp dir.
    pub fn creds_path(&self) -> Option<PathBuf> {
        self.secrets
            .decentralized
            .as_ref()
            .map(|_| self.dir.path().join(CREDS_FILE))
    }

    /// The public key of the user of a server started with
    /// [`NatsBuilder::nkey_user`] or [`NatsBuilder::jwt_auth`] (`U...`).
    pub fn user_public_key(&self) -> Option<String> {
        match (&self.secrets.nkey, &self.secrets.decentralized) {
            (Some(key), _) => Some(key.public_key()),
            (None, Some(d)) => Some(d.user_public.clone()),
            (None, None) => None,
        }
    }

    /// The process id while it runs (also while paused); `None` after
    /// [`kill`](NatsServer::kill).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The JetStream store directory (inside the temp dir removed on drop).
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// True if `GET /healthz` answers `ok` within one second. A paused or
    /// killed server is not healthy.
    pub fn is_healthy(&self) -> bool {
        self.monitor("/healthz")
            .is_some_and(|(status, body)| status == 200 && body.contains("\"ok\""))
    }

    /// A monitoring endpoint's status and body.
    fn monitor(&self, path: &str) -> Option<(u16, String)> {
        net::http(
            net::loopback(self.http_port),
            "GET",
            path,
            "",
            Duration::from_secs(1),
        )
        .ok()
    }

    /// SIGKILLs the process and waits for it. The store stays for
    /// [`restart`](NatsServer::restart). Does nothing if already killed.
    pub fn kill(&mut self) -> Result<()> {
        process::kill(&mut self.child)
    }

    /// Kills the process if it runs, starts it again on the same ports with
    /// the same store, and waits until it is healthy.
    pub fn restart(&mut self) -> Result<()> {
        self.kill()?;
        self.launch()?;
        self.wait_healthy()
    }

    /// Freezes the process with SIGSTOP until [`resume`](NatsServer::resume).
    pub fn pause(&self) -> Result<()> {
        self.signal("STOP")
    }

    /// Continues a paused process with SIGCONT.
    pub fn resume(&self) -> Result<()> {
        self.signal("CONT")
    }

    fn signal(&self, sig: &str) -> Result<()> {
        process::signal(self.pid(), sig, "nats-server")
    }

    /// The last `n` lines of the server's log (all runs).
    pub fn log_tail(&self, n: usize) -> String {
        process::log_tail(&self.log_path, n)
    }

    /// The path of the log file (inside the temp dir removed on drop).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// A NATS cluster of `n` real `nats-server -js` processes on loopback,
/// connected by routes, each a [`NatsServer`] with its own store.
///
/// Guarantees: after a start returns `Ok`, every node is healthy and the
/// JetStream meta group has a leader, so streams with up to `n` replicas
/// can be created. Dropping it kills every node and removes their stores.
///
/// ```no_run
/// use fleetcoord::testing::NatsCluster;
///
/// let mut cluster = NatsCluster::start(3)?;
/// let urls = cluster.urls(); // "nats://127.0.0.1:a,nats://127.0.0.1:b,..."
/// cluster.kill(0)?;
/// cluster.restart(0)?;
/// # Ok::<(), fleetcoord::Error>(())
/// ```
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<NatsServer>,
}

impl NatsCluster {
    /// Starts `n` nodes (at least 1) with default options.
    pub fn start(n: usize) -> Result<NatsCluster> {
        NatsBuilder::new().start_cluster(n)
    }

    fn start_with(builder: &NatsBuilder, n: usize) -> Result<NatsCluster> {
        if n == 0 {
            return Err(Error::invalid("n", "a cluster needs at least one node"));
        }
        let secrets = Secrets::generate(builder)?;
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let ports = (0..n)
                .map(|_| Ok((net::free_port()?, net::free_port()?, net::free_port()?)))
                .collect::<io::Result<Vec<(u16, u16, u16)>>>()?;
            let routes: Vec<u16> = ports.iter().map(|p| p.2).collect();
            let name = unique_token();
            let mut nodes = Vec::with_capacity(n);
            for (i, (client_port, http_port, route_port)) in ports.iter().enumerate() {
                nodes.push(NatsServer::spawn(&NodeSpec {
                    name: format!("n{i}"),
                    client_port: *client_port,
                    http_port: *http_port,
                    cluster: Some((name.clone(), *route_port, routes.clone())),
                    builder,
                    secrets: secrets.clone(),
                })?);
            }
            let mut cluster = NatsCluster { nodes };
            match cluster.wait_ready() {
                Ok(()) => return Ok(cluster),
                Err(e) if cluster.nodes.iter().any(NatsServer::lost_port_race) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io_error("no start attempt was made").into()))
    }

    fn wait_ready(&mut self) -> Result<()> {
        for node in &mut self.nodes {
            node.wait_healthy()?;
        }
        let deadline = deadline_after(HEALTH_TIMEOUT);
        loop {
            let led = self.nodes.iter().all(|node| {
                node.monitor("/jsz")
                    // Pretty-printed JSON: compare without blanks.
                    .is_some_and(|(_, body)| {
                        let compact: String = body.chars().filter(|c| !c.is_whitespace()).collect();
                        compact.contains("\"leader\":\"")
                    })
            });
            if led {
                return Ok(());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(self.nodes[0].start_error("no JetStream meta leader"));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every node's URL, comma-separated: what a client is given.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(NatsServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes, in start order.
    pub fn nodes(&self) -> &[NatsServer] {
        &self.nodes
    }

    /// Node `i`, for faults beyond kill and restart (pause, logs).
    pub fn node(&self, i: usize) -> Result<&NatsServer> {
        self.nodes
            .get(i)
            .ok_or_else(|| Error::invalid("node", format!("{i} is not below {}", self.nodes.len())))
    }

    /// The node leading the JetStream stream `stream` (its server-side
    /// name, e.g. `COORD_S_jobs` for coordinator stream `jobs`, `KV_b` for
    /// bucket `b`), as the nodes' `/jsz` reports it; `None` while it has no
    /// leader or no live node knows it.
    pub fn stream_leader(&self, stream: &str) -> Option<usize> {
        let name = format!("\"name\":\"{stream}\"");
        for node in &self.nodes {
            let Some((200, body)) = node.monitor("/jsz?streams=true") else {
                continue;
            };
            let compact: String = body.chars().filter(|c| !c.is_whitespace()).collect();
            let Some(at) = compact.find(&name) else {
                continue;
            };
            // This stream's details (name, created, cluster {leader, ...})
            // run up to the next stream's "created".
            let rest = &compact[at + name.len()..];
            let created = "\"created\":";
            let details = match rest.find(created) {
                Some(first) => {
                    let after = &rest[first + created.len()..];
                    after.find(created).map_or(after, |end| &after[..end])
                }
                None => rest,
            };
            let leader = details
                .split("\"leader\":\"")
                .nth(1)
                .and_then(|l| l.split('"').next());
            if let Some(leader) = leader {
                return leader.strip_prefix('n').and_then(|i| i.parse().ok());
            }
        }
        None
    }

    /// SIGKILLs node `i`.
    pub fn kill(&mut self, i: usize) -> Result<()> {
        self.node_mut(i)?.kill()
    }

    /// Restarts node `i` with its store and waits until it is healthy.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.node_mut(i)?.restart()
    }

    fn node_mut(&mut self, i: usize) -> Result<&mut NatsServer> {
        let n = self.nodes.len();
        self.nodes
            .get_mut(i)
            .ok_or_else(|| Error::invalid("node", format!("{i} is not below {n}")))
    }
}

/// The name of a [`NatsBuilder::jwt_auth`] server's `.creds` file.
const CREDS_FILE: &str = "user.creds";

/// A string in the server config's double quotes.
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn io_error(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

const INSTALL_HINT: &str = "run `make deps-nats` or `apt-get install nats-server`, \
    or set NATS_SERVER_BIN to the nats-server binary";

fn find_nats_server() -> Result<PathBuf> {
    find_in(
        std::env::var_os("NATS_SERVER_BIN"),
        std::env::var_os("PATH"),
    )
}

fn find_in(explicit: Option<OsString>, path: Option<OsString>) -> Result<PathBuf> {
    process::find_bin_in(
        "NATS_SERVER_BIN",
        "nats-server",
        INSTALL_HINT,
        explicit,
        path,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_says_how_to_install() {
        let empty = tempfile::tempdir().unwrap();
        let msg = match find_in(None, Some(empty.path().into())) {
            Err(Error::Io(e)) => e.to_string(),
            other => panic!("{other:?}"),
        };
        assert!(msg.contains("make deps-nats"), "{msg}");
        assert!(msg.contains("apt-get install nats-server"), "{msg}");
        let missing = empty.path().join("none");
        let msg = match find_in(Some(missing.into()), None) {
            Err(Error::Io(e)) => e.to_string(),
            other => panic!("{other:?}"),
        };
        assert!(msg.contains("NATS_SERVER_BIN="), "{msg}");
    }
}
