//! Pub/sub on Redis channels `coord:topic:{<topic>}`.
//!
//! On a cluster, sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`): a message goes
//! only to the shard that owns the channel's slot instead of being
//! broadcast over the cluster bus to every node, so pub/sub traffic scales
//! with the shards, and it measured ~25 µs faster at p50 (docs/backend-notes.md,
//! "Pub/sub"). On a standalone server plain `PUBLISH`/`SUBSCRIBE`, which the
//! crate's standalone connection supports directly.
//!
//! Live-only, like Redis pub/sub itself: nothing is buffered by the server.
//! Messages published while a subscriber's connection is down are lost
//! (the subscriber reconnects, resubscribes and logs a warning); messages
//! that arrive while the consumer's queue is full are dropped (all but the
//! newest), counted in one warning once the consumer has read half its queue.

use super::conn::{message, Conn};
use super::names;
use super::target::Target;
use super::task::FeedCtx;
use crate::coordinator::feed_task::retry_backoff;
use crate::coordinator::Message;
use crate::feed_queue::Offer;
use fleetcoord_sm::newest::Newest;
use redis::{PushInfo, PushKind, RedisResult};
use tokio::sync::mpsc::UnboundedReceiver;

/// Runs a subscription until its feed ends.
pub(crate) async fn subscribe_task(mut ctx: FeedCtx<Message>, topic: String) {
    let channel = names::topic_channel(&topic);
    let mut backoff = retry_backoff();
    loop {
        if ctx.is_halted() {
            return;
        }
        let (_conn, mut pushes) = match subscribed(&ctx.target, &channel).await {
            Ok(c) => c,
            Err(e) => {
                let error = ctx.target.error(format!("subscription to {topic:?}"), &e);
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
        backoff.reset();
        ctx.started(Ok(()));
        if !follow(&mut ctx, &mut pushes, &topic, channel.as_bytes()).await {
            return;
        }
        log::warn!(
            "subscription to {topic:?}: connection lost; messages published until it is \
             back are lost"
        );
        if !ctx.pause(&mut backoff).await {
            return;
        }
    }
}

async fn subscribed(
    target: &Target,
    channel: &str,
) -> RedisResult<(Conn, UnboundedReceiver<PushInfo>)> {
    let (mut conn, pushes) = target.push_conn().await?;
    conn.subscribe(channel).await?;
    Ok((conn, pushes))
}

/// Delivers messages until the connection is lost (`true`) or the feed
/// ends (`false`).
async fn follow(
    ctx: &mut FeedCtx<Message>,
    pushes: &mut UnboundedReceiver<PushInfo>,
    topic: &str,
    channel: &[u8],
) -> bool {
    loop {
        let push = tokio::select! {
            push = pushes.recv() => push,
            _ = ctx.halted() => return false,
        };
        let Some(push) = push else {
            return true;
        };
        if push.kind == PushKind::Disconnection {
            return true;
        }
        let Some((on, payload)) = message(&push) else {
            continue;
        };
        if on != channel {
            continue;
        }
        let mut newest = Newest::new();
        match ctx.tx.offer(Message {
            topic: topic.to_string(),
            payload,
        }) {
            Offer::Taken => continue,
            Offer::Gone => return false,
            Offer::Full(held) => newest.hold(held),
        }
        // Full: keep draining the connection so the server never buffers
        // for us; the newest message replaces the held one (the contract
        // in coordinator/mod.rs, "Slow consumers"); deliver it once the
        // consumer caught up.
        let mut lost = false;
        loop {
            tokio::select! {
                relieved = ctx.relieved() => {
                    if !relieved {
                        return false;
                    }
                    break;
                }
                push = pushes.recv(), if !lost => match push {
                    Some(p) if p.kind == PushKind::Disconnection => lost = true,
                    None => lost = true,
                    Some(p) => {
                        if let Some((on, payload)) = message(&p) {
                            if on == channel {
                                newest.hold(Message {
                                    topic: topic.to_string(),
                                    payload,
                                });
                            }
                        }
                    }
                },
            }
        }
        if let Some(held) = newest.take() {
            if !ctx.tx.offer(held).is_taken() {
                return false;
            }
        }
        let dropped = newest.take_replaced();
        if dropped > 0 {
            log::warn!(
                "subscription to {topic:?}: the consumer fell behind; {dropped} message(s) \
                 were dropped while its queue was full (the newest was kept)"
            );
        }
        if lost {
            return true;
        }
    }
}
