//! The wire between one machine and the model etcd: requests run at the
//! send instant, replies arrive after a drawn latency, watches are served
//! from the model's history one batch per revision, streams can break and
//! replies can be lost. A unary request can also be held up and land at
//! etcd later, after its client was told it failed and whatever the client
//! did since. A harness never reorders what real etcd would not (watch
//! batches, renewals on one keepalive stream).

use crate::faults::Faults;
use crate::random::{chance, ChaCha8Rng};
use crate::{ModelEtcd, LIVELOCK_LIMIT};
use fleetcoord_sm::{
    Command, KeyRange, Machine, Request, Response, Revision, RpcError, RpcId, RpcReply, WatchEvent,
};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// Which gRPC stream a reply travels on: replies on one keepalive stream
/// keep their order, a watch's batches keep theirs, unary calls race.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    Unary,
    KeepAlive,
    Watch,
}

/// A reply on its way; `seq` keeps send order among equal due instants.
#[derive(Clone, Debug)]
struct Pending {
    due: Instant,
    seq: u64,
    id: RpcId,
    stream: Stream,
    result: Result<Response, RpcError>,
}

/// A unary request held up on its way to etcd: it runs at `due` (or, if etcd
/// is paused then, once it resumes) and nobody waits for its result. `seq`
/// keeps send order among equal due instants.
#[derive(Clone, Debug)]
struct Held {
    due: Instant,
    seq: u64,
    request: Request,
}

/// A watch registered at the model: the next revision it has not yet
/// been sent, and when its last batch arrives (later batches never
/// overtake it).
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
    pub notifications: Vec<(Instant, M::Notice)>,
    /// How long after `drop_streams` the stream errors arrive.
    pub stream_drop_delay: Duration,
    /// Requests handed to etcd (including failed ones), for statistics.
    pub requests_sent: u64,
    /// Injected request failures, lost replies and held-up requests, for
    /// statistics (counted when injected).
    pub faults_injected: u64,
    /// Held-up requests that have since landed at etcd, for statistics (and
    /// for a simulation to show the fault happened at all).
    pub late_landed: u64,
    pending: Vec<Pending>,
    queued: VecDeque<(RpcId, Request)>,
    held: Vec<Held>,
    /// Held-up requests whose instant came while etcd was paused, in the
    /// order they came due: they land at the first pump after it resumes.
    stalled: VecDeque<Request>,
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
            late_landed: 0,
            pending: Vec::new(),
            queued: VecDeque::new(),
            held: Vec::new(),
            stalled: VecDeque::new(),
            watches: BTreeMap::new(),
            keepalive_last_due: None,
            seq: 0,
        }
    }

    /// Drains the machine's commands: runs RPCs against `etcd` (or queues
    /// them while it is paused, running the queue first once it is not),
    /// registers watches, honours cancels, records notifications; then
    /// schedules every new watch event of every active watch. Held-up
    /// requests whose instant came while etcd was paused land first, before
    /// the queue (they were due before it could run).
    pub fn pump(
        &mut self,
        etcd: &mut ModelEtcd,
        now: Instant,
        rng: &mut ChaCha8Rng,
        faults: &Faults,
    ) {
        if !etcd.is_paused() {
            while let Some(request) = self.stalled.pop_front() {
                self.land(etcd, now, &request);
            }
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
        if stream == Stream::Unary && chance(rng, faults.land_late) {
            self.faults_injected += 1;
            let late_due = now + faults.sample_late_by(rng);
            self.seq += 1;
            self.held.push(Held {
                due: late_due,
                seq: self.seq,
                request,
            });
            self.push(
                due,
                id,
                stream,
                Err(RpcError::Unavailable("injected: request held up".into())),
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

    /// Runs a held-up request at etcd, at the instant it is processed (never
    /// earlier than the model's clock has been), and drops its result: its
    /// client gave up on it long ago.
    fn land(&mut self, etcd: &mut ModelEtcd, now: Instant, request: &Request) {
        // Whatever etcd answers (a failed guard, a lease long gone) is
        // what a late request gets in production too; nobody reads it.
        let _ = etcd.execute(now, request);
        self.late_landed += 1;
    }

    /// Lands every held-up request due at or before `now`, earliest first
    /// (send order among equals); while etcd is paused they stall instead,
    /// to land once it resumes.
    fn land_due(&mut self, etcd: &mut ModelEtcd, now: Instant) {
        while let Some(index) = self
            .held
            .iter()
            .enumerate()
            .filter(|(_, h)| h.due <= now)
            .min_by_key(|(_, h)| (h.due, h.seq))
            .map(|(i, _)| i)
        {
            let h = self.held.remove(index);
            if etcd.is_paused() {
                self.stalled.push_back(h.request);
            } else {
                self.land(etcd, now, &h.request);
            }
        }
    }

    // A held-up request is not the client's any more: a cancel leaves it.
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

    /// Lands every held-up request due at or before `now` at etcd (or, if
    /// it is paused, keeps it for the first pump after it resumes), then
    /// hands every reply due at or before `now` to the machine, earliest
    /// first (send order among equals), pumping after each. Landing first
    /// means a reply due at the same instant already sees the late write.
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
        self.land_due(etcd, now);
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

    /// The earliest pending delivery, held-up request's landing or machine
    /// deadline. Requests stalled behind a paused etcd are not events: they
    /// land at the first pump after it resumes.
    pub fn next_event_time(&self) -> Option<Instant> {
        let delivery = self.pending.iter().map(|p| p.due).min();
        let landing = self.held.iter().map(|h| h.due).min();
        next_time(&[delivery, landing, self.machine.poll_timeout()])
    }

    /// Breaks every stream of this harness: each active (or queued) watch
    /// fails with `Unavailable("stream dropped")` and its undelivered batches
    /// are lost; every outstanding keepalive reply becomes that error (a
    /// renewal that ran stays run). Errors arrive `stream_drop_delay` later.
    /// Held-up requests still land: they are past this client's streams.
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
    /// Held-up requests still land.
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

    /// Held-up requests that have not landed yet (due later, or stalled
    /// behind a paused etcd); their machine gave up on them.
    pub fn held(&self) -> usize {
        self.held.len() + self.stalled.len()
    }

    /// Moves every held-up request not yet landed to `to`, in the order
    /// they would have landed, for a machine replaced by another that sits
    /// on the same wire: a process that stops does not recall what is stuck
    /// on its way to etcd, so those requests must still land. The counters
    /// stay here.
    pub fn pass_held_to<N: Machine>(&mut self, to: &mut Harness<N>) {
        let mut held = std::mem::take(&mut self.held);
        held.sort_by_key(|h| (h.due, h.seq));
        for h in held {
            to.seq += 1;
            to.held.push(Held { seq: to.seq, ..h });
        }
        to.stalled.append(&mut self.stalled);
    }

    /// Takes every notification recorded so far.
    pub fn drain_notifications(&mut self) -> Vec<(Instant, M::Notice)> {
        std::mem::take(&mut self.notifications)
    }
}

/// The earliest of the given instants (here, at the bottom of the layers,
/// because the harness and every world above it use it).
pub fn next_time(candidates: &[Option<Instant>]) -> Option<Instant> {
    candidates.iter().flatten().min().copied()
}
