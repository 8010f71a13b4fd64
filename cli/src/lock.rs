//! `lock`: hold a distributed lock until a signal, or run a command while
//! holding it (see [`crate::gated`]).

use crate::election::{acquire_or_shutdown, finish};
use crate::gated::Held;
use crate::gated::{self, Ended, GateArgs};
use crate::output::event;
use crate::{duration, CliError, Ctx};
use crossbeam_channel::{select, Receiver};
use fleetcoord::{LivenessState, LockOptions, Mutex, RwLock, RwMode, Semaphore};
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
    /// Key prefix of the lock's waiters (default /coord/lock/, or
    /// /coord/semaphore/ with --permits, /coord/rwlock/ with --read or
    /// --write); `--prefix ''` shares the lock with `etcdctl lock NAME`
    /// (with --read/--write: with Go's `recipe.NewRWMutex(s, "NAME")`).
    #[arg(long)]
    prefix: Option<String>,
    /// Hold one of N permits of a semaphore instead of the lock: at most N
    /// holders at once. Every process of one NAME must pass the same N.
    /// `--permits 1` is a one-permit semaphore (its keys carry the count and
    /// live under /coord/semaphore/), not the etcdctl-compatible lock.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,
    /// Take a shared read of the read-write lock NAME (keys under
    /// /coord/rwlock/NAME/read/): other readers may hold at the same time,
    /// no writer. Waits for every writer that queued before it.
    #[arg(long, conflicts_with_all = ["permits", "write"])]
    read: bool,
    /// Take the exclusive write of the read-write lock NAME (keys under
    /// /coord/rwlock/NAME/write/): waits for every reader and writer that
    /// queued before it; readers that come later wait for it.
    #[arg(long, conflicts_with_all = ["permits", "read"])]
    write: bool,
    #[command(flatten)]
    gate: GateArgs,
}

impl LockArgs {
    fn options(&self) -> LockOptions {
        let options = LockOptions::default().with_ttl(self.ttl);
        match &self.prefix {
            Some(prefix) => options.with_prefix(prefix.clone()),
            None => options,
        }
    }

    /// What the library would refuse, found before connecting.
    pub fn check(&self) -> fleetcoord::Result<()> {
        if self.rw_mode().is_some() {
            return self.options().check_rwlock(&self.name);
        }
        self.options().check(&self.name, self.permits.is_some())
    }

    /// The side of a read-write lock asked for, if any.
    fn rw_mode(&self) -> Option<RwMode> {
        match (self.read, self.write) {
            (true, _) => Some(RwMode::Read),
            (_, true) => Some(RwMode::Write),
            _ => None,
        }
    }
}

/// The error a lost lock ends `lock` with (exit status 1), with the hint
/// a user who wants the process to outlive it needs (see
/// `election::lost_leadership`).
fn lost_lock(name: &str, gated: bool) -> CliError {
    let hint = if gated {
        "add --restart to wait for the lock again and rerun the command when it is lost"
    } else {
        "run lock again (e.g. systemd Restart=on-failure), or use -- CMD with --restart to \
         wait for it again by itself"
    };
    CliError::Hinted {
        message: format!("lost the lock {name}: the session lease could not be kept alive"),
        hint: hint.into(),
    }
}

/// The lock, a semaphore's permit with `--permits`, or one side of a
/// read-write lock with `--read`/`--write`.
enum Locker {
    Mutex(Mutex),
    Semaphore(Semaphore),
    Rw(RwLock, RwMode),
}

impl Locker {
    /// Blocks until held; the hold and its key.
    fn acquire(&self) -> fleetcoord::Result<(Box<dyn Held + Send>, String)> {
        Ok(match self {
            Locker::Mutex(m) => {
                let guard = m.lock()?;
                let key = guard.key().to_string();
                (Box::new(guard), key)
            }
            Locker::Semaphore(s) => {
                let guard = s.acquire()?;
                let key = guard.key().to_string();
                (Box::new(guard), key)
            }
            Locker::Rw(l, mode) => {
                let guard = l.lock(*mode, None)?;
                let key = guard.key().to_string();
                (Box::new(guard), key)
            }
        })
    }

    fn session(&self) -> Option<LivenessState> {
        match self {
            Locker::Mutex(m) => m.session(),
            Locker::Semaphore(s) => s.session(),
            Locker::Rw(l, _) => l.session(),
        }
    }

    fn session_trusted_until(&self) -> Option<std::time::Instant> {
        match self {
            Locker::Mutex(m) => m.session_trusted_until(),
            Locker::Semaphore(s) => s.session_trusted_until(),
            Locker::Rw(l, _) => l.session_trusted_until(),
        }
    }
}

pub fn lock(ctx: &Ctx, args: LockArgs, shutdown: &Receiver<()>) -> Result<(), CliError> {
    let options = args.options();
    let mode = args.rw_mode();
    let name = args.name;
    let trusted = options.trusted_lifetime();
    let mutex = Arc::new(match (args.permits, mode) {
        (_, Some(mode)) => Locker::Rw(RwLock::with_options(&ctx.etcd, &name, options)?, mode),
        (Some(permits), None) => {
            Locker::Semaphore(Semaphore::with_options(&ctx.etcd, &name, permits, options)?)
        }
        (None, None) => Locker::Mutex(Mutex::with_options(&ctx.etcd, &name, options)?),
    });
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
        let Some((guard, key)) = acquire_or_shutdown(move || locker.acquire(), shutdown)? else {
            let _ = ctx.etcd.close();
            out.emit(
                format!("{name}: cancelled"),
                event("cancelled", [("name", json!(name))]),
            )?;
            return Ok(());
        };
        let token = guard.token();
        ctx.health.set(true);
        out.emit(
            format!("{name}: locked with fencing token {token} (key {key})"),
            event(
                "locked",
                [
                    ("name", json!(name)),
                    ("token", json!(token)),
                    ("key", json!(key)),
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
                    return Err(lost_lock(&name, false));
                }
                recv(shutdown) -> _ => {}
            }
            ctx.health.set(false);
            guard.release()?;
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
        match gated::run(&out, &name, &args.gate, guard, trusted, &session, shutdown)? {
            Ended::Exited {
                status,
                shutdown: stopping,
            } => {
                out.emit(
                    format!("{name}: unlocked"),
                    event("unlocked", [("name", json!(name)), ("token", json!(token))]),
                )?;
                if stopping {
                    return gated::finish_stopped(status);
                }
                if !args.gate.restart {
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
                    return Err(lost_lock(&name, true));
                }
            }
        }
    }
}
