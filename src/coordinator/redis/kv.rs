//! KV buckets: one hash per bucket, written together with a version bump
//! and a notification by one script, and the watch that mirrors it without
//! a gap.
//!
//! **Write.** [`WRITE`] declares the hash `coord:kv:{b}`, the version
//! `coord:kvv:{b}` and the channel `coord:kvn:{b}` in `KEYS` (SPUBLISH from a
//! script refuses an undeclared channel, "Script attempted to access a non
//! local key"; docs/backend-notes.md, "Atomic write + notification"); the `{b}` tag
//! puts all three on one slot. It sets or deletes the field, increments the
//! version and publishes `"<version> <op> <key length> <key><value>"`, all or
//! nothing. Deleting a missing field changes nothing, so it neither bumps
//! the version nor publishes: watchers hear nothing (trait contract).
//!
//! **Watch** (docs/backend-notes.md, "Gap-free KV watch": 3,000 concurrent
//! writes on a cluster): subscribe first, then take the hash and the version
//! together ([`SNAPSHOT`]); notifications at or below the snapshot's
//! version are already in it, each later one must be exactly the next
//! version. A gap, a dropped connection (then a new connection and a new
//! subscription) or a full consumer queue leads to a new snapshot, and the
//! consumer is told the difference between what it was told and the new
//! snapshot. A version going backwards after a reconnect (a restart that
//! lost the data) is no special case: the new snapshot is the truth.

use super::conn::{message, publish_command, Conn};
use super::names;
use super::target::Target;
use super::task::FeedCtx;
use crate::coordinator::feed_task::retry_backoff;
use crate::coordinator::kv_mirror::{offer_queued, KvMirror};
use crate::coordinator::{pattern, KvEvent};
use crate::feed_queue::Offer;
use fleetcoord_sm::mirror::Order;
use redis::{PushInfo, PushKind, RedisResult, Script, Value};
use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

/// How often a watch looks for keys to expire while none has a deadline
/// (a key set with a TTL meanwhile is expired at most this late, well
/// within the contract's second).
const SWEEP_IDLE: Duration = Duration::from_millis(500);
use tokio::sync::mpsc::UnboundedReceiver;

/// The Lua every KV script starts with. KEYS: hash, version, channel,
/// revisions, expiries, tokens; ARGV[1] the publish command. `now_ms`
/// reads the server's clock (the one clock all clients share);
/// `notify` bumps the version and announces a change; `expire` removes
/// keys whose deadline passed — as deletes the watchers hear — at most
/// 100 per call, so no script runs long; `revision` is a present key's
/// revision (a key written before revisions were recorded counts as 1:
/// every write since has recorded a larger one), `false` when absent.
const PRELUDE: &str = r"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function notify(op, key, value)
  local v = redis.call('INCR', KEYS[2])
  redis.call(ARGV[1], KEYS[3], v .. ' ' .. op .. ' ' .. string.len(key) .. ' ' .. key .. value)
  return v
end
local function forget(key)
  redis.call('HDEL', KEYS[4], key)
  redis.call('ZREM', KEYS[5], key)
  redis.call('HDEL', KEYS[6], key)
end
local function expire(now)
  local due = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 100)
  for _, key in ipairs(due) do
    forget(key)
    if redis.call('HDEL', KEYS[1], key) == 1 then notify('d', key, '') end
  end
end
local function revision(key)
  if redis.call('HEXISTS', KEYS[1], key) == 0 then return false end
  return tonumber(redis.call('HGET', KEYS[4], key) or '1')
end
";

/// The keys every KV script is given, in [`PRELUDE`]'s order.
fn kv_keys(call: &mut redis::ScriptInvocation<'_>, bucket: &str) {
    call.key(names::kv_hash(bucket))
        .key(names::kv_version(bucket))
        .key(names::kv_channel(bucket))
        .key(names::kv_revisions(bucket))
        .key(names::kv_expiries(bucket))
        .key(names::kv_tokens(bucket));
}

/// ARGV: publish command, op (`s` set, `d` delete), key, value, expected
/// revision (`''`: none, `'0'`: absent), TTL in ms (`''`: none), token of
/// a conditional write (`''` for others).
///
/// Returns `{1, revision}` when applied (revision 0: a delete that changed
/// nothing), `{0, current}` when the condition failed (current 0: absent).
/// A conditional write whose token is the key's already applied (its
/// first answer was lost): `{1, revision}` again, without writing. A set
/// without a TTL drops the key's deadline: the key is permanent again.
pub(crate) static WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{PRELUDE}
local now = now_ms()
expire(now)
local key = ARGV[3]
if ARGV[2] == 'd' then
  forget(key)
  if redis.call('HDEL', KEYS[1], key) == 1 then return {{1, notify('d', key, '')}} end
  return {{1, 0}}
