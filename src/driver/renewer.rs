//! One lease renewal stream per connection, shared by every lease the
//! driver keeps alive.
//!
//! etcd's `LeaseKeepAlive` stream takes any lease id in each request and
//! answers every request, in order, with the id and the TTL it granted (0
//! for a lease it does not have). So a thousand leases need one stream, not
//! a thousand: each stream of its own cost a task (14 KiB) and tonic's two
//! 8 KiB stream buffers per lease, 30 of the 44 KiB a `HostLiveness` cost
//! beyond a raw etcd-client keepalive (measured with a counting allocator,
//! 1,000 hosts on one `Etcd`).
//!
//! What each renewal gets is unchanged from a stream per lease: exactly one
//! reply — the TTL etcd answered, or an error — within the request timeout.
//! * A renewal without an answer for a whole request timeout means the
//!   stream answers nothing (answers come in order): it is failed with a
//!   timeout, the handle's health monitor is told ([`Suspicion`]), and the
//!   stream is dropped; the renewals still waiting on it fail at once, and
//!   the next renewal opens a fresh stream.
//! * A stream that breaks or ends fails every renewal waiting on it.
//! * Opening a stream renews its first lease once (etcd-client reads that
//!   answer itself); when etcd has no such lease the renewals of that lease
//!   are answered with TTL 0, as etcd would, and the stream is opened again
//!   for the others. Any other failure to open fails every renewal waiting
//!   for the stream.
//! * A revoke first makes the renewer forget the lease: renewals of it not
//!   yet written to the stream are failed, never sent after the revoke.
//!
//! Decisions (when to renew, what a failure means) stay in the keepalive
//! machine; this only multiplexes.

use super::exec;
use super::health::Suspicion;
use super::runner::Delivery;
use etcd_client as ec;
use fleetcoord_sm::{LeaseId, Response, RpcError, RpcId, RpcReply};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The renewer's end for the machine runners: where renewals are sent.
#[derive(Clone)]
pub(crate) struct Renewals {
    tx: mpsc::UnboundedSender<Message>,
}

enum Message {
    Renew(Renewal),
    Forget(LeaseId),
}

/// One renewal asked for by a machine, answered on `reply` with `id`.
struct Renewal {
    lease: LeaseId,
    id: RpcId,
    reply: mpsc::UnboundedSender<Delivery>,
    /// When the renewer took it: its request timeout runs from here.
    started: Instant,
}

impl Renewal {
    fn answer(self, result: Result<Response, RpcError>) {
        let elapsed = self.started.elapsed();
        crate::metrics::request("keepalive", elapsed, &result);
        let reply = RpcReply {
            id: self.id,
            result,
        };
        // The machine may have ended meanwhile; nobody wants the answer then.
        let _ = self.reply.send(Delivery { reply, last: true });
    }
}

impl Renewals {
    /// Renew `lease`; the answer goes to `reply` under `id`.
    pub(super) fn renew(&self, lease: LeaseId, id: RpcId, reply: &mpsc::UnboundedSender<Delivery>) {
        let renewal = Renewal {
            lease,
            id,
            reply: reply.clone(),
            started: Instant::now(),
        };
        if let Err(mpsc::error::SendError(Message::Renew(r))) =
            self.tx.send(Message::Renew(renewal))
        {
            r.answer(Err(RpcError::Unavailable("renewal stream closed".into())));
        }
    }

    /// `lease` is about to be revoked: send no renewal of it that is still
    /// waiting for the stream.
    pub(super) fn forget(&self, lease: LeaseId) {
        let _ = self.tx.send(Message::Forget(lease));
    }
}

type Opening = Pin<
    Box<dyn Future<Output = Result<(ec::LeaseKeeper, ec::LeaseKeepAliveStream), RpcError>> + Send>,
>;

