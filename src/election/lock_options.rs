//! [`LockOptions`]: how a [`Mutex`], a [`Semaphore`] or an [`RwLock`] is
//! configured. Not
//! [`ElectionOptions`]: a lock made with election options took their
//! prefix, the elections' namespace, where it queued behind the election
//! of the same name. A lock's options have no prefix of their own unless
//! one is given, so they always land in the lock's own namespace.
//!
//! [`Mutex`]: crate::Mutex
//! [`Semaphore`]: crate::Semaphore
//! [`RwLock`]: crate::RwLock

use super::options::{ElectionOptions, DEFAULT_ELECTION_PREFIX};
use crate::error::{Error, Result};
use crate::liveness::DEFAULT_HOSTS_PREFIX;
use crate::session::SessionOptions;
use std::time::Duration;

use super::mutex::DEFAULT_LOCK_PREFIX;
use super::rwlock::DEFAULT_RWLOCK_PREFIX;
use super::semaphore::DEFAULT_SEMAPHORE_PREFIX;

/// Settings of a [`Mutex`](crate::Mutex) or a
/// [`Semaphore`](crate::Semaphore): where its keys live and its session.
///
/// Start from [`LockOptions::default`] (the primitive's own namespace,
/// [`DEFAULT_LOCK_PREFIX`] or [`DEFAULT_SEMAPHORE_PREFIX`], and a 10 s
/// session) and change what you need with the `with_*` methods; the fields
/// are public for reading. `#[non_exhaustive]` so that new settings are not
/// a breaking change.
///
/// ```
/// use fleetcoord::LockOptions;
/// use std::time::Duration;
///
/// // Share a lock with `etcdctl lock <name>`, with a 5 s session.
/// let options = LockOptions::default().with_prefix("").with_ttl(Duration::from_secs(5));
/// assert_eq!(options.prefix.as_deref(), Some(""));
/// assert_eq!(LockOptions::default().prefix, None); // the lock's own namespace
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LockOptions {
    /// Prepended to the name; holder keys are `<prefix><name>/<lease id
    /// hex>`. `None` (the default): the primitive's own namespace,
    /// [`DEFAULT_LOCK_PREFIX`] for a mutex, [`DEFAULT_SEMAPHORE_PREFIX`] for
    /// a semaphore. `""` shares a lock with `etcdctl lock <name>`. Another
    /// primitive's default namespace (elections', hosts', the other
    /// lock's) is refused with [`Error::InvalidArgument`]: a lock there
    /// would queue behind, or be counted as, that primitive's keys.
    pub prefix: Option<String>,
    /// The lease settings: TTL, safety margin and clock drift allowance,
    /// as every session has them (default TTL 10 s: a holder that dies frees
    /// the lock about one TTL after its last renewal) ([`SessionOptions`]). The `with_ttl`,
    /// `with_safety_margin` and `with_drift_allowance_ppm` builders set
    /// them here.
    pub session: SessionOptions,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            prefix: None,
            session: ElectionOptions::default().session,
        }
    }
}

impl LockOptions {
    /// These options with [`LockOptions::prefix`] set (checked when the
    /// lock is made).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// These options with the session's TTL ([`SessionOptions::ttl`]) set
    /// (checked when the lock is made).
    #[must_use]
    pub const fn with_ttl(mut self, ttl: Duration) -> Self {
        self.session.ttl = ttl;
        self
    }

    /// These options with the session's safety margin
    /// ([`SessionOptions::safety_margin`]) set (checked when the lock is
    /// made).
    #[must_use]
    pub const fn with_safety_margin(mut self, margin: Duration) -> Self {
        self.session.safety_margin = margin;
        self
    }

    /// These options with the session's drift allowance
    /// ([`SessionOptions::drift_allowance_ppm`]) set (checked when the lock
    /// is made).
    #[must_use]
    pub const fn with_drift_allowance_ppm(mut self, ppm: u32) -> Self {
        self.session.drift_allowance_ppm = ppm;
        self
    }

    /// How long a holder with these options trusts its session; see
    /// [`ElectionOptions::trusted_lifetime`].
    pub fn trusted_lifetime(&self) -> Duration {
        self.election_options("").trusted_lifetime()
    }

