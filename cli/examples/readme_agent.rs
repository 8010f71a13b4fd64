//! The README's first agent, run the way its text promises: against a
//! throwaway etcd that goes away for a few seconds mid-run. The agent must
//! see the outage (a failed call it retries), still be running afterwards,
//! lead and write again, and exit 0 on SIGTERM. `scripts/readme-example.sh`
//! builds the agent from the README and runs this with its binary:
//!
//! ```text
//! cargo run -p fleetcoord-cli --example readme_agent -- PATH/TO/readme-example
//! ```
//!
//! Exits 1 with what was missing, and the agent's output, when a promise
//! is not kept.

use crossbeam_channel::{Receiver, RecvTimeoutError};
use fleetcoord::testing::EtcdServer;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long etcd stays down: longer than the agent's 1 s tick, so that at
/// least one of its fenced writes meets the outage; shorter than its host
/// lease's 5 s TTL.
const DOWN: Duration = Duration::from_secs(3);
/// Bound on leading at the start, and again after etcd is back.
const LEAD_WITHIN: Duration = Duration::from_secs(20);
/// Bound on the exit after SIGTERM.
const EXIT_WITHIN: Duration = Duration::from_secs(5);

/// One line the agent printed, and on which stream.
struct Line {
    stderr: bool,
    text: String,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("readme_agent: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let agent = std::env::args()
        .nth(1)
        .ok_or("usage: readme_agent PATH-TO-THE-README-AGENT")?;
    let mut server = EtcdServer::start().map_err(|e| format!("starting etcd: {e}"))?;
    let mut child = Command::new(&agent)
        .env("ETCD_ENDPOINTS", server.endpoint())
        .env("RUST_LOG", "off")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {agent}: {e}"))?;
    let (tx, lines) = crossbeam_channel::unbounded();
    for stderr in [false, true] {
        let stream: Box<dyn Read + Send> = match stderr {
            false => Box::new(child.stdout.take().ok_or("no stdout")?),
            true => Box::new(child.stderr.take().ok_or("no stderr")?),
        };
        let tx = tx.clone();
        std::thread::spawn(move || {
            for text in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = tx.send(Line { stderr, text });
            }
        });
    }
    drop(tx);
    let mut seen = Vec::new();
    let result = check(&mut server, &mut child, &lines, &mut seen);
    let _ = child.kill();
    let _ = child.wait();
    if result.is_err() {
        eprintln!("readme_agent: what the agent printed:");
        for line in &seen {
            eprintln!("  {}{}", if line.stderr { "[err] " } else { "" }, line.text);
        }
    }
    result
}

fn check(
    server: &mut EtcdServer,
    child: &mut Child,
    lines: &Receiver<Line>,
    seen: &mut Vec<Line>,
) -> Result<(), String> {
    wait_for(
        lines,
        seen,
        LEAD_WITHIN,
        "a first fenced write (\"scheduled\")",
        |l| !l.stderr && l.text.starts_with("scheduled, token "),
    )?;
    println!("readme_agent: the agent leads and writes; etcd goes away for {DOWN:?}");
    server.kill().map_err(|e| format!("killing etcd: {e}"))?;
    let down_since = seen.len();
    std::thread::sleep(DOWN);
    drain(lines, seen);
    if let Ok(Some(status)) = child.try_wait() {
        return Err(format!("the agent died while etcd was down ({status})"));
    }
    server
        .restart()
        .map_err(|e| format!("restarting etcd: {e}"))?;
    let back = Instant::now();
    println!("readme_agent: etcd is back; waiting for the agent to write again");
    let after = seen.len();
    wait_for(
        lines,
        seen,
        LEAD_WITHIN,
        "a fenced write after the restart",
        |l| !l.stderr && l.text.starts_with("scheduled, token "),
    )?;
    // Counted once etcd is back: the failed call may be one that was under
    // way when etcd went away and failed only later.
    if !seen[down_since..].iter().any(|l| l.stderr) {
        return Err(
            "the agent printed no failed call while etcd was down: the outage was \
                    not exercised"
                .into(),
        );
    }
    let rewritten = back.elapsed();
    if let Ok(Some(status)) = child.try_wait() {
        return Err(format!("the agent exited after the restart ({status})"));
    }
    println!(
        "readme_agent: written again {rewritten:.2?} after etcd was back ({} lines since)",
        seen.len() - after
    );
    let pid = child.id().to_string();
    let term = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .map_err(|e| format!("kill -TERM: {e}"))?;
    if !term.success() {
        return Err(format!("kill -TERM {pid} failed"));
    }
    let asked = Instant::now();
    loop {
        drain(lines, seen);
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(status)) => return Err(format!("the agent exited with {status} on SIGTERM")),
            Ok(None) if asked.elapsed() > EXIT_WITHIN => {
                return Err(format!(
                    "the agent still runs {EXIT_WITHIN:?} after SIGTERM"
                ))
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for the agent: {e}")),
        }
    }
    println!(
        "readme_agent: exited 0 {:.2?} after SIGTERM: the first agent keeps the README's promises",
        asked.elapsed()
    );
    Ok(())
}

/// Reads lines until one matches `want`, at most `within`.
fn wait_for(
    lines: &Receiver<Line>,
    seen: &mut Vec<Line>,
    within: Duration,
    what: &str,
    want: impl Fn(&Line) -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                let found = want(&line);
                seen.push(line);
                if found {
                    return Ok(());
                }
            }
            Err(RecvTimeoutError::Timeout) => return Err(format!("no {what} within {within:?}")),
            Err(RecvTimeoutError::Disconnected) => {
                return Err(format!("the agent closed its output before {what}"))
            }
        }
    }
}

/// Takes every line printed so far.
fn drain(lines: &Receiver<Line>, seen: &mut Vec<Line>) {
    seen.extend(lines.try_iter());
}
