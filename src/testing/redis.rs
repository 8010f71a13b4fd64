//! One real `redis-server` process: start, kill, restart, pause, resume,
//! and a tiny RESP client for the harness' own checks.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::net;
use super::pki::TestPki;
use super::process;
use crate::{Error, Result};

/// How many times a start is retried when another process took the port
/// between our probe and the server's bind.
const PORT_ATTEMPTS: usize = 3;

/// How long a start or restart waits for the server to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

const INSTALL_HINT: &str = "run `make deps-redis` (Debian packages `redis-server` and \
    `redis-tools`), or set REDIS_SERVER_BIN / REDIS_CLI_BIN";

/// A real `redis-server` on a free loopback port, without persistence
/// (`--save '' --appendonly no`) unless started with
/// [`start_persistent`](RedisServer::start_persistent), in its own
/// temporary directory.
///
/// Guarantees: after [`RedisServer::start`] returns `Ok`, the server
/// answered `PING`. [`restart`](RedisServer::restart) keeps the port (and,
/// without persistence, loses the data). Dropping the value SIGKILLs the
/// process (also when paused), waits for it and deletes the directory.
///
/// The binary is `$REDIS_SERVER_BIN`, else `redis-server` from `PATH`; a
/// missing binary is an error saying how to install it, never a skip.
///
/// ```
/// use fleetcoord::testing::RedisServer;
///
/// let mut redis = RedisServer::start()?;
/// assert!(redis.url().starts_with("redis://127.0.0.1:"));
/// redis.pause()?; // SIGSTOP: connections stay open, nothing is answered
/// redis.resume()?;
/// redis.kill()?;
/// assert!(!redis.is_ready());
/// redis.restart()?; // same port, empty
/// assert!(redis.is_ready());
/// # Ok::<(), fleetcoord::Error>(())
/// ```
pub struct RedisServer {
    bin: PathBuf,
    args: Vec<String>,
    port: u16,
    /// The TLS port, when the server speaks TLS ([`RedisBuilder::tls`]).
    tls_port: Option<u16>,
    pki: Option<Arc<TestPki>>,
    child: Option<Child>,
    log_path: PathBuf,
    // Last field: dropped after `Drop::drop` killed the process.
    dir: tempfile::TempDir,
}

/// Options for starting a [`RedisServer`] or a [`RedisCluster`](super::RedisCluster): TLS with
/// test certificates, clients required to present one, ACL users, and
/// persistence.
///
/// A TLS server listens on two loopback ports: the TLS port that
/// [`RedisServer::url`] names (`rediss://`), for the client under test,
/// and a plain one ([`RedisServer::port`]) that only the harness uses
/// ([`RedisServer::command`], readiness checks, `redis-cli --cluster
/// create`). A cluster node answers `CLUSTER SLOTS` over TLS with the TLS
/// ports (Redis 7), so a TLS client never learns of a plain port.
///
/// ```
/// use fleetcoord::testing::RedisBuilder;
///
/// let server = RedisBuilder::new()
///     .tls()
///     .acl_user("app", "app-secret", &["~coord:*", "&coord:*", "+@all"])
///     .start()?;
/// assert!(server.url().starts_with("rediss://127.0.0.1:"));
/// assert!(server.pki().is_some());
/// // The harness's own commands run as `default` on the plain port.
/// assert_eq!(server.command(&["ACL", "WHOAMI"])?, "default");
/// # Ok::<(), fleetcoord::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct RedisBuilder {
    tls: bool,
    auth_clients: bool,
    persistent: bool,
    users: Vec<Vec<String>>,
}

