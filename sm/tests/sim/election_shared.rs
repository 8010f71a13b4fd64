//! Elections on one shared session against the model etcd: process A runs
//! a lease-only `Keepalive` and, on its lease (`Election::on_session`), two
//! elections and a semaphore of two permits, composed as the facade
//! composes them: the keepalive's notices go to the production
//! `SessionHub`, whose commands are executed in order (its facts told to
//! the machines, its `EndBeliefs` ending what A's users believe, its
//! keepalive inputs fed to the keepalive), and the machines'
//! `SessionRequest`s go to the hub. What A's users believe is kept as the
//! facade keeps it: a `SessionBelief` per machine and the leadership each
//! last reported (`Elected`'s deadline, moved by `Trusted`). Contenders
//! on their own sessions campaign on the same three names: one per
//! election, two on the semaphore. Once A holds everything, it is cut off
//! from etcd at a seeded instant (all its requests fail, its streams
//! break), under seeded latency and, before the cut, moderate faults.
//!
//! Checked after every step, in etcd's (the world's) time:
//! * per name, no more believe they hold than it has permits;
//! * no machine of A believes it holds once etcd no longer holds its key
//!   with its token (the lease expired), and A's deadline read on etcd's
//!   clock is at least the safety margin before etcd's expiry of the lease;
//!   the same for what A's users believe;
//! * when a contender is elected, no machine of A believes it holds
//!   anything: the session's loss ends every leadership on it before
//!   anyone else can win, not one name at a time.
//!
//! After the cut every contender holds within the TTL plus a few round
//! trips. The checker has teeth: `a_machine_deaf_to_its_session_is_caught`
//! runs the same world with one machine of A never told `Lost` and told a
//! deadline a whole TTL late, and sees it caught.

use fleetcoord_sm::election::{
    Election, ElectionConfig, ElectionInput, ElectionNotice, OpId, SessionInput,
};
use fleetcoord_sm::keepalive::{Keepalive, KeepaliveConfig, KeepaliveInput, KeepaliveNotice};
use fleetcoord_sm::session::{HubCommand, MemberId, SessionBelief, SessionHub};
use fleetcoord_sm::{BackoffConfig, Command, Machine, RpcReply};
use fleetcoord_test_support::*;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

const SEEDS: u64 = 200;
const TTL_SECS: i64 = 2;
const SAFETY_MARGIN: Duration = Duration::from_millis(100);
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(400);
/// The names of A's machines, and how many permits each has.
const NAMES: [(&[u8], u32); 3] = [(b"/e/a/", 1), (b"/e/b/", 1), (b"/e/s/", 2)];

fn backoff() -> BackoffConfig {
    BackoffConfig {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(800),
        multiplier: 2,
        jitter_percent: 50,
    }
}

fn config(prefix: &[u8], permits: u32) -> ElectionConfig {
    ElectionConfig {
        prefix: prefix.to_vec(),
        ttl_secs: TTL_SECS,
        backoff: backoff(),
        safety_margin: SAFETY_MARGIN,
        drift_allowance_ppm: 0,
        attempt_timeout: ATTEMPT_TIMEOUT,
        announce_session_trust: true,
        permits,
        rw: None,
    }
}

/// What A's user of one machine believes, as the facade keeps it: the
/// leadership last reported (token, lease, deadline, handed out over).
#[derive(Clone, Debug, Default)]
struct UserBelief {
    session: SessionBelief,
    held: Option<(i64, i64, Instant, bool)>,
}

impl UserBelief {
    /// The token believed held at `now`, and its lease.
    fn holds(&self, now: Instant) -> Option<(i64, i64)> {
        self.held
            .filter(|(_, _, until, over)| !over && now < *until)
            .map(|(token, lease, _, _)| (token, lease))
    }
}

