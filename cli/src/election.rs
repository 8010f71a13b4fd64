//! `elect`, `leader` and `observe`: leader elections.

use crate::follow::{follow, CountArgs};
use crate::gated::{self, Ended, GateArgs};
use crate::output::{event, lease_json, object, text, Out};
use crate::{duration, CliError, Ctx};
use crossbeam_channel::{select, Receiver};
use fleetcoord::{Election, ElectionOptions, LeaderInfo, Leadership};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct NameArgs {
    /// The election's name: one key segment (no '/').
    name: String,
}

#[derive(clap::Args, Debug)]
pub struct ObserveArgs {
    /// The election's name: one key segment (no '/').
    name: String,
    #[command(flatten)]
    count: CountArgs,
}

#[derive(clap::Args, Debug)]
pub struct ElectArgs {
    /// The election's name: one key segment (no '/').
    name: String,
    /// What the leader announces (observers and `leader` show it)
    /// [default: `fleetcoord-<pid>`].
    #[arg(long)]
    value: Option<String>,
    /// Session lease TTL: a leader that dies is replaced about this long
    /// after its last renewal (whole seconds).
    #[arg(long, default_value = "10s", value_parser = duration::ttl)]
    ttl: Duration,
    #[command(flatten)]
    gate: GateArgs,
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
    let current = Election::leader_of(&ctx.etcd, &args.name, &ElectionOptions::default())?;
    ctx.out.emit(
        leader_line(&args.name, current.as_ref()),
        object([
            ("name", json!(args.name)),
            ("leader", leader_value(current.as_ref())),
        ]),
    )?;
    Ok(())
}

/// `observe`: the current leader, then every change.
pub fn observe(ctx: &Ctx, args: ObserveArgs, shutdown: &Receiver<()>) -> Result<(), CliError> {
    let observer = Election::observe_of(&ctx.etcd, &args.name, &ElectionOptions::default())?;
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
    let name = args.name;
    let value = args
        .value
        .unwrap_or_else(|| format!("fleetcoord-{}", std::process::id()));
    let options = ElectionOptions::default().with_ttl(args.ttl);
    let trusted = options.trusted_lifetime();
    let election = Arc::new(Election::with_options(&ctx.etcd, &name, options)?);
    let watched = Arc::downgrade(&election);
    ctx.watchdog(
        args.ttl,
        Box::new(move || watched.upgrade()?.session_trusted_until()),
    );
    let gated = !args.gate.command.is_empty();
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
            let result = hold_until_signal(&out, &name, leadership, election, shutdown);
            ctx.health.set(false);
            return result;
        }
        let session = {
            let election = election.clone();
            move || election.session()
        };
        let ended = gated::run(
            &out,
            &name,
            &args.gate,
            Box::new(leadership),
            trusted,
            &session,
            shutdown,
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
                if stopping || !args.gate.restart {
                    return finish(status);
                }
            }
            Ended::Lost => {
                out.emit(
                    format!("{name}: leadership lost (fencing token {token} is stale now); the command was stopped"),
                    event("lost", [("name", json!(name)), ("token", json!(token))]),
                )?;
                if !args.gate.restart {
                    return Err(CliError::Message(format!(
                        "lost the leadership of {name}: the session lease could not be kept alive"
                    )));
                }
            }
        }
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

/// Without a command: lead until a signal, then resign.
fn hold_until_signal(
    out: &Out,
    name: &str,
    leadership: Leadership,
    election: Arc<Election>,
    shutdown: &Receiver<()>,
) -> Result<(), CliError> {
    let token = leadership.fencing_token();
    select! {
        recv(leadership.lost()) -> _ => {
            out.emit(
                format!("{name}: leadership lost (fencing token {token} is stale now)"),
                event("lost", [("name", json!(name)), ("token", json!(token))]),
            )?;
            return Err(CliError::Message(format!(
                "lost the leadership of {name}: the session lease could not be kept alive"
            )));
        }
        recv(shutdown) -> _ => {}
    }
    let resigned = leadership.resign();
    if let Ok(election) = Arc::try_unwrap(election) {
        let _ = election.close();
    }
    resigned?;
    out.emit(
        format!("{name}: resigned"),
        event("resigned", [("name", json!(name)), ("token", json!(token))]),
    )?;
    Ok(())
}
