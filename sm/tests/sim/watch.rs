//! The watch machine against the model etcd, over many seeds.
//!
//! Each seed: hosts register (lease + key), update their metadata, crash
//! (stop renewing; the lease expires), leave (revoke), re-register under the
//! same id, and a few invalid keys come and go — while the watch suffers
//! failed requests, lost replies, reads that land at etcd up to 3 s after
//! the machine was told they failed, dropped streams, compactions, etcd
//! pauses longer than the TTL, leader changes and a consumer that stalls.
//! Then the faults stop and the world goes quiet.
//!
//! Checked after every step, from the notices alone ([`Consumer`]) and on
//! the wire ([`Spy`]):
//! * no `Up` for a key already up; `Updated`/`Down` only for a key that is up
//!   with the same create revision and a newer mod revision, and `Down`
//!   carries exactly the last-seen value; `Up`/`Updated` never show a revision etcd has not reached;
//! * `Synced` exactly once, and nothing but replay (`Up`, `InvalidKey`)
//!   before it; each invalid key reported once, valid keys never, leave
//!   markers (written by two thirds of the graceful leaves, in today's
//!   one-transaction form or the older marker-then-revoke) not at all;
//! * a `Left` only for a key whose marker was put on the key's lease (so a
//!   crash, a plain revoke or a delete never reads as a leave), and some
//!   leaves are seen as `Left`;
//! * every `Up`/`Updated` is preceded by exactly the incarnation written
//!   with that state (half the writes carry one, in the same transaction
//!   on the same lease), and by none when none was; every `Down`/`Left` by
//!   the incarnation last told for its key;
//! * `known()` equals the view rebuilt from the notices;
//! * at most one request outstanding; `poll_timeout` never before the last
//!   `now`; nothing issued after `Stop`.
//!
//! Once settled, the consumer's view equals the model's prefix exactly, the
//! watch is live, and `Stop` leaves no timer and sends nothing more.

use fleetcoord_sm::watch::{
    incarnation_key, leave_marker_key, parse_leave_marker, KeyRule, Watch, WatchConfig, WatchInput,
    WatchNotice,
};
use fleetcoord_sm::{
    BackoffConfig, Command, Compare, KeyRange, KeyValue, LeaseId, Machine, Request, Response,
    RpcId, RpcReply, Txn, TxnOp,
};
use fleetcoord_test_support::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const SEEDS: u64 = 1_000;
const PREFIX: &[u8] = b"/coord/hosts/";
const HOSTS: usize = 6;

fn is_valid(key: &[u8]) -> bool {
    key.strip_prefix(PREFIX)
        .is_some_and(|s| KeyRule::HostId.accepts(s))
}

/// Wraps the machine and checks the wire rules on every command.
struct Spy {
    machine: Watch,
    last_now: Instant,
    outstanding: BTreeSet<RpcId>,
    stopped: bool,
}

impl Machine for Spy {
    type Input = WatchInput;
    type Notice = WatchNotice;

    fn stop_input() -> WatchInput {
        Watch::stop_input()
    }

    fn is_finished(&self) -> bool {
        self.machine.is_finished()
    }

    fn handle(&mut self, now: Instant, input: WatchInput) {
        self.last_now = now;
        match &input {
            // Anything but a watch batch ends the request it answers.
            WatchInput::Rpc(RpcReply { id, result })
                if !matches!(result, Ok(Response::WatchEvents { .. })) =>
            {
                self.outstanding.remove(id);
            }
            WatchInput::Stop => self.stopped = true,
            _ => {}
        }
        self.machine.handle(now, input);
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.last_now = now;
        self.machine.handle_timeout(now);
    }

