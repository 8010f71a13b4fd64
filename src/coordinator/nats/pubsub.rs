//! Pub/sub on core NATS subjects: one subject per topic, live-only.

use super::feed::Lifeline;
use crate::coordinator::bridge::FeedFull;
use crate::coordinator::Message;
use futures_util::StreamExt;

/// Moves the messages of `sub` to the consumer until the feed is dropped or
/// the handle closes.
///
/// Live-only, so there is nothing to resume: while the consumer's queue is
/// full, messages that arrive are dropped (and counted); once it has read
/// half of its queue, the message that did not fit goes out first and
/// delivery goes on with the next message published. A warning says how
/// many were dropped.
pub(super) async fn feed(mut sub: async_nats::Subscriber, topic: String, life: Lifeline<Message>) {
    let tx = life.tx();
    loop {
        let next = tokio::select! {
            next = sub.next() => next,
            _ = life.ended() => break,
        };
        // The client resubscribes by itself after a reconnect; the stream
        // only ends when the connection is closed for good.
        let Some(m) = next else { break };
        let message = Message {
            topic: topic.clone(),
            payload: m.payload.to_vec(),
        };
        let held = match tx.try_send(message) {
            Ok(()) => continue,
            Err(FeedFull::Gone) => break,
            Err(FeedFull::Full(held)) => held,
        };
        let mut dropped: u64 = 0;
        let relieved = loop {
            tokio::select! {
                relieved = life.relieved() => break relieved,
                next = sub.next() => match next {
                    Some(_) => dropped = dropped.saturating_add(1),
                    None => break false,
                },
                _ = life.ended() => break false,
            }
        };
        if dropped > 0 {
            log::warn!(
                "fleetcoord nats: subscriber of topic {topic:?} fell behind; \
                 {dropped} message(s) published while its queue was full were dropped"
            );
        }
        if !relieved || tx.try_send(held).is_err() {
            break;
        }
    }
    // Dropping the subscriber unsubscribes.
    drop(sub);
}
