//! [`HostWatcher`]: the fleet's hosts as a stream of Up/Updated/Down events.

use crate::driver::handle::WaitError;
use crate::driver::{rand_seed, FeedItem, FeedSink, Finished, MachineHandle, Notify};
use crate::error::{Error, Result};
use crate::etcd::Etcd;
use crate::liveness::DEFAULT_HOSTS_PREFIX;
use crate::session::CLOSE_WAIT;
use crate::validate;
use fleetcoord_sm::watch::{
    parse_host_id, KeyRule, Watch, WatchConfig, WatchNotice, DEFAULT_PAGE_SIZE,
};
use fleetcoord_sm::{BackoffConfig, KeyValue, RpcError};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use uuid::Uuid;

/// What is known about one host: its id and its key's current (or, in a
/// `Down`, last-seen) state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostInfo {
    /// The host id (the last segment of its key).
    pub id: Uuid,
    /// The metadata the host registered with, as bytes.
    pub metadata: Vec<u8>,
    /// The lease the key is bound to. It changes, in an
    /// [`HostEvent::Updated`], when the host registers again on a new lease
    /// while its old key still exists (see there).
    pub lease: i64,
    /// Revision at which the host's key was created. It changes only when
    /// the key was deleted and written again — the host went `Down` (lease
    /// expired or revoked) and came `Up` — not when a registration on a new
    /// lease overwrote the key while it still existed: etcd keeps a key's
    /// create revision across puts. To notice a new registration either
    /// way, compare [`HostInfo::lease`].
    pub create_revision: i64,
    /// Revision of the last write to the key (new metadata, or a
    /// registration on a new lease).
    pub mod_revision: i64,
    /// Which process of this host wrote the key
    /// ([`crate::HostLiveness::incarnation`]): 1 for a fresh
    /// [`crate::HostLiveness::register`], one more for each
    /// [`crate::HostLiveness::resume`] (a restart handed over with
    /// `detach`; within the TTL it kept the registration, so no `Down` was
    /// seen), so consumers can count restarts. It comes from `<prefix><host id>/incarnation`,
    /// which `HostLiveness` writes in the same transaction, on the same
    /// lease, as every write of its key when asked to
    /// ([`crate::LivenessOptions::publish_incarnation`], off by default,
    /// so that the prefix holds one key per host); it is 0 when the key's
    /// last write came without one (the host does not publish it, another
    /// client, or an older fleetcoord).
    /// An incarnation key rewritten on its own is not the
    /// host's: a [`HostWatcher`] keeps what came with the host key, while
    /// [`list_hosts`] (which reads both afresh) says 0.
    pub incarnation: u64,
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
    /// The host's key was written again while it existed: new metadata, or
    /// a registration on a new lease before the old one expired (the
    /// self-healing keepalive does this when it gave its lease up locally
    /// but etcd had not expired it yet, e.g. after an etcd restart renewed
    /// every lease; so does a restarted process that reuses its host id
    /// within the TTL). The host never looked absent in etcd, so this is
    /// no `Down` + `Up`: `lease` is the new lease, `create_revision` stays
    /// the same, and the old lease's later expiry removes nothing.
    Updated(HostInfo),
    /// The host's key is gone, and why ([`DownReason`]): it closed, its
    /// lease expired, or it was deleted. Carries the last-seen metadata. A
    /// host that registers again after this comes back `Up` with a new
    /// `create_revision`.
    Down(HostInfo, DownReason),
    /// Every host that existed when the watcher started has been reported;
    /// sent exactly once, after the replayed `Up`s. The replay is read in
    /// pages at one revision; if it is interrupted between pages (etcd
    /// compacted that revision, or you fell behind), it is finished as a
    /// difference against what was already reported, so an `Updated` or
    /// `Down` correcting an earlier `Up` may come before `Synced` — never a
    /// `Down` without an earlier `Up`.
    Synced,
}

