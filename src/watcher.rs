//! [`HostWatcher`]: the fleet's hosts as a stream of Up/Updated/Down events.

use crate::driver::rand_seed;
use crate::error::{Error, Result};
use crate::etcd::{assert_not_async, Etcd};
use crate::liveness::DEFAULT_HOSTS_PREFIX;
use crate::validate;
use fleetcoord_sm::watch::{KeyRule, Watch, WatchConfig, WatchInput, WatchNotice};
use fleetcoord_sm::{BackoffConfig, KeyRange, KeyValue, RangeRequest, Request, Response};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use uuid::Uuid;

/// What is known about one host: its id and its key's current (or, in a
/// `Down`, last-seen) state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostInfo {
    /// The host id (the last segment of its key).
    pub id: Uuid,
    /// The metadata the host registered with, as bytes.
    pub metadata: Vec<u8>,
    /// The lease the key is bound to.
    pub lease: i64,
    /// Revision at which this registration was created. A host that
    /// re-registers (new lease) gets a new one.
    pub create_revision: i64,
    /// Revision of the last metadata change.
    pub mod_revision: i64,
}

/// A change in the set of live hosts.
///
/// Deliberately exhaustive (not `#[non_exhaustive]`): up, updated, down and
/// the sync marker are everything a consumer needs to mirror the fleet, so a
/// new variant would change what correct handling is and should break the
/// build rather than fall into a wildcard arm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostEvent {
    /// The host registered (or, before `Synced`, was already registered).
    Up(HostInfo),
    /// The host changed its metadata.
    Updated(HostInfo),
    /// The host's key is gone: it closed, its lease expired, or it was
    /// deleted. Carries the last-seen metadata.
    Down(HostInfo),
    /// Every host that existed when the watcher started has been reported;
    /// sent exactly once, after the replayed `Up`s.
    Synced,
}

/// Settings for [`HostWatcher::watch_with`].
///
/// Start from [`WatcherOptions::default`] and change what you need with the
/// `with_*` methods; the fields are public for reading. `#[non_exhaustive]`
/// so that new settings are not a breaking change.
///
/// ```
/// use fleetcoord::WatcherOptions;
///
/// let options = WatcherOptions::default().with_prefix("/myapp/hosts/").with_capacity(256);
/// assert_eq!(options.capacity, 256);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WatcherOptions {
    /// Key prefix hosts register under. Default [`DEFAULT_HOSTS_PREFIX`].
    pub prefix: String,
    /// Soft capacity of the event channel; see [`HostWatcher`]. Default 4,096.
    pub capacity: usize,
}

impl Default for WatcherOptions {
    fn default() -> Self {
        WatcherOptions {
            prefix: DEFAULT_HOSTS_PREFIX.into(),
            capacity: 4096,
        }
    }
}

impl WatcherOptions {
    /// These options with [`WatcherOptions::prefix`] set (checked by
    /// [`HostWatcher::watch_with`]).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// These options with [`WatcherOptions::capacity`] set (checked by
    /// [`HostWatcher::watch_with`]).
    #[must_use]
    pub const fn with_capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }
}

/// Streams the fleet's hosts as [`HostEvent`]s on a crossbeam receiver.
///
/// A new watcher first replays every registered host as `Up`, then sends
/// `Synced`, then live changes. After a dropped connection or a compaction
/// it re-reads the prefix and reports the difference (`Down` for hosts that
/// vanished meanwhile, `Up` for new ones, `Down` + `Up` for hosts that
/// re-registered, `Updated` for changed metadata): no change is lost, none is
/// invented, and no `Down` comes without an earlier `Up`.
///
/// Slow consumers: the driver never blocks on you. When more than
/// `capacity` events are waiting unread, the watcher pauses its etcd watch;
/// once you have read half of them it re-reads the prefix and sends the
/// difference. Memory is therefore bounded by `capacity` plus one diff (at
/// most two events per host), and no change is dropped — intermediate
/// states of a host may be coalesced, its final state never is.
///
/// Keys under the prefix that are not host ids are logged once and skipped.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::{Etcd, EtcdOptions, HostEvent, HostLiveness, HostWatcher};
/// use std::time::Duration;
///
/// let etcd = Etcd::connect(&[server.endpoint()], EtcdOptions::default())?;
/// let watcher = HostWatcher::watch(&etcd)?;
/// assert_eq!(watcher.events().recv_timeout(Duration::from_secs(5))?, HostEvent::Synced);
/// let id = uuid::Uuid::new_v4();
/// let host = HostLiveness::register(&etcd, id, b"meta", Duration::from_secs(5))?;
/// match watcher.events().recv_timeout(Duration::from_secs(5))? {
///     HostEvent::Up(info) => assert_eq!((info.id, info.metadata.as_slice()), (id, &b"meta"[..])),
///     other => panic!("expected Up, got {other:?}"),
/// }
/// host.close()?;
/// assert!(matches!(watcher.events().recv_timeout(Duration::from_secs(5))?, HostEvent::Down(_)));
/// # Ok(()) }
/// ```
#[must_use = "dropping a HostWatcher stops the watch"]
pub struct HostWatcher {
    events: crossbeam_channel::Receiver<HostEvent>,
    input: mpsc::UnboundedSender<WatchInput>,
    _etcd: Etcd,
}

