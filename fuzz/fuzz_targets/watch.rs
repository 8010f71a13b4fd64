//! Fuzz the watch machine against a small reference etcd.
//!
//! Operations change the reference store (puts, deletes, lease revokes that
//! delete several keys at one revision), answer the machine's one outstanding
//! request coherently (snapshots, watch batches per revision, repeats of old
//! batches, compaction), inject failures, stall the consumer, stop, or feed
//! arbitrary replies. After every step:
//! * the consumer's view, rebuilt from the notices alone, equals `known()`;
//! * no `Up` for a key already up, no `Updated`/`Down` for a key not up, a
//!   `Down` carries exactly the last-seen value, an `Updated` is newer than
//!   what the consumer has (repeats are never re-reported);
//! * `Synced` at most once and before any non-replay notice; invalid keys
//!   reported once and never as `Up`;
//! * at most one request outstanding; nothing issued after `Stop`;
//! * `poll_timeout` never before `now`;
//! * once live and caught up with the reference history (and no arbitrary
//!   reply reached an outstanding request), the view equals the store.

#![no_main]

use arbitrary::Arbitrary;
use fleetcoord_sm::watch::{KeyRule, Watch, WatchConfig, WatchInput, WatchNotice};
use fleetcoord_sm::{
    BackoffConfig, Command, EventKind, KeyRange, KeyValue, Machine, Request, Response, Revision,
    RpcError, RpcId, RpcReply, WatchEvent,
};
use libfuzzer_sys::fuzz_target;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const PREFIX: &[u8] = b"/h/";
const MAX_COMMANDS_PER_STEP: usize = 10_000;

/// Keys 0..4 are valid host ids, 4 is an invalid key under the prefix, 5 is
/// outside the prefix.
fn key(index: u8) -> Vec<u8> {
    match index % 6 {
        4 => b"/h/not-a-host".to_vec(),
        5 => b"/elsewhere".to_vec(),
        n => format!("/h/00000000-0000-0000-0000-00000000000{n}").into_bytes(),
    }
}

fn is_valid(key: &[u8]) -> bool {
    key.strip_prefix(PREFIX)
        .is_some_and(|s| KeyRule::HostId.accepts(s))
}

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u16),
    Put { key: u8, value: u8, lease: bool },
    Delete(u8),
    Revoke(u8),
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
    Range(RpcId),
    Watch { id: RpcId, cursor: Revision },
}

#[derive(Default)]
struct Store {
    revision: Revision,
    kvs: BTreeMap<Vec<u8>, KeyValue>,
    /// One batch per revision, as etcd delivers them.
    history: BTreeMap<Revision, Vec<WatchEvent>>,
    compacted: Revision,
}

impl Store {
    fn put(&mut self, key: Vec<u8>, value: u8, lease: bool) {
        self.revision += 1;
        let prev = self.kvs.get(&key).cloned();
        let kv = KeyValue {
            key: key.clone(),
            value: vec![value],
            create_revision: prev.as_ref().map_or(self.revision, |p| p.create_revision),
            mod_revision: self.revision,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            lease: if lease { 9 } else { 0 },
        };
        self.kvs.insert(key, kv.clone());
        let event = WatchEvent {
            kind: EventKind::Put,
            kv,
            prev_kv: prev,
        };
        self.history.insert(self.revision, vec![event]);
    }

    fn delete(&mut self, keys: &[Vec<u8>]) {
        let present: Vec<&Vec<u8>> = keys.iter().filter(|k| self.kvs.contains_key(*k)).collect();
        if present.is_empty() {
            return;
        }
        self.revision += 1;
        let mut batch = Vec::new();
        for key in present {
            let prev = self.kvs.remove(key);
            let kv = KeyValue {
                key: key.clone(),
                mod_revision: self.revision,
                ..KeyValue::default()
            };
            batch.push(WatchEvent {
                kind: EventKind::Delete,
                kv,
                prev_kv: prev,
            });
        }
        self.history.insert(self.revision, batch);
    }

