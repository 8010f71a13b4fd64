//! The NATS backend's options: how to log in, how KV keys are stored,
//! replicas, limits and timeouts, each checked before anything connects.

#[cfg(doc)]
use super::NatsCoordinator;
use crate::error::{Error, Result};
use crate::tls::Tls;
use crate::validate;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// The most replicas JetStream keeps of a stream.
const MAX_REPLICAS: usize = 5;

/// How a [`NatsCoordinator`] logs in.
///
/// `#[non_exhaustive]`: more kinds may follow. Its `Debug` output never
/// shows a password, token or seed, and no error of fleetcoord quotes them.
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum NatsCredentials {
    /// No credentials. The default.
    #[default]
    None,
    /// A user name and password.
    UserPassword {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
    /// A token.
    Token(String),
    /// An NKey user: the seed (`SU...`, a secret) signs the server's
    /// challenge; the server lists the user by its public key
    /// (`authorization { users: [ { nkey: U... } ] }`).
    NKey(String),
    /// A `.creds` file, as `nsc` writes it: a user JWT (decentralized auth,
    /// the server in operator mode) and the user's NKey seed. It is read
    /// when the handle connects; a later change of the file applies to
    /// handles made after it.
    CredentialsFile(PathBuf),
}

impl fmt::Debug for NatsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NatsCredentials::None => f.write_str("None"),
            NatsCredentials::UserPassword { user, .. } => f
                .debug_struct("UserPassword")
                .field("user", user)
                .field("password", &"<redacted>")
                .finish(),
            NatsCredentials::Token(_) => f.write_str("Token(<redacted>)"),
            NatsCredentials::NKey(_) => f.write_str("NKey(<redacted>)"),
            NatsCredentials::CredentialsFile(path) => {
                f.debug_tuple("CredentialsFile").field(path).finish()
            }
        }
    }
}

/// How a [`NatsCoordinator`] stores KV keys (see the [module
/// docs](super)).
///
/// `#[non_exhaustive]`: another encoding may follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum NatsKeyEncoding {
    /// Keys NATS accepts as they are, `=` and an escape for the others:
    /// the keys `nats kv` and other clients see. The default.
    #[default]
    Nats,
    /// Every key with every byte outside `[A-Za-z0-9-]` as `_XX`, as
    /// fleetcoord stored keys before [`NatsKeyEncoding::Nats`]: for
    /// deployments whose buckets hold such keys. Entries other clients
    /// wrote with `.` or `_` in their keys are skipped (and logged).
    Legacy,
}

/// Settings of a [`NatsCoordinator`].
///
/// Start from [`NatsOptions::default`] and change what you need with the
/// `with_*` methods; [`NatsCoordinator::with_options`] checks the ranges.
/// The fields are public for reading. `#[non_exhaustive]` so that new
/// settings are not a breaking change.
///
/// ```
/// use fleetcoord::coordinator::NatsOptions;
///
/// // For `NatsCoordinator::with_options("nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222", options)`.
/// let options = NatsOptions::default()
///     .with_kv_replicas(3)
///     .with_stream_replicas(3)
///     .with_stream_max_len(100_000);
/// assert_eq!(options.kv_replicas, 3);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NatsOptions {
    /// Replicas of each KV bucket created by this handle: 1 to 5, at most
    /// the cluster's size. Default 1 (3 is usual on a 3-node cluster).
    /// Buckets that already exist keep theirs.
    pub kv_replicas: usize,
    /// Replicas of each stream created by this handle: 1 to 5. Default 1.
    pub stream_replicas: usize,
    /// Keep only the newest `n` entries of each stream created by this
    /// handle. Default `None` (no limit).
    pub stream_max_len: Option<u64>,
    /// Drop stream entries older than this (at least one second). Default
    /// `None` (no limit). Below 2 minutes it also shortens the window in
    /// which a retried append is recognised as a repeat to this age, and
    /// an append stops retrying within it (so one shorter than
    /// `request_timeout` shortens how long an append keeps trying).
    pub stream_max_age: Option<Duration>,
    /// How to log in. Default [`NatsCredentials::None`].
    pub credentials: NatsCredentials,
    /// TLS: the server's certificate is verified against this CA bundle
    /// (and name), and its client certificate, if any, presented for
    /// servers with `verify: true`. Default `None`: plain text for
    /// `nats://` URLs; `tls://` URLs then trust the platform's roots.
    pub tls: Option<Tls>,
    /// How long connecting may take. Default 5 s.
    pub connect_timeout: Duration,
    /// How long one call may take, retries included: a write retried
    /// across a reconnect or a cluster's leader change, a read, a feed's
    /// start. Default 20 s: when the node leading a replicated stream dies,
    /// nats-server 2.9 elects a new leader after its Raft election timeout
    /// and writes to that stream stall meanwhile (5 to 9 s measured here
    /// on a 3-node cluster).
    pub request_timeout: Duration,
    /// Capacity of every feed's channel, allocated as items arrive: 2 to
    /// 1,048,576. Default 4,096.
    pub feed_capacity: usize,
    /// How KV keys are stored. Default [`NatsKeyEncoding::Nats`]; every
    /// handle on a bucket must use the same.
    pub key_encoding: NatsKeyEncoding,
}

impl Default for NatsOptions {
    fn default() -> Self {
        NatsOptions {
            kv_replicas: 1,
            stream_replicas: 1,
            stream_max_len: None,
            stream_max_age: None,
            credentials: NatsCredentials::None,
            tls: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(20),
            feed_capacity: crate::coordinator::DEFAULT_FEED_CAPACITY,
            key_encoding: NatsKeyEncoding::Nats,
        }
    }
}

