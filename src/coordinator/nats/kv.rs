//! KV on JetStream KV buckets: writes are JetStream publishes to the
//! bucket's subjects (with a `Nats-Msg-Id`, so a retried write is stored
//! once), reads go through async-nats' KV store, and a watch reads the
//! bucket's stream with an ordered consumer.

use super::conn::{failed, Conn, EXPECTED_SUBJECT_SEQUENCE};
use super::names;
use super::ordered::{self, Begin, Ordered, Pulled};
use super::streams::StreamSpec;
use crate::coordinator::bridge::FeedSender;
use crate::coordinator::feed_task::FeedTask;
use crate::coordinator::kv_mirror::{offer_queued, KvMirror};
use crate::coordinator::{pattern, refused, KvEvent, SetPlan};
use crate::error::{Error, ErrorKind, Result};
use crate::feed_queue::Offer;
use async_nats::jetstream::kv::Operation;
use fleetcoord_sm::kv::Condition;
use fleetcoord_sm::mirror::Order;

/// The header JetStream KV marks deletes with, and its values.
const KV_OPERATION: &str = "KV-Operation";
const KV_DELETE: &str = "DEL";
const KV_PURGE: &str = "PURGE";
/// The header of the marker the server writes when a message's TTL ends
/// (or limits remove it): the key is gone.
const NATS_MARKER_REASON: &str = "Nats-Marker-Reason";

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
        &[],
        value.into(),
        &|why| failed(&what, format!("{why}; it may have been stored")),
    )
    .await
    .map(|_| ())
}

/// The value of `key` and its revision (the stream sequence of the
/// message that set it); `NotFound` when it, or the whole bucket, is
/// absent (deleted, purged, or expired: the server's delete marker).
pub(super) async fn get(conn: Conn, bucket: String, key: String) -> Result<(Vec<u8>, u64)> {
    match last(&conn, &bucket, &key).await? {
        Some(Last::Put { value, revision }) => Ok((value, revision)),
        _ => Err(Error::NotFound),
    }
}

/// The newest message of a key.
enum Last {
    /// It sets the key.
    Put { value: Vec<u8>, revision: u64 },
    /// A delete or purge marker, or the server's marker of an expiry: the
    /// key is absent, and a write conditional on absence must name this
    /// sequence, the subject's last.
    Tombstone { revision: u64 },
}

/// The newest message of `key`, `None` when the key (or bucket) has none.
async fn last(conn: &Conn, bucket: &str, key: &str) -> Result<Option<Last>> {
    let bucket_name = names::bucket_name(bucket);
    let Some(store) = conn.store(&bucket_name).await? else {
        return Ok(None);
    };
    match store
        .entry(names::kv_key(conn.settings.key_encoding, key))
        .await
    {
        Ok(Some(entry)) if entry.operation == Operation::Put => Ok(Some(Last::Put {
            value: entry.value.to_vec(),
            revision: entry.revision,
        })),
        Ok(Some(entry)) => Ok(Some(Last::Tombstone {
            revision: entry.revision,
        })),
        Ok(None) => Ok(None),
        Err(e) => Err(failed(format!("reading {key:?} in bucket {bucket:?}"), e)),
    }
}

/// The header a per-message TTL is given in, in whole seconds.
const NATS_TTL: &str = "Nats-TTL";

/// How often a write conditional on absence follows a key's tombstone
/// that moves (deleted again meanwhile) before it answers a conflict.
const TOMBSTONE_CHASES: usize = 3;

