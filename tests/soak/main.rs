//! Soak: a randomized fault run on a 3-member etcd cluster with every
//! primitive busy at once, and a checker over the recorded history.
//!
//! Actors (each on its own connection, behind fault proxies, one per
//! member, unless said otherwise):
//! * three election candidates that campaign, hold for a random while with
//!   fenced writes every 20 ms, resign, and try one more fenced write after
//!   losing;
//! * a churner registering and closing four hosts at random;
//! * a HostWatcher (direct connection) mirroring the hosts;
//! * two stream appenders (one coordinator, behind proxies) and a reader per
//!   stream (direct connection);
//! * four semaphore contenders on one semaphore of [`PERMITS`] permits,
//!   three on the candidates' connections (so a candidate's partition cuts
//!   one off too) and one on the churner's, that acquire with a timeout,
//!   hold for a random while and release;
//! * a shard map whose members join, leave and crash one at a time, each
//!   behind its own proxies, with its own checker (`shard_workload.rs`);
//! * four handles of one read-write lock, on the contenders' connections,
//!   taking reads and the write at random with fenced writes, and a final
//!   bounded acquire each once the faults stopped, with their own checker
//!   (`rwlock_workload.rs`: writers exclude every holder, by effects and
//!   by beliefs apart; readers share; stale guards refused; liveness).
//!
//! The nemesis picks one fault per round (seeded; `SOAK_SEED` replays a
//! run): partition a candidate (past the TTL or not), partition the
//! churner, pause a member, pause the raft leader past the TTL and resume
//! it (etcd may then revoke leases their holders kept renewing,
//! etcd-io/etcd#15247), kill and restart a member, reset every proxied
//! connection, restart a candidate's client. After healing, a quiet period
//! checks that the watcher's view equals etcd's hosts. Raw etcd-client
//! watches (one per member, `../common/raw_history.rs`) record every
//! change of the candidates' and contenders' keys. At the end the
//! checker (`history.rs`) verifies: no overlapping leadership and never
//! more than [`PERMITS`] semaphore contenders believing they hold at once,
//! except where etcd deleted a holder's key while its session was still
//! trusted (a server early revocation: printed with its evidence, not a
//! failure); no belief seen after the holder's own fenced call was
//! refused; tokens increase, stale fenced writes refused, stream entries
//! read exactly once in order. And liveness (`common/liveness.rs`), printed as distributions
//! and bounded: leaderless time while a candidate waits (at most
//! 2 × TTL + 2 s beyond the time etcd itself had no raft leader, plus a TTL
//! for every raft leader elected meanwhile, since each extends every lease
//! to a full TTL; after a
//! resign, at most 1 s beyond the fault windows),
//! every timed call back within its bound + 1 s, the watcher converged
//! within [`CONVERGE`] of each heal, and readers' lag behind an
//! acknowledged append within [`LAG`], and a free permit taken within the
//! election's bound while a contender waits. `SOAK_ROUNDS` sets the length
//! (`make soak`; `make test` runs a few rounds).

#[path = "../common/belief.rs"]
mod belief;
#[path = "../common/mod.rs"]
mod common;
mod history;
#[path = "../common/liveness.rs"]
mod liveness;
#[path = "../common/raw_history.rs"]
mod raw_history;
mod rwlock_workload;
mod shard_workload;
#[path = "../common/shards.rs"]
mod shards;

use fleetcoord::coordinator::{Coordinator, EtcdCoordinator, StreamPosition};
use fleetcoord::testing::{EtcdCluster, FaultProxy, Mode};
use fleetcoord::{
    list_hosts, Election, ElectionOptions, Etcd, EtcdOptions, HostEvent, HostInfo, HostLiveness,
    HostWatcher, LivenessOptions, Semaphore, TxnOp, TxnOpResponse, DEFAULT_HOSTS_PREFIX,
    DEFAULT_SEMAPHORE_PREFIX,
};
use history::{FencedWrite, History, Permit, StreamLog, Tenure};
use liveness::{Held, Outage, Timed, Waited};
use parking_lot::Mutex;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use raw_history::RawHistory;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use uuid::Uuid;

const TTL: Duration = Duration::from_secs(2);
const CANDIDATES: usize = 3;
const HOST_SLOTS: usize = 4;
const STREAMS: usize = 2;
/// The permits of the soak's semaphore, and how many contend for them.
const PERMITS: u32 = 2;
const CONTENDERS: usize = 4;
const FENCE_KEY: &str = "/soak/fence";
/// How long the watcher may take to equal etcd after a fault healed:
/// a partitioned host's lease must first expire (TTL), and a restarted
/// member must rejoin.
const CONVERGE: Duration = Duration::from_secs(20);
/// How long after its append was acknowledged a reader may read an entry.
const LAG: Duration = Duration::from_secs(10);
/// The candidates' request timeout (see [`options`]), the bound of a resign.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// What a campaign of the soak waits at most.
const CAMPAIGN: Duration = Duration::from_secs(1);
/// What the liveness contract allows on top of a call's bound.
const SLACK: Duration = Duration::from_secs(1);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Uniform in `[lo, hi)` milliseconds.
fn between(rng: &mut ChaCha8Rng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(lo + rng.next_u64() % (hi - lo).max(1))
}

/// One client's way to the cluster: a proxy in front of every member.
struct Net {
    proxies: Vec<FaultProxy>,
}

