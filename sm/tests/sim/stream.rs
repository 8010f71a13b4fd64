//! The stream machines against the model etcd: three appenders and three
//! readers share one stream, each in its own harness, under random append
//! schedules and faults (failed requests, lost replies, reads and append
//! transactions that land at etcd up to 3 s after their machine was told
//! they failed, dropped watches, compactions, etcd pauses, stalled
//! consumers, readers restarted after their last entry, appenders stopped
//! mid-append and replaced by one given the head their last append left,
//! often stale by then, as `EtcdCoordinator` does, while what the stopped
//! one had held up still lands; junk keys under the entry prefix). Half the
//! seeds trim the stream to a few entries.
//!
//! The ground truth is the *ledger* (test-support's `StreamLedger`, shared
//! with the stream fuzz target): every entry ever written, read from the
//! model's history after every step (and before every compaction), with the
//! revision that wrote it and the revision that trimmed it.
//!
//! Checked after every step:
//! * the ledger holds entries `1..=n` exactly, each written once, each
//!   payload at most once (no append is ever applied twice), and the head
//!   key says `n`; with `max_len` etcd retains exactly the newest
//!   `max_len` entries, without it all of them;
//! * every `Appended { seq, revision }` names the ledger entry holding that
//!   appender's payload and the revision that wrote it; appenders are answered in the order asked, with
//!   strictly increasing IDs; a payload whose append failed with anything
//!   but `Indeterminate` never appears in the ledger, now or later; a
//!   transaction that failed in flight is only ever sent again unchanged
//!   (same guard, same writes) until an answer settles it;
//! * readers deliver strictly increasing IDs, continuing across restarts
//!   (`After(last)`), each with the ledger's payload; `Live` exactly once,
//!   and no entry from a watch before it;
//! * gaps, precisely: a reader delivering entry `b` right after `a` (or
//!   after its starting point) skipped `s` in `a < s < b` only if `b` came
//!   from a read at revision `R` and every such `s` had been trimmed at a
//!   revision `<= R`; an entry from a watch is always `a + 1`;
//! * at most one request outstanding per machine; nothing issued after
//!   `Stop`; `poll_timeout` never before the last `now`.
//!
//! After the faults stop and every pending append is answered, every reader
//! has delivered up to the head and is watching: so every entry was read by
//! every reader exactly once, in order, unless trimmed before it could be.

use fleetcoord_sm::stream::{
    Append, AppendConfig, AppendInput, AppendNotice, Entry, Head, ReadFrom, Reader, ReaderConfig,
    ReaderInput, ReaderNotice, StreamError, StreamKeys,
};
use fleetcoord_sm::{
    BackoffConfig, Command, Machine, Request, Response, Revision, RpcId, RpcReply, Txn, TxnOp,
};
use fleetcoord_test_support::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

const SEEDS: u64 = 1_000;
const APPENDERS: usize = 3;
const READERS: usize = 3;
const CHAOS: Duration = Duration::from_secs(6);
const QUIET: Duration = Duration::from_secs(5);

/// Built once: the checks ask for the keys after every step.
fn keys() -> &'static StreamKeys {
    static KEYS: std::sync::OnceLock<StreamKeys> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| StreamKeys::new("/coord", "jobs"))
}

/// The payload of an append transaction (its entry put), with the part a
/// resend must repeat exactly: its guard and its writes.
fn txn_payload(request: &Request) -> Option<(Vec<u8>, Txn)> {
    let Request::Txn(txn) = request else {
        return None;
    };
    let payload = txn.success.iter().find_map(|op| match op {
        TxnOp::Put { key, value, .. } if key.as_slice() != keys().head() => Some(value.clone()),
        _ => None,
    })?;
    let writes = Txn {
        compare: txn.compare.clone(),
        success: txn.success.clone(),
        failure: vec![],
    };
    Some((payload, writes))
}

/// The request in flight: its id and, for an append transaction, its
/// payload and transaction.
type InFlight = (RpcId, Option<(Vec<u8>, Txn)>);

/// Wraps an [`Append`] and checks the wire rules on every command.
struct AppendSpy {
    machine: Append,
    last_now: Instant,
    outstanding: Option<InFlight>,
    /// Payloads whose transaction failed in flight, with that transaction's
    /// guard and writes: until an answer comes, only those may be sent.
    in_doubt: BTreeMap<Vec<u8>, Txn>,
    /// Answers to transactions sent again after a lost answer.
    settled: u64,
    stopped: bool,
}

impl Machine for AppendSpy {
    type Input = AppendInput;
    type Notice = AppendNotice;

    fn stop_input() -> AppendInput {
        Append::stop_input()
    }

