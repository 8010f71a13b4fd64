//! `hosts`, `watch-hosts` and `agent`: the fleet's membership.

use crate::follow::{follow, CountArgs};
use crate::output::{lease_hex, lease_json, metadata_value, object, text};
use crate::{duration, CliError, Ctx};
use crossbeam_channel::{select, Receiver};
use fleetcoord::LeaseTtl;
use fleetcoord::{
    list_hosts, HostEvent, HostInfo, HostLiveness, HostWatcher, LivenessOptions, LivenessState,
    Resume, WatcherOptions, DEFAULT_HOSTS_PREFIX,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// `--prefix` shared by the host commands.
#[derive(clap::Args, Debug)]
pub struct PrefixArgs {
    /// Key prefix hosts register under (starts and ends with '/').
    #[arg(long, default_value = DEFAULT_HOSTS_PREFIX)]
    pub prefix: String,
}

#[derive(clap::Args, Debug)]
pub struct HostsArgs {
    #[command(flatten)]
    prefix: PrefixArgs,
}

#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    #[command(flatten)]
    prefix: PrefixArgs,
    #[command(flatten)]
    count: CountArgs,
}

#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// This host's id (a UUID).
    #[arg(long, value_name = "UUID")]
    host_id: Uuid,
    /// Metadata to publish, as JSON.
    #[arg(long, value_name = "JSON", default_value = "{}", value_parser = parse_json)]
    meta: String,
    /// Lease TTL: how soon after this process dies the fleet sees it Down
    /// (whole seconds, e.g. 5s).
    #[arg(long, default_value = "5s", value_parser = duration::ttl)]
    ttl: Duration,
    #[command(flatten)]
    prefix: PrefixArgs,
    /// Hand the registration to this command's next run instead of leaving:
    /// on start, resume the registration saved in PATH (if the lease and
    /// that key incarnation still exist; else register afresh); on Ctrl-C /
    /// SIGTERM, stop renewing without leaving and save it to PATH (written
    /// atomically). A restart within the TTL is then no Down and no Up for
    /// watchers (at most an Updated); past the TTL they see Down (expired)
    /// and Up. Leaderships are never carried over.
    #[arg(long, value_name = "PATH")]
    state_file: Option<PathBuf>,
    /// Also write `<prefix><host id>/incarnation` with the host key, so
    /// that watchers report which run of this agent wrote it (they count
    /// restarts); a second key per host under the prefix.
    #[arg(long)]
    publish_incarnation: bool,
    /// When another live process holds this host id's key, write over it
    /// and revoke that process's lease (it then stops, reporting the
    /// duplicate) instead of failing. Without it, a key whose holder
    /// crashed is waited for (at most its TTL plus about a second) and a
    /// live holder's fails this agent with a duplicate-id error.
    #[arg(long)]
    take_over: bool,
}

impl PrefixArgs {
    /// The library's checks of the prefix, made before connecting.
    fn check(&self) -> fleetcoord::Result<()> {
        WatcherOptions::default()
            .with_prefix(self.prefix.clone())
            .check()
    }
}

impl HostsArgs {
    /// What the library would refuse, found before connecting.
    pub fn check(&self) -> fleetcoord::Result<()> {
        self.prefix.check()
    }
}

impl WatchArgs {
    /// What the library would refuse, found before connecting.
    pub fn check(&self) -> fleetcoord::Result<()> {
        self.prefix.check()
    }
}

impl AgentArgs {
    /// What the library would refuse, found before connecting.
    pub fn check(&self) -> fleetcoord::Result<()> {
        self.options().check(self.host_id)
    }

    fn options(&self) -> LivenessOptions {
        LivenessOptions::default()
            .with_prefix(self.prefix.prefix.clone())
            .with_ttl(self.ttl)
            .with_published_incarnation(self.publish_incarnation)
            .with_take_over(self.take_over)
    }
}

fn parse_json(text: &str) -> Result<String, String> {
    serde_json::from_str::<Value>(text)
        .map(|_| text.to_string())
        .map_err(|e| format!("not valid JSON: {e}"))
}

fn host_fields(info: &HostInfo) -> Value {
    object([
        ("id", json!(info.id.to_string())),
        ("metadata", metadata_value(&info.metadata)),
        ("lease", lease_json(info.lease)),
        ("create_revision", json!(info.create_revision)),
        ("mod_revision", json!(info.mod_revision)),
        // 0: not known (not published, or written by another client or an
        // older version).
        ("incarnation", json!(info.incarnation)),
    ])
}

