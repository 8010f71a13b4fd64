//! What the CLI's newer test files share: the binary with a clean
//! environment, and a long-running instance whose JSON records are read
//! as they come. A test file includes it with `mod support;` after
//! `mod common;` (the repository's `tests/common`).
#![allow(dead_code)]

use crate::common::{lines_of, ChildGuard};
use crossbeam_channel::Receiver;
use serde_json::Value;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Upper bound for a step that normally takes milliseconds; a loaded
/// 2-core machine can stall for seconds.
pub const WAIT: Duration = Duration::from_secs(20);

/// The binary, with nothing taken from the runner's environment that
/// would change what it does or prints; library log records off, so that
/// stderr holds only the tool's own lines.
pub fn cli() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fleetcoord"));
    for name in [
        "ETCD_ENDPOINTS",
        "ETCDCTL_ENDPOINTS",
        "ETCDCTL_CACERT",
        "ETCDCTL_CERT",
        "ETCDCTL_KEY",
        "ETCDCTL_USER",
        "ETCDCTL_PASSWORD",
        "COORD",
        "COORD_URL",
        "COORD_TLS_CA",
        "COORD_TLS_CERT",
        "COORD_TLS_KEY",
        "COORD_TLS_SERVER_NAME",
        "COORD_NATS_CREDS",
        "COORD_NATS_NKEY_FILE",
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
    ] {
        command.env_remove(name);
    }
    command.env("RUST_LOG", "off").stdin(Stdio::null());
    command
}

/// [`cli`] against the etcd at `endpoint`.
pub fn at(endpoint: &str) -> Command {
    let mut command = cli();
    command.args(["--endpoints", endpoint]);
    command
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A long-running `fleetcoord --json ...` whose stdout lines arrive on
/// `lines`; killed on drop.
pub struct Running {
    pub child: ChildGuard,
    pub lines: Receiver<String>,
}

impl Running {
    pub fn start(endpoint: &str, args: &[&str]) -> Running {
        let mut child = at(endpoint)
            .arg("--json")
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn fleetcoord");
        let lines = lines_of(child.stdout.take().expect("stdout"));
        Running {
            child: ChildGuard(child),
            lines,
        }
    }

    /// The next record, within `within`; `None` if none came.
    pub fn next_within(&self, within: Duration) -> Option<Value> {
        let line = self.lines.recv_timeout(within).ok()?;
        Some(
            serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not a JSON line: {line:?}: {e}")),
        )
    }

    /// The next record; panics after [`WAIT`].
    pub fn next(&self) -> Value {
        self.next_within(WAIT)
            .unwrap_or_else(|| panic!("no record within {WAIT:?}"))
    }

    /// Reads records until one has `key` == `value`; returns it.
    pub fn until(&self, key: &str, value: &str) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("no record with {key} = {value} within {WAIT:?}"));
            if let Some(record) = self.next_within(left) {
                if record[key] == value {
                    return record;
                }
            }
        }
    }
}
