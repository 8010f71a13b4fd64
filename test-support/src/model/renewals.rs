//! The renewals world: one real [`Renewals`] machine (the renewal stream
//! shared by every lease of a driver) around the model etcd's leases, with
//! the stream played explicitly: every opening's answer, every write, every
//! reply, a stream going silent or breaking, an opening that hangs, is an
//! action. Users renew leases (some etcd never had), revoke them (the
//! driver's `Forget` first, then the revoke at etcd) and stop the driver.
//!
//! Safety, checked after every action (the numbers are the machine's rules
//! and guarantees in `sm/src/renewals.rs`):
//! 1. **Answered once, by its deadline** (G1, G2): every renewal is
//!    answered at most once, never after its deadline (taken + the
//!    request timeout), and none is left waiting at or past it.
//! 2. **One deadline per renewal** (G2, rules 1, 7, 8): the machine's
//!    `poll_timeout()` is exactly the earliest deadline of the renewals
//!    waiting and of the opening under way (never earlier than now): no
//!    other timer exists.
//! 3. **TTLs are etcd's** (rules 4, 5): a TTL answer is the one etcd gave
//!    the write of that very renewal, delivered in the stream's order; or,
//!    for an opening refused because etcd has no such first lease, TTL 0
//!    for that lease's unwritten renewals, and then none of them is left
//!    waiting (TTL 0 for a missing lease). Nothing else answers a TTL.
//! 4. **Forget before revoke** (G3, rule 10): no renewal taken before a
//!    `Forget` of its lease is written after it; after the `Forget` none
//!    of them is left waiting, written or not (each was answered at once).
//!    **No stale renewal** (G6, rules 4 and 10): a renewal taken before a
//!    `Forget` of its lease is never answered with a TTL, though etcd ran
//!    the ones already written before the revoke and their replies, TTL
//!    above zero, still come after it; each such reply is consumed in its
//!    place, and the renewals behind it get their own replies.
//! 5. **One stream** (G4, rules 2, 3, 9, 12): `Open` only with no stream,
//!    for the lease of the oldest unwritten renewal; `Drop` only of a
//!    stream there is; writes only on an open stream, oldest renewal
//!    first; a renewal written on a stream is answered when that stream is
//!    given up (no renewal waits on a dropped stream); while renewals wait
//!    unwritten and no stream exists, one is being opened — or, with a
//!    reopen window (`reopen_spread`), the window of the last fault (a
//!    `Drop`, a refused opening) still runs: the machine's next timer then
//!    lies within it.
//! 6. **Reset on silence** (G4, rule 7): once a written renewal reaches
//!    its deadline unanswered, the stream it was written on is gone.
//! 7. **The monitor is told** (G5, rules 7, 9): a renewal answered for
//!    want of an answer at its deadline or on a stream given up for
//!    silence, a stream that ended or failed while reading, each tells
//!    `Suspect` in the same step; a stream closed for writes does not.
//!    (An opening that hangs to its own deadline fails the renewals
//!    waiting for it without telling the monitor, as rule 8 says.)
//! 8. **Stop** (rule 11): every renewal is answered, the stream dropped,
//!    no stream opened again, and later renewals are answered at once.
//!
//! Liveness, from every quiescent state (nothing to write, deliver or
//! answer on the stream): with no further faults, openings answered and
//! writes and replies made at once and time moving to each next
//! deadline, within `liveness_bound` every waiting renewal is answered
//! and a renewal of a live lease — asked again after each error answer,
//! as a keepalive does — is answered with a TTL above zero (a silent or
//! hung stream is given up and replaced), unless the driver stopped.

use super::{hash_debug, World};
use crate::ModelEtcd;
use fleetcoord_sm::renewals::{Renewals, RenewalsCommand, RenewalsInput};
use fleetcoord_sm::{LeaseId, Request, Response, RpcError};
use std::collections::{BTreeMap, VecDeque};
use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A lease id etcd never granted (the model starts far above it).
const MISSING: LeaseId = 1;

