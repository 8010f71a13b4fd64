//! `fleetcoord`: look at a live fleet and take part in it from the shell,
//! the way `etcdctl` does for etcd itself.
//!
//! Exit status ([`man::EXIT_STATUSES`], which the man pages print and the
//! README's table must match): 0 on success (also after Ctrl-C / SIGTERM,
//! which stop long-running commands cleanly, and with `-- CMD` when CMD
//! obeyed), 1 on a runtime error (message on stderr), 2 on a usage error,
//! 3 when a lookup finds nothing there, 130 on a second signal, CMD's own
//! status otherwise.

// Unsafe code only where a gated command is tied to this process's life
// (`tether`, which allows it for itself).
#![deny(unsafe_code)]

mod barrier;
mod bus;
mod duration;
mod election;
mod follow;
mod gated;
mod hosts;
mod lock;
mod man;
mod metrics_http;
mod notify;
mod output;
mod security;
mod shards;
mod signal;
mod tether;

use clap::{Parser, Subcommand};
use fleetcoord::coordinator::{Coordinator, EtcdCoordinator};
use fleetcoord::{Etcd, EtcdOptions};
use output::Out;
use std::process::ExitCode;
use std::time::Duration;

/// Used when neither `--endpoints` nor an endpoints variable is set.
const DEFAULT_ENDPOINT: &str = "127.0.0.1:2379";

/// Where endpoints come from when `--endpoints` is absent, first set wins:
/// our own variable, then etcdctl's, so a shell already set up for etcdctl
/// works unchanged (its `http://` URLs included: the library takes them).
const ENDPOINT_VARS: [&str; 2] = ["ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS"];

/// The heading of the options every subcommand takes, so that a
/// subcommand's `--help` lists its own options first, apart from them.
const GLOBAL_OPTIONS: &str = "Global options";

/// Cross-host coordination on etcd: hosts, leader elections, KV, pub/sub
/// and streams.
#[derive(Parser, Debug)]
#[command(
    name = "fleetcoord",
    version,
    propagate_version = true,
    next_help_heading = GLOBAL_OPTIONS
)]
struct Cli {
    /// etcd endpoints, comma-separated host:port, http://host:port or (with
    /// --cacert) https://host:port [default: $ETCD_ENDPOINTS, else
    /// $ETCDCTL_ENDPOINTS, else 127.0.0.1:2379]
    #[arg(long, global = true, value_name = "HOST:PORT,...", value_parser = endpoint_flag)]
    endpoints: Option<String>,

    #[command(flatten)]
    security: security::SecurityArgs,

    /// Print one JSON object per line instead of text for people. The
    /// streaming commands (watch-hosts, agent, elect, lock, observe, kv
    /// watch, sub, stream read) add `ts`, when the record was printed (RFC
    /// 3339, UTC, milliseconds).
    #[arg(long, global = true)]
    json: bool,

    /// Start each line of a streaming command's text output with the time
    /// it was printed (RFC 3339, UTC, milliseconds), as `ts` in --json.
    #[arg(long, global = true)]
    timestamps: bool,

    /// How long to try reaching etcd before giving up (e.g. 500ms, 5s,
    /// 1m30s).
    #[arg(long, global = true, default_value = "5s", value_parser = duration::timeout)]
    connect_timeout: Duration,

    #[command(flatten)]
    backend: bus::BackendArgs,

