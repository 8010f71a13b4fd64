//! Streams on Redis Streams: appends, and the reader that delivers every
//! entry exactly once, in order, across reconnects.
//!
//! **IDs.** Appends use `XADD <key> 0-* …`: Redis 7 assigns the next
//! sequence number within milliseconds-part 0, so entries get `0-1`, `0-2`,
//! … gap-free and increasing, also after `MAXLEN` trims, and the Redis id
//! `0-N` is carried exactly by `StreamId(N)`. An entry whose id is not
//! `0-N` (someone appended by hand with `*`) cannot be given a `StreamId`
//! without mangling it: a reader that meets one logs an error and ends its
//! feed, and appends fail from then on (Redis refuses `0-*` below the
//! stream's top id) with an error that says so.
//!
//! **Epochs.** Each entry carries the stream's epoch (field `e`, a token no
//! other append ever draws, kept at `coord:streame:{name}`: the token of
//! the first append of a stream's life) next to its payload (field `p`). A server restart without
//! persistence wipes the stream, and its IDs start again at 1; a reader
//! notices the new epoch (in a new entry, or when it probes an idle or
//! reconnected stream) and reads the new stream from its first entry, with
//! a warning, instead of waiting for an ID it already saw.

use super::conn::{bytes, Conn};
use super::failover::{retried, Repeat, Through};
use super::names;
use super::target::Target;
use super::task::FeedCtx;
use crate::coordinator::feed_task::retry_backoff;
use crate::coordinator::write_ids::WriteIds;
use crate::coordinator::{read_from, StreamEntry, StreamId, StreamPosition};
use crate::error::ErrorKind;
use crate::feed_queue::Offer;
use fleetcoord_sm::stream::{Offered, Place};
use redis::{RedisResult, Script, Value};
use std::sync::LazyLock;
use std::time::Duration;

/// KEYS: stream, epoch, tokens, token order. ARGV: the epoch if this
/// append creates the stream (its own token),
/// payload, max length (or empty), this append's token, how many tokens to
/// keep, how long to keep them (ms). Returns the entry's id: the one an
/// earlier attempt with the same token stored, if there was one, so
/// running it again never appends twice.
static APPEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local done = redis.call('HGET', KEYS[3], ARGV[4])
if done then
  return done
end
local e = redis.call('GET', KEYS[2])
if not e then
  e = ARGV[1]
  redis.call('SET', KEYS[2], e)
end
local id
if ARGV[3] ~= '' then
  id = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[3], '0-*', 'e', e, 'p', ARGV[2])
else
  id = redis.call('XADD', KEYS[1], '0-*', 'e', e, 'p', ARGV[2])
end
redis.call('HSET', KEYS[3], ARGV[4], id)
if redis.call('RPUSH', KEYS[4], ARGV[4]) > tonumber(ARGV[5]) then
  redis.call('HDEL', KEYS[3], redis.call('LPOP', KEYS[4]))
end
redis.call('PEXPIRE', KEYS[3], ARGV[6])
redis.call('PEXPIRE', KEYS[4], ARGV[6])
return id
",
    )
});

/// Append tokens kept per stream: a retry finds its first attempt's entry
/// unless this many other appends to the stream came in between.
const TOKENS_KEPT: usize = 4096;

/// How long a stream's tokens outlive its last append, at least: far longer
/// than any one append's retries ([`append`] stops at the request timeout;
/// the tokens live at least twice that).
const TOKEN_TTL: Duration = Duration::from_secs(600);

/// How long one `XREAD` blocks. Short enough that an idle reader probes
/// for a recreated stream about once a second.
const BLOCK: Duration = Duration::from_secs(1);

/// Entries per `XREAD`: bounds what a reader holds beyond its feed.
const BATCH: usize = 256;

/// Appends `payload` to `stream`, trimming to `max_len`, and returns its ID.
///
/// Every attempt carries one token (a fresh id of `ids`), which the script
/// records with the id it assigned, so an attempt whose answer was lost (a server restart, a
/// dropped connection, a master failing over) can be repeated:
/// the repeat returns the first attempt's id instead of appending again.
/// Attempts go on while failures are transient, until the request timeout;
/// then, if any attempt may have run, the outcome is unknown:
/// [`Error::Indeterminate`](crate::Error::Indeterminate).
pub(crate) async fn append(
    conn: &mut Conn,
    target: &Target,
    stream: &str,
    payload: &[u8],
    max_len: Option<u64>,
    ids: &WriteIds,
) -> crate::Result<StreamId> {
    append_as(conn, target, stream, payload, max_len, &ids.next()).await
}

