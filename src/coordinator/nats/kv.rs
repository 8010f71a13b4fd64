//! KV on JetStream KV buckets: writes are JetStream publishes to the
//! bucket's subjects (with a `Nats-Msg-Id`, so a retried write is stored
//! once), reads go through async-nats' KV store, and a watch reads the
//! bucket's stream with an ordered consumer.

use super::conn::{failed, Conn, StreamSpec};
use super::feed::Lifeline;
use super::names;
use super::ordered::{self, Begin, Ordered, Pulled};
use crate::coordinator::bridge::{FeedFull, FeedSender};
use crate::coordinator::{pattern, KvEvent};
use crate::error::{Error, Result};
use async_nats::jetstream::kv::Operation;
use std::collections::{BTreeMap, HashSet, VecDeque};

/// The header JetStream KV marks deletes with, and its values.
const KV_OPERATION: &str = "KV-Operation";
const KV_DELETE: &str = "DEL";
const KV_PURGE: &str = "PURGE";

/// Sets `key` in `bucket`, creating the bucket on first use.
pub(super) async fn set(conn: Conn, bucket: String, key: String, value: Vec<u8>) -> Result<()> {
    let bucket_name = names::bucket_name(&bucket);
    let spec = StreamSpec::for_bucket(&conn.settings, &bucket);
    conn.ensure_stream(&spec).await?;
    let what = format!("setting {key:?} in bucket {bucket:?}");
    conn.publish_once(
        &what,
        Some(&spec),
        names::key_subject(&bucket_name, conn.settings.key_encoding, &key),
        None,
        value.into(),
        &|why| failed(&what, format!("{why}; it may have been stored")),
    )
    .await
    .map(|_| ())
}

/// The value of `key`; `NotFound` when it, or the whole bucket, is absent.
pub(super) async fn get(conn: Conn, bucket: String, key: String) -> Result<Vec<u8>> {
    let bucket_name = names::bucket_name(&bucket);
    let Some(store) = conn.store(&bucket_name).await? else {
        return Err(Error::NotFound);
    };
    match store
        .entry(names::kv_key(conn.settings.key_encoding, &key))
        .await
    {
        Ok(Some(entry)) if entry.operation == Operation::Put => Ok(entry.value.to_vec()),
        Ok(_) => Err(Error::NotFound),
        Err(e) => Err(failed(format!("reading {key:?} in bucket {bucket:?}"), e)),
    }
}

/// Deletes `key` by writing JetStream KV's delete marker; nothing at all
/// when the bucket does not exist.
pub(super) async fn delete(conn: Conn, bucket: String, key: String) -> Result<()> {
    let bucket_name = names::bucket_name(&bucket);
    if conn.store(&bucket_name).await?.is_none() {
        return Ok(());
    }
    let spec = StreamSpec::for_bucket(&conn.settings, &bucket);
    let what = format!("deleting {key:?} in bucket {bucket:?}");
    conn.publish_once(
        &what,
        Some(&spec),
        names::key_subject(&bucket_name, conn.settings.key_encoding, &key),
        Some((KV_OPERATION, KV_DELETE)),
        bytes::Bytes::new(),
        &|why| failed(&what, format!("{why}; it may have been stored")),
    )
    .await
    .map(|_| ())
}

/// A watch opened on the driver, live, for [`feed`] to run.
pub(super) struct Opened {
    bucket_name: String,
    stream: String,
    filter: String,
    messages: Ordered,
    pending: u64,
}

/// Creates the bucket if needed and opens a consumer on the newest entry
/// of every key. Its pending count at creation says how long the snapshot
/// is, which is how an empty bucket gets its `Synced` (BACKEND-NOTES, "KV").
pub(super) async fn open_watch(conn: Conn, bucket: String) -> Result<Opened> {
    let bucket_name = names::bucket_name(&bucket);
    let spec = StreamSpec::for_bucket(&conn.settings, &bucket);
    conn.ensure_stream(&spec).await?;
    let filter = format!("$KV.{bucket_name}.>");
    let (messages, pending) =
        ordered::open_waiting(&conn, &spec.name, &filter, Begin::LastPerSubject)
            .await
            .map_err(|e| failed(format!("watching bucket {bucket:?}"), e))?;
    Ok(Opened {
        bucket_name,
        stream: spec.name,
        filter,
        messages,
        pending,
    })
}

