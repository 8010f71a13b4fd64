//! [`RateLimit`]: a fleet-wide rate limit on etcd, each process's share
//! tied to its session lease.
//!
//! Every decision (the share, the sliding window, the join wait, the
//! trust margin) is `fleetcoord_sm::ratelimit::RateShare`'s; this module
//! feeds it what a [`HostLiveness`] (the member key on its lease) and a
//! [`HostWatcher`] (the other members' keys) report, and asks it with the
//! calling thread's clock.

use crate::error::{Error, Result};
use crate::etcd::Etcd;
use crate::session::SessionOptions;
use crate::validate;
use crate::{HostEvent, HostLiveness, HostWatcher, LivenessOptions, LivenessState, WatcherOptions};
use crossbeam_channel::{select, Receiver, Sender};
use fleetcoord_sm::ratelimit::{Grant, RateConfig, RateShare};
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Where rate limits live unless told otherwise.
pub const DEFAULT_RATELIMIT_PREFIX: &str = "/coord/ratelimit/";

/// The settings of a [`RateLimit`]; start from
/// [`RateLimitOptions::default`] and change what you need with the
/// `with_*` methods. `#[non_exhaustive]` so that new settings are not a
/// breaking change.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimitOptions {
    /// Key prefix; a member's key is `<prefix><name>/<member id>`. Must
    /// start and end with `/`. Default [`DEFAULT_RATELIMIT_PREFIX`].
    pub prefix: String,
    /// The window the permits are counted over: at most `permits` are
    /// granted by the fleet in any interval this long. 10 ms to 1 h.
    /// Default 1 s (permits per second).
    pub window: Duration,
    /// How long a membership change may take to reach every member; a new
    /// member spends nothing for `window + lag` after its key is written.
    /// 0 to 1 h. Default 1 s.
    pub lag: Duration,
    /// The member's own lease (ignored by [`RateLimit::with_session`]):
    /// a killed process's share returns to the others when it expires,
    /// about this TTL after the kill. Default TTL 5 s.
    pub session: SessionOptions,
    /// How long the constructor waits for the member key to be written.
    /// 1 ms to 24 h. Default 10 s.
    pub register_timeout: Duration,
}

impl Default for RateLimitOptions {
    fn default() -> Self {
        RateLimitOptions {
            prefix: DEFAULT_RATELIMIT_PREFIX.into(),
            window: Duration::from_secs(1),
            lag: Duration::from_secs(1),
            session: SessionOptions::default().with_ttl(Duration::from_secs(5)),
            register_timeout: Duration::from_secs(10),
        }
    }
}

impl RateLimitOptions {
    /// These options with [`RateLimitOptions::prefix`] set.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// These options with [`RateLimitOptions::window`] set.
    #[must_use]
    pub const fn with_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// These options with [`RateLimitOptions::lag`] set.
    #[must_use]
    pub const fn with_lag(mut self, lag: Duration) -> Self {
        self.lag = lag;
        self
    }

