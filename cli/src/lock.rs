//! `lock`: hold a distributed lock until a signal, or run a command while
//! holding it (see [`crate::gated`]).

use crate::election::{acquire_or_shutdown, finish};
use crate::gated::{self, Ended, GateArgs};
use crate::output::event;
use crate::{duration, CliError, Ctx};
use crossbeam_channel::{select, Receiver};
use fleetcoord::{ElectionOptions, Mutex, DEFAULT_LOCK_PREFIX};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct LockArgs {
    /// The lock's name: one key segment (no '/').
    name: String,
    /// Session lease TTL: a holder that dies releases the lock about this
    /// long after its last renewal (whole seconds).
    #[arg(long, default_value = "10s", value_parser = duration::ttl)]
    ttl: Duration,
    /// Key prefix of the lock's waiters; `--prefix ''` shares the lock with
    /// `etcdctl lock NAME`.
    #[arg(long, default_value = DEFAULT_LOCK_PREFIX)]
    prefix: String,
    #[command(flatten)]
    gate: GateArgs,
}

pub fn lock(ctx: &Ctx, args: LockArgs, shutdown: &Receiver<()>) -> Result<(), CliError> {
    let name = args.name;
    let options = ElectionOptions::default()
        .with_prefix(args.prefix)
        .with_ttl(args.ttl);
    let trusted = options.trusted_lifetime();
    let mutex = Arc::new(Mutex::with_options(&ctx.etcd, &name, options)?);
    let watched = Arc::downgrade(&mutex);
    ctx.watchdog(
        args.ttl,
        Box::new(move || watched.upgrade()?.session_trusted_until()),
    );
    let gated = !args.gate.command.is_empty();
    let out = if gated { ctx.out.on_stderr() } else { ctx.out };
    loop {
        out.emit(
            format!("{name}: waiting for the lock"),
            event("waiting", [("name", json!(name))]),
        )?;
        let locker = mutex.clone();
        let Some(guard) = acquire_or_shutdown(move || locker.lock(), shutdown)? else {
            let _ = ctx.etcd.close();
            out.emit(
                format!("{name}: cancelled"),
                event("cancelled", [("name", json!(name))]),
            )?;
            return Ok(());
        };
        let token = guard.fencing_token();
        ctx.health.set(true);
        out.emit(
            format!(
                "{name}: locked with fencing token {token} (key {})",
                guard.key()
            ),
            event(
                "locked",
                [
                    ("name", json!(name)),
                    ("token", json!(token)),
                    ("key", json!(guard.key())),
                ],
            ),
        )?;
        if !gated {
            select! {
                recv(guard.lost()) -> _ => {
                    ctx.health.set(false);
                    out.emit(
                        format!("{name}: lock lost (fencing token {token} is stale now)"),
                        event("lost", [("name", json!(name)), ("token", json!(token))]),
                    )?;
                    return Err(CliError::Message(format!(
                        "lost the lock {name}: the session lease could not be kept alive"
                    )));
                }
                recv(shutdown) -> _ => {}
            }
            ctx.health.set(false);
            guard.unlock()?;
            out.emit(
                format!("{name}: unlocked"),
                event("unlocked", [("name", json!(name)), ("token", json!(token))]),
            )?;
            return Ok(());
        }
        let session = {
            let mutex = mutex.clone();
            move || mutex.session()
        };
        match gated::run(
            &out,
            &name,
            &args.gate,
            Box::new(guard),
            trusted,
            &session,
            shutdown,
        )? {
            Ended::Exited {
                status,
                shutdown: stopping,
            } => {
                out.emit(
                    format!("{name}: unlocked"),
                    event("unlocked", [("name", json!(name)), ("token", json!(token))]),
                )?;
                if stopping || !args.gate.restart {
                    return finish(status);
                }
            }
            // A lock never steps down (no priorities, no hand-over).
            Ended::SteppedDown { status, .. } => return finish(status),
            Ended::Lost => {
                out.emit(
                    format!("{name}: lock lost (fencing token {token} is stale now); the command was stopped"),
                    event("lost", [("name", json!(name)), ("token", json!(token))]),
                )?;
                if !args.gate.restart {
                    return Err(CliError::Message(format!(
                        "lost the lock {name}: the session lease could not be kept alive"
                    )));
                }
            }
        }
    }
}