/// Process A: one session, a machine per name on it.
#[derive(Clone, Debug)]
struct Process {
    session: Keepalive,
    hub: SessionHub,
    /// Each machine's place on the hub, in `machines` order.
    members: Vec<MemberId>,
    users: Vec<UserBelief>,
    machines: Vec<Election>,
    queue: VecDeque<Command<(usize, ElectionNotice)>>,
    /// The machine (if any) whose driver is broken in the checker's own
    /// test: it never hears `Lost` and is told every deadline a TTL late.
    deaf: Option<usize>,
}

#[derive(Clone, Debug)]
enum ProcessInput {
    Rpc(RpcReply),
    Campaign(usize, OpId),
}

impl From<RpcReply> for ProcessInput {
    fn from(reply: RpcReply) -> Self {
        ProcessInput::Rpc(reply)
    }
}

impl Process {
    fn new(now: Instant, seed: u64, deaf: Option<usize>) -> Self {
        let session = Keepalive::with_first_rpc_id(
            KeepaliveConfig {
                ttl_secs: TTL_SECS,
                backoff: backoff(),
                safety_margin: SAFETY_MARGIN,
                drift_allowance_ppm: 0,
                attempt_timeout: ATTEMPT_TIMEOUT,
                announce_trust: true,
            },
            now,
            seed,
            0,
        );
        let mut hub = SessionHub::new();
        let members = NAMES
            .iter()
            .map(|(prefix, _)| {
                hub.attach(&String::from_utf8_lossy(prefix))
                    .expect("one prefix each")
            })
            .collect();
        let machines = NAMES
            .iter()
            .enumerate()
            .map(|(i, (prefix, permits))| {
                let first = (i as u64 + 1) << 44;
                Election::on_session(config(prefix, *permits), now, seed ^ i as u64, first)
            })
            .collect();
        let mut p = Process {
            session,
            hub,
            members,
            users: vec![UserBelief::default(); NAMES.len()],
            machines,
            queue: VecDeque::new(),
            deaf,
        };
        p.pump(now);
        p
    }

    /// Tells machine `i` `input`, bent for the deaf machine.
    fn tell(&mut self, now: Instant, i: usize, input: SessionInput) {
        let input = match (&input, self.deaf == Some(i)) {
            (SessionInput::Lost { .. } | SessionInput::Suspended { .. }, true) => return,
            (SessionInput::Trusted { lease, until }, true) => SessionInput::Trusted {
                lease: *lease,
                until: *until + Duration::from_secs(TTL_SECS as u64),
            },
            (input, _) => input.clone(),
        };
        self.machines[i].handle(now, ElectionInput::Session(input));
    }

    /// Executes the hub's commands, as the facade does.
    fn run_hub(&mut self, now: Instant) {
        while let Some(command) = self.hub.poll_command() {
            match command {
                HubCommand::EndBeliefs {
                    member,
                    lease,
                    for_good,
                } => {
                    if let Some(i) = self.members.iter().position(|m| *m == member) {
                        self.users[i].session.end(lease, for_good);
                        self.users[i].held = None;
                    }
                }
                HubCommand::Tell { member, fact } => {
                    if let Some(i) = self.members.iter().position(|m| *m == member) {
                        self.tell(now, i, fact);
                    }
                }
                HubCommand::Keepalive(input) => self.session.handle(now, input),
                HubCommand::State(_) | HubCommand::Detached(_) => {}
            }
        }
    }

    /// What the facade's election handler does with machine `i`'s notice.
    fn user(&mut self, i: usize, notice: &ElectionNotice) {
        let user = &mut self.users[i];
        match notice {
            ElectionNotice::Elected {
                token,
                lease,
                trusted_until,
                ..
            } => {
                let over = !user.session.admits(*lease);
                user.held = Some((*token, *lease, *trusted_until, over));
            }
            ElectionNotice::Trusted { token, until } => {
                if let Some(held) = user.held.as_mut().filter(|h| h.0 == *token) {
                    held.2 = *until;
                }
            }
            ElectionNotice::LeadershipLost { token } | ElectionNotice::Resigned { token }
                if user.held.is_some_and(|h| h.0 == *token) =>
            {
                user.held = None;
            }
            _ => {}
        }
    }