impl std::fmt::Debug for HostWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostWatcher")
            .field("pending", &self.events.len())
            .finish()
    }
}

pub(crate) fn host_info(prefix_len: usize, kv: &KeyValue) -> Option<HostInfo> {
    let id = std::str::from_utf8(kv.key.get(prefix_len..)?).ok()?;
    Some(HostInfo {
        id: Uuid::parse_str(id).ok()?,
        metadata: kv.value.clone(),
        lease: kv.lease,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
    })
}

impl HostWatcher {
    /// Watch the default hosts prefix.
    pub fn watch(etcd: &Etcd) -> Result<HostWatcher> {
        Self::watch_with(etcd, WatcherOptions::default())
    }

    /// Watch with explicit settings.
    pub fn watch_with(etcd: &Etcd, options: WatcherOptions) -> Result<HostWatcher> {
        assert_not_async();
        validate::prefix("prefix", &options.prefix)?;
        if options.capacity < 2 {
            return Err(Error::invalid("capacity", "must be at least 2"));
        }
        let prefix_len = options.prefix.len();
        let config = WatchConfig {
            prefix: options.prefix.into_bytes(),
            keys: KeyRule::HostId,
            backoff: BackoffConfig::default(),
        };
        let machine = Watch::new(config, Instant::now(), rand_seed());
        let (tx, events) = crossbeam_channel::unbounded();
        let (input_tx, input_rx) = mpsc::unbounded_channel();
        let paused = Arc::new(AtomicBool::new(false));
        let capacity = options.capacity;
        let notify = {
            let tx = tx.clone();
            let input_tx = input_tx.clone();
            let paused = paused.clone();
            move |notice: WatchNotice| {
                let event = match notice {
                    WatchNotice::Up(kv) => host_info(prefix_len, &kv).map(HostEvent::Up),
                    WatchNotice::Updated(kv) => host_info(prefix_len, &kv).map(HostEvent::Updated),
                    WatchNotice::Down(kv) => host_info(prefix_len, &kv).map(HostEvent::Down),
                    WatchNotice::Synced => Some(HostEvent::Synced),
                    WatchNotice::InvalidKey(key) => {
                        log::warn!(
                            "ignoring key {:?} under the hosts prefix: not a host id",
                            String::from_utf8_lossy(&key)
                        );
                        None
                    }
                    _ => None,
                };
                let Some(event) = event else { return true };
                if tx.send(event).is_err() {
                    return false;
                }
                if tx.len() >= capacity && !paused.swap(true, Ordering::SeqCst) {
                    let _ = input_tx.send(WatchInput::ConsumerFull);
                    // This runs on the driver runtime; the poller lives only
                    // while the watch is paused.
                    tokio::spawn(resume_when_drained(
                        tx.clone(),
                        input_tx.clone(),
                        paused.clone(),
                        capacity / 2,
                    ));
                }
                true
            }
        };
        etcd.run_machine_with(machine, input_rx, notify)?;
        Ok(HostWatcher {
            events,
            input: input_tx,
            _etcd: etcd.clone(),
        })
    }

    /// The events, in order.
    pub fn events(&self) -> &crossbeam_channel::Receiver<HostEvent> {
        &self.events
    }

    /// Stop watching. Events already queued stay readable until the watcher
    /// is dropped.
    pub fn close(self) {}
}

impl Drop for HostWatcher {
    fn drop(&mut self) {
        let _ = self.input.send(WatchInput::Stop);
    }
}

/// While a watch is paused for a slow consumer, check every 50 ms whether
/// the consumer has read its queue down to `low_water`, then resume it.
async fn resume_when_drained(
    tx: crossbeam_channel::Sender<HostEvent>,
    input: mpsc::UnboundedSender<WatchInput>,
    paused: Arc<AtomicBool>,
    low_water: usize,
) {
    while !input.is_closed() {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if tx.len() <= low_water {
            paused.store(false, Ordering::SeqCst);
            let _ = input.send(WatchInput::ConsumerReady);
            return;
        }
    }
}

/// List the hosts registered under `prefix` right now (one linearizable read).
pub fn list_hosts(etcd: &Etcd, prefix: &str) -> Result<Vec<HostInfo>> {
    validate::prefix("prefix", prefix)?;
    let response = etcd.request(Request::Range(RangeRequest::all(KeyRange::Prefix(
        prefix.as_bytes().to_vec(),
    ))))?;
    match response {
        Response::Range { kvs, .. } => Ok(kvs
            .iter()
            .filter_map(|kv| host_info(prefix.len(), kv))
            .collect()),
        other => Err(Error::Etcd(format!(
            "unexpected answer to a range: {other:?}"
        ))),
    }
}
