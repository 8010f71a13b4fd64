//! [`Mutex`]: a fenced distributed lock, compatible with Go's
//! `concurrency.Mutex` and `etcdctl lock`.
//!
//! A mutex is an election whose value nobody reads: the same
//! lowest-create-revision protocol, the same session machine, the same
//! fence. Only the vocabulary and the default prefix differ, so everything
//! [`Election`] guarantees (one holder at a time as etcd sees it, a fencing
//! token that only grows, `lost()` before the lease can expire) holds here.

use super::{Election, Leadership, LockOptions, Pending, TryCampaign};
use crate::error::Result;
use crate::etcd::Etcd;
use crate::txn::{TxnOp, TxnOpResponse};
use crate::LivenessState;
use std::time::Duration;

/// Where locks live unless told otherwise. Use a prefix of `""` to share a
/// lock with `etcdctl lock <name>` (keys `<name>/<lease id hex>`).
pub const DEFAULT_LOCK_PREFIX: &str = "/coord/lock/";

/// A distributed mutex on a name.
///
/// Waiters queue in etcd by the create revision of their key; the lowest
/// holds the lock. Holding is fenced: [`MutexGuard::txn_if_held`] writes
/// only while this holder's key is still the one etcd has, whatever this
/// process believes after a pause. Options are [`LockOptions`]: the
/// `prefix` (default [`DEFAULT_LOCK_PREFIX`], never another primitive's
/// namespace) and the session.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::{Etcd, EtcdOptions, Mutex, TxnOp};
///
/// let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default())?;
/// let mutex = Mutex::new(&etcd, "nightly-backup")?;
/// let guard = mutex.lock()?; // blocks until held
/// // Write only while the lock is still ours in etcd.
/// let wrote = guard.txn_if_held([TxnOp::put("/backup/owner", "host-a")])?;
/// assert!(wrote.is_some());
/// assert!(Mutex::new(&etcd, "nightly-backup")?.try_lock()?.is_none());
/// guard.unlock()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "dropping the last handle of a Mutex revokes its session"]
pub struct Mutex {
    election: Election,
}

impl Mutex {
    /// The mutex `name` (one key segment, as election names) under
    /// [`DEFAULT_LOCK_PREFIX`], with a 10 s session.
    pub fn new(etcd: &Etcd, name: &str) -> Result<Mutex> {
        crate::blocking::check()?;
        Self::with_options(etcd, name, LockOptions::default())
    }

    /// The mutex `name` with `options` (no prefix: [`DEFAULT_LOCK_PREFIX`];
    /// `""` shares the lock with `etcdctl lock`). Starts the session at
    /// once; locking waits for it.
    pub fn with_options(etcd: &Etcd, name: &str, options: LockOptions) -> Result<Mutex> {
        crate::blocking::check()?;
        let options = options.to_election(DEFAULT_LOCK_PREFIX)?;
        Ok(Mutex {
            election: Election::with_options(etcd, name, options)?,
        })
    }

    /// The mutex `name` on `session` (see [`Election::with_session`]): the
    /// waiter's key is bound to the session's lease, whose settings apply
    /// (those of `options` are ignored). A lost session lease ends the lock
    /// held, as every lock and leadership on the session.
    pub fn with_session(
        session: &crate::Session,
        name: &str,
        options: LockOptions,
    ) -> Result<Mutex> {
        crate::blocking::check()?;
        let options = options.to_election(DEFAULT_LOCK_PREFIX)?;
        Ok(Mutex {
            election: Election::with_session(session, name, options)?,
        })
    }

    /// Blocks until this handle holds the lock. A session lease lost while
    /// waiting is replaced and the wait goes on (see [`Election::campaign`]).
    pub fn lock(&self) -> Result<MutexGuard> {
        crate::blocking::check()?;
        self.election.campaign(b"").map(MutexGuard::new)
    }

