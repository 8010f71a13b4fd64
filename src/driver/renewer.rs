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
//! Every decision that takes (queues, deadlines, TTL 0 for a lease missing
//! when a stream opens, dropping a silent stream, forgetting a lease before
//! its revoke) is `fleetcoord_sm::renewals`'s, stated and tested there;
//! this task only does the stream's I/O: it feeds that machine what
//! happened and carries out its commands. Decisions about the leases
//! themselves (when to renew, what a failure means) stay in the keepalive
//! machine.

use super::delivery::Delivery;
use super::exec;
use super::health::Suspicion;
use etcd_client as ec;
use fleetcoord_sm::renewals::{self, RenewalsCommand, RenewalsInput};
use fleetcoord_sm::{LeaseId, Response, RpcError, RpcId, RpcReply};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// The renewer's end for the machine runners: where renewals are sent.
#[derive(Clone)]
pub(crate) struct Renewals {
    tx: mpsc::UnboundedSender<Message>,
}

enum Message {
    Renew(LeaseId, Waiter),
    Forget(LeaseId),
}

/// Who waits for one renewal's answer: the machine that asked, under `id`.
/// The renewals machine carries it as its token and hands it back with the
/// answer.
struct Waiter {
    id: RpcId,
    reply: mpsc::UnboundedSender<Delivery>,
    /// When the renewer was asked, for the request metrics.
    started: Instant,
}

impl Waiter {
    fn answer(self, ttl: Result<i64, RpcError>) {
        let result = ttl.map(|ttl_secs| Response::KeptAlive { ttl_secs });
        crate::metrics::request("keepalive", self.started.elapsed(), &result);
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
        let waiter = Waiter {
            id,
            reply: reply.clone(),
            started: Instant::now(),
        };
        if let Err(mpsc::error::SendError(Message::Renew(_, w))) =
            self.tx.send(Message::Renew(lease, waiter))
        {
            w.answer(Err(RpcError::Unavailable("renewal stream closed".into())));
        }
    }

    /// `lease` is about to be revoked: send no renewal of it that is still
    /// waiting for the stream.
    pub(super) fn forget(&self, lease: LeaseId) {
        let _ = self.tx.send(Message::Forget(lease));
    }
}

/// How long after a fault the stream may wait before it opens again
/// (`fleetcoord_sm::renewals`, rule 12), picked per handle from a seed of
/// its own. A member restart ends the streams of every handle connected
/// to it at one instant, and each handle's keepalives retry within their
/// first backoff (50-100 ms): without a spread, thousands of processes
/// reopen their streams at the surviving members in the same 50 ms. Over
/// 500 ms they arrive at a tenth of that rate. 500 ms is a tenth of the
/// default 5 s TTL: a keepalive keeps at least half of a lease's remaining
/// lifetime for its retries (`fleetcoord_sm::keepalive`, rule 1), so the
/// wait costs a lease only where a stream breaks within a few hundred ms
/// of its deadline anyway. The machine caps it at a quarter of the
/// request timeout.
pub(crate) const REOPEN_SPREAD: Duration = Duration::from_millis(500);

type Opened = Result<(ec::LeaseKeeper, ec::LeaseKeepAliveStream), RpcError>;
type Opening = Pin<Box<dyn Future<Output = Opened> + Send>>;

/// The renewer task and the handle to it. The task ends when the driver
/// shuts down or every handle is gone.
pub(crate) fn start(
    client: ec::Client,
    timeout: Duration,
    suspicion: Suspicion,
    shutdown: watch::Receiver<bool>,
) -> (Renewals, impl Future<Output = ()> + Send) {
    let (tx, rx) = mpsc::unbounded_channel();
    let now = Instant::now();
    let renewer = Renewer {
        client,
        suspicion,
        machine: renewals::Renewals::new(timeout, now)
            .with_reopen_spread(REOPEN_SPREAD, super::rand_seed()),
        last_now: now,
        keeper: None,
        responses: None,
        opening: None,
    };
    (Renewals { tx }, renewer.run(rx, shutdown))
}

struct Renewer {
    client: ec::Client,
    suspicion: Suspicion,
    machine: renewals::Renewals<Waiter>,
    /// The last instant fed to the machine: its time never goes back.
    last_now: Instant,
    /// The open stream's request side and replies; both or neither.
    keeper: Option<ec::LeaseKeeper>,
    responses: Option<ec::LeaseKeepAliveStream>,
    /// The stream being opened.
    opening: Option<Opening>,
}