/// Why a host went [`HostEvent::Down`]: a graceful leave or a failure.
///
/// How it is told: a closing [`crate::HostLiveness`] first writes a *leave
/// marker*, `<prefix><host id>/left`, on its own lease, then revokes the
/// lease; the revoke deletes host key and marker at one etcd revision. A
/// lease that simply runs out deletes the host key without a marker seen
/// before. The watcher needs no extra request for this: markers come with
/// its watch and snapshot of the prefix, and are never reported as hosts.
///
/// `#[non_exhaustive]`: a finer reason may be added; treat an unknown one
/// like [`DownReason::Expired`], the one that promises nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DownReason {
    /// The host announced its leave: it closed its registration
    /// ([`crate::HostLiveness::close`], dropping the `HostLiveness`,
    /// `fleetcoord agent` on SIGTERM or Ctrl-C): its key was deleted in the
    /// revision that wrote its leave marker (one transaction, on the host's
    /// lease), or together with a marker written before (a revoke, as
    /// fleetcoord versions before the one-transaction leave did it). One
    /// round trip after the close. Planned: no alarm.
    Left,
    /// No leave was seen: the lease expired (the process crashed or was
    /// killed, the host was partitioned from etcd or paused past its TTL),
    /// the close could not reach etcd to write its marker, another client
    /// deleted the key, or the host went away while this watcher was
    /// disconnected and its marker was never seen (a resync can only say
    /// the key is gone). Hosts registered by fleetcoord versions before the
    /// markers always end this way. Treat as a failure.
    Expired,
}

impl DownReason {
    /// `"left"` or `"expired"`: the spelling the CLI and the metrics use.
    pub fn as_str(&self) -> &'static str {
        match self {
            DownReason::Left => "left",
            DownReason::Expired => "expired",
        }
    }
}

impl std::fmt::Display for DownReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Settings for [`HostWatcher::with_options`].
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
    /// How many events the channel holds at most; see [`HostWatcher`].
    /// 2 to 1,048,576. Default 4,096. Memory is taken as events queue up,
    /// not for the whole capacity up front.
    pub capacity: usize,
}

impl Default for WatcherOptions {
    fn default() -> Self {
        WatcherOptions {
            prefix: DEFAULT_HOSTS_PREFIX.into(),
            capacity: crate::validate::DEFAULT_CAPACITY,
        }
    }
}

impl WatcherOptions {
    /// The checks [`HostWatcher::with_options`] (and, of the prefix,
    /// [`list_hosts`]) make before sending anything, without a connection:
    /// `Ok` here means these options will not be refused as
    /// [`crate::Error::InvalidArgument`].
    pub fn check(&self) -> crate::Result<()> {
        validate::prefix("prefix", &self.prefix)?;
        validate::capacity("capacity", self.capacity)
    }

