//! A model etcd and a harness that runs machines against it on a virtual
//! clock, with faults.
//!
//! API in short (everything is `pub`, use `crate::model::*`):
//!
//! * [`ModelEtcd`] — in-memory etcd v3: revisions, leases on the virtual
//!   clock, watch history, compaction, pause/resume, leader change.
//!   `execute(now, &request) -> Result<Response, RpcError>` runs one request
//!   exactly as etcd would (except `Request::Watch`, which the harness
//!   serves). Inspection: `revision()`, `get(key)`, `range_prefix(prefix)`,
//!   `lease_exists(lease)`, `lease_deadline(lease)`, `leases()`,
//!   `next_deadline()`, `watch_history(range, from)`.
//! * [`Faults`] — probabilities of a failed request / lost reply and the
//!   reply latency range; `Faults::none()`, `Faults::moderate()`.
//! * [`Harness<M>`] — one machine plus everything on the wire for it:
//!   replies in flight, active watches, requests queued while etcd is
//!   paused, notifications (`pub notifications: Vec<(Instant, N)>`).
//!   `pump`, `fire_timeout`, `deliver_due`, `next_event_time`,
//!   `drop_streams(now)`, `lose_all_inflight()`.
//! * [`Node`] — the object-safe face of a harness, so machines of different
//!   types can be stepped together: [`step`] processes one instant for all of
//!   them in the required order, [`world_next_time`] finds the next instant,
//!   [`run_until`] loops the two. [`next_time`] is the minimum of options;
//!   [`next_due`] is the next instant of a one-node world up to a bound.
//! * Small helpers for schedules: [`rng`] (seeded), [`chance`], [`pick`]
//!   (a number in `0..n`), [`ms`].
//!
//! Ordering at one instant (what [`step`] does, and what hand-written loops
//! must do): `etcd.advance(now)` (leases expire first), then every due
//! `handle_timeout`, then every due reply delivery, then pump every harness
//! until no new write happens (so each watch sees every other harness's
//! writes). Timeouts before deliveries is the point: a leader's local deadline
//! fires before anyone else can learn that its key is gone.
//!
//! Requests are executed when the harness pumps them (the send instant);
//! replies arrive after a latency drawn from `faults.latency`. Watch batches
//! are one per revision and never reordered; keepalive replies of one harness
//! are never reordered (they share one stream).

#![allow(dead_code)]

use fleetcoord_sm::{
    Command, Compare, EventKind, KeyRange, KeyValue, LeaseId, Machine, RangeRequest, Request,
    Response, Revision, RpcError, RpcId, RpcReply, SortOrder, Txn, TxnOp, TxnOpResponse,
    WatchEvent,
};
pub use rand_chacha::ChaCha8Rng;
pub use rand_core::{RngCore, SeedableRng};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// etcd's limit on the operations of one transaction (per list).
pub const MAX_TXN_OPS: usize = 128;
/// etcd's largest lease TTL in seconds.
pub const MAX_LEASE_TTL_SECS: i64 = 9_000_000_000;
/// First lease id handed out; large so hex key names have many digits, as
/// real etcd lease ids do.
const FIRST_LEASE: LeaseId = 0x694d_7a2e_1f00_0001;
/// Work allowed at one instant before the harness declares a livelock.
const LIVELOCK_LIMIT: usize = 100_000;

/// A seeded simulation RNG.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl).unwrap_or(0))
}