/// The renewer task and the handle to it. The task ends when the driver
/// shuts down or every handle is gone.
pub(crate) fn start(
    client: ec::Client,
    timeout: Duration,
    suspicion: Suspicion,
    shutdown: watch::Receiver<bool>,
) -> (Renewals, impl Future<Output = ()> + Send) {
    let (tx, rx) = mpsc::unbounded_channel();
    let renewer = Renewer {
        client,
        timeout,
        suspicion,
        keeper: None,
        responses: None,
        opening: None,
        unsent: VecDeque::new(),
        sent: VecDeque::new(),
    };
    (Renewals { tx }, renewer.run(rx, shutdown))
}

struct Renewer {
    client: ec::Client,
    timeout: Duration,
    suspicion: Suspicion,
    /// The open stream's request side and answers; both or neither.
    keeper: Option<ec::LeaseKeeper>,
    responses: Option<ec::LeaseKeepAliveStream>,
    /// A stream being opened, and the lease its opening request renews.
    opening: Option<(LeaseId, Opening)>,
    /// Taken, not yet written to a stream (none open, or its queue full).
    unsent: VecDeque<Renewal>,
    /// Written to the open stream, in the order etcd answers them.
    sent: VecDeque<Renewal>,
}

impl Renewer {
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Message>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            self.flush();
            if self.keeper.is_none() && self.opening.is_none() {
                if let Some(first) = self.unsent.front() {
                    let lease = first.lease;
                    self.opening = Some((lease, open(self.client.clone(), lease, self.timeout)));
                }
            }
            // Answers come in order, so the oldest renewal times out first.
            let oldest = self
                .sent
                .front()
                .into_iter()
                .chain(self.unsent.front())
                .map(|r| r.started)
                .min();
            let give_up = oldest.map(|t| t + self.timeout);
            tokio::select! {
                biased;
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        break;
                    }
                }
                message = rx.recv() => match message {
                    Some(Message::Renew(r)) => self.unsent.push_back(r),
                    Some(Message::Forget(lease)) => self.forget(lease),
                    None => break,
                },
                (lease, opened) = opening(&mut self.opening) => {
                    self.opening = None;
                    self.opened(lease, opened);
                }
                answer = message(&mut self.responses) => self.answered(answer),
                () = room(&self.keeper), if !self.unsent.is_empty() => {}
                () = sleep(give_up) => self.time_out(),
            }
        }
        let gone = || Err(RpcError::Unavailable("the driver is shutting down".into()));
        for r in self.sent.drain(..).chain(self.unsent.drain(..)) {
            r.answer(gone());
        }
    }

    /// Writes what waits to the open stream, in order, while it has room.
    fn flush(&mut self) {
        let Some(keeper) = &self.keeper else { return };
        while let Some(r) = self.unsent.pop_front() {
            let mut request = blank(&keeper.sender);
            request.id = r.lease;
            match keeper.sender.try_send(request) {
                Ok(()) => self.sent.push_back(r),
                Err(mpsc::error::TrySendError::Full(_)) => {
                    // Written once the stream has room (`room`).
                    self.unsent.push_front(r);
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    self.unsent.push_front(r);
                    self.reset(RpcError::Unavailable("renewal stream closed".into()));
                    return;
                }
            }
        }
    }

    fn forget(&mut self, lease: LeaseId) {
        let (gone, keep): (VecDeque<_>, VecDeque<_>) =
            self.unsent.drain(..).partition(|r| r.lease == lease);
        self.unsent = keep;
        for r in gone {
            r.answer(Err(RpcError::Unavailable(
                "the lease is being revoked".into(),
            )));
        }
    }

    fn opened(
        &mut self,
        lease: LeaseId,
        opened: Result<(ec::LeaseKeeper, ec::LeaseKeepAliveStream), RpcError>,
    ) {
        match opened {
            Ok((keeper, responses)) => {
                self.keeper = Some(keeper);
                self.responses = Some(responses);
            }
            Err(RpcError::LeaseNotFound) => {
                // etcd has no such lease: that is the answer for its
                // renewals; the others wait for the next stream.
                let (gone, keep): (VecDeque<_>, VecDeque<_>) =
                    self.unsent.drain(..).partition(|r| r.lease == lease);
                self.unsent = keep;
                for r in gone {
                    r.answer(Ok(Response::KeptAlive { ttl_secs: 0 }));
                }
            }
            Err(e) => {
                for r in self.unsent.drain(..) {
                    r.answer(Err(e.clone()));
                }
            }
        }
    }

    fn answered(&mut self, answer: Result<Option<ec::LeaseKeepAliveResponse>, ec::Error>) {
        match answer {
            Ok(Some(a)) => {
                // etcd answers in order; the first renewal of this lease is
                // the one answered.
                if let Some(at) = self.sent.iter().position(|r| r.lease == a.id()) {
                    if let Some(r) = self.sent.remove(at) {
                        r.answer(Ok(Response::KeptAlive { ttl_secs: a.ttl() }));
                    }
                }
            }
            Ok(None) => self.reset(RpcError::Unavailable("renewal stream ended".into())),
            Err(e) => self.reset(exec::rpc_error(e)),
        }
    }

    fn time_out(&mut self) {
        let now = Instant::now();
        let due = |r: &Renewal| r.started + self.timeout <= now;
        let error = RpcError::Unavailable(format!("no renewal answer within {:?}", self.timeout));
        let stuck = self.sent.front().is_some_and(due);
        let (late, keep): (VecDeque<_>, VecDeque<_>) = self.unsent.drain(..).partition(due);
        self.unsent = keep;
        if stuck || !late.is_empty() {
            self.suspicion.raise();
        }
        for r in late {
            r.answer(Err(error.clone()));
        }
        if stuck {
            // Nothing came back for a whole timeout: a fresh stream for
            // whatever follows.
            self.reset(error);
        } else if self.unsent.is_empty() {
            self.opening = None;
        }
    }

    /// Drops the stream and fails every renewal written to it.
    fn reset(&mut self, error: RpcError) {
        self.keeper = None;
        self.responses = None;
        for r in self.sent.drain(..) {
            r.answer(Err(error.clone()));
        }
    }
}

