//! [`Etcd`]: the one connection every primitive shares.

use crate::driver::handle::Sink;
use crate::driver::holdings::Holdings;
use crate::driver::runner::MachineTask;
use crate::driver::{
    self, CallFailure, DriverHandle, DriverMsg, EtcdTarget, MachineHandle, StartError, UnaryError,
};
use crate::endpoint;
use crate::endpoints::Endpoints;
use crate::error::{Error, ErrorKind, Result};
use crate::server_version::{MemberVersions, ServerVersion};
use crate::tls::{EtcdUser, Tls};
use crate::validate;
use fleetcoord_sm::keepalive::RenewalGrid;
use fleetcoord_sm::{Machine, Request, Response};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A lease's remaining and granted time to live, whole seconds as etcd
/// reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTtl {
    /// Time left before etcd expires the lease unless it is renewed.
    pub remaining: Duration,
    /// The TTL etcd granted; `granted - remaining` is the time since the
    /// last renewal.
    pub granted: Duration,
}

/// How to connect to etcd.
///
/// Start from [`EtcdOptions::default`] and change what you need with the
/// `with_*` methods; the fields are public for reading. The struct is
/// `#[non_exhaustive]` so that new settings are not a breaking change.
///
/// ```
/// use fleetcoord::EtcdOptions;
/// use std::time::Duration;
///
/// let options = EtcdOptions::default().with_connect_timeout(Duration::from_secs(2));
/// assert_eq!(options.connect_timeout, Duration::from_secs(2));
/// ```
///
/// `Debug` shows every setting but no secret: a password or a client key
/// reads `<redacted>`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// How long [`Etcd::connect`] may take before it fails with
    /// [`Error::Connect`]. 1 ms to 24 h. Default 5 s.
    pub connect_timeout: Duration,
    /// Deadline of each individual request (put, get, txn, grant, revoke,
    /// one renewal). Long-lived calls — watches, a campaign's wait — have no
    /// deadline. 1 ms to 24 h. Default 5 s.
    pub request_timeout: Duration,
    /// HTTP/2 ping interval and timeout: how soon a silently dead connection
    /// (a blackholed network) under an open watch or keepalive stream is
    /// noticed and the stream opened again elsewhere. A ping goes out after
    /// this long without a frame from the member, only while a stream is
    /// open (a connection with nothing open is never pinged: an unanswered
    /// call times out instead), and may take as long to be answered. 1 s
    /// to 1 h. Default 5 s.
    ///
    /// etcd closes, with `too_many_pings`, a connection pinged more often
    /// than its `--grpc-keepalive-min-time` (5 s unless configured) while it
    /// has sent nothing: below 5 s, against such a member, every quiet
    /// connection is dropped after three pings, and every watch and
    /// keepalive stream on it starts over. Go lower only for members
    /// started with a lower `--grpc-keepalive-min-time`. Below a second a
    /// stalled scheduler on a loaded host would read as a dead connection
    /// (zero made the client reconnect without pause).
    pub keepalive_interval: Duration,
    /// TLS (a CA bundle, optionally a client certificate): endpoints are
    /// dialled as `https://`. `None` (the default) is plain `http://`.
    pub tls: Option<Tls>,
    /// The etcd user to authenticate as; `None` (the default) sends no
    /// credentials, as for a cluster without auth.
    pub user: Option<EtcdUser>,
}

/// Shortest [`EtcdOptions::keepalive_interval`] accepted.
const MIN_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Longest [`EtcdOptions::keepalive_interval`] accepted: a dead connection
/// going unnoticed for longer helps no one.
const MAX_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(3600);

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(5),
            tls: None,
            user: None,
        }
    }
}

impl EtcdOptions {
    /// These options with [`EtcdOptions::connect_timeout`] set (1 ms to
    /// 24 h; [`Etcd::connect`] checks).
    #[must_use]
    pub const fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// These options with [`EtcdOptions::request_timeout`] set (1 ms to
    /// 24 h; [`Etcd::connect`] checks).
    #[must_use]
    pub const fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// These options with [`EtcdOptions::keepalive_interval`] set (1 s to
    /// 1 h; [`Etcd::connect`] checks).
    #[must_use]
    pub const fn with_keepalive_interval(mut self, interval: Duration) -> Self {
        self.keepalive_interval = interval;
        self
    }