impl Net {
    fn new(cluster: &EtcdCluster) -> Net {
        Net {
            proxies: cluster
                .endpoints()
                .iter()
                .map(|e| FaultProxy::start(e).expect("fault proxy"))
                .collect(),
        }
    }

    fn endpoints(&self) -> Vec<String> {
        self.proxies.iter().map(FaultProxy::endpoint).collect()
    }

    fn set(&self, mode: Mode) {
        for p in &self.proxies {
            p.set_mode(mode);
        }
    }

    fn reset(&self) {
        for p in &self.proxies {
            p.reset_all();
        }
    }
}

fn options() -> EtcdOptions {
    EtcdOptions::default().with_request_timeout(REQUEST_TIMEOUT)
}

/// What the liveness checker reads: when things happened.
#[derive(Default)]
struct Timeline {
    /// What each candidate did and when, for the report of a long gap:
    /// campaign outcomes, resigns, client restarts.
    actions: Vec<(Instant, usize, String)>,
    held: Vec<Held>,
    waited: Vec<Waited>,
    timed: Vec<Timed>,
    /// Per stream, when each id was acknowledged and when it was read.
    acked_at: Vec<HashMap<u64, Instant>>,
    read_at: Vec<HashMap<u64, Instant>>,
    /// Each fault's window: from its start until a second after it healed
    /// (a TTL more for a partition: the candidate's lease must expire).
    faults: Vec<Outage>,
    /// When etcd had no raft leader (a killed or paused leader, until a new
    /// one was seen): no client can elect anyone then.
    leaderless_etcd: Vec<Outage>,
    convergence: Vec<Duration>,
    /// Each contender's calls of `acquire_timeout`, from call to return.
    permit_waits: Vec<Waited>,
    /// Each contender's holds, from `acquire_timeout`'s return to the last
    /// `is_held()` seen true.
    permit_holds: Vec<Held>,
}

/// Connects, retrying: a client restarted during a fault may need a while.
fn connect(endpoints: &[String], stop: &AtomicBool) -> Option<Etcd> {
    while !stop.load(Ordering::SeqCst) {
        match Etcd::with_options(endpoints, options()) {
            Ok(etcd) => return Some(etcd),
            Err(_) => thread::sleep(Duration::from_millis(100)),
        }
    }
    None
}

struct Shared {
    stop: AtomicBool,
    history: Mutex<History>,
    restart: Vec<AtomicBool>,
    /// Held by the churner while it changes hosts; the checker takes it to
    /// freeze the fleet during a quiet period.
    churn: Mutex<()>,
    view: Mutex<HashMap<Uuid, HostInfo>>,
    violations: Mutex<Vec<String>>,
    /// Set at the end: the newest acknowledged id of each stream, which
    /// its reader must reach before it stops.
    targets: Mutex<Vec<Option<u64>>>,
    timeline: Mutex<Timeline>,
}

/// How long a reader may take to catch up at the end.
const CATCH_UP: Duration = Duration::from_secs(30);

/// One fenced write; true when etcd refused it (the leadership's key is
/// gone: the evidence a holder can see).
fn fenced_write(leadership: &fleetcoord::Leadership, shared: &Shared) -> bool {
    let token = leadership.fencing_token();
    let ops = [
        TxnOp::put(FENCE_KEY, token.to_string()),
        TxnOp::get(FENCE_KEY),
    ];
    match leadership.txn_if_leader(ops) {
        Ok(Some(responses)) => {
            if let Some(TxnOpResponse::Get { kvs }) = responses.get(1) {
                if let Some(kv) = kvs.first() {
                    shared.history.lock().writes.push(FencedWrite {
                        token,
                        revision: kv.mod_revision,
                    });
                }
            }
            false
        }
        Ok(None) => true,
        Err(_) => false,
    }
}

/// Appends `until` to `samples` if it differs from the last one.
fn sample(samples: &mut Vec<(Instant, Option<Instant>)>, at: Instant, until: Option<Instant>) {
    if samples.last().map(|(_, v)| *v) != Some(until) {
        samples.push((at, until));
    }
}