#[derive(Clone, Debug)]
struct Lease {
    ttl_secs: i64,
    deadline: Instant,
}

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
            // No machine asks; the model answers like etcd for a lease it
            // does not know.
            Request::LeaseTimeToLive { .. } => Ok(Response::LeaseTimeToLive {
                ttl_secs: -1,
                granted_secs: 0,
            }),
            Request::Revoke { lease } => {
                if self.leases.contains_key(lease) {
                    self.expire_lease(*lease);
                    Ok(Response::Revoked)
                } else {
                    Err(RpcError::Rejected("lease not found".into()))
                }
            }
            Request::KeepAlive { lease } => {
                let ttl_secs = match self.leases.get_mut(lease) {
                    Some(l) => {
                        l.deadline = now + secs(l.ttl_secs);
                        l.ttl_secs
                    }
                    None => 0,
                };
                Ok(Response::KeptAlive { ttl_secs })
            }
            Request::Put { key, value, lease } => {
                self.check_lease(*lease)?;
                let revision = self.revision + 1;
                self.apply_put(revision, key, value, *lease);
                self.revision = revision;
                Ok(Response::Put { revision })
            }
            Request::Range(r) => Ok(Response::Range {
                revision: self.revision,
                kvs: self.read(r),
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

    fn grant(&mut self, now: Instant, ttl_secs: i64) -> Result<Response, RpcError> {
        if ttl_secs > MAX_LEASE_TTL_SECS {
            return Err(RpcError::Rejected("too large lease TTL".into()));
        }
        let ttl = ttl_secs.max(self.min_ttl_secs).max(1);
        let lease = self.next_lease;
        self.next_lease += 1;
        self.leases.insert(
            lease,
            Lease {
                ttl_secs: ttl,
                deadline: now + secs(ttl),
            },
        );
        Ok(Response::Granted {
            lease,
            ttl_secs: ttl,
        })
    }

    fn check_lease(&self, lease: LeaseId) -> Result<(), RpcError> {
        if lease == 0 || self.leases.contains_key(&lease) {
            Ok(())
        } else {
            Err(RpcError::Rejected("requested lease not found".into()))
        }
    }

    fn txn(&mut self, txn: &Txn) -> Result<Response, RpcError> {
        if txn.compare.len() > MAX_TXN_OPS {
            return Err(RpcError::Rejected(
                "too many operations in txn request".into(),
            ));
        }
        check_branch(&txn.success)?;
        check_branch(&txn.failure)?;
        let succeeded = txn.compare.iter().all(|c| self.holds(c));
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        for op in ops {
            if let TxnOp::Put { lease, .. } = op {
                self.check_lease(*lease)?;
            }
        }
        let revision = self.revision + 1;
        let mut wrote = false;
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                TxnOp::Put { key, value, lease } => {
                    self.apply_put(revision, key, value, *lease);
                    wrote = true;
                    responses.push(TxnOpResponse::Put);
                }
                TxnOp::Range(r) => responses.push(TxnOpResponse::Range { kvs: self.read(r) }),
                TxnOp::Delete(range) => {
                    let deleted = self.apply_delete(revision, range);
                    wrote |= deleted > 0;
                    responses.push(TxnOpResponse::Delete { deleted });
                }
            }
        }
        if wrote {
            self.revision = revision;
        }
        Ok(Response::Txn {
            revision: self.revision,
            succeeded,
            responses,
        })
    }

    fn holds(&self, compare: &Compare) -> bool {
        match compare {
            Compare::CreateRevisionEquals { key, revision } => {
                self.kvs.get(key).map_or(0, |kv| kv.create_revision) == *revision
            }
            Compare::ModRevisionEquals { key, revision } => {
                self.kvs.get(key).map_or(0, |kv| kv.mod_revision) == *revision
            }
        }
    }

    fn read(&self, r: &RangeRequest) -> Vec<KeyValue> {
        let mut kvs: Vec<KeyValue> = self
            .kvs
            .values()
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
        kvs
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

    /// Expires or revokes `lease` now: its keys go in one revision (none if
    /// it had no keys). Returns whether the lease existed.
    pub fn expire_lease(&mut self, lease: LeaseId) -> bool {
        if self.leases.remove(&lease).is_none() {
            return false;
        }
        let revision = self.revision + 1;
        if self.delete_where(revision, |kv| kv.lease == lease) > 0 {
            self.revision = revision;
        }
        true
    }

    /// Expires every lease whose deadline is at or before `now`, in deadline
    /// order (ties by id). Does nothing while paused.
    pub fn advance(&mut self, now: Instant) {
        if self.paused {
            return;
        }
        while let Some((&lease, _)) = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .min_by_key(|(id, l)| (l.deadline, **id))
        {
            self.expire_lease(lease);
        }
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

    /// An etcd leader change or restart: every lease gets a full TTL from `now`.
    pub fn extend_all_leases(&mut self, now: Instant) {
        for l in self.leases.values_mut() {
            l.deadline = now + secs(l.ttl_secs);
        }
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

    /// Every key starting with `prefix`, in key order.
    pub fn range_prefix(&self, prefix: &[u8]) -> Vec<KeyValue> {
        self.kvs
            .values()
            .filter(|kv| kv.key.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Whether `lease` is alive.
    pub fn lease_exists(&self, lease: LeaseId) -> bool {
        self.leases.contains_key(&lease)
    }

    /// When `lease` expires unless renewed.
    pub fn lease_deadline(&self, lease: LeaseId) -> Option<Instant> {
        self.leases.get(&lease).map(|l| l.deadline)
    }

    /// The granted TTL of `lease`.
    pub fn lease_ttl(&self, lease: LeaseId) -> Option<i64> {
        self.leases.get(&lease).map(|l| l.ttl_secs)
    }

    /// Every live lease, ascending.
    pub fn leases(&self) -> Vec<LeaseId> {
        self.leases.keys().copied().collect()
    }

    /// The next lease expiry; `None` when there is no lease or while paused.
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.paused {
            return None;
        }
        self.leases.values().map(|l| l.deadline).min()
    }
}

/// etcd's `checkIntervals`: no two puts of one key, no delete covering a put,
/// at most [`MAX_TXN_OPS`] operations.
fn check_branch(ops: &[TxnOp]) -> Result<(), RpcError> {
    if ops.len() > MAX_TXN_OPS {
        return Err(RpcError::Rejected(
            "too many operations in txn request".into(),
        ));
    }
    let puts: Vec<&[u8]> = ops
        .iter()
        .filter_map(|op| match op {
            TxnOp::Put { key, .. } => Some(key.as_slice()),
            _ => None,
        })
        .collect();
    let duplicate_put = puts.iter().enumerate().any(|(i, a)| puts[..i].contains(a));
    let deleted_put = ops.iter().any(|op| match op {
        TxnOp::Delete(range) => puts.iter().any(|key| range.contains(key)),
        _ => false,
    });
    if duplicate_put || deleted_put {
        return Err(RpcError::Rejected(
            "duplicate key given in txn request".into(),
        ));
    }
    Ok(())
}

/// What can go wrong on the wire, and how slow it is.
#[derive(Clone, Debug, PartialEq)]
pub struct Faults {
    /// Probability that a request fails with `Unavailable` without running.
    pub fail_request: f64,
    /// Probability that a request runs but its reply is replaced by
    /// `Unavailable` (the write happened; the client does not know).
    pub lose_reply: f64,
    /// Reply latency, drawn uniformly from `min..=max`.
    pub latency: (Duration, Duration),
}

impl Faults {
    /// No faults, a fixed 1 ms latency (non-zero so an instant's work ends).
    pub fn none() -> Self {
        Faults {
            fail_request: 0.0,
            lose_reply: 0.0,
            latency: (Duration::from_millis(1), Duration::from_millis(1)),
        }
    }

    /// 5 % failed requests, 2 % lost replies, 1–20 ms latency.
    pub fn moderate() -> Self {
        Faults {
            fail_request: 0.05,
            lose_reply: 0.02,
            latency: (Duration::from_millis(1), Duration::from_millis(20)),
        }
    }

    /// One latency draw.
    pub fn sample_latency(&self, rng: &mut ChaCha8Rng) -> Duration {
        let (min, max) = self.latency;
        if max <= min {
            return min;
        }
        let span = u64::try_from((max - min).as_nanos()).unwrap_or(u64::MAX);
        min + Duration::from_nanos(rng.next_u64() % span.saturating_add(1))
    }
}

/// True with probability `p`.
pub fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    if p <= 0.0 {
        return false;
    }
    let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    unit < p
}

/// A uniform-enough pick in `0..n` (`n` > 0).
pub fn pick(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    rng.next_u64() % n
}

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    Unary,
    KeepAlive,
    Watch,
}

#[derive(Clone, Debug)]
struct Pending {
    due: Instant,
    seq: u64,
    id: RpcId,
    stream: Stream,
    result: Result<Response, RpcError>,
}

#[derive(Clone, Debug)]
struct ActiveWatch {
    range: KeyRange,
    next_revision: Revision,
    last_due: Instant,
}

/// One machine under test and everything on the wire for it.
pub struct Harness<M: Machine> {
    /// The machine; call its user-facing methods directly, then `pump`.
    pub machine: M,
    /// Every `Command::Notify`, with the instant it was emitted, in order.
    pub notifications: Vec<(Instant, M::Notification)>,
    /// How long after `drop_streams` the stream errors arrive.
    pub stream_drop_delay: Duration,
    /// Requests handed to etcd (including failed ones), for statistics.
    pub requests_sent: u64,
    /// Injected request failures and lost replies, for statistics.
    pub faults_injected: u64,
    pending: Vec<Pending>,
    queued: VecDeque<(RpcId, Request)>,
    watches: BTreeMap<RpcId, ActiveWatch>,
    keepalive_last_due: Option<Instant>,
    seq: u64,
}

impl<M: Machine> Harness<M> {
    /// Wraps `machine`; nothing is in flight yet. Call `pump` to collect the
    /// commands it emitted in `new`.
    pub fn new(machine: M) -> Self {
        Harness {
            machine,
            notifications: Vec::new(),
            stream_drop_delay: Duration::from_millis(1),
            requests_sent: 0,
            faults_injected: 0,
            pending: Vec::new(),
            queued: VecDeque::new(),
            watches: BTreeMap::new(),
            keepalive_last_due: None,
            seq: 0,
        }
    }

    /// Drains the machine's commands: runs RPCs against `etcd` (or queues
    /// them while it is paused, running the queue first once it is not),
    /// registers watches, honours cancels, records notifications; then
    /// schedules every new watch event of every active watch.
    pub fn pump(
        &mut self,
        etcd: &mut ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
    ) {
        if !etcd.is_paused() {
            while let Some((id, request)) = self.queued.pop_front() {
                self.run(etcd, now, rng, faults, id, request);
            }
        }
        while let Some(command) = self.machine.poll_command() {
            match command {
                Command::Rpc { id, request } => {
                    if etcd.is_paused() {
                        self.queued.push_back((id, request));
                    } else {
                        self.run(etcd, now, rng, faults, id, request);
                    }
                }
                Command::Cancel { id } => self.cancel(id),
                Command::Notify(n) => self.notifications.push((now, n)),
            }
        }
        if !etcd.is_paused() {
            self.sync_watches(etcd, now, rng, faults);
        }
    }

    fn push(
        &mut self,
        due: Instant,
        id: RpcId,
        stream: Stream,
        result: Result<Response, RpcError>,
    ) {
        let due = if stream == Stream::KeepAlive {
            let due = self.keepalive_last_due.map_or(due, |last| due.max(last));
            self.keepalive_last_due = Some(due);
            due
        } else {
            due
        };
        self.seq += 1;
        self.pending.push(Pending {
            due,
            seq: self.seq,
            id,
            stream,
            result,
        });
    }

    fn run(
        &mut self,
        etcd: &mut ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
        id: RpcId,
        request: Request,
    ) {
        self.requests_sent += 1;
        let stream = match request {
            Request::KeepAlive { .. } => Stream::KeepAlive,
            Request::Watch { .. } => Stream::Watch,
            _ => Stream::Unary,
        };
        let due = now + faults.sample_latency(rng);
        if chance(rng, faults.fail_request) {
            self.faults_injected += 1;
            self.push(
                due,
                id,
                stream,
                Err(RpcError::Unavailable("injected: request failed".into())),
            );
            return;
        }
        if let Request::Watch {
            range,
            start_revision,
        } = request
        {
            let next_revision = if start_revision <= 0 {
                etcd.revision() + 1
            } else {
                start_revision
            };
            self.watches.insert(
                id,
                ActiveWatch {
                    range,
                    next_revision,
                    last_due: due,
                },
            );
            self.push(
                due,
                id,
                stream,
                Ok(Response::WatchEvents { events: Vec::new() }),
            );
            return;
        }
        let mut result = etcd.execute(now, &request);
        if chance(rng, faults.lose_reply) {
            self.faults_injected += 1;
            result = Err(RpcError::Unavailable("injected: reply lost".into()));
        }
        self.push(due, id, stream, result);
    }

    fn cancel(&mut self, id: RpcId) {
        self.watches.remove(&id);
        self.pending.retain(|p| p.id != id);
        self.queued.retain(|(queued, _)| *queued != id);
    }

    fn sync_watches(
        &mut self,
        etcd: &ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
    ) {
        let ids: Vec<RpcId> = self.watches.keys().copied().collect();
        for id in ids {
            let Some(watch) = self.watches.get(&id) else {
                continue;
            };
            match etcd.watch_history(&watch.range, watch.next_revision) {
                Err(compact_revision) => {
                    let due = (now + faults.sample_latency(rng)).max(watch.last_due);
                    self.watches.remove(&id);
                    self.push(
                        due,
                        id,
                        Stream::Watch,
                        Ok(Response::WatchCanceled { compact_revision }),
                    );
                }
                Ok(events) if events.is_empty() => {
                    if let Some(w) = self.watches.get_mut(&id) {
                        w.next_revision = w.next_revision.max(etcd.revision() + 1);
                    }
                }
                Ok(events) => {
                    let due = (now + faults.sample_latency(rng)).max(watch.last_due);
                    let mut batches: Vec<Vec<WatchEvent>> = Vec::new();
                    for event in events {
                        match batches.last_mut() {
                            Some(batch) if batch[0].kv.mod_revision == event.kv.mod_revision => {
                                batch.push(event)
                            }
                            _ => batches.push(vec![event]),
                        }
                    }
                    for events in batches {
                        self.push(due, id, Stream::Watch, Ok(Response::WatchEvents { events }));
                    }
                    if let Some(w) = self.watches.get_mut(&id) {
                        w.next_revision = etcd.revision() + 1;
                        w.last_due = due;
                    }
                }
            }
        }
    }

    /// Calls `handle_timeout(now)` if the machine's deadline is due, then pumps.
    pub fn fire_timeout(
        &mut self,
        etcd: &mut ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
    ) {
        if self.machine.poll_timeout().is_some_and(|t| t <= now) {
            self.machine.handle_timeout(now);
        }
        self.pump(etcd, now, rng, faults);
    }

    /// Hands every reply due at or before `now` to the machine, earliest
    /// first (send order among equals), pumping after each.
    ///
    /// # Panics
    /// When the machine keeps producing replies due now without end.
    pub fn deliver_due(
        &mut self,
        etcd: &mut ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
    ) {
        for _ in 0..LIVELOCK_LIMIT {
            let next = self
                .pending
                .iter()
                .enumerate()
                .filter(|(_, p)| p.due <= now)
                .min_by_key(|(_, p)| (p.due, p.seq))
                .map(|(i, _)| i);
            let Some(index) = next else { return };
            let p = self.pending.remove(index);
            if p.stream == Stream::Watch && !matches!(p.result, Ok(Response::WatchEvents { .. })) {
                self.watches.remove(&p.id);
            }
            self.machine.handle(
                now,
                RpcReply {
                    id: p.id,
                    result: p.result,
                }
                .into(),
            );
            self.pump(etcd, now, rng, faults);
        }
        panic!("livelock: replies keep coming due at one instant");
    }

    /// The earliest pending delivery or machine deadline.
    pub fn next_event_time(&self) -> Option<Instant> {
        let delivery = self.pending.iter().map(|p| p.due).min();
        next_time(&[delivery, self.machine.poll_timeout()])
    }

    /// Breaks every stream of this harness: each active (or queued) watch
    /// fails with `Unavailable("stream dropped")` and its undelivered batches
    /// are lost; every outstanding keepalive reply becomes that error (a
    /// renewal that ran stays run). Errors arrive `stream_drop_delay` later.
    pub fn drop_streams(&mut self, now: Instant) {
        let dropped = || Err(RpcError::Unavailable("stream dropped".into()));
        let due = now + self.stream_drop_delay;
        let watch_ids: Vec<RpcId> = self.watches.keys().copied().collect();
        for id in watch_ids {
            self.watches.remove(&id);
            self.pending.retain(|p| p.id != id);
            self.push(due, id, Stream::Watch, dropped());
        }
        for p in &mut self.pending {
            if p.stream == Stream::KeepAlive {
                p.result = dropped();
            }
        }
        let queued = std::mem::take(&mut self.queued);
        for (id, request) in queued {
            match request {
                Request::Watch { .. } => self.push(due, id, Stream::Watch, dropped()),
                Request::KeepAlive { .. } => self.push(due, id, Stream::KeepAlive, dropped()),
                other => self.queued.push_back((id, other)),
            }
        }
    }

    /// Every unary and keepalive reply still in flight becomes
    /// `Unavailable("connection lost")` (the requests did run). Watches are
    /// untouched; combine with `drop_streams` for a full connection reset.
    pub fn lose_all_inflight(&mut self) {
        for p in &mut self.pending {
            if p.stream != Stream::Watch {
                p.result = Err(RpcError::Unavailable("connection lost".into()));
            }
        }
    }

    /// Replies and watch batches not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Watches currently registered at the model etcd.
    pub fn active_watches(&self) -> usize {
        self.watches.len()
    }

    /// Requests waiting for a paused etcd.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// Takes every notification recorded so far.
    pub fn drain_notifications(&mut self) -> Vec<(Instant, M::Notification)> {
        std::mem::take(&mut self.notifications)
    }
}

/// The object-safe face of a [`Harness`], so harnesses of different machine
/// types can be stepped together by [`step`].
pub trait Node {
    /// See [`Harness::next_event_time`].
    fn next_event_time(&self) -> Option<Instant>;
    /// See [`Harness::fire_timeout`].
    fn fire_timeout(
        &mut self,
        etcd: &mut ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
    );
    /// See [`Harness::deliver_due`].
    fn deliver_due(
        &mut self,
        etcd: &mut ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
    );
    /// See [`Harness::pump`].
    fn pump(&mut self, etcd: &mut ModelEtcd, now: Instant, rng: &mut ChaCha8Rng, faults: &Faults);
}

impl<M: Machine> Node for Harness<M> {
    fn next_event_time(&self) -> Option<Instant> {
        Harness::next_event_time(self)
    }
    fn fire_timeout(
        &mut self,
        etcd: &mut ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
    ) {
        Harness::fire_timeout(self, etcd, now, rng, faults)
    }
    fn deliver_due(
        &mut self,
        etcd: &mut ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
    ) {
        Harness::deliver_due(self, etcd, now, rng, faults)
    }
    fn pump(&mut self, etcd: &mut ModelEtcd, now: Instant, rng: &mut ChaCha8Rng, faults: &Faults) {
        Harness::pump(self, etcd, now, rng, faults)
    }
}

/// The earliest of the given instants.
pub fn next_time(candidates: &[Option<Instant>]) -> Option<Instant> {
    candidates.iter().flatten().min().copied()
}

/// The next instant anything happens: a node's delivery or deadline, or a
/// lease expiry.
pub fn world_next_time(etcd: &ModelEtcd, nodes: &[&mut dyn Node]) -> Option<Instant> {
    let nodes_next = nodes.iter().filter_map(|n| n.next_event_time()).min();
    next_time(&[nodes_next, etcd.next_deadline()])
}

/// The next instant anything happens in a world of one node, when it is
/// no later than `until`.
pub fn next_due(etcd: &ModelEtcd, node: &mut dyn Node, until: Instant) -> Option<Instant> {
    let nodes: [&mut dyn Node; 1] = [node];
    world_next_time(etcd, &nodes).filter(|t| *t <= until)
}

/// Pumps every node until a whole round writes nothing, so every watch has
/// seen every write made at this instant.
pub fn settle(
    etcd: &mut ModelEtcd,
    nodes: &mut [&mut dyn Node],
    now: Instant,
    rng: &mut ChaCha8Rng,
    faults: &Faults,
) {
    for _ in 0..LIVELOCK_LIMIT {
        let before = etcd.revision();
        for n in nodes.iter_mut() {
            n.pump(etcd, now, rng, faults);
        }
        if etcd.revision() == before {
            return;
        }
    }
    panic!("livelock: writes keep happening at one instant");
}

/// Processes everything due at `now`, in the required order: lease expiry,
/// then machine timeouts, then reply deliveries, then [`settle`]; repeated
/// until nothing is due at `now` any more.
///
/// # Panics
/// When work keeps coming due at `now` without end (a machine livelock).
pub fn step(
    etcd: &mut ModelEtcd,
    nodes: &mut [&mut dyn Node],
    now: Instant,
    rng: &mut ChaCha8Rng,
    faults: &Faults,
) {
    for _ in 0..LIVELOCK_LIMIT {
        etcd.advance(now);
        for n in nodes.iter_mut() {
            n.fire_timeout(etcd, now, rng, faults);
        }
        for n in nodes.iter_mut() {
            n.deliver_due(etcd, now, rng, faults);
        }
        settle(etcd, nodes, now, rng, faults);
        let due = world_next_time(etcd, nodes).is_some_and(|t| t <= now);
        if !due {
            return;
        }
    }
    panic!("livelock: work keeps coming due at one instant");
}

/// Steps through every event instant up to and including `until`; returns
/// `until`. Use `world_next_time` + `step` directly to check invariants
/// between steps.
pub fn run_until(
    etcd: &mut ModelEtcd,
    nodes: &mut [&mut dyn Node],
    until: Instant,
    rng: &mut ChaCha8Rng,
    faults: &Faults,
) -> Instant {
    while let Some(t) = world_next_time(etcd, nodes) {
        if t > until {
            break;
        }
        step(etcd, nodes, t, rng, faults);
    }
    until
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetcoord_sm::RpcIds;

    fn put(key: &str, value: &str, lease: LeaseId) -> Request {
        Request::Put {
            key: key.into(),
            value: value.into(),
            lease,
        }
    }

    fn grant(etcd: &mut ModelEtcd, now: Instant, ttl_secs: i64) -> (LeaseId, i64) {
        match etcd.execute(now, &Request::Grant { ttl_secs }).unwrap() {
            Response::Granted { lease, ttl_secs } => (lease, ttl_secs),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn kvs(response: Response) -> Vec<KeyValue> {
        match response {
            Response::Range { kvs, .. } => kvs,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn keys(kvs: &[KeyValue]) -> Vec<String> {
        kvs.iter()
            .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
            .collect()
    }

    /// A machine that sends what the test queues and records what it gets.
    #[derive(Default)]
    struct Probe {
        ids: RpcIds,
        out: VecDeque<Command<String>>,
        log: Vec<(Instant, String)>,
        replies: Vec<(Instant, RpcReply)>,
        timer: Option<Instant>,
    }

    impl Probe {
        fn send(&mut self, request: Request) -> RpcId {
            let id = self.ids.next_id();
            self.out.push_back(Command::Rpc { id, request });
            id
        }
        fn replies_for(&self, id: RpcId) -> Vec<(Instant, Result<Response, RpcError>)> {
            self.replies
                .iter()
                .filter(|(_, r)| r.id == id)
                .map(|(t, r)| (*t, r.result.clone()))
                .collect()
        }
    }

    impl Machine for Probe {
        type Event = RpcReply;
        type Notification = String;
        fn stop_input() -> RpcReply {
            // The probe has no stop; this reply to nothing is ignored.
            RpcReply {
                id: RpcId(u64::MAX),
                result: Err(RpcError::Unavailable("stop".into())),
            }
        }
        fn is_finished(&self) -> bool {
            false
        }
        fn handle(&mut self, now: Instant, event: RpcReply) {
            self.log.push((now, format!("reply {}", event.id.0)));
            self.replies.push((now, event));
        }
        fn handle_timeout(&mut self, now: Instant) {
            if self.timer.is_some_and(|t| t <= now) {
                self.timer = None;
                self.log.push((now, "timeout".into()));
                self.out.push_back(Command::Notify("timed out".into()));
            }
        }
        fn poll_command(&mut self) -> Option<Command<String>> {
            self.out.pop_front()
        }
        fn poll_timeout(&self) -> Option<Instant> {
            self.timer
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn grant_applies_min_ttl_and_hands_out_distinct_nonzero_ids() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let (a, ttl_a) = grant(&mut etcd, t0, 1);
        let (b, ttl_b) = grant(&mut etcd, t0, 5);
        assert_eq!((ttl_a, ttl_b), (2, 5));
        assert!(a != 0 && b != 0 && a != b);
        assert_eq!(etcd.lease_deadline(a), Some(t0 + Duration::from_secs(2)));
        assert_eq!(etcd.revision(), 1, "grants do not write keys");
    }

    #[test]
    fn lease_expiry_deletes_keys_in_one_revision_with_delete_events() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let (lease, ttl) = grant(&mut etcd, t0, 2);
        etcd.execute(t0, &put("/h/a", "1", lease)).unwrap();
        etcd.execute(t0, &put("/h/b", "2", lease)).unwrap();
        etcd.execute(t0, &put("/other", "x", 0)).unwrap();
        assert_eq!(etcd.revision(), 4);
        let renewed = t0 + ms(1500);
        assert_eq!(
            etcd.execute(renewed, &Request::KeepAlive { lease })
                .unwrap(),
            Response::KeptAlive { ttl_secs: ttl }
        );
        etcd.advance(t0 + Duration::from_secs(2));
        assert!(etcd.lease_exists(lease), "renewal moved the deadline");
        etcd.advance(renewed + Duration::from_secs(2));
        assert!(!etcd.lease_exists(lease));
        assert_eq!(etcd.revision(), 5, "one revision for both keys");
        assert!(etcd.range_prefix(b"/h/").is_empty());
        assert!(etcd.get(b"/other").is_some());
        let events = etcd
            .watch_history(&KeyRange::Prefix(b"/h/".to_vec()), 5)
            .unwrap();
        assert_eq!(events.len(), 2);
        for e in &events {
            assert_eq!(e.kind, EventKind::Delete);
            assert_eq!(e.kv.mod_revision, 5);
            assert_eq!(e.prev_kv.as_ref().unwrap().lease, lease);
        }
        assert_eq!(
            etcd.execute(renewed, &Request::KeepAlive { lease })
                .unwrap(),
            Response::KeptAlive { ttl_secs: 0 }
        );
    }

    #[test]
    fn leases_expire_in_deadline_order() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let (late, _) = grant(&mut etcd, t0, 5);
        let (early, _) = grant(&mut etcd, t0, 3);
        etcd.execute(t0, &put("late", "", late)).unwrap();
        etcd.execute(t0, &put("early", "", early)).unwrap();
        etcd.advance(t0 + Duration::from_secs(10));
        let events = etcd
            .watch_history(&KeyRange::Prefix(Vec::new()), 4)
            .unwrap();
        assert_eq!(
            keys(&events.iter().map(|e| e.kv.clone()).collect::<Vec<_>>()),
            ["early", "late"]
        );
        assert_eq!(events[0].kv.mod_revision + 1, events[1].kv.mod_revision);
    }

    #[test]
    fn revoke_and_put_reject_unknown_leases() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        assert_eq!(
            etcd.execute(t0, &Request::Revoke { lease: 42 }),
            Err(RpcError::Rejected("lease not found".into()))
        );
        assert_eq!(
            etcd.execute(t0, &put("k", "v", 42)),
            Err(RpcError::Rejected("requested lease not found".into()))
        );
        let (lease, _) = grant(&mut etcd, t0, 10);
        etcd.execute(t0, &put("k", "v", lease)).unwrap();
        assert_eq!(
            etcd.execute(t0, &Request::Revoke { lease }),
            Ok(Response::Revoked)
        );
        assert!(etcd.get(b"k").is_none());
        assert_eq!(etcd.revision(), 3);
    }

    #[test]
    fn put_tracks_create_mod_version() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        assert_eq!(
            etcd.execute(t0, &put("k", "1", 0)),
            Ok(Response::Put { revision: 2 })
        );
        etcd.execute(t0, &put("k", "2", 0)).unwrap();
        let kv = etcd.get(b"k").unwrap();
        assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
        let events = etcd
            .watch_history(&KeyRange::Key(b"k".to_vec()), 3)
            .unwrap();
        assert_eq!(events[0].prev_kv.as_ref().unwrap().value, b"1");
    }

    #[test]
    fn delete_prefix_is_one_revision_and_deleting_nothing_is_none() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        for k in ["/p/a", "/p/b", "/q"] {
            etcd.execute(t0, &put(k, "", 0)).unwrap();
        }
        let r = etcd
            .execute(t0, &Request::Delete(KeyRange::Prefix(b"/p/".to_vec())))
            .unwrap();
        assert_eq!(
            r,
            Response::Deleted {
                revision: 5,
                deleted: 2
            }
        );
        let r = etcd
            .execute(t0, &Request::Delete(KeyRange::Key(b"/nope".to_vec())))
            .unwrap();
        assert_eq!(
            r,
            Response::Deleted {
                revision: 5,
                deleted: 0
            }
        );
        assert_eq!(keys(&etcd.range_prefix(b"")), ["/q"]);
    }

    #[test]
    fn txn_compares_and_shares_one_revision() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let absent = Compare::CreateRevisionEquals {
            key: b"a".to_vec(),
            revision: 0,
        };
        let create = Txn {
            compare: vec![absent.clone()],
            success: vec![
                TxnOp::Put {
                    key: b"a".to_vec(),
                    value: b"1".to_vec(),
                    lease: 0,
                },
                TxnOp::Put {
                    key: b"b".to_vec(),
                    value: b"2".to_vec(),
                    lease: 0,
                },
                TxnOp::Range(RangeRequest::all(KeyRange::Key(b"a".to_vec()))),
            ],
            failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(
                b"a".to_vec(),
            )))],
        };
        let Response::Txn {
            revision,
            succeeded,
            responses,
        } = etcd.execute(t0, &Request::Txn(create.clone())).unwrap()
        else {
            panic!()
        };
        assert!(succeeded);
        assert_eq!(revision, 2);
        assert_eq!(etcd.get(b"b").unwrap().mod_revision, 2);
        assert!(matches!(&responses[2], TxnOpResponse::Range { kvs } if kvs[0].value == b"1"));
        // Same txn again: the key exists now, so the failure branch reads it.
        let Response::Txn {
            revision,
            succeeded,
            responses,
        } = etcd.execute(t0, &Request::Txn(create)).unwrap()
        else {
            panic!()
        };
        assert!(!succeeded);
        assert_eq!(revision, 2, "a read-only branch does not bump the revision");
        assert!(
            matches!(&responses[0], TxnOpResponse::Range { kvs } if kvs[0].create_revision == 2)
        );
        let guarded = |rev| Txn {
            compare: vec![Compare::ModRevisionEquals {
                key: b"a".to_vec(),
                revision: rev,
            }],
            success: vec![TxnOp::Delete(KeyRange::Key(b"a".to_vec()))],
            failure: vec![],
        };
        let r = etcd.execute(t0, &Request::Txn(guarded(7))).unwrap();
        assert!(matches!(
            r,
            Response::Txn {
                succeeded: false,
                revision: 2,
                ..
            }
        ));
        let r = etcd.execute(t0, &Request::Txn(guarded(2))).unwrap();
        assert!(matches!(
            r,
            Response::Txn {
                succeeded: true,
                revision: 3,
                ..
            }
        ));
        assert!(etcd.get(b"a").is_none());
    }

    #[test]
    fn txn_rejects_duplicates_and_unknown_leases_without_writing() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let p = |k: &str, lease| TxnOp::Put {
            key: k.into(),
            value: Vec::new(),
            lease,
        };
        let dup = Txn {
            compare: vec![],
            success: vec![p("x", 0), p("x", 0)],
            failure: vec![],
        };
        assert!(matches!(
            etcd.execute(t0, &Request::Txn(dup)),
            Err(RpcError::Rejected(_))
        ));
        let overlap = Txn {
            compare: vec![],
            success: vec![p("x/1", 0), TxnOp::Delete(KeyRange::Prefix(b"x/".to_vec()))],
            failure: vec![],
        };
        assert!(matches!(
            etcd.execute(t0, &Request::Txn(overlap)),
            Err(RpcError::Rejected(_))
        ));
        let bad_lease = Txn {
            compare: vec![],
            success: vec![p("y", 0), p("z", 99)],
            failure: vec![],
        };
        assert_eq!(
            etcd.execute(t0, &Request::Txn(bad_lease)),
            Err(RpcError::Rejected("requested lease not found".into()))
        );
        assert_eq!(etcd.revision(), 1);
        assert!(etcd.range_prefix(b"").is_empty());
    }

    #[test]
    fn range_sorts_limits_and_bounds_create_revision() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        for k in ["/e/c", "/e/a", "/e/b", "/f"] {
            etcd.execute(t0, &put(k, "", 0)).unwrap();
        }
        let range = |sort, limit, max_create_revision| {
            Request::Range(RangeRequest {
                range: KeyRange::Prefix(b"/e/".to_vec()),
                sort,
                limit,
                max_create_revision,
            })
        };
        let r = |etcd: &mut ModelEtcd, req| keys(&kvs(etcd.execute(t0, &req).unwrap()));
        assert_eq!(
            r(&mut etcd, range(SortOrder::Key, 0, 0)),
            ["/e/a", "/e/b", "/e/c"]
        );
        assert_eq!(
            r(&mut etcd, range(SortOrder::CreateAscending, 0, 0)),
            ["/e/c", "/e/a", "/e/b"]
        );
        assert_eq!(
            r(&mut etcd, range(SortOrder::CreateDescending, 1, 0)),
            ["/e/b"]
        );
        assert_eq!(
            r(&mut etcd, range(SortOrder::CreateDescending, 1, 3)),
            ["/e/a"]
        );
        assert_eq!(r(&mut etcd, range(SortOrder::Key, 2, 0)), ["/e/a", "/e/b"]);
        let resp = etcd.execute(t0, &range(SortOrder::Key, 0, 0)).unwrap();
        assert!(matches!(resp, Response::Range { revision: 5, .. }));
    }

    #[test]
    fn compaction_drops_history_and_refuses_old_starts() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        for v in ["1", "2", "3"] {
            etcd.execute(t0, &put("k", v, 0)).unwrap();
        }
        etcd.compact(3);
        let all = KeyRange::Prefix(Vec::new());
        assert_eq!(etcd.watch_history(&all, 3), Err(3));
        assert_eq!(etcd.watch_history(&all, 4).unwrap().len(), 1);
        etcd.compact(100);
        assert_eq!(
            etcd.compacted_revision(),
            4,
            "clamped to the current revision"
        );
    }

    #[test]
    fn pause_blocks_work_and_resume_expires_overdue_leases_first() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let faults = Faults::none();
        let mut rng = rng(1);
        let (lease, _) = grant(&mut etcd, t0, 2);
        etcd.execute(t0, &put("/h/x", "", lease)).unwrap();
        let mut h = Harness::new(Probe::default());
        etcd.pause();
        let t1 = t0 + Duration::from_secs(1);
        let id = h.machine.send(Request::KeepAlive { lease });
        h.pump(&mut etcd, t1, &mut rng, &faults);
        assert_eq!(h.queued(), 1);
        let t5 = t0 + Duration::from_secs(5);
        etcd.advance(t5);
        assert!(etcd.lease_exists(lease), "a paused etcd expires nothing");
        etcd.resume(t5);
        assert!(!etcd.lease_exists(lease));
        assert!(etcd.get(b"/h/x").is_none());
        h.pump(&mut etcd, t5, &mut rng, &faults);
        h.deliver_due(&mut etcd, t5 + ms(1), &mut rng, &faults);
        assert_eq!(
            h.machine.replies_for(id),
            [(t5 + ms(1), Ok(Response::KeptAlive { ttl_secs: 0 }))]
        );
    }

    #[test]
    fn extend_all_leases_gives_a_full_ttl_from_now() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let (lease, _) = grant(&mut etcd, t0, 3);
        let t2 = t0 + Duration::from_secs(2);
        etcd.extend_all_leases(t2);
        assert_eq!(
            etcd.lease_deadline(lease),
            Some(t2 + Duration::from_secs(3))
        );
        assert_eq!(etcd.next_deadline(), Some(t2 + Duration::from_secs(3)));
    }

    #[test]
    fn replies_arrive_after_the_latency_and_not_before() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let faults = Faults {
            latency: (ms(5), ms(9)),
            ..Faults::none()
        };
        let mut rng = rng(7);
        let mut h = Harness::new(Probe::default());
        let id = h.machine.send(put("k", "v", 0));
        h.pump(&mut etcd, t0, &mut rng, &faults);
        assert!(etcd.get(b"k").is_some(), "executed at the send instant");
        let due = h.next_event_time().unwrap();
        assert!(due >= t0 + ms(5) && due <= t0 + ms(9), "{:?}", due - t0);
        h.deliver_due(&mut etcd, due - Duration::from_nanos(1), &mut rng, &faults);
        assert!(h.machine.replies.is_empty());
        h.deliver_due(&mut etcd, due, &mut rng, &faults);
        assert_eq!(
            h.machine.replies_for(id),
            [(due, Ok(Response::Put { revision: 2 }))]
        );
        assert_eq!(h.next_event_time(), None);
    }

    #[test]
    fn latency_draws_cover_the_range() {
        let faults = Faults::moderate();
        let mut rng = rng(3);
        let draws: Vec<Duration> = (0..1000).map(|_| faults.sample_latency(&mut rng)).collect();
        assert!(draws
            .iter()
            .all(|d| *d >= faults.latency.0 && *d <= faults.latency.1));
        assert!(draws.iter().any(|d| *d < ms(5)) && draws.iter().any(|d| *d > ms(15)));
        let hits = (0..10_000).filter(|_| chance(&mut rng, 0.25)).count();
        assert!((2200..2800).contains(&hits), "{hits}");
    }

    #[test]
    fn injected_faults_fail_or_hide_writes() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let mut rng = rng(5);
        let mut h = Harness::new(Probe::default());
        let fail = Faults {
            fail_request: 1.0,
            ..Faults::none()
        };
        let a = h.machine.send(put("a", "", 0));
        h.pump(&mut etcd, t0, &mut rng, &fail);
        let lose = Faults {
            lose_reply: 1.0,
            ..Faults::none()
        };
        let b = h.machine.send(put("b", "", 0));
        h.pump(&mut etcd, t0, &mut rng, &lose);
        h.deliver_due(&mut etcd, t0 + ms(1), &mut rng, &lose);
        assert!(etcd.get(b"a").is_none(), "a failed request does not run");
        assert!(etcd.get(b"b").is_some(), "a lost reply's write happened");
        for id in [a, b] {
            assert!(matches!(
                h.machine.replies_for(id)[0].1,
                Err(RpcError::Unavailable(_))
            ));
        }
        assert_eq!(h.faults_injected, 2);
    }

    fn watch_batches(h: &Harness<Probe>, id: RpcId) -> Vec<Vec<(EventKind, String, Revision)>> {
        h.machine
            .replies_for(id)
            .into_iter()
            .map(|(_, r)| match r {
                Ok(Response::WatchEvents { events }) => events
                    .iter()
                    .map(|e| {
                        (
                            e.kind,
                            String::from_utf8(e.kv.key.clone()).unwrap(),
                            e.kv.mod_revision,
                        )
                    })
                    .collect(),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    #[test]
    fn harness_delivers_watch_history_then_live_events_in_order() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let faults = Faults {
            latency: (ms(1), ms(30)),
            ..Faults::none()
        };
        let mut rng = rng(11);
        let (lease, _) = grant(&mut etcd, t0, 2);
        etcd.execute(t0, &put("/w/a", "", 0)).unwrap(); // 2
        etcd.execute(t0, &put("/x", "", 0)).unwrap(); // 3, outside the range
        etcd.execute(t0, &put("/w/b", "", lease)).unwrap(); // 4
        let mut h = Harness::new(Probe::default());
        let id = h.machine.send(Request::Watch {
            range: KeyRange::Prefix(b"/w/".to_vec()),
            start_revision: 2,
        });
        h.pump(&mut etcd, t0, &mut rng, &faults);
        let mut other = Harness::new(Probe::default());
        let mut now = t0;
        // Writes by another harness and the lease expiring, each picked up
        // with random latency; batches must still arrive in revision order.
        for i in 0..20 {
            now += ms(3);
            other.machine.send(put(&format!("/w/k{i}"), "", 0));
            step(&mut etcd, &mut [&mut h, &mut other], now, &mut rng, &faults);
        }
        let until = t0 + Duration::from_secs(3);
        run_until(
            &mut etcd,
            &mut [&mut h, &mut other],
            until,
            &mut rng,
            &faults,
        );
        let batches = watch_batches(&h, id);
        assert!(batches[0].is_empty(), "the created notice comes first");
        let revs: Vec<Revision> = batches[1..].iter().map(|b| b[0].2).collect();
        assert_eq!(revs[..2], [2, 4]);
        assert!(revs.windows(2).all(|w| w[0] < w[1]), "{revs:?}");
        assert_eq!(revs.len(), 2 + 20 + 1);
        let last = batches.last().unwrap();
        assert_eq!(last[0].0, EventKind::Delete);
        assert_eq!(last[0].1, "/w/b");
        let times: Vec<Instant> = h.machine.replies_for(id).iter().map(|(t, _)| *t).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn compaction_cancels_a_lagging_watch() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let faults = Faults::none();
        let mut rng = rng(2);
        for v in ["1", "2", "3"] {
            etcd.execute(t0, &put("k", v, 0)).unwrap();
        }
        etcd.compact(3);
        let mut h = Harness::new(Probe::default());
        let old = h.machine.send(Request::Watch {
            range: KeyRange::Key(b"k".to_vec()),
            start_revision: 2,
        });
        h.pump(&mut etcd, t0, &mut rng, &faults);
        h.deliver_due(&mut etcd, t0 + ms(1), &mut rng, &faults);
        let replies: Vec<_> = h
            .machine
            .replies_for(old)
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        assert_eq!(
            replies,
            [
                Ok(Response::WatchEvents { events: vec![] }),
                Ok(Response::WatchCanceled {
                    compact_revision: 3
                })
            ]
        );
        assert_eq!(h.active_watches(), 0);
        // A live watch that has not yet been told about revision 5 when 5 is
        // compacted is cancelled too.
        let live = h.machine.send(Request::Watch {
            range: KeyRange::Key(b"k".to_vec()),
            start_revision: 0,
        });
        h.pump(&mut etcd, t0, &mut rng, &faults);
        etcd.execute(t0, &put("k", "4", 0)).unwrap();
        etcd.execute(t0, &put("k", "5", 0)).unwrap();
        etcd.compact(6);
        h.pump(&mut etcd, t0, &mut rng, &faults);
        h.deliver_due(&mut etcd, t0 + ms(1), &mut rng, &faults);
        let last = h.machine.replies_for(live).pop().unwrap().1;
        assert_eq!(
            last,
            Ok(Response::WatchCanceled {
                compact_revision: 6
            })
        );
    }

    #[test]
    fn drop_streams_fails_watches_and_outstanding_keepalives() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let faults = Faults {
            latency: (ms(10), ms(10)),
            ..Faults::none()
        };
        let mut rng = rng(4);
        let (lease, _) = grant(&mut etcd, t0, 2);
        let mut h = Harness::new(Probe::default());
        let w = h.machine.send(Request::Watch {
            range: KeyRange::Prefix(Vec::new()),
            start_revision: 0,
        });
        let k = h.machine.send(Request::KeepAlive { lease });
        let p = h.machine.send(put("k", "", 0));
        h.pump(&mut etcd, t0, &mut rng, &faults);
        h.drop_streams(t0 + ms(2));
        run_until(&mut etcd, &mut [&mut h], t0 + ms(50), &mut rng, &faults);
        let dropped = Err(RpcError::Unavailable("stream dropped".into()));
        assert_eq!(h.machine.replies_for(w), [(t0 + ms(3), dropped.clone())]);
        assert_eq!(h.machine.replies_for(k), [(t0 + ms(10), dropped)]);
        assert_eq!(
            h.machine.replies_for(p),
            [(t0 + ms(10), Ok(Response::Put { revision: 2 }))]
        );
        assert_eq!(
            etcd.lease_deadline(lease),
            Some(t0 + Duration::from_secs(2)),
            "the renewal ran"
        );
        assert_eq!(h.active_watches(), 0);
    }

    #[test]
    fn cancel_forgets_replies_and_watches() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let faults = Faults::none();
        let mut rng = rng(6);
        let mut h = Harness::new(Probe::default());
        let w = h.machine.send(Request::Watch {
            range: KeyRange::Prefix(Vec::new()),
            start_revision: 0,
        });
        let p = h.machine.send(put("k", "", 0));
        h.machine.out.push_back(Command::Cancel { id: w });
        h.machine.out.push_back(Command::Cancel { id: p });
        h.pump(&mut etcd, t0, &mut rng, &faults);
        run_until(&mut etcd, &mut [&mut h], t0 + ms(50), &mut rng, &faults);
        assert!(h.machine.replies.is_empty());
        assert_eq!((h.active_watches(), h.in_flight()), (0, 0));
    }

    #[test]
    fn timeouts_fire_before_deliveries_at_the_same_instant() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let faults = Faults {
            latency: (ms(4), ms(4)),
            ..Faults::none()
        };
        let mut rng = rng(8);
        let mut a = Harness::new(Probe::default());
        let mut b = Harness::new(Probe::default());
        b.machine.send(put("k", "", 0));
        b.pump(&mut etcd, t0, &mut rng, &faults);
        a.machine.timer = Some(t0 + ms(4));
        b.machine.timer = Some(t0 + ms(4));
        run_until(
            &mut etcd,
            &mut [&mut b, &mut a],
            t0 + ms(10),
            &mut rng,
            &faults,
        );
        let log: Vec<&str> = b.machine.log.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(log, ["timeout", "reply 0"]);
        assert_eq!(a.notifications, [(t0 + ms(4), "timed out".to_string())]);
    }

    #[test]
    fn next_time_is_the_minimum() {
        let t0 = Instant::now();
        assert_eq!(
            next_time(&[None, Some(t0 + ms(2)), Some(t0 + ms(1)), None]),
            Some(t0 + ms(1))
        );
        assert_eq!(next_time(&[None, None]), None);
    }

    #[test]
    fn lose_all_inflight_hides_results_of_requests_that_ran() {
        let t0 = Instant::now();
        let mut etcd = ModelEtcd::new();
        let faults = Faults::none();
        let mut rng = rng(9);
        let mut h = Harness::new(Probe::default());
        let w = h.machine.send(Request::Watch {
            range: KeyRange::Prefix(Vec::new()),
            start_revision: 0,
        });
        let p = h.machine.send(put("k", "", 0));
        h.pump(&mut etcd, t0, &mut rng, &faults);
        h.lose_all_inflight();
        run_until(&mut etcd, &mut [&mut h], t0 + ms(10), &mut rng, &faults);
        assert!(etcd.get(b"k").is_some());
        let lost = Err(RpcError::Unavailable("connection lost".into()));
        assert_eq!(h.machine.replies_for(p), [(t0 + ms(1), lost)]);
        assert_eq!(
            h.machine.replies_for(w).len(),
            2,
            "the watch is untouched and sees the put"
        );
    }

    /// Everything is a function of the seed: two runs with the same seed
    /// under faults give the same replies at the same instants.
    #[test]
    fn same_seed_same_run() {
        fn run(seed: u64) -> Vec<(Duration, RpcReply)> {
            let t0 = Instant::now();
            let mut etcd = ModelEtcd::new();
            let faults = Faults::moderate();
            let mut rng = rng(seed);
            let mut h = Harness::new(Probe::default());
            h.machine.send(Request::Watch {
                range: KeyRange::Prefix(Vec::new()),
                start_revision: 0,
            });
            let mut now = t0;
            for i in 0..50 {
                now += ms(7);
                h.machine.send(put(&format!("k{}", i % 5), "", 0));
                step(&mut etcd, &mut [&mut h], now, &mut rng, &faults);
            }
            run_until(&mut etcd, &mut [&mut h], now + ms(100), &mut rng, &faults);
            h.machine
                .replies
                .iter()
                .map(|(t, r)| (*t - t0, r.clone()))
                .collect()
        }
        let a = run(21);
        assert_eq!(a, run(21));
        assert_ne!(a, run(22));
        assert!(
            a.iter().any(|(_, r)| r.result.is_err()),
            "moderate faults inject something"
        );
    }
}
