//! `shards join NAME --shards M -- CMD` against a real etcd: two, then
//! three members; their commands' owned sets follow the membership (a
//! join, a graceful leave on SIGTERM, a member SIGKILLed and left to
//! expire), and no two commands ever hold one shard at once: per shard,
//! the commands' lives (from just before the spawn to just after the reap,
//! as each fleetcoord reports them; a SIGKILLed fleetcoord's command ends
//! with it, by its tether) never overlap. Also `shards NAME` (the table)
//! and its usage errors.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::{start_etcd, ChildGuard};
use crossbeam_channel::Receiver;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const WAIT: Duration = Duration::from_secs(20);
const SHARDS: u32 = 8;

fn cli(endpoint: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fleetcoord"));
    command
        .env("RUST_LOG", "off")
        .env_remove("ETCD_ENDPOINTS")
        .env_remove("ETCDCTL_ENDPOINTS")
        .stdin(Stdio::null())
        .args(["--json", "--endpoints", endpoint]);
    command
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// One `shards join` process; its JSON records (on stderr while a
/// command runs) arrive on `records`, and every one read is kept.
struct Member {
    id: &'static str,
    child: ChildGuard,
    records: Receiver<String>,
    seen: Vec<Value>,
}

impl Member {
    fn start(endpoint: &str, id: &'static str) -> Member {
        let mut child = cli(endpoint)
            .args([
                "shards",
                "join",
                "cli-map",
                "--shards",
                "8",
                "--member",
                id,
                "--ttl",
                "2s",
                "--drain",
                "1s",
                "--kill-grace",
                "1s",
                "--",
                "sh",
                "-c",
                // Deaf to SIGTERM (its children inherit that): it lingers
                // until the SIGKILL after the kill grace, so a hand-back
                // before its death would show as an overlap.
                "trap '' TERM; while :; do sleep 0.05; done",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fleetcoord");
        let records = common::lines_of(child.stderr.take().expect("stderr"));
        Member {
            id,
            child: ChildGuard(child),
            records,
            seen: Vec::new(),
        }
    }

    /// Reads records until the last `started` names exactly `want`.
    fn running_with(&mut self, want: &BTreeSet<u64>) {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.current() == Some(want.clone()) {
                return;
            }
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| {
                    panic!(
                        "{}: not running with {want:?}; records {:?}",
                        self.id, self.seen
                    )
                });
            if let Ok(line) = self.records.recv_timeout(left) {
                if let Ok(record) = serde_json::from_str::<Value>(&line) {
                    self.seen.push(record);
                }
            }
        }
    }

    /// The shards of the command running now (its last `started` with no
    /// `exited` after it).
    fn current(&self) -> Option<BTreeSet<u64>> {
        let last = self
            .seen
            .iter()
            .rev()
            .find(|r| r["event"] == "started" || r["event"] == "exited")?;
        (last["event"] == "started").then(|| shards_of(last))
    }

    /// Reads what is left (the process has ended).
    fn drain(&mut self) {
        while let Ok(line) = self.records.recv_timeout(Duration::from_secs(5)) {
            if let Ok(record) = serde_json::from_str::<Value>(&line) {
                self.seen.push(record);
            }
        }
    }

    /// Each command's life: (shards, from, to); `killed_at` ends one still
    /// running when fleetcoord was SIGKILLed.
    fn lives(&self, killed_at: Option<u64>) -> Vec<(BTreeSet<u64>, u64, u64)> {
        let mut lives = Vec::new();
        let mut open: Option<(BTreeSet<u64>, u64)> = None;
        for r in &self.seen {
            if r["event"] == "started" {
                assert!(open.is_none(), "{}: two commands at once", self.id);
                open = Some((shards_of(r), r["at_unix_us"].as_u64().expect("at")));
            } else if r["event"] == "exited" {
                let (shards, from) = open.take().expect("exited without started");
                lives.push((shards, from, r["at_unix_us"].as_u64().expect("at")));
            }
        }
        if let Some((shards, from)) = open {
            let to = killed_at.unwrap_or_else(|| panic!("{}: command never exited", self.id));
            lives.push((shards, from, to));
        }
        lives
    }
}

fn shards_of(record: &Value) -> BTreeSet<u64> {
    record["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .map(|s| s.as_u64().expect("shard"))
        .collect()
}

fn sigterm(child: &ChildGuard) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
}

#[test]
fn commands_follow_the_owned_set_and_never_share_a_shard() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let all: BTreeSet<u64> = (0..u64::from(SHARDS)).collect();

    let mut a = Member::start(&endpoint, "a");
    a.running_with(&all);
    let mut b = Member::start(&endpoint, "b");
    // The two split the map: whatever placement gives b, a keeps the rest.
    let deadline = Instant::now() + WAIT;
    loop {
        let (sa, sb) = (
            a.current().unwrap_or_default(),
            b.current().unwrap_or_default(),
        );
        if !sb.is_empty() && sa.len() + sb.len() == SHARDS as usize && sa.is_disjoint(&sb) {
            break;
        }
        assert!(Instant::now() < deadline, "no split: a {sa:?}, b {sb:?}");
        for m in [&mut a, &mut b] {
            if let Ok(line) = m.records.recv_timeout(Duration::from_millis(20)) {
                if let Ok(record) = serde_json::from_str::<Value>(&line) {
                    m.seen.push(record);
                }
            }
        }
    }
    // The table shows the split.
    let table = cli(&endpoint)
        .args(["shards", "cli-map", "--shards", "8"])
        .output()
        .expect("table");
    assert!(table.status.success(), "{table:?}");
    let rows: Vec<Value> = String::from_utf8_lossy(&table.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(rows.len(), SHARDS as usize);
    for row in &rows {
        let shard = row["shard"].as_u64().expect("shard");
        let owner = if b.current().unwrap_or_default().contains(&shard) {
            "b"
        } else {
            "a"
        };
        assert_eq!(row["owner"], owner, "{row}");
    }

    // b leaves gracefully: a runs with everything again.
    sigterm(&b.child);
    let status = b.child.0.wait().expect("b exits");
    // It left the map all the same; its command, deaf to SIGTERM, had to
    // be SIGKILLed after --kill-grace, and the status says so (128 + 9).
    assert_eq!(status.code(), Some(137), "b: {status:?}");
    b.drain();
    a.running_with(&all);

    // c joins, then a is SIGKILLed (its lease left to expire): c ends up
    // with everything.
    let mut c = Member::start(&endpoint, "c");
    let deadline = Instant::now() + WAIT;
    while c.current().is_none() {
        assert!(
            Instant::now() < deadline,
            "c never started its command: {:?}",
            c.seen
        );
        if let Ok(line) = c.records.recv_timeout(Duration::from_millis(50)) {
            if let Ok(record) = serde_json::from_str::<Value>(&line) {
                c.seen.push(record);
            }
        }
        while let Ok(line) = a.records.try_recv() {
            if let Ok(record) = serde_json::from_str::<Value>(&line) {
                a.seen.push(record);
            }
        }
    }
    a.running_with(&(&all - &c.current().expect("c runs")));
    a.child.0.kill().expect("SIGKILL a");
    let killed_at = now_us();
    let _ = a.child.0.wait();
    a.drain();
    c.running_with(&all);
    sigterm(&c.child);
    let _ = c.child.0.wait();
    c.drain();

    // No shard in two commands at once.
    let mut lives: BTreeMap<u64, Vec<(u64, u64, &str)>> = BTreeMap::new();
    for (m, killed) in [(&a, Some(killed_at)), (&b, None), (&c, None)] {
        for (shards, from, to) in m.lives(killed) {
            for s in shards {
                lives.entry(s).or_default().push((from, to, m.id));
            }
        }
    }
    for (shard, mut ls) in lives {
        ls.sort();
        for w in ls.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "shard {shard}: {:?} overlaps {:?}",
                w[0],
                w[1]
            );
        }
    }
}

#[test]
fn usage_errors_exit_2() {
    let server = start_etcd();
    for args in [
        vec!["shards", "a/b"],
        vec!["shards", "m", "--shards", "0"],
        vec!["shards", "m", "--shards", "4097"],
        vec![
            "shards", "join", "m", "--shards", "8", "--member", "x/y", "--", "true",
        ],
        vec!["shards", "m", "--prefix", "nope"],
    ] {
        let output = cli(&server.endpoint()).args(&args).output().expect("run");
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.lines().count() >= 1, "{args:?}");
        assert!(
            stderr.starts_with("error:") || stderr.starts_with("fleetcoord: error:"),
            "{args:?}: {stderr}"
        );
    }
}