fn candidate(i: usize, endpoints: Vec<String>, shared: Arc<Shared>, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let value = format!("candidate-{i}");
    'client: while !shared.stop.load(Ordering::SeqCst) {
        let Some(etcd) = connect(&endpoints, &shared.stop) else {
            return;
        };
        let Ok(election) =
            Election::with_options(&etcd, "soak", ElectionOptions::default().with_ttl(TTL))
        else {
            continue;
        };
        while !shared.stop.load(Ordering::SeqCst) {
            if shared.restart[i].swap(false, Ordering::SeqCst) {
                shared
                    .timeline
                    .lock()
                    .actions
                    .push((Instant::now(), i, "client restarted".into()));
                drop(election);
                let _ = etcd.close();
                continue 'client;
            }
            let asked = Instant::now();
            shared
                .timeline
                .lock()
                .actions
                .push((asked, i, "campaign started".into()));
            let result = election.campaign_timeout(value.as_bytes(), CAMPAIGN);
            let returned = Instant::now();
            {
                let mut t = shared.timeline.lock();
                t.waited.push(Waited {
                    candidate: i,
                    from: asked,
                    to: returned,
                });
                t.timed.push(Timed {
                    what: "campaign_timeout(1s)",
                    took: returned - asked,
                    bound: CAMPAIGN,
                });
            }
            let leadership = match result {
                Ok(l) => l,
                Err(e) => {
                    let what = match e {
                        fleetcoord::Error::Timeout(_) => "campaign timed out".to_string(),
                        e => format!("campaign failed: {e}"),
                    };
                    shared.timeline.lock().actions.push((returned, i, what));
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            shared.timeline.lock().actions.push((
                returned,
                i,
                format!(
                    "elected, token {}, held at return: {}",
                    leadership.fencing_token(),
                    leadership.is_held()
                ),
            ));
            let elected_at = returned;
            let mut last_held_at = elected_at;
            let mut trusted = Vec::new();
            let mut first_refusal = None;
            let hold_until = elected_at + between(&mut rng, 200, 1500);
            while !shared.stop.load(Ordering::SeqCst) && Instant::now() < hold_until {
                // Taken before the check: the flag only ever turns false,
                // so it was held at `t` too.
                let t = Instant::now();
                let held = leadership.is_held();
                sample(&mut trusted, t, election.session_trusted_until());
                if !held {
                    shared
                        .timeline
                        .lock()
                        .actions
                        .push((t, i, "no longer held".into()));
                    break;
                }
                last_held_at = t;
                if fenced_write(&leadership, &shared) && first_refusal.is_none() {
                    let at = Instant::now();
                    first_refusal = Some(at);
                    shared
                        .timeline
                        .lock()
                        .actions
                        .push((at, i, "fenced write refused".into()));
                }
                thread::sleep(Duration::from_millis(20));
            }
            let lost = !leadership.is_held();
            shared.history.lock().tenures.push(Tenure {
                candidate: i,
                token: leadership.fencing_token(),
                key: leadership.key().to_string(),
                elected_at,
                last_held_at,
                lost,
                trusted,
                first_refusal,
            });
            if lost {
                // Deposed: etcd must refuse this unless no newer leader
                // has written yet (the checker orders writes by revision).
                fenced_write(&leadership, &shared);
            }
            let resign_at = Instant::now();
            let resigned = leadership.resign();
            let mut t = shared.timeline.lock();
            let what = match resigned {
                Ok(()) => format!("resigned in {:.0?}", resign_at.elapsed()),
                Err(e) => format!("resign failed after {:.0?}: {e}", resign_at.elapsed()),
            };
            t.actions.push((resign_at, i, what));
            t.held.push(Held {
                candidate: i,
                from: elected_at,
                to: if lost { last_held_at } else { resign_at },
                resigned: !lost,
            });
            t.timed.push(Timed {
                what: "resign",
                took: resign_at.elapsed(),
                bound: REQUEST_TIMEOUT,
            });
        }
    }
}

/// A semaphore contender: acquire (bounded), hold a while checking the
/// belief, release; the checker counts believed holders at every instant.
fn contender(i: usize, endpoints: Vec<String>, shared: Arc<Shared>, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let options = fleetcoord::LockOptions::default().with_ttl(TTL);
    'client: while !shared.stop.load(Ordering::SeqCst) {
        let Some(etcd) = connect(&endpoints, &shared.stop) else {
            return;
        };
        let semaphore = match Semaphore::with_options(&etcd, "soak", PERMITS, options.clone()) {
            Ok(s) => s,
            // The mismatch read failed under a fault: a new connection.
            Err(_) => {
                thread::sleep(Duration::from_millis(100));
                continue 'client;
            }
        };
        while !shared.stop.load(Ordering::SeqCst) {
            let asked = Instant::now();
            let result = semaphore.acquire_timeout(CAMPAIGN);
            let returned = Instant::now();
            {
                let mut t = shared.timeline.lock();
                t.permit_waits.push(Waited {
                    candidate: i,
                    from: asked,
                    to: returned,
                });
                t.timed.push(Timed {
                    what: "acquire_timeout(1s)",
                    took: returned - asked,
                    bound: CAMPAIGN,
                });
            }
            let Ok(guard) = result else {
                thread::sleep(Duration::from_millis(50));
                continue;
            };
            let mut last_held_at = returned;
            let mut trusted = Vec::new();
            let mut first_refusal = None;
            let mut lost = false;
            let hold_until = returned + between(&mut rng, 100, 1200);
            while !shared.stop.load(Ordering::SeqCst) && Instant::now() < hold_until {
                // Taken before the check, as a candidate's: held at `t` too.
                let t = Instant::now();
                let held = guard.is_held();
                sample(&mut trusted, t, semaphore.session_trusted_until());
                if !held {
                    lost = true;
                    break;
                }
                last_held_at = t;
                // A fenced "do I still hold?": a refusal is the evidence
                // the holder can see that its key is gone.
                if matches!(guard.txn_if_held([]), Ok(None)) && first_refusal.is_none() {
                    first_refusal = Some(Instant::now());
                }
                thread::sleep(Duration::from_millis(20));
            }
            shared.history.lock().permits.push(Permit {
                contender: i,
                token: guard.fencing_token(),
                key: guard.key().to_string(),
                from: returned,
                last_held_at,
                lost,
                trusted,
                first_refusal,
            });
            let released_at = Instant::now();
            let _ = guard.release();
            let mut t = shared.timeline.lock();
            t.permit_holds.push(Held {
                candidate: i,
                from: returned,
                to: last_held_at,
                resigned: true,
            });
            t.timed.push(Timed {
                what: "release",
                took: released_at.elapsed(),
                bound: REQUEST_TIMEOUT,
            });
        }
    }
}

