//! The driver thread: one per [`crate::Etcd`] handle, running a tokio
//! `current_thread` runtime and the one `etcd_client::Client`.
//!
//! User threads reach it by exactly two typed messages (see [`DriverMsg`]):
//! a unary [`Request`] with its reply channel, or "run this machine". Sending
//! never blocks and needs no runtime; answers come back on crossbeam
//! channels. Every machine runs as a task on this runtime ([`runner`]), and
//! [`exec`] is the one place that turns the plain-data requests of `sm` into
//! etcd-client calls. Nothing here knows the facade: errors are the driver's
//! own small types, which the facade maps to its `Error`.

// Only the NATS and Redis backends run a client other than etcd-client.
#[cfg(any(feature = "nats", feature = "redis"))]
pub(crate) mod bridge;
pub(crate) mod exec;
pub(crate) mod handle;
pub(crate) mod runner;

pub(crate) use handle::{
    CallError, Feed, FeedItem, Finished, MachineHandle, Notify, StopHandle, UnaryCall,
};

use etcd_client as ec;
use fleetcoord_sm::RpcError;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// How to reach etcd, in plain data: the facade never names etcd-client.
#[derive(Clone, Debug)]
pub(crate) struct ConnectSettings {
    /// `http://host:port` URLs.
    pub endpoints: Vec<String>,
    /// How long connecting (and the first request that proves it) may take.
    pub connect_timeout: Duration,
    /// Deadline of each unary request and renewal.
    pub request_timeout: Duration,
    /// HTTP/2 keepalive ping interval and timeout.
    pub keepalive_interval: Duration,
}

/// Settings the driver applies to every request it runs.
#[derive(Clone, Debug)]
pub(crate) struct DriverOptions {
    pub request_timeout: Duration,
}

/// What every task on the driver runtime shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub client: ec::Client,
    pub options: DriverOptions,
    /// Flips to `true` when the handle closes; machine tasks then stop.
    pub shutdown: watch::Receiver<bool>,
}

/// A message from a user thread to the driver: the only two things a user
/// thread ever asks of it, plus shutdown.
pub(crate) enum DriverMsg {
    /// Run one request against etcd within the request timeout and answer
    /// on the call's reply channel, unless the caller gives up first.
    Unary(UnaryCall),
    /// Run this machine until it finishes (see [`runner::run`]).
    Run(Box<dyn runner::Runnable>),
    /// Stop every task (letting machines revoke and resign within their
    /// grace period), then stop the runtime.
    Shutdown,
}

/// The driver thread has stopped; nothing more can be done through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Gone;

/// Why the driver could not be started.
#[derive(Debug)]
pub(crate) enum StartError {
    /// The thread or its runtime could not be created.
    Io(std::io::Error),
    /// etcd did not answer; one line for an operator.
    Connect(String),
}