end
if ARGV[5] ~= '' then
  if ARGV[7] ~= '' and redis.call('HGET', KEYS[6], key) == ARGV[7] then
    return {{1, revision(key)}}
  end
  local current = revision(key)
  local holds
  if current then holds = tonumber(ARGV[5]) == current else holds = ARGV[5] == '0' end
  if not holds then return {{0, current or 0}} end
end
redis.call('HSET', KEYS[1], key, ARGV[4])
local v = notify('s', key, ARGV[4])
redis.call('HSET', KEYS[4], key, v)
if ARGV[6] ~= '' then
  redis.call('ZADD', KEYS[5], now + tonumber(ARGV[6]), key)
else
  redis.call('ZREM', KEYS[5], key)
end
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[6], key, ARGV[7])
else
  redis.call('HDEL', KEYS[6], key)
end
return {{1, v}}
"
    ))
});

/// ARGV: publish command, key. Returns `{value, revision}`, or nil when
/// the key is absent or past its deadline (removed as a delete).
static READ: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{PRELUDE}
expire(now_ms())
local current = revision(ARGV[2])
if not current then return nil end
return {{redis.call('HGET', KEYS[1], ARGV[2]), current}}
"
    ))
});

/// ARGV: publish command. Expires what is due; returns how many
/// milliseconds until the next deadline, -1 when none.
static SWEEP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{PRELUDE}
local now = now_ms()
expire(now)
local next = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
if next[2] == nil then return -1 end
local left = tonumber(next[2]) - now
if left < 0 then return 0 end
return math.floor(left)
"
    ))
});

/// ARGV: publish command. Expires what is due, then returns
/// `{version, {field, value, ...}}` read at one instant.
static SNAPSHOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{PRELUDE}
expire(now_ms())
return {{redis.call('GET', KEYS[2]) or '0', redis.call('HGETALL', KEYS[1])}}
"
    ))
});

/// A write as the script takes it.
pub(crate) struct Write<'a> {
    pub(crate) key: &'a str,
    /// `None`: delete.
    pub(crate) value: Option<&'a [u8]>,
    /// The expected revision (0: absent); `None`: unconditional.
    pub(crate) expected: Option<u64>,
    pub(crate) ttl_ms: Option<u64>,
    /// Identifies one conditional write across its retries.
    pub(crate) token: Option<u64>,
}

/// What the write script answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Written {
    /// Applied at this revision (0: a delete that changed nothing).
    Applied(u64),
    /// The condition failed; the key's revision (`None`: absent).
    Refused(Option<u64>),
}

/// Runs one write of `bucket`.
pub(crate) async fn write(
    conn: &mut Conn,
    cluster: bool,
    bucket: &str,
    w: &Write<'_>,
) -> RedisResult<Written> {
    let mut call = WRITE.prepare_invoke();
    kv_keys(&mut call, bucket);
    let text = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or_default();
    call.arg(publish_command(cluster))
        .arg(if w.value.is_some() { "s" } else { "d" })
        .arg(w.key)
        .arg(w.value.unwrap_or_default())
        .arg(text(w.expected))
        .arg(text(w.ttl_ms))
        .arg(text(w.token));
    let (applied, revision): (u8, u64) = conn.invoke(&call).await?;
    Ok(match (applied, revision) {
        (1, revision) => Written::Applied(revision),
        (_, 0) => Written::Refused(None),
        (_, current) => Written::Refused(Some(current)),
    })
}

/// Whether a script may have run although `e` came back: everything but
/// an error reply from the server (which refuses a script before running
/// it) and a refused connection (nothing was sent).
pub(crate) fn may_have_run(e: &redis::RedisError) -> bool {
    !matches!(e.kind(), redis::ErrorKind::Server(_)) && !e.is_connection_refusal()
}

/// The value of `key` with its revision; `None` when absent or expired.
pub(crate) async fn read(
    conn: &mut Conn,
    cluster: bool,
    bucket: &str,
    key: &str,
) -> RedisResult<Option<(Vec<u8>, u64)>> {
    let mut call = READ.prepare_invoke();
    kv_keys(&mut call, bucket);
    call.arg(publish_command(cluster)).arg(key);
    conn.invoke_read(&call).await
}