/// Sets `key` as `plan` says (conditional, expiring); returns the
/// revision written.
///
/// The condition is the server's: the publish expects the subject's last
/// sequence (0: no message). A key that is absent may still have a last
/// message — its delete marker — so a write conditional on absence that
/// finds one is sent again expecting exactly that marker. A lost answer is
/// retried with the same message id: nats-server 2.9 answers a repeat of a
/// stored write as a duplicate, later servers refuse it on its expected
/// sequence, so after an unanswered attempt a refusal is checked against
/// the key's newest message (ours: applied) and is otherwise
/// `KvIndeterminate`, never a conflict with itself.
pub(super) async fn set_with(
    conn: Conn,
    bucket: String,
    key: String,
    value: Vec<u8>,
    plan: SetPlan,
) -> Result<u64> {
    if plan.ttl_secs.is_some() && !conn.settings.msg_ttl() {
        return Err(Error::Backend {
            backend: "nats",
            endpoints: String::new(),
            kind: ErrorKind::Unsupported,
            message: format!(
                "setting {key:?} in bucket {bucket:?} with a TTL: per-key TTL needs \
                 nats-server 2.11 or newer (per-message TTL); this server is {}",
                conn.settings.server_version
            ),
        });
    }
    let bucket_name = names::bucket_name(&bucket);
    let spec = StreamSpec::for_bucket(&conn.settings, &bucket);
    conn.ensure_stream(&spec).await?;
    let subject = names::key_subject(&bucket_name, conn.settings.key_encoding, &key);
    let what = format!("setting {key:?} in bucket {bucket:?}");
    let indeterminate = |why: String| Error::KvIndeterminate {
        backend: "nats",
        bucket: bucket.clone(),
        key: key.clone(),
        message: why,
    };
    let plain = |why: String| failed(&what, format!("{why}; it may have been stored"));
    let mut expected = plan.condition.expected();
    let mut ttl_enabled = false;
    let payload = bytes::Bytes::from(value);
    for _ in 0..=TOMBSTONE_CHASES {
        let id = conn.next_id();
        let mut headers = Vec::new();
        if let Some(secs) = plan.ttl_secs {
            headers.push((NATS_TTL, secs.to_string()));
        }
        if let Some(sequence) = expected {
            headers.push((EXPECTED_SUBJECT_SEQUENCE, sequence.to_string()));
        }
        let unknown: &(dyn Fn(String) -> Error + Send + Sync) = if expected.is_some() {
            &indeterminate
        } else {
            &plain
        };
        let outcome = conn
            .publish_with_id(
                &what,
                Some(&spec),
                subject.clone(),
                &headers,
                payload.clone(),
                unknown,
                &id,
            )
            .await;
        match outcome {
            Ok(revision) => return Ok(revision),
            Err(Error::Conflict { .. }) => {}
            // An attempt went unanswered: if the key's newest message is
            // ours, the write applied (and nobody wrote since).
            Err(e @ Error::KvIndeterminate { .. }) => {
                return match own_message(&conn, &spec.name, &subject, &id).await {
                    Some(revision) => Ok(revision),
                    None => Err(e),
                }
            }
            // A bucket made before per-key TTLs were asked of this server:
            // allow them (a stream setting that can be turned on), once.
            Err(Error::Backend {
                kind: ErrorKind::Unsupported,
                ..
            }) if plan.ttl_secs.is_some() && !ttl_enabled => {
                ttl_enabled = true;
                conn.js
                    .update_stream(&spec.config)
                    .await
                    .map_err(|e| failed(format!("allowing per-key TTLs in {what}"), e))?;
                continue;
            }
            Err(e) => return Err(e),
        }
        let current = match last(&conn, &bucket, &key).await? {
            Some(Last::Tombstone { revision })
                if plan.condition == Condition::Absent && expected != Some(revision) =>
            {
                expected = Some(revision);
                continue;
            }
            Some(Last::Put { revision, .. }) => Some(revision),
            Some(Last::Tombstone { .. }) | None => None,
        };
        let verdict = fleetcoord_sm::kv::refusal(plan.condition, current);
        return Err(refused(&bucket, &key, plan.condition, verdict)
            .unwrap_or_else(|| refused_anyway(&bucket, &key, current)));
    }
    Err(refused_anyway(&bucket, &key, None))
}

/// The sequence of `subject`'s newest message when it carries the message
/// id `id`; `None` when it does not, or when that cannot be read.
async fn own_message(conn: &Conn, stream: &str, subject: &str, id: &str) -> Option<u64> {
    let stream = conn.js.get_stream_no_info(stream).await.ok()?;
    let last = stream.direct_get_last_for_subject(subject).await.ok()?;
    let ours = last
        .headers
        .get(NATS_MSG_ID)
        .is_some_and(|v| v.as_str() == id);
    ours.then_some(last.sequence)
}