    /// These options with the own lease's TTL set (whole seconds, at
    /// least 1 s).
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.session = self.session.with_ttl(ttl);
        self
    }

    /// These options with [`RateLimitOptions::register_timeout`] set.
    #[must_use]
    pub const fn with_register_timeout(mut self, timeout: Duration) -> Self {
        self.register_timeout = timeout;
        self
    }

    /// The checks [`RateLimit::with_options`] makes of `name`, `permits`
    /// and these options before sending anything (the window must also be
    /// shorter than the session's trusted lifetime less a third of its
    /// TTL): `Ok` here means they will not be refused as
    /// [`Error::InvalidArgument`].
    pub fn check(&self, name: &str, permits: u32) -> Result<()> {
        validate::election_name("name", name)?;
        validate::prefix("prefix", &self.prefix)?;
        validate::timeout("register_timeout", self.register_timeout)?;
        self.session.validate()?;
        self.config(permits)?;
        self.fits(&self.session)
    }

    /// The window against the session it runs on: a member grants only
    /// while its lease is trusted for a window more, and a renewal comes
    /// every third of the TTL, so a window not shorter than the trusted
    /// lifetime less a third of the TTL would grant only now and then, or
    /// never (an acquire that waits forever).
    fn fits(&self, session: &SessionOptions) -> Result<()> {
        let room = session.trusted_lifetime().saturating_sub(session.ttl / 3);
        if self.window >= room {
            return Err(Error::invalid(
                "window",
                format!(
                    "{:?} must be shorter than {room:?}, the session's trusted lifetime less \
                     a third of its TTL of {:?}: a member grants only while its lease is \
                     trusted for a window more; raise the TTL or shorten the window",
                    self.window, session.ttl
                ),
            ));
        }
        Ok(())
    }

    fn config(&self, permits: u32) -> Result<RateConfig> {
        let config = RateConfig {
            permits,
            window: self.window,
            lag: self.lag,
        };
        config
            .check()
            .map_err(|e| Error::invalid(e.what, e.why))
            .map(|()| config)
    }
}

/// What the pump thread and the callers share.
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    share: RateShare<Uuid>,
    /// The watch of the members ended: the view can no longer be kept.
    failed: bool,
    /// A member whose key says another `permits`/`window`.
    mismatch: Option<String>,
    closed: bool,
}

/// A fleet-wide rate limit: the processes sharing a name share `permits`
/// permits per window.
///
/// Each process is a member with a key `<prefix><name>/<uuid>` on its
/// lease (its value, `permits` and the window in milliseconds as
/// `"<permits>/<ms>"`), and watches the others'. With `n` members, ordered
/// by id, each may grant `permits / n` permits in any window, the first
/// `permits % n` one more, so the shares add up to `permits`; a member
/// counts its own grants in a sliding window and never asks etcd for a
/// permit. The protocol, its invariants and the derivation of the bound
/// are in `fleetcoord_sm::ratelimit`'s module docs; in short:
///
/// * **Overshoot bound.** While every member hears every membership change
///   within [`RateLimitOptions::lag`] (or stops granting first), the fleet
///   grants at most `permits` in **any** interval of one window: a new
///   member waits `window + lag` before spending, a member grants only
///   while its lease is trusted for a window more (so its last grant is a
///   window older than its key's expiry), and [`RateLimit::close`] deletes
///   the key only a window after the last grant. A member cut off from
///   etcd keeps its share of the view it had until its lease's trust ends
///   (its TTL); if members join meanwhile it grants up to
///   `ceil(permits / n) - floor(permits / N)` too many per window (its
///   view of `n` against `N` members spending), so the fleet's bound is
///   `permits + s * ceil(permits / n)` for `s` members cut off while
///   others join — exactly `permits` when nobody joins during a cut.
/// * **A killed member's share** goes back to the others when etcd
///   expires its lease (within the TTL of the kill) and the watch tells
///   them (milliseconds).
/// * With more members than permits, the members of rank `permits` and
///   above get none; they wait until members leave.
/// * Processes sharing a name must agree on `permits` and the window: a
///   member whose key says otherwise makes every acquire fail with
///   [`Error::InvalidArgument`] naming `permits`.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::{Etcd, EtcdOptions, RateLimit, RateLimitOptions};
/// use std::time::Duration;
///
/// let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default())?;
/// let options = RateLimitOptions::default().with_lag(Duration::from_millis(200));
/// let limit = RateLimit::with_options(&etcd, "emails", 100, options)?;
/// let permit = limit.acquire()?; // waits for the join (window + lag), then a permit
/// assert!(permit.granted_at() <= std::time::Instant::now());
/// assert_eq!(limit.share(), 100, "the only member has every permit");
/// limit.close()?;
/// # Ok(()) }
/// ```
pub struct RateLimit {
    shared: Arc<Shared>,
    liveness: Option<HostLiveness>,
    watcher: Option<HostWatcher>,
    stop: Option<Sender<()>>,
    pump: Option<JoinHandle<()>>,
    id: Uuid,
}

