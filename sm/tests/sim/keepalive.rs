//! The keepalive machine against the model etcd, over many seeds.
//!
//! Each seed runs a random schedule of healthy periods, failed requests,
//! lost replies (in both, some grants, puts and revokes land at etcd up to
//! 3 s after the machine was told they failed), dropped renewal streams,
//! etcd pauses longer than the TTL, lease extensions (leader changes) and
//! value changes, then a quiet period, then `Stop`. Invariants checked after every step:
//!
//! * (a) while the machine holds a lease it believes in (`lease()` is
//!   `Some`), the model still has that lease and the local deadline is at
//!   least the (seeded) safety margin before the model's expiry; in host
//!   mode the key exists, bound to that lease;
//! * (b) in a run without faults the lease is never lost and, once
//!   registered, the key never disappears;
//! * (c) no KeepAlive, Grant or Put is emitted after Stop or after the
//!   stop's Revoke, and a lease the machine still holds is revoked only
//!   after Stop, once; leases it gave up may be revoked at any time
//!   (checked on every command by [`Spy`]);
//! * (d) `poll_timeout` is never earlier than the last `now` ([`Spy`]);
//! * (e) after the faults stop, the machine ends Registered with the key
//!   present in the model, holding the latest value; and Stop revokes.

use fleetcoord_sm::host::{Host, HostConfig, HostInput, HostNotice};
use fleetcoord_sm::keepalive::{
    Keepalive, KeepaliveConfig, KeepaliveInput, KeepaliveNotice, LivenessState,
};
use fleetcoord_sm::registration::RegistrationPoint;
use fleetcoord_sm::{BackoffConfig, Command, KeyRange, LeaseId, Machine, Request, Txn, TxnOp};
use fleetcoord_test_support::*;
use std::time::{Duration, Instant};

const SEEDS: u64 = 1_000;
const KEY: &[u8] = b"/coord/hosts/0f0e0d0c-0b0a-0908-0706-050403020100";
const MARKER: &[u8] = b"/coord/hosts/0f0e0d0c-0b0a-0908-0706-050403020100/left";

/// Whether `txn` writes the leave marker.
fn puts_marker(txn: &Txn) -> bool {
    txn.success
        .iter()
        .any(|op| matches!(op, TxnOp::Put { key, .. } if key.as_slice() == MARKER))
}

/// The machine under test: a lease-only keepalive, or in host mode a
/// host registration on its own lease (`sm/src/host.rs`), as
/// `HostLiveness` runs it. Both are spoken to in the host's words, the
/// keepalive's a subset of them.
enum Subject {
    Lease(Box<Keepalive>),
    Host(Box<Host>),
}

