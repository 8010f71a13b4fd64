//! Fuzz the watch machine against the shared model etcd
//! (`fleetcoord-test-support`).
//!
//! Operations change the model's store (puts, with or without a lease,
//! deletes, and transactions that delete several keys at one revision as a
//! lease revoke does), answer the machine's one outstanding request
//! coherently (snapshots read from the model, watch batches per revision
//! from its history, repeats of old batches, compaction), inject failures,
//! stall the consumer, stop, or feed arbitrary replies. After every step:
//! * the consumer's view, rebuilt from the notices alone, equals `known()`;
//! * no `Up` for a key already up, no `Updated`/`Down` for a key not up, a
//!   `Down` carries exactly the last-seen value, an `Updated` is newer than
//!   what the consumer has (repeats are never re-reported);
//! * `Synced` at most once and before any non-replay notice; invalid keys
//!   reported once and never as `Up`; leave markers (keys 6 and 7, of hosts
//!   0 and 1) never reported at all;
//! * a `Left` (like a `Down` otherwise) only for a key whose leave marker
//!   was written on the key's (non-zero) lease after the key was created;
//! * incarnation keys (keys 8 and 9, of hosts 0 and 1) never reported;
//!   every `Up`/`Updated` told with the incarnation written with that
//!   state in one transaction (`Register`), or with none (0) when none was
//!   — or when the incarnation key was rewritten or deleted alone since,
//!   which a snapshot cannot see past; every `Down`/`Left` with the one
//!   last told for its key;
//! * at most one request outstanding; nothing issued after `Stop`;
//! * `poll_timeout` never before `now`;
//! * once live and caught up with the model's history (and no arbitrary
//!   reply reached an outstanding request), the view equals the model's
//!   keys under the prefix.

#![no_main]

use arbitrary::Arbitrary;
use fleetcoord_sm::watch::{
    incarnation_key, leave_marker_key, parse_leave_marker, KeyRule, Watch, WatchConfig, WatchInput,
    WatchNotice,
};
use fleetcoord_sm::{
    BackoffConfig, Command, KeyRange, KeyValue, LeaseId, Machine, RangeRequest, Request, Response,
    Revision, RpcError, RpcId, RpcReply, Txn, TxnOp, WatchEvent,
};
use fleetcoord_test_support::{Incarnations, ModelEtcd};
use libfuzzer_sys::fuzz_target;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const PREFIX: &[u8] = b"/h/";
const MAX_COMMANDS_PER_STEP: usize = 10_000;
/// TTL of the lease keys may be bound to: longer than any run (256 steps of
/// at most 65.5 s), so only a delete removes a key and the store changes only
/// when an operation says so.
const LEASE_TTL_SECS: i64 = 24 * 60 * 60;

/// Keys 0..4 are valid host ids, 4 is an invalid key under the prefix, 5 is
/// outside the prefix, 6 and 7 are the leave markers of hosts 0 and 1, 8
/// and 9 their incarnation keys.
fn key(index: u8) -> Vec<u8> {
    match index % 10 {
        4 => b"/h/not-a-host".to_vec(),
        5 => b"/elsewhere".to_vec(),
        n @ (6 | 7) => leave_marker_key(&key(n - 6)),
        n @ (8 | 9) => incarnation_key(&key(n - 8)),
        n => format!("/h/00000000-0000-0000-0000-00000000000{n}").into_bytes(),
    }
}

fn is_marker(key: &[u8]) -> bool {
    key.strip_prefix(PREFIX)
        .is_some_and(|s| parse_leave_marker(s).is_some())
}

/// A snapshot page: the prefix, or the rest of it from some key.
fn assert_page(r: &RangeRequest) {
    match &r.range {
        KeyRange::Prefix(p) => assert_eq!(p.as_slice(), PREFIX),
        KeyRange::PrefixFrom { prefix, from } => {
            assert_eq!(prefix.as_slice(), PREFIX);
            assert!(from.as_slice() > PREFIX);
        }
        KeyRange::PrefixSpan { prefix, from, to } => {
            assert_eq!(prefix.as_slice(), PREFIX);
            assert!(from.as_slice() > PREFIX);
            assert!(to > from && to.starts_with(PREFIX));
        }
        other => panic!("a snapshot page of {other:?}"),
    }
    assert!(r.limit >= 1, "an unlimited page");
}

