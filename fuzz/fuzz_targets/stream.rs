//! Fuzz the stream machines — one appender, one reader — against the shared
//! model etcd (`fleetcoord-test-support`) holding one stream.
//!
//! The target plays the wire and the world: it answers the appender's and
//! the reader's outstanding requests truthfully (executing them on the
//! model etcd), fails them without executing them (unavailable or
//! refused), executes one and loses its reply, lets a foreign appender win
//! races, garbles and restores the head, writes junk keys under the entry
//! prefix, delivers, repeats or cancels watch batches, compacts, stalls the
//! consumer, stops either machine, advances time, and feeds stray replies
//! (ids never issued) and arbitrary replies to outstanding requests.
//!
//! The target keeps a *ledger* (test-support's `StreamLedger`, shared with
//! the stream simulation), read from the model's history after every
//! write: every entry ever written, with the revision that wrote it and the
//! one that trimmed it. After every step:
//! * each payload is written at most once (no append is ever applied
//!   twice), and a payload whose append failed with anything but
//!   `Indeterminate` is never written, now or later;
//! * a transaction that failed in flight is only sent again unchanged (same
//!   guard, same writes) until an answer settles it; an `Indeterminate {
//!   seq }` payload, if written, is entry `seq`; `Contended { attempts }`
//!   never exceeds the configured attempts;
//! * the appender answers appends in the order asked; while every reply was
//!   truthful, entries are written in turn (`1, 2, 3…`) and an
//!   `Appended { seq, revision }` names the ledger entry holding that
//!   payload and the revision that wrote it, with IDs strictly increasing;
//! * the reader delivers strictly increasing IDs; while every reply was
//!   truthful, each with the ledger's payload, skipping an ID only when the
//!   entry came from a read at revision `R` and every skipped entry was
//!   trimmed at a revision `<= R`, never from a watch batch; `Live` once,
//!   before any watch entry; each junk key reported once, never delivered;
//! * at most one request outstanding per machine; nothing issued after
//!   `Stop` (or after the reader's `Failed`); `poll_timeout` never before
//!   `now`; draining commands terminates;
//! * once the reader watches, is caught up with the store and every reply
//!   was truthful, it has delivered up to the newest entry.

#![no_main]

use arbitrary::Arbitrary;
use fleetcoord_sm::stream::{
    Append, AppendConfig, AppendInput, AppendNotice, Entry, ReadFrom, Reader, ReaderConfig,
    ReaderInput, ReaderNotice, StreamError, StreamKeys,
};
use fleetcoord_sm::{
    BackoffConfig, Command, KeyRange, Machine, Request, Response, Revision, RpcError, RpcId,
    RpcReply, Txn, TxnOp, WatchEvent,
};
use fleetcoord_test_support::{ModelEtcd, StreamLedger};
use libfuzzer_sys::fuzz_target;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

const MAX_COMMANDS_PER_STEP: usize = 10_000;

#[derive(Arbitrary, Debug)]
struct Input {
    seed: u64,
    /// 0 = no trimming.
    max_len: u8,
    max_attempts: u8,
    patience_ms: u16,
    jitter_percent: u8,
    from: ReadFrom,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u16),
    Append,
    AnswerAppender,
    LoseAppenderReply,
    FailAppender { refused: bool },
    ForeignAppend,
    GarbleHead(u8),
    RestoreHead,
    JunkEntry(u8),
    AnswerReader,
    FailReader { refused: bool },
    DeliverWatch(u8),
    RepeatOld(u8),
    CancelWatch,
    Compact,
    ReaderFull,
    ReaderReady,
    StopAppender,
    StopReader,
    Stray(RpcReply),
    GarbageToAppender(Result<Response, RpcError>),
    GarbageToReader(Result<Response, RpcError>),
}

/// The shared model etcd holding the stream, and the ledger of every entry
/// ever written to it (test-support's `StreamLedger`, shared with the
/// stream simulation), read from the model's history after every write (so
/// a compaction never hides one).
struct Store {
    etcd: ModelEtcd,
    ledger: StreamLedger,
}

impl Store {
    fn new(keys: StreamKeys) -> Self {
        let etcd = ModelEtcd::new();
        let ledger = StreamLedger::new(keys, &etcd);
        Store { etcd, ledger }
    }

    fn head(&self) -> u64 {
        self.ledger.head()
    }

    fn revision(&self) -> Revision {
        self.etcd.revision()
    }