impl std::fmt::Debug for RateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("id", &self.id)
            .field("share", &self.share())
            .finish_non_exhaustive()
    }
}

/// One permit, granted at [`Permit::granted_at`]: it counts against the
/// window that contains that instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permit {
    at: Instant,
}

impl Permit {
    /// The instant the permit was granted at, on the calling thread's
    /// clock.
    pub fn granted_at(&self) -> Instant {
        self.at
    }
}

impl RateLimit {
    /// The rate limit `name` (one key segment) of `permits` per second
    /// under [`DEFAULT_RATELIMIT_PREFIX`], on a lease of its own.
    pub fn new(etcd: &Etcd, name: &str, permits: u32) -> Result<RateLimit> {
        crate::blocking::check()?;
        Self::with_options(etcd, name, permits, RateLimitOptions::default())
    }

    /// The rate limit `name` of `permits` per window with `options`, on a
    /// lease of its own. Blocks until the member key is written (at most
    /// [`RateLimitOptions::register_timeout`]).
    pub fn with_options(
        etcd: &Etcd,
        name: &str,
        permits: u32,
        options: RateLimitOptions,
    ) -> Result<RateLimit> {
        crate::blocking::check()?;
        options.check(name, permits)?;
        let (id, liveness_options, value) = member(name, permits, &options);
        let liveness = HostLiveness::with_options(
            etcd,
            id,
            value.as_bytes(),
            LivenessOptions {
                session: options.session.clone(),
                ..liveness_options
            },
        )?;
        Self::start(etcd, id, permits, &options, liveness, value)
    }

    /// The rate limit `name` on `session`: the member key is bound to the
    /// session's lease, whose settings apply (those of `options` are
    /// ignored); a lost session lease ends the share until the key is
    /// written on the next one, and the wait `window + lag` starts again.
    pub fn with_session(
        session: &crate::Session,
        name: &str,
        permits: u32,
        options: RateLimitOptions,
    ) -> Result<RateLimit> {
        crate::blocking::check()?;
        validate::election_name("name", name)?;
        validate::prefix("prefix", &options.prefix)?;
        validate::timeout("register_timeout", options.register_timeout)?;
        options.config(permits)?;
        options.fits(session.options())?;
        let (id, liveness_options, value) = member(name, permits, &options);
        let liveness = HostLiveness::with_session(session, id, value.as_bytes(), liveness_options)?;
        Self::start(session.etcd(), id, permits, &options, liveness, value)
    }

