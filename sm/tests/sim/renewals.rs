//! The renewals machine against the model etcd's leases, over many seeds.
//!
//! The harness drives one machine per lease, with renewals as plain
//! requests; the renewals machine instead keeps one stream for many leases,
//! so this world plays that stream itself. Each seed renews a few leases
//! (one etcd never had) at random instants, forgets some and then revokes
//! them at the model (as a driver does before a revoke), and lets each
//! stream open, fail to open, hang while opening, fill up, go silent, end,
//! fail or close for writes at random; then renewals stop and the world
//! runs until nothing waits. Checked on every step:
//!
//! * (a) every renewal is answered exactly once, at or before its deadline
//!   (taken + the request timeout), and by the end every one is answered;
//! * (b) no renewal of a forgotten lease is written after the forget;
//! * (c) a TTL answer is the model's: on a reply, the TTL the model gave
//!   that write, for the oldest waiting renewal of the replied lease
//!   (replies come in order); on an opening refused for a missing first
//!   lease, TTL 0 for the renewals of that lease, which the model did not
//!   have;
//! * (d) at most one stream at a time: `Open` only when none is open or
//!   being opened, `Drop` only of one that is, writes only on an open one.

use fleetcoord_sm::renewals::{Renewals, RenewalsCommand, RenewalsInput};
use fleetcoord_sm::{LeaseId, Request, Response, RpcError};
use fleetcoord_test_support::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

const SEEDS: u64 = 500;
const TIMEOUT: Duration = Duration::from_millis(500);
/// How long renewals are asked for; then the world runs until quiet.
const BUSY: Duration = Duration::from_secs(20);
/// A lease the model never granted.
const MISSING: LeaseId = 1;

/// The stream as the wire sees it.
enum Wire {
    None,
    /// Being opened on `lease`; done at an instant with a result, or never.
    Opening {
        lease: LeaseId,
        done: Option<(Instant, Result<(), RpcError>)>,
    },
    Open(OpenStream),
}

struct OpenStream {
    /// Replies on their way, in order: due instant, lease, the model's TTL.
    replies: VecDeque<(Instant, LeaseId, i64)>,
    /// From this instant on, writes reach etcd but no reply comes back.
    silent_from: Option<Instant>,
    /// When and how the stream breaks, if it does.
    breaks: Option<(Instant, RenewalsInput<u64>)>,
    /// How many more requests the stream takes now; refilled a
    /// millisecond after it ran out.
    room: usize,
    refill: Option<Instant>,
}

/// What the input being fed makes a TTL answer (check c).
#[derive(Clone, Copy)]
enum Expect {
    /// No TTL answer may come of it.
    Nothing,
    /// A renewal of this lease, answered this TTL.
    Ttl(LeaseId, i64),
}

#[derive(Default, Debug)]
struct Stats {
    positive: u64,
    zero: u64,
    errors: u64,
    suspects: u64,
    forgotten_unsent: u64,
    writes: u64,
}

struct World {
    rng: ChaCha8Rng,
    etcd: ModelEtcd,
    faults: Faults,
    machine: Renewals<u64>,
    wire: Wire,
    now: Instant,
    /// Renewals not yet answered: token → (lease, deadline).
    waiting: BTreeMap<u64, (LeaseId, Instant)>,
    forgotten: BTreeSet<LeaseId>,
    stats: Stats,
}

/// The TTL the model's renewal of `lease` at `now` gives (0: no such lease).
fn renew_at_model(etcd: &mut ModelEtcd, now: Instant, lease: LeaseId) -> i64 {
    match etcd.execute(now, &Request::KeepAlive { lease }) {
        Ok(Response::KeptAlive { ttl_secs }) => ttl_secs,
        other => panic!("the model renews: {other:?}"),
    }
}

impl World {
    /// Feeds `input` at `now`, timers due by then first, as a driver must.
    fn handle(&mut self, input: RenewalsInput<u64>, expect: Expect) {
        if self.machine.poll_timeout().is_some_and(|at| at <= self.now) {
            self.fire_timeout();
        }
        self.machine.handle(self.now, input);
        self.execute(expect);
    }

    fn fire_timeout(&mut self) {
        self.machine.handle_timeout(self.now);
        self.execute(Expect::Nothing);
    }

    /// Carries out the machine's commands, checking (a), (c) and (d), then
    /// writes what it hands out.
    fn execute(&mut self, expect: Expect) {
        while let Some(command) = self.machine.poll_command() {
            match command {
                RenewalsCommand::Open { lease } => {
                    assert!(matches!(self.wire, Wire::None), "(d) a second stream");
                    let done = (!chance(&mut self.rng, 0.05)).then(|| {
                        let at = self.now + self.faults.sample_latency(&mut self.rng);
                        let result = if chance(&mut self.rng, 0.1) {
                            Err(RpcError::Unavailable("connection refused".into()))
                        } else {
                            Ok(())
                        };
                        (at, result)
                    });
                    self.wire = Wire::Opening { lease, done };
                }
                RenewalsCommand::Drop => {
                    assert!(!matches!(self.wire, Wire::None), "(d) no stream to drop");
                    self.wire = Wire::None;
                }
                RenewalsCommand::Suspect => self.stats.suspects += 1,
                RenewalsCommand::Answer { token, ttl } => self.answered(token, ttl, expect),
            }
        }
        self.write();
    }