/// What a watch has seen and told.
struct Watch {
    pattern: String,
    bucket_name: String,
    /// The next stream sequence wanted; lower ones were applied already.
    next: u64,
    /// The snapshot so far (a key's newest value, `None` for a delete
    /// marker) until it is complete; `None` once `Synced` was queued.
    snapshot: Option<BTreeMap<String, Option<Vec<u8>>>>,
    /// Keys the consumer was told hold a value: a delete of any other key
    /// (never set, or set before the watch and deleted) reports nothing.
    told: HashSet<String>,
    /// Events not yet handed to the consumer.
    outbox: VecDeque<KvEvent>,
}

impl Watch {
    /// Applies one bucket message; `pending` is how many more the consumer
    /// has for us right now.
    fn apply(&mut self, seq: u64, key: Option<String>, value: Option<Vec<u8>>, pending: u64) {
        if seq < self.next {
            return;
        }
        self.next = seq.saturating_add(1);
        if let Some(key) = key {
            match self.snapshot.as_mut() {
                Some(snapshot) => {
                    snapshot.insert(key, value);
                }
                None => self.change(key, value),
            }
        }
        if pending == 0 {
            self.synced();
        }
    }

    /// Ends the snapshot (once): its values that match, then `Synced`.
    fn synced(&mut self) {
        let Some(snapshot) = self.snapshot.take() else {
            return;
        };
        for (key, value) in snapshot {
            if let Some(value) = value {
                if pattern::matches(&self.pattern, &key) {
                    self.told.insert(key.clone());
                    self.outbox.push_back(KvEvent::Put { key, value });
                }
            }
        }
        self.outbox.push_back(KvEvent::Synced);
    }

    fn change(&mut self, key: String, value: Option<Vec<u8>>) {
        if !pattern::matches(&self.pattern, &key) {
            return;
        }
        match value {
            Some(value) => {
                self.told.insert(key.clone());
                self.outbox.push_back(KvEvent::Put { key, value });
            }
            None => {
                if self.told.remove(&key) {
                    self.outbox.push_back(KvEvent::Deleted { key });
                }
            }
        }
    }

    /// Where a consumer recreated now must start.
    fn resume_at(&self) -> Begin {
        if self.next == 0 {
            // Nothing seen yet: the snapshot starts over.
            Begin::LastPerSubject
        } else {
            // The snapshot arrives in sequence order, so every key whose
            // newest entry lies below `next` was seen already.
            Begin::Sequence(self.next)
        }
    }

    /// Hands queued events over without waiting.
    fn flush(&mut self, tx: &FeedSender<KvEvent>) -> Flush {
        while let Some(event) = self.outbox.pop_front() {
            match tx.try_send(event) {
                Ok(()) => {}
                Err(FeedFull::Gone) => return Flush::Gone,
                Err(FeedFull::Full(event)) => {
                    self.outbox.push_front(event);
                    return Flush::Full;
                }
            }
        }
        Flush::Done
    }
}

enum Flush {
    Done,
    Full,
    Gone,
}

