//! The soak's shard workload: a shard map of [`SHARDS`] shards whose
//! members (up to [`SLOTS`], each behind its own proxies) join, leave
//! gracefully, crash (cut off, then dropped: the lease is left to
//! expire), or are cut off past the TTL and come back (like SIGSTOP and
//! SIGCONT; a fenced write with each ownership from before is then
//! refused) at random while the nemesis works, consumed as a user would
//! (`../common/shards.rs`: start on `Acquired`, hand back at once on
//! `Release`, stop on `Lost`; a fenced write to an owned shard every
//! [`WRITE_EVERY`]).
//!
//! After each membership change the workload waits until etcd shows every
//! shard owned by its placed member among the live members and every
//! member believes exactly what etcd shows it owning, and records how long
//! that took; then membership stays stable a while, and the events told
//! meanwhile are kept for the checker. [`check`] lists:
//! * per shard, belief overlaps (classified as the soak's elections are,
//!   but only inside a window of the fault that makes etcd revoke early:
//!   a server early revocation, with its evidence, is printed, not
//!   failed), owners' tokens that do not rise, and fenced writes applied
//!   after a newer owner's (a stale token let through);
//! * liveness: every change settled within its bound (a join or a leave
//!   [`GRACEFUL`], a crash or a cut-off TTL + [`GRACEFUL`], a return
//!   [`BACK`] from when the proxies pass again) beyond the time the
//!   windows of faults that touch etcd or the members' connections
//!   overlapped it (and a TTL for every raft leader elected meanwhile: each
//!   extends every lease, the crashed member's too);
//! * no event while membership was stable, outside those faults' windows.

use crate::liveness::{self, Outage};
use crate::shards::{self, Interval, Log};
use crate::{belief, between, connect, raw_history::Change, Net, TTL};
use fleetcoord::{Etcd, ShardMap, ShardOptions, TxnOp, DEFAULT_SHARDS_PREFIX};
use parking_lot::Mutex;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The map's name, its shard count, and how many members at most.
pub const MAP: &str = "soak";
pub const SHARDS: u32 = 16;
pub const SLOTS: usize = 3;
/// The bound after a join or a graceful leave: round trips and the
/// hand-back.
const GRACEFUL: Duration = Duration::from_secs(1);
/// The bound of a cut-off member's return, from the moment its proxies
/// pass again: a reconnect and a session grant that may wait out the
/// backoff of the failed attempts (at most 5 s), then a join. (It was
/// timed from the start of the cut-off, so the cut-off itself, TTL plus
/// up to 1.5 s, and any time the others took to settle without the
/// member, which keeps it cut off, counted against it.)
const BACK: Duration = Duration::from_secs(6);
/// How long past its bound a change is waited for before it counts as
/// never settled.
const GIVE_UP: Duration = Duration::from_secs(20);
const WRITE_EVERY: Duration = Duration::from_millis(50);
const DATA: &str = "/soak-shards-data/";

/// The prefix of the map's shard keys (for the raw history).
pub fn shards_prefix() -> String {
    format!("{DEFAULT_SHARDS_PREFIX}{MAP}/shards/")
}

/// One membership change and how long the map took to settle after it.
#[derive(Clone, Debug)]
pub struct Settle {
    pub what: String,
    pub at: Instant,
    pub bound: Duration,
    /// `None`: not settled within the bound and [`GIVE_UP`].
    pub took: Option<Duration>,
    /// What was still unsettled when it was given up.
    pub last: String,
}

/// A stretch of stable membership: from a settled map to the next change.
#[derive(Clone, Debug)]
pub struct Stable {
    pub from: Instant,
    pub to: Instant,
}

#[derive(Default)]
pub struct Record {
    pub changes: Vec<Settle>,
    pub stable: Vec<Stable>,
}

struct Member {
    map: Arc<ShardMap>,
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<()>,
    etcd: Etcd,
}

impl Member {
    fn stop(self) -> (ShardMap, Etcd) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
        let map = Arc::try_unwrap(self.map).expect("the consumer's handle is gone");
        (map, self.etcd)
    }
}

fn shard_options(id: &str) -> ShardOptions {
    ShardOptions::default()
        .with_member(id)
        .with_ttl(TTL)
        .with_drain(GRACEFUL)
}

fn join(id: &str, net: &Net, stop: &AtomicBool, log: &Arc<Mutex<Log>>) -> Option<Member> {
    let etcd = connect(&net.endpoints(), stop)?;
    let map = Arc::new(ShardMap::join(&etcd, MAP, SHARDS, shard_options(id)).ok()?);
    let consumer_stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (stop, map, log, id) = (
            consumer_stop.clone(),
            map.clone(),
            log.clone(),
            id.to_string(),
        );
        thread::spawn(move || shards::consume(&id, &map, &stop, &log, Some((WRITE_EVERY, DATA))))
    };
    Some(Member {
        map,
        stop: consumer_stop,
        thread,
        etcd,
    })
}

