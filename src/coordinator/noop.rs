//! A backend that accepts everything and delivers nothing.

use super::lifecycle::Lifecycle;
use super::{
    check_key, check_name, check_payload, pattern, plan_set, refused, Capabilities, Coordinator,
    Feed, KvEntry, KvSetOptions, KvWatcher, StreamId, StreamPosition, StreamReader, Subscription,
};
use crate::error::{Error, Result};
use crossbeam_channel::{bounded, Sender};
use parking_lot::Mutex;
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Stream IDs and KV revisions: process-wide, so handles from one factory
/// never hand out the same number, as handles onto one real store would
/// not.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A [`Coordinator`] for when coordination is switched off (or could not be
/// set up): calls succeed and go nowhere, so code written against the trait
/// keeps running.
///
/// * `publish`, `kv_set`, `kv_delete` succeed; nothing is stored.
/// * `append_stream` succeeds with unique, increasing IDs from one counter
///   shared by all streams and all noop handles of the process (so callers
///   that compare IDs keep working); no entry is stored.
/// * `kv_get` and `kv_get_entry` return [`Error::NotFound`]: every key is
///   always absent.
/// * `kv_set_with` (`kv_set_if`, `kv_set_with_ttl`) checks its input like
///   every backend, then answers as a store in which every key is absent
///   would: a write expecting absence (revision 0), or expecting nothing,
///   succeeds with a new revision from the process-wide counter and is
///   dropped (so a claim on a noop always wins, as a `kv_set` always
///   succeeds); a write expecting a revision is [`Error::Conflict`] with
///   `current: None`. A TTL is accepted and has nothing to expire.
/// * feeds from `subscribe`, `read_stream` and `kv_watch` stay open and
///   silent (a KV watch never even says `Synced`) until the handle closes.
/// * `ping` succeeds; `close` is idempotent, then every call returns
///   [`Error::Closed`].
///
/// Input is validated exactly as by the other backends.
///
/// A noop that [`from_env`](super::from_env) fell back to is not silent
/// about it: [`NoopCoordinator::fallback_reason`] and
/// [`Coordinator::describe`] say why it is there.
#[derive(Debug, Default)]
pub struct NoopCoordinator {
    inner: Arc<Mutex<Inner>>,
    /// Closed only with `inner` locked, so a feed registered under the
    /// lock is never missed by `close`.
    life: Lifecycle,
    /// Why this noop stands in for the backend that was asked for.
    fallback: Option<String>,
}

#[derive(Default)]
struct Inner {
    next_feed: u64,
    /// The senders that keep open feeds open, keyed by feed id.
    senders: HashMap<u64, Box<dyn Any + Send>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("feeds", &self.senders.len())
            .finish()
    }
}

impl NoopCoordinator {
    /// A new, open noop coordinator, switched off on purpose.
    pub fn new() -> Self {
        Self::default()
    }

    /// A noop standing in for a backend that could not be used, because
    /// of `reason` (one line, e.g. the connect error): [`describe`]
    /// reads `noop (fallback: <reason>)`.
    ///
    /// [`describe`]: Coordinator::describe
    pub fn fallback(reason: impl Into<String>) -> Self {
        NoopCoordinator {
            fallback: Some(reason.into()),
            ..Self::default()
        }
    }

    /// Why this noop stands in for another backend; `None` for a noop
    /// asked for as such ([`NoopCoordinator::new`], `COORD=noop`).
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    fn silent_feed<T: Send + 'static>(&self) -> Result<Feed<T>> {
        // Nothing is ever sent: a zero-capacity channel, kept open by its
        // sender until the feed is dropped or the handle closes.
        let (tx, rx) = bounded::<T>(0);
        let mut inner = self.inner.lock();
        self.life.check_open()?;
        inner.next_feed += 1;
        let id = inner.next_feed;
        let keep: Sender<T> = tx;
        inner.senders.insert(id, Box::new(keep));
        let weak: Weak<Mutex<Inner>> = Arc::downgrade(&self.inner);
        Ok(Feed::new(rx, move || {
            if let Some(inner) = weak.upgrade() {
                inner.lock().senders.remove(&id);
            }
        }))
    }
}

impl Coordinator for NoopCoordinator {
    fn publish(&self, topic: &str, payload: &[u8]) -> Result<()> {
        self.life.check_open()?;
        check_name("topic", topic)?;
        check_payload("noop", "payload", payload)
    }

    fn subscribe(&self, topic: &str) -> Result<Subscription> {
        self.life.check_open()?;
        check_name("topic", topic)?;
        self.silent_feed()
    }

    fn append_stream(&self, stream: &str, payload: &[u8]) -> Result<StreamId> {
        self.life.check_open()?;
        check_name("stream", stream)?;
        check_payload("noop", "payload", payload)?;
        Ok(StreamId(NEXT_ID.fetch_add(1, Ordering::Relaxed)))
    }

