//! Connections: the one shared command connection, and the dedicated ones
//! each feed opens for itself. The only file that picks between standalone
//! and cluster clients of the `redis` crate.
//!
//! * Commands go over one multiplexed connection that reconnects by itself
//!   (`ConnectionManager` standalone, the async `ClusterConnection` on a
//!   cluster), with retries kept low and every response bounded by the
//!   request timeout: with the crate's defaults a command to a dead master
//!   hung for over two minutes (docs/backend-notes.md, "Reconnects").
//! * Each subscription and KV watch has its own RESP3 connection with a
//!   push channel; each stream reader its own connection without a
//!   response timeout shorter than its `XREAD BLOCK` (the multiplexed
//!   connection's 500 ms default fails a longer block, and a blocked read
//!   delays every other command on its connection; docs/backend-notes.md,
//!   "Streams"). Feeds rebuild their connection themselves after a failure,
//!   so they never depend on the crate's silent resubscription.
//! * On a cluster, [`with_failover`] carries each request through a
//!   master's failover: it retries, with jittered backoff until the request
//!   deadline, the answers a cluster gives meanwhile, and when it gives up
//!   it says which slot and master it waited for. The crate itself does not
//!   retry commands on the command connection (`retries(0)`): it re-sends
//!   a command whose connection broke, which for an append whose reply was
//!   lost stores it twice; only [`with_failover`] decides what is repeated.
//! * With [`RedisOptions::min_replicas`] every script run on the command
//!   connection (the KV write, the stream append) is followed by `WAIT` in
//!   the same pipeline, so it counts the replicas that have this write.

use super::options::RedisOptions;
use crate::coordinator::retry::{self, Decision, GiveUp, LastPause, Sign};
use crate::endpoints::Endpoints;
use crate::error::{one_line, Error, ErrorKind, Result};
use crate::tls::refusal::{self, ClientSide};
use crate::tls::Tls;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Client, ClientTlsConfig, Cmd, ConnectionInfo, FromRedisValue,
    IntoConnectionInfo, ProtocolVersion, PushInfo, RedisError, RedisResult, ScriptInvocation,
    TlsCertificates,
};
use std::future::Future;
use std::time::Duration;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// Where and how to connect, checked once.
#[derive(Clone)]
pub(crate) struct Target {
    /// The URLs as given (passwords removed), for messages.
    pub(crate) urls: String,
    nodes: Vec<ConnectionInfo>,
    pub(crate) cluster: bool,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    /// `WAIT` after each write of the command connection: replicas and
    /// milliseconds.
    confirm: Option<Confirm>,
    /// The URLs are `rediss://`.
    secure: bool,
    /// [`RedisOptions::tls`], for explaining failed handshakes.
    tls: Option<Tls>,
    /// The same, in the crate's form; the client key leaves [`Tls`] only
    /// into this (the crate's `Debug` of it is redacted too).
    certs: Option<TlsCertificates>,
}

/// How many replicas must confirm a write, and how long to wait for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Confirm {
    replicas: usize,
    timeout_ms: u64,
}

/// A connection that serves commands.
#[derive(Clone)]
pub(crate) struct Conn {
    link: Link,
    /// Set on the command connection only: feeds never write.
    confirm: Option<Confirm>,
}

#[derive(Clone)]
enum Link {
    /// Standalone, reconnecting by itself.
    Managed(ConnectionManager),
    /// Standalone, dead for good once its server is gone: feeds notice that
    /// and rebuild.
    Single(MultiplexedConnection),
    /// Cluster.
    Cluster(ClusterConnection),
}

impl From<Link> for Conn {
    fn from(link: Link) -> Self {
        Conn {
            link,
            confirm: None,
        }
    }
}

impl Target {
    /// Checks `urls` (`redis://` or `rediss://` URLs, or `host:port`,
    /// which means `redis://host:port`, or `rediss://host:port` when
    /// `options` configure TLS) and `options`.
    pub(crate) fn parse(
        urls: &(impl Endpoints + ?Sized),
        options: &RedisOptions,
    ) -> Result<Target> {
        options.check()?;
        let list = urls
            .endpoint_list()
            .iter()
            .map(|u| with_scheme(u, options.tls.is_some()))
            .collect::<Result<Vec<String>>>()?;
        if list.is_empty() {
            return Err(Error::invalid("url", "no redis:// URL given"));
        }
        let secure = list.iter().any(|u| u.starts_with("rediss://"));
        let mut nodes = Vec::with_capacity(list.len());
        let mut shown = Vec::with_capacity(list.len());
        for url in &list {
            let url = url.as_str();
            let tls_url = url.starts_with("rediss://");
            if !tls_url && !url.starts_with("redis://") {
                return Err(Error::invalid(
                    "url",
                    format!("{:?} is not a redis:// or rediss:// URL", redacted(url)),
                ));
            }
            if tls_url != secure {
                return Err(Error::invalid(
                    "url",
                    "mixes redis:// and rediss:// URLs; every node takes the same one",
                ));
            }
            if !tls_url && options.tls.is_some() {
                return Err(Error::invalid(
                    "url",
                    format!(
                        "{:?} is plain redis:// but TLS is configured; use rediss://",
                        redacted(url)
                    ),
                ));
            }
            // The crate reads `#insecure` as "skip the host name check".
            if url.contains('#') {
                return Err(Error::invalid(
                    "url",
                    format!(
                        "{:?} has a #fragment; none is taken (the server's certificate is \
                         always verified, so #insecure is refused)",
                        redacted(url)
                    ),
                ));
            }
            let info = url
                .into_connection_info()
                .map_err(|e| Error::invalid("url", format!("{:?}: {e}", redacted(url))))?;
            let mut settings = info
                .redis_settings()
                .clone()
                .set_protocol(ProtocolVersion::RESP3);
            if let Some(user) = &options.username {
                settings = settings.set_username(user);
            }
            if let Some(password) = &options.password {
                settings = settings.set_password(password);
            }
            nodes.push(info.set_redis_settings(settings));
            shown.push(redacted(url));
        }
        let cluster = options.cluster.unwrap_or(nodes.len() > 1);
        if !cluster && nodes.len() > 1 {
            return Err(Error::invalid(
                "url",
                "several URLs name a cluster; standalone takes exactly one",
            ));
        }
        Ok(Target {
            urls: shown.join(","),
            nodes,
            cluster,
            connect_timeout: options.connect_timeout,
            request_timeout: options.request_timeout,
            confirm: options.min_replicas.map(|replicas| Confirm {
                replicas,
                // `check` bounds it to at least 1 ms and at most 24 h.
                timeout_ms: u64::try_from(options.min_replicas_timeout.as_millis())
                    .unwrap_or(u64::MAX),
            }),
            secure,
            tls: options.tls.clone(),
            certs: options.tls.as_ref().map(certificates),
        })
    }

