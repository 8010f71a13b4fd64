//! `elect NAME -- CMD` and `lock NAME -- CMD` against a real etcd: the
//! command runs only while held, gets the fencing token, passes its exit
//! status on, stops on Ctrl-C with a resign, and — the point of it all —
//! is dead before another instance's command starts when the holder is
//! partitioned from etcd.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::{etcdctl_keys, start_etcd, ChildGuard};
use crossbeam_channel::Receiver;
use fleetcoord::testing::{FaultProxy, Mode};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Upper bound for a step that normally takes milliseconds to a few TTLs.
const WAIT: Duration = Duration::from_secs(20);

fn cli(endpoint: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fleetcoord"));
    command
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .args(["--json", "--endpoints", endpoint]);
    command
}

/// A running gated `fleetcoord`; its JSON records (on stderr while a
/// command runs) arrive on `records`.
struct Gated {
    child: ChildGuard,
    records: Receiver<String>,
}

impl Gated {
    fn start(endpoint: &str, args: &[&str]) -> Gated {
        let mut child = cli(endpoint)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fleetcoord");
        let records = common::lines_of(child.stderr.take().expect("stderr"));
        Gated {
            child: ChildGuard(child),
            records,
        }
    }

    /// The next record with `event` == `name`, within `within`.
    fn next(&self, name: &str, within: Duration) -> Option<Value> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let line = self.records.recv_timeout(left).ok()?;
            let Ok(record) = serde_json::from_str::<Value>(&line) else {
                continue; // a log line
            };
            if record["event"] == name {
                return Some(record);
            }
        }
    }

    fn expect(&self, name: &str) -> Value {
        self.next(name, WAIT)
            .unwrap_or_else(|| panic!("no {name:?} record within {WAIT:?}"))
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill(1)");
        assert!(status.success());
    }

    fn wait(&mut self) -> Option<i32> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            assert!(Instant::now() < deadline, "fleetcoord did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn alive(pid: u64) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .expect("kill(1)")
        .success()
}

