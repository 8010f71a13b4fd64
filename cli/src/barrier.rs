//! `barrier NAME --count N [-- CMD]`: a double barrier (Go's
//! `recipes.DoubleBarrier` layout). Enter, which returns once N processes
//! were in the barrier at once; then run CMD, if given; then leave, which
//! returns once every process's key is gone. Without CMD the command is a
//! rendezvous: it exits once all N arrived and all passed.

use crate::election::finish;
use crate::output::event;
use crate::{duration, CliError, Ctx};
use fleetcoord::{DoubleBarrier, LockOptions, MAX_BARRIER_COUNT};
use serde_json::json;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct BarrierArgs {
    /// The barrier's name: one key segment (no '/').
    name: String,
    /// How many processes enter together (1 to 10000). Every process of one
    /// NAME must pass the same N; one more than N fails (exit 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BARRIER_COUNT)))]
    count: u32,
    /// Session lease TTL: a process that dies gives its place up about this
    /// long after its last renewal (whole seconds).
    #[arg(long, default_value = "10s", value_parser = duration::ttl)]
    ttl: Duration,
    /// Key prefix of the barrier (default /coord/barrier/); `--prefix ''`
    /// shares the barrier with Go's `recipe.NewDoubleBarrier(s, "NAME", N)`.
    #[arg(long)]
    prefix: Option<String>,
    /// The command to run between enter and leave, after `--`; its exit
    /// status becomes fleetcoord's (after leaving).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

impl BarrierArgs {
    fn options(&self) -> LockOptions {
        let options = LockOptions::default().with_ttl(self.ttl);
        match &self.prefix {
            Some(prefix) => options.with_prefix(prefix.clone()),
            None => options,
        }
    }

    /// What the library would refuse, found before connecting.
    pub fn check(&self) -> fleetcoord::Result<()> {
        DoubleBarrier::check(&self.name, self.count, &self.options())
    }
}

pub fn barrier(ctx: &Ctx, args: BarrierArgs) -> Result<(), CliError> {
    let name = &args.name;
    let barrier = DoubleBarrier::with_options(&ctx.etcd, name, args.count, args.options())?;
    let out = if args.command.is_empty() {
        ctx.out
    } else {
        ctx.out.on_stderr()
    };
    out.emit(
        format!("{name}: waiting for {} to enter", args.count),
        event(
            "waiting",
            [("name", json!(name)), ("count", json!(args.count))],
        ),
    )?;
    barrier.enter()?;
    out.emit(
        format!("{name}: all {} entered", args.count),
        event("entered", [("name", json!(name))]),
    )?;
    let status = match args.command.split_first() {
        Some((program, rest)) => Some(
            std::process::Command::new(program)
                .args(rest)
                .status()
                .map_err(|e| CliError::Message(format!("cannot start {program}: {e}")))?,
        ),
        None => None,
    };
    barrier.leave()?;
    out.emit(
        format!("{name}: all left"),
        event("left", [("name", json!(name))]),
    )?;
    let _ = barrier.close();
    match status {
        Some(status) => finish(status),
        None => Ok(()),
    }
}
