//! [`Semaphore`]: a fenced distributed semaphore of N permits.
//!
//! A semaphore is the election protocol with N holders: waiters queue in
//! etcd by the create revision of their key, and a waiter holds once fewer
//! than N keys are older than its own. It is an [`Election`] run with
//! `permits` = N, so the session, the guard on the own key, the fence and
//! the deadline rule (a holder stops believing before etcd can expire its
//! lease) are the election's.

use super::{Election, Leadership, LockOptions, Pending, TryCampaign};
use crate::error::{Error, Result};
use crate::etcd::Etcd;
use crate::txn::{TxnOp, TxnOpResponse};
use crate::LivenessState;
use fleetcoord_sm::rpc::{KeyRange, RangeRequest, Request, SortOrder};
use fleetcoord_sm::Response;
use std::time::Duration;

/// Where semaphores live unless told otherwise.
pub const DEFAULT_SEMAPHORE_PREFIX: &str = "/coord/semaphore/";

/// How many of the oldest keys [`Semaphore::with_options`] reads to check
/// that they agree on the number of permits: every holder is among them
/// as long as `permits` is at most this, which covers any sane use.
const MISMATCH_READ: i64 = 128;

/// A distributed semaphore: at most `permits` holders at once.
///
/// Waiters queue in etcd as keys `<prefix><name>/<lease id hex>` (bound
/// to the session lease, as [`Election`] candidates), each with the value
/// of its `permits` in ASCII decimal (`b"2"`). A waiter holds once fewer
/// than `permits` keys are older than its own, checked together with its
/// own key in one read, so:
///
/// * At most `permits` [`SemaphoreGuard`]s with
///   [`SemaphoreGuard::is_held`] true exist at any instant, and none once
///   etcd has expired its session lease: a holder stops believing at its
///   session's local deadline, before etcd can expire the lease and let a
///   waiter in (same conditions as [`Election`]: this clock runs no slower
///   than the drift allowance permits, no pause longer than the safety
///   margin; the fencing token covers the rest).
/// * A waiter watches exactly the `permits` keys nearest ahead of it: a
///   release or expiry wakes only the waiters whose rank it can change,
///   never the whole queue.
/// * Liveness: a released permit goes to the oldest waiter within about a
///   read and a watch event; a holder whose session dies frees its permit
///   when etcd expires the lease (about the TTL).
///
/// **Mismatched permits.** Each process counts with its own `permits`: a
/// waiter with N holds while fewer than N keys are older than its own.
/// Processes sharing one name with different counts therefore never have
/// more than max(N) holders at once (the k-th oldest key holds only if k is
/// below its own N), but one with a smaller N may wait while a permit of a
/// larger N is free. To catch the mistake, [`Semaphore::with_options`]
/// reads the oldest 128 keys of the name and fails with
/// [`Error::InvalidArgument`] naming `"permits"` if any of them carries a
/// different count (or a value that is no count, such as another tool's
/// key under the same prefix). Processes that join concurrently are not
/// checked against each other.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::{Etcd, EtcdOptions, Semaphore, TxnOp};
///
/// let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default())?;
/// let uploads = Semaphore::new(&etcd, "uploads", 2)?;
/// let first = uploads.acquire()?; // blocks until a permit is held
/// let second = Semaphore::new(&etcd, "uploads", 2)?.try_acquire()?;
/// assert!(second.is_some(), "two permits");
/// assert!(Semaphore::new(&etcd, "uploads", 2)?.try_acquire()?.is_none());
/// // Write only while the permit is still ours in etcd.
/// let wrote = first.txn_if_held([TxnOp::put("/uploads/slot-a", "host-a")])?;
/// assert!(wrote.is_some());
/// first.release()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "dropping the last handle of a Semaphore revokes its session"]
pub struct Semaphore {
    election: Election,
    permits: u32,
}

impl Semaphore {
    /// The semaphore `name` (one key segment, as election names) of
    /// `permits` permits under [`DEFAULT_SEMAPHORE_PREFIX`], with a 10 s
    /// session. `permits` 0 is [`Error::InvalidArgument`].
    pub fn new(etcd: &Etcd, name: &str, permits: u32) -> Result<Semaphore> {
        crate::blocking::check()?;
        Self::with_options(etcd, name, permits, LockOptions::default())
    }

