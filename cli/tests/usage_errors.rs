//! Every way to call the tool wrongly exits 2 with one line on stderr
//! saying what is wrong, as the README promises: whether clap, the tool
//! or the library found it, and whether etcd is up or not (every name and
//! flag is checked before connecting). Runtime failures stay 1.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use common::start_etcd;
use std::process::Output;
use support::{at, cli, stderr, Running};

/// The tool's own verdict: exit 2, nothing on stdout, exactly one line on
/// stderr, naming `needle`.
fn one_line_usage_error(what: &str, output: &Output, needle: &str) {
    let text = stderr(output);
    assert_eq!(output.status.code(), Some(2), "{what}: {text}");
    assert!(output.stdout.is_empty(), "{what} printed on stdout");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: not one line: {text:?}");
    assert!(
        lines[0].starts_with("fleetcoord: error: "),
        "{what}: {text}"
    );
    assert!(
        lines[0].contains(needle),
        "{what}: {needle:?} not in {text}"
    );
}

/// clap's verdict: exit 2, the whole reason on the first line (clap adds
/// a usage hint below it).
fn parse_error(what: &str, output: &Output, needle: &str) {
    let text = stderr(output);
    assert_eq!(output.status.code(), Some(2), "{what}: {text}");
    assert!(output.stdout.is_empty(), "{what} printed on stdout");
    let first = text.lines().next().unwrap_or_default();
    assert!(first.starts_with("error: "), "{what}: {text}");
    assert!(first.contains(needle), "{what}: {needle:?} not in {first}");
}

const HOST: &str = "7f1c3a6e-8b2d-4a55-9f10-2b9d5f8e1c01";

#[test]
fn what_the_library_rejects_is_a_usage_error_with_or_without_etcd() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    // Nothing listens there: a check made only once connected would
    // report the connection error (1) instead.
    let nowhere = "127.0.0.1:1";
    let long = "x".repeat(300);
    let cases: &[(&[&str], &str)] = &[
        // Election, lock and semaphore names: one key segment.
        (&["elect", "a/b"], "contains '/'"),
        (&["elect", ""], "must not be empty"),
        (&["elect", &long], "300 bytes"),
        (&["elect", "a\u{7}b"], "control character"),
        (&["leader", "a/b"], "contains '/'"),
        (&["leader", ""], "must not be empty"),
        (&["observe", "a/b"], "contains '/'"),
        (&["lock", "a/b"], "contains '/'"),
        (&["lock", "--permits", "2", ""], "must not be empty"),
        (&["elect", "hand-over", "a/b", "--to", "x"], "contains '/'"),
        // Prefixes: start and end with '/'.
        (&["elect", "--prefix", "nope", "db"], "prefix"),
        (&["leader", "--prefix", "nope", "db"], "prefix"),
        (&["observe", "--prefix", "nope", "db"], "prefix"),
        (
            &["elect", "hand-over", "--prefix", "x", "db", "--to", "y"],
            "prefix",
        ),
        (&["lock", "--prefix", "nope", "db"], "prefix"),
        (&["hosts", "--prefix", "nope"], "prefix"),
        (&["watch-hosts", "--prefix", "nope"], "prefix"),
        (&["agent", "--host-id", HOST, "--prefix", "nope"], "prefix"),
        // Host ids.
        (
            &["agent", "--host-id", "00000000-0000-0000-0000-000000000000"],
            "nil UUID",
        ),
        // Buckets, keys, topics, streams, patterns.
        (&["kv", "get", "", "k"], "bucket"),
        (&["kv", "set", "b", "", "v"], "key"),
        (&["kv", "set", "b", "a/b", "v"], "key"),
        (&["kv", "del", "b/c", "k"], "bucket"),
        (&["kv", "watch", "b", ""], "pattern"),
        (&["pub", "", "m"], "topic"),
        (&["sub", ""], "topic"),
        (&["stream", "append", "", "x"], "stream"),
        (&["stream", "read", "a/b"], "stream"),
    ];
    for (args, needle) in cases {
        for at_endpoint in [endpoint.as_str(), nowhere] {
            let output = at(at_endpoint)
                .args(["--connect-timeout", "300ms"])
                .args(*args)
                .output()
                .expect("spawn");
            one_line_usage_error(&format!("{args:?} at {at_endpoint}"), &output, needle);
        }
    }
}

