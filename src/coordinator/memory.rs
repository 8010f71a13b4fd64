//! In-process backend: the embedded default and the reference semantics.

use super::{
    check_key, check_name, check_payload, pattern, Capabilities, Coordinator, Feed, KvEvent,
    KvWatcher, Message, StreamEntry, StreamId, StreamPosition, StreamReader, Subscription,
};
use crate::error::{Error, Result};
use crossbeam_channel::{unbounded, Sender};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// A [`Coordinator`] inside one process, built on `parking_lot` and
/// crossbeam.
///
/// **Handles.** `MemoryCoordinator::new()` creates a hub; [`Clone`] gives
/// another, independent handle onto the same hub — like a second process
/// connected to the same server. Handles see each other's messages, streams
/// and keys. [`close`](Coordinator::close) (and dropping a handle) closes
/// only that handle and ends only the feeds it opened; the hub lives while
/// any handle does.
///
/// **Delivery never blocks the sender.** Every feed is an unbounded channel,
/// filled while the hub's lock is held (which is what orders each topic,
/// stream and bucket). A feed that is not drained keeps every item queued:
/// memory grows by the size of what is sent until it is read or dropped.
/// Dropped feeds are removed at once by their drop hook, and any channel
/// found disconnected is removed on the next send.
///
/// **Streams** number entries 1, 2, 3… per stream and keep all of them, or
/// only the newest `n` with [`with_stream_max_len`](Self::with_stream_max_len).
pub struct MemoryCoordinator {
    hub: Arc<Hub>,
    id: u64,
    // Written only with the hub lock held, so a call that checked it under
    // the lock cannot register a feed that `close` then misses.
    closed: AtomicBool,
}

struct Hub {
    state: Mutex<State>,
    next_id: AtomicU64,
    stream_max_len: Option<usize>,
}

#[derive(Default)]
struct State {
    topics: HashMap<String, Vec<Reg<Message>>>,
    streams: HashMap<String, Stream>,
    buckets: HashMap<String, Bucket>,
}

/// A registered feed: `id` for its drop hook, `owner` for `close`.
struct Reg<T> {
    id: u64,
    owner: u64,
    tx: Sender<T>,
}

#[derive(Default)]
struct Stream {
    head: u64,
    entries: VecDeque<StreamEntry>,
    readers: Vec<Reg<StreamEntry>>,
}

#[derive(Default)]
struct Bucket {
    entries: BTreeMap<String, Vec<u8>>,
    watchers: Vec<(Reg<KvEvent>, String)>,
}

/// Where a feed is registered, for its drop hook.
enum Place {
    Topic(String),
    Stream(String),
    Bucket(String),
}

impl MemoryCoordinator {
    /// A new, empty hub whose streams keep every entry.
    pub fn new() -> Self {
        Self::with_hub(None)
    }

    /// A new, empty hub whose streams keep only their newest `max_len`
    /// entries (at least 1). Readers asking for a trimmed position start at
    /// the oldest retained entry.
    pub fn with_stream_max_len(max_len: usize) -> Self {
        Self::with_hub(Some(max_len.max(1)))
    }

    fn with_hub(stream_max_len: Option<usize>) -> Self {
        let hub = Hub {
            state: Mutex::new(State::default()),
            next_id: AtomicU64::new(1),
            stream_max_len,
        };
        Self::handle(Arc::new(hub))
    }

    fn handle(hub: Arc<Hub>) -> Self {
        let id = hub.next_id.fetch_add(1, Ordering::Relaxed);
        MemoryCoordinator {
            hub,
            id,
            closed: AtomicBool::new(false),
        }
    }

    /// Fails fast without the lock; callers check again under it.
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Locks the hub, failing if this handle is closed.
    fn lock(&self) -> Result<parking_lot::MutexGuard<'_, State>> {
        let state = self.hub.state.lock();
        self.check_open()?;
        Ok(state)
    }

    fn new_reg<T>(&self, tx: Sender<T>) -> Reg<T> {
        Reg {
            id: self.hub.next_id.fetch_add(1, Ordering::Relaxed),
            owner: self.id,
            tx,
        }
    }

    fn feed<T>(&self, rx: crossbeam_channel::Receiver<T>, id: u64, place: Place) -> Feed<T> {
        let hub = Arc::downgrade(&self.hub);
        Feed::new(rx, move || unregister(&hub, id, place))
    }

    /// Ends every feed this handle opened (their senders are dropped).
    fn close_feeds(&self, state: &mut State) {
        let me = self.id;
        state.topics.retain(|_, subs| {
            subs.retain(|r| r.owner != me);
            !subs.is_empty()
        });
        for stream in state.streams.values_mut() {
            stream.readers.retain(|r| r.owner != me);
        }
        state.buckets.retain(|_, b| {
            b.watchers.retain(|(r, _)| r.owner != me);
            !(b.entries.is_empty() && b.watchers.is_empty())
        });
    }
}

