//! `--metrics-addr HOST:PORT`: Prometheus text at `/metrics` and a health
//! check at `/healthz` for the long-running commands (`agent`, `elect`,
//! `lock`, `watch-hosts`).
//!
//! `/healthz` is 200 only while the command is doing its job: the agent's
//! liveness is `Registered`; `elect`/`lock` hold the leadership/lock (a
//! readiness check: exactly one instance of a group is ready); `watch-hosts`
//! has `Synced` and its watch is alive. Otherwise 503. The series are the
//! library's (see `fleetcoord::metrics`).
//!
//! A plain blocking HTTP/1.0 responder on one thread: a scrape every few
//! seconds needs nothing more, and it adds no async runtime to the tool.

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Whether `/healthz` answers 200; commands flip it as their state changes.
/// Under a service manager (`NOTIFY_SOCKET`) every change is also told to
/// it: `READY=1` the first time, `STATUS=` each time (see notify.rs).
#[derive(Clone, Default)]
pub struct Health(Arc<HealthState>);

#[derive(Default)]
struct HealthState {
    healthy: AtomicBool,
    notifier: Option<crate::notify::Notifier>,
    /// What healthy means for this command, for `STATUS=`.
    what: &'static str,
    ready_sent: AtomicBool,
    /// Until when the command's lease is trusted, asked by the watchdog
    /// thread (see [`Health::watch_trust`]).
    trust: std::sync::Mutex<Option<TrustSource>>,
    /// The service manager's watchdog period, if it set one.
    watchdog: Option<Duration>,
    watchdog_started: AtomicBool,
    stopped: AtomicBool,
}

/// Reads how long the command's lease is trusted: the library's
/// `trusted_until`, which moves at every answered renewal.
pub type TrustSource = Box<dyn Fn() -> Option<Instant> + Send>;

/// How often the watchdog thread looks at the trust source, per
/// watchdog period: a renewal is told well within the period.
const WATCHDOG_LOOKS_PER_PERIOD: u32 = 10;
const WATCHDOG_LOOK_MAX: Duration = Duration::from_millis(500);
const WATCHDOG_LOOK_MIN: Duration = Duration::from_millis(10);

impl Health {
    /// Health that also tells `notifier` (if any) about each change;
    /// `what` names the healthy state ("registered", "leading", …).
    /// `watchdog` is the service manager's watchdog period, if it set one.
    pub fn new(
        notifier: Option<crate::notify::Notifier>,
        what: &'static str,
        watchdog: Option<Duration>,
    ) -> Health {
        Health(Arc::new(HealthState {
            notifier,
            what,
            watchdog,
            ..HealthState::default()
        }))
    }

    pub fn set(&self, healthy: bool) {
        let was = self.0.healthy.swap(healthy, Ordering::SeqCst);
        let Some(notifier) = &self.0.notifier else {
            return;
        };
        if was == healthy {
            return;
        }
        let what = self.0.what;
        if healthy && !self.0.ready_sent.swap(true, Ordering::SeqCst) {
            notifier.send(&format!("READY=1\nSTATUS={what}"));
        } else if healthy {
            notifier.send(&format!("STATUS={what}"));
        } else {
            notifier.send(&format!("STATUS=not {what}"));
        }
    }

    /// Under a watchdog (`WATCHDOG_USEC`, see notify.rs), sends `WATCHDOG=1`
    /// each time `source` says the lease's trust moved forward, i.e. at
    /// every answered renewal; replaces any earlier source. Without a
    /// watchdog, does nothing. Returns the watchdog period, if any.
    pub fn watch_trust(&self, source: TrustSource) -> Option<Duration> {
        let period = self.0.notifier.as_ref().and(self.0.watchdog)?;
        *lock(&self.0.trust) = Some(source);
        if !self.0.watchdog_started.swap(true, Ordering::SeqCst) {
            let state = self.0.clone();
            let look =
                (period / WATCHDOG_LOOKS_PER_PERIOD).clamp(WATCHDOG_LOOK_MIN, WATCHDOG_LOOK_MAX);
            // Detached: it ends when the command stops (or with the process).
            let _ = std::thread::Builder::new()
                .name("fleetcoord-watchdog".into())
                .spawn(move || watchdog(&state, look));
        }
        Some(period)
    }

    /// Drops the trust source given to [`Health::watch_trust`] (and whatever
    /// it holds); no `WATCHDOG=1` follows until a new one is given.
    pub fn forget_trust(&self) {
        *lock(&self.0.trust) = None;
    }

    /// The command is stopping: tell the service manager.
    pub fn stopping(&self) {
        self.0.stopped.store(true, Ordering::SeqCst);
        self.forget_trust();
        if let Some(notifier) = &self.0.notifier {
            notifier.send("STOPPING=1");
        }
    }

    fn get(&self) -> bool {
        self.0.healthy.load(Ordering::SeqCst)
    }
}

/// The watchdog thread: `WATCHDOG=1` whenever the trust source's answer is
/// later than the one before. A wedged driver (no renewal answered) or a
/// lease that cannot be renewed sends nothing, and the service manager
/// restarts the unit one period after the last renewal.
fn watchdog(state: &HealthState, look: Duration) {
    let mut last: Option<Instant> = None;
    while !state.stopped.load(Ordering::SeqCst) {
        std::thread::sleep(look);
        let until = lock(&state.trust).as_ref().and_then(|source| source());
        if until.is_some() && until > last {
            last = until;
            if let Some(notifier) = &state.notifier {
                notifier.send("WATCHDOG=1");
            }
        }
    }
}

/// A source that panicked leaves the slot as it was: still usable.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A slow or silent client must not hold the responder for long.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// `--metrics-addr`: `HOST:PORT` with a port of 0 to 65535 (0 picks a free
/// one), checked when parsing so that a typo is a usage error before
/// anything connects; whether HOST resolves is learnt when binding.
pub fn address(text: &str) -> Result<String, String> {
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err("expected HOST:PORT, e.g. 127.0.0.1:9100".into());
    };
    if host.is_empty() {
        return Err("names no host; expected HOST:PORT, e.g. 127.0.0.1:9100".into());
    }
    port.parse::<u16>()
        .map_err(|_| format!("{port:?} is not a port (0-65535)"))?;
    Ok(text.to_string())
}

/// Installs the Prometheus recorder and serves it on `addr` from a thread
/// of its own. Returns the bound address (`:0` picks a free port).
pub fn serve(addr: &str, health: Health) -> Result<SocketAddr, String> {
    let listener = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    // `# HELP` for every family: without it `promtool check metrics`
    // warns about each one.
    fleetcoord::metrics::describe();
    std::thread::Builder::new()
        .name("fleetcoord-metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                // One failed exchange (a client gone mid-request) only ends
                // that exchange.
                let _ = answer(stream, &handle, &health);
            }
        })
        .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
    Ok(bound)
}

fn answer(stream: TcpStream, handle: &PrometheusHandle, health: &Health) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Read the headers off so the client sees a clean close.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => {
            handle.run_upkeep();
            ("200 OK", "text/plain; version=0.0.4", handle.render())
        }
        ("GET", "/healthz") if health.get() => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/healthz") => (
            "503 Service Unavailable",
            "text/plain",
            "unhealthy\n".to_string(),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_string(),
        ),
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}
