//! Everything the tool prints on stdout: one line per record, either for
//! people or (`--json`) one JSON object per line for scripts.

use serde_json::{json, Map, Value};
use std::io::Write;

/// Where records go and in which form.
#[derive(Clone, Copy, Debug)]
pub struct Out {
    json: bool,
    stderr: bool,
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
        if self.stderr {
            Self::write(std::io::stderr().lock(), self.json, human, object)
        } else {
            Self::write(std::io::stdout().lock(), self.json, human, object)
        }
    }

    fn write(
        mut to: impl Write,
        json: bool,
        human: impl std::fmt::Display,
        object: Value,
    ) -> Result<(), Closed> {
        let written = if json {
            writeln!(to, "{object}")
        } else {
            writeln!(to, "{human}")
        };
        written.and_then(|_| to.flush()).map_err(Closed)
    }
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
    use super::{lease_hex, lease_json};

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
