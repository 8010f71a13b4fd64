//! Runs one sm [`Machine`] inside the driver runtime: executes its commands
//! against etcd, feeds replies, user inputs and timeouts back, and hands
//! notices to the machine's [`Sink`]. Glue only — every decision is the
//! machine's; the runner only keeps the contract: drain commands after
//! every `handle*`, sleep until `poll_timeout`, stop with the machine's stop
//! input, end when it `is_finished()`, pause it while its consumer is full.

use super::delivery::Delivery;
use super::exec;
use super::handle::{Control, Finished, MachineHandle, Sink};
use super::health::{self, Suspicion};
use super::holdings::Holdings;
use super::{no_answer, Shared};
use crate::feed_queue::{Offer, RELIEF_POLL};
use etcd_client as ec;
use fleetcoord_sm::{Command, KeyRange, Machine, Request, Response, RpcError, RpcId, RpcReply};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

/// A machine with everything it needs to run: its inputs, where its notices
/// go, and whom to tell when it finished.
pub(crate) struct MachineTask<M: Machine> {
    machine: M,
    /// User requests; when every sender is gone the machine is stopped.
    inputs: mpsc::UnboundedReceiver<Control<M::Input>>,
    sink: Box<dyn Sink<M::Notice>>,
    finished: crossbeam_channel::Sender<Finished>,
}

impl<M> MachineTask<M>
where
    M: Machine + Send + 'static,
    M::Input: Send + 'static,
    M::Notice: Send + 'static,
{
    /// The task for `machine` and the primitive's handle on it.
    pub(crate) fn new(
        machine: M,
        sink: impl Sink<M::Notice> + 'static,
    ) -> (MachineTask<M>, MachineHandle<M>) {
        let (input_tx, inputs) = mpsc::unbounded_channel();
        let (finished, finished_rx) = crossbeam_channel::bounded(1);
        (
            MachineTask {
                machine,
                inputs,
                sink: Box::new(sink),
                finished,
            },
            MachineHandle::new(input_tx, finished_rx),
        )
    }
}

/// A machine task with its type erased, as the driver receives it.
pub(crate) trait Runnable: Send {
    /// The task's future on the driver runtime.
    fn run(self: Box<Self>, shared: Shared) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

impl<M> Runnable for MachineTask<M>
where
    M: Machine + Send + 'static,
    M::Input: Send + 'static,
    M::Notice: Send + 'static,
{
    fn run(self: Box<Self>, shared: Shared) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(run(shared, *self))
    }
}

/// Slack beyond one request timeout that a stopping machine gets to finish
/// (revoke, resign) before the runner gives up on it; a dead etcd must not
/// block shutdown forever, but a slow one should still see the revoke.
const STOP_SLACK: Duration = Duration::from_secs(1);

