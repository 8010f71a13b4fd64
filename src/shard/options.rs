//! [`ShardOptions`]: how a member of a shard map is configured, the
//! map's key prefix, and the checks on both.

use crate::error::{Error, Result};
use crate::session::SessionOptions;
use crate::validate;
use std::time::Duration;

/// Where shard maps live unless told otherwise: map `jobs` is under
/// `/coord/shards/jobs/`.
pub const DEFAULT_SHARDS_PREFIX: &str = "/coord/shards/";

/// The most shards a map may have. Every member places every shard again
/// at each membership change and reads the whole map at start and after a
/// broken watch, so the cost of a member grows with the shard count;
/// 4,096 keeps one such read well inside etcd's default request size
/// limit. Beyond that, map several items to one shard.
pub const MAX_SHARDS: u32 = 4096;

/// Settings for [`ShardMap::join`](super::ShardMap::join).
///
/// Start from [`ShardOptions::default`] and change what you need with the
/// `with_*` methods; the fields are public for reading. `#[non_exhaustive]`
/// so that new settings are not a breaking change.
///
/// ```
/// use fleetcoord::ShardOptions;
/// use std::time::Duration;
///
/// let options = ShardOptions::default()
///     .with_member("host-a")
///     .with_weight(2)
///     .with_drain(Duration::from_secs(3));
/// assert_eq!(options.prefix, "/coord/shards/");
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ShardOptions {
    /// Prepended to the map's name: its keys are under `<prefix><name>/`.
    /// Starts and ends with `/`. Default [`DEFAULT_SHARDS_PREFIX`].
    pub prefix: String,
    /// This member's id: one key segment, unique among the map's live
    /// members (the map tells members apart by id alone). `None` (the
    /// default): a new random UUID at each join.
    pub member: Option<String>,
    /// This member's share of the shards, relative to the others'
    /// (weighted rendezvous hashing); 0 joins as an observer that is never
    /// placed. Default 1.
    pub weight: u32,
    /// How long the user may drain a shard after
    /// [`ShardEvent::Release`](super::ShardEvent::Release) before the map
    /// releases it itself; never longer than the session's trusted
    /// lifetime. Default 5 s.
    pub drain: Duration,
    /// The session lease's settings, used by [`ShardMap::join`](super::ShardMap::join)
    /// (a member on a shared [`Session`](crate::Session) has that
    /// session's instead): its TTL (a member that dies is replaced about
    /// this long after its last renewal), the safety margin (how long
    /// before etcd can expire the lease this member stops believing it
    /// owns its shards) and the clock drift allowance. Defaults as
    /// [`SessionOptions::default`].
    pub session: SessionOptions,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            prefix: DEFAULT_SHARDS_PREFIX.into(),
            member: None,
            weight: 1,
            drain: Duration::from_secs(5),
            session: SessionOptions::default(),
        }
    }
}

impl ShardOptions {
    /// These options with [`ShardOptions::prefix`] set (checked at join).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// These options with [`ShardOptions::member`] set (checked at join).
    #[must_use]
    pub fn with_member(mut self, member: impl Into<String>) -> Self {
        self.member = Some(member.into());
        self
    }

    /// These options with [`ShardOptions::weight`] set.
    #[must_use]
    pub const fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// These options with [`ShardOptions::drain`] set (at most a day,
    /// checked at join).
    #[must_use]
    pub const fn with_drain(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    /// These options with the session's TTL ([`SessionOptions::ttl`]) set
    /// (checked at join).
    #[must_use]
    pub const fn with_ttl(mut self, ttl: Duration) -> Self {
        self.session.ttl = ttl;
        self
    }

    /// These options with the session's safety margin
    /// ([`SessionOptions::safety_margin`]) set (at most half of the TTL
    /// less the drift allowance, checked at join).
    #[must_use]
    pub const fn with_safety_margin(mut self, margin: Duration) -> Self {
        self.session.safety_margin = margin;
        self
    }

    /// These options with the session's drift allowance
    /// ([`SessionOptions::drift_allowance_ppm`]) set (at most 100,000,
    /// checked at join).
    #[must_use]
    pub const fn with_drift_allowance_ppm(mut self, ppm: u32) -> Self {
        self.session.drift_allowance_ppm = ppm;
        self
    }

    /// How long a session with these options trusts its lease after the
    /// send of its last acknowledged renewal: the TTL less the drift
    /// allowance, less the safety margin. A member cut off from etcd owns
    /// its shards at most this long.
    pub fn trusted_lifetime(&self) -> Duration {
        self.session.trusted_lifetime()
    }

    /// Checks the session and member settings.
    pub(super) fn check_settings(&self) -> Result<()> {
        self.session.validate()?;
        self.check_member()
    }

    /// Checks the member settings alone (a member on a shared session
    /// uses that session's settings).
    pub(super) fn check_member(&self) -> Result<()> {
        validate::within("drain", self.drain, Duration::ZERO, validate::MAX_TIMEOUT)?;
        if let Some(member) = &self.member {
            validate::segment("member", member)?;
        }
        Ok(())
    }
}

impl ShardOptions {
    /// The checks [`crate::ShardMap::join`] and
    /// [`crate::ShardMap::owners_of`] make of `name` and these options
    /// before sending anything (the name one key segment, the prefix, the
    /// session and member settings; the shard count is checked apart),
    /// without a connection: `Ok` here means they will not be refused as
    /// [`Error::InvalidArgument`].
    ///
    /// ```
    /// use fleetcoord::ShardOptions;
    ///
    /// assert!(ShardOptions::default().check("tenants").is_ok());
    /// assert!(ShardOptions::default().check("a/b").is_err());
    /// ```
    pub fn check(&self, name: &str) -> Result<()> {
        map_prefix(name, self)?;
        self.check_settings()
    }
}

/// `<prefix><name>/`, after checking both.
pub(super) fn map_prefix(name: &str, options: &ShardOptions) -> Result<String> {
    validate::segment("name", name)?;
    validate::prefix("prefix", &options.prefix)?;
    Ok(format!("{}{}/", options.prefix, name))
}

/// `shards` within `1..=MAX_SHARDS`.
pub(super) fn shard_count(shards: u32) -> Result<()> {
    if !(1..=MAX_SHARDS).contains(&shards) {
        return Err(Error::invalid(
            "shards",
            format!("{shards} is outside 1..={MAX_SHARDS}"),
        ));
    }
    Ok(())
}