    /// Serve Prometheus metrics at /metrics and a health check at /healthz
    /// on this address (agent, elect, lock, watch-hosts); port 0 picks a
    /// free one, printed at start.
    #[arg(long, global = true, value_name = "HOST:PORT", value_parser = metrics_http::address)]
    metrics_addr: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the live hosts and their metadata.
    Hosts(hosts::HostsArgs),
    /// Stream host Up / Updated / Down events as they happen; a Down says
    /// why: left (the host closed) or expired (its lease ran out: a crash,
    /// a partition).
    WatchHosts(hosts::WatchArgs),
    /// Register this process as a host until Ctrl-C, printing its liveness
    /// state changes; exiting (Ctrl-C, SIGTERM) announces the leave and
    /// revokes the lease so watchers see Down (left) at once. With
    /// --state-file, exiting hands the registration to the next run instead
    /// (a restart within the TTL is no Down for watchers). A host id another
    /// live agent holds is a duplicate: the agent fails within about one
    /// TTL and the other is left alone; a crashed predecessor's key is
    /// waited for (state `waiting`) and then registered.
    Agent(hosts::AgentArgs),
    /// Campaign in an election; print when leading (with the fencing token),
    /// hold until Ctrl-C, then resign. With `-- CMD ARGS...`: run CMD only
    /// while leading (FLEETCOORD_FENCING_TOKEN in its environment), stop it
    /// before leadership can pass on, exit with its status.
    Elect(election::ElectArgs),
    /// Take a distributed lock (compatible with `etcdctl lock` under
    /// `--prefix ''`), with `--permits N` one of N permits of a
    /// semaphore, or with `--read`/`--write` one side of a read-write lock
    /// (Go's `recipes.RWMutex` layout); hold it until Ctrl-C, or run
    /// `-- CMD ARGS...` while holding it, as `elect` does.
    Lock(lock::LockArgs),
    /// Wait until N processes entered the barrier NAME (Go's
    /// `recipes.DoubleBarrier` layout), run `-- CMD ARGS...` if given, then
    /// leave, waiting until all N left; exits with CMD's status.
    Barrier(barrier::BarrierArgs),
    /// Print the current leader of an election.
    Leader(election::NameArgs),
    /// Stream the leader of an election as it changes.
    Observe(election::ObserveArgs),
    /// Show a shard map (shard -> owner, token), or with --watch every
    /// change; `shards join NAME --shards M -- CMD ARGS...` joins it and
    /// runs CMD with the shards this process owns (FLEETCOORD_SHARDS),
    /// restarted when they change, stopped before a shard can pass on.
    Shards(shards::ShardsArgs),
    /// KV buckets: get, set, del, watch.
    #[command(subcommand)]
    Kv(bus::KvCommand),
    /// Publish a message on a topic (live-only: current subscribers see it).
    Pub(bus::PubArgs),
    /// Print the messages published on a topic from now on.
    Sub(bus::SubArgs),
    /// Append-only streams: append, read.
    #[command(subcommand)]
    Stream(bus::StreamCommand),
    /// Print a shell completion script (e.g. `fleetcoord completions bash >
    /// /etc/bash_completion.d/fleetcoord`). Needs no etcd.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print a man page (roff) on stdout: fleetcoord(1), or with
    /// SUBCOMMAND the page of that subcommand (`fleetcoord man kv get`);
    /// `--all DIR` writes every page into DIR (e.g. `fleetcoord man --all
    /// /usr/local/share/man/man1`). Needs no etcd.
    Man(man::ManArgs),
}

/// Why a command failed.
#[derive(Debug)]
pub enum CliError {
    /// A library call failed.
    Fleet(fleetcoord::Error),
    /// Anything else, already phrased for the user.
    Message(String),
    /// What the user typed (an argument, a flag, a variable standing in for
    /// one) cannot be used; exit status 2, like clap's own usage errors.
    Usage(String),
    /// Stdout went away; not worth a message.
    Stdout(output::Closed),
    /// What was asked for is not there (`leader` with no leader, `kv get`
    /// of a missing key, `shards NAME` with no shard owned): the answer is
    /// printed already, and [`NOTHING_THERE`] tells a script so without
    /// parsing it, apart from errors (1).
    NothingThere,
    /// A gated command's nonzero exit status, passed on.
    Exit(u8),
    /// A runtime error (exit status 1) the user can avoid next time: the
    /// message, then a line saying how (an option to add).
    Hinted { message: String, hint: String },
}

impl From<fleetcoord::Error> for CliError {
    /// The library rejects an argument before sending anything
    /// (`InvalidArgument`): here every such argument is one the user typed
    /// (a name, a prefix, a key, an endpoint, a TLS file), so it is a usage
    /// error, whether clap or the library found it.
    fn from(e: fleetcoord::Error) -> Self {
        match e {
            e @ fleetcoord::Error::InvalidArgument { .. } => CliError::Usage(e.to_string()),
            e => CliError::Fleet(e),
        }
    }
}

/// The exit status of a read that found nothing (see
/// [`CliError::NothingThere`]): neither success (0), nor an error (1), nor
/// a usage error (2), as `systemctl is-active` says "inactive" with 3.
pub const NOTHING_THERE: u8 = 3;

/// The exit status of a failed command: 2 for usage errors, as clap's own,
/// [`NOTHING_THERE`] (3) for a read that found nothing and for a
/// conditional `kv set` that lost (so a script tells a taken claim from a
/// failure), the command's own status when a gated command failed, else 1.
fn exit_status(e: &CliError) -> u8 {
    match e {
        CliError::Stdout(_) => 0,
        CliError::NothingThere => NOTHING_THERE,
        CliError::Exit(code) => *code,
        CliError::Usage(_) => 2,
        CliError::Fleet(fleetcoord::Error::Conflict { .. }) => NOTHING_THERE,
        CliError::Fleet(_) | CliError::Message(_) | CliError::Hinted { .. } => 1,
    }
}