    fn is_finished(&self) -> bool {
        self.machine.is_finished()
    }

    fn handle(&mut self, now: Instant, input: AppendInput) {
        self.last_now = now;
        match &input {
            AppendInput::Rpc(RpcReply { id, result }) => {
                if let Some((out, payload)) = self.outstanding.take() {
                    if out != *id {
                        self.outstanding = Some((out, payload));
                    } else if let Some((p, writes)) = payload {
                        match result {
                            Err(_) => {
                                self.in_doubt.insert(p, writes);
                            }
                            Ok(_) => {
                                if self.in_doubt.remove(&p).is_some() {
                                    self.settled += 1;
                                }
                            }
                        }
                    }
                }
            }
            AppendInput::Stop => self.stopped = true,
            AppendInput::Append(_) => {}
        }
        self.machine.handle(now, input);
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.last_now = now;
        self.machine.handle_timeout(now);
    }

    fn poll_command(&mut self) -> Option<Command<AppendNotice>> {
        let command = self.machine.poll_command()?;
        match &command {
            Command::Rpc { id, request } => {
                assert!(!self.stopped, "{request:?} after Stop");
                assert!(self.outstanding.is_none(), "two requests outstanding");
                let payload = txn_payload(request);
                if let Some((p, writes)) = &payload {
                    if let Some(first) = self.in_doubt.get(p) {
                        assert_eq!(writes, first, "an in-doubt append was sent changed");
                    }
                }
                self.outstanding = Some((*id, payload));
            }
            Command::Cancel { id } => {
                if self.outstanding.as_ref().is_some_and(|(o, _)| o == id) {
                    self.outstanding = None;
                }
            }
            Command::Notify(_) => {}
        }
        Some(command)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let at = self.machine.poll_timeout();
        if let Some(at) = at {
            assert!(at >= self.last_now, "poll_timeout before the last now");
            assert!(!self.stopped, "a timer after Stop");
        }
        at
    }
}

/// Where a reader notice came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// A read answered at this revision.
    Read(Revision),
    /// A watch batch.
    Watch,
    /// An input or a timer.
    Other,
}

/// Wraps a [`Reader`], checks the wire rules and tags every notice with
/// the reply it came from, which the gap rule needs.
struct ReaderSpy {
    machine: Reader,
    last_now: Instant,
    outstanding: Option<(RpcId, bool)>,
    source: Source,
    log: Vec<(Source, ReaderNotice)>,
    stopped: bool,
}

impl Machine for ReaderSpy {
    type Input = ReaderInput;
    type Notice = ReaderNotice;

    fn stop_input() -> ReaderInput {
        Reader::stop_input()
    }

    fn is_finished(&self) -> bool {
        self.machine.is_finished()
    }

    fn handle(&mut self, now: Instant, input: ReaderInput) {
        self.last_now = now;
        self.source = Source::Other;
        match &input {
            ReaderInput::Rpc(RpcReply { id, result }) => {
                if let Some((out, is_watch)) = self.outstanding {
                    if out == *id {
                        self.source = match result {
                            Ok(Response::Range { revision, .. })
                            | Ok(Response::Txn { revision, .. })
                                if !is_watch =>
                            {
                                Source::Read(*revision)
                            }
                            Ok(Response::WatchEvents { .. }) if is_watch => Source::Watch,
                            _ => Source::Other,
                        };
                        // Anything but a watch batch ends the request.
                        if !matches!(result, Ok(Response::WatchEvents { .. })) {
                            self.outstanding = None;
                        }
                    }
                }
            }
            ReaderInput::Stop => self.stopped = true,
            ReaderInput::ConsumerFull | ReaderInput::ConsumerReady => {}
        }
        self.machine.handle(now, input);
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.last_now = now;
        self.source = Source::Other;
        self.machine.handle_timeout(now);
    }

    fn poll_command(&mut self) -> Option<Command<ReaderNotice>> {
        let command = self.machine.poll_command()?;
        match &command {
            Command::Rpc { id, request } => {
                assert!(!self.stopped, "{request:?} after Stop");
                assert!(self.outstanding.is_none(), "two requests outstanding");
                let is_watch = matches!(request, Request::Watch { .. });
                self.outstanding = Some((*id, is_watch));
            }
            Command::Cancel { id } => {
                if self.outstanding.is_some_and(|(o, _)| o == *id) {
                    self.outstanding = None;
                }
            }
            Command::Notify(n) => self.log.push((self.source, n.clone())),
        }
        Some(command)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let at = self.machine.poll_timeout();
        if let Some(at) = at {
            assert!(at >= self.last_now, "poll_timeout before the last now");
            assert!(!self.stopped, "a timer after Stop");
        }
        at
    }
}

