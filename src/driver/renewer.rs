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
                message = rx.recv() => {
                    let Some(message) = message else { break };
                    self.take(message);
                    // Renewals due at one instant arrive together: take
                    // them all before writing, so one write carries them.
                    while let Ok(message) = rx.try_recv() {
                        self.take(message);
                    }
                }
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

    fn take(&mut self, message: Message) {
        match message {
            Message::Renew(r) => self.unsent.push_back(r),
            Message::Forget(lease) => self.forget(lease),
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
            // A broken stream may mean a member went away: check them all.
            Ok(None) => {
                self.suspicion.raise();
                self.reset(RpcError::Unavailable("renewal stream ended".into()));
            }
            Err(e) => {
                self.suspicion.raise();
                self.reset(exec::rpc_error(e));
            }
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

/// The renewer against a real etcd, alone on a runtime of its own: each
/// renewal gets exactly one answer, whatever the stream does.
#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::testing::{EtcdServer, FaultProxy, Mode};

    /// Long enough that only a silent stream reaches it on a loaded CI
    /// machine; short enough to keep the tests quick.
    const TIMEOUT: Duration = Duration::from_secs(1);
    /// How long a test waits for an answer that must come.
    const WAIT: Duration = Duration::from_secs(10);
    const MISSING_LEASE: LeaseId = 0x0bad_1ea5e;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// A renewer on `endpoint` with a request timeout of `timeout`, and
    /// where its answers arrive.
    struct Rig {
        renewals: Renewals,
        suspicion: Suspicion,
        shutdown: watch::Sender<bool>,
        reply_tx: mpsc::UnboundedSender<Delivery>,
        replies: mpsc::UnboundedReceiver<Delivery>,
        task: tokio::task::JoinHandle<()>,
        next_id: u64,
    }

    impl Rig {
        async fn start(endpoint: &str, timeout: Duration) -> Rig {
            let client = ec::Client::connect([endpoint], None)
                .await
                .expect("lazy connect");
            let suspicion = Suspicion::default();
            let (shutdown, shutdown_rx) = watch::channel(false);
            let (renewals, renewer) = start(client, timeout, suspicion.clone(), shutdown_rx);
            let (reply_tx, replies) = mpsc::unbounded_channel();
            Rig {
                renewals,
                suspicion,
                shutdown,
                reply_tx,
                replies,
                task: tokio::spawn(renewer),
                next_id: 0,
            }
        }

        /// Ask for a renewal of `lease`; its id.
        fn renew(&mut self, lease: LeaseId) -> RpcId {
            self.next_id += 1;
            let id = RpcId(self.next_id);
            self.renewals.renew(lease, id, &self.reply_tx);
            id
        }

        /// The next answer, which must come within [`WAIT`].
        async fn answer(&mut self) -> (RpcId, Result<Response, RpcError>) {
            let delivery = tokio::time::timeout(WAIT, self.replies.recv())
                .await
                .expect("an answer in time")
                .expect("the rig holds a sender");
            assert!(delivery.last, "a renewal has exactly one answer");
            (delivery.reply.id, delivery.reply.result)
        }

        /// No answer arrives within `quiet`.
        async fn silent_for(&mut self, quiet: Duration) {
            if let Ok(extra) = tokio::time::timeout(quiet, self.replies.recv()).await {
                panic!("unexpected answer {:?}", extra.map(|d| d.reply));
            }
        }
    }

    async fn grant(endpoint: &str) -> LeaseId {
        let mut client = ec::Client::connect([endpoint], None)
            .await
            .expect("connect");
        client.lease_grant(30, None).await.expect("grant").id()
    }

    fn kept_alive(result: &Result<Response, RpcError>) -> i64 {
        match result {
            Ok(Response::KeptAlive { ttl_secs }) => *ttl_secs,
            other => panic!("not a renewal answer: {other:?}"),
        }
    }

    fn unavailable(result: Result<Response, RpcError>) -> String {
        match result {
            Err(RpcError::Unavailable(why)) => why,
            other => panic!("not Unavailable: {other:?}"),
        }
    }

    #[test]
    fn leases_share_one_stream_and_a_missing_lease_is_answered_ttl_zero() {
        let server = EtcdServer::start().expect("etcd");
        runtime().block_on(async {
            let lease = grant(&server.endpoint()).await;
            let mut rig = Rig::start(&server.endpoint(), WAIT).await;
            // The first stream opens on the missing lease: etcd refuses it,
            // which answers that renewal, and the live lease waits for the
            // next stream.
            let missing = rig.renew(MISSING_LEASE);
            let live = rig.renew(lease);
            let (id, result) = rig.answer().await;
            assert_eq!((id, kept_alive(&result)), (missing, 0));
            let (id, result) = rig.answer().await;
            assert_eq!(id, live);
            assert!(kept_alive(&result) > 0, "{result:?}");
            // On the open stream, etcd answers each in order, the missing
            // one again with TTL 0.
            let ids = [rig.renew(lease), rig.renew(MISSING_LEASE), rig.renew(lease)];
            let mut answers = Vec::new();
            for _ in ids {
                let (id, result) = rig.answer().await;
                answers.push((id, kept_alive(&result) > 0));
            }
            answers.sort_by_key(|(id, _)| id.0);
            assert_eq!(answers, [(ids[0], true), (ids[1], false), (ids[2], true)]);
            rig.silent_for(Duration::from_millis(200)).await;
        });
    }

    #[test]
    fn a_stream_that_answers_nothing_fails_its_renewal_and_the_next_opens_afresh() {
        let server = EtcdServer::start().expect("etcd");
        let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
        runtime().block_on(async {
            let lease = grant(&server.endpoint()).await;
            let mut rig = Rig::start(&proxy.endpoint(), TIMEOUT).await;
            rig.renew(lease);
            assert!(kept_alive(&rig.answer().await.1) > 0);

            proxy.set_mode(Mode::Blackhole);
            let stuck = rig.renew(lease);
            let (id, result) = rig.answer().await;
            assert_eq!(id, stuck);
            assert_eq!(
                unavailable(result),
                format!("no renewal answer within {TIMEOUT:?}")
            );
            // The health monitor is asked for a round of probes.
            tokio::time::timeout(WAIT, rig.suspicion.raised())
                .await
                .expect("suspicion raised");

            // The old connection lost bytes for good: drop it, and a new
            // renewal works on a fresh stream (its first attempt may still
            // see the broken connection).
            proxy.set_mode(Mode::Pass);
            proxy.reset_all();
            let started = tokio::time::Instant::now();
            loop {
                rig.renew(lease);
                match rig.answer().await.1 {
                    Ok(Response::KeptAlive { ttl_secs }) if ttl_secs > 0 => break,
                    other => {
                        assert!(
                            started.elapsed() < WAIT,
                            "no renewal after the fault: {other:?}"
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
    }

    #[test]
    fn a_stream_that_cannot_open_fails_the_renewals_waiting_for_it_in_time() {
        let server = EtcdServer::start().expect("etcd");
        let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
        proxy.set_mode(Mode::Blackhole);
        runtime().block_on(async {
            let mut rig = Rig::start(&proxy.endpoint(), TIMEOUT).await;
            let first = rig.renew(7);
            let second = rig.renew(8);
            // Before the renewer runs, so that the renewals' own timeouts
            // come (by a timer tick) before the timeout of the opening
            // they wait for.
            std::thread::sleep(Duration::from_millis(5));
            for expected in [first, second] {
                let (id, result) = rig.answer().await;
                assert_eq!(id, expected);
                assert_eq!(
                    unavailable(result),
                    format!("no renewal answer within {TIMEOUT:?}")
                );
            }
            rig.silent_for(Duration::from_millis(200)).await;
        });
    }

    #[test]
    fn a_refused_connection_fails_every_renewal_waiting_for_the_stream() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("addr").port()
        };
        runtime().block_on(async {
            let mut rig = Rig::start(&format!("http://127.0.0.1:{port}"), WAIT).await;
            let ids = [rig.renew(7), rig.renew(8)];
            for expected in ids {
                let (id, result) = rig.answer().await;
                assert_eq!(id, expected);
                let why = unavailable(result);
                assert!(!why.starts_with("no renewal answer"), "{why}");
            }
        });
    }

    #[test]
    fn a_broken_stream_fails_the_renewals_written_to_it_at_once() {
        let server = EtcdServer::start().expect("etcd");
        let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
        runtime().block_on(async {
            let lease = grant(&server.endpoint()).await;
            // A timeout no answer in this test gets near.
            let mut rig = Rig::start(&proxy.endpoint(), Duration::from_secs(60)).await;
            rig.renew(lease);
            assert!(kept_alive(&rig.answer().await.1) > 0);
            proxy.set_mode(Mode::Blackhole);
            let written = rig.renew(lease);
            // Let the renewer write it to the stream.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let started = tokio::time::Instant::now();
            proxy.reset_all();
            let (id, result) = rig.answer().await;
            assert_eq!(id, written);
            let why = unavailable(result);
            assert!(!why.starts_with("no renewal answer"), "{why}");
            assert!(started.elapsed() < WAIT);
        });
    }

    #[test]
    fn a_forgotten_lease_is_never_renewed_and_shutdown_answers_the_rest() {
        let server = EtcdServer::start().expect("etcd");
        let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
        proxy.set_mode(Mode::Blackhole);
        runtime().block_on(async {
            let mut rig = Rig::start(&proxy.endpoint(), Duration::from_secs(60)).await;
            // Both wait for a stream that cannot open.
            let revoked = rig.renew(7);
            let other = rig.renew(8);
            rig.renewals.forget(7);
            let (id, result) = rig.answer().await;
            assert_eq!(id, revoked);
            assert_eq!(unavailable(result), "the lease is being revoked");
            rig.silent_for(Duration::from_millis(200)).await;

            rig.shutdown.send(true).expect("renewer running");
            let (id, result) = rig.answer().await;
            assert_eq!(id, other);
            assert_eq!(unavailable(result), "the driver is shutting down");
            (&mut rig.task).await.expect("renewer ended");
            // With the renewer gone, a renewal is answered on the spot.
            let late = rig.renew(9);
            let (id, result) = rig.answer().await;
            assert_eq!(id, late);
            assert_eq!(unavailable(result), "renewal stream closed");
        });
    }

    #[test]
    fn a_burst_larger_than_the_stream_queue_is_answered_in_full() {
        let server = EtcdServer::start().expect("etcd");
        runtime().block_on(async {
            let lease = grant(&server.endpoint()).await;
            let mut rig = Rig::start(&server.endpoint(), WAIT).await;
            rig.renew(lease);
            assert!(kept_alive(&rig.answer().await.1) > 0);
            // More than etcd-client's queue of 100 requests, all at once.
            let ids: Vec<RpcId> = (0..300).map(|_| rig.renew(lease)).collect();
            let mut answered = Vec::new();
            for _ in &ids {
                let (id, result) = rig.answer().await;
                assert!(kept_alive(&result) > 0, "{result:?}");
                answered.push(id);
            }
            answered.sort_by_key(|id| id.0);
            assert_eq!(answered, ids);
            rig.silent_for(Duration::from_millis(200)).await;
        });
    }

    #[test]
    fn the_renewer_ends_once_every_handle_is_gone() {
        runtime().block_on(async {
            let rig = Rig::start("http://127.0.0.1:9", WAIT).await;
            // The shutdown sender stays: only the handles go.
            let Rig {
                renewals,
                task,
                shutdown,
                ..
            } = rig;
            drop(renewals);
            tokio::time::timeout(WAIT, task)
                .await
                .expect("ended without a shutdown")
                .expect("no panic");
            assert!(!*shutdown.borrow());
        });
    }
}