    /// The semaphore `name` of `permits` permits with `options` (no
    /// prefix: [`DEFAULT_SEMAPHORE_PREFIX`]). Checks the permits of the
    /// keys already there (see "Mismatched permits" above), then starts
    /// the session; acquiring waits for it. Unlike [`Mutex::new`](crate::Mutex::new), it needs
    /// etcd to answer that one read (within the request timeout): an
    /// unreachable etcd is the read's error, not a semaphore that waits.
    pub fn with_options(
        etcd: &Etcd,
        name: &str,
        permits: u32,
        options: LockOptions,
    ) -> Result<Semaphore> {
        crate::blocking::check()?;
        at_least_one(permits)?;
        // No priority: LockOptions has none (with N holders there is no
        // single next leader to order).
        let options = options.to_election(DEFAULT_SEMAPHORE_PREFIX)?;
        let prefix = super::options::election_prefix(name, &options)?;
        check_permits(etcd, &prefix, permits)?;
        Ok(Semaphore {
            election: Election::with_permits(etcd, name, options, permits)?,
            permits,
        })
    }

    /// The semaphore `name` of `permits` permits on `session` (see
    /// [`Election::with_session`]): the holder's key is bound to the
    /// session's lease, whose settings apply (those of `options` are
    /// ignored). A lost session lease ends the permit held, as every lock
    /// and leadership on the session. Checks the permits as
    /// [`Semaphore::with_options`] does.
    pub fn with_session(
        session: &crate::Session,
        name: &str,
        permits: u32,
        options: LockOptions,
    ) -> Result<Semaphore> {
        crate::blocking::check()?;
        at_least_one(permits)?;
        let etcd = session.etcd();
        let options = options.to_election(DEFAULT_SEMAPHORE_PREFIX)?;
        let prefix = super::options::election_prefix(name, &options)?;
        check_permits(etcd, &prefix, permits)?;
        Ok(Semaphore {
            election: Election::open(etcd, Some(session), name, options, permits, None)?,
            permits,
        })
    }

    /// The number of permits this handle counts with.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    fn value(&self) -> Vec<u8> {
        self.permits.to_string().into_bytes()
    }

    /// Blocks until this handle holds a permit. A session lease lost while
    /// waiting is replaced and the wait goes on (see [`Election::campaign`]).
    pub fn acquire(&self) -> Result<SemaphoreGuard> {
        crate::blocking::check()?;
        self.election
            .campaign(&self.value())
            .map(SemaphoreGuard::new)
    }

    /// [`Semaphore::acquire`], giving up after `timeout` with
    /// [`Error::Timeout`] at the deadline, whatever etcd does; the waiting
    /// key is removed in the background (retried until etcd confirms, or
    /// it goes with the session), so a waiter that gave up never holds the
    /// queue. `Duration::MAX` means no timeout.
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<SemaphoreGuard> {
        crate::blocking::check()?;
        self.election
            .campaign_timeout(&self.value(), timeout)
            .map(SemaphoreGuard::new)
    }

    /// Queue for a permit and return at once: the waiting key keeps its
    /// place until the [`Pending`] is won, canceled, dropped or closed,
    /// however it is waited on (in slices, from several threads, or
    /// canceled from another). See [`Pending`].
    pub fn start_acquire(&self) -> Result<Pending<SemaphoreGuard>> {
        crate::blocking::check()?;
        self.election.start(&self.value(), SemaphoreGuard::new)
    }

    /// [`Semaphore::acquire`] until `stop` receives a message or is
    /// disconnected: `Ok(None)` then, the waiting key withdrawn (etcd
    /// confirmed it) before the return. See [`Election::campaign_until`].
    pub fn acquire_until(
        &self,
        stop: &crossbeam_channel::Receiver<()>,
    ) -> Result<Option<SemaphoreGuard>> {
        crate::blocking::check()?;
        self.start_acquire()?.until(stop)
    }

    /// Takes a permit only if fewer than `permits` keys are ahead (holders
    /// or waiters); never waits for other holders. `Ok(None)`: all permits
    /// are taken or queued for (the own key is removed again).
    pub fn try_acquire(&self) -> Result<Option<SemaphoreGuard>> {
        crate::blocking::check()?;
        Ok(match self.election.try_campaign(&self.value())? {
            TryCampaign::Elected(leadership) => Some(SemaphoreGuard::new(leadership)),
            TryCampaign::NotElected(_) => None,
        })
    }

    /// The key prefix waiters of this semaphore use (`<prefix><name>/`).
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

    /// Leaves: releases the permit if held, stops waiting, revokes the
    /// session. An error means the lease will expire after its TTL instead.
    /// Takes `&self`: an acquire waited on in another thread returns
    /// [`Error::Closed`] at once (see [`Election::close`]).
    pub fn close(&self) -> Result<()> {
        crate::blocking::check()?;
        self.election.close()
    }
}