    fn poll_command(&mut self) -> Option<Command<WatchNotice>> {
        let command = self.machine.poll_command()?;
        match &command {
            Command::Rpc { id, request } => {
                assert!(!self.stopped, "{request:?} after Stop");
                assert!(
                    self.outstanding.is_empty(),
                    "two requests outstanding: {request:?}"
                );
                assert!(matches!(request, Request::Range(_) | Request::Watch { .. }));
                self.outstanding.insert(*id);
            }
            Command::Cancel { id } => {
                self.outstanding.remove(id);
            }
            Command::Notify(_) => {}
        }
        Some(command)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let at = self.machine.poll_timeout();
        if let Some(at) = at {
            assert!(at >= self.last_now, "poll_timeout before the last now");
            assert!(!self.stopped, "a timer after Stop");
        }
        at
    }
}

/// The consumer's view, rebuilt from the notices alone.
#[derive(Default)]
struct Consumer {
    view: BTreeMap<Vec<u8>, KeyValue>,
    synced: u32,
    reported: BTreeSet<Vec<u8>>,
    ups: u64,
    downs: u64,
    lefts: u64,
    updates: u64,
    invalid: u64,
    /// (host key, lease) of every leave marker put.
    marker_puts: BTreeSet<(Vec<u8>, LeaseId)>,
    /// What incarnations were written, checked against those told.
    incarnations: Incarnations,
}

impl Consumer {
    fn apply(&mut self, notice: WatchNotice, etcd_revision: i64) {
        if self.synced == 0 {
            // A first snapshot interrupted between pages (compaction, a
            // stalled consumer) is finished as a resync, whose diff may
            // correct keys replayed from its earlier pages; the checks
            // below still hold for those notices.
            assert!(
                matches!(
                    notice,
                    WatchNotice::Up(_)
                        | WatchNotice::Incarnation(_)
                        | WatchNotice::InvalidKey(_)
                        | WatchNotice::Synced
                        | WatchNotice::Down(_)
                        | WatchNotice::Left(_)
                        | WatchNotice::Updated(_)
                ),
                "{notice:?} before Synced"
            );
        }
        if let Err(e) = self.incarnations.check(&notice) {
            panic!("{e}");
        }
        match notice {
            WatchNotice::Incarnation(_) => {}
            WatchNotice::Up(kv) => {
                assert!(is_valid(&kv.key), "Up for an invalid key");
                assert!(kv.mod_revision <= etcd_revision, "Up from the future");
                let key = kv.key.clone();
                assert!(
                    self.view.insert(key, kv).is_none(),
                    "Up for a key already up"
                );
                self.ups += 1;
            }
            WatchNotice::Updated(kv) => {
                let before = self.view.get(&kv.key).expect("Updated for a key not up");
                assert_eq!(
                    before.create_revision, kv.create_revision,
                    "Updated across re-creation"
                );
                assert!(kv.mod_revision <= etcd_revision, "Updated from the future");
                assert!(
                    kv.mod_revision > before.mod_revision,
                    "Updated without a change"
                );
                self.view.insert(kv.key.clone(), kv);
                self.updates += 1;
            }
            WatchNotice::Down(kv) => {
                let before = self
                    .view
                    .remove(&kv.key)
                    .expect("Down without an earlier Up");
                assert_eq!(before, kv, "Down must carry the last-seen key");
                self.downs += 1;
            }
            WatchNotice::Left(kv) => {
                let before = self
                    .view
                    .remove(&kv.key)
                    .expect("Left without an earlier Up");
                assert_eq!(before, kv, "Left must carry the last-seen key");
                assert!(
                    kv.lease != 0 && self.marker_puts.contains(&(kv.key.clone(), kv.lease)),
                    "Left without a leave marker on its lease: {kv:?}"
                );
                self.lefts += 1;
            }
            WatchNotice::Synced => self.synced += 1,
            WatchNotice::InvalidKey(key) => {
                assert!(
                    key.starts_with(PREFIX) && !is_valid(&key),
                    "valid key reported invalid"
                );
                assert!(
                    key.strip_prefix(PREFIX)
                        .is_none_or(|s| parse_leave_marker(s).is_none()),
                    "a leave marker reported invalid"
                );
                assert!(
                    !key.ends_with(b"/incarnation"),
                    "an incarnation key reported invalid"
                );
                assert!(self.reported.insert(key), "invalid key reported twice");
                self.invalid += 1;
            }
            other => panic!("unexpected notice {other:?}"),
        }
        assert!(self.synced <= 1, "Synced twice");
    }
}

