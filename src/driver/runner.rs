//! Runs one sm [`Machine`] inside the driver runtime: executes its commands
//! against etcd, feeds replies, user inputs and timeouts back, and hands
//! notifications to the user. Glue only — every decision is the machine's.

use super::exec;
use super::Shared;
use etcd_client as ec;
use fleetcoord_sm::{
    Command, KeyRange, LeaseId, Machine, Request, Response, RpcError, RpcId, RpcReply,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

/// How a machine task is wired to its user.
pub(crate) struct MachineTask<M: Machine> {
    /// The machine to run.
    pub machine: M,
    /// User requests; when every sender is gone the machine is stopped.
    pub inputs: mpsc::UnboundedReceiver<M::Event>,
    /// Receives each notification. Returns `false` once nobody listens any
    /// more; the runner then stops the machine.
    pub notify: Box<dyn FnMut(M::Notification) -> bool + Send>,
}

/// The input that asks a machine to stop (revoke, resign, cancel); the
/// runner ends the task once the machine has finished stopping.
pub(crate) trait StopInput {
    fn stop() -> Self;
    fn is_stop(&self) -> bool;
}

macro_rules! stop_input {
    ($($ty:path => $variant:path),* $(,)?) => {$(
        impl StopInput for $ty {
            fn stop() -> Self {
                $variant
            }
            fn is_stop(&self) -> bool {
                matches!(self, $variant)
            }
        }
    )*};
}

stop_input!(
    fleetcoord_sm::keepalive::KeepaliveEvent => fleetcoord_sm::keepalive::KeepaliveEvent::Stop,
    fleetcoord_sm::watch::WatchInput => fleetcoord_sm::watch::WatchInput::Stop,
    fleetcoord_sm::election::ElectionInput => fleetcoord_sm::election::ElectionInput::Stop,
    fleetcoord_sm::observe::ObserveInput => fleetcoord_sm::observe::ObserveInput::Stop,
);

/// A renewal stream for one lease, opened lazily and dropped on failure.
struct KeepaliveStream {
    lease: LeaseId,
    requests: mpsc::UnboundedSender<RpcId>,
    /// The task owning the stream, aborted when the stream is replaced or
    /// its lease revoked, so no renewal is ever sent after a revoke.
    task: AbortHandle,
}

impl Drop for KeepaliveStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Slack beyond one request timeout that a stopping machine gets to finish
/// (revoke, resign) before the runner gives up on it; a dead etcd must not
/// block shutdown forever, but a slow one should still see the revoke.
const STOP_SLACK: Duration = Duration::from_secs(1);

pub(crate) async fn run<M>(shared: Shared, task: MachineTask<M>)
where
    M: Machine + Send + 'static,
    M::Event: Send + StopInput,
    M::Notification: Send,
{
    let MachineTask {
        mut machine,
        mut inputs,
        mut notify,
    } = task;
    let stop = <M::Event as StopInput>::stop;
    let (reply_tx, mut replies) = mpsc::unbounded_channel::<RpcReply>();
    let mut inflight: HashMap<RpcId, AbortHandle> = HashMap::new();
    let mut keepalive: Option<KeepaliveStream> = None;
    let mut shutdown = shared.shutdown.clone();
    let mut stop_deadline: Option<tokio::time::Instant> = None;
    let mut last_now = Instant::now();
    let stop_grace = shared.options.request_timeout + STOP_SLACK;

    loop {
        while let Some(command) = machine.poll_command() {
            match command {
                Command::Rpc { id, request } => {
                    start_rpc(
                        &shared,
                        id,
                        request,
                        &reply_tx,
                        &mut inflight,
                        &mut keepalive,
                    );
                }
                Command::Cancel { id } => {
                    // A renewal the machine gave up on is deliberately not
                    // aborted: while etcd elects a new raft leader a renewal
                    // is merely slow, and its stream succeeds once the leader
                    // is back, whereas a fresh stream may be routed to the
                    // dead member (measured with tests/cluster.rs). Its late
                    // reply is ignored by the machine.
                    if let Some(handle) = inflight.remove(&id) {
                        handle.abort();
                    }
                }
                Command::Notify(n) => {
                    if !notify(n) && stop_deadline.is_none() {
                        // The user dropped the receiver and handle: stop as if asked.
                        stop_deadline = Some(tokio::time::Instant::now() + stop_grace);
                        machine.handle(Instant::now().max(last_now), stop());
                    }
                }
            }
        }
        if let Some(deadline) = stop_deadline {
            if machine.poll_timeout().is_none() && inflight.is_empty() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                log::warn!("machine did not finish stopping within {stop_grace:?}; abandoning it");
                break;
            }
        }
        let timeout = machine.poll_timeout();
        let sleep_until = match (timeout, stop_deadline) {
            (Some(t), Some(d)) => Some(tokio::time::Instant::from_std(t).min(d)),
            (Some(t), None) => Some(tokio::time::Instant::from_std(t)),
            (None, d) => d,
        };
        tokio::select! {
            biased;
            reply = replies.recv() => {
                let Some(reply) = reply else { break };
                // Every task's last message is its only non-`WatchEvents`
                // reply (a unary answer, or a watch's end): it is done.
                if !matches!(reply.result, Ok(Response::WatchEvents { .. })) {
                    inflight.remove(&reply.id);
                }
                last_now = Instant::now().max(last_now);
                machine.handle(last_now, reply.into());
            }
            input = inputs.recv(), if stop_deadline.is_none() => {
                last_now = Instant::now().max(last_now);
                match input {
                    Some(event) => {
                        if event.is_stop() {
                            stop_deadline = Some(tokio::time::Instant::now() + stop_grace);
                        }
                        machine.handle(last_now, event)
                    }
                    None => {
                        stop_deadline = Some(tokio::time::Instant::now() + stop_grace);
                        machine.handle(last_now, stop());
                    }
                }
            }
            _ = shutdown.changed(), if stop_deadline.is_none() => {
                last_now = Instant::now().max(last_now);
                stop_deadline = Some(tokio::time::Instant::now() + stop_grace);
                machine.handle(last_now, stop());
            }
            _ = sleep(sleep_until) => {
                last_now = Instant::now().max(last_now);
                machine.handle_timeout(last_now);
            }
        }
    }
    for (_, handle) in inflight.drain() {
        handle.abort();
    }
}

