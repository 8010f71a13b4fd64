//! [`Etcd`]: the one connection every primitive shares.

use crate::driver::{self, runner, DriverHandle, DriverMsg, DriverOptions, Shared};
use crate::error::{Error, Result};
use etcd_client as ec;
use fleetcoord_sm::{Machine, Request, Response, RpcError};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

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
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// How long [`Etcd::connect`] may take before it fails with
    /// [`Error::Connect`]. Default 5 s.
    pub connect_timeout: Duration,
    /// Deadline of each individual request (put, get, txn, grant, revoke,
    /// one renewal). Long-lived calls — watches, a campaign's wait — have no
    /// deadline. Default 5 s.
    pub request_timeout: Duration,
    /// HTTP/2 ping interval and timeout: how soon a silently dead connection
    /// (a blackholed network) is noticed and watches resync. Default 2 s.
    pub keepalive_interval: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(2),
        }
    }
}

impl EtcdOptions {
    /// These options with [`EtcdOptions::connect_timeout`] set. Must be
    /// greater than zero ([`Etcd::connect`] checks).
    #[must_use]
    pub const fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// These options with [`EtcdOptions::request_timeout`] set. Must be
    /// greater than zero ([`Etcd::connect`] checks).
    #[must_use]
    pub const fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// These options with [`EtcdOptions::keepalive_interval`] set.
    #[must_use]
    pub const fn with_keepalive_interval(mut self, interval: Duration) -> Self {
        self.keepalive_interval = interval;
        self
    }
}

/// A connection to an etcd cluster, driven by one background thread.
///
/// Cheap to clone: clones share the connection and the thread. The thread
/// stops when [`Etcd::close`] is called or the last clone (including the
/// clones held inside primitives) is dropped. After that every call on any
/// clone returns [`Error::DriverGone`].
///
/// All methods block. Do not call them from inside an async runtime's
/// worker thread (it would stall that runtime; debug builds assert this).
#[derive(Clone)]
pub struct Etcd {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<String>,
    options: EtcdOptions,
    driver: Mutex<DriverHandle>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.inner.endpoints)
            .finish()
    }
}

pub(crate) fn assert_not_async() {
    debug_assert!(
        tokio::runtime::Handle::try_current().is_err(),
        "fleetcoord's blocking API was called from inside an async runtime; \
         call it from a plain thread (e.g. tokio::task::spawn_blocking)"
    );
}

