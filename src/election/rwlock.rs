//! [`RwLock`]: a fenced distributed read-write lock on the key layout of
//! Go's `recipes.RWMutex` (etcd's `client/v3/experimental/recipes`).
//!
//! Each side is the election protocol with a different queue
//! (`fleetcoord_sm::election::RwRole`, rules in that module's docs): a
//! reader's key is `<root>read/<lease hex>` and it holds once no key under
//! `<root>write/` is older; a writer's key is `<root>write/<lease hex>`
//! and it holds once no key under `<root>` is older. So the session, the
//! guard on the own key, the fence and every deadline rule are the
//! election's, unchanged. Both sides of one handle run on one session
//! (one lease).

use super::{Election, Leadership, LockOptions, TryCampaign};
use crate::error::Result;
use crate::etcd::Etcd;
use crate::session::Session;
use crate::txn::{TxnOp, TxnOpResponse};
use crate::LivenessState;
use fleetcoord_sm::election::RwRole;
use std::time::Duration;

/// Where read-write locks live unless told otherwise: the root of lock
/// `name` is `<prefix><name>/`. Use a prefix of `""` to share a lock with
/// a Go program's `recipe.NewRWMutex(session, "<name>")`.
pub const DEFAULT_RWLOCK_PREFIX: &str = "/coord/rwlock/";

/// Which side of an [`RwLock`] a guard holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RwMode {
    /// Shared: other readers may hold at the same time, no writer.
    Read,
    /// Exclusive: nobody else holds.
    Write,
}

/// A distributed read-write lock: readers share it, a writer excludes
/// everyone.
///
/// Waiters queue in etcd by the create revision of their key, readers
/// under `<root>read/`, writers under `<root>write/` (the layout of Go's
/// `recipes.RWMutex`, so Go and Rust processes share a lock; the root is
/// `<prefix><name>/`, prefix [`DEFAULT_RWLOCK_PREFIX`] unless
/// [`LockOptions::prefix`] says otherwise). Guarantees:
/// * **A writer never holds beside anyone**: a writer holds once, in one
///   read at one revision, its key existed with its token and no key of
///   the lock was older; a reader once no writer's key was older. So a
///   holder that sees another holder's key older than its own is a reader
///   beside readers. Each belief ends before etcd can expire the holder's
///   lease (the election's deadline rule).
/// * **First come, first served, writers included**: a reader waits for
///   every *older* writer, so a writer that queued waits only for the
///   holders before it, and readers that come later queue behind it. A
///   stream of readers cannot starve a writer (nor writers a reader).
/// * **Fenced**: every guard has a fencing token (its key's create
///   revision) and [`RwLockGuard::txn_if_held`], which etcd runs only while
///   that key is the one it has. Tokens are unique; writers' tokens rise
///   from writer to writer, readers holding together may hold in any
///   token order.
/// * A holder that dies frees the lock when etcd expires its session's
///   lease (one TTL after its last renewal).
///
/// One handle holds at most one read and one write at a time (one key of
/// each side); a `write` asked while the same handle holds a read waits
/// for that read like any other (there is no upgrade): release it first.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::{Etcd, EtcdOptions, RwLock, TxnOp};
///
/// let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default())?;
/// let a = RwLock::new(&etcd, "catalog")?;
/// let b = RwLock::new(&etcd, "catalog")?;
/// let read_a = a.read()?;
/// let read_b = b.read()?; // readers share
/// assert!(a.try_write()?.is_none()); // a writer waits for both
/// read_a.unlock()?;
/// read_b.unlock()?;
/// let write = b.write()?;
/// let wrote = write.txn_if_held([TxnOp::put("/catalog/version", "7")])?;
/// assert!(wrote.is_some());
/// write.unlock()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "dropping the last handle of an RwLock revokes its session"]
pub struct RwLock {
    // Dropped before the session they run on.
    reader: Election,
    writer: Election,
    /// The lock's own session; `None` on a session of the caller's.
    own: Option<Session>,
    root: String,
}