fn unregister(hub: &Weak<Hub>, id: u64, place: Place) {
    let Some(hub) = hub.upgrade() else { return };
    let mut state = hub.state.lock();
    match place {
        Place::Topic(topic) => {
            if let Some(subs) = state.topics.get_mut(&topic) {
                subs.retain(|r| r.id != id);
                if subs.is_empty() {
                    state.topics.remove(&topic);
                }
            }
        }
        Place::Stream(name) => {
            if let Some(stream) = state.streams.get_mut(&name) {
                stream.readers.retain(|r| r.id != id);
            }
        }
        Place::Bucket(name) => {
            if let Some(bucket) = state.buckets.get_mut(&name) {
                bucket.watchers.retain(|(r, _)| r.id != id);
                if bucket.entries.is_empty() && bucket.watchers.is_empty() {
                    state.buckets.remove(&name);
                }
            }
        }
    }
}

impl Default for MemoryCoordinator {
    fn default() -> Self {
        Self::new()
    }
}

impl Clone for MemoryCoordinator {
    /// Another open handle onto the same hub, closed independently.
    fn clone(&self) -> Self {
        Self::handle(self.hub.clone())
    }
}

impl Drop for MemoryCoordinator {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl std::fmt::Debug for MemoryCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryCoordinator")
            .field("handle", &self.id)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

impl Coordinator for MemoryCoordinator {
    fn publish(&self, topic: &str, payload: &[u8]) -> Result<()> {
        self.check_open()?;
        check_name("topic", topic)?;
        check_payload("payload", payload)?;
        let mut state = self.lock()?;
        if let Some(subs) = state.topics.get_mut(topic) {
            let msg = Message {
                topic: topic.to_owned(),
                payload: payload.to_vec(),
            };
            subs.retain(|r| r.tx.send(msg.clone()).is_ok());
            if subs.is_empty() {
                state.topics.remove(topic);
            }
        }
        Ok(())
    }

    fn subscribe(&self, topic: &str) -> Result<Subscription> {
        self.check_open()?;
        check_name("topic", topic)?;
        let (tx, rx) = unbounded();
        let reg = self.new_reg(tx);
        let id = reg.id;
        self.lock()?
            .topics
            .entry(topic.to_owned())
            .or_default()
            .push(reg);
        Ok(self.feed(rx, id, Place::Topic(topic.to_owned())))
    }

    fn append_stream(&self, stream: &str, payload: &[u8]) -> Result<StreamId> {
        self.check_open()?;
        check_name("stream", stream)?;
        check_payload("payload", payload)?;
        let mut state = self.lock()?;
        let s = state.streams.entry(stream.to_owned()).or_default();
        s.head += 1;
        let entry = StreamEntry {
            id: StreamId(s.head),
            payload: payload.to_vec(),
        };
        s.readers.retain(|r| r.tx.send(entry.clone()).is_ok());
        s.entries.push_back(entry);
        if let Some(max) = self.hub.stream_max_len {
            while s.entries.len() > max {
                s.entries.pop_front();
            }
        }
        Ok(StreamId(s.head))
    }

    fn read_stream(&self, stream: &str, from: StreamPosition) -> Result<StreamReader> {
        self.check_open()?;
        check_name("stream", stream)?;
        let (tx, rx) = unbounded();
        let reg = self.new_reg(tx);
        let id = reg.id;
        let mut state = self.lock()?;
        let s = state.streams.entry(stream.to_owned()).or_default();
        // Replay and registration happen under one lock: no gap, no repeat.
        let after = match from {
            StreamPosition::Start => Some(0),
            StreamPosition::End => None,
            StreamPosition::After(StreamId(n)) => Some(n),
        };
        if let Some(after) = after {
            for entry in s.entries.iter().filter(|e| e.id.0 > after) {
                // The receiver is still in hand, so this cannot fail.
                let _ = reg.tx.send(entry.clone());
            }
        }
        s.readers.push(reg);
        drop(state);
        Ok(self.feed(rx, id, Place::Stream(stream.to_owned())))
    }

    fn kv_set(&self, bucket: &str, key: &str, value: &[u8]) -> Result<()> {
        self.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        check_payload("value", value)?;
        let mut state = self.lock()?;
        let b = state.buckets.entry(bucket.to_owned()).or_default();
        b.entries.insert(key.to_owned(), value.to_vec());
        b.watchers.retain(|(r, pat)| {
            !pattern::matches(pat, key)
                || r.tx
                    .send(KvEvent::Put {
                        key: key.to_owned(),
                        value: value.to_vec(),
                    })
                    .is_ok()
        });
        Ok(())
    }