#[test]
fn a_slash_in_a_name_is_reported_with_that_name_and_command() {
    let cases: &[(&[&str], &str)] = &[
        (&["lock", "foo/bar"], "lock: "),
        (&["elect", "foo/bar"], "elect: "),
        (&["elect", "foo/bar", "--", "true"], "elect: "),
        (&["leader", "foo/bar"], "leader: "),
        (&["observe", "foo/bar"], "observe: "),
        (
            &["elect", "hand-over", "foo/bar", "--to", "x"],
            "elect hand-over: ",
        ),
        (&["lock", "--permits", "2", "foo/bar"], "lock: "),
        (&["lock", "--read", "foo/bar"], "lock: "),
        (&["barrier", "foo/bar", "--count", "2"], "barrier: "),
        (
            &["barrier", "foo/bar", "--count", "2", "--", "true"],
            "barrier: ",
        ),
    ];
    for (args, command) in cases {
        let output = at("127.0.0.1:1").args(*args).output().expect("spawn");
        let what = format!("{args:?}");
        one_line_usage_error(&what, &output, "\"foo/bar\"");
        let text = stderr(&output);
        assert!(
            text.starts_with(&format!("fleetcoord: error: {command}")),
            "{what}: names the command: {text}"
        );
        assert!(text.contains("\"foo\""), "{what}: names the parent: {text}");
        assert!(!text.contains("a/b"), "{what}: a fixed example: {text}");
    }
    // Shard maps, buckets: the command too.
    for (args, command) in [
        (&["shards", "foo/bar"][..], "shards: "),
        (
            &["shards", "join", "foo/bar", "--shards", "2", "--", "true"][..],
            "shards join: ",
        ),
        (&["kv", "get", "foo/bar", "k"][..], "kv get: "),
    ] {
        let output = at("127.0.0.1:1").args(args).output().expect("spawn");
        let what = format!("{args:?}");
        one_line_usage_error(&what, &output, "\"foo/bar\"");
        assert!(
            stderr(&output).starts_with(&format!("fleetcoord: error: {command}")),
            "{what}: {}",
            stderr(&output)
        );
    }
}

#[test]
fn a_semaphore_with_another_permit_count_is_a_usage_error() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let holder = Running::start(&endpoint, &["lock", "--permits", "2", "uploads"]);
    holder.until("event", "locked");
    let output = at(&endpoint)
        .args(["lock", "--permits", "3", "uploads"])
        .output()
        .expect("spawn");
    one_line_usage_error("--permits 3 beside 2", &output, "permits");
}

/// Arguments, environment variables, what the message must name.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

