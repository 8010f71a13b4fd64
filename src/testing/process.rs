//! Controlling a server process the harness started, the same way for
//! etcd, nats-server and redis-server: kill and reap, SIGSTOP/SIGCONT, the
//! tail of its log.

use crate::Result;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// SIGKILLs `child` (if it still runs) and reaps it; `None` does nothing.
pub(crate) fn kill(child: &mut Option<Child>) -> Result<()> {
    if let Some(mut child) = child.take() {
        // Kill failing means it already exited; wait reaps it either way.
        let _ = child.kill();
        child.wait()?;
    }
    Ok(())
}

/// Sends `sig` (`"STOP"`, `"CONT"`) to `pid`; `what` names the server in
/// the error when it is not running. The crate forbids unsafe code, so the
/// signal goes through the shell's kill builtin (always present, unlike
/// procps' kill binary).
pub(crate) fn signal(pid: Option<u32>, sig: &str, what: &str) -> Result<()> {
    let pid =
        pid.ok_or_else(|| io::Error::other(format!("{what} is not running (it was killed)")))?;
    let status = Command::new("sh")
        .args(["-c", "kill -s \"$0\" \"$1\"", sig, &pid.to_string()])
        .status()?;
    if !status.success() {
        return Err(io::Error::other(format!("kill -s {sig} {pid} failed ({status})")).into());
    }
    if sig == "STOP" {
        wait_stopped(pid);
    }
    Ok(())
}

/// Waits (up to a second) until every thread of `pid` has stopped: `kill`
/// returns once the signal is queued, and a thread running on another
/// core may still answer a request or two before it stops, which a test
/// of a paused server would read as the server answering while paused.
/// Where `/proc` is not there to tell, returns at once.
fn wait_stopped(pid: u32) {
    let tasks = format!("/proc/{pid}/task");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while std::time::Instant::now() < until {
        let Ok(entries) = std::fs::read_dir(&tasks) else {
            return;
        };
        let running = entries.flatten().any(|task| {
            std::fs::read_to_string(task.path().join("stat"))
                .ok()
                .and_then(|stat| {
                    // The state follows the parenthesised command name.
                    let after = stat.rfind(')')?;
                    stat[after..].chars().nth(2)
                })
                .is_some_and(|state| !matches!(state, 'T' | 't' | 'Z' | 'X'))
        });
        if !running {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The whole log at `path`, lossily decoded; empty if unreadable.
pub(crate) fn log_text(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The last `n` lines of the log at `path`.
pub(crate) fn log_tail(path: &Path, n: usize) -> String {
    let text = log_text(path);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The server binary `name`: `explicit` (the value of the variable `var`)
/// if set, else the first `name` file on `path` (a `PATH` value). Missing,
/// it is an error that says how to install it (`hint`): tests built on the
/// harness fail, never skip.
pub(crate) fn find_bin_in(
    var: &str,
    name: &str,
    hint: &str,
    explicit: Option<OsString>,
    path: Option<OsString>,
) -> Result<PathBuf> {
    if let Some(bin) = explicit {
        let bin = PathBuf::from(bin);
        if bin.is_file() {
            return Ok(bin);
        }
        return Err(not_found(format!(
            "{name} not found: {var}={} is not a file; {hint}",
            bin.display()
        )));
    }
    std::env::split_paths(&path.unwrap_or_default())
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| not_found(format!("{name} not found in PATH; {hint}")))
}

fn not_found(msg: String) -> crate::Error {
    crate::Error::Io(io::Error::new(io::ErrorKind::NotFound, msg))
}