fn host_line(info: &HostInfo) -> String {
    // Shown only when known, and above 1: how many restarts kept the
    // registration is what an operator reads it for.
    let restarts = match info.incarnation {
        0 | 1 => String::new(),
        n => format!("  incarnation {n}"),
    };
    format!(
        "{}  lease {}  since rev {}{}  {}",
        info.id,
        lease_hex(info.lease),
        info.create_revision,
        restarts,
        text(&info.metadata)
    )
}

/// `hosts` adds the lease's age (time since its last renewal) and
/// remaining TTL; `None` when the lease vanished between the two reads.
fn lease_fields(ttl: Option<LeaseTtl>) -> (String, Value) {
    match ttl {
        Some(t) => {
            let age = t.granted.saturating_sub(t.remaining);
            (
                format!(
                    "renewed {}s ago, expires in {}s",
                    age.as_secs(),
                    t.remaining.as_secs()
                ),
                object([
                    ("lease_age_secs", json!(age.as_secs())),
                    ("lease_remaining_secs", json!(t.remaining.as_secs())),
                    ("lease_granted_secs", json!(t.granted.as_secs())),
                ]),
            )
        }
        None => (
            "lease gone".to_string(),
            object([("lease_remaining_secs", Value::Null)]),
        ),
    }
}

/// `hosts`: one linearizable read of the prefix.
pub fn list(ctx: &Ctx, args: HostsArgs) -> Result<(), CliError> {
    let hosts = list_hosts(&ctx.etcd, &args.prefix.prefix)?;
    if hosts.is_empty() && !ctx.out.is_json() {
        eprintln!("no hosts registered under {}", args.prefix.prefix);
    }
    for info in &hosts {
        let (lease_text, lease_extra) = lease_fields(ctx.etcd.lease_ttl(info.lease)?);
        let mut fields = host_fields(info);
        if let (Value::Object(all), Value::Object(extra)) = (&mut fields, lease_extra) {
            all.extend(extra);
        }
        ctx.out
            .emit(format!("{}  {}", host_line(info), lease_text), fields)?;
    }
    Ok(())
}

/// `watch-hosts`: the watcher's events, including the initial replay and
/// `synced`.
pub fn watch(ctx: &Ctx, args: WatchArgs, shutdown: &Receiver<()>) -> Result<(), CliError> {
    let options = WatcherOptions::default().with_prefix(args.prefix.prefix);
    let watcher = HostWatcher::with_options(&ctx.etcd, options)?;
    let result = follow(
        watcher.events(),
        shutdown,
        args.count,
        "the host watch ended",
        |event| {
            let (name, info, reason) = match &event {
                HostEvent::Up(i) => ("up", Some(i), None),
                HostEvent::Updated(i) => ("updated", Some(i), None),
                HostEvent::Down(i, reason) => ("down", Some(i), Some(*reason)),
                HostEvent::Synced => {
                    ctx.health.set(true);
                    ("synced", None, None)
                }
            };
            let mut value = info.map(host_fields).unwrap_or_else(|| json!({}));
            if let Value::Object(map) = &mut value {
                map.insert("event".into(), json!(name));
                // Only on `down`: `left` (a graceful close) or `expired`.
                if let Some(reason) = reason {
                    map.insert("reason".into(), json!(reason.as_str()));
                }
            }
            let human = match (info, reason) {
                (Some(i), Some(reason)) => {
                    format!("{:<8}{}  ({reason})", name.to_uppercase(), host_line(i))
                }
                (Some(i), None) => format!("{:<8}{}", name.to_uppercase(), host_line(i)),
                (None, _) => "SYNCED  (every host registered so far was listed above)".into(),
            };
            ctx.out.emit(human, value).map_err(CliError::from)
        },
    );
    // The watch ended (or the command stops): no longer a live view.
    ctx.health.set(false);
    match (result, watcher.stop_reason()) {
        (Err(CliError::Message(_)), Some(reason)) => Err(reason.into()),
        (result, _) => result,
    }
}

fn state_record(host: Uuid, state: &LivenessState) -> (String, Value) {
    let (name, lease, extra) = match state {
        LivenessState::Registering => ("registering", None, None),
        LivenessState::Registered { lease } => ("registered", Some(*lease), None),
        LivenessState::Suspended { lease } => ("suspended", Some(*lease), None),
        LivenessState::Lost { lease } => ("lost", Some(*lease), None),
        LivenessState::Stopped { revoked } => ("stopped", None, Some(*revoked)),
        LivenessState::Refused { .. } => ("refused", None, None),
        LivenessState::Waiting { holder } => {
            return held_record(host, "waiting", *holder, WAITING);
        }
        LivenessState::Duplicate { holder } => {
            return held_record(host, "duplicate", *holder, DUPLICATE);
        }
        #[allow(unreachable_patterns)]
        _ => ("unknown", None, None),
    };
    let mut human = format!("{host}: {name}");
    let mut value = object([("host_id", json!(host.to_string())), ("state", json!(name))]);
    if let Value::Object(map) = &mut value {
        if let Some(lease) = lease {
            human.push_str(&format!(" (lease {})", lease_hex(lease)));
            map.insert("lease".into(), lease_json(lease));
        }
        if let Some(revoked) = extra {
            human.push_str(if revoked {
                " (lease revoked: watchers see Down now)"
            } else {
                " (lease not revoked: it expires after its TTL)"
            });
            map.insert("revoked".into(), json!(revoked));
        }
    }
    (human, value)
}

