//! `kv`, `pub`, `sub` and `stream`: the coordination bus, on whichever
//! backend `--coord` (or `COORD`) names.

use crate::follow::{follow, CountArgs};
use crate::output::{event, object, text, Out};
use crate::CliError;
use crossbeam_channel::Receiver;
use fleetcoord::coordinator::{
    check_key, check_name, pattern, ConnectSettings, Coordinator, KvEvent, KvSetOptions, StreamId,
    StreamPosition,
};
use fleetcoord::Error;
use serde_json::json;
use std::path::PathBuf;

/// The backend of the bus commands: `--coord`/`--coord-url`, else
/// `COORD`/`COORD_URL`, else etcd at `--endpoints`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct BackendArgs {
    /// Coordination backend for kv, pub, sub and stream: etcd, nats, redis
    /// [default: $COORD, else etcd]
    #[arg(long, global = true, value_name = "BACKEND", value_parser = backend_flag)]
    coord: Option<String>,
    /// Server URLs of that backend, comma-separated (etcd: --endpoints
    /// applies when this is absent) [default: $COORD_URL]
    #[arg(long, global = true, value_name = "URL,...")]
    coord_url: Option<String>,
    /// CA bundle that signs that backend's servers' certificates; turns on
    /// TLS [env: COORD_TLS_CA]
    #[arg(long, global = true, value_name = "FILE")]
    coord_tls_ca: Option<PathBuf>,
    /// Client certificate for servers that verify clients (needs
    /// --coord-tls-key) [env: COORD_TLS_CERT]
    #[arg(long, global = true, value_name = "FILE")]
    coord_tls_cert: Option<PathBuf>,
    /// Private key of --coord-tls-cert [env: COORD_TLS_KEY]
    #[arg(long, global = true, value_name = "FILE")]
    coord_tls_key: Option<PathBuf>,
    /// Name to check the servers' certificates against instead of the
    /// URL's host [env: COORD_TLS_SERVER_NAME]
    #[arg(long, global = true, value_name = "NAME")]
    coord_tls_server_name: Option<String>,
    /// NATS: log in with this .creds file (user JWT and NKey seed)
    /// [env: COORD_NATS_CREDS]
    #[arg(long, global = true, value_name = "FILE")]
    nats_creds: Option<PathBuf>,
    /// NATS: log in with the NKey user seed (SU...) on this file's first
    /// line [env: COORD_NATS_NKEY_FILE]
    #[arg(long, global = true, value_name = "FILE")]
    nats_nkey_file: Option<PathBuf>,
}

/// The backends an operator can point the bus commands at. `memory` and
/// `noop` would make every command a silent no-op across processes.
const CLI_BACKENDS: [&str; 3] = ["etcd", "nats", "redis"];

fn backend_flag(text: &str) -> Result<String, String> {
    let name = text.trim().to_ascii_lowercase();
    if CLI_BACKENDS.contains(&name.as_str()) {
        Ok(name)
    } else {
        Err(format!("expected one of {}", CLI_BACKENDS.join(", ")))
    }
}

/// Where the bus commands go, resolved from flags and environment.
#[derive(Debug, PartialEq, Eq)]
pub enum Backend {
    /// The etcd of `--endpoints` (one connection shared with the rest).
    Etcd,
    /// Another backend (or etcd at other URLs), connected by name.
    Other { name: String, url: Option<String> },
}

impl BackendArgs {
    /// Flags win over `COORD`/`COORD_URL`; a blank variable counts as
    /// unset. An unknown `COORD` is a usage error here, not a noop: the
    /// operator asked for a backend and must learn it is not there.
    pub fn resolve(&self, var: impl Fn(&str) -> Option<String>) -> Result<Backend, CliError> {
        let nonblank = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
        let name = match nonblank(self.coord.clone()) {
            Some(name) => name,
            None => match nonblank(var("COORD")) {
                Some(raw) => backend_flag(&raw)
                    .map_err(|e| CliError::Usage(format!("COORD={raw:?}: {e}")))?,
                None => "etcd".to_string(),
            },
        };
        let url = nonblank(self.coord_url.clone()).or_else(|| nonblank(var("COORD_URL")));
        Ok(match (name.as_str(), url) {
            ("etcd", None) => Backend::Etcd,
            (_, url) => Backend::Other { name, url },
        })
    }

