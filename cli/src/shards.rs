//! `shards`: show a shard map, or join one and run a command with the
//! shards this process owns.
//!
//! The contract of `shards join NAME --shards M -- CMD`, the gated-command
//! contract of `elect -- CMD` ([`crate::gated`]) per shard set:
//! * CMD runs only while this member owns at least one shard, with the
//!   owned set in `FLEETCOORD_SHARDS` (`1,5,9`) and each shard's fencing
//!   token in `FLEETCOORD_SHARD_TOKENS` (`1=812,5=815,9=820`);
//! * when the set changes, CMD is stopped (SIGTERM, SIGKILL after
//!   `--kill-grace`) and started again with the new set, once the set has
//!   not changed for [`SETTLE`];
//! * a shard placed elsewhere (`Release`) is handed back only once CMD is
//!   dead; CMD is SIGKILLed before the release deadline at the latest;
//! * a shard lost, or the session's local deadline passing by this
//!   process's clock (whichever is seen first) → SIGKILL at once; renewals
//!   late by half of the trusted lifetime → SIGTERM, then SIGKILL before
//!   the deadline;
//! * fleetcoord dying without cleaning up → SIGKILL to CMD's process group
//!   ([`crate::tether`]);
//! * CMD exiting by itself → leave the map and exit with its status
//!   (`--restart`: start it again);
//! * SIGINT/SIGTERM/SIGHUP → stop CMD as above, leave the map, exit 0 if
//!   CMD obeyed, else with its status (`gated::finish_stopped`).

use crate::gated::{exit_code, unix_micros};
use crate::output::{event, lease_hex, lease_json, object, Out};
use crate::tether::{self, Tether};
use crate::{duration, CliError, Ctx};
use crossbeam_channel::{select, Receiver};
use fleetcoord::{
    ShardEvent, ShardMap, ShardOptions, ShardOwner, DEFAULT_SHARDS_PREFIX, MAX_SHARDS,
};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// The variable CMD finds its shards in.
pub const SHARDS_VAR: &str = "FLEETCOORD_SHARDS";
/// The variable CMD finds its shards' fencing tokens in.
pub const TOKENS_VAR: &str = "FLEETCOORD_SHARD_TOKENS";

/// How long the owned set must stay the same before CMD is (re)started: a
/// join acquires its shards over a few round trips, and one restart is
/// better than one per shard.
pub const SETTLE: Duration = Duration::from_millis(300);

/// How often the supervisor looks at CMD, the map and the clock.
const TICK: Duration = Duration::from_millis(10);

/// Kept free before a deadline when killing: delivering SIGKILL and
/// reaping take a few milliseconds, a loaded machine more.
const KILL_MARGIN: Duration = Duration::from_millis(200);