/// How many faults and requests of each kind one path may contain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// Renewals asked for, all leases together.
    pub renew: u32,
    /// Leases revoked (forgotten, then revoked at etcd).
    pub revoke: u32,
    /// Stops of the driver.
    pub stop: u32,
    /// Openings refused (`Unavailable`) or left hanging for good.
    pub open_fault: u32,
    /// Streams that go silent (etcd runs the writes, no reply comes back).
    pub silence: u32,
    /// Streams that end, fail while reading, or refuse a write.
    pub breaks: u32,
    /// Times time passes while something is on its way.
    pub delay: u32,
}

/// A world to explore: its size, its faults and what it checks.
#[derive(Clone, Debug)]
pub struct RenewalsSetup {
    /// Leases granted at the start (each with `ttl_secs`); one more lease
    /// etcd never had is renewable too when `missing` is set.
    pub leases: usize,
    /// A lease etcd never granted may be renewed.
    pub missing: bool,
    /// The granted TTL (the model grants 1 s as asked).
    pub ttl_secs: i64,
    /// The machine's request timeout.
    pub timeout: Duration,
    /// Faults and user requests per path.
    pub budget: Budget,
    /// Time stops here (a quiescent state at the horizon is a leaf).
    pub horizon: Duration,
    /// The liveness bound from every quiescent state.
    pub liveness_bound: Duration,
    /// The stream delivers a lease's replies newest first (a test that
    /// must fail, on rule 3).
    pub reorder_replies: bool,
    /// Every opening hangs, also in the fair continuation (a test that
    /// must fail, on liveness).
    pub openings_hang: bool,
    /// The machine's reopen window (rule 12, seed [`SEED`]); zero: none.
    pub reopen_spread: Duration,
}

/// The seed of the machine's reopen picks.
pub const SEED: u64 = 5;

impl RenewalsSetup {
    /// `leases` leases of 1 s plus a missing one, timeout 400 ms, no
    /// requests or faults, a 1.5 s horizon, liveness within 3 timeouts.
    pub fn new(leases: usize) -> Self {
        RenewalsSetup {
            leases,
            missing: true,
            ttl_secs: 1,
            timeout: Duration::from_millis(400),
            budget: Budget::default(),
            horizon: Duration::from_millis(1_500),
            liveness_bound: Duration::from_millis(1_200),
            reorder_replies: false,
            openings_hang: false,
            reopen_spread: Duration::ZERO,
        }
    }
}

/// One step of the renewals world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenewalsAction {
    /// The user renews lease `.0` (an index into the world's leases).
    Renew(usize),
    /// The driver revokes lease `.0`: `Forget`, then the revoke at etcd.
    Revoke(usize),
    /// The driver shuts down.
    Stop,
    /// The opening is answered as etcd would: open, or refused for a
    /// missing first lease.
    OpenDone,
    /// The opening is refused (`Unavailable`).
    OpenRefused,
    /// The opening will never be answered.
    OpenHang,
    /// The driver writes the next renewal to the open stream.
    Write,
    /// The oldest reply on the stream arrives.
    Reply,
    /// The stream goes silent: writes still run, replies are lost.
    Silence,
    /// The stream ends (`Ended`).
    End,
    /// Reading the stream fails (`Failed`).
    Fail,
    /// The stream refuses a write (`Closed`).
    Close,
    /// Time passes to the next deadline, nothing on its way.
    Tick,
    /// Time passes to the next deadline with something on its way.
    Delay,
}

/// The stream as the wire sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Stream {
    None,
    Opening {
        lease: LeaseId,
        deadline: Instant,
        hung: bool,
    },
    Open {
        /// Replies on their way, in order: token, lease, etcd's TTL.
        replies: VecDeque<(u64, LeaseId, i64)>,
        silent: bool,
    },
}

/// A renewal taken and not yet answered.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Waiting {
    lease: LeaseId,
    deadline: Instant,
    /// The generation of the stream it was written on.
    written: Option<u64>,
    /// Its lease was forgotten after it was taken.
    forgotten: bool,
}

/// What a TTL answer may be in the step under way (rule 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Nothing,
    /// The reply for this renewal with this TTL.
    Reply(u64, i64),
    /// TTL 0 for the unwritten renewals of this missing first lease.
    Missing(LeaseId),
}