    /// These options with TLS (see [`Tls`]): every endpoint is dialled
    /// as `https://host:port`; an `http://` endpoint is then refused.
    #[must_use]
    pub fn with_tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// These options authenticating as `user` (see [`EtcdUser`]). The
    /// client logs in when connecting and again whenever etcd reports the
    /// token expired; a wrong password fails [`Etcd::connect`] with
    /// [`Error::Connect`].
    #[must_use]
    pub fn with_user(mut self, user: EtcdUser) -> Self {
        self.user = Some(user);
        self
    }

    /// Every field within its documented range, or the first one that is
    /// not, named.
    fn check(&self) -> Result<()> {
        validate::timeout("connect_timeout", self.connect_timeout)?;
        validate::timeout("request_timeout", self.request_timeout)?;
        validate::within(
            "keepalive_interval",
            self.keepalive_interval,
            MIN_KEEPALIVE_INTERVAL,
            MAX_KEEPALIVE_INTERVAL,
        )
    }
}

/// A connection to an etcd cluster, driven by one background thread.
///
/// Cheap to clone: clones share the connection and the thread. The thread
/// stops when [`Etcd::close`] is called or the last clone (including the
/// clones held inside primitives) is dropped. After [`Etcd::close`] every
/// call on any clone, and on every primitive made from one, returns
/// [`Error::Closed`]; should the thread stop on its own (a panic), they
/// return [`Error::DriverGone`] instead.
///
/// All methods block. Called from a thread that is running an async
/// runtime's tasks (a tokio worker, a current-thread runtime), every
/// blocking method of this handle and of every primitive made from it
/// fails at once with [`Error::InsideAsyncRuntime`], in debug and release
/// builds alike, and never panics; from `tokio::task::spawn_blocking`,
/// inside `tokio::task::block_in_place` or from a plain thread it works.
/// Dropping the last clone from such a thread stops the driver without
/// waiting for it.
#[derive(Clone)]
pub struct Etcd {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<String>,
    options: EtcdOptions,
    driver: DriverHandle,
    /// Set by [`Etcd::close`] before the driver stops, so that a call that
    /// finds the driver gone can tell the user's close ([`Error::Closed`])
    /// from a driver that died ([`Error::DriverGone`]).
    closed: AtomicBool,
    /// The instants every lease of this handle renews on (see
    /// [`RENEWAL_STEP`]).
    renewal_grid: RenewalGrid,
    /// See [`Etcd::server_versions`].
    versions: Arc<MemberVersions>,
    /// The keys held on this handle (see [`Holdings`]).
    holdings: Arc<Holdings>,
}

/// The spacing of the renewal grid every lease of one [`Etcd`] renews on:
/// renewals due within this of each other go out together, in one driver
/// wake-up and one stream write, instead of one each. A renewal moves
/// earlier by less than this (never later), so a lease renewed every
/// third of a 5 s TTL is renewed at most 0.4 % more often; leases whose
/// renewal interval is under ten steps (TTL under ~0.7 s) are not moved.
const RENEWAL_STEP: Duration = Duration::from_millis(20);

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.inner.endpoints)
            .finish()
    }
}

impl Etcd {
    /// Connect to etcd at `endpoints` with [`EtcdOptions::default`]; see
    /// [`Etcd::with_options`].
    pub fn connect(endpoints: &(impl Endpoints + ?Sized)) -> Result<Etcd> {
        crate::blocking::check()?;
        Self::with_options(endpoints, EtcdOptions::default())
    }

