//! The shard map against the model etcd: members (weights 1 to 3) join,
//! leave gracefully, crash (their lease left to expire) and are cut off
//! from etcd for longer than their TTL, and etcd pauses for up to 1.5 TTLs,
//! at random, under request failures, lost replies and requests that land
//! late (also those of crashed and departed members). Each member is the
//! production `Member` (`fleetcoord_sm::shard::member`, the machine the
//! facade runs): every other one on its own lease-only session, the rest
//! on a session their process keeps outside the member and tells it about
//! (`SessionInput`: `Trusted`, `Up`, `Lost`, ...), acting on the member's
//! `SessionRequest`s. Users hand released shards back after a random
//! drain, sometimes never (the map's deadline then releases them); a
//! member that leaves hands every owned shard back at once.
//!
//! Every member's clock drifts within the drift allowance of etcd's
//! ([`Drifting`]), half of them at the allowance, fast or slow.
//!
//! Checked after every step, in etcd's (the world's) time:
//! * per shard, at most one member believes it owns it (`token(shard)`):
//!   no two belief intervals overlap;
//! * a member that believes it owns a shard with token T sees etcd hold
//!   the shard key with create revision T (belief never outlives the key);
//! * per shard, every `Acquired` token is greater than every earlier one,
//!   or equal to the previous one for the same member (an ownership it
//!   took back after its trust lapsed on the same lease);
//! * `poll_timeout()` is never earlier than the instant just processed.
//!
//! After the chaos, with membership stable and no faults, every shard is
//! owned by the member placement names within `SETTLE_BOUND`, and no
//! ownership changes after that until the end of the run.
//!
//! The checker has teeth: `a_member_that_ignores_its_trust_deadline_is_caught`
//! runs members whose session owner trusts the session a whole second past
//! its local deadline (`Trusted` carries the deadline plus 1 s, `Lost`
//! comes 1 s late), so a cut-off owner keeps believing after etcd expired
//! its lease.

use fleetcoord_sm::election::SessionRequest;
use fleetcoord_sm::keepalive::{
    Keepalive, KeepaliveConfig, KeepaliveInput, KeepaliveNotice, LivenessState,
};
use fleetcoord_sm::session::SessionInput;
use fleetcoord_sm::shard::member::{Member, MemberInput, MemberNotice};
use fleetcoord_sm::shard::{keys, placement, ShardConfig, ShardNotice};
use fleetcoord_sm::{BackoffConfig, Command, LeaseId, Machine};
use fleetcoord_test_support::*;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

const SEEDS: u64 = 200;
const PREFIX: &[u8] = b"/coord/shards/jobs/";
const SHARDS: u32 = 32;
const TTL_SECS: i64 = 2;
const CHAOS: Duration = Duration::from_secs(30);
const QUIET: Duration = Duration::from_secs(20);
/// After membership settles: a crashed owner's lease (2 s TTL) expires,
/// a drain (1 s) ends, a cut-off member's session is granted again, plus
/// round trips and backoff delays (at most 800 ms).
const SETTLE_BOUND: Duration = Duration::from_secs(6);
const DRAIN: Duration = Duration::from_secs(1);
/// The members' drift allowance (2 %): every member's clock runs at a
/// seeded rate within it of etcd's (the world's), half of them at it.
const DRIFT_PPM: u64 = 20_000;

fn backoff() -> BackoffConfig {
    BackoffConfig {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(800),
        multiplier: 2,
        jitter_percent: 50,
    }
}

/// One process: the production shard member (`fleetcoord_sm::shard::member`),
/// on its own session lease, or on a session its process keeps outside it
/// (as a `Session` keeps one lease for several primitives), whose facts
/// the owner here tells it as `SessionInput`s and whose requests
/// (`SessionRequest`) it acts on.
#[derive(Clone, Debug)]
struct Process {
    member: Member,
    /// The session kept outside the member; `None` for an own session.
    owner: Option<Owner>,
    queue: VecDeque<Command<MemberNotice>>,
}

