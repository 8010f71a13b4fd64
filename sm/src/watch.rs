//! Prefix watch with snapshot replay, revision de-duplication and resync.
//!
//! [`Watch`] keeps a consumer informed of every key under a prefix: it reads
//! a snapshot, replays it as [`WatchNotice::Up`]s, says
//! [`WatchNotice::Synced`], then watches from the snapshot revision + 1.
//!
//! Snapshots are read in pages of [`WatchConfig::page_size`] keys, all at
//! one revision: the header revision of the first page. Each page asks for
//! one key more than it keeps, so a page without that key is the last and
//! no empty page is read after it. etcd counts the rest of a page's range
//! on every page, so after the first few pages each page's range also ends
//! about a page ahead ([`KeyRange::PrefixSpan`]), placed by how densely
//! the keys read so far lay; a page that does not fill such a range goes on
//! from its end. A snapshot of N keys then costs etcd O(N), not O(N² /
//! page). The first snapshot
//! streams its `Up`s page by page, asking for the next page before it
//! hands out the `Up`s of the one it has, so etcd reads one while the
//! consumer gets the other; a resync collects its pages and emits the diff
//! after the last one. A page read at a revision etcd has compacted
//! meanwhile restarts the snapshot at the current revision; a page etcd
//! refuses (an answer over the client's message limit is refused) is read
//! again at half the size, down to one key. An error that retrying cannot
//! fix (a refused one-key page, a denied permission) ends the machine with
//! [`WatchNotice::Failed`] instead of a silent retry loop.
//! A watch canceled for compaction reads its fresh snapshot at once.
//! Whenever the watch fails, is canceled (compaction or otherwise), answers
//! with something unexpected, or the consumer falls behind, it reads a fresh
//! snapshot and emits only the *difference* against what the consumer was
//! already told, then watches again. So, whatever the faults, the notices
//! applied in order always rebuild etcd's prefix: no change is lost for good,
//! none is invented, and a `Down` always names a key previously `Up`.
//!
//! Slow consumers: the driver feeds [`WatchInput::ConsumerFull`] when the
//! consumer's channel passes its soft capacity. The machine then cancels its
//! request and says nothing until [`WatchInput::ConsumerReady`], when it
//! resyncs — or, in the middle of the first snapshot, reads its next page
//! (at the snapshot's revision, so nothing is lost or repeated). Memory therefore stays bounded by the channel capacity plus one
//! diff, and the driver never blocks or drops a notice.
//!
//! Exactly one request is outstanding at any time; a watch being replaced is
//! canceled ([`Command::Cancel`]) before its successor is opened.
//!
//! # Leave or expiry
//!
//! Under [`KeyRule::HostId`] a key `<host key>/left` is that host's *leave
//! marker* ([`leave_marker_key`]): a graceful close writes it on the host's
//! lease and deletes the host key in one transaction, then revokes the
//! lease (which removes the marker). Markers are never reported (neither
//! as a key nor as [`WatchNotice::InvalidKey`]); they decide how a known
//! host key's disappearance is reported:
//!
//! (A key `<host key>/incarnation`, [`incarnation_key`], is not reported
//! either: its value, when written with the host key's state, comes as the
//! [`WatchNotice::Incarnation`] before each notice about that host.)
//!
//! * [`WatchNotice::Left`] when its marker *marks* it — bound to the same
//!   (non-zero) lease as the host key's last seen state, and created at a
//!   later revision than the host key — and
//!   * live: the marker is written in the revision that deletes the host
//!     key (the one-transaction leave); or it was known before that
//!     revision and is deleted in it (a revoke, or an expiry, of the lease
//!     both are bound to deletes both at once: how fleetcoord versions
//!     before the one-transaction leave announced it);
//!   * by a resync's diff (the delete happened while no watch was open):
//!     the fresh snapshot holds the marker (its revoke not yet applied),
//!     or the marker was known before the resync and the fresh snapshot no
//!     longer has it either.
//! * [`WatchNotice::Down`] otherwise: the lease expired (a crash, a
//!   partition or pause past the TTL), the close could not write its
//!   marker (etcd unreachable), another client deleted the host key alone,
//!   the marker was on another lease or older than the registration, a
//!   leave whose marker came and went entirely while disconnected (marker
//!   never seen), a missed delete seen as a re-created key, and hosts
//!   written by fleetcoord versions that write no markers.
//!
//! A host that left but whose revoke then failed keeps its marker until
//! the lease expires; nothing more is reported then. A client that writes
//! the marker and deletes the host key in one transaction, or deletes both
//! in one, is taken for a leave. A host registering again after a leave
//! starts clean: its new key has a newer create revision and a new lease,
//! which the old marker marks neither.

