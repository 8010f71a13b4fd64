//! [`ElectionPool`]: many elections, one long-lived session each.

use super::{Election, ElectionOptions, Leadership, Pending, TryCampaign};
use crate::error::{Error, Result};
use crate::etcd::Etcd;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Campaigns on many election names, keeping one session (lease) per name
/// for as long as the pool lives.
///
/// The first campaign on a name creates its [`Election`] (and session);
/// later campaigns on that name reuse it, so a campaign/resign cycle costs
/// no lease grant or revoke. Each session self-heals. [`ElectionPool::close_election`]
/// ends one name's session, [`ElectionPool::close`] all of them and waits
/// for the revokes; dropping the pool asks for the same without waiting.
///
/// Names follow the rule of [`Election::new`]: one key segment, no `/`
/// (a name with `/` would nest inside another election of the pool). Every
/// method that takes a name refuses a bad one with
/// [`Error::InvalidArgument`] naming `"name"`, before any session starts.
/// The options are checked on the first campaign.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::{ElectionPool, Etcd, EtcdOptions};
///
/// let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default())?;
/// let pool = ElectionPool::new(&etcd);
/// let first = pool.campaign("shard-7", b"me")?;
/// let lease = first.lease();
/// first.resign()?;
/// let again = pool.campaign("shard-7", b"me")?;
/// assert_eq!(again.lease(), lease, "the session is reused");
/// # drop(again);
/// pool.close()?;
/// # Ok(()) }
/// ```
#[must_use = "dropping an ElectionPool leaves every election of the pool"]
pub struct ElectionPool {
    etcd: Etcd,
    options: ElectionOptions,
    /// The shared session every election of the pool runs on, if any.
    session: Option<crate::Session>,
    elections: Mutex<HashMap<String, Arc<Election>>>,
    closed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for ElectionPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectionPool")
            .field("names", &self.elections.lock().len())
            .finish()
    }
}

impl ElectionPool {
    /// A pool with default [`ElectionOptions`].
    pub fn new(etcd: &Etcd) -> ElectionPool {
        Self::with_options(etcd, ElectionOptions::default())
    }

    /// A pool whose elections all use `options`.
    pub fn with_options(etcd: &Etcd, options: ElectionOptions) -> ElectionPool {
        ElectionPool {
            etcd: etcd.clone(),
            options,
            session: None,
            elections: Mutex::new(HashMap::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A pool whose elections all run on `session` (see
    /// [`Election::with_session`]): one lease for every name instead of one
    /// per name. [`ElectionPool::close_election`] and [`ElectionPool::close`]
    /// delete the names' keys and leave the session running.
    pub fn with_session(session: &crate::Session, options: ElectionOptions) -> ElectionPool {
        ElectionPool {
            etcd: session.etcd().clone(),
            options,
            session: Some(session.clone()),
            elections: Mutex::new(HashMap::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The election for `name`, created (with its session) on first use.
    pub fn election(&self, name: &str) -> Result<Arc<Election>> {
        crate::blocking::check()?;
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        let mut elections = self.elections.lock();
        if let Some(e) = elections.get(name) {
            return Ok(e.clone());
        }
        let election = Arc::new(match &self.session {
            Some(session) => Election::with_session(session, name, self.options.clone())?,
            None => Election::with_options(&self.etcd, name, self.options.clone())?,
        });
        elections.insert(name.to_string(), election.clone());
        Ok(election)
    }

    /// Campaign on `name`; blocks until leader. See [`Election::campaign`].
    pub fn campaign(&self, name: &str, value: &[u8]) -> Result<Leadership> {
        crate::blocking::check()?;
        self.election(name)?.campaign(value)
    }

    /// Campaign on `name` for at most `timeout`.
    pub fn campaign_timeout(
        &self,
        name: &str,
        value: &[u8],
        timeout: Duration,
    ) -> Result<Leadership> {
        crate::blocking::check()?;
        self.election(name)?.campaign_timeout(value, timeout)
    }

    /// Start a campaign on `name` and return at once; see
    /// [`Election::start_campaign`] and [`Pending`]. [`ElectionPool::close`]
    /// or [`ElectionPool::close_election`] of `name` ends it ([`Error::Closed`]).
    pub fn start_campaign(&self, name: &str, value: &[u8]) -> Result<Pending<Leadership>> {
        crate::blocking::check()?;
        self.election(name)?.start_campaign(value)
    }

    /// Campaign on `name` until leader or `stop`; see
    /// [`Election::campaign_until`].
    pub fn campaign_until(
        &self,
        name: &str,
        value: &[u8],
        stop: &crossbeam_channel::Receiver<()>,
    ) -> Result<Option<Leadership>> {
        crate::blocking::check()?;
        self.election(name)?.campaign_until(value, stop)
    }

    /// Become leader of `name` only if nobody else is.
    pub fn try_campaign(&self, name: &str, value: &[u8]) -> Result<TryCampaign> {
        crate::blocking::check()?;
        self.election(name)?.try_campaign(value)
    }

    /// Close the election for `name`, as [`Election::close`] would: its
    /// own session ends (its lease revoked), or on a shared session its
    /// keys are deleted and the session left running. A later campaign on
    /// `name` starts afresh. (Not `release`: elsewhere that hands back
    /// what a holder holds, a permit or a shard, and nothing more.)
    pub fn close_election(&self, name: &str) -> Result<()> {
        crate::blocking::check()?;
        let election = self.elections.lock().remove(name);
        match election.map(Arc::try_unwrap) {
            Some(Ok(e)) => e.close(),
            // Still shared by a caller of `election()`: it stops when they drop it.
            Some(Err(_)) | None => Ok(()),
        }
    }

    /// End every session. Later calls return [`Error::Closed`]. Any thread
    /// may close: a campaign waiting on the pool in another thread
    /// (blocking, timed, or a [`Pending`] wait) returns [`Error::Closed`]
    /// within milliseconds, its key removed with the session's revoke.
    pub fn close(&self) -> Result<()> {
        crate::blocking::check()?;
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let elections: Vec<Arc<Election>> = self.elections.lock().drain().map(|(_, e)| e).collect();
        // Stop every session first, then wait: with etcd down each stop
        // takes its full grace period, and they should overlap.
        for e in &elections {
            e.begin_close();
        }
        let mut first_error = None;
        for e in &elections {
            if let Err(err) = e.wait_closed() {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

// Drop never waits for etcd: every session is asked to stop (revoke) and
// the driver finishes that in the background, as for `Leadership`.
impl Drop for ElectionPool {
    fn drop(&mut self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        for (_, election) in self.elections.lock().drain() {
            election.begin_close();
        }
    }
}