    fn start(
        etcd: &Etcd,
        id: Uuid,
        permits: u32,
        options: &RateLimitOptions,
        liveness: HostLiveness,
        value: String,
    ) -> Result<RateLimit> {
        let config = options.config(permits)?;
        let mut share = RateShare::new(config, id).map_err(|e| Error::invalid(e.what, e.why))?;
        // The key is written: the join wait starts now (invariant 3 of
        // the share), the later read of the prefix can only be newer.
        share.registered(Instant::now());
        let prefix = liveness_prefix(&liveness);
        let watcher =
            HostWatcher::with_options(etcd, WatcherOptions::default().with_prefix(prefix))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                share,
                failed: false,
                mismatch: None,
                closed: false,
            }),
            changed: Condvar::new(),
        });
        let (stop, stopped) = crossbeam_channel::bounded(1);
        let events = watcher.events().clone();
        let states = liveness.states().clone();
        let lease = liveness.lease();
        let pump = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("fleetcoord-ratelimit".into())
                .spawn(move || pump(&shared, &events, &states, &stopped, lease, &value))?
        };
        Ok(RateLimit {
            shared,
            liveness: Some(liveness),
            watcher: Some(watcher),
            stop: Some(stop),
            pump: Some(pump),
            id,
        })
    }

    /// This member's id (the last segment of its key).
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// This member's share of the permits of a window under its current
    /// view of the fleet.
    pub fn share(&self) -> u32 {
        self.shared.state.lock().share.share()
    }

    /// How many members this one counts, itself included.
    pub fn members(&self) -> usize {
        self.shared.state.lock().share.members()
    }

    /// One permit if this member may grant it now, else `None` at once.
    /// Errors: the member watch failed, a member disagrees on `permits`,
    /// or the rate limit is closed.
    pub fn try_acquire(&self) -> Result<Option<Permit>> {
        crate::blocking::check()?;
        let mut state = self.shared.state.lock();
        Ok(self.ask(&mut state)?.0)
    }

    /// Blocks until this member may grant a permit.
    pub fn acquire(&self) -> Result<Permit> {
        crate::blocking::check()?;
        self.wait(None, Duration::MAX)
    }

    /// [`RateLimit::acquire`], giving up after `timeout` with
    /// [`Error::Timeout`] (`Duration::MAX` means no timeout).
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<Permit> {
        crate::blocking::check()?;
        self.wait(Instant::now().checked_add(timeout), timeout)
    }

    fn wait(&self, deadline: Option<Instant>, timeout: Duration) -> Result<Permit> {
        let mut state = self.shared.state.lock();
        loop {
            let (permit, retry) = self.ask(&mut state)?;
            if let Some(permit) = permit {
                return Ok(permit);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| d <= now) {
                return Err(Error::Timeout(timeout));
            }
            // A fact may change without a notice (the trust moves at each
            // renewal): look again at least every 100 ms.
            let mut until = now + Duration::from_millis(100);
            if let Some(retry) = retry {
                until = until.min(retry);
            }
            if let Some(deadline) = deadline {
                until = until.min(deadline);
            }
            self.shared.changed.wait_until(&mut state, until);
        }
    }

    /// Asks the share at the calling thread's `now`, with the lease's trust
    /// as of now: a permit, or when to ask again (`None`: on a fact).
    fn ask(&self, state: &mut State) -> Result<(Option<Permit>, Option<Instant>)> {
        if state.closed {
            return Err(Error::Closed);
        }
        if state.failed {
            // The watcher says why it stopped; a driver that went away
            // is the usual reason.
            return Err(self
                .watcher
                .as_ref()
                .and_then(HostWatcher::stop_reason)
                .unwrap_or(Error::DriverGone));
        }
        if let Some(why) = &state.mismatch {
            return Err(Error::invalid("permits", why.clone()));
        }
        match self.liveness.as_ref().and_then(HostLiveness::trusted_until) {
            Some(until) => state.share.trusted(until),
            None => state.share.untrusted(),
        }
        let now = Instant::now();
        Ok(match state.share.try_acquire(now) {
            Grant::Granted => (Some(Permit { at: now }), None),
            Grant::At(at) => (None, Some(at)),
            Grant::Fact => (None, None),
        })
    }

    /// Leaves the fleet: stops granting, waits until a window has passed
    /// since this member's last grant (at most one window), then deletes
    /// the key and revokes the lease (on a session, only the key), so the
    /// others take the share back without overshooting.
    pub fn close(mut self) -> Result<()> {
        crate::blocking::check()?;
        let release = self.stop_granting();
        if let Some(at) = release {
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
        }
        let left = self.liveness.take().map_or(Ok(()), HostLiveness::close);
        let watched = self.watcher.take().map_or(Ok(()), HostWatcher::close);
        left.and(watched)
    }

    /// Ends every grant and the pump; when the key may go
    /// ([`RateShare::release_at`]).
    fn stop_granting(&mut self) -> Option<Instant> {
        let release = {
            let mut state = self.shared.state.lock();
            state.closed = true;
            state.share.lost();
            state.share.release_at()
        };
        self.shared.changed.notify_all();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(pump) = self.pump.take() {
            // It returns at the stop: it never blocks but on the lock.
            let _ = pump.join();
        }
        release.filter(|&at| at > Instant::now())
    }
}

