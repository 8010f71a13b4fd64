//! `kv`, `pub`, `sub` and `stream`: the coordination bus on etcd.

use crate::follow::{follow, CountArgs};
use crate::output::{event, object, text};
use crate::{CliError, Ctx};
use crossbeam_channel::Receiver;
use fleetcoord::coordinator::{Coordinator, EtcdCoordinator, KvEvent, StreamId, StreamPosition};
use fleetcoord::Error;
use serde_json::json;

#[derive(clap::Subcommand, Debug)]
pub enum KvCommand {
    /// Print the value of a key.
    Get(KeyArgs),
    /// Set a key.
    Set(SetArgs),
    /// Delete a key (deleting a missing key succeeds).
    Del(KeyArgs),
    /// Print the matching keys, then `synced`, then every change.
    Watch(KvWatchArgs),
}

#[derive(clap::Args, Debug)]
pub struct KeyArgs {
    bucket: String,
    key: String,
}

#[derive(clap::Args, Debug)]
pub struct SetArgs {
    bucket: String,
    key: String,
    value: String,
}

#[derive(clap::Args, Debug)]
pub struct KvWatchArgs {
    bucket: String,
    /// Glob over keys: `*` any run of characters, `?` one character.
    #[arg(default_value = "*")]
    pattern: String,
    #[command(flatten)]
    count: CountArgs,
}

#[derive(clap::Args, Debug)]
pub struct PubArgs {
    topic: String,
    message: String,
}

#[derive(clap::Args, Debug)]
pub struct SubArgs {
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
    stream: String,
    payload: String,
}

#[derive(clap::Args, Debug)]
pub struct ReadArgs {
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

fn coordinator(ctx: &Ctx) -> Result<EtcdCoordinator, CliError> {
    Ok(EtcdCoordinator::new(&ctx.etcd)?)
}

pub fn kv(ctx: &Ctx, command: KvCommand, shutdown: &Receiver<()>) -> Result<(), CliError> {
    let coord = coordinator(ctx)?;
    match command {
        KvCommand::Get(a) => {
            let value = match coord.kv_get(&a.bucket, &a.key) {
                Ok(v) => v,
                Err(Error::NotFound) => {
                    return Err(CliError::Message(format!(
                        "key {:?} is not set in bucket {:?}",
                        a.key, a.bucket
                    )))
                }
                Err(e) => return Err(e.into()),
            };
            ctx.out.emit(
                text(&value),
                object([
                    ("bucket", json!(a.bucket)),
                    ("key", json!(a.key)),
                    ("value", json!(text(&value))),
                ]),
            )?;
        }
        KvCommand::Set(a) => {
            coord.kv_set(&a.bucket, &a.key, a.value.as_bytes())?;
            ctx.out.emit(
                format!("set {}/{}", a.bucket, a.key),
                event("set", [("bucket", json!(a.bucket)), ("key", json!(a.key))]),
            )?;
        }
        KvCommand::Del(a) => {
            coord.kv_delete(&a.bucket, &a.key)?;
            ctx.out.emit(
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
                    ctx.out.emit(human, value).map_err(CliError::from)
                },
            )?;
        }
    }
    let _ = coord.close();
    Ok(())
}

pub fn publish(ctx: &Ctx, args: PubArgs) -> Result<(), CliError> {
    let coord = coordinator(ctx)?;
    coord.publish(&args.topic, args.message.as_bytes())?;
    ctx.out.emit(
        format!("published to {}", args.topic),
        event("published", [("topic", json!(args.topic))]),
    )?;
    let _ = coord.close();
    Ok(())
}

pub fn subscribe(ctx: &Ctx, args: SubArgs, shutdown: &Receiver<()>) -> Result<(), CliError> {
    let coord = coordinator(ctx)?;
    let sub = coord.subscribe(&args.topic)?;
    let result = follow(
        sub.receiver(),
        shutdown,
        args.count,
        "the subscription ended",
        |m| {
            ctx.out
                .emit(
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
    let _ = coord.close();
    result
}

pub fn stream(ctx: &Ctx, command: StreamCommand, shutdown: &Receiver<()>) -> Result<(), CliError> {
    let coord = coordinator(ctx)?;
    match command {
        StreamCommand::Append(a) => {
            let id = coord.append_stream(&a.stream, a.payload.as_bytes())?;
            ctx.out.emit(
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
                    ctx.out
                        .emit(
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
    let _ = coord.close();
    Ok(())
}
