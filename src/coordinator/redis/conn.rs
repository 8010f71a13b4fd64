//! Connections: the one shared command connection, and the dedicated ones
//! each feed opens for itself. The only file that picks between standalone
//! and cluster clients of the `redis` crate.
//!
//! * Commands go over one multiplexed connection that reconnects by itself
//!   (`ConnectionManager` standalone, the async `ClusterConnection` on a
//!   cluster), with retries kept low and every response bounded by the
//!   request timeout: with the crate's defaults a command to a dead master
//!   hung for over two minutes (docs/backend-notes.md, "Reconnects"). The
//!   crate does not retry commands on the cluster's command connection
//!   (`retries(0)`): it re-sends a command whose connection broke, which
//!   for an append whose reply was lost stores it twice; only
//!   `failover.rs` decides what is repeated.
//! * Each subscription and KV watch has its own RESP3 connection with a
//!   push channel; each stream reader its own connection without a
//!   response timeout shorter than its `XREAD BLOCK` (the multiplexed
//!   connection's 500 ms default fails a longer block, and a blocked read
//!   delays every other command on its connection; docs/backend-notes.md,
//!   "Streams"). Feeds rebuild their connection themselves after a failure,
//!   so they never depend on the crate's silent resubscription.
//! * With [`RedisOptions::min_replicas`] every script run on the command
//!   connection (the KV write, the stream append) is followed by `WAIT` in
//!   the same pipeline, so it counts the replicas that have this write.

#[cfg(doc)]
use super::options::RedisOptions;
use super::target::Target;
use super::tls::install_crypto_provider;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Client, Cmd, FromRedisValue, ProtocolVersion, PushInfo, RedisError,
    RedisResult, ScriptInvocation,
};
use std::time::Duration;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// How many replicas must confirm a write, and how long to wait for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Confirm {
    pub(super) replicas: usize,
    pub(super) timeout_ms: u64,
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

    /// Runs one script that is no write of the caller's (a read), never
    /// followed by `WAIT`: there is nothing of the caller's to confirm
    /// (the expiries such a script may carry out are the server's).
    pub(crate) async fn invoke_read<T: FromRedisValue>(
        &mut self,
        script: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
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
            if wrote_nothing(&reply) {
                // There is no write to confirm.
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

/// The code of the error [`Conn::invoke_confirmed`] makes when too few
/// replicas confirmed; [`kind_of`] maps it to
/// [`ErrorKind::Unreplicated`].
pub(super) const UNREPLICATED: &str = "FLEETCOORD_UNREPLICATED";

/// Whether a script's answer says it wrote nothing of the caller's: the KV
/// write script's `{1, 0}` (a delete of a missing key) and `{0, current}`
/// (a conditional write refused), and a bare 0.
fn wrote_nothing(reply: &redis::Value) -> bool {
    use redis::Value;
    match reply {
        Value::Int(0) => true,
        Value::Array(parts) => matches!(
            parts.as_slice(),
            [Value::Int(1), Value::Int(0)] | [Value::Int(0), _]
        ),
        _ => false,
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::redis::options::RedisOptions;
    use crate::coordinator::redis::target::kind_of;
    use crate::error::{Error, ErrorKind};

    fn parse(urls: &str) -> crate::error::Result<Target> {
        Target::parse(urls, &RedisOptions::default())
    }

    #[test]
    fn only_answers_of_writes_wait_for_replicas() {
        use redis::Value::{Array, Int};
        assert!(wrote_nothing(&Int(0)));
        // A delete of a missing key, a refused conditional set.
        assert!(wrote_nothing(&Array(vec![Int(1), Int(0)])));
        assert!(wrote_nothing(&Array(vec![Int(0), Int(7)])));
        assert!(wrote_nothing(&Array(vec![Int(0), Int(0)])));
        // A set at revision 7, an append's id.
        assert!(!wrote_nothing(&Array(vec![Int(1), Int(7)])));
        assert!(!wrote_nothing(&redis::Value::BulkString(b"0-3".to_vec())));
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