    /// Moves every part's commands into the queue, the session's notices
    /// through the hub to the machines and their requests through the hub
    /// to the session.
    fn pump(&mut self, now: Instant) {
        loop {
            let mut progressed = false;
            while let Some(command) = self.session.poll_command() {
                progressed = true;
                match command {
                    Command::Rpc { id, request } => {
                        self.queue.push_back(Command::Rpc { id, request })
                    }
                    Command::Cancel { id } => self.queue.push_back(Command::Cancel { id }),
                    Command::Notify(
                        notice @ (KeepaliveNotice::Trusted { .. } | KeepaliveNotice::State(_)),
                    ) => {
                        self.hub.keepalive(notice);
                        self.run_hub(now);
                    }
                    Command::Notify(_) => {}
                }
            }
            for i in 0..self.machines.len() {
                while let Some(command) = self.machines[i].poll_command() {
                    progressed = true;
                    match command {
                        Command::Rpc { id, request } => {
                            self.queue.push_back(Command::Rpc { id, request })
                        }
                        Command::Cancel { id } => self.queue.push_back(Command::Cancel { id }),
                        Command::Notify(ElectionNotice::SessionRequest(request)) => {
                            self.hub.request(request);
                            self.run_hub(now);
                        }
                        Command::Notify(n) => {
                            self.user(i, &n);
                            self.queue.push_back(Command::Notify((i, n)))
                        }
                    }
                }
            }
            if !progressed {
                break;
            }
        }
    }
}

impl Machine for Process {
    type Input = ProcessInput;
    type Notice = (usize, ElectionNotice);