    /// Runs one request of a stream machine on the model at `now`, then
    /// reads what it wrote into the ledger.
    fn execute(&mut self, now: Instant, request: &Request) -> Result<Response, RpcError> {
        match request {
            Request::Range(_) | Request::Txn(_) => {}
            other => panic!("a stream machine sent {other:?}"),
        }
        let result = self.etcd.execute(now, request);
        self.ledger.ingest(&self.etcd);
        result
    }

    /// A write of the world's own (foreign writers, junk, a garbled head).
    fn write(&mut self, now: Instant, request: Request) {
        if let Err(e) = self.etcd.execute(now, &request) {
            panic!("the model refused {request:?}: {e:?}");
        }
        self.ledger.ingest(&self.etcd);
    }

    /// The watch batch etcd sends for `revision`: entry keys written at
    /// that revision (none if it wrote elsewhere or was compacted away).
    fn batch(&self, revision: Revision) -> Vec<WatchEvent> {
        let events = self
            .etcd
            .watch_history(&self.ledger.entry_range(), revision)
            .unwrap_or_default();
        events
            .into_iter()
            .take_while(|e| e.kv.mod_revision == revision)
            .collect()
    }

    /// Drops all history up to the current revision.
    fn compact(&mut self) {
        self.etcd.compact(self.etcd.revision());
    }
}

enum ReaderOut {
    Read(RpcId, Request),
    Watch { id: RpcId, cursor: Revision },
}

/// Where the reader's notices of this step came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Read(Revision),
    Watch,
    Other,
}

struct World {
    store: Store,
    now: Instant,
    max_attempts: u32,

    appender: Append,
    app_out: Option<(RpcId, Request)>,
    asked: VecDeque<Vec<u8>>,
    /// Payloads whose transaction failed in flight, with its guard and
    /// writes (the failure branch cleared): until settled, only that.
    in_doubt: BTreeMap<Vec<u8>, Txn>,
    /// Payloads whose append failed cleanly: never to be written.
    never: BTreeSet<Vec<u8>>,
    last_appended: u64,
    app_stopped: bool,
    next_payload: u64,

    reader: Reader,
    from: ReadFrom,
    rd_out: Option<ReaderOut>,
    rd_stopped: bool,
    resolved: Option<u64>,
    live: bool,
    reported: BTreeSet<Vec<u8>>,
    source: Source,
    next_stray: u64,
}

fn txn_payload(keys: &StreamKeys, request: &Request) -> Option<(Vec<u8>, Txn)> {
    let Request::Txn(txn) = request else {
        return None;
    };
    let payload = txn.success.iter().find_map(|op| match op {
        TxnOp::Put { key, value, .. } if keys.entry_seq(key).is_some() => Some(value.clone()),
        _ => None,
    })?;
    let writes = Txn {
        compare: txn.compare.clone(),
        success: txn.success.clone(),
        failure: vec![],
    };
    Some((payload, writes))
}

impl World {
    fn drain_appender(&mut self) {
        for _ in 0..MAX_COMMANDS_PER_STEP {
            let Some(command) = self.appender.poll_command() else {
                return;
            };
            match command {
                Command::Rpc { id, request } => {
                    assert!(!self.app_stopped, "appender request after Stop");
                    assert!(self.app_out.is_none(), "two appender requests outstanding");
                    assert!(
                        matches!(request, Request::Range(_) | Request::Txn(_)),
                        "appender sent {request:?}"
                    );
                    if let Some((p, writes)) = txn_payload(self.store.ledger.keys(), &request) {
                        if let Some(first) = self.in_doubt.get(&p) {
                            assert_eq!(&writes, first, "an in-doubt append was sent changed");
                        }
                    }
                    self.next_stray = self.next_stray.max(id.0 + 1);
                    self.app_out = Some((id, request));
                }
                Command::Cancel { id } => {
                    if self.app_out.as_ref().is_some_and(|(o, _)| *o == id) {
                        self.app_out = None;
                    }
                }
                Command::Notify(notice) => self.appender_notice(notice),
            }
        }
        panic!("the appender produced an unbounded command stream");
    }

