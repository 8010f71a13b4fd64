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
use std::time::Duration;

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
}

impl Health {
    /// Health that also tells `notifier` (if any) about each change;
    /// `what` names the healthy state ("registered", "leading", …).
    pub fn new(notifier: Option<crate::notify::Notifier>, what: &'static str) -> Health {
        Health(Arc::new(HealthState {
            notifier,
            what,
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

    /// The command is stopping: tell the service manager.
    pub fn stopping(&self) {
        if let Some(notifier) = &self.0.notifier {
            notifier.send("STOPPING=1");
        }
    }

    fn get(&self) -> bool {
        self.0.healthy.load(Ordering::SeqCst)
    }
}

/// A slow or silent client must not hold the responder for long.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

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
