//! The etcd backend: pub/sub, streams and KV on keys under one root, watched
//! with the same sm `Watch` machine that powers [`crate::HostWatcher`].

use super::{
    check_key, check_name, check_payload, pattern, Capabilities, Coordinator, Feed, KvEvent,
    KvWatcher, Message, StreamEntry, StreamId, StreamPosition, StreamReader, Subscription,
};
use crate::driver::rand_seed;
use crate::error::{Error, Result};
use crate::etcd::{Etcd, EtcdOptions};
use crate::validate;
use fleetcoord_sm::watch::{KeyRule, Watch, WatchConfig, WatchInput, WatchNotice};
use fleetcoord_sm::{
    BackoffConfig, Compare, KeyRange, KeyValue, RangeRequest, Request, Response, Txn, TxnOp,
};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Settings of an [`EtcdCoordinator`].
///
/// Start from [`EtcdCoordinatorOptions::default`] and change what you need
/// with the `with_*` methods; the fields are public for reading.
/// `#[non_exhaustive]` so that new settings are not a breaking change.
///
/// ```
/// use fleetcoord::coordinator::EtcdCoordinatorOptions;
///
/// let options = EtcdCoordinatorOptions::default().with_root("/myapp").with_stream_max_len(1000);
/// assert_eq!(options.stream_max_len, Some(1000));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EtcdCoordinatorOptions {
    /// Every key lives under this root (`<root>/kv/…`, `<root>/topic/…`,
    /// `<root>/stream/…`). Starts with `/`, no trailing `/`. Default `/coord`.
    pub root: String,
    /// Keep only the newest `n` entries of each stream (each append deletes
    /// the entry that falls out). `None` keeps everything. Default `None`.
    pub stream_max_len: Option<u64>,
}

impl Default for EtcdCoordinatorOptions {
    fn default() -> Self {
        EtcdCoordinatorOptions {
            root: "/coord".into(),
            stream_max_len: None,
        }
    }
}

impl EtcdCoordinatorOptions {
    /// These options with [`EtcdCoordinatorOptions::root`] set (checked by
    /// [`EtcdCoordinator::with_options`]).
    #[must_use]
    pub fn with_root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// These options keeping only the newest `max_len` entries of each
    /// stream (at least 1, checked by [`EtcdCoordinator::with_options`]).
    #[must_use]
    pub const fn with_stream_max_len(mut self, max_len: u64) -> Self {
        self.stream_max_len = Some(max_len);
        self
    }
}

/// A [`Coordinator`] on etcd.
///
/// Layout under the root: KV keys at `<root>/kv/<bucket>/<key>`; one key per
/// topic at `<root>/topic/<topic>`, overwritten by each publish; streams as
/// `<root>/stream/<name>/head` (the last sequence number) plus entries at
/// `<root>/stream/<name>/e/<sequence, 20 digits>`.
///
/// Semantics beyond the trait's:
/// * **pub/sub** is live-only and ordered per topic. A subscription is
///   live when `subscribe` returns. Delivery is at-most-once across
///   connection failures: after a reconnect the subscriber resumes with the
///   topic's latest message if it changed meanwhile, and messages published
///   in between are not replayed.
/// * **streams**: IDs are sequence numbers, assigned by a transaction guarded
///   on the head key (retried on conflict), so concurrent appenders from any
///   number of processes get unique, increasing IDs. Readers deliver each
///   entry exactly once, in order, across reconnects and compactions.
/// * **KV watches** resync after reconnects and compaction by re-reading the
///   bucket and reporting the difference; no change is lost, intermediate
///   values of a key may be coalesced.
/// * Feeds are unbounded channels: a feed that is not read grows in memory.
pub struct EtcdCoordinator {
    etcd: Etcd,
    root: String,
    stream_max_len: Option<u64>,
    closed: AtomicBool,
    feeds: Mutex<Vec<mpsc::UnboundedSender<WatchInput>>>,
}

impl std::fmt::Debug for EtcdCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCoordinator")
            .field("root", &self.root)
            .finish()
    }
}

