//! The model etcd: an in-memory etcd v3 server, as far as fleetcoord's
//! protocols can tell. Keys, revisions, watch history and compaction live
//! here; leases in `lease` and transactions in `txn`, each a part of
//! [`ModelEtcd`]'s behaviour with its own rules.
//!
//! Each rule is etcd's own, so a machine that passes against the model
//! passes for the reason it would pass against etcd: one revision per
//! write request however many keys it touches, create/mod revisions and
//! versions, a delete of nothing writes nothing, compaction refuses old
//! watch starts.

mod lease;
mod txn;

use fleetcoord_sm::{
    EventKind, KeyRange, KeyValue, LeaseId, RangeRequest, Request, Response, Revision, RpcError,
    SortOrder, WatchEvent,
};
use lease::Lease;
use std::collections::BTreeMap;
use std::time::Instant;

pub use lease::MAX_LEASE_TTL_SECS;
pub use txn::MAX_TXN_OPS;

/// First lease id handed out; large so hex key names have many digits, as
/// real etcd lease ids do.
const FIRST_LEASE: LeaseId = 0x694d_7a2e_1f00_0001;

/// An in-memory etcd v3 server, as far as fleetcoord's protocols can tell.
///
/// Revisions start at 1; every request or transaction that writes bumps the
/// revision once, however many keys it touches. Leases expire at the last
/// renewal's processing time plus the granted TTL, on the virtual clock
/// passed to [`ModelEtcd::advance`] / [`ModelEtcd::execute`].
#[derive(Clone, Debug)]
pub struct ModelEtcd {
    /// The smallest TTL granted; etcd grants a 1 s request as 2 s.
    pub min_ttl_secs: i64,
    revision: Revision,
    compacted: Revision,
    kvs: BTreeMap<Vec<u8>, KeyValue>,
    leases: BTreeMap<LeaseId, Lease>,
    next_lease: LeaseId,
    history: Vec<WatchEvent>,
    paused: bool,
}

impl Default for ModelEtcd {
    fn default() -> Self {
        Self::new()
    }
}

impl ModelEtcd {
    /// An empty store at revision 1, no leases, not paused, min TTL 2 s.
    pub fn new() -> Self {
        ModelEtcd {
            min_ttl_secs: 2,
            revision: 1,
            compacted: 0,
            kvs: BTreeMap::new(),
            leases: BTreeMap::new(),
            next_lease: FIRST_LEASE,
            history: Vec::new(),
            paused: false,
        }
    }

    /// Runs one request at `now`, after expiring every lease due by `now`.
    /// While paused every request fails with `Unavailable` (the harness
    /// queues instead of calling this). `Request::Watch` is rejected: the
    /// harness serves watches from [`ModelEtcd::watch_history`].
    pub fn execute(&mut self, now: Instant, request: &Request) -> Result<Response, RpcError> {
        if self.paused {
            return Err(RpcError::Unavailable("etcd paused".into()));
        }
        self.advance(now);
        match request {
            Request::Grant { ttl_secs } => self.grant(now, *ttl_secs),
            Request::LeaseTimeToLive { lease } => Ok(self.time_to_live(now, *lease)),
            Request::Revoke { lease } => self.revoke(*lease),
            Request::KeepAlive { lease } => Ok(self.renew(now, *lease)),
            Request::Put { key, value, lease } => {
                self.check_lease(*lease)?;
                let revision = self.revision + 1;
                self.apply_put(revision, key, value, *lease);
                self.revision = revision;
                Ok(Response::Put { revision })
            }
            Request::Range(r) => Ok(Response::Range {
                revision: self.revision,
                kvs: self.read_at(r)?,
            }),
            Request::Delete(range) => {
                let revision = self.revision + 1;
                let deleted = self.apply_delete(revision, range);
                if deleted > 0 {
                    self.revision = revision;
                }
                Ok(Response::Deleted {
                    revision: self.revision,
                    deleted,
                })
            }
            Request::Txn(txn) => self.txn(txn),
            Request::Watch { .. } => Err(RpcError::Rejected(
                "watch is served by the harness, not execute".into(),
            )),
        }
    }

    /// A range at `r.revision` (0 = now), as etcd serves it: a future
    /// revision is refused, one below the last compaction is `Compacted`,
    /// and any other is rebuilt from the current keys by undoing, newest
    /// first, the history written after it (compaction keeps every event
    /// above the compaction revision, so this is always possible).
    fn read_at(&self, r: &RangeRequest) -> Result<Vec<KeyValue>, RpcError> {
        if r.revision <= 0 || r.revision == self.revision {
            return Ok(self.read(r));
        }
        if r.revision > self.revision {
            return Err(RpcError::Rejected(
                "etcdserver: mvcc: required revision is a future revision".into(),
            ));
        }
        if r.revision < self.compacted {
            return Err(RpcError::Compacted {
                compact_revision: self.compacted,
            });
        }
        let mut then: BTreeMap<Vec<u8>, KeyValue> = self
            .kvs
            .iter()
            .filter(|(key, _)| r.range.contains(key))
            .map(|(key, kv)| (key.clone(), kv.clone()))
            .collect();
        for event in self.history.iter().rev() {
            if event.kv.mod_revision <= r.revision {
                break;
            }
            if !r.range.contains(&event.kv.key) {
                continue;
            }
            match &event.prev_kv {
                Some(prev) => then.insert(prev.key.clone(), prev.clone()),
                None => then.remove(&event.kv.key),
            };
        }
        Ok(select(then.values(), r))
    }

    fn read(&self, r: &RangeRequest) -> Vec<KeyValue> {
        select(self.kvs.values(), r)
    }

