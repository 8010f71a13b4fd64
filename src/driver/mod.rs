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
pub(crate) mod connect;
pub(crate) mod exec;
pub(crate) mod handle;
pub(crate) mod health;
pub(crate) mod renewer;
pub(crate) mod runner;

pub(crate) use handle::{
    CallError, Feed, FeedItem, Finished, MachineHandle, Notify, StopHandle, UnaryCall, WeakInput,
};

use crate::tls::{EtcdTls, EtcdUser};
use etcd_client as ec;
use fleetcoord_sm::RpcError;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// How to reach etcd, in plain data: the facade never names etcd-client.
/// `Debug` redacts the key and password (see [`crate::tls`]).
#[derive(Clone, Debug)]
pub(crate) struct ConnectSettings {
    /// `http://host:port` or (with `tls`) `https://host:port` URLs.
    pub endpoints: Vec<String>,
    /// How long connecting (and the first request that proves it) may take.
    pub connect_timeout: Duration,
    /// Deadline of each unary request and renewal.
    pub request_timeout: Duration,
    /// HTTP/2 keepalive ping interval and timeout.
    pub keepalive_interval: Duration,
    /// TLS for every connection.
    pub tls: Option<EtcdTls>,
    /// Who to log in as.
    pub user: Option<EtcdUser>,
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
    /// Raised when a call got no answer in time: the health monitor then
    /// probes every endpoint at once.
    pub suspicion: health::Suspicion,
    /// The one renewal stream every lease of the handle is kept alive on.
    pub renewals: renewer::Renewals,
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
                let connected = match connect::connect(&settings).await {
                    Ok(c) => c,
                    Err(reason) => {
                        let _ = ready_tx.send(Err(StartError::Connect(reason)));
                        return;
                    }
                };
                let (shutdown_tx, shutdown_rx) = watch::channel(false);
                let options = DriverOptions { request_timeout: settings.request_timeout };
                let shutdown_grace = options.request_timeout.saturating_add(SHUTDOWN_SLACK);
                let suspicion = health::Suspicion::default();
                let (renewals, renewer) = renewer::start(
                    connected.client.clone(),
                    options.request_timeout,
                    suspicion.clone(),
                    shutdown_rx.clone(),
                );
                let shared = Shared {
                    client: connected.client,
                    options,
                    shutdown: shutdown_rx,
                    suspicion: suspicion.clone(),
                    renewals,
                };
                let mut tasks = tokio::task::JoinSet::new();
                tasks.spawn(renewer);
                if connected.probes.len() > 1 {
                    // A probe that takes longer than a request would have
                    // timed out anyway; one that takes longer than a
                    // keepalive ping would have broken the connection.
                    let probe_timeout = settings.request_timeout.min(settings.keepalive_interval);
                    tasks.spawn(health::monitor(
                        shared.client.clone(),
                        connected.probes,
                        probe_timeout,
                        suspicion,
                        shared.shutdown.clone(),
                    ));
                }
                let _ = ready_tx.send(Ok(()));
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

/// A seed for a machine's jitter. Machines are deterministic given their
/// seed; outside tests hosts should differ, so it comes from the OS.
pub(crate) fn rand_seed() -> u64 {
    use rand_core::{OsRng, RngCore};
    OsRng.next_u64()
}