    /// TLS and the NATS login for [`Backend::Other`]: each `--coord-tls-*`
    /// and `--nats-*` flag wins over its `COORD_TLS_*`/`COORD_NATS_*`
    /// variable, and the library checks them together (and reads the TLS
    /// files) as it does for `from_env`. A flag given on the command line
    /// also replaces the variable of the other NATS login, so
    /// `--nats-creds` works in a shell with `COORD_NATS_NKEY_FILE` set.
    pub fn settings(
        &self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<ConnectSettings, CliError> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let flags = [
            ("COORD_TLS_CA", path(&self.coord_tls_ca)),
            ("COORD_TLS_CERT", path(&self.coord_tls_cert)),
            ("COORD_TLS_KEY", path(&self.coord_tls_key)),
            ("COORD_TLS_SERVER_NAME", self.coord_tls_server_name.clone()),
            ("COORD_NATS_CREDS", path(&self.nats_creds)),
            ("COORD_NATS_NKEY_FILE", path(&self.nats_nkey_file)),
        ];
        let nats_flag = self.nats_creds.is_some() || self.nats_nkey_file.is_some();
        ConnectSettings::from_vars(|name| {
            let flag = flags.iter().find(|(n, _)| *n == name);
            match flag {
                Some((_, Some(value))) => Some(value.clone()),
                Some(_) if nats_flag && name.starts_with("COORD_NATS_") => None,
                _ => var(name),
            }
        })
        .map_err(|e| CliError::Usage(e.to_string()))
    }
}

impl KvCommand {
    /// The subcommand's words, for messages.
    pub fn path(&self) -> &'static str {
        match self {
            KvCommand::Get(_) => "kv get",
            KvCommand::Set(_) => "kv set",
            KvCommand::Del(_) => "kv del",
            KvCommand::Watch(_) => "kv watch",
        }
    }

    /// What every backend would refuse, found before connecting.
    pub fn check(&self) -> fleetcoord::Result<()> {
        match self {
            KvCommand::Get(GetArgs { bucket, key, .. })
            | KvCommand::Del(KeyArgs { bucket, key }) => {
                check_name("bucket", bucket).and_then(|()| check_key(key))
            }
            KvCommand::Set(a) => check_name("bucket", &a.bucket).and_then(|()| check_key(&a.key)),
            KvCommand::Watch(a) => {
                check_name("bucket", &a.bucket).and_then(|()| pattern::validate(&a.pattern))
            }
        }
    }
}

impl PubArgs {
    /// What every backend would refuse, found before connecting.
    pub fn check(&self) -> fleetcoord::Result<()> {
        check_name("topic", &self.topic)
    }
}

impl SubArgs {
    /// What every backend would refuse, found before connecting.
    pub fn check(&self) -> fleetcoord::Result<()> {
        check_name("topic", &self.topic)
    }
}