fn is_valid(key: &[u8]) -> bool {
    key.strip_prefix(PREFIX)
        .is_some_and(|s| KeyRule::HostId.accepts(s))
}

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u16),
    Put {
        key: u8,
        value: u8,
        lease: bool,
    },
    Delete(u8),
    Revoke(u16),
    /// Host 0 or 1 written as `HostLiveness` does: its incarnation key
    /// (any decimal, 0 included, which is no incarnation) and then the
    /// host key, in one transaction, on one lease.
    Register {
        host: bool,
        value: u8,
        incarnation: u8,
        lease: bool,
    },
    ReplyRange,
    DeliverWatch(u8),
    RepeatOld(u8),
    Fail,
    CancelWatch,
    Compact,
    WrongVariant,
    ConsumerFull,
    ConsumerReady,
    Stop,
    Stray(RpcReply),
    GarbageToOutstanding(Result<Response, RpcError>),
}

#[derive(Debug)]
enum Outstanding {
    Range(RpcId, RangeRequest),
    Watch { id: RpcId, cursor: Revision },
}

struct Consumer {
    view: BTreeMap<Vec<u8>, KeyValue>,
    /// Every put of a leave marker so far: (key, lease, revision).
    marker_puts: Vec<(Vec<u8>, LeaseId, Revision)>,
    synced: bool,
    reported: BTreeSet<Vec<u8>>,
    /// The machine gave up with `Failed` (its last notice).
    failed: bool,
    /// What incarnations were written, checked against those told.
    incarnations: Incarnations,
}

impl Consumer {
    fn apply(&mut self, notice: WatchNotice, replay: bool) {
        if !replay {
            assert!(self.synced, "non-replay notice before Synced: {notice:?}");
        }
        assert!(!self.failed, "{notice:?} after Failed");
        if let Err(e) = self.incarnations.check(&notice) {
            panic!("{e}");
        }
        match notice {
            WatchNotice::Incarnation(_) => {}
            WatchNotice::Up(kv) => {
                assert!(is_valid(&kv.key), "Up for an invalid key");
                assert!(
                    self.view.insert(kv.key.clone(), kv).is_none(),
                    "Up for a key already up"
                );
            }
            WatchNotice::Updated(kv) => {
                let before = self.view.get(&kv.key).expect("Updated for a key not up");
                assert_eq!(before.create_revision, kv.create_revision);
                assert!(
                    kv.mod_revision > before.mod_revision,
                    "invented Updated: {kv:?}"
                );
                self.view.insert(kv.key.clone(), kv);
            }
            WatchNotice::Down(kv) => {
                let before = self.view.remove(&kv.key).expect("Down for a key not up");
                assert_eq!(before, kv, "Down must carry the last-seen value");
            }
            WatchNotice::Left(kv) => {
                let before = self.view.remove(&kv.key).expect("Left for a key not up");
                assert_eq!(before, kv, "Left must carry the last-seen value");
                let marker = leave_marker_key(&kv.key);
                assert!(
                    self.marker_puts.iter().any(|(k, lease, rev)| *k == marker
                        && *lease != 0
                        && *lease == kv.lease
                        && *rev > kv.create_revision),
                    "Left without a marker on its lease after its creation: {kv:?}"
                );
            }
            WatchNotice::Synced => {
                assert!(!self.synced, "Synced twice");
                self.synced = true;
            }
            WatchNotice::InvalidKey(key) => {
                assert!(!is_valid(&key) && key.starts_with(PREFIX));
                assert!(!is_marker(&key), "a leave marker reported as invalid");
                assert!(
                    key != self::key(8) && key != self::key(9),
                    "an incarnation key reported as invalid"
                );
                assert!(self.reported.insert(key), "invalid key reported twice");
            }
            WatchNotice::Failed(e) => {
                assert!(!e.is_retryable(), "gave up on a retryable {e:?}");
                self.failed = true;
            }
            other => panic!("unknown notice {other:?}"),
        }
    }
}

