//! `make demo`: a small fleet on one machine, narrated.
//!
//! Starts a throwaway etcd (unless `--endpoints HOST:PORT` is given), then
//! three agents and two campaigners as separate `fleetcoord` processes, and
//! watches them from here: host Up events, the leader, a KV change, an agent
//! crash (SIGKILL) and its Down after the lease TTL, a leader handing over
//! to the next campaigner with a higher fencing token, and a graceful leave.
//!
//! Run: `cargo build -p fleetcoord-cli --bin fleetcoord --example demo`,
//! then `cargo run -p fleetcoord-cli --example demo`. It looks for the
//! `fleetcoord` binary next to its own build directory, or at
//! `$FLEETCOORD_BIN`.

use crossbeam_channel::{Receiver, Sender};
use fleetcoord::coordinator::{Coordinator, EtcdCoordinator, KvEvent};
use fleetcoord::testing::EtcdServer;
use fleetcoord::{
    Election, Etcd, EtcdOptions, HostEvent, HostWatcher, LeaderInfo, WatcherOptions,
    DEFAULT_HOSTS_PREFIX,
};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Agents' lease TTL in seconds: how long after a crash the fleet sees Down.
const AGENT_TTL_SECS: u64 = 3;
/// Upper bound for any step that normally takes milliseconds (a loaded
/// 2-core machine can stall for seconds).
const STEP: Duration = Duration::from_secs(15);

type Error = Box<dyn std::error::Error>;

static START: OnceLock<Instant> = OnceLock::new();

fn say(who: &str, what: impl std::fmt::Display) {
    let ms = START.get_or_init(Instant::now).elapsed().as_millis();
    println!("[{ms:>6} ms] {who:<13}| {what}");
}

/// Everything that happens, in the order it was seen.
enum Seen {
    Host(HostEvent),
    Leader(Option<LeaderInfo>),
    Kv(KvEvent),
    Child { name: String, record: Value },
}

/// Every process the demo started. Dropping it (any exit path, panics
/// included) kills and reaps whatever is still running.
#[derive(Default)]
struct Fleet {
    procs: Vec<(String, Child)>,
}

impl Fleet {
    fn pid(&self, name: &str) -> Result<u32, Error> {
        self.procs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.id())
            .ok_or_else(|| format!("no process named {name}").into())
    }

    /// SIGKILL: a crash, nothing runs in the process after it.
    fn crash(&mut self, name: &str) -> Result<(), Error> {
        let (_, child) = self
            .procs
            .iter_mut()
            .find(|(n, _)| n == name)
            .ok_or_else(|| format!("no process named {name}"))?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// SIGTERM, then wait for the clean exit (the process revokes or
    /// resigns first); returns the exit status.
    fn stop(&mut self, name: &str) -> Result<std::process::ExitStatus, Error> {
        let pid = self.pid(name)?;
        // std only sends SIGKILL; kill(1) keeps this free of unsafe code.
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        let (_, child) = self
            .procs
            .iter_mut()
            .find(|(n, _)| n == name)
            .ok_or_else(|| format!("no process named {name}"))?;
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                return Err(format!("{name} did not exit within {STEP:?} of SIGTERM").into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (_, child) in &mut self.procs {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

/// The `fleetcoord` binary: `$FLEETCOORD_BIN`, else next to this example
/// (`target/<profile>/examples/demo` → `target/<profile>/fleetcoord`).
fn find_cli() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os("FLEETCOORD_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent();
    while let Some(d) = dir {
        let candidate = d.join("fleetcoord");
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = d
            .parent()
            .filter(|p| p.ends_with("debug") || p.ends_with("release"));
    }
    Err(
        "the fleetcoord binary was not found next to the demo; build it first with \
         `cargo build -p fleetcoord-cli --bin fleetcoord` (make demo does) or set FLEETCOORD_BIN"
            .into(),
    )
}

struct Demo {
    cli: PathBuf,
    endpoint: String,
    fleet: Fleet,
    seen: Receiver<Seen>,
    tx: Sender<Seen>,
}

impl Demo {
    /// Starts `fleetcoord --json <args>` as `name`; its records are
    /// narrated and forwarded as [`Seen::Child`].
    fn spawn(&mut self, name: &str, args: &[&str]) -> Result<(), Error> {
        let mut child = Command::new(&self.cli)
            .args(["--json", "--endpoints", &self.endpoint])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("child stdout missing")?;
        say(name, format!("started (pid {})", child.id()));
        self.fleet.procs.push((name.to_string(), child));
        let (tx, name) = (self.tx.clone(), name.to_string());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let record: Value = serde_json::from_str(&line).unwrap_or(Value::String(line));
                say(&name, describe_child(&record));
                let _ = tx.send(Seen::Child {
                    name: name.clone(),
                    record,
                });
            }
        });
        Ok(())
    }

    /// Waits until `want` accepts something seen, up to `within`.
    fn expect<T>(
        &self,
        what: &str,
        within: Duration,
        mut want: impl FnMut(&Seen) -> Option<T>,
    ) -> Result<T, Error> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.seen.recv_timeout(left) {
                Ok(seen) => {
                    if let Some(t) = want(&seen) {
                        return Ok(t);
                    }
                }
                Err(_) => return Err(format!("{what} did not happen within {within:?}").into()),
            }
        }
    }
}