    /// The checks [`crate::Mutex::with_options`] (`semaphore` false) or
    /// [`crate::Semaphore::with_options`] (true) make of `name` and these
    /// options before sending anything, without a connection: `Ok` here
    /// means they will not be refused as [`Error::InvalidArgument`].
    ///
    /// ```
    /// use fleetcoord::LockOptions;
    ///
    /// assert!(LockOptions::default().check("nightly-backup", false).is_ok());
    /// assert!(LockOptions::default().check("foo/bar", false).is_err());
    /// ```
    pub fn check(&self, name: &str, semaphore: bool) -> Result<()> {
        let own = if semaphore {
            DEFAULT_SEMAPHORE_PREFIX
        } else {
            DEFAULT_LOCK_PREFIX
        };
        self.to_election(own)?.check(name)
    }

    /// The checks [`crate::RwLock::with_options`] makes of `name` and these
    /// options before sending anything, without a connection, as
    /// [`LockOptions::check`] for the other locks.
    ///
    /// ```
    /// use fleetcoord::LockOptions;
    ///
    /// assert!(LockOptions::default().check_rwlock("catalog").is_ok());
    /// assert!(LockOptions::default().check_rwlock("cat/alog").is_err());
    /// ```
    pub fn check_rwlock(&self, name: &str) -> Result<()> {
        self.to_election(DEFAULT_RWLOCK_PREFIX)?.check(name)
    }

    /// The election options of the lock protocol, in the namespace
    /// `own` (the primitive's default prefix) unless a prefix was given;
    /// a given prefix that is another primitive's default namespace is
    /// refused.
    pub(super) fn to_election(&self, own: &str) -> Result<ElectionOptions> {
        if let Some(prefix) = &self.prefix {
            let others = [
                DEFAULT_ELECTION_PREFIX,
                DEFAULT_HOSTS_PREFIX,
                DEFAULT_LOCK_PREFIX,
                DEFAULT_SEMAPHORE_PREFIX,
                DEFAULT_RWLOCK_PREFIX,
            ];
            if let Some(taken) = others.iter().find(|p| **p != own && **p == prefix) {
                return Err(Error::invalid(
                    "prefix",
                    format!(
                        "{taken:?} is another primitive's namespace; a lock there would \
                         queue behind, or be counted as, its keys (leave the prefix unset \
                         for the lock's own, {own:?})"
                    ),
                ));
            }
        }
        Ok(self.election_options(own))
    }

    fn election_options(&self, own: &str) -> ElectionOptions {
        let mut options = ElectionOptions::default()
            .with_prefix(self.prefix.clone().unwrap_or_else(|| own.to_string()));
        options.session = self.session.clone();
        options
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_prefix_means_the_primitives_own_namespace() {
        let options = LockOptions::default().with_ttl(Duration::from_secs(3));
        for own in [DEFAULT_LOCK_PREFIX, DEFAULT_SEMAPHORE_PREFIX] {
            let election = options.to_election(own).unwrap();
            assert_eq!(election.prefix, own);
            assert_eq!(election.session.ttl, Duration::from_secs(3));
            assert_eq!((election.priority, election.yield_to_higher), (None, false));
        }
        let shared = LockOptions::default().with_prefix("");
        assert_eq!(shared.to_election(DEFAULT_LOCK_PREFIX).unwrap().prefix, "");
        let own = LockOptions::default().with_prefix(DEFAULT_LOCK_PREFIX);
        assert!(own.to_election(DEFAULT_LOCK_PREFIX).is_ok());
    }

    #[test]
    fn another_primitives_namespace_is_refused() {
        for (own, other) in [
            (DEFAULT_LOCK_PREFIX, DEFAULT_ELECTION_PREFIX),
            (DEFAULT_LOCK_PREFIX, DEFAULT_SEMAPHORE_PREFIX),
            (DEFAULT_LOCK_PREFIX, DEFAULT_HOSTS_PREFIX),
            (DEFAULT_SEMAPHORE_PREFIX, DEFAULT_ELECTION_PREFIX),
            (DEFAULT_SEMAPHORE_PREFIX, DEFAULT_LOCK_PREFIX),
            (DEFAULT_RWLOCK_PREFIX, DEFAULT_LOCK_PREFIX),
            (DEFAULT_LOCK_PREFIX, DEFAULT_RWLOCK_PREFIX),
        ] {
            match LockOptions::default().with_prefix(other).to_election(own) {
                Err(Error::InvalidArgument { what: "prefix", .. }) => {}
                r => panic!("{own} with {other}: {:?}", r.map(|o| o.prefix)),
            }
        }
    }

    #[test]
    fn trusted_lifetime_is_the_sessions() {
        let options = LockOptions::default();
        assert_eq!(
            options.trusted_lifetime(),
            ElectionOptions::default().trusted_lifetime()
        );
    }
}