/// What the step under way saw of the commands.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    suspects: u32,
    /// A renewal was answered for want of an answer at its deadline, or
    /// written on a stream given up for silence.
    no_answer: bool,
    /// A written renewal was answered for want of an answer.
    silent_written: bool,
}

/// The renewals world; see the module docs for what it checks.
#[derive(Clone)]
pub struct RenewalsWorld {
    setup: Arc<RenewalsSetup>,
    etcd: ModelEtcd,
    machine: Renewals<u64>,
    start: Instant,
    now: Instant,
    leases: Vec<LeaseId>,
    stream: Stream,
    /// Bumped at every `Open`: which stream a renewal was written on.
    generation: u64,
    waiting: BTreeMap<u64, Waiting>,
    next_token: u64,
    stopped: bool,
    budget: Budget,
    expect: Expect,
    seen: Seen,
    /// The last renewal answered with a TTL above zero (for liveness).
    positive: Option<u64>,
    /// The last fault that gave a stream up: no stream need open before
    /// it plus the reopen window (rule 12).
    fault: Option<Instant>,
    marks: u32,
}

const POSITIVE: u32 = 1 << 0;
const ZERO_REPLY: u32 = 1 << 1;
const ZERO_OPEN: u32 = 1 << 2;
const FORGOTTEN: u32 = 1 << 3;
const SILENCE_RESET: u32 = 1 << 4;
const OPENING_GIVEN_UP: u32 = 1 << 5;
const BROKEN: u32 = 1 << 6;
const SUSPECT: u32 = 1 << 7;
const STOPPED: u32 = 1 << 8;
const LIVENESS: u32 = 1 << 9;
const UNSENT_LATE: u32 = 1 << 10;
const STALE_CONSUMED: u32 = 1 << 11;
const REOPEN_WAITED: u32 = 1 << 12;

fn no_answer(error: &RpcError) -> bool {
    matches!(error, RpcError::Unavailable(m) if m.starts_with("no renewal answer"))
}

impl RenewalsWorld {
    /// The machine at rest, the leases granted.
    pub fn new(setup: RenewalsSetup) -> Self {
        let start = Instant::now();
        let mut etcd = ModelEtcd::new();
        etcd.min_ttl_secs = 1;
        let mut leases = Vec::new();
        for _ in 0..setup.leases {
            match etcd.execute(
                start,
                &Request::Grant {
                    ttl_secs: setup.ttl_secs,
                },
            ) {
                Ok(Response::Granted { lease, .. }) => leases.push(lease),
                other => panic!("the model grants: {other:?}"),
            }
        }
        if setup.missing {
            leases.push(MISSING);
        }
        RenewalsWorld {
            machine: Renewals::new(setup.timeout, start)
                .with_reopen_spread(setup.reopen_spread, SEED),
            budget: setup.budget.clone(),
            setup: Arc::new(setup),
            etcd,
            start,
            now: start,
            leases,
            stream: Stream::None,
            generation: 0,
            waiting: BTreeMap::new(),
            next_token: 0,
            stopped: false,
            expect: Expect::Nothing,
            seen: Seen::default(),
            positive: None,
            fault: None,
            marks: 0,
        }
    }

    /// The reopen window as the machine applies it (rule 12's cap).
    fn window(&self) -> Duration {
        self.setup.reopen_spread.min(self.setup.timeout / 4)
    }

    /// Whether rule 12 lets the machine wait before opening a stream now.
    fn may_wait(&self) -> bool {
        self.fault
            .is_some_and(|f| !self.window().is_zero() && self.now < f + self.window())
    }

    fn at(&self, t: Instant) -> String {
        format!("+{} ms", (t - self.start).as_millis())
    }

    /// Feeds `input` at now, due timers first as a driver must, and
    /// carries out what the machine says.
    fn feed(&mut self, input: RenewalsInput<u64>, expect: Expect) -> Result<(), String> {
        self.fire_due()?;
        self.expect = expect;
        self.machine.handle(self.now, input);
        let done = self.execute();
        self.expect = Expect::Nothing;
        done
    }