/// The keeper of a shared session, as a driver's session hub is: the
/// keepalive's states become facts for the member. Only this owner can be
/// made to over-trust (the checker's own test).
#[derive(Clone, Debug)]
struct Owner {
    session: Keepalive,
    stopped: bool,
    /// Extra trust the owner claims beyond the session's local deadline
    /// (0 but in the checker's own test): `Trusted` carries the deadline
    /// plus this, and `Lost` reaches the member this much late.
    overtrust: Duration,
    /// When a late `Lost` is due, and for which lease.
    lost_at: Option<(Instant, LeaseId)>,
}

fn session_config() -> KeepaliveConfig {
    KeepaliveConfig {
        ttl_secs: TTL_SECS,
        backoff: backoff(),
        safety_margin: Duration::from_millis(100),
        drift_allowance_ppm: DRIFT_PPM as u32,
        attempt_timeout: Duration::from_millis(400),
        announce_trust: true,
    }
}

impl Process {
    /// `shared`: on a session kept outside the member (always, when
    /// `overtrust` is not zero).
    fn new(
        id: &str,
        weight: u32,
        now: Instant,
        seed: u64,
        shared: bool,
        overtrust: Duration,
    ) -> Self {
        let map = ShardConfig {
            prefix: PREFIX.to_vec(),
            member: id.as_bytes().to_vec(),
            weight,
            shards: SHARDS,
            backoff: backoff(),
            attempt_timeout: Duration::from_millis(400),
            drain: DRAIN,
        };
        let shared = shared || !overtrust.is_zero();
        let (member, owner) = if shared {
            // The owner's ids below the member's, as on one driver.
            let session = Keepalive::with_first_rpc_id(session_config(), now, seed, 0);
            let owner = Owner {
                session,
                stopped: false,
                overtrust,
                lost_at: None,
            };
            (Member::on_session(map, now, seed), Some(owner))
        } else {
            (Member::new(session_config(), map, None, now, seed), None)
        };
        let mut p = Process {
            member,
            owner,
            queue: VecDeque::new(),
        };
        p.pump(now);
        p
    }