    fn standalone(&self) -> RedisResult<Client> {
        // `parse` guarantees at least one node.
        let node =
            self.nodes.first().cloned().ok_or_else(|| {
                RedisError::from((redis::ErrorKind::InvalidClientConfig, "no URL"))
            })?;
        install_crypto_provider(self.secure);
        match &self.certs {
            Some(certs) => Client::build_with_tls(node, certs.clone()),
            None => Client::open(node),
        }
    }

    fn cluster_builder(&self) -> ClusterClientBuilder {
        install_crypto_provider(self.secure);
        let builder = ClusterClientBuilder::new(self.nodes.clone())
            .use_protocol(ProtocolVersion::RESP3)
            .connection_timeout(self.connect_timeout)
            .retries(2)
            .min_retry_wait(50)
            .max_retry_wait(500);
        match &self.certs {
            // Also for the nodes learnt from `CLUSTER SLOTS`: the crate
            // dials them with the seeds' TLS mode and these certificates.
            Some(certs) => builder.certs(certs.clone()),
            None => builder,
        }
    }

    /// The shared command connection, proven with a PING.
    pub(crate) async fn command_conn(&self) -> RedisResult<Conn> {
        let link = if self.cluster {
            let client = self
                .cluster_builder()
                // Every retry is `with_failover`'s decision (module docs).
                .retries(0)
                .response_timeout(self.request_timeout)
                .overall_response_timeout(Some(self.request_timeout))
                .build()?;
            Link::Cluster(client.get_async_connection().await?)
        } else {
            let config = ConnectionManagerConfig::new()
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(500))
                .set_connection_timeout(Some(self.connect_timeout))
                .set_response_timeout(Some(self.request_timeout));
            Link::Managed(
                self.standalone()?
                    .get_connection_manager_with_config(config)
                    .await?,
            )
        };
        let mut conn = Conn {
            link,
            confirm: self.confirm,
        };
        conn.query::<()>(&redis::cmd("PING")).await?;
        Ok(conn)
    }

    /// A dedicated connection whose pushes (pub/sub messages,
    /// `Disconnection`) arrive on the returned receiver.
    pub(crate) async fn push_conn(&self) -> RedisResult<(Conn, UnboundedReceiver<PushInfo>)> {
        let (tx, rx) = unbounded_channel();
        let conn = if self.cluster {
            let client = self
                .cluster_builder()
                .response_timeout(self.request_timeout)
                .overall_response_timeout(Some(self.request_timeout))
                .push_sender(tx)
                .build()?;
            Link::Cluster(client.get_async_connection().await?)
        } else {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.connect_timeout))
                .set_response_timeout(Some(self.request_timeout))
                .set_push_sender(tx);
            Link::Single(
                self.standalone()?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            )
        };
        Ok((conn.into(), rx))
    }

    /// A dedicated connection for blocking reads of up to `block`.
    pub(crate) async fn blocking_conn(&self, block: Duration) -> RedisResult<Conn> {
        let timeout = block.saturating_add(self.request_timeout);
        if self.cluster {
            let client = self
                .cluster_builder()
                .response_timeout(timeout)
                .overall_response_timeout(Some(timeout))
                .build()?;
            Ok(Link::Cluster(client.get_async_connection().await?).into())
        } else {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.connect_timeout))
                .set_response_timeout(Some(timeout));
            Ok(Link::Single(
                self.standalone()?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            )
            .into())
        }
    }

    /// `e` as the user's error, with what was being done.
    pub(crate) fn error(&self, context: impl std::fmt::Display, e: &RedisError) -> Error {
        let kind = kind_of(e);
        let said = match (kind, e.detail()) {
            // Our own error: its detail is the whole story, its code noise.
            (ErrorKind::Unreplicated, Some(detail)) => detail.to_string(),
            _ => self.explain(e, false),
        };
        Error::Backend {
            backend: "redis",
            endpoints: self.urls.clone(),
            kind,
            message: format!("{context}: {said}"),
        }
    }

    /// `e` in one line; on `rediss://`, a failed handshake says which check
    /// failed and what to change, told apart by rustls's words in the
    /// crate's message (a handshake failure arrives as an I/O error, like
    /// a network failure). `connecting`: `e` ended the first connect, where
    /// a server hanging up means it refused the handshake; later (a
    /// restart, a failover) it means nothing of the kind.
    pub(crate) fn explain(&self, e: &RedisError, connecting: bool) -> String {
        let said = one_line(e);
        if !self.secure {
            return said;
        }
        let has_identity = self.tls.as_ref().is_some_and(Tls::has_client_identity);
        explain_tls(&said, connecting, has_identity, self.tls.is_some(), || {
            self.tls
                .as_ref()
                .and_then(|t| t.client_cert_invalid_at(refusal::unix_now()))
        })
    }

    /// An error of `kind` that did not come from the crate.
    pub(crate) fn failure(&self, kind: ErrorKind, message: impl Into<String>) -> Error {
        Error::Backend {
            backend: "redis",
            endpoints: self.urls.clone(),
            kind,
            message: message.into(),
        }
    }
}

