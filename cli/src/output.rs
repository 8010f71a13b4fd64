//! Everything the tool prints on stdout: one line per record, either for
//! people or (`--json`) one JSON object per line for scripts.

use serde_json::{json, Map, Value};
use std::io::Write;
use std::time::SystemTime;

/// Where records go and in which form.
#[derive(Clone, Copy, Debug)]
pub struct Out {
    json: bool,
    stderr: bool,
    /// Add `ts` to every JSON record (streaming commands).
    stamp_json: bool,
    /// Start every line for people with the time (`--timestamps`).
    stamp_text: bool,
}

/// Writing to stdout failed (typically the reader went away, as with
/// `| head -1`); long-running commands stop and clean up.
#[derive(Debug)]
pub struct Closed(pub std::io::Error);

impl Out {
    pub fn new(json: bool) -> Out {
        Out {
            json,
            stderr: false,
            stamp_json: false,
            stamp_text: false,
        }
    }

    /// The output of a streaming command, whose records happen over time:
    /// each JSON record carries `ts`, when it was printed (RFC 3339, UTC,
    /// milliseconds); lines for people start with it when `text` is set.
    pub fn streaming(self, text: bool) -> Out {
        Out {
            stamp_json: true,
            stamp_text: text,
            ..self
        }
    }

    /// The same records on stderr: while a gated command runs, stdout is
    /// the command's own.
    pub fn on_stderr(self) -> Out {
        Out {
            stderr: true,
            ..self
        }
    }

    pub fn is_json(&self) -> bool {
        self.json
    }

    /// Prints one record: `human` for people, `object` with `--json`.
    /// Flushes at once so that a reader (a script, the demo) sees each
    /// record as it happens.
    pub fn emit(&self, human: impl std::fmt::Display, object: Value) -> Result<(), Closed> {
        let line = self.line(human, object, SystemTime::now());
        if self.stderr {
            Self::write(std::io::stderr().lock(), &line)
        } else {
            Self::write(std::io::stdout().lock(), &line)
        }
    }

    /// The line a record printed `at` becomes.
    fn line(&self, human: impl std::fmt::Display, mut object: Value, at: SystemTime) -> String {
        match (self.json, self.stamp_json, self.stamp_text) {
            (true, true, _) => {
                if let Value::Object(map) = &mut object {
                    map.insert("ts".into(), json!(timestamp(at)));
                }
                object.to_string()
            }
            (true, false, _) => object.to_string(),
            (false, _, true) => format!("{} {human}", timestamp(at)),
            (false, _, false) => human.to_string(),
        }
    }

    fn write(mut to: impl Write, line: &str) -> Result<(), Closed> {
        writeln!(to, "{line}")
            .and_then(|_| to.flush())
            .map_err(Closed)
    }
}

/// `at` as RFC 3339 in UTC with milliseconds (`2018-02-14T00:28:07.123Z`):
/// one width for every line, sortable as text, read by `date -d` and
/// every JSON consumer's date parser.
pub fn timestamp(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// Bytes as text for people: lossy UTF-8, so a binary value never aborts
/// the output.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Host metadata in JSON output: embedded as JSON when it is JSON (agents
/// register with `--meta JSON`, so scripts can reach into it), otherwise
/// as a string.
pub fn metadata_value(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|_| Value::String(text(bytes)))
}

/// A lease id for people, exactly as etcdctl prints it (`lease grant`,
/// `lease list`: Go's `%016x`), so an id can be pasted into
/// `etcdctl lease timetolive` and found in etcdctl's output. etcd issues
/// only positive ids, so the sign never shows.
pub fn lease_hex(lease: i64) -> String {
    format!("{lease:016x}")
}

/// A lease id in `--json` output: a decimal integer, as `etcdctl -w json`
/// writes it, so scripts can join the two. Ids exceed 2^53: read them with
/// a parser that keeps 64-bit integers.
pub fn lease_json(lease: i64) -> Value {
    json!(lease)
}

/// Builds an object from pairs, keeping their order readable in code.
pub fn object<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    let mut map = Map::new();
    for (k, v) in pairs {
        map.insert(k.to_string(), v);
    }
    Value::Object(map)
}

/// `{"event": name}` plus `fields`.
pub fn event<const N: usize>(name: &str, fields: [(&str, Value); N]) -> Value {
    let mut value = object(fields);
    if let Value::Object(map) = &mut value {
        map.insert("event".into(), json!(name));
    }
    value
}

#[cfg(test)]
mod tests {
    use super::{lease_hex, lease_json, timestamp, Out};
    use serde_json::{json, Value};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    fn at(millis: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(millis)
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_milliseconds() {
        // Values `date -u -d @SECONDS +%Y-%m-%dT%H:%M:%S` prints.
        assert_eq!(timestamp(at(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(timestamp(at(1_518_568_087_123)), "2018-02-14T00:28:07.123Z");
        // A leap day, and the last millisecond of a year.
        assert_eq!(timestamp(at(951_782_400_007)), "2000-02-29T00:00:00.007Z");
        assert_eq!(timestamp(at(1_798_761_599_999)), "2026-12-31T23:59:59.999Z");
        // Sub-millisecond parts are cut, never rounded up into the next.
        let late = at(1_000) + Duration::from_micros(999);
        assert_eq!(timestamp(late), "1970-01-01T00:00:01.000Z");
    }

    #[test]
    fn streaming_records_carry_the_time_in_json_and_on_request_in_text() {
        let t = at(1_518_568_087_123);
        let record = || json!({"event": "up"});
        let line = Out::new(true).streaming(false).line("UP", record(), t);
        let value: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["ts"], "2018-02-14T00:28:07.123Z", "{line}");
        assert_eq!(value["event"], "up", "{line}");
        // A one-shot command's record has no time.
        let line = Out::new(true).line("UP", record(), t);
        assert!(!line.contains("ts"), "{line}");
        assert_eq!(
            Out::new(false).streaming(true).line("UP", record(), t),
            "2018-02-14T00:28:07.123Z UP"
        );
        assert_eq!(
            Out::new(false).streaming(false).line("UP", record(), t),
            "UP"
        );
        assert_eq!(Out::new(false).line("UP", record(), t), "UP");
    }

    #[test]
    fn lease_ids_are_etcdctl_hex_for_people_and_decimal_in_json() {
        // An id etcdctl printed as `lease 4818a22e1b2ef205 granted ...` and
        // as `"ID":5195080489080123909` with `-w json`.
        let id = 5_195_080_489_080_123_909;
        assert_eq!(lease_hex(id), "4818a22e1b2ef205");
        assert_eq!(lease_json(id).to_string(), "5195080489080123909");
        // Zero-padded to 16 digits like Go's %016x, never 0x-prefixed.
        assert_eq!(lease_hex(0x2a), "000000000000002a");
    }
}
