//! Liveness under etcd member restarts: the scenario that made elections
//! stall for 14–38 s (issue 23), as a test with its bounds.
//!
//! A 3-member cluster; three candidates, each on its own `Etcd`, loop
//! `campaign_timeout(3 s)` → hold 1.5–3 s doing fenced writes → `resign()`,
//! TTL 5 s; 20 `HostLiveness` and a `HostWatcher` beside them. The raft
//! leader is SIGKILLed and restarted every ~4 s, `MEMBER_KILLS` times (10
//! by default), so etcd keeps quorum throughout. Checked:
//!
//! * safety: leaderships never overlap, tokens increase, no host ever goes
//!   `Down` (none leaves);
//! * liveness: leaderless while a candidate waits at most 2 × TTL + 2 s
//!   whatever happened, and, after a resign, at most 1 s beyond the time
//!   etcd itself had no raft leader; every `campaign_timeout(3 s)` back
//!   within 3 s + 1 s, every `resign` within the request timeout + 1 s; no
//!   `lease not found`, and every error says what failed; finally every
//!   host closes right after a kill, each close back within the request
//!   timeout + 1 s with its lease revoked, and the watcher sees them all
//!   `Down` within 1 s of the last close.
//!
//! It prints each figure as a distribution.

mod common;
#[path = "common/liveness.rs"]
mod liveness;

use fleetcoord::testing::EtcdCluster;
use fleetcoord::{
    Election, ElectionOptions, Error, Etcd, EtcdOptions, HostEvent, HostLiveness, HostWatcher,
    TxnOp,
};
use liveness::{Held, Outage, Timed, Waited};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use uuid::Uuid;

const TTL: Duration = Duration::from_secs(5);
const CAMPAIGN: Duration = Duration::from_secs(3);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const CANDIDATES: usize = 3;
const HOSTS: usize = 20;
/// What the contract allows on top of each call's own bound.
const SLACK: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Record {
    held: Vec<Held>,
    waited: Vec<Waited>,
    timed: Vec<Timed>,
    tokens: Vec<(Instant, i64)>,
    errors: Vec<String>,
    resigns: Vec<Duration>,
    campaigns: Vec<Duration>,
    /// Everything anyone did, for the timeline printed around a violation.
    events: Vec<(Instant, String)>,
}

fn options() -> EtcdOptions {
    EtcdOptions::default().with_request_timeout(REQUEST_TIMEOUT)
}