/// Expires what is due in `bucket`; the time until its next deadline.
async fn sweep(conn: &mut Conn, cluster: bool, bucket: &str) -> RedisResult<Option<Duration>> {
    let mut call = SWEEP.prepare_invoke();
    kv_keys(&mut call, bucket);
    call.arg(publish_command(cluster));
    // The expiries are the server's, not a write of the caller's to confirm.
    let left: i64 = conn.invoke_read(&call).await?;
    Ok(u64::try_from(left).ok().map(Duration::from_millis))
}

/// One change as announced on a bucket's channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) version: u64,
    pub(crate) key: String,
    /// `None`: deleted.
    pub(crate) value: Option<Vec<u8>>,
}

/// Decodes what [`WRITE`] publishes; `None` for anything else.
pub(crate) fn decode(raw: &[u8]) -> Option<Change> {
    let (version, rest) = split_word(raw)?;
    let (op, rest) = split_word(rest)?;
    let (len, rest) = split_word(rest)?;
    let version: u64 = std::str::from_utf8(version).ok()?.parse().ok()?;
    let len: usize = std::str::from_utf8(len).ok()?.parse().ok()?;
    let key = rest.get(..len)?;
    let value = rest.get(len..)?;
    let key = String::from_utf8(key.to_vec()).ok()?;
    match op {
        b"s" => Some(Change {
            version,
            key,
            value: Some(value.to_vec()),
        }),
        b"d" if value.is_empty() => Some(Change {
            version,
            key,
            value: None,
        }),
        _ => None,
    }
}

fn split_word(raw: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = raw.iter().position(|&b| b == b' ')?;
    Some((&raw[..at], &raw[at + 1..]))
}

/// A bucket's content and version, read together.
async fn snapshot(
    conn: &mut Conn,
    cluster: bool,
    bucket: &str,
) -> RedisResult<(u64, BTreeMap<String, Vec<u8>>)> {
    let mut call = SNAPSHOT.prepare_invoke();
    kv_keys(&mut call, bucket);
    call.arg(publish_command(cluster));
    let value: Value = conn.invoke(&call).await?;
    parse_snapshot(value).ok_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "the snapshot script answered in an unknown shape",
        ))
    })
}

fn parse_snapshot(value: Value) -> Option<(u64, BTreeMap<String, Vec<u8>>)> {
    let Value::Array(parts) = value else {
        return None;
    };
    let [version, fields] = parts.as_slice() else {
        return None;
    };
    let version: u64 = String::from_utf8(super::conn::bytes(version)?)
        .ok()?
        .parse()
        .ok()?;
    let fields = match fields {
        Value::Array(items) => items
            .chunks(2)
            .map(|pair| match pair {
                [k, v] => Some((
                    String::from_utf8(super::conn::bytes(k)?).ok()?,
                    super::conn::bytes(v)?,
                )),
                _ => None,
            })
            .collect::<Option<BTreeMap<_, _>>>()?,
        Value::Map(items) => items
            .iter()
            .map(|(k, v)| {
                Some((
                    String::from_utf8(super::conn::bytes(k)?).ok()?,
                    super::conn::bytes(v)?,
                ))
            })
            .collect::<Option<BTreeMap<_, _>>>()?,
        _ => return None,
    };
    Some((version, fields))
}

/// What a watch's inner loop ended with.
enum Next {
    /// Take a new snapshot on the same connection.
    Resync,
    /// The connection is gone: open a new one.
    Reconnect,
    /// The feed is over.
    Stop,
}

/// One watch: the bucket, the pattern, and what the consumer was told.
struct Watch {
    bucket: String,
    pattern: String,
    channel: Vec<u8>,
    mirror: KvMirror,
}

