//! What the README and the man pages promise about exit statuses and
//! messages, each checked against a real etcd (or a server that is not
//! one): a stop asked for by a signal ends in 0, a lost leadership says how
//! to outlive it, "nothing there" exits 3, a foreign protocol is named as
//! such, and the etcd-version warning is one short line.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use common::{lines_of, start_etcd, ChildGuard};
use crossbeam_channel::Receiver;
use fleetcoord::testing::{FaultProxy, Mode};
use fleetcoord::{etcd_defects, Etcd, EtcdOptions};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{at, cli, stderr, stdout, WAIT};

/// A long-running `fleetcoord --json ...` whose stdout is its command's:
/// its records, on stderr, arrive on `records`; killed on drop.
struct OnStderr {
    child: ChildGuard,
    records: Receiver<String>,
    /// Every stderr line read so far, records and messages alike.
    seen: Vec<String>,
    /// Stdout's lines when it is piped: kept open, so that the tool never
    /// sees a closed stdout (which ends it quietly, status 0).
    _stdout: Option<Receiver<String>>,
}

impl OnStderr {
    fn start(endpoint: &str, args: &[&str]) -> OnStderr {
        let mut child = at(endpoint)
            .arg("--json")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fleetcoord");
        let records = lines_of(child.stderr.take().expect("stderr"));
        OnStderr {
            child: ChildGuard(child),
            records,
            seen: Vec::new(),
            _stdout: None,
        }
    }

    /// Reads stderr until a record has `event` == `name`; returns it.
    fn until(&mut self, name: &str) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("no {name:?} record within {WAIT:?}: {:?}", self.seen));
            let Ok(line) = self.records.recv_timeout(left) else {
                panic!("stderr closed before {name:?}: {:?}", self.seen);
            };
            self.seen.push(line.clone());
            if let Ok(record) = serde_json::from_str::<Value>(&line) {
                if record["event"] == name {
                    return record;
                }
            }
        }
    }

    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill(1)");
        assert!(status.success());
    }

    /// The exit code, and the rest of stderr.
    fn wait(&mut self) -> (Option<i32>, Vec<String>) {
        let deadline = Instant::now() + WAIT;
        let code = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status.code();
            }
            assert!(Instant::now() < deadline, "fleetcoord did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        while let Ok(line) = self.records.recv_timeout(Duration::from_secs(1)) {
            self.seen.push(line);
        }
        (code, self.seen.clone())
    }
}

#[test]
fn sigterm_ends_a_gated_command_with_status_0_when_it_obeys() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let runs: [(&[&str], &str); 3] = [
        (&["elect", "term-elect", "--", "sleep", "1000"], "started"),
        (&["lock", "term-lock", "--", "sleep", "1000"], "started"),
        (
            &[
                "shards", "join", "term-map", "--shards", "2", "--", "sleep", "1000",
            ],
            "started",
        ),
    ];
    for (args, started) in runs {
        let mut gated = OnStderr::start(&endpoint, args);
        gated.until(started);
        gated.terminate();
        let (code, said) = gated.wait();
        // The README: "0 on success and after Ctrl-C/SIGTERM".
        assert_eq!(code, Some(0), "{args:?}: {said:?}");
    }
    // A command that does not obey in time, or fails on its way out,
    // passes that on: the stop was not clean.
    let stubborn: [(&[&str], i32); 2] = [
        (
            &[
                "elect",
                "term-stubborn",
                "--kill-grace",
                "300ms",
                "--",
                "sh",
                "-c",
                "trap '' TERM; sleep 1000 & wait; sleep 1000",
            ],
            137,
        ),
        (
            &[
                "lock",
                "term-failing",
                "--",
                "sh",
                "-c",
                "trap 'exit 7' TERM; sleep 1000 & wait",
            ],
            7,
        ),
    ];
    for (args, expected) in stubborn {
        let mut gated = OnStderr::start(&endpoint, args);
        gated.until("started");
        // The shell sets its trap before the first record can be read;
        // give it the moment anyway on a loaded machine.
        std::thread::sleep(Duration::from_millis(200));
        gated.terminate();
        let (code, said) = gated.wait();
        assert_eq!(code, Some(expected), "{args:?}: {said:?}");
    }
}