struct Host {
    key: Vec<u8>,
    /// Registrations so far: the incarnation its writes carry.
    incarnation: u64,
    lease: Option<LeaseId>,
    ttl: i64,
    crashed: bool,
}

#[derive(Default)]
struct Totals {
    steps: u64,
    actions: u64,
    faults: u64,
    ups: u64,
    downs: u64,
    lefts: u64,
    updates: u64,
    invalid: u64,
    joined: u64,
    compactions: u64,
    consumer_stalls: u64,
    /// Requests that landed at etcd after the machine gave up on them.
    late_landed: u64,
}

struct World {
    etcd: ModelEtcd,
    rng: ChaCha8Rng,
    h: Harness<Spy>,
    consumer: Consumer,
    hosts: Vec<Host>,
    now: Instant,
    steps: u64,
    faults: u64,
    compactions: u64,
    stalls: u64,
}

impl World {
    fn check(&mut self) {
        let revision = self.etcd.revision();
        for (_, notice) in self.h.drain_notifications() {
            self.consumer.apply(notice, revision);
        }
        let known: Vec<&KeyValue> = self.h.machine.machine.known().collect();
        let view: Vec<&KeyValue> = self.consumer.view.values().collect();
        assert_eq!(known, view, "known() differs from the notices");
        let _ = self.h.machine.poll_timeout();
    }

    /// Runs every event up to `until` under `faults`, checking after each step.
    fn run_to(&mut self, until: Instant, faults: &Faults) {
        while let Some(t) = next_due(&self.etcd, &mut self.h, until) {
            step(&mut self.etcd, &mut [&mut self.h], t, &mut self.rng, faults);
            self.steps += 1;
            self.check();
        }
        self.now = until;
        self.etcd.advance(until);
        self.pump(faults);
    }

    fn pump(&mut self, faults: &Faults) {
        self.h.pump(&mut self.etcd, self.now, &mut self.rng, faults);
        self.check();
    }

    fn run(&mut self, request: Request) -> Option<Response> {
        self.etcd.execute(self.now, &request).ok()
    }

    /// Healthy hosts renew when half their TTL is gone; a renewal that finds
    /// the lease gone (after a pause) makes the host unregistered.
    fn renew(&mut self) {
        for i in 0..self.hosts.len() {
            let (Some(lease), false) = (self.hosts[i].lease, self.hosts[i].crashed) else {
                continue;
            };
            let half = Duration::from_secs(u64::try_from(self.hosts[i].ttl).unwrap_or(2)) / 2;
            let due = self
                .etcd
                .lease_deadline(lease)
                .is_none_or(|d| d <= self.now + half);
            if due {
                if let Some(Response::KeptAlive { ttl_secs: 0 }) =
                    self.run(Request::KeepAlive { lease })
                {
                    self.hosts[i].lease = None;
                }
            }
        }
        for host in &mut self.hosts {
            if host.lease.is_some_and(|l| !self.etcd.lease_exists(l)) && !self.etcd.is_paused() {
                host.lease = None;
                host.crashed = false;
            }
        }
    }

    fn register(&mut self, i: usize) {
        let ttl = 2 + i64::try_from(pick(&mut self.rng, 4)).unwrap_or(0);
        if let Some(Response::Granted { lease, ttl_secs }) =
            self.run(Request::Grant { ttl_secs: ttl })
        {
            self.hosts[i].lease = Some(lease);
            self.hosts[i].incarnation += 1;
            self.hosts[i].ttl = ttl_secs;
            self.hosts[i].crashed = false;
            self.put_meta(i);
        }
    }