/// Runs a KV watch until its feed ends.
pub(crate) async fn watch_task(mut ctx: FeedCtx<KvEvent>, bucket: String, pattern: String) {
    let mut w = Watch {
        channel: names::kv_channel(&bucket).into_bytes(),
        bucket,
        pattern,
        // Versions come from one INCR per change: a skipped one is a
        // notification missed.
        mirror: KvMirror::new(Order::Contiguous, ctx.tx.capacity()),
    };
    let mut backoff = retry_backoff();
    'connect: loop {
        if ctx.is_halted() {
            return;
        }
        let (mut conn, mut pushes) = match subscribed(&ctx.target, &w.channel).await {
            Ok(c) => c,
            Err(e) => {
                let error = ctx
                    .target
                    .error(format!("watch of bucket {:?}", w.bucket), &e);
                if ctx.starting() {
                    ctx.started(Err(error));
                    return;
                }
                log::warn!("{error}; retrying");
                if !ctx.pause(&mut backoff).await {
                    return;
                }
                continue;
            }
        };
        loop {
            let (version, content) = match snapshot(&mut conn, ctx.target.cluster, &w.bucket).await
            {
                Ok(s) => s,
                Err(e) => {
                    let error = ctx
                        .target
                        .error(format!("snapshot of bucket {:?}", w.bucket), &e);
                    if ctx.starting() {
                        ctx.started(Err(error));
                        return;
                    }
                    log::warn!("{error}; reconnecting");
                    if !ctx.pause(&mut backoff).await {
                        return;
                    }
                    continue 'connect;
                }
            };
            backoff.reset();
            // Live from here: every later change has a higher version and
            // reaches the subscription.
            ctx.started(Ok(()));
            let matching = content
                .into_iter()
                .filter(|(key, _)| pattern::matches(&w.pattern, key));
            w.mirror.snapshot(version, matching);
            match w.follow(&mut ctx, &mut conn, &mut pushes).await {
                Next::Resync => continue,
                Next::Reconnect => {
                    // Whatever was published while disconnected is lost.
                    w.mirror.missed();
                    if !ctx.pause(&mut backoff).await {
                        return;
                    }
                    continue 'connect;
                }
                Next::Stop => return,
            }
        }
    }
}

/// A new push connection subscribed to `channel`.
async fn subscribed(
    target: &Target,
    channel: &[u8],
) -> RedisResult<(Conn, UnboundedReceiver<PushInfo>)> {
    let (mut conn, pushes) = target.push_conn().await?;
    let channel = String::from_utf8_lossy(channel).into_owned();
    conn.subscribe(&channel).await?;
    Ok((conn, pushes))
}

impl Watch {
    /// Hands the mirror's notices to the consumer and feeds it the
    /// bucket's notifications, until the mirror wants a snapshot (a gap, or
    /// a consumer that fell too far behind, once it has room again) or the
    /// connection is gone. Notifications keep being read while the
    /// consumer is full, so the subscription never backs up.
    ///
    /// Meanwhile it expires the bucket's keys as their deadlines pass
    /// ([`SWEEP`]), so that watchers hear an expiry within the contract's
    /// second even when nobody writes or reads the bucket: Redis 7.0 has
    /// no expiry for one field of a hash, so the deadlines are fleetcoord's
    /// own and every watch keeps them.
    async fn follow(
        &mut self,
        ctx: &mut FeedCtx<KvEvent>,
        conn: &mut Conn,
        pushes: &mut UnboundedReceiver<PushInfo>,
    ) -> Next {
        let cluster = ctx.target.cluster;
        let mut next_sweep = tokio::time::Instant::now();
        loop {
            let full = match offer_queued(&mut self.mirror, |event| ctx.tx.offer(event)) {
                Offer::Gone => return Next::Stop,
                Offer::Full(()) => true,
                Offer::Taken => {
                    if self.mirror.wants_snapshot() {
                        return Next::Resync;
                    }
                    false
                }
            };
            tokio::select! {
                push = pushes.recv() => {
                    if let Some(next) = self.apply(push) {
                        return next;
                    }
                }
                relieved = ctx.relieved(), if full => {
                    if !relieved {
                        return Next::Stop;
                    }
                }
                _ = ctx.halted() => return Next::Stop,
                () = tokio::time::sleep_until(next_sweep) => {
                    let left = match sweep(conn, cluster, &self.bucket).await {
                        Ok(Some(left)) => left.min(SWEEP_IDLE),
                        Ok(None) => SWEEP_IDLE,
                        Err(e) => {
                            // The next sweep, or any read or write of the
                            // bucket, expires what this one did not.
                            log::debug!("expiring keys of bucket {:?}: {e}", self.bucket);
                            SWEEP_IDLE
                        }
                    };
                    next_sweep = tokio::time::Instant::now() + left;
                }
            }
        }
    }