/// How often `shards NAME --watch` reads the map.
const WATCH_POLL: Duration = Duration::from_millis(500);

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ShardsArgs {
    #[command(subcommand)]
    action: Option<ShardsAction>,
    /// The map's name: one key segment (no '/').
    #[arg(required = true)]
    name: Option<String>,
    /// The map's shard count: keys of shards beyond it are not shown
    /// [default: 4096, the most a map may have].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SHARDS)))]
    shards: Option<u32>,
    /// Print the map, then every change of an owner as it is seen (the map
    /// is read every 500 ms), until Ctrl-C.
    #[arg(long)]
    watch: bool,
    #[command(flatten)]
    prefix: ShardPrefixArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum ShardsAction {
    /// Join the map as a member and run `-- CMD ARGS...` with the shards
    /// this member owns (FLEETCOORD_SHARDS), restarted when they change,
    /// stopped before a shard can pass on; or, without CMD, print the
    /// ownership changes until Ctrl-C.
    ///
    /// Restart policy: CMD is restarted whole on every change of the owned
    /// set, a shard gained as well as one lost or placed elsewhere. The
    /// old CMD gets SIGTERM (SIGKILL after --kill-grace); once it is dead
    /// and the set has not changed for 300 ms, CMD starts again with the
    /// new FLEETCOORD_SHARDS and FLEETCOORD_SHARD_TOKENS. Changes are never
    /// handed to a running CMD: a shard is released only once CMD no
    /// longer uses it, and only its exit proves that.
    Join(JoinArgs),
}

/// `--prefix` of the shard commands.
#[derive(clap::Args, Debug)]
pub struct ShardPrefixArgs {
    /// Key prefix of the maps (starts and ends with '/'); map NAME is under
    /// PREFIX/NAME/.
    #[arg(long, default_value = DEFAULT_SHARDS_PREFIX)]
    prefix: String,
}

#[derive(clap::Args, Debug)]
pub struct JoinArgs {
    /// The map's name: one key segment (no '/').
    name: String,
    /// How many shards the map has; every member must pass the same.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SHARDS)))]
    shards: u32,
    /// This member's id, unique among the map's members [default: a new
    /// random UUID].
    #[arg(long)]
    member: Option<String>,
    /// This member's share of the shards relative to the others'; 0 never
    /// owns any.
    #[arg(long, default_value_t = 1)]
    weight: u32,
    /// Session lease TTL: a member that dies loses its shards about this
    /// long after its last renewal (whole seconds).
    #[arg(long, default_value = "10s", value_parser = duration::ttl)]
    ttl: Duration,
    /// How long a shard placed elsewhere may stay with this member while
    /// CMD stops (capped by the session's trusted lifetime).
    #[arg(long, default_value = "5s", value_parser = duration::timeout)]
    drain: Duration,
    /// After SIGTERM, how long CMD may take to exit before SIGKILL (capped
    /// so that it is dead before a shard can pass on).
    #[arg(long, default_value = "10s", value_parser = duration::timeout, requires = "command")]
    kill_grace: Duration,
    /// When CMD exits by itself, start it again instead of leaving.
    #[arg(long, requires = "command")]
    restart: bool,
    #[command(flatten)]
    prefix: ShardPrefixArgs,
    /// The command to run with the owned shards, after `--`; restarted
    /// whole on every change of the owned set.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

impl ShardsArgs {
    /// Whether the command prints records as things happen.
    pub fn streams(&self) -> bool {
        self.watch || self.action.is_some()
    }
}

impl ShardsArgs {
    /// The subcommand's words, for messages: `shards` or `shards join`.
    pub fn path(&self) -> &'static str {
        match self.action {
            Some(ShardsAction::Join(_)) => "shards join",
            None => "shards",
        }
    }

    /// What the library would refuse, found before connecting.
    pub fn check(&self) -> fleetcoord::Result<()> {
        match (&self.action, &self.name) {
            (Some(ShardsAction::Join(a)), _) => a.options().check(&a.name),
            (None, Some(name)) => options(&self.prefix).check(name),
            // clap requires the name; `shards` says so itself.
            (None, None) => Ok(()),
        }
    }
}

impl JoinArgs {
    fn options(&self) -> ShardOptions {
        let options = options(&self.prefix)
            .with_ttl(self.ttl)
            .with_drain(self.drain)
            .with_weight(self.weight);
        match &self.member {
            Some(member) => options.with_member(member.clone()),
            None => options,
        }
    }
}

fn options(prefix: &ShardPrefixArgs) -> ShardOptions {
    ShardOptions::default().with_prefix(prefix.prefix.clone())
}

fn owner_line(o: &ShardOwner) -> String {
    format!("shard {}  owner {}  token {}", o.shard, o.member, o.token)
}

fn owner_json(o: &ShardOwner) -> serde_json::Value {
    object([
        ("shard", json!(o.shard)),
        ("owner", json!(o.member)),
        ("token", json!(o.token)),
        ("lease", lease_json(o.lease)),
    ])
}

/// `shards NAME`: one linearizable read of the owners; `--watch` reads
/// again every [`WATCH_POLL`] and prints what changed.
pub fn shards(ctx: &Ctx, args: ShardsArgs, shutdown: &Receiver<()>) -> Result<(), CliError> {
    if let Some(ShardsAction::Join(a)) = args.action {
        return join(ctx, a, shutdown);
    }
    let Some(name) = args.name else {
        return Err(CliError::Usage("shards needs the map's name".into()));
    };
    let count = args.shards.unwrap_or(MAX_SHARDS);
    let options = options(&args.prefix);
    let mut seen: BTreeMap<u32, ShardOwner> = BTreeMap::new();
    let owners = ShardMap::owners_of(&ctx.etcd, &name, count, &options)?;
    if owners.is_empty() && !ctx.out.is_json() {
        eprintln!("no shard of {name} is owned under {}", args.prefix.prefix);
    }
    for o in owners {
        ctx.out.emit(owner_line(&o), owner_json(&o))?;
        seen.insert(o.shard, o);
    }
    if !args.watch {
        // Nothing owned: nothing there (a script tells it from an error).
        if seen.is_empty() {
            return Err(CliError::NothingThere);
        }
        return Ok(());
    }
    loop {
        select! {
            recv(shutdown) -> _ => return Ok(()),
            default(WATCH_POLL) => {}
        }
        let now: BTreeMap<u32, ShardOwner> =
            ShardMap::owners_of(&ctx.etcd, &name, count, &options)?
                .into_iter()
                .map(|o| (o.shard, o))
                .collect();
        for (shard, old) in &seen {
            if !now.contains_key(shard) {
                ctx.out.emit(
                    format!("shard {shard}  no owner (was {})", old.member),
                    object([
                        ("shard", json!(shard)),
                        ("owner", serde_json::Value::Null),
                        ("token", serde_json::Value::Null),
                    ]),
                )?;
            }
        }
        for (shard, o) in &now {
            if seen.get(shard) != Some(o) {
                ctx.out.emit(owner_line(o), owner_json(o))?;
            }
        }
        seen = now;
    }
}

/// CMD while it runs, with the set it was started with.
struct Running {
    child: Child,
    tether: Tether,
    shards: BTreeSet<u32>,
    /// SIGTERM sent (by us): its exit is ours, not its own.
    termed: bool,
    kill_at: Option<Instant>,
}

impl Running {
    fn signal(&self, signal: Signal) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = killpg(Pid::from_raw(pid), signal);
        }
    }

    /// SIGTERM once, SIGKILL at `kill_at` (moved earlier, never later).
    fn term(&mut self, kill_at: Instant) {
        if !self.termed {
            self.termed = true;
            self.signal(Signal::SIGTERM);
        }
        self.kill_at = Some(self.kill_at.map_or(kill_at, |at| at.min(kill_at)));
    }

    fn kill_now(&mut self) {
        self.termed = true;
        self.signal(Signal::SIGKILL);
        let _ = self.child.kill();
    }
}

