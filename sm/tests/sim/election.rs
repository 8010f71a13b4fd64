//! The election machine against the model etcd: two or three candidates
//! share one etcd, each in its own harness, under random user schedules and
//! faults (failed requests, lost replies, one-candidate partitions with
//! dropped streams, etcd pauses longer than the TTL, lease extensions,
//! stop-and-replace of a candidate).
//!
//! Checked after every step:
//! * at most one candidate has `is_leader()`;
//! * every `Elected` token is strictly greater than every earlier one;
//! * a leader's `session_deadline()` is not later than the model's expiry of
//!   its lease, and its key exists in the model with the token as create
//!   revision;
//! * `Elected` only answers an open campaign (never after `SessionLost`
//!   without a new campaign);
//! * `poll_timeout()` is never earlier than the instant just processed.
//!
//! After the faults stop and every live candidate campaigns, one of them is
//! elected within a quiet period.

use fleetcoord_sm::election::{Election, ElectionConfig, ElectionInput, ElectionNotice};
use fleetcoord_sm::{BackoffConfig, Machine};
use fleetcoord_test_support::*;
use std::time::{Duration, Instant};

const SEEDS: u64 = 1_000;
const PREFIX: &[u8] = b"/coord/election/db/";
const TTL_SECS: i64 = 2;
const CHAOS: Duration = Duration::from_secs(30);
const QUIET: Duration = Duration::from_secs(20);

fn config() -> ElectionConfig {
    ElectionConfig {
        prefix: PREFIX.to_vec(),
        ttl_secs: TTL_SECS,
        backoff: BackoffConfig {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(800),
            multiplier: 2,
            jitter_percent: 50,
        },
    }
}

/// One seat at the table: the current candidate in it and what the
/// checker knows about it.
struct Seat {
    harness: Harness<Election>,
    faults: Faults,
    partitioned_until: Option<Instant>,
    /// Campaign requests not yet answered (Busy answers one at once).
    open_campaigns: u32,
    /// The token of this candidate's latest `Elected`, which its user
    /// would resign with (possibly long after it was lost: a stale handle).
    last_token: i64,
    stopping: bool,
    generation: u64,
}

impl Seat {
    fn new(now: Instant, seed: u64) -> Self {
        Seat {
            harness: Harness::new(Election::new(config(), now, seed)),
            faults: Faults::none(),
            partitioned_until: None,
            open_campaigns: 0,
            last_token: 0,
            stopping: false,
            generation: 0,
        }
    }
}

#[derive(Default)]
struct Stats {
    steps: u64,
    faults: u64,
    elections: u64,
    campaigns: u64,
}

struct World {
    etcd: ModelEtcd,
    seats: Vec<Seat>,
    rng: ChaCha8Rng,
    base: Faults,
    paused_until: Option<Instant>,
    max_token: i64,
    stats: Stats,
    seed: u64,
}

fn partitioned() -> Faults {
    Faults {
        fail_request: 1.0,
        lose_reply: 0.0,
        latency: (Duration::from_millis(1), Duration::from_millis(5)),
    }
}

impl World {
    fn next_time(&self) -> Option<Instant> {
        let nodes = self
            .seats
            .iter()
            .filter_map(|s| s.harness.next_event_time())
            .min();
        next_time(&[nodes, self.etcd.next_deadline()])
    }

    /// `fleetcoord_test_support::step` with a fault profile per candidate, so one of them can
    /// be cut off while the others talk to etcd.
    fn step(&mut self, now: Instant) {
        for _ in 0..10_000 {
            self.etcd.advance(now);
            for s in &mut self.seats {
                s.harness
                    .fire_timeout(&mut self.etcd, now, &mut self.rng, &s.faults);
            }
            for s in &mut self.seats {
                s.harness
                    .deliver_due(&mut self.etcd, now, &mut self.rng, &s.faults);
            }
            loop {
                let before = self.etcd.revision();
                for s in &mut self.seats {
                    s.harness
                        .pump(&mut self.etcd, now, &mut self.rng, &s.faults);
                }
                if self.etcd.revision() == before {
                    break;
                }
            }
            if self.next_time().is_none_or(|t| t > now) {
                self.stats.steps += 1;
                self.check(now);
                return;
            }
        }
        panic!("seed {}: livelock at one instant", self.seed);
    }

