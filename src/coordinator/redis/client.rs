//! Connections: the one shared command connection, and the dedicated ones
//! each feed opens for itself. The only file that picks between standalone
//! and cluster clients of the `redis` crate.
//!
//! * Commands go over one multiplexed connection that reconnects by itself
//!   (`ConnectionManager` standalone, the async `ClusterConnection` on a
//!   cluster), with retries kept low and every response bounded by the
//!   request timeout: with the crate's defaults a command to a dead master
//!   hung for over two minutes (BACKEND-NOTES, "Reconnects").
//! * Each subscription and KV watch has its own RESP3 connection with a
//!   push channel; each stream reader its own connection without a
//!   response timeout shorter than its `XREAD BLOCK` (the multiplexed
//!   connection's 500 ms default fails a longer block, and a blocked read
//!   delays every other command on its connection; BACKEND-NOTES,
//!   "Streams"). Feeds rebuild their connection themselves after a failure,
//!   so they never depend on the crate's silent resubscription.

use super::options::RedisOptions;
use crate::error::{Error, EtcdErrorKind, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionInfo, FromRedisValue, IntoConnectionInfo,
    ProtocolVersion, PushInfo, RedisError, RedisResult, ScriptInvocation,
};
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
}

/// A connection that serves commands.
#[derive(Clone)]
pub(crate) enum Conn {
    /// Standalone, reconnecting by itself.
    Managed(ConnectionManager),
    /// Standalone, dead for good once its server is gone: feeds notice that
    /// and rebuild.
    Single(MultiplexedConnection),
    /// Cluster.
    Cluster(ClusterConnection),
}

impl Target {
    /// Checks `urls` (comma-separated `redis://` URLs) and `options`.
    pub(crate) fn parse(urls: &str, options: &RedisOptions) -> Result<Target> {
        options.check()?;
        let list: Vec<&str> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect();
        if list.is_empty() {
            return Err(Error::invalid("url", "no redis:// URL given"));
        }
        let mut nodes = Vec::with_capacity(list.len());
        let mut shown = Vec::with_capacity(list.len());
        for url in &list {
            if url.starts_with("rediss://") {
                return Err(Error::Unsupported(
                    "TLS (rediss://): the redis backend is built without a TLS stack",
                ));
            }
            if !url.starts_with("redis://") {
                return Err(Error::invalid(
                    "url",
                    format!("{:?} is not a redis:// URL", redacted(url)),
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
        })
    }

    fn standalone(&self) -> RedisResult<Client> {
        // `parse` guarantees at least one node.
        let node =
            self.nodes.first().cloned().ok_or_else(|| {
                RedisError::from((redis::ErrorKind::InvalidClientConfig, "no URL"))
            })?;
        Client::open(node)
    }

    fn cluster_builder(&self) -> ClusterClientBuilder {
        ClusterClientBuilder::new(self.nodes.clone())
            .use_protocol(ProtocolVersion::RESP3)
            .connection_timeout(self.connect_timeout)
            .retries(2)
            .min_retry_wait(50)
            .max_retry_wait(500)
    }

    /// The shared command connection, proven with a PING.
    pub(crate) async fn command_conn(&self) -> RedisResult<Conn> {
        let mut conn = if self.cluster {
            let client = self
                .cluster_builder()
                .response_timeout(self.request_timeout)
                .overall_response_timeout(Some(self.request_timeout))
                .build()?;
            Conn::Cluster(client.get_async_connection().await?)
        } else {
            let config = ConnectionManagerConfig::new()
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(500))
                .set_connection_timeout(Some(self.connect_timeout))
                .set_response_timeout(Some(self.request_timeout));
            Conn::Managed(
                self.standalone()?
                    .get_connection_manager_with_config(config)
                    .await?,
            )
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
            Conn::Cluster(client.get_async_connection().await?)
        } else {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.connect_timeout))
                .set_response_timeout(Some(self.request_timeout))
                .set_push_sender(tx);
            Conn::Single(
                self.standalone()?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            )
        };
        Ok((conn, rx))
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
            Ok(Conn::Cluster(client.get_async_connection().await?))
        } else {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.connect_timeout))
                .set_response_timeout(Some(timeout));
            Ok(Conn::Single(
                self.standalone()?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            ))
        }
    }

    /// `e` as the user's error, with what was being done.
    pub(crate) fn error(&self, context: impl std::fmt::Display, e: &RedisError) -> Error {
        Error::Backend {
            backend: "redis",
            endpoints: self.urls.clone(),
            kind: kind_of(e),
            message: format!("{context}: {}", one_line(e)),
        }
    }

    /// An error of `kind` that did not come from the crate.
    pub(crate) fn failure(&self, kind: EtcdErrorKind, message: impl Into<String>) -> Error {
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
        match self {
            Conn::Managed(c) => cmd.query_async(c).await,
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// Runs one script (EVALSHA, loading it on `NOSCRIPT`).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &mut self,
        script: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        match self {
            Conn::Managed(c) => script.invoke_async(c).await,
            Conn::Single(c) => script.invoke_async(c).await,
            Conn::Cluster(c) => script.invoke_async(c).await,
        }
    }

    /// Subscribes to `channel`: sharded (`SSUBSCRIBE`) on a cluster, so the
    /// subscription lives on the shard that owns the channel's slot; plain
    /// `SUBSCRIBE` on a standalone server. Returns once the server
    /// confirmed it.
    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Conn::Managed(c) => c.subscribe(channel).await,
            Conn::Single(c) => c.subscribe(channel).await,
            Conn::Cluster(c) => c.ssubscribe(channel).await,
        }
    }
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
pub(super) fn kind_of(e: &RedisError) -> EtcdErrorKind {
    use redis::{ErrorKind, ServerErrorKind};
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return EtcdErrorKind::Unavailable;
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::ReadOnly,
        )
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::Io => EtcdErrorKind::Unavailable,
        ErrorKind::Server(ServerErrorKind::NoPerm) | ErrorKind::AuthenticationFailed => {
            EtcdErrorKind::PermissionDenied
        }
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => EtcdErrorKind::Unexpected,
        _ => EtcdErrorKind::Rejected,
    }
}

