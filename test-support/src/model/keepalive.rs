//! The keepalive world: one or two real machines around the model etcd,
//! each behind its own [`Wire`]: in lease-only mode a [`Keepalive`] (an
//! election session), in host mode a [`Host`] (a key bound to the
//! lease as `HostLiveness` runs it: the host registration on a lease-only
//! keepalive, `sm/src/host.rs`, leave marker included), with users who
//! change the bound value and stop, and an etcd that may revoke a lease
//! early.
//!
//! Safety, checked after every action (etcd's time is the machines' time):
//! 1. **Trust ends before etcd's expiry**: while a machine holds a lease
//!    (`local_deadline()` is some), that lease exists in etcd and the local
//!    deadline plus `required_margin` is no later than etcd's expiry of it
//!    — unless etcd revoked it early (`RevokeEarly`, etcd's own bug, which
//!    no deadline survives; rule 3 judges that case).
//! 2. **Registered means registered**: `lease()` names the lease the
//!    machine's last `Trusted` notice named; in host mode, unless etcd
//!    revoked that lease early, the key exists bound to it.
//! 3. **Belief ends at the first evidence**: a machine handed a renewal
//!    answered TTL 0, or a put refused `LeaseNotFound`, for the lease it
//!    holds no longer holds that lease once the answer is handled.
//! 4. **Trust told is trust held**: every `Trusted` notice names the
//!    machine's local deadline, later than now.
//! 5. **Deadlines never lie in the past**: `poll_timeout()` is never
//!    earlier than the current instant after a step.
//! 6. **Revokes are the stop's or the given-up leases'**: a machine never
//!    revokes the lease it holds before `Stop`, and after `Stop` sends no
//!    grant or put but the leave transaction (the marker put and the key
//!    deleted at one revision), and no renewal but a host's while its
//!    leave is out (the lease must live for it; never after the stop's
//!    revoke); the marker is never put alone, and `Left` is told only
//!    while etcd holds the marker on that lease.
//! 7. **Detach leaves the registration as it is** (rule 8 of
//!    `sm/src/keepalive.rs`, rule 5 of `sm/src/registration.rs`, rule 6
//!    of `sm/src/host.rs`): after `Detach` a machine sends nothing but
//!    the last revokes of leases it gave up earlier — no leave, no delete,
//!    no revoke of the lease it hands over; it tells `Detached` with the
//!    point it had (`resume_point()`), naming the lease and the key's
//!    create revision as etcd holds them and a mod revision no later than
//!    etcd's (a put whose answer was lost may have applied; unless etcd
//!    revoked that lease early), then `Stopped` without a revoke.
//! 8. **Resume takes over or starts afresh** (keepalive rule 9,
//!    registration rule 6, host rule 7): a machine resumed
//!    from a point is `Registering` until it registers; registered on the
//!    point's lease, etcd holds the key incarnation of the point (the same
//!    create revision: watchers see no `Down`/`Up`); before that first
//!    registration it tells `Lost` of the point's lease only once it told
//!    that lease trusted (a refused resume registers afresh without it),
//!    and rules 1 and 2 hold for it as for any machine.
//!
//! 9. **No trust from a stale renewal** (keepalive rule 10): with late renewal
//!    answers (`late_renewal_answers`, the wire's rule 6), a renewal the
//!    machine canceled is still answered later. An answer to a renewal
//!    sent before the machine's last re-grant (a `Grant` sent), a revoke
//!    of that renewal's lease (a `Revoke` sent), a `Lost` of it, or a
//!    stop or detach, never moves the local deadline later nor is told as
//!    trust (`Trusted`) — whatever TTL it carries.
//!
//! Liveness, from every quiescent state (nothing in flight): with no
//! further faults or user requests, messages delivered at once and time
//! moving to each next deadline, within `liveness_bound` every running
//! machine is `Registered` on a lease etcd has (a lost lease is granted
//! again), in host mode with its key bound to that lease and holding
//! the latest value; every stopped machine has told `Stopped` and its
//! key and leave marker are gone from etcd. A detached machine's successor
//! is resumed at once in the continuation.

use super::wire::{Bends, Taken, Wire, WireAction};
use super::{debug_hash, hash_debug, World};
use crate::ModelEtcd;
use fleetcoord_sm::host::{Host, HostConfig, HostInput, HostNotice};
use fleetcoord_sm::keepalive::{
    Keepalive, KeepaliveConfig, KeepaliveInput, KeepaliveNotice, LivenessState, ResumePoint,
};
use fleetcoord_sm::registration::RegistrationPoint;
use fleetcoord_sm::watch::leave_marker_key;
use fleetcoord_sm::{
    BackoffConfig, Command, LeaseId, Machine, Request, Response, RpcError, RpcId, TxnOp,
};
use std::collections::BTreeSet;
use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every machine gets the same seed (no jitter: it decides nothing).
const SEED: u64 = 11;

/// The key machine `m` binds to its lease (host mode).
fn key_of(m: usize) -> Vec<u8> {
    format!("/h/{m}").into_bytes()
}

/// Whether `txn` is a leave: the marker put and the key deleted together.
fn is_leave(txn: &fleetcoord_sm::Txn, marker: &[u8], key: &[u8]) -> bool {
    let puts_marker = txn
        .success
        .iter()
        .any(|op| matches!(op, TxnOp::Put { key: k, .. } if k == marker));
    let deletes_key = txn
        .success
        .iter()
        .any(|op| matches!(op, TxnOp::Delete(fleetcoord_sm::KeyRange::Key(k)) if k == key));
    puts_marker && deletes_key
}