pub(crate) async fn run<M>(shared: Shared, task: MachineTask<M>)
where
    M: Machine + Send + 'static,
    M::Input: Send,
    M::Notice: Send,
{
    let MachineTask {
        mut machine,
        mut inputs,
        mut sink,
        finished,
    } = task;
    let (reply_tx, mut replies) = mpsc::unbounded_channel::<Delivery>();
    let mut inflight: HashMap<RpcId, AbortHandle> = HashMap::new();
    let mut shutdown = shared.shutdown.clone();
    let mut stop_deadline: Option<tokio::time::Instant> = None;
    let mut paused = false;
    let mut last_now = Instant::now();
    let stop_grace = shared.options.request_timeout.saturating_add(STOP_SLACK);
    let stop = |machine: &mut M, last_now: Instant, deadline: &mut Option<tokio::time::Instant>| {
        if deadline.is_none() {
            // `request_timeout` is bounded when the handle is built, so the
            // sum fits; checked all the same, because a panic here would
            // take the whole driver down. A grace too long to represent is
            // as good as a year, and `deadline` must be `Some` from here
            // on: it is also the "stopping" flag.
            let now = tokio::time::Instant::now();
            *deadline = Some(
                now.checked_add(stop_grace)
                    .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
                    .unwrap_or(now),
            );
            machine.handle(last_now, M::stop_input());
        }
    };

    let outcome = loop {
        // Whether a request was started and not yet given the chance to go
        // out: a machine that asks for something before it notifies (the
        // watch's next snapshot page) wants etcd working on it while the
        // notices are delivered, so the runner yields once before the first
        // of them; the request's task then writes it to the connection.
        let mut unsent = false;
        while let Some(command) = machine.poll_command() {
            match command {
                Command::Rpc { id, request } => {
                    start_rpc(&shared, id, request, &reply_tx, &mut inflight);
                    unsent = true;
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
                    if std::mem::take(&mut unsent) {
                        tokio::task::yield_now().await;
                    }
                    if !sink.deliver(n) {
                        // Nobody listens any more: stop as if asked.
                        last_now = Instant::now().max(last_now);
                        stop(&mut machine, last_now, &mut stop_deadline);
                    }
                }
            }
        }
        if machine.is_finished() {
            break Finished::Done;
        }
        if stop_deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            log::warn!("machine did not finish stopping within {stop_grace:?}; abandoning it");
            break Finished::Abandoned;
        }
        if !paused && stop_deadline.is_none() && sink.is_full() {
            if let Some(pause) = M::consumer_full_input() {
                paused = true;
                last_now = Instant::now().max(last_now);
                machine.handle(last_now, pause);
                continue;
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
            delivery = replies.recv() => {
                // The runner holds a sender itself, so this never ends.
                let Some(Delivery { reply, last }) = delivery else { break Finished::Abandoned };
                if last {
                    inflight.remove(&reply.id);
                }
                last_now = Instant::now().max(last_now);
                fire_due_timers(&mut machine, last_now);
                machine.handle(last_now, reply.into());
            }
            control = inputs.recv(), if stop_deadline.is_none() => {
                last_now = Instant::now().max(last_now);
                fire_due_timers(&mut machine, last_now);
                match control {
                    Some(Control::Input(input)) => machine.handle(last_now, input),
                    // Asked to stop, or every handle is gone.
                    Some(Control::Stop) | None => stop(&mut machine, last_now, &mut stop_deadline),
                }
            }
            _ = shutdown.changed(), if stop_deadline.is_none() => {
                last_now = Instant::now().max(last_now);
                stop(&mut machine, last_now, &mut stop_deadline);
            }
            // Lazy: select! builds the futures of disabled branches too,
            // and a `Sleep` is not free to build (a clock read, a handle).
            _ = async { tokio::time::sleep(RELIEF_POLL).await }, if paused && stop_deadline.is_none() => {
                match sink.relieve() {
                    Offer::Taken => {
                        paused = false;
                        if let Some(resume) = M::consumer_ready_input() {
                            last_now = Instant::now().max(last_now);
                            machine.handle(last_now, resume);
                        }
                    }
                    Offer::Full(()) => {}
                    Offer::Gone => {
                        last_now = Instant::now().max(last_now);
                        stop(&mut machine, last_now, &mut stop_deadline);
                    }
                }
            }
            _ = sleep(sleep_until) => {
                last_now = Instant::now().max(last_now);
                machine.handle_timeout(last_now);
            }
        }
    };
    for (_, handle) in inflight.drain() {
        handle.abort();
    }
    // The sink goes before `finished` is signalled, so that whoever waits
    // for it (a `HostWatcher::close`) finds the feed's channel already
    // disconnected, not about to be.
    drop(sink);
    let _ = finished.try_send(outcome);
}