impl RwLock {
    /// The read-write lock `name` (one key segment, as election names)
    /// under [`DEFAULT_RWLOCK_PREFIX`], with a 10 s session.
    pub fn new(etcd: &Etcd, name: &str) -> Result<RwLock> {
        crate::blocking::check()?;
        Self::with_options(etcd, name, LockOptions::default())
    }

    /// The read-write lock `name` with `options` (no prefix:
    /// [`DEFAULT_RWLOCK_PREFIX`]; `""` shares the lock with Go's
    /// `recipe.NewRWMutex(session, name)`). Starts its session (one lease
    /// for both sides) at once; locking waits for it.
    pub fn with_options(etcd: &Etcd, name: &str, options: LockOptions) -> Result<RwLock> {
        crate::blocking::check()?;
        // Names and options first: nothing is granted for a bad call.
        options.check_rwlock(name)?;
        let session = Session::with_options(etcd, options.session.clone())?;
        Self::open(&session.clone(), name, &options, Some(session))
    }

    /// The read-write lock `name` on `session` (see
    /// [`Election::with_session`]): both sides' keys are bound to the
    /// session's lease, whose settings apply (those of `options` are
    /// ignored). A lost session lease ends every guard held, as every lock
    /// on the session.
    pub fn with_session(session: &Session, name: &str, options: LockOptions) -> Result<RwLock> {
        crate::blocking::check()?;
        options.check_rwlock(name)?;
        Self::open(session, name, &options, None)
    }

    fn open(
        session: &Session,
        name: &str,
        options: &LockOptions,
        own: Option<Session>,
    ) -> Result<RwLock> {
        let election = options.to_election(DEFAULT_RWLOCK_PREFIX)?;
        let etcd = session.etcd();
        let side = |rw| Election::open(etcd, Some(session), name, election.clone(), 1, Some(rw));
        // A failure drops what was made: the elections leave the session,
        // and the last handle of an own session revokes its lease.
        let reader = side(RwRole::Read)?;
        let writer = side(RwRole::Write)?;
        let root = reader.key_prefix().to_string();
        Ok(RwLock {
            reader,
            writer,
            own,
            root,
        })
    }

    fn side(&self, mode: RwMode) -> &Election {
        match mode {
            RwMode::Read => &self.reader,
            RwMode::Write => &self.writer,
        }
    }

    /// Blocks until this handle holds a read (shared with other readers).
    /// A session lease lost while waiting is replaced and the wait goes on
    /// (see [`Election::campaign`]).
    pub fn read(&self) -> Result<RwLockGuard> {
        self.lock(RwMode::Read, None)
    }

    /// Blocks until this handle holds the write (nobody else holds).
    pub fn write(&self) -> Result<RwLockGuard> {
        self.lock(RwMode::Write, None)
    }

    /// [`RwLock::read`], giving up after `timeout` with
    /// [`Error::Timeout`](crate::Error::Timeout) (the waiting key is removed
    /// again; `Duration::MAX` means no timeout).
    pub fn read_timeout(&self, timeout: Duration) -> Result<RwLockGuard> {
        self.lock(RwMode::Read, Some(timeout))
    }

    /// [`RwLock::write`], giving up after `timeout` as
    /// [`RwLock::read_timeout`] does.
    pub fn write_timeout(&self, timeout: Duration) -> Result<RwLockGuard> {
        self.lock(RwMode::Write, Some(timeout))
    }

    /// Blocks until `mode` is held, or `timeout` passes (`None`: never).
    pub fn lock(&self, mode: RwMode, timeout: Option<Duration>) -> Result<RwLockGuard> {
        crate::blocking::check()?;
        let election = self.side(mode);
        let leadership = match timeout {
            Some(timeout) => election.campaign_timeout(b"", timeout)?,
            None => election.campaign(b"")?,
        };
        Ok(RwLockGuard { leadership, mode })
    }

    /// Takes a read only if no writer holds or waits ahead of it; never
    /// waits. `Ok(None)`: a writer is ahead (nothing is left behind).
    pub fn try_read(&self) -> Result<Option<RwLockGuard>> {
        self.try_lock(RwMode::Read)
    }

    /// Takes the write only if nobody holds or waits; never waits.
    /// `Ok(None)`: somebody is ahead (nothing is left behind).
    pub fn try_write(&self) -> Result<Option<RwLockGuard>> {
        self.try_lock(RwMode::Write)
    }