    fn put_meta(&mut self, i: usize) {
        let Some(lease) = self.hosts[i].lease else {
            return;
        };
        let value = format!("meta-{}", pick(&mut self.rng, 5)).into_bytes();
        let key = self.hosts[i].key.clone();
        if pick(&mut self.rng, 2) == 0 {
            // An older writer: no incarnation key.
            self.run(Request::Put { key, value, lease });
            return;
        }
        // As `HostLiveness` writes: the incarnation key first, in the
        // same transaction, on the same lease.
        let incarnation = self.hosts[i].incarnation;
        let write = Request::Txn(Txn {
            compare: vec![],
            success: vec![
                TxnOp::Put {
                    key: incarnation_key(&key),
                    value: incarnation.to_string().into_bytes(),
                    lease,
                },
                TxnOp::Put {
                    key: key.clone(),
                    value,
                    lease,
                },
            ],
            failure: vec![],
        });
        if let Some(Response::Txn { revision, .. }) = self.run(write) {
            self.consumer
                .incarnations
                .written(key, revision, lease, incarnation);
        }
    }

    /// A graceful leave: a third of the time as `HostLiveness::close` does
    /// (one transaction puts the leave marker on the host's lease and
    /// deletes the key, guarded on its mod revision; then the revoke), a
    /// third as older clients did (the marker put, then the revoke), a
    /// third unannounced (an older client still, or a close whose leave
    /// did not get through).
    fn revoke(&mut self, i: usize) {
        if let Some(lease) = self.hosts[i].lease.take() {
            let host = self.hosts[i].key.clone();
            let marker = leave_marker_key(&host);
            let announced = match pick(&mut self.rng, 3) {
                0 => {
                    let revision = self.etcd.get(&host).map_or(0, |kv| kv.mod_revision);
                    let leave = Request::Txn(Txn {
                        compare: vec![Compare::ModRevisionEquals {
                            key: host.clone(),
                            revision,
                        }],
                        success: vec![
                            TxnOp::Put {
                                key: marker,
                                value: Vec::new(),
                                lease,
                            },
                            TxnOp::Delete(KeyRange::Key(host.clone())),
                            TxnOp::Delete(KeyRange::Key(incarnation_key(&host))),
                        ],
                        failure: vec![],
                    });
                    matches!(
                        self.run(leave),
                        Some(Response::Txn {
                            succeeded: true,
                            ..
                        })
                    )
                }
                1 => {
                    let put = Request::Put {
                        key: marker,
                        value: Vec::new(),
                        lease,
                    };
                    self.run(put).is_some()
                }
                _ => false,
            };
            if announced {
                self.consumer.marker_puts.insert((host, lease));
            }
            self.run(Request::Revoke { lease });
        }
    }

    fn workload(&mut self) {
        let i = usize::try_from(pick(&mut self.rng, HOSTS as u64)).unwrap_or(0);
        let registered = self.hosts[i].lease.is_some();
        match pick(&mut self.rng, 7) {
            0 | 1 if !registered => self.register(i),
            0 | 1 => self.put_meta(i),
            2 => self.hosts[i].crashed = true,
            3 => self.revoke(i),
            4 => {
                self.revoke(i);
                self.register(i);
            }
            5 => {
                let key = self.hosts[i].key.clone();
                self.run(Request::Delete(KeyRange::Key(key)));
            }
            _ => {
                let mut key = PREFIX.to_vec();
                key.extend_from_slice(if i % 2 == 0 {
                    b"not-a-host"
                } else {
                    b"0F0E0D0C-0B0A-0908-0706-050403020100"
                });
                let request = if pick(&mut self.rng, 2) == 0 {
                    Request::Put {
                        key,
                        value: b"junk".to_vec(),
                        lease: 0,
                    }
                } else {
                    Request::Delete(fleetcoord_sm::KeyRange::Key(key))
                };
                self.run(request);
            }
        }
    }
}