struct World {
    machine: Watch,
    etcd: ModelEtcd,
    /// The lease a put may bind its key to.
    lease: LeaseId,
    consumer: Consumer,
    outstanding: Option<Outstanding>,
    now: Instant,
    stopped: bool,
    /// An arbitrary reply reached an outstanding request: the machine's view
    /// may legitimately differ from the store from now on.
    tainted: bool,
    next_stray: u64,
}

impl World {
    /// A write the target makes itself; the model accepts every one.
    fn write(&mut self, request: Request) {
        let before = self.etcd.revision();
        if let Err(e) = self.etcd.execute(self.now, &request) {
            panic!("the model refused {request:?}: {e:?}");
        }
        let at = self.etcd.revision();
        if let Request::Put { key, lease, .. } = &request {
            if is_marker(key) {
                self.consumer.marker_puts.push((key.clone(), *lease, at));
            }
        }
        if at == before {
            return;
        }
        // Which incarnation keys this write touched.
        let keys: Vec<&[u8]> = match &request {
            Request::Put { key, .. } | Request::Delete(KeyRange::Key(key)) => vec![key],
            Request::Txn(txn) => txn
                .success
                .iter()
                .filter_map(|op| match op {
                    TxnOp::Put { key, .. } | TxnOp::Delete(KeyRange::Key(key)) => {
                        Some(key.as_slice())
                    }
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        for written in keys {
            if let Some(host) = written.strip_suffix(b"/incarnation".as_slice()) {
                self.consumer.incarnations.touched(host.to_vec(), at);
            }
        }
    }

    /// The watch batch etcd sends for `revision`: the events under the
    /// prefix written at that revision (none if it touched other keys or
    /// was compacted away).
    fn batch(&self, revision: Revision) -> Vec<WatchEvent> {
        let range = KeyRange::Prefix(PREFIX.to_vec());
        let events = self
            .etcd
            .watch_history(&range, revision)
            .unwrap_or_default();
        events
            .into_iter()
            .take_while(|e| e.kv.mod_revision == revision)
            .collect()
    }

    fn feed(&mut self, input: WatchInput) {
        self.machine.handle(self.now, input);
        self.drain();
    }

    fn reply(&mut self, id: RpcId, result: Result<Response, RpcError>) {
        self.feed(WatchInput::Rpc(RpcReply { id, result }));
    }

    fn drain(&mut self) {
        let replay = !self.consumer.synced;
        for _ in 0..MAX_COMMANDS_PER_STEP {
            let Some(command) = self.machine.poll_command() else {
                return self.check();
            };
            match command {
                Command::Rpc { id, request } => {
                    assert!(!self.stopped, "request after Stop");
                    assert!(self.outstanding.is_none(), "two requests outstanding");
                    self.next_stray = self.next_stray.max(id.0 + 1);
                    self.outstanding = Some(match request {
                        Request::Range(r) => {
                            assert_page(&r);
                            Outstanding::Range(id, r)
                        }
                        Request::Watch {
                            range,
                            start_revision,
                        } => {
                            assert_eq!(range, KeyRange::Prefix(PREFIX.to_vec()));
                            Outstanding::Watch {
                                id,
                                cursor: start_revision,
                            }
                        }
                        other => panic!("unexpected request {other:?}"),
                    });
                }
                Command::Cancel { id } => {
                    if self.outstanding_id() == Some(id) {
                        self.outstanding = None;
                    }
                }
                Command::Notify(notice) => self.consumer.apply(notice, replay),
            }
        }
        panic!("the machine produced an unbounded command stream");
    }

    fn outstanding_id(&self) -> Option<RpcId> {
        match self.outstanding {
            Some(Outstanding::Range(id, _)) | Some(Outstanding::Watch { id, .. }) => Some(id),
            None => None,
        }
    }

    fn check(&self) {
        let known: Vec<&KeyValue> = self.machine.known().collect();
        let view: Vec<&KeyValue> = self.consumer.view.values().collect();
        assert_eq!(known, view, "known() differs from the notices");
        assert_eq!(self.machine.is_synced(), self.consumer.synced);
        if let Some(at) = self.machine.poll_timeout() {
            assert!(at >= self.now, "deadline in the past");
            assert!(!self.stopped);
            assert!(!self.consumer.failed, "a timer after Failed");
        }
        if self.consumer.failed {
            assert!(self.outstanding.is_none(), "a request after Failed");
        }
        let caught_up = matches!(
            self.outstanding,
            Some(Outstanding::Watch { cursor, .. }) if cursor > self.etcd.revision()
        );
        if self.machine.is_live() && caught_up && !self.tainted {
            let store = self.etcd.range_prefix(PREFIX);
            // Markers are never in the view.
            let expected: Vec<&KeyValue> = store.iter().filter(|kv| is_valid(&kv.key)).collect();
            assert_eq!(view, expected, "settled view differs from the store");
        }
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Advance(ms) => {
                self.now += Duration::from_millis(u64::from(ms));
                self.machine.handle_timeout(self.now);
                self.drain();
            }
            Op::Put {
                key: k,
                value,
                lease,
            } => self.write(Request::Put {
                key: key(k),
                value: vec![value],
                lease: if lease { self.lease } else { 0 },
            }),
            Op::Delete(k) => self.write(Request::Delete(KeyRange::Key(key(k)))),
            Op::Register {
                host,
                value,
                incarnation,
                lease,
            } => {
                let (host, lease) = (key(u8::from(host)), if lease { self.lease } else { 0 });
                self.write(Request::Txn(Txn {
                    compare: Vec::new(),
                    success: vec![
                        TxnOp::Put {
                            key: incarnation_key(&host),
                            value: incarnation.to_string().into_bytes(),
                            lease,
                        },
                        TxnOp::Put {
                            key: host.clone(),
                            value: vec![value],
                            lease,
                        },
                    ],
                    failure: Vec::new(),
                }));
                let at = self.etcd.revision();
                self.consumer
                    .incarnations
                    .written(host, at, lease, u64::from(incarnation));
            }
            Op::Revoke(mask) => {
                // Hosts 0 and 1 with their markers (bits 6, 7) and
                // incarnation keys (bits 8, 9), at one revision: what a
                // lease revoke does.
                let success = (0..10)
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| TxnOp::Delete(KeyRange::Key(key(i))))
                    .collect();
                self.write(Request::Txn(Txn {
                    compare: Vec::new(),
                    success,
                    failure: Vec::new(),
                }));
            }
            Op::ReplyRange => {
                let range = self
                    .outstanding
                    .take_if(|o| matches!(o, Outstanding::Range(..)));
                if let Some(Outstanding::Range(id, read)) = range {
                    let snapshot = self.etcd.execute(self.now, &Request::Range(read));
                    self.reply(id, snapshot);
                }
            }
            Op::DeliverWatch(batches) => {
                let Some(Outstanding::Watch { id, cursor }) = self.outstanding else {
                    return;
                };
                let range = KeyRange::Prefix(PREFIX.to_vec());
                if let Err(compact_revision) = self.etcd.watch_history(&range, cursor) {
                    self.outstanding = None;
                    return self.reply(id, Ok(Response::WatchCanceled { compact_revision }));
                }
                let last = self
                    .etcd
                    .revision()
                    .min(cursor + Revision::from(batches % 8));
                let mut next = cursor;
                if last < cursor {
                    self.reply(id, Ok(Response::WatchEvents { events: vec![] }));
                }
                while next <= last && self.outstanding_id() == Some(id) {
                    let events = self.batch(next);
                    next += 1;
                    self.outstanding = Some(Outstanding::Watch { id, cursor: next });
                    self.reply(id, Ok(Response::WatchEvents { events }));
                }
            }
            Op::RepeatOld(back) => {
                let Some(Outstanding::Watch { id, cursor }) = self.outstanding else {
                    return;
                };
                let revision = cursor - 1 - Revision::from(back % 4);
                let events = self.batch(revision);
                self.reply(id, Ok(Response::WatchEvents { events }));
            }
            Op::Fail => {
                if let Some(id) = self.outstanding_id() {
                    self.outstanding = None;
                    self.reply(id, Err(RpcError::Unavailable("fuzz".into())));
                }
            }
            Op::CancelWatch => {
                if let Some(Outstanding::Watch { id, .. }) = self.outstanding {
                    self.outstanding = None;
                    self.reply(
                        id,
                        Ok(Response::WatchCanceled {
                            compact_revision: 0,
                        }),
                    );
                }
            }
            Op::Compact => self.etcd.compact(self.etcd.revision()),
            Op::WrongVariant => {
                if let Some(id) = self.outstanding_id() {
                    self.outstanding = None;
                    self.reply(id, Ok(Response::Revoked));
                }
            }
            Op::ConsumerFull => self.feed(WatchInput::ConsumerFull),
            Op::ConsumerReady => self.feed(WatchInput::ConsumerReady),
            Op::Stop => {
                self.feed(WatchInput::Stop);
                self.stopped = true;
                assert!(
                    self.outstanding.is_none(),
                    "Stop left a request outstanding"
                );
            }
            Op::Stray(mut reply) => {
                // Ids the machine never issued must change nothing.
                reply.id = RpcId(self.next_stray.saturating_add(reply.id.0 % 1000));
                let before: Vec<KeyValue> = self.machine.known().cloned().collect();
                self.feed(WatchInput::Rpc(reply));
                assert_eq!(before, self.machine.known().cloned().collect::<Vec<_>>());
            }
            Op::GarbageToOutstanding(result) => {
                if let Some(id) = self.outstanding_id() {
                    self.tainted = true;
                    // Terminal or not, the harness can no longer tell; the
                    // machine's next request shows whether it gave up on it.
                    self.outstanding = None;
                    self.machine
                        .handle(self.now, WatchInput::Rpc(RpcReply { id, result }));
                    self.drain_lenient();
                }
            }
        }
    }

    /// After an arbitrary reply the old request may or may not be live; only
    /// structural invariants are checked.
    fn drain_lenient(&mut self) {
        let replay = !self.consumer.synced;
        for _ in 0..MAX_COMMANDS_PER_STEP {
            let Some(command) = self.machine.poll_command() else {
                return self.check();
            };
            match command {
                Command::Rpc { id, request } => {
                    assert!(!self.stopped);
                    self.next_stray = self.next_stray.max(id.0 + 1);
                    self.outstanding = Some(match request {
                        Request::Watch { start_revision, .. } => Outstanding::Watch {
                            id,
                            cursor: start_revision,
                        },
                        Request::Range(r) => Outstanding::Range(id, r),
                        other => panic!("unexpected request {other:?}"),
                    });
                }
                Command::Cancel { .. } => {}
                Command::Notify(notice) => self.consumer.apply(notice, replay),
            }
        }
        panic!("the machine produced an unbounded command stream");
    }
}

fuzz_target!(|input: (u64, Vec<Op>)| {
    let (seed, ops) = input;
    let config = WatchConfig {
        prefix: PREFIX.to_vec(),
        keys: KeyRule::HostId,
        backoff: BackoffConfig::default(),
        // Small pages, so snapshots span several.
        page_size: 1 + (seed % 3) as i64,
    };
    let now = Instant::now();
    let mut etcd = ModelEtcd::new();
    let lease = match etcd.execute(
        now,
        &Request::Grant {
            ttl_secs: LEASE_TTL_SECS,
        },
    ) {
        Ok(Response::Granted { lease, .. }) => lease,
        other => panic!("the model refused a grant: {other:?}"),
    };
    let mut world = World {
        machine: Watch::new(config, now, seed),
        etcd,
        lease,
        consumer: Consumer {
            view: BTreeMap::new(),
            marker_puts: Vec::new(),
            incarnations: Incarnations::default(),
            synced: false,
            reported: BTreeSet::new(),
            failed: false,
        },
        outstanding: None,
        now,
        stopped: false,
        tainted: false,
        next_stray: 0,
    };
    world.drain();
    for op in ops.into_iter().take(256) {
        world.step(op);
    }
});
