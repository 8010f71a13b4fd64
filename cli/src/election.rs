//! `elect`, `leader` and `observe`: leader elections.

use crate::follow::{follow, CountArgs};
use crate::gated::{self, Ended, GateArgs};
use crate::output::{event, lease_json, object, text, Out};
use crate::{duration, CliError, Ctx};
use crossbeam_channel::{select, Receiver};
use fleetcoord::election::DEFAULT_ELECTION_PREFIX;
use fleetcoord::{Election, ElectionOptions, LeaderInfo, Leadership};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// `--prefix` of every election command: which key namespace the
/// election's candidates live in.
#[derive(clap::Args, Debug)]
pub struct PrefixArgs {
    /// Key prefix of the election's candidates, whose keys are
    /// PREFIX NAME/<lease hex>; `--prefix ''` is the election of
    /// `etcdctl elect NAME`.
    #[arg(long, default_value = DEFAULT_ELECTION_PREFIX)]
    prefix: String,
}

impl PrefixArgs {
    fn options(&self) -> ElectionOptions {
        ElectionOptions::default().with_prefix(self.prefix.clone())
    }
}

#[derive(clap::Args, Debug)]
pub struct NameArgs {
    /// The election's name: one key segment (no '/').
    name: String,
    #[command(flatten)]
    prefix: PrefixArgs,
}

#[derive(clap::Args, Debug)]
pub struct ObserveArgs {
    /// The election's name: one key segment (no '/').
    name: String,
    #[command(flatten)]
    prefix: PrefixArgs,
    #[command(flatten)]
    count: CountArgs,
}

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ElectArgs {
    #[command(subcommand)]
    action: Option<ElectAction>,
    /// The election's name: one key segment (no '/').
    #[arg(required = true)]
    name: Option<String>,
    /// Join ranked with this priority: among waiting ranked candidates the
    /// highest leads next (ties: first come); plain candidates (etcdctl,
    /// Go, fleetcoord without --priority) keep their place.
    #[arg(long)]
    priority: Option<u32>,
    /// While leading, step down when a higher priority waits: the command
    /// is stopped as on a signal, then the leadership is resigned and the
    /// campaign starts over. Joins ranked (priority 0 unless --priority).
    #[arg(long)]
    yield_to_higher: bool,
    /// While leading, act on `fleetcoord elect hand-over NAME --to VALUE`:
    /// stop the command as on a signal, then hand over and campaign again.
    /// Costs one read every 250 ms while leading.
    #[arg(long)]
    accept_hand_over: bool,
    /// What the leader announces (observers and `leader` show it)
    /// [default: `fleetcoord-<pid>`].
    #[arg(long)]
    value: Option<String>,
    /// Session lease TTL: a leader that dies is replaced about this long
    /// after its last renewal (whole seconds).
    #[arg(long, default_value = "10s", value_parser = duration::ttl)]
    ttl: Duration,
    #[command(flatten)]
    prefix: PrefixArgs,
    #[command(flatten)]
    gate: GateArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum ElectAction {
    /// Ask the leader of an election to hand over to a waiting candidate
    /// (the leader must run `elect --accept-hand-over`), and wait until
    /// that candidate leads.
    HandOver(HandOverArgs),
}

#[derive(clap::Args, Debug)]
pub struct HandOverArgs {
    /// The election's name: one key segment (no '/').
    name: String,
    /// The candidate to lead next: its value or its candidate key.
    #[arg(long, value_parser = clap::builder::NonEmptyStringValueParser::new())]
    to: String,
    #[command(flatten)]
    prefix: PrefixArgs,
    /// How long to wait for the candidate to lead before failing.
    #[arg(long, default_value = "10s", value_parser = duration::timeout)]
    timeout: Duration,
}

impl NameArgs {
    /// What the library would refuse, found before connecting.
    pub fn check(&self) -> fleetcoord::Result<()> {
        self.prefix.options().check(&self.name)
    }
}

impl ObserveArgs {
    /// What the library would refuse, found before connecting.
    pub fn check(&self) -> fleetcoord::Result<()> {
        self.prefix.options().check(&self.name)
    }
}

impl ElectArgs {
    /// The subcommand's words, for messages: `elect` or `elect hand-over`.
    pub fn path(&self) -> &'static str {
        match self.action {
            Some(ElectAction::HandOver(_)) => "elect hand-over",
            None => "elect",
        }
    }

    /// What the library would refuse, found before connecting: the name
    /// and the options `elect` joins with.
    pub fn check(&self) -> fleetcoord::Result<()> {
        match (&self.action, &self.name) {
            (Some(ElectAction::HandOver(a)), _) => a.prefix.options().check(&a.name),
            (None, Some(name)) => self.prefix.options().with_ttl(self.ttl).check(name),
            // clap requires the name; `elect` says so itself.
            (None, None) => Ok(()),
        }
    }
}