/// The `n`-th value a user sets (0: the initial one).
fn value_of(n: u32) -> Vec<u8> {
    format!("v{n}").into_bytes()
}

/// How many faults and requests of each kind one path may contain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// Values set by users (host mode), all machines together.
    pub user: u32,
    /// Machines stopped by their users.
    pub stop: u32,
    /// Requests, replies or renewal streams lost.
    pub lose: u32,
    /// Orphans (requests given up) landing late.
    pub land: u32,
    /// Times time passes while messages are in flight.
    pub delay: u32,
    /// Leases etcd revokes before their expiry (etcd's own bug on 3.4 and
    /// 3.5 when a paused raft leader resumes).
    pub revoke_early: u32,
    /// Machines detached by their users (host mode), each resumed by a
    /// successor (a process restart within the TTL, or past it).
    pub detach: u32,
}

/// A world to explore: its size, its faults and what it checks.
#[derive(Clone, Debug)]
pub struct KeepaliveSetup {
    /// Machines, each registering from the start.
    pub machines: usize,
    /// Host mode: machine `m` binds `/h/<m>` to its lease.
    pub hosts: bool,
    /// In host mode, a stop first writes the leave marker.
    pub leave_marker: bool,
    /// The requested TTL.
    pub ttl_secs: i64,
    /// The machines' safety margin.
    pub safety_margin: Duration,
    /// The margin rule 1 requires; `safety_margin` unless a test means to
    /// catch a machine trusting its lease too long.
    pub required_margin: Duration,
    /// The machines' attempt timeout.
    pub attempt_timeout: Duration,
    /// Faults and user requests per path.
    pub budget: Budget,
    /// How many times time may pass between a request being given up and
    /// its landing (see [`Wire::age_orphans`]).
    pub land_within: u32,
    /// Time stops here (a quiescent state at the horizon is a leaf).
    pub horizon: Duration,
    /// The liveness bound from every quiescent state.
    pub liveness_bound: Duration,
    /// etcd answers every renewal with this many seconds more than the
    /// lease's TTL, which it keeps (a test that must fail, on rule 1).
    pub renewal_ttl_bonus: i64,
    /// Once a machine lost a lease, every grant reply it is sent is lost
    /// (a test that must fail, on liveness).
    pub lose_regrant_replies: bool,
    /// Another client may delete a registered machine's key (a test that
    /// must fail, on rule 2: nothing in the contract lets the machine see
    /// it).
    pub foreign_deletes: bool,
    /// Canceled renewals stay on the wire and are answered late (the
    /// wire's rule 6; rule 9 checks them).
    pub late_renewal_answers: bool,
}

impl KeepaliveSetup {
    /// `machines` in lease-only mode (`hosts` false) or host mode with
    /// a leave marker, TTL 2 s, margin 100 ms, attempt timeout 400 ms, no
    /// faults, a 3 s horizon, liveness within 2 × TTL + 1 s.
    pub fn new(machines: usize, hosts: bool) -> Self {
        KeepaliveSetup {
            machines,
            hosts,
            leave_marker: hosts,
            ttl_secs: 2,
            safety_margin: Duration::from_millis(100),
            required_margin: Duration::from_millis(100),
            attempt_timeout: Duration::from_millis(400),
            budget: Budget::default(),
            land_within: 1,
            horizon: Duration::from_secs(3),
            liveness_bound: Duration::from_secs(5),
            renewal_ttl_bonus: 0,
            lose_regrant_replies: false,
            foreign_deletes: false,
            late_renewal_answers: false,
        }
    }

    fn backoff() -> BackoffConfig {
        BackoffConfig {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(800),
            multiplier: 2,
            // No jitter: the seed then decides nothing.
            jitter_percent: 0,
        }
    }

    /// Machine `m`, its first request id `first`, resumed from `point`
    /// if given: a lease-only keepalive, or in host mode a host (its
    /// registration on its own keepalive, `sm/src/host.rs`).
    fn machine(&self, m: usize, now: Instant, first: u64, point: Option<Point>) -> Subject {
        if !self.hosts {
            let config = self.config();
            return Subject::Lease(Box::new(match point {
                Some(p) => {
                    Keepalive::resume(config, now, SEED, first, ResumePoint { lease: p.lease })
                }
                None => Keepalive::with_first_rpc_id(config, now, SEED, first),
            }));
        }
        let config = HostConfig {
            lease: self.config(),
            key: key_of(m),
            value: value_of(0),
            leave_marker: self.leave_marker.then(|| leave_marker_key(&key_of(m))),
            companion: None,
            take_over: false,
            backoff: Self::backoff(),
        };
        let point = point.map(|p| RegistrationPoint {
            lease: p.lease,
            mod_revision: p.mod_revision,
            create_revision: p.create_revision,
        });
        Subject::Host(Box::new(Host::with_first_rpc_id(
            config, now, SEED, first, point,
        )))
    }

    fn config(&self) -> KeepaliveConfig {
        KeepaliveConfig {
            ttl_secs: self.ttl_secs,
            backoff: Self::backoff(),
            safety_margin: self.safety_margin,
            drift_allowance_ppm: 0,
            attempt_timeout: self.attempt_timeout,
            // As HostLiveness: the Trusted notices name the lease held
            // (rules 2 and 4).
            announce_trust: true,
        }
    }
}