#[test]
fn a_lost_leadership_ends_with_1_and_a_hint_naming_restart() {
    let server = start_etcd();
    let cases: [(&[&str], &str); 3] = [
        (
            &["elect", "lost-gated", "--ttl", "2s", "--", "sleep", "1000"],
            "--restart",
        ),
        (&["elect", "lost-plain", "--ttl", "2s"], "--restart"),
        (
            &["lock", "lost-lock", "--ttl", "2s", "--", "sleep", "1000"],
            "--restart",
        ),
    ];
    for (args, needle) in cases {
        let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
        let mut running = if args.contains(&"--") {
            OnStderr::start(&proxy.endpoint(), args)
        } else {
            // Without a command the records are on stdout: watch stderr
            // only for the end.
            OnStderr::start_plain(&proxy.endpoint(), args)
        };
        if args.contains(&"--") {
            running.until("started");
        } else {
            std::thread::sleep(Duration::from_millis(500));
        }
        proxy.set_mode(Mode::Blackhole);
        let (code, said) = running.wait();
        assert_eq!(code, Some(1), "{args:?}: {said:?}");
        let hint = said
            .iter()
            .find(|l| l.starts_with("fleetcoord: hint: "))
            .unwrap_or_else(|| panic!("{args:?}: no hint in {said:?}"));
        assert!(hint.contains(needle), "{args:?}: {hint}");
        let error = said
            .iter()
            .position(|l| l.starts_with("fleetcoord: error: "))
            .unwrap_or_else(|| panic!("{args:?}: no error in {said:?}"));
        assert!(
            said[error + 1].starts_with("fleetcoord: hint: "),
            "the hint follows the error: {said:?}"
        );
    }
}

impl OnStderr {
    /// [`OnStderr::start`] for a command without CMD: it waits until the
    /// campaign is won (its `elected` record, on stdout) before returning.
    fn start_plain(endpoint: &str, args: &[&str]) -> OnStderr {
        let mut child = at(endpoint)
            .arg("--json")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fleetcoord");
        let out = lines_of(child.stdout.take().expect("stdout"));
        let records = lines_of(child.stderr.take().expect("stderr"));
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline
                .checked_duration_since(Instant::now())
                .expect("no elected record in time");
            let line = out.recv_timeout(left).expect("an elected record");
            if line.contains("\"elected\"") {
                break;
            }
        }
        OnStderr {
            child: ChildGuard(child),
            records,
            seen: Vec::new(),
            _stdout: Some(out),
        }
    }
}

#[test]
fn nothing_there_exits_3_and_something_there_0() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let run = |args: &[&str]| at(&endpoint).args(args).output().expect("spawn");

    // Nothing there: 3, the answer printed all the same.
    let leader = run(&["--json", "leader", "none-yet"]);
    assert_eq!(leader.status.code(), Some(3), "{}", stderr(&leader));
    let record: Value = serde_json::from_str(stdout(&leader).trim()).expect("one record");
    assert!(record["leader"].is_null(), "{record}");
    let text = run(&["leader", "none-yet"]);
    assert_eq!(text.status.code(), Some(3));
    assert!(stdout(&text).contains("no leader"), "{}", stdout(&text));

    let key = run(&["kv", "get", "cfg", "missing"]);
    assert_eq!(key.status.code(), Some(3), "{}", stderr(&key));
    assert!(
        stdout(&key).is_empty(),
        "no value printed: {}",
        stdout(&key)
    );
    assert!(stderr(&key).contains("missing"), "{}", stderr(&key));
    let key = run(&["--json", "kv", "get", "cfg", "missing"]);
    assert_eq!(key.status.code(), Some(3));
    let record: Value = serde_json::from_str(stdout(&key).trim()).expect("one record");
    assert!(record["value"].is_null(), "{record}");

    let shards = run(&["shards", "empty-map", "--shards", "4"]);
    assert_eq!(shards.status.code(), Some(3), "{}", stderr(&shards));

    // Something there: 0.
    let leading = support::Running::start(&endpoint, &["elect", "there"]);
    leading.until("event", "elected");
    assert_eq!(run(&["leader", "there"]).status.code(), Some(0));
    assert_eq!(run(&["kv", "set", "cfg", "k", "v"]).status.code(), Some(0));
    assert_eq!(run(&["kv", "get", "cfg", "k"]).status.code(), Some(0));
    let member =
        support::Running::start(&endpoint, &["shards", "join", "full-map", "--shards", "2"]);
    member.until("event", "acquired");
    assert_eq!(
        run(&["shards", "full-map", "--shards", "2"]).status.code(),
        Some(0)
    );
    drop((leading, member));
}

