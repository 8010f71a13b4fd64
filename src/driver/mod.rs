//! The driver: one per [`crate::Etcd`] handle, a [`crate::runtime`] thread
//! running the one `etcd_client::Client`.
//!
//! User threads reach it in exactly two ways: a unary [`Request`], which
//! the caller's own thread drives to its answer on a connection of the
//! callers' own ([`direct`]), or, while that one is not ready, polls while
//! this thread drives the shared connection ([`DriverHandle::call`]: no
//! task, no message, no reply channel, so concurrent callers pipeline on
//! one connection either way), and
//! "run this machine" ([`DriverMsg`]), which never blocks and needs no
//! runtime; a machine's notices come back on crossbeam channels. Every machine runs as a task on this runtime ([`runner`]), and
//! [`exec`] is the one place that turns the plain-data requests of `sm` into
//! etcd-client calls. Nothing here knows the facade: it takes the TLS and
//! user settings as plain values ([`crate::tls`]), and errors are the
//! driver's own small types, which the facade maps to its `Error`.

pub(crate) mod connect;
mod delivery;
mod direct;
pub(crate) mod exec;
mod explain;
pub(crate) mod handle;
pub(crate) mod health;
pub(crate) mod holdings;
pub(crate) mod renewer;
pub(crate) mod runner;

pub(crate) use handle::{
    FeedItem, FeedSink, Finished, MachineHandle, Notify, StopHandle, UnaryError, WeakInput,
};

pub(crate) use crate::runtime::{Gone, StartError};

use crate::runtime::{self, CallError, Job, Launch, RuntimeThread, Stopping};
use crate::tls::{EtcdUser, Tls};
use etcd_client as ec;
use fleetcoord_sm::{Request, Response, RpcError};
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
    /// Tells of each endpoint the health monitor takes out of use: reads
    /// in flight are then sent again ([`health::routed`]).
    pub removals: watch::Receiver<u64>,
    /// The keys this handle holds, which every watch shows its events to
    /// before handing them on ([`holdings`]).
    pub holdings: std::sync::Arc<holdings::Holdings>,
}

/// A message from a user thread to the driver task (unary calls are
/// polled on the caller's thread instead, see [`DriverHandle::call`];
/// shutdown is the runtime thread's own).
pub(crate) enum DriverMsg {
    /// Run this machine until it finishes (see [`runner::run`]).
    Run(Box<dyn runner::Runnable>),
}

/// Why a unary call polled on its caller's thread has no response.
#[derive(Debug)]
pub(crate) enum CallFailure {
    /// etcd refused it, or it got no answer in time.
    Unary(UnaryError),
    /// The driver is shutting down or gone.
    Gone,
    /// The caller's thread runs an async runtime's tasks
    /// (`crate::blocking`); nothing was sent.
    InsideAsyncRuntime,
}

/// The user-side end of the driver: the runtime thread it runs on, and
/// what its tasks share (the client, a cheap clone of the one connection;
/// the request timeout; the suspicion a slow call raises), which a unary
/// call polled on its caller's thread uses as a task would.
pub(crate) struct DriverHandle {
    thread: RuntimeThread<DriverMsg>,
    shared: Shared,
    /// The connection unary calls drive themselves (see [`direct`]).
    direct: direct::Direct,
}

impl DriverHandle {
    /// Hand `msg` to the driver.
    pub(crate) fn send(&self, msg: DriverMsg) -> Result<(), Gone> {
        self.thread.send(msg)
    }