    fn handle(&mut self, now: Instant, input: ProcessInput) {
        match input {
            ProcessInput::Rpc(reply) if self.session.owns(reply.id) => {
                self.session.handle(now, KeepaliveInput::Rpc(reply))
            }
            ProcessInput::Rpc(reply) => {
                let i = (reply.id.0 >> 44).saturating_sub(1) as usize;
                if let Some(m) = self.machines.get_mut(i) {
                    m.handle(now, ElectionInput::Rpc(reply));
                }
            }
            ProcessInput::Campaign(i, op) => {
                let value = b"a".to_vec();
                self.machines[i].handle(now, ElectionInput::Campaign { op, value });
            }
        }
        self.pump(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.session.handle_timeout(now);
        self.pump(now);
        for m in &mut self.machines {
            m.handle_timeout(now);
        }
        self.pump(now);
    }

    fn poll_command(&mut self) -> Option<Command<(usize, ElectionNotice)>> {
        self.queue.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let machines = self.machines.iter().filter_map(|m| m.poll_timeout()).min();
        next_time(&[self.session.poll_timeout(), machines])
    }

    fn stop_input() -> ProcessInput {
        unreachable!("the simulation never stops process A")
    }

    fn is_finished(&self) -> bool {
        false
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

struct World {
    etcd: ModelEtcd,
    a: Harness<Process>,
    a_faults: Faults,
    /// Contenders: (name index, own-session machine).
    others: Vec<(usize, Harness<Election>)>,
    others_faults: Faults,
    rng: ChaCha8Rng,
    seed: u64,
    /// Contenders elected so far.
    elected: usize,
    /// A was cut off: from then on, a contender elected while any machine
    /// of A believes is a violation (before, one of the semaphore's
    /// contenders takes its second permit beside A).
    cut: bool,
    cut_at: Option<Instant>,
}

impl World {
    fn new(seed: u64, deaf: Option<usize>) -> (World, Instant) {
        let now = Instant::now();
        let a = Harness::new(Process::new(now, seed, deaf));
        let mut others = Vec::new();
        for (i, (prefix, permits)) in NAMES.iter().enumerate() {
            for k in 0..*permits {
                let s = seed
                    .wrapping_mul(31)
                    .wrapping_add(i as u64 * 7 + u64::from(k));
                others.push((
                    i,
                    Harness::new(Election::new(config(prefix, *permits), now, s)),
                ));
            }
        }
        let mut rng = rng(seed);
        let latency = Duration::from_millis(1 + rng.next_u64() % 20);
        let quiet = Faults {
            latency: (Duration::from_millis(1), latency),
            ..Faults::none()
        };
        let world = World {
            etcd: ModelEtcd::new(),
            a,
            a_faults: Faults {
                late_by: (ms(50), ms(300)),
                ..Faults::moderate()
            },
            others,
            others_faults: quiet,
            rng,
            seed,
            elected: 0,
            cut: false,
            cut_at: None,
        };
        (world, now)
    }

    fn next_time(&self) -> Option<Instant> {
        let others = self
            .others
            .iter()
            .filter_map(|(_, h)| h.next_event_time())
            .min();
        next_time(&[self.a.next_event_time(), others, self.etcd.next_deadline()])
    }

    fn step(&mut self, now: Instant) -> Result<(), String> {
        for _ in 0..10_000 {
            self.etcd.advance(now);
            self.a
                .fire_timeout(&mut self.etcd, now, &mut self.rng, &self.a_faults);
            for (_, h) in &mut self.others {
                h.fire_timeout(&mut self.etcd, now, &mut self.rng, &self.others_faults);
            }
            self.a
                .deliver_due(&mut self.etcd, now, &mut self.rng, &self.a_faults);
            for (_, h) in &mut self.others {
                h.deliver_due(&mut self.etcd, now, &mut self.rng, &self.others_faults);
            }
            loop {
                let before = self.etcd.revision();
                self.a
                    .pump(&mut self.etcd, now, &mut self.rng, &self.a_faults);
                for (_, h) in &mut self.others {
                    h.pump(&mut self.etcd, now, &mut self.rng, &self.others_faults);
                }
                if self.etcd.revision() == before {
                    break;
                }
            }
            if self.next_time().is_none_or(|t| t > now) {
                return self.check(now);
            }
        }
        panic!("seed {}: livelock at one instant", self.seed);
    }

    fn check(&mut self, now: Instant) -> Result<(), String> {
        let seed = self.seed;
        let mut holders = [0u32; NAMES.len()];
        let mut a_holds = Vec::new();
        for (i, m) in self.a.machine.machines.iter().enumerate() {
            if let Some(at) = m.poll_timeout() {
                ensure!(
                    at >= now,
                    "seed {seed}: A's machine {i} timeout {at:?} before now"
                );
            }
            if let Some((token, lease)) = self.a.machine.users[i].holds(now) {
                let key = [NAMES[i].0, format!("{lease:x}").as_bytes()].concat();
                let kv = self.etcd.get(&key);
                ensure!(
                    kv.as_ref()
                        .is_some_and(|kv| kv.create_revision == token && kv.lease == lease),
                    "seed {seed}: A's user of machine {i} believes it holds {token} on lease \
                     {lease:x} at {now:?}, but etcd has {kv:?}"
                );
            }
            let Some(token) = m.token() else { continue };
            holders[i] += 1;
            a_holds.push(i);
            let key = m.my_key().expect("a holder has a key");
            let kv = self.etcd.get(&key);
            ensure!(
                kv.as_ref().map(|kv| kv.create_revision) == Some(token),
                "seed {seed}: A's machine {i} believes it holds {token} at {now:?}, \
                 but etcd has {kv:?}"
            );
            let deadline = m.session_deadline().expect("a holder has a deadline");
            let expiry = kv.and_then(|kv| self.etcd.lease_deadline(kv.lease));
            ensure!(
                expiry.is_some_and(|e| deadline + SAFETY_MARGIN <= e),
                "seed {seed}: A's machine {i} trusts until {deadline:?}, less than the \
                 margin before etcd's expiry {expiry:?}"
            );
        }
        for (i, h) in &mut self.others {
            for (_, n) in h.drain_notifications() {
                if let ElectionNotice::Elected { .. } = n {
                    self.elected += 1;
                    ensure!(
                        !self.cut || a_holds.is_empty(),
                        "seed {seed}: a contender on {} was elected at {now:?} while A's \
                         machines {a_holds:?} still believe they hold (cut {:?})",
                        String::from_utf8_lossy(NAMES[*i].0),
                        self.cut_at
                    );
                }
            }
            if h.machine.is_leader() {
                holders[*i] += 1;
            }
        }
        for (i, (prefix, permits)) in NAMES.iter().enumerate() {
            ensure!(
                holders[i] <= *permits,
                "seed {seed}: {} holders of {} at {now:?}",
                holders[i],
                String::from_utf8_lossy(prefix)
            );
        }
        Ok(())
    }

    fn run_until(&mut self, until: Instant) -> Result<(), String> {
        while let Some(t) = self.next_time() {
            if t > until {
                break;
            }
            self.step(t)?;
        }
        Ok(())
    }
}

/// One run; `Err` says what the checker caught.
fn run(seed: u64, deaf: Option<usize>) -> Result<(), String> {
    let (mut w, t0) = World::new(seed, deaf);
    let mut op = 0;
    for i in 0..NAMES.len() {
        op += 1;
        w.a.machine.handle(t0, ProcessInput::Campaign(i, OpId(op)));
    }
    w.step(t0)?;
    let held_by = t0 + Duration::from_secs(3);
    w.run_until(held_by)?;
    let a_holds =
        w.a.machine
            .machines
            .iter()
            .filter(|m| m.is_leader())
            .count();
    ensure!(
        a_holds == NAMES.len(),
        "seed {seed}: A holds {a_holds} of {} names after 3 s",
        NAMES.len()
    );
    // Contenders queue up behind A (on the semaphore, one of the two gets
    // A's second permit at once).
    let start = held_by + ms(1);
    w.run_until(start)?;
    for (_, h) in &mut w.others {
        op += 1;
        h.machine.handle(
            start,
            ElectionInput::Campaign {
                op: OpId(op),
                value: b"c".to_vec(),
            },
        );
    }
    w.step(start)?;
    let cut = start + ms(200 + w.rng.next_u64() % 1_500);
    w.run_until(cut)?;
    w.a_faults = Faults {
        fail_request: 1.0,
        latency: (ms(1), ms(5)),
        ..Faults::none()
    };
    w.a.drop_streams(cut);
    w.cut = true;
    w.cut_at = Some(cut);
    let end = cut + Duration::from_secs(TTL_SECS as u64) + Duration::from_secs(3);
    w.run_until(end)?;
    ensure!(
        w.elected == w.others.len(),
        "seed {seed}: {} of {} contenders elected",
        w.elected,
        w.others.len()
    );
    let waiting = w
        .others
        .iter()
        .filter(|(_, h)| !h.machine.is_leader())
        .count();
    ensure!(
        waiting == 0,
        "seed {seed}: {waiting} contenders still wait a TTL + 3 s after the cut"
    );
    ensure!(
        w.a.machine.machines.iter().all(|m| !m.is_leader()),
        "seed {seed}: A still believes after its lease expired"
    );
    Ok(())
}

#[test]
fn a_lost_session_ends_every_leadership_on_it_before_anyone_else_wins() {
    for seed in 0..SEEDS {
        if let Err(e) = run(seed, None) {
            panic!("{e}");
        }
    }
}

#[test]
fn a_machine_deaf_to_its_session_is_caught() {
    let caught = (0..20).filter(|&seed| run(seed, Some(0)).is_err()).count();
    assert!(
        caught > 0,
        "a machine trusting a TTL past its deadline went unnoticed"
    );
}
