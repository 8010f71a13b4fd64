//! Reading a JetStream stream in order, exactly once, whatever happens to
//! the connection: an ordered push consumer, recreated from the next wanted
//! sequence on any error, and every sequence below it skipped.
//!
//! docs/backend-notes.md, "Restart", measured the ordered push consumer, and an
//! ordered pull consumer recreated on every error, as the readers that kept
//! 301 of 301 entries across kill -9 restarts. The push consumer is the one
//! used: it notices a reconnect at once and a consumer that vanished with
//! its node within its 5 s idle heartbeat, where the pull consumer's 15 s
//! heartbeat, missed twice, left a reader of a stream whose leader was
//! killed stalled for more than 20 s (`tests/nats_faults.rs`).

use super::conn::{Conn, ATTEMPT_TIMEOUT};
use crate::coordinator::feed_task::{retry_backoff, FeedTask};
use async_nats::jetstream::consumer::{push, DeliverPolicy};
use futures_util::StreamExt;
use std::time::Duration;
use tokio::time::Instant;

/// The messages of one ordered consumer.
pub(super) type Ordered = push::Ordered;

/// How long a reader waits for a message before it checks that it is not
/// stuck behind the stream: a consumer can go quiet for good (its node
/// died and the client library's own recreation did not get through), and
/// readers of a killed stream leader were seen waiting for over 20 s.
pub(super) const IDLE_CHECK: Duration = Duration::from_secs(3);
/// Failed recreations in a row before a warning is logged.
const WARN_AFTER: u32 = 10;

/// Where a consumer starts.
#[derive(Clone, Copy, Debug)]
pub(super) enum Begin {
    /// The newest message of each subject (a KV snapshot).
    LastPerSubject,
    /// This stream sequence (or the oldest retained one after it).
    Sequence(u64),
}

/// Opens an ordered consumer on `stream`, filtered to `filter` (empty:
/// every subject), and returns its messages and how many it will deliver
/// before it is caught up; an error once `bound` passes without an answer.
pub(super) async fn open(
    conn: &Conn,
    stream: &str,
    filter: &str,
    from: Begin,
    bound: Duration,
) -> Result<(Ordered, u64), String> {
    let deliver_policy = match from {
        Begin::LastPerSubject => DeliverPolicy::LastPerSubject,
        Begin::Sequence(start_sequence) => DeliverPolicy::ByStartSequence {
            start_sequence: start_sequence.max(1),
        },
    };
    let config = push::OrderedConfig {
        // The server delivers only once the subscription exists, and the
        // start is a fixed position, so nothing sent before it is missed.
        deliver_subject: conn.client.new_inbox(),
        filter_subject: filter.to_owned(),
        deliver_policy,
        ..Default::default()
    };
    let create = async {
        let consumer = conn
            .js
            .create_consumer_on_stream(config, stream)
            .await
            .map_err(|e| e.to_string())?;
        let pending = consumer.cached_info().num_pending;
        let messages = consumer.messages().await.map_err(|e| e.to_string())?;
        Ok((messages, pending))
    };
    match tokio::time::timeout(bound, create).await {
        Ok(result) => result,
        Err(_) => Err(format!("no consumer within {bound:?}")),
    }
}

/// [`open`] for a caller that waits: retried with backoff (a cluster may be
/// electing the stream's leader) until the request timeout, which also
/// bounds the last attempt.
///
/// Each attempt is bounded like any other JetStream attempt: right after a
/// replica's node is killed, some creations get no answer at all while the
/// next one is answered in milliseconds (nats-server 2.9,
/// `tests/nats_faults.rs`; why is not known). At 5 s an attempt, four such
/// misses in a row used up a 20 s request timeout and a watch failed to
/// open.
pub(super) async fn open_waiting(
    conn: &Conn,
    stream: &str,
    filter: &str,
    from: Begin,
) -> Result<(Ordered, u64), String> {
    let mut policy = super::conn::retries(conn.settings.request_timeout);
    let deadline = crate::coordinator::retry::on_runtime(policy.deadline());
    loop {
        let bound = ATTEMPT_TIMEOUT.min(deadline.saturating_duration_since(Instant::now()));
        match open(conn, stream, filter, from, bound).await {
            Ok(opened) => return Ok(opened),
            Err(e) => {
                if !super::conn::pause(&mut policy, fleetcoord_sm::retry::Sign::NotRun).await {
                    return Err(e);
                }
            }
        }
    }
}