impl From<output::Closed> for CliError {
    fn from(e: output::Closed) -> Self {
        CliError::Stdout(e)
    }
}

/// What every command gets: the connection, the output, and the health
/// `/healthz` reports (when `--metrics-addr` serves it).
pub struct Ctx {
    pub etcd: Etcd,
    pub out: Out,
    pub health: metrics_http::Health,
}

impl Ctx {
    /// Under a service manager's watchdog, tells it `WATCHDOG=1` each time
    /// `source` (a lease's `trusted_until`) moves forward; warns when the
    /// period is shorter than `ttl`, as renewals retried through a short
    /// etcd hiccup would then get the unit restarted.
    pub fn watchdog(&self, ttl: std::time::Duration, source: metrics_http::TrustSource) {
        if let Some(period) = self.health.watch_trust(source) {
            if period < ttl {
                eprintln!(
                    "fleetcoord: warning: the watchdog period ({period:?}) is shorter than \
                     the TTL ({ttl:?}): a few failed renewals in a row get this unit \
                     restarted; set WatchdogSec= to at least the TTL"
                );
            }
        }
    }
}

/// The items of a comma-separated endpoint list, trimmed, empty ones
/// dropped.
fn split_endpoints(raw: &str) -> Vec<String> {
    raw.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// `--endpoints` must name at least one endpoint. A flag given on purpose
/// but empty (`--endpoints ""`, an unset shell variable expanded into it)
/// is a mistake to report, not a request for the environment's endpoints
/// or the default: that would quietly talk to another cluster.
fn endpoint_flag(text: &str) -> Result<String, String> {
    if split_endpoints(text).is_empty() {
        return Err("names no endpoint; expected host:port[,host:port...]".into());
    }
    Ok(text.to_string())
}

/// The endpoints to use: the flag (never blank, see [`endpoint_flag`]),
/// else the first of [`ENDPOINT_VARS`] that names an endpoint, else the
/// default. A variable naming none counts as unset, as an
/// `export ETCD_ENDPOINTS=` meant to clear it would.
fn endpoints(flag: Option<String>, var: impl Fn(&str) -> Option<String>) -> Vec<String> {
    std::iter::once(flag)
        .chain(ENDPOINT_VARS.iter().map(|name| var(name)))
        .flatten()
        .map(|raw| split_endpoints(&raw))
        .find(|list| !list.is_empty())
        .unwrap_or_else(|| vec![DEFAULT_ENDPOINT.to_string()])
}

/// Checks every name, prefix and key the command will hand the library,
/// with the library's own rules, before anything connects: a typo is a
/// usage error (2) naming the command, whether etcd is up or not, never
/// hidden behind a connection error.
fn precheck(command: &Command) -> Result<(), CliError> {
    let (path, checked) = match command {
        Command::Hosts(a) => ("hosts", a.check()),
        Command::WatchHosts(a) => ("watch-hosts", a.check()),
        Command::Agent(a) => ("agent", a.check()),
        Command::Elect(a) => (a.path(), a.check()),
        Command::Lock(a) => ("lock", a.check()),
        Command::Barrier(a) => ("barrier", a.check()),
        Command::Leader(a) => ("leader", a.check()),
        Command::Observe(a) => ("observe", a.check()),
        Command::Shards(a) => (a.path(), a.check()),
        Command::Kv(c) => (c.path(), c.check()),
        Command::Pub(a) => ("pub", a.check()),
        Command::Sub(a) => ("sub", a.check()),
        Command::Stream(c) => (c.path(), c.check()),
        Command::Completions { .. } | Command::Man(_) => return Ok(()),
    };
    checked.map_err(|e| CliError::Usage(format!("{path}: {e}")))
}

fn run(cli: Cli) -> Result<(), CliError> {
    precheck(&cli.command)?;
    match &cli.command {
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut command, "fleetcoord", &mut script);
            return print_raw(&script);
        }
        Command::Man(args) => {
            let page = man::man(<Cli as clap::CommandFactory>::command(), args)?;
            return print_raw(&page);
        }
        _ => {}
    }
    // Long-running commands print records as things happen (streaming),
    // and take signals over before connecting, so that a Ctrl-C during a
    // slow connect still ends in a clean exit.
    let streaming = matches!(
        &cli.command,
        Command::WatchHosts(_)
            | Command::Agent(_)
            | Command::Elect(_)
            | Command::Lock(_)
            | Command::Observe(_)
            | Command::Sub(_)
            | Command::Kv(bus::KvCommand::Watch(_))
            | Command::Stream(bus::StreamCommand::Read(_))
    ) || matches!(&cli.command, Command::Shards(a) if a.streams());
    let out = match (streaming, cli.timestamps) {
        (true, text) => Out::new(cli.json).streaming(text),
        (false, false) => Out::new(cli.json),
        (false, true) => {
            return Err(CliError::Usage(
                "--timestamps is for the streaming commands watch-hosts, agent, elect, lock, \
                 observe, shards --watch, shards join, kv watch, sub and stream read"
                    .into(),
            ))
        }
    };
    let shutdown = if streaming {
        signal::install().map_err(CliError::Message)?
    } else {
        crossbeam_channel::never()
    };
    // Readiness for a service manager, for the commands that have a
    // healthy state (the others exit when done, which says it all).
    let what = match &cli.command {
        Command::Agent(_) => Some("registered"),
        Command::Elect(_) => Some("leading"),
        Command::Lock(_) => Some("holding the lock"),
        Command::WatchHosts(_) => Some("synced"),
        _ => None,
    };
    let notifier = what.and_then(|_| notify::Notifier::from_env(|name| std::env::var(name).ok()));
    let watchdog = notifier
        .as_ref()
        .and_then(|_| notify::watchdog_period(|name| std::env::var(name).ok(), std::process::id()));
    let health = metrics_http::Health::new(notifier, what.unwrap_or(""), watchdog);
    if let Some(addr) = &cli.metrics_addr {
        if !matches!(
            cli.command,
            Command::Agent(_) | Command::Elect(_) | Command::Lock(_) | Command::WatchHosts(_)
        ) {
            return Err(CliError::Usage(
                "--metrics-addr is for the long-running commands agent, elect, lock and watch-hosts"
                    .into(),
            ));
        }
        let bound = metrics_http::serve(addr, health.clone()).map_err(CliError::Message)?;
        // On stderr: an elect/lock command's stdout belongs to its command.
        out.on_stderr().emit(
            format!("metrics on http://{bound}/metrics, health on http://{bound}/healthz"),
            serde_json::json!({"event": "metrics", "addr": bound.to_string()}),
        )?;
    }
    // The bus commands need etcd only when their backend is the etcd of
    // `--endpoints`; `--coord nats` must work where no etcd runs.
    let backend = match &cli.command {
        Command::Kv(_) | Command::Pub(_) | Command::Sub(_) | Command::Stream(_) => {
            Some(cli.backend.resolve(|name| std::env::var(name).ok())?)
        }
        _ => None,
    };
    if let Some(bus::Backend::Other { name, url }) = backend {
        let settings = cli.backend.settings(|name| std::env::var(name).ok())?;
        let coord =
            fleetcoord::coordinator::connect(&name, url.as_deref(), &settings).map_err(|e| {
                let at = url.as_deref().unwrap_or("its default URL");
                let message = format!("cannot use the {name} backend at {at}: {e}");
                match e {
                    // A URL that does not parse: the user's to fix.
                    fleetcoord::Error::InvalidArgument { .. } => CliError::Usage(message),
                    _ => CliError::Message(message),
                }
            })?;
        let result = run_bus(cli.command, &out, coord.as_ref(), &shutdown);
        let _ = coord.close();
        return result;
    }
    let options = EtcdOptions::default().with_connect_timeout(cli.connect_timeout);
    let options = cli
        .security
        .apply(options, |name| std::env::var(name).ok())?;
    let endpoints = endpoints(cli.endpoints, |name| std::env::var(name).ok());
    let etcd = Etcd::with_options(&endpoints, options)?;
    let ctx = Ctx {
        etcd: etcd.clone(),
        out,
        health,
    };
    let result = match cli.command {
        Command::Hosts(a) => hosts::list(&ctx, a),
        Command::WatchHosts(a) => hosts::watch(&ctx, a, &shutdown),
        Command::Agent(a) => hosts::agent(&ctx, a, &shutdown),
        Command::Elect(a) => election::elect(&ctx, a, &shutdown),
        Command::Lock(a) => lock::lock(&ctx, a, &shutdown),
        Command::Barrier(a) => barrier::barrier(&ctx, a),
        Command::Leader(a) => election::leader(&ctx, a),
        Command::Observe(a) => election::observe(&ctx, a, &shutdown),
        Command::Shards(a) => shards::shards(&ctx, a, &shutdown),
        bus_command => EtcdCoordinator::on_etcd(&ctx.etcd)
            .map_err(CliError::from)
            .and_then(|coord| {
                let result = run_bus(bus_command, &ctx.out, &coord, &shutdown);
                let _ = coord.close();
                result
            }),
    };
    ctx.health.stopping();
    drop(ctx);
    // Closing revokes whatever a command left registered (a campaign
    // interrupted before it won, for instance) before the process exits.
    let _ = etcd.close();
    result
}