fn host_key(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut hex = format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64());
    for at in [8, 13, 18, 23] {
        hex.insert(at, '-');
    }
    let mut key = PREFIX.to_vec();
    key.extend_from_slice(hex.as_bytes());
    key
}

fn run_seed(seed: u64, totals: &mut Totals) {
    let mut rng = rng(seed);
    let start = Instant::now();
    let hosts = (0..HOSTS)
        .map(|_| Host {
            key: host_key(&mut rng),
            incarnation: 0,
            lease: None,
            ttl: 2,
            crashed: false,
        })
        .collect();
    let faults = Faults {
        fail_request: 0.25 * (pick(&mut rng, 100) as f64 / 100.0),
        lose_reply: 0.1 * (pick(&mut rng, 100) as f64 / 100.0),
        latency: (ms(1), ms(1 + pick(&mut rng, 40))),
        land_late: 0.06 * (pick(&mut rng, 100) as f64 / 100.0),
        late_by: (ms(50), ms(3_000)),
    };
    let config = WatchConfig {
        prefix: PREFIX.to_vec(),
        keys: KeyRule::HostId,
        backoff: BackoffConfig::default(),
        // Small pages, so snapshots span several (and compactions and
        // faults land between them).
        page_size: 1 + pick(&mut rng, 4) as i64,
    };
    let spy = Spy {
        machine: Watch::new(config, start, seed),
        last_now: start,
        outstanding: BTreeSet::new(),
        stopped: false,
    };
    let mut w = World {
        etcd: ModelEtcd::new(),
        rng,
        h: Harness::new(spy),
        consumer: Consumer::default(),
        hosts,
        now: start,
        steps: 0,
        faults: 0,
        compactions: 0,
        stalls: 0,
    };
    // Some hosts exist before the watcher starts, so there is a replay.
    for _ in 0..pick(&mut w.rng, 2 * HOSTS as u64) {
        w.workload();
    }
    w.pump(&faults);

    let mut paused_until: Option<Instant> = None;
    let mut full_until: Option<Instant> = None;
    // Sometimes the consumer is full before the first snapshot arrives.
    if pick(&mut w.rng, 8) == 0 {
        w.h.machine.handle(w.now, WatchInput::ConsumerFull);
        full_until = Some(w.now + ms(pick(&mut w.rng, 1000)));
        w.stalls += 1;
        w.pump(&faults);
    }
    let actions = 50 + pick(&mut w.rng, 150);
    for _ in 0..actions {
        let next = w.now + ms(pick(&mut w.rng, 400));
        w.run_to(next, &faults);
        if paused_until.is_some_and(|t| t <= w.now) {
            paused_until = None;
            w.etcd.resume(w.now);
        }
        if full_until.is_some_and(|t| t <= w.now) {
            full_until = None;
            w.h.machine.handle(w.now, WatchInput::ConsumerReady);
        }
        w.renew();
        if !w.etcd.is_paused() {
            w.workload();
        }
        match pick(&mut w.rng, 40) {
            0 => {
                w.h.drop_streams(w.now);
                w.faults += 1;
            }
            1 => {
                w.h.lose_all_inflight();
                w.faults += 1;
            }
            2 | 3 => {
                let back = i64::try_from(pick(&mut w.rng, 3)).unwrap_or(0);
                w.etcd.compact(w.etcd.revision() - back);
                w.faults += 1;
                w.compactions += 1;
            }
            4 if paused_until.is_none() => {
                w.etcd.pause();
                paused_until = Some(w.now + ms(200 + pick(&mut w.rng, 6000)));
                w.faults += 1;
            }
            5 => {
                w.etcd.extend_all_leases(w.now);
                w.faults += 1;
            }
            6 | 7 if full_until.is_none() => {
                w.h.machine.handle(w.now, WatchInput::ConsumerFull);
                full_until = Some(w.now + ms(pick(&mut w.rng, 3000)));
                w.faults += 1;
                w.stalls += 1;
            }
            _ => {}
        }
        w.pump(&faults);
    }

    // Faults stop; hosts keep renewing; nothing else is written.
    if paused_until.is_some() {
        w.etcd.resume(w.now);
    }
    if full_until.is_some() {
        w.h.machine.handle(w.now, WatchInput::ConsumerReady);
    }
    let quiet = Faults::none();
    w.pump(&quiet);
    for _ in 0..60 {
        let next = w.now + ms(200);
        w.run_to(next, &quiet);
        w.renew();
        w.pump(&quiet);
    }
    let expected: Vec<KeyValue> = w
        .etcd
        .range_prefix(PREFIX)
        .into_iter()
        .filter(|kv| is_valid(&kv.key))
        .collect();
    let view: Vec<KeyValue> = w.consumer.view.values().cloned().collect();
    assert_eq!(
        view, expected,
        "seed {seed}: settled view differs from etcd"
    );
    assert_eq!(w.consumer.synced, 1, "seed {seed}: Synced not exactly once");
    assert!(
        w.h.machine.machine.is_live(),
        "seed {seed}: not live after settling"
    );

    // Stop: the watch is canceled, no timer, nothing sent afterwards.
    let sent = w.h.requests_sent;
    w.h.machine.handle(w.now, WatchInput::Stop);
    w.pump(&quiet);
    assert_eq!(
        w.h.active_watches(),
        0,
        "seed {seed}: watch left open after Stop"
    );
    w.workload();
    let until = w.now + Duration::from_secs(10);
    w.run_to(until, &quiet);
    assert_eq!(w.h.requests_sent, sent, "seed {seed}: requests after Stop");
    assert_eq!(w.h.machine.poll_timeout(), None);

    totals.steps += w.steps;
    totals.actions += actions;
    totals.faults += w.faults + w.h.faults_injected;
    totals.late_landed += w.h.late_landed;
    totals.ups += w.consumer.ups;
    totals.downs += w.consumer.downs;
    totals.lefts += w.consumer.lefts;
    totals.updates += w.consumer.updates;
    totals.invalid += w.consumer.invalid;
    totals.joined += w.consumer.incarnations.joined();
    totals.compactions += w.compactions;
    totals.consumer_stalls += w.stalls;
}

