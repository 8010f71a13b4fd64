//! Prefix watch with snapshot replay, revision de-duplication and resync.
//!
//! [`Watch`] keeps a consumer informed of every key under a prefix: it reads
//! a snapshot (`Range`), replays it as [`WatchNotice::Up`]s, says
//! [`WatchNotice::Synced`], then watches from the snapshot revision + 1.
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
//! resyncs. Memory therefore stays bounded by the channel capacity plus one
//! diff, and the driver never blocks or drops a notice.
//!
//! Exactly one request is outstanding at any time; a watch being replaced is
//! canceled ([`Command::Cancel`]) before its successor is opened.

mod keys;
mod view;

pub use keys::{parse_host_id, KeyRule};

use crate::backoff::{Backoff, BackoffConfig};
use crate::clock::Clock;
use crate::outbox::Outbox;
use crate::rpc::{
    Command, KeyRange, KeyValue, RangeRequest, Request, Response, Revision, RpcId, RpcReply,
    WatchEvent,
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
}

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
    /// A known key disappeared (or was re-created, then an `Up` follows).
    /// Carries the last-seen key and value, since etcd no longer has them.
    Down(KeyValue),
    /// The first snapshot has been replayed completely. Emitted exactly
    /// once, before any notice that is not part of that replay.
    Synced,
    /// A key under the prefix that does not satisfy the [`KeyRule`];
    /// reported once per key for the machine's life, then ignored.
    InvalidKey(Vec<u8>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// Backoff before the next snapshot read.
    Retry,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for [`Timer::Retry`] before reading a snapshot.
    Waiting,
    /// A snapshot read is outstanding.
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
    clock: Clock,
}

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

    fn start_range(&mut self) {
        let request = Request::Range(RangeRequest::all(KeyRange::Prefix(self.prefix.clone())));
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

    fn notify_all(&mut self, notices: Vec<WatchNotice>) {
        for notice in notices {
            self.outbox.notify(notice);
        }
    }

    fn on_snapshot(&mut self, revision: Revision, kvs: Vec<KeyValue>) {
        let mut notices = Vec::new();
        self.view.resync(kvs, &mut notices);
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
        for event in events {
            let revision = event.kv.mod_revision;
            if revision <= base {
                continue;
            }
            self.revision = self.revision.max(revision);
            self.view.apply(event, &mut notices);
        }
        self.notify_all(notices);
    }

    fn on_reply(&mut self, now: Instant, reply: RpcReply) {
        match self.phase {
            Phase::Ranging(id) if id == reply.id => match reply.result {
                Ok(Response::Range { revision, kvs }) => self.on_snapshot(revision, kvs),
                _ => self.retry_later(now),
            },
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
                _ => self.retry_later(now),
            },
            _ => {}
        }
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
                self.phase = Phase::Paused;
            }
            WatchInput::ConsumerReady => {
                if self.phase == Phase::Paused {
                    self.start_range();
                }
            }
            WatchInput::Stop => {
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
                        self.start_range();
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