    /// Connect to etcd at `endpoints` (see [`Endpoints`]: `host:port`,
    /// `http://host:port`, or with [`EtcdOptions::tls`] `https://host:port`,
    /// as a comma-separated string or a list) with `options`.
    ///
    /// Returns only once etcd has answered a request (and accepted the
    /// user's credentials), or fails with [`Error::Connect`] naming the
    /// endpoints within [`EtcdOptions::connect_timeout`]; its reason is one
    /// line saying what failed (refused, unknown CA, a certificate for
    /// another name, a client certificate missing or refused, a wrong
    /// password), never a secret.
    ///
    /// With several endpoints, each is probed on its own about once a
    /// second: a member that stops answering (accepts connections but never
    /// replies) gets no more calls until it answers again; the last answering
    /// member is never dropped.
    ///
    /// Checked before anything is dialled, each failing with
    /// [`Error::InvalidArgument`]: every endpoint (a host name, a dotted-quad
    /// IPv4 address or a bracketed IPv6 address, then `:` and a port
    /// 1..=65535; surrounding whitespace is ignored; the scheme must agree
    /// with [`EtcdOptions::tls`]), and every option against the range
    /// documented on its field of [`EtcdOptions`].
    pub fn with_options(
        endpoints: &(impl Endpoints + ?Sized),
        options: EtcdOptions,
    ) -> Result<Etcd> {
        crate::blocking::check()?;
        let endpoints = endpoints.endpoint_list();
        if endpoints.is_empty() {
            return Err(Error::invalid(
                "endpoints",
                "at least one endpoint is required",
            ));
        }
        let mut normalized = Vec::with_capacity(endpoints.len());
        for e in &endpoints {
            let url = endpoint::parse(e, options.tls.is_some())
                .map_err(|why| Error::invalid("endpoints", format!("{e:?}: {why}")))?;
            normalized.push(url);
        }
        options.check()?;
        let versions = Arc::new(MemberVersions::default());
        let holdings = Arc::new(Holdings::default());
        let driver = driver::start(
            EtcdTarget {
                endpoints: normalized.clone(),
                connect_timeout: options.connect_timeout,
                request_timeout: options.request_timeout,
                keepalive_interval: options.keepalive_interval,
                tls: options.tls.clone(),
                user: options.user.clone(),
            },
            versions.clone(),
            holdings.clone(),
        )
        .map_err(|e| match e {
            StartError::Io(e) => Error::Io(e),
            StartError::Connect(reason) => Error::Connect {
                backend: "etcd",
                endpoints: normalized.join(","),
                kind: ErrorKind::Unavailable,
                reason,
            },
        })?;
        Ok(Etcd {
            inner: Arc::new(Inner {
                endpoints: normalized,
                options,
                driver,
                closed: AtomicBool::new(false),
                renewal_grid: RenewalGrid {
                    origin: std::time::Instant::now(),
                    step: RENEWAL_STEP,
                },
                versions,
                holdings,
            }),
        })
    }

    /// The endpoints this handle connects to.
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// The grid every lease of this handle renews on.
    pub(crate) fn renewal_grid(&self) -> RenewalGrid {
        self.inner.renewal_grid
    }

    /// The options this handle was built with.
    pub fn options(&self) -> &EtcdOptions {
        &self.inner.options
    }

    /// The oldest etcd version among the members this handle has heard
    /// from ([`Etcd::server_versions`]): what a mixed-version cluster can
    /// promise is what its oldest member can. `None` when no member
    /// reported a version ([`ServerVersion::parse`]; logged at debug
    /// level).
    pub fn server_version(&self) -> Option<ServerVersion> {
        self.inner.versions.oldest()
    }

    /// Every member's etcd version, by member id (in hex in etcd's own
    /// tools), oldest first: read from the status each member answered at
    /// [`Etcd::connect`] (no request of its own), and again whenever a
    /// member the handle had stopped using for not answering answers again
    /// (it may have been upgraded meanwhile). Members that never answered
    /// are missing. A version with [known defects](crate::etcd_defects)
    /// was logged once per process and defect: one warning line naming
    /// them and the release that fixes them, the detail at debug level.
    pub fn server_versions(&self) -> Vec<(u64, ServerVersion)> {
        self.inner.versions.all()
    }

    /// Stop the driver thread for every clone of this handle: running
    /// primitives revoke their leases and resign (each within a short grace
    /// period), then the runtime stops and the thread is joined. Idempotent.
    /// Any thread may close: a campaign, lock or acquire waiting on this
    /// handle in another thread returns [`Error::Closed`] within
    /// milliseconds (its key goes with the revoked session).
    pub fn close(&self) -> Result<()> {
        crate::blocking::check()?;
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.driver.shutdown();
        Ok(())
    }

