//! Pub/sub on core NATS subjects: one subject per topic, live-only.

use crate::coordinator::feed_task::FeedTask;
use crate::coordinator::Message;
use crate::feed_queue::Offer;
use fleetcoord_sm::newest::Newest;
use futures_util::StreamExt;

/// Moves the messages of `sub` to the consumer until the feed is dropped or
/// the handle closes.
///
/// Live-only, so there is nothing to resume: while the consumer's queue is
/// full, only the newest message is kept and the others are dropped (and
/// counted); once it has read half of its queue, that newest message goes
/// out and delivery goes on with the next one published. A warning says
/// how many were dropped.
pub(super) async fn feed(mut sub: async_nats::Subscriber, topic: String, life: FeedTask<Message>) {
    let tx = &life.tx;
    loop {
        let next = tokio::select! {
            next = sub.next() => next,
            _ = life.halted() => break,
        };
        // The client resubscribes by itself after a reconnect; the stream
        // only ends when the connection is closed for good.
        let Some(m) = next else { break };
        let message = Message {
            topic: topic.clone(),
            payload: m.payload.to_vec(),
        };
        let mut newest = Newest::new();
        match tx.offer(message) {
            Offer::Taken => continue,
            Offer::Gone => break,
            Offer::Full(held) => newest.hold(held),
        }
        let relieved = loop {
            tokio::select! {
                relieved = life.relieved() => break relieved,
                next = sub.next() => match next {
                    // The newest replaces the held one (the contract in
                    // coordinator/mod.rs, "Slow consumers").
                    Some(m) => newest.hold(Message {
                        topic: topic.clone(),
                        payload: m.payload.to_vec(),
                    }),
                    None => break false,
                },
                _ = life.halted() => break false,
            }
        };
        let dropped = newest.take_replaced();
        if dropped > 0 {
            log::warn!(
                "fleetcoord nats: subscriber of topic {topic:?} fell behind; \
                 {dropped} message(s) published while its queue was full were dropped \
                 (the newest was kept)"
            );
        }
        if !relieved {
            break;
        }
        if let Some(held) = newest.take() {
            if !tx.offer(held).is_taken() {
                break;
            }
        }
    }
    // Dropping the subscriber unsubscribes.
    drop(sub);
}