/// How long `subscribe`, `read_stream` and `kv_watch` wait for their
/// initial snapshot before failing.
const FEED_START_TIMEOUT: Duration = Duration::from_secs(10);

/// Appends retry this often on a conflicting concurrent append before
/// giving up (each retry is one round trip; contention this long means
/// something is wrong).
const APPEND_ATTEMPTS: u32 = 1000;

impl EtcdCoordinator {
    /// A coordinator on `etcd` with default options.
    pub fn new(etcd: &Etcd) -> Result<EtcdCoordinator> {
        Self::with_options(etcd, EtcdCoordinatorOptions::default())
    }

    /// A coordinator on `etcd` with explicit options.
    pub fn with_options(etcd: &Etcd, options: EtcdCoordinatorOptions) -> Result<EtcdCoordinator> {
        let root = options.root;
        if !root.starts_with('/') || root.ends_with('/') || root.len() < 2 {
            return Err(Error::invalid(
                "root",
                format!("{root:?} must start with '/' and not end with '/'"),
            ));
        }
        validate::key("root", &root)?;
        if options.stream_max_len == Some(0) {
            return Err(Error::invalid("stream_max_len", "must be at least 1"));
        }
        Ok(EtcdCoordinator {
            etcd: etcd.clone(),
            root,
            stream_max_len: options.stream_max_len,
            closed: AtomicBool::new(false),
            feeds: Mutex::new(Vec::new()),
        })
    }

    /// Connect to comma-separated `endpoints` and build a coordinator with
    /// default options.
    pub fn connect(endpoints: &str) -> Result<EtcdCoordinator> {
        let list: Vec<&str> = endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .collect();
        let etcd = Etcd::connect(&list, EtcdOptions::default())?;
        Self::new(&etcd)
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    fn kv_key(&self, bucket: &str, key: &str) -> Vec<u8> {
        format!("{}/kv/{bucket}/{key}", self.root).into_bytes()
    }

    fn topic_key(&self, topic: &str) -> Vec<u8> {
        format!("{}/topic/{topic}", self.root).into_bytes()
    }

    fn stream_head(&self, stream: &str) -> Vec<u8> {
        format!("{}/stream/{stream}/head", self.root).into_bytes()
    }

    fn stream_entries(&self, stream: &str) -> Vec<u8> {
        format!("{}/stream/{stream}/e/", self.root).into_bytes()
    }

    /// Start a Watch machine on `prefix`; `on_notice(notice, synced)` turns
    /// its notices into feed items (returning `false` once the feed is
    /// gone). Returns after the initial snapshot was delivered, so the feed
    /// is live: anything written later has a higher revision and will come.
    fn start_feed<T: Send + 'static>(
        &self,
        prefix: Vec<u8>,
        mut on_notice: impl FnMut(WatchNotice, bool, &crossbeam_channel::Sender<T>) -> bool
            + Send
            + 'static,
    ) -> Result<Feed<T>> {
        let mut feeds = self.feeds.lock();
        self.check_open()?;
        let config = WatchConfig {
            prefix,
            keys: KeyRule::Any,
            backoff: BackoffConfig::default(),
        };
        let machine = Watch::new(config, Instant::now(), rand_seed());
        let (tx, rx) = crossbeam_channel::unbounded();
        let (synced_tx, synced_rx) = crossbeam_channel::bounded::<()>(1);
        let mut synced = false;
        let input = self.etcd.run_machine(machine, move |notice| {
            if notice == WatchNotice::Synced {
                synced = true;
                let _ = synced_tx.try_send(());
            }
            on_notice(notice, synced, &tx)
        })?;
        feeds.retain(|f| !f.is_closed());
        feeds.push(input.clone());
        drop(feeds);
        let stop = input.clone();
        let feed = Feed::new(rx, move || {
            let _ = stop.send(WatchInput::Stop);
        });
        match synced_rx.recv_timeout(FEED_START_TIMEOUT) {
            Ok(()) => Ok(feed),
            Err(_) => {
                let _ = input.send(WatchInput::Stop);
                Err(Error::Timeout(FEED_START_TIMEOUT))
            }
        }
    }