/// The user-side end of the driver: a sender and the thread to join.
pub(crate) struct DriverHandle {
    tx: mpsc::UnboundedSender<DriverMsg>,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl DriverHandle {
    /// Hand `msg` to the driver.
    pub(crate) fn send(&self, msg: DriverMsg) -> Result<(), Gone> {
        self.tx.send(msg).map_err(|_| Gone)
    }

    /// Ask the driver to stop and join its thread (unless called from it).
    /// Machines get their grace period to revoke and resign first.
    /// Idempotent; concurrent callers do not wait on each other's join.
    pub(crate) fn shutdown(&self) {
        let _ = self.tx.send(DriverMsg::Shutdown);
        let thread = self.thread.lock().take();
        if let Some(thread) = thread {
            // Joining from the driver thread itself (a handle dropped inside a
            // task) would deadlock; the thread ends on its own then.
            if thread.thread().id() != std::thread::current().id() && thread.join().is_err() {
                log::error!("fleetcoord driver thread panicked");
            }
        }
    }
}

/// Slack beyond a machine's own stop grace (one request timeout plus a
/// second, see the runner) that the driver waits for tasks after shutdown.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(2);

/// Start the driver thread, connect, and report the outcome before
/// returning — the caller learns about a bad endpoint here, not later.
pub(crate) fn start(settings: ConnectSettings) -> Result<DriverHandle, StartError> {
    let (tx, mut rx) = mpsc::unbounded_channel::<DriverMsg>();
    let (ready_tx, ready_rx) = crossbeam_channel::bounded::<Result<(), StartError>>(1);
    let connect_timeout = settings.connect_timeout;
    let thread = std::thread::Builder::new()
        .name("fleetcoord-driver".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(StartError::Io(e)));
                    return;
                }
            };
            runtime.block_on(async move {
                let options = ec::ConnectOptions::new()
                    .with_connect_timeout(settings.connect_timeout)
                    .with_keep_alive(settings.keepalive_interval, settings.keepalive_interval)
                    .with_keep_alive_while_idle(true);
                let client =
                    match connect_checked(&settings.endpoints, options, settings.connect_timeout).await {
                        Ok(c) => c,
                        Err(reason) => {
                            let _ = ready_tx.send(Err(StartError::Connect(reason)));
                            return;
                        }
                    };
                let (shutdown_tx, shutdown_rx) = watch::channel(false);
                let options = DriverOptions { request_timeout: settings.request_timeout };
                let shutdown_grace = options.request_timeout.saturating_add(SHUTDOWN_SLACK);
                let shared = Shared { client, options, shutdown: shutdown_rx };
                let _ = ready_tx.send(Ok(()));
                let mut tasks = tokio::task::JoinSet::new();
                while let Some(msg) = rx.recv().await {
                    match msg {
                        DriverMsg::Unary(call) => {
                            tasks.spawn(handle::unary(shared.clone(), call));
                        }
                        DriverMsg::Run(task) => {
                            tasks.spawn(task.run(shared.clone()));
                        }
                        DriverMsg::Shutdown => break,
                    }
                    // Reap finished tasks so a long-lived handle does not accumulate them.
                    while tasks.try_join_next().is_some() {}
                }
                let _ = shutdown_tx.send(true);
                let drained = tokio::time::timeout(shutdown_grace, async {
                    while tasks.join_next().await.is_some() {}
                })
                .await;
                if drained.is_err() {
                    log::warn!("fleetcoord driver: tasks still running after {shutdown_grace:?}; aborting them");
                    tasks.abort_all();
                }
            });
        })
        .map_err(StartError::Io)?;
    // The driver bounds connecting by `connect_timeout`; the slack only
    // covers a thread too slow to report.
    let wait = connect_timeout.saturating_add(Duration::from_secs(5));
    match ready_rx.recv_timeout(wait) {
        Ok(Ok(())) => Ok(DriverHandle {
            tx,
            thread: parking_lot::Mutex::new(Some(thread)),
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
            // The thread keeps trying in the background; its sender is gone
            // once it reports, and the thread then ends.
            Err(StartError::Connect(format!(
                "no answer within {connect_timeout:?}"
            )))
        }
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
            let _ = thread.join();
            Err(StartError::Connect(
                "the driver thread ended before connecting".into(),
            ))
        }
    }
}

/// The error of a request that got no answer within `timeout`.
pub(crate) fn no_answer(timeout: Duration) -> RpcError {
    RpcError::Unavailable(format!("no answer within {timeout:?}"))
}

/// Connect and prove the cluster answers: etcd-client connects lazily, so
/// without a real request a wrong endpoint would only surface later.
async fn connect_checked(
    endpoints: &[String],
    options: ec::ConnectOptions,
    timeout: Duration,
) -> std::result::Result<ec::Client, String> {
    let attempt = async {
        let mut client = ec::Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| connect_reason(&e))?;
        client.status().await.map_err(|e| connect_reason(&e))?;
        Ok::<_, String>(client)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// Why connecting failed, as one line for an operator. The Display of
/// etcd-client's error embeds tonic's `Status`, whose Display appends its
/// cause with `{:?}` — a struct dump. The root cause of the `source()`
/// chain says it plainly ("connection refused", a DNS failure), so that is
/// what the message carries.
fn connect_reason(e: &ec::Error) -> String {
    use std::error::Error as _;
    let reason = match e {
        ec::Error::GRpcStatus(status) => match status.source() {
            Some(cause) => root_cause(cause),
            // etcd (or something at that address) answered with a status.
            None if !status.message().is_empty() => status.message().to_string(),
            None => status.code().to_string(),
        },
        ec::Error::TransportError(t) => root_cause(t),
        ec::Error::IoError(io) => root_cause(io),
        other => other.to_string(),
    };
    // Display impls may still contain line breaks; the message is one line.
    reason.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The Display of the innermost error, in the lowercase style of the rest
/// of the message: an OS error's "(os error N)" suffix is dropped, since
/// the text before it says the same.
fn root_cause(mut e: &(dyn std::error::Error + 'static)) -> String {
    while let Some(next) = e.source() {
        e = next;
    }
    let text = e.to_string();
    let text = match text.find(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_string(),
        _ => text,
    };
    // "Connection refused" reads "connection refused"; "DNS ..." stays.
    let mut chars = text.chars();
    match (chars.next(), chars.next()) {
        (Some(first), Some(second)) if first.is_uppercase() && second.is_lowercase() => {
            first.to_lowercase().chain(text.chars().skip(1)).collect()
        }
        _ => text,
    }
}

/// A seed for a machine's jitter. Machines are deterministic given their
/// seed; outside tests hosts should differ, so it comes from the OS.
pub(crate) fn rand_seed() -> u64 {
    use rand_core::{OsRng, RngCore};
    OsRng.next_u64()
}