impl Renewer {
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Message>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        // Kept across turns (see `runner::run`): a turn per reply would
        // otherwise register a fresh shutdown waiter and timer each time.
        let stopped = async move {
            loop {
                // An error means the sender is gone: a shutdown as well.
                if shutdown.changed().await.is_err() || *shutdown.borrow() {
                    break;
                }
            }
        };
        tokio::pin!(stopped);
        let timer = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(timer);
        let mut armed: Option<Instant> = None;
        loop {
            self.execute();
            if self.write() {
                self.execute();
            }
            let deadline = self.machine.poll_timeout();
            if deadline != armed {
                if let Some(at) = deadline {
                    timer.as_mut().reset(tokio::time::Instant::from_std(at));
                }
                armed = deadline;
            }
            tokio::select! {
                biased;
                () = &mut stopped => break,
                message = rx.recv() => {
                    let Some(message) = message else { break };
                    self.take(message);
                    // Renewals due at one instant arrive together: take
                    // them all before writing, so one write carries them.
                    while let Ok(message) = rx.try_recv() {
                        self.take(message);
                    }
                }
                opened = opening(&mut self.opening) => {
                    self.opening = None;
                    match opened {
                        Ok((keeper, responses)) => {
                            self.keeper = Some(keeper);
                            self.responses = Some(responses);
                            self.feed(RenewalsInput::Opened);
                        }
                        Err(error) => self.feed(RenewalsInput::OpenFailed { error }),
                    }
                }
                reply = message(&mut self.responses) => {
                    let mut reply = Some(reply);
                    // Replies come in bursts (a grid step's renewals were
                    // written together): take every one already read
                    // before turning again, as with renewals above.
                    while let Some(r) = reply.take() {
                        let more = matches!(r, Ok(Some(_)));
                        self.feed(match r {
                            Ok(Some(r)) => RenewalsInput::Reply { lease: r.id(), ttl_secs: r.ttl() },
                            Ok(None) => RenewalsInput::Ended,
                            Err(e) => RenewalsInput::Failed { error: exec::rpc_error(e) },
                        });
                        // Answered now, not at the next turn: the machine
                        // may have dropped the stream (then none is read).
                        self.execute();
                        if more {
                            reply = ready_message(&mut self.responses).await;
                        }
                    }
                }
                () = room(&self.keeper), if self.machine.wants_to_write() => {}
                () = &mut timer, if armed.is_some() => {
                    armed = None;
                    let now = self.now();
                    self.machine.handle_timeout(now);
                }
            }
        }
        self.feed(RenewalsInput::Stop);
        self.execute();
    }

    fn take(&mut self, message: Message) {
        match message {
            // A renewal's request timeout runs from when it was asked for,
            // not from when this task got to it (as long as time does not
            // go back for the machine).
            Message::Renew(lease, token) => {
                let asked = token.started.max(self.last_now);
                self.feed_at(asked, RenewalsInput::Renew { lease, token });
            }
            Message::Forget(lease) => self.feed(RenewalsInput::Forget { lease }),
        }
    }

    fn now(&mut self) -> Instant {
        self.last_now = Instant::now().max(self.last_now);
        self.last_now
    }

    fn feed(&mut self, input: RenewalsInput<Waiter>) {
        let now = self.now();
        self.feed_at(now, input);
    }

    /// Feeds `input` at `now`, after the timers due by then (the machine's
    /// `handle` never fires them).
    fn feed_at(&mut self, now: Instant, input: RenewalsInput<Waiter>) {
        self.last_now = now.max(self.last_now);
        let now = self.last_now;
        if self.machine.poll_timeout().is_some_and(|at| at <= now) {
            self.machine.handle_timeout(now);
        }
        self.machine.handle(now, input);
    }

    /// Carries out the machine's commands, in order.
    fn execute(&mut self) {
        while let Some(command) = self.machine.poll_command() {
            match command {
                RenewalsCommand::Open { lease } => {
                    self.opening = Some(open(self.client.clone(), lease));
                }
                RenewalsCommand::Drop => {
                    self.keeper = None;
                    self.responses = None;
                    self.opening = None;
                }
                RenewalsCommand::Answer { token, ttl } => token.answer(ttl),
                RenewalsCommand::Suspect => self.suspicion.raise(),
            }
        }
    }

    /// Writes what the machine hands out while the open stream has room.
    /// Returns whether the machine was told something (the stream closed),
    /// so that its commands are due.
    fn write(&mut self) -> bool {
        let Some(keeper) = &self.keeper else {
            return false;
        };
        let mut closed = false;
        while self.machine.wants_to_write() {
            match keeper.sender.try_reserve() {
                Ok(permit) => {
                    let Some(lease) = self.machine.poll_write() else {
                        break;
                    };
                    let mut request = blank(&keeper.sender);
                    request.id = lease;
                    permit.send(request);
                }
                // Written once the stream has room (`room`).
                Err(mpsc::error::TrySendError::Full(())) => break,
                Err(mpsc::error::TrySendError::Closed(())) => {
                    closed = true;
                    break;
                }
            }
        }
        if closed {
            self.feed(RenewalsInput::Closed);
        }
        closed
    }
}

