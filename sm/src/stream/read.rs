//! The reader: which entries to deliver ([`Cursor`]) and the machine that
//! reads, watches and re-reads a stream ([`Reader`]).

use super::requests;
use super::{Entry, StreamError, StreamKeys};
use crate::backoff::{Backoff, BackoffConfig};
use crate::clock::Clock;
use crate::outbox::Outbox;
use crate::rpc::{
    self, Command, EventKind, KeyValue, Response, RpcError, RpcId, RpcReply, WatchEvent,
};
use crate::timer::TimerTable;
use crate::Machine;
use std::collections::BTreeSet;
use std::time::Instant;

/// The delivery rule of a reader: entries strictly after the last delivered
/// sequence number, in increasing order, each once.
///
/// It needs nothing but that number, so a reader resumes anywhere — after
/// a watch failure, a compaction, a reconnect or in another process — by
/// reading again and offering what it finds: everything at or below
/// [`Cursor::last`] is a repeat and is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cursor {
    last: u64,
}

/// What a cursor let through from one read or one watch batch.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Batch {
    /// Entries to deliver, in order.
    pub entries: Vec<Entry>,
    /// Keys under the entry prefix that are not entry keys, in the order
    /// met; they are never delivered.
    pub invalid: Vec<Vec<u8>>,
}

impl Cursor {
    /// A cursor that delivers entries after `after` (0 = from the start).
    pub fn new(after: u64) -> Self {
        Cursor { last: after }
    }

    /// The last sequence number delivered (or the starting point).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Whether entry `seq` is to be delivered; if so it becomes the last.
    pub fn admit(&mut self, seq: u64) -> bool {
        if seq > self.last {
            self.last = seq;
            true
        } else {
            false
        }
    }

    /// The entries of a read of the entry prefix to deliver. Sorted by
    /// sequence number first, so the answer's order does not matter; gaps
    /// are entries trimmed before the read and are skipped.
    pub fn read(&mut self, keys: &StreamKeys, kvs: Vec<KeyValue>) -> Batch {
        let mut batch = Batch::default();
        let mut found = Vec::with_capacity(kvs.len());
        for kv in kvs {
            match keys.entry_seq(&kv.key) {
                Some(seq) => found.push(Entry {
                    seq,
                    payload: kv.value,
                }),
                None if kv.key.starts_with(keys.entry_prefix()) => batch.invalid.push(kv.key),
                None => {}
            }
        }
        found.sort_by_key(|e| e.seq);
        batch.entries = found.into_iter().filter(|e| self.admit(e.seq)).collect();
        batch
    }

    /// The entries of a watch batch to deliver. Only puts count: deletes
    /// are trimming. Events are taken in the order given (revision order),
    /// and anything at or below the last delivered entry — a repeat after a
    /// reconnect — is dropped, so delivery stays ordered whatever arrives.
    pub fn events(&mut self, keys: &StreamKeys, events: Vec<WatchEvent>) -> Batch {
        let mut batch = Batch::default();
        for event in events {
            if event.kind != EventKind::Put {
                continue;
            }
            match keys.entry_seq(&event.kv.key) {
                Some(seq) if self.admit(seq) => batch.entries.push(Entry {
                    seq,
                    payload: event.kv.value,
                }),
                Some(_) => {}
                None if event.kv.key.starts_with(keys.entry_prefix()) => {
                    batch.invalid.push(event.kv.key)
                }
                None => {}
            }
        }
        batch
    }

    /// Where to read from after a watch failure, a compaction or a pause:
    /// the key of the entry after [`Cursor::last`].
    pub fn resume_key(&self, keys: &StreamKeys) -> Vec<u8> {
        keys.entry_key(self.last.saturating_add(1))
    }
}

/// Where a [`Reader`] starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum ReadFrom {
    /// Every retained entry, then new ones.
    Start,
    /// Only entries appended after the first read.
    End,
    /// Entries after this sequence number. If it is beyond the head, the
    /// next append is the first entry delivered; if entries after it were
    /// trimmed, the oldest retained one is.
    After(u64),
}

