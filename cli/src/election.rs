//! `elect`, `leader` and `observe`: leader elections.

use crate::follow::{follow, CountArgs};
use crate::output::{event, lease_json, object, text};
use crate::{duration, CliError, Ctx};
use crossbeam_channel::{select, Receiver};
use fleetcoord::{Election, ElectionOptions, LeaderInfo};
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

/// `elect`: campaign, report leadership, hold it until a signal, resign.
pub fn elect(ctx: &Ctx, args: ElectArgs, shutdown: &Receiver<()>) -> Result<(), CliError> {
    let name = args.name;
    let value = args
        .value
        .unwrap_or_else(|| format!("fleetcoord-{}", std::process::id()));
    let options = ElectionOptions::default().with_ttl(args.ttl);
    let election = Arc::new(Election::with_options(&ctx.etcd, &name, options)?);
    ctx.out.emit(
        format!("{name}: campaigning as {value}"),
        event(
            "campaigning",
            [("name", json!(name)), ("value", json!(value))],
        ),
    )?;

    // `campaign` blocks until elected; a signal meanwhile must still end the
    // process cleanly, so the campaign runs on its own thread.
    let (won_tx, won) = crossbeam_channel::bounded(1);
    let campaign = {
        let election = election.clone();
        let value = value.clone();
        std::thread::spawn(move || {
            let _ = won_tx.send(election.campaign(value.as_bytes()));
        })
    };
    let leadership = select! {
        recv(won) -> result => match result {
            Ok(result) => result?,
            Err(_) => return Err(CliError::Message("the campaign thread ended without an answer".into())),
        },
        recv(shutdown) -> _ => {
            // Closing the connection revokes the session lease, which deletes
            // the candidate key: the queue moves on at once.
            let _ = ctx.etcd.close();
            ctx.out.emit(
                format!("{name}: campaign cancelled"),
                event("cancelled", [("name", json!(name))]),
            )?;
            return Ok(());
        }
    };
    let _ = campaign.join();
    ctx.out.emit(
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
    let token = leadership.fencing_token();
    select! {
        recv(leadership.lost()) -> _ => {
            ctx.out.emit(
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
    ctx.out.emit(
        format!("{name}: resigned"),
        event("resigned", [("name", json!(name)), ("token", json!(token))]),
    )?;
    Ok(())
}