    /// Moves the owner's and the member's commands into the queue: the
    /// owner's keepalive states told to the member as facts, the member's
    /// session requests acted on; once the member is done, a shared
    /// session is stopped too (the process exits).
    fn pump(&mut self, now: Instant) {
        loop {
            let mut progressed = false;
            if let Some(owner) = &mut self.owner {
                while let Some(command) = owner.session.poll_command() {
                    progressed = true;
                    let fact = match command {
                        Command::Rpc { id, request } => {
                            self.queue.push_back(Command::Rpc { id, request });
                            None
                        }
                        Command::Cancel { id } => {
                            self.queue.push_back(Command::Cancel { id });
                            None
                        }
                        Command::Notify(KeepaliveNotice::Trusted { lease, until }) => {
                            Some(SessionInput::Trusted {
                                lease,
                                until: until + owner.overtrust,
                            })
                        }
                        Command::Notify(KeepaliveNotice::State(state)) => match state {
                            LivenessState::Registered { lease } => Some(SessionInput::Up { lease }),
                            LivenessState::Suspended { lease } => {
                                Some(SessionInput::Suspended { lease })
                            }
                            LivenessState::Lost { lease } if owner.overtrust.is_zero() => {
                                Some(SessionInput::Lost { lease })
                            }
                            LivenessState::Lost { lease } => {
                                owner.lost_at = Some((now + owner.overtrust, lease));
                                None
                            }
                            LivenessState::Refused { error } => Some(SessionInput::Refused(error)),
                            LivenessState::Stopped { .. } => Some(SessionInput::Closed),
                            // A lease-only session binds no key.
                            LivenessState::Registering
                            | LivenessState::Waiting { .. }
                            | LivenessState::Duplicate { .. } => None,
                        },
                        Command::Notify(_) => None,
                    };
                    if let Some(fact) = fact {
                        self.member.handle(now, MemberInput::Session(fact));
                    }
                }
            }
            while let Some(command) = self.member.poll_command() {
                progressed = true;
                match (&mut self.owner, command) {
                    (Some(owner), Command::Notify(MemberNotice::SessionRequest(request))) => {
                        let input = match request {
                            SessionRequest::Gone(lease) => KeepaliveInput::LeaseGone { lease },
                            SessionRequest::Replace(lease) => KeepaliveInput::Replace { lease },
                        };
                        owner.session.handle(now, input);
                    }
                    (_, command) => self.queue.push_back(command),
                }
            }
            if let Some(owner) = &mut self.owner {
                if self.member.is_finished() && !owner.stopped {
                    owner.stopped = true;
                    owner.session.handle(now, KeepaliveInput::Stop);
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
    }

    /// The map, to read what it believes.
    fn map(&self) -> &fleetcoord_sm::shard::ShardMap {
        self.member.map()
    }
}

impl Machine for Process {
    type Input = MemberInput;
    type Notice = MemberNotice;

    fn handle(&mut self, now: Instant, input: MemberInput) {
        match (&mut self.owner, input) {
            (Some(owner), MemberInput::Rpc(reply)) if owner.session.owns(reply.id) => {
                owner.session.handle(now, KeepaliveInput::Rpc(reply))
            }
            (_, input) => self.member.handle(now, input),
        }
        self.pump(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        if let Some(owner) = &mut self.owner {
            owner.session.handle_timeout(now);
            self.pump(now);
        }
        let late = self.owner.as_mut().and_then(|owner| {
            let (at, lease) = owner.lost_at?;
            (at <= now).then(|| {
                owner.lost_at = None;
                lease
            })
        });
        if let Some(lease) = late {
            self.member
                .handle(now, MemberInput::Session(SessionInput::Lost { lease }));
            self.pump(now);
        }
        self.member.handle_timeout(now);
        self.pump(now);
    }

    fn poll_command(&mut self) -> Option<Command<MemberNotice>> {
        self.queue.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let owner = self.owner.as_ref();
        next_time(&[
            owner.and_then(|o| o.session.poll_timeout()),
            owner.and_then(|o| o.lost_at.map(|(at, _)| at)),
            self.member.poll_timeout(),
        ])
    }

    fn stop_input() -> MemberInput {
        MemberInput::Leave
    }

    fn is_finished(&self) -> bool {
        self.member.is_finished()
            && self.owner.as_ref().is_none_or(|o| o.session.is_finished())
            && self.queue.is_empty()
    }
}

/// `Err` with a message saying what broke, unless `cond`.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

struct Seat {
    id: String,
    weight: u32,
    harness: Harness<Drifting<Process>>,
    faults: Faults,
    cut_off_until: Option<Instant>,
    leaving: bool,
    /// Shards whose `Release` the user answers at the instant given.
    releases: Vec<(Instant, u32)>,
}

#[derive(Default, Debug)]
struct Stats {
    acquired: u64,
    released: u64,
    lost: u64,
    joins: u64,
    leaves: u64,
    crashes: u64,
    cut_offs: u64,
    pauses: u64,
    late_landed: u64,
    settle: Duration,
}

struct World {
    etcd: ModelEtcd,
    seats: Vec<Seat>,
    rng: ChaCha8Rng,
    base: Faults,
    next_id: u64,
    overtrust: Duration,
    paused_until: Option<Instant>,
    /// Per shard, the greatest token acquired and who acquired it.
    tokens: BTreeMap<u32, (i64, String)>,
    /// The last instant any ownership changed (a notice was told).
    last_change: Option<Instant>,
    stats: Stats,
    seed: u64,
}

impl World {
    fn new(seed: u64, overtrust: Duration) -> (Self, Instant) {
        let t0 = Instant::now();
        let mut w = World {
            etcd: ModelEtcd::new(),
            seats: Vec::new(),
            rng: rng(seed),
            base: Faults::moderate(),
            next_id: 0,
            overtrust,
            paused_until: None,
            tokens: BTreeMap::new(),
            last_change: None,
            stats: Stats::default(),
            seed,
        };
        for _ in 0..3 {
            w.join(t0);
        }
        (w, t0)
    }

    fn join(&mut self, now: Instant) {
        self.next_id += 1;
        let id = format!("m{}", self.next_id);
        let seed = self.seed.wrapping_mul(1000).wrapping_add(self.next_id);
        // Weights 1 to 3: placement is weighted rendezvous hashing.
        let weight = 1 + u32::try_from(self.next_id % 3).unwrap_or(0);
        // Half the clocks drift at the allowance, fast or slow; the rest
        // anywhere within it.
        let magnitude = match pick(&mut self.rng, 4) {
            0 | 1 => DRIFT_PPM,
            _ => pick(&mut self.rng, DRIFT_PPM + 1),
        };
        let magnitude = i32::try_from(magnitude).unwrap_or(0);
        let ppm = if pick(&mut self.rng, 2) == 0 {
            -magnitude
        } else {
            magnitude
        };
        let overtrust = self.overtrust;
        // Every other member on a session kept outside it.
        let shared = self.next_id.is_multiple_of(2);
        let member = Drifting::new(DriftClock::new(now, ppm), now, |local| {
            Process::new(&id, weight, local, seed, shared, overtrust)
        });
        self.seats.push(Seat {
            id,
            weight,
            harness: Harness::new(member),
            faults: self.base.clone(),
            cut_off_until: None,
            leaving: false,
            releases: Vec::new(),
        });
        self.stats.joins += 1;
    }

    fn next_time(&self) -> Option<Instant> {
        let nodes = self
            .seats
            .iter()
            .flat_map(|s| {
                [
                    s.harness.next_event_time(),
                    s.releases.iter().map(|r| r.0).min(),
                ]
            })
            .flatten()
            .min();
        next_time(&[nodes, self.etcd.next_deadline()])
    }

    fn step(&mut self, now: Instant) -> Result<(), String> {
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
            // The users hand back what they finished draining.
            for s in &mut self.seats {
                let (due, later): (Vec<_>, Vec<_>) =
                    s.releases.iter().partition(|(at, _)| *at <= now);
                s.releases = later;
                for (_, shard) in due {
                    s.harness.machine.handle(now, MemberInput::Release(shard));
                }
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
            // Members that left for good are gone; their held-up requests
            // stay on the wire of one that is not.
            let mut i = 0;
            while i < self.seats.len() {
                if self.seats[i].harness.machine.is_finished() && self.seats.len() > 1 {
                    let mut gone = self.seats.remove(i);
                    let heir = &mut self.seats[0].harness;
                    gone.harness.pass_held_to(heir);
                    self.stats.late_landed += gone.harness.late_landed;
                } else {
                    i += 1;
                }
            }
            self.check(now)?;
            if self.next_time().is_none_or(|t| t > now) {
                return Ok(());
            }
        }
        Err(format!("seed {}: livelock at one instant", self.seed))
    }

    fn check(&mut self, now: Instant) -> Result<(), String> {
        let seed = self.seed;
        let mut believers: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for s in &mut self.seats {
            let context = format!("seed {seed}: member {} at {now:?}", s.id);
            if let Some(at) = s.harness.machine.poll_timeout() {
                ensure!(at >= now, "{context}: poll_timeout {at:?} before now");
            }
            for (_, n) in s.harness.drain_notifications() {
                let MemberNotice::Shard(n) = n else {
                    // The session's facts as the member tells them.
                    continue;
                };
                self.last_change = Some(now);
                match n {
                    ShardNotice::Acquired { shard, token } => {
                        self.stats.acquired += 1;
                        if let Some((max, by)) = self.tokens.get(&shard) {
                            ensure!(
                                token > *max || (token == *max && *by == s.id),
                                "{context}: shard {shard} acquired with token {token} \
                                 after {max} of {by}"
                            );
                        }
                        self.tokens.insert(shard, (token, s.id.clone()));
                    }
                    ShardNotice::Release { shard, deadline } => {
                        self.stats.released += 1;
                        // Drained within the deadline, or after it (the
                        // map then released it itself), or never.
                        let roll = pick(&mut self.rng, 10);
                        if roll < 9 {
                            let span = deadline.saturating_duration_since(now);
                            let nanos = u64::try_from(span.as_nanos()).unwrap_or(u64::MAX);
                            let at = now
                                + Duration::from_nanos(pick(
                                    &mut self.rng,
                                    nanos.max(1) + nanos / 4,
                                ));
                            s.releases.push((at, shard));
                        }
                    }
                    ShardNotice::Lost { .. } => self.stats.lost += 1,
                    // Every member has an id of its own; a restarted one
                    // waits for its predecessor's key, never a duplicate.
                    ShardNotice::Waiting { .. } => {}
                    ShardNotice::Duplicate { holder } => {
                        panic!(
                            "member {:?} refused as a duplicate of lease {holder:x}",
                            s.id
                        )
                    }
                }
            }
            let map = s.harness.machine.machine.map();
            for (shard, token) in map.owned() {
                believers.entry(shard).or_default().push(s.id.clone());
                let kv = self.etcd.get(&keys::shard_key(PREFIX, shard));
                ensure!(
                    kv.as_ref().map(|kv| kv.create_revision) == Some(token),
                    "{context}: believes it owns shard {shard} with token {token}, \
                     but etcd has {kv:?}"
                );
            }
        }
        for (shard, who) in believers {
            ensure!(
                who.len() <= 1,
                "seed {seed}: shard {shard} believed owned by {who:?} at {now:?}"
            );
        }
        Ok(())
    }

    fn random_action(&mut self, now: Instant) {
        let roll = pick(&mut self.rng, 100);
        let live: Vec<usize> = (0..self.seats.len())
            .filter(|i| !self.seats[*i].leaving)
            .collect();
        match roll {
            0..=24 if self.seats.len() < 8 => self.join(now),
            25..=39 if live.len() > 1 => {
                let i = live[pick(&mut self.rng, live.len() as u64) as usize];
                self.seats[i].leaving = true;
                self.seats[i]
                    .harness
                    .machine
                    .handle(now, MemberInput::Leave);
                self.stats.leaves += 1;
            }
            40..=49 if live.len() > 1 => {
                // A crash: the process is gone, its lease left to expire.
                let i = live[pick(&mut self.rng, live.len() as u64) as usize];
                let mut gone = self.seats.remove(i);
                let heir = &mut self.seats[0].harness;
                gone.harness.pass_held_to(heir);
                self.stats.late_landed += gone.harness.late_landed;
                self.stats.crashes += 1;
            }
            50..=59 => {
                // Cut off for longer than the TTL, streams broken.
                let i = pick(&mut self.rng, self.seats.len() as u64) as usize;
                let s = &mut self.seats[i];
                s.faults = Faults {
                    fail_request: 1.0,
                    ..Faults::none()
                };
                s.cut_off_until = Some(now + Duration::from_millis(2500));
                s.harness.drop_streams(now);
                self.stats.cut_offs += 1;
            }
            60..=63 if self.paused_until.is_none() => {
                // etcd stops (SIGSTOP) for up to 1.5 TTLs: every session
                // may be lost; leases whose deadline passed expire on resume.
                self.etcd.pause();
                self.paused_until =
                    Some(now + Duration::from_millis(500 + pick(&mut self.rng, 2500)));
                self.stats.pauses += 1;
            }
            _ => {}
        }
    }

    fn heal(&mut self, now: Instant, quiet: bool) {
        if self.paused_until.is_some_and(|t| t <= now || quiet) {
            self.paused_until = None;
            self.etcd.resume(now);
        }
        for s in &mut self.seats {
            if s.cut_off_until.is_some_and(|t| t <= now) || (quiet && s.cut_off_until.is_some()) {
                s.cut_off_until = None;
                s.faults = self.base.clone();
            }
            if quiet {
                s.faults = Faults::none();
            }
        }
    }

    /// Placement over the members that stay, as every member computes it.
    fn placed(&self, shard: u32) -> Option<String> {
        let members: Vec<(&[u8], u32)> = self
            .seats
            .iter()
            .filter(|s| !s.leaving)
            .map(|s| (s.id.as_bytes(), s.weight))
            .collect();
        placement::owner(members, shard).map(|m| String::from_utf8_lossy(m).into_owned())
    }
}

fn run(seed: u64, overtrust: Duration) -> Result<Stats, String> {
    let (mut w, t0) = World::new(seed, overtrust);
    let chaos_end = t0 + CHAOS;
    let mut next_action = t0 + Duration::from_millis(500);
    let mut now = t0;
    while now < chaos_end {
        let t = next_time(&[w.next_time(), Some(next_action), w.paused_until])
            .unwrap_or(next_action)
            .min(chaos_end);
        now = now.max(t);
        if now >= next_action {
            w.heal(now, false);
            w.random_action(now);
            next_action = now + Duration::from_millis(200 + pick(&mut w.rng, 800));
        }
        w.heal(now, false);
        w.step(now)?;
    }
    // Quiet: no faults, no membership changes; let leavers finish.
    w.heal(now, true);
    let end = chaos_end + QUIET;
    while let Some(t) = w.next_time().filter(|t| *t <= end) {
        now = now.max(t);
        w.step(now)?;
    }
    let settled = w.last_change.unwrap_or(chaos_end);
    let settle = settled.saturating_duration_since(chaos_end);
    ensure!(
        settle <= SETTLE_BOUND,
        "seed {seed}: ownership still changed {settle:?} after the chaos ended"
    );
    for shard in 0..SHARDS {
        let placed = w.placed(shard);
        let owners: Vec<&str> = w
            .seats
            .iter()
            .filter(|s| s.harness.machine.machine.map().token(shard).is_some())
            .map(|s| s.id.as_str())
            .collect();
        ensure!(
            owners.len() == 1 && placed.as_deref() == Some(owners[0]),
            "seed {seed}: shard {shard} owned by {owners:?}, placed on {placed:?}"
        );
    }
    w.stats.settle = settle;
    for s in &w.seats {
        w.stats.late_landed += s.harness.late_landed;
    }
    Ok(w.stats)
}

#[test]
fn shards_are_never_owned_twice_and_settle_on_their_placement() {
    let mut total = Stats::default();
    for seed in 0..SEEDS {
        let stats = run(seed, Duration::ZERO).unwrap_or_else(|e| panic!("{e}"));
        total.acquired += stats.acquired;
        total.released += stats.released;
        total.lost += stats.lost;
        total.joins += stats.joins;
        total.leaves += stats.leaves;
        total.crashes += stats.crashes;
        total.cut_offs += stats.cut_offs;
        total.pauses += stats.pauses;
        total.late_landed += stats.late_landed;
        total.settle = total.settle.max(stats.settle);
    }
    // Every kind of event happened, so the checks above saw them.
    assert!(
        total.acquired > 0 && total.released > 0 && total.lost > 0,
        "{total:?}"
    );
    assert!(
        total.crashes > 0 && total.cut_offs > 0 && total.pauses > 0 && total.late_landed > 0,
        "{total:?}"
    );
    eprintln!("shard sim over {SEEDS} seeds: {total:?}");
}

#[test]
fn a_member_that_ignores_its_trust_deadline_is_caught() {
    let caught = (0..SEEDS).find_map(|seed| run(seed, Duration::from_secs(1)).err());
    let e = caught.expect("trusting past the deadline must be caught");
    eprintln!("caught: {e}");
    assert!(
        e.contains("believes it owns") || e.contains("believed owned by"),
        "{e}"
    );
}