/// What to read and how to retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReaderConfig {
    /// The stream's keys.
    pub keys: StreamKeys,
    /// Where to start.
    pub from: ReadFrom,
    /// Delays between failed attempts; reset once a watch is established.
    pub backoff: BackoffConfig,
}

/// Inputs of [`Reader`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum ReaderInput {
    /// The outcome of a request this machine issued (late ones are ignored).
    Rpc(RpcReply),
    /// The consumer's channel is over its soft capacity: stop producing.
    ConsumerFull,
    /// The consumer caught up: read again after the last delivered entry.
    ConsumerReady,
    /// Cancel everything; the machine issues nothing afterwards.
    Stop,
}

impl From<RpcReply> for ReaderInput {
    fn from(reply: RpcReply) -> Self {
        ReaderInput::Rpc(reply)
    }
}

/// What the consumer is told.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReaderNotice {
    /// The next entry: sequence numbers strictly increase from one entry to
    /// the next.
    Entry(Entry),
    /// The first page has been read and its entries delivered: every
    /// entry appended from now on will come (from a later page or the
    /// watch). Emitted exactly once, after the entries of that page and
    /// before any other entry.
    Live,
    /// A key under the entry prefix that is not an entry key; reported once
    /// per key for the machine's life, then ignored.
    InvalidKey(Vec<u8>),
    /// Reading failed for good (the head is garbage, or etcd refused a
    /// request, which retrying would not change). The machine has stopped.
    Failed(StreamError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// Backoff before the next read.
    Retry,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for [`Timer::Retry`] before reading.
    Waiting,
    /// A read is outstanding.
    Reading(RpcId),
    /// A watch is open; `established` once its first response arrived.
    Watching { id: RpcId, established: bool },
    /// The consumer is full; nothing is outstanding until it drains.
    Paused,
    /// Stopped for good.
    Stopped,
}

/// The reader machine: see the [module docs](super).
///
/// Exactly one request is outstanding at any time (none while waiting,
/// paused or stopped). A new request is only issued once the previous one
/// has ended: answered, failed, ended by etcd, or canceled
/// ([`Command::Cancel`]) when the consumer is full or the reader stops.
#[derive(Clone, Debug)]
pub struct Reader {
    keys: StreamKeys,
    /// The starting position until the first read resolves it.
    unresolved: Option<ReadFrom>,
    cursor: Cursor,
    backoff: Backoff,
    timers: TimerTable<Timer>,
    outbox: Outbox<ReaderNotice>,
    /// Kept for the machine's life so each bad key is reported once,
    /// however often it is read again; grows only with distinct bad keys.
    reported: BTreeSet<Vec<u8>>,
    live: bool,
    /// Where the next page starts.
    next_from: Vec<u8>,
    /// Keys per page: [`PAGE`], halved each time etcd refuses a page (an
    /// answer over the gRPC message limit is refused), down to one entry.
    page: i64,
    phase: Phase,
    clock: Clock,
}

/// Keys per page of a read. Entries are at most 1.5 MiB each (etcd's
/// request limit), so a page of large entries can exceed the client's 4 MiB
/// answer limit: the reader then halves the page and reads again.
pub const PAGE: i64 = 256;

impl Reader {
    /// A reader that immediately asks for its first read. Retry jitter is
    /// derived from `seed` alone.
    pub fn new(config: ReaderConfig, now: Instant, seed: u64) -> Self {
        let after = match config.from {
            ReadFrom::After(seq) => seq,
            ReadFrom::Start | ReadFrom::End => 0,
        };
        let next_from = match config.from {
            // Everything under the prefix, so junk keys are reported too.
            ReadFrom::Start => config.keys.entry_prefix().to_vec(),
            _ => config.keys.entry_key(after.saturating_add(1)),
        };
        let mut reader = Reader {
            keys: config.keys,
            unresolved: Some(config.from),
            cursor: Cursor::new(after),
            backoff: Backoff::new(config.backoff, seed),
            timers: TimerTable::new(),
            outbox: Outbox::default(),
            reported: BTreeSet::new(),
            live: false,
            next_from,
            page: PAGE,
            phase: Phase::Waiting,
            clock: Clock::new(now),
        };
        reader.start_read();
        reader
    }