fn churner(endpoints: Vec<String>, shared: Arc<Shared>, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let Some(etcd) = connect(&endpoints, &shared.stop) else {
        return;
    };
    let ids: Vec<Uuid> = (0..HOST_SLOTS).map(|_| Uuid::new_v4()).collect();
    let mut hosts: Vec<Option<HostLiveness>> = (0..HOST_SLOTS).map(|_| None).collect();
    let options = LivenessOptions::default()
        .with_ttl(TTL)
        .with_register_timeout(Duration::from_secs(3));
    while !shared.stop.load(Ordering::SeqCst) {
        thread::sleep(between(&mut rng, 100, 400));
        let _churning = shared.churn.lock();
        let slot = (rng.next_u64() % HOST_SLOTS as u64) as usize;
        match hosts[slot].take() {
            Some(host) => {
                let _ = host.close();
            }
            None => {
                let meta = format!("{{\"n\":{}}}", rng.next_u64() % 1000);
                hosts[slot] =
                    HostLiveness::with_options(&etcd, ids[slot], meta.as_bytes(), options.clone())
                        .ok();
            }
        }
    }
    for host in hosts.into_iter().flatten() {
        let _ = host.close();
    }
}

fn watcher(etcd: Etcd, shared: Arc<Shared>) {
    let watcher = HostWatcher::watch(&etcd).expect("host watcher");
    while !shared.stop.load(Ordering::SeqCst) {
        match watcher.events().recv_timeout(Duration::from_millis(100)) {
            Ok(HostEvent::Synced) => {}
            Ok(event) => common::apply(&mut shared.view.lock(), event),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                shared
                    .violations
                    .lock()
                    .push("the host watcher's events ended".into());
                return;
            }
        }
    }
}

fn appender(s: usize, coord: Arc<EtcdCoordinator>, shared: Arc<Shared>) {
    let mut n = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        n += 1;
        let payload = format!("s{s}-{n}").into_bytes();
        match coord.append_stream(&format!("soak-{s}"), &payload) {
            Ok(id) => {
                shared.history.lock().streams[s].acked.insert(id.0, payload);
                shared.timeline.lock().acked_at[s].insert(id.0, Instant::now());
            }
            Err(_) => shared.history.lock().streams[s].unacked.push(payload),
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn reader(s: usize, coord: EtcdCoordinator, shared: Arc<Shared>) {
    let reader = coord
        .read_stream(&format!("soak-{s}"), StreamPosition::Start)
        .expect("stream reader");
    let mut read: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut catching_up: Option<Instant> = None;
    loop {
        if let Some(target) = shared.targets.lock()[s] {
            let since = *catching_up.get_or_insert_with(Instant::now);
            let last = read.last().map_or(0, |(id, _)| *id);
            if last >= target || since.elapsed() > CATCH_UP {
                break;
            }
        }
        match reader.recv_timeout(Duration::from_millis(100)) {
            Ok(entry) => {
                shared.timeline.lock().read_at[s].insert(entry.id.0, Instant::now());
                read.push((entry.id.0, entry.payload));
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                shared
                    .violations
                    .lock()
                    .push(format!("stream {s}: the reader's feed ended"));
                break;
            }
        }
    }
    shared.history.lock().streams[s].reads.push(read);
}

/// Whether the watcher's view equals etcd's hosts, waiting up to
/// [`CONVERGE`] with the churner frozen.
fn converged(etcd: &Etcd, shared: &Shared) -> Result<Duration, String> {
    let _frozen = shared.churn.lock();
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < CONVERGE {
        if let Ok(hosts) = list_hosts(etcd, DEFAULT_HOSTS_PREFIX) {
            let actual: BTreeMap<Uuid, Vec<u8>> =
                hosts.into_iter().map(|h| (h.id, h.metadata)).collect();
            let view: BTreeMap<Uuid, Vec<u8>> = shared
                .view
                .lock()
                .iter()
                .map(|(id, h)| (*id, h.metadata.clone()))
                .collect();
            if actual == view {
                return Ok(start.elapsed());
            }
            last = format!("etcd {:?} vs watcher {:?}", actual.keys(), view.keys());
        }
        thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "watcher did not converge within {CONVERGE:?}: {last}"
    ))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    PartitionLeaderPastTtl,
    /// The raft leader SIGSTOPped past the TTL, then resumed: the resumed
    /// ex-leader may revoke leases that clients kept renewing with the new
    /// leader (etcd-io/etcd#15247; issue 33).
    PauseRaftLeaderPastTtl,
    PartitionCandidate,
    PartitionChurner,
    PauseMember,
    KillMember,
    /// The raft leader, SIGKILLed and restarted (issue 23's scenario, one
    /// round at a time).
    KillLeader,
    ResetConnections,
    RestartClient,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::PartitionLeaderPastTtl => "PartitionLeaderPastTtl",
            Fault::PauseRaftLeaderPastTtl => "PauseRaftLeaderPastTtl",
            Fault::PartitionCandidate => "PartitionCandidate",
            Fault::PartitionChurner => "PartitionChurner",
            Fault::PauseMember => "PauseMember",
            Fault::KillMember => "KillMember",
            Fault::KillLeader => "KillLeader",
            Fault::ResetConnections => "ResetConnections",
            Fault::RestartClient => "RestartClient",
        }
    }
}