/// What a machine hands over at a detach, in either mode (a lease-only
/// keepalive's revisions are 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Point {
    lease: LeaseId,
    create_revision: i64,
    mod_revision: i64,
}

/// A notice of either machine, as the world reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Told {
    State(LivenessState),
    Trusted {
        lease: LeaseId,
        until: Instant,
    },
    Left {
        lease: LeaseId,
    },
    Detached(Point),
    /// A failed grant reported: why nothing is registered yet. It claims
    /// nothing about etcd, so there is nothing to check.
    GrantFailed,
}

/// `command` with its notice, if any, turned by `f`.
fn map_notice<N, M>(command: Command<N>, f: impl FnOnce(N) -> M) -> Command<M> {
    match command {
        Command::Rpc { id, request } => Command::Rpc { id, request },
        Command::Cancel { id } => Command::Cancel { id },
        Command::Notify(n) => Command::Notify(f(n)),
    }
}

/// The machine under test: a lease-only keepalive (an election session)
/// or a host registration on its own lease (`HostLiveness`).
#[derive(Clone, Debug)]
enum Subject {
    Lease(Box<Keepalive>),
    Host(Box<Host>),
}

/// The inputs the world gives a machine.
enum Give {
    Rpc(fleetcoord_sm::RpcReply),
    SetValue(Vec<u8>),
    Stop,
    Detach,
}

impl Subject {
    fn handle(&mut self, now: Instant, input: Give) {
        match self {
            Subject::Lease(k) => k.handle(
                now,
                match input {
                    Give::Rpc(r) => KeepaliveInput::Rpc(r),
                    // A lease-only keepalive keeps no value.
                    Give::SetValue(_) => return,
                    Give::Stop => KeepaliveInput::Stop,
                    Give::Detach => KeepaliveInput::Detach,
                },
            ),
            Subject::Host(h) => h.handle(
                now,
                match input {
                    Give::Rpc(r) => HostInput::Rpc(r),
                    Give::SetValue(v) => HostInput::SetValue(v),
                    Give::Stop => HostInput::Stop,
                    Give::Detach => HostInput::Detach,
                },
            ),
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        match self {
            Subject::Lease(k) => k.handle_timeout(now),
            Subject::Host(h) => h.handle_timeout(now),
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Subject::Lease(k) => k.poll_timeout(),
            Subject::Host(h) => h.poll_timeout(),
        }
    }

    fn poll_command(&mut self) -> Option<Command<Told>> {
        let command = match self {
            Subject::Lease(k) => map_notice(k.poll_command()?, |n| match n {
                KeepaliveNotice::State(s) => Told::State(s),
                KeepaliveNotice::Trusted { lease, until } => Told::Trusted { lease, until },
                KeepaliveNotice::GrantFailed { .. } => Told::GrantFailed,
                KeepaliveNotice::Detached(p) => Told::Detached(Point {
                    lease: p.lease,
                    create_revision: 0,
                    mod_revision: 0,
                }),
            }),
            Subject::Host(h) => map_notice(h.poll_command()?, |n| match n {
                HostNotice::State(s) => Told::State(s),
                HostNotice::Trusted { lease, until } => Told::Trusted { lease, until },
                HostNotice::Left { lease } => Told::Left { lease },
                HostNotice::GrantFailed { .. } => Told::GrantFailed,
                HostNotice::Detached(p) => Told::Detached(Point {
                    lease: p.lease,
                    create_revision: p.create_revision,
                    mod_revision: p.mod_revision,
                }),
            }),
        };
        Some(command)
    }

    fn local_deadline(&self) -> Option<Instant> {
        match self {
            Subject::Lease(k) => k.local_deadline(),
            Subject::Host(h) => h.local_deadline(),
        }
    }

    fn lease(&self) -> Option<LeaseId> {
        match self {
            Subject::Lease(k) => k.lease(),
            Subject::Host(h) => h.lease(),
        }
    }

    fn state(&self) -> &LivenessState {
        match self {
            Subject::Lease(k) => k.state(),
            Subject::Host(h) => h.state(),
        }
    }

    fn resume_point(&self) -> Option<Point> {
        match self {
            Subject::Lease(k) => k.resume_point().map(|p| Point {
                lease: p.lease,
                create_revision: 0,
                mod_revision: 0,
            }),
            Subject::Host(h) => h.resume_point().map(|p| Point {
                lease: p.lease,
                create_revision: p.create_revision,
                mod_revision: p.mod_revision,
            }),
        }
    }
}

/// One step of the keepalive world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeepaliveAction {
    /// A step on machine `.0`'s wire.
    Wire(usize, WireAction),
    /// Time passes to the next deadline, nothing in flight.
    Tick,
    /// Time passes to the next deadline with messages in flight (a fault).
    Delay,
    /// etcd revokes machine `.0`'s lease early (etcd's bug, not ours).
    RevokeEarly(usize),
    /// Machine `.0`'s user sets the next value (host mode).
    SetValue(usize),
    /// Machine `.0`'s user stops it.
    Stop(usize),
    /// Another client deletes machine `.0`'s key (a bend).
    DeleteKey(usize),
    /// Machine `.0`'s user detaches it (a restart: keepalive rule 8).
    Detach(usize),
    /// Machine `.0`'s successor resumes from the detached point (keepalive rule 9).
    Resume(usize),
}