impl Subject {
    fn handle(&mut self, now: Instant, input: HostInput) {
        match self {
            Subject::Lease(k) => {
                let input = match input {
                    HostInput::Rpc(r) => KeepaliveInput::Rpc(r),
                    HostInput::Stop => KeepaliveInput::Stop,
                    HostInput::Detach => KeepaliveInput::Detach,
                    // A lease-only keepalive keeps no value.
                    HostInput::SetValue(_) => return,
                };
                k.handle(now, input)
            }
            Subject::Host(h) => h.handle(now, input),
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        match self {
            Subject::Lease(k) => k.handle_timeout(now),
            Subject::Host(h) => h.handle_timeout(now),
        }
    }

    fn poll_command(&mut self) -> Option<Command<HostNotice>> {
        match self {
            Subject::Lease(k) => Some(match k.poll_command()? {
                Command::Rpc { id, request } => Command::Rpc { id, request },
                Command::Cancel { id } => Command::Cancel { id },
                Command::Notify(n) => Command::Notify(match n {
                    KeepaliveNotice::State(s) => HostNotice::State(s),
                    KeepaliveNotice::Trusted { lease, until } => {
                        HostNotice::Trusted { lease, until }
                    }
                    KeepaliveNotice::GrantFailed { error } => HostNotice::GrantFailed { error },
                    KeepaliveNotice::Detached(p) => HostNotice::Detached(RegistrationPoint {
                        lease: p.lease,
                        mod_revision: 0,
                        create_revision: 0,
                    }),
                }),
            }),
            Subject::Host(h) => h.poll_command(),
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Subject::Lease(k) => k.poll_timeout(),
            Subject::Host(h) => h.poll_timeout(),
        }
    }

    fn is_finished(&self) -> bool {
        match self {
            Subject::Lease(k) => k.is_finished(),
            Subject::Host(h) => h.is_finished(),
        }
    }

    /// The lease registered (a host's: once its key is written).
    fn lease(&self) -> Option<LeaseId> {
        match self {
            Subject::Lease(k) => k.lease(),
            Subject::Host(h) => h.lease(),
        }
    }

    /// The lease the keepalive holds, key written or not.
    fn held(&self) -> Option<LeaseId> {
        match self {
            Subject::Lease(k) => k.lease(),
            Subject::Host(h) => h.keepalive().lease(),
        }
    }

    fn local_deadline(&self) -> Option<Instant> {
        match self {
            Subject::Lease(k) => k.local_deadline(),
            Subject::Host(h) => h.local_deadline(),
        }
    }

    fn state(&self) -> &LivenessState {
        match self {
            Subject::Lease(k) => k.state(),
            Subject::Host(h) => h.state(),
        }
    }
}

/// Wraps the machine and checks (c) and (d) on every command and deadline.
struct Spy {
    machine: Subject,
    /// The lease the keepalive held after the last input.
    held: Option<LeaseId>,
    stop_requested: bool,
    revoke_sent: bool,
    /// The leave transaction went out (after Stop, before the revoke).
    marker_sent: bool,
    /// A leave went out: the marker's, or a host's delete of its key.
    leave_sent: bool,
    /// `Left` was told (once, after the leave, before the revoke).
    left_told: bool,
    /// Leases notified `Lost`: revoking them is retiring, allowed any time.
    given_up: Vec<fleetcoord_sm::LeaseId>,
    last_now: Option<Instant>,
    /// Whether the machine was asked to tell the deadline's moves.
    announce_trust: bool,
    /// How many times it did.
    trusted_told: u64,
}

impl Spy {
    /// A lease the keepalive held and holds no more was given up (a host
    /// tells `Lost` only of a lease its key was written on).
    fn note_held(&mut self) {
        let held = self.machine.held();
        if let Some(old) = self.held.filter(|old| held != Some(*old)) {
            self.given_up.push(old);
        }
        self.held = held;
    }
}

impl Machine for Spy {
    type Input = HostInput;
    type Notice = HostNotice;

    fn stop_input() -> HostInput {
        HostInput::Stop
    }

    fn is_finished(&self) -> bool {
        self.machine.is_finished()
    }

    fn handle(&mut self, now: Instant, input: HostInput) {
        self.stop_requested |= input == HostInput::Stop;
        self.last_now = Some(now);
        self.machine.handle(now, input);
        self.note_held();
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.last_now = Some(now);
        self.machine.handle_timeout(now);
        self.note_held();
    }