struct AppenderSeat {
    h: Harness<AppendSpy>,
    /// Payloads asked for and not answered, in order.
    asked: VecDeque<Vec<u8>>,
    last_seq: u64,
    /// The head this seat's last append left, for its next incarnation.
    last_head: Option<Head>,
    stopping: bool,
    generation: u64,
}

struct ReaderSeat {
    h: Harness<ReaderSpy>,
    from: ReadFrom,
    /// The last entry delivered by any incarnation of this reader, or its
    /// starting point once resolved.
    last: Option<u64>,
    /// The current incarnation has not answered its first read yet.
    unresolved: bool,
    live: bool,
    reported: BTreeSet<Vec<u8>>,
    paused_until: Option<Instant>,
    generation: u64,
}

#[derive(Default)]
struct Stats {
    steps: u64,
    appended: u64,
    contended: u64,
    in_doubt: u64,
    failed: u64,
    delivered: u64,
    skipped_trimmed: u64,
    compactions: u64,
    faults: u64,
    restarts: u64,
    settled: u64,
    /// Requests that landed at etcd after their machine gave up on them.
    late_landed: u64,
}

struct World {
    seed: u64,
    etcd: ModelEtcd,
    rng: ChaCha8Rng,
    faults: Faults,
    max_len: Option<u64>,
    append: AppendConfig,
    appenders: Vec<AppenderSeat>,
    readers: Vec<ReaderSeat>,
    ledger: StreamLedger,
    /// Payloads that must never be written (their append failed cleanly).
    never: BTreeSet<Vec<u8>>,
    /// Every ID reported by `Appended`.
    reported: BTreeSet<u64>,
    next_payload: u64,
    paused_until: Option<Instant>,
    stats: Stats,
}

fn append_config(max_len: Option<u64>, max_attempts: u32) -> AppendConfig {
    AppendConfig {
        max_len: max_len.and_then(NonZeroU64::new),
        max_attempts,
        ..AppendConfig::new(keys().clone())
    }
}

fn reader_config(from: ReadFrom) -> ReaderConfig {
    ReaderConfig {
        keys: keys().clone(),
        from,
        backoff: BackoffConfig {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(500),
            multiplier: 2,
            jitter_percent: 50,
        },
    }
}

fn new_appender(config: &AppendConfig, now: Instant, seed: u64) -> Harness<AppendSpy> {
    Harness::new(AppendSpy {
        machine: Append::new(config.clone(), now, seed),
        last_now: now,
        outstanding: None,
        in_doubt: BTreeMap::new(),
        settled: 0,
        stopped: false,
    })
}

fn new_reader(from: ReadFrom, now: Instant, seed: u64) -> Harness<ReaderSpy> {
    Harness::new(ReaderSpy {
        machine: Reader::new(reader_config(from), now, seed),
        last_now: now,
        outstanding: None,
        source: Source::Other,
        log: Vec::new(),
        stopped: false,
    })
}

impl World {
    fn sub_seed(&self, what: u64, seat: usize, generation: u64) -> u64 {
        self.seed
            .wrapping_mul(1_000_003)
            .wrapping_add(what << 40)
            .wrapping_add((seat as u64) << 20)
            .wrapping_add(generation)
    }

    fn next_time(&self) -> Option<Instant> {
        let a = self
            .appenders
            .iter()
            .filter_map(|s| s.h.next_event_time())
            .min();
        let r = self
            .readers
            .iter()
            .filter_map(|s| s.h.next_event_time())
            .min();
        next_time(&[a, r, self.etcd.next_deadline()])
    }

    /// `fleetcoord_test_support::step` over both kinds of harness, then the checks.
    fn step(&mut self, now: Instant) {
        let (etcd, rng, faults) = (&mut self.etcd, &mut self.rng, &self.faults);
        for _ in 0..10_000 {
            etcd.advance(now);
            for s in &mut self.appenders {
                s.h.fire_timeout(etcd, now, rng, faults);
            }
            for s in &mut self.readers {
                s.h.fire_timeout(etcd, now, rng, faults);
            }
            for s in &mut self.appenders {
                s.h.deliver_due(etcd, now, rng, faults);
            }
            for s in &mut self.readers {
                s.h.deliver_due(etcd, now, rng, faults);
            }
            loop {
                let before = etcd.revision();
                for s in &mut self.appenders {
                    s.h.pump(etcd, now, rng, faults);
                }
                for s in &mut self.readers {
                    s.h.pump(etcd, now, rng, faults);
                }
                if etcd.revision() == before {
                    break;
                }
            }
            let a = self
                .appenders
                .iter()
                .filter_map(|s| s.h.next_event_time())
                .min();
            let r = self
                .readers
                .iter()
                .filter_map(|s| s.h.next_event_time())
                .min();
            let due = next_time(&[a, r, etcd.next_deadline()]).is_some_and(|t| t <= now);
            if !due {
                self.stats.steps += 1;
                self.check();
                return;
            }
        }
        panic!("seed {}: livelock at one instant", self.seed);
    }

