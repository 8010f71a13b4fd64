//! Unary calls driven by their callers: a second connection to etcd, on a
//! `current_thread` runtime that has no thread of its own.
//!
//! Through the driver's connection a blocking call costs two wake-ups of
//! another thread: the driver's, to write the request, and the caller's,
//! for the answer (60–130 µs a call on 2 cores; BENCHMARKS.md, "Issue
//! 45"). Here the calling thread writes, reads and polls its call itself,
//! as a raw client on the calling thread does.
//!
//! What it guarantees:
//!
//! * **A lone call never crosses a thread.** [`Direct::call`] runs the call
//!   in `Runtime::block_on` on the calling thread. Concurrent callers take
//!   turns driving the connection (tokio hands the runtime's core from one
//!   `block_on` to the next) and each polls its own call, so they pipeline
//!   on the one connection.
//! * **Only endpoints in use.** The connection is built on the endpoints
//!   the health monitor has in use ([`InUse`]), and built again once that
//!   set changes, so a member taken out for not answering gets no call
//!   here either.
//! * **Nothing runs between calls.** Nobody drives the connection while no
//!   call is running, so it has no HTTP/2 pings (an answer to a ping that
//!   nobody reads would look like a dead connection and close it) and
//!   carries no renewal and no watch: those stay on the driver's
//!   connection, which its thread drives all the time.
//! * **One connection per call.** A call is sent on one connection, and
//!   its failure is reported as it happened, never sent again on the
//!   driver's. A call that got no answer in time, or found the connection
//!   broken ([`RpcError::Unavailable`]), drops the connection: one that
//!   died while idle (no pings notice it) would otherwise swallow every
//!   call until the kernel gives up on it. The next call builds a new one.
//! * **Building never fails a call.** A connection is built lazily by the
//!   first call that needs it, on that call's thread (etcd-client dials at
//!   the first request, so this costs no round trip unless a user logs
//!   in). While none is ready (another caller is building it, building
//!   failed within the last [`RETRY_AFTER`], the handle is closed), calls
//!   take the driver's connection: the same server and answers, two
//!   wake-ups more.
//! * **Closing ends it.** After [`Direct::close`] no call takes this path,
//!   and the runtime ends when the last call on it has: without blocking
//!   (`shutdown_background`), so it may end on any thread.

use super::connect::probe_options;
use super::explain::explain;
use super::{exec, health, EtcdTarget, UnaryError};
use etcd_client as ec;
use fleetcoord_sm::{Request, Response, RpcError};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long after a failed build the calls keep to the driver's
/// connection before one tries again.
pub(crate) const RETRY_AFTER: Duration = health::PROBE_INTERVAL;

/// The endpoints the health monitor has in use, numbered: each change gets
/// a new epoch, so a connection built on an older set is built again.
#[derive(Default)]
pub(crate) struct InUse {
    epoch: AtomicU64,
    urls: Mutex<Vec<String>>,
}