    /// The error for a call that found the driver thread gone: the one
    /// "gone" rule of every backend ([`Error::Closed`] when the user closed
    /// this handle, [`Error::DriverGone`] when the thread stopped by
    /// itself).
    pub(crate) fn gone(&self) -> Error {
        if self.inner.closed.load(Ordering::SeqCst) {
            Error::Closed
        } else {
            Error::DriverGone
        }
    }

    /// `e`, with a [`Error::DriverGone`] decided without this handle at hand
    /// (in a machine's failure, say) made to follow [`Etcd::gone`].
    pub(crate) fn or_gone(&self, e: Error) -> Error {
        match e {
            Error::DriverGone => self.gone(),
            other => other,
        }
    }

    /// How long `lease` has left and what TTL it was granted, or `None`
    /// when etcd no longer has it. One request.
    pub fn lease_ttl(&self, lease: i64) -> Result<Option<LeaseTtl>> {
        match self.request(Request::LeaseTimeToLive { lease })? {
            Response::LeaseTimeToLive {
                ttl_secs,
                granted_secs,
            } => Ok((ttl_secs >= 0).then(|| LeaseTtl {
                remaining: Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(0)),
                granted: Duration::from_secs(u64::try_from(granted_secs).unwrap_or(0)),
            })),
            other => Err(Error::unexpected(other)),
        }
    }

    /// Run one unary request within the request timeout: the one way user
    /// threads make a single call, polled on the calling thread (see
    /// `DriverHandle::call`). Giving up (a timeout, a panic unwinding
    /// through here) drops the call.
    pub(crate) fn request(&self, request: Request) -> Result<Response> {
        self.request_within(request, self.inner.options.request_timeout)
    }

    /// [`Etcd::request`], given up after `limit` when that is shorter than
    /// the request timeout: [`Error::Timeout`] with `limit`, and the call
    /// is canceled on the driver (a request already sent may still apply).
    pub(crate) fn request_within(&self, request: Request, limit: Duration) -> Result<Response> {
        crate::blocking::check()?;
        // The call enforces the request timeout itself; the slack only
        // covers a runtime too busy to fire its timer. A shorter limit is
        // the caller's.
        let timeout = self.inner.options.request_timeout;
        let wait = if limit < timeout {
            limit
        } else {
            timeout.saturating_add(Duration::from_secs(1))
        };
        match self.inner.driver.call(&request, wait) {
            Ok(response) => Ok(response),
            Err(CallFailure::Unary(UnaryError::Timeout(after))) => Err(Error::Timeout(after)),
            Err(CallFailure::Unary(UnaryError::Rpc(e))) => {
                Err(Error::rpc(e).with_endpoints(self.endpoints()))
            }
            Err(CallFailure::InsideAsyncRuntime) => Err(Error::InsideAsyncRuntime),
            Err(CallFailure::Gone) => Err(self.gone()),
        }
    }

    /// The keys held on this handle: a leadership, lock or permit
    /// registers its key here, so that any watch of the handle that sees
    /// it deleted ends it (see [`Holdings`]).
    pub(crate) fn holdings(&self) -> &Arc<Holdings> {
        &self.inner.holdings
    }

    /// Start `machine` on the driver; its notices go to `sink`. Returns the
    /// primitive's handle on it: inputs in, stop (also on drop), and the
    /// signal that it finished.
    pub(crate) fn run<M>(
        &self,
        machine: M,
        sink: impl Sink<M::Notice> + 'static,
    ) -> Result<MachineHandle<M>>
    where
        M: Machine + Send + 'static,
        M::Input: Send + 'static,
        M::Notice: Send + 'static,
    {
        let (task, handle) = MachineTask::new(machine, sink);
        self.inner
            .driver
            .send(DriverMsg::Run(Box::new(task)))
            .map_err(|_| self.gone())?;
        Ok(handle)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.driver.shutdown();
    }
}