#[derive(Clone, Debug)]
struct Node {
    machine: Subject,
    wire: Wire,
    /// The lease the last `Trusted` notice named, until `Lost`.
    trusted: Option<LeaseId>,
    /// Renewals and puts on the wire, with the lease they name (rule 3).
    on_lease: Vec<(RpcId, LeaseId)>,
    /// The last value set (its number, see `value_of`).
    value: u32,
    /// `Lost` was told at least once.
    lost_before: bool,
    /// The user stopped it.
    stopped: bool,
    /// The leave transaction went out.
    marker_sent: bool,
    /// The stop's revoke of the lease held went out: no renewal after it.
    stop_revoked: bool,
    /// The user detached the machine: the point it must tell.
    detaching: Option<Point>,
    /// Told `Detached` with this point; the successor is not resumed yet.
    detached: Option<Point>,
    /// The machine was resumed from this point and has not registered yet.
    resumed: Option<Point>,
    /// Machines this node has run (each successor's request ids are its
    /// own, so orphans of the one before cannot be mistaken for them).
    incarnation: u64,
    /// Renewals sent and not yet answered, with the lease each names
    /// (rule 9).
    renewals: Vec<(RpcId, LeaseId)>,
    /// Those of them sent before a later re-grant, revoke, loss, stop or
    /// detach: their answers may predate it (rule 9).
    stale: BTreeSet<RpcId>,
    /// `Trusted` notices told so far (rule 9).
    trust_told: u64,
}

impl Node {
    /// The lease held and its local deadline (rule 1).
    fn holding(&self) -> Option<(Option<LeaseId>, Instant)> {
        self.machine.local_deadline().map(|d| (self.trusted, d))
    }
}

/// The keepalive world; see the module docs for what it checks.
#[derive(Clone)]
pub struct KeepaliveWorld {
    setup: Arc<KeepaliveSetup>,
    etcd: ModelEtcd,
    start: Instant,
    now: Instant,
    nodes: Vec<Node>,
    budget: Budget,
    /// Leases etcd revoked early (rules 1–3).
    revoked_early: BTreeSet<LeaseId>,
    bends: Bends,
    marks: u32,
}

const REGISTERED: u32 = 1 << 0;
const SUSPENDED: u32 = 1 << 1;
const LOST: u32 = 1 << 2;
const REGRANTED: u32 = 1 << 3;
const LANDED: u32 = 1 << 4;
const EXPIRED: u32 = 1 << 5;
const REVOKED_EARLY: u32 = 1 << 6;
const NOTICED: u32 = 1 << 7;
const VALUE_WRITTEN: u32 = 1 << 8;
const MARKER: u32 = 1 << 9;
const STOPPED: u32 = 1 << 10;
const LIVENESS: u32 = 1 << 11;
const DETACHED: u32 = 1 << 12;
const RESUMED: u32 = 1 << 13;
const RESUMED_AFRESH: u32 = 1 << 14;
const STALE_ANSWER: u32 = 1 << 15;

impl KeepaliveWorld {
    /// Every machine started at one instant, each registering.
    pub fn new(setup: KeepaliveSetup) -> Self {
        let start = Instant::now();
        let keep_orphans = setup.budget.land > 0;
        let wire = || {
            let wire = Wire::new(keep_orphans);
            if setup.late_renewal_answers {
                wire.with_late_renewal_answers()
            } else {
                wire
            }
        };
        let nodes = (0..setup.machines)
            .map(|m| Node {
                machine: setup.machine(m, start, 0, None),
                wire: wire(),
                trusted: None,
                on_lease: Vec::new(),
                value: 0,
                lost_before: false,
                stopped: false,
                marker_sent: false,
                stop_revoked: false,
                detaching: None,
                detached: None,
                resumed: None,
                incarnation: 0,
                renewals: Vec::new(),
                stale: BTreeSet::new(),
                trust_told: 0,
            })
            .collect();
        let mut world = KeepaliveWorld {
            budget: setup.budget.clone(),
            bends: Bends::default(),
            setup: Arc::new(setup),
            etcd: ModelEtcd::new(),
            start,
            now: start,
            nodes,
            revoked_early: BTreeSet::new(),
            marks: 0,
        };
        for m in 0..world.nodes.len() {
            if let Err(message) = world.pump(m) {
                panic!("the initial world breaks a rule: {message}");
            }
        }
        world
    }