fn candidate(i: usize, endpoints: Vec<String>, stop: Arc<AtomicBool>, record: Arc<Mutex<Record>>) {
    let etcd = Etcd::with_options(&endpoints, options()).expect("connect");
    let election =
        Election::with_options(&etcd, "restarts", ElectionOptions::default().with_ttl(TTL))
            .expect("election");
    let mut round: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        round += 1;
        let asked = Instant::now();
        let result = election.campaign_timeout(format!("c{i}").as_bytes(), CAMPAIGN);
        let returned = Instant::now();
        {
            let mut r = record.lock();
            r.waited.push(Waited {
                candidate: i,
                from: asked,
                to: returned,
            });
            r.timed.push(Timed {
                what: "campaign_timeout(3s)",
                took: returned - asked,
                bound: CAMPAIGN,
            });
            r.campaigns.push(returned - asked);
            let outcome = match &result {
                Ok(l) => format!("leads, token {}", l.fencing_token()),
                Err(e) => e.to_string(),
            };
            r.events.push((asked, format!("candidate {i} campaigns")));
            r.events.push((
                returned,
                format!("candidate {i} campaign returns: {outcome}"),
            ));
        }
        let leadership = match result {
            Ok(l) => l,
            Err(Error::Timeout(_)) => continue,
            Err(e) => {
                record.lock().errors.push(format!("campaign: {e}"));
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        record
            .lock()
            .tokens
            .push((returned, leadership.fencing_token()));
        // 1.5–3 s, varied per candidate and round without an RNG.
        let hold = Duration::from_millis(1500 + (round * 7919 + i as u64 * 104_729) % 1500);
        let mut last_held = returned;
        let mut lost = false;
        while returned.elapsed() < hold && !stop.load(Ordering::SeqCst) {
            let t = Instant::now();
            if !leadership.is_held() {
                lost = true;
                record
                    .lock()
                    .events
                    .push((t, format!("candidate {i} sees its leadership lost")));
                break;
            }
            last_held = t;
            let key = format!("/restarts/fence/{i}");
            if let Err(e) = leadership.txn_if_leader([TxnOp::put(key, round.to_string())]) {
                let mut r = record.lock();
                r.errors.push(format!("fenced write: {e}"));
                r.events
                    .push((t, format!("candidate {i} fenced write: {e}")));
            }
            thread::sleep(Duration::from_millis(100));
        }
        let resign_at = Instant::now();
        // Held until the last instant `is_held` said so: a fenced write
        // that blocked through an outage may have outlived the leadership,
        // so it is asked once more rather than assumed at the resign.
        if !lost && !leadership.is_held() {
            lost = true;
            record.lock().events.push((
                resign_at,
                format!("candidate {i} sees its leadership lost at the end of its hold"),
            ));
        }
        let held_to = if lost { last_held } else { resign_at };
        let resigned = leadership.resign();
        let took = resign_at.elapsed();
        let mut r = record.lock();
        r.held.push(Held {
            candidate: i,
            from: returned,
            to: held_to,
            resigned: !lost,
        });
        r.timed.push(Timed {
            what: "resign",
            took,
            bound: REQUEST_TIMEOUT,
        });
        r.resigns.push(took);
        r.events.push((
            resign_at,
            format!(
                "candidate {i} {}resigns: {:?} after {took:.2?}",
                if lost { "lost, " } else { "" },
                resigned.as_ref().map_err(|e| e.to_string())
            ),
        ));
        if let Err(e) = resigned {
            r.errors.push(format!("resign: {e}"));
        }
    }
    drop(election);
}

/// The election's keys in etcd, `lease@create_revision` in queue order, or
/// `None` when etcdctl gets no answer.
fn election_queue(endpoints: &str) -> Option<String> {
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoints, "--command-timeout=1s"])
        .args([
            "get",
            "/coord/election/restarts/",
            "--prefix",
            "-w",
            "fields",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |line: &str, name: &str| {
        line.strip_prefix(&format!("\"{name}\" : "))
            .map(|v| v.trim().to_string())
    };
    let mut keys: Vec<(i64, String)> = Vec::new();
    let mut created = 0;
    for line in text.lines() {
        if let Some(v) = field(line, "CreateRevision") {
            created = v.parse().unwrap_or(0);
        }
        if let Some(v) = field(line, "Lease") {
            let lease: i64 = v.parse().unwrap_or(0);
            keys.push((created, format!("{lease:x}@{created}")));
        }
    }
    keys.sort();
    Some(
        keys.into_iter()
            .map(|(_, k)| k)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The events from 5 s before `from` to 1 s after `to`, one per line, each
/// at its offset from `from`.
fn timeline(events: &[(Instant, String)], from: Instant, to: Instant) -> String {
    let mut around: Vec<&(Instant, String)> = events
        .iter()
        .filter(|(at, _)| *at + Duration::from_secs(5) >= from && *at <= to + SLACK)
        .collect();
    around.sort_by_key(|(at, _)| *at);
    around
        .iter()
        .map(|(at, what)| {
            let offset = if *at >= from {
                format!("+{:.2?}", *at - from)
            } else {
                format!("-{:.2?}", from - *at)
            };
            format!("  {offset:>9} {what}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn elections_stay_live_while_the_raft_leader_is_killed_and_restarted() {
    let kills: usize = std::env::var("MEMBER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut cluster = EtcdCluster::start(3).unwrap_or_else(|e| {
        panic!(
            "cannot start a 3-member etcd cluster ({e}); {}",
            common::INSTALL
        )
    });
    let endpoints = cluster.endpoints();
    let stop = Arc::new(AtomicBool::new(false));
    let record = Arc::new(Mutex::new(Record::default()));

    // The fleet beside the election: 20 hosts on one handle, a watcher on
    // another. None of them leaves, so any `Down` is false.
    let hosts_etcd = Etcd::with_options(&endpoints, options()).expect("connect");
    let hosts: Vec<HostLiveness> = (0..HOSTS)
        .map(|_| HostLiveness::register(&hosts_etcd, Uuid::new_v4(), b"up", TTL).expect("register"))
        .collect();
    let watch_etcd = Etcd::with_options(&endpoints, options()).expect("connect");
    let watcher = HostWatcher::watch(&watch_etcd).expect("watcher");
    let downs = Arc::new(Mutex::new(Vec::new()));
    let watch_stop = Arc::new(AtomicBool::new(false));
    // Every host's state changes, with the time, into the timeline.
    let states_stop = Arc::new(AtomicBool::new(false));
    let states = {
        let receivers: Vec<_> = hosts.iter().map(|h| h.states().clone()).collect();
        let (stop, record) = (states_stop.clone(), record.clone());
        thread::spawn(move || {
            let mut losses = vec![0usize; receivers.len()];
            while !stop.load(Ordering::SeqCst) {
                for (k, rx) in receivers.iter().enumerate() {
                    while let Ok(state) = rx.try_recv() {
                        if matches!(state, fleetcoord::LivenessState::Lost { .. }) {
                            losses[k] += 1;
                        }
                        record
                            .lock()
                            .events
                            .push((Instant::now(), format!("host {k}: {state:?}")));
                    }
                }
                thread::sleep(Duration::from_millis(20));
            }
            losses
        })
    };
    let watching = {
        let (events, downs, stop) = (watcher.events().clone(), downs.clone(), watch_stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if let Ok(HostEvent::Down(info, _)) =
                    events.recv_timeout(Duration::from_millis(100))
                {
                    downs.lock().push((Instant::now(), info.id));
                }
            }
        })
    };

    // The queue as etcd holds it, read with etcdctl every 250 ms; each
    // change goes into the timeline, so a stall shows the key it waits on.
    let queue_stop = Arc::new(AtomicBool::new(false));
    let queue = {
        let (stop, record, endpoints) = (queue_stop.clone(), record.clone(), endpoints.join(","));
        thread::spawn(move || {
            let mut last = String::new();
            while !stop.load(Ordering::SeqCst) {
                if let Some(now) = election_queue(&endpoints) {
                    if now != last {
                        record
                            .lock()
                            .events
                            .push((Instant::now(), format!("queue: {now}")));
                        last = now;
                    }
                }
                thread::sleep(Duration::from_millis(250));
            }
        })
    };

    let threads: Vec<_> = (0..CANDIDATES)
        .map(|i| {
            let (endpoints, stop, record) = (endpoints.clone(), stop.clone(), record.clone());
            thread::spawn(move || candidate(i, endpoints, stop, record))
        })
        .collect();

    // The nemesis: the raft leader, SIGKILLed and restarted every ~4 s.
    // From the kill until a new leader is seen, etcd can commit nothing:
    // that stretch is an outage no client can shorten.
    let mut outages = Vec::new();
    let mut recoveries = Vec::new();
    thread::sleep(Duration::from_secs(3));
    for _ in 0..kills {
        let leader = cluster.leader_index().expect("a raft leader");
        let killed = Instant::now();
        cluster.kill(leader).expect("kill");
        let next_leader = cluster.leader_index().expect("a new raft leader");
        let elected = Instant::now();
        {
            let mut r = record.lock();
            r.events
                .push((killed, format!("member {leader} (raft leader) killed")));
            r.events
                .push((elected, format!("member {next_leader} seen raft leader")));
        }
        outages.push(Outage {
            from: killed,
            to: elected,
            what: "raft leader killed",
        });
        recoveries.push(elected - killed);
        thread::sleep(Duration::from_millis(500));
        cluster.restart(leader).expect("restart");
        record
            .lock()
            .events
            .push((Instant::now(), format!("member {leader} restarted")));
        let next = killed + Duration::from_secs(4);
        thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    // A quiet stretch, so that the end of the run is not one big gap.
    thread::sleep(Duration::from_secs(4));
    let end = Instant::now();
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("candidate");
    }
    queue_stop.store(true, Ordering::SeqCst);
    queue.join().expect("queue reader");

    // How often a host lost its lease while etcd kept quorum: each loss
    // is a new registration (and, for a candidate, a lost leadership).
    states_stop.store(true, Ordering::SeqCst);
    let losses = states.join().expect("state reader");

    // Every host leaves right after the raft leader is killed: the revokes
    // are lost in the raft election and must be sent again, so that each
    // close is back within its bound and watchers see a leave, not an
    // expiry a TTL later.
    let leader = cluster.leader_index().expect("a raft leader");
    cluster.kill(leader).expect("kill");
    let leaving = Instant::now();
    let closes: Vec<_> = hosts
        .into_iter()
        .map(|h| {
            thread::spawn(move || {
                let result = h.close();
                (leaving.elapsed(), result)
            })
        })
        .collect();
    let closes: Vec<(Duration, fleetcoord::Result<()>)> = closes
        .into_iter()
        .map(|t| t.join().expect("close"))
        .collect();
    let closed = Instant::now();
    while downs.lock().iter().filter(|(at, _)| *at >= leaving).count() < HOSTS
        && closed.elapsed() < TTL * 2
    {
        thread::sleep(Duration::from_millis(10));
    }
    let all_down = closed.elapsed();
    watch_stop.store(true, Ordering::SeqCst);
    watching.join().expect("watcher thread");
    cluster.restart(leader).expect("restart");

    let r = record.lock();
    let mut violations = Vec::new();
    // Safety.
    let mut held = r.held.clone();
    held.sort_by_key(|h| h.from);
    for pair in held.windows(2) {
        if pair[1].from < pair[0].to {
            violations.push(format!(
                "overlap: candidate {} elected {:?} before candidate {} stopped holding; around it:\n{}",
                pair[1].candidate,
                pair[0].to - pair[1].from,
                pair[0].candidate,
                timeline(&r.events, pair[1].from, pair[0].to)
            ));
        }
    }
    let mut tokens = r.tokens.clone();
    tokens.sort();
    for pair in tokens.windows(2) {
        if pair[1].1 <= pair[0].1 {
            violations.push(format!(
                "token regression: {} after {}",
                pair[1].1, pair[0].1
            ));
        }
    }
    for (at, id) in downs.lock().iter() {
        if *at < leaving {
            violations.push(format!("false Down of host {id}"));
        }
    }
    for (took, result) in &closes {
        if *took > REQUEST_TIMEOUT + SLACK {
            violations.push(format!("a close right after a kill took {took:.2?}"));
        }
        if let Err(e) = result {
            violations.push(format!("a close right after a kill failed: {e}"));
        }
    }
    let gone = downs.lock().iter().filter(|(at, _)| *at >= leaving).count();
    if gone < HOSTS || all_down > SLACK {
        violations.push(format!(
            "{gone} of {HOSTS} hosts seen Down {all_down:.2?} after the last close returned"
        ));
    }
    // Liveness.
    let gaps = liveness::gaps(&r.held, &r.waited, &outages, end);
    let bound = TTL * 2 + Duration::from_secs(2);
    for g in &gaps {
        if g.length() > bound {
            violations.push(format!("{} (bound {bound:?})", g.describe()));
        }
        if g.after_resign && g.excess() > SLACK {
            violations.push(format!(
                "{} (bound {SLACK:?} outside outages); around it:\n{}",
                g.describe(),
                timeline(&r.events, g.from, g.to)
            ));
        }
    }
    violations.extend(liveness::overruns(&r.timed, SLACK));
    for e in &r.errors {
        if e.contains("lease not found") {
            violations.push(format!("a campaign saw its dead lease: {e}"));
        }
        if e.contains("transport error") {
            violations.push(format!("an error that does not say what failed: {e}"));
        }
    }

    // Ten kills in ~44 s give room for about 15 leaderships.
    if r.held.len() < kills {
        let from = r.held.first().map_or(end, |h| h.from);
        violations.push(format!(
            "only {} leaderships in {kills} kills; the whole run:\n{}",
            r.held.len(),
            timeline(&r.events, from, end)
        ));
    }
    let lengths: Vec<Duration> = gaps.iter().map(|g| g.length()).collect();
    let after_resign: Vec<Duration> = gaps
        .iter()
        .filter(|g| g.after_resign)
        .map(|g| g.excess())
        .collect();
    println!("{kills} kills, {} leaderships", r.held.len());
    println!(
        "{}",
        liveness::distribution("raft leader re-elected after", &recoveries)
    );
    println!(
        "{}",
        liveness::distribution("leaderless while waiting", &lengths)
    );
    println!(
        "{}",
        liveness::distribution("after a resign, beyond the outages", &after_resign)
    );
    println!(
        "{}",
        liveness::distribution("campaign_timeout(3s)", &r.campaigns)
    );
    println!("{}", liveness::distribution("resign", &r.resigns));
    let close_times: Vec<Duration> = closes.iter().map(|(t, _)| *t).collect();
    println!(
        "{}",
        liveness::distribution("HostLiveness::close right after a kill", &close_times)
    );
    println!(
        "hosts that lost their lease: {} of {HOSTS}, {} losses",
        losses.iter().filter(|n| **n > 0).count(),
        losses.iter().sum::<usize>()
    );
    let first_loss = r
        .events
        .iter()
        .filter(|(_, what)| what.contains(": Lost {"))
        .map(|(at, _)| *at)
        .min();
    if let Some(at) = first_loss {
        println!(
            "around the first lost host lease:\n{}",
            timeline(&r.events, at, at)
        );
    }
    println!("{} errors: {:?}", r.errors.len(), r.errors);
    assert!(
        violations.is_empty(),
        "{} violations:\n{}",
        violations.len(),
        violations.join("\n")
    );
}