    fn check(&mut self) {
        let seed = self.seed;
        // The store only changes with the revision: check it then.
        if self.ledger.is_behind(&self.etcd) {
            self.ledger.ingest(&self.etcd);
            self.check_store();
        }
        for i in 0..self.appenders.len() {
            self.check_appender(i);
        }
        for i in 0..self.readers.len() {
            self.check_reader(i);
        }
        for p in &self.never {
            assert!(
                !self.ledger.contains(p),
                "seed {seed}: {:?} was written after its append failed cleanly",
                String::from_utf8_lossy(p)
            );
        }
    }

    fn check_store(&self) {
        let seed = self.seed;
        let keys = keys();
        let n = self.ledger.head();
        let head = self.etcd.get(keys.head()).map(|kv| kv.value);
        let expected_head = (n > 0).then(|| n.to_string().into_bytes());
        assert_eq!(head, expected_head, "seed {seed}: head key vs ledger");
        let retained: Vec<u64> = self
            .etcd
            .range_prefix(keys.entry_prefix())
            .iter()
            .filter_map(|kv| keys.entry_seq(&kv.key))
            .collect();
        let oldest = self.max_len.map_or(1, |m| n.saturating_sub(m) + 1);
        let expected: Vec<u64> = (oldest.max(1)..=n).collect();
        assert_eq!(retained, expected, "seed {seed}: retained entries");
    }

    fn check_appender(&mut self, i: usize) {
        let seed = self.seed;
        let notices = self.appenders[i].h.drain_notifications();
        for (_, notice) in notices {
            let seat = &mut self.appenders[i];
            let payload = seat
                .asked
                .pop_front()
                .unwrap_or_else(|| panic!("seed {seed}: appender {i} answered unasked"));
            match notice {
                AppendNotice::Appended { seq, revision } => {
                    let written = self.ledger.get(seq);
                    assert!(
                        written.is_some_and(|w| w.payload == payload && w.revision == revision),
                        "seed {seed}: appender {i} got id {seq} for {:?}, ledger has {:?}",
                        String::from_utf8_lossy(&payload),
                        written.map(|w| String::from_utf8_lossy(&w.payload).to_string())
                    );
                    assert!(
                        seq > seat.last_seq,
                        "seed {seed}: appender {i} ids not increasing"
                    );
                    seat.last_seq = seq;
                    seat.last_head = Some(Head {
                        seq,
                        mod_revision: revision,
                    });
                    assert!(
                        self.reported.insert(seq),
                        "seed {seed}: id {seq} reported twice"
                    );
                    self.stats.appended += 1;
                }
                AppendNotice::Failed(StreamError::Indeterminate { seq, .. }) => {
                    // If stored at all, then at the sequence it names.
                    if let Some(w) = self.ledger.seq_of(&payload) {
                        assert_eq!(w, seq, "seed {seed}: in-doubt append stored elsewhere");
                    }
                    self.stats.in_doubt += 1
                }
                AppendNotice::Failed(e) => {
                    assert!(
                        matches!(
                            e,
                            StreamError::Contended { .. }
                                | StreamError::Rpc(_)
                                | StreamError::Stopped
                        ),
                        "seed {seed}: appender {i}: {e:?}"
                    );
                    if matches!(e, StreamError::Contended { .. }) {
                        self.stats.contended += 1;
                    }
                    self.stats.failed += 1;
                    self.never.insert(payload);
                }
                other => panic!("seed {seed}: unexpected {other:?}"),
            }
        }
    }