/// [`append`] under a given token: a second call with the same token
/// stores nothing and returns the first call's ID. The token is also the
/// epoch a stream gets if this append creates it: unique, as an epoch
/// must be, and no second id to draw.
async fn append_as(
    conn: &mut Conn,
    target: &Target,
    stream: &str,
    payload: &[u8],
    max_len: Option<u64>,
    token: &str,
) -> crate::Result<StreamId> {
    let ttl = TOKEN_TTL.max(target.request_timeout.saturating_mul(2));
    let mut call = APPEND.prepare_invoke();
    call.key(names::stream_key(stream))
        .key(names::stream_epoch(stream))
        .key(names::stream_tokens(stream))
        .key(names::stream_token_order(stream))
        .arg(token)
        .arg(payload)
        .arg(max_len.map(|n| n.to_string()).unwrap_or_default())
        .arg(token)
        .arg(TOKENS_KEPT)
        .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
    let context = format!("append to stream {stream:?}");
    let key = names::stream_key(stream);
    let attempt = || {
        let (mut conn, call) = (conn.clone(), &call);
        async move { conn.invoke::<String>(call).await }
    };
    // Whether the failure that ended it may have come after the script ran.
    let mut ran = false;
    let describe = |e: &redis::RedisError| {
        ran = may_have_run(e);
        append_error(target, stream, e)
    };
    // A failover or a restart is waited out; the token makes every
    // repeat, also of an attempt whose connection broke, safe.
    let (e, in_doubt) = match retried(
        target,
        &context,
        Some(&key),
        Repeat::Safe,
        Through::Restart,
        attempt,
        describe,
    )
    .await
    {
        Ok(id) => {
            return match sequence(&id) {
                Some(seq) => Ok(StreamId(seq)),
                None => Err(target.failure(
                    ErrorKind::Unexpected,
                    format!("append to stream {stream:?}: Redis assigned id {id:?}, not 0-N"),
                )),
            }
        }
        Err(failed) => failed,
    };
    // Applied, with its id, only less replicated than asked: say so.
    let unreplicated = matches!(
        e,
        crate::Error::Backend {
            kind: ErrorKind::Unreplicated,
            ..
        }
    );
    if unreplicated || !(in_doubt || ran) {
        return Err(e);
    }
    Err(indeterminate(stream, e.to_string()))
}

fn indeterminate(stream: &str, message: String) -> crate::Error {
    crate::Error::Indeterminate {
        backend: "redis",
        stream: stream.to_string(),
        // Redis assigns the id when the script runs.
        id: None,
        message,
    }
}

/// Whether the script may have run although `e` came back: everything but
/// an error reply from the server (which refuses a script before running
/// it, or aborts it at the XADD, before the entry is written) and a refused
/// connection (nothing was sent).
fn may_have_run(e: &redis::RedisError) -> bool {
    !matches!(e.kind(), redis::ErrorKind::Server(_)) && !e.is_connection_refusal()
}

/// `N` of an id `0-N`.
pub(crate) fn sequence(id: &str) -> Option<u64> {
    let seq = id.strip_prefix("0-")?;
    if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    seq.parse().ok()
}

/// One entry as Redis holds it.
#[derive(Debug, PartialEq, Eq)]
struct Raw {
    id: String,
    epoch: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
}

fn parse_entry(value: &Value) -> Option<Raw> {
    let Value::Array(parts) = value else {
        return None;
    };
    let [id, fields] = parts.as_slice() else {
        return None;
    };
    let id = String::from_utf8(bytes(id)?).ok()?;
    let mut raw = Raw {
        id,
        epoch: None,
        payload: None,
    };
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = match fields {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|p| match p {
                [f, v] => Some((bytes(f)?, bytes(v)?)),
                _ => None,
            })
            .collect(),
        Value::Map(items) => items
            .iter()
            .filter_map(|(f, v)| Some((bytes(f)?, bytes(v)?)))
            .collect(),
        _ => return None,
    };
    for (field, value) in pairs {
        match field.as_slice() {
            b"e" => raw.epoch = Some(value),
            b"p" => raw.payload = Some(value),
            _ => {}
        }
    }
    Some(raw)
}