    fn fire_due(&mut self) -> Result<(), String> {
        if self.machine.poll_timeout().is_some_and(|t| t <= self.now) {
            self.machine.handle_timeout(self.now);
            self.execute()?;
        }
        Ok(())
    }

    /// Carries out the machine's commands, checking rules 1, 3, 5 and 7.
    fn execute(&mut self) -> Result<(), String> {
        while let Some(command) = self.machine.poll_command() {
            match command {
                RenewalsCommand::Open { lease } => {
                    if self.stream != Stream::None || self.stopped {
                        return Err(format!(
                            "Open on lease {lease:x} with the stream {:?} (stopped {})",
                            self.stream, self.stopped
                        ));
                    }
                    let oldest = self.waiting.values().find(|w| w.written.is_none());
                    if oldest.map(|w| w.lease) != Some(lease) {
                        return Err(format!(
                            "Open on lease {lease:x}, but the oldest unwritten renewal is {oldest:?}"
                        ));
                    }
                    if self.may_wait() {
                        self.marks |= REOPEN_WAITED;
                    }
                    self.generation += 1;
                    self.stream = Stream::Opening {
                        lease,
                        deadline: self.now + self.setup.timeout,
                        hung: self.setup.openings_hang,
                    };
                }
                RenewalsCommand::Drop => {
                    if matches!(self.stream, Stream::Opening { .. }) {
                        self.marks |= OPENING_GIVEN_UP;
                    }
                    if self.stream == Stream::None {
                        return Err("Drop with no stream".into());
                    }
                    self.stream = Stream::None;
                    self.fault = Some(self.now);
                }
                RenewalsCommand::Suspect => {
                    self.seen.suspects += 1;
                    self.marks |= SUSPECT;
                }
                RenewalsCommand::Answer { token, ttl } => self.answered(token, ttl)?,
            }
        }
        Ok(())
    }

    /// Rules 1 and 3 for one answer.
    fn answered(&mut self, token: u64, ttl: Result<i64, RpcError>) -> Result<(), String> {
        let Some(w) = self.waiting.remove(&token) else {
            return Err(format!("renewal {token} answered twice, or never asked"));
        };
        if self.now > w.deadline {
            return Err(format!(
                "renewal {token} answered at {}, after its deadline {}",
                self.at(self.now),
                self.at(w.deadline)
            ));
        }
        if w.forgotten && matches!(ttl, Ok(t) if t > 0) {
            return Err(format!(
                "renewal {token} of lease {:x}, taken before its lease was forgotten (revoked), \
                 answered TTL {ttl:?}: that answer may predate the revoke",
                w.lease
            ));
        }
        match ttl {
            Ok(ttl) => match self.expect {
                Expect::Reply(t, expected) if t == token && ttl == expected => {
                    self.marks |= if ttl > 0 { POSITIVE } else { ZERO_REPLY };
                    if ttl > 0 {
                        self.positive = Some(token);
                    }
                }
                Expect::Missing(lease) if w.lease == lease && w.written.is_none() && ttl == 0 => {
                    self.marks |= ZERO_OPEN;
                }
                expect => {
                    return Err(format!(
                        "renewal {token} of lease {:x} answered TTL {ttl}, but what came is \
                         {expect:?}",
                        w.lease
                    ))
                }
            },
            Err(error) => {
                if self.expect == Expect::Missing(w.lease) && w.written.is_none() {
                    return Err(format!(
                        "renewal {token} of missing lease {:x} answered {error:?}, not TTL 0",
                        w.lease
                    ));
                }
                if no_answer(&error) {
                    // A renewal at its deadline, or one the silence of its
                    // stream answers; not one answered early because the
                    // opening it waited for hung (rule 8 tells nobody).
                    if w.written.is_some() || self.now >= w.deadline {
                        self.seen.no_answer = true;
                    }
                    if w.written.is_some() {
                        self.seen.silent_written = true;
                    } else if self.now >= w.deadline {
                        self.marks |= UNSENT_LATE;
                    }
                }
                if error == RpcError::Unavailable("the lease is being revoked".into()) {
                    self.marks |= FORGOTTEN;
                }
            }
        }
        Ok(())
    }