/// What `waiting` means, for people.
const WAITING: &str = "another process's key: waiting for its lease to expire (a crashed \
                       predecessor) or to be renewed (a duplicate)";

/// What `duplicate` means, for people.
const DUPLICATE: &str =
    "another live process holds this host id: stopping without touching its key";

/// A state about another process's lease `holder` on this host's key.
fn held_record(host: Uuid, name: &str, holder: i64, meaning: &str) -> (String, Value) {
    let human = format!(
        "{host}: {name} (held by lease {}: {meaning})",
        lease_hex(holder)
    );
    let value = object([
        ("host_id", json!(host.to_string())),
        ("state", json!(name)),
        ("holder", lease_json(holder)),
    ]);
    (human, value)
}

/// The agent's error for a duplicate host id, with how to avoid it.
fn duplicate_error(e: fleetcoord::Error) -> CliError {
    if e.kind() != fleetcoord::ErrorKind::DuplicateId {
        return e.into();
    }
    CliError::Hinted {
        message: e.to_string(),
        hint: "give every host its own --host-id (a clone must regenerate /etc/machine-id: \
               `systemd-machine-id-setup` after emptying it), or pass --take-over to replace \
               the running one"
            .into(),
    }
}

/// The agent's last record when its key was another process's: watchers
/// saw nothing of this exit.
fn displaced_record(host: Uuid) -> (String, Value) {
    let human = format!(
        "{host}: stopped (the key is another live process's: watchers see no change from this exit)"
    );
    let value = object([
        ("host_id", json!(host.to_string())),
        ("state", json!("stopped")),
        ("left", json!(false)),
        ("duplicate", json!(true)),
    ]);
    (human, value)
}

/// `agent`: register (or resume, with `--state-file`), print every
/// liveness state change; on Ctrl-C / SIGTERM leave and revoke, or with
/// `--state-file` detach and save the registration for the next run.
pub fn agent(ctx: &Ctx, args: AgentArgs, shutdown: &Receiver<()>) -> Result<(), CliError> {
    let options = args.options();
    let saved = match &args.state_file {
        Some(path) => read_resume(path).filter(|r| {
            let same = r.host_id == args.host_id;
            if !same {
                eprintln!(
                    "warning: {} is host {}'s registration, not {}'s; registering afresh",
                    path.display(),
                    r.host_id,
                    args.host_id
                );
            }
            same
        }),
        None => None,
    };
    let host = match saved {
        Some(resume) => HostLiveness::resume(&ctx.etcd, resume, args.meta.as_bytes(), options),
        None => HostLiveness::with_options(&ctx.etcd, args.host_id, args.meta.as_bytes(), options),
    }
    .map_err(duplicate_error)?;
    let mut first = args
        .state_file
        .as_ref()
        .map(|_| (host.resumed(), host.incarnation()));
    let host = Arc::new(host);
    let watched = Arc::downgrade(&host);
    ctx.watchdog(
        args.ttl,
        Box::new(move || watched.upgrade()?.trusted_until()),
    );
    // `states()` starts with the state `register` returned; every later
    // transition is printed below in order.
    let mut duplicate = false;
    loop {
        select! {
            recv(host.states()) -> state => match state {
                Ok(state) => {
                    ctx.health.set(matches!(state, LivenessState::Registered { .. }));
                    let (mut human, mut value) = state_record(args.host_id, &state);
                    // With --state-file the first record says whether the
                    // earlier run's registration was taken over.
                    if let (Some((resumed, incarnation)), Value::Object(map)) = (first.take(), &mut value) {
                        human.push_str(if resumed { " (resumed)" } else { " (registered afresh)" });
                        map.insert("resumed".into(), json!(resumed));
                        map.insert("incarnation".into(), json!(incarnation));
                    }
                    ctx.out.emit(human, value)?;
                    // Displaced by another process with this host id: the
                    // registration is over, and the agent with it.
                    if matches!(state, LivenessState::Duplicate { .. }) {
                        duplicate = true;
                        break;
                    }
                }
                Err(_) => return Err(CliError::Message("the keepalive stopped unexpectedly".into())),
            },
            recv(shutdown) -> _ => break,
        }
    }
    ctx.health.set(false);
    // The watchdog's source goes first: it holds the only other reference.
    ctx.health.forget_trust();
    let Ok(host) = Arc::try_unwrap(host) else {
        let (human, value) = left_record(args.host_id, false);
        ctx.out.emit(human, value)?;
        return Ok(());
    };
    if duplicate {
        // Nothing to hand over or leave: say what watchers saw, and fail.
        let result = host.leave();
        if let Some(path) = &args.state_file {
            let _ = std::fs::remove_file(path);
        }
        let (human, value) = displaced_record(args.host_id);
        ctx.out.emit(human, value)?;
        return Err(match result {
            Err(e) => duplicate_error(e),
            Ok(_) => CliError::Message("another process took this host id's key".into()),
        });
    }
    if let Some(path) = &args.state_file {
        return detach(ctx, host, path);
    }
    // `leave` is Ok(true) once etcd confirmed the leave (marker written,
    // key deleted at one revision), before the revoke is answered, and
    // Ok(false) when only the revoke was: the record must say which one
    // watchers saw.
    let (human, value) = match host.leave() {
        Ok(true) => left_record(args.host_id, true),
        Ok(false) => revoked_record(args.host_id),
        // Found at the leave: another process had taken the key over.
        Err(e) if e.kind() == fleetcoord::ErrorKind::DuplicateId => {
            let (human, value) = displaced_record(args.host_id);
            ctx.out.emit(human, value)?;
            return Err(duplicate_error(e));
        }
        Err(_) => left_record(args.host_id, false),
    };
    ctx.out.emit(human, value)?;
    Ok(())
}