impl Drop for RateLimit {
    /// Stops granting at once and returns without waiting: the key is
    /// deleted (and the lease revoked) a window after the last grant by a
    /// thread of its own, as [`RateLimit::close`] would; should the
    /// process end first, the lease expires, which is no earlier (every
    /// grant was made while the lease was trusted for a window more).
    fn drop(&mut self) {
        if self.liveness.is_none() {
            return;
        }
        let release = self.stop_granting();
        let liveness = self.liveness.take();
        let watcher = self.watcher.take();
        match release {
            Some(at) => {
                let parts = Arc::new(Mutex::new(Some((liveness, watcher))));
                let theirs = parts.clone();
                let spawned = std::thread::Builder::new()
                    .name("fleetcoord-ratelimit-leave".into())
                    .spawn(move || {
                        std::thread::sleep(at.saturating_duration_since(Instant::now()));
                        drop(theirs.lock().take());
                    });
                if spawned.is_err() {
                    // No thread to leave on: wait here (at most a window)
                    // rather than delete the key early.
                    std::thread::sleep(at.saturating_duration_since(Instant::now()));
                    drop(parts.lock().take());
                }
            }
            None => drop((liveness, watcher)),
        }
    }
}

/// A fresh member id, its key's options and value.
fn member(name: &str, permits: u32, options: &RateLimitOptions) -> (Uuid, LivenessOptions, String) {
    let id = Uuid::new_v4();
    let liveness = LivenessOptions {
        register_timeout: options.register_timeout,
        ..LivenessOptions::default().with_prefix(format!("{}{name}/", options.prefix))
    };
    let value = format!("{permits}/{}", options.window.as_millis());
    (id, liveness, value)
}

/// The prefix the member keys of `liveness`'s rate limit live under.
fn liveness_prefix(liveness: &HostLiveness) -> String {
    let key = liveness.key();
    let cut = key.rfind('/').map_or(0, |i| i + 1);
    key[..cut].to_string()
}

/// Feeds the share what the member watch and the own key report, until
/// told to stop.
fn pump(
    shared: &Shared,
    events: &Receiver<HostEvent>,
    states: &Receiver<LivenessState>,
    stop: &Receiver<()>,
    mut lease: Option<i64>,
    value: &str,
) {
    loop {
        select! {
            recv(stop) -> _ => return,
            recv(events) -> event => {
                let mut state = shared.state.lock();
                match event {
                    Ok(HostEvent::Up(info)) | Ok(HostEvent::Updated(info)) => {
                        if info.metadata != value.as_bytes() {
                            state.mismatch = Some(format!(
                                "member {} has {:?} as permits/window in ms, this one {value:?}: \
                                 every member of a rate limit must have the same",
                                info.id,
                                String::from_utf8_lossy(&info.metadata)
                            ));
                        }
                        state.share.member_up(info.id);
                    }
                    Ok(HostEvent::Down(info, _)) => state.share.member_down(&info.id),
                    Ok(HostEvent::Synced) => state.share.synced(),
                    Err(_) => {
                        state.share.unsynced();
                        state.failed = true;
                        drop(state);
                        shared.changed.notify_all();
                        return;
                    }
                }
                drop(state);
                shared.changed.notify_all();
            }
            recv(states) -> change => {
                let Ok(change) = change else { return };
                let mut state = shared.state.lock();
                match change {
                    LivenessState::Registered { lease: now_on } => {
                        if lease != Some(now_on) {
                            // A new lease is a new join (invariant 3).
                            lease = Some(now_on);
                            state.share.registered(Instant::now());
                        }
                    }
                    LivenessState::Suspended { .. } => {}
                    _ => {
                        lease = None;
                        state.share.lost();
                    }
                }
                drop(state);
                shared.changed.notify_all();
            }
        }
    }
}