    /// Moves machine `m`'s commands onto its wire, checking rules 4 and 6.
    fn pump(&mut self, m: usize) -> Result<(), String> {
        let marker = leave_marker_key(&key_of(m));
        // Rule 9 tracks renewals only where their answers come late; the
        // other worlds keep their states as they were.
        let late = self.setup.late_renewal_answers;
        while let Some(command) = self.nodes[m].machine.poll_command() {
            let node = &mut self.nodes[m];
            match &command {
                Command::Rpc { id, request } => {
                    if let Request::KeepAlive { lease } | Request::Put { lease, .. } = request {
                        node.on_lease.push((*id, *lease));
                    }
                    // Rule 9: what a renewal sent before this may predate.
                    match request {
                        _ if !late => {}
                        Request::KeepAlive { lease } => node.renewals.push((*id, *lease)),
                        Request::Grant { .. } => {
                            node.stale.extend(node.renewals.iter().map(|(r, _)| *r));
                        }
                        Request::Revoke { lease } => node.stale.extend(
                            node.renewals
                                .iter()
                                .filter(|(_, l)| l == lease)
                                .map(|(r, _)| *r),
                        ),
                        _ => {}
                    }
                    // The key's put: a transaction guarded on its revision.
                    if let Request::Txn(txn) = request {
                        let lease = txn.success.iter().find_map(|op| match op {
                            TxnOp::Put { lease, .. } => Some(*lease),
                            _ => None,
                        });
                        if let Some(lease) = lease {
                            node.on_lease.push((*id, lease));
                        }
                    }
                    if let Some(point) = node.detaching {
                        match request {
                            Request::Revoke { lease } if *lease != point.lease => {}
                            other => {
                                return Err(format!(
                                    "machine {m} sent {other:?} after Detach (point {point:?})"
                                ));
                            }
                        }
                    }
                    match request {
                        Request::Txn(txn) if is_leave(txn, &marker, &key_of(m)) => {
                            if !node.stopped {
                                return Err(format!("machine {m} left without a stop"));
                            }
                            node.marker_sent = true;
                            self.marks |= MARKER;
                        }
                        Request::Put { key, .. } if *key == marker => {
                            return Err(format!(
                                "machine {m} put its leave marker outside the leave transaction"
                            ));
                        }
                        Request::Revoke { lease } => {
                            let held = node.holding().and_then(|(l, _)| l);
                            if !node.stopped && held == Some(*lease) {
                                return Err(format!(
                                    "machine {m} revokes lease {lease:x}, which it holds, before Stop"
                                ));
                            }
                            if node.stopped && held == Some(*lease) {
                                node.stop_revoked = true;
                            }
                        }
                        // A host keeps its lease alive for its leave
                        // (`sm/src/host.rs`, rule 4): renewals until the
                        // stop's revoke, never after it.
                        Request::KeepAlive { .. }
                            if node.stopped && self.setup.hosts && !node.stop_revoked => {}
                        other if node.stopped => {
                            return Err(format!("machine {m} sent {other:?} after Stop"));
                        }
                        _ => {}
                    }
                }
                Command::Cancel { id } => node.on_lease.retain(|(r, _)| r != id),
                Command::Notify(Told::State(LivenessState::Lost { lease })) => {
                    node.stale.extend(
                        node.renewals
                            .iter()
                            .filter(|(_, l)| l == lease)
                            .map(|(r, _)| *r),
                    );
                }
                Command::Notify(Told::State(LivenessState::Stopped { .. }) | Told::Detached(_)) => {
                    node.stale.extend(node.renewals.iter().map(|(r, _)| *r))
                }
                Command::Notify(_) => {}
            }
            if let Some(notice) = self.nodes[m].wire.accept(command) {
                self.notice(m, notice)?;
            }
        }
        Ok(())
    }

    /// Rule 4, and what the notices tell the world.
    fn notice(&mut self, m: usize, notice: Told) -> Result<(), String> {
        let node = &mut self.nodes[m];
        match notice {
            Told::Trusted { lease, until } => {
                if node.machine.local_deadline() != Some(until) || until <= self.now {
                    return Err(format!(
                        "machine {m} told lease {lease:x} trusted until +{:?}, but its deadline \
                         is {:?} at +{:?}",
                        until - self.start,
                        node.machine.local_deadline().map(|d| d - self.start),
                        self.now - self.start
                    ));
                }
                node.trusted = Some(lease);
                if self.setup.late_renewal_answers {
                    node.trust_told += 1;
                }
            }
            Told::Left { lease } => {
                // Told once etcd applied the leave: the key is gone and
                // the marker is bound to the lease (until its revoke).
                let marker = self.etcd.get(&leave_marker_key(&key_of(m)));
                if !node.stopped
                    || !node.marker_sent
                    || marker.as_ref().is_none_or(|kv| kv.lease != lease)
                {
                    return Err(format!(
                        "machine {m} told Left on lease {lease:x} without a leave applied \
                         (stopped: {}, marker: {marker:?})",
                        node.stopped
                    ));
                }
            }
            Told::GrantFailed => {}
            Told::Detached(point) => {
                if node.detaching != Some(point) {
                    return Err(format!(
                        "machine {m} detached at {point:?}, asked at {:?}",
                        node.detaching
                    ));
                }
                let kv = self.etcd.get(&key_of(m));
                // A put whose answer was lost may have moved the key on
                // since the machine last knew it: the successor's guard
                // then fails and it registers afresh (keepalive rule 9).
                let held = kv.as_ref().is_some_and(|kv| {
                    kv.lease == point.lease
                        && kv.create_revision == point.create_revision
                        && kv.mod_revision >= point.mod_revision
                });
                if !held && !self.revoked_early.contains(&point.lease) {
                    return Err(format!(
                        "machine {m} detached at {point:?}, but etcd has its key as {kv:?}"
                    ));
                }
                node.detached = Some(point);
                self.marks |= DETACHED;
            }
            Told::State(state) => match state {
                LivenessState::Registered { lease } => {
                    self.marks |= REGISTERED;
                    if node.lost_before {
                        self.marks |= REGRANTED;
                    }
                    if let Some(point) = node.resumed.take() {
                        if lease == point.lease {
                            let kv = self.etcd.get(&key_of(m));
                            if kv.as_ref().map(|kv| kv.create_revision)
                                != Some(point.create_revision)
                                && !self.revoked_early.contains(&lease)
                            {
                                return Err(format!(
                                    "machine {m} resumed on lease {lease:x} from {point:?}, \
                                     but etcd has its key as {kv:?}"
                                ));
                            }
                            self.marks |= RESUMED;
                        } else {
                            self.marks |= RESUMED_AFRESH;
                        }
                    }
                }
                LivenessState::Suspended { .. } => self.marks |= SUSPENDED,
                LivenessState::Lost { lease } => {
                    // A proven lease (told trusted) whose resume
                    // transaction is still unanswered at its deadline is
                    // lost as any other (sm/tests/unit/keepalive.rs,
                    // `a_resume_transaction_unanswered_until_the_deadline_ends_the_resume`).
                    let proven = node.trusted == Some(lease);
                    if let Some(point) = node.resumed.filter(|p| p.lease == lease && !proven) {
                        return Err(format!(
                            "machine {m} resumed from {point:?} told Lost on lease {lease:x} \
                             before it registered"
                        ));
                    }
                    node.trusted = None;
                    node.lost_before = true;
                    self.marks |= LOST;
                }
                LivenessState::Stopped { revoked } => {
                    if node.detaching.is_some() && revoked {
                        return Err(format!("machine {m} detached with a revoke"));
                    }
                    node.trusted = None;
                    self.marks |= STOPPED;
                }
                // Every machine of this world has a key of its own, and a
                // successor resumes its predecessor's lease: nobody else
                // ever holds a machine's key, so it is never a duplicate.
                LivenessState::Duplicate { holder } => {
                    return Err(format!(
                        "machine {m} took lease {holder:x} for a live duplicate of its key"
                    ));
                }
                LivenessState::Registering
                | LivenessState::Refused { .. }
                | LivenessState::Waiting { .. } => {}
            },
        }
        Ok(())
    }

