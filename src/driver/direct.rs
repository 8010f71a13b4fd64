//! The etcd driver's unary calls on a connection their callers drive
//! ([`crate::caller_driven`]): a lone call crosses no thread, where the
//! driver's connection costs two wake-ups of another thread per call.
//!
//! What it adds for etcd:
//!
//! * **Only endpoints in use.** The connection is built on the endpoints
//!   the health monitor has in use ([`InUse`]), and built again once that
//!   set changes (its epoch), so a member taken out for not answering gets
//!   no call here either.
//! * **No pings.** Nobody reads the connection between calls, so an
//!   HTTP/2 ping would go unanswered and close a healthy connection: it is
//!   built with the probes' options (no pings) plus the user's login.
//!   Renewals and watches stay on the driver's connection.
//! * **Suspect means no answer.** A call that got no answer within the
//!   request timeout, or found the connection broken
//!   ([`RpcError::Unavailable`]), drops the connection; an error of etcd's
//!   own (a refusal, a missing lease) does not.
//! * **Never sent twice, but a read moved off a removed endpoint.** A
//!   call taken here answers as it ended; only a call that was not taken
//!   goes to the driver's connection, and a read or a revoke
//!   (`health::may_send_twice`) still unanswered when the health monitor
//!   takes an endpoint out of use (it may have gone there), which is sent
//!   again there. Any other write is never sent twice.

use super::connect::probe_options;
use super::explain::explain;
use super::health::Routed;
use super::{exec, health, EtcdTarget, UnaryError};
use crate::caller_driven::{CallerDriven, Health, Ran};
use etcd_client as ec;
use fleetcoord_sm::{Request, Response, RpcError};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The endpoints the health monitor has in use, numbered: each change gets
/// a new epoch, so a connection built on an older set is built again.
/// Each change that takes an endpoint out also counts a removal, which
/// reads in flight wait for ([`health::routed`]): the read may have been
/// sent to that endpoint, so it is sent again on those still in use.
pub(crate) struct InUse {
    epoch: AtomicU64,
    urls: Mutex<Vec<String>>,
    removals: watch::Sender<u64>,
}

impl Default for InUse {
    fn default() -> Self {
        InUse {
            epoch: AtomicU64::new(0),
            urls: Mutex::new(Vec::new()),
            removals: watch::channel(0).0,
        }
    }
}

