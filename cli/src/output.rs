//! Everything the tool prints on stdout: one line per record, either for
//! people or (`--json`) one JSON object per line for scripts.

use serde_json::{json, Map, Value};
use std::io::Write;

/// Where records go and in which form.
#[derive(Clone, Copy, Debug)]
pub struct Out {
    json: bool,
}

/// Writing to stdout failed (typically the reader went away, as with
/// `| head -1`); long-running commands stop and clean up.
#[derive(Debug)]
pub struct Closed(pub std::io::Error);

impl Out {
    pub fn new(json: bool) -> Out {
        Out { json }
    }

    pub fn is_json(&self) -> bool {
        self.json
    }

    /// Prints one record: `human` for people, `object` with `--json`.
    /// Flushes at once so that a reader (a script, the demo) sees each
    /// record as it happens.
    pub fn emit(&self, human: impl std::fmt::Display, object: Value) -> Result<(), Closed> {
        let mut stdout = std::io::stdout().lock();
        let written = if self.json {
            writeln!(stdout, "{object}")
        } else {
            writeln!(stdout, "{human}")
        };
        written.and_then(|_| stdout.flush()).map_err(Closed)
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

/// A lease id as etcd tools print it (hex, as in `etcdctl lease list`).
pub fn lease_hex(lease: i64) -> String {
    format!("{lease:x}")
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