    /// Rules 1, 2 and 5.
    fn check(&self) -> Result<(), String> {
        for (m, node) in self.nodes.iter().enumerate() {
            if node.machine.poll_timeout().is_some_and(|t| t < self.now) {
                return Err(format!("machine {m}'s next deadline is in the past"));
            }
            let registered = node.machine.lease();
            if registered.is_some() && registered != node.trusted {
                return Err(format!(
                    "machine {m} is registered with lease {registered:?}, but its last trusted \
                     lease is {:?}",
                    node.trusted
                ));
            }
            let Some((trusted, deadline)) = node.holding() else {
                continue;
            };
            let Some(lease) = trusted else {
                return Err(format!("machine {m} holds a lease it never told of"));
            };
            if self.revoked_early.contains(&lease) {
                continue;
            }
            let expiry = self.etcd.lease_deadline(lease);
            if expiry.is_none_or(|e| deadline + self.setup.required_margin > e) {
                return Err(format!(
                    "machine {m} trusts lease {lease:x} until +{:?} but etcd expires it at +{:?} \
                     (margin {:?} required)",
                    deadline - self.start,
                    expiry.map(|t| t - self.start),
                    self.setup.required_margin
                ));
            }
            if self.setup.hosts && registered.is_some() {
                let kv = self.etcd.get(&key_of(m));
                if kv.as_ref().is_none_or(|kv| kv.lease != lease) {
                    return Err(format!(
                        "machine {m} is registered with lease {lease:x} but etcd has its key as \
                         {kv:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    fn in_flight(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| n.wire.in_flight(&self.etcd, &self.bends))
    }

    /// The next instant anything is due: a machine's deadline or a lease
    /// expiry.
    fn next_deadline(&self) -> Option<Instant> {
        self.nodes
            .iter()
            .filter_map(|n| n.machine.poll_timeout())
            .chain(self.etcd.next_deadline())
            .min()
    }

    /// Time passes to `at`: etcd expires leases first, then every due
    /// machine deadline fires (the harness's order at one instant).
    fn tick_to(&mut self, at: Instant) -> Result<(), String> {
        self.now = self.now.max(at);
        let leases = self.etcd.leases().len();
        self.etcd.advance(self.now);
        if self.etcd.leases().len() < leases {
            self.marks |= EXPIRED;
        }
        let land_within = self.setup.land_within;
        for m in 0..self.nodes.len() {
            self.nodes[m].wire.age_orphans(land_within);
            if self.nodes[m]
                .machine
                .poll_timeout()
                .is_some_and(|t| t <= self.now)
            {
                self.nodes[m].machine.handle_timeout(self.now);
            }
            self.pump(m)?;
        }
        Ok(())
    }

    /// A step on machine `m`'s wire, with the bends on what it delivers
    /// and rule 3.
    fn wire_step(&mut self, m: usize, action: WireAction) -> Result<(), String> {
        let now = self.now;
        let node = &mut self.nodes[m];
        let taken = node.wire.take(action, &mut self.etcd, now, &self.bends);
        let mut reply = match taken {
            Taken::Nothing => return Ok(()),
            Taken::Landed => {
                self.marks |= LANDED;
                return Ok(());
            }
            Taken::Reply(reply) => reply,
        };
        let named = node
            .on_lease
            .iter()
            .position(|(id, _)| *id == reply.id)
            .map(|i| node.on_lease.remove(i).1);
        match &mut reply.result {
            Ok(Response::KeptAlive { ttl_secs }) if *ttl_secs > 0 => {
                *ttl_secs += self.setup.renewal_ttl_bonus;
            }
            Ok(Response::Granted { .. }) if self.setup.lose_regrant_replies && node.lost_before => {
                reply.result = Err(RpcError::Unavailable("model: grant reply lost".into()));
            }
            Ok(Response::Txn {
                succeeded: true, ..
            }) if node.value > 0 => {
                self.marks |= VALUE_WRITTEN;
            }
            _ => {}
        }
        let evidence = matches!(
            reply.result,
            Ok(Response::KeptAlive { ttl_secs: 0 }) | Err(RpcError::LeaseNotFound)
        );
        let held = node.holding().and_then(|(l, _)| l);
        let gone = named.filter(|l| evidence && held == Some(*l));
        if node.machine.poll_timeout().is_some_and(|t| t <= now) {
            node.machine.handle_timeout(now);
            self.pump(m)?;
        }
        let node = &mut self.nodes[m];
        let renewal = node
            .renewals
            .iter()
            .position(|(r, _)| *r == reply.id)
            .map(|i| node.renewals.remove(i));
        let stale = renewal.filter(|(r, _)| node.stale.remove(r));
        let before = node.machine.local_deadline();
        let told = node.trust_told;
        node.machine.handle(now, Give::Rpc(reply));
        self.pump(m)?;
        if let Some((id, lease)) = stale {
            self.marks |= STALE_ANSWER;
            let after = self.nodes[m].machine.local_deadline();
            let moved = after.is_some_and(|a| before.is_none_or(|b| a > b));
            if moved || self.nodes[m].trust_told != told {
                return Err(format!(
                    "machine {m} told trust or moved its deadline (from {:?} to {:?}) on the \
                     answer to renewal {id:?} of lease {lease:x}, sent before its last re-grant, \
                     revoke, loss or stop: that answer may predate it",
                    before.map(|t| t - self.start),
                    after.map(|t| t - self.start)
                ));
            }
        }
        if let Some(lease) = gone {
            let node = &self.nodes[m];
            if node.holding().and_then(|(l, _)| l) == Some(lease) {
                return Err(format!(
                    "machine {m} still holds lease {lease:x} after etcd said it is gone"
                ));
            }
            if self.revoked_early.contains(&lease) {
                self.marks |= NOTICED;
            }
        }
        Ok(())
    }

    /// The fair continuation's next message: the first request to run,
    /// else the first answer to deliver, machine by machine.
    fn fair_next(&self) -> Option<KeepaliveAction> {
        let mut actions = Vec::new();
        for (m, node) in self.nodes.iter().enumerate() {
            if node.detached.is_some() {
                return Some(KeepaliveAction::Resume(m));
            }
            actions.clear();
            node.wire
                .actions(&self.etcd, &self.bends, false, false, &mut actions);
            if let Some(action) = actions.first() {
                return Some(KeepaliveAction::Wire(m, *action));
            }
        }
        None
    }

    /// Whether machine `m` is where liveness wants it (see the module
    /// docs).
    fn settled(&self, m: usize) -> bool {
        let node = &self.nodes[m];
        let key = self.etcd.get(&key_of(m));
        if node.detaching.is_some() {
            return false;
        }
        if node.stopped {
            let marker = self.etcd.get(&leave_marker_key(&key_of(m)));
            return matches!(node.machine.state(), LivenessState::Stopped { .. })
                && key.is_none()
                && marker.is_none();
        }
        let LivenessState::Registered { lease } = *node.machine.state() else {
            return false;
        };
        self.etcd.lease_exists(lease)
            && (!self.setup.hosts
                || key.is_some_and(|kv| kv.lease == lease && kv.value == value_of(node.value)))
    }

    fn live(&self) -> bool {
        (0..self.nodes.len()).all(|m| self.settled(m))
    }
}

impl World for KeepaliveWorld {
    type Action = KeepaliveAction;

    const MARKS: &'static [&'static str] = &[
        "registered",
        "suspended",
        "lease lost",
        "re-granted",
        "landed late",
        "lease expired",
        "revoked early",
        "early revocation noticed",
        "value rewritten",
        "leave marker",
        "stopped",
        "liveness checked",
        "detached",
        "resumed on the same lease",
        "resumed afresh",
        "stale renewal answered",
    ];

    fn actions(&self, out: &mut Vec<KeepaliveAction>) {
        let b = &self.budget;
        for (m, node) in self.nodes.iter().enumerate() {
            let mut wire = Vec::new();
            node.wire
                .actions(&self.etcd, &self.bends, b.lose > 0, b.land > 0, &mut wire);
            out.extend(wire.into_iter().map(|a| KeepaliveAction::Wire(m, a)));
            if node.detached.is_some() {
                out.push(KeepaliveAction::Resume(m));
            }
            if node.stopped || node.detaching.is_some() {
                continue;
            }
            if b.detach > 0 && node.machine.resume_point().is_some() {
                out.push(KeepaliveAction::Detach(m));
            }
            let held = node.holding().and_then(|(l, _)| l);
            if b.revoke_early > 0 && held.is_some_and(|l| self.etcd.lease_exists(l)) {
                out.push(KeepaliveAction::RevokeEarly(m));
            }
            if b.user > 0 && self.setup.hosts {
                out.push(KeepaliveAction::SetValue(m));
            }
            if b.stop > 0 {
                out.push(KeepaliveAction::Stop(m));
            }
            if self.setup.foreign_deletes
                && node.machine.lease().is_some()
                && self.etcd.get(&key_of(m)).is_some()
            {
                out.push(KeepaliveAction::DeleteKey(m));
            }
        }
        if self
            .next_deadline()
            .is_some_and(|at| at <= self.start + self.setup.horizon)
        {
            if !self.in_flight() {
                out.push(KeepaliveAction::Tick);
            } else if b.delay > 0 {
                out.push(KeepaliveAction::Delay);
            }
        }
    }

    fn apply(&mut self, action: &KeepaliveAction) -> Result<(), String> {
        let now = self.now;
        match *action {
            KeepaliveAction::Wire(m, step) => {
                if let WireAction::Lose(_) = step {
                    self.budget.lose -= 1;
                }
                if let WireAction::Land(_) = step {
                    self.budget.land -= 1;
                }
                self.wire_step(m, step)?;
                if self.budget.land == 0 {
                    for node in &mut self.nodes {
                        node.wire.forget_orphans();
                    }
                }
            }
            KeepaliveAction::Tick | KeepaliveAction::Delay => {
                if *action == KeepaliveAction::Delay {
                    self.budget.delay -= 1;
                }
                if let Some(at) = self.next_deadline() {
                    self.tick_to(at)?;
                }
            }
            KeepaliveAction::RevokeEarly(m) => {
                self.budget.revoke_early -= 1;
                if let Some(lease) = self.nodes[m].holding().and_then(|(l, _)| l) {
                    self.etcd.expire_lease(lease);
                    self.revoked_early.insert(lease);
                    self.marks |= REVOKED_EARLY;
                }
            }
            KeepaliveAction::SetValue(m) => {
                self.budget.user -= 1;
                let node = &mut self.nodes[m];
                node.value += 1;
                let value = value_of(node.value);
                node.machine.handle(now, Give::SetValue(value));
                self.pump(m)?;
            }
            KeepaliveAction::Stop(m) => {
                self.budget.stop -= 1;
                let node = &mut self.nodes[m];
                node.stopped = true;
                node.machine.handle(now, Give::Stop);
                self.pump(m)?;
            }
            KeepaliveAction::Detach(m) => {
                self.budget.detach -= 1;
                let node = &mut self.nodes[m];
                node.detaching = node.machine.resume_point();
                node.machine.handle(now, Give::Detach);
                self.pump(m)?;
                if self.nodes[m].detached.is_none() {
                    return Err(format!("machine {m} did not tell Detached"));
                }
            }
            KeepaliveAction::Resume(m) => {
                let setup = self.setup.clone();
                let node = &mut self.nodes[m];
                let Some(point) = node.detached.take() else {
                    return Err(format!("machine {m} resumed with nothing detached"));
                };
                node.incarnation += 1;
                node.machine = setup.machine(m, now, node.incarnation << 20, Some(point));
                node.detaching = None;
                // The successor writes its own initial value.
                node.value = 0;
                node.resumed = Some(point);
                node.trusted = None;
                node.on_lease.clear();
                self.pump(m)?;
            }
            KeepaliveAction::DeleteKey(m) => {
                let delete = Request::Delete(fleetcoord_sm::KeyRange::Key(key_of(m)));
                // A delete of a key that exists always succeeds.
                let _ = self.etcd.execute(now, &delete);
            }
        }
        self.check()
    }

    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        hash_debug(&mut hasher, &self.etcd);
        hash_debug(&mut hasher, &(self.now - self.start));
        hash_debug(&mut hasher, &self.budget);
        hash_debug(&mut hasher, &self.revoked_early);
        // A machine's key (host mode) is in its state: permuting
        // machines merges states only when they are truly alike.
        let mut nodes: Vec<u64> = self.nodes.iter().map(debug_hash).collect();
        nodes.sort_unstable();
        for n in nodes {
            hasher.write_u64(n);
        }
        hasher.finish()
    }

    fn check_liveness(&mut self) -> Result<(), String> {
        if self.in_flight() || self.live() {
            return Ok(());
        }
        self.marks |= LIVENESS;
        let mut fair = self.clone();
        fair.budget = Budget::default();
        let from = fair.now;
        let until = from + self.setup.liveness_bound;
        loop {
            if fair.live() {
                return Ok(());
            }
            let step = match fair.fair_next() {
                Some(KeepaliveAction::Wire(m, a)) => fair.wire_step(m, a),
                Some(resume @ KeepaliveAction::Resume(_)) => fair.apply(&resume),
                _ => match fair.next_deadline().filter(|at| *at <= until) {
                    Some(at) => fair.tick_to(at),
                    None => break,
                },
            };
            step.and_then(|()| fair.check()).map_err(|m| {
                format!(
                    "in the fair continuation from +{:?}: {m}",
                    from - self.start
                )
            })?;
        }
        let unsettled: Vec<String> = (0..fair.nodes.len())
            .filter(|m| !fair.settled(*m))
            .map(|m| format!("machine {m} is {:?}", fair.nodes[m].machine.state()))
            .collect();
        Err(format!(
            "liveness: from the quiescent state at +{:?}, {} after {:?} without faults",
            from - self.start,
            unsettled.join(", "),
            self.setup.liveness_bound
        ))
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn take_marks(&mut self) -> u32 {
        std::mem::take(&mut self.marks)
    }

    fn describe(&self) -> String {
        let at = |t: Instant| format!("+{} ms", (t - self.start).as_millis());
        let mut out = self.etcd.describe(self.start);
        for (m, node) in self.nodes.iter().enumerate() {
            out += &format!(
                "\n  machine {m}: {:?}, trusted lease {:?} until {:?}, value v{}, stopped {}, \
                 next deadline {:?}\n    wire {:?}",
                node.machine.state(),
                node.trusted.map(|l| format!("{l:x}")),
                node.machine.local_deadline().map(at),
                node.value,
                node.stopped,
                node.machine.poll_timeout().map(at),
                node.wire
            );
        }
        out
    }
}