/// Writes generated text (a completion script, the man page) to stdout; a
/// closed stdout (`| head`) is not an error.
fn print_raw(bytes: &[u8]) -> Result<(), CliError> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::Message(format!("cannot write to stdout: {e}"))),
    }
}

/// Runs a bus command (`kv`, `pub`, `sub`, `stream`) on `coord`.
fn run_bus(
    command: Command,
    out: &Out,
    coord: &dyn Coordinator,
    shutdown: &crossbeam_channel::Receiver<()>,
) -> Result<(), CliError> {
    match command {
        Command::Kv(c) => bus::kv(out, coord, c, shutdown),
        Command::Pub(a) => bus::publish(out, coord, a),
        Command::Sub(a) => bus::subscribe(out, coord, a, shutdown),
        Command::Stream(c) => bus::stream(out, coord, c, shutdown),
        other => Err(CliError::Message(format!(
            "internal: {other:?} is not a bus command"
        ))),
    }
}

/// Sends the library's `log` records (a keepalive that keeps failing, a
/// driver that would not stop) to stderr, where an operator sees them
/// beside our own messages. `warn` by default so that normal runs stay
/// quiet; `RUST_LOG=debug` and friends select more.
fn init_logger() {
    // Fails only if a logger is installed already, which nothing here does.
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .target(env_logger::Target::Stderr)
        .try_init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logger();
    let Err(e) = run(cli) else {
        return ExitCode::SUCCESS;
    };
    match &e {
        CliError::Fleet(e) => eprintln!("fleetcoord: error: {e}"),
        CliError::Message(m) | CliError::Usage(m) => eprintln!("fleetcoord: error: {m}"),
        CliError::Hinted { message, hint } => {
            eprintln!("fleetcoord: error: {message}");
            eprintln!("fleetcoord: hint: {hint}");
        }
        CliError::Stdout(_) | CliError::Exit(_) | CliError::NothingThere => {}
    }
    ExitCode::from(exit_status(&e))
}