    fn check(&mut self, now: Instant) {
        let seed = self.seed;
        let mut leaders = 0;
        for (i, s) in self.seats.iter_mut().enumerate() {
            let m = &s.harness.machine;
            if let Some(at) = m.poll_timeout() {
                assert!(
                    at >= now,
                    "seed {seed}: seat {i} poll_timeout {at:?} before now {now:?}"
                );
            }
            for (_, n) in s.harness.drain_notifications() {
                match n {
                    ElectionNotice::Elected { token, .. } => {
                        assert!(
                            s.open_campaigns > 0,
                            "seed {seed}: seat {i} elected without an open campaign"
                        );
                        assert!(
                            token > self.max_token,
                            "seed {seed}: token {token} after {}",
                            self.max_token
                        );
                        self.max_token = token;
                        s.last_token = token;
                        s.open_campaigns -= 1;
                        self.stats.elections += 1;
                    }
                    ElectionNotice::NotElected { .. } | ElectionNotice::CampaignFailed(_) => {
                        assert!(
                            s.open_campaigns > 0,
                            "seed {seed}: seat {i} answer without a campaign"
                        );
                        s.open_campaigns -= 1;
                    }
                    _ => {}
                }
            }
            let m = &s.harness.machine;
            if m.is_leader() {
                leaders += 1;
                let token = m.token().expect("a leader has a token");
                let deadline = m.session_deadline().expect("a leader has a session");
                let key = m.my_key().expect("a leader has a key");
                let lease = self.etcd.get(&key).map(|kv| kv.lease);
                let model_deadline = lease.and_then(|l| self.etcd.lease_deadline(l));
                assert!(
                    model_deadline.is_some_and(|d| deadline <= d),
                    "seed {seed}: seat {i} leads with deadline {deadline:?}, model {model_deadline:?}"
                );
                let kv = self.etcd.get(&key);
                assert_eq!(
                    kv.map(|kv| kv.create_revision),
                    Some(token),
                    "seed {seed}: seat {i} key"
                );
            }
        }
        assert!(leaders <= 1, "seed {seed}: {leaders} leaders at {now:?}");
    }

    fn input(&mut self, seat: usize, input: ElectionInput, now: Instant) {
        let s = &mut self.seats[seat];
        if s.stopping {
            return;
        }
        match &input {
            ElectionInput::Campaign { .. } | ElectionInput::TryCampaign { .. } => {
                s.open_campaigns += 1;
                self.stats.campaigns += 1;
            }
            ElectionInput::Stop => s.stopping = true,
            _ => {}
        }
        s.harness.machine.handle(now, input);
    }

    fn random_action(&mut self, now: Instant, chaos: bool) {
        let seat = (self.rng.next_u64() % self.seats.len() as u64) as usize;
        let value = format!("v{}", self.rng.next_u64() % 100).into_bytes();
        let roll = self.rng.next_u64() % 100;
        match roll {
            0..=29 => self.input(seat, ElectionInput::Campaign { value }, now),
            30..=41 => self.input(seat, ElectionInput::TryCampaign { value }, now),
            42..=51 => {
                // Mostly the latest leadership's token; sometimes an older
                // one, as a stale handle's drop would send.
                let latest = self.seats[seat].last_token;
                let token = if roll.is_multiple_of(3) {
                    latest.saturating_sub(1)
                } else {
                    latest
                };
                self.input(seat, ElectionInput::Resign { token }, now)
            }
            52..=61 => self.input(seat, ElectionInput::Proclaim { value }, now),
            62..=67 => self.input(seat, ElectionInput::CancelCampaign, now),
            68..=69 => self.input(seat, ElectionInput::Stop, now),
            _ if !chaos => {}
            70..=77 => {
                // A partition of one candidate: its requests fail and its streams break.
                let s = &mut self.seats[seat];
                let len = Duration::from_millis(200 + self.rng.next_u64() % 5_000);
                s.partitioned_until = Some(now + len);
                s.faults = partitioned();
                s.harness.drop_streams(now);
                self.stats.faults += 1;
            }
            78..=81 if self.paused_until.is_none() => {
                // Longer than the TTL half the time.
                let len = Duration::from_millis(500 + self.rng.next_u64() % 4_000);
                self.etcd.pause();
                self.paused_until = Some(now + len);
                self.stats.faults += 1;
            }
            82..=85 => {
                self.etcd.extend_all_leases(now);
                self.stats.faults += 1;
            }
            86..=89 => {
                self.seats[seat].harness.lose_all_inflight();
                self.stats.faults += 1;
            }
            90..=93 => {
                self.seats[seat].harness.drop_streams(now);
                self.stats.faults += 1;
            }
            _ => {}
        }
    }