/// `shards join NAME --shards M [-- CMD]`.
pub fn join(ctx: &Ctx, args: JoinArgs, shutdown: &Receiver<()>) -> Result<(), CliError> {
    let options = args.options();
    let trusted = options.trusted_lifetime();
    let map = ShardMap::join(&ctx.etcd, &args.name, args.shards, options)?;
    let name = args.name.clone();
    let gated = !args.command.is_empty();
    // CMD's stdout is its own.
    let out = if gated { ctx.out.on_stderr() } else { ctx.out };
    out.emit(
        format!("{name}: joined as {}", map.member_id()),
        event(
            "joined",
            [("name", json!(name)), ("member", json!(map.member_id()))],
        ),
    )?;
    let mut tokens: BTreeMap<u32, i64> = BTreeMap::new();
    // Shards told `Release`, with their deadlines: handed back once CMD no
    // longer has them.
    let mut releasing: BTreeMap<u32, Instant> = BTreeMap::new();
    let mut changed_at = Instant::now();
    let mut running: Option<Running> = None;
    let mut stopping = false;
    // The status of the run a signal stopped: the stop went cleanly only
    // if CMD obeyed it (see `gated::finish_stopped`).
    let mut stopped: Option<ExitStatus> = None;
    loop {
        select! {
            recv(map.events()) -> e => {
                let Ok(e) = e else { break };
                changed_at = Instant::now();
                report(&out, &name, &e)?;
                match e {
                    ShardEvent::Acquired { shard, token } => {
                        tokens.insert(shard, token);
                    }
                    ShardEvent::Release { shard, deadline } => {
                        tokens.remove(&shard);
                        releasing.insert(shard, deadline);
                    }
                    ShardEvent::Lost { shard } => {
                        tokens.remove(&shard);
                        releasing.remove(&shard);
                        if let Some(r) = running.as_mut().filter(|r| r.shards.contains(&shard)) {
                            r.kill_now();
                        }
                    }
                    // Another live process has this member id: the map
                    // has stopped; so does the command, with its error.
                    ShardEvent::Duplicate { .. } => stopping = true,
                    _ => {}
                }
            }
            recv(shutdown) -> _ => stopping = true,
            default(TICK) => {}
        }
        let now = Instant::now();
        if let Some(r) = running.as_mut() {
            // Not a moment past the belief, by this thread's clock.
            if r.shards.iter().any(|s| map.token(*s).is_none()) {
                r.kill_now();
            }
            // Renewals late: stop in time for the deadline.
            if let Some(until) = map.session_trusted_until() {
                if until.saturating_duration_since(now) < trusted / 2 {
                    r.term(
                        (now + args.kill_grace).min(until.checked_sub(KILL_MARGIN).unwrap_or(now)),
                    );
                }
            }
            for (shard, deadline) in &releasing {
                if r.shards.contains(shard) {
                    let by = deadline.checked_sub(KILL_MARGIN).unwrap_or(now);
                    r.term((now + args.kill_grace).min(by));
                }
            }
            let restart = r.shards != tokens.keys().copied().collect::<BTreeSet<u32>>();
            if restart && now.duration_since(changed_at) >= SETTLE {
                r.term(now + args.kill_grace);
            }
            if stopping {
                r.term(now + args.kill_grace);
            }
            if r.kill_at.is_some_and(|at| now >= at) {
                r.kill_now();
            }
            let status = tether::try_wait_clearing_group(&mut r.child)
                .map_err(|e| CliError::Message(format!("cannot wait for the command: {e}")))?;
            if let Some(status) = status {
                let r = running.take().expect("running");
                r.tether.disarm();
                exited(&out, &name, status)?;
                if stopping {
                    stopped = Some(status);
                }
                if !r.termed && !args.restart {
                    map.leave()?;
                    left(&out, &name)?;
                    return crate::election::finish(status);
                }
            }
        }
        // Shards CMD no longer has go back at once.
        let held: BTreeSet<u32> = running
            .as_ref()
            .map(|r| r.shards.clone())
            .unwrap_or_default();
        let done: Vec<u32> = releasing
            .keys()
            .filter(|s| !held.contains(s))
            .copied()
            .collect();
        for shard in done {
            releasing.remove(&shard);
            map.release(shard)?;
        }
        if stopping && running.is_none() {
            break;
        }
        let settled = now.duration_since(changed_at) >= SETTLE;
        // A session whose renewals are late would have CMD stopped again.
        let healthy = map
            .session_trusted_until()
            .is_some_and(|until| until.saturating_duration_since(now) >= trusted / 2);
        if gated
            && running.is_none()
            && !stopping
            && settled
            && healthy
            && releasing.is_empty()
            && !tokens.is_empty()
        {
            // Only what is believed now, by this thread's clock.
            let owned: BTreeMap<u32, i64> = map.owned().into_iter().collect();
            if owned.len() == tokens.len() {
                running = Some(spawn(&out, &name, &args.command, &owned)?);
            }
        }
    }
    map.leave()?;
    left(&out, &name)?;
    match stopped {
        Some(status) => crate::gated::finish_stopped(status),
        None => Ok(()),
    }
}