    /// These options with [`WatcherOptions::prefix`] set (checked by
    /// [`HostWatcher::with_options`]).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// These options with [`WatcherOptions::capacity`] set (checked by
    /// [`HostWatcher::with_options`]).
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
/// vanished meanwhile, `Up` for new ones, `Down` + `Up` for hosts whose key
/// was deleted and created again, `Updated` for keys written again — new
/// metadata or a new lease): no change is lost, none is invented, and no
/// `Down` comes without an earlier `Up`. A `Down` therefore always means
/// the key was gone from etcd, never merely that the host moved to a new
/// lease (see [`HostEvent::Updated`]).
///
/// Slow consumers: the driver never blocks on you. The event channel is
/// bounded by `capacity`; when it is full, the watcher pauses its etcd
/// watch (holding back the rest of the etcd response it was delivering);
/// once you have read half of the channel it re-reads the prefix and sends
/// the difference. Memory is therefore bounded by `capacity` plus one etcd
/// response and one diff (at most two events per host), and no change is
/// dropped — intermediate states of a host may be coalesced, its final
/// state never is. Every watch-fed receiver of fleetcoord follows this one
/// policy.
///
/// Keys under the prefix that are not host ids are logged once and skipped;
/// hosts' leave markers (`<prefix><host id>/left`, see [`DownReason`]) and
/// incarnation keys (`<prefix><host id>/incarnation`, written by
/// [`crate::HostLiveness`] with every write of its key when it publishes
/// its incarnation, [`crate::LivenessOptions::publish_incarnation`]) are skipped
/// silently; an incarnation key's value comes as the host's
/// [`HostInfo::incarnation`]. Reading the prefix in pages, the `Up` of a
/// page's last host may wait for the next page, where its incarnation key
/// can be.
///
/// Large fleets: the prefix is read in pages of 1,000 keys at one revision,
/// and the initial `Up`s arrive page by page. After the first pages each
/// page's range ends about a page ahead, so that what etcd counts for
/// every page (the rest of its range) stays near the page: a replay costs
/// etcd time linear in the fleet, not quadratic. Transient errors are retried
/// with backoff; an error retrying cannot fix (the etcd user may not read
/// the prefix, one key larger than the client's message limit) is logged
/// with `log::warn` and ends the channel: `recv` then reports it
/// disconnected, and [`HostWatcher::stop_reason`] says why.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::{Etcd, EtcdOptions, HostEvent, HostLiveness, HostWatcher};
/// use std::time::Duration;
///
/// let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default())?;
/// let watcher = HostWatcher::watch(&etcd)?;
/// assert_eq!(watcher.events().recv_timeout(Duration::from_secs(5))?, HostEvent::Synced);
/// let id = uuid::Uuid::new_v4();
/// let host = HostLiveness::register(&etcd, id, b"meta", Duration::from_secs(5))?;
/// match watcher.events().recv_timeout(Duration::from_secs(5))? {
///     HostEvent::Up(info) => assert_eq!((info.id, info.metadata.as_slice()), (id, &b"meta"[..])),
///     other => panic!("expected Up, got {other:?}"),
/// }
/// host.close()?;
/// assert!(matches!(
///     watcher.events().recv_timeout(Duration::from_secs(5))?,
///     HostEvent::Down(_, fleetcoord::DownReason::Left)
/// ));
/// # Ok(()) }
/// ```
#[must_use = "dropping a HostWatcher stops the watch"]
pub struct HostWatcher {
    events: crossbeam_channel::Receiver<HostEvent>,
    /// Set once, by the machine's `Failed`, before the channel ends.
    failure: Arc<OnceLock<RpcError>>,
    prefix: String,
    /// Dropping it stops the watch; [`HostWatcher::close`] also waits.
    machine: MachineHandle<Watch>,
    _etcd: Etcd,
}

impl std::fmt::Debug for HostWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostWatcher")
            .field("pending", &self.events.len())
            .finish()
    }
}

/// The host a key under the prefix names, by sm's one rule for host keys
/// (the one the watch machine applies as [`KeyRule::HostId`]), so that
/// [`list_hosts`] and [`HostWatcher`] always agree on which keys are hosts.
/// Takes the key-value by value: the metadata moves into the event, which
/// saves a copy per event of every replay. `incarnation` is the one the
/// watch machine told right before the notice (0 if none).
pub(crate) fn host_info(prefix_len: usize, kv: KeyValue, incarnation: u64) -> Option<HostInfo> {
    let id = parse_host_id(kv.key.get(prefix_len..)?)?;
    Some(HostInfo {
        id: Uuid::from_bytes(id),
        metadata: kv.value,
        lease: kv.lease,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        incarnation,
    })
}

/// Pairs each [`WatchNotice::Incarnation`] with the host notice the watch
/// machine tells right after it (its contract), for [`HostWatcher`] and
/// [`list_hosts`] alike.
#[derive(Default)]
struct Incarnations {
    told: u64,
}

impl Incarnations {
    /// `None` for an incarnation (kept for the next notice); any other
    /// notice with the incarnation told right before it (0 if none).
    fn pair(&mut self, notice: WatchNotice) -> Option<(WatchNotice, u64)> {
        match notice {
            WatchNotice::Incarnation(n) => {
                self.told = n;
                None
            }
            other => Some((other, std::mem::take(&mut self.told))),
        }
    }
}