    /// The last sequence number delivered (or the resolved starting point).
    pub fn last(&self) -> u64 {
        self.cursor.last()
    }

    /// Whether [`ReaderNotice::Live`] has been emitted.
    pub fn is_live(&self) -> bool {
        self.live
    }

    /// Whether a watch is established and no re-read is pending.
    pub fn is_watching(&self) -> bool {
        matches!(
            self.phase,
            Phase::Watching {
                established: true,
                ..
            }
        )
    }

    fn start_read(&mut self) {
        let request = match self.unresolved {
            // The whole stream is wanted: no head needed.
            Some(ReadFrom::Start) | None => {
                requests::read_entries(&self.keys, &self.next_from, self.page)
            }
            // Nothing before the head is wanted: read only the head.
            Some(ReadFrom::End) => requests::read_head(&self.keys),
            // Clamp to the head and take entries from the same snapshot.
            Some(ReadFrom::After(_)) => {
                requests::read_head_and_entries(&self.keys, &self.next_from, self.page)
            }
        };
        let id = self.outbox.rpc(request);
        self.phase = Phase::Reading(id);
    }

    /// The next read starts after the last delivered entry (a failed page,
    /// watch or pause may have left `next_from` anywhere).
    fn resume_after_last(&mut self) {
        if self.unresolved.is_none() {
            self.next_from = self.cursor.resume_key(&self.keys);
        }
    }

    /// Drop whatever is outstanding (request or retry timer).
    fn abandon(&mut self) {
        match self.phase {
            Phase::Reading(id) | Phase::Watching { id, .. } => self.outbox.cancel(id),
            Phase::Waiting => self.timers.stop(Timer::Retry),
            Phase::Paused | Phase::Stopped => {}
        }
    }

    /// Called when the outstanding request has ended (answered, failed or
    /// canceled by etcd), so there is nothing to cancel.
    fn retry_later(&mut self, now: Instant) {
        self.resume_after_last();
        let delay = self.backoff.next_delay();
        // An absurd configured delay must not panic; retrying at once is the
        // harmless fallback.
        self.timers
            .set(Timer::Retry, now.checked_add(delay).unwrap_or(now));
        self.phase = Phase::Waiting;
    }

    /// Like [`Reader::retry_later`], called when the outstanding request
    /// has ended.
    fn fail(&mut self, error: StreamError) {
        self.timers.clear();
        self.phase = Phase::Stopped;
        self.outbox.notify(ReaderNotice::Failed(error));
    }

    fn deliver(&mut self, batch: Batch) {
        for key in batch.invalid {
            if self.reported.insert(key.clone()) {
                self.outbox.notify(ReaderNotice::InvalidKey(key));
            }
        }
        for entry in batch.entries {
            self.outbox.notify(ReaderNotice::Entry(entry));
        }
    }

    /// The entries to deliver from a read's answer, resolving the starting
    /// position on the first one. `Err(None)` = retry, `Err(Some(e))` = give up.
    fn read_answer(
        &mut self,
        response: Response,
    ) -> Result<(i64, Vec<KeyValue>), Option<StreamError>> {
        match (self.unresolved, response) {
            (Some(ReadFrom::End), Response::Range { revision, kvs }) => {
                let head = requests::parse_head(&self.keys, &kvs).map_err(Some)?;
                self.cursor = Cursor::new(head.seq);
                Ok((revision, Vec::new()))
            }
            (
                Some(ReadFrom::After(after)),
                Response::Txn {
                    revision,
                    succeeded: true,
                    responses,
                },
            ) => {
                let (head, entries) = requests::split_head_and_entries(responses).ok_or(None)?;
                let head = requests::parse_head(&self.keys, &head).map_err(Some)?;
                self.cursor = Cursor::new(after.min(head.seq));
                Ok((revision, entries))
            }
            (Some(ReadFrom::Start) | None, Response::Range { revision, kvs }) => {
                Ok((revision, kvs))
            }
            _ => Err(None),
        }
    }

