//! Streaming output carries its time: `ts` (RFC 3339, UTC, milliseconds)
//! in every `--json` record of every streaming command, and at the start
//! of each text line with `--timestamps`; one-shot commands print none.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use common::start_etcd;
use serde_json::Value;
use std::time::{Duration, SystemTime};
use support::{at, stderr, stdout, Running};

/// `ts` of `record`, checked: `YYYY-MM-DDTHH:MM:SS.mmmZ`, between
/// `before` (cut to the millisecond, as printed) and `after`.
fn check_ts(what: &str, record: &Value, before: SystemTime, after: SystemTime) {
    let ts = record["ts"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no ts in {record}"));
    check_stamp(what, ts, before, after);
}

fn check_stamp(what: &str, ts: &str, before: SystemTime, after: SystemTime) {
    let shape = ts.len() == 24
        && ts.ends_with('Z')
        && ts.char_indices().all(|(i, c)| match i {
            4 | 7 => c == '-',
            10 => c == 'T',
            13 | 16 => c == ':',
            19 => c == '.',
            23 => c == 'Z',
            _ => c.is_ascii_digit(),
        });
    assert!(
        shape,
        "{what}: {ts:?} is not RFC 3339 UTC with milliseconds"
    );
    let at = humantime::parse_rfc3339(ts).unwrap_or_else(|e| panic!("{what}: {ts}: {e}"));
    let since_epoch = before
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970");
    let floor = SystemTime::UNIX_EPOCH
        + Duration::from_millis(u64::try_from(since_epoch.as_millis()).expect("fits"));
    assert!(
        floor <= at && at <= after,
        "{what}: {ts} is not between {before:?} and {after:?}"
    );
}

#[test]
fn every_streaming_json_record_has_its_time() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let before = SystemTime::now();
    // Those that end by themselves after --count records.
    for args in [
        &["watch-hosts", "--count", "1"][..],
        &["observe", "db", "--count", "1"],
        &["kv", "watch", "config", "--count", "1"],
    ] {
        let output = at(&endpoint)
            .arg("--json")
            .args(args)
            .output()
            .expect("spawn");
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        let record: Value = serde_json::from_str(stdout(&output).trim()).expect("JSON");
        check_ts(&format!("{args:?}"), &record, before, SystemTime::now());
    }
    // sub: one message published while it listens.
    let sub = Running::start(&endpoint, &["sub", "deploys", "--count", "1"]);
    let deadline = std::time::Instant::now() + support::WAIT;
    let message = loop {
        let published = at(&endpoint).args(["pub", "deploys", "v42"]).output();
        assert!(published.expect("spawn").status.success());
        if let Some(record) = sub.next_within(Duration::from_millis(200)) {
            break record;
        }
        assert!(std::time::Instant::now() < deadline, "sub got nothing");
    };
    assert_eq!(message["payload"], "v42");
    check_ts("sub", &message, before, SystemTime::now());
    // stream read: an entry appended before.
    let appended = at(&endpoint)
        .args(["stream", "append", "audit", "login"])
        .output();
    assert!(appended.expect("spawn").status.success());
    let reader = Running::start(&endpoint, &["stream", "read", "audit"]);
    check_ts("stream read", &reader.next(), before, SystemTime::now());
    // The long-running participants: every record, the first included.
    let agent = Running::start(
        &endpoint,
        &["agent", "--host-id", "5b0c8f7e-2f5e-4d2a-9c61-0b8f1e2d3c4a"],
    );
    // `states()` starts with the state `register` returned: one record.
    let registered = agent.next();
    assert_eq!(registered["state"], "registered");
    check_ts("agent", &registered, before, SystemTime::now());
    let candidate = Running::start(&endpoint, &["elect", "db", "--value", "a"]);
    for _ in 0..2 {
        check_ts("elect", &candidate.next(), before, SystemTime::now());
    }
    let locker = Running::start(&endpoint, &["lock", "nightly"]);
    for _ in 0..2 {
        check_ts("lock", &locker.next(), before, SystemTime::now());
    }
    // One-shot commands: no time, the record is the state itself.
    for args in [&["leader", "db"][..], &["hosts"]] {
        let output = at(&endpoint)
            .arg("--json")
            .args(args)
            .output()
            .expect("spawn");
        let text = stdout(&output);
        assert!(output.status.success() && !text.is_empty(), "{args:?}");
        assert!(!text.contains("\"ts\""), "{args:?}: {text}");
    }
}

#[test]
fn text_lines_start_with_the_time_on_request() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let before = SystemTime::now();
    let output = at(&endpoint)
        .args(["--timestamps", "kv", "watch", "config", "--count", "1"])
        .output()
        .expect("spawn");
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let (stamp, rest) = text.trim_end().split_once(' ').expect("two words");
    check_stamp("--timestamps", stamp, before, SystemTime::now());
    assert_eq!(rest, "SYNCED");
    // Without the flag, the line as before.
    let plain = at(&endpoint)
        .args(["kv", "watch", "config", "--count", "1"])
        .output()
        .expect("spawn");
    assert_eq!(stdout(&plain), "SYNCED\n");
}