    fn check_reader(&mut self, i: usize) {
        let seed = self.seed;
        let log = std::mem::take(&mut self.readers[i].h.machine.log);
        self.readers[i].h.drain_notifications();
        for (source, notice) in log {
            let seat = &mut self.readers[i];
            if seat.unresolved {
                // The first notice of an incarnation comes from its first
                // read, which resolves the starting point.
                let Source::Read(r0) = source else {
                    panic!(
                        "seed {seed}: reader {i}: {notice:?} from {source:?} before the first read"
                    );
                };
                let head = self.ledger.head_at(r0);
                let start = match seat.from {
                    ReadFrom::Start => 0,
                    ReadFrom::End => head,
                    ReadFrom::After(k) => k.min(head),
                };
                // A restarted reader resumes exactly where the last stopped.
                if let Some(before) = seat.last {
                    assert_eq!(start, before, "seed {seed}: reader {i} resumed elsewhere");
                }
                seat.last = Some(start);
                seat.unresolved = false;
            }
            let last = seat.last.unwrap_or(0);
            match notice {
                ReaderNotice::Entry(Entry { seq, payload }) => {
                    assert!(seq > last, "seed {seed}: reader {i}: {seq} after {last}");
                    let written = self.ledger.get(seq).expect("delivered but never written");
                    assert_eq!(
                        written.payload, payload,
                        "seed {seed}: reader {i}: payload of {seq}"
                    );
                    match source {
                        Source::Read(r) => {
                            assert!(written.revision <= r, "seed {seed}: {seq} from the future");
                            for s in last + 1..seq {
                                assert!(
                                    self.ledger.trimmed_by(s, r),
                                    "seed {seed}: reader {i} skipped {s} (between {last} and {seq}), \
                                     not trimmed by the read at {r}"
                                );
                                self.stats.skipped_trimmed += 1;
                            }
                        }
                        Source::Watch => {
                            assert!(
                                seat.live,
                                "seed {seed}: reader {i}: watch entry before Live"
                            );
                            assert_eq!(seq, last + 1, "seed {seed}: reader {i}: gap on a watch");
                        }
                        Source::Other => panic!("seed {seed}: reader {i}: entry from nowhere"),
                    }
                    seat.last = Some(seq);
                    self.stats.delivered += 1;
                }
                ReaderNotice::Live => {
                    assert!(!seat.live, "seed {seed}: reader {i}: Live twice");
                    assert!(matches!(source, Source::Read(_)));
                    seat.live = true;
                }
                ReaderNotice::InvalidKey(key) => {
                    assert!(keys().entry_seq(&key).is_none());
                    assert!(
                        seat.reported.insert(key),
                        "seed {seed}: reader {i}: junk reported twice"
                    );
                }
                other => panic!("seed {seed}: reader {i}: {other:?}"),
            }
        }
    }

    fn append(&mut self, i: usize, now: Instant) {
        let seat = &mut self.appenders[i];
        if seat.stopping {
            return;
        }
        let payload = format!("a{i}-{}", self.next_payload).into_bytes();
        self.next_payload += 1;
        seat.asked.push_back(payload.clone());
        self.appender_input(i, now, AppendInput::Append(payload));
    }

    /// Stops appender `i`; the next housekeeping replaces it.
    fn stop_appender(&mut self, i: usize, now: Instant) {
        self.appenders[i].stopping = true;
        self.appender_input(i, now, AppendInput::Stop);
    }

    /// Feeds appender `i` and drains its commands, as the contract requires
    /// after every `handle`.
    fn appender_input(&mut self, i: usize, now: Instant, input: AppendInput) {
        let h = &mut self.appenders[i].h;
        h.machine.handle(now, input);
        h.pump(&mut self.etcd, now, &mut self.rng, &self.faults);
    }

    /// Feeds reader `i` and drains its commands.
    fn reader_input(&mut self, i: usize, now: Instant, input: ReaderInput) {
        let h = &mut self.readers[i].h;
        h.machine.handle(now, input);
        h.pump(&mut self.etcd, now, &mut self.rng, &self.faults);
    }

    /// Replaces reader `i` by a new one that starts after its last entry,
    /// as a consumer resuming in another process would.
    fn restart_reader(&mut self, i: usize, now: Instant) {
        let Some(last) = self.readers[i].last.filter(|_| !self.readers[i].unresolved) else {
            return;
        };
        let generation = self.readers[i].generation + 1;
        let seed = self.sub_seed(2, i, generation);
        self.reader_input(i, now, ReaderInput::Stop);
        let seat = &mut self.readers[i];
        assert_eq!(seat.h.active_watches(), 0, "a stopped reader still watches");
        let mut h = new_reader(ReadFrom::After(last), now, seed);
        // The stopped reader's held-up reads are still on the wire.
        seat.h.pass_held_to(&mut h);
        self.stats.faults += seat.h.faults_injected;
        self.stats.late_landed += seat.h.late_landed;
        seat.h = h;
        seat.from = ReadFrom::After(last);
        seat.unresolved = true;
        seat.generation = generation;
        seat.paused_until = None;
        seat.live = false;
        seat.reported.clear();
        self.stats.restarts += 1;
    }