/// Delivers the snapshot, `Synced`, then every change in bucket order.
///
/// On any consumer error, and after the consumer's queue was full, the
/// watch reads on from the next stream sequence it has not applied: the
/// bucket keeps one entry per key, so that is every key changed since,
/// with its newest value or its delete marker — the difference from what
/// the consumer was told, never a change twice.
pub(super) async fn feed(conn: Conn, opened: Opened, pattern: String, life: Lifeline<KvEvent>) {
    let tx = life.tx();
    let Opened {
        bucket_name,
        stream,
        filter,
        messages,
        pending,
    } = opened;
    let mut watch = Watch {
        pattern,
        bucket_name,
        next: 0,
        snapshot: Some(BTreeMap::new()),
        told: HashSet::new(),
        outbox: VecDeque::new(),
    };
    let mut messages = Some(messages);
    if pending == 0 {
        watch.synced();
    }
    let what = format!("watch of {stream}");
    let encoding = conn.settings.key_encoding;
    let mut undecodable = names::Undecodable::default();
    loop {
        match watch.flush(tx) {
            Flush::Done => {}
            Flush::Gone => return,
            Flush::Full => {
                // Pause: stop pulling until the consumer made room.
                messages = None;
                loop {
                    if !life.relieved().await {
                        return;
                    }
                    match watch.flush(tx) {
                        Flush::Done => break,
                        Flush::Full => {}
                        Flush::Gone => return,
                    }
                }
            }
        }
        let current = match messages.as_mut() {
            Some(current) => current,
            None => {
                let begin = watch.resume_at();
                match ordered::reopen(&conn, &stream, &filter, begin, &life).await {
                    Some((reopened, pending)) => {
                        messages = Some(reopened);
                        if pending == 0 {
                            watch.synced();
                        }
                    }
                    None => return,
                }
                continue;
            }
        };
        let message = match ordered::pull(current, &conn, &stream, watch.next, &life, &what).await {
            Pulled::Message(message) => *message,
            Pulled::Again => continue,
            Pulled::Reopen => {
                messages = None;
                continue;
            }
            Pulled::Ended => return,
        };
        let (seq, pending) = match message.info() {
            Ok(info) => (info.stream_sequence, info.pending),
            Err(e) => {
                log::warn!("fleetcoord nats: message without sequence on {stream}: {e}");
                continue;
            }
        };
        let deleted = message
            .headers
            .as_ref()
            .and_then(|h| h.get(KV_OPERATION))
            .is_some_and(|op| op.as_str() == KV_DELETE || op.as_str() == KV_PURGE);
        let key = names::subject_key(&watch.bucket_name, encoding, message.subject.as_str());
        if key.is_none() {
            undecodable.skip(&stream, message.subject.as_str(), encoding);
        }
        let value = (!deleted).then(|| message.payload.to_vec());
        watch.apply(seq, key, value, pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(pattern: &str) -> Watch {
        Watch {
            pattern: pattern.into(),
            bucket_name: "b".into(),
            next: 0,
            snapshot: Some(BTreeMap::new()),
            told: HashSet::new(),
            outbox: VecDeque::new(),
        }
    }

    fn put(key: &str, value: &[u8]) -> KvEvent {
        KvEvent::Put {
            key: key.into(),
            value: value.to_vec(),
        }
    }

    #[test]
    fn snapshot_keeps_newest_values_and_drops_tombstones() {
        let mut w = watch("*");
        w.apply(3, Some("a".into()), Some(b"1".to_vec()), 2);
        w.apply(4, Some("gone".into()), None, 1);
        // A change during the snapshot replaces the snapshot value.
        w.apply(5, Some("a".into()), Some(b"2".to_vec()), 0);
        assert_eq!(
            Vec::from(w.outbox.clone()),
            [put("a", b"2"), KvEvent::Synced]
        );
    }

    #[test]
    fn deletes_only_of_keys_told_and_no_repeats() {
        let mut w = watch("k*");
        w.synced();
        w.apply(1, Some("k1".into()), Some(b"v".to_vec()), 0);
        w.apply(2, Some("never".into()), Some(b"v".to_vec()), 0);
        w.apply(3, Some("k2".into()), None, 0);
        w.apply(4, Some("k1".into()), None, 0);
        // A resumed consumer repeating earlier sequences changes nothing.
        w.apply(4, Some("k1".into()), None, 0);
        w.apply(1, Some("k1".into()), Some(b"v".to_vec()), 0);
        assert_eq!(
            Vec::from(w.outbox.clone()),
            [
                KvEvent::Synced,
                put("k1", b"v"),
                KvEvent::Deleted { key: "k1".into() }
            ]
        );
        assert!(matches!(w.resume_at(), Begin::Sequence(5)));
    }
}