/// The entries of an `XREAD` reply for one stream (RESP2 array or RESP3
/// map); empty for a timeout.
fn parse_read(value: Value) -> Option<Vec<Raw>> {
    let streams: Vec<(Value, Value)> = match value {
        Value::Nil => return Some(Vec::new()),
        Value::Map(m) => m,
        Value::Array(items) => items
            .into_iter()
            .filter_map(|s| match s {
                Value::Array(mut kv) if kv.len() == 2 => {
                    let entries = kv.pop()?;
                    let key = kv.pop()?;
                    Some((key, entries))
                }
                _ => None,
            })
            .collect(),
        _ => return None,
    };
    let mut out = Vec::new();
    for (_, entries) in streams {
        let Value::Array(entries) = entries else {
            return None;
        };
        for e in &entries {
            out.push(parse_entry(e)?);
        }
    }
    Some(out)
}

/// The newest entry of the stream, if any.
async fn top(conn: &mut Conn, key: &str) -> RedisResult<Option<Raw>> {
    let value: Value = conn
        .query(
            redis::cmd("XREVRANGE")
                .arg(key)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1),
        )
        .await?;
    Ok(match value {
        Value::Array(items) => items.first().and_then(parse_entry),
        _ => None,
    })
}

/// Logs that `stream` was found recreated under its reader (the reader's
/// [`Place`] has started over).
fn recreated(stream: &str) {
    log::warn!(
        "stream {stream:?} was recreated (a server restart without persistence?): \
         reading it again from its first entry; its ids start again at 1"
    );
}

/// What the place makes of the stream's newest entry.
fn check_head(place: &mut Place, stream: &str, newest: Option<&Raw>) {
    let head = newest.map(|t| (sequence(&t.id), t.epoch.as_deref()));
    if place.check_head(head) {
        recreated(stream);
    }
}

/// Runs a stream reader until its feed ends.
pub(crate) async fn read_task(mut ctx: FeedCtx<StreamEntry>, stream: String, from: StreamPosition) {
    let key = names::stream_key(&stream);
    let mut pos: Option<Place> = None;
    let mut backoff = retry_backoff();
    loop {
        if ctx.is_halted() {
            return;
        }
        let connected = async {
            let mut conn = ctx.target.blocking_conn(BLOCK).await?;
            let newest = top(&mut conn, &key).await?;
            Ok::<_, redis::RedisError>((conn, newest))
        }
        .await;
        let (mut conn, newest) = match connected {
            Ok(c) => c,
            Err(e) => {
                let error = ctx.target.error(format!("reader of stream {stream:?}"), &e);
                if ctx.starting() {
                    ctx.started(Err(error));
                    return;
                }
                log::warn!("{error}; reconnecting");
                if !ctx.pause(&mut backoff).await {
                    return;
                }
                continue;
            }
        };
        // Taken and put back, so that the place is there by construction
        // for `follow`.
        let here = match pos.take() {
            Some(mut p) => {
                check_head(&mut p, &stream, newest.as_ref());
                p
            }
            None => {
                let head = newest.map(|t| (sequence(&t.id).unwrap_or(0), t.epoch));
                ctx.started(Ok(()));
                Place::open(read_from(from), head)
            }
        };
        let p = pos.insert(here);
        match follow(&mut ctx, &mut conn, &stream, &key, p).await {
            Next::Reconnect => {
                if !ctx.pause(&mut backoff).await {
                    return;
                }
            }
            Next::Stop => return,
        }
        backoff.reset();
    }
}

enum Next {
    Reconnect,
    Stop,
}