/// The contract's rule: `handle` never fires timers, so a driver with an
/// input at `now` fires the timers due by then first. (The select above is
/// biased towards replies, which may be ready together with a due timer.)
fn fire_due_timers<M: Machine>(machine: &mut M, now: Instant) {
    if machine.poll_timeout().is_some_and(|at| at <= now) {
        machine.handle_timeout(now);
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
    reply_tx: &mpsc::UnboundedSender<Delivery>,
    inflight: &mut HashMap<RpcId, AbortHandle>,
) {
    let reply_tx = reply_tx.clone();
    match request {
        Request::Watch {
            range,
            start_revision,
        } => {
            let client = shared.client.clone();
            let suspicion = shared.suspicion.clone();
            let holdings = shared.holdings.clone();
            let handle = tokio::spawn(watch(
                client,
                id,
                range,
                start_revision,
                suspicion,
                holdings,
                reply_tx,
            ));
            inflight.insert(id, handle.abort_handle());
        }
        // Renewals are not tracked in flight: the renewer answers each
        // exactly once (see `renewer`).
        Request::KeepAlive { lease } => shared.renewals.renew(lease, id, &reply_tx),
        request => {
            if let Request::Revoke { lease } = &request {
                // Renewals queued for this lease must not reach etcd after
                // the revoke: the renewer drops them first.
                shared.renewals.forget(*lease);
            }
            let client = shared.client.clone();
            let timeout = shared.options.request_timeout;
            let suspicion = shared.suspicion.clone();
            let removals = shared.removals.clone();
            let handle = tokio::spawn(async move {
                let resend = health::may_send_twice(&request);
                let attempt = || {
                    let mut client = client.clone();
                    let request = &request;
                    async move { exec::unary(&mut client, request).await }
                };
                let result = health::routed(&suspicion, &removals, timeout, resend, attempt)
                    .await
                    .unwrap_or_else(|| Err(no_answer(timeout)));
                let _ = reply_tx.send(Delivery {
                    reply: RpcReply { id, result },
                    last: true,
                });
            });
            inflight.insert(id, handle.abort_handle());
        }
    }
}

/// One watch: forwards every response until etcd cancels it, the stream
/// breaks, or the machine cancels it (abort). A watch etcd refuses at once
/// is answered with the refusal as an error ([`exec::watch_refusal`]); one
/// refused for an expired token is opened again once after logging in
/// again, since etcd-client's token refresh never sees it
/// (docs/etcd-notes.md, "Token expiry"). Every event is shown to the
/// handle's [`Holdings`] before it is handed on, so a holding this watch
/// shows over ends before this watch's consumer hears of it.
async fn watch(
    client: ec::Client,
    id: RpcId,
    range: KeyRange,
    start_revision: i64,
    suspicion: Suspicion,
    holdings: std::sync::Arc<Holdings>,
    reply_tx: mpsc::UnboundedSender<Delivery>,
) {
    let (key, options) = exec::watch_options(&range, start_revision);
    let mut watches = client
        .watch_client()
        .max_decoding_message_size(exec::WATCH_RESPONSE_LIMIT);
    let mut logged_in_again = false;
    'open: loop {
        crate::metrics::watch_stream_opened();
        let mut stream = match exec::on_a_live_member!(
            watches.watch(key.clone(), Some(options.clone())).await
        ) {
            Ok(s) => s,
            Err(e) => {
                let _ = reply_tx.send(Delivery {
                    reply: RpcReply {
                        id,
                        result: Err(exec::rpc_error(e)),
                    },
                    last: true,
                });
                return;
            }
        };
        loop {
            let (result, last) = match stream.message().await {
                Ok(Some(r)) => match exec::watch_refusal(&r) {
                    Some(RpcError::Unauthenticated(_)) if !logged_in_again => {
                        logged_in_again = true;
                        match client.refresh_token().await {
                            Ok(()) => continue 'open,
                            Err(e) => (Err(exec::rpc_error(e)), true),
                        }
                    }
                    Some(refused) => (Err(refused), true),
                    None => {
                        let response = exec::watch_response(&r);
                        if let Response::WatchEvents { events } = &response {
                            holdings.saw(events);
                        }
                        // etcd ends a watch by cancelling it; nothing follows.
                        let last = matches!(response, Response::WatchCanceled { .. });
                        (Ok(response), last)
                    }
                },
                // A broken stream may mean a member went away: check them all.
                Ok(None) => {
                    suspicion.raise();
                    (
                        Err(RpcError::Unavailable("watch stream ended".into())),
                        true,
                    )
                }
                Err(e) => {
                    suspicion.raise();
                    (Err(exec::rpc_error(e)), true)
                }
            };
            let reply = RpcReply { id, result };
            if reply_tx.send(Delivery { reply, last }).is_err() || last {
                return;
            }
        }
    }
}