const FAULTS: [Fault; 9] = [
    Fault::PartitionLeaderPastTtl,
    Fault::PauseRaftLeaderPastTtl,
    Fault::PartitionCandidate,
    Fault::PartitionChurner,
    Fault::PauseMember,
    Fault::KillMember,
    Fault::KillLeader,
    Fault::ResetConnections,
    Fault::RestartClient,
];

#[test]
fn soak() {
    let rounds = env_u64("SOAK_ROUNDS").unwrap_or(6);
    let seed = env_u64("SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    println!("soak: {rounds} rounds, SOAK_SEED={seed}");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut cluster = EtcdCluster::start(3).unwrap_or_else(|e| {
        panic!(
            "cannot start a 3-member etcd cluster ({e}); {}",
            common::INSTALL
        )
    });
    let direct = Etcd::with_options(&cluster.endpoints(), options()).expect("connect");
    // The run's clock zero, and the independent history of the
    // candidates' and contenders' keys (raw watches, one per member).
    let origin = Instant::now();
    let election_prefix = format!("{}soak/", ElectionOptions::default().prefix);
    let semaphore_prefix = format!("{DEFAULT_SEMAPHORE_PREFIX}soak/");
    let shards_prefix = shard_workload::shards_prefix();
    let rwlock_prefix = rwlock_workload::prefix();
    let watches = RawHistory::start(
        &cluster.endpoints(),
        &[
            election_prefix.as_str(),
            semaphore_prefix.as_str(),
            shards_prefix.as_str(),
            rwlock_prefix.as_str(),
        ],
    );
    let rw = Arc::new(rwlock_workload::Control::new());

    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        history: Mutex::new(History {
            streams: (0..STREAMS).map(|_| StreamLog::default()).collect(),
            ..History::default()
        }),
        restart: (0..CANDIDATES).map(|_| AtomicBool::new(false)).collect(),
        churn: Mutex::new(()),
        view: Mutex::new(HashMap::new()),
        violations: Mutex::new(Vec::new()),
        targets: Mutex::new(vec![None; STREAMS]),
        timeline: Mutex::new(Timeline {
            acked_at: vec![HashMap::new(); STREAMS],
            read_at: vec![HashMap::new(); STREAMS],
            ..Timeline::default()
        }),
    });
    let candidate_nets: Vec<Net> = (0..CANDIDATES).map(|_| Net::new(&cluster)).collect();
    let churner_net = Net::new(&cluster);
    let stream_net = Net::new(&cluster);
    let shard_nets: Arc<Vec<Net>> = Arc::new(
        (0..shard_workload::SLOTS)
            .map(|_| Net::new(&cluster))
            .collect(),
    );
    let shard_log = Arc::new(Mutex::new(shards::Log::default()));
    let shard_record = Arc::new(Mutex::new(shard_workload::Record::default()));

    let mut threads = Vec::new();
    for (i, net) in candidate_nets.iter().enumerate() {
        let (endpoints, shared, s) = (net.endpoints(), shared.clone(), rng.next_u64());
        threads.push(thread::spawn(move || candidate(i, endpoints, shared, s)));
    }
    {
        let (endpoints, shared, s) = (churner_net.endpoints(), shared.clone(), rng.next_u64());
        threads.push(thread::spawn(move || churner(endpoints, shared, s)));
    }
    for i in 0..CONTENDERS {
        let net = candidate_nets.get(i).unwrap_or(&churner_net);
        let (endpoints, shared, s) = (net.endpoints(), shared.clone(), rng.next_u64());
        threads.push(thread::spawn(move || contender(i, endpoints, shared, s)));
    }
    for i in 0..rwlock_workload::ACTORS {
        let net = candidate_nets.get(i).unwrap_or(&churner_net);
        let (endpoints, shared, rw, s) =
            (net.endpoints(), shared.clone(), rw.clone(), rng.next_u64());
        threads.push(thread::spawn(move || {
            rwlock_workload::actor(i, endpoints, shared, rw, s)
        }));
    }
    {
        let (etcd, shared) = (direct.clone(), shared.clone());
        threads.push(thread::spawn(move || watcher(etcd, shared)));
    }
    {
        let (nets, etcd, log, record, shared, s) = (
            shard_nets.clone(),
            direct.clone(),
            shard_log.clone(),
            shard_record.clone(),
            shared.clone(),
            rng.next_u64(),
        );
        threads.push(thread::spawn(move || {
            shard_workload::run(nets, etcd, log, record, &shared.stop, s)
        }));
    }
    let appending = Etcd::with_options(&stream_net.endpoints(), options()).expect("connect");
    let append_coord = Arc::new(EtcdCoordinator::on_etcd(&appending).expect("coordinator"));
    let mut appenders = Vec::new();
    let mut readers = Vec::new();
    for s in 0..STREAMS {
        let (coord, sh) = (append_coord.clone(), shared.clone());
        appenders.push(thread::spawn(move || appender(s, coord, sh)));
        let (coord, sh) = (
            EtcdCoordinator::on_etcd(&direct).expect("coordinator"),
            shared.clone(),
        );
        readers.push(thread::spawn(move || reader(s, coord, sh)));
    }

    let started = Instant::now();
    let mut faults: BTreeMap<Fault, usize> = BTreeMap::new();
    let mut slowest_convergence = Duration::ZERO;
    let mut members_diverged = false;
    for round in 0..rounds {
        let fault = FAULTS[(rng.next_u64() % FAULTS.len() as u64) as usize];
        *faults.entry(fault).or_default() += 1;
        let fault_from = Instant::now();
        match fault {
            Fault::PartitionLeaderPastTtl | Fault::PartitionCandidate => {
                let c = (rng.next_u64() % CANDIDATES as u64) as usize;
                let how_long = if fault == Fault::PartitionLeaderPastTtl {
                    TTL + between(&mut rng, 300, 1500)
                } else {
                    between(&mut rng, 200, 1500)
                };
                candidate_nets[c].set(Mode::Blackhole);
                thread::sleep(how_long);
                candidate_nets[c].set(Mode::Pass);
            }
            Fault::PartitionChurner => {
                churner_net.set(Mode::Blackhole);
                stream_net.set(Mode::Blackhole);
                thread::sleep(between(&mut rng, 500, 3500));
                churner_net.set(Mode::Pass);
                stream_net.set(Mode::Pass);
            }
            Fault::PauseMember => {
                let m = (rng.next_u64() % 3) as usize;
                let was_leader = cluster.leader_index().ok() == Some(m);
                cluster.pause(m).expect("pause");
                thread::sleep(between(&mut rng, 200, 2000));
                cluster.resume(m).expect("resume");
                if was_leader {
                    etcd_leaderless(&cluster, fault_from, fault.name(), &shared);
                }
            }
            Fault::PauseRaftLeaderPastTtl => {
                let m = cluster.leader_index().expect("a raft leader");
                let how_long = TTL + between(&mut rng, 300, 1500);
                cluster.pause(m).expect("pause");
                // etcd's outage: until the other two elect a leader.
                etcd_leaderless(&cluster, fault_from, fault.name(), &shared);
                thread::sleep(how_long.saturating_sub(fault_from.elapsed()));
                cluster.resume(m).expect("resume");
            }
            Fault::KillMember => {
                let m = (rng.next_u64() % 3) as usize;
                let was_leader = cluster.leader_index().ok() == Some(m);
                cluster.kill(m).expect("kill");
                if was_leader {
                    etcd_leaderless(&cluster, fault_from, fault.name(), &shared);
                }
                thread::sleep(between(&mut rng, 200, 1500));
                cluster.restart(m).expect("restart");
            }
            Fault::KillLeader => {
                let m = cluster.leader_index().expect("a raft leader");
                cluster.kill(m).expect("kill");
                etcd_leaderless(&cluster, fault_from, fault.name(), &shared);
                thread::sleep(between(&mut rng, 200, 1500));
                cluster.restart(m).expect("restart");
            }
            Fault::ResetConnections => {
                let others = [&churner_net, &stream_net];
                for net in candidate_nets.iter().chain(others).chain(shard_nets.iter()) {
                    net.reset();
                }
                thread::sleep(between(&mut rng, 100, 500));
            }
            Fault::RestartClient => {
                let c = (rng.next_u64() % CANDIDATES as u64) as usize;
                shared.restart[c].store(true, Ordering::SeqCst);
                thread::sleep(between(&mut rng, 100, 800));
            }
        }
        // A restarted member must hold the same data as the others: if it
        // does not, etcd itself lost or reordered writes (etcd 3.5.0–3.5.2
        // can, etcd-io/etcd#13766), and the history's violations that
        // follow are not the client's. Reported once, at the first round.
        if matches!(fault, Fault::KillMember | Fault::KillLeader) && !members_diverged {
            match cluster.member_hashes() {
                Ok(hashes) if hashes.iter().all(|h| h.hash == hashes[0].hash) => {}
                Ok(hashes) => {
                    members_diverged = true;
                    shared.violations.lock().push(format!(
                        "round {round} ({fault:?}): etcd's members diverged: their keys hash \
                         differently at one revision ({hashes:?})"
                    ));
                }
                Err(e) => shared.violations.lock().push(format!(
                    "round {round} ({fault:?}): hashing the members: {e}"
                )),
            }
        }
        // Until a second after the heal; a partitioned candidate's lease
        // must first expire, one TTL more.
        let partition = matches!(
            fault,
            Fault::PartitionLeaderPastTtl | Fault::PartitionCandidate | Fault::RestartClient
        );
        let after = Duration::from_secs(1) + if partition { TTL } else { Duration::ZERO };
        shared.timeline.lock().faults.push(Outage {
            from: fault_from,
            to: Instant::now() + after,
            what: fault.name(),
        });
        match converged(&direct, &shared) {
            Ok(took) => {
                slowest_convergence = slowest_convergence.max(took);
                shared.timeline.lock().convergence.push(took);
            }
            Err(e) => shared
                .violations
                .lock()
                .push(format!("round {round} ({fault:?}): {e}")),
        }
    }

    // The faults have stopped (the last one healed, the watcher
    // converged): each read-write lock handle takes the write and a read
    // once more, bounded.
    rw.final_phase.store(true, Ordering::SeqCst);
    let finals_from = Instant::now();
    while rw.finished.load(Ordering::SeqCst) < rwlock_workload::ACTORS
        && finals_from.elapsed() < rwlock_workload::FINAL * 3 + CAMPAIGN * 2
    {
        thread::sleep(Duration::from_millis(20));
    }

    // Wind down: appenders first, then readers catch up with every
    // acknowledged append before they stop.
    let end = Instant::now();
    shared.stop.store(true, Ordering::SeqCst);
    for t in appenders {
        t.join().expect("appender");
    }
    for s in 0..STREAMS {
        let newest = shared.history.lock().streams[s].acked.keys().max().copied();
        shared.targets.lock()[s] = Some(newest.unwrap_or(0));
    }
    for t in readers {
        t.join().expect("reader");
    }
    for t in threads {
        t.join().expect("actor");
    }

    shared.history.lock().changes = watches.finish(Duration::from_millis(300));
    let history = shared.history.lock();
    let mut violations = shared.violations.lock().clone();
    // Every belief overlap, classified, with its evidence (a server early
    // revocation passes, see history.rs).
    for workload in history::beliefs(&history, PERMITS as usize, origin) {
        println!("soak: {}", workload.summary());
        for o in &workload.overlaps {
            let class = if o.early_revocation {
                "server early revocation"
            } else {
                "fleetcoord bug"
            };
            let at = workload.beliefs[o.newest].from;
            println!(
                "soak: overlap of {} ({class}): {}\n  faults and candidates around it:\n{}",
                workload.what,
                o.report,
                timeline_between(
                    &shared.timeline.lock(),
                    at,
                    Duration::from_secs(4),
                    at + Duration::from_millis(300)
                )
            );
        }
        println!(
            "soak: {}",
            belief::signed_distribution(
                &format!("{}: DELETE seen -> last belief (lost)", workload.what),
                &belief::delete_to_belief_end(&workload.beliefs, &history.changes)
            )
        );
        println!(
            "soak: {}",
            belief::signed_distribution(
                &format!("{}: refused fenced call -> last belief", workload.what),
                &belief::refusal_to_belief_end(&workload.beliefs)
            )
        );
    }
    let safety = history::check(&history, PERMITS as usize, origin);
    if !safety.is_empty() {
        let timeline = shared.timeline.lock();
        for (a, b) in history::suspect_pairs(&history.tenures) {
            println!(
                "soak: candidates {} (token {}) and {} (token {}), around the second's election:\n{}",
                a.candidate,
                a.token,
                b.candidate,
                b.token,
                timeline_between(&timeline, b.elected_at, Duration::from_secs(3), a.last_held_at)
            );
        }
    }
    violations.extend(safety);
    {
        let report = rwlock_workload::check(&rw.record.lock(), &history.changes, origin);
        println!("soak: {}", report.summary);
        for o in &report.overlaps {
            let class = if o.early_revocation {
                "server early revocation"
            } else {
                "fleetcoord bug"
            };
            let at = report.beliefs[o.newest].from;
            println!(
                "soak: overlap of rwlock holds ({class}): {}\n  faults and candidates around it:\n{}",
                o.report,
                timeline_between(
                    &shared.timeline.lock(),
                    at,
                    Duration::from_secs(4),
                    at + Duration::from_millis(300)
                )
            );
        }
        println!(
            "soak: {}",
            belief::signed_distribution(
                "rwlock holds: refused fenced call -> last belief",
                &belief::refusal_to_belief_end(&report.beliefs)
            )
        );
        violations.extend(report.violations);
    }
    {
        let timeline = shared.timeline.lock();
        violations.extend(shard_workload::check(
            &shard_log.lock(),
            &shard_record.lock(),
            &timeline.faults,
            &timeline.leaderless_etcd,
            &history.changes,
            origin,
        ));
    }
    println!(
        "soak: semaphore of {PERMITS} permits: {} holds by {CONTENDERS} contenders",
        history.permits.len(),
    );
    let timeline = shared.timeline.lock();
    violations.extend(liveness_violations(&timeline, end));
    let appended: usize = history.streams.iter().map(|s| s.acked.len()).sum();
    let unknown: usize = history.streams.iter().map(|s| s.unacked.len()).sum();
    let read: usize = history
        .streams
        .iter()
        .flat_map(|s| s.reads.iter().map(Vec::len))
        .sum();
    println!(
        "soak: {rounds} rounds in {:.0?}, faults {faults:?}; {} leaderships, {} fenced writes, \
         {appended} entries acknowledged ({unknown} unknown), {read} read; slowest watcher \
         convergence {slowest_convergence:.1?}; {} violations",
        started.elapsed(),
        history.tenures.len(),
        history.writes.len(),
        violations.len()
    );
    assert!(
        violations.is_empty(),
        "SOAK_SEED={seed}: {} violations:\n{}",
        violations.len(),
        violations.join("\n")
    );
}