    fn housekeeping(&mut self, now: Instant) {
        if self.paused_until.is_some_and(|t| t <= now) {
            self.paused_until = None;
            self.etcd.resume(now);
        }
        for i in 0..self.readers.len() {
            if self.readers[i].paused_until.is_some_and(|t| t <= now) {
                self.readers[i].paused_until = None;
                self.reader_input(i, now, ReaderInput::ConsumerReady);
            }
        }
        for i in 0..self.appenders.len() {
            let done = {
                let s = &self.appenders[i];
                s.stopping && s.asked.is_empty()
            };
            if done {
                let generation = self.appenders[i].generation + 1;
                let seed = self.sub_seed(1, i, generation);
                let seat = &mut self.appenders[i];
                let config = AppendConfig {
                    head: seat.last_head,
                    ..self.append.clone()
                };
                self.stats.settled += seat.h.machine.settled;
                let mut h = new_appender(&config, now, seed);
                // A stopped appender's held-up transaction may still land
                // after it is gone; the ledger checks must hold then too.
                seat.h.pass_held_to(&mut h);
                self.stats.faults += seat.h.faults_injected;
                self.stats.late_landed += seat.h.late_landed;
                seat.h = h;
                seat.stopping = false;
                seat.last_seq = 0;
                seat.generation = generation;
            }
        }
    }

    fn random_action(&mut self, now: Instant) {
        let roll = pick(&mut self.rng, 100);
        let a = usize::try_from(pick(&mut self.rng, APPENDERS as u64)).unwrap_or(0);
        let r = usize::try_from(pick(&mut self.rng, READERS as u64)).unwrap_or(0);
        match roll {
            0..=59 => self.append(a, now),
            60..=63 => {
                self.readers[r].h.drop_streams(now);
                self.stats.faults += 1;
            }
            64..=66 => {
                self.appenders[a].h.lose_all_inflight();
                self.readers[r].h.lose_all_inflight();
                self.stats.faults += 1;
            }
            67..=70 => {
                self.ledger.ingest(&self.etcd);
                let back = i64::try_from(pick(&mut self.rng, 4)).unwrap_or(0);
                self.etcd.compact(self.etcd.revision() - back);
                self.stats.compactions += 1;
            }
            71..=72 if self.paused_until.is_none() => {
                self.etcd.pause();
                self.paused_until = Some(now + ms(100 + pick(&mut self.rng, 2_000)));
                self.stats.faults += 1;
            }
            73..=75 if self.readers[r].paused_until.is_none() => {
                self.reader_input(r, now, ReaderInput::ConsumerFull);
                self.readers[r].paused_until = Some(now + ms(pick(&mut self.rng, 1_500)));
                self.stats.faults += 1;
            }
            76..=77 => self.restart_reader(r, now),
            78 => self.stop_appender(a, now),
            79 if !self.etcd.is_paused() => {
                // Junk under the entry prefix, as a hand-written key would be.
                let key = [keys().entry_prefix(), b"junk"].concat();
                self.etcd
                    .execute(
                        now,
                        &Request::Put {
                            key,
                            value: b"?".to_vec(),
                            lease: 0,
                        },
                    )
                    .expect("put");
            }
            _ => {}
        }
    }

    fn run_until(&mut self, mut now: Instant, until: Instant, chaos: bool) -> Instant {
        let mut next_action = now;
        loop {
            let mut t = next_time(&[self.next_time(), self.paused_until]);
            if chaos {
                t = next_time(&[t, Some(next_action)]);
            }
            for s in &self.readers {
                t = next_time(&[t, s.paused_until]);
            }
            let Some(t) = t.filter(|t| *t <= until) else {
                return now.max(until);
            };
            now = now.max(t);
            self.housekeeping(now);
            if chaos && next_action <= now {
                self.random_action(now);
                next_action = now + ms(1 + pick(&mut self.rng, 120));
            }
            self.step(now);
        }
    }
}