    fn kv_get(&self, bucket: &str, key: &str) -> Result<Vec<u8>> {
        self.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        let state = self.lock()?;
        state
            .buckets
            .get(bucket)
            .and_then(|b| b.entries.get(key))
            .cloned()
            .ok_or(Error::NotFound)
    }

    fn kv_delete(&self, bucket: &str, key: &str) -> Result<()> {
        self.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        let mut state = self.lock()?;
        let Some(b) = state.buckets.get_mut(bucket) else {
            return Ok(());
        };
        if b.entries.remove(key).is_some() {
            b.watchers.retain(|(r, pat)| {
                !pattern::matches(pat, key)
                    || r.tx
                        .send(KvEvent::Deleted {
                            key: key.to_owned(),
                        })
                        .is_ok()
            });
        }
        if b.entries.is_empty() && b.watchers.is_empty() {
            state.buckets.remove(bucket);
        }
        Ok(())
    }

    fn kv_watch(&self, bucket: &str, pat: &str) -> Result<KvWatcher> {
        self.check_open()?;
        check_name("bucket", bucket)?;
        pattern::validate(pat)?;
        let (tx, rx) = unbounded();
        let reg = self.new_reg(tx);
        let id = reg.id;
        let mut state = self.lock()?;
        let b = state.buckets.entry(bucket.to_owned()).or_default();
        // The receiver is still in hand, so these sends cannot fail.
        for (key, value) in b.entries.iter().filter(|(k, _)| pattern::matches(pat, k)) {
            let _ = reg.tx.send(KvEvent::Put {
                key: key.clone(),
                value: value.clone(),
            });
        }
        let _ = reg.tx.send(KvEvent::Synced);
        b.watchers.push((reg, pat.to_owned()));
        drop(state);
        Ok(self.feed(rx, id, Place::Bucket(bucket.to_owned())))
    }

    fn ping(&self) -> Result<()> {
        self.check_open()
    }

    fn close(&self) -> Result<()> {
        let mut state = self.hub.state.lock();
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.close_feeds(&mut state);
        }
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            delivers: true,
            stream_max_len: self.hub.stream_max_len.map(|n| n as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const T: Duration = Duration::from_secs(1);

    fn counts(c: &MemoryCoordinator) -> (usize, usize, usize) {
        let s = c.hub.state.lock();
        (
            s.topics.values().map(Vec::len).sum(),
            s.streams.values().map(|s| s.readers.len()).sum(),
            s.buckets.values().map(|b| b.watchers.len()).sum(),
        )
    }

    #[test]
    fn dropped_feeds_are_unregistered() {
        let c = MemoryCoordinator::new();
        let sub = c.subscribe("t").unwrap();
        let reader = c.read_stream("s", StreamPosition::End).unwrap();
        let watch = c.kv_watch("b", "*").unwrap();
        assert_eq!(counts(&c), (1, 1, 1));
        drop((sub, reader, watch));
        assert_eq!(counts(&c), (0, 0, 0));
        assert!(c.hub.state.lock().topics.is_empty());
        assert!(c.hub.state.lock().buckets.is_empty());
    }

    #[test]
    fn close_ends_only_own_feeds() {
        let a = MemoryCoordinator::new();
        let b = a.clone();
        let sa = a.subscribe("t").unwrap();
        let sb = b.subscribe("t").unwrap();
        a.close().unwrap();
        assert!(matches!(
            sa.recv_timeout(T),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        ));
        assert!(matches!(a.publish("t", b"x"), Err(Error::Closed)));
        b.publish("t", b"x").unwrap();
        assert_eq!(sb.recv_timeout(T).unwrap().payload, b"x");
        assert_eq!(counts(&b), (1, 0, 0));
    }

    #[test]
    fn dropping_the_last_handle_ends_feeds() {
        let c = MemoryCoordinator::new();
        let sub = c.subscribe("t").unwrap();
        drop(c);
        assert!(sub.recv_timeout(T).is_err());
    }

    #[test]
    fn trimming_keeps_newest() {
        let c = MemoryCoordinator::with_stream_max_len(3);
        for i in 0..10u8 {
            c.append_stream("s", &[i]).unwrap();
        }
        let r = c
            .read_stream("s", StreamPosition::After(StreamId(2)))
            .unwrap();
        let ids: Vec<u64> = (0..3).map(|_| r.recv_timeout(T).unwrap().id.0).collect();
        assert_eq!(ids, [8, 9, 10]);
        assert!(r.try_recv().is_err());
    }

    #[test]
    fn after_beyond_head_starts_with_next_append() {
        let c = MemoryCoordinator::new();
        c.append_stream("s", b"1").unwrap();
        let r = c
            .read_stream("s", StreamPosition::After(StreamId(100)))
            .unwrap();
        assert_eq!(c.append_stream("s", b"2").unwrap(), StreamId(2));
        assert_eq!(r.recv_timeout(T).unwrap().id, StreamId(2));
    }
}
