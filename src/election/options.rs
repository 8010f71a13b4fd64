//! [`ElectionOptions`]: how an election is configured, and the key prefix
//! its candidates use. A file of its own because [`Election`], [`Mutex`]
//! and [`ElectionPool`] all take these options.
//!
//! [`Mutex`]: crate::Mutex

use crate::error::Result;
use crate::session::SessionOptions;
use crate::validate;
use std::time::Duration;

#[cfg(doc)]
use super::{Election, ElectionPool, Leadership};

/// Where elections live unless told otherwise.
pub const DEFAULT_ELECTION_PREFIX: &str = "/coord/election/";

/// Settings for [`Election::with_options`] and [`ElectionPool`].
///
/// Start from [`ElectionOptions::default`] and change what you need with the
/// `with_*` methods; the fields are public for reading. `#[non_exhaustive]`
/// so that new settings are not a breaking change.
///
/// ```
/// use fleetcoord::ElectionOptions;
/// use std::time::Duration;
///
/// // Share elections with `etcdctl elect <name>`, with a 5 s session.
/// let options = ElectionOptions::default().with_prefix("").with_ttl(Duration::from_secs(5));
/// assert_eq!(options.prefix, "");
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ElectionOptions {
    /// Prepended to the election name; candidate keys are
    /// `<prefix><name>/<lease id hex>`. Default [`DEFAULT_ELECTION_PREFIX`].
    /// Use `""` to share an election with `etcdctl elect <name>`, whose keys
    /// are `<name>/<lease id hex>`.
    pub prefix: String,
    /// The lease settings: TTL, safety margin and clock drift allowance,
    /// as every session has them (default TTL 10 s; a leader that dies is
    /// replaced about one TTL after its last renewal; the margin is how long
    /// before etcd can expire the lease this candidate stops believing it
    /// leads) ([`SessionOptions`]). The `with_ttl`,
    /// `with_safety_margin` and `with_drift_allowance_ppm` builders set
    /// them here.
    pub session: SessionOptions,
    /// This candidate's priority, `None` (the default) for a plain
    /// candidate. See [`ElectionOptions::with_priority`].
    pub priority: Option<u32>,
    /// Whether a leader resigns at once when a candidate of a higher
    /// priority waits. See [`ElectionOptions::with_yield_to_higher`].
    pub yield_to_higher: bool,
}

impl Default for ElectionOptions {
    fn default() -> Self {
        ElectionOptions {
            prefix: DEFAULT_ELECTION_PREFIX.into(),
            session: SessionOptions::default(),
            priority: None,
            yield_to_higher: false,
        }
    }
}

impl ElectionOptions {
    /// These options with [`ElectionOptions::prefix`] set (checked when the
    /// election is joined).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// These options with the session's TTL ([`SessionOptions::ttl`]) set
    /// (checked when the election is joined).
    #[must_use]
    pub const fn with_ttl(mut self, ttl: Duration) -> Self {
        self.session.ttl = ttl;
        self
    }

    /// These options with the session's safety margin
    /// ([`SessionOptions::safety_margin`]) set (at most half of the TTL
    /// less the drift allowance, checked when the election is joined).
    #[must_use]
    pub const fn with_safety_margin(mut self, margin: Duration) -> Self {
        self.session.safety_margin = margin;
        self
    }

    /// These options with the session's drift allowance
    /// ([`SessionOptions::drift_allowance_ppm`]) set (at most 100,000,
    /// checked when the election is joined).
    #[must_use]
    pub const fn with_drift_allowance_ppm(mut self, ppm: u32) -> Self {
        self.session.drift_allowance_ppm = ppm;
        self
    }

    /// These options with [`ElectionOptions::priority`] set: campaigns
    /// join *ranked*. Among waiting ranked candidates, the highest
    /// priority is elected next (equal priorities: first come); a ranked
    /// leader with a lower priority than a waiting candidate is told
    /// ([`Leadership::step_down_requested`]). The priority is published in
    /// a side key on the session lease, outside the candidate prefix.
    /// Candidates that did not opt in (plain fleetcoord candidates, Go's
    /// `concurrency` package, `etcdctl elect`) keep their place in the
    /// queue: they are never moved back. `with_priority(0)` joins ranked
    /// at the lowest priority, which lets a [`Leadership::hand_over`] move
    /// this candidate back. Fencing is unchanged: the leader is the oldest
    /// key, its token that key's create revision (README, "Leader
    /// preference and hand-over").
    #[must_use]
    pub const fn with_priority(mut self, priority: u32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// These options with [`ElectionOptions::yield_to_higher`] set: while
    /// leading, resign at once (belief ends first, then the fenced delete,
    /// as [`Leadership::resign`]) when a ranked candidate of a higher
    /// priority waits; [`Leadership::lost`] and
    /// [`Leadership::step_down_requested`] fire. Joins ranked (at priority
    /// 0 unless [`ElectionOptions::with_priority`] says otherwise).
    #[must_use]
    pub const fn with_yield_to_higher(mut self, yield_to_higher: bool) -> Self {
        self.yield_to_higher = yield_to_higher;
        self
    }

    /// The rank campaigns with these options join with; `None` for plain
    /// campaigns (today's keys and requests, Go-compatible).
    pub(super) fn rank(&self) -> Option<fleetcoord_sm::election::Rank> {
        (self.priority.is_some() || self.yield_to_higher).then(|| fleetcoord_sm::election::Rank {
            priority: self.priority.unwrap_or(0),
            yield_to_higher: self.yield_to_higher,
        })
    }

    /// How long a session with these options trusts its lease, counted
    /// from the send of its last acknowledged renewal: the TTL less the
    /// drift allowance, less the safety margin (for the requested TTL; etcd
    /// may grant a longer one, which is then trusted longer). A leader
    /// whose renewals stop holds at most this long; the keepalive renews
    /// every third of it.
    ///
    /// ```
    /// use fleetcoord::ElectionOptions;
    /// use std::time::Duration;
    ///
    /// // 10 s less 1 % less 250 ms.
    /// assert_eq!(ElectionOptions::default().trusted_lifetime(), Duration::from_millis(9_650));
    /// ```
    pub fn trusted_lifetime(&self) -> Duration {
        self.session.trusted_lifetime()
    }

    /// The checks [`Election::with_options`] makes of `name` and these
    /// options before it sends anything (the name one key segment, the
    /// prefix, the session's TTL and trust settings), without a
    /// connection: `Ok` here means they will not be refused as
    /// [`crate::Error::InvalidArgument`], so a tool can refuse a bad name
    /// before it connects.
    ///
    /// ```
    /// use fleetcoord::ElectionOptions;
    ///
    /// assert!(ElectionOptions::default().check("scheduler").is_ok());
    /// assert!(ElectionOptions::default().check("a/b").is_err());
    /// ```
    pub fn check(&self, name: &str) -> Result<()> {
        election_prefix(name, self)?;
        self.session.validate()
    }
}

/// `<prefix><name>/`, after checking both. The name is one segment (no
/// `/`): that is what keeps elections under one prefix independent, see
/// [`Election::new`].
pub(super) fn election_prefix(name: &str, options: &ElectionOptions) -> Result<String> {
    validate::election_name("name", name)?;
    if !options.prefix.is_empty() {
        validate::prefix("prefix", &options.prefix)?;
    }
    Ok(format!("{}{}/", options.prefix, name))
}