#[test]
fn what_the_tool_rejects_before_connecting_is_a_usage_error() {
    // No etcd anywhere: each is refused before any connection is tried
    // (a connection attempt would fail with status 1).
    let nowhere = "127.0.0.1:1";
    let missing = "/nonexistent/fleetcoord-test/ca.pem";
    let cases: &[Case] = &[
        // Endpoints: a port out of range, a space, a scheme, https without TLS.
        (
            &["--endpoints", "127.0.0.1:70000", "hosts"],
            &[],
            "not a port",
        ),
        (&["--endpoints", "a b:1", "hosts"], &[], "endpoints"),
        (&["--endpoints", "ftp://h:1", "hosts"], &[], "scheme"),
        (&["--endpoints", "https://h:1", "hosts"], &[], "--cacert"),
        (
            &["hosts"],
            &[("ETCD_ENDPOINTS", "127.0.0.1:0")],
            "not a port",
        ),
        // etcd TLS and users.
        (&["--cert", missing, "hosts"], &[], "--cacert"),
        (
            &["--cacert", missing, "--cert", missing, "hosts"],
            &[],
            "--key",
        ),
        (&["--cacert", missing, "hosts"], &[], missing),
        (&["hosts"], &[("ETCDCTL_CACERT", missing)], missing),
        (&["--user", "agent", "hosts"], &[], "no password"),
        (&["--password-file", missing, "hosts"], &[], "--user"),
        (
            &["--user", "agent", "--password-file", missing, "hosts"],
            &[],
            missing,
        ),
        // The flags of long-running commands on one-shot ones.
        (
            &["--metrics-addr", "127.0.0.1:0", "hosts"],
            &[],
            "--metrics-addr",
        ),
        (&["--timestamps", "hosts"], &[], "--timestamps"),
        (&["--timestamps", "leader", "db"], &[], "--timestamps"),
        // The bus backends.
        (&["kv", "get", "b", "k"], &[("COORD", "bogus")], "COORD"),
        (
            &[
                "--coord",
                "nats",
                "--coord-tls-cert",
                missing,
                "kv",
                "get",
                "b",
                "k",
            ],
            &[],
            "COORD_TLS_CA",
        ),
        (
            &["--coord", "nats", "kv", "get", "b", "k"],
            &[("COORD_TLS_CA", missing)],
            missing,
        ),
        (
            &[
                "--coord",
                "nats",
                "--nats-creds",
                missing,
                "--nats-nkey-file",
                missing,
                "sub",
                "t",
            ],
            &[],
            "set one",
        ),
        (
            &[
                "--coord",
                "nats",
                "--coord-url",
                "nats://127.0.0.1:99999",
                "sub",
                "t",
            ],
            &[],
            "99999",
        ),
        (
            &[
                "--coord",
                "redis",
                "--coord-url",
                "redis://127.0.0.1:99999",
                "sub",
                "t",
            ],
            &[],
            "99999",
        ),
        // A barrier without a name, or on a prefix without its slash.
        (&["barrier", "", "--count", "2"], &[], "name"),
        (
            &["barrier", "b", "--count", "2", "--prefix", "no-slash"],
            &[],
            "prefix",
        ),
        // Pages that do not exist.
        (&["man", "no-such-command"], &[], "no-such-command"),
        (&["man", "kv", "nope"], &[], "nope"),
    ];
    for (args, vars, needle) in cases {
        let output = cli()
            .env("ETCD_ENDPOINTS", nowhere)
            .args(["--connect-timeout", "1s"])
            .args(args.iter())
            .envs(vars.iter().copied())
            .output()
            .expect("spawn");
        one_line_usage_error(&format!("{args:?} {vars:?}"), &output, needle);
    }
}

#[test]
fn what_clap_rejects_is_a_usage_error_too() {
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--metrics-addr",
                "127.0.0.1:70000",
                "agent",
                "--host-id",
                HOST,
            ],
            "not a port",
        ),
        (
            &["--metrics-addr", "nohost", "agent", "--host-id", HOST],
            "HOST:PORT",
        ),
        (
            &["--metrics-addr", ":9100", "agent", "--host-id", HOST],
            "no host",
        ),
        (&["elect", "hand-over", "db", "--to", ""], "--to"),
        (&["elect", "db", "--ttl", "500ms"], "one second"),
        (&["lock", "--permits", "0", "db"], "--permits"),
        // Barrier sizes: none, above the most, beyond u32.
        (&["barrier", "b", "--count", "0"], "--count"),
        (&["barrier", "b", "--count", "10001"], "--count"),
        (&["barrier", "b", "--count", "99999999999"], "--count"),
        (&["barrier", "b", "--count", "-1"], "'-1'"),
        (&["barrier", "b"], "required arguments"),
        (
            &["barrier", "b", "--count", "2", "--ttl", "500ms"],
            "one second",
        ),
        (&["--coord", "bogus", "sub", "t"], "etcd, nats, redis"),
        (&["--endpoints", "", "hosts"], "names no endpoint"),
    ];
    for (args, needle) in cases {
        let output = cli().args(*args).output().expect("spawn");
        parse_error(&format!("{args:?}"), &output, needle);
    }
}

#[test]
fn runtime_failures_still_exit_1() {
    // Nothing listens there: not the user's typing, the world's state.
    let output = cli()
        .args(["--endpoints", "127.0.0.1:1", "--connect-timeout", "1s"])
        .args(["leader", "db"])
        .output()
        .expect("spawn");
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
}