fn report(out: &Out, name: &str, e: &ShardEvent) -> Result<(), CliError> {
    let (text, object) = match e {
        ShardEvent::Acquired { shard, token } => (
            format!("{name}: acquired shard {shard} with fencing token {token}"),
            event(
                "acquired",
                [
                    ("name", json!(name)),
                    ("shard", json!(shard)),
                    ("token", json!(token)),
                ],
            ),
        ),
        ShardEvent::Release { shard, .. } => (
            format!("{name}: shard {shard} is placed elsewhere; releasing"),
            event("release", [("name", json!(name)), ("shard", json!(shard))]),
        ),
        ShardEvent::Lost { shard } => (
            format!("{name}: lost shard {shard}"),
            event("lost", [("name", json!(name)), ("shard", json!(shard))]),
        ),
        ShardEvent::Waiting { holder } => (
            format!(
                "{name}: this member id's key is held by lease {} of another process: waiting \
                 for it to expire (a crashed predecessor) or to be renewed (a duplicate)",
                lease_hex(*holder)
            ),
            event(
                "waiting",
                [("name", json!(name)), ("holder", lease_json(*holder))],
            ),
        ),
        ShardEvent::Duplicate { holder } => (
            format!(
                "{name}: another live process (lease {}) has this member id; stopping",
                lease_hex(*holder)
            ),
            event(
                "duplicate",
                [("name", json!(name)), ("holder", lease_json(*holder))],
            ),
        ),
        other => (
            format!("{name}: {other:?}"),
            event("other", [("name", json!(name))]),
        ),
    };
    out.emit(text, object)?;
    Ok(())
}