    /// Rules 1, 2, 5 and 8 on the state reached.
    fn check(&self) -> Result<(), String> {
        let mut expected: Option<Instant> = None;
        for (token, w) in &self.waiting {
            if w.deadline <= self.now {
                return Err(format!(
                    "renewal {token} still waits at {}, its deadline {}",
                    self.at(self.now),
                    self.at(w.deadline)
                ));
            }
            if let Some(generation) = w.written {
                let open = matches!(self.stream, Stream::Open { .. });
                if !open || generation != self.generation {
                    return Err(format!(
                        "renewal {token} waits on stream {generation}, which is gone \
                         (stream now {:?}, generation {})",
                        self.stream, self.generation
                    ));
                }
            }
            expected = Some(expected.map_or(w.deadline, |e| e.min(w.deadline)));
        }
        if let Stream::Opening { deadline, .. } = self.stream {
            if deadline <= self.now {
                return Err(format!(
                    "the opening is still under way past its deadline {}",
                    self.at(deadline)
                ));
            }
            expected = Some(expected.map_or(deadline, |e| e.min(deadline)));
        }
        let timeout = self.machine.poll_timeout();
        let unwritten = self.waiting.values().any(|w| w.written.is_none());
        let reopening = self.stream == Stream::None && unwritten && self.may_wait();
        // Rule 12: a reopen wait is the one other timer, within the window.
        let early = reopening
            && timeout.is_some_and(|t| {
                expected.is_none_or(|e| t <= e)
                    && self.fault.is_some_and(|f| t <= f + self.window())
            });
        if timeout != expected && !early {
            return Err(format!(
                "the machine's next deadline is {:?}, but the renewals and the opening \
                 waiting make it {:?}",
                timeout.map(|t| self.at(t)),
                expected.map(|t| self.at(t))
            ));
        }
        if unwritten && self.stream == Stream::None && !self.may_wait() {
            return Err(format!(
                "renewals wait unwritten and no stream is being opened (last fault {:?}, \
                 window {:?})",
                self.fault.map(|f| self.at(f)),
                self.window()
            ));
        }
        if self.stopped && (!self.waiting.is_empty() || self.stream != Stream::None) {
            return Err(format!(
                "stopped with {} renewals waiting and the stream {:?}",
                self.waiting.len(),
                self.stream
            ));
        }
        if self.machine.waiting() != self.waiting.len() {
            return Err(format!(
                "the machine counts {} renewals waiting, the world {}",
                self.machine.waiting(),
                self.waiting.len()
            ));
        }
        Ok(())
    }

