//! A gated command dies with its supervisor: `fleetcoord elect/lock NAME
//! -- CMD` SIGKILLed (as by the OOM killer) takes CMD and everything in its
//! process group with it at once, not a lease TTL later, so the next
//! holder's CMD never runs beside it. Linux only (PR_SET_PDEATHSIG and the
//! watchdog, see cli/src/tether.rs); elsewhere CMD outlives a killed
//! fleetcoord, as the README says.
#![cfg(target_os = "linux")]

#[path = "../../tests/common/mod.rs"]
mod common;

use common::{etcdctl_keys, start_etcd, ChildGuard};
use crossbeam_channel::Receiver;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Upper bound for a step that normally takes milliseconds to a few TTLs.
const WAIT: Duration = Duration::from_secs(20);

/// How soon after the SIGKILL the command and its children must be gone.
const GONE_WITHIN: Duration = Duration::from_millis(100);

/// The command: a shell that starts a child of its own (`sleep 1000 &`,
/// its pid in `$1.child`) and appends a timestamp (ns since the epoch) to
/// `$1` every 10 ms, from its start on.
const SCRIPT: &str = "sleep 1000 & echo $! > \"$1.child\"; \
                      while :; do date +%s%N >> \"$1\"; sleep 0.01; done";

/// Kill rounds per test; `FLEETCOORD_DEATHSIG_ROUNDS` raises it for a
/// measurement run.
fn rounds() -> usize {
    std::env::var("FLEETCOORD_DEATHSIG_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// One `fleetcoord` instance; its JSON records (on stderr while a command
/// runs) arrive on `records`, its command's heartbeats in `beats`.
struct Instance {
    child: ChildGuard,
    records: Receiver<String>,
    beats: PathBuf,
    /// The command's pid (= its process group), once started.
    pid: Option<i32>,
}

impl Instance {
    fn start(endpoint: &str, args: &[&str], beats: PathBuf) -> Instance {
        let beats_arg = beats.to_str().expect("utf-8 temp dir").to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_fleetcoord"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .args(["--json", "--endpoints", endpoint])
            .args(args)
            .args(["--ttl", "2s", "--", "sh", "-c", SCRIPT, "sh", &beats_arg])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fleetcoord");
        let records = common::lines_of(child.stderr.take().expect("stderr"));
        Instance {
            child: ChildGuard(child),
            records,
            beats,
            pid: None,
        }
    }

    /// Waits for the `started` record, notes the command's pid in `pid`
    /// and `groups`, and waits for its first heartbeat and its child.
    fn started(&mut self, groups: &mut Groups) {
        let deadline = Instant::now() + WAIT;
        let record = loop {
            let left = deadline
                .checked_duration_since(Instant::now())
                .expect("no started record in time");
            let line = self.records.recv_timeout(left).expect("no started record");
            match serde_json::from_str::<Value>(&line) {
                Ok(r) if r["event"] == "started" => break r,
                _ => {}
            }
        };
        let pid = record["pid"].as_i64().expect("pid") as i32;
        self.pid = Some(pid);
        groups.0.push(pid);
        while beats(&self.beats).is_empty() || self.command_child().is_none() {
            assert!(Instant::now() < deadline, "the command never beat");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The pid of the command's own `sleep 1000` child.
    fn command_child(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.beats.with_extension("child")).ok()?;
        text.strip_suffix('\n')?.parse().ok()
    }
}

/// Kills the process groups of the commands a failing test leaves behind.
struct Groups(Vec<i32>);

impl Drop for Groups {
    fn drop(&mut self) {
        for pgid in &self.0 {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A process's state letter and process group, from /proc/PID/stat.
fn stat(pid: i32) -> Option<(char, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid pgrp ...": comm may hold anything but the
    // last ')'.
    let mut fields = text.get(text.rfind(')')? + 1..)?.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

/// Running (not a zombie waiting for a reaper that may never come).
fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(state, _)| !matches!(state, 'Z' | 'X' | 'x'))
}

/// The live members of process group `pgid`.
fn group(pgid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|(_, g)| g == pgid) && alive(pid))
        .collect()
}

/// The heartbeats written so far (ns since the epoch), whole lines only.
fn beats(path: &Path) -> Vec<i128> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let whole = text.rfind('\n').map_or("", |end| &text[..end]);
    whole
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The most commands alive at once, judged by their heartbeats: each ran
/// from its first to its last; `running` ones run on.
fn most_at_once(instances: &[Instance], running: &[usize]) -> i32 {
    let mut edges: Vec<(i128, i32)> = Vec::new();
    for (i, instance) in instances.iter().enumerate() {
        let b = beats(&instance.beats);
        let (Some(&first), Some(&last)) = (b.first(), b.last()) else {
            continue;
        };
        let last = if running.contains(&i) {
            i128::MAX
        } else {
            last
        };
        edges.extend([(first, 1), (last, -1)]);
    }
    // At equal instants an end counts before a start: a beat at the same
    // nanosecond is as good as a gap (it never happens anyway).
    edges.sort();
    let (mut open, mut most) = (0, 0);
    for (_, d) in edges {
        open += d;
        most = most.max(open);
    }
    most
}

/// `permits` instances hold, one waits; each round SIGKILLs a holder and
/// checks that its command and the command's child are gone within
/// [`GONE_WITHIN`], that the waiter's command starts only after the killed
/// one's last heartbeat, and that never more than `permits` commands ran.
fn kill_rounds(args: &[&str], keys: &str, permits: usize) {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let dir = std::env::temp_dir().join(format!(
        "fleetcoord-deathsig-{}-{}",
        std::process::id(),
        keys.replace('/', "_")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut groups = Groups(Vec::new());
    let mut instances: Vec<Instance> = Vec::new();
    let spawn = |instances: &mut Vec<Instance>| {
        let beats = dir.join(format!("cmd{}", instances.len()));
        instances.push(Instance::start(&endpoint, args, beats));
        instances.len() - 1
    };
    let mut holders = Vec::new();
    for _ in 0..permits {
        let i = spawn(&mut instances);
        instances[i].started(&mut groups);
        holders.push(i);
    }
    let queued = |want: usize| {
        let deadline = Instant::now() + WAIT;
        while etcdctl_keys(&endpoint, keys).len() != want {
            assert!(Instant::now() < deadline, "{want} candidates never queued");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut waiter = spawn(&mut instances);
    queued(permits + 1);
    let mut took = Vec::new();
    for round in 0..rounds() {
        let victim = holders[round % permits];
        let pid = instances[victim].pid.expect("started");
        let child = instances[victim]
            .command_child()
            .expect("the command's child");
        let members = group(pid);
        assert!(
            members.contains(&pid) && members.contains(&child),
            "round {round}: the command ({pid}) and its child ({child}) are not in its group: {members:?}"
        );
        let t0 = Instant::now();
        instances[victim].child.kill().expect("SIGKILL fleetcoord");
        let gone = loop {
            if !alive(pid) && !alive(child) && group(pid).is_empty() {
                break t0.elapsed();
            }
            assert!(
                t0.elapsed() < GONE_WITHIN,
                "round {round}: {:?} after SIGKILL to fleetcoord, its command's group lives on: \
                 {:?} (command {pid} alive: {}, its child {child} alive: {})",
                t0.elapsed(),
                group(pid),
                alive(pid),
                alive(child)
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        took.push(gone);
        println!("round {round}: command and its child gone {gone:?} after the SIGKILL");
        let _ = instances[victim].child.wait();

        instances[waiter].started(&mut groups);
        // Liveness: the README's bound for a lost leader, 2 × TTL + 2 s
        // (the killed holder's lease must expire first; TTL 2 s here).
        let next = t0.elapsed();
        assert!(
            next <= Duration::from_secs(6),
            "round {round}: the waiter's command started {next:?} after the SIGKILL"
        );
        let last = *beats(&instances[victim].beats).last().expect("beats");
        let first = *beats(&instances[waiter].beats).first().expect("beats");
        println!(
            "round {round}: the waiter's command started {:.1} ms after the killed one's last beat",
            (first - last) as f64 / 1e6
        );
        assert!(
            first > last,
            "round {round}: the waiter's command started {} ns before the killed one's last beat",
            last - first
        );
        holders[round % permits] = waiter;
        let most = most_at_once(&instances, &holders);
        assert!(
            most <= permits as i32,
            "round {round}: {most} commands ran at once under {permits} permit(s)"
        );
        waiter = spawn(&mut instances);
        queued(permits + 1);
    }
    took.sort();
    println!(
        "{args:?}, {} kills: command and child gone after {:?} (median), {:?} (max)",
        took.len(),
        took[took.len() / 2],
        took[took.len() - 1]
    );
    drop(instances);
    drop(groups);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_sigkilled_leaders_command_and_its_children_die_with_it() {
    kill_rounds(&["elect", "deathsig"], "/coord/election/deathsig/", 1);
}

#[test]
fn a_sigkilled_permit_holders_command_and_its_children_die_with_it() {
    kill_rounds(
        &["lock", "--permits", "2", "deathsig-sem"],
        "/coord/semaphore/deathsig-sem/",
        2,
    );
}