/// The agent's last record: whether watchers saw the leave.
fn left_record(host: Uuid, left: bool) -> (String, Value) {
    let human = format!(
        "{host}: stopped{}",
        if left {
            " (left: watchers see Down(Left) now)"
        } else {
            " (leave not confirmed: the lease expires after its TTL)"
        }
    );
    let value = object([
        ("host_id", json!(host.to_string())),
        ("state", json!("stopped")),
        ("left", json!(left)),
    ]);
    (human, value)
}

/// The agent's last record when the leave could not be written but the
/// revoke was confirmed: watchers see the host Down at once, as expired.
fn revoked_record(host: Uuid) -> (String, Value) {
    let human = format!(
        "{host}: stopped (leave not written, lease revoked: watchers see Down(Expired) now)"
    );
    let value = object([
        ("host_id", json!(host.to_string())),
        ("state", json!("stopped")),
        ("left", json!(false)),
        ("revoked", json!(true)),
    ]);
    (human, value)
}

/// The registration saved by an earlier run, if `path` holds one. A file
/// that cannot be read or parsed is reported and registers afresh: a
/// registration is never refused over a stale state file.
fn read_resume(path: &Path) -> Option<Resume> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            eprintln!(
                "warning: cannot read {}: {e}; registering afresh",
                path.display()
            );
            return None;
        }
    };
    match text.parse() {
        Ok(resume) => Some(resume),
        Err(e) => {
            eprintln!(
                "warning: {} holds no registration ({e}); registering afresh",
                path.display()
            );
            None
        }
    }
}

/// `--state-file` on shutdown: stop renewing without leaving and save the
/// registration for the next run, atomically (a temporary file beside it,
/// synced, then renamed over it), so a crash mid-write never leaves half a
/// state file.
fn detach(ctx: &Ctx, host: HostLiveness, path: &Path) -> Result<(), CliError> {
    let host_id = host.host_id();
    let resume = match host.detach() {
        Ok(resume) => resume,
        Err(e) => {
            // Not registered: it left instead; nothing to hand over.
            eprintln!("warning: {e}");
            let _ = std::fs::remove_file(path);
            let (human, value) = left_record(host_id, false);
            ctx.out.emit(human, value)?;
            return Ok(());
        }
    };
    write_atomically(path, resume.to_string().as_bytes()).map_err(|e| {
        CliError::Message(format!(
            "cannot save the registration to {}: {e} (the lease expires after its TTL)",
            path.display()
        ))
    })?;
    let human = format!(
        "{host_id}: detached (lease {} saved to {}: resume within {}s to keep it)",
        lease_hex(resume.lease),
        path.display(),
        resume.ttl.as_secs()
    );
    let value = object([
        ("host_id", json!(host_id.to_string())),
        ("state", json!("detached")),
        ("lease", lease_json(resume.lease)),
        ("state_file", json!(path.display().to_string())),
    ]);
    ctx.out.emit(human, value)?;
    Ok(())
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?
        .to_os_string();
    name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(name);
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