/// The header JetStream deduplicates writes by.
const NATS_MSG_ID: &str = "Nats-Msg-Id";

/// The conflict of a write refused although its key looked absent (a key
/// deleted again and again while the write chased its marker).
fn refused_anyway(bucket: &str, key: &str, current: Option<u64>) -> Error {
    Error::Conflict {
        bucket: bucket.to_owned(),
        key: key.to_owned(),
        current,
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
        &[(KV_OPERATION, KV_DELETE.to_string())],
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
/// is, which is how an empty bucket gets its `Synced` (docs/backend-notes.md, "KV").
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

/// What a watch has seen and told: the mirror (its decisions), and the
/// pattern it matches keys with.
struct Watch {
    pattern: String,
    mirror: KvMirror,
    /// The lowest stream sequence still wanted: lower ones are repeats of
    /// what a reopened consumer already delivered. `None` while a fresh
    /// snapshot starts (it brings older sequences by design).
    next: Option<u64>,
}

impl Watch {
    fn new(pattern: String, capacity: usize) -> Self {
        Watch {
            pattern,
            // A stream sequence filtered to one bucket has holes that mean
            // nothing; what is missed is said with `missed`.
            mirror: KvMirror::new(Order::Increasing, capacity),
            next: None,
        }
    }

    /// Applies one bucket message (`key` is `None` for a subject that does
    /// not decode); `pending` is how many more the consumer has for us
    /// right now.
    fn apply(&mut self, seq: u64, key: Option<String>, value: Option<Vec<u8>>, pending: u64) {
        if self.next.is_some_and(|next| seq < next) {
            return;
        }
        self.next = Some(seq.saturating_add(1));
        let matching = key.filter(|k| pattern::matches(&self.pattern, k));
        if self.mirror.needs_snapshot() {
            match matching {
                Some(key) => self.mirror.snapshot_entry(seq, key, value),
                None => self.mirror.snapshot_seen(seq),
            }
            if pending == 0 {
                self.mirror.snapshot_end(seq);
            }
        } else if let Some(key) = matching {
            let _ = self.mirror.change(seq, key, value);
        }
    }

    /// A consumer was (re)opened and has `pending` messages for us: with
    /// none, a snapshot in progress is complete.
    fn opened(&mut self, pending: u64) {
        if pending == 0 && self.mirror.needs_snapshot() {
            self.mirror.snapshot_end(0);
        }
    }

    /// Where a consumer recreated now must start.
    fn resume_at(&mut self) -> Begin {
        match self.mirror.resume_at() {
            // A stale mirror (the consumer fell too far behind) takes a
            // fresh snapshot: every key's newest entry, older ones included.
            Some(_) if self.mirror.needs_snapshot() && !self.mirror.is_building() => {
                self.next = None;
                Begin::LastPerSubject
            }
            // The stream arrives in sequence order, so every key whose
            // newest entry lies below this was seen already.
            Some(next) => Begin::Sequence(next),
            None => Begin::LastPerSubject,
        }
    }

    /// Offers queued events to the consumer without waiting.
    fn flush(&mut self, tx: &FeedSender<KvEvent>) -> Offer {
        offer_queued(&mut self.mirror, |event| tx.offer(event))
    }
}

/// Delivers the snapshot, `Synced`, then every change in bucket order.
///
/// On any consumer error, and after the consumer's queue was full, the
/// watch reads on from the next stream sequence it has not applied: the
/// bucket keeps one entry per key, so that is every key changed since,
/// with its newest value or its delete marker — the difference from what
/// the consumer was told, never a change twice.
pub(super) async fn feed(conn: Conn, opened: Opened, pattern: String, life: FeedTask<KvEvent>) {
    let tx = &life.tx;
    let Opened {
        bucket_name,
        stream,
        filter,
        messages,
        pending,
    } = opened;
    let mut watch = Watch::new(pattern, tx.capacity());
    let mut messages = Some(messages);
    watch.opened(pending);
    let what = format!("watch of {stream}");
    let encoding = conn.settings.key_encoding;
    let mut undecodable = names::Undecodable::default();
    loop {
        match watch.flush(tx) {
            Offer::Taken => {}
            Offer::Gone => return,
            Offer::Full(()) => {
                // Pause: stop pulling until the consumer made room.
                messages = None;
                loop {
                    if !life.relieved().await {
                        return;
                    }
                    match watch.flush(tx) {
                        Offer::Taken => break,
                        Offer::Full(()) => {}
                        Offer::Gone => return,
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
                        watch.opened(pending);
                    }
                    None => return,
                }
                continue;
            }
        };
        let message = match ordered::pull(
            current,
            &conn,
            &stream,
            watch.next.unwrap_or(0),
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
        let (seq, pending) = match message.info() {
            Ok(info) => (info.stream_sequence, info.pending),
            Err(e) => {
                log::warn!("fleetcoord nats: message without sequence on {stream}: {e}");
                continue;
            }
        };
        let deleted = message.headers.as_ref().is_some_and(|h| {
            h.get(KV_OPERATION)
                .is_some_and(|op| op.as_str() == KV_DELETE || op.as_str() == KV_PURGE)
                // The server's marker of an expired key (nats-server 2.11+).
                || h.get(NATS_MARKER_REASON).is_some()
        });
        let key = names::subject_key(&bucket_name, encoding, message.subject.as_str());
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

    fn put(key: &str, value: &[u8]) -> KvEvent {
        KvEvent::Put {
            key: key.into(),
            value: value.to_vec(),
        }
    }

    fn queued(w: &mut Watch) -> Vec<KvEvent> {
        let mut out = Vec::new();
        let _ = offer_queued(&mut w.mirror, |e| {
            out.push(e);
            Offer::Taken
        });
        out
    }

    #[test]
    fn snapshot_keeps_newest_values_and_drops_tombstones() {
        let mut w = Watch::new("*".into(), 8);
        w.opened(3);
        w.apply(3, Some("a".into()), Some(b"1".to_vec()), 2);
        w.apply(4, Some("gone".into()), None, 1);
        // A change during the snapshot replaces the snapshot value.
        w.apply(5, Some("a".into()), Some(b"2".to_vec()), 0);
        assert_eq!(queued(&mut w), [put("a", b"2"), KvEvent::Synced]);
    }

    #[test]
    fn deletes_only_of_keys_told_and_no_repeats() {
        let mut w = Watch::new("k*".into(), 8);
        w.opened(0);
        w.apply(1, Some("k1".into()), Some(b"v".to_vec()), 0);
        w.apply(2, Some("never".into()), Some(b"v".to_vec()), 0);
        w.apply(3, Some("k2".into()), None, 0);
        w.apply(4, Some("k1".into()), None, 0);
        // A resumed consumer repeating earlier sequences changes nothing.
        w.apply(4, Some("k1".into()), None, 0);
        w.apply(1, Some("k1".into()), Some(b"v".to_vec()), 0);
        // A subject that does not decode moves nothing but the sequence.
        w.apply(6, None, Some(b"x".to_vec()), 0);
        assert_eq!(
            queued(&mut w),
            [
                KvEvent::Synced,
                put("k1", b"v"),
                KvEvent::Deleted { key: "k1".into() }
            ]
        );
        assert!(matches!(w.resume_at(), Begin::Sequence(5)));
    }

    #[test]
    fn a_consumer_too_far_behind_resyncs_from_every_keys_newest_entry() {
        let mut w = Watch::new("*".into(), 1);
        w.opened(0);
        w.apply(1, Some("a".into()), Some(b"1".to_vec()), 0);
        // The second live change finds one already waiting: stale.
        w.apply(2, Some("a".into()), Some(b"2".to_vec()), 0);
        assert!(matches!(w.resume_at(), Begin::LastPerSubject));
        assert_eq!(queued(&mut w), [KvEvent::Synced, put("a", b"1")]);
        // The fresh snapshot brings a's newest entry, at an old sequence.
        w.apply(2, Some("a".into()), Some(b"2".to_vec()), 0);
        assert_eq!(queued(&mut w), [put("a", b"2")]);
        assert!(matches!(w.resume_at(), Begin::Sequence(3)));
    }
}
