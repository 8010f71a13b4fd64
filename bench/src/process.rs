//! Child processes: the `fleetcoord` binary, `etcdctl`, and this binary's
//! own `child-*` subcommands (rows whose memory or CPU must not mix with
//! the other side's, and raw processes to SIGKILL).

use crate::Res;
use crossbeam_channel::Receiver;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `fleetcoord` binary: `$FLEETCOORD_BIN`, else the one built next to
/// this benchmark (same target directory and profile).
pub fn fleetcoord_bin() -> Res<PathBuf> {
    if let Some(path) = std::env::var_os("FLEETCOORD_BIN") {
        return Ok(path.into());
    }
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .ok_or("the benchmark's executable has no directory")?
        .join("fleetcoord");
    if !path.exists() {
        return Err(format!(
            "{} is missing: build it first (cargo build -p fleetcoord-cli, with the \
             benchmark's profile), or set FLEETCOORD_BIN",
            path.display()
        )
        .into());
    }
    Ok(path)
}

/// This benchmark's own executable, for its `child-*` subcommands.
pub fn self_bin() -> Res<PathBuf> {
    Ok(std::env::current_exe()?)
}

/// A running child whose stdout lines arrive on a channel; killed
/// (SIGKILL) and reaped on drop.
pub struct Spawned {
    child: Child,
    lines: Receiver<String>,
}

impl Spawned {
    pub fn start(mut command: Command) -> Res<Spawned> {
        let program = format!("{:?}", command.get_program());
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {program}: {e}"))?;
        let stdout = child.stdout.take().ok_or("child has no stdout")?;
        let (tx, lines) = crossbeam_channel::unbounded();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Spawned { child, lines })
    }

    /// Waits for a stdout line containing `needle`.
    pub fn wait_line(&self, needle: &str, timeout: Duration) -> Res<String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return Ok(line),
                Ok(_) => {}
                Err(_) => {
                    return Err(format!(
                        "no line with {needle:?} from the child within {timeout:?}"
                    )
                    .into())
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) -> Res<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Sends `signal` with kill(1) (no unsafe code here), then waits for
    /// the exit at most `timeout`.
    pub fn signal_and_wait(&mut self, signal: &str, timeout: Duration) -> Res<()> {
        send_signal(self.pid(), signal)?;
        self.wait_exit(timeout)
    }

    /// Waits at most `timeout` for the child to exit, and reaps it.
    pub fn wait_exit(&mut self, timeout: Duration) -> Res<()> {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(format!("child {} did not exit within {timeout:?}", self.pid()).into())
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kill -<signal> <pid>`: the signal is sent when this returns.
pub fn send_signal(pid: u32, signal: &str) -> Res<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()?;
    if !status.success() {
        return Err(format!("kill -{signal} {pid} failed: {status}").into());
    }
    Ok(())
}

/// What a `child-*` subcommand reported: its `RESULT key=value ...` line
/// and, if it printed one, its `SAMPLES <µs> ...` line.
pub struct ChildOut {
    pub values: HashMap<String, f64>,
    pub samples: Vec<Duration>,
}

/// Runs this binary's `child-*` subcommand to completion and parses what
/// it reported.
pub fn run_child(args: &[String]) -> Res<ChildOut> {
    let output = Command::new(self_bin()?)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    if !output.status.success() {
        return Err(format!("child {args:?} failed: {}", output.status).into());
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .ok_or_else(|| format!("child {args:?} printed no RESULT line"))?;
    let mut values = HashMap::new();
    for pair in line.split_whitespace() {
        let (k, v) = pair.split_once('=').ok_or("bad RESULT pair")?;
        values.insert(k.to_string(), v.parse::<f64>()?);
    }
    let mut samples = Vec::new();
    if let Some(line) = text.lines().find_map(|l| l.strip_prefix("SAMPLES")) {
        for us in line.split_whitespace() {
            samples.push(Duration::from_micros(us.parse()?));
        }
    }
    Ok(ChildOut { values, samples })
}

/// Prints the SAMPLES line of [`run_child`]'s `ChildOut::samples`.
pub fn print_samples(samples: &[Duration]) {
    let body: Vec<String> = samples.iter().map(|d| d.as_micros().to_string()).collect();
    println!("SAMPLES {}", body.join(" "));
}

/// The value `key` of a child's RESULT line.
pub fn field(out: &ChildOut, key: &str) -> Res<f64> {
    out.values
        .get(key)
        .copied()
        .ok_or_else(|| format!("child RESULT has no {key}").into())
}

/// Prints the RESULT line a parent's [`run_child`] parses.
pub fn print_result(pairs: &[(&str, f64)]) {
    let body: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("RESULT {}", body.join(" "));
}
