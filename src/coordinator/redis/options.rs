//! Settings of a [`RedisCoordinator`](super::RedisCoordinator).

use crate::error::{Error, Result};
use crate::tls::Tls;
use crate::validate;
use std::time::Duration;

/// Settings of a [`RedisCoordinator`](super::RedisCoordinator).
///
/// Start from [`RedisOptions::default`] and change what you need with the
/// `with_*` methods; [`RedisCoordinator::with_options`](super::RedisCoordinator::with_options)
/// checks every value and names the one out of range. The fields are public
/// for reading; `#[non_exhaustive]` so that new settings are not a breaking
/// change.
///
/// TLS: `rediss://` URLs, verified against [`RedisOptions::with_tls`]'s CA
/// (or, without it, the Mozilla roots built in); see
/// [`RedisOptions::with_tls`]. ACL users: [`RedisOptions::with_username`]
/// and [`RedisOptions::with_password`]; the permissions such a user needs
/// are in the [module docs](super#acl-users).
///
/// ```
/// use fleetcoord::coordinator::redis::RedisOptions;
/// use std::time::Duration;
///
/// let options = RedisOptions::default()
///     .with_username("fleet")
///     .with_password("s3cret")
///     .with_stream_max_len(10_000)
///     .with_request_timeout(Duration::from_secs(2));
/// assert_eq!(options.stream_max_len, Some(10_000));
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct RedisOptions {
    /// ACL user name sent with `AUTH` (Redis 6+). `None`: the URL's user, or
    /// the default user. Default `None`.
    pub username: Option<String>,
    /// Password sent with `AUTH`. `None`: the URL's password, or none.
    /// Default `None`. Never printed by `Debug`.
    pub password: Option<String>,
    /// `Some(true)`: the URLs are seed nodes of a Redis Cluster;
    /// `Some(false)`: one standalone server (exactly one URL). `None` (the
    /// default): one URL is standalone, several are a cluster.
    pub cluster: Option<bool>,
    /// Keep about this many newest entries per stream (`XADD MAXLEN`, exact
    /// trimming); `None` keeps everything. At least 1. Default `None`.
    pub stream_max_len: Option<u64>,
    /// Capacity of every feed's channel (subscriptions, stream readers, KV
    /// watches), allocated as items arrive: 2 to 1,048,576. Default 4,096.
    pub feed_capacity: usize,
    /// How long connecting may take (each node of a cluster). 1 ms to 24 h.
    /// Default 5 s.
    pub connect_timeout: Duration,
    /// Deadline of each request (set, get, publish, append, a watch's
    /// snapshot), retries through a cluster failover included. 1 ms to
    /// 24 h. Default 5 s.
    pub request_timeout: Duration,
    /// Replicas that must confirm every KV write and stream append
    /// (`WAIT n timeout` right after it, on the same connection): 1 to
    /// [`MAX_MIN_REPLICAS`]. `None` (the default): writes are answered
    /// once the master applied them, and replication is asynchronous (see
    /// the [module docs](super#replication)).
    pub min_replicas: Option<usize>,
    /// How long a write waits for [`RedisOptions::min_replicas`]
    /// confirmations: 1 ms up to, not including, the request timeout (both
    /// share the request's deadline). Default 1 s.
    pub min_replicas_timeout: Duration,
    /// How `rediss://` servers are verified, and the client certificate
    /// for servers that ask for one. `None` (the default): `rediss://`
    /// servers must present a certificate from a public CA (Mozilla's
    /// roots, built in); `redis://` URLs are plain TCP. `Debug` never
    /// shows the client key.
    pub tls: Option<Tls>,
}