fn run_seed(seed: u64, stats: &mut Stats) {
    let t0 = Instant::now();
    let mut rng = rng(seed);
    let faults = Faults {
        fail_request: 0.2 * (pick(&mut rng, 100) as f64 / 100.0),
        lose_reply: 0.08 * (pick(&mut rng, 100) as f64 / 100.0),
        latency: (ms(1), ms(1 + pick(&mut rng, 30))),
        land_late: 0.06 * (pick(&mut rng, 100) as f64 / 100.0),
        late_by: (ms(50), ms(3_000)),
    };
    let max_len = (pick(&mut rng, 2) == 0).then(|| 2 + pick(&mut rng, 6));
    // A quarter of the seeds give up after two lost races, so contention
    // failures happen too.
    let max_attempts = if pick(&mut rng, 4) == 0 { 2 } else { 32 };
    let etcd = ModelEtcd::new();
    let ledger = StreamLedger::new(keys().clone(), &etcd);
    let mut w = World {
        seed,
        etcd,
        rng,
        faults,
        max_len,
        append: append_config(max_len, max_attempts),
        appenders: Vec::new(),
        readers: Vec::new(),
        ledger,
        never: BTreeSet::new(),
        reported: BTreeSet::new(),
        next_payload: 0,
        paused_until: None,
        stats: Stats::default(),
    };
    for i in 0..APPENDERS {
        let h = new_appender(&w.append, t0, w.sub_seed(1, i, 0));
        w.appenders.push(AppenderSeat {
            h,
            asked: VecDeque::new(),
            last_seq: 0,
            last_head: None,
            stopping: false,
            generation: 0,
        });
    }
    // Some entries exist before the readers start, so every position means
    // something (and with trimming, Start already misses a few).
    for _ in 0..pick(&mut w.rng, 12) {
        let a = usize::try_from(pick(&mut w.rng, APPENDERS as u64)).unwrap_or(0);
        w.append(a, t0);
    }
    let now = w.run_until(t0, t0 + ms(300), false);
    for i in 0..READERS {
        let from = match pick(&mut w.rng, 4) {
            0 => ReadFrom::Start,
            1 => ReadFrom::End,
            2 => ReadFrom::After(pick(&mut w.rng, 8)),
            _ => ReadFrom::After(1_000),
        };
        let h = new_reader(from, now, w.sub_seed(2, i, 0));
        w.readers.push(ReaderSeat {
            h,
            from,
            last: None,
            unresolved: true,
            live: false,
            reported: BTreeSet::new(),
            paused_until: None,
            generation: 0,
        });
    }
    let now = w.run_until(now, now + CHAOS, true);

    // Faults stop: etcd resumes, consumers drain, nothing new is appended.
    if w.paused_until.take().is_some() {
        w.etcd.resume(now);
    }
    for i in 0..w.readers.len() {
        if w.readers[i].paused_until.take().is_some() {
            w.reader_input(i, now, ReaderInput::ConsumerReady);
        }
    }
    w.faults = Faults::none();
    w.step(now);
    let end = w.run_until(now, now + QUIET, false);
    w.step(end);

    let head = w.ledger.head();
    for (i, seat) in w.appenders.iter().enumerate() {
        assert!(
            seat.asked.is_empty(),
            "seed {seed}: appender {i} still has {} appends unanswered",
            seat.asked.len()
        );
    }
    for (i, seat) in w.readers.iter().enumerate() {
        assert!(seat.live, "seed {seed}: reader {i} never went live");
        assert_eq!(
            seat.last,
            Some(head),
            "seed {seed}: reader {i} ({:?}) did not reach the head",
            seat.from
        );
        assert!(
            seat.h.machine.machine.is_watching(),
            "seed {seed}: reader {i} not watching"
        );
    }

    stats.steps += w.stats.steps;
    stats.appended += w.stats.appended;
    stats.contended += w.stats.contended;
    stats.in_doubt += w.stats.in_doubt;
    stats.failed += w.stats.failed;
    stats.delivered += w.stats.delivered;
    stats.skipped_trimmed += w.stats.skipped_trimmed;
    stats.compactions += w.stats.compactions;
    stats.faults += w.stats.faults
        + w.appenders.iter().map(|s| s.h.faults_injected).sum::<u64>()
        + w.readers.iter().map(|s| s.h.faults_injected).sum::<u64>();
    stats.restarts += w.stats.restarts;
    stats.late_landed += w.stats.late_landed
        + w.appenders.iter().map(|s| s.h.late_landed).sum::<u64>()
        + w.readers.iter().map(|s| s.h.late_landed).sum::<u64>();
    stats.settled += w.stats.settled + w.appenders.iter().map(|s| s.h.machine.settled).sum::<u64>();
}