impl StreamCommand {
    /// The subcommand's words, for messages.
    pub fn path(&self) -> &'static str {
        match self {
            StreamCommand::Append(_) => "stream append",
            StreamCommand::Read(_) => "stream read",
        }
    }

    /// What every backend would refuse, found before connecting.
    pub fn check(&self) -> fleetcoord::Result<()> {
        match self {
            StreamCommand::Append(a) => check_name("stream", &a.stream),
            StreamCommand::Read(a) => check_name("stream", &a.stream),
        }
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum KvCommand {
    /// Print the value of a key (or, with --revision, its revision).
    Get(GetArgs),
    /// Set a key; with --if-revision only if nobody else changed it, with
    /// --ttl for a while.
    Set(SetArgs),
    /// Delete a key (deleting a missing key succeeds).
    Del(KeyArgs),
    /// Print the matching keys, then `synced`, then every change.
    Watch(KvWatchArgs),
}

#[derive(clap::Args, Debug)]
pub struct KeyArgs {
    /// The bucket: one key segment (no '/').
    bucket: String,
    /// The key in the bucket: one key segment (no '/').
    key: String,
}

#[derive(clap::Args, Debug)]
pub struct GetArgs {
    /// The bucket: one key segment (no '/').
    bucket: String,
    /// The key in the bucket: one key segment (no '/').
    key: String,
    /// Print the key's revision instead of its value: what `kv set
    /// --if-revision` expects (--json prints both)
    #[arg(long)]
    revision: bool,
}

#[derive(clap::Args, Debug)]
pub struct SetArgs {
    /// The bucket: one key segment (no '/').
    bucket: String,
    /// The key in the bucket: one key segment (no '/').
    key: String,
    /// The value to store, as given.
    value: String,
    /// Set only if the key is still at this revision (from `kv get
    /// --revision`), or for 0 only if it is not set; otherwise change
    /// nothing and exit with status 3, naming the key's revision
    #[arg(long, value_name = "N")]
    if_revision: Option<u64>,
    /// Delete the key this long after the set (e.g. 30s, 5m; 2s up to
    /// 365 days, rounded up to whole seconds); a set without --ttl makes
    /// the key permanent again
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::kv_ttl)]
    ttl: Option<std::time::Duration>,
}

#[derive(clap::Args, Debug)]
pub struct KvWatchArgs {
    /// The bucket: one key segment (no '/').
    bucket: String,
    /// Glob over keys: `*` any run of characters, `?` one character.
    #[arg(default_value = "*")]
    pattern: String,
    #[command(flatten)]
    count: CountArgs,
}

#[derive(clap::Args, Debug)]
pub struct PubArgs {
    /// The topic: one segment (no '/').
    topic: String,
    /// The message, as given; only current subscribers see it.
    message: String,
}