/// Without the ACL users' passwords.
impl std::fmt::Debug for RedisBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBuilder")
            .field("tls", &self.tls)
            .field("auth_clients", &self.auth_clients)
            .field("persistent", &self.persistent)
            .field(
                "users",
                &self
                    .users
                    .iter()
                    .filter_map(|u| u.first())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl RedisBuilder {
    /// Plain TCP, no persistence, only the `default` user (no password).
    pub fn new() -> Self {
        RedisBuilder::default()
    }

    /// Serve TLS (`--tls-port`, and on a cluster `--tls-cluster yes
    /// --tls-replication yes`, so the cluster bus and replication are TLS
    /// too) with a [`TestPki`] generated at start (see
    /// [`RedisServer::pki`]); the server certificate is valid for
    /// `127.0.0.1` and `localhost`. Clients need not present a
    /// certificate (`--tls-auth-clients no`) unless
    /// [`RedisBuilder::tls_auth_clients`] says so.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// TLS (as [`RedisBuilder::tls`]) with `--tls-auth-clients yes`: clients
    /// must present a certificate signed by the test CA
    /// ([`TestPki::client_tls`]).
    pub fn tls_auth_clients(mut self) -> Self {
        self.tls = true;
        self.auth_clients = true;
        self
    }

    /// Keep the data across restarts, as [`RedisServer::start_persistent`].
    pub fn persistent(mut self) -> Self {
        self.persistent = true;
        self
    }

    /// An ACL user `name` with `password` and the ACL `rules` (e.g.
    /// `["~coord:*", "&coord:*", "-@all", "+ping"]`), defined on the
    /// command line (a `user` config line: `user NAME reset on >PASSWORD
    /// RULES...`), so it survives restarts. The `default` user stays
    /// enabled without a password for the harness.
    pub fn acl_user(mut self, name: &str, password: &str, rules: &[&str]) -> Self {
        let mut line = vec![
            name.to_string(),
            "reset".to_string(),
            "on".to_string(),
            format!(">{password}"),
        ];
        line.extend(rules.iter().map(|r| r.to_string()));
        self.users.push(line);
        self
    }

    /// Starts a standalone server and waits until it answers `PING`.
    pub fn start(&self) -> Result<RedisServer> {
        let pki = self.pki()?;
        RedisServer::start_configured(&self.args(&pki, false), pki)
    }

    pub(crate) fn pki(&self) -> Result<Option<Arc<TestPki>>> {
        Ok(if self.tls {
            Some(Arc::new(TestPki::generate()?))
        } else {
            None
        })
    }

    /// The `redis-server` arguments these options add; the TLS port is
    /// added at spawn time.
    pub(crate) fn args(&self, pki: &Option<Arc<TestPki>>, cluster: bool) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(pki) = pki {
            for (flag, value) in [
                ("--tls-cert-file", pki.server_cert_path()),
                ("--tls-key-file", pki.server_key_path()),
                ("--tls-ca-cert-file", pki.ca_path()),
            ] {
                args.push(flag.to_string());
                args.push(value.to_string_lossy().into_owned());
            }
            args.push("--tls-auth-clients".to_string());
            args.push(if self.auth_clients { "yes" } else { "no" }.to_string());
            if cluster {
                for flag in ["--tls-cluster", "--tls-replication"] {
                    args.push(flag.to_string());
                    args.push("yes".to_string());
                }
            }
        }
        if self.persistent {
            args.extend(persistence());
        }
        for user in &self.users {
            args.push("--user".to_string());
            args.extend(user.iter().cloned());
        }
        args
    }
}

impl RedisServer {
    /// Starts a standalone server and waits until it answers `PING`.
    pub fn start() -> Result<RedisServer> {
        RedisServer::start_with_args(&[])
    }

    /// Options for a TLS server, ACL users and more: [`RedisBuilder::new`].
    pub fn builder() -> RedisBuilder {
        RedisBuilder::new()
    }

    /// Starts a standalone server that keeps its data across
    /// [`restart`](RedisServer::restart): an append-only file, fsynced
    /// before every reply (`--appendonly yes --appendfsync always`), so
    /// every acknowledged write survives a kill.
    pub fn start_persistent() -> Result<RedisServer> {
        RedisServer::start_with_args(&persistence())
    }

    /// Starts a server with extra `redis-server` arguments (e.g.
    /// `["--cluster-enabled", "yes"]`).
    pub(crate) fn start_with_args(extra: &[String]) -> Result<RedisServer> {
        RedisServer::start_configured(extra, None)
    }