    fn on_read(&mut self, now: Instant, result: Result<Response, RpcError>) {
        let response = match result {
            Ok(response) => response,
            // An answer over the message limit is refused too (the driver
            // reports it as `Rejected`): a smaller page may fit. Only a
            // one-entry page that is refused is final.
            Err(RpcError::Rejected(_))
                if self.page > 1 && self.unresolved != Some(ReadFrom::End) =>
            {
                self.page /= 2;
                return self.start_read();
            }
            Err(e) if !e.is_retryable() => return self.fail(StreamError::Rpc(e)),
            Err(_) => return self.retry_later(now),
        };
        let (revision, kvs) = match self.read_answer(response) {
            Ok(answer) => answer,
            Err(Some(e)) => return self.fail(e),
            Err(None) => return self.retry_later(now),
        };
        let was_head_only = self.unresolved == Some(ReadFrom::End);
        self.unresolved = None;
        let full = !was_head_only && i64::try_from(kvs.len()).unwrap_or(i64::MAX) >= self.page;
        if let Some(last) = kvs.last() {
            self.next_from = rpc::key_after(&last.key);
        } else {
            self.resume_after_last();
        }
        let batch = self.cursor.read(&self.keys, kvs);
        self.deliver(batch);
        if !self.live {
            self.live = true;
            self.outbox.notify(ReaderNotice::Live);
        }
        if full {
            // There may be more: the next page, from just after this one.
            return self.start_read();
        }
        // Everything up to `revision` is in the reads: the watch takes over
        // exactly after it.
        let request = requests::watch_entries(&self.keys, revision.saturating_add(1));
        let id = self.outbox.rpc(request);
        self.phase = Phase::Watching {
            id,
            established: false,
        };
    }

    fn on_watch(
        &mut self,
        now: Instant,
        id: RpcId,
        established: bool,
        result: Result<Response, RpcError>,
    ) {
        match result {
            Ok(Response::WatchEvents { events }) => {
                if !established {
                    self.backoff.reset();
                    self.phase = Phase::Watching {
                        id,
                        established: true,
                    };
                }
                let batch = self.cursor.events(&self.keys, events);
                self.deliver(batch);
            }
            Err(e) if !e.is_retryable() => self.fail(StreamError::Rpc(e)),
            // Failed, canceled (compaction or otherwise), or nonsense: read
            // again after the last delivered entry.
            _ => self.retry_later(now),
        }
    }

    fn on_reply(&mut self, now: Instant, reply: RpcReply) {
        match self.phase {
            Phase::Reading(id) if id == reply.id => self.on_read(now, reply.result),
            Phase::Watching { id, established } if id == reply.id => {
                self.on_watch(now, id, established, reply.result)
            }
            _ => {}
        }
    }
}

impl Machine for Reader {
    type Input = ReaderInput;
    type Notice = ReaderNotice;

    fn handle(&mut self, now: Instant, input: ReaderInput) {
        self.clock.observe(now);
        if self.phase == Phase::Stopped {
            return;
        }
        match input {
            ReaderInput::Rpc(reply) => self.on_reply(now, reply),
            ReaderInput::ConsumerFull => {
                self.abandon();
                self.resume_after_last();
                self.phase = Phase::Paused;
            }
            ReaderInput::ConsumerReady => {
                if self.phase == Phase::Paused {
                    self.start_read();
                }
            }
            ReaderInput::Stop => {
                self.abandon();
                self.timers.clear();
                self.phase = Phase::Stopped;
            }
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.clock.observe(now);
        while let Some(timer) = self.timers.pop_expired(now) {
            match timer {
                Timer::Retry => {
                    if self.phase == Phase::Waiting {
                        self.start_read();
                    }
                }
            }
        }
    }

    fn poll_command(&mut self) -> Option<Command<ReaderNotice>> {
        self.outbox.pop()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if self.phase == Phase::Stopped {
            return None;
        }
        self.timers.next().map(|at| self.clock.clamp(at))
    }

    fn stop_input() -> ReaderInput {
        ReaderInput::Stop
    }

    fn is_finished(&self) -> bool {
        self.phase == Phase::Stopped && self.outbox.is_empty()
    }

    fn consumer_full_input() -> Option<ReaderInput> {
        Some(ReaderInput::ConsumerFull)
    }

    fn consumer_ready_input() -> Option<ReaderInput> {
        Some(ReaderInput::ConsumerReady)
    }
}