    fn answered(&mut self, token: u64, ttl: Result<i64, RpcError>, expect: Expect) {
        if let (Ok(_), Expect::Ttl(lease, _)) = (&ttl, expect) {
            // Replies come in order, so the oldest renewal of the lease
            // still waiting is the one replied to: those older were written
            // earlier or failed, those unsent are newer.
            let oldest = self.waiting.iter().find(|(_, w)| w.0 == lease);
            assert_eq!(oldest.map(|(t, _)| *t), Some(token), "(c) out of order");
        }
        let (lease, deadline) = self
            .waiting
            .remove(&token)
            .unwrap_or_else(|| panic!("(a) renewal {token} answered twice or never asked"));
        assert!(
            self.now <= deadline,
            "(a) renewal {token} answered after its deadline"
        );
        match ttl {
            Ok(ttl) => {
                let Expect::Ttl(replied, model) = expect else {
                    panic!("(c) renewal {token} answered a TTL nobody replied");
                };
                assert_eq!((lease, ttl), (replied, model), "(c) renewal {token}");
                if ttl > 0 {
                    self.stats.positive += 1;
                } else {
                    self.stats.zero += 1;
                }
            }
            Err(e) => {
                if e == RpcError::Unavailable("the lease is being revoked".into()) {
                    self.stats.forgotten_unsent += 1;
                }
                self.stats.errors += 1;
            }
        }
    }

    /// Writes what the machine hands out while the stream has room, each
    /// run at the model as it is written (check b).
    fn write(&mut self) {
        let Wire::Open(stream) = &mut self.wire else {
            assert_eq!(
                self.machine.poll_write(),
                None,
                "(d) a write with no stream"
            );
            return;
        };
        while stream.room > 0 {
            let Some(lease) = self.machine.poll_write() else {
                break;
            };
            stream.room -= 1;
            self.stats.writes += 1;
            assert!(
                !self.forgotten.contains(&lease),
                "(b) lease {lease} written after its forget"
            );
            let ttl = renew_at_model(&mut self.etcd, self.now, lease);
            if stream.silent_from.is_some_and(|t| t <= self.now) {
                continue;
            }
            let sent = self.now + self.faults.sample_latency(&mut self.rng);
            let due = stream.replies.back().map_or(sent, |r| r.0.max(sent));
            stream.replies.push_back((due, lease, ttl));
        }
        if stream.room == 0 && self.machine.wants_to_write() && stream.refill.is_none() {
            stream.refill = Some(self.now + ms(1));
        }
    }

    /// The next instant anything on the wire happens.
    fn wire_next(&self) -> Option<Instant> {
        match &self.wire {
            Wire::None => None,
            Wire::Opening { done, .. } => done.as_ref().map(|d| d.0),
            Wire::Open(s) => next_time(&[
                s.replies.front().map(|r| r.0),
                s.breaks.as_ref().map(|b| b.0),
                s.refill,
            ]),
        }
    }

    /// One thing due on the wire at `now`, if any: the opening's end, the
    /// stream's break, a reply, or room for more writes. Returns whether
    /// something happened.
    fn wire_step(&mut self) -> bool {
        let now = self.now;
        match &mut self.wire {
            Wire::None => false,
            Wire::Opening { lease, done } => {
                let first = *lease;
                let Some((_, result)) = done.take_if(|d| d.0 <= now) else {
                    return false;
                };
                match result {
                    // etcd-client's own first request, run at the model.
                    Ok(()) => match renew_at_model(&mut self.etcd, now, first) {
                        0 => {
                            self.wire = Wire::None;
                            let error = RpcError::LeaseNotFound;
                            self.handle(RenewalsInput::OpenFailed { error }, Expect::Ttl(first, 0));
                        }
                        _ => {
                            self.wire = Wire::Open(self.draw_stream());
                            self.handle(RenewalsInput::Opened, Expect::Nothing);
                        }
                    },
                    Err(error) => {
                        self.wire = Wire::None;
                        self.handle(RenewalsInput::OpenFailed { error }, Expect::Nothing);
                    }
                }
                true
            }
            Wire::Open(stream) => {
                if let Some((_, input)) = stream.breaks.take_if(|b| b.0 <= now) {
                    self.handle(input, Expect::Nothing);
                } else if let Some((_, lease, ttl_secs)) = stream
                    .replies
                    .front()
                    .is_some_and(|r| r.0 <= now)
                    .then(|| stream.replies.pop_front())
                    .flatten()
                {
                    self.handle(
                        RenewalsInput::Reply { lease, ttl_secs },
                        Expect::Ttl(lease, ttl_secs),
                    );
                } else if stream.refill.take_if(|at| *at <= now).is_some() {
                    stream.room = 1 + pick(&mut self.rng, 3) as usize;
                    self.write();
                } else {
                    return false;
                }
                true
            }
        }
    }