/// Waits until etcd has exactly `live` as members, every shard owned by
/// its placed member, and every member believing what etcd shows.
fn settle(
    observer: &Etcd,
    members: &[Option<Member>],
    live: &BTreeSet<String>,
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<(), String> {
    let mut last = String::from("no read answered");
    while Instant::now() < deadline && !stop.load(Ordering::SeqCst) {
        let read = ShardMap::members_of(observer, MAP, &ShardOptions::default()).and_then(|m| {
            ShardMap::owners_of(observer, MAP, SHARDS, &ShardOptions::default()).map(|o| (m, o))
        });
        if let Ok((in_etcd, owners)) = read {
            let ids: BTreeSet<String> = in_etcd.into_iter().map(|m| m.member).collect();
            let placed = shards::as_placed(&owners, live, SHARDS);
            let believed = members
                .iter()
                .flatten()
                .all(|m| shards::believes_as_etcd(&m.map, &owners));
            if ids == *live && placed && believed {
                return Ok(());
            }
            last = format!(
                "members {ids:?} (want {live:?}), {} of {SHARDS} owned, as placed: {placed}, \
                 beliefs as etcd: {believed}",
                owners.len()
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    Err(last)
}

/// A member cut off (its proxies blackholed, like SIGSTOP) past its TTL
/// by `beyond`: the others settle without it within TTL + [`GRACEFUL`],
/// and a fenced write with each of its old ownerships is refused. Then
/// its proxies pass again; the change returned after is its return, timed
/// from the instant returned (`None`: stopped meanwhile).
#[allow(clippy::too_many_arguments)]
fn cut_off(
    id: &str,
    member: &Member,
    net: &Net,
    observer: &Etcd,
    members: &[Option<Member>],
    live: &mut BTreeSet<String>,
    log: &Mutex<Log>,
    record: &Mutex<Record>,
    stop: &AtomicBool,
    beyond: Duration,
) -> Option<Instant> {
    let stale: Vec<u32> = member.map.owned().into_iter().map(|(s, _)| s).collect();
    net.set(fleetcoord::testing::Mode::Blackhole);
    let at = Instant::now();
    live.remove(id);
    let bound = TTL + GRACEFUL;
    let settled = settle(observer, members, live, at + bound + GIVE_UP, stop);
    if stop.load(Ordering::SeqCst) {
        return None;
    }
    let took = Instant::now() - at;
    record.lock().changes.push(Settle {
        what: format!("cut-off of {id}"),
        at,
        bound,
        took: settled.is_ok().then_some(took),
        last: settled.err().unwrap_or_default(),
    });
    // Others own those shards now: the old ownerships may write nothing.
    for shard in stale {
        let key = format!("{DATA}{shard}");
        if let Ok(Some(_)) = member.map.txn_if_owner(shard, [TxnOp::put(key, "stale")]) {
            log.lock().violations.push(format!(
                "{id}: a write with its ownership of shard {shard} from before the cut-off \
                 applied after the others settled without it"
            ));
        }
    }
    let back = (at + TTL + beyond).saturating_duration_since(Instant::now());
    thread::sleep(back);
    net.set(fleetcoord::testing::Mode::Pass);
    // Bytes dropped mid-stream leave the connections broken: start afresh.
    net.reset();
    live.insert(id.to_string());
    Some(Instant::now())
}

/// The workload until `stop`: membership changes one at a time, each
/// followed by a stable stretch.
pub fn run(
    nets: Arc<Vec<Net>>,
    observer: Etcd,
    log: Arc<Mutex<Log>>,
    record: Arc<Mutex<Record>>,
    stop: &AtomicBool,
    seed: u64,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut members: Vec<Option<Member>> = (0..SLOTS).map(|_| None).collect();
    let mut ids: Vec<String> = vec![String::new(); SLOTS];
    // A crashed slot's proxies stay cut off until its lease has expired.
    let mut cooling: Vec<Option<Instant>> = vec![None; SLOTS];
    let mut live: BTreeSet<String> = BTreeSet::new();
    let mut generation = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        for (slot, until) in cooling.iter_mut().enumerate() {
            if until.is_some_and(|u| u <= now) {
                *until = None;
                nets[slot].set(fleetcoord::testing::Mode::Pass);
                nets[slot].reset();
            }
        }
        let free: Vec<usize> = (0..SLOTS)
            .filter(|s| members[*s].is_none() && cooling[*s].is_none())
            .collect();
        let present: Vec<usize> = (0..SLOTS).filter(|s| members[*s].is_some()).collect();
        // Join while fewer than two; leave or crash only with two or more,
        // so the map always has a member to settle on.
        let action = match (free.is_empty(), present.len()) {
            (true, 0) => {
                thread::sleep(Duration::from_millis(100));
                continue;
            }
            (false, 0 | 1) => 0,
            (true, _) => 1 + rng.next_u64() % 3,
            (false, _) => rng.next_u64() % 4,
        };
        let mut at = Instant::now();
        let (what, bound) = match action {
            0 => {
                let slot = free[(rng.next_u64() % free.len() as u64) as usize];
                generation += 1;
                let id = format!("m{slot}-{generation}");
                let Some(member) = join(&id, &nets[slot], stop, &log) else {
                    continue;
                };
                members[slot] = Some(member);
                ids[slot] = id.clone();
                live.insert(id.clone());
                // The first member waits for its session and creates all.
                let bound = GRACEFUL + if live.len() == 1 { TTL } else { Duration::ZERO };
                (format!("join of {id}"), bound)
            }
            1 => {
                let slot = present[(rng.next_u64() % present.len() as u64) as usize];
                let member = members[slot].take().expect("present");
                let (map, etcd) = member.stop();
                live.remove(&ids[slot]);
                // A leave etcd did not confirm leaves the keys to the
                // lease: then the crash's bound.
                let (what, bound) = match map.leave() {
                    Ok(()) => (format!("leave of {}", ids[slot]), GRACEFUL),
                    Err(e) => (format!("leave of {} ({e})", ids[slot]), TTL + GRACEFUL),
                };
                drop(etcd);
                (what, bound)
            }
            2 => {
                let slot = present[(rng.next_u64() % present.len() as u64) as usize];
                let member = members[slot].as_ref().expect("present");
                let Some(passed) = cut_off(
                    &ids[slot],
                    member,
                    &nets[slot],
                    &observer,
                    &members,
                    &mut live,
                    &log,
                    &record,
                    stop,
                    between(&mut rng, 300, 1500),
                ) else {
                    break;
                };
                at = passed;
                (format!("return of {} after a cut-off", ids[slot]), BACK)
            }
            _ => {
                let slot = present[(rng.next_u64() % present.len() as u64) as usize];
                nets[slot].set(fleetcoord::testing::Mode::Blackhole);
                let member = members[slot].take().expect("present");
                let (map, etcd) = member.stop();
                live.remove(&ids[slot]);
                // Its handle's driver waits out a grace for the leave that
                // cannot get through: not on this thread.
                thread::spawn(move || drop((map, etcd)));
                cooling[slot] = Some(at + TTL + Duration::from_secs(2));
                (format!("crash of {}", ids[slot]), TTL + GRACEFUL)
            }
        };
        let settled = settle(&observer, &members, &live, at + bound + GIVE_UP, stop);
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let took = Instant::now() - at;
        record.lock().changes.push(Settle {
            what,
            at,
            bound,
            took: settled.is_ok().then_some(took),
            last: settled.err().unwrap_or_default(),
        });
        let from = Instant::now();
        let quiet_until = from + between(&mut rng, 300, 1200);
        while Instant::now() < quiet_until && !stop.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(20));
        }
        record.lock().stable.push(Stable {
            from,
            to: Instant::now(),
        });
    }
    for member in members.into_iter().flatten() {
        let (map, etcd) = member.stop();
        let _ = map.leave();
        drop(etcd);
    }
}

/// The faults whose windows excuse a slow settle or an event while
/// membership was stable: the ones that touch etcd itself or the shard
/// members' connections. The others (partitions of candidates or the
/// churner, client restarts) must not disturb the map at all.
const DISTURBING: [&str; 5] = [
    "PauseRaftLeaderPastTtl",
    "PauseMember",
    "KillMember",
    "KillLeader",
    "ResetConnections",
];

fn overlap(a_from: Instant, a_to: Instant, b_from: Instant, b_to: Instant) -> Duration {
    a_to.min(b_to).saturating_duration_since(a_from.max(b_from))
}

/// Every violation of the workload's safety and liveness, one line each;
/// prints its figures on the way. `faults` and `leaderless` are the soak's
/// fault windows and etcd's own leaderless stretches; `changes` the raw
/// history (with the map's shard keys).
pub fn check(
    log: &Log,
    record: &Record,
    faults: &[Outage],
    leaderless: &[Outage],
    changes: &[Change],
    origin: Instant,
) -> Vec<String> {
    let mut violations = log.violations.clone();
    let disturbing: Vec<&Outage> = faults
        .iter()
        .filter(|o| DISTURBING.contains(&o.what))
        .chain(leaderless)
        .collect();
    let excused = |from: Instant, to: Instant| -> Duration {
        disturbing
            .iter()
            .map(|o| overlap(from, to, o.from, o.to))
            .sum()
    };

    // Safety.
    let (overlaps, tokens) = shards::check_intervals(&log.intervals);
    let mut early = 0;
    for (a, b) in &overlaps {
        let beliefs = [belief_of(a), belief_of(b)];
        let classified = belief::overlaps(&beliefs, 1, changes, origin);
        let report = classified
            .first()
            .map_or("no instant with both believing".to_string(), |o| {
                o.report.clone()
            });
        // The classifier trusts the deadline the member announced; a
        // belief bug that inflates it would pass as etcd's. So etcd is
        // blamed only inside the window of the one fault known to make it
        // revoke early (a resumed ex-leader, etcd-io/etcd#15247).
        let pause = faults
            .iter()
            .filter(|o| o.what == "PauseRaftLeaderPastTtl")
            .any(|o| o.from <= b.from && b.from <= o.to);
        if pause && classified.first().is_some_and(|o| o.early_revocation) {
            early += 1;
            println!("soak: shard overlap (server early revocation): {report}");
        } else {
            violations.push(format!(
                "shard {}: belief of {} (token {}) overlaps {} (token {}): {report}",
                a.shard, a.member, a.token, b.member, b.token
            ));
        }
    }
    violations.extend(tokens);
    violations.extend(shards::check_writes(&log.writes));

    // Liveness.
    let mut settles = Vec::new();
    for c in &record.changes {
        let Some(took) = c.took else {
            // What the members were told and which faults ran meanwhile:
            // the evidence for why it did not settle.
            let until = c.at + c.bound + GIVE_UP;
            for (t, who, e) in log
                .events
                .iter()
                .filter(|(t, _, _)| c.at <= *t && *t <= until)
            {
                println!(
                    "soak: shard map: unsettled {}: {} {who} {e:?}",
                    c.what,
                    belief::secs(*t, origin)
                );
            }
            for o in faults.iter().chain(leaderless) {
                if o.to >= c.at && o.from <= until {
                    println!(
                        "soak: shard map: unsettled {}: fault {} from {} to {}",
                        c.what,
                        o.what,
                        belief::secs(o.from, origin),
                        belief::secs(o.to, origin)
                    );
                }
            }
            violations.push(format!(
                "shard map: {} at {} never settled ({:?} + {GIVE_UP:?}): {}",
                c.what,
                belief::secs(c.at, origin),
                c.bound,
                c.last
            ));
            continue;
        };
        settles.push(took);
        println!(
            "soak: shard map: {} at {} settled after {took:.2?}",
            c.what,
            belief::secs(c.at, origin)
        );
        let end = c.at + took;
        let extensions = leaderless
            .iter()
            .filter(|o| o.to > c.at && o.to <= end)
            .count() as u32;
        let bound = c.bound + TTL * extensions;
        let excess = took.saturating_sub(excused(c.at, end));
        if excess > bound {
            violations.push(format!(
                "shard map: {} at {} settled after {took:.2?}, {excess:.2?} outside disturbing \
                 faults (bound {bound:?})",
                c.what,
                belief::secs(c.at, origin)
            ));
        }
    }
    let mut flaps = 0;
    let mut excused_flaps = 0;
    for s in &record.stable {
        let told = shards::events_between(log, s.from, s.to);
        if told.is_empty() {
            continue;
        }
        let in_fault = told
            .iter()
            .all(|(t, _, _)| disturbing.iter().any(|o| o.from <= *t && *t <= o.to));
        if in_fault {
            excused_flaps += told.len();
        } else {
            flaps += told.len();
            violations.push(format!(
                "shard map: {} events while membership was stable ({} to {}), outside \
                 disturbing faults: {:?}",
                told.len(),
                belief::secs(s.from, origin),
                belief::secs(s.to, origin),
                &told[..told.len().min(4)]
            ));
        }
    }
    println!(
        "soak: shard map of {SHARDS} shards: {} changes, {} beliefs, {} fenced writes, {} \
         overlaps ({early} server early revocations), {flaps} events while stable ({excused_flaps} \
         more inside disturbing faults)",
        record.changes.len(),
        log.intervals.len(),
        log.writes.len(),
        overlaps.len()
    );
    println!(
        "soak: {}",
        liveness::distribution("shard map settled after a membership change", &settles)
    );
    violations
}

fn belief_of(iv: &Interval) -> belief::Belief {
    let to = iv.to.unwrap_or(iv.from);
    belief::Belief {
        who: format!("member {}", iv.member),
        token: iv.token,
        key: format!("{}{}", shards_prefix(), iv.shard),
        from: iv.from,
        last_held_at: to,
        lost: iv.lost,
        trusted: iv.trusted.clone(),
        first_refusal: None,
    }
}
