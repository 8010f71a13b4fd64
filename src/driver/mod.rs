//! The driver: one per [`crate::Etcd`] handle, a [`crate::runtime`] thread
//! running the one `etcd_client::Client`.
//!
//! User threads reach it by exactly two typed messages (see [`DriverMsg`]):
//! a unary [`Request`] with its reply channel, or "run this machine". Sending
//! never blocks and needs no runtime; answers come back on crossbeam
//! channels. Every machine runs as a task on this runtime ([`runner`]), and
//! [`exec`] is the one place that turns the plain-data requests of `sm` into
//! etcd-client calls. Nothing here knows the facade: it takes the TLS and
//! user settings as plain values ([`crate::tls`]), and errors are the
//! driver's own small types, which the facade maps to its `Error`.

pub(crate) mod connect;
mod delivery;
pub(crate) mod exec;
mod explain;
pub(crate) mod handle;
pub(crate) mod health;
pub(crate) mod renewer;
pub(crate) mod runner;

pub(crate) use handle::{
    FeedItem, FeedSink, Finished, MachineHandle, Notify, StopHandle, UnaryCall, UnaryError,
    WeakInput,
};

pub(crate) use crate::runtime::{Gone, StartError};

use crate::runtime::{self, Job, Launch, RuntimeThread, Stopping};
use crate::tls::{EtcdUser, Tls};
use etcd_client as ec;
use fleetcoord_sm::RpcError;
use std::time::Duration;
use tokio::sync::watch;

/// How to reach etcd, in plain data: the facade never names etcd-client.
/// `Debug` redacts the key and password (see [`crate::tls`]).
#[derive(Clone, Debug)]
pub(crate) struct EtcdTarget {
    /// `http://host:port` or (with `tls`) `https://host:port` URLs.
    pub endpoints: Vec<String>,
    /// How long connecting (and the first request that proves it) may take.
    pub connect_timeout: Duration,
    /// Deadline of each unary request and renewal.
    pub request_timeout: Duration,
    /// HTTP/2 keepalive ping interval and timeout.
    pub keepalive_interval: Duration,
    /// TLS for every connection.
    pub tls: Option<Tls>,
    /// Who to log in as.
    pub user: Option<EtcdUser>,
}

/// What a member said of itself in its answer to a status request
/// (connect's probes ask every member anyway).
#[derive(Clone, Debug)]
pub(crate) struct ServerStatus {
    /// Its etcd version, as reported (`3.4.23`).
    pub version: String,
    /// Its member id; 0 when the answer had no header.
    pub member_id: u64,
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
/// thread ever asks of it (shutdown is the runtime thread's own).
pub(crate) enum DriverMsg {
    /// Run one request against etcd within the request timeout and answer
    /// on the call's reply channel, unless the caller gives up first.
    Unary(UnaryCall),
    /// Run this machine until it finishes (see [`runner::run`]).
    Run(Box<dyn runner::Runnable>),
}

/// The user-side end of the driver: the runtime thread it runs on.
pub(crate) struct DriverHandle(RuntimeThread<DriverMsg>);

impl DriverHandle {
    /// Hand `msg` to the driver.
    pub(crate) fn send(&self, msg: DriverMsg) -> Result<(), Gone> {
        self.0.send(msg)
    }

    /// Ask the driver to stop and join its thread (unless called from it).
    /// Machines get their grace period to revoke and resign first.
    /// Idempotent; concurrent callers do not wait on each other's join.
    pub(crate) fn shutdown(&self) {
        self.0.shutdown();
    }
}

/// Slack beyond a machine's own stop grace (one request timeout plus a
/// second, see the runner) that the driver waits for tasks after shutdown.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(2);

/// Start the driver thread, connect, and report the outcome before
/// returning — the caller learns about a bad endpoint here, not later —
/// with what the member that proved the connection said of itself.
/// `connect::connect` bounds itself by the connect timeout.
pub(crate) fn start(settings: EtcdTarget) -> Result<(DriverHandle, ServerStatus), StartError> {
    let options = DriverOptions {
        request_timeout: settings.request_timeout,
    };
    let grace = options.request_timeout.saturating_add(SHUTDOWN_SLACK);
    let connect_timeout = settings.connect_timeout;
    let (thread, status) = runtime::start(
        "fleetcoord-driver",
        connect_timeout,
        grace,
        move |stopping: Stopping| async move {
            let connected = connect::connect(&settings).await?;
            let status = connected.status;
            let suspicion = health::Suspicion::default();
            let (renewals, renewer) = renewer::start(
                connected.client.clone(),
                options.request_timeout,
                suspicion.clone(),
                stopping.receiver(),
            );
            let shared = Shared {
                client: connected.client,
                options,
                shutdown: stopping.receiver(),
                suspicion: suspicion.clone(),
                renewals,
            };
            let mut tasks: Vec<Job> = vec![Box::pin(renewer)];
            if connected.probes.len() > 1 {
                // A probe that takes longer than a request would have
                // timed out anyway; one that takes longer than a
                // keepalive ping would have broken the connection.
                let probe_timeout = settings.request_timeout.min(settings.keepalive_interval);
                tasks.push(Box::pin(health::monitor(
                    shared.client.clone(),
                    connected.probes,
                    probe_timeout,
                    suspicion,
                    stopping.receiver(),
                )));
            }
            Ok(Launch {
                state: shared,
                answer: status,
                tasks,
            })
        },
        |shared: &Shared, msg: DriverMsg| -> Job {
            match msg {
                DriverMsg::Unary(call) => Box::pin(handle::unary(shared.clone(), call)),
                DriverMsg::Run(task) => task.run(shared.clone()),
            }
        },
    )?;
    Ok((DriverHandle(thread), status))
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