    fn read_head(&self, head: &[u8]) -> Result<(u64, i64)> {
        match self
            .etcd
            .request(Request::Range(RangeRequest::all(KeyRange::Key(
                head.to_vec(),
            ))))? {
            Response::Range { kvs, .. } => match kvs.first() {
                None => Ok((0, 0)),
                Some(kv) => Ok((parse_seq(&kv.value)?, kv.mod_revision)),
            },
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(response: &Response) -> Error {
    Error::Etcd(format!("unexpected answer from etcd: {response:?}"))
}

fn parse_seq(bytes: &[u8]) -> Result<u64> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            Error::Etcd(format!(
                "stream head holds {:?}, not a sequence number",
                String::from_utf8_lossy(bytes)
            ))
        })
}

fn entry_key(prefix: &[u8], seq: u64) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(format!("{seq:020}").as_bytes());
    key
}

fn entry_seq(prefix_len: usize, kv: &KeyValue) -> Option<u64> {
    std::str::from_utf8(kv.key.get(prefix_len..)?)
        .ok()?
        .parse()
        .ok()
}

impl Coordinator for EtcdCoordinator {
    fn publish(&self, topic: &str, payload: &[u8]) -> Result<()> {
        self.check_open()?;
        check_name("topic", topic)?;
        check_payload("payload", payload)?;
        self.etcd.request(Request::Put {
            key: self.topic_key(topic),
            value: payload.to_vec(),
            lease: 0,
        })?;
        Ok(())
    }

    fn subscribe(&self, topic: &str) -> Result<Subscription> {
        self.check_open()?;
        check_name("topic", topic)?;
        let key = self.topic_key(topic);
        let topic = topic.to_string();
        // Watching the key as a prefix also matches longer topic names; keep
        // the exact key only.
        self.start_feed(key.clone(), move |notice, synced, tx| match notice {
            WatchNotice::Up(kv) | WatchNotice::Updated(kv) if synced && kv.key == key => tx
                .send(Message {
                    topic: topic.clone(),
                    payload: kv.value,
                })
                .is_ok(),
            _ => true,
        })
    }

    fn append_stream(&self, stream: &str, payload: &[u8]) -> Result<StreamId> {
        self.check_open()?;
        check_name("stream", stream)?;
        check_payload("payload", payload)?;
        let head = self.stream_head(stream);
        let entries = self.stream_entries(stream);
        for attempt in 0..APPEND_ATTEMPTS {
            let (seq, head_rev) = self.read_head(&head)?;
            let next = seq + 1;
            let mut success = vec![
                TxnOp::Put {
                    key: head.clone(),
                    value: next.to_string().into_bytes(),
                    lease: 0,
                },
                TxnOp::Put {
                    key: entry_key(&entries, next),
                    value: payload.to_vec(),
                    lease: 0,
                },
            ];
            if let Some(max) = self.stream_max_len {
                if next > max {
                    success.push(TxnOp::Delete(KeyRange::Key(entry_key(
                        &entries,
                        next - max,
                    ))));
                }
            }
            let txn = Txn {
                compare: vec![Compare::ModRevisionEquals {
                    key: head.clone(),
                    revision: head_rev,
                }],
                success,
                failure: vec![],
            };
            match self.etcd.request(Request::Txn(txn))? {
                Response::Txn {
                    succeeded: true, ..
                } => return Ok(StreamId(next)),
                Response::Txn {
                    succeeded: false, ..
                } => {
                    // Another appender won this sequence number; back off a
                    // little (growing with contention) and read the head again.
                    std::thread::sleep(Duration::from_micros(50 * u64::from(attempt.min(40))));
                }
                other => return Err(unexpected(&other)),
            }
        }
        Err(Error::Etcd(format!(
            "append to {stream:?} lost {APPEND_ATTEMPTS} races in a row"
        )))
    }