    /// Ends partitions and pauses that are due, and replaces stopped candidates.
    fn housekeeping(&mut self, now: Instant) {
        if self.paused_until.is_some_and(|t| t <= now) {
            self.paused_until = None;
            self.etcd.resume(now);
        }
        for s in &mut self.seats {
            if s.partitioned_until.is_some_and(|t| t <= now) {
                s.partitioned_until = None;
                s.faults = self.base.clone();
            }
        }
        for s in &mut self.seats {
            let stopped = s.stopping
                && s.harness.machine.poll_timeout().is_none()
                && s.harness.in_flight() == 0;
            if stopped {
                assert!(!s.harness.machine.is_leader());
                s.generation += 1;
                let seed = self
                    .seed
                    .wrapping_mul(31)
                    .wrapping_add(s.generation.wrapping_mul(1_000_003));
                let faults = s.faults.clone();
                *s = Seat {
                    generation: s.generation,
                    faults,
                    ..Seat::new(now, seed)
                };
            }
        }
    }

    fn run_until(
        &mut self,
        mut now: Instant,
        until: Instant,
        chaos: bool,
        mut next_action: Instant,
    ) -> Instant {
        loop {
            let mut t = next_time(&[self.next_time(), Some(next_action), self.paused_until]);
            for s in &self.seats {
                t = next_time(&[t, s.partitioned_until]);
            }
            let Some(t) = t.filter(|t| *t <= until) else {
                return now.max(until);
            };
            now = now.max(t);
            self.housekeeping(now);
            if next_action <= now {
                self.random_action(now, chaos);
                next_action = now + Duration::from_millis(10 + self.rng.next_u64() % 1_500);
            }
            self.step(now);
        }
    }
}

fn run_seed(seed: u64, stats: &mut Stats) {
    let t0 = Instant::now();
    let mut rng = rng(seed);
    let candidates = 2 + (rng.next_u64() % 2) as usize;
    let base = if rng.next_u64().is_multiple_of(5) {
        Faults::none()
    } else {
        Faults::moderate()
    };
    let mut seats: Vec<Seat> = (0..candidates)
        .map(|i| Seat::new(t0, seed * 10 + i as u64))
        .collect();
    for s in &mut seats {
        s.faults = base.clone();
    }
    let mut world = World {
        etcd: ModelEtcd::new(),
        seats,
        rng,
        base,
        paused_until: None,
        max_token: 0,
        stats: Stats::default(),
        seed,
    };
    world.step(t0);
    let now = world.run_until(t0, t0 + CHAOS, true, t0);

    // Quiet: faults end, every live candidate campaigns, someone must win.
    world.paused_until = world.paused_until.map(|_| now);
    for s in &mut world.seats {
        s.partitioned_until = s.partitioned_until.map(|_| now);
    }
    world.housekeeping(now);
    world.step(now);
    let settle = now + Duration::from_secs(5);
    let now = world.run_until(now, settle, false, settle + QUIET);
    for i in 0..world.seats.len() {
        let idle =
            world.seats[i].open_campaigns == 0 && !world.seats[i].harness.machine.is_leader();
        if idle {
            world.input(
                i,
                ElectionInput::Campaign {
                    value: b"final".to_vec(),
                },
                now,
            );
        }
    }
    world.step(now);
    let end = world.run_until(now, now + QUIET, false, now + QUIET + QUIET);
    let leaders: Vec<usize> = (0..world.seats.len())
        .filter(|&i| world.seats[i].harness.machine.is_leader())
        .collect();
    if leaders.len() != 1 {
        let keys: Vec<(String, i64, i64)> = world
            .etcd
            .range_prefix(PREFIX)
            .into_iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key).into_owned(),
                    kv.create_revision,
                    kv.lease,
                )
            })
            .collect();
        let seats: Vec<String> = world
            .seats
            .iter()
            .map(|s| format!("open={} {:?}", s.open_campaigns, s.harness.machine))
            .collect();
        panic!("seed {seed}: {} leaders after the quiet period ending {end:?}; keys {keys:?}; seats {seats:#?}", leaders.len());
    }

    stats.steps += world.stats.steps;
    stats.faults += world.stats.faults
        + world
            .seats
            .iter()
            .map(|s| s.harness.faults_injected)
            .sum::<u64>();
    stats.elections += world.stats.elections;
    stats.campaigns += world.stats.campaigns;
}

#[test]
fn at_most_one_leader_with_increasing_tokens_over_many_seeds() {
    let mut stats = Stats::default();
    for seed in 0..SEEDS {
        run_seed(seed, &mut stats);
    }
    println!(
        "election sim: {SEEDS} seeds, {} steps, {} faults injected, {} campaigns, {} elections",
        stats.steps, stats.faults, stats.campaigns, stats.elections
    );
    assert!(
        stats.elections > SEEDS,
        "too few elections to mean anything"
    );
}