#[derive(clap::Args, Debug)]
pub struct SubArgs {
    /// The topic: one segment (no '/').
    topic: String,
    #[command(flatten)]
    count: CountArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum StreamCommand {
    /// Append an entry and print its ID.
    Append(AppendArgs),
    /// Print entries from a position on, then follow the stream.
    Read(ReadArgs),
}

#[derive(clap::Args, Debug)]
pub struct AppendArgs {
    /// The stream: one segment (no '/').
    stream: String,
    /// The entry to append, as given.
    payload: String,
}

#[derive(clap::Args, Debug)]
pub struct ReadArgs {
    /// The stream: one segment (no '/').
    stream: String,
    /// Where to start: `start` (replay everything), `end` (only new
    /// entries) or an entry ID (entries after it).
    #[arg(long, default_value = "start", value_parser = parse_position)]
    from: StreamPosition,
    #[command(flatten)]
    count: CountArgs,
}

fn parse_position(text: &str) -> Result<StreamPosition, String> {
    match text {
        "start" => Ok(StreamPosition::Start),
        "end" => Ok(StreamPosition::End),
        id => id
            .parse::<StreamId>()
            .map(StreamPosition::After)
            .map_err(|_| format!("{id:?} is not `start`, `end` or an entry ID")),
    }
}

pub fn kv(
    out: &Out,
    coord: &dyn Coordinator,
    command: KvCommand,
    shutdown: &Receiver<()>,
) -> Result<(), CliError> {
    match command {
        KvCommand::Get(a) => {
            let entry = match coord.kv_get_entry(&a.bucket, &a.key) {
                Ok(entry) => entry,
                Err(Error::NotFound) => {
                    // For people, stdout stays empty: a value prints as
                    // is, so any text there would read as the value. JSON
                    // says null.
                    if out.is_json() {
                        out.emit(
                            "",
                            object([
                                ("bucket", json!(a.bucket)),
                                ("key", json!(a.key)),
                                ("value", serde_json::Value::Null),
                            ]),
                        )?;
                    } else {
                        eprintln!("key {:?} is not set in bucket {:?}", a.key, a.bucket);
                    }
                    return Err(CliError::NothingThere);
                }
                Err(e) => return Err(e.into()),
            };
            let human = if a.revision {
                entry.revision.to_string()
            } else {
                text(&entry.value)
            };
            out.emit(
                human,
                object([
                    ("bucket", json!(a.bucket)),
                    ("key", json!(a.key)),
                    ("value", json!(text(&entry.value))),
                    ("revision", json!(entry.revision)),
                ]),
            )?;
        }
        KvCommand::Set(a) => {
            let mut options = KvSetOptions::new();
            if let Some(expected) = a.if_revision {
                options = options.if_revision(expected);
            }
            if let Some(ttl) = a.ttl {
                options = options.with_ttl(ttl);
            }
            let revision = coord.kv_set_with(&a.bucket, &a.key, a.value.as_bytes(), options)?;
            out.emit(
                format!("set {}/{} at revision {revision}", a.bucket, a.key),
                event(
                    "set",
                    [
                        ("bucket", json!(a.bucket)),
                        ("key", json!(a.key)),
                        ("revision", json!(revision)),
                    ],
                ),
            )?;
        }
        KvCommand::Del(a) => {
            coord.kv_delete(&a.bucket, &a.key)?;
            out.emit(
                format!("deleted {}/{}", a.bucket, a.key),
                event(
                    "deleted",
                    [("bucket", json!(a.bucket)), ("key", json!(a.key))],
                ),
            )?;
        }
        KvCommand::Watch(a) => {
            let watch = coord.kv_watch(&a.bucket, &a.pattern)?;
            follow(
                watch.receiver(),
                shutdown,
                a.count,
                "the KV watch ended",
                |e| {
                    let (human, value) = match e {
                        KvEvent::Put { key, value } => (
                            format!("PUT     {key} = {}", text(&value)),
                            event("put", [("key", json!(key)), ("value", json!(text(&value)))]),
                        ),
                        KvEvent::Deleted { key } => (
                            format!("DELETE  {key}"),
                            event("deleted", [("key", json!(key))]),
                        ),
                        KvEvent::Synced => ("SYNCED".to_string(), event("synced", [])),
                        #[allow(unreachable_patterns)]
                        _ => return Ok(()),
                    };
                    out.emit(human, value).map_err(CliError::from)
                },
            )?;
        }
    }
    Ok(())
}

pub fn publish(out: &Out, coord: &dyn Coordinator, args: PubArgs) -> Result<(), CliError> {
    coord.publish(&args.topic, args.message.as_bytes())?;
    out.emit(
        format!("published to {}", args.topic),
        event("published", [("topic", json!(args.topic))]),
    )?;
    Ok(())
}

pub fn subscribe(
    out: &Out,
    coord: &dyn Coordinator,
    args: SubArgs,
    shutdown: &Receiver<()>,
) -> Result<(), CliError> {
    let sub = coord.subscribe(&args.topic)?;
    let result = follow(
        sub.receiver(),
        shutdown,
        args.count,
        "the subscription ended",
        |m| {
            out.emit(
                format!("{}: {}", m.topic, text(&m.payload)),
                object([
                    ("topic", json!(m.topic)),
                    ("payload", json!(text(&m.payload))),
                ]),
            )
            .map_err(CliError::from)
        },
    );
    drop(sub);
    result
}

pub fn stream(
    out: &Out,
    coord: &dyn Coordinator,
    command: StreamCommand,
    shutdown: &Receiver<()>,
) -> Result<(), CliError> {
    match command {
        StreamCommand::Append(a) => {
            let id = coord.append_stream(&a.stream, a.payload.as_bytes())?;
            out.emit(
                id,
                object([("stream", json!(a.stream)), ("id", json!(id.0))]),
            )?;
        }
        StreamCommand::Read(a) => {
            let reader = coord.read_stream(&a.stream, a.from)?;
            follow(
                reader.receiver(),
                shutdown,
                a.count,
                "the stream reader ended",
                |entry| {
                    out.emit(
                        format!("{}: {}", entry.id, text(&entry.payload)),
                        object([
                            ("stream", json!(a.stream)),
                            ("id", json!(entry.id.0)),
                            ("payload", json!(text(&entry.payload))),
                        ]),
                    )
                    .map_err(CliError::from)
                },
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Backend, BackendArgs};
    use crate::CliError;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    fn args(coord: Option<&str>, url: Option<&str>) -> BackendArgs {
        BackendArgs {
            coord: coord.map(str::to_string),
            coord_url: url.map(str::to_string),
            ..BackendArgs::default()
        }
    }

    fn other(name: &str, url: Option<&str>) -> Backend {
        Backend::Other {
            name: name.to_string(),
            url: url.map(str::to_string),
        }
    }

    #[test]
    fn flags_win_over_the_environment_which_wins_over_etcd() {
        let env = [("COORD", "redis"), ("COORD_URL", "redis://127.0.0.1:7000")];
        let resolve = |a: BackendArgs, e| a.resolve(vars(e)).ok();
        assert_eq!(resolve(args(None, None), &[]), Some(Backend::Etcd));
        assert_eq!(
            resolve(args(None, None), &env),
            Some(other("redis", Some("redis://127.0.0.1:7000")))
        );
        assert_eq!(
            resolve(args(Some("nats"), Some("nats://127.0.0.1:1")), &env),
            Some(other("nats", Some("nats://127.0.0.1:1")))
        );
        // etcd at other URLs than --endpoints is a connection of its own.
        assert_eq!(
            resolve(args(Some("etcd"), Some("127.0.0.1:1")), &[]),
            Some(other("etcd", Some("127.0.0.1:1")))
        );
        let blank = [("COORD", " "), ("COORD_URL", "")];
        assert_eq!(resolve(args(None, None), &blank), Some(Backend::Etcd));
    }

    fn message(e: CliError) -> String {
        match e {
            CliError::Usage(m) => m,
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn tls_flags_win_over_the_variables_and_are_checked_together() {
        let none = args(Some("nats"), None).settings(vars(&[])).unwrap();
        assert!(none.tls.is_none());
        // The variable's half-setup is refused...
        let env = [("COORD_TLS_CERT", "client.pem")];
        let err = message(args(None, None).settings(vars(&env)).unwrap_err());
        assert!(err.contains("COORD_TLS_CA"), "{err}");
        // ...and a flag replaces the variable's file, which is then read.
        let flagged = BackendArgs {
            coord_tls_ca: Some("/nonexistent/flag-ca.pem".into()),
            ..BackendArgs::default()
        };
        let env = [("COORD_TLS_CA", "/nonexistent/env-ca.pem")];
        let err = message(flagged.settings(vars(&env)).unwrap_err());
        assert!(
            err.contains("flag-ca.pem") && !err.contains("env-ca"),
            "{err}"
        );
    }

    #[test]
    fn a_nats_login_flag_replaces_either_variable() {
        let flagged = BackendArgs {
            nats_creds: Some("/flag/app.creds".into()),
            ..BackendArgs::default()
        };
        let env = [("COORD_NATS_NKEY_FILE", "/env/seed")];
        let settings = flagged.settings(vars(&env)).unwrap();
        assert_eq!(settings.nats_creds, Some("/flag/app.creds".into()));
        assert_eq!(settings.nats_nkey_file, None);
        let settings = args(None, None).settings(vars(&env)).unwrap();
        assert_eq!(settings.nats_nkey_file, Some("/env/seed".into()));
    }

    #[test]
    fn an_unknown_coord_variable_is_an_error_not_a_noop() {
        assert!(args(None, None)
            .resolve(vars(&[("COORD", "bogus")]))
            .is_err());
        assert!(args(None, None)
            .resolve(vars(&[("COORD", "noop")]))
            .is_err());
    }
}