/// Records the stretch from `from` until the cluster shows a raft leader
/// again as etcd's own outage.
fn etcd_leaderless(cluster: &EtcdCluster, from: Instant, what: &'static str, shared: &Shared) {
    let _ = cluster.leader_index();
    shared.timeline.lock().leaderless_etcd.push(Outage {
        from,
        to: Instant::now(),
        what,
    });
}

/// What every candidate did from a second before `g` to its end, and the
/// faults that overlapped it, one line each with its offset from the
/// gap's start: a short gap's cause is in the order of these.
fn timeline_around(t: &Timeline, g: &liveness::Gap) -> String {
    timeline_between(t, g.from, Duration::from_secs(1), g.to)
}

/// Every candidate's actions and the faults from `before` ahead of
/// `anchor` until `to`, each with its offset from `anchor`.
fn timeline_between(t: &Timeline, anchor: Instant, before: Duration, to: Instant) -> String {
    let from = anchor.checked_sub(before).unwrap_or(anchor);
    let to = to.max(anchor);
    let offset = |at: Instant| -> String {
        if at >= anchor {
            format!("+{:>5}ms", at.duration_since(anchor).as_millis())
        } else {
            format!("-{:>5}ms", anchor.duration_since(at).as_millis())
        }
    };
    let mut lines: Vec<(Instant, String)> = t
        .actions
        .iter()
        .filter(|(at, _, _)| *at >= from && *at <= to)
        .map(|(at, c, what)| (*at, format!("  {} candidate {c}: {what}", offset(*at))))
        .collect();
    for o in t.faults.iter().chain(&t.leaderless_etcd) {
        if o.to >= from && o.from <= to {
            lines.push((
                o.from,
                format!("  {} {} until {}", offset(o.from), o.what, offset(o.to)),
            ));
        }
    }
    lines.sort_by_key(|(at, _)| *at);
    lines
        .into_iter()
        .map(|(_, l)| l)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The liveness bounds over the run's timeline, one line per violation;
/// prints each figure's distribution on the way.
fn liveness_violations(t: &Timeline, end: Instant) -> Vec<String> {
    let mut violations = Vec::new();
    let gaps = liveness::gaps(&t.held, &t.waited, &t.faults, end);
    let bound = TTL * 2 + Duration::from_secs(2);
    for g in &gaps {
        // The bound holds while etcd can elect: its own leaderless time is
        // no client's to shorten. And every raft leader elected meanwhile
        // extended every lease to a full TTL: the lease of a candidate
        // that is gone (a restarted client whose revoke did not get
        // through) first in line lives that much longer each time.
        let etcd_down = g.within(&t.leaderless_etcd);
        let extensions = g.ended_inside(&t.leaderless_etcd);
        let bound = bound + TTL * extensions;
        if g.length().saturating_sub(etcd_down) > bound {
            // What every candidate did meanwhile, summarised per candidate.
            let mut doing: BTreeMap<usize, BTreeMap<String, usize>> = BTreeMap::new();
            for (at, c, what) in &t.actions {
                if *at >= g.from && *at <= g.to {
                    let what = what.split(" (").next().unwrap_or(what).to_string();
                    *doing.entry(*c).or_default().entry(what).or_default() += 1;
                }
            }
            violations.push(format!(
                "{} (bound {bound:?} beyond the {etcd_down:.2?} etcd had no raft leader); meanwhile {doing:?}",
                g.describe()
            ));
        }
        if g.after_resign && g.excess() > SLACK {
            violations.push(format!(
                "{} (bound {SLACK:?} outside outages); timeline:\n{}",
                g.describe(),
                timeline_around(t, g)
            ));
        }
    }
    violations.extend(liveness::overruns(&t.timed, SLACK));
    let short = liveness::short_of_permits(&t.permit_holds, &t.permit_waits, PERMITS as usize, end);
    for g in &short {
        let etcd_down = g.within(&t.leaderless_etcd);
        let extensions = g.ended_inside(&t.leaderless_etcd);
        let bound = bound + TTL * extensions;
        if g.length().saturating_sub(etcd_down) > bound {
            violations.push(format!(
                "a permit was free for {:.2?} while contender {} waited (bound {bound:?} beyond the {etcd_down:.2?} etcd had no raft leader)",
                g.length(),
                g.waiter
            ));
        }
    }
    let short_lengths: Vec<Duration> = short.iter().map(|g| g.length()).collect();
    println!(
        "soak: {}",
        liveness::distribution("a permit free while a contender waited", &short_lengths)
    );
    let mut lags = Vec::new();
    for (acked, read) in t.acked_at.iter().zip(&t.read_at) {
        for (id, at) in acked {
            if let Some(seen) = read.get(id) {
                lags.push(seen.saturating_duration_since(*at));
            }
        }
    }
    for lag in lags.iter().filter(|l| **l > LAG) {
        violations.push(format!(
            "a reader lagged {lag:.2?} behind an acknowledged append"
        ));
    }
    let lengths: Vec<Duration> = gaps.iter().map(|g| g.length()).collect();
    let excess: Vec<Duration> = gaps
        .iter()
        .filter(|g| g.after_resign)
        .map(|g| g.excess())
        .collect();
    let timed = |what: &str| -> Vec<Duration> {
        t.timed
            .iter()
            .filter(|c| c.what == what)
            .map(|c| c.took)
            .collect()
    };
    for line in [
        liveness::distribution("leaderless while waiting", &lengths),
        liveness::distribution("after a resign, outside fault windows", &excess),
        liveness::distribution("campaign_timeout(1s)", &timed("campaign_timeout(1s)")),
        liveness::distribution("resign", &timed("resign")),
        liveness::distribution("watcher converged after a heal", &t.convergence),
        liveness::distribution("reader lag behind an acknowledged append", &lags),
    ] {
        println!("soak: {line}");
    }
    violations
}