fn spawn(
    out: &Out,
    name: &str,
    command: &[String],
    owned: &BTreeMap<u32, i64>,
) -> Result<Running, CliError> {
    let Some((program, rest)) = command.split_first() else {
        return Err(CliError::Message("no command to run".into()));
    };
    let shards: Vec<String> = owned.keys().map(u32::to_string).collect();
    // Before the spawn: CMD cannot start earlier.
    let starting_at = unix_micros();
    let tokens: Vec<String> = owned.iter().map(|(s, t)| format!("{s}={t}")).collect();
    let tether = Tether::new().map_err(|e| {
        CliError::Message(format!(
            "cannot start {program:?}: cannot fork its watchdog: {e}"
        ))
    })?;
    let mut cmd = Command::new(program);
    cmd.args(rest)
        .env(SHARDS_VAR, shards.join(","))
        .env(TOKENS_VAR, tokens.join(","))
        .process_group(0);
    tether.arm(&mut cmd);
    let child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            tether.disarm();
            return Err(CliError::Message(format!("cannot start {program:?}: {e}")));
        }
    };
    out.emit(
        format!(
            "{name}: started {program} (pid {}) with shards {}",
            child.id(),
            shards.join(",")
        ),
        event(
            "started",
            [
                ("pid", json!(child.id())),
                ("shards", json!(owned.keys().collect::<Vec<_>>())),
                ("at_unix_us", json!(starting_at as u64)),
            ],
        ),
    )?;
    Ok(Running {
        child,
        tether,
        shards: owned.keys().copied().collect(),
        termed: false,
        kill_at: None,
    })
}

fn exited(out: &Out, name: &str, status: ExitStatus) -> Result<(), CliError> {
    out.emit(
        format!("{name}: the command exited ({status})"),
        event(
            "exited",
            [
                ("code", json!(status.code())),
                ("status", json!(exit_code(status))),
                // After the reap: CMD cannot have ended later.
                ("at_unix_us", json!(unix_micros() as u64)),
            ],
        ),
    )?;
    Ok(())
}

fn left(out: &Out, name: &str) -> Result<(), CliError> {
    out.emit(
        format!("{name}: left"),
        event("left", [("name", json!(name))]),
    )?;
    Ok(())
}
