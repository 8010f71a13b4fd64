//! The `fleetcoord` binary, spawned against a real etcd: exit codes, usage
//! errors, `--json` output, each command family end to end, and running
//! as a service (`Type=notify` readiness, completions, the man page).

#[path = "../../tests/common/mod.rs"]
mod common;

use common::{etcdctl, start_etcd, ChildGuard};
use fleetcoord::testing::EtcdServer;
use serde_json::Value;
use std::io::{BufRead, BufReader, Lines};
use std::os::unix::net::UnixDatagram;
use std::process::{ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Upper bound for any step that normally takes milliseconds; a loaded
/// 2-core machine can stall for seconds.
const WAIT: Duration = Duration::from_secs(15);

fn cli() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fleetcoord"));
    // The default endpoint must come from the test, never from the runner,
    // and neither may the log level (tests count stderr lines).
    command
        .env_remove("ETCD_ENDPOINTS")
        .env_remove("ETCDCTL_ENDPOINTS")
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null());
    command
}

fn run(server: &EtcdServer, args: &[&str]) -> Output {
    cli()
        .args(["--endpoints", &server.endpoint()])
        .args(args)
        .output()
        .expect("spawn fleetcoord")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("utf-8 stdout")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn ok(server: &EtcdServer, args: &[&str]) -> String {
    let output = run(server, args);
    assert_eq!(
        output.status.code(),
        Some(0),
        "fleetcoord {args:?} failed: {}",
        stderr(&output)
    );
    stdout(&output)
}

/// The stdout of a read that finds nothing there, which exits 3.
fn nothing_there(server: &EtcdServer, args: &[&str]) -> String {
    let output = run(server, args);
    assert_eq!(
        output.status.code(),
        Some(3),
        "fleetcoord {args:?}: {}",
        stderr(&output)
    );
    stdout(&output)
}

/// Every stdout line as a JSON object; panics on anything else.
fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line: {line:?}: {e}"));
            assert!(value.is_object(), "not an object: {line}");
            value
        })
        .collect()
}

/// A long-running `fleetcoord --json ...`; killed on drop so a failing test
/// leaves nothing behind.
struct Running {
    child: ChildGuard,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Running {
    fn start(server: &EtcdServer, args: &[&str]) -> Running {
        let mut child = cli()
            .args(["--json", "--endpoints", &server.endpoint()])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn fleetcoord");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Running {
            child: ChildGuard(child),
            lines,
        }
    }

    /// Reads records until one has `key` == `value`; returns it.
    fn until(&mut self, key: &str, value: &str) -> Value {
        for line in self.lines.by_ref() {
            let line = line.expect("read child stdout");
            let record: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not a JSON line: {line:?}: {e}"));
            if record[key] == value {
                return record;
            }
        }
        panic!("the child's stdout ended before a record with {key} = {value}");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill(1)");
        assert!(status.success());
    }