/// [`open`], retried with backoff until it works; `None` when the feed
/// ended first.
pub(super) async fn reopen<T>(
    conn: &Conn,
    stream: &str,
    filter: &str,
    from: Begin,
    life: &FeedTask<T>,
) -> Option<(Ordered, u64)> {
    let mut backoff = retry_backoff();
    let mut failures: u32 = 0;
    loop {
        let result = tokio::select! {
            result = open(conn, stream, filter, from, ATTEMPT_TIMEOUT) => result,
            _ = life.halted() => return None,
        };
        match result {
            Ok(opened) => {
                if failures >= WARN_AFTER {
                    log::info!("fleetcoord nats: reading {stream} again");
                }
                return Some(opened);
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                if failures == WARN_AFTER {
                    log::warn!("fleetcoord nats: cannot read {stream} yet, still trying: {e}");
                } else {
                    log::debug!("fleetcoord nats: reopening {stream}: {e}");
                }
            }
        }
        if !life.pause(&mut backoff).await {
            return None;
        }
    }
}

/// Whether `stream` holds a message at or after `next`: a reader waiting
/// for `next` that has heard nothing for [`IDLE_CHECK`] is then stuck and
/// must start again from `next`. Unknown (the server did not answer) is
/// not stuck: the next check asks again.
pub(super) async fn behind(conn: &Conn, stream: &str, next: u64) -> bool {
    matches!(
        tokio::time::timeout(ATTEMPT_TIMEOUT, conn.stream_state(stream)).await,
        Ok(Ok(Some(state))) if state.last_sequence >= next.max(1)
    )
}

/// What waiting for the next message of an ordered consumer gave.
pub(super) enum Pulled {
    /// A message (the caller still skips sequences below the next wanted).
    Message(Box<async_nats::jetstream::Message>),
    /// Nothing for [`IDLE_CHECK`], and the stream holds nothing the reader
    /// waits for: wait again on the same consumer.
    Again,
    /// The consumer failed, ended, or went quiet while the stream holds
    /// what the reader waits for: open a new one from the next wanted
    /// sequence.
    Reopen,
    /// The feed ended.
    Ended,
}

/// The next message of `current`, for a reader of `stream` waiting for
/// sequence `next`; `what` names the reader in debug logs. The one rule
/// every ordered reader follows: any error or end means a new consumer,
/// and so does silence while the stream is [`behind`].
pub(super) async fn pull<T>(
    current: &mut Ordered,
    conn: &Conn,
    stream: &str,
    next: u64,
    life: &FeedTask<T>,
    what: &str,
) -> Pulled {
    let item = tokio::select! {
        item = tokio::time::timeout(IDLE_CHECK, current.next()) => item,
        _ = life.halted() => return Pulled::Ended,
    };
    let Ok(item) = item else {
        let stuck = tokio::select! {
            stuck = behind(conn, stream, next) => stuck,
            _ = life.halted() => return Pulled::Ended,
        };
        if stuck {
            log::debug!("fleetcoord nats: {what} stuck before {next}; restarting");
            return Pulled::Reopen;
        }
        return Pulled::Again;
    };
    match item {
        Some(Ok(message)) => Pulled::Message(Box::new(message)),
        Some(Err(e)) => {
            log::debug!("fleetcoord nats: {what} restarts at {next}: {e}");
            Pulled::Reopen
        }
        None => Pulled::Reopen,
    }
}