#[test]
fn watch_converges_to_etcd_under_faults_over_many_seeds() {
    let mut totals = Totals::default();
    for seed in 0..SEEDS {
        run_seed(seed, &mut totals);
    }
    println!(
        "watch sim: {SEEDS} seeds, {} steps + {} workload actions, {} faults injected ({} compactions, {} consumer stalls), \
         {} requests landed late ({:.2} per seed); \
         notices: {} Up, {} Updated, {} Down, {} Left, {} InvalidKey, {} with an incarnation",
        totals.steps,
        totals.actions,
        totals.faults,
        totals.compactions,
        totals.consumer_stalls,
        totals.late_landed,
        totals.late_landed as f64 / SEEDS as f64,
        totals.ups,
        totals.updates,
        totals.downs,
        totals.lefts,
        totals.invalid,
        totals.joined
    );
    // The workload must actually exercise every kind of notice and fault.
    assert!(totals.downs > SEEDS && totals.updates > SEEDS && totals.invalid > SEEDS / 2);
    assert!(totals.lefts > SEEDS / 2, "leaves are rarely seen as Left");
    assert!(totals.joined > SEEDS, "incarnations are rarely told");
    assert!(totals.compactions > SEEDS && totals.consumer_stalls > SEEDS);
    assert!(
        totals.late_landed > 0,
        "no request landed late: the fault was never exercised"
    );
}