    fn try_lock(&self, mode: RwMode) -> Result<Option<RwLockGuard>> {
        crate::blocking::check()?;
        Ok(match self.side(mode).try_campaign(b"")? {
            TryCampaign::Elected(leadership) => Some(RwLockGuard { leadership, mode }),
            TryCampaign::NotElected(_) => None,
        })
    }

    /// The lock's root, `<prefix><name>/`: readers' keys are under
    /// `<root>read/`, writers' under `<root>write/`.
    pub fn key_prefix(&self) -> &str {
        &self.root
    }

    /// The session's state (granting, registered, suspended, lost), `None`
    /// before the session has reported one.
    pub fn session(&self) -> Option<LivenessState> {
        self.writer.session()
    }

    /// Until when the session is trusted, as
    /// [`Election::session_trusted_until`].
    pub fn session_trusted_until(&self) -> Option<std::time::Instant> {
        self.writer.session_trusted_until()
    }

    /// Leaves: releases what this handle holds, stops waiting, and (on its
    /// own session) revokes the session. An error means the lease will
    /// expire after its TTL instead. Waits on other threads return
    /// [`Error::Closed`](crate::Error::Closed) at once.
    pub fn close(&self) -> Result<()> {
        crate::blocking::check()?;
        let reader = self.reader.close();
        let writer = self.writer.close();
        let own = self.own.as_ref().map_or(Ok(()), Session::close);
        reader.and(writer).and(own)
    }
}

/// Holding one side of an [`RwLock`]. Dropping it releases without
/// waiting (as [`Leadership`] resigns on drop); [`RwLockGuard::unlock`]
/// waits for etcd.
#[derive(Debug)]
#[must_use = "dropping an RwLockGuard releases at once; keep it while you need the lock"]
pub struct RwLockGuard {
    leadership: Leadership,
    mode: RwMode,
}

impl RwLockGuard {
    /// Which side this guard holds.
    pub fn mode(&self) -> RwMode {
        self.mode
    }

    /// How long the call that took this guard waited for it (see
    /// [`Leadership::waited`]).
    pub fn waited(&self) -> Duration {
        self.leadership.waited()
    }

    /// Whether that call found the lock held against it and waited for a
    /// holder to go (see [`Leadership::contended`]).
    pub fn contended(&self) -> bool {
        self.leadership.contended()
    }

    /// How often the call that took this guard joined the queue: 1, plus
    /// one for each time it started over (see [`Leadership::attempts`]).
    pub fn attempts(&self) -> u32 {
        self.leadership.attempts()
    }

    /// The fencing token: this holder's key's create revision, unique to
    /// this hold; a writer's is greater than every earlier holder's.
    pub fn fencing_token(&self) -> i64 {
        self.leadership.fencing_token()
    }

    /// This holder's key (`<root>read/<lease hex>` or
    /// `<root>write/<lease hex>`).
    pub fn key(&self) -> &str {
        self.leadership.key()
    }

    /// Whether this holder may still act: false once the guard is lost or
    /// released, and before the session's lease can expire in etcd.
    pub fn is_held(&self) -> bool {
        self.leadership.is_held()
    }

    /// Receives `()` once if the guard is lost (not on unlock).
    pub fn lost(&self) -> &crossbeam_channel::Receiver<()> {
        self.leadership.lost()
    }

    /// Runs `ops` atomically only while this holder's key is still the one
    /// in etcd; `Ok(None)` when etcd refused (the guard is gone and nothing
    /// was applied). See [`Leadership::txn_if_leader`].
    pub fn txn_if_held(
        &self,
        ops: impl IntoIterator<Item = TxnOp>,
    ) -> Result<Option<Vec<TxnOpResponse>>> {
        crate::blocking::check()?;
        self.leadership.txn_if_leader(ops)
    }

    /// Releases and waits until etcd deleted the key, so the next waiter
    /// can take it: at most the request timeout, past which the driver
    /// finishes the release in the background (see [`Leadership::resign`]).
    pub fn unlock(self) -> Result<()> {
        crate::blocking::check()?;
        self.leadership.resign()
    }
}