impl HostWatcher {
    /// Watch the default hosts prefix.
    pub fn watch(etcd: &Etcd) -> Result<HostWatcher> {
        crate::blocking::check()?;
        Self::with_options(etcd, WatcherOptions::default())
    }

    /// Watch with explicit settings (checked: a bad prefix or capacity is
    /// [`crate::Error::InvalidArgument`]).
    pub fn with_options(etcd: &Etcd, options: WatcherOptions) -> Result<HostWatcher> {
        crate::blocking::check()?;
        validate::prefix("prefix", &options.prefix)?;
        validate::capacity("capacity", options.capacity)?;
        let prefix_len = options.prefix.len();
        let metrics_prefix = options.prefix.clone();
        let prefix = options.prefix.clone();
        let failure = Arc::new(OnceLock::new());
        let failed = failure.clone();
        let config = WatchConfig {
            prefix: options.prefix.into_bytes(),
            keys: KeyRule::HostId,
            backoff: BackoffConfig::default(),
            page_size: DEFAULT_PAGE_SIZE,
        };
        let machine = Watch::new(config, Instant::now(), rand_seed());
        let mut incarnations = Incarnations::default();
        let (feed, events) = FeedSink::new(options.capacity, move |notice: WatchNotice| {
            let Some((notice, incarnation)) = incarnations.pair(notice) else {
                return FeedItem::Skip;
            };
            let (label, reason) = match &notice {
                WatchNotice::Up(_) => ("up", ""),
                WatchNotice::Updated(_) => ("updated", ""),
                WatchNotice::Down(_) => ("down", DownReason::Expired.as_str()),
                WatchNotice::Left(_) => ("down", DownReason::Left.as_str()),
                WatchNotice::Synced => ("synced", ""),
                _ => ("", ""),
            };
            if !label.is_empty() {
                crate::metrics::host_event(&metrics_prefix, label, reason);
            }
            let event = match notice {
                WatchNotice::Up(kv) => host_info(prefix_len, kv, incarnation).map(HostEvent::Up),
                WatchNotice::Updated(kv) => {
                    host_info(prefix_len, kv, incarnation).map(HostEvent::Updated)
                }
                WatchNotice::Down(kv) => host_info(prefix_len, kv, incarnation)
                    .map(|info| HostEvent::Down(info, DownReason::Expired)),
                WatchNotice::Left(kv) => host_info(prefix_len, kv, incarnation)
                    .map(|info| HostEvent::Down(info, DownReason::Left)),
                WatchNotice::Synced => Some(HostEvent::Synced),
                WatchNotice::InvalidKey(key) => {
                    log::warn!(
                        "ignoring key {:?} under the hosts prefix: not a host id",
                        String::from_utf8_lossy(&key)
                    );
                    None
                }
                WatchNotice::Failed(e) => {
                    log::warn!("host watcher gave up, its events end here: {e}");
                    // Set before the channel ends, so whoever sees it
                    // disconnected finds the reason.
                    let _ = failed.set(e);
                    return FeedItem::End;
                }
                _ => None,
            };
            event.map_or(FeedItem::Skip, FeedItem::Item)
        });
        let machine = etcd.run(machine, feed)?;
        Ok(HostWatcher {
            events,
            failure,
            prefix,
            machine,
            _etcd: etcd.clone(),
        })
    }

    /// The events, in order.
    pub fn events(&self) -> &crossbeam_channel::Receiver<HostEvent> {
        &self.events
    }

    /// Why the events ended, once etcd refused the watch in a way retrying
    /// cannot fix: [`ErrorKind::PermissionDenied`] for a user who may
    /// not read the prefix, say. `None` while the watch runs, and when the
    /// events ended because the [`Etcd`] handle was closed. Set before the
    /// channel reports itself disconnected, so a consumer that sees the
    /// disconnection can always ask.
    ///
    /// [`ErrorKind::PermissionDenied`]: crate::ErrorKind::PermissionDenied
    pub fn stop_reason(&self) -> Option<Error> {
        let e = self.failure.get()?.clone();
        Some(Error::rpc_in(format!("host watch of {:?}", self.prefix), e))
    }