/// Reads and delivers until the connection fails or the feed ends.
async fn follow(
    ctx: &mut FeedCtx<StreamEntry>,
    conn: &mut Conn,
    stream: &str,
    key: &str,
    pos: &mut Place,
) -> Next {
    loop {
        let mut read = redis::cmd("XREAD");
        read.arg("COUNT")
            .arg(BATCH)
            .arg("BLOCK")
            .arg(BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(key)
            .arg(format!("0-{}", pos.last()));
        let reply = tokio::select! {
            r = conn.query::<Value>(&read) => r,
            _ = ctx.halted() => return Next::Stop,
        };
        let entries = match reply.map(parse_read) {
            Ok(Some(entries)) => entries,
            Ok(None) => {
                log::error!("stream {stream:?}: XREAD answered in an unknown shape; reconnecting");
                return Next::Reconnect;
            }
            Err(e) => {
                log::warn!(
                    "{}; reconnecting",
                    ctx.target.error(format!("reader of stream {stream:?}"), &e)
                );
                return Next::Reconnect;
            }
        };
        if entries.is_empty() {
            // Idle: make sure we are not waiting on a stream that was
            // recreated below our position.
            match top(conn, key).await {
                Ok(newest) => check_head(pos, stream, newest.as_ref()),
                Err(_) => return Next::Reconnect,
            }
            continue;
        }
        for raw in entries {
            let (Some(seq), Some(payload)) = (sequence(&raw.id), raw.payload) else {
                log::error!(
                    "stream {stream:?}: entry {:?} was not appended by fleetcoord (its id is \
                     not of the form 0-N, or it has no payload field); ending the reader \
                     rather than mangling its id",
                    raw.id
                );
                return Next::Stop;
            };
            match pos.offer(seq, raw.epoch.as_deref()) {
                Offered::Deliver => {}
                Offered::Repeat => continue,
                Offered::Recreated => {
                    recreated(stream);
                    break;
                }
            }
            let entry = StreamEntry {
                id: StreamId(seq),
                payload,
            };
            if !deliver(ctx, entry).await {
                return Next::Stop;
            }
        }
    }
}

/// Hands `entry` to the consumer, waiting (without reading further) while
/// its queue is full; `false` when the feed ended.
async fn deliver(ctx: &mut FeedCtx<StreamEntry>, entry: StreamEntry) -> bool {
    match ctx.tx.offer(entry) {
        Offer::Taken => true,
        Offer::Gone => false,
        Offer::Full(held) => ctx.relieved().await && ctx.tx.offer(held).is_taken(),
    }
}

/// The target's error for a failed append.
pub(crate) fn append_error(target: &Target, stream: &str, e: &redis::RedisError) -> crate::Error {
    let context = if e.to_string().contains("equal or smaller") {
        format!(
            "append to stream {stream:?} (it holds an entry not appended by fleetcoord, \
             with an id above 0-N)"
        )
    } else {
        format!("append to stream {stream:?}")
    };
    target.error(context, e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetcoord_sm::stream::ReadFrom;

    /// The script against a real server: a repeated token is answered with
    /// the first attempt's id and stores nothing; only the newest tokens
    /// are kept, all under the stream's hash tag.
    #[cfg(feature = "testing")]
    #[test]
    fn a_repeated_token_returns_the_first_id_and_appends_nothing() {
        let server = crate::testing::RedisServer::start().expect("start redis-server");
        let target =
            Target::parse(&server.url(), &super::super::RedisOptions::default()).expect("target");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut conn = target.command_conn().await.expect("connect");
            let first = append_as(&mut conn, &target, "s", b"a", None, "t1").await;
            let again = append_as(&mut conn, &target, "s", b"a", None, "t1").await;
            let other = append_as(&mut conn, &target, "s", b"b", None, "t2").await;
            assert_eq!(
                (first.ok(), again.ok(), other.ok()),
                (Some(StreamId(1)), Some(StreamId(1)), Some(StreamId(2)))
            );
            let len: u64 = conn
                .query(redis::cmd("XLEN").arg(names::stream_key("s")))
                .await
                .expect("XLEN");
            assert_eq!(len, 2, "the repeat stored nothing");
            for i in 0..TOKENS_KEPT {
                let token = format!("n{i}");
                append_as(&mut conn, &target, "s", b"x", Some(8), &token)
                    .await
                    .expect("append");
            }
            let kept: u64 = conn
                .query(redis::cmd("HLEN").arg(names::stream_tokens("s")))
                .await
                .expect("HLEN");
            assert_eq!(kept, TOKENS_KEPT as u64, "the oldest tokens are forgotten");
            let ttl: i64 = conn
                .query(redis::cmd("PTTL").arg(names::stream_token_order("s")))
                .await
                .expect("PTTL");
            assert!(ttl > 0 && ttl <= TOKEN_TTL.as_millis() as i64, "{ttl}");
            // t1 was forgotten: the same token now appends again.
            let late = append_as(&mut conn, &target, "s", b"a", Some(8), "t1").await;
            assert_eq!(late.ok(), Some(StreamId(TOKENS_KEPT as u64 + 3)));
        });
    }

    #[test]
    fn only_0_n_ids_are_sequences() {
        assert_eq!(sequence("0-1"), Some(1));
        assert_eq!(sequence("0-18446744073709551615"), Some(u64::MAX));
        for bad in [
            "1-0",
            "1700000000000-0",
            "0-",
            "0--1",
            "0-+1",
            "0-18446744073709551616",
            "",
            "5",
        ] {
            assert_eq!(sequence(bad), None, "{bad:?}");
        }
    }

    fn entry(id: &str, epoch: &[u8], payload: &[u8]) -> Value {
        Value::Array(vec![
            Value::BulkString(id.as_bytes().to_vec()),
            Value::Array(vec![
                Value::BulkString(b"e".to_vec()),
                Value::BulkString(epoch.to_vec()),
                Value::BulkString(b"p".to_vec()),
                Value::BulkString(payload.to_vec()),
            ]),
        ])
    }

    #[test]
    fn xread_replies_in_both_protocols() {
        let entries = Value::Array(vec![entry("0-1", b"E", b"a"), entry("0-2", b"E", b"b")]);
        let key = Value::BulkString(b"coord:stream:{s}".to_vec());
        let resp3 = Value::Map(vec![(key.clone(), entries.clone())]);
        let resp2 = Value::Array(vec![Value::Array(vec![key, entries])]);
        for reply in [resp3, resp2] {
            let raws = parse_read(reply).unwrap();
            assert_eq!(raws.len(), 2);
            assert_eq!(raws[1].id, "0-2");
            assert_eq!(raws[1].payload.as_deref(), Some(&b"b"[..]));
            assert_eq!(raws[1].epoch.as_deref(), Some(&b"E"[..]));
        }
        assert_eq!(parse_read(Value::Nil).unwrap(), Vec::new());
    }

    #[test]
    fn a_recreated_stream_restarts_the_reader() {
        // Heads as the reader reads them, judged by the place (its rules
        // are sm's, tested there; this checks the reading of entries).
        let raw = |id: &str, e: &[u8]| parse_entry(&entry(id, e, b"x")).unwrap();
        let at_five = || {
            let mut p = Place::open(ReadFrom::Start, None);
            for seq in 1..=5 {
                assert_eq!(p.offer(seq, Some(b"A")), Offered::Deliver);
            }
            p
        };
        for (head, recreated) in [
            (Some(raw("0-7", b"A")), false),
            (Some(raw("0-5", b"A")), false),
            (Some(raw("0-9", b"B")), true),
            (Some(raw("0-2", b"A")), true),
            (None, true),
        ] {
            let mut p = at_five();
            check_head(&mut p, "s", head.as_ref());
            assert_eq!(p.last() == 0, recreated, "{head:?}");
        }
        let mut fresh = Place::open(ReadFrom::Start, None);
        check_head(&mut fresh, "s", None);
        check_head(&mut fresh, "s", Some(&raw("0-3", b"B")));
        assert_eq!(fresh.offer(1, Some(b"B")), Offered::Deliver);
    }

    fn bulk(b: &[u8]) -> Value {
        Value::BulkString(b.to_vec())
    }

    #[test]
    fn resp3_entry_fields_are_a_map_and_unknown_fields_are_ignored() {
        let v = Value::Array(vec![
            bulk(b"0-4"),
            Value::Map(vec![
                (bulk(b"p"), bulk(b"x")),
                (bulk(b"other"), bulk(b"y")),
                (bulk(b"e"), Value::Nil),
            ]),
        ]);
        assert_eq!(
            parse_entry(&v),
            Some(Raw {
                id: "0-4".into(),
                epoch: None,
                payload: Some(b"x".to_vec()),
            })
        );
        // An entry without a payload parses; the reader refuses it later.
        let v = Value::Array(vec![bulk(b"0-5"), Value::Array(vec![bulk(b"e")])]);
        assert_eq!(parse_entry(&v).map(|r| r.payload), Some(None));
    }

    #[test]
    fn replies_of_an_unknown_shape_are_refused_whole() {
        for bad in [
            Value::Int(1),
            Value::Array(vec![bulk(b"0-1")]),
            Value::Array(vec![Value::Nil, Value::Array(vec![])]),
            Value::Array(vec![bulk(b"\xff"), Value::Array(vec![])]),
            Value::Array(vec![bulk(b"0-1"), bulk(b"p")]),
        ] {
            assert_eq!(parse_entry(&bad), None, "{bad:?}");
        }
        let key = || bulk(b"coord:stream:{s}");
        for bad in [
            Value::Int(1),
            // The entries of a stream are not a list.
            Value::Map(vec![(key(), bulk(b"x"))]),
            // One entry of the list is not an entry.
            Value::Map(vec![(key(), Value::Array(vec![Value::Int(1)]))]),
        ] {
            assert_eq!(parse_read(bad.clone()), None, "{bad:?}");
        }
        // RESP2 items that are not [key, entries] pairs name no stream.
        let stray = Value::Array(vec![Value::Int(1), Value::Array(vec![key()])]);
        assert_eq!(parse_read(stray), Some(Vec::new()));
    }
}