/// `elect hand-over`: write the request, wait for the target to lead,
/// remove the request whatever happened. Never deletes a candidate key
/// itself: the leader may still be acting as leader.
fn hand_over(ctx: &Ctx, args: HandOverArgs) -> Result<(), CliError> {
    let options = args.prefix.options();
    let named = |l: &LeaderInfo| l.value == args.to.as_bytes() || l.key == args.to;
    let before = Election::leader_of(&ctx.etcd, &args.name, &options)?;
    let Some(before) = before else {
        return Err(CliError::Message(format!(
            "{}: no leader to hand over from",
            args.name
        )));
    };
    if named(&before) {
        return Err(CliError::Message(format!(
            "{}: {} leads already",
            args.name, args.to
        )));
    }
    Election::request_hand_over(&ctx.etcd, &args.name, &options, args.to.as_bytes())?;
    let deadline = std::time::Instant::now() + args.timeout;
    let outcome = loop {
        let leader = Election::leader_of(&ctx.etcd, &args.name, &options);
        // Read after the leader: a leader that refuses records why before
        // anything else changes, so a new leader seen above comes with its
        // predecessor's reason, if it had one.
        match Election::hand_over_refusal(&ctx.etcd, &args.name, &options) {
            Ok(Some(reason)) => {
                break Err(format!(
                    "{}: the leader {} refused to hand over to {}: {reason}",
                    args.name,
                    text(&before.value),
                    args.to
                ))
            }
            Ok(None) => {}
            Err(e) => break Err(format!("{}: {e}", args.name)),
        }
        match leader {
            Ok(Some(l)) if named(&l) => break Ok(l),
            Ok(Some(l)) if l.token != before.token => {
                break Err(format!(
                    "{}: {} leads now, not {} (was {} waiting behind the leader?)",
                    args.name,
                    text(&l.value),
                    args.to,
                    args.to
                ))
            }
            Ok(_) => {}
            Err(e) => break Err(format!("{}: {e}", args.name)),
        }
        if std::time::Instant::now() >= deadline {
            break Err(format!(
                "{}: {} did not lead within {:?} and the leader did not answer; does it run \
                 `elect --accept-hand-over`?",
                args.name, args.to, args.timeout
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let withdrawn = Election::withdraw_hand_over_request(&ctx.etcd, &args.name, &options);
    let leader = outcome.map_err(CliError::Message)?;
    withdrawn?;
    ctx.out.emit(
        format!(
            "{}: handed over to {} (fencing token {})",
            args.name,
            text(&leader.value),
            leader.token
        ),
        event(
            "handed_over",
            [
                ("name", json!(args.name)),
                ("leader", leader_value(Some(&leader))),
            ],
        ),
    )?;
    Ok(())
}

fn leader_value(leader: Option<&LeaderInfo>) -> Value {
    match leader {
        None => Value::Null,
        Some(l) => object([
            ("value", json!(text(&l.value))),
            ("token", json!(l.token)),
            ("key", json!(l.key)),
            ("lease", lease_json(l.lease)),
        ]),
    }
}

fn leader_line(name: &str, leader: Option<&LeaderInfo>) -> String {
    match leader {
        None => format!("{name}: no leader"),
        Some(l) => format!(
            "{name}: leader {} (fencing token {}, key {})",
            text(&l.value),
            l.token,
            l.key
        ),
    }
}

/// `leader`: one linearizable read.
pub fn leader(ctx: &Ctx, args: NameArgs) -> Result<(), CliError> {
    let current = Election::leader_of(&ctx.etcd, &args.name, &args.prefix.options())?;
    ctx.out.emit(
        leader_line(&args.name, current.as_ref()),
        object([
            ("name", json!(args.name)),
            ("leader", leader_value(current.as_ref())),
        ]),
    )?;
    match current {
        Some(_) => Ok(()),
        None => Err(CliError::NothingThere),
    }
}

/// `observe`: the current leader, then every change.
pub fn observe(ctx: &Ctx, args: ObserveArgs, shutdown: &Receiver<()>) -> Result<(), CliError> {
    let observer = Election::observe_of(&ctx.etcd, &args.name, &args.prefix.options())?;
    let result = follow(
        observer.leaders(),
        shutdown,
        args.count,
        "the leader observation ended",
        |leader| {
            ctx.out
                .emit(
                    leader_line(&args.name, leader.as_ref()),
                    object([
                        ("name", json!(args.name)),
                        ("leader", leader_value(leader.as_ref())),
                    ]),
                )
                .map_err(CliError::from)
        },
    );
    drop(observer);
    result
}

/// Runs `acquire` (a blocking campaign or lock) on its own thread so that
/// a signal meanwhile still ends the process cleanly. `None`: a signal came
/// first; the caller then closes the connection, which revokes the session
/// and with it the waiting key.
pub fn acquire_or_shutdown<T: Send + 'static>(
    acquire: impl FnOnce() -> fleetcoord::Result<T> + Send + 'static,
    shutdown: &Receiver<()>,
) -> Result<Option<T>, CliError> {
    let (won_tx, won) = crossbeam_channel::bounded(1);
    let thread = std::thread::spawn(move || {
        let _ = won_tx.send(acquire());
    });
    select! {
        recv(won) -> result => {
            let _ = thread.join();
            match result {
                Ok(result) => Ok(Some(result?)),
                Err(_) => Err(CliError::Message("the campaign thread ended without an answer".into())),
            }
        }
        recv(shutdown) -> _ => Ok(None),
    }
}

/// `elect`: campaign, report leadership, then hold it until a signal (and
/// resign), or run the gated command while leading.
pub fn elect(ctx: &Ctx, args: ElectArgs, shutdown: &Receiver<()>) -> Result<(), CliError> {
    if let Some(ElectAction::HandOver(a)) = args.action {
        return hand_over(ctx, a);
    }
    let Some(name) = args.name else {
        return Err(CliError::Usage("elect needs the election's name".into()));
    };
    let value = args
        .value
        .unwrap_or_else(|| format!("fleetcoord-{}", std::process::id()));
    let gated = !args.gate.command.is_empty();
    let mut options = args.prefix.options().with_ttl(args.ttl);
    if args.priority.is_some() || args.yield_to_higher || args.accept_hand_over {
        options = options.with_priority(args.priority.unwrap_or(0));
    }
    // Without a command the library may yield at once; with one, the
    // command must be dead first (see gated.rs), so the CLI steps down.
    if args.yield_to_higher && !gated {
        options = options.with_yield_to_higher(true);
    }
    let stepping = gated::StepDown {
        on_higher: args.yield_to_higher,
        hand_over_requests: args.accept_hand_over,
    };
    let trusted = options.trusted_lifetime();
    let election = Arc::new(Election::with_options(&ctx.etcd, &name, options)?);
    let watched = Arc::downgrade(&election);
    ctx.watchdog(
        args.ttl,
        Box::new(move || watched.upgrade()?.session_trusted_until()),
    );
    // While a command runs, stdout is the command's.
    let out = if gated { ctx.out.on_stderr() } else { ctx.out };
    loop {
        out.emit(
            format!("{name}: campaigning as {value}"),
            event(
                "campaigning",
                [("name", json!(name)), ("value", json!(value))],
            ),
        )?;
        let campaigner = election.clone();
        let bytes = value.clone().into_bytes();
        let Some(leadership) = acquire_or_shutdown(move || campaigner.campaign(&bytes), shutdown)?
        else {
            let _ = ctx.etcd.close();
            out.emit(
                format!("{name}: campaign cancelled"),
                event("cancelled", [("name", json!(name))]),
            )?;
            return Ok(());
        };
        report_elected(&out, &name, &value, &leadership)?;
        ctx.health.set(true);
        let token = leadership.fencing_token();
        if !gated {
            let held = hold_until_signal(&out, &name, leadership, shutdown, stepping);
            ctx.health.set(false);
            match held? {
                Hold::Again => continue,
                Hold::Signal => {
                    if let Ok(election) = Arc::try_unwrap(election) {
                        let _ = election.close();
                    }
                    return Ok(());
                }
            }
        }
        let session = {
            let election = election.clone();
            move || election.session()
        };
        let ended = gated::run_stepping(
            &out,
            &name,
            &args.gate,
            Box::new(leadership),
            trusted,
            &session,
            shutdown,
            stepping,
        );
        ctx.health.set(false);
        match ended? {
            Ended::Exited {
                status,
                shutdown: stopping,
            } => {
                out.emit(
                    format!("{name}: resigned"),
                    event("resigned", [("name", json!(name)), ("token", json!(token))]),
                )?;
                if stopping {
                    return gated::finish_stopped(status);
                }
                if !args.gate.restart {
                    return finish(status);
                }
            }
            Ended::SteppedDown {
                handed_to, outcome, ..
            } => {
                report_step_down(&out, &name, token, handed_to.as_deref(), outcome)?;
            }
            Ended::Lost => {
                out.emit(
                    format!("{name}: leadership lost (fencing token {token} is stale now); the command was stopped"),
                    event("lost", [("name", json!(name)), ("token", json!(token))]),
                )?;
                if !args.gate.restart {
                    return Err(lost_leadership(&name, true));
                }
            }
        }
    }
}

/// The error a lost leadership ends `elect` with (exit status 1), with
/// the hint a user who wants the process to outlive it needs: `--restart`
/// with a command, a supervisor's restart without one (`--restart` is for
/// commands only).
fn lost_leadership(name: &str, gated: bool) -> CliError {
    let hint = if gated {
        "add --restart to campaign again and rerun the command when the leadership is lost"
    } else {
        "run elect again (e.g. systemd Restart=on-failure), or use -- CMD with --restart to \
         campaign again by itself"
    };
    CliError::Hinted {
        message: format!(
            "lost the leadership of {name}: the session lease could not be kept alive"
        ),
        hint: hint.into(),
    }
}

/// Exits with the gated command's status.
pub fn finish(status: std::process::ExitStatus) -> Result<(), CliError> {
    match gated::exit_code(status) {
        0 => Ok(()),
        code => Err(CliError::Exit(code)),
    }
}

fn report_elected(
    out: &Out,
    name: &str,
    value: &str,
    leadership: &Leadership,
) -> Result<(), CliError> {
    out.emit(
        format!(
            "{name}: leading as {value} with fencing token {} (key {})",
            leadership.fencing_token(),
            leadership.key()
        ),
        event(
            "elected",
            [
                ("name", json!(name)),
                ("value", json!(value)),
                ("token", json!(leadership.fencing_token())),
                ("key", json!(leadership.key())),
                ("lease", lease_json(leadership.lease())),
            ],
        ),
    )?;
    Ok(())
}

/// How [`hold_until_signal`] ended.
enum Hold {
    /// A signal: resigned; exit.
    Signal,
    /// Stepped down (yielded or handed over): campaign again.
    Again,
}

/// Tells how a step-down went; a failed one is reported, not fatal: the
/// campaign starts over either way.
fn report_step_down(
    out: &Out,
    name: &str,
    token: i64,
    handed_to: Option<&[u8]>,
    outcome: fleetcoord::Result<()>,
) -> Result<(), CliError> {
    let (line, kind) = match (handed_to, &outcome) {
        (Some(to), Ok(())) => (
            format!("{name}: handed over to {}", text(to)),
            "handed_over",
        ),
        (None, Ok(())) => (
            format!("{name}: stepped down for a higher priority"),
            "stepped_down",
        ),
        (_, Err(e)) => (
            format!("{name}: stepping down failed: {e}"),
            "step_down_failed",
        ),
    };
    out.emit(
        line,
        event(kind, [("name", json!(name)), ("token", json!(token))]),
    )?;
    Ok(())
}

/// Without a command: lead until a signal (then resign), a yield to a
/// higher priority, or an accepted hand-over request.
fn hold_until_signal(
    out: &Out,
    name: &str,
    leadership: Leadership,
    shutdown: &Receiver<()>,
    stepping: gated::StepDown,
) -> Result<Hold, CliError> {
    let token = leadership.fencing_token();
    let poll = if stepping.hand_over_requests {
        crossbeam_channel::tick(gated::HAND_OVER_POLL)
    } else {
        crossbeam_channel::never()
    };
    loop {
        select! {
            recv(leadership.lost()) -> _ => {
                if leadership.step_down_requested().try_recv().is_ok() {
                    // The library yielded (with_yield_to_higher).
                    report_step_down(out, name, token, None, Ok(()))?;
                    return Ok(Hold::Again);
                }
                out.emit(
                    format!("{name}: leadership lost (fencing token {token} is stale now)"),
                    event("lost", [("name", json!(name)), ("token", json!(token))]),
                )?;
                return Err(lost_leadership(name, false));
            }
            recv(poll) -> _ => {
                let Ok(Some(to)) = leadership.hand_over_requested() else { continue };
                if leadership.key().as_bytes() == to.as_slice() {
                    let _ = leadership.clear_hand_over_request();
                    continue;
                }
                let outcome = leadership.hand_over(&to);
                if let Err(e) = &outcome {
                    // Said where the operator's `hand-over` looks.
                    let _ = leadership.refuse_hand_over(&e.to_string());
                    report_step_down(out, name, token, Some(&to), outcome)?;
                    continue;
                }
                report_step_down(out, name, token, Some(&to), outcome)?;
                return Ok(Hold::Again);
            }
            recv(shutdown) -> _ => break,
        }
    }
    leadership.resign()?;
    out.emit(
        format!("{name}: resigned"),
        event("resigned", [("name", json!(name)), ("token", json!(token))]),
    )?;
    Ok(Hold::Signal)
}