    fn draw_stream(&mut self) -> OpenStream {
        let now = self.now;
        let rng = &mut self.rng;
        let later = |rng: &mut ChaCha8Rng| now + ms(pick(rng, 3_000));
        let silent_from = chance(rng, 0.1).then(|| later(rng));
        let breaks = match pick(rng, 10) {
            0 => Some((later(rng), RenewalsInput::Ended)),
            1 => Some((
                later(rng),
                RenewalsInput::Failed {
                    error: RpcError::Unavailable("connection reset".into()),
                },
            )),
            2 => Some((later(rng), RenewalsInput::Closed)),
            _ => None,
        };
        OpenStream {
            replies: VecDeque::new(),
            silent_from,
            breaks,
            room: 1 + pick(rng, 3) as usize,
            refill: None,
        }
    }
}

/// One seed's run; its statistics.
fn run(seed: u64) -> Stats {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let mut rng = rng(seed);
    let mut leases = vec![MISSING];
    for _ in 0..6 {
        let ttl_secs = 2 + pick(&mut rng, 10) as i64;
        match etcd.execute(t0, &Request::Grant { ttl_secs }) {
            Ok(Response::Granted { lease, .. }) => leases.push(lease),
            other => panic!("the model grants: {other:?}"),
        }
    }
    let mut world = World {
        rng,
        etcd,
        faults: Faults::moderate(),
        machine: Renewals::new(TIMEOUT, t0),
        wire: Wire::None,
        now: t0,
        waiting: BTreeMap::new(),
        forgotten: BTreeSet::new(),
        stats: Stats::default(),
    };
    let mut next_token = 0;
    let mut next_ask = Some(t0);
    let mut steps = 0;
    loop {
        steps += 1;
        assert!(steps < 1_000_000, "seed {seed}: livelock");
        let Some(now) = next_time(&[
            next_ask,
            world.wire_next(),
            world.machine.poll_timeout(),
            world.etcd.next_deadline(),
        ]) else {
            break;
        };
        assert!(now >= world.now, "seed {seed}: time went back");
        world.now = now;
        world.etcd.advance(now);
        if world.machine.poll_timeout().is_some_and(|at| at <= now) {
            world.fire_timeout();
        }
        while world.wire_step() {}
        if next_ask.is_some_and(|at| at <= now) {
            // Renewals due together come together (a renewal grid), more
            // than a stream may have room for.
            let mut renewed = Vec::new();
            for _ in 0..1 + pick(&mut world.rng, 4) {
                let live: Vec<LeaseId> = leases
                    .iter()
                    .copied()
                    .filter(|l| !world.forgotten.contains(l))
                    .collect();
                let at = pick(&mut world.rng, live.len() as u64) as usize;
                let Some(&lease) = live.get(at) else {
                    unreachable!("the missing lease is never forgotten");
                };
                next_token += 1;
                world.waiting.insert(next_token, (lease, now + TIMEOUT));
                let token = next_token;
                world.handle(RenewalsInput::Renew { lease, token }, Expect::Nothing);
                renewed.push(lease);
            }
            // Now and then a revoke of one of them, at once: forget
            // first, then the model drops the lease.
            let lease = renewed[pick(&mut world.rng, renewed.len() as u64) as usize];
            if lease != MISSING && chance(&mut world.rng, 0.02) {
                world.forgotten.insert(lease);
                world.handle(RenewalsInput::Forget { lease }, Expect::Nothing);
                world.etcd.expire_lease(lease);
            }
            let gap = ms(1 + pick(&mut world.rng, 300));
            next_ask = Some(now + gap).filter(|at| *at < t0 + BUSY);
        }
    }
    assert!(
        world.waiting.is_empty(),
        "seed {seed}: (a) renewals never answered: {:?}",
        world.waiting
    );
    assert_eq!(world.machine.waiting(), 0, "seed {seed}");
    world.stats
}

#[test]
fn every_renewal_is_answered_once_in_time_with_the_models_ttl() {
    let mut total = Stats::default();
    for seed in 0..SEEDS {
        let s = run(seed);
        total.positive += s.positive;
        total.zero += s.zero;
        total.errors += s.errors;
        total.suspects += s.suspects;
        total.forgotten_unsent += s.forgotten_unsent;
        total.writes += s.writes;
    }
    // Every path was taken, so the checks above were exercised.
    assert!(total.positive > 0, "{total:?}");
    assert!(total.zero > 0, "{total:?}");
    assert!(total.errors > 0, "{total:?}");
    assert!(total.suspects > 0, "{total:?}");
    assert!(total.forgotten_unsent > 0, "{total:?}");
    println!("{total:?}");
}