/// The crate's error on one line.
pub(crate) fn one_line(e: &RedisError) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `url` without its password.
fn redacted(url: &str) -> String {
    // redis://[user[:password]@]host...
    let Some(rest) = url.strip_prefix("redis://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((auth, host)) => {
            let user = auth.split_once(':').map_or(auth, |(u, _)| u);
            format!("redis://{user}:***@{host}")
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
        for bad in ["", " , ", "http://127.0.0.1:6379", "127.0.0.1:6379"] {
            match parse(bad) {
                Err(Error::InvalidArgument { what: "url", .. }) => {}
                other => panic!("{bad:?}: {:?}", other.map(|t| t.urls)),
            }
        }
        assert!(matches!(
            parse("rediss://127.0.0.1:6379"),
            Err(Error::Unsupported(_))
        ));
    }

    #[test]
    fn messages_never_show_passwords() {
        let t = parse("redis://app:hunter2@127.0.0.1:6379").unwrap();
        assert_eq!(t.urls, "redis://app:***@127.0.0.1:6379");
        let e = t.failure(EtcdErrorKind::Unavailable, "x").to_string();
        assert!(!e.contains("hunter2"), "{e}");
        // A user without a password, and text that is no redis:// URL, are
        // shown as they are.
        assert_eq!(
            redacted("redis://app@127.0.0.1:6379"),
            "redis://app:***@127.0.0.1:6379"
        );
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redacted("tcp://a:b@host"), "tcp://a:b@host");
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
        use redis::{ErrorKind, ServerErrorKind};
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let timed_out = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let unavailable = [
            refused,
            timed_out,
            RedisError::from((ErrorKind::Io, "dropped")),
            RedisError::from((ErrorKind::ClusterConnectionNotFound, "no node")),
            server(ServerErrorKind::BusyLoading),
            server(ServerErrorKind::TryAgain),
            server(ServerErrorKind::ClusterDown),
            server(ServerErrorKind::MasterDown),
            server(ServerErrorKind::Moved),
            server(ServerErrorKind::Ask),
            server(ServerErrorKind::ReadOnly),
        ];
        for e in &unavailable {
            assert_eq!(kind_of(e), EtcdErrorKind::Unavailable, "{e}");
        }
        for e in [
            server(ServerErrorKind::NoPerm),
            RedisError::from((ErrorKind::AuthenticationFailed, "WRONGPASS")),
        ] {
            assert_eq!(kind_of(&e), EtcdErrorKind::PermissionDenied, "{e}");
        }
        for e in [
            RedisError::from((ErrorKind::Parse, "garbled")),
            RedisError::from((ErrorKind::UnexpectedReturnType, "not a string")),
        ] {
            assert_eq!(kind_of(&e), EtcdErrorKind::Unexpected, "{e}");
        }
        for e in [
            server(ServerErrorKind::ResponseError),
            server(ServerErrorKind::CrossSlot),
            server(ServerErrorKind::NoScript),
            RedisError::from((ErrorKind::InvalidClientConfig, "bad")),
        ] {
            assert_eq!(kind_of(&e), EtcdErrorKind::Rejected, "{e}");
        }
        // What the user sees: the backend, the URLs, the context, one line.
        let t = parse("redis://127.0.0.1:6379").unwrap();
        let e = RedisError::from((ErrorKind::Io, "line one\nline  two"));
        match t.error("kv_set", &e) {
            Error::Backend {
                backend: "redis",
                endpoints,
                kind: EtcdErrorKind::Unavailable,
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