fn describe_child(record: &Value) -> String {
    let field = |k: &str| record.get(k).and_then(Value::as_str).unwrap_or("?");
    if let Some(state) = record.get("state").and_then(Value::as_str) {
        return match state {
            // `--json` carries lease ids as decimal integers; people read
            // them in hex, as etcdctl prints them.
            "registered" => match record.get("lease").and_then(Value::as_i64) {
                Some(lease) => format!("registered, lease {lease:016x}"),
                None => "registered".to_string(),
            },
            "stopped" => format!("stopped, lease revoked: {}", record["revoked"]),
            other => other.to_string(),
        };
    }
    match record.get("event").and_then(Value::as_str) {
        Some("campaigning") => format!("campaigning as {}", field("value")),
        Some("elected") => format!("elected, fencing token {}", record["token"]),
        Some("resigned") => "resigned".into(),
        Some(other) => other.to_string(),
        None => record.to_string(),
    }
}

fn host_name(info: &fleetcoord::HostInfo) -> String {
    serde_json::from_slice::<Value>(&info.metadata)
        .ok()
        .and_then(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| info.id.to_string())
}

fn leader_is(seen: &Seen, value: &str) -> Option<i64> {
    match seen {
        Seen::Leader(Some(l)) if l.value == value.as_bytes() => Some(l.token),
        _ => None,
    }
}

fn down_of(seen: &Seen, id: Uuid) -> bool {
    matches!(seen, Seen::Host(HostEvent::Down(i, _)) if i.id == id)
}