mod keys;
mod view;

pub use keys::{
    incarnation_key, leave_marker_key, parse_host_id, parse_incarnation_key, parse_leave_marker,
    KeyClass, KeyRule, INCARNATION_SUFFIX, LEAVE_MARKER_SUFFIX,
};

use crate::backoff::{Backoff, BackoffConfig};
use crate::clock::Clock;
use crate::outbox::Outbox;
use crate::rpc::{
    key_after, Command, KeyRange, KeyValue, RangeRequest, Request, Response, Revision, RpcError,
    RpcId, RpcReply, WatchEvent,
};
use crate::timer::TimerTable;
use crate::Machine;
use std::time::Instant;
use view::View;

/// What to watch and how to retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchConfig {
    /// Every key starting with these bytes is watched.
    pub prefix: Vec<u8>,
    /// Which keys under the prefix are reported; others become
    /// [`WatchNotice::InvalidKey`] once.
    pub keys: KeyRule,
    /// Delays between failed attempts; reset once a watch is established.
    pub backoff: BackoffConfig,
    /// Keys per snapshot page ([`DEFAULT_PAGE_SIZE`] unless a test wants
    /// many pages); values below 1 count as 1. Halved for the rest of a
    /// snapshot whenever etcd refuses a page as too large.
    pub page_size: i64,
}

/// Keys per snapshot page by default: with etcd's 1.5 MiB value limit a
/// page may still exceed the client's 4 MiB answer limit, and is then
/// halved; with typical small values a page stays well under it.
pub const DEFAULT_PAGE_SIZE: i64 = 1000;

/// Inputs of [`Watch`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum WatchInput {
    /// The outcome of a request this machine issued (late ones are ignored).
    Rpc(RpcReply),
    /// The consumer's channel is over its soft capacity: stop producing.
    ConsumerFull,
    /// The consumer caught up: resync and continue.
    ConsumerReady,
    /// Cancel everything; the machine issues nothing afterwards.
    Stop,
}

impl From<RpcReply> for WatchInput {
    fn from(reply: RpcReply) -> Self {
        WatchInput::Rpc(reply)
    }
}

/// What the consumer is told. Applied in order, these rebuild the set of
/// valid keys under the prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WatchNotice {
    /// A key appeared: replayed from the first snapshot, created later, or
    /// found by a resync.
    Up(KeyValue),
    /// A known key was written again (same create revision). Emitted for
    /// every put with a newer mod revision, even if value and lease are
    /// unchanged, and by a resync when anything about the key changed.
    Updated(KeyValue),
    /// A known key disappeared (or was re-created, then an `Up` follows)
    /// without a leave announced for it (see [`WatchNotice::Left`]):
    /// its lease expired, or it was deleted. Carries the last-seen key and
    /// value, since etcd no longer has them.
    Down(KeyValue),
    /// A known key disappeared after its holder announced a leave: exactly
    /// like [`WatchNotice::Down`] otherwise (the same key leaves the set),
    /// and emitted instead of it, never beside it. Only under
    /// [`KeyRule::HostId`], where leave markers exist; the rule is in the
    /// module docs ("Leave or expiry").
    Left(KeyValue),
    /// The incarnation of the host the very next notice (an `Up`,
    /// `Updated`, `Down` or `Left`) is about: the positive decimal value
    /// of its [`incarnation_key`], written in the same revision and on the
    /// same lease as the host key's state that notice carries (for a
    /// `Down`/`Left`, the last state seen). Only under [`KeyRule::HostId`];
    /// a notice without one before it is about a host whose incarnation is
    /// not known (written by another client or an older version).
    ///
    /// A first snapshot reads a host key before its incarnation key (key
    /// order), possibly a page earlier, so the `Up` of the last new host
    /// key of a page waits for the next page (or the snapshot's end).
    Incarnation(u64),
    /// The first snapshot has been replayed completely. Emitted exactly
    /// once, before any notice that is not part of that replay. A replay
    /// interrupted between pages (compaction, a paused consumer) finishes
    /// as a diff, so `Updated`/`Down` correcting an earlier `Up` may
    /// precede it; a `Down` never comes without an earlier `Up`.
    Synced,
    /// A key under the prefix that does not satisfy the [`KeyRule`];
    /// reported once per key for the machine's life, then ignored.
    InvalidKey(Vec<u8>),
    /// etcd answered a snapshot read with an error that retrying cannot
    /// fix (a permission denied, a one-key page still too large, ...). The
    /// machine has stopped; this is its last notice.
    Failed(RpcError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// Backoff before the next snapshot read.
    Retry,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for [`Timer::Retry`] before reading a snapshot page.
    Waiting,
    /// A snapshot page read is outstanding.
    Ranging(RpcId),
    /// A watch is open; `established` once its first response arrived.
    Watching { id: RpcId, established: bool },
    /// The consumer is full; nothing is outstanding until it drains.
    Paused,
    /// Stopped for good.
    Stopped,
}