    fn snapshot(&self) -> Response {
        let kvs = self
            .kvs
            .values()
            .filter(|kv| kv.key.starts_with(PREFIX))
            .cloned()
            .collect();
        Response::Range {
            revision: self.revision,
            kvs,
        }
    }

    fn batch(&self, revision: Revision) -> Vec<WatchEvent> {
        let events = self.history.get(&revision).cloned().unwrap_or_default();
        events
            .into_iter()
            .filter(|e| e.kv.key.starts_with(PREFIX))
            .collect()
    }

    fn compact(&mut self) {
        self.compacted = self.revision;
        self.history = self.history.split_off(&(self.revision + 1));
    }
}

struct Consumer {
    view: BTreeMap<Vec<u8>, KeyValue>,
    synced: bool,
    reported: BTreeSet<Vec<u8>>,
}

impl Consumer {
    fn apply(&mut self, notice: WatchNotice, replay: bool) {
        if !replay {
            assert!(self.synced, "non-replay notice before Synced: {notice:?}");
        }
        match notice {
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
            WatchNotice::Synced => {
                assert!(!self.synced, "Synced twice");
                self.synced = true;
            }
            WatchNotice::InvalidKey(key) => {
                assert!(!is_valid(&key) && key.starts_with(PREFIX));
                assert!(self.reported.insert(key), "invalid key reported twice");
            }
            other => panic!("unknown notice {other:?}"),
        }
    }
}

struct World {
    machine: Watch,
    store: Store,
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
                            assert_eq!(r.range, KeyRange::Prefix(PREFIX.to_vec()));
                            Outstanding::Range(id)
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
            Some(Outstanding::Range(id)) | Some(Outstanding::Watch { id, .. }) => Some(id),
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
        }
        let caught_up = matches!(
            self.outstanding,
            Some(Outstanding::Watch { cursor, .. }) if cursor > self.store.revision
        );
        if self.machine.is_live() && caught_up && !self.tainted {
            let expected: Vec<&KeyValue> = self
                .store
                .kvs
                .values()
                .filter(|kv| is_valid(&kv.key))
                .collect();
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
            } => self.store.put(key(k), value, lease),
            Op::Delete(k) => self.store.delete(&[key(k)]),
            Op::Revoke(mask) => {
                let keys: Vec<Vec<u8>> = (0..6).filter(|i| mask & (1 << i) != 0).map(key).collect();
                self.store.delete(&keys);
            }
            Op::ReplyRange => {
                if let Some(Outstanding::Range(id)) = self.outstanding {
                    self.outstanding = None;
                    let snapshot = self.store.snapshot();
                    self.reply(id, Ok(snapshot));
                }
            }
            Op::DeliverWatch(batches) => {
                let Some(Outstanding::Watch { id, cursor }) = self.outstanding else {
                    return;
                };
                if cursor <= self.store.compacted {
                    self.outstanding = None;
                    let compact_revision = self.store.compacted;
                    return self.reply(id, Ok(Response::WatchCanceled { compact_revision }));
                }
                let last = self
                    .store
                    .revision
                    .min(cursor + Revision::from(batches % 8));
                let mut next = cursor;
                if last < cursor {
                    self.reply(id, Ok(Response::WatchEvents { events: vec![] }));
                }
                while next <= last && self.outstanding_id() == Some(id) {
                    let events = self.store.batch(next);
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
                let events = self.store.batch(revision);
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
            Op::Compact => self.store.compact(),
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
                        _ => Outstanding::Range(id),
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
    };
    let now = Instant::now();
    let mut world = World {
        machine: Watch::new(config, now, seed),
        store: Store::default(),
        consumer: Consumer {
            view: BTreeMap::new(),
            synced: false,
            reported: BTreeSet::new(),
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