impl Conn {
    /// Runs one command.
    pub(crate) async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<T> {
        match &mut self.link {
            Link::Managed(c) => cmd.query_async(c).await,
            Link::Single(c) => cmd.query_async(c).await,
            Link::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// Runs one script (EVALSHA, loading it on `NOSCRIPT`). On the command
    /// connection with [`RedisOptions::min_replicas`] set, the script is a
    /// write and `WAIT` follows it (see [`Conn::invoke_confirmed`]).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &mut self,
        script: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        if let Some(confirm) = self.confirm {
            return self.invoke_confirmed(script, confirm).await;
        }
        match &mut self.link {
            Link::Managed(c) => script.invoke_async(c).await,
            Link::Single(c) => script.invoke_async(c).await,
            Link::Cluster(c) => script.invoke_async(c).await,
        }
    }

    /// Runs `script` and `WAIT` in one pipeline: one connection, so `WAIT`
    /// counts the replicas that have this script's writes (on a cluster the
    /// keyless `WAIT` follows the script's slot, since the crate routes a
    /// pipeline by its first keyed command). `WAIT` cannot run inside a
    /// script, and as a command of its own it could reach a connection the
    /// crate rebuilt meanwhile, whose `WAIT` has no write to wait for and
    /// would confirm at once.
    async fn invoke_confirmed<T: FromRedisValue>(
        &mut self,
        script: &ScriptInvocation<'_>,
        confirm: Confirm,
    ) -> RedisResult<T> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .invoke_script(script)
            .cmd("WAIT")
            .arg(confirm.replicas)
            .arg(confirm.timeout_ms);
        let mut loaded = false;
        loop {
            let replies: Vec<redis::Value> = match &mut self.link {
                Link::Managed(c) => pipe.query_async(c).await?,
                Link::Single(c) => pipe.query_async(c).await?,
                Link::Cluster(c) => pipe.query_async(c).await?,
            };
            let mut replies = replies.into_iter();
            let (Some(reply), Some(acked)) = (replies.next(), replies.next()) else {
                return Err(RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "a script and WAIT answered with fewer than two replies",
                )));
            };
            let reply = match reply.extract_error() {
                Err(e)
                    if !loaded
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    // Nothing ran: load the script and send both again.
                    match &mut self.link {
                        Link::Managed(c) => script.load_async(c).await?,
                        Link::Single(c) => script.load_async(c).await?,
                        Link::Cluster(c) => script.load_async(c).await?,
                    };
                    loaded = true;
                    continue;
                }
                other => other?,
            };
            let acked: i64 = redis::from_redis_value(acked.extract_error()?)?;
            if reply == redis::Value::Int(0) {
                // The KV script's "nothing changed" (a delete of a missing
                // key): there is no write to confirm.
                return Ok(redis::from_redis_value(reply)?);
            }
            let wanted = i64::try_from(confirm.replicas).unwrap_or(i64::MAX);
            if acked < wanted {
                return Err(unreplicated(&reply, acked, confirm));
            }
            return Ok(redis::from_redis_value(reply)?);
        }
    }

    /// Subscribes to `channel`: sharded (`SSUBSCRIBE`) on a cluster, so the
    /// subscription lives on the shard that owns the channel's slot; plain
    /// `SUBSCRIBE` on a standalone server. Returns once the server
    /// confirmed it.
    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match &mut self.link {
            Link::Managed(c) => c.subscribe(channel).await,
            Link::Single(c) => c.subscribe(channel).await,
            Link::Cluster(c) => c.ssubscribe(channel).await,
        }
    }
}

/// The crate's form of `tls`.
fn certificates(tls: &Tls) -> TlsCertificates {
    TlsCertificates {
        client_tls: tls
            .client_identity_pem()
            .map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.to_vec(),
                client_key: key.to_vec(),
            }),
        root_cert: Some(tls.ca_pem().to_vec()),
    }
}

/// Makes ring rustls' process-level CryptoProvider unless one is set. The
/// crate builds its TLS config with `rustls::ClientConfig::builder()`,
/// which takes that provider and panics when none is set and the
/// application's dependency graph enables more than one (ring here, and
/// aws-lc-rs from another crate). An application that installed its own
/// keeps it.
fn install_crypto_provider(secure: bool) {
    if secure && rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one first, which serves as well.
        let _ = crate::tls::provider::ring().install_default();
    }
}

/// [`Target::explain`] on the crate's one-line message `said`:
/// `connecting` whether it ended the first connect, `has_identity` whether
/// a client certificate was given, `has_ca` whether a CA was (else the
/// built-in roots verify), `cert_invalid` why the client certificate is not
/// valid now, if it is not.
fn explain_tls(
    said: &str,
    connecting: bool,
    has_identity: bool,
    has_ca: bool,
    cert_invalid: impl FnOnce() -> Option<String>,
) -> String {
    if refusal::untrusted_server(said) {
        let ca = if has_ca {
            "the given CA (RedisOptions::with_tls)"
        } else {
            "a public CA, and no CA was given (RedisOptions::with_tls)"
        };
        return format!(
            "TLS: the server's certificate is not trusted: it is not signed by {ca} ({said})"
        );
    }
    if refusal::wrong_name(said) {
        return format!(
            "TLS: the server's certificate is not valid for the host in the URL; use a host \
             name or address it was issued for ({said})"
        );
    }
    // rustls says "invalid peer certificate: …" of the server's certificate
    // and "received fatal alert: …" when the server refused the client's.
    let alert = said.contains("received fatal alert") || said.contains("certificate required");
    if !alert && (said.contains("Expired") || said.contains("NotValidYet")) {
        return format!("TLS: the server's certificate is outside its validity dates ({said})");
    }
    // A server that wants a client certificate aborts the handshake with an
    // alert, or (TLS 1.3, where the client finishes first) hangs up right
    // after it; the client then sees a reset or an early end of file.
    let closed = connecting
        && [
            "connection reset",
            "Connection reset",
            "broken pipe",
            "Broken pipe",
            "unexpected end of file",
            "UnexpectedEof",
            "peer closed connection",
        ]
        .iter()
        .any(|w| said.contains(w));
    if !(alert || closed) {
        return said.to_string();
    }
    match refusal::client_side(has_identity, cert_invalid) {
        ClientSide::Missing => format!(
            "TLS: the server closed the connection during the handshake; it most likely \
             requires a client certificate (tls-auth-clients), and none was given \
             (Tls::with_client_files) ({said})"
        ),
        ClientSide::Invalid(why) => {
            format!("TLS: the server refused the client certificate: {why} ({said})")
        }
        // A hang-up alone, with a valid certificate given, is no verdict
        // on it: the crate's own words say more.
        ClientSide::Refused if !alert => said.to_string(),
        ClientSide::Refused => format!(
            "TLS: the server refused the client certificate (is it signed by a CA the \
             server trusts?) ({said})"
        ),
    }
}

/// The code of the error [`Conn::invoke_confirmed`] makes when too few
/// replicas confirmed; [`kind_of`] maps it to
/// [`ErrorKind::Unreplicated`].
const UNREPLICATED: &str = "FLEETCOORD_UNREPLICATED";

/// A write applied on the master that only `acked` replicas confirmed.
fn unreplicated(reply: &redis::Value, acked: i64, confirm: Confirm) -> RedisError {
    // An append's reply is its entry's id: worth saying, the entry exists.
    let applied = match bytes(reply).and_then(|b| String::from_utf8(b).ok()) {
        Some(id) => format!("applied on the master as {id}"),
        None => "applied on the master".to_string(),
    };
    redis::make_extension_error(
        UNREPLICATED.to_string(),
        Some(format!(
            "{applied} but confirmed by {acked} of {} replicas within {} ms \
             (stored; durability unconfirmed: lost if the master fails before a replica has it)",
            confirm.replicas, confirm.timeout_ms
        )),
    )
}

