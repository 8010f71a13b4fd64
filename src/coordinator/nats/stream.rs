//! Streams on JetStream streams: one JetStream stream (and subject) per
//! coordinator stream, so its sequence numbers are the entry IDs.

use super::conn::Conn;
use super::names;
use super::ordered::{self, Begin, Ordered, Pulled};
use super::streams::StreamSpec;
use crate::coordinator::feed_task::FeedTask;
use crate::coordinator::{read_from, StreamEntry, StreamId, StreamPosition};
use crate::error::Result;
use crate::feed_queue::Offer;
use fleetcoord_sm::stream::{Offered, Place};

/// Appends `payload`; the ID is the stored message's stream sequence.
pub(super) async fn append(conn: Conn, stream: String, payload: Vec<u8>) -> Result<StreamId> {
    let spec = StreamSpec::for_stream(&conn.settings, &stream);
    conn.ensure_stream(&spec).await?;
    let seq = conn
        .publish_once(
            &format!("appending to stream {stream:?}"),
            Some(&spec),
            names::stream_subject(&stream),
            &[],
            payload.into(),
            &|why| indeterminate(&stream, why),
        )
        .await?;
    Ok(StreamId(seq))
}

/// The error of an append that may have been stored: typed, so the caller
/// knows not to append it again. The server assigns the sequence, so there
/// is no ID to name.
fn indeterminate(stream: &str, why: String) -> crate::Error {
    crate::Error::Indeterminate {
        backend: "nats",
        stream: stream.to_string(),
        id: None,
        message: why,
    }
}

/// A reader opened on the driver, live, for [`feed`] to run.
pub(super) struct Opened {
    pub name: String,
    pub place: Place,
    pub messages: Ordered,
}

/// Creates the stream if needed and opens its reader at `from`. The first
/// wanted sequence is fixed here, from the stream's state: `End` is the
/// entry after the last one now, and `After(id)` never starts beyond it
/// (an ID past the head waits for the next append instead of skipping
/// appends until the sequence reaches it).
pub(super) async fn open(conn: Conn, stream: String, from: StreamPosition) -> Result<Opened> {
    let spec = StreamSpec::for_stream(&conn.settings, &stream);
    let state = conn.create_stream(&spec).await?;
    // JetStream streams keep their sequences across restarts: no epoch.
    let place = Place::open(read_from(from), Some((state.last_sequence, None)));
    let next = place.last().saturating_add(1);
    let (messages, _) = ordered::open_waiting(&conn, &spec.name, "", Begin::Sequence(next))
        .await
        .map_err(|e| super::conn::failed(format!("reading stream {stream:?}"), e))?;
    Ok(Opened {
        name: spec.name,
        place,
        messages,
    })
}

/// Delivers entries from `opened.next` on, each exactly once and in order:
/// sequences below the next wanted one are skipped, and on any error, or
/// when the consumer's queue is full (after it has read half of it), the
/// consumer is recreated from the next wanted sequence.
pub(super) async fn feed(conn: Conn, opened: Opened, life: FeedTask<StreamEntry>) {
    let tx = &life.tx;
    let Opened {
        name,
        mut place,
        messages,
    } = opened;
    let mut messages = Some(messages);
    let what = format!("reader of {name}");
    loop {
        let current = match messages.as_mut() {
            Some(current) => current,
            None => {
                match ordered::reopen(
                    &conn,
                    &name,
                    "",
                    Begin::Sequence(place.last().saturating_add(1)),
                    &life,
                )
                .await
                {
                    Some((reopened, _)) => messages = Some(reopened),
                    None => return,
                }
                continue;
            }
        };
        let message = match ordered::pull(
            current,
            &conn,
            &name,
            place.last().saturating_add(1),
            &life,
            &what,
        )
        .await
        {
            Pulled::Message(message) => *message,
            Pulled::Again => continue,
            Pulled::Reopen => {
                messages = None;
                continue;
            }
            Pulled::Ended => return,
        };
        let seq = match message.info() {
            Ok(info) => info.stream_sequence,
            Err(e) => {
                log::warn!("fleetcoord nats: message without sequence on {name}: {e}");
                continue;
            }
        };
        // Without epochs an entry is either the next one or a repeat.
        if place.offer(seq, None) != Offered::Deliver {
            continue;
        }
        let entry = StreamEntry {
            id: StreamId(seq),
            payload: message.payload.to_vec(),
        };
        match tx.offer(entry) {
            Offer::Taken => {}
            Offer::Gone => return,
            Offer::Full(held) => {
                // Pause: stop pulling, wait for room, resume after `held`.
                messages = None;
                if !life.relieved().await || !tx.offer(held).is_taken() {
                    return;
                }
            }
        }
    }
}