async fn sleep(until: Option<tokio::time::Instant>) {
    match until {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn start_rpc(
    shared: &Shared,
    id: RpcId,
    request: Request,
    reply_tx: &mpsc::UnboundedSender<RpcReply>,
    inflight: &mut HashMap<RpcId, AbortHandle>,
    keepalive: &mut Option<KeepaliveStream>,
) {
    let reply_tx = reply_tx.clone();
    match request {
        Request::Watch {
            range,
            start_revision,
        } => {
            let client = shared.client.clone();
            let handle = tokio::spawn(watch(client, id, range, start_revision, reply_tx));
            inflight.insert(id, handle.abort_handle());
        }
        Request::KeepAlive { lease } => {
            let stream = match keepalive {
                Some(s) if s.lease == lease && !s.requests.is_closed() => s,
                _ => {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let client = shared.client.clone();
                    let timeout = shared.options.request_timeout;
                    let task = tokio::spawn(renewals(client, lease, rx, reply_tx.clone(), timeout));
                    keepalive.insert(KeepaliveStream {
                        lease,
                        requests: tx,
                        task: task.abort_handle(),
                    })
                }
            };
            if stream.requests.send(id).is_err() {
                let _ = reply_tx.send(RpcReply {
                    id,
                    result: Err(RpcError::Unavailable("renewal stream closed".into())),
                });
            }
        }
        request => {
            if let Request::Revoke { lease } = &request {
                // Renewals queued for this lease must not reach etcd after
                // the revoke: drop (and abort) its stream first.
                if keepalive.as_ref().is_some_and(|k| k.lease == *lease) {
                    *keepalive = None;
                }
            }
            let mut client = shared.client.clone();
            let timeout = shared.options.request_timeout;
            let handle = tokio::spawn(async move {
                let result =
                    match tokio::time::timeout(timeout, exec::unary(&mut client, &request)).await {
                        Ok(result) => result,
                        Err(_) => Err(RpcError::Unavailable(format!(
                            "no answer within {timeout:?}"
                        ))),
                    };
                let _ = reply_tx.send(RpcReply { id, result });
            });
            inflight.insert(id, handle.abort_handle());
        }
    }
}

/// One watch: forwards every response until etcd cancels it, the stream
/// breaks, or the machine cancels it (abort).
async fn watch(
    mut client: ec::Client,
    id: RpcId,
    range: KeyRange,
    start_revision: i64,
    reply_tx: mpsc::UnboundedSender<RpcReply>,
) {
    let (key, options) = exec::watch_options(&range, start_revision);
    let mut stream =
        match exec::on_a_live_member!(client.watch(key.clone(), Some(options.clone())).await) {
            Ok(s) => s,
            Err(e) => {
                let _ = reply_tx.send(RpcReply {
                    id,
                    result: Err(exec::rpc_error(e)),
                });
                return;
            }
        };
    loop {
        let result = match stream.message().await {
            Ok(Some(r)) => Ok(exec::watch_response(&r)),
            Ok(None) => Err(RpcError::Unavailable("watch stream ended".into())),
            Err(e) => Err(exec::rpc_error(e)),
        };
        let last = !matches!(result, Ok(Response::WatchEvents { .. }));
        if reply_tx.send(RpcReply { id, result }).is_err() || last {
            return;
        }
    }
}

/// The renewal stream of one lease. Each request id gets exactly one reply:
/// the TTL etcd answered with, or an error (after which the stream is
/// reopened for the next request).
async fn renewals(
    client: ec::Client,
    lease: LeaseId,
    mut requests: mpsc::UnboundedReceiver<RpcId>,
    reply_tx: mpsc::UnboundedSender<RpcReply>,
    timeout: Duration,
) {
    let mut stream: Option<(ec::LeaseKeeper, ec::LeaseKeepAliveStream)> = None;
    while let Some(id) = requests.recv().await {
        let result = tokio::time::timeout(timeout, renew_once(&client, lease, &mut stream)).await;
        let result = match result {
            Ok(r) => r,
            Err(_) => Err(RpcError::Unavailable(format!(
                "no renewal answer within {timeout:?}"
            ))),
        };
        if result.is_err() {
            stream = None;
        }
        if reply_tx.send(RpcReply { id, result }).is_err() {
            return;
        }
    }
}

async fn renew_once(
    client: &ec::Client,
    lease: LeaseId,
    stream: &mut Option<(ec::LeaseKeeper, ec::LeaseKeepAliveStream)>,
) -> Result<Response, RpcError> {
    if stream.is_none() {
        let mut c = client.clone();
        // Opening the stream already renews once and reads the answer;
        // etcd-client reports a TTL of 0 there as this error.
        match exec::on_a_live_member!(c.lease_keep_alive(lease).await) {
            Ok(opened) => *stream = Some(opened),
            Err(ec::Error::LeaseKeepAliveError(msg)) if msg.contains("lease not found") => {
                return Ok(Response::KeptAlive { ttl_secs: 0 });
            }
            Err(e) => return Err(exec::rpc_error(e)),
        }
    }
    let Some((keeper, responses)) = stream.as_mut() else {
        return Err(RpcError::Unavailable("renewal stream missing".into()));
    };
    keeper.keep_alive().await.map_err(exec::rpc_error)?;
    match responses.message().await.map_err(exec::rpc_error)? {
        Some(r) => Ok(Response::KeptAlive { ttl_secs: r.ttl() }),
        None => Err(RpcError::Unavailable("renewal stream ended".into())),
    }
}
