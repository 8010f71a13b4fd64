//! Who leads an election, and every change of leader.
//!
//! An election keeps one key per candidate under its prefix
//! (`<prefix><lease id in hex>`, as Go's `concurrency` package writes them);
//! the leader is the candidate whose key has the lowest create revision.
//! [`Observe`] runs a [`Watch`] over that prefix and, after each batch of
//! changes, reports the leader whenever its key, create revision or value
//! (a proclamation) changed — including `Leader(None)` when no candidate is
//! left. The first report comes right after the watch's initial snapshot.
//!
//! Observers want the *current* leader, not a history: when the consumer
//! falls behind, the watch resyncs and only the leader after the resync is
//! reported, never a stale one.

use crate::backoff::BackoffConfig;
use crate::outbox::Outbox;
use crate::rpc::{Command, KeyValue, Revision, RpcError, RpcReply};
use crate::watch::{KeyRule, Watch, WatchConfig, WatchInput, WatchNotice, DEFAULT_PAGE_SIZE};
use crate::Machine;
use std::time::Instant;

/// What to observe and how to retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObserveConfig {
    /// The election's key prefix; every key under it is a candidate.
    pub prefix: Vec<u8>,
    /// Delays between failed attempts of the underlying watch.
    pub backoff: BackoffConfig,
}

/// Inputs of [`Observe`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum ObserveInput {
    /// The outcome of a request this machine issued (late ones are ignored).
    Rpc(RpcReply),
    /// The consumer's channel is over its soft capacity: stop producing.
    ConsumerFull,
    /// The consumer caught up: resync and report the leader if it changed.
    ConsumerReady,
    /// Cancel everything; the machine issues nothing afterwards.
    Stop,
}

impl From<RpcReply> for ObserveInput {
    fn from(reply: RpcReply) -> Self {
        ObserveInput::Rpc(reply)
    }
}

/// What the consumer is told.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ObserveNotice {
    /// The leader now: its key (value = what it proclaimed), or `None` when
    /// no candidate remains. Never repeated without a change of key, create
    /// revision or value.
    Leader(Option<KeyValue>),
    /// The underlying watch met an error retrying cannot fix (see
    /// [`WatchNotice::Failed`]); the machine has stopped and reports
    /// nothing more.
    Failed(RpcError),
}

/// The observe machine: see the [module docs](self).
#[derive(Clone, Debug)]
pub struct Observe {
    watch: Watch,
    outbox: Outbox<ObserveNotice>,
    /// The leader last reported; `None` until the first report.
    reported: Option<Option<KeyValue>>,
}

impl Observe {
    /// An observer that immediately asks for the election's snapshot.
    pub fn new(config: ObserveConfig, now: Instant, seed: u64) -> Self {
        let watch = WatchConfig {
            prefix: config.prefix,
            keys: KeyRule::Any,
            backoff: config.backoff,
            page_size: DEFAULT_PAGE_SIZE,
        };
        let mut observe = Observe {
            watch: Watch::new(watch, now, seed),
            outbox: Outbox::default(),
            reported: None,
        };
        observe.pump();
        observe
    }

    /// The leader as of the last report; `None` before the first report or
    /// when there is no candidate.
    pub fn leader(&self) -> Option<&KeyValue> {
        self.reported.as_ref().and_then(Option::as_ref)
    }

    /// Forward the watch's requests, then report the leader once the whole
    /// batch of changes is applied, so a handover done in one revision
    /// (delete old + nothing else) is never reported as a flicker.
    fn pump(&mut self) {
        while let Some(command) = self.watch.poll_command() {
            match command {
                Command::Rpc { id, request } => self.outbox.push(Command::Rpc { id, request }),
                Command::Cancel { id } => self.outbox.cancel(id),
                Command::Notify(WatchNotice::Failed(e)) => {
                    self.outbox.notify(ObserveNotice::Failed(e));
                    return;
                }
                Command::Notify(_) => {}
            }
        }
        if !self.watch.is_synced() {
            return;
        }
        let leader = self
            .watch
            .known()
            .min_by_key(|kv| (kv.create_revision, &kv.key))
            .cloned();
        let changed = match &self.reported {
            None => true,
            Some(before) => identity(before.as_ref()) != identity(leader.as_ref()),
        };
        if changed {
            self.outbox.notify(ObserveNotice::Leader(leader.clone()));
        }
        // Kept fresh even without a report, so `leader()` shows the latest
        // mod revision and lease of an unchanged leader.
        self.reported = Some(leader);
    }
}

/// What makes a leader "different" for an observer.
fn identity(kv: Option<&KeyValue>) -> Option<(&[u8], Revision, &[u8])> {
    kv.map(|kv| (kv.key.as_slice(), kv.create_revision, kv.value.as_slice()))
}

impl Machine for Observe {
    type Input = ObserveInput;
    type Notice = ObserveNotice;

    fn handle(&mut self, now: Instant, input: ObserveInput) {
        let input = match input {
            ObserveInput::Rpc(reply) => WatchInput::Rpc(reply),
            ObserveInput::ConsumerFull => WatchInput::ConsumerFull,
            ObserveInput::ConsumerReady => WatchInput::ConsumerReady,
            ObserveInput::Stop => WatchInput::Stop,
        };
        self.watch.handle(now, input);
        self.pump();
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.watch.handle_timeout(now);
        self.pump();
    }

    fn poll_command(&mut self) -> Option<Command<ObserveNotice>> {
        self.outbox.pop()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.watch.poll_timeout()
    }

    fn stop_input() -> ObserveInput {
        ObserveInput::Stop
    }

    fn is_finished(&self) -> bool {
        self.watch.is_finished() && self.outbox.is_empty()
    }

    fn consumer_full_input() -> Option<ObserveInput> {
        Some(ObserveInput::ConsumerFull)
    }

    fn consumer_ready_input() -> Option<ObserveInput> {
        Some(ObserveInput::ConsumerReady)
    }
}
