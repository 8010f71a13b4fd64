//! The driver thread: one per [`crate::Etcd`] handle, running a tokio
//! `current_thread` runtime and the one `etcd_client::Client`.
//!
//! User threads talk to it through [`DriverMsg`]s on a tokio unbounded
//! channel (sending never blocks and needs no runtime) and get answers on
//! crossbeam channels. Every primitive is a task on this runtime that runs
//! one sm machine ([`runner`]).

pub(crate) mod exec;
pub(crate) mod runner;

use crate::error::{Error, Result};
use etcd_client as ec;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

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

type Job = Box<dyn FnOnce(Shared) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A message from a user thread to the driver.
pub(crate) enum DriverMsg {
    /// Spawn this job as a task on the driver runtime.
    Spawn(Job),
    /// Stop every task (letting machines revoke and resign within their
    /// grace period), then stop the runtime.
    Shutdown,
}

/// The user-side end of the driver: a sender and the thread to join.
pub(crate) struct DriverHandle {
    pub tx: mpsc::UnboundedSender<DriverMsg>,
    pub thread: Option<std::thread::JoinHandle<()>>,
}

/// Slack beyond a machine's own stop grace (one request timeout plus a
/// second, see the runner) that the driver waits for tasks after shutdown.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(2);

/// Start the driver thread, connect, and report the outcome before
/// returning — the caller learns about a bad endpoint here, not later.
pub(crate) fn start(
    endpoints: Vec<String>,
    connect: ec::ConnectOptions,
    connect_timeout: Duration,
    options: DriverOptions,
) -> Result<DriverHandle> {
    let (tx, mut rx) = mpsc::unbounded_channel::<DriverMsg>();
    let (ready_tx, ready_rx) = crossbeam_channel::bounded::<Result<()>>(1);
    let shown = endpoints.join(",");
    let thread = std::thread::Builder::new()
        .name("fleetcoord-driver".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(Error::Io(e)));
                    return;
                }
            };
            runtime.block_on(async move {
                let client = match connect_checked(&endpoints, connect, connect_timeout).await {
                    Ok(c) => c,
                    Err(reason) => {
                        let _ = ready_tx.send(Err(Error::Connect { endpoints: endpoints.join(","), reason }));
                        return;
                    }
                };
                let (shutdown_tx, shutdown_rx) = watch::channel(false);
                let shutdown_grace = options.request_timeout + SHUTDOWN_SLACK;
                let shared = Shared { client, options, shutdown: shutdown_rx };
                let _ = ready_tx.send(Ok(()));
                let mut tasks = tokio::task::JoinSet::new();
                while let Some(msg) = rx.recv().await {
                    match msg {
                        DriverMsg::Spawn(job) => {
                            tasks.spawn(job(shared.clone()));
                            // Reap finished tasks so a long-lived handle does not accumulate them.
                            while tasks.try_join_next().is_some() {}
                        }
                        DriverMsg::Shutdown => break,
                    }
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
        .map_err(Error::Io)?;
    match ready_rx.recv_timeout(connect_timeout + Duration::from_secs(5)) {
        Ok(Ok(())) => Ok(DriverHandle {
            tx,
            thread: Some(thread),
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => Err(Error::Connect {
            endpoints: shown,
            reason: "the driver thread did not start".into(),
        }),
    }
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