impl InUse {
    /// Replaces the set (at connect, and the health monitor after each
    /// change, once the shared client follows it).
    pub(crate) fn set(&self, urls: Vec<String>) {
        let mut held = self.urls.lock();
        let removed = held.iter().any(|old| !urls.contains(old));
        *held = urls;
        self.epoch.fetch_add(1, Ordering::Release);
        drop(held);
        if removed {
            self.removals.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Tells of every later removal ([`health::routed`]).
    pub(crate) fn removals(&self) -> watch::Receiver<u64> {
        self.removals.subscribe()
    }

    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The set and its epoch, read together.
    fn read(&self) -> (u64, Vec<String>) {
        let held = self.urls.lock();
        (self.epoch(), held.clone())
    }
}

/// The caller-driven connection of one driver.
pub(crate) struct Direct {
    settings: Arc<EtcdTarget>,
    in_use: Arc<InUse>,
    conn: Arc<CallerDriven<ec::Client>>,
}

impl Direct {
    pub(crate) fn new(settings: EtcdTarget, in_use: Arc<InUse>) -> Direct {
        let conn = Arc::new(CallerDriven::new(settings.connect_timeout));
        Direct {
            settings: Arc::new(settings),
            in_use,
            conn,
        }
    }

    /// Runs `request` on the caller-driven connection, within `wait` (the
    /// request timeout applies inside it, and raises `suspicion` when slow,
    /// as on the driver's connection). `None` when no connection can be
    /// had now (`crate::caller_driven`): the call is the driver's. Also
    /// `None` for a read or a revoke still unanswered when the health
    /// monitor takes an endpoint out of use: this connection may have sent it there, so it
    /// is dropped, and the call is the driver's, whose connection no
    /// longer uses that endpoint (`health::routed`).
    pub(crate) fn call(
        &self,
        request: &Request,
        wait: Duration,
        suspicion: &health::Suspicion,
    ) -> Option<Result<Response, UnaryError>> {
        let timeout = self.settings.request_timeout;
        let (settings, in_use) = (self.settings.clone(), self.in_use.clone());
        let build = move || build(settings, in_use);
        let removals = health::may_send_twice(request).then(|| self.in_use.removals());
        let taken = CallerDriven::take(&self.conn, self.in_use.epoch(), build)?;
        let ran = taken.run(wait, |mut client| async move {
            let call = exec::unary(&mut client, request);
            match health::watched_or_moved(suspicion, removals.as_ref(), timeout, call).await {
                Routed::Answer(Ok(response)) => (Some(Ok(response)), Health::Sound),
                Routed::Answer(Err(e @ RpcError::Unavailable(_))) => {
                    (Some(Err(UnaryError::Rpc(e))), Health::Suspect)
                }
                Routed::Answer(Err(e)) => (Some(Err(UnaryError::Rpc(e))), Health::Sound),
                Routed::TimedOut => (Some(Err(UnaryError::Timeout(timeout))), Health::Suspect),
                Routed::Moved => (None, Health::Suspect),
            }
        });
        match ran {
            Ran::Answer(answer) => answer,
            Ran::Waited => Some(Err(UnaryError::Timeout(wait))),
            Ran::Panicked => Some(Err(UnaryError::Rpc(RpcError::Unavailable(
                "the call panicked".to_string(),
            )))),
        }
    }

    /// No call takes this path any more.
    pub(crate) fn close(&self) {
        self.conn.close();
    }
}

/// A client on the endpoints in use, logged in when a user is set.
/// etcd-client dials at the first request, so without a user this costs
/// no round trip.
async fn build(settings: Arc<EtcdTarget>, in_use: Arc<InUse>) -> Result<ec::Client, String> {
    let (_, urls) = in_use.read();
    if urls.is_empty() {
        return Err("no endpoint in use".to_string());
    }
    let mut options = probe_options(&settings).with_auto_token_refresh(true);
    if let Some(user) = &settings.user {
        options = options.with_user(user.name(), user.password());
    }
    ec::Client::connect(urls, Some(options))
        .await
        .map_err(|e| explain(&e, settings.tls.as_ref()))
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::testing::{EtcdServer, FaultProxy, Mode};
    use fleetcoord_sm::{KeyRange, RangeRequest};

    const WAIT: Duration = Duration::from_secs(10);

    fn target(endpoint: String, request_timeout: Duration) -> EtcdTarget {
        EtcdTarget {
            endpoints: vec![endpoint],
            connect_timeout: Duration::from_secs(5),
            request_timeout,
            keepalive_interval: Duration::from_secs(5),
            tls: None,
            user: None,
        }
    }

    /// A `Direct` with no driver beside it: nothing but the calling thread
    /// can drive its calls.
    fn alone(endpoint: &str, request_timeout: Duration) -> Direct {
        let in_use = Arc::new(InUse::default());
        in_use.set(vec![endpoint.to_string()]);
        Direct::new(target(endpoint.to_string(), request_timeout), in_use)
    }

    fn put(key: &str, value: &str) -> Request {
        Request::Put {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            lease: 0,
        }
    }

    fn get(key: &str) -> Request {
        Request::Range(RangeRequest::all(KeyRange::Key(key.as_bytes().to_vec())))
    }

    /// The values `response` (a range answer) holds.
    fn values(response: Response) -> Vec<Vec<u8>> {
        match response {
            Response::Range { kvs, .. } => kvs.into_iter().map(|kv| kv.value).collect(),
            other => panic!("not a range answer: {other:?}"),
        }
    }

    /// `request` on `direct`, once it has its connection (the first calls
    /// start building it and are not taken).
    fn call(direct: &Direct, request: &Request) -> Result<Response, UnaryError> {
        let until = std::time::Instant::now() + WAIT;
        loop {
            if let Some(answer) = direct.call(request, WAIT, &health::Suspicion::default()) {
                return answer;
            }
            assert!(std::time::Instant::now() < until, "never taken");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn the_calling_thread_alone_drives_its_calls() {
        let etcd = EtcdServer::start().expect("etcd");
        let direct = alone(&etcd.endpoint(), WAIT);
        call(&direct, &put("k", "v")).expect("put");
        assert_eq!(
            values(call(&direct, &get("k")).expect("get")),
            vec![b"v".to_vec()]
        );
        // From another plain thread at the same time as this one.
        std::thread::scope(|s| {
            for t in 0..4 {
                let direct = &direct;
                s.spawn(move || {
                    for i in 0..50 {
                        let key = format!("t{t}/{i}");
                        call(direct, &put(&key, "x")).expect("concurrent put");
                    }
                });
            }
        });
        let all = Request::Range(RangeRequest::all(KeyRange::Prefix(b"t".to_vec())));
        assert_eq!(values(call(&direct, &all).expect("range")).len(), 200);
    }

    #[test]
    fn a_new_set_of_endpoints_in_use_moves_the_calls() {
        let a = EtcdServer::start().expect("etcd a");
        let b = EtcdServer::start().expect("etcd b");
        let direct = alone(&a.endpoint(), WAIT);
        call(&direct, &put("only-on-a", "1")).expect("put on a");
        direct.in_use.set(vec![b.endpoint()]);
        assert!(
            values(call(&direct, &get("only-on-a")).expect("get on b")).is_empty(),
            "the call went to the member no longer in use"
        );
    }

    #[test]
    fn a_call_that_finds_the_connection_dead_drops_it_and_the_next_builds_anew() {
        let etcd = EtcdServer::start().expect("etcd");
        let proxy = FaultProxy::start(&etcd.endpoint().replace("http://", "")).expect("proxy");
        let direct = alone(
            &format!("http://{}", proxy.endpoint()),
            Duration::from_millis(500),
        );
        call(&direct, &put("k", "1")).expect("put through the proxy");
        // A connection that died silently: nothing ever comes back on it.
        proxy.set_mode(Mode::Blackhole);
        let started = std::time::Instant::now();
        assert!(
            matches!(call(&direct, &get("k")), Err(UnaryError::Timeout(_))),
            "no answer is a timeout"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "bounded by the request timeout"
        );
        assert!(!direct.conn.is_ready(), "dropped");
        // The old connection stays swallowed (bytes were lost mid-stream);
        // a new one works once traffic passes again.
        proxy.set_mode(Mode::Pass);
        assert_eq!(
            values(call(&direct, &get("k")).expect("get")),
            vec![b"1".to_vec()]
        );
    }

    #[test]
    fn closed_it_takes_no_call_and_with_no_endpoint_in_use_nothing_is_built() {
        let etcd = EtcdServer::start().expect("etcd");
        let direct = alone(&etcd.endpoint(), WAIT);
        call(&direct, &put("k", "1")).expect("put");
        direct.close();
        assert!(direct
            .call(&get("k"), WAIT, &health::Suspicion::default())
            .is_none());

        // No endpoint in use: nothing to build on, until there is one.
        let none = Arc::new(InUse::default());
        let unbuildable = Direct::new(target(etcd.endpoint(), WAIT), none.clone());
        let suspicion = health::Suspicion::default();
        for _ in 0..10 {
            assert!(unbuildable.call(&get("k"), WAIT, &suspicion).is_none());
            std::thread::sleep(Duration::from_millis(20));
        }
        none.set(vec![etcd.endpoint()]);
        assert_eq!(
            values(call(&unbuildable, &get("k")).expect("get")),
            vec![b"1".to_vec()]
        );
    }
}