    fn poll_command(&mut self) -> Option<Command<HostNotice>> {
        let command = self.machine.poll_command()?;
        if let Command::Notify(HostNotice::Trusted { lease, until }) = &command {
            assert!(self.announce_trust, "(e) trust told unasked");
            assert_eq!(
                self.machine.local_deadline(),
                Some(*until),
                "(e) told a deadline that is not the machine's"
            );
            // Before its key is written a lease is held but not yet
            // registered (`lease()` is `None` until then).
            assert!(
                self.machine.lease().is_none_or(|held| held == *lease),
                "(e) trusted a lease it does not hold"
            );
            assert!(
                self.last_now.is_some_and(|now| *until > now),
                "(e) told a deadline already past"
            );
            self.trusted_told += 1;
        }
        if let Command::Notify(HostNotice::Left { .. }) = &command {
            assert!(self.leave_sent, "Left told without a leave sent");
            assert!(!self.revoke_sent, "Left told after the revoke");
            assert!(!self.left_told, "Left told twice");
            self.left_told = true;
        }
        if let Command::Notify(HostNotice::State(LivenessState::Lost { lease })) = &command {
            self.given_up.push(*lease);
        }
        if let Command::Rpc { request, .. } = &command {
            match request {
                // Retiring a lease given up (revoked as it is given up, or
                // one last time at stop): never the one it holds.
                Request::Revoke { lease }
                    if (!self.stop_requested && self.machine.held() != Some(*lease))
                        || self.given_up.contains(lease) => {}
                // A host keeps its lease alive while its leave is out
                // (`sm/src/host.rs`, rule 4), never after the revoke.
                Request::KeepAlive { .. }
                    if matches!(self.machine, Subject::Host(_)) && !self.revoke_sent => {}
                // The leave: the marker put and the key deleted in one
                // transaction, after Stop, before the revoke (again only
                // when a write of its own moved the key meanwhile).
                Request::Txn(txn) if puts_marker(txn) => {
                    assert!(self.stop_requested, "leave without stop");
                    assert!(!self.revoke_sent, "leave after the revoke");
                    assert!(
                        txn.success
                            .contains(&TxnOp::Delete(KeyRange::Key(KEY.to_vec()))),
                        "a leave that does not delete the key"
                    );
                    self.marker_sent = true;
                    self.leave_sent = true;
                }
                // A host without a leave marker still deletes its key
                // when it stops (sm/src/registration.rs, rule 3): after
                // Stop, before the revoke.
                Request::Txn(txn)
                    if txn
                        .success
                        .contains(&TxnOp::Delete(KeyRange::Key(KEY.to_vec()))) =>
                {
                    assert!(self.stop_requested, "delete without stop");
                    assert!(!self.revoke_sent, "delete after the revoke");
                    self.leave_sent = true;
                }
                Request::Put { key, .. } if key.as_slice() == MARKER => {
                    panic!("leave marker put outside the leave transaction")
                }
                Request::Revoke { .. } => {
                    assert!(self.stop_requested, "revoke without stop");
                    assert!(!self.revoke_sent, "second revoke");
                    self.revoke_sent = true;
                }
                other => assert!(
                    !self.stop_requested && !self.revoke_sent,
                    "(c) {other:?} after stop/revoke"
                ),
            }
        }
        Some(command)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let at = self.machine.poll_timeout();
        if let (Some(at), Some(now)) = (at, self.last_now) {
            assert!(at >= now, "(d) poll_timeout {at:?} before now {now:?}");
        }
        at
    }
}

/// What one schedule entry does at its start.
#[derive(Clone, Copy, Debug)]
enum Phase {
    Healthy,
    FailingRequests,
    LosingReplies,
    DropStreams,
    PauseLongerThanTtl,
    ExtendLeases,
    LoseInflight,
    SetValue,
}

struct World {
    etcd: ModelEtcd,
    h: Harness<Spy>,
    rng: ChaCha8Rng,
    /// The configured safety margin (a seeded choice, zero included).
    margin: Duration,
    faults: Faults,
    now: Instant,
    host_mode: bool,
    /// The run injects no faults at all: (b) applies.
    clean: bool,
    /// The key was seen registered at least once (for (b)).
    registered_once: bool,
    steps: u64,
    events_injected: u64,
}

impl World {
    fn check(&mut self) {
        let m = &self.h.machine.machine;
        if let Some(lease) = m.lease() {
            let local = m.local_deadline().expect("a lease has a deadline");
            let server = self.etcd.lease_deadline(lease);
            assert!(
                server.is_some(),
                "(a) machine holds lease {lease:x} the model expired"
            );
            assert!(
                server.is_some_and(|server| local + self.margin <= server),
                "(a) local deadline {local:?} not {:?} before the model's {server:?}",
                self.margin
            );
            if self.host_mode {
                let kv = self.etcd.get(KEY);
                assert_eq!(
                    kv.map(|kv| kv.lease),
                    Some(lease),
                    "(a) key not bound to the lease"
                );
            }
            self.registered_once = true;
        }
        if self.clean && !self.h.machine.stop_requested {
            for (_, n) in &self.h.notifications {
                assert!(
                    !matches!(n, HostNotice::State(LivenessState::Lost { .. })),
                    "(b) healthy run lost its lease"
                );
                assert!(
                    !matches!(n, HostNotice::State(LivenessState::Suspended { .. })),
                    "(b) healthy run suspended"
                );
            }
            if self.registered_once && self.host_mode {
                assert!(
                    self.etcd.get(KEY).is_some(),
                    "(b) key vanished in a healthy run"
                );
            }
        }
    }

    /// Steps through every event up to `until`, checking after each step.
    fn run_until(&mut self, until: Instant) {
        while let Some(t) = next_due(&self.etcd, &mut self.h, until) {
            let t = t.max(self.now);
            step(
                &mut self.etcd,
                &mut [&mut self.h],
                t,
                &mut self.rng,
                &self.faults,
            );
            self.now = t;
            self.steps += 1;
            self.check();
        }
        self.now = self.now.max(until);
    }