/// The watch machine: see the [module docs](self).
#[derive(Clone, Debug)]
pub struct Watch {
    prefix: Vec<u8>,
    backoff: Backoff,
    timers: TimerTable<Timer>,
    outbox: Outbox<WatchNotice>,
    view: View,
    /// Highest revision the view reflects; events at or below it are repeats.
    revision: Revision,
    synced: bool,
    phase: Phase,
    /// The snapshot being read, while one is (kept across retries of a
    /// page, dropped when the watch is paused or replaced).
    snapshot: Option<Snapshot>,
    page_size: i64,
    clock: Clock,
}

/// A snapshot read page by page.
#[derive(Clone, Debug)]
struct Snapshot {
    /// Revision every page is read at: the first page's header revision,
    /// 0 until that page answered.
    revision: Revision,
    /// Where the next page starts; `None` for the first page.
    from: Option<Vec<u8>>,
    /// Keys per page for the rest of this snapshot.
    page: i64,
    /// Deliver each page as it comes (the first snapshot, while the
    /// consumer has been told nothing, so the diff is all `Up`s) rather
    /// than collect the pages and diff after the last.
    streaming: bool,
    /// Pages collected so far when not streaming.
    collected: Vec<KeyValue>,
    /// Where the next page's range ends, as a [`Span`]: `None` reads to
    /// the prefix's end (the first [`UNBOUNDED_PAGES`] pages, and after a
    /// span found nothing).
    span: Option<Span>,
    /// Full pages answered so far.
    pages: u32,
}

/// How many full pages a snapshot reads to the prefix's end before it
/// bounds its pages' ranges: a small prefix is read as it always was, in
/// as few requests as possible, and these pages' counts cost etcd a
/// fixed multiple of the prefix, not its square.
const UNBOUNDED_PAGES: u32 = 3;

/// A stretch of the key space past the prefix, in [`position`]s: the next
/// page reads from its snapshot's `from` up to `at + width`. etcd counts
/// the rest of a page's range on every page, so pages that run to the
/// prefix's end make a snapshot of N keys cost it O(N²/page); a range end
/// placed about one page ahead keeps each count near the page's size and
/// the snapshot linear. The width comes from how densely the keys read so
/// far lay.
#[derive(Clone, Copy, Debug)]
struct Span {
    at: u64,
    width: u64,
}

/// Where `key` lies past `prefix`: its first 8 bytes after the prefix as
/// a big-endian number (missing bytes count as 0). Keys in byte order have
/// positions in the same order.
fn position(prefix: &[u8], key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    for (b, k) in bytes
        .iter_mut()
        .zip(key.get(prefix.len()..).unwrap_or_default())
    {
        *b = *k;
    }
    u64::from_be_bytes(bytes)
}

/// The key at `position` past `prefix`: the prefix and the position's 8
/// bytes. It sorts after every key whose [`position`] is lower.
fn key_at(prefix: &[u8], position: u64) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(&position.to_be_bytes());
    key
}

/// The most a span grows from one page to the next: a dense stretch after
/// a sparse one costs at most this many pages' worth of counting.
const SPAN_GROWTH: u64 = 16;

impl Watch {
    /// A watch that immediately asks for the first snapshot. Jitter of the
    /// retry delays is derived from `seed` alone.
    pub fn new(config: WatchConfig, now: Instant, seed: u64) -> Self {
        let mut watch = Watch {
            view: View::new(config.prefix.clone(), config.keys),
            prefix: config.prefix,
            backoff: Backoff::new(config.backoff, seed),
            timers: TimerTable::new(),
            outbox: Outbox::default(),
            revision: 0,
            synced: false,
            phase: Phase::Waiting,
            snapshot: None,
            page_size: config.page_size.max(1),
            clock: Clock::new(now),
        };
        watch.start_range();
        watch
    }

