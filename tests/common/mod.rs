//! Helpers shared by the integration tests. A test file includes them with
//! `mod common;`; as a subdirectory of `tests/` this is no test target of
//! its own.
//!
//! Not every test file uses every helper.
#![allow(dead_code)]

use fleetcoord::testing::EtcdServer;
use fleetcoord::{Etcd, EtcdOptions, HostEvent, HostInfo};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::ops::{Deref, DerefMut};
use std::process::{Child, Command};
use uuid::Uuid;

/// How to get the `etcd` and `etcdctl` binaries the tests need.
pub const INSTALL: &str =
    "run `make test` (which installs them) or `apt-get install etcd-server etcd-client`";

/// Starts a fresh etcd; panics with install instructions when it cannot.
pub fn start_etcd() -> EtcdServer {
    EtcdServer::start().unwrap_or_else(|e| panic!("cannot start etcd ({e}); {INSTALL}"))
}

pub fn connect(endpoint: &str) -> Etcd {
    Etcd::with_options(&[endpoint], EtcdOptions::default()).expect("connect")
}

/// Runs `etcdctl` (API v3) against `endpoint`; panics with install
/// instructions when it is missing and with its stderr when it fails.
/// Returns its stdout.
pub fn etcdctl(endpoint: &str, args: &[&str]) -> String {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(endpoint)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run etcdctl ({e}); {INSTALL}"));
    assert!(
        out.status.success(),
        "etcdctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The keys under `prefix`, read with etcdctl (not through fleetcoord).
pub fn etcdctl_keys(endpoint: &str, prefix: &str) -> Vec<String> {
    etcdctl(endpoint, &["get", prefix, "--prefix", "--keys-only"])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Applies one event to a view of the fleet, checking that the stream is
/// consistent: no `Down`/`Updated` for an unknown host, no second `Up`
/// without a `Down` in between.
pub fn apply(view: &mut HashMap<Uuid, HostInfo>, event: HostEvent) {
    match event {
        HostEvent::Up(info) => {
            if let Some(old) = view.insert(info.id, info.clone()) {
                panic!(
                    "Up for {} which is already up ({old:?}); new {info:?}",
                    info.id
                );
            }
        }
        HostEvent::Updated(info) => {
            assert!(view.contains_key(&info.id), "Updated without Up: {info:?}");
            view.insert(info.id, info);
        }
        HostEvent::Down(info, _) => {
            assert!(view.remove(&info.id).is_some(), "Down without Up: {info:?}");
        }
        HostEvent::Synced => panic!("a second Synced"),
    }
}

/// A command that runs this test binary again (a child process of a test).
/// Under an emulator (`make qemu-lib` runs foreign-architecture test
/// binaries with qemu-user) the binary cannot be exec'd directly:
/// `FLEETCOORD_TEST_RUNNER` names the runner and its arguments, as Cargo's
/// `CARGO_TARGET_<triple>_RUNNER` does.
pub fn this_test_binary() -> Command {
    let exe = std::env::current_exe().expect("current test binary");
    let runner = std::env::var("FLEETCOORD_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut command = Command::new(program);
            command.args(words).arg(exe);
            command
        }
        None => Command::new(exe),
    }
}

/// Kills the child process on drop, so a failing test leaves nothing behind.
pub struct ChildGuard(pub Child);

impl Deref for ChildGuard {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads `output` line by line on a thread of its own; the lines arrive on
/// the returned channel until the output ends or the receiver is dropped.
pub fn lines_of(output: impl Read + Send + 'static) -> crossbeam_channel::Receiver<String> {
    let (tx, lines) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    lines
}

/// A long-running `etcdctl` (API v3: `elect`, `lock`, ...) whose stdout
/// lines arrive on `lines`; killed on drop.
pub struct EtcdctlChild {
    pub child: ChildGuard,
    pub lines: crossbeam_channel::Receiver<String>,
}

impl EtcdctlChild {
    /// Runs `etcdctl --endpoints <endpoint> <args...>`; panics with install
    /// instructions when etcdctl is missing.
    pub fn spawn(endpoint: &str, args: &[&str]) -> EtcdctlChild {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoint])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run etcdctl ({e}); {INSTALL}"));
        let lines = lines_of(child.stdout.take().expect("piped stdout"));
        EtcdctlChild {
            child: ChildGuard(child),
            lines,
        }
    }

    /// SIGINT (etcdctl resigns or unlocks first), then waits at most
    /// `within` for the exit.
    pub fn interrupt(mut self, within: std::time::Duration) {
        let status = Command::new("sh")
            .args(["-c", "kill -s INT \"$0\"", &self.child.id().to_string()])
            .status()
            .expect("sh");
        assert!(status.success());
        let deadline = std::time::Instant::now() + within;
        while self.child.try_wait().expect("try_wait").is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "etcdctl did not exit after SIGINT"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// How many calls of gRPC `method` (`"Range"`, `"Txn"`, `"Watch"`, …)
/// etcd at `endpoint` has started since it began, from its own
/// `grpc_server_started_total` counter on `/metrics`: what a client really
/// sent, whatever the client says.
pub fn etcd_calls(endpoint: &str, method: &str) -> u64 {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(endpoint).expect("metrics connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .expect("metrics request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("metrics answer");
    let label = format!("grpc_method=\"{method}\"");
    // Absent until the first call of that method.
    text.lines()
        .filter(|l| l.starts_with("grpc_server_started_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The rules of the `ACL SETUSER fleet …` line in the Redis backend's module
/// docs (src/coordinator/redis/mod.rs, "ACL users"), after the password:
/// the Redis ACL tests log in as exactly that user, so the documented line
/// is the tested one.
pub fn redis_acl_rules() -> Vec<&'static str> {
    const DOCS: &str = include_str!("../../src/coordinator/redis/mod.rs");
    let line = DOCS
        .lines()
        .find_map(|l| l.strip_prefix("//! ACL SETUSER fleet reset on >CHANGE-ME "))
        .expect("the Redis module docs give an `ACL SETUSER fleet` line");
    line.split_whitespace().collect()
}

/// Checks a conformance report of the NATS backend: every case passed,
/// except, on a nats-server before 2.11 (which cannot expire single
/// messages), exactly the TTL cases, reported unsupported with a reason
/// naming the version needed and the one found.
pub fn assert_nats_conforms(report: &fleetcoord::conformance::Report) {
    let version = nats_server_version();
    if version >= (2, 11) {
        report.assert_nothing_skipped();
        return;
    }
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    let cases: Vec<&str> = report.unsupported.iter().map(|(case, _)| *case).collect();
    assert_eq!(
        cases,
        [
            "kv TTL expiry seen by kv_get and by a watcher",
            "kv TTL removed by a plain set"
        ],
        "{:?}",
        report.unsupported
    );
    for (case, why) in &report.unsupported {
        assert!(
            why.contains("needs nats-server 2.11 or newer")
                && why.contains(&format!("this server is {}.{}.", version.0, version.1)),
            "{case}: {why}"
        );
    }
}

/// The major and minor version of the nats-server the tests start
/// (`$NATS_SERVER_BIN`, else `nats-server` from `PATH`, as
/// `fleetcoord::testing` picks it).
pub fn nats_server_version() -> (u64, u64) {
    let bin = std::env::var_os("NATS_SERVER_BIN").unwrap_or_else(|| "nats-server".into());
    let out = Command::new(&bin)
        .arg("--version")
        .output()
        .expect("run nats-server --version");
    let text = String::from_utf8_lossy(&out.stdout);
    // "nats-server: v2.9.10"
    let version = text
        .trim()
        .rsplit('v')
        .next()
        .unwrap_or_default()
        .to_owned();
    let mut parts = version.split('.').map(|p| p.parse::<u64>());
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor),
        _ => panic!("cannot read the version in {text:?}"),
    }
}