/// The command that publishes on this deployment's channels, matching
/// [`Conn::subscribe`].
pub(crate) fn publish_command(cluster: bool) -> &'static str {
    if cluster {
        "SPUBLISH"
    } else {
        "PUBLISH"
    }
}

/// The channel and payload of a pub/sub message push; `None` for other
/// pushes.
pub(crate) fn message(push: &PushInfo) -> Option<(Vec<u8>, Vec<u8>)> {
    use redis::PushKind;
    if !matches!(push.kind, PushKind::Message | PushKind::SMessage) {
        return None;
    }
    match push.data.as_slice() {
        [channel, payload] => Some((bytes(channel)?, bytes(payload)?)),
        _ => None,
    }
}

/// The bytes of a string reply.
pub(crate) fn bytes(value: &redis::Value) -> Option<Vec<u8>> {
    match value {
        redis::Value::BulkString(b) => Some(b.clone()),
        redis::Value::SimpleString(s) => Some(s.clone().into_bytes()),
        redis::Value::VerbatimString { text, .. } => Some(text.clone().into_bytes()),
        _ => None,
    }
}

/// How the policy of [`Error::is_retryable`] sees a crate error.
pub(super) fn kind_of(e: &RedisError) -> ErrorKind {
    use redis::{ErrorKind as RedisErrorKind, ServerErrorKind};
    if e.kind() == RedisErrorKind::Extension && e.code() == Some(UNREPLICATED) {
        return ErrorKind::Unreplicated;
    }
    // Codes the crate has no kind for: a refused login (`HELLO 3 AUTH`
    // answers `WRONGPASS` for a wrong password or a disabled user) and a
    // server that wants one (`NOAUTH`).
    if matches!(e.code(), Some("WRONGPASS" | "NOAUTH")) {
        return ErrorKind::PermissionDenied;
    }
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return ErrorKind::Unavailable;
    }
    match e.kind() {
        RedisErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::ReadOnly,
        )
        | RedisErrorKind::ClusterConnectionNotFound
        | RedisErrorKind::Io => ErrorKind::Unavailable,
        RedisErrorKind::Server(ServerErrorKind::NoPerm) | RedisErrorKind::AuthenticationFailed => {
            ErrorKind::PermissionDenied
        }
        RedisErrorKind::Parse | RedisErrorKind::UnexpectedReturnType => ErrorKind::Unexpected,
        _ => ErrorKind::Rejected,
    }
}

/// Whether running a request twice is the same as running it once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Repeat {
    /// Reads, and KV writes (the same value set again, a delete of what is
    /// gone): retried after any transient failure.
    Safe,
    /// An append (stored twice) or a publish (delivered twice): retried
    /// only after an answer proving it did not run. It carries what to say
    /// when a lost connection leaves its outcome unknown.
    Unsafe(&'static str),
}

impl Repeat {
    fn policy(self) -> retry::Repeat {
        match self {
            Repeat::Safe => retry::Repeat::Safe,
            Repeat::Unsafe(_) => retry::Repeat::Once,
        }
    }
}

/// Which failures [`retried`] waits out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Through {
    /// A cluster's failover; on a standalone server nothing is retried
    /// (its command connection reconnects by itself).
    Failover,
    /// Also a standalone server's restart: for a request that must not
    /// fail on a blip and carries its own dedupe (the stream append).
    Restart,
}

/// What a cluster answers while a master fails over, as far as a retry is
/// concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `MOVED`/`ASK` to `addr`: the node asked does not serve the slot. In
    /// a failover it points at the dead master until its replica took
    /// over. Not run.
    Redirected { addr: String },
    /// `CLUSTERDOWN`: with `cluster-require-full-coverage yes` (Redis'
    /// default) every node refuses every slot while one slot has no
    /// reachable master. Not run.
    ClusterDown,
    /// `TRYAGAIN`: the slot is being migrated. Not run.
    TryAgain,
    /// `MASTERDOWN`, `READONLY` (a master demoted to replica), `LOADING`:
    /// the node cannot serve the write yet. Not run.
    NotReady,
    /// Connection refused, or the crate has no connection for the slot:
    /// nothing was sent.
    Unreachable,
    /// The connection broke or went silent mid-request: the command may
    /// have run.
    Lost,
}

impl Answer {
    /// The answer `e` is of a failover, or `None` for any other failure.
    pub(crate) fn of(e: &RedisError) -> Option<Answer> {
        use redis::{ErrorKind, ServerErrorKind as S};
        if e.is_connection_refusal() {
            return Some(Answer::Unreachable);
        }
        match e.kind() {
            ErrorKind::Server(S::Moved | S::Ask) => Some(Answer::Redirected {
                addr: e.redirect_node().map(|(addr, _)| addr.to_string())?,
            }),
            ErrorKind::Server(S::ClusterDown) => Some(Answer::ClusterDown),
            ErrorKind::Server(S::TryAgain) => Some(Answer::TryAgain),
            ErrorKind::Server(S::MasterDown | S::ReadOnly | S::BusyLoading) => {
                Some(Answer::NotReady)
            }
            ErrorKind::ClusterConnectionNotFound => Some(Answer::Unreachable),
            _ if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                Some(Answer::Lost)
            }
            _ => None,
        }
    }

    /// What it says to the retry policy: only a lost connection leaves
    /// the request possibly run.
    fn sign(&self) -> Sign {
        match self {
            Answer::Lost => Sign::MaybeRun,
            _ => Sign::NotRun,
        }
    }
}

/// What the retries of one request saw, for the message when they give up.
#[derive(Debug, Default)]
struct Seen {
    /// The address the cluster last named as the slot's master.
    master: Option<String>,
    last: Option<Answer>,
}

impl Seen {
    fn note(&mut self, answer: Answer) {
        if let Answer::Redirected { addr } = &answer {
            self.master = Some(addr.clone());
        }
        self.last = Some(answer);
    }
}

/// Pauses between attempts through a failover: a slot whose master died is
/// refused for 1.5 to 3.5 s after a kill (measured on a cluster with a 1 s
/// `cluster-node-timeout`), so short steps, 20 ms doubling to 400 ms;
/// jittered, so that the callers refused together do not all retry
/// together.
const FAILOVER_PAUSES: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(400));