#[cfg(test)]
mod tests {
    use super::{endpoint_flag, endpoints};

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn endpoints_come_from_flag_then_our_var_then_etcdctls_then_default() {
        let both = [
            ("ETCD_ENDPOINTS", "a:1"),
            ("ETCDCTL_ENDPOINTS", "http://b:2"),
        ];
        assert_eq!(endpoints(Some("f:0".into()), env(&both)), ["f:0"]);
        assert_eq!(endpoints(None, env(&both)), ["a:1"]);
        assert_eq!(
            endpoints(None, env(&[("ETCDCTL_ENDPOINTS", "http://b:2,http://c:3")])),
            ["http://b:2", "http://c:3"]
        );
        assert_eq!(endpoints(None, env(&[])), ["127.0.0.1:2379"]);
    }

    #[test]
    fn blank_variables_count_as_unset() {
        let vars = [("ETCD_ENDPOINTS", " , "), ("ETCDCTL_ENDPOINTS", "b:2")];
        assert_eq!(endpoints(None, env(&vars)), ["b:2"]);
        assert_eq!(
            endpoints(None, env(&[("ETCD_ENDPOINTS", "")])),
            ["127.0.0.1:2379"]
        );
    }

    #[test]
    fn a_blank_flag_is_refused() {
        for blank in ["", " ", ",", " , ,"] {
            assert!(endpoint_flag(blank).is_err(), "{blank:?}");
        }
        assert_eq!(endpoint_flag(" a:1, "), Ok(" a:1, ".to_string()));
    }

    #[test]
    fn list_items_are_trimmed_and_empty_ones_dropped() {
        assert_eq!(
            endpoints(Some(" a:1 , ,b:2,".into()), env(&[])),
            ["a:1", "b:2"]
        );
    }
}
