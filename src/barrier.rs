//! [`DoubleBarrier`]: `count` processes enter together and leave together,
//! on the key layout of Go's `recipes.DoubleBarrier`. Every decision is
//! the `fleetcoord_sm::barrier` machine's (rules in its module docs); this
//! file runs it on a session and waits for its answers.

use crate::driver::{rand_seed, MachineHandle, Notify};
use crate::error::{Error, Result};
use crate::etcd::Etcd;
use crate::session::Session;
use crate::validate;
use crate::{LivenessState, LockOptions};
use fleetcoord_sm::barrier::{
    BarrierConfig, BarrierError, BarrierInput, BarrierNotice, DoubleBarrier as Machine,
};
use fleetcoord_sm::BackoffConfig;
use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Where barriers live unless told otherwise: barrier `name` keeps its keys
/// under `<prefix><name>/`. Use a prefix of `""` to share a barrier with a
/// Go program's `recipe.NewDoubleBarrier(session, "<name>", count)`.
pub const DEFAULT_BARRIER_PREFIX: &str = "/coord/barrier/";

/// The most participants a barrier takes: a join reads the oldest `count`
/// keys in one answer, which this keeps far below etcd's message limit.
pub const MAX_BARRIER_COUNT: u32 = 10_000;

/// A double barrier of `count` participants: [`enter`](Self::enter) returns
/// once `count` participants were in the barrier at once, and
/// [`leave`](Self::leave) once every participant's key is gone.
///
/// Guarantees (the machine's rules 1 to 5):
/// * **Nobody passes `enter` early**: the ready key is put only by the
///   participant whose key was the `count`-th oldest in one read at one
///   revision (so `count` keys existed at once), guarded so that a late or
///   resent copy of that put can never open a later round; everyone else
///   enters at the first put of it after its own key.
/// * **One too many is refused**: an enter that finds `count` older keys
///   fails with [`Error::InvalidArgument`] naming `"count"` (Go's
///   `ErrTooManyClients`) and removes its key.
/// * **A participant that dies gives its place up** when etcd expires its
///   session's lease (one TTL after its last renewal): its key is bound to
///   the lease, so waiters still waiting to fill the barrier count one
///   fewer, and leavers stop waiting for it.
/// * `leave` deletes this participant's key at once and returns once no
///   key is left; the last one out deletes the ready key. (Go's `Leave`
///   has the lowest participant wait for the others and delete last; both
///   drain a mixed barrier.)
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::{DoubleBarrier, Etcd, EtcdOptions};
///
/// let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default())?;
/// let workers: Vec<_> = (0..3)
///     .map(|_| DoubleBarrier::new(&etcd, "nightly-batch", 3))
///     .collect::<Result<_, _>>()?;
/// std::thread::scope(|s| {
///     for w in &workers {
///         s.spawn(move || {
///             w.enter().expect("all three entered");
///             // ... the work that needs all three ...
///             w.leave().expect("all three left");
///         });
///     }
/// });
/// # Ok(()) }
/// ```
#[must_use = "dropping a DoubleBarrier leaves it (its key is deleted)"]
pub struct DoubleBarrier {
    machine: MachineHandle<Machine>,
    notices: crossbeam_channel::Receiver<BarrierNotice>,
    session: Session,
    /// Whether the session is this barrier's own (closed with it).
    own: bool,
    key: String,
    count: u32,
    /// One operation at a time (the machine's rule 7).
    turn: Mutex<()>,
}

impl std::fmt::Debug for DoubleBarrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DoubleBarrier")
            .field("key", &self.key)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

/// `count` must be 1 to [`MAX_BARRIER_COUNT`].
fn check_count(count: u32) -> Result<()> {
    if count == 0 || count > MAX_BARRIER_COUNT {
        return Err(Error::invalid(
            "count",
            format!("must be 1 to {MAX_BARRIER_COUNT} participants, got {count}"),
        ));
    }
    Ok(())
}