/// Runs `attempt` until it succeeds, fails for a reason a failover does
/// not explain, or the request timeout passes; on a cluster, answers of a
/// failover are retried (see [`Answer`] and [`Repeat`]), on a standalone
/// server nothing is. `key` (any key of the request) names its slot in the
/// message; `describe` turns a failure that is not a failover's into the
/// user's error.
///
/// Guarantee: it returns within the request timeout of `target` (plus
/// scheduling), with the last failure said in one line.
pub(crate) async fn with_failover<T, F, Fut>(
    target: &Target,
    context: &str,
    key: Option<&str>,
    repeat: Repeat,
    attempt: F,
    describe: impl FnOnce(&RedisError) -> Error,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    retried(target, context, key, repeat, Through::Failover, attempt, describe)
        .await
        .map_err(|(e, _)| e)
}

/// [`with_failover`], also through `through`'s failures, saying on failure
/// whether an attempt may have run unanswered (a failure the retries did
/// not explain is judged by `describe`'s caller).
///
/// Which failures are repeated, the pauses and when to stop are the
/// decisions of one [`retry`] policy; this loop only sends and sleeps.
pub(crate) async fn retried<T, F, Fut>(
    target: &Target,
    context: &str,
    key: Option<&str>,
    repeat: Repeat,
    through: Through,
    mut attempt: F,
    describe: impl FnOnce(&RedisError) -> Error,
) -> std::result::Result<T, (Error, bool)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    let mut policy = retry::policy(
        target.request_timeout,
        last_attempt_reserve(target.request_timeout),
        FAILOVER_PAUSES,
        LastPause::Shorten,
        repeat.policy(),
    );
    let deadline = retry::on_runtime(policy.deadline());
    let mut seen = Seen::default();
    let gave_up = |seen: &Seen, policy: &retry::Retry| {
        let elapsed = retry::now().saturating_duration_since(policy.started());
        let message = gave_up(context, key, seen, elapsed, repeat);
        (
            target.failure(ErrorKind::Unavailable, message),
            policy.in_doubt(),
        )
    };
    let waits = target.cluster || through == Through::Restart;
    loop {
        let e = match tokio::time::timeout_at(deadline, attempt()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => e,
            Err(_) => {
                // Cut off by the deadline: it may have run, and the
                // policy ends the request.
                let first = policy.failures() == 0;
                let _ = policy.on_error(retry::now(), Sign::MaybeRun);
                if first {
                    return Err((Error::Timeout(target.request_timeout), true));
                }
                return Err(gave_up(&seen, &policy));
            }
        };
        let answer = Answer::of(&e);
        let sign = match &answer {
            Some(answer) if waits => answer.sign(),
            _ => Sign::Final,
        };
        let first = policy.failures() == 0;
        match policy.on_error(retry::now(), sign) {
            Decision::Retry(pause) => {
                if let Some(answer) = answer {
                    seen.note(answer);
                }
                // No attempt is begun without time to hear its answer (the
                // policy's reserve): the crate hands a command to its
                // connection task at once, so an attempt cut off by the
                // deadline may still be sent, and an append that until then
                // only met refusals (provably not run, so retryable) would
                // end in doubt for nothing.
                tokio::time::sleep(pause).await;
            }
            Decision::GiveUp(GiveUp::Final) => {
                let error = describe(&e);
                // A write whose connection broke: it may be stored.
                return Err(if answer == Some(Answer::Lost) {
                    (outcome_unknown(error, repeat), true)
                } else {
                    (error, policy.in_doubt())
                });
            }
            Decision::GiveUp(GiveUp::Unrepeatable) if first => {
                return Err((outcome_unknown(describe(&e), repeat), true));
            }
            Decision::GiveUp(_) => {
                if let Some(answer) = answer {
                    seen.note(answer);
                }
                return Err(gave_up(&seen, &policy));
            }
        }
    }
}

/// How long before the request deadline [`with_failover`] begins its last
/// attempt: a refusal comes back within a millisecond on a healthy network,
/// so 100 ms leaves room for a slow one, and a tenth of short timeouts
/// keeps most of them for waiting out the failover.
fn last_attempt_reserve(request_timeout: Duration) -> Duration {
    (request_timeout / 10).min(Duration::from_millis(100))
}

/// `e` saying that the request it failed may have had its effect.
fn outcome_unknown(e: Error, repeat: Repeat) -> Error {
    let Repeat::Unsafe(unknown) = repeat else {
        return e;
    };
    match e {
        Error::Backend {
            backend,
            endpoints,
            kind,
            message,
        } => Error::Backend {
            backend,
            endpoints,
            kind,
            message: format!("{message} ({unknown})"),
        },
        other => other,
    }
}