    fn read_stream(&self, stream: &str, from: StreamPosition) -> Result<StreamReader> {
        self.check_open()?;
        check_name("stream", stream)?;
        let prefix = self.stream_entries(stream);
        let prefix_len = prefix.len();
        // Entries at or below `last` are never delivered again: this makes
        // delivery exactly-once across the resyncs the watch does.
        let mut last = match from {
            StreamPosition::Start => 0,
            // Beyond the head: start with the next append, as if at the end.
            StreamPosition::After(id) => id.0.min(self.read_head(&self.stream_head(stream))?.0),
            StreamPosition::End => self.read_head(&self.stream_head(stream))?.0,
        };
        self.start_feed(prefix, move |notice, _synced, tx| match notice {
            WatchNotice::Up(kv) | WatchNotice::Updated(kv) => match entry_seq(prefix_len, &kv) {
                Some(seq) if seq > last => {
                    last = seq;
                    tx.send(StreamEntry {
                        id: StreamId(seq),
                        payload: kv.value,
                    })
                    .is_ok()
                }
                _ => true,
            },
            _ => true,
        })
    }

    fn kv_set(&self, bucket: &str, key: &str, value: &[u8]) -> Result<()> {
        self.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        check_payload("value", value)?;
        self.etcd.request(Request::Put {
            key: self.kv_key(bucket, key),
            value: value.to_vec(),
            lease: 0,
        })?;
        Ok(())
    }

    fn kv_get(&self, bucket: &str, key: &str) -> Result<Vec<u8>> {
        self.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        match self
            .etcd
            .request(Request::Range(RangeRequest::all(KeyRange::Key(
                self.kv_key(bucket, key),
            ))))? {
            Response::Range { mut kvs, .. } => match kvs.pop() {
                Some(kv) => Ok(kv.value),
                None => Err(Error::NotFound),
            },
            other => Err(unexpected(&other)),
        }
    }

    fn kv_delete(&self, bucket: &str, key: &str) -> Result<()> {
        self.check_open()?;
        check_name("bucket", bucket)?;
        check_key(key)?;
        self.etcd
            .request(Request::Delete(KeyRange::Key(self.kv_key(bucket, key))))?;
        Ok(())
    }

    fn kv_watch(&self, bucket: &str, pattern: &str) -> Result<KvWatcher> {
        self.check_open()?;
        check_name("bucket", bucket)?;
        pattern::validate(pattern)?;
        let prefix = format!("{}/kv/{bucket}/", self.root).into_bytes();
        let prefix_len = prefix.len();
        let pattern = pattern.to_string();
        self.start_feed(prefix, move |notice, _synced, tx| {
            let (kv, deleted) = match notice {
                WatchNotice::Synced => return tx.send(KvEvent::Synced).is_ok(),
                WatchNotice::Up(kv) | WatchNotice::Updated(kv) => (kv, false),
                WatchNotice::Down(kv) => (kv, true),
                _ => return true,
            };
            let Some(key) = kv
                .key
                .get(prefix_len..)
                .and_then(|k| std::str::from_utf8(k).ok())
            else {
                return true;
            };
            if !pattern::matches(&pattern, key) {
                return true;
            }
            let event = if deleted {
                KvEvent::Deleted {
                    key: key.to_string(),
                }
            } else {
                KvEvent::Put {
                    key: key.to_string(),
                    value: kv.value,
                }
            };
            tx.send(event).is_ok()
        })
    }

    fn ping(&self) -> Result<()> {
        self.check_open()?;
        let probe = RangeRequest {
            limit: 1,
            ..RangeRequest::all(KeyRange::Key(self.root.clone().into_bytes()))
        };
        match self.etcd.request(Request::Range(probe))? {
            Response::Range { .. } => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    fn close(&self) -> Result<()> {
        let feeds = {
            let mut feeds = self.feeds.lock();
            self.closed.store(true, Ordering::SeqCst);
            std::mem::take(&mut *feeds)
        };
        for feed in feeds {
            let _ = feed.send(WatchInput::Stop);
        }
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            stream_max_len: self.stream_max_len,
            ..Capabilities::default()
        }
    }
}

impl Drop for EtcdCoordinator {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