/// Fails if one of the oldest keys under `prefix` carries another count of
/// permits than `permits` (see "Mismatched permits" on [`Semaphore`]).
fn check_permits(etcd: &Etcd, prefix: &str, permits: u32) -> Result<()> {
    let read = Request::Range(RangeRequest {
        range: KeyRange::Prefix(prefix.as_bytes().to_vec()),
        sort: SortOrder::CreateAscending,
        limit: MISMATCH_READ,
        max_create_revision: 0,
        revision: 0,
        // The values are the permit counts compared; the limit bounds
        // what etcd sends to MISMATCH_READ of them.
        keys_only: false,
    });
    let kvs = match etcd.request(read)? {
        Response::Range { kvs, .. } => kvs,
        other => return Err(Error::unexpected(other)),
    };
    for kv in kvs {
        let theirs = std::str::from_utf8(&kv.value)
            .ok()
            .and_then(|v| v.parse::<u32>().ok());
        if theirs != Some(permits) {
            let key = String::from_utf8_lossy(&kv.key);
            let found = match theirs {
                Some(n) => format!("{n} permits"),
                None => "a value that is no permit count".to_string(),
            };
            return Err(Error::invalid(
                "permits",
                format!(
                    "{key} uses this semaphore with {found}, this process with {permits}: \
                     every process of one semaphore must count the same permits"
                ),
            ));
        }
    }
    Ok(())
}

/// Holding one permit of a [`Semaphore`]. Dropping it releases without
/// waiting (as [`Leadership`] resigns on drop); [`SemaphoreGuard::release`]
/// waits for etcd.
#[derive(Debug)]
#[must_use = "dropping a SemaphoreGuard releases the permit at once; keep it while you need it"]
pub struct SemaphoreGuard {
    leadership: Leadership,
}

impl SemaphoreGuard {
    fn new(leadership: Leadership) -> SemaphoreGuard {
        SemaphoreGuard { leadership }
    }

    /// How long the call that took this permit waited for it (see
    /// [`Leadership::waited`]).
    pub fn waited(&self) -> std::time::Duration {
        self.leadership.waited()
    }

    /// Whether that call found every permit held and waited for a holder to
    /// go (see [`Leadership::contended`]).
    pub fn contended(&self) -> bool {
        self.leadership.contended()
    }

    /// How often the call that took this permit joined the queue (see
    /// [`Leadership::attempts`]).
    pub fn attempts(&self) -> u32 {
        self.leadership.attempts()
    }

    /// The fencing token: this holder's key's create revision. Unique to
    /// this holding, and greater than the token of every holder whose key
    /// was created before this one queued; up to `permits` tokens are
    /// current at once. Pass it with writes to resources that can refuse
    /// stale holders.
    pub fn fencing_token(&self) -> i64 {
        self.leadership.fencing_token()
    }

    /// This holder's key (`<prefix><name>/<lease hex>`).
    pub fn key(&self) -> &str {
        self.leadership.key()
    }

    /// Whether this holder may still act: false once the permit is lost or
    /// released, and before the session's lease can expire in etcd (judged
    /// by the calling thread's clock, see [`Leadership::is_held`]).
    pub fn is_held(&self) -> bool {
        self.leadership.is_held()
    }

    /// Receives `()` once if the permit is lost (session deadline passed,
    /// lease lost, key deleted), not on release; it fires before etcd can
    /// hand the permit to a waiter.
    pub fn lost(&self) -> &crossbeam_channel::Receiver<()> {
        self.leadership.lost()
    }

    /// Runs `ops` atomically only while this holder's key is still the one
    /// in etcd; `Ok(None)` when etcd refused (the permit is gone and
    /// nothing was applied). See [`Leadership::txn_if_leader`].
    pub fn txn_if_held(
        &self,
        ops: impl IntoIterator<Item = TxnOp>,
    ) -> Result<Option<Vec<TxnOpResponse>>> {
        crate::blocking::check()?;
        self.leadership.txn_if_leader(ops)
    }

    /// Releases the permit and waits until etcd deleted the key, so the
    /// next waiter can take it: at most the request timeout, past which the
    /// driver finishes the release in the background (see
    /// [`Leadership::resign`]).
    pub fn release(self) -> Result<()> {
        crate::blocking::check()?;
        self.leadership.resign()
    }
}

/// A semaphore of no permits could never be acquired: refused up front.
fn at_least_one(permits: u32) -> Result<()> {
    if permits == 0 {
        return Err(Error::invalid(
            "permits",
            "a semaphore needs at least one permit",
        ));
    }
    Ok(())
}