/// A default request of the stream's own message type: etcd-client
/// exports `LeaseKeeper::sender` (feature `pub-response-field`) but not the
/// request type (`LeaseKeepAliveRequest { id }`), which is only named here
/// through the sender.
fn blank<T: Default>(_: &mpsc::Sender<T>) -> T {
    T::default()
}

fn open(client: ec::Client, lease: LeaseId, timeout: Duration) -> Opening {
    Box::pin(async move {
        let mut c = client;
        let opened = tokio::time::timeout(timeout, async {
            exec::on_a_live_member!(c.lease_keep_alive(lease).await)
        })
        .await;
        match opened {
            Ok(r) => r.map_err(exec::rpc_error),
            Err(_) => Err(RpcError::Unavailable(format!(
                "no renewal answer within {timeout:?}"
            ))),
        }
    })
}

async fn opening(
    opening: &mut Option<(LeaseId, Opening)>,
) -> (
    LeaseId,
    Result<(ec::LeaseKeeper, ec::LeaseKeepAliveStream), RpcError>,
) {
    match opening {
        Some((lease, f)) => (*lease, f.await),
        None => std::future::pending().await,
    }
}

async fn message(
    responses: &mut Option<ec::LeaseKeepAliveStream>,
) -> Result<Option<ec::LeaseKeepAliveResponse>, ec::Error> {
    match responses {
        Some(s) => s.message().await,
        None => std::future::pending().await,
    }
}

/// Resolves once the open stream can take another request.
async fn room(keeper: &Option<ec::LeaseKeeper>) {
    match keeper {
        // The permit is dropped unused: `flush` sends right after.
        Some(k) => {
            if k.sender.reserve().await.is_err() {
                // Closed: `flush` finds out and resets.
            }
        }
        None => std::future::pending().await,
    }
}

async fn sleep(until: Option<Instant>) {
    match until {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
