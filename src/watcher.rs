//! [`HostWatcher`]: the fleet's hosts as a stream of Up/Updated/Down events.

use crate::driver::handle::WaitError;
use crate::driver::{rand_seed, FeedItem, FeedSink, Finished, MachineHandle, Notify};
use crate::error::{Error, Result};
use crate::etcd::{assert_not_async, Etcd};
use crate::liveness::DEFAULT_HOSTS_PREFIX;
use crate::session::CLOSE_WAIT;
use crate::validate;
use fleetcoord_sm::watch::{
    incarnation_key, parse_host_id, parse_incarnation_key, KeyRule, Watch, WatchConfig,
    WatchNotice, DEFAULT_PAGE_SIZE,
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
    /// Which process of the host's registration wrote the key: 1 for a
    /// fresh registration, one more for each restart that handed the
    /// registration on ([`crate::HostLiveness::resume`], also when the
    /// resume fell back to registering afresh); see
    /// [`crate::HostLiveness::incarnation`]. Comparing it across events
    /// counts restarts that never showed a `Down`.
    ///
    /// Read from the host's *incarnation key*,
    /// `<prefix><host id>/incarnation`, which the registration puts on the
    /// same lease in the same transaction as every write of the host key;
    /// it is taken only when its lease and mod revision are the host key's
    /// (the same write), so it never belongs to another write of the key.
    /// 0 when not known: the key was written by a fleetcoord version
    /// without incarnation keys, by another client, by a registration on a
    /// shared [`crate::Session`], or by a process that did not write one —
    /// and, for now, in every [`HostWatcher`] event: only [`list_hosts`]
    /// joins the two keys yet.
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
/// hosts' leave markers (`<prefix><host id>/left`, see [`DownReason`]) are
/// skipped silently.
///
/// Large fleets: the prefix is read in pages of 1,000 keys at one revision,
/// and the initial `Up`s arrive page by page. Transient errors are retried
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
/// saves a copy per event of every replay.
pub(crate) fn host_info(prefix_len: usize, kv: KeyValue) -> Option<HostInfo> {
    let id = parse_host_id(kv.key.get(prefix_len..)?)?;
    Some(HostInfo {
        id: Uuid::from_bytes(id),
        metadata: kv.value,
        lease: kv.lease,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        incarnation: 0,
    })
}

/// The hosts among `view` (every key under the prefix at one revision,
/// keyed by key), each with the incarnation its incarnation key in `view`
/// gives it (see [`HostInfo::incarnation`]), in key order.
fn join_incarnations(prefix_len: usize, mut view: BTreeMap<Vec<u8>, KeyValue>) -> Vec<HostInfo> {
    let incarnations: BTreeMap<Vec<u8>, KeyValue> = {
        let keys: Vec<Vec<u8>> = view
            .keys()
            .filter(|key| {
                key.get(prefix_len..)
                    .is_some_and(|suffix| parse_incarnation_key(suffix).is_some())
            })
            .cloned()
            .collect();
        keys.into_iter()
            .filter_map(|key| view.remove_entry(&key))
            .collect()
    };
    view.into_values()
        .filter_map(|kv| {
            let incarnation = incarnations
                .get(&incarnation_key(&kv.key))
                .and_then(|inc| incarnation_of(inc, &kv))
                .unwrap_or(0);
            host_info(prefix_len, kv).map(|info| HostInfo {
                incarnation,
                ..info
            })
        })
        .collect()
}

/// The incarnation `inc` (an incarnation key) records for the write of the
/// host key `host`: only when both were written by one transaction on one
/// lease, and the value is a decimal number.
fn incarnation_of(inc: &KeyValue, host: &KeyValue) -> Option<u64> {
    if inc.lease == 0 || inc.lease != host.lease || inc.mod_revision != host.mod_revision {
        return None;
    }
    let text = std::str::from_utf8(&inc.value).ok()?;
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

impl HostWatcher {
    /// Watch the default hosts prefix.
    pub fn watch(etcd: &Etcd) -> Result<HostWatcher> {
        Self::with_options(etcd, WatcherOptions::default())
    }

    /// Watch with explicit settings (checked: a bad prefix or capacity is
    /// [`crate::Error::InvalidArgument`]).
    pub fn with_options(etcd: &Etcd, options: WatcherOptions) -> Result<HostWatcher> {
        assert_not_async();
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
        let (feed, events) = FeedSink::new(options.capacity, move |notice: WatchNotice| {
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
            let event =
                match notice {
                    WatchNotice::Up(kv) => host_info(prefix_len, kv).map(HostEvent::Up),
                    WatchNotice::Updated(kv) => host_info(prefix_len, kv).map(HostEvent::Updated),
                    WatchNotice::Down(kv) => host_info(prefix_len, kv)
                        .map(|info| HostEvent::Down(info, DownReason::Expired)),
                    WatchNotice::Left(kv) => host_info(prefix_len, kv)
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
/// keys (`<host id>/incarnation`) included, is skipped. Each host's
/// [`HostInfo::incarnation`] comes from its incarnation key in the same
/// snapshot.
pub fn list_hosts(etcd: &Etcd, prefix: &str) -> Result<Vec<HostInfo>> {
    assert_not_async();
    validate::prefix("prefix", prefix)?;
    let prefix_len = prefix.len();
    // Every key, not only hosts: the join below needs the incarnation keys
    // of the same snapshot; it keeps only hosts.
    let config = WatchConfig {
        prefix: prefix.as_bytes().to_vec(),
        keys: KeyRule::Any,
        backoff: BackoffConfig::default(),
        page_size: DEFAULT_PAGE_SIZE,
    };
    let machine = Watch::new(config, Instant::now(), rand_seed());
    let (done_tx, done) = crossbeam_channel::bounded(1);
    // Keyed by etcd key, so the list comes out in key order.
    let mut view: BTreeMap<Vec<u8>, KeyValue> = BTreeMap::new();
    let _machine = etcd.run(
        machine,
        Notify(move |notice| match notice {
            WatchNotice::Up(kv) | WatchNotice::Updated(kv) => {
                view.insert(kv.key.clone(), kv);
                true
            }
            // An interrupted replay finishes as a diff.
            WatchNotice::Down(kv) | WatchNotice::Left(kv) => {
                view.remove(&kv.key);
                true
            }
            // The snapshot is complete: `false` stops the machine before
            // its watch matters.
            WatchNotice::Synced => {
                let _ = done_tx.try_send(Ok(std::mem::take(&mut view)));
                false
            }
            WatchNotice::Failed(e) => {
                let _ = done_tx.try_send(Err(Error::rpc(e)));
                false
            }
            _ => true,
        }),
    )?;
    let wait = etcd.options().request_timeout.saturating_mul(3);
    match done.recv_timeout(wait) {
        Ok(Ok(view)) => Ok(join_incarnations(prefix_len, view)),
        Ok(Err(e)) => Err(e),
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(Error::Timeout(wait)),
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(etcd.gone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFIX: &str = "/coord/hosts/";
    const ID: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";

    fn kv(key: &str, value: &str, lease: i64, create: i64, modified: i64) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            lease,
            create_revision: create,
            mod_revision: modified,
            ..KeyValue::default()
        }
    }

    fn host(lease: i64, modified: i64) -> KeyValue {
        kv(&format!("{PREFIX}{ID}"), "meta", lease, 3, modified)
    }

    fn inc(value: &str, lease: i64, modified: i64) -> KeyValue {
        kv(
            &format!("{PREFIX}{ID}/incarnation"),
            value,
            lease,
            3,
            modified,
        )
    }

    fn join(kvs: Vec<KeyValue>) -> Vec<(Uuid, u64)> {
        let view = kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
        join_incarnations(PREFIX.len(), view)
            .into_iter()
            .map(|info| (info.id, info.incarnation))
            .collect()
    }

    #[test]
    fn the_incarnation_of_the_same_write_is_joined_and_never_a_host() {
        let id = Uuid::parse_str(ID).unwrap();
        assert_eq!(join(vec![host(7, 9), inc("3", 7, 9)]), vec![(id, 3)]);
        // Alone, an incarnation key is no host.
        assert_eq!(join(vec![inc("3", 7, 9)]), vec![]);
        // No incarnation key (an older version): not known.
        assert_eq!(join(vec![host(7, 9)]), vec![(id, 0)]);
    }

    #[test]
    fn an_incarnation_of_another_write_or_unreadable_is_not_known() {
        let id = Uuid::parse_str(ID).unwrap();
        for stale in [
            // The key was written again since, without one.
            inc("3", 7, 8),
            // Another lease's.
            inc("3", 6, 9),
            // Not on a lease at all.
            inc("3", 0, 9),
            // Not a decimal number, or too large.
            inc("", 7, 9),
            inc("+3", 7, 9),
            inc("3 ", 7, 9),
            inc("x", 7, 9),
            inc("18446744073709551616", 7, 9),
        ] {
            assert_eq!(
                join(vec![host(7, 9), stale.clone()]),
                vec![(id, 0)],
                "{stale:?}"
            );
        }
        assert_eq!(
            join(vec![host(7, 9), inc("18446744073709551615", 7, 9)]),
            vec![(id, u64::MAX)]
        );
        // Leave markers and stray keys stay out of the list.
        let marker = kv(&format!("{PREFIX}{ID}/left"), "", 7, 10, 10);
        let stray = kv(&format!("{PREFIX}not-a-host"), "x", 0, 4, 4);
        assert_eq!(
            join(vec![host(7, 9), inc("2", 7, 9), marker, stray]),
            vec![(id, 2)]
        );
    }
}
