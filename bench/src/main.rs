//! `fleetcoord-bench`: every fleetcoord figure beside its anchor — the same
//! operation done directly with etcd-client (or `etcdctl`) — measured in
//! the same run against the same etcd, samples interleaved so machine
//! noise hits both sides. Prints a markdown report on stdout (progress on
//! stderr). `make bench` runs `all` on an etcd of its own.
//!
//! ```text
//! fleetcoord-bench [--quick] [--pool-secs N] [--endpoints host:port] [FIGURE...]
//! FIGURE: kv leave crash campaign handover semaphore rwlock ratelimit elect-cli failover watch pool liveness coord idle-cost concurrency mass-failure rtt shards cas waiters ranges fleet | all (default)
//! ```
//!
//! `--quick` (or `BENCH_QUICK=1`) runs a few samples of every row in
//! seconds, to check that each row still produces numbers; its timings mean
//! nothing.

#![forbid(unsafe_code)]

mod cas;
mod concurrency;
mod coord;
mod cost;
mod election;
mod fleet;
mod kv;
mod liveness;
mod mass;
mod pool;
mod process;
mod raw;
mod raw_bus;
mod report;
mod rtt;
mod shards;
mod stats;
mod waiters;
mod watch;

use report::Row;
use std::time::Instant;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Res<T> = Result<T, BoxError>;

/// What a run is asked to do.
pub struct Config {
    pub quick: bool,
    pub endpoint: String,
    /// The ElectionPool's CPU window (default 20 s; the issue's 60 s with
    /// `--pool-secs 60`).
    pub pool_secs: u64,
}

impl Config {
    /// Sample count: `full` normally, `quick` under `--quick`.
    pub fn samples(&self, full: usize, quick: usize) -> usize {
        if self.quick {
            quick
        } else {
            full
        }
    }
}

type Figure = fn(&Config) -> Res<Vec<Row>>;

const FIGURES: [(&str, Figure); 23] = [
    ("kv", kv::run),
    ("leave", liveness::leave),
    ("crash", liveness::crash),
    ("campaign", election::campaign),
    ("handover", election::handover),
    ("semaphore", election::semaphore),
    ("rwlock", election::rwlock),
    ("ratelimit", election::ratelimit),
    ("elect-cli", election::elect_cli),
    ("failover", election::failover),
    ("watch", watch::run),
    ("pool", pool::run),
    ("liveness", liveness::many),
    ("coord", coord::run),
    ("idle-cost", cost::idle),
    ("concurrency", concurrency::run),
    ("mass-failure", mass::run),
    ("rtt", rtt::run),
    ("shards", shards::run),
    ("cas", cas::run),
    ("waiters", waiters::run),
    ("ranges", watch::compare_reads),
    ("fleet", fleet::run),
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("child-raw-agent") => liveness::child_raw_agent(&args[1..]),
        Some("child-liveness") => liveness::child_liveness(&args[1..]),
        Some("child-liveness-cpu") => liveness::child_liveness_cpu(&args[1..]),
        Some("child-raw-leader") => election::child_raw_leader(&args[1..]),
        Some("child-watch") => watch::child_watch(&args[1..]),
        Some("child-pool") => pool::child_pool(&args[1..]),
        Some("child-pool-memory") => pool::child_pool_memory(&args[1..]),
        Some("child-fleet") => fleet::child_fleet(&args[1..]),
        _ => bench(&args),
    };
    if let Err(e) = result {
        eprintln!("fleetcoord-bench: {e}");
        std::process::exit(1);
    }
}

fn usage() -> String {
    let names: Vec<&str> = FIGURES.iter().map(|(n, _)| *n).collect();
    format!(
        "usage: fleetcoord-bench [--quick] [--pool-secs N] [--endpoints host:port] [FIGURE...]\n\
         FIGURE: {} | all (default)",
        names.join(" ")
    )
}

fn bench(args: &[String]) -> Res<()> {
    let mut quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let mut pool_secs = 20;
    let mut endpoints = None;
    let mut wanted = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--pool-secs" => {
                pool_secs = it
                    .next()
                    .ok_or("--pool-secs needs a number of seconds")?
                    .parse()
                    .map_err(|e| format!("--pool-secs: {e}"))?;
                if !(2..=3600).contains(&pool_secs) {
                    return Err("--pool-secs must be 2 to 3600".into());
                }
            }
            "--endpoints" => {
                endpoints = Some(it.next().ok_or("--endpoints needs host:port")?.clone())
            }
            "-h" | "--help" => {
                println!("{}", usage());
                return Ok(());
            }
            "all" => wanted.extend(FIGURES.iter().map(|(n, _)| n.to_string())),
            name if FIGURES.iter().any(|(n, _)| *n == name) => wanted.push(name.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{}", usage()).into()),
        }
    }
    if wanted.is_empty() {
        wanted.extend(FIGURES.iter().map(|(n, _)| n.to_string()));
    }
    let _server;
    let endpoint = match endpoints {
        Some(e) => e,
        None => {
            let server = fleetcoord::testing::EtcdServer::start()?;
            let e = server.endpoint();
            _server = server;
            e
        }
    };
    let cfg = Config {
        quick,
        endpoint,
        pool_secs,
    };
    let started = Instant::now();
    let load_before = loadavg();
    let etcd_version = etcd_version(&cfg.endpoint)?;
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for name in &wanted {
        let Some((_, figure)) = FIGURES.iter().find(|(n, _)| n == name) else {
            continue;
        };
        eprintln!("== {name}");
        let t = Instant::now();
        match figure(&cfg) {
            Ok(new) => {
                for r in &new {
                    eprintln!("   {}", r.progress_line());
                }
                eprintln!("   ({name}: {:.1} s)", t.elapsed().as_secs_f64());
                rows.extend(new);
            }
            Err(e) => {
                eprintln!("   {name} FAILED: {e}");
                failures.push(format!("{name}: {e}"));
            }
        }
    }
    let mut command = String::from("fleetcoord-bench");
    for a in args {
        command.push(' ');
        command.push_str(a);
    }
    if quick && !command.contains("--quick") {
        command.push_str(" (BENCH_QUICK=1)");
    }
    println!("- Command: `{command}` (release build, `make bench`)");
    println!("- Machine: {}", machine());
    println!("- etcd: {etcd_version}, one member on loopback, started by the benchmark");
    println!(
        "- Load average (1/5/15 min) at start: {load_before}; at end: {}",
        loadavg()
    );
    println!(
        "- Wall time of the run: {:.0} s",
        started.elapsed().as_secs_f64()
    );
    if quick {
        println!("- QUICK MODE: a few samples per row; the numbers mean nothing");
    }
    println!();
    print!("{}", report::markdown(&rows));
    if !failures.is_empty() {
        return Err(format!(
            "{} figure(s) failed:\n  {}",
            failures.len(),
            failures.join("\n  ")
        )
        .into());
    }
    Ok(())
}

/// The server's own report of its version.
fn etcd_version(endpoint: &str) -> Res<String> {
    let raw = raw::Raw::connect(endpoint)?;
    let mut c = raw.client();
    Ok(raw.block_on(c.status())?.version().to_string())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// Cores, CPU model, RAM and kernel, from /proc.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU".to_string(), |(_, m)| m.trim().to_string());
    let ram = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or("unknown".to_string(), |kib| {
            format!("{:.1} GiB", kib as f64 / 1024.0 / 1024.0)
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or("unknown".to_string(), |k| k.trim().to_string());
    format!("{cores} cores ({model}), {ram} RAM, Linux {kernel}")
}