    fn appender_notice(&mut self, notice: AppendNotice) {
        let payload = self.asked.pop_front().expect("an answer nobody asked for");
        match notice {
            AppendNotice::Appended { seq, revision } => {
                if !self.store.ledger.is_tainted() {
                    let written = self.store.ledger.get(seq).expect("appended, not written");
                    assert_eq!(written.payload, payload, "Appended names another entry");
                    assert_eq!(written.revision, revision, "Appended names another write");
                    assert!(seq > self.last_appended, "ids not increasing");
                }
                self.last_appended = seq;
            }
            AppendNotice::Failed(StreamError::Indeterminate { seq, .. }) => {
                if !self.store.ledger.is_tainted() {
                    if let Some(at) = self.store.ledger.seq_of(&payload) {
                        assert_eq!(at, seq, "an in-doubt append was stored elsewhere");
                    }
                }
            }
            AppendNotice::Failed(StreamError::Contended { attempts }) => {
                assert!(attempts >= 1 && attempts <= self.max_attempts);
                self.never.insert(payload);
            }
            AppendNotice::Failed(StreamError::Unexpected(_)) => {
                assert!(
                    self.store.ledger.is_tainted(),
                    "Unexpected without an arbitrary reply"
                );
            }
            AppendNotice::Failed(
                StreamError::Rpc(_) | StreamError::BadHead { .. } | StreamError::Stopped,
            ) => {
                self.never.insert(payload);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    fn drain_reader(&mut self) {
        for _ in 0..MAX_COMMANDS_PER_STEP {
            let Some(command) = self.reader.poll_command() else {
                return;
            };
            match command {
                Command::Rpc { id, request } => {
                    assert!(!self.rd_stopped, "reader request after Stop or Failed");
                    assert!(self.rd_out.is_none(), "two reader requests outstanding");
                    self.next_stray = self.next_stray.max(id.0 + 1);
                    self.rd_out = Some(match request {
                        Request::Watch {
                            range,
                            start_revision,
                        } => {
                            assert_eq!(
                                range,
                                KeyRange::Prefix(self.store.ledger.keys().entry_prefix().to_vec())
                            );
                            ReaderOut::Watch {
                                id,
                                cursor: start_revision,
                            }
                        }
                        Request::Range(_) | Request::Txn(_) => ReaderOut::Read(id, request),
                        other => panic!("reader sent {other:?}"),
                    });
                }
                Command::Cancel { id } => {
                    let matches = match &self.rd_out {
                        Some(ReaderOut::Read(o, _)) | Some(ReaderOut::Watch { id: o, .. }) => {
                            *o == id
                        }
                        None => false,
                    };
                    if matches {
                        self.rd_out = None;
                    }
                }
                Command::Notify(notice) => self.reader_notice(notice),
            }
        }
        panic!("the reader produced an unbounded command stream");
    }

    fn reader_notice(&mut self, notice: ReaderNotice) {
        let tainted = self.store.ledger.is_tainted();
        if self.resolved.is_none() && matches!(notice, ReaderNotice::Entry(_) | ReaderNotice::Live)
        {
            let start = match self.source {
                Source::Read(r0) => {
                    let head = self.store.ledger.head_at(r0);
                    match self.from {
                        ReadFrom::Start => 0,
                        ReadFrom::End => head,
                        ReadFrom::After(k) => k.min(head),
                    }
                }
                _ => {
                    assert!(tainted, "{notice:?} before any read");
                    self.reader.last()
                }
            };
            self.resolved = Some(start);
        }
        match notice {
            ReaderNotice::Entry(Entry { seq, payload }) => {
                let last = self.resolved.unwrap_or(0);
                assert!(seq > last, "entry {seq} after {last}");
                if !tainted {
                    let written = self
                        .store
                        .ledger
                        .get(seq)
                        .expect("delivered, never written");
                    assert_eq!(written.payload, payload, "payload of {seq}");
                    match self.source {
                        Source::Read(r) => {
                            assert!(written.revision <= r, "{seq} from the future");
                            for s in last + 1..seq {
                                assert!(
                                    self.store.ledger.trimmed_by(s, r),
                                    "skipped {s} (between {last} and {seq}), not trimmed by {r}"
                                );
                            }
                        }
                        Source::Watch => {
                            assert!(self.live, "watch entry before Live");
                            assert_eq!(seq, last + 1, "gap on a watch");
                        }
                        Source::Other => panic!("entry {seq} from no reply"),
                    }
                }
                self.resolved = Some(seq);
            }
            ReaderNotice::Live => {
                assert!(!self.live, "Live twice");
                self.live = true;
            }
            ReaderNotice::InvalidKey(key) => {
                assert!(key.starts_with(self.store.ledger.keys().entry_prefix()));
                assert!(
                    self.store.ledger.keys().entry_seq(&key).is_none(),
                    "an entry reported junk"
                );
                assert!(self.reported.insert(key), "junk reported twice");
            }
            ReaderNotice::Failed(_) => {
                assert!(!self.rd_stopped);
                self.rd_stopped = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    fn check(&self) {
        for at in [self.appender.poll_timeout(), self.reader.poll_timeout()]
            .into_iter()
            .flatten()
        {
            assert!(at >= self.now, "deadline in the past");
        }
        if self.app_stopped {
            assert_eq!(
                self.appender.poll_timeout(),
                None,
                "appender timer after Stop"
            );
        }
        if self.rd_stopped {
            assert_eq!(self.reader.poll_timeout(), None, "reader timer after Stop");
        }
        for p in &self.never {
            assert!(
                !self.store.ledger.contains(p),
                "a cleanly failed append was written"
            );
        }
        let caught_up = matches!(
            self.rd_out,
            Some(ReaderOut::Watch { cursor, .. }) if cursor > self.store.revision()
        );
        if caught_up
            && self.reader.is_watching()
            && !self.store.ledger.is_tainted()
            && !self.rd_stopped
        {
            assert_eq!(
                self.reader.last(),
                self.store.head().max(self.resolved.unwrap_or(0)),
                "caught up, not at the newest entry"
            );
            assert_eq!(Some(self.reader.last()), self.resolved);
        }
    }

    fn feed_appender(&mut self, input: AppendInput) {
        self.appender.handle(self.now, input);
        self.drain_appender();
    }

    fn feed_reader(&mut self, source: Source, input: ReaderInput) {
        self.source = source;
        self.reader.handle(self.now, input);
        self.drain_reader();
        self.source = Source::Other;
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Advance(ms) => {
                self.now += Duration::from_millis(u64::from(ms));
                self.appender.handle_timeout(self.now);
                self.drain_appender();
                self.reader.handle_timeout(self.now);
                self.drain_reader();
            }
            Op::Append => {
                let payload = format!("p{}", self.next_payload).into_bytes();
                self.next_payload += 1;
                self.asked.push_back(payload.clone());
                self.feed_appender(AppendInput::Append(payload));
            }
            Op::AnswerAppender => {
                if let Some((id, request)) = self.app_out.take() {
                    let result = self.store.execute(self.now, &request);
                    if result.is_ok() {
                        if let Some((p, _)) = txn_payload(self.store.ledger.keys(), &request) {
                            self.in_doubt.remove(&p);
                        }
                    }
                    self.feed_appender(reply(id, result));
                }
            }
            Op::LoseAppenderReply => {
                if let Some((id, request)) = self.app_out.take() {
                    let _ = self.store.execute(self.now, &request);
                    if let Some((p, writes)) = txn_payload(self.store.ledger.keys(), &request) {
                        self.in_doubt.entry(p).or_insert(writes);
                    }
                    self.feed_appender(reply(id, Err(RpcError::Unavailable("lost".into()))));
                }
            }
            Op::FailAppender { refused } => {
                if let Some((id, request)) = self.app_out.take() {
                    let error = if refused {
                        RpcError::Rejected("refused".into())
                    } else {
                        // Not executed, but the machine cannot know that.
                        if let Some((p, writes)) = txn_payload(self.store.ledger.keys(), &request) {
                            self.in_doubt.entry(p).or_insert(writes);
                        }
                        RpcError::Unavailable("failed".into())
                    };
                    self.feed_appender(reply(id, Err(error)));
                }
            }
            Op::ForeignAppend => {
                let head = self.store.etcd.get(self.store.ledger.keys().head());
                let seq = match head {
                    None => 0,
                    Some(kv) => match std::str::from_utf8(&kv.value)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok())
                    {
                        Some(seq) => seq,
                        None => return,
                    },
                };
                let Some(next) = seq.checked_add(1) else {
                    return;
                };
                let payload = format!("f{}", self.next_payload).into_bytes();
                self.next_payload += 1;
                // Head and entry at one revision, as an appender's
                // transaction writes them.
                let success = vec![
                    TxnOp::Put {
                        key: self.store.ledger.keys().head().to_vec(),
                        value: next.to_string().into_bytes(),
                        lease: 0,
                    },
                    TxnOp::Put {
                        key: self.store.ledger.keys().entry_key(next),
                        value: payload,
                        lease: 0,
                    },
                ];
                let txn = Txn {
                    compare: Vec::new(),
                    success,
                    failure: Vec::new(),
                };
                self.store.write(self.now, Request::Txn(txn));
            }
            Op::GarbleHead(b) => {
                let value: &[u8] = match b % 4 {
                    0 => b"",
                    1 => b"x",
                    2 => b"-1",
                    _ => b" 7",
                };
                let key = self.store.ledger.keys().head().to_vec();
                self.put(key, value.to_vec());
            }
            Op::RestoreHead => {
                let key = self.store.ledger.keys().head().to_vec();
                let head = self.store.head().to_string();
                self.put(key, head.into_bytes());
            }
            Op::JunkEntry(b) => {
                let mut key = self.store.ledger.keys().entry_prefix().to_vec();
                key.extend_from_slice(match b % 3 {
                    0 => &b"junk"[..],
                    1 => b"0000000000000000001",
                    _ => b"99999999999999999999",
                });
                self.put(key, b"?".to_vec());
            }
            Op::AnswerReader => {
                if let Some(ReaderOut::Read(id, request)) = self.rd_out.take() {
                    let result = self.store.execute(self.now, &request);
                    let revision = self.store.revision();
                    self.feed_reader(Source::Read(revision), reply(id, result));
                } else if let Some(out) = self.rd_out.take() {
                    self.rd_out = Some(out);
                }
            }
            Op::FailReader { refused } => {
                let id = match &self.rd_out {
                    Some(ReaderOut::Read(id, _)) | Some(ReaderOut::Watch { id, .. }) => *id,
                    None => return,
                };
                self.rd_out = None;
                let error = if refused {
                    RpcError::Rejected("refused".into())
                } else {
                    RpcError::Unavailable("failed".into())
                };
                self.feed_reader(Source::Other, reply(id, Err(error)));
            }
            Op::DeliverWatch(batches) => {
                let Some(ReaderOut::Watch { id, cursor }) = self.rd_out else {
                    return;
                };
                let compacted = self
                    .store
                    .etcd
                    .watch_history(&self.store.ledger.entry_range(), cursor);
                if let Err(compact_revision) = compacted {
                    self.rd_out = None;
                    return self.feed_reader(
                        Source::Other,
                        reply(id, Ok(Response::WatchCanceled { compact_revision })),
                    );
                }
                let last = self
                    .store
                    .revision()
                    .min(cursor + Revision::from(batches % 8));
                if last < cursor {
                    self.feed_reader(
                        Source::Watch,
                        reply(id, Ok(Response::WatchEvents { events: vec![] })),
                    );
                }
                let mut next = cursor;
                while next <= last && self.watching(id) {
                    let events = self.store.batch(next);
                    next += 1;
                    self.rd_out = Some(ReaderOut::Watch { id, cursor: next });
                    self.feed_reader(
                        Source::Watch,
                        reply(id, Ok(Response::WatchEvents { events })),
                    );
                }
            }
            Op::RepeatOld(back) => {
                let Some(ReaderOut::Watch { id, cursor }) = self.rd_out else {
                    return;
                };
                let revision = cursor - 1 - Revision::from(back % 4);
                let events = self.store.batch(revision);
                self.feed_reader(
                    Source::Watch,
                    reply(id, Ok(Response::WatchEvents { events })),
                );
            }
            Op::CancelWatch => {
                if let Some(ReaderOut::Watch { id, .. }) = self.rd_out {
                    self.rd_out = None;
                    self.feed_reader(
                        Source::Other,
                        reply(
                            id,
                            Ok(Response::WatchCanceled {
                                compact_revision: 0,
                            }),
                        ),
                    );
                }
            }
            Op::Compact => self.store.compact(),
            Op::ReaderFull => self.feed_reader(Source::Other, ReaderInput::ConsumerFull),
            Op::ReaderReady => self.feed_reader(Source::Other, ReaderInput::ConsumerReady),
            Op::StopAppender => {
                self.feed_appender(AppendInput::Stop);
                self.app_stopped = true;
                assert!(
                    self.app_out.is_none(),
                    "Stop left an appender request outstanding"
                );
                assert!(self.asked.is_empty(), "Stop left appends unanswered");
            }
            Op::StopReader => {
                self.feed_reader(Source::Other, ReaderInput::Stop);
                self.rd_stopped = true;
                assert!(
                    self.rd_out.is_none(),
                    "Stop left a reader request outstanding"
                );
            }
            Op::Stray(mut r) => {
                // Ids the machines never issued change nothing.
                r.id = RpcId(self.next_stray.saturating_add(r.id.0 % 1000));
                let (asked, last) = (self.asked.len(), self.reader.last());
                self.feed_appender(AppendInput::Rpc(r.clone()));
                self.feed_reader(Source::Other, ReaderInput::Rpc(r));
                assert_eq!((asked, last), (self.asked.len(), self.reader.last()));
            }
            Op::GarbageToAppender(result) => {
                if let Some((id, request)) = self.app_out.take() {
                    self.store.ledger.taint();
                    // A made-up answer may settle a doubt either way.
                    if let Some((p, _)) = txn_payload(self.store.ledger.keys(), &request) {
                        self.in_doubt.remove(&p);
                    }
                    self.feed_appender(reply(id, result));
                }
            }
            Op::GarbageToReader(result) => {
                let id = match &self.rd_out {
                    Some(ReaderOut::Read(id, _)) | Some(ReaderOut::Watch { id, .. }) => *id,
                    None => return,
                };
                self.store.ledger.taint();
                // Terminal or not, the target can no longer tell; the
                // machine's next request shows whether it gave up on it.
                self.rd_out = None;
                self.reader.handle(self.now, reply(id, result));
                self.drain_reader_lenient();
            }
        }
        self.check();
    }

    /// A write of one key by the world, outside any machine.
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        let put = Request::Put {
            key,
            value,
            lease: 0,
        };
        self.store.write(self.now, put);
    }

    fn watching(&self, id: RpcId) -> bool {
        matches!(self.rd_out, Some(ReaderOut::Watch { id: o, .. }) if o == id)
    }

    /// After an arbitrary reply to a watch, the old watch may still be
    /// open: a new request replaces it without a cancel.
    fn drain_reader_lenient(&mut self) {
        for _ in 0..MAX_COMMANDS_PER_STEP {
            let Some(command) = self.reader.poll_command() else {
                return;
            };
            match command {
                Command::Rpc { id, request } => {
                    assert!(!self.rd_stopped);
                    self.next_stray = self.next_stray.max(id.0 + 1);
                    self.rd_out = Some(match request {
                        Request::Watch { start_revision, .. } => ReaderOut::Watch {
                            id,
                            cursor: start_revision,
                        },
                        other => ReaderOut::Read(id, other),
                    });
                }
                Command::Cancel { .. } => {}
                Command::Notify(notice) => self.reader_notice(notice),
            }
        }
        panic!("the reader produced an unbounded command stream");
    }
}

fn reply<E: From<RpcReply>>(id: RpcId, result: Result<Response, RpcError>) -> E {
    RpcReply { id, result }.into()
}

fuzz_target!(|input: Input| {
    let keys = StreamKeys::new("/c", "s");
    let now = Instant::now();
    let backoff = BackoffConfig {
        initial: Duration::from_millis(1),
        max: Duration::from_millis(50),
        multiplier: 2,
        jitter_percent: input.jitter_percent,
    };
    let max_attempts = u32::from(input.max_attempts % 8).max(1);
    let append = AppendConfig {
        max_len: NonZeroU64::new(u64::from(input.max_len % 16)),
        backoff: backoff.clone(),
        max_attempts,
        patience: Duration::from_millis(u64::from(input.patience_ms)),
        ..AppendConfig::new(keys.clone())
    };
    let read = ReaderConfig {
        keys: keys.clone(),
        from: input.from,
        backoff,
    };
    let mut world = World {
        store: Store::new(keys),
        now,
        max_attempts,
        appender: Append::new(append, now, input.seed),
        app_out: None,
        asked: VecDeque::new(),
        in_doubt: BTreeMap::new(),
        never: BTreeSet::new(),
        last_appended: 0,
        app_stopped: false,
        next_payload: 0,
        reader: Reader::new(read, now, input.seed.rotate_left(17)),
        from: input.from,
        rd_out: None,
        rd_stopped: false,
        resolved: None,
        live: false,
        reported: BTreeSet::new(),
        source: Source::Other,
        next_stray: 0,
    };
    world.drain_appender();
    world.drain_reader();
    for op in input.ops.into_iter().take(256) {
        world.step(op);
    }
});