    /// Feeds one push to the mirror; `Reconnect` when the connection is
    /// gone.
    fn apply(&mut self, push: Option<PushInfo>) -> Option<Next> {
        let Some(push) = push else {
            return Some(Next::Reconnect);
        };
        if push.kind == PushKind::Disconnection {
            log::warn!(
                "watch of bucket {:?}: connection lost; reconnecting and resyncing",
                self.bucket
            );
            return Some(Next::Reconnect);
        }
        let (channel, raw) = message(&push)?;
        if channel != self.channel {
            return None;
        }
        let Some(change) = decode(&raw) else {
            log::warn!(
                "watch of bucket {:?}: ignoring a notification not written by fleetcoord",
                self.bucket
            );
            return None;
        };
        // A gap is the mirror's to notice: `follow` resyncs once it wants.
        let _ = if pattern::matches(&self.pattern, &change.key) {
            self.mirror.change(change.version, change.key, change.value)
        } else {
            self.mirror.passed(change.version)
        };
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_round_trip_through_the_script_format() {
        // What the script builds: v .. ' ' .. op .. ' ' .. len .. ' ' .. key .. value
        let raw = b"42 s 7 a b:{c}x y\x00\xff".to_vec();
        assert_eq!(
            decode(&raw),
            Some(Change {
                version: 42,
                key: "a b:{c}".into(),
                value: Some(b"x y\x00\xff".to_vec())
            })
        );
        assert_eq!(
            decode(b"7 d 3 k 1"),
            Some(Change {
                version: 7,
                key: "k 1".into(),
                value: None
            })
        );
        assert_eq!(
            decode(b"8 s 1 k"),
            Some(Change {
                version: 8,
                key: "k".into(),
                value: Some(Vec::new())
            })
        );
    }

    #[test]
    fn foreign_notifications_are_refused() {
        for bad in [
            &b""[..],
            b"x s 1 k",
            b"1 q 1 k",
            b"1 s 9 k",
            b"1 d 1 kv",
            b"-1 s 1 k",
            b"1 s 18446744073709551616 k",
        ] {
            assert_eq!(decode(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn snapshot_shapes() {
        let v = Value::Array(vec![
            Value::BulkString(b"3".to_vec()),
            Value::Array(vec![
                Value::BulkString(b"a".to_vec()),
                Value::BulkString(b"1".to_vec()),
            ]),
        ]);
        let (version, map) = parse_snapshot(v).unwrap();
        assert_eq!(version, 3);
        assert_eq!(map.get("a").map(Vec::as_slice), Some(&b"1"[..]));
        assert!(parse_snapshot(Value::Nil).is_none());
    }

    fn bulk(b: &[u8]) -> Value {
        Value::BulkString(b.to_vec())
    }

    #[test]
    fn a_resp3_snapshot_reads_like_a_resp2_one() {
        let v = Value::Array(vec![
            Value::SimpleString("12".into()),
            Value::Map(vec![(bulk(b"a"), bulk(b"1")), (bulk(b"b"), bulk(b""))]),
        ]);
        let (version, map) = parse_snapshot(v).unwrap();
        assert_eq!(version, 12);
        assert_eq!(
            map.into_iter().collect::<Vec<_>>(),
            vec![("a".into(), b"1".to_vec()), ("b".into(), Vec::new())]
        );
    }

    #[test]
    fn a_snapshot_of_any_other_shape_is_refused_whole() {
        let fields = || Value::Array(vec![bulk(b"a"), bulk(b"1")]);
        for bad in [
            // Not two parts.
            Value::Array(vec![bulk(b"3")]),
            Value::Array(vec![bulk(b"3"), fields(), fields()]),
            // A version that is not a count.
            Value::Array(vec![bulk(b"-1"), fields()]),
            Value::Array(vec![bulk(b"\xff"), fields()]),
            Value::Array(vec![Value::Int(3), fields()]),
            // Fields that are not pairs of strings.
            Value::Array(vec![bulk(b"3"), Value::Array(vec![bulk(b"a")])]),
            Value::Array(vec![
                bulk(b"3"),
                Value::Array(vec![bulk(b"\xff"), bulk(b"1")]),
            ]),
            Value::Array(vec![bulk(b"3"), Value::Array(vec![bulk(b"a"), Value::Nil])]),
            Value::Array(vec![bulk(b"3"), Value::Map(vec![(Value::Nil, bulk(b"1"))])]),
            Value::Array(vec![
                bulk(b"3"),
                Value::Map(vec![(bulk(b"\xff"), bulk(b"1"))]),
            ]),
            Value::Array(vec![bulk(b"3"), Value::Map(vec![(bulk(b"a"), Value::Nil)])]),
            Value::Array(vec![bulk(b"3"), bulk(b"a")]),
        ] {
            assert_eq!(parse_snapshot(bad.clone()), None, "{bad:?}");
        }
    }
}