#[test]
fn appenders_and_readers_agree_on_every_entry_under_faults_over_many_seeds() {
    let mut stats = Stats::default();
    for seed in 0..SEEDS {
        run_seed(seed, &mut stats);
    }
    println!(
        "stream sim: {SEEDS} seeds, {} steps; appends: {} ok, {} contended, {} in doubt, {} failed cleanly; \
         {} lost answers settled by a resend; \
         {} entries delivered, {} trimmed entries skipped; {} faults, {} requests landed late \
         ({:.2} per seed), {} compactions, {} reader restarts",
        stats.steps,
        stats.appended,
        stats.contended,
        stats.in_doubt,
        stats.failed,
        stats.settled,
        stats.delivered,
        stats.skipped_trimmed,
        stats.faults,
        stats.late_landed,
        stats.late_landed as f64 / SEEDS as f64,
        stats.compactions,
        stats.restarts
    );
    // The schedule must exercise what the invariants are about.
    assert!(stats.appended > 20 * SEEDS && stats.delivered > 50 * SEEDS);
    assert!(stats.in_doubt > 0 && stats.failed > 0 && stats.skipped_trimmed > 0);
    // Lost answers are settled, not given up on: far more resends settle
    // than appends end in doubt.
    assert!(
        stats.settled > 10 * stats.in_doubt,
        "{} settled",
        stats.settled
    );
    assert!(stats.contended > 0);
    assert!(stats.compactions > SEEDS && stats.restarts > SEEDS / 2);
    assert!(
        stats.late_landed > 0,
        "no request landed late: the fault was never exercised"
    );
}

/// Two appenders reading the same head race; the loser backs off and
/// retries on the head its failure showed, and with a quiet etcd both
/// land, in some order, as 1 and 2.
#[test]
fn a_race_for_the_head_has_one_winner_and_the_loser_retries() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let mut rng = rng(3);
    let faults = Faults::none();
    let config = append_config(None, 32);
    let mut a = new_appender(&config, t0, 1);
    let mut b = new_appender(&config, t0, 2);
    a.machine.handle(t0, AppendInput::Append(b"a".to_vec()));
    b.machine.handle(t0, AppendInput::Append(b"b".to_vec()));
    step(&mut etcd, &mut [&mut a, &mut b], t0, &mut rng, &faults);
    run_until(
        &mut etcd,
        &mut [&mut a, &mut b],
        t0 + Duration::from_secs(1),
        &mut rng,
        &faults,
    );
    let mut ids: Vec<u64> = [a.notifications.clone(), b.notifications.clone()]
        .concat()
        .into_iter()
        .map(|(_, n)| match n {
            AppendNotice::Appended { seq, .. } => seq,
            other => panic!("{other:?}"),
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2]);
    assert_eq!(
        a.requests_sent + b.requests_sent,
        5,
        "a read and a txn each, plus the loser's second txn (its failed one \
         read the winner's head)"
    );
}

/// A head handed to a new machine that pairs a real revision with another
/// `seq` (a group's first ID with the group's revision, as an earlier
/// version of the coordinator's head cache did) must not write over
/// entries: the guard's value compare fails it like a stale head, and the
/// append lands after the real head.
#[test]
fn a_head_pair_etcd_never_held_writes_nothing_over_existing_entries() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let mut rng = rng(5);
    let faults = Faults::none();
    let mut first = new_appender(&append_config(None, 32), t0, 1);
    for p in ["a", "b", "c"] {
        first
            .machine
            .handle(t0, AppendInput::Append(p.as_bytes().to_vec()));
    }
    step(&mut etcd, &mut [&mut first], t0, &mut rng, &faults);
    run_until(
        &mut etcd,
        &mut [&mut first],
        t0 + Duration::from_secs(1),
        &mut rng,
        &faults,
    );
    let appended: Vec<(u64, Revision)> = first
        .notifications
        .iter()
        .map(|(_, n)| match n {
            AppendNotice::Appended { seq, revision } => (*seq, *revision),
            other => panic!("{other:?}"),
        })
        .collect();
    let (_, revision) = appended[0];
    assert!(
        appended.iter().all(|(_, r)| *r == revision),
        "one group, one revision: {appended:?}"
    );
    let wrong = AppendConfig {
        head: Some(Head {
            seq: 1,
            mod_revision: revision,
        }),
        ..append_config(None, 32)
    };
    let mut second = new_appender(&wrong, t0, 2);
    second
        .machine
        .handle(t0, AppendInput::Append(b"d".to_vec()));
    step(&mut etcd, &mut [&mut second], t0, &mut rng, &faults);
    run_until(
        &mut etcd,
        &mut [&mut second],
        t0 + Duration::from_secs(2),
        &mut rng,
        &faults,
    );
    assert!(
        matches!(
            second.notifications.as_slice(),
            [(_, AppendNotice::Appended { seq: 4, .. })]
        ),
        "{:?}",
        second.notifications
    );
    let kvs = etcd
        .range_prefix(keys().entry_prefix())
        .into_iter()
        .map(|kv| String::from_utf8(kv.value).expect("utf-8"))
        .collect::<Vec<_>>();
    assert_eq!(kvs, ["a", "b", "c", "d"]);
}