/// A default request of the stream's own message type: etcd-client
/// exports `LeaseKeeper::sender` (feature `pub-response-field`) but not the
/// request type (`LeaseKeepAliveRequest { id }`), which is only named here
/// through the sender.
fn blank<T: Default>(_: &mpsc::Sender<T>) -> T {
    T::default()
}

/// Opens a stream whose opening request renews `lease`; the machine gives
/// up on it at its deadline by dropping it.
fn open(client: ec::Client, lease: LeaseId) -> Opening {
    Box::pin(async move {
        let mut c = client;
        exec::on_a_live_member!(c.lease_keep_alive(lease).await).map_err(exec::rpc_error)
    })
}

async fn opening(opening: &mut Option<Opening>) -> Opened {
    match opening {
        Some(f) => f.await,
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
        // The permit is dropped unused: `write` sends right after.
        Some(k) => {
            if k.sender.reserve().await.is_err() {
                // Closed: `write` finds out and tells the machine.
            }
        }
        None => std::future::pending().await,
    }
}

/// The open stream's next reply if it is already read, without waiting:
/// polled once with this task's waker, so a `None` leaves the stream
/// registered to wake the task as [`message`] would.
async fn ready_message(
    responses: &mut Option<ec::LeaseKeepAliveStream>,
) -> Option<Result<Option<ec::LeaseKeepAliveResponse>, ec::Error>> {
    let stream = responses.as_mut()?;
    let next = stream.message();
    tokio::pin!(next);
    std::future::poll_fn(|cx| match next.as_mut().poll(cx) {
        std::task::Poll::Ready(reply) => std::task::Poll::Ready(Some(reply)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
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

    /// Guarantee 6 of `fleetcoord_sm::renewals` against a real etcd: a
    /// renewal etcd answers with a positive TTL before the lease's revoke,
    /// the answer held up (a slow link) until after the revoke. The renewal
    /// is answered at the forget, never with that TTL.
    #[test]
    fn an_answer_etcd_sent_before_the_revoke_never_reaches_the_renewal() {
        const HOLD: Duration = Duration::from_millis(400);
        let server = EtcdServer::start().expect("etcd");
        let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
        runtime().block_on(async {
            let lease = grant(&server.endpoint()).await;
            let mut direct = ec::Client::connect([server.endpoint()], None)
                .await
                .expect("connect");
            let mut rig = Rig::start(&proxy.endpoint(), WAIT).await;
            rig.renew(lease);
            assert!(kept_alive(&rig.answer().await.1) > 0);

            // Every byte now takes HOLD each way: the renewal reaches etcd
            // HOLD after it is written, its answer HOLD after that.
            proxy.set_mode(Mode::Delay(HOLD));
            let stale = rig.renew(lease);
            let written = tokio::time::Instant::now();
            // etcd has renewed (and answered) by now; the answer is still
            // on its way. The driver revokes: forget first, as it does.
            tokio::time::sleep(HOLD + HOLD / 2).await;
            let keys_before = direct
                .lease_time_to_live(lease, None)
                .await
                .expect("ttl")
                .ttl();
            assert!(keys_before > 0, "the lease lives until the revoke");
            rig.renewals.forget(lease);
            direct.lease_revoke(lease).await.expect("revoke");
            let (id, result) = rig.answer().await;
            assert_eq!(id, stale);
            assert_eq!(unavailable(result), "the lease is being revoked");
            assert!(
                written.elapsed() < HOLD * 2,
                "answered at the forget, not when etcd's answer came"
            );
            // etcd's answer (TTL above zero, from before the revoke)
            // arrives now and reaches nobody.
            rig.silent_for(HOLD * 2).await;
            // A renewal after the revoke gets etcd's answer to itself.
            proxy.set_mode(Mode::Pass);
            rig.renew(lease);
            assert_eq!(kept_alive(&rig.answer().await.1), 0);
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