#[test]
fn the_command_gets_the_token_and_its_exit_status_passes_through() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    for (verb, prefix) in [("elect", "/coord/election/"), ("lock", "/coord/lock/")] {
        let output = cli(&endpoint)
            .args([verb, "gate-exit", "--ttl", "2s", "--"])
            .args([
                "sh",
                "-c",
                "echo \"token=$FLEETCOORD_FENCING_TOKEN\"; exit 3",
            ])
            .output()
            .expect("spawn fleetcoord");
        assert_eq!(
            output.status.code(),
            Some(3),
            "{verb}: exit status passes through"
        );
        // stdout is the command's alone; our records went to stderr.
        let stdout = String::from_utf8(output.stdout).unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        let started: Value = stderr
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|r| r["event"] == "started")
            .unwrap_or_else(|| panic!("{verb}: no started record in {stderr}"));
        assert_eq!(stdout, format!("token={}\n", started["token"]), "{verb}");
        assert!(started["token"].as_i64().unwrap() > 0);
        assert!(
            etcdctl_keys(&endpoint, &format!("{prefix}gate-exit/")).is_empty(),
            "{verb}: released after the command exited"
        );
    }
    let ok = cli(&endpoint)
        .args(["lock", "gate-ok", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(ok.status.code(), Some(0));
    // Zero permits is a usage error, not a semaphore nobody can hold.
    let zero = cli(&endpoint)
        .args(["lock", "--permits", "0", "gate-zero", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(zero.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&zero.stderr).contains("--permits"));
    let missing = cli(&endpoint)
        .args(["elect", "gate-missing", "--", "/nonexistent/program"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot start"));
}

#[test]
fn ctrl_c_stops_the_command_and_resigns() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let mut gated = Gated::start(&endpoint, &["elect", "gate-int", "--", "sleep", "1000"]);
    let started = gated.expect("started");
    let pid = started["pid"].as_u64().unwrap();
    assert!(alive(pid));
    gated.signal("-INT");
    // sleep dies of the forwarded SIGTERM, as asked: a clean stop, 0.
    assert_eq!(gated.wait(), Some(0));
    assert!(!alive(pid), "the command outlived fleetcoord");
    assert!(etcdctl_keys(&endpoint, "/coord/election/gate-int/").is_empty());
}

/// Rounds of the partition test; `FLEETCOORD_GATED_ROUNDS` raises it for a
/// measurement run (the closing figure uses 20).
fn rounds() -> usize {
    std::env::var("FLEETCOORD_GATED_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

#[test]
fn a_partitioned_leaders_command_dies_before_the_next_one_starts() {
    handover_rounds(&["sleep", "1000"]);
}

/// A command that ignores SIGTERM: only the SIGKILL before the local
/// deadline (not the 60 s grace) can end it in time.
#[test]
fn a_command_ignoring_sigterm_is_killed_before_the_next_one_starts() {
    handover_rounds(&["sh", "-c", "trap '' TERM; exec sleep 1000"]);
}

fn handover_rounds(command: &[&str]) {
    let server = start_etcd();
    let proxies = [
        FaultProxy::start(&server.endpoint()).unwrap(),
        FaultProxy::start(&server.endpoint()).unwrap(),
    ];
    // A long kill grace: the deadline, not the grace, must bound the kill.
    let mut args = vec![
        "elect",
        "gate-part",
        "--ttl",
        "2s",
        "--restart",
        "--kill-grace",
        "60s",
        "--",
    ];
    args.extend_from_slice(command);
    let instances = [
        Gated::start(&proxies[0].endpoint(), &args),
        Gated::start(&proxies[1].endpoint(), &args),
    ];
    // Whoever starts its command first leads.
    let mut leader = {
        let deadline = Instant::now() + WAIT;
        loop {
            assert!(Instant::now() < deadline, "nobody started the command");
            if instances[0]
                .next("started", Duration::from_millis(50))
                .is_some()
            {
                break 0;
            }
            if instances[1]
                .next("started", Duration::from_millis(50))
                .is_some()
            {
                break 1;
            }
        }
    };
    let mut gaps = Vec::new();
    for round in 0..rounds() {
        let follower = 1 - leader;
        proxies[leader].set_mode(Mode::Blackhole);
        let exited = instances[leader].expect("exited");
        let started = instances[follower].expect("started");
        let exit_us = exited["at_unix_us"].as_i64().unwrap();
        let start_us = started["at_unix_us"].as_i64().unwrap();
        let gap = start_us - exit_us;
        println!("round {round}: old command dead {gap} us before the new one started");
        assert!(
            gap > 0,
            "round {round}: the new leader's command started {}us before the old one died",
            -gap
        );
        gaps.push(gap);
        instances[leader].expect("lost");
        proxies[leader].set_mode(Mode::Pass);
        // The old leader campaigns again and queues behind the new one.
        instances[leader].expect("campaigning");
        leader = follower;
    }
    let min = gaps.iter().min().unwrap();
    let max = gaps.iter().max().unwrap();
    println!(
        "{command:?}, {} rounds: minimum gap {:.1} ms, maximum {:.1} ms",
        gaps.len(),
        *min as f64 / 1000.0,
        *max as f64 / 1000.0
    );
}

/// `lock --permits 2`: six instances, each running a command that leaves
/// its mark in a shared file. Never more than two commands alive, judged
/// by fleetcoord's own records (`started` just before the spawn, `exited`
/// just after the reap, so each interval covers the command's whole life),
/// and all six ran.
#[test]
fn lock_with_two_permits_runs_at_most_two_of_six_commands_at_once() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let marks = std::env::temp_dir().join(format!("fleetcoord-gate-sem-{}", std::process::id()));
    let _ = std::fs::remove_file(&marks);
    let script = format!(
        "echo \"start $FLEETCOORD_FENCING_TOKEN\" >> {m}; sleep 0.4; echo \"end $FLEETCOORD_FENCING_TOKEN\" >> {m}",
        m = marks.display()
    );
    let mut instances: Vec<Gated> = (0..6)
        .map(|_| {
            Gated::start(
                &endpoint,
                &[
                    "lock",
                    "--permits",
                    "2",
                    "gate-sem",
                    "--ttl",
                    "2s",
                    "--",
                    "sh",
                    "-c",
                    &script,
                ],
            )
        })
        .collect();
    let mut intervals = Vec::new();
    for (i, instance) in instances.iter().enumerate() {
        let started = instance.expect("started");
        let exited = instance.expect("exited");
        intervals.push((
            started["at_unix_us"].as_i64().unwrap(),
            exited["at_unix_us"].as_i64().unwrap(),
            i,
        ));
    }
    for instance in &mut instances {
        assert_eq!(
            instance.wait(),
            Some(0),
            "the command's status passes through"
        );
    }
    let mut edges: Vec<(i64, i32)> = intervals
        .iter()
        .flat_map(|&(a, b, _)| [(a, 1), (b, -1)])
        .collect();
    edges.sort();
    let (mut open, mut max) = (0, 0);
    for (_, d) in edges {
        open += d;
        max = max.max(open);
    }
    println!("6 commands under 2 permits: at most {max} alive at once");
    assert!(
        max <= 2,
        "{max} commands alive under 2 permits: {intervals:?}"
    );
    let text = std::fs::read_to_string(&marks).unwrap();
    let starts = text.lines().filter(|l| l.starts_with("start ")).count();
    let ends = text.lines().filter(|l| l.starts_with("end ")).count();
    assert_eq!((starts, ends), (6, 6), "all six ran to the end: {text}");
    let _ = std::fs::remove_file(&marks);
    assert!(etcdctl_keys(&endpoint, "/coord/semaphore/gate-sem/").is_empty());
}

/// The partition test of `elect`/`lock`, with `lock --permits 2` and three
/// instances: the holder cut off from etcd has its command dead before
/// the waiting instance's command starts on the freed permit, while the
/// other holder keeps its command running.
#[test]
fn a_partitioned_permit_holders_command_dies_before_the_waiters_starts() {
    let server = start_etcd();
    let proxies: Vec<FaultProxy> = (0..3)
        .map(|_| FaultProxy::start(&server.endpoint()).unwrap())
        .collect();
    let args = [
        "lock",
        "--permits",
        "2",
        "gate-sem-part",
        "--ttl",
        "2s",
        "--restart",
        "--kill-grace",
        "60s",
        "--",
        "sleep",
        "1000",
    ];
    let instances: Vec<Gated> = proxies
        .iter()
        .map(|p| Gated::start(&p.endpoint(), &args))
        .collect();
    // The first two to start their commands hold the permits.
    let mut holders = Vec::new();
    let deadline = Instant::now() + WAIT;
    while holders.len() < 2 {
        assert!(Instant::now() < deadline, "two permits were not taken");
        for (i, instance) in instances.iter().enumerate() {
            if !holders.contains(&i)
                && instance
                    .next("started", Duration::from_millis(50))
                    .is_some()
            {
                holders.push(i);
            }
        }
    }
    let mut waiter = (0..3).find(|i| !holders.contains(i)).unwrap();
    let mut gaps = Vec::new();
    for round in 0..rounds() {
        let cut = holders[round % 2];
        proxies[cut].set_mode(Mode::Blackhole);
        let exited = instances[cut].expect("exited");
        let started = instances[waiter].expect("started");
        let gap = started["at_unix_us"].as_i64().unwrap() - exited["at_unix_us"].as_i64().unwrap();
        println!("round {round}: cut holder's command dead {gap} us before the waiter's started");
        assert!(
            gap > 0,
            "round {round}: the waiter's command started {}us before the cut holder's died",
            -gap
        );
        gaps.push(gap);
        instances[cut].expect("lost");
        proxies[cut].set_mode(Mode::Pass);
        // Bytes the blackhole discarded leave the old connection broken
        // once traffic passes again, and it may take longer than the 2 s
        // TTL to notice: the restored instance's next session would be
        // lost to that, not to this round's partition. A fresh connection
        // keeps each round about its own cut.
        proxies[cut].reset_all();
        instances[cut].expect("waiting");
        holders[round % 2] = waiter;
        waiter = cut;
    }
    println!(
        "lock --permits 2, {} rounds: minimum gap {:.1} ms",
        gaps.len(),
        *gaps.iter().min().unwrap() as f64 / 1000.0
    );
}

/// The instant (µs since the epoch) of `instance`'s next `name` record.
fn at_us(instance: &Gated, name: &str) -> i64 {
    instance.expect(name)["at_unix_us"]
        .as_i64()
        .expect("at_unix_us")
}

fn queued(endpoint: &str, prefix: &str, want: usize) {
    let deadline = Instant::now() + WAIT;
    while etcdctl_keys(endpoint, prefix).len() != want {
        assert!(Instant::now() < deadline, "{want} candidates never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_operators_hand_over_stops_the_command_before_the_target_starts_its_own() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let prefix = "/coord/election/ho/";
    let gated = |value: &str, extra: &[&str]| {
        let mut args = vec!["elect", "ho", "--value", value, "--priority", "0"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sleep", "100"]);
        Gated::start(&endpoint, &args)
    };
    let a = gated("a", &["--accept-hand-over"]);
    a.expect("started");
    let b = gated("b", &[]);
    queued(&endpoint, prefix, 2);
    let c = gated("c", &[]);
    queued(&endpoint, prefix, 3);
    let t0 = Instant::now();
    let status = cli(&endpoint)
        .args(["elect", "hand-over", "ho", "--to", "c", "--timeout", "10s"])
        .status()
        .expect("fleetcoord elect hand-over");
    assert!(status.success(), "hand-over failed: {status}");
    println!("operator's hand-over took {:?}", t0.elapsed());
    let exited = at_us(&a, "exited");
    let started = at_us(&c, "started");
    assert!(
        started > exited,
        "c's command started {} us before a's died",
        exited - started
    );
    a.expect("handed_over");
    // b keeps waiting (queued again behind c), and the request is gone.
    assert!(b.next("started", Duration::from_millis(300)).is_none());
    assert!(etcdctl_keys(&endpoint, "/coord/election/ho\u{1f}hand-over").is_empty());
    // Naming nobody fails clearly, within its timeout.
    let out = cli(&endpoint)
        .args([
            "elect",
            "hand-over",
            "ho",
            "--to",
            "nobody",
            "--timeout",
            "1s",
        ])
        .output()
        .expect("fleetcoord elect hand-over");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("did not lead"), "{stderr}");
}

#[test]
fn a_yielding_leaders_command_dies_before_the_higher_ones_starts() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let low = Gated::start(
        &endpoint,
        &[
            "elect",
            "y",
            "--value",
            "low",
            "--yield-to-higher",
            "--",
            "sleep",
            "100",
        ],
    );
    low.expect("started");
    let t0 = Instant::now();
    let high = Gated::start(
        &endpoint,
        &[
            "elect",
            "y",
            "--value",
            "high",
            "--priority",
            "5",
            "--",
            "sleep",
            "100",
        ],
    );
    let exited = at_us(&low, "exited");
    let started = at_us(&high, "started");
    println!(
        "higher priority joined -> its command started: {:?}",
        t0.elapsed()
    );
    assert!(started > exited, "overlap of {} us", exited - started);
    low.expect("stepped_down");
    // The yielder campaigns again and waits behind the higher one.
    low.expect("campaigning");
    assert!(low.next("started", Duration::from_millis(300)).is_none());
}

/// A command that exits on its own must not leave anything running beside
/// the next holder's command: what it started in the background (still in
/// its process group) is killed before the hold is released.
#[test]
fn what_an_exited_command_left_in_the_background_dies_before_the_release() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let dir = std::env::temp_dir().join(format!("fleetcoord-bg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for verb in ["elect", "lock"] {
        let pidfile = dir.join(format!("{verb}.pid"));
        let script = format!(
            "sleep 1000 >/dev/null 2>&1 & echo $! > {}; exit 0",
            pidfile.display()
        );
        let output = cli(&endpoint)
            .args([verb, "gate-background", "--ttl", "2s", "--", "sh", "-c"])
            .arg(&script)
            .output()
            .expect("spawn fleetcoord");
        assert_eq!(output.status.code(), Some(0), "{verb}");
        let pid: u64 = std::fs::read_to_string(&pidfile)
            .expect("pid file")
            .trim()
            .parse()
            .expect("a pid");
        // Reaped by init once killed; give that a moment on a busy machine.
        let deadline = Instant::now() + Duration::from_secs(2);
        while alive(pid) && !zombie(pid) {
            assert!(
                Instant::now() < deadline,
                "{verb}: the background child {pid} outlived its command"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Killed but not yet reaped by its new parent.
fn zombie(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
            Some(state == 'Z')
        })
        .unwrap_or(false)
}

/// `lock --read` and `lock --write`: two readers run their commands at
/// once; a writer's command starts only once both have exited, and a
/// reader that comes while the writer waits starts after the writer.
#[test]
fn readers_run_together_and_a_writer_runs_alone() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let reader = |name| Gated::start(&endpoint, &["lock", "--read", name, "--", "sleep", "1000"]);
    let (mut a, mut b) = (reader("rwc"), reader("rwc"));
    a.expect("started");
    b.expect("started");
    let mut writer = Gated::start(&endpoint, &["lock", "--write", "rwc", "--", "true"]);
    writer.expect("waiting");
    assert!(
        writer.next("started", Duration::from_millis(700)).is_none(),
        "the writer's command started beside two readers"
    );
    let mut late = Gated::start(&endpoint, &["lock", "--read", "rwc", "--", "true"]);
    late.expect("waiting");
    assert!(
        late.next("started", Duration::from_millis(500)).is_none(),
        "a reader started although a writer waited ahead of it"
    );
    a.signal("-INT");
    assert_eq!(a.wait(), Some(0), "a clean stop");
    assert!(
        writer.next("started", Duration::from_millis(500)).is_none(),
        "the writer's command started beside a reader"
    );
    b.signal("-INT");
    assert_eq!(b.wait(), Some(0));
    let started = writer.expect("started");
    assert!(started["token"].as_i64().unwrap() > 0);
    assert_eq!(writer.wait(), Some(0));
    late.expect("started");
    assert_eq!(late.wait(), Some(0));
    assert!(
        etcdctl_keys(&endpoint, "/coord/rwlock/rwc/").is_empty(),
        "every side released its key"
    );
}