    /// [`Mutex::lock`], giving up after `timeout` with
    /// [`Error::Timeout`](crate::Error::Timeout) (the waiting key is
    /// removed again; `Duration::MAX` means no timeout).
    pub fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        crate::blocking::check()?;
        self.election
            .campaign_timeout(b"", timeout)
            .map(MutexGuard::new)
    }

    /// Queue for the lock and return at once: the waiting key keeps its
    /// place until the [`Pending`] is won, canceled, dropped or closed,
    /// however it is waited on (in slices, from several threads, or
    /// canceled from another). See [`Pending`].
    pub fn start_lock(&self) -> Result<Pending<MutexGuard>> {
        crate::blocking::check()?;
        self.election.start(b"", MutexGuard::new)
    }

    /// [`Mutex::lock`] until `stop` receives a message or is disconnected:
    /// `Ok(None)` then, the waiting key withdrawn (etcd confirmed it) before
    /// the return. See [`Election::campaign_until`].
    pub fn lock_until(&self, stop: &crossbeam_channel::Receiver<()>) -> Result<Option<MutexGuard>> {
        crate::blocking::check()?;
        self.start_lock()?.until(stop)
    }

    /// Takes the lock only if nobody holds it or waits for it; never waits
    /// for other holders. `Ok(None)`: somebody else has it (nothing is left
    /// behind).
    pub fn try_lock(&self) -> Result<Option<MutexGuard>> {
        crate::blocking::check()?;
        Ok(match self.election.try_campaign(b"")? {
            TryCampaign::Elected(leadership) => Some(MutexGuard::new(leadership)),
            TryCampaign::NotElected(_) => None,
        })
    }

    /// The key prefix waiters of this mutex use (`<prefix><name>/`).
    pub fn key_prefix(&self) -> &str {
        self.election.key_prefix()
    }

    /// The session's state (granting, registered, suspended, lost), `None`
    /// before the session has reported one.
    pub fn session(&self) -> Option<LivenessState> {
        self.election.session()
    }

    /// Until when the session is trusted, as
    /// [`Election::session_trusted_until`]: moves at every answered
    /// renewal, holding or waiting.
    pub fn session_trusted_until(&self) -> Option<std::time::Instant> {
        self.election.session_trusted_until()
    }

    /// Leaves: releases the lock if held, stops waiting, revokes the
    /// session. An error means the lease will expire after its TTL instead.
    /// Takes `&self`: a lock waited on in another thread returns
    /// [`Error::Closed`](crate::Error::Closed) at once (see
    /// [`Election::close`]).
    pub fn close(&self) -> Result<()> {
        crate::blocking::check()?;
        self.election.close()
    }
}

/// Holding a [`Mutex`]. Dropping it unlocks without waiting (as
/// [`Leadership`] resigns on drop); [`MutexGuard::unlock`] waits for etcd.
#[derive(Debug)]
#[must_use = "dropping a MutexGuard unlocks at once; keep it while you need the lock"]
pub struct MutexGuard {
    leadership: Leadership,
}

impl MutexGuard {
    fn new(leadership: Leadership) -> MutexGuard {
        MutexGuard { leadership }
    }

    /// How long the call that took this lock waited for it (see
    /// [`Leadership::waited`]).
    pub fn waited(&self) -> std::time::Duration {
        self.leadership.waited()
    }

    /// Whether that call found the lock held and waited for a holder to
    /// go (see [`Leadership::contended`]).
    pub fn contended(&self) -> bool {
        self.leadership.contended()
    }

    /// How often the call that took this lock joined the queue (see
    /// [`Leadership::attempts`]).
    pub fn attempts(&self) -> u32 {
        self.leadership.attempts()
    }

    /// The fencing token: this holder's key's create revision, strictly
    /// greater than every earlier holder's. Pass it with writes to
    /// resources that can refuse stale holders.
    pub fn fencing_token(&self) -> i64 {
        self.leadership.fencing_token()
    }

    /// This holder's key (`<prefix><name>/<lease hex>`).
    pub fn key(&self) -> &str {
        self.leadership.key()
    }

    /// Whether this holder may still act: false once the lock is lost or
    /// released, and before the session's lease can expire in etcd.
    pub fn is_held(&self) -> bool {
        self.leadership.is_held()
    }

    /// Receives `()` once if the lock is lost (not on unlock).
    pub fn lost(&self) -> &crossbeam_channel::Receiver<()> {
        self.leadership.lost()
    }

    /// Runs `ops` atomically only while this holder's key is still the one
    /// in etcd; `Ok(None)` when etcd refused (the lock is gone and nothing
    /// was applied). See [`Leadership::txn_if_leader`].
    pub fn txn_if_held(
        &self,
        ops: impl IntoIterator<Item = TxnOp>,
    ) -> Result<Option<Vec<TxnOpResponse>>> {
        crate::blocking::check()?;
        self.leadership.txn_if_leader(ops)
    }

    /// Releases the lock and waits until etcd deleted the key, so the next
    /// waiter can take it: at most the request timeout, past which the
    /// driver finishes the release in the background (see
    /// [`Leadership::resign`]).
    pub fn unlock(self) -> Result<()> {
        crate::blocking::check()?;
        self.leadership.resign()
    }
}