    /// Stop watching, and return once the watch has ended: its machine has
    /// stopped, etcd's watch is canceled, and the events channel is
    /// disconnected. A clone of [`HostWatcher::events`] still reads the
    /// events queued before, then reports the disconnection; no event
    /// arrives after this returns.
    ///
    /// Dropping the watcher stops the watch too, without waiting for it.
    /// Fails with [`Error::Timeout`] only when the driver thread did not
    /// confirm the stop within 10 s (a starved or stuck driver); the watch
    /// then ends when the driver gets to it.
    pub fn close(self) -> Result<()> {
        crate::blocking::check()?;
        match self.machine.stop_and_wait(CLOSE_WAIT) {
            // Finished, or cut short by a driver shutting down: either way
            // nothing of the watch is left running.
            Ok(Finished::Done | Finished::Abandoned) => Ok(()),
            Err(WaitError::Timeout(after)) => Err(Error::Timeout(after)),
        }
    }
}

/// List the hosts registered under `prefix` right now: the snapshot a
/// [`HostWatcher`] starts with — read in pages all at the revision of the
/// first, so the list is the prefix as it was at one instant however large
/// it is — without the watch that would follow it. It is the same sm
/// `Watch` machine, stopped at `Synced`, so paging, compaction between
/// pages and refused pages are handled in one place. Transient failures are
/// retried for up to three request timeouts, then [`Error::Timeout`];
/// a permanent one (permission denied, say) is returned as it is.
///
/// The same keys count as hosts as for [`HostWatcher`]: only the canonical
/// spelling of a host id (a lowercase, hyphenated UUID, as
/// [`crate::HostLiveness`] writes it); any other key under the prefix,
/// leave markers (`<host id>/left`, see [`DownReason`]) and incarnation
/// keys (`<host id>/incarnation`) included, is skipped.
pub fn list_hosts(etcd: &Etcd, prefix: &str) -> Result<Vec<HostInfo>> {
    crate::blocking::check()?;
    validate::prefix("prefix", prefix)?;
    let prefix_len = prefix.len();
    let config = WatchConfig {
        prefix: prefix.as_bytes().to_vec(),
        keys: KeyRule::HostId,
        backoff: BackoffConfig::default(),
        page_size: DEFAULT_PAGE_SIZE,
    };
    let machine = Watch::new(config, Instant::now(), rand_seed());
    let (done_tx, done) = crossbeam_channel::bounded(1);
    // Keyed by etcd key, so the list comes out in key order.
    let mut view: BTreeMap<Vec<u8>, (KeyValue, u64)> = BTreeMap::new();
    let mut incarnations = Incarnations::default();
    let endpoints = etcd.endpoints().to_vec();
    let _machine = etcd.run(
        machine,
        Notify(move |notice| match incarnations.pair(notice) {
            None => true,
            Some((WatchNotice::Up(kv) | WatchNotice::Updated(kv), incarnation)) => {
                view.insert(kv.key.clone(), (kv, incarnation));
                true
            }
            // An interrupted replay finishes as a diff.
            Some((WatchNotice::Down(kv) | WatchNotice::Left(kv), _)) => {
                view.remove(&kv.key);
                true
            }
            // The snapshot is complete: `false` stops the machine before
            // its watch matters.
            Some((WatchNotice::Synced, _)) => {
                let _ = done_tx.try_send(Ok(std::mem::take(&mut view)));
                false
            }
            Some((WatchNotice::Failed(e), _)) => {
                let _ = done_tx.try_send(Err(Error::rpc(e).with_endpoints(&endpoints)));
                false
            }
            Some(_) => true,
        }),
    )?;
    let wait = etcd.options().request_timeout.saturating_mul(3);
    match done.recv_timeout(wait) {
        Ok(Ok(view)) => Ok(view
            .into_values()
            .filter_map(|(kv, incarnation)| host_info(prefix_len, kv, incarnation))
            .collect()),
        Ok(Err(e)) => Err(e),
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(Error::Timeout(wait)),
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(etcd.gone()),
    }
}