/// A server that answers every connection with `reply` and hangs up.
fn foreign_server(reply: &'static [u8]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            // As a server that keeps the connection: answer the first
            // bytes, then read until the client hangs up.
            std::thread::spawn(move || {
                let mut buffer = [0u8; 1024];
                let _ = stream.read(&mut buffer);
                let _ = stream.write_all(reply);
                while matches!(stream.read(&mut buffer), Ok(n) if n > 0) {}
            });
        }
    });
    address
}

#[test]
fn a_server_that_is_not_etcd_is_named_as_such() {
    let servers = [
        (
            "HTTP/1",
            foreign_server(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"),
        ),
        ("Redis", foreign_server(b"-ERR unknown command 'PRI'\r\n")),
    ];
    for (what, address) in servers {
        for args in [&["hosts"][..], &["elect", "db"][..]] {
            let output = cli()
                .args(["--endpoints", &address, "--connect-timeout", "3s"])
                .args(args)
                .output()
                .expect("spawn");
            let text = stderr(&output);
            assert_eq!(output.status.code(), Some(1), "{what}: {text}");
            assert_eq!(text.lines().count(), 1, "{what}: one line: {text}");
            assert!(
                text.contains("not an etcd server (or a TLS mismatch)"),
                "{what}: {text}"
            );
            assert!(
                text.contains(&address),
                "{what}: names the endpoint: {text}"
            );
        }
    }
}

#[test]
fn the_etcd_version_warning_is_one_short_line() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let etcd = Etcd::with_options(endpoint.as_str(), EtcdOptions::default()).expect("connect");
    let version = etcd
        .server_version()
        .expect("etcd reports its version")
        .to_string();
    etcd.close().expect("close");
    // The default log level, as a user has it.
    let output = cli()
        .env_remove("RUST_LOG")
        .args(["--endpoints", &endpoint, "kv", "set", "cfg", "k", "v"])
        .output()
        .expect("spawn");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stderr(&output);
    let lines: Vec<&str> = text.lines().collect();
    if etcd_defects(&version).is_empty() {
        assert!(
            lines.is_empty(),
            "etcd {version} has no known defect: {text}"
        );
        return;
    }
    assert_eq!(lines.len(), 1, "one line: {text}");
    let line = lines[0];
    assert!(line.contains(&version), "{line}");
    // The log prefix (time, level, target) plus the message.
    let message = line.split_once("] ").map_or(line, |(_, message)| message);
    assert!(
        message.chars().count() <= 120,
        "{} characters: {message}",
        message.chars().count()
    );
}

#[test]
fn a_tls_mismatch_is_named_as_such() {
    let tls = fleetcoord::testing::EtcdBuilder::new()
        .tls()
        .start()
        .expect("a TLS etcd");
    let plain = start_etcd();
    let ca = tls.pki().expect("its CA").ca_path();
    let ca = ca.to_str().expect("a UTF-8 path");
    let cases: [(&str, Vec<String>); 2] = [
        // Plain text to a TLS port.
        ("plain to TLS", vec![format!("http://{}", tls.endpoint())]),
        // TLS to a plain-text port.
        (
            "TLS to plain",
            vec![
                "--cacert".into(),
                ca.into(),
                format!("https://{}", plain.endpoint()),
            ],
        ),
    ];
    for (what, args) in cases {
        let (endpoint, flags) = args.split_last().expect("an endpoint");
        let output = cli()
            .args(flags)
            .args(["--endpoints", endpoint, "--connect-timeout", "3s", "hosts"])
            .output()
            .expect("spawn");
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{what}: {text}");
        assert!(
            text.contains("not an etcd server (or a TLS mismatch)"),
            "{what}: {text}"
        );
        assert!(text.contains(endpoint.as_str()), "{what}: {text}");
    }
}