    fn apply_put(&mut self, revision: Revision, key: &[u8], value: &[u8], lease: LeaseId) {
        let prev = self.kvs.get(key).cloned();
        let kv = KeyValue {
            key: key.to_vec(),
            value: value.to_vec(),
            create_revision: prev.as_ref().map_or(revision, |p| p.create_revision),
            mod_revision: revision,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            lease,
        };
        self.kvs.insert(key.to_vec(), kv.clone());
        self.history.push(WatchEvent {
            kind: EventKind::Put,
            kv,
            prev_kv: prev,
        });
    }

    /// Deletes every key for which `pick` holds, all at `revision`.
    fn delete_where(&mut self, revision: Revision, pick: impl Fn(&KeyValue) -> bool) -> i64 {
        let keys: Vec<Vec<u8>> = self
            .kvs
            .values()
            .filter(|kv| pick(kv))
            .map(|kv| kv.key.clone())
            .collect();
        for key in &keys {
            let prev = self.kvs.remove(key);
            self.history.push(WatchEvent {
                kind: EventKind::Delete,
                kv: KeyValue {
                    key: key.clone(),
                    mod_revision: revision,
                    ..KeyValue::default()
                },
                prev_kv: prev,
            });
        }
        i64::try_from(keys.len()).unwrap_or(i64::MAX)
    }

    fn apply_delete(&mut self, revision: Revision, range: &KeyRange) -> i64 {
        self.delete_where(revision, |kv| range.contains(&kv.key))
    }

    /// Stops the server (SIGSTOP): nothing executes, no lease expires.
    pub fn pause(&mut self) {
        self.paused = true;
    }

    /// Continues the server at `now`: first every lease whose deadline passed
    /// (during the pause too) expires, then work may proceed.
    pub fn resume(&mut self, now: Instant) {
        self.paused = false;
        self.advance(now);
    }

    /// Whether the server is paused.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Drops watch history at or below `revision` (clamped to the current
    /// revision; a revision at or below the last compaction does nothing).
    pub fn compact(&mut self, revision: Revision) {
        let revision = revision.min(self.revision);
        if revision <= self.compacted {
            return;
        }
        self.compacted = revision;
        let keep_from = self
            .history
            .partition_point(|e| e.kv.mod_revision <= revision);
        self.history.drain(..keep_from);
    }

    /// The last compaction revision, 0 if never compacted.
    pub fn compacted_revision(&self) -> Revision {
        self.compacted
    }

    /// Every event in `range` with revision >= `start_revision`, in revision
    /// order (op order within a revision); `Err(compact_revision)` when
    /// `start_revision` is at or below the last compaction.
    pub fn watch_history(
        &self,
        range: &KeyRange,
        start_revision: Revision,
    ) -> Result<Vec<WatchEvent>, Revision> {
        if self.compacted > 0 && start_revision <= self.compacted {
            return Err(self.compacted);
        }
        let from = self
            .history
            .partition_point(|e| e.kv.mod_revision < start_revision);
        Ok(self.history[from..]
            .iter()
            .filter(|e| range.contains(&e.kv.key))
            .cloned()
            .collect())
    }

    /// The current store revision.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The key, if present.
    pub fn get(&self, key: &[u8]) -> Option<KeyValue> {
        self.kvs.get(key).cloned()
    }

    /// The store and its leases, for a model world's failure report:
    /// every key with its value, lease and create revision, every lease
    /// with its expiry, times as offsets from `start`.
    pub fn describe(&self, start: Instant) -> String {
        let at = |t: Instant| format!("+{} ms", (t - start).as_millis());
        let mut out = format!("  etcd at revision {}:", self.revision());
        for kv in self.range_prefix(b"") {
            out += &format!(
                "\n    {} = {} lease {:x} created {}",
                String::from_utf8_lossy(&kv.key),
                String::from_utf8_lossy(&kv.value),
                kv.lease,
                kv.create_revision
            );
        }
        for lease in self.leases() {
            let expiry = self.lease_deadline(lease).map(at);
            out += &format!("\n    lease {lease:x} expires {expiry:?}");
        }
        out
    }

    /// Every key starting with `prefix`, in key order.
    pub fn range_prefix(&self, prefix: &[u8]) -> Vec<KeyValue> {
        self.kvs
            .values()
            .filter(|kv| kv.key.starts_with(prefix))
            .cloned()
            .collect()
    }
}

/// The keys of `kvs` (in key order) that `r` selects, sorted and limited
/// as `r` asks.
fn select<'a>(kvs: impl Iterator<Item = &'a KeyValue>, r: &RangeRequest) -> Vec<KeyValue> {
    let mut kvs: Vec<KeyValue> = kvs
        .filter(|kv| r.range.contains(&kv.key))
        .filter(|kv| r.max_create_revision <= 0 || kv.create_revision <= r.max_create_revision)
        .cloned()
        .collect();
    match r.sort {
        SortOrder::Key => {}
        SortOrder::CreateAscending => kvs.sort_by(|a, b| {
            a.create_revision
                .cmp(&b.create_revision)
                .then(a.key.cmp(&b.key))
        }),
        SortOrder::CreateDescending => kvs.sort_by(|a, b| {
            b.create_revision
                .cmp(&a.create_revision)
                .then(a.key.cmp(&b.key))
        }),
    }
    if r.limit > 0 {
        kvs.truncate(usize::try_from(r.limit).unwrap_or(usize::MAX));
    }
    if r.keys_only {
        // etcd answers keys_only with every value empty, revisions kept.
        for kv in &mut kvs {
            kv.value.clear();
        }
    }
    kvs
}