impl InUse {
    /// Replaces the set (the health monitor, after each change).
    pub(crate) fn set(&self, urls: Vec<String>) {
        let mut held = self.urls.lock();
        *held = urls;
        self.epoch.fetch_add(1, Ordering::Release);
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

/// A runtime that ends without blocking when the last call on it is done.
struct Driven(Option<tokio::runtime::Runtime>);

impl Drop for Driven {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// One built connection: its runtime, its client, and the endpoint set it
/// was built on.
#[derive(Clone)]
struct Conn {
    epoch: u64,
    rt: Arc<Driven>,
    client: ec::Client,
}

enum State {
    /// No connection; the next call may build one (after `not_before`).
    Idle {
        not_before: Option<Instant>,
    },
    /// A caller is building one; the others take the driver's connection.
    Building,
    Ready(Conn),
    Closed,
}

/// The caller-driven connection of one driver.
pub(crate) struct Direct {
    settings: EtcdTarget,
    in_use: Arc<InUse>,
    state: Mutex<State>,
}

/// A call this path did not take: run it on the driver's connection.
pub(crate) struct NotTaken;

impl Direct {
    pub(crate) fn new(settings: EtcdTarget, in_use: Arc<InUse>) -> Direct {
        Direct {
            settings,
            in_use,
            state: Mutex::new(State::Idle { not_before: None }),
        }
    }

    /// Runs `request` on the caller-driven connection, within `wait` (the
    /// request timeout applies inside it, and raises `suspicion` when slow,
    /// as on the driver's connection). [`NotTaken`] when no connection is
    /// ready or the calling thread is inside a tokio runtime's context
    /// (where a runtime of our own may not be entered).
    pub(crate) fn call(
        &self,
        request: &Request,
        wait: Duration,
        suspicion: &health::Suspicion,
    ) -> Result<Result<Response, UnaryError>, NotTaken> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(NotTaken);
        }
        let conn = self.conn().ok_or(NotTaken)?;
        let Some(rt) = conn.rt.0.as_ref() else {
            return Err(NotTaken);
        };
        let timeout = self.settings.request_timeout;
        let mut client = conn.client.clone();
        let call = async {
            let answer = health::watched(suspicion, timeout, exec::unary(&mut client, request));
            tokio::time::timeout(wait, answer).await
        };
        let answer =
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(call))) {
                Ok(answer) => answer,
                // The panic hook has reported it; like a panicking call on
                // the driver's connection, it ends this call only.
                Err(_) => {
                    self.drop_conn(conn.epoch);
                    return Ok(Err(UnaryError::Rpc(RpcError::Unavailable(
                        "the call panicked".to_string(),
                    ))));
                }
            };
        Ok(match answer {
            Ok(Some(Ok(response))) => Ok(response),
            Ok(Some(Err(e))) => {
                if matches!(e, RpcError::Unavailable(_)) {
                    self.drop_conn(conn.epoch);
                }
                Err(UnaryError::Rpc(e))
            }
            Ok(None) => {
                self.drop_conn(conn.epoch);
                Err(UnaryError::Timeout(timeout))
            }
            // The caller's own patience ran out first: no evidence
            // against the connection.
            Err(_) => Err(UnaryError::Timeout(wait)),
        })
    }

    /// No call takes this path any more; the connection ends with the
    /// last call running on it.
    pub(crate) fn close(&self) {
        *self.state.lock() = State::Closed;
    }

    /// The ready connection, built now when none is and none is being
    /// built; `None` when the call should take the driver's connection.
    fn conn(&self) -> Option<Conn> {
        let epoch = self.in_use.epoch();
        {
            let mut state = self.state.lock();
            match &*state {
                State::Ready(conn) if conn.epoch == epoch => return Some(conn.clone()),
                State::Ready(_) => *state = State::Building,
                State::Idle { not_before } => {
                    if not_before.is_some_and(|at| Instant::now() < at) {
                        return None;
                    }
                    *state = State::Building;
                }
                State::Building | State::Closed => return None,
            }
        }
        // Built outside the lock: a login may take a round trip, and the
        // other callers meanwhile take the driver's connection.
        let built = self.build();
        let mut state = self.state.lock();
        if matches!(*state, State::Closed) {
            return None;
        }
        match built {
            Ok(conn) => {
                *state = State::Ready(conn.clone());
                Some(conn)
            }
            Err(why) => {
                log::debug!("etcd calls stay on the shared connection for now: {why}");
                *state = State::Idle {
                    not_before: Instant::now().checked_add(RETRY_AFTER),
                };
                None
            }
        }
    }

    /// Forgets the connection built for `epoch` (not a newer one another
    /// caller built since).
    fn drop_conn(&self, epoch: u64) {
        let mut state = self.state.lock();
        if matches!(&*state, State::Ready(conn) if conn.epoch == epoch) {
            *state = State::Idle { not_before: None };
        }
    }

    /// A runtime and a client on the endpoints in use, logged in when a
    /// user is set; within the connect timeout.
    fn build(&self) -> Result<Conn, String> {
        let (epoch, urls) = self.in_use.read();
        if urls.is_empty() {
            return Err("no endpoint in use".to_string());
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("no runtime: {e}"))?;
        let settings = &self.settings;
        let mut options = probe_options(settings).with_auto_token_refresh(true);
        if let Some(user) = &settings.user {
            options = options.with_user(user.name(), user.password());
        }
        let connect = ec::Client::connect(urls, Some(options));
        let client = rt.block_on(async {
            match tokio::time::timeout(settings.connect_timeout, connect).await {
                Ok(Ok(client)) => Ok(client),
                Ok(Err(e)) => Err(explain(&e, settings.tls.as_ref())),
                Err(_) => Err(format!("no answer within {:?}", settings.connect_timeout)),
            }
        });
        let rt = Arc::new(Driven(Some(rt)));
        match client {
            Ok(client) => Ok(Conn { epoch, rt, client }),
            Err(why) => Err(why),
        }
    }
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

    fn call(direct: &Direct, request: &Request) -> Result<Response, UnaryError> {
        match direct.call(request, WAIT, &health::Suspicion::default()) {
            Ok(answer) => answer,
            Err(NotTaken) => panic!("the call was not taken"),
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
        let started = Instant::now();
        assert!(
            matches!(call(&direct, &get("k")), Err(UnaryError::Timeout(_))),
            "no answer is a timeout"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "bounded by the request timeout"
        );
        assert!(
            matches!(*direct.state.lock(), State::Idle { .. }),
            "dropped"
        );
        // The old connection stays swallowed (bytes were lost mid-stream);
        // a new one works once traffic passes again.
        proxy.set_mode(Mode::Pass);
        assert_eq!(
            values(call(&direct, &get("k")).expect("get")),
            vec![b"1".to_vec()]
        );
    }

    #[test]
    fn closed_it_takes_no_call_and_a_failed_build_waits_before_trying_again() {
        let etcd = EtcdServer::start().expect("etcd");
        let direct = alone(&etcd.endpoint(), WAIT);
        call(&direct, &put("k", "1")).expect("put");
        direct.close();
        assert!(direct
            .call(&get("k"), WAIT, &health::Suspicion::default())
            .is_err());

        let none = Arc::new(InUse::default());
        let unbuildable = Direct::new(target(etcd.endpoint(), WAIT), none.clone());
        let suspicion = health::Suspicion::default();
        assert!(unbuildable.call(&get("k"), WAIT, &suspicion).is_err());
        none.set(vec![etcd.endpoint()]);
        assert!(
            unbuildable.call(&get("k"), WAIT, &suspicion).is_err(),
            "within RETRY_AFTER of the failed build"
        );
        std::thread::sleep(RETRY_AFTER);
        assert!(unbuildable.call(&get("k"), WAIT, &suspicion).is_ok());
    }
}