/// The most replicas [`RedisOptions::with_min_replicas`] accepts.
pub const MAX_MIN_REPLICAS: usize = 100;

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            username: None,
            password: None,
            cluster: None,
            stream_max_len: None,
            feed_capacity: crate::coordinator::DEFAULT_FEED_CAPACITY,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            min_replicas: None,
            min_replicas_timeout: Duration::from_secs(1),
            tls: None,
        }
    }
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("cluster", &self.cluster)
            .field("stream_max_len", &self.stream_max_len)
            .field("feed_capacity", &self.feed_capacity)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("min_replicas", &self.min_replicas)
            .field("min_replicas_timeout", &self.min_replicas_timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

impl RedisOptions {
    /// These options authenticating as ACL user `username` (with
    /// [`RedisOptions::with_password`]): every connection, to every node of
    /// a cluster, starts with `HELLO 3 AUTH username password`. A refused
    /// login is [`Error::Backend`] of kind
    /// [`PermissionDenied`](crate::ErrorKind::PermissionDenied) saying
    /// `WRONGPASS`, never quoting the password. What the user must be
    /// allowed: [module docs](super#acl-users).
    #[must_use]
    pub fn with_username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// These options authenticating with `password` (as the `default`
    /// user unless [`RedisOptions::with_username`] names another); it
    /// overrides a password in the URLs. Never in `Debug`, errors or logs.
    #[must_use]
    pub fn with_password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// These options treating the URLs as a cluster (`true`) or one
    /// standalone server (`false`) whatever their number.
    #[must_use]
    pub const fn with_cluster(mut self, cluster: bool) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// These options trimming each stream to its newest `max_len` entries
    /// (at least 1).
    #[must_use]
    pub const fn with_stream_max_len(mut self, max_len: u64) -> Self {
        self.stream_max_len = Some(max_len);
        self
    }

    /// These options with [`RedisOptions::feed_capacity`] set.
    #[must_use]
    pub const fn with_feed_capacity(mut self, capacity: usize) -> Self {
        self.feed_capacity = capacity;
        self
    }

    /// These options with [`RedisOptions::connect_timeout`] set.
    #[must_use]
    pub const fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// These options with [`RedisOptions::request_timeout`] set.
    #[must_use]
    pub const fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// These options confirming every KV set and delete and every stream
    /// append on `replicas` replicas within `timeout` (Redis `WAIT`).
    ///
    /// A write that fewer replicas confirmed in time fails with
    /// [`Error::Backend`] of kind
    /// [`Unreplicated`](crate::ErrorKind::Unreplicated): it *was
    /// applied* on the master (it is stored; an append has its id), only
    /// its durability is unconfirmed. `publish` is not followed by `WAIT`:
    /// a message is delivered to the subscribers connected at that moment
    /// and never stored, so there is nothing for a replica to keep. Each
    /// `WAIT` holds the handle's connection to that master until the
    /// replicas answered or `timeout` passed, so commands behind it on the
    /// same master wait too.
    ///
    /// ```
    /// use fleetcoord::coordinator::redis::RedisOptions;
    /// use std::time::Duration;
    ///
    /// let options = RedisOptions::default().with_min_replicas(1, Duration::from_secs(1));
    /// assert_eq!(options.min_replicas, Some(1));
    /// ```
    #[must_use]
    pub const fn with_min_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.min_replicas = Some(replicas);
        self.min_replicas_timeout = timeout;
        self
    }

    /// These options speaking TLS to `rediss://` servers, verified against
    /// `tls`'s CA bundle only (the built-in roots are then not trusted),
    /// and presenting its client certificate when it has one (for
    /// `tls-auth-clients yes`). On a cluster the same settings serve every
    /// node, including those the client learns of from `CLUSTER SLOTS`.
    ///
    /// Guarantees: the server's certificate is always verified (chain and
    /// name; there is no insecure mode); the name checked is each URL's
    /// host, and on a cluster each address the nodes announce, so the
    /// certificates must name those (an IP address SAN for nodes announced
    /// by IP). [`Tls::with_server_name`] is refused with
    /// [`Error::Unsupported`] (the `redis` crate checks the dialled host).
    /// With `tls` set every URL must be `rediss://`: a `redis://` URL is
    /// [`Error::InvalidArgument`] for `url` rather than sent in the clear.
    /// A failed handshake is one line saying which check failed (the
    /// server's certificate not signed by the given CA, a name mismatch, a
    /// client certificate the server wants or refused).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use fleetcoord::coordinator::redis::RedisOptions;
    /// use fleetcoord::coordinator::{Coordinator, RedisCoordinator};
    /// use fleetcoord::testing::RedisServer;
    ///
    /// // A TLS server that also wants a client certificate (test CA).
    /// let server = RedisServer::builder().tls().tls_auth_clients().start()?;
    /// let pki = server.pki().expect("a TLS server has test certificates");
    /// assert!(server.url().starts_with("rediss://"));
    /// let options = RedisOptions::default().with_tls(pki.client_tls()?);
    /// let coord = RedisCoordinator::with_options(&server.url(), options)?;
    /// coord.kv_set("config", "mode", b"on")?;
    /// assert_eq!(coord.kv_get("config", "mode")?, b"on");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn with_tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Every value in range, or the first one that is not.
    pub(crate) fn check(&self) -> Result<()> {
        if self.stream_max_len == Some(0) {
            return Err(Error::invalid("stream_max_len", "must be at least 1"));
        }
        validate::capacity("feed_capacity", self.feed_capacity)?;
        validate::timeout("connect_timeout", self.connect_timeout)?;
        validate::timeout("request_timeout", self.request_timeout)?;
        if let Some(n) = self.min_replicas {
            if !(1..=MAX_MIN_REPLICAS).contains(&n) {
                return Err(Error::invalid(
                    "min_replicas",
                    format!("{n} is outside 1..={MAX_MIN_REPLICAS}"),
                ));
            }
            validate::timeout("min_replicas_timeout", self.min_replicas_timeout)?;
            if self.min_replicas_timeout >= self.request_timeout {
                return Err(Error::invalid(
                    "min_replicas_timeout",
                    format!(
                        "{:?} is not shorter than request_timeout ({:?}): the write and its \
                         confirmation share the request's deadline",
                        self.min_replicas_timeout, self.request_timeout
                    ),
                ));
            }
        }
        if self.tls.as_ref().is_some_and(|t| t.server_name().is_some()) {
            return Err(Error::Unsupported(
                "a TLS server name for redis: the redis crate checks each URL's host; \
                 give a URL whose host the certificate names",
            ));
        }
        for (what, value) in [("username", &self.username), ("password", &self.password)] {
            if let Some(v) = value {
                if v.is_empty() || v.chars().any(char::is_control) {
                    return Err(Error::invalid(
                        what,
                        "must be non-empty, without control characters",
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_and_each_bad_value_is_named() {
        assert!(RedisOptions::default().check().is_ok());
        let bad = [
            (
                RedisOptions::default().with_stream_max_len(0),
                "stream_max_len",
            ),
            (
                RedisOptions::default().with_feed_capacity(1),
                "feed_capacity",
            ),
            (
                RedisOptions::default().with_feed_capacity(usize::MAX),
                "feed_capacity",
            ),
            (
                RedisOptions::default().with_connect_timeout(Duration::ZERO),
                "connect_timeout",
            ),
            (
                RedisOptions::default().with_request_timeout(Duration::MAX),
                "request_timeout",
            ),
            (RedisOptions::default().with_password(""), "password"),
            (
                RedisOptions::default().with_min_replicas(0, Duration::from_secs(1)),
                "min_replicas",
            ),
            (
                RedisOptions::default()
                    .with_min_replicas(MAX_MIN_REPLICAS + 1, Duration::from_secs(1)),
                "min_replicas",
            ),
            (
                RedisOptions::default().with_min_replicas(1, Duration::ZERO),
                "min_replicas_timeout",
            ),
            (
                RedisOptions::default().with_min_replicas(1, Duration::from_secs(5)),
                "min_replicas_timeout",
            ),
            (RedisOptions::default().with_username("a\nb"), "username"),
        ];
        for (options, field) in bad {
            match options.check() {
                Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }

    #[test]
    fn min_replicas_in_range_pass() {
        let options = RedisOptions::default()
            .with_request_timeout(Duration::from_secs(2))
            .with_min_replicas(MAX_MIN_REPLICAS, Duration::from_millis(1999));
        assert!(options.check().is_ok());
        // The timeout is only checked when confirmations are asked for.
        let unused = RedisOptions {
            min_replicas_timeout: Duration::ZERO,
            ..RedisOptions::default()
        };
        assert!(unused.check().is_ok());
    }

    #[test]
    fn debug_hides_the_password() {
        let text = format!("{:?}", RedisOptions::default().with_password("hunter2"));
        assert!(!text.contains("hunter2"), "{text}");
    }
}