    /// Something on the stream can happen without time passing.
    fn in_flight(&self) -> bool {
        match &self.stream {
            Stream::None => false,
            Stream::Opening { hung, .. } => !hung,
            Stream::Open { replies, silent } => {
                (!silent && !replies.is_empty()) || self.machine.wants_to_write()
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        [self.machine.poll_timeout(), self.etcd.next_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    fn tick(&mut self) -> Result<(), String> {
        let Some(at) = self.next_deadline() else {
            return Ok(());
        };
        self.now = self.now.max(at);
        self.etcd.advance(self.now);
        self.fire_due()?;
        if self.seen.silent_written {
            self.marks |= SILENCE_RESET;
        }
        Ok(())
    }

    fn renew(&mut self, lease: LeaseId) -> Result<(), String> {
        self.next_token += 1;
        let token = self.next_token;
        self.waiting.insert(
            token,
            Waiting {
                lease,
                deadline: self.now + self.setup.timeout,
                written: None,
                forgotten: false,
            },
        );
        self.feed(RenewalsInput::Renew { lease, token }, Expect::Nothing)?;
        if self.stopped && self.waiting.contains_key(&token) {
            return Err(format!(
                "renewal {token} after the stop is not answered at once"
            ));
        }
        Ok(())
    }

    /// Rule 4's forget, then the revoke at etcd.
    fn revoke(&mut self, lease: LeaseId) -> Result<(), String> {
        for w in self.waiting.values_mut().filter(|w| w.lease == lease) {
            w.forgotten = true;
        }
        self.feed(RenewalsInput::Forget { lease }, Expect::Nothing)?;
        if let Some((token, w)) = self
            .waiting
            .iter()
            .find(|(_, w)| w.lease == lease && w.forgotten)
        {
            return Err(format!(
                "renewal {token} of forgotten lease {lease:x} still waits (written on {:?})",
                w.written
            ));
        }
        self.etcd.expire_lease(lease);
        Ok(())
    }

    fn open_done(&mut self) -> Result<(), String> {
        let Stream::Opening { lease, .. } = self.stream else {
            return Ok(());
        };
        // etcd-client's own first request renews the first lease.
        let ttl = self.renew_at_etcd(lease);
        if ttl == 0 {
            self.stream = Stream::None;
            self.feed(
                RenewalsInput::OpenFailed {
                    error: RpcError::LeaseNotFound,
                },
                Expect::Missing(lease),
            )?;
            let left = self
                .waiting
                .iter()
                .find(|(_, w)| w.lease == lease && w.written.is_none());
            if let Some((token, _)) = left {
                return Err(format!(
                    "renewal {token} of missing lease {lease:x} still waits after the opening \
                     was refused for it"
                ));
            }
            Ok(())
        } else {
            self.stream = Stream::Open {
                replies: VecDeque::new(),
                silent: false,
            };
            self.feed(RenewalsInput::Opened, Expect::Nothing)
        }
    }

    fn renew_at_etcd(&mut self, lease: LeaseId) -> i64 {
        match self.etcd.execute(self.now, &Request::KeepAlive { lease }) {
            Ok(Response::KeptAlive { ttl_secs }) => ttl_secs,
            other => panic!("the model renews: {other:?}"),
        }
    }

    fn write(&mut self) -> Result<(), String> {
        self.fire_due()?;
        let Some(lease) = self.machine.poll_write() else {
            return Ok(());
        };
        let generation = self.generation;
        let Stream::Open { .. } = self.stream else {
            return Err(format!(
                "lease {lease:x} written with the stream {:?}",
                self.stream
            ));
        };
        let Some((&token, w)) = self.waiting.iter_mut().find(|(_, w)| w.written.is_none()) else {
            return Err(format!(
                "lease {lease:x} written, but no renewal waits unwritten"
            ));
        };
        if w.lease != lease {
            return Err(format!(
                "lease {lease:x} written, but the oldest unwritten renewal ({token}) is of \
                 lease {:x}",
                w.lease
            ));
        }
        if w.forgotten {
            return Err(format!(
                "renewal {token} of lease {lease:x} written after its forget"
            ));
        }
        w.written = Some(generation);
        let ttl = self.renew_at_etcd(lease);
        let reorder = self.setup.reorder_replies;
        if let Stream::Open { replies, silent } = &mut self.stream {
            if !*silent {
                // The bend: this reply overtakes the lease's earlier ones.
                let at = if reorder {
                    replies
                        .iter()
                        .position(|r| r.1 == lease)
                        .unwrap_or(replies.len())
                } else {
                    replies.len()
                };
                replies.insert(at, (token, lease, ttl));
            }
        }
        Ok(())
    }

    fn reply(&mut self) -> Result<(), String> {
        let Stream::Open { replies, .. } = &mut self.stream else {
            return Ok(());
        };
        let Some((token, lease, ttl_secs)) = replies.pop_front() else {
            return Ok(());
        };
        if !self.waiting.contains_key(&token) {
            // Answered at its lease's forget: this reply is stale.
            self.marks |= STALE_CONSUMED;
        }
        self.feed(
            RenewalsInput::Reply { lease, ttl_secs },
            Expect::Reply(token, ttl_secs),
        )
    }

    /// Rule 7 for a stream broken by `input`.
    fn broken(&mut self, input: RenewalsInput<u64>) -> Result<(), String> {
        let tells = !matches!(input, RenewalsInput::Closed);
        self.fire_due()?;
        if !matches!(self.stream, Stream::Open { .. }) {
            return Ok(());
        }
        self.seen = Seen::default();
        self.feed(input, Expect::Nothing)?;
        self.marks |= BROKEN;
        if matches!(self.stream, Stream::Open { .. }) {
            return Err("a broken stream is not dropped".into());
        }
        if tells != (self.seen.suspects > 0) {
            return Err(format!(
                "a stream broken ({}) told the monitor {} times",
                if tells { "while reading" } else { "for writes" },
                self.seen.suspects
            ));
        }
        Ok(())
    }

    /// The fair continuation's next step, if any is on its way.
    fn fair_next(&mut self) -> Option<Result<(), String>> {
        match &self.stream {
            Stream::Opening { hung: false, .. } => Some(self.open_done()),
            Stream::Open { replies, silent } => {
                if self.machine.wants_to_write() {
                    Some(self.write())
                } else if !silent && !replies.is_empty() {
                    Some(self.reply())
                } else {
                    None
                }
            }
            _ => None,
        }
    }
}

impl World for RenewalsWorld {
    type Action = RenewalsAction;

    const MARKS: &'static [&'static str] = &[
        "TTL answered",
        "TTL 0 replied",
        "TTL 0 at opening",
        "forgotten unwritten",
        "silent stream reset",
        "opening given up",
        "stream broken",
        "monitor told",
        "stopped",
        "liveness checked",
        "unwritten renewal late",
        "stale reply consumed",
        "reopen waited",
    ];

    fn actions(&self, out: &mut Vec<RenewalsAction>) {
        use RenewalsAction::*;
        let b = &self.budget;
        if b.renew > 0 {
            out.extend((0..self.leases.len()).map(Renew));
        }
        if b.revoke > 0 && !self.stopped {
            out.extend(
                (0..self.leases.len())
                    .filter(|i| self.etcd.lease_exists(self.leases[*i]))
                    .map(Revoke),
            );
        }
        if b.stop > 0 && !self.stopped {
            out.push(Stop);
        }
        match &self.stream {
            Stream::None => {}
            Stream::Opening { hung, .. } => {
                if !hung {
                    out.push(OpenDone);
                    if b.open_fault > 0 {
                        out.extend([OpenRefused, OpenHang]);
                    }
                }
            }
            Stream::Open { replies, silent } => {
                if self.machine.wants_to_write() {
                    out.push(Write);
                }
                if !silent && !replies.is_empty() {
                    out.push(Reply);
                }
                if b.silence > 0 && !silent {
                    out.push(Silence);
                }
                if b.breaks > 0 {
                    out.extend([End, Fail, Close]);
                }
            }
        }
        if self
            .next_deadline()
            .is_some_and(|at| at <= self.start + self.setup.horizon)
        {
            if !self.in_flight() {
                out.push(Tick);
            } else if b.delay > 0 {
                out.push(Delay);
            }
        }
    }

    fn apply(&mut self, action: &RenewalsAction) -> Result<(), String> {
        use RenewalsAction::*;
        self.seen = Seen::default();
        match *action {
            Renew(i) => {
                self.budget.renew -= 1;
                self.renew(self.leases[i])?;
            }
            Revoke(i) => {
                self.budget.revoke -= 1;
                self.revoke(self.leases[i])?;
            }
            Stop => {
                self.budget.stop -= 1;
                self.feed(RenewalsInput::Stop, Expect::Nothing)?;
                self.stopped = true;
                self.marks |= STOPPED;
            }
            OpenDone => self.open_done()?,
            OpenRefused => {
                self.budget.open_fault -= 1;
                self.stream = Stream::None;
                self.fault = Some(self.now);
                let error = RpcError::Unavailable("model: connection refused".into());
                self.feed(RenewalsInput::OpenFailed { error }, Expect::Nothing)?;
            }
            OpenHang => {
                self.budget.open_fault -= 1;
                if let Stream::Opening { hung, .. } = &mut self.stream {
                    *hung = true;
                }
            }
            Write => self.write()?,
            Reply => self.reply()?,
            Silence => {
                self.budget.silence -= 1;
                if let Stream::Open { replies, silent } = &mut self.stream {
                    replies.clear();
                    *silent = true;
                }
            }
            End => {
                self.budget.breaks -= 1;
                self.broken(RenewalsInput::Ended)?;
            }
            Fail => {
                self.budget.breaks -= 1;
                let error = RpcError::Unavailable("model: connection reset".into());
                self.broken(RenewalsInput::Failed { error })?;
            }
            Close => {
                self.budget.breaks -= 1;
                self.broken(RenewalsInput::Closed)?;
            }
            Tick | Delay => {
                if *action == Delay {
                    self.budget.delay -= 1;
                }
                self.tick()?;
            }
        }
        if self.seen.no_answer && self.seen.suspects == 0 {
            return Err(
                "renewals answered for want of an answer without telling the monitor".into(),
            );
        }
        self.check()
    }

    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        hash_debug(&mut hasher, &self.etcd);
        hash_debug(&mut hasher, &(self.now - self.start));
        hash_debug(&mut hasher, &self.budget);
        hash_debug(&mut hasher, &self.machine);
        hash_debug(&mut hasher, &self.stream);
        hash_debug(&mut hasher, &self.generation);
        hash_debug(&mut hasher, &self.waiting);
        hash_debug(&mut hasher, &self.stopped);
        // Only while it can still hold an opening back (rule 12).
        let fault = self.fault.filter(|_| self.may_wait());
        hash_debug(&mut hasher, &fault.map(|f| f - self.start));
        hasher.finish()
    }

    fn check_liveness(&mut self) -> Result<(), String> {
        if self.in_flight() || self.stopped {
            return Ok(());
        }
        self.marks |= LIVENESS;
        let mut fair = self.clone();
        fair.budget = Budget::default();
        let from = fair.now;
        let until = from + self.setup.liveness_bound;
        let lease = match fair.etcd.execute(
            from,
            &Request::Grant {
                ttl_secs: self.setup.ttl_secs + 2,
            },
        ) {
            Ok(Response::Granted { lease, .. }) => lease,
            other => panic!("the model grants: {other:?}"),
        };
        let context = |m: String| {
            format!(
                "in the fair continuation from +{:?}: {m}",
                from - self.start
            )
        };
        let mut asked: Option<u64> = None;
        let mut renewed = false;
        loop {
            let ours = asked.filter(|t| !fair.waiting.contains_key(t));
            if let Some(token) = ours {
                // Answered: with a TTL (the reply check matched it), or
                // with an error, and then asked again.
                if fair.positive == Some(token) {
                    renewed = true;
                }
                asked = None;
            }
            if renewed && fair.waiting.is_empty() {
                return Ok(());
            }
            if asked.is_none() && !renewed {
                fair.seen = Seen::default();
                fair.renew(lease).map_err(context)?;
                asked = Some(fair.next_token);
                fair.check().map_err(context)?;
                continue;
            }
            fair.seen = Seen::default();
            let step = match fair.fair_next() {
                Some(step) => step,
                None => match fair.next_deadline().filter(|at| *at <= until) {
                    Some(_) => fair.tick(),
                    None => break,
                },
            };
            step.and_then(|()| fair.check()).map_err(context)?;
        }
        Err(format!(
            "liveness: from the quiescent state at +{:?}, after {:?} without faults, {} \
             renewals still wait and a live lease was{} renewed (stream {:?})",
            from - self.start,
            self.setup.liveness_bound,
            fair.waiting.len(),
            if renewed { "" } else { " not" },
            fair.stream
        ))
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn take_marks(&mut self) -> u32 {
        std::mem::take(&mut self.marks)
    }

    fn describe(&self) -> String {
        let mut out = format!("  at {}, stopped {}", self.at(self.now), self.stopped);
        for lease in self.etcd.leases() {
            let expiry = self.etcd.lease_deadline(lease).map(|t| self.at(t));
            out += &format!("\n    lease {lease:x} expires {expiry:?}");
        }
        out += &format!(
            "\n  stream (generation {}): {:?}",
            self.generation, self.stream
        );
        for (token, w) in &self.waiting {
            out += &format!(
                "\n  renewal {token}: lease {:x}, deadline {}, written on {:?}, forgotten {}",
                w.lease,
                self.at(w.deadline),
                w.written,
                w.forgotten
            );
        }
        out += &format!(
            "\n  machine: next deadline {:?}, {} waiting",
            self.machine.poll_timeout().map(|t| self.at(t)),
            self.machine.waiting()
        );
        out
    }
}