    fn read_stream(&self, stream: &str, _from: StreamPosition) -> Result<StreamReader> {
        self.life.check_open()?;
        check_name("stream", stream)?;
        self.silent_feed()
    }

    fn kv_set(&self, bucket: &str, key: &str, value: &[u8]) -> Result<()> {
        self.life.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        check_payload("noop", "value", value)
    }

    fn kv_get(&self, bucket: &str, key: &str) -> Result<Vec<u8>> {
        self.life.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        Err(Error::NotFound)
    }

    fn kv_get_entry(&self, bucket: &str, key: &str) -> Result<KvEntry> {
        self.kv_get(bucket, key).map(|value| KvEntry::new(value, 0))
    }

    fn kv_set_with(
        &self,
        bucket: &str,
        key: &str,
        value: &[u8],
        options: KvSetOptions,
    ) -> Result<u64> {
        self.kv_set(bucket, key, value)?;
        let plan = plan_set(options)?;
        let verdict = fleetcoord_sm::kv::check(plan.condition, None);
        if let Some(error) = refused(bucket, key, plan.condition, verdict) {
            return Err(error);
        }
        Ok(NEXT_ID.fetch_add(1, Ordering::Relaxed))
    }

    fn kv_delete(&self, bucket: &str, key: &str) -> Result<()> {
        self.life.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)
    }

    fn kv_watch(&self, bucket: &str, pat: &str) -> Result<KvWatcher> {
        self.life.check_open()?;
        check_name("bucket", bucket)?;
        pattern::validate(pat)?;
        self.silent_feed()
    }

    fn ping(&self) -> Result<()> {
        self.life.check_open()
    }

    fn close(&self) -> Result<()> {
        let senders = {
            let mut inner = self.inner.lock();
            self.life.close();
            std::mem::take(&mut inner.senders)
        };
        // Dropping the senders outside the lock ends every open feed.
        drop(senders);
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            delivers: false,
            ..Capabilities::default()
        }
    }

    fn describe(&self) -> String {
        match &self.fallback {
            Some(reason) => format!("noop (fallback: {reason})"),
            None => "noop".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::RecvTimeoutError;
    use std::time::Duration;

    #[test]
    fn silent_until_close() {
        let c = NoopCoordinator::new();
        let sub = c.subscribe("t").unwrap();
        c.publish("t", b"x").unwrap();
        assert!(matches!(
            sub.recv_timeout(Duration::from_millis(20)),
            Err(RecvTimeoutError::Timeout)
        ));
        c.close().unwrap();
        assert!(matches!(
            sub.recv_timeout(Duration::from_secs(1)),
            Err(RecvTimeoutError::Disconnected)
        ));
    }

    #[test]
    fn dropped_feeds_release_their_sender() {
        let c = NoopCoordinator::new();
        let w = c.kv_watch("b", "*").unwrap();
        assert_eq!(c.inner.lock().senders.len(), 1);
        drop(w);
        assert!(c.inner.lock().senders.is_empty());
    }

    #[test]
    fn feeds_hold_nothing() {
        let c = NoopCoordinator::new();
        let r = c.read_stream("s", StreamPosition::Start).unwrap();
        assert_eq!(r.receiver().capacity(), Some(0));
    }

    #[test]
    fn a_fallback_says_what_it_is_and_why() {
        assert_eq!(NoopCoordinator::new().describe(), "noop");
        assert_eq!(NoopCoordinator::new().fallback_reason(), None);
        let c = NoopCoordinator::fallback("cannot connect to etcd at http://127.0.0.1:1");
        assert_eq!(
            c.describe(),
            "noop (fallback: cannot connect to etcd at http://127.0.0.1:1)"
        );
        assert_eq!(
            c.fallback_reason(),
            Some("cannot connect to etcd at http://127.0.0.1:1")
        );
        // Still a working noop.
        c.kv_set("b", "k", b"v").unwrap();
        c.close().unwrap();
        assert_eq!(
            c.describe(),
            "noop (fallback: cannot connect to etcd at http://127.0.0.1:1)"
        );
    }

    #[test]
    fn append_ids_increase() {
        let c = NoopCoordinator::new();
        let a = c.append_stream("s", b"").unwrap();
        let b = c.append_stream("s", b"").unwrap();
        assert!(b > a);
    }

    #[test]
    fn debug_counts_open_feeds_and_shows_closed() {
        let c = NoopCoordinator::new();
        let _feed = c.subscribe("t").unwrap();
        let text = format!("{c:?}");
        assert!(
            text.contains("closed: false") && text.contains("feeds: 1"),
            "{text}"
        );
        c.close().unwrap();
        let text = format!("{c:?}");
        assert!(
            text.contains("closed: true") && text.contains("feeds: 0"),
            "{text}"
        );
    }
}