    /// Runs `request` against etcd on the calling thread: on the
    /// connection its callers drive ([`direct`]), where a lone call
    /// crosses no thread, and while that one is not ready, polled inside
    /// the driver runtime's context (see `crate::runtime`'s `block_on`),
    /// the runtime thread driving the connection: one wake-up of the
    /// runtime thread and one of the caller per call, as a raw client on a
    /// multi-thread runtime pays.
    ///
    /// The request timeout applies as on every request (and raises the
    /// health monitor's suspicion as any slow call does); the caller stops
    /// waiting after `wait`, dropping the call (a request already sent may
    /// still apply). `Err(Gone)` once the driver is shutting down or gone,
    /// or when called from the driver thread itself, where nothing would
    /// drive the call.
    pub(crate) fn call(&self, request: &Request, wait: Duration) -> Result<Response, CallFailure> {
        if self.thread.is_current() {
            return Err(CallFailure::Gone);
        }
        if !crate::blocking::may_block() {
            return Err(CallFailure::InsideAsyncRuntime);
        }
        let started = std::time::Instant::now();
        if let Some(answer) = self.direct.call(request, wait, &self.shared.suspicion) {
            return answer.map_err(CallFailure::Unary);
        }
        // Not taken there, or a read moved off an endpoint taken out of
        // use: what is left of the wait and of the request timeout.
        let spent = started.elapsed();
        let wait = wait.saturating_sub(spent);
        let shared = &self.shared;
        let timeout = shared.options.request_timeout;
        let left = timeout.saturating_sub(spent);
        let call = async move {
            let attempt = || {
                let mut client = shared.client.clone();
                async move { exec::unary(&mut client, request).await }
            };
            let resend = health::may_send_twice(request);
            match health::routed(&shared.suspicion, &shared.removals, left, resend, attempt).await {
                Some(answer) => answer.map_err(UnaryError::Rpc),
                None => Err(UnaryError::Timeout(timeout)),
            }
        };
        match self.thread.block_on(wait, call) {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(CallFailure::Unary(e)),
            Err(CallError::Timeout) => Err(CallFailure::Unary(UnaryError::Timeout(wait))),
            Err(CallError::Gone) => Err(CallFailure::Gone),
            Err(CallError::InsideAsyncRuntime) => Err(CallFailure::InsideAsyncRuntime),
        }
    }

    /// Ask the driver to stop and join its thread (unless called from it).
    /// Machines get their grace period to revoke and resign first.
    /// Idempotent; concurrent callers do not wait on each other's join.
    pub(crate) fn shutdown(&self) {
        self.direct.close();
        self.thread.shutdown();
    }
}

/// Slack beyond a machine's own stop grace (one request timeout plus a
/// second, see the runner) that the driver waits for tasks after shutdown.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(2);

/// Start the driver thread, connect, and report the outcome before
/// returning — the caller learns about a bad endpoint here, not later —
/// with what the member that proved the connection said of itself.
/// `connect::connect` bounds itself by the connect timeout.
pub(crate) fn start(
    settings: EtcdTarget,
    versions: std::sync::Arc<crate::server_version::MemberVersions>,
    holdings: std::sync::Arc<holdings::Holdings>,
) -> Result<DriverHandle, StartError> {
    let options = DriverOptions {
        request_timeout: settings.request_timeout,
    };
    let grace = options.request_timeout.saturating_add(SHUTDOWN_SLACK);
    let connect_timeout = settings.connect_timeout;
    let in_use = std::sync::Arc::new(direct::InUse::default());
    let direct = direct::Direct::new(settings.clone(), in_use.clone());
    let (thread, answer) = runtime::start(
        "fleetcoord-driver",
        connect_timeout,
        grace,
        move |stopping: Stopping| async move {
            let connected = connect::connect(&settings).await?;
            in_use.set(
                connected
                    .probes
                    .iter()
                    .filter(|(_, answered)| *answered)
                    .map(|(probe, _)| probe.url().to_string())
                    .collect(),
            );
            for status in &connected.statuses {
                versions.record(status);
            }
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
                removals: in_use.removals(),
                holdings,
            };
            let mut tasks: Vec<Job> = vec![Box::pin(renewer)];
            if connected.probes.len() > 1 {
                // A probe that takes longer than a request would have
                // timed out anyway; one that takes longer than a
                // keepalive ping would have broken the connection.
                let probe_timeout = settings
                    .request_timeout
                    .min(settings.keepalive_interval)
                    .min(health::PROBE_TIMEOUT);
                tasks.push(Box::pin(health::monitor(
                    shared.client.clone(),
                    connected.probes,
                    probe_timeout,
                    suspicion,
                    in_use,
                    versions,
                    stopping.receiver(),
                )));
            }
            Ok(Launch {
                answer: shared.clone(),
                state: shared,
                tasks,
            })
        },
        |shared: &Shared, msg: DriverMsg| -> Job {
            match msg {
                DriverMsg::Run(task) => task.run(shared.clone()),
            }
        },
    )?;
    Ok(DriverHandle {
        thread,
        shared: answer,
        direct,
    })
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