    /// The keys the consumer has been told about, in key order: exactly the
    /// result of applying every notice emitted so far.
    pub fn known(&self) -> impl Iterator<Item = &KeyValue> {
        self.view.known()
    }

    /// Whether the first snapshot has been replayed (and `Synced` emitted).
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Whether a watch is established and no resync is pending: the known
    /// set is then as fresh as etcd's notifications allow.
    pub fn is_live(&self) -> bool {
        matches!(
            self.phase,
            Phase::Watching {
                established: true,
                ..
            }
        )
    }

    /// Start a fresh snapshot at the current revision.
    fn start_range(&mut self) {
        self.view.forget_held();
        self.snapshot = Some(Snapshot {
            revision: 0,
            from: None,
            page: self.page_size,
            streaming: !self.synced && self.view.is_empty(),
            collected: Vec::new(),
            span: None,
            pages: 0,
        });
        self.read_page();
    }

    /// The end of the next page's range: `None` for the prefix's end.
    fn span_end(&self, span: Option<Span>) -> Option<(Vec<u8>, u64)> {
        let span = span?;
        let end = span.at.checked_add(span.width)?;
        Some((key_at(&self.prefix, end), end))
    }

    /// Ask for the next page of the snapshot under way (a fresh one if
    /// none is).
    fn read_page(&mut self) {
        let Some(snapshot) = &self.snapshot else {
            return self.start_range();
        };
        let range = match (&snapshot.from, self.span_end(snapshot.span)) {
            (None, _) => KeyRange::Prefix(self.prefix.clone()),
            (Some(from), Some((to, _))) => KeyRange::PrefixSpan {
                prefix: self.prefix.clone(),
                from: from.clone(),
                to,
            },
            (Some(from), None) => KeyRange::PrefixFrom {
                prefix: self.prefix.clone(),
                from: from.clone(),
            },
        };
        let request = Request::Range(RangeRequest {
            limit: lookahead_limit(snapshot.page),
            revision: snapshot.revision,
            ..RangeRequest::all(range)
        });
        let id = self.outbox.rpc(request);
        self.phase = Phase::Ranging(id);
    }

    /// Drop whatever is outstanding (request or retry timer).
    fn abandon(&mut self) {
        match self.phase {
            Phase::Ranging(id) | Phase::Watching { id, .. } => self.outbox.cancel(id),
            Phase::Waiting => self.timers.stop(Timer::Retry),
            Phase::Paused | Phase::Stopped => {}
        }
    }

    fn retry_later(&mut self, now: Instant) {
        self.abandon();
        let delay = self.backoff.next_delay();
        // An absurd configured delay must not panic; retrying at once is the
        // harmless fallback.
        self.timers
            .set(Timer::Retry, now.checked_add(delay).unwrap_or(now));
        self.phase = Phase::Waiting;
    }

    /// Give up for good: tell the consumer why and stop.
    fn fail(&mut self, error: RpcError) {
        self.abandon();
        self.timers.clear();
        self.snapshot = None;
        self.phase = Phase::Stopped;
        self.outbox.notify(WatchNotice::Failed(error));
    }

    fn notify_all(&mut self, notices: Vec<WatchNotice>) {
        self.outbox.reserve(notices.len());
        for notice in notices {
            self.outbox.notify(notice);
        }
    }