/// The barrier's key, `<prefix><name>`, after checking both.
fn barrier_key(name: &str, options: &LockOptions) -> Result<String> {
    validate::election_name("name", name)?;
    let prefix = options.prefix.as_deref().unwrap_or(DEFAULT_BARRIER_PREFIX);
    if !prefix.is_empty() {
        validate::prefix("prefix", prefix)?;
    }
    options.session.validate()?;
    Ok(format!("{prefix}{name}"))
}

impl DoubleBarrier {
    /// The checks [`DoubleBarrier::with_options`] makes of `name`, `count`
    /// and `options` before sending anything, without a connection.
    ///
    /// ```
    /// use fleetcoord::{DoubleBarrier, LockOptions};
    ///
    /// assert!(DoubleBarrier::check("batch", 3, &LockOptions::default()).is_ok());
    /// assert!(DoubleBarrier::check("batch", 0, &LockOptions::default()).is_err());
    /// assert!(DoubleBarrier::check("a/b", 3, &LockOptions::default()).is_err());
    /// ```
    pub fn check(name: &str, count: u32, options: &LockOptions) -> Result<()> {
        check_count(count)?;
        barrier_key(name, options).map(drop)
    }

    /// The barrier `name` (one key segment, as election names) of `count`
    /// participants under [`DEFAULT_BARRIER_PREFIX`], on a 10 s session of
    /// its own. `count` 0 or above [`MAX_BARRIER_COUNT`] is
    /// [`Error::InvalidArgument`] naming `"count"`.
    pub fn new(etcd: &Etcd, name: &str, count: u32) -> Result<DoubleBarrier> {
        crate::blocking::check()?;
        Self::with_options(etcd, name, count, LockOptions::default())
    }

    /// The barrier `name` with `options` (their prefix, default
    /// [`DEFAULT_BARRIER_PREFIX`]; `""` shares Go's keys; and their session
    /// settings, for a session of its own).
    pub fn with_options(
        etcd: &Etcd,
        name: &str,
        count: u32,
        options: LockOptions,
    ) -> Result<DoubleBarrier> {
        crate::blocking::check()?;
        check_count(count)?;
        let key = barrier_key(name, &options)?;
        let session = Session::with_options(etcd, options.session.clone())?;
        Self::start(etcd, session, true, key, count)
    }

    /// The barrier `name` on `session`: the participant key is bound to the
    /// session's lease (the settings of `options` but its prefix are
    /// ignored).
    pub fn with_session(
        session: &Session,
        name: &str,
        count: u32,
        options: LockOptions,
    ) -> Result<DoubleBarrier> {
        crate::blocking::check()?;
        check_count(count)?;
        let key = barrier_key(name, &options)?;
        Self::start(session.etcd(), session.clone(), false, key, count)
    }

    fn start(
        etcd: &Etcd,
        session: Session,
        own: bool,
        key: String,
        count: u32,
    ) -> Result<DoubleBarrier> {
        let config = BarrierConfig {
            key: key.clone().into_bytes(),
            count,
            backoff: BackoffConfig::default(),
        };
        let machine = Machine::new(config, Instant::now(), rand_seed());
        let (tx, notices) = crossbeam_channel::unbounded();
        // Few notices (one per call), read by the caller waiting for them.
        let machine = etcd.run(machine, Notify(move |notice| tx.send(notice).is_ok()))?;
        Ok(DoubleBarrier {
            machine,
            notices,
            session,
            own,
            key,
            count,
            turn: Mutex::new(()),
        })
    }

    /// The barrier's key (`<prefix><name>`): participants are under
    /// `<key>/waiters/`, the ready key is `<key>/ready`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How many participants enter together.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Blocks until `count` participants were in the barrier at once.
    pub fn enter(&self) -> Result<()> {
        self.enter_timeout(Duration::MAX)
    }