fn run(endpoints: Option<String>) -> Result<(), Error> {
    say(
        "demo",
        "a fleet of three agents and two campaigners, watched from here",
    );
    let _server; // dropped last: etcd outlives every process below
    let (endpoint, tag) = match endpoints {
        Some(e) => {
            // A shared cluster: keep out of everybody else's keys.
            let tag = format!("-{}", &Uuid::new_v4().simple().to_string()[..8]);
            say(
                "demo",
                format!("using the etcd at {e} (names end in {tag})"),
            );
            (e, tag)
        }
        None => {
            let server = EtcdServer::start()?;
            let e = server.endpoint();
            say(
                "etcd",
                format!(
                    "throwaway etcd ready at {e} (pid {})",
                    server.pid().unwrap_or(0)
                ),
            );
            _server = server;
            (e, String::new())
        }
    };
    let prefix = if tag.is_empty() {
        DEFAULT_HOSTS_PREFIX.to_string()
    } else {
        format!("/coord/demo{tag}/hosts/")
    };
    let (election_name, bucket) = (format!("primary{tag}"), format!("config{tag}"));
    let (tx, seen) = crossbeam_channel::unbounded();
    let mut demo = Demo {
        cli: find_cli()?,
        endpoint: endpoint.clone(),
        fleet: Fleet::default(),
        seen,
        tx,
    };

    let etcd = Etcd::with_options(&[&endpoint], EtcdOptions::default())?;
    let watcher = HostWatcher::with_options(&etcd, WatcherOptions::default().with_prefix(&prefix))?;
    let election = Election::new(&etcd, &election_name)?;
    let observer = election.observe()?;
    let coord = EtcdCoordinator::on_etcd(&etcd)?;
    let kv_watch = coord.kv_watch(&bucket, "*")?;
    forward(watcher.events().clone(), demo.tx.clone(), |e| {
        match &e {
            HostEvent::Up(i) => say(
                "host watcher",
                format!(
                    "UP      {} {}",
                    host_name(i),
                    String::from_utf8_lossy(&i.metadata)
                ),
            ),
            HostEvent::Updated(i) => say("host watcher", format!("UPDATED {}", host_name(i))),
            HostEvent::Down(i, why) => say(
                "host watcher",
                format!(
                    "DOWN    {} ({why}: lease {:016x} gone)",
                    host_name(i),
                    i.lease
                ),
            ),
            HostEvent::Synced => say("host watcher", "synced: every registered host listed"),
        }
        Seen::Host(e)
    });
    let name = election_name.clone();
    forward(observer.leaders().clone(), demo.tx.clone(), move |l| {
        match &l {
            Some(l) => say(
                "observer",
                format!(
                    "leader of {name} is {} (fencing token {})",
                    String::from_utf8_lossy(&l.value),
                    l.token
                ),
            ),
            None => say("observer", format!("{name} has no leader")),
        }
        Seen::Leader(l)
    });
    let b = bucket.clone();
    forward(kv_watch.receiver().clone(), demo.tx.clone(), move |e| {
        match &e {
            KvEvent::Put { key, value } => say(
                "kv watcher",
                format!("PUT {b}/{key} = {}", String::from_utf8_lossy(value)),
            ),
            KvEvent::Deleted { key } => say("kv watcher", format!("DELETE {b}/{key}")),
            KvEvent::Synced => say("kv watcher", format!("synced on bucket {b}")),
        }
        Seen::Kv(e)
    });
    demo.expect("the host watcher's sync", STEP, |s| {
        matches!(s, Seen::Host(HostEvent::Synced)).then_some(())
    })?;

    let ttl = format!("{AGENT_TTL_SECS}s");
    let mut ids = Vec::new();
    for (i, zone) in ["a", "b", "c"].iter().enumerate() {
        let name = format!("agent-{}", i + 1);
        let id = Uuid::new_v4();
        let meta = format!(r#"{{"name":"{name}","zone":"{zone}"}}"#);
        demo.spawn(
            &name,
            &[
                "agent",
                "--host-id",
                &id.to_string(),
                "--meta",
                &meta,
                "--ttl",
                &ttl,
                "--prefix",
                &prefix,
            ],
        )?;
        ids.push(id);
    }
    let mut missing: std::collections::HashSet<Uuid> = ids.iter().copied().collect();
    demo.expect("every agent's Up", STEP, |s| {
        if let Seen::Host(HostEvent::Up(i)) = s {
            missing.remove(&i.id);
        }
        missing.is_empty().then_some(())
    })?;

    demo.spawn(
        "campaigner-a",
        &[
            "elect",
            &election_name,
            "--value",
            "campaigner-a",
            "--ttl",
            "5s",
        ],
    )?;
    let first_token = demo.expect("campaigner-a leading", STEP, |s| {
        leader_is(s, "campaigner-a")
    })?;
    demo.spawn(
        "campaigner-b",
        &[
            "elect",
            &election_name,
            "--value",
            "campaigner-b",
            "--ttl",
            "5s",
        ],
    )?;
    demo.expect("campaigner-b queueing", STEP, |s| {
        matches!(s, Seen::Child { name, record } if name == "campaigner-b" && record["event"] == "campaigning").then_some(())
    })?;

    say(
        "operator",
        format!("fleetcoord kv set {bucket} rollout 50%"),
    );
    let status = Command::new(&demo.cli)
        .args([
            "--endpoints",
            &endpoint,
            "kv",
            "set",
            &bucket,
            "rollout",
            "50%",
        ])
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        return Err(format!("fleetcoord kv set failed: {status}").into());
    }
    demo.expect("the KV change at the watcher", STEP, |s| {
        matches!(s, Seen::Kv(KvEvent::Put { key, .. }) if key == "rollout").then_some(())
    })?;

    say(
        "demo",
        format!("SIGKILL agent-2: a crash, nobody revokes its lease (TTL {AGENT_TTL_SECS} s)"),
    );
    let crashed = Instant::now();
    demo.fleet.crash("agent-2")?;
    demo.expect(
        "agent-2's Down",
        STEP + Duration::from_secs(AGENT_TTL_SECS),
        |s| down_of(s, ids[1]).then_some(()),
    )?;
    say(
        "demo",
        format!(
            "agent-2 seen Down {} ms after the crash: the lease expired",
            crashed.elapsed().as_millis()
        ),
    );

    say(
        "demo",
        "SIGTERM campaigner-a: the leader resigns, the next in line takes over",
    );
    let status = demo.fleet.stop("campaigner-a")?;
    let second_token = demo.expect("campaigner-b leading", STEP, |s| {
        leader_is(s, "campaigner-b")
    })?;
    say("demo", format!(
        "campaigner-a exited ({status}); new leader campaigner-b, fencing token {second_token} > {first_token}: \
         writes fenced with {first_token} are now refused"
    ));
    if second_token <= first_token {
        return Err("the fencing token did not increase".into());
    }

    say(
        "demo",
        "SIGTERM agent-1: a graceful leave revokes the lease",
    );
    let left = Instant::now();
    demo.fleet.stop("agent-1")?;
    demo.expect("agent-1's Down", STEP, |s| down_of(s, ids[0]).then_some(()))?;
    say(
        "demo",
        format!(
            "agent-1 seen Down {} ms after SIGTERM",
            left.elapsed().as_millis()
        ),
    );

    for name in ["agent-3", "campaigner-b"] {
        let status = demo.fleet.stop(name)?;
        if !status.success() {
            return Err(format!("{name} exited with {status}").into());
        }
    }
    drop((kv_watch, observer, watcher));
    let _ = coord.close();
    let _ = election.close();
    let _ = etcd.close();
    drop(demo);
    say("demo", "every process stopped cleanly; done");
    Ok(())
}

/// Narrates and forwards one source's items on its own thread, so the
/// narration follows the order things actually happen in.
fn forward<T: Send + 'static>(
    rx: Receiver<T>,
    tx: Sender<Seen>,
    mut f: impl FnMut(T) -> Seen + Send + 'static,
) {
    std::thread::spawn(move || {
        for item in rx {
            if tx.send(f(item)).is_err() {
                return;
            }
        }
    });
}

fn main() -> ExitCode {
    START.get_or_init(Instant::now);
    let mut args = std::env::args().skip(1);
    let endpoints = match (args.next().as_deref(), args.next()) {
        (None, _) => None,
        (Some("--endpoints"), Some(e)) if !e.is_empty() => Some(e),
        _ => {
            eprintln!("usage: demo [--endpoints HOST:PORT[,...]]");
            return ExitCode::from(2);
        }
    };
    match run(endpoints) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}