    /// Starts a server with extra arguments, serving TLS too with `pki`'s
    /// certificates when given (the TLS flags are in `extra`).
    pub(crate) fn start_configured(
        extra: &[String],
        pki: Option<Arc<TestPki>>,
    ) -> Result<RedisServer> {
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = net::free_port()?;
            let mut extra = extra.to_vec();
            let tls_port = match pki {
                Some(_) => {
                    let tls_port = net::free_port()?;
                    extra.push("--tls-port".to_string());
                    extra.push(tls_port.to_string());
                    Some(tls_port)
                }
                None => None,
            };
            let mut server = RedisServer::spawn(port, &extra)?;
            server.tls_port = tls_port;
            server.pki = pki.clone();
            match server.wait_ready() {
                Ok(()) => return Ok(server),
                Err(e) if server.log_text().contains("Address already in use") => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no start attempt was made").into()))
    }

    fn spawn(port: u16, extra: &[String]) -> Result<RedisServer> {
        let bin = find_bin("REDIS_SERVER_BIN", "redis-server")?;
        let dir = tempfile::Builder::new()
            .prefix("fleetcoord-redis-")
            .tempdir()?;
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir.path().to_string_lossy(),
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().cloned());
        let log_path = dir.path().join("redis.log");
        let mut server = RedisServer {
            bin,
            args,
            port,
            tls_port: None,
            pki: None,
            child: None,
            log_path,
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
            .args(&self.args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| io::Error::other(format!("cannot run {}: {e}", self.bin.display())))?;
        self.child = Some(child);
        Ok(())
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.child.as_mut() {
                None => return Err(self.start_error("redis-server is not running (it was killed)")),
                Some(child) => {
                    if let Some(status) = child.try_wait()? {
                        self.child = None;
                        return Err(self.start_error(&format!(
                            "redis-server exited during start-up ({status})"
                        )));
                    }
                }
            }
            if self.is_ready() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.start_error(&format!(
                    "redis-server did not answer PING within {READY_TIMEOUT:?}"
                )));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn start_error(&self, what: &str) -> Error {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        Error::Io(io::Error::other(format!(
            "{what} on port {}; its log:\n{tail}",
            self.port
        )))
    }

    fn log_text(&self) -> String {
        process::log_text(&self.log_path)
    }

    /// `redis://127.0.0.1:PORT`, or `rediss://127.0.0.1:TLS_PORT` for a
    /// TLS server. Stable across restarts.
    pub fn url(&self) -> String {
        match self.tls_port {
            Some(port) => format!("rediss://127.0.0.1:{port}"),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The plain port (on a TLS server, the harness's own). Stable across
    /// restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TLS port of a TLS server ([`RedisBuilder::tls`]).
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// The certificates of a TLS server ([`RedisBuilder::tls`]): its CA
    /// for [`TestPki::server_tls`], a client certificate for
    /// [`TestPki::client_tls`].
    pub fn pki(&self) -> Option<&TestPki> {
        self.pki.as_deref()
    }

    /// The process id while it runs (also while paused).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True if the server answers `PING` within one second.
    pub fn is_ready(&self) -> bool {
        matches!(self.command(&["PING"]), Ok(reply) if reply == "PONG")
    }

    /// Sends one command and returns its reply as text: a simple or bulk
    /// string as is, an integer in decimal, an error as `Err`. For the
    /// harness and for tests (`CLUSTER KEYSLOT`, `HGETALL`-free checks);
    /// arrays are not supported.
    pub fn command(&self, args: &[&str]) -> Result<String> {
        command(self.port, args)
    }

    /// SIGKILLs the process and waits for it. Does nothing if it is not
    /// running.
    pub fn kill(&mut self) -> Result<()> {
        process::kill(&mut self.child)
    }

    /// Kills the process if it runs, starts it again on the same port and
    /// waits until it answers. Without persistence it starts empty (a
    /// cluster node keeps its slots: `nodes.conf` survives).
    pub fn restart(&mut self) -> Result<()> {
        self.kill()?;
        self.launch()?;
        self.wait_ready()
    }

    /// Freezes the process with SIGSTOP until [`resume`](RedisServer::resume).
    pub fn pause(&self) -> Result<()> {
        self.signal("STOP")
    }

    /// Continues a paused process with SIGCONT.
    pub fn resume(&self) -> Result<()> {
        self.signal("CONT")
    }

    fn signal(&self, sig: &str) -> Result<()> {
        process::signal(self.pid(), sig, "redis-server")
    }

    /// The server's log file (inside the directory removed on drop).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
}

/// Without the arguments, which hold the ACL users' passwords.
impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("bin", &self.bin)
            .field("port", &self.port)
            .field("tls_port", &self.tls_port)
            .field("pid", &self.pid())
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// The arguments that make a server durable: later arguments override the
/// defaults of [`RedisServer::spawn`].
pub(crate) fn persistence() -> Vec<String> {
    ["--appendonly", "yes", "--appendfsync", "always"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// One command over a fresh connection to `127.0.0.1:port`.
pub(crate) fn command(port: u16, args: &[&str]) -> Result<String> {
    let timeout = Duration::from_secs(1);
    let mut stream = TcpStream::connect_timeout(&net::loopback(port), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    stream.write_all(&request)?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end_matches(['\r', '\n']);
    let bad = |what: &str| Error::Io(io::Error::new(io::ErrorKind::InvalidData, what.to_string()));
    match line.split_at_checked(1) {
        Some(("+", text)) | Some((":", text)) => Ok(text.to_string()),
        Some(("-", text)) => Err(Error::Io(io::Error::other(format!("redis: {text}")))),
        Some(("$", len)) => {
            let len: i64 = len.parse().map_err(|_| bad("bad bulk length"))?;
            let Ok(len) = usize::try_from(len) else {
                return Ok(String::new()); // nil
            };
            let mut body = vec![0u8; len.saturating_add(2)];
            io::Read::read_exact(&mut reader, &mut body)?;
            body.truncate(len);
            Ok(String::from_utf8_lossy(&body).into_owned())
        }
        _ => Err(bad(&format!("unsupported reply {line:?}"))),
    }
}

/// `$<var>`, else the first `<name>` on `PATH`.
pub(crate) fn find_bin(var: &str, name: &str) -> Result<PathBuf> {
    find_bin_in(var, name, std::env::var_os(var), std::env::var_os("PATH"))
}

fn find_bin_in(
    var: &str,
    name: &str,
    explicit: Option<OsString>,
    path: Option<OsString>,
) -> Result<PathBuf> {
    process::find_bin_in(var, name, INSTALL_HINT, explicit, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_says_how_to_install() {
        let empty = tempfile::tempdir().unwrap();
        let err = find_bin_in(
            "REDIS_SERVER_BIN",
            "redis-server",
            None,
            Some(empty.path().into()),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("redis-server not found"), "{err}");
        assert!(err.contains("make deps-redis"), "{err}");
        let err = find_bin_in(
            "REDIS_SERVER_BIN",
            "redis-server",
            Some(empty.path().join("nope").into()),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("REDIS_SERVER_BIN="), "{err}");
    }
}