/// The one line a request retried through a failover ends with.
fn gave_up(
    context: &str,
    key: Option<&str>,
    seen: &Seen,
    elapsed: Duration,
    repeat: Repeat,
) -> String {
    let slot = match key {
        Some(key) => format!("slot {}", key_slot(key.as_bytes())),
        None => "a slot".to_string(),
    };
    let master = match &seen.master {
        Some(addr) => format!("{slot}'s master {addr}"),
        None => format!("{slot}'s master"),
    };
    let what = match seen.last {
        Some(Answer::ClusterDown) => format!(
            "{slot} is refused: the cluster is down (CLUSTERDOWN) until a failed master is replaced"
        ),
        Some(Answer::TryAgain) => format!("{slot} is being migrated (TRYAGAIN)"),
        Some(Answer::NotReady) => format!("{master} is not ready for writes"),
        _ => format!("{master} is unreachable"),
    };
    let unknown = match (&seen.last, repeat) {
        (Some(Answer::Lost), Repeat::Unsafe(unknown)) => format!(" ({unknown})"),
        _ => String::new(),
    };
    format!("{context}: {what}: failover in progress (gave up after {elapsed:.1?}){unknown}")
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the bytes
/// between the first `{` and the next `}`, when not empty) or of the whole
/// key, modulo 16,384, as Redis Cluster computes it.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// `url` with the scheme `host:port` stands for: `redis://`, or
/// `rediss://` with `tls`, as etcd's and NATS' endpoints read; a URL with
/// a scheme stays as it is. `host:port` is checked as strictly as an etcd
/// endpoint (a port is required, 1..=65535).
fn with_scheme(url: &str, tls: bool) -> Result<String> {
    if url.contains("://") {
        return Ok(url.to_string());
    }
    let dialled = crate::endpoint::parse(url, false)
        .map_err(|why| Error::invalid("url", format!("{url:?} {why}")))?;
    let authority = dialled.trim_start_matches("http://");
    Ok(if tls {
        format!("rediss://{authority}")
    } else {
        format!("redis://{authority}")
    })
}

/// `url` without its password.
fn redacted(url: &str) -> String {
    // redis[s]://[user[:password]@]host...
    let Some((scheme, rest)) = ["redis://", "rediss://"]
        .iter()
        .find_map(|s| url.strip_prefix(s).map(|rest| (s, rest)))
    else {
        return url.to_string();
    };
    match rest.rsplit_once('@') {
        Some((auth, host)) => {
            let user = auth.split_once(':').map_or(auth, |(u, _)| u);
            format!("{scheme}{user}:***@{host}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(urls: &str) -> Result<Target> {
        Target::parse(urls, &RedisOptions::default())
    }

    #[test]
    fn host_port_means_redis_or_rediss_with_tls() {
        let t = parse("127.0.0.1:6379").unwrap();
        assert_eq!(t.urls, "redis://127.0.0.1:6379");
        assert!(!t.secure && !t.cluster);
        let t = parse("127.0.0.1:7000, 127.0.0.1:7001").unwrap();
        assert_eq!(t.urls, "redis://127.0.0.1:7000,redis://127.0.0.1:7001");
        let with_ca = RedisOptions::default().with_tls(Tls::new(TEST_CA).unwrap());
        let t = Target::parse(&["127.0.0.1:6379"], &with_ca).unwrap();
        assert_eq!(t.urls, "rediss://127.0.0.1:6379");
        assert!(t.secure);
        assert!(parse("127.0.0.1").is_err());
    }

    /// A CA certificate (self-signed, made once with openssl) for checks
    /// that never dial.
    const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBdTCCARugAwIBAgIUDZAsTM3txF1EJjLXFMJxUAWpDd0wCgYIKoZIzj0EAwIw
DzENMAsGA1UEAwwEdGVzdDAgFw0yNjEyMDIxMzA3MzBaGA8yMTI2MTEwODEzMDcz
MFowDzENMAsGA1UEAwwEdGVzdDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABMSJ
2coBxtnxSjJ/lCELQw0Fh8lrTfOglIV0NRuCtuBKWUk9sPtl0Pho9CG0utoRmhWV
IbJe141t/NAeUDHSZaKjUzBRMB0GA1UdDgQWBBSTe4qD0MeiEKCfdhWsx3iCzeuH
QDAfBgNVHSMEGDAWgBSTe4qD0MeiEKCfdhWsx3iCzeuHQDAPBgNVHRMBAf8EBTAD
AQH/MAoGCCqGSM49BAMCA0gAMEUCIQDNzn+GYzGusEcLgMBEQZ7LAHIQv4b9WcAE
9jUtZdU4kwIgQUUJ4slVD4FBVIOCjHIA3uSlNSNpO1wv/73IauaolWE=
-----END CERTIFICATE-----
";

    #[test]
    fn one_url_is_standalone_several_a_cluster() {
        assert!(!parse("redis://127.0.0.1:6379").unwrap().cluster);
        assert!(
            parse("redis://127.0.0.1:7000, redis://127.0.0.1:7001")
                .unwrap()
                .cluster
        );
        let forced = Target::parse(
            "redis://127.0.0.1:7000",
            &RedisOptions::default().with_cluster(true),
        )
        .unwrap();
        assert!(forced.cluster);
        assert!(Target::parse(
            "redis://127.0.0.1:7000,redis://127.0.0.1:7001",
            &RedisOptions::default().with_cluster(false),
        )
        .is_err());
    }

    #[test]
    fn bad_urls_are_named() {
        for bad in [
            "",
            " , ",
            "http://127.0.0.1:6379",
            "127.0.0.1",
            "127.0.0.1:99999",
        ] {
            match parse(bad) {
                Err(Error::InvalidArgument { what: "url", .. }) => {}
                other => panic!("{bad:?}: {:?}", other.map(|t| t.urls)),
            }
        }
    }

    #[test]
    fn rediss_urls_take_tls_and_never_skip_verification() {
        // Without a CA: TLS verified against the built-in roots.
        let t = parse("rediss://127.0.0.1:6379").unwrap();
        assert!(t.secure && t.certs.is_none());
        let t = parse("rediss://127.0.0.1:7000,rediss://127.0.0.1:7001").unwrap();
        assert!(t.secure && t.cluster);
        let tls = Tls::new(TEST_CA).unwrap();
        let with_ca = RedisOptions::default().with_tls(tls.clone());
        let t = Target::parse("rediss://127.0.0.1:6379", &with_ca).unwrap();
        let certs = t.certs.as_ref().expect("the CA is handed to the crate");
        assert_eq!(certs.root_cert.as_deref(), Some(TEST_CA.as_bytes()));
        assert!(certs.client_tls.is_none());
        for (urls, options, says) in [
            (
                "redis://127.0.0.1:6379",
                &with_ca,
                "is plain redis:// but TLS is configured",
            ),
            (
                "rediss://127.0.0.1:7000,redis://127.0.0.1:7001",
                &RedisOptions::default(),
                "mixes redis:// and rediss://",
            ),
            (
                "rediss://127.0.0.1:6379/#insecure",
                &RedisOptions::default(),
                "#insecure is refused",
            ),
        ] {
            match Target::parse(urls, options) {
                Err(Error::InvalidArgument { what: "url", why }) => {
                    assert!(why.contains(says), "{urls}: {why}")
                }
                other => panic!("{urls}: {:?}", other.map(|t| t.urls)),
            }
        }
        let named = RedisOptions::default().with_tls(tls.with_server_name("localhost").unwrap());
        assert!(matches!(
            Target::parse("rediss://127.0.0.1:6379", &named),
            Err(Error::Unsupported(_))
        ));
    }

    #[test]
    fn failed_handshakes_say_which_check_failed() {
        let none = || None;
        let said = "cannot connect: invalid peer certificate: UnknownIssuer";
        let text = explain_tls(said, true, false, true, none);
        assert!(
            text.starts_with(
                "TLS: the server's certificate is not trusted: it is not signed by the given CA"
            ),
            "{text}"
        );
        assert!(explain_tls(said, true, false, false, none).contains("no CA was given"));
        let text = explain_tls(
            "invalid peer certificate: NotValidForName",
            true,
            false,
            true,
            none,
        );
        assert!(text.contains("not valid for the host in the URL"), "{text}");
        let reset = "Connection reset by peer";
        assert!(
            explain_tls(reset, true, false, true, none).contains("requires a client certificate")
        );
        let alert = "received fatal alert: CertificateRequired";
        assert!(
            explain_tls(alert, true, false, true, none).contains("requires a client certificate")
        );
        let text = explain_tls("invalid peer certificate: Expired", true, true, true, none);
        assert!(
            text.contains("the server's certificate is outside its validity dates"),
            "{text}"
        );
        let expired = || Some("it expired on 2021-01-01 00:00:00 UTC".to_string());
        assert_eq!(
            explain_tls(
                "received fatal alert: CertificateExpired",
                true,
                true,
                true,
                expired
            ),
            "TLS: the server refused the client certificate: it expired on 2021-01-01 \
             00:00:00 UTC (received fatal alert: CertificateExpired)"
        );
        assert_eq!(
            explain_tls("connection refused", true, true, true, none),
            "connection refused"
        );
        // Past the first connect a reset is a restart or a failover, not a
        // refused handshake.
        assert_eq!(explain_tls(reset, false, false, true, none), reset);
    }

    #[test]
    fn messages_never_show_passwords() {
        let t = parse("redis://app:hunter2@127.0.0.1:6379").unwrap();
        assert_eq!(t.urls, "redis://app:***@127.0.0.1:6379");
        let e = t.failure(ErrorKind::Unavailable, "x").to_string();
        assert!(!e.contains("hunter2"), "{e}");
        // A user without a password, and text that is no redis:// URL, are
        // shown as they are.
        assert_eq!(
            redacted("redis://app@127.0.0.1:6379"),
            "redis://app:***@127.0.0.1:6379"
        );
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redacted("tcp://a:b@host"), "tcp://a:b@host");
        assert_eq!(
            redacted("rediss://app:p@ss@127.0.0.1:6379"),
            "rediss://app:***@127.0.0.1:6379"
        );
        let with_options = Target::parse(
            "redis://127.0.0.1:6379",
            &RedisOptions::default()
                .with_username("fleet")
                .with_password("s3cret"),
        )
        .unwrap();
        assert_eq!(with_options.urls, "redis://127.0.0.1:6379");
        let settings = with_options.nodes[0].redis_settings();
        assert_eq!(settings.username(), Some("fleet"));
        assert_eq!(settings.password(), Some("s3cret"));
    }

    #[test]
    fn out_of_range_options_and_unparsable_urls_are_refused_before_connecting() {
        let zero = RedisOptions::default().with_feed_capacity(0);
        assert!(matches!(
            Target::parse("redis://127.0.0.1:6379", &zero),
            Err(Error::InvalidArgument { .. })
        ));
        match parse("redis://127.0.0.1:notaport") {
            Err(Error::InvalidArgument { what: "url", why }) => {
                assert!(why.contains("notaport"), "{why}")
            }
            other => panic!("{:?}", other.map(|t| t.urls)),
        }
    }

    fn server(kind: redis::ServerErrorKind) -> RedisError {
        RedisError::from((redis::ErrorKind::Server(kind), "from the server"))
    }

    #[test]
    fn crate_errors_map_onto_the_retry_policy() {
        use redis::{ErrorKind as RedisErrorKind, ServerErrorKind};
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let timed_out = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let unavailable = [
            refused,
            timed_out,
            RedisError::from((RedisErrorKind::Io, "dropped")),
            RedisError::from((RedisErrorKind::ClusterConnectionNotFound, "no node")),
            server(ServerErrorKind::BusyLoading),
            server(ServerErrorKind::TryAgain),
            server(ServerErrorKind::ClusterDown),
            server(ServerErrorKind::MasterDown),
            server(ServerErrorKind::Moved),
            server(ServerErrorKind::Ask),
            server(ServerErrorKind::ReadOnly),
        ];
        for e in &unavailable {
            assert_eq!(kind_of(e), ErrorKind::Unavailable, "{e}");
        }
        for e in [
            server(ServerErrorKind::NoPerm),
            RedisError::from((RedisErrorKind::AuthenticationFailed, "WRONGPASS")),
            redis::make_extension_error("WRONGPASS".into(), Some("invalid pair".into())),
            redis::make_extension_error("NOAUTH".into(), None),
        ] {
            assert_eq!(kind_of(&e), ErrorKind::PermissionDenied, "{e}");
        }
        for e in [
            RedisError::from((RedisErrorKind::Parse, "garbled")),
            RedisError::from((RedisErrorKind::UnexpectedReturnType, "not a string")),
        ] {
            assert_eq!(kind_of(&e), ErrorKind::Unexpected, "{e}");
        }
        for e in [
            server(ServerErrorKind::ResponseError),
            server(ServerErrorKind::CrossSlot),
            server(ServerErrorKind::NoScript),
            RedisError::from((RedisErrorKind::InvalidClientConfig, "bad")),
        ] {
            assert_eq!(kind_of(&e), ErrorKind::Rejected, "{e}");
        }
        // What the user sees: the backend, the URLs, the context, one line.
        let t = parse("redis://127.0.0.1:6379").unwrap();
        let e = RedisError::from((RedisErrorKind::Io, "line one\nline  two"));
        match t.error("kv_set", &e) {
            Error::Backend {
                backend: "redis",
                endpoints,
                kind: ErrorKind::Unavailable,
                message,
            } => {
                assert_eq!(endpoints, "redis://127.0.0.1:6379");
                assert!(message.starts_with("kv_set: "), "{message}");
                assert!(
                    !message.contains('\n') && !message.contains("  "),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn slots_are_redis_clusters() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(key_slot(b"{a}x"), 15495);
        assert_eq!(key_slot(b"a"), 15495);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"123456789"), 12739);
        // An empty or unclosed tag hashes the whole key; only the first
        // tag counts.
        assert_eq!(key_slot(b"{}foo"), 9500);
        assert_eq!(key_slot(b"{foo"), 13308);
        assert_eq!(key_slot(b"a{b}"), 3300);
        assert_eq!(key_slot(b"x{}{y}"), 14166);
        assert_eq!(key_slot(b"coord:kv:{b}"), key_slot(b"coord:kvn:{b}"));
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn failover_answers_are_told_from_other_failures() {
        use redis::ServerErrorKind as S;
        let ours = redis::make_extension_error("x".into(), None);
        assert_eq!(Answer::of(&ours), None);
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(Answer::of(&refused), Some(Answer::Unreachable));
        let reset = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(Answer::of(&reset), Some(Answer::Lost));
        for (kind, sign) in [
            (S::ClusterDown, Answer::ClusterDown),
            (S::TryAgain, Answer::TryAgain),
            (S::MasterDown, Answer::NotReady),
            (S::ReadOnly, Answer::NotReady),
            (S::BusyLoading, Answer::NotReady),
        ] {
            assert_eq!(Answer::of(&server(kind)), Some(sign), "{kind:?}");
        }
        for kind in [S::ResponseError, S::NoScript, S::CrossSlot, S::NoPerm] {
            assert_eq!(Answer::of(&server(kind)), None, "{kind:?}");
        }
        // Not run: retried for every request; may have run: only for those
        // that can be repeated (the policy's rule 2).
        assert_eq!(Answer::ClusterDown.sign(), Sign::NotRun);
        assert_eq!(Answer::Unreachable.sign(), Sign::NotRun);
        assert_eq!(Answer::Lost.sign(), Sign::MaybeRun);
        assert_eq!(
            Repeat::Unsafe("it may have been applied").policy(),
            retry::Repeat::Once
        );
        assert_eq!(Repeat::Safe.policy(), retry::Repeat::Safe);
    }

    #[test]
    fn no_attempt_through_a_failover_is_cut_off_by_the_deadline() {
        // Every attempt is refused after 5 ms (a dead master): all of them
        // must end with their answer, so that the caller knows none ran.
        let target = Target::parse(
            "redis://127.0.0.1:1,redis://127.0.0.1:2",
            &RedisOptions::default().with_request_timeout(Duration::from_millis(300)),
        )
        .expect("a cluster target");
        let (begun, answered) = (
            std::sync::atomic::AtomicU32::new(0),
            std::sync::atomic::AtomicU32::new(0),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let started = std::time::Instant::now();
        let result: Result<()> = runtime.block_on(with_failover(
            &target,
            "append to stream \"s\"",
            Some("coord:stream:{s}"),
            Repeat::Safe,
            || async {
                begun.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(RedisError::from(std::io::Error::from(
                    std::io::ErrorKind::ConnectionRefused,
                )))
            },
            |_| unreachable!("a refusal is a failover's"),
        ));
        let took = started.elapsed();
        let e = result.expect_err("refused throughout");
        assert!(e.is_retryable(), "{e}");
        assert!(
            e.to_string()
                .contains("is unreachable: failover in progress"),
            "{e}"
        );
        assert!(took <= Duration::from_millis(300), "took {took:?}");
        let begun = begun.load(std::sync::atomic::Ordering::Relaxed);
        assert!(begun > 3, "retried through the failover: {begun} attempts");
        assert_eq!(
            answered.load(std::sync::atomic::Ordering::Relaxed),
            begun,
            "an attempt was begun without time for its answer"
        );
    }

    #[test]
    fn giving_up_says_which_slot_and_master_and_why() {
        let mut seen = Seen::default();
        seen.note(Answer::Redirected {
            addr: "127.0.0.1:39195".into(),
        });
        seen.note(Answer::Unreachable);
        let after = Duration::from_millis(5000);
        assert_eq!(
            gave_up(
                "set \"k\" in bucket \"b\"",
                Some("coord:kv:{b}"),
                &seen,
                after,
                Repeat::Safe
            ),
            format!(
                "set \"k\" in bucket \"b\": slot {}'s master 127.0.0.1:39195 is unreachable: \
                 failover in progress (gave up after 5.0s)",
                key_slot(b"b")
            )
        );
        let down = Seen {
            master: None,
            last: Some(Answer::ClusterDown),
        };
        assert_eq!(
            gave_up("ping", None, &down, after, Repeat::Safe),
            "ping: a slot is refused: the cluster is down (CLUSTERDOWN) until a failed master is \
             replaced: failover in progress (gave up after 5.0s)"
        );
        let lost = Seen {
            master: None,
            last: Some(Answer::Lost),
        };
        let once = Repeat::Unsafe("the append may or may not have been applied");
        let text = gave_up("append", Some("s"), &lost, after, once);
        assert!(
            text.ends_with("(gave up after 5.0s) (the append may or may not have been applied)"),
            "{text}"
        );
        let migrating = Seen {
            master: None,
            last: Some(Answer::TryAgain),
        };
        assert!(gave_up("x", Some("s"), &migrating, after, Repeat::Safe).contains("(TRYAGAIN)"));
    }

    #[test]
    fn an_unconfirmed_write_is_its_own_kind_and_says_it_was_applied() {
        let confirm = Confirm {
            replicas: 2,
            timeout_ms: 1000,
        };
        let t = parse("redis://127.0.0.1:6379").unwrap();
        let e = unreplicated(&redis::Value::BulkString(b"0-17".to_vec()), 1, confirm);
        assert_eq!(kind_of(&e), ErrorKind::Unreplicated);
        match t.error("append to stream \"s\"", &e) {
            Error::Backend {
                kind: ErrorKind::Unreplicated,
                message,
                ..
            } => assert_eq!(
                message,
                "append to stream \"s\": applied on the master as 0-17 but confirmed by 1 of 2 \
                 replicas within 1000 ms (stored; durability unconfirmed: lost if the master \
                 fails before a replica has it)"
            ),
            other => panic!("{other:?}"),
        }
        let e = unreplicated(&redis::Value::Int(4), 0, confirm);
        assert!(t
            .error("set", &e)
            .to_string()
            .contains("set: applied on the master but"));
        // Other extension errors keep the usual mapping.
        let other = redis::make_extension_error("OTHER".into(), Some("x".into()));
        assert_eq!(kind_of(&other), ErrorKind::Rejected);
    }

    #[test]
    fn only_message_pushes_carry_a_message() {
        use redis::{PushKind, Value};
        let bulk = |b: &[u8]| Value::BulkString(b.to_vec());
        let push = |kind, data| PushInfo { kind, data };
        assert_eq!(
            message(&push(PushKind::Message, vec![bulk(b"ch"), bulk(b"hi")])),
            Some((b"ch".to_vec(), b"hi".to_vec()))
        );
        assert_eq!(
            message(&push(
                PushKind::SMessage,
                vec![Value::SimpleString("ch".into()), bulk(b"")]
            )),
            Some((b"ch".to_vec(), Vec::new()))
        );
        for other in [
            push(PushKind::Subscribe, vec![bulk(b"ch"), Value::Int(1)]),
            push(PushKind::Disconnection, vec![]),
            push(PushKind::Message, vec![bulk(b"ch")]),
            push(PushKind::Message, vec![bulk(b"ch"), Value::Int(1)]),
            push(PushKind::Message, vec![Value::Nil, bulk(b"hi")]),
        ] {
            assert_eq!(message(&other), None, "{other:?}");
        }
        assert_eq!(
            bytes(&Value::VerbatimString {
                format: redis::VerbatimFormat::Text,
                text: "txt".into()
            }),
            Some(b"txt".to_vec())
        );
        assert_eq!(bytes(&Value::Okay), None);
        assert_eq!(publish_command(true), "SPUBLISH");
        assert_eq!(publish_command(false), "PUBLISH");
    }
}