    /// [`DoubleBarrier::enter`], giving up after `timeout` with
    /// [`Error::Timeout`]: the handle is then closed (its key deleted), as
    /// a participant that gave up must not count; make a new one to try
    /// again.
    pub fn enter_timeout(&self, timeout: Duration) -> Result<()> {
        crate::blocking::check()?;
        let _turn = self.turn.lock();
        let deadline = Instant::now().checked_add(timeout);
        let lease = self.lease(deadline)?;
        self.machine
            .send(BarrierInput::Enter { lease })
            .map_err(|_| Error::Closed)?;
        self.answer(deadline, timeout)
    }

    /// Leaves after entering: deletes this participant's key and blocks
    /// until no participant's key is left.
    pub fn leave(&self) -> Result<()> {
        self.leave_timeout(Duration::MAX)
    }

    /// [`DoubleBarrier::leave`], giving up after `timeout` with
    /// [`Error::Timeout`] (this participant's key is gone by then or soon;
    /// the handle is closed).
    pub fn leave_timeout(&self, timeout: Duration) -> Result<()> {
        crate::blocking::check()?;
        let _turn = self.turn.lock();
        let deadline = Instant::now().checked_add(timeout);
        self.machine
            .send(BarrierInput::Leave)
            .map_err(|_| Error::Closed)?;
        self.answer(deadline, timeout)
    }

    /// The session's lease, waiting for its first grant until `deadline`.
    fn lease(&self, deadline: Option<Instant>) -> Result<i64> {
        loop {
            if let Some(lease) = self.session.lease() {
                return Ok(lease);
            }
            if self.session.is_closed() {
                return Err(Error::Closed);
            }
            if let LivenessState::Stopped { .. } = self.session.state() {
                return Err(Error::Closed);
            }
            let left = match deadline {
                Some(at) => at.saturating_duration_since(Instant::now()),
                None => Duration::from_millis(50),
            };
            if left.is_zero() {
                return Err(Error::Timeout(Duration::ZERO));
            }
            let _ = self
                .session
                .states()
                .recv_timeout(left.min(Duration::from_millis(50)));
        }
    }

    /// The machine's answer to the operation just sent.
    fn answer(&self, deadline: Option<Instant>, timeout: Duration) -> Result<()> {
        let notice = match deadline {
            Some(at) => match self
                .notices
                .recv_timeout(at.saturating_duration_since(Instant::now()))
            {
                Ok(n) => n,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    self.machine.stop();
                    return Err(Error::Timeout(timeout));
                }
                Err(_) => return Err(Error::Closed),
            },
            None => self.notices.recv().map_err(|_| Error::Closed)?,
        };
        match notice {
            BarrierNotice::Entered { .. } | BarrierNotice::Left => Ok(()),
            BarrierNotice::Failed(e) => Err(self.error(e)),
        }
    }

    fn error(&self, e: BarrierError) -> Error {
        match e {
            BarrierError::TooMany => Error::invalid(
                "count",
                format!(
                    "barrier {} already holds its {} participants (Go's ErrTooManyClients): \
                     wait until they left, or use another name",
                    self.key, self.count
                ),
            ),
            BarrierError::SessionLost => Error::SessionLost,
            BarrierError::Busy => Error::invalid("enter", "this participant already entered"),
            BarrierError::NotEntered => {
                Error::invalid("leave", "this participant has not entered the barrier")
            }
            BarrierError::Rejected(e) => Error::rpc(e),
            _ => Error::Closed,
        }
    }

    /// Leaves without waiting for the others: deletes this participant's
    /// key, and (on its own session) revokes the session.
    pub fn close(&self) -> Result<()> {
        crate::blocking::check()?;
        self.machine.stop();
        if self.own {
            self.session.close()
        } else {
            Ok(())
        }
    }
}

impl Drop for DoubleBarrier {
    fn drop(&mut self) {
        self.machine.stop();
    }
}