impl NatsOptions {
    /// These options with [`NatsOptions::kv_replicas`] set.
    #[must_use]
    pub const fn with_kv_replicas(mut self, replicas: usize) -> Self {
        self.kv_replicas = replicas;
        self
    }

    /// These options with [`NatsOptions::stream_replicas`] set.
    #[must_use]
    pub const fn with_stream_replicas(mut self, replicas: usize) -> Self {
        self.stream_replicas = replicas;
        self
    }

    /// These options keeping the newest `max_len` entries of each stream.
    #[must_use]
    pub const fn with_stream_max_len(mut self, max_len: u64) -> Self {
        self.stream_max_len = Some(max_len);
        self
    }

    /// These options dropping stream entries older than `max_age`.
    #[must_use]
    pub const fn with_stream_max_age(mut self, max_age: Duration) -> Self {
        self.stream_max_age = Some(max_age);
        self
    }

    /// These options logging in with a user and password.
    #[must_use]
    pub fn with_user_password(mut self, user: &str, password: &str) -> Self {
        self.credentials = NatsCredentials::UserPassword {
            user: user.to_owned(),
            password: password.to_owned(),
        };
        self
    }

    /// These options logging in with a token.
    #[must_use]
    pub fn with_token(mut self, token: &str) -> Self {
        self.credentials = NatsCredentials::Token(token.to_owned());
        self
    }

    /// These options logging in as the NKey user of `seed` (`SU...`).
    /// [`NatsCoordinator::with_options`] refuses a seed that is not a user
    /// seed with [`Error::InvalidArgument`] for `nkey`, without quoting it;
    /// a server that does not know the user refuses it with an error
    /// naming the user's public key.
    #[must_use]
    pub fn with_nkey(mut self, seed: &str) -> Self {
        self.credentials = NatsCredentials::NKey(seed.trim().to_owned());
        self
    }

    /// These options logging in with the `.creds` file at `path` (user
    /// JWT and NKey seed). [`NatsCoordinator::with_options`] reads it
    /// before connecting: a missing file, one without a JWT or seed block,
    /// or a seed that is not a user's is an [`Error::InvalidArgument`] for
    /// `credentials_file` naming the file (never quoting the seed).
    #[must_use]
    pub fn with_credentials_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.credentials = NatsCredentials::CredentialsFile(path.into());
        self
    }

    /// These options connecting with TLS: the server's certificate must be
    /// signed by `tls`'s CA bundle (and valid for its server name, else
    /// for the URL's host), and `tls`'s client certificate, if any, is
    /// presented. Every URL then uses TLS, `nats://` ones too; a server
    /// without TLS is refused.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use fleetcoord::coordinator::{Coordinator, NatsCoordinator, NatsOptions};
    /// use fleetcoord::testing::NatsBuilder;
    /// use fleetcoord::Tls;
    ///
    /// // A server that wants TLS and a client certificate (`verify: true`).
    /// let server = NatsBuilder::new().tls_verify_clients().start()?;
    /// let pki = server.pki().expect("a TLS server has test certificates");
    /// let tls = Tls::from_ca_file(pki.ca_path())?
    ///     .with_client_files(pki.client_cert_path(), pki.client_key_path())?;
    /// let coord = NatsCoordinator::with_options(&server.url(), NatsOptions::default().with_tls(tls))?;
    /// coord.kv_set("config", "mode", b"on")?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn with_tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// These options with [`NatsOptions::connect_timeout`] set.
    #[must_use]
    pub const fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// These options with [`NatsOptions::request_timeout`] set.
    #[must_use]
    pub const fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// These options with [`NatsOptions::feed_capacity`] set.
    #[must_use]
    pub const fn with_feed_capacity(mut self, capacity: usize) -> Self {
        self.feed_capacity = capacity;
        self
    }

    /// These options with [`NatsOptions::key_encoding`] set.
    #[must_use]
    pub const fn with_key_encoding(mut self, encoding: NatsKeyEncoding) -> Self {
        self.key_encoding = encoding;
        self
    }

    /// Every range check, before anything connects.
    pub(super) fn check(&self) -> Result<()> {
        for (what, replicas) in [
            ("kv_replicas", self.kv_replicas),
            ("stream_replicas", self.stream_replicas),
        ] {
            if !(1..=MAX_REPLICAS).contains(&replicas) {
                return Err(Error::invalid(
                    what,
                    format!("{replicas} is outside 1..={MAX_REPLICAS}"),
                ));
            }
        }
        if let Some(max_len) = self.stream_max_len {
            if max_len == 0 || i64::try_from(max_len).is_err() {
                return Err(Error::invalid(
                    "stream_max_len",
                    format!("{max_len} is outside 1..={}", i64::MAX),
                ));
            }
        }
        if let Some(age) = self.stream_max_age {
            validate::within(
                "stream_max_age",
                age,
                Duration::from_secs(1),
                Duration::from_secs(100 * 365 * 24 * 60 * 60),
            )?;
        }
        validate::timeout("connect_timeout", self.connect_timeout)?;
        validate::timeout("request_timeout", self.request_timeout)?;
        validate::capacity("feed_capacity", self.feed_capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_show_secrets() {
        let shown = [
            NatsCredentials::None,
            NatsOptions::default()
                .with_user_password("app", "s3cret")
                .credentials,
            NatsOptions::default().with_token("t0ken").credentials,
            NatsOptions::default()
                .with_nkey("SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY")
                .credentials,
            NatsOptions::default()
                .with_credentials_file("/etc/nats/app.creds")
                .credentials,
        ]
        .map(|c| format!("{c:?}"));
        assert_eq!(
            shown,
            [
                "None",
                r#"UserPassword { user: "app", password: "<redacted>" }"#,
                "Token(<redacted>)",
                "NKey(<redacted>)",
                r#"CredentialsFile("/etc/nats/app.creds")"#,
            ]
        );
    }
}