    fn on_page(&mut self, now: Instant, result: Result<Response, RpcError>) {
        let Some(mut snapshot) = self.snapshot.take() else {
            return self.retry_later(now);
        };
        let (header, kvs) = match result {
            Ok(Response::Range { revision, kvs }) => (revision, kvs),
            // The snapshot's revision was compacted between pages: start
            // over at the current one.
            Err(RpcError::Compacted { .. }) if snapshot.revision > 0 => {
                return self.start_range();
            }
            // Refused, most likely as over the message limit: a smaller
            // page may fit. A refused one-key page is final.
            Err(RpcError::Rejected(_)) if snapshot.page > 1 => {
                snapshot.page /= 2;
                self.snapshot = Some(snapshot);
                return self.read_page();
            }
            Err(e) if !e.is_retryable() && !matches!(e, RpcError::Compacted { .. }) => {
                return self.fail(e);
            }
            Err(_) => {
                // Try the same page again later, at the same revision.
                self.snapshot = Some(snapshot);
                return self.retry_later(now);
            }
            Ok(_) => return self.retry_later(now),
        };
        if snapshot.revision == 0 {
            snapshot.revision = header;
        }
        let mut kvs = kvs;
        let len = i64::try_from(kvs.len()).unwrap_or(i64::MAX);
        // With the one-key lookahead (see `lookahead_limit`), more keys
        // follow exactly when the page came back over its size; the extra
        // key is left for the next page. A one-key page has no lookahead:
        // it is full when it holds its key.
        let full = if lookahead_limit(snapshot.page) > snapshot.page {
            len > snapshot.page
        } else {
            len >= snapshot.page
        };
        if full {
            let lookahead = kvs
                .split_off(usize::try_from(snapshot.page).unwrap_or(usize::MAX))
                .into_iter()
                .next();
            let next = kvs.last().map(|kv| key_after(&kv.key));
            // The next page must start inside the prefix and past this
            // one; anything else is not etcd's answer to this read.
            let advances = next.as_ref().is_some_and(|next| {
                next.starts_with(&self.prefix) && snapshot.from.as_ref().is_none_or(|f| next > f)
            });
            if !advances {
                return self.retry_later(now);
            }
            // A page's worth of keys lay between where it started and its
            // last key: the next page's span is as wide.
            snapshot.pages = snapshot.pages.saturating_add(1);
            if snapshot.pages < UNBOUNDED_PAGES || snapshot.page < 2 {
                // Still reading to the prefix's end; and one key (a page
                // halved after refusals) tells no density.
            } else if let (Some(first), Some(last)) = (kvs.first(), kvs.last()) {
                let start = snapshot
                    .span
                    .map_or_else(|| position(&self.prefix, &first.key), |s| s.at);
                let at = position(&self.prefix, &last.key);
                snapshot.span = Some(Span {
                    at,
                    width: at.saturating_sub(start).max(1),
                });
            }
            snapshot.from = next;
            if snapshot.streaming {
                // The next page is asked for before this one's notices, so
                // that etcd reads it while the consumer is handed these
                // (the driver sends a request before it delivers what
                // follows it). The snapshot is already past this page: a
                // pause from here on resumes after it, and what these
                // notices told the consumer stays true.
                self.snapshot = Some(snapshot);
                self.read_page();
                return self.view.add(kvs, lookahead, &mut self.outbox);
            }
            snapshot.collected.extend(kvs);
            self.snapshot = Some(snapshot);
            return self.read_page();
        }
        // Not full: the page's range is read to its end. Unless that is
        // the prefix's end, the next page starts there, over a span
        // resized to hold about a page.
        if let (Some(span), Some((to, end))) = (snapshot.span, self.span_end(snapshot.span)) {
            let found = u64::try_from(kvs.len()).unwrap_or(u64::MAX);
            let page = u64::try_from(snapshot.page).unwrap_or(1).max(1);
            let grown = span.width.saturating_mul(SPAN_GROWTH);
            // Keys are seldom spread evenly over bytes (text leaves most
            // byte values unused): a span that found nothing grows, one
            // that found some is resized to hold about a page.
            let width = match found {
                0 => grown,
                n => (span.width / n).saturating_mul(page).min(grown),
            };
            snapshot.span = Some(Span {
                at: end,
                width: width.max(1),
            });
            snapshot.from = Some(to);
            if snapshot.streaming {
                // As for a full page: the next is asked for first. The
                // last key may still wait for its incarnation key, which
                // would open the next page.
                self.snapshot = Some(snapshot);
                self.read_page();
                return self.view.add(kvs, None, &mut self.outbox);
            }
            snapshot.collected.extend(kvs);
            self.snapshot = Some(snapshot);
            return self.read_page();
        }
        if snapshot.streaming {
            self.view.add(kvs, None, &mut self.outbox);
            self.view.flush(&mut self.outbox);
        } else {
            snapshot.collected.extend(kvs);
        }
        let kvs = if snapshot.streaming {
            None
        } else {
            Some(snapshot.collected)
        };
        self.on_snapshot(snapshot.revision, kvs);
    }