    fn pump(&mut self) {
        self.h
            .pump(&mut self.etcd, self.now, &mut self.rng, &self.faults);
        self.check();
    }
}

struct Totals {
    steps: u64,
    faults: u64,
    /// Requests that landed at etcd after the machine gave up on them.
    late_landed: u64,
    losses: u64,
    clean_runs: u64,
    trusted_told: u64,
}

fn run_seed(seed: u64, totals: &mut Totals) {
    let mut rng = rng(seed);
    let ttl = 2 + pick(&mut rng, 9) as i64;
    let host_mode = pick(&mut rng, 4) != 0;
    let clean = seed.is_multiple_of(10);
    let mut value = b"boot".to_vec();
    let config = KeepaliveConfig {
        ttl_secs: ttl,
        backoff: BackoffConfig::default(),
        // From the seed, not the schedule's RNG, so each seed's schedule
        // stays what it was before margins existed.
        safety_margin: [Duration::ZERO, ms(100), ms(500)][(seed % 3) as usize],
        drift_allowance_ppm: [0, 1_000, 10_000][(seed / 3 % 3) as usize],
        // Every other seed resends unanswered grants, puts and revokes.
        attempt_timeout: [Duration::ZERO, ms(400)][(seed / 9 % 2) as usize],
        // Every other seed tells the deadline's moves (checked in `Spy`).
        announce_trust: seed / 18 % 2 == 1,
    };
    let margin = config.safety_margin;
    let t0 = Instant::now();
    let announce_trust = config.announce_trust;
    let machine = if host_mode {
        Subject::Host(Box::new(Host::new(
            HostConfig {
                lease: config,
                key: KEY.to_vec(),
                value: value.clone(),
                // Every other seed announces its leave.
                leave_marker: seed.is_multiple_of(2).then(|| MARKER.to_vec()),
                companion: None,
                take_over: false,
                backoff: BackoffConfig::default(),
            },
            t0,
            seed,
        )))
    } else {
        Subject::Lease(Box::new(Keepalive::new(config, t0, seed)))
    };
    let spy = Spy {
        machine,
        held: None,
        stop_requested: false,
        revoke_sent: false,
        marker_sent: false,
        leave_sent: false,
        left_told: false,
        given_up: Vec::new(),
        last_now: Some(t0),
        announce_trust,
        trusted_told: 0,
    };
    let mut w = World {
        etcd: ModelEtcd::new(),
        h: Harness::new(spy),
        rng,
        margin,
        faults: Faults::none(),
        now: t0,
        host_mode,
        clean,
        registered_once: false,
        steps: 0,
        events_injected: 0,
    };
    w.pump();
    let ttl_d = Duration::from_secs(ttl as u64);
    let phases = 4 + pick(&mut w.rng, 12);
    for _ in 0..phases {
        let phase = if clean {
            match pick(&mut w.rng, 3) {
                0 => Phase::SetValue,
                _ => Phase::Healthy,
            }
        } else {
            match pick(&mut w.rng, 8) {
                0 => Phase::Healthy,
                1 => Phase::FailingRequests,
                2 => Phase::LosingReplies,
                3 => Phase::DropStreams,
                4 => Phase::PauseLongerThanTtl,
                5 => Phase::ExtendLeases,
                6 => Phase::LoseInflight,
                _ => Phase::SetValue,
            }
        };
        w.faults = Faults::none();
        let length = ms(200 + pick(&mut w.rng, 3 * ttl as u64 * 1000));
        match phase {
            Phase::Healthy => {}
            Phase::FailingRequests => {
                w.faults = Faults {
                    fail_request: 0.3,
                    ..Faults::moderate()
                };
            }
            Phase::LosingReplies => {
                w.faults = Faults {
                    lose_reply: 0.3,
                    ..Faults::moderate()
                };
            }
            Phase::DropStreams => {
                w.h.drop_streams(w.now);
                w.events_injected += 1;
            }
            Phase::PauseLongerThanTtl => {
                w.etcd.pause();
                w.events_injected += 1;
                let until = w.now + ttl_d + ms(pick(&mut w.rng, 2 * ttl as u64 * 1000));
                w.run_until(until);
                w.etcd.resume(w.now);
                w.pump();
            }
            Phase::ExtendLeases => {
                w.etcd.extend_all_leases(w.now);
                w.events_injected += 1;
            }
            Phase::LoseInflight => {
                w.h.lose_all_inflight();
                w.events_injected += 1;
            }
            Phase::SetValue => {
                // Sometimes several in a row: later ones find a put in flight.
                for _ in 0..1 + pick(&mut w.rng, 3) {
                    value = format!("v{}", pick(&mut w.rng, 1_000_000)).into_bytes();
                    let now = w.now;
                    w.h.machine.handle(now, HostInput::SetValue(value.clone()));
                    w.pump();
                }
            }
        }
        let until = w.now + length;
        w.run_until(until);
    }

    // Quiet: enough for any backoff (5 s cap) plus a lease that must first
    // run out locally, plus a grant and a put.
    w.faults = Faults::none();
    let until = w.now + 2 * ttl_d + Duration::from_secs(12);
    w.run_until(until);
    let m = &w.h.machine.machine;
    let lease = m.lease();
    assert!(
        matches!(m.state(), LivenessState::Registered { .. }),
        "(e) seed {seed}: not registered after the faults: {:?}",
        m.state()
    );
    if host_mode {
        let kv = w.etcd.get(KEY).expect("(e) key present");
        assert_eq!(kv.value, value, "(e) seed {seed}: latest value");
        assert_eq!(Some(kv.lease), lease);
    }

    let now = w.now;
    w.h.machine.handle(now, HostInput::Stop);
    w.pump();
    let until = w.now + 2 * ttl_d;
    w.run_until(until);
    let last = w.h.notifications.last().map(|(_, n)| n.clone());
    assert_eq!(
        last,
        Some(HostNotice::State(LivenessState::Stopped { revoked: true })),
        "seed {seed}"
    );
    assert_eq!(w.h.machine.poll_timeout(), None);
    let lease = lease.expect("registered has a lease");
    assert!(!w.etcd.lease_exists(lease), "revoked lease still alive");
    assert!(w.etcd.get(KEY).is_none(), "key outlived the revoke");
    assert!(
        w.etcd.get(MARKER).is_none(),
        "leave marker outlived the revoke"
    );
    // Registered when stopped, so a marker-writing machine announced it.
    assert_eq!(
        w.h.machine.marker_sent,
        host_mode && seed.is_multiple_of(2),
        "seed {seed}: leave marker"
    );
    // etcd answers at once here, so every leave sent was told.
    assert_eq!(
        w.h.machine.left_told, w.h.machine.leave_sent,
        "seed {seed}: Left told"
    );
    // Later input changes nothing.
    w.h.machine.handle(until, HostInput::Stop);
    w.h.machine.handle_timeout(until + ttl_d);
    w.pump();

    totals.steps += w.steps;
    totals.faults += w.h.faults_injected + w.events_injected;
    totals.late_landed += w.h.late_landed;
    totals.losses +=
        w.h.notifications
            .iter()
            .filter(|(_, n)| matches!(n, HostNotice::State(LivenessState::Lost { .. })))
            .count() as u64;
    // Every renewal the model answered in time moved the deadline: a
    // machine that tells the moves told at least one per registration.
    if w.h.machine.announce_trust {
        assert!(
            w.h.machine.trusted_told > 0,
            "(e) seed {seed}: no deadline told"
        );
    }
    totals.trusted_told += w.h.machine.trusted_told;
    totals.clean_runs += u64::from(clean);
}

#[test]
fn keepalive_survives_random_fault_schedules() {
    let mut totals = Totals {
        steps: 0,
        faults: 0,
        late_landed: 0,
        losses: 0,
        clean_runs: 0,
        trusted_told: 0,
    };
    for seed in 0..SEEDS {
        run_seed(seed, &mut totals);
    }
    println!(
        "keepalive sim: {SEEDS} seeds ({} fault-free), {} steps, {} faults injected, \
         {} requests landed late ({:.2} per seed), {} leases lost and re-registered, \
         {} deadline moves told",
        totals.clean_runs,
        totals.steps,
        totals.faults,
        totals.late_landed,
        totals.late_landed as f64 / SEEDS as f64,
        totals.losses,
        totals.trusted_told
    );
    assert!(
        totals.late_landed > 0,
        "no request landed late: the fault was never exercised"
    );
    assert!(
        totals.losses > 0,
        "the schedules never exercised a lost lease"
    );
}