impl Etcd {
    /// Connect to etcd at `endpoints` (`host:port` or `http://host:port`).
    ///
    /// Returns only once etcd has answered a request, or fails with
    /// [`Error::Connect`] naming the endpoints within
    /// [`EtcdOptions::connect_timeout`].
    pub fn connect<S: AsRef<str>>(endpoints: &[S], options: EtcdOptions) -> Result<Etcd> {
        assert_not_async();
        if endpoints.is_empty() {
            return Err(Error::invalid(
                "endpoints",
                "at least one endpoint is required",
            ));
        }
        let mut normalized = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            let e = e.as_ref().trim();
            if e.is_empty() || e.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(Error::invalid(
                    "endpoints",
                    format!("{e:?} is not a host:port endpoint"),
                ));
            }
            if e.starts_with("https://") {
                return Err(Error::invalid(
                    "endpoints",
                    format!("{e}: TLS endpoints are not supported yet"),
                ));
            }
            let e = if e.starts_with("http://") {
                e.to_string()
            } else {
                format!("http://{e}")
            };
            normalized.push(e);
        }
        if options.connect_timeout.is_zero() || options.request_timeout.is_zero() {
            return Err(Error::invalid(
                "options",
                "timeouts must be greater than zero",
            ));
        }
        let connect = ec::ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_keep_alive(options.keepalive_interval, options.keepalive_interval)
            .with_keep_alive_while_idle(true);
        let driver = driver::start(
            normalized.clone(),
            connect,
            options.connect_timeout,
            DriverOptions {
                request_timeout: options.request_timeout,
            },
        )?;
        Ok(Etcd {
            inner: Arc::new(Inner {
                endpoints: normalized,
                options,
                driver: Mutex::new(driver),
            }),
        })
    }

    /// The endpoints this handle connects to.
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// The options this handle was built with.
    pub fn options(&self) -> &EtcdOptions {
        &self.inner.options
    }

    /// Stop the driver thread for every clone of this handle: running
    /// primitives revoke their leases and resign (each within a short grace
    /// period), then the runtime stops and the thread is joined. Idempotent.
    pub fn close(&self) -> Result<()> {
        assert_not_async();
        self.inner.shutdown();
        Ok(())
    }

    /// How long `lease` has left and what TTL it was granted, or `None`
    /// when etcd no longer has it. One request.
    pub fn lease_ttl(&self, lease: i64) -> Result<Option<LeaseTtl>> {
        self.call(move |mut shared| async move {
            let r = shared
                .client
                .lease_time_to_live(lease, None)
                .await
                .map_err(|e| Error::Etcd(e.to_string()))?;
            Ok((r.ttl() >= 0).then(|| LeaseTtl {
                remaining: Duration::from_secs(r.ttl().max(0) as u64),
                granted: Duration::from_secs(r.granted_ttl().max(0) as u64),
            }))
        })
    }

    /// Run one unary request with the configured request timeout.
    pub(crate) fn request(&self, request: Request) -> Result<Response> {
        self.call(move |mut shared| async move {
            driver::exec::unary(&mut shared.client, &request)
                .await
                .map_err(|e| match e {
                    RpcError::Rejected(msg) | RpcError::Unavailable(msg) => Error::Etcd(msg),
                    other => Error::Etcd(format!("{other:?}")),
                })
        })
    }

    /// Run `job` on the driver within one request timeout and wait for its
    /// result: the one way user threads make a single call.
    fn call<T, F, Fut>(&self, job: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Shared) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        assert_not_async();
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.spawn(move |shared: Shared| async move {
            let timeout = shared.options.request_timeout;
            let result = tokio::time::timeout(timeout, job(shared))
                .await
                .unwrap_or(Err(Error::Timeout(timeout)));
            let _ = tx.send(result);
        })?;
        // The driver enforces the timeout; the slack only covers a driver
        // too busy to report it.
        let wait = self.inner.options.request_timeout + Duration::from_secs(1);
        match rx.recv_timeout(wait) {
            Ok(result) => result,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(Error::Timeout(wait)),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(Error::DriverGone),
        }
    }

    /// Start a machine task; returns the sender for its inputs.
    pub(crate) fn run_machine<M>(
        &self,
        machine: M,
        notify: impl FnMut(M::Notification) -> bool + Send + 'static,
    ) -> Result<mpsc::UnboundedSender<M::Event>>
    where
        M: Machine + Send + 'static,
        M::Event: Send + runner::StopInput + 'static,
        M::Notification: Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        self.run_machine_with(machine, rx, notify)?;
        Ok(tx)
    }

    /// [`Etcd::run_machine`] with a caller-made input channel, for callers
    /// whose notification handler must also feed the machine.
    pub(crate) fn run_machine_with<M>(
        &self,
        machine: M,
        inputs: mpsc::UnboundedReceiver<M::Event>,
        notify: impl FnMut(M::Notification) -> bool + Send + 'static,
    ) -> Result<()>
    where
        M: Machine + Send + 'static,
        M::Event: Send + runner::StopInput + 'static,
        M::Notification: Send + 'static,
    {
        let task = runner::MachineTask {
            machine,
            inputs,
            notify: Box::new(notify),
        };
        self.spawn(move |shared| runner::run(shared, task))
    }

    fn spawn<F, Fut>(&self, job: F) -> Result<()>
    where
        F: FnOnce(Shared) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let msg = DriverMsg::Spawn(Box::new(move |shared| Box::pin(job(shared))));
        self.inner
            .driver
            .lock()
            .tx
            .send(msg)
            .map_err(|_| Error::DriverGone)
    }
}

impl Inner {
    fn shutdown(&self) {
        let thread = {
            let mut driver = self.driver.lock();
            let _ = driver.tx.send(DriverMsg::Shutdown);
            driver.thread.take()
        };
        if let Some(thread) = thread {
            // Joining from the driver thread itself (a handle dropped inside a
            // task) would deadlock; the thread ends on its own then.
            if thread.thread().id() != std::thread::current().id() && thread.join().is_err() {
                log::error!("fleetcoord driver thread panicked");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}