    /// The last page is in: `kvs` are every page's keys when they were
    /// collected (a resync), `None` when each page was delivered already.
    fn on_snapshot(&mut self, revision: Revision, kvs: Option<Vec<KeyValue>>) {
        let mut notices = Vec::new();
        if let Some(kvs) = kvs {
            self.view.resync(kvs, &mut notices);
        }
        if !self.synced {
            self.synced = true;
            notices.push(WatchNotice::Synced);
        }
        self.notify_all(notices);
        self.revision = revision;
        let id = self.outbox.rpc(Request::Watch {
            range: KeyRange::Prefix(self.prefix.clone()),
            start_revision: revision.saturating_add(1),
        });
        self.phase = Phase::Watching {
            id,
            established: false,
        };
    }

    fn on_events(&mut self, events: Vec<WatchEvent>) {
        // All events of one revision arrive in one batch, so comparing with
        // the revision reached *before* the batch drops repeats without
        // dropping the siblings of an event that shares its revision.
        let base = self.revision;
        let mut notices = Vec::new();
        // Grouped by revision: whether a delete is a leave depends on the
        // other deletes of its revision (its leave marker's).
        let mut group: Vec<WatchEvent> = Vec::new();
        for event in events {
            let revision = event.kv.mod_revision;
            if revision <= base {
                continue;
            }
            if group
                .last()
                .is_some_and(|last| last.kv.mod_revision != revision)
            {
                self.view
                    .apply_revision(std::mem::take(&mut group), &mut notices);
            }
            self.revision = self.revision.max(revision);
            group.push(event);
        }
        if !group.is_empty() {
            self.view.apply_revision(group, &mut notices);
        }
        self.notify_all(notices);
    }

    fn on_reply(&mut self, now: Instant, reply: RpcReply) {
        match self.phase {
            Phase::Ranging(id) if id == reply.id => self.on_page(now, reply.result),
            Phase::Watching { id, established } if id == reply.id => match reply.result {
                Ok(Response::WatchEvents { events }) => {
                    if !established {
                        self.backoff.reset();
                        self.phase = Phase::Watching {
                            id,
                            established: true,
                        };
                    }
                    self.on_events(events);
                }
                // Compacted past the watch's position: nothing failed, and
                // waiting would only leave the consumer behind longer; the
                // fresh snapshot is read at once.
                Ok(Response::WatchCanceled { compact_revision }) if compact_revision > 0 => {
                    self.abandon();
                    self.start_range();
                }
                _ => self.retry_later(now),
            },
            _ => {}
        }
    }
}

/// The limit a snapshot page of `page` keys asks etcd for: one key more,
/// so that a page that comes back without that key is known to be the
/// last, with no further (empty) read; etcd's own `more` flag is not in
/// the rpc vocabulary. A one-key page (the smallest a refused page is
/// halved to) asks for exactly one, so that it stays one key.
fn lookahead_limit(page: i64) -> i64 {
    if page > 1 {
        page.saturating_add(1)
    } else {
        page
    }
}

impl Machine for Watch {
    type Input = WatchInput;
    type Notice = WatchNotice;

    fn handle(&mut self, now: Instant, input: WatchInput) {
        self.clock.observe(now);
        if self.phase == Phase::Stopped {
            return;
        }
        match input {
            WatchInput::Rpc(reply) => self.on_reply(now, reply),
            WatchInput::ConsumerFull => {
                self.abandon();
                // A first snapshot being streamed continues where it
                // stopped (at its revision, unless compacted meanwhile);
                // collected pages are dropped, a later resync reads afresh.
                if !self.snapshot.as_ref().is_some_and(|s| s.streaming) {
                    self.snapshot = None;
                }
                self.phase = Phase::Paused;
            }
            WatchInput::ConsumerReady => {
                if self.phase == Phase::Paused {
                    self.read_page();
                }
            }
            WatchInput::Stop => {
                self.abandon();
                self.snapshot = None;
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
                        self.read_page();
                    }
                }
            }
        }
    }

    fn poll_command(&mut self) -> Option<Command<WatchNotice>> {
        self.outbox.pop()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if self.phase == Phase::Stopped {
            return None;
        }
        self.timers.next().map(|at| self.clock.clamp(at))
    }

    fn stop_input() -> WatchInput {
        WatchInput::Stop
    }

    fn is_finished(&self) -> bool {
        self.phase == Phase::Stopped && self.outbox.is_empty()
    }

    fn consumer_full_input() -> Option<WatchInput> {
        Some(WatchInput::ConsumerFull)
    }

    fn consumer_ready_input() -> Option<WatchInput> {
        Some(WatchInput::ConsumerReady)
    }
}