    /// Waits for the exit and returns the status code.
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

#[test]
fn usage_errors_exit_2_with_a_message() {
    for args in [
        &[][..],
        &["no-such-command"],
        &["hosts", "--no-such-flag"],
        &["agent", "--host-id", "not-a-uuid"],
        &[
            "agent",
            "--host-id",
            "7f1c3a6e-8b2d-4a55-9f10-2b9d5f8e1c01",
            "--ttl",
            "5x",
        ],
        &[
            "agent",
            "--host-id",
            "7f1c3a6e-8b2d-4a55-9f10-2b9d5f8e1c01",
            "--meta",
            "{not json",
        ],
        &["--connect-timeout", "soon", "hosts"],
        &["--connect-timeout", "0s", "hosts"],
        &["--connect-timeout", "25h", "hosts"],
        &[
            "agent",
            "--host-id",
            "7f1c3a6e-8b2d-4a55-9f10-2b9d5f8e1c01",
            "--ttl",
            "0s",
        ],
        &["elect", "db", "--ttl", "500ms"],
        // Above the one-day maximum: a usage error too, not exit 1 after
        // connecting.
        &[
            "agent",
            "--host-id",
            "7f1c3a6e-8b2d-4a55-9f10-2b9d5f8e1c01",
            "--ttl",
            "100000000000000h",
        ],
        &["kv", "get", "only-a-bucket"],
        &["stream", "read", "s", "--from", "middle"],
        // A read-write lock: one side, no permits, a one-segment name, a
        // lease TTL of whole seconds.
        &["lock", "--read", "--write", "rw"],
        &["lock", "--read", "--permits", "2", "rw"],
        &["lock", "--write", "a/b"],
        &["lock", "--read", "rw", "--ttl", "500ms"],
        &["lock", "--write", "rw", "--prefix", "/coord/lock/"],
    ] {
        let output = cli().args(args).output().expect("spawn fleetcoord");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(output.stdout.is_empty(), "{args:?} printed on stdout");
        assert!(!stderr(&output).trim().is_empty(), "{args:?}: no message");
    }
    let junk = cli()
        .args(["--connect-timeout", "soon", "hosts"])
        .output()
        .expect("spawn");
    assert!(
        stderr(&junk).contains("not a duration") && stderr(&junk).contains("1m30s"),
        "{}",
        stderr(&junk)
    );
    // A read-write lock's name: refused before connecting, the allowed
    // form named.
    let slash = cli()
        .args(["lock", "--read", "a/b", "--", "true"])
        .output()
        .expect("spawn");
    assert_eq!(slash.status.code(), Some(2));
    assert!(
        stderr(&slash).contains("name") && stderr(&slash).contains('/'),
        "{}",
        stderr(&slash)
    );
    // A duration, but not one a lease can have.
    let fraction = cli()
        .args(["agent", "--host-id", "7f1c3a6e-8b2d-4a55-9f10-2b9d5f8e1c01"])
        .args(["--ttl", "1.5s"])
        .output()
        .expect("spawn");
    assert_eq!(fraction.status.code(), Some(2));
    assert!(
        stderr(&fraction).contains("whole number of seconds"),
        "{}",
        stderr(&fraction)
    );
}

#[test]
fn go_style_durations_are_accepted() {
    let server = start_etcd();
    ok(&server, &["--connect-timeout", "1m30s", "hosts"]);
    ok(&server, &["--connect-timeout", "1.5s", "hosts"]);
    let mut agent = Running::start(
        &server,
        &[
            "agent",
            "--host-id",
            "1d2c3b4a-5e6f-4a70-8b91-a2b3c4d5e6f7",
            "--ttl",
            "1m30s",
        ],
    );
    agent.until("state", "registered");
    let hosts = json_lines(&ok(&server, &["--json", "hosts"]));
    assert_eq!(hosts[0]["lease_granted_secs"], 90, "{hosts:?}");
}

/// A free loopback port: bind, learn it, release it.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// Runs `fleetcoord hosts` against `endpoint` expecting a connection
/// failure; checks it is one plain line naming the endpoint and returns it.
fn connect_error(endpoint: &str, timeout: &str) -> String {
    let started = Instant::now();
    let output = cli()
        .args([
            "--endpoints",
            endpoint,
            "--connect-timeout",
            timeout,
            "hosts",
        ])
        .output()
        .expect("spawn fleetcoord");
    assert!(started.elapsed() < WAIT, "took {:?}", started.elapsed());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(output.stdout.is_empty());
    let text = stderr(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {text:?}");
    let line = lines[0];
    assert!(
        line.starts_with("fleetcoord: error: cannot connect to etcd at "),
        "{line}"
    );
    assert!(line.contains(endpoint), "{line}");
    // No Debug dumps of tonic's or hyper's error structs.
    for dump in ["Status {", "tonic", "{", "Os ", "ConnectError"] {
        assert!(!line.contains(dump), "{dump:?} in {line}");
    }
    line.to_string()
}

#[test]
fn connection_errors_are_one_plain_line() {
    let refused = connect_error(&format!("127.0.0.1:{}", free_port()), "2s");
    assert!(refused.ends_with(": connection refused"), "{refused}");

    // Something that accepts TCP but never speaks HTTP/2: only the timeout
    // ends the attempt.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = silent.local_addr().expect("local_addr").to_string();
    let timed_out = connect_error(&endpoint, "300ms");
    assert!(
        timed_out.ends_with(": no answer within 300ms"),
        "{timed_out}"
    );
    drop(silent);
    // A name that does not resolve is not tried here: resolving it would
    // ask the system's DNS server, and tests only ever talk to loopback.
}

#[test]
fn endpoints_default_to_the_environment() {
    let server = start_etcd();
    let output = cli()
        .env("ETCD_ENDPOINTS", server.endpoint())
        .args(["--json", "hosts"])
        .output()
        .expect("spawn fleetcoord");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "");
}

/// `--endpoints ""` (or only separators) names no endpoint: a usage error,
/// not a silent fallback to the environment or the default.
#[test]
fn empty_endpoints_flag_is_a_usage_error() {
    let server = start_etcd();
    for flag in ["", " ", ",", " , "] {
        let output = cli()
            .env("ETCD_ENDPOINTS", server.endpoint())
            .args(["--endpoints", flag, "--json", "hosts"])
            .output()
            .expect("spawn fleetcoord");
        assert_eq!(
            output.status.code(),
            Some(2),
            "--endpoints {flag:?}: {}",
            stderr(&output)
        );
        assert!(output.stdout.is_empty());
        assert!(
            stderr(&output).contains("--endpoints"),
            "{}",
            stderr(&output)
        );
    }
}

#[test]
fn etcdctl_endpoints_are_honoured_after_ours() {
    let server = start_etcd();
    let dead = format!("127.0.0.1:{}", free_port());
    let hosts = |vars: &[(&str, String)], flag: Option<&str>| {
        let mut command = cli();
        command.envs(vars.iter().map(|(k, v)| (k, v)));
        if let Some(flag) = flag {
            command.args(["--endpoints", flag]);
        }
        command
            .args(["--connect-timeout", "2s", "--json", "hosts"])
            .output()
            .expect("spawn fleetcoord")
    };
    // etcdctl's variable, with the `http://` scheme etcdctl users write.
    let alone = hosts(
        &[("ETCDCTL_ENDPOINTS", format!("http://{}", server.endpoint()))],
        None,
    );
    assert_eq!(alone.status.code(), Some(0), "{}", stderr(&alone));

    // ETCD_ENDPOINTS comes first: pointing it at a dead port fails even
    // though ETCDCTL_ENDPOINTS is good...
    let ours_first = hosts(
        &[
            ("ETCD_ENDPOINTS", dead.clone()),
            ("ETCDCTL_ENDPOINTS", server.endpoint()),
        ],
        None,
    );
    assert_eq!(ours_first.status.code(), Some(1));
    assert!(
        stderr(&ours_first).contains(&dead),
        "{}",
        stderr(&ours_first)
    );
    // ...and the flag comes before both.
    let flag_first = hosts(
        &[
            ("ETCD_ENDPOINTS", dead.clone()),
            ("ETCDCTL_ENDPOINTS", dead.clone()),
        ],
        Some(&server.endpoint()),
    );
    assert_eq!(flag_first.status.code(), Some(0), "{}", stderr(&flag_first));
}

#[test]
fn kv_set_get_del_round_trip() {
    let server = start_etcd();
    let set = json_lines(&ok(
        &server,
        &["--json", "kv", "set", "cfg", "mode", "blue green"],
    ));
    assert_eq!(set.len(), 1);
    assert_eq!(set[0]["event"], "set");
    assert_eq!(ok(&server, &["kv", "get", "cfg", "mode"]), "blue green\n");
    let got = json_lines(&ok(&server, &["--json", "kv", "get", "cfg", "mode"]));
    assert_eq!(got.len(), 1);
    assert_eq!(
        (&got[0]["bucket"], &got[0]["key"], &got[0]["value"]),
        (&"cfg".into(), &"mode".into(), &"blue green".into())
    );
    ok(&server, &["kv", "del", "cfg", "mode"]);
    let missing = run(&server, &["kv", "get", "cfg", "mode"]);
    assert_eq!(missing.status.code(), Some(3), "nothing there");
    assert!(stderr(&missing).contains("mode"), "{}", stderr(&missing));

    // An invalid name is a usage error, though the library found it.
    let bad = run(&server, &["kv", "set", "a/b", "k", "v"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("bucket"), "{}", stderr(&bad));
}

#[test]
fn kv_set_if_revision_and_ttl() {
    let server = start_etcd();
    // A claim: only if absent; a second claim loses with status 3.
    let claimed = json_lines(&ok(
        &server,
        &[
            "--json",
            "kv",
            "set",
            "locks",
            "job",
            "me",
            "--if-revision",
            "0",
        ],
    ));
    let revision = claimed[0]["revision"].as_u64().expect("a revision");
    assert_eq!(
        ok(&server, &["kv", "get", "--revision", "locks", "job"]),
        format!("{revision}\n")
    );
    let got = json_lines(&ok(&server, &["--json", "kv", "get", "locks", "job"]));
    assert_eq!(got[0]["revision"].as_u64(), Some(revision));
    let lost = run(
        &server,
        &["kv", "set", "locks", "job", "you", "--if-revision", "0"],
    );
    assert_eq!(lost.status.code(), Some(3), "{}", stderr(&lost));
    assert!(
        stderr(&lost).contains(&format!("at revision {revision}")),
        "{}",
        stderr(&lost)
    );
    // The holder updates it at the revision it read.
    let rev = revision.to_string();
    let moved = ok(
        &server,
        &[
            "kv",
            "set",
            "locks",
            "job",
            "me again",
            "--if-revision",
            &rev,
        ],
    );
    assert!(moved.starts_with("set locks/job at revision "), "{moved}");
    // A presence marker that goes away by itself.
    ok(
        &server,
        &["kv", "set", "presence", "host-a", "up", "--ttl", "2s"],
    );
    assert_eq!(ok(&server, &["kv", "get", "presence", "host-a"]), "up\n");
    std::thread::sleep(std::time::Duration::from_millis(3500));
    let gone = run(&server, &["kv", "get", "presence", "host-a"]);
    assert_eq!(gone.status.code(), Some(3), "{}", stderr(&gone));
    // Out of range is a usage error before anything connects.
    for ttl in ["0s", "1s", "400d"] {
        let bad = run(&server, &["kv", "set", "presence", "h", "up", "--ttl", ttl]);
        assert_eq!(bad.status.code(), Some(2), "{ttl}: {}", stderr(&bad));
        assert!(stderr(&bad).contains("allowed range"), "{}", stderr(&bad));
    }
}

#[test]
fn kv_watch_sees_snapshot_then_changes() {
    let server = start_etcd();
    ok(&server, &["kv", "set", "cfg", "a", "1"]);
    let mut watch = Running::start(&server, &["kv", "watch", "cfg", "--count", "3"]);
    let first = watch.until("event", "put");
    assert_eq!((&first["key"], &first["value"]), (&"a".into(), &"1".into()));
    watch.until("event", "synced");
    ok(&server, &["kv", "set", "cfg", "b", "2"]);
    let change = watch.until("event", "put");
    assert_eq!(change["key"], "b");
    assert_eq!(watch.wait(), Some(0), "--count 3 ends the watch");
}

#[test]
fn hosts_lists_a_running_agent() {
    let server = start_etcd();
    let id = "5b0f8a2c-3d4e-4f60-8a71-92b3c4d5e6f7";
    let mut agent = Running::start(
        &server,
        &[
            "agent",
            "--host-id",
            id,
            "--meta",
            r#"{"zone":"a"}"#,
            "--ttl",
            "2s",
        ],
    );
    let registered = agent.until("state", "registered");
    assert_eq!(registered["host_id"], id);

    let hosts = json_lines(&ok(&server, &["--json", "hosts"]));
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    assert_eq!(hosts[0]["id"], id);
    assert_eq!(hosts[0]["metadata"]["zone"], "a");
    assert_eq!(hosts[0]["lease"], registered["lease"]);
    // Not published unless the agent is asked to (`--publish-incarnation`).
    assert_eq!(hosts[0]["incarnation"], 0);
    let remaining = hosts[0]["lease_remaining_secs"]
        .as_u64()
        .expect("lease_remaining_secs");
    let granted = hosts[0]["lease_granted_secs"]
        .as_u64()
        .expect("lease_granted_secs");
    assert!(
        remaining > 0 && remaining <= granted,
        "{remaining} of {granted}"
    );
    assert!(hosts[0]["lease_age_secs"].as_u64().is_some());
    assert!(ok(&server, &["hosts"]).contains(id));

    // A crash: the lease is not revoked, the host stays listed until its
    // TTL runs out.
    agent.child.kill().unwrap();
    agent.child.wait().unwrap();
    let deadline = Instant::now() + WAIT;
    while !ok(&server, &["--json", "hosts"]).is_empty() {
        assert!(Instant::now() < deadline, "the crashed agent never expired");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn agent_revokes_on_sigterm_and_watchers_see_it() {
    let server = start_etcd();
    let id = "0e7d6c5b-4a39-4281-9706-f5e4d3c2b1a0";
    let mut watch = Running::start(&server, &["watch-hosts", "--count", "3"]);
    watch.until("event", "synced");
    let mut agent = Running::start(&server, &["agent", "--host-id", id, "--ttl", "30s"]);
    agent.until("state", "registered");
    assert_eq!(watch.until("event", "up")["id"], id);
    let signaled = Instant::now();
    agent.signal("-TERM");
    let stopped = agent.until("state", "stopped");
    assert_eq!(stopped["left"], true);
    assert_eq!(agent.wait(), Some(0));
    // A 30 s lease gone at once: only a revoke does that, and the agent
    // announced it as a leave.
    let down = watch.until("event", "down");
    let latency = signaled.elapsed();
    println!("SIGTERM -> down ({}): {latency:?}", down["reason"]);
    assert_eq!(down["id"], id);
    assert_eq!(down["reason"], "left", "{down}");
    // Process exit included; a second is far below the 30 s TTL.
    assert!(latency < Duration::from_secs(1), "{latency:?}");
    assert_eq!(watch.wait(), Some(0));
    assert_eq!(ok(&server, &["hosts", "--json"]), "");
}

#[test]
fn a_sigkilled_agent_is_down_expired_within_the_ttl_and_says_so_for_people() {
    const TTL: u64 = 2;
    let server = start_etcd();
    let id = "7c6b5a49-3827-4165-8e4d-3c2b1a0f9e8d";
    // Human output: the reason is on the DOWN line.
    let mut watch = cli()
        .args([
            "--endpoints",
            &server.endpoint(),
            "watch-hosts",
            "--count",
            "3",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .map(ChildGuard)
        .expect("spawn watch-hosts");
    let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).lines();
    let mut line = || lines.next().expect("watch-hosts ended").expect("read");
    assert!(line().starts_with("SYNCED"));
    let mut agent = Running::start(&server, &["agent", "--host-id", id, "--ttl", "2s"]);
    agent.until("state", "registered");
    let up = line();
    assert!(up.starts_with("UP") && up.contains(id), "{up}");
    // A few renewals, so the expiry counts from a renewed lease.
    std::thread::sleep(Duration::from_millis(1500));
    agent.child.kill().expect("SIGKILL the agent");
    let killed = Instant::now();
    agent.child.wait().expect("reap");
    let down = line();
    let latency = killed.elapsed();
    println!("SIGKILL -> {down:?} at TTL {TTL} s: {latency:?}");
    assert!(down.starts_with("DOWN") && down.contains(id), "{down}");
    assert!(down.ends_with("(expired)"), "{down}");
    // At most TTL after the last renewal, plus etcd's 500 ms expiry loop
    // and room for a loaded machine.
    assert!(latency <= Duration::from_secs(TTL + 2), "{latency:?}");
}

#[test]
fn elect_then_leader_then_resign() {
    let server = start_etcd();
    let none = json_lines(&nothing_there(&server, &["--json", "leader", "db"]));
    assert_eq!(none.len(), 1);
    assert_eq!(none[0]["name"], "db");
    assert!(none[0]["leader"].is_null());

    let mut first = Running::start(&server, &["elect", "db", "--value", "node-1"]);
    let elected = first.until("event", "elected");
    let token = elected["token"].as_i64().expect("token is a number");
    let leader = json_lines(&ok(&server, &["--json", "leader", "db"]));
    assert_eq!(leader[0]["leader"]["value"], "node-1");
    assert_eq!(leader[0]["leader"]["token"], token);
    assert!(ok(&server, &["leader", "db"]).contains("node-1"));

    let mut second = Running::start(&server, &["elect", "db", "--value", "node-2"]);
    second.until("event", "campaigning");
    first.signal("-INT");
    assert_eq!(first.until("event", "resigned")["token"], token);
    assert_eq!(first.wait(), Some(0));
    let next = second.until("event", "elected");
    assert!(next["token"].as_i64().expect("token") > token);

    second.signal("-TERM");
    assert_eq!(second.wait(), Some(0));
    let after = json_lines(&nothing_there(&server, &["--json", "leader", "db"]));
    assert!(after[0]["leader"].is_null(), "{after:?}");
}

#[test]
fn observe_reports_the_current_leader() {
    let server = start_etcd();
    let mut leader = Running::start(&server, &["elect", "jobs", "--value", "w1"]);
    leader.until("event", "elected");
    let seen = json_lines(&ok(&server, &["--json", "observe", "jobs", "--count", "1"]));
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["leader"]["value"], "w1");
}

#[test]
fn streams_append_and_replay() {
    let server = start_etcd();
    assert_eq!(ok(&server, &["stream", "append", "audit", "login"]), "1\n");
    let second = json_lines(&ok(
        &server,
        &["--json", "stream", "append", "audit", "logout"],
    ));
    assert_eq!(second[0]["id"], 2);
    let read = json_lines(&ok(
        &server,
        &["--json", "stream", "read", "audit", "--count", "2"],
    ));
    let entries: Vec<(i64, &str)> = read
        .iter()
        .map(|r| (r["id"].as_i64().unwrap(), r["payload"].as_str().unwrap()))
        .collect();
    assert_eq!(entries, [(1, "login"), (2, "logout")]);
    let after = json_lines(&ok(
        &server,
        &[
            "--json", "stream", "read", "audit", "--from", "1", "--count", "1",
        ],
    ));
    assert_eq!(after[0]["payload"], "logout");
}

#[test]
fn sub_receives_what_pub_sends() {
    let server = start_etcd();
    let mut sub = Running::start(&server, &["sub", "deploys", "--count", "1"]);
    // `sub` prints nothing until a message arrives, so publish until its
    // subscription was live for one of them.
    let deadline = Instant::now() + WAIT;
    while sub.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "sub never received a message");
        ok(&server, &["pub", "deploys", "v42"]);
        std::thread::sleep(Duration::from_millis(100));
    }
    let message = sub.until("topic", "deploys");
    assert_eq!(message["payload"], "v42");
    assert_eq!(sub.wait(), Some(0));
}

/// The lines etcdctl prints for `lease list`: simple and `-w json`.
fn etcdctl_leases(server: &EtcdServer) -> (Vec<String>, Vec<Value>) {
    let simple = etcdctl(&server.endpoint(), &["lease", "list"]);
    let listed = simple.lines().skip(1).map(str::to_string).collect();
    let json: Value = serde_json::from_str(&etcdctl(
        &server.endpoint(),
        &["-w", "json", "lease", "list"],
    ))
    .expect("etcdctl -w json prints JSON");
    let ids = json["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .map(|l| l["id"].clone())
        .collect();
    (listed, ids)
}

#[test]
fn lease_ids_print_as_etcdctl_prints_them() {
    let server = start_etcd();
    let id = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";
    let mut agent = Running::start(&server, &["agent", "--host-id", id, "--ttl", "30s"]);
    let registered = agent.until("state", "registered");
    let (hex, decimal) = etcdctl_leases(&server);
    assert_eq!((hex.len(), decimal.len()), (1, 1), "{hex:?} {decimal:?}");
    let (hex, decimal) = (&hex[0], &decimal[0]);

    // --json: the decimal integer of `etcdctl -w json`.
    assert!(registered["lease"].is_u64(), "{registered}");
    assert_eq!(&registered["lease"], decimal);
    let hosts = json_lines(&ok(&server, &["--json", "hosts"]));
    assert_eq!(&hosts[0]["lease"], decimal);
    // For people: etcdctl's hex, as `etcdctl lease list` shows it.
    let human = ok(&server, &["hosts"]);
    assert!(human.contains(&format!("lease {hex} ")), "{human} vs {hex}");
    // The two forms name the same lease.
    let parsed = i64::from_str_radix(hex, 16).expect("etcdctl prints hex");
    assert_eq!(decimal.as_i64(), Some(parsed));

    // The election records follow the same rule.
    let mut leader = Running::start(&server, &["elect", "db", "--value", "n1"]);
    let elected = leader.until("event", "elected");
    let lease = elected["lease"]
        .as_i64()
        .expect("elected lease is a number");
    let current = json_lines(&ok(&server, &["--json", "leader", "db"]));
    assert_eq!(current[0]["leader"]["lease"], lease);
    let (hex, _) = etcdctl_leases(&server);
    assert!(hex.contains(&format!("{lease:016x}")), "{hex:?}");

    agent.signal("-TERM");
    assert_eq!(agent.wait(), Some(0));
    leader.signal("-TERM");
    assert_eq!(leader.wait(), Some(0));
}

#[test]
fn agent_human_output_shows_the_lease_in_hex() {
    let server = start_etcd();
    let id = "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f";
    let mut child = cli()
        .args(["--endpoints", &server.endpoint()])
        .args(["agent", "--host-id", id, "--ttl", "30s"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn fleetcoord");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let _child = ChildGuard(child);
    let registered = lines
        .by_ref()
        .map(|l| l.expect("read child stdout"))
        .find(|l| l.contains("registered"))
        .expect("a registered line");
    let (hex, _) = etcdctl_leases(&server);
    assert_eq!(hex.len(), 1, "{hex:?}");
    assert_eq!(registered, format!("{id}: registered (lease {})", hex[0]));
}

#[test]
fn library_warnings_reach_stderr() {
    let server = start_etcd();
    // The host watcher warns about (and skips) a key that is not a host id.
    etcdctl(&server.endpoint(), &["put", "/coord/hosts/not-a-uuid", "x"]);
    let watch = |level: Option<&str>| {
        let mut command = cli();
        if let Some(level) = level {
            command.env("RUST_LOG", level);
        }
        command
            .args(["--endpoints", &server.endpoint()])
            .args(["--json", "watch-hosts", "--count", "1"])
            .output()
            .expect("spawn fleetcoord")
    };
    let default = watch(None);
    assert_eq!(default.status.code(), Some(0), "{}", stderr(&default));
    assert_eq!(json_lines(&stdout(&default))[0]["event"], "synced");
    let warned = stderr(&default);
    assert!(
        warned.contains("WARN") && warned.contains("not a host id"),
        "{warned:?}"
    );
    // RUST_LOG chooses: `error` silences warnings.
    let quiet = watch(Some("error"));
    assert_eq!(quiet.status.code(), Some(0), "{}", stderr(&quiet));
    assert_eq!(stderr(&quiet), "");
}

/// `fleetcoord --coord redis --coord-url URL ...`, with no etcd anywhere.
fn redis_cli(url: &str, args: &[&str]) -> String {
    let output = cli()
        .env_remove("COORD")
        .env_remove("COORD_URL")
        .args(["--coord", "redis", "--coord-url", url])
        .args(args)
        .output()
        .expect("spawn fleetcoord");
    assert_eq!(
        output.status.code(),
        Some(0),
        "fleetcoord {args:?} failed: {}",
        stderr(&output)
    );
    stdout(&output)
}

#[test]
fn bus_commands_run_on_redis() {
    let server = fleetcoord::testing::RedisServer::start()
        .expect("start redis-server (run `make deps-redis`)");
    let url = server.url();
    redis_cli(&url, &["kv", "set", "config", "mode", "on"]);
    assert_eq!(redis_cli(&url, &["kv", "get", "config", "mode"]), "on\n");
    assert_eq!(
        redis_cli(&url, &["stream", "append", "audit", "login"]),
        "1\n"
    );
    assert_eq!(
        redis_cli(&url, &["stream", "append", "audit", "logout"]),
        "2\n"
    );
    let read = json_lines(&redis_cli(
        &url,
        &["--json", "stream", "read", "audit", "--count", "2"],
    ));
    let entries: Vec<(i64, &str)> = read
        .iter()
        .map(|r| (r["id"].as_i64().unwrap(), r["payload"].as_str().unwrap()))
        .collect();
    assert_eq!(entries, [(1, "login"), (2, "logout")]);
    // The data is in Redis, where the documented layout puts it.
    assert_eq!(
        server
            .command(&["HGET", "coord:kv:{config}", "mode"])
            .unwrap(),
        "on"
    );
    assert_eq!(
        server.command(&["XLEN", "coord:stream:{audit}"]).unwrap(),
        "2"
    );
}

// ---- running as a service ----

/// A notify socket in a directory of its own, as a service manager makes.
struct NotifySocket {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
    socket: UnixDatagram,
}

impl NotifySocket {
    fn bind(name: &str) -> NotifySocket {
        let dir = std::env::temp_dir().join(format!("fleetcoord-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("socket dir");
        let path = dir.join("notify");
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        NotifySocket { dir, path, socket }
    }

    /// The next datagram, as text; `None` after `WAIT`.
    fn next(&self) -> Option<String> {
        self.socket.set_read_timeout(Some(WAIT)).expect("timeout");
        let mut buf = [0u8; 4096];
        let n = self.socket.recv(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// Every datagram that arrives within `within`, with its arrival time.
    fn during(&self, within: Duration) -> Vec<(Instant, String)> {
        let end = Instant::now() + within;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return got;
            }
            self.socket.set_read_timeout(Some(left)).expect("timeout");
            if let Ok(n) = self.socket.recv(&mut buf) {
                got.push((
                    Instant::now(),
                    String::from_utf8_lossy(&buf[..n]).into_owned(),
                ));
            }
        }
    }

    /// Reads datagrams until `STOPPING=1`; panics if it does not come
    /// within `WAIT` of the one before.
    fn until_stopping(&self) {
        let mut rest = Vec::new();
        while let Some(datagram) = self.next() {
            let stopping = datagram == "STOPPING=1";
            rest.push(datagram);
            if stopping {
                return;
            }
        }
        panic!("no STOPPING=1 after {rest:?}");
    }
}

/// The arrival times of the `WATCHDOG=1` datagrams among `datagrams`.
fn pets(datagrams: &[(Instant, String)]) -> Vec<Instant> {
    datagrams
        .iter()
        .filter(|(_, d)| d == "WATCHDOG=1")
        .map(|(at, _)| *at)
        .collect()
}

/// The longest gap between consecutive instants.
fn longest_gap(at: &[Instant]) -> Duration {
    at.windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .max()
        .unwrap_or_default()
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn terminate(child: &ChildGuard) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill(1)");
    assert!(status.success());
}

fn wait_exit(child: &mut ChildGuard) -> Option<i32> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status.code();
        }
        assert!(Instant::now() < deadline, "fleetcoord did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn agent_says_ready_once_registered_and_stopping_at_the_end() {
    let server = start_etcd();
    let notify = NotifySocket::bind("agent");
    let started = Instant::now();
    let mut agent = ChildGuard(
        cli()
            .args(["--endpoints", &server.endpoint(), "agent", "--ttl", "30s"])
            .args(["--host-id", "5b8f0c1e-2d3a-4e6f-9a7b-1c2d3e4f5a6b"])
            .env("NOTIFY_SOCKET", &notify.path)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn fleetcoord"),
    );
    let ready = notify.next().expect("a readiness datagram");
    assert_eq!(ready, "READY=1\nSTATUS=registered");
    // Ready means registered: the host is listed by then.
    let hosts = cli()
        .args(["--endpoints", &server.endpoint(), "--json", "hosts"])
        .output()
        .expect("hosts");
    assert_eq!(String::from_utf8_lossy(&hosts.stdout).lines().count(), 1);
    assert!(started.elapsed() < WAIT);
    terminate(&agent);
    notify.until_stopping();
    assert_eq!(wait_exit(&mut agent), Some(0));
}

/// Under a watchdog the agent says `WATCHDOG=1` at every renewal (TTL 3 s:
/// about every second), falls silent while etcd is frozen (so systemd
/// would restart it), and resumes once etcd answers again.
#[test]
fn agent_pets_the_watchdog_at_each_renewal_and_only_then() {
    let server = start_etcd();
    let notify = NotifySocket::bind("watchdog");
    let mut agent = ChildGuard(
        cli()
            .args(["--endpoints", &server.endpoint(), "agent", "--ttl", "3s"])
            .args(["--host-id", "6c9f1d2e-3e4b-4f70-8b8c-2d3e4f5a6b7c"])
            .env("NOTIFY_SOCKET", &notify.path)
            .env("WATCHDOG_USEC", "3000000")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn fleetcoord"),
    );
    let healthy = notify.during(Duration::from_secs(4));
    assert!(
        healthy.iter().any(|(_, d)| d.starts_with("READY=1")),
        "{healthy:?}"
    );
    let healthy = pets(&healthy);
    assert!(healthy.len() >= 3, "{} pets in 4 s", healthy.len());
    // Liveness: well inside the 3 s period, on a loaded machine too.
    assert!(
        longest_gap(&healthy) < Duration::from_millis(2500),
        "longest gap {:?}",
        longest_gap(&healthy)
    );

    server.pause().expect("freeze etcd");
    let frozen = pets(&notify.during(Duration::from_secs(3)));
    server.resume().expect("thaw etcd");
    // A renewal answered just before the freeze may still be told.
    assert!(
        frozen.len() <= 1,
        "{} pets while etcd was frozen",
        frozen.len()
    );

    let thawed = Instant::now();
    let back = pets(&notify.during(Duration::from_secs(8)));
    let first = back.first().expect("pets again once etcd answers");
    assert!(
        first.duration_since(thawed) < Duration::from_secs(6),
        "first pet {:?} after the thaw",
        first.duration_since(thawed)
    );
    terminate(&agent);
    notify.until_stopping();
    assert_eq!(wait_exit(&mut agent), Some(0));
}

/// A waiting candidate renews its session too: both the leader and the
/// waiting one pet the watchdog; a watchdog shorter than the TTL is warned
/// about.
#[test]
fn candidates_pet_the_watchdog_leading_or_waiting() {
    let server = start_etcd();
    let sockets = [
        NotifySocket::bind("lead-dog"),
        NotifySocket::bind("wait-dog"),
    ];
    let spawn = |socket: &NotifySocket, value: &str, period: &str| {
        ChildGuard(
            cli()
                .args([
                    "--endpoints",
                    &server.endpoint(),
                    "elect",
                    "dog",
                    "--ttl",
                    "3s",
                ])
                .args(["--value", value])
                .env("NOTIFY_SOCKET", &socket.path)
                .env("WATCHDOG_USEC", period)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn fleetcoord"),
        )
    };
    let mut leader = spawn(&sockets[0], "a", "3000000");
    assert_eq!(
        sockets[0].next().as_deref(),
        Some("READY=1\nSTATUS=leading")
    );
    let mut waiting = spawn(&sockets[1], "b", "1000000");
    let lead = sockets[0].during(Duration::from_secs(3));
    // The waiting one's datagrams queued meanwhile: 3 s of them, and 1 more.
    let wait = sockets[1].during(Duration::from_secs(1));
    assert!(pets(&lead).len() >= 2, "leader: {lead:?}");
    assert!(pets(&wait).len() >= 2, "waiting: {wait:?}");
    assert!(
        !wait.iter().any(|(_, d)| d.starts_with("READY=1")),
        "the waiting one is not ready: {wait:?}"
    );
    terminate(&leader);
    terminate(&waiting);
    assert_eq!(wait_exit(&mut leader), Some(0));
    assert_eq!(wait_exit(&mut waiting), Some(0));
    let mut stderr = String::new();
    use std::io::Read;
    waiting
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert!(
        stderr.contains("shorter than the TTL"),
        "a 1 s watchdog with a 3 s TTL is warned about: {stderr}"
    );
}

#[test]
fn a_waiting_candidate_is_not_ready_until_it_leads() {
    let server = start_etcd();
    let first_socket = NotifySocket::bind("first");
    let second_socket = NotifySocket::bind("second");
    let elect = |socket: &NotifySocket, value: &str| {
        ChildGuard(
            cli()
                .args([
                    "--endpoints",
                    &server.endpoint(),
                    "elect",
                    "svc",
                    "--value",
                    value,
                ])
                .env("NOTIFY_SOCKET", &socket.path)
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn fleetcoord"),
        )
    };
    let mut first = elect(&first_socket, "a");
    assert_eq!(
        first_socket.next().as_deref(),
        Some("READY=1\nSTATUS=leading")
    );
    let mut second = elect(&second_socket, "b");
    second_socket
        .socket
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .expect("timeout");
    let mut buf = [0u8; 64];
    assert!(
        second_socket.socket.recv(&mut buf).is_err(),
        "the second candidate waits, so it is not ready"
    );
    terminate(&first);
    assert_eq!(wait_exit(&mut first), Some(0));
    assert_eq!(
        second_socket.next().as_deref(),
        Some("READY=1\nSTATUS=leading")
    );
    terminate(&second);
    assert_eq!(wait_exit(&mut second), Some(0));
}

#[test]
fn completions_are_valid_bash_and_the_man_page_names_every_command() {
    let script = cli()
        .args(["completions", "bash"])
        .output()
        .expect("completions");
    assert!(script.status.success());
    let script = String::from_utf8(script.stdout).expect("utf-8");
    assert!(script.contains("_fleetcoord()"), "{script:.200}");
    let syntax = Command::new("bash")
        .args(["-n", "-c", &script])
        .status()
        .expect("bash");
    assert!(syntax.success(), "bash -n refused the completion script");
    let page = cli().arg("man").output().expect("man");
    assert!(page.status.success());
    let page = String::from_utf8(page.stdout).expect("utf-8");
    assert!(
        page.starts_with(".ie") && page.contains(".TH fleetcoord 1"),
        "{page:.200}"
    );
    for command in ["agent", "elect", "lock", "watch\\-hosts", "completions"] {
        assert!(page.contains(command), "the man page lacks {command}");
    }
    let bad = cli().args(["completions", "nosh"]).output().expect("spawn");
    assert_eq!(
        bad.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

/// Issue 48, item 2, from the outside: a second agent with a live agent's
/// host id fails (status 1, the duplicate named, how to fix it) within
/// about one TTL and leaves the first registered; `--take-over` replaces
/// the first, which says `duplicate` and exits 1 without claiming a leave.
#[test]
fn a_second_agent_with_the_same_host_id_fails_and_take_over_displaces_the_first() {
    let server = start_etcd();
    let id = "5d4c3b2a-1908-4f7e-8d6c-5b4a39281706";
    let mut first = Running::start(&server, &["agent", "--host-id", id, "--ttl", "3s"]);
    let registered = first.until("state", "registered");
    let lease = registered["lease"].clone();

    let started = Instant::now();
    let second = cli()
        .args(["--endpoints", &server.endpoint()])
        .args(["agent", "--host-id", id, "--ttl", "3s"])
        .output()
        .expect("run the second agent");
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&second.stderr);
    println!(
        "second agent exited {:?} after {took:?}: {err}",
        second.status.code()
    );
    assert_eq!(second.status.code(), Some(1), "{err}");
    assert!(err.contains("duplicate id") && err.contains(id), "{err}");
    assert!(err.contains("--take-over"), "says how: {err}");
    assert!(took < Duration::from_secs(3 + 3), "took {took:?}");
    let hosts: Value =
        serde_json::from_str(ok(&server, &["hosts", "--json"]).trim()).expect("json");
    assert_eq!(
        hosts["lease"], lease,
        "the first still holds its key: {hosts}"
    );

    let mut third = Running::start(
        &server,
        &["agent", "--host-id", id, "--ttl", "3s", "--take-over"],
    );
    third.until("state", "registered");
    let displaced = first.until("state", "duplicate");
    println!("displaced: {displaced}");
    let stopped = first.until("state", "stopped");
    assert_eq!(stopped["duplicate"], true, "{stopped}");
    assert_eq!(stopped["left"], false, "{stopped}");
    assert_eq!(first.wait(), Some(1));
    third.signal("-TERM");
    assert_eq!(third.until("state", "stopped")["left"], true);
    assert_eq!(third.wait(), Some(0));
}
