//! Shard-map beliefs as a user sees them, and the checks over them, shared
//! by the 20-member fault test (`shard_map.rs`) and the soak's shard
//! workload (`soak/shard_workload.rs`).
//!
//! A member's events are consumed as a user would: work starts on
//! `Acquired`, is handed back at once on `Release`, stops on `Lost`. A
//! belief ([`Interval`]) runs from the `Acquired` event to its end: the
//! hand-back, the `Release` deadline or the `Lost` event, whichever is
//! first, clipped at the session's trusted deadline as the member last
//! read it (`ShardMap::session_trusted_until`). Checked per shard
//! ([`check_intervals`]): no two beliefs overlap, and tokens rise from one
//! owner to the next; per shard, fenced writes ordered by the revision
//! etcd applied them at never go back to an older token
//! ([`check_writes`]).
#![allow(dead_code)]

use fleetcoord::{ShardEvent, ShardMap, ShardOwner, TxnOp, TxnOpResponse};
use fleetcoord_sm::shard::placement;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How late a consumer may read an event already told.
pub const CONSUMER_LAG: Duration = Duration::from_millis(100);

/// One ownership as its member saw it.
#[derive(Clone, Debug)]
pub struct Interval {
    pub member: String,
    pub shard: u32,
    pub token: i64,
    pub from: Instant,
    /// `None` while it lasts.
    pub to: Option<Instant>,
    /// Ended by `Lost` or the session's deadline, not a hand-back.
    pub lost: bool,
    /// The session's trusted-until at each read where it changed, from the
    /// last read before `from`: (read at, value).
    pub trusted: Vec<(Instant, Option<Instant>)>,
}

/// A fenced write etcd applied for a shard: the token it was fenced on
/// and the revision it landed at.
#[derive(Clone, Debug)]
pub struct ShardWrite {
    pub shard: u32,
    pub token: i64,
    pub revision: i64,
}

#[derive(Default)]
pub struct Log {
    pub intervals: Vec<Interval>,
    /// Every event any member received: (when, member, event).
    pub events: Vec<(Instant, String, ShardEvent)>,
    pub writes: Vec<ShardWrite>,
    /// What a consumer saw that no member may do (an `Acquired` of a shard
    /// already believed, an event of no known kind, a failed hand-back).
    pub violations: Vec<String>,
}

/// Consumes `map`'s events until `stop`, recording beliefs and events in
/// `log`. With `write`, every `write.0` one owned shard (in turn) gets a
/// fenced `put` of its token to `<write.1><shard>`, recorded when applied.
pub fn consume(
    id: &str,
    map: &ShardMap,
    stop: &AtomicBool,
    log: &Mutex<Log>,
    write: Option<(Duration, &str)>,
) {
    // Per shard: the index of its open interval in the log.
    let mut open: BTreeMap<u32, usize> = BTreeMap::new();
    let mut trusted: Option<Instant> = None;
    let mut samples: Vec<(Instant, Option<Instant>)> = Vec::new();
    let mut next_write = Instant::now();
    let mut turn = 0usize;
    let close = |log: &mut Log,
                 i: usize,
                 at: Instant,
                 trusted: Option<Instant>,
                 lost: bool,
                 samples: &[(Instant, Option<Instant>)]| {
        let end = trusted.map_or(at, |t| t.min(at));
        let iv = &mut log.intervals[i];
        iv.to = Some(end);
        iv.lost = lost || end < at;
        let first = samples
            .iter()
            .rposition(|(t, _)| *t <= iv.from)
            .unwrap_or(0);
        iv.trusted = samples[first..].to_vec();
    };
    while !stop.load(Ordering::SeqCst) {
        let event = map.events().recv_timeout(Duration::from_millis(5));
        // What the user knows of its deadline, read as often as it acts.
        let read = map.session_trusted_until();
        let now = Instant::now();
        if samples.last().map(|(_, v)| *v) != Some(read) {
            samples.push((now, read));
        }
        trusted = read.or(trusted);
        let mut g = log.lock();
        // A belief past the session's deadline is over whatever comes.
        if let Some(t) = trusted.filter(|t| *t <= now) {
            for (_, i) in std::mem::take(&mut open) {
                close(&mut g, i, t, None, true, &samples);
            }
        }
        let event = match event {
            Ok(event) => event,
            Err(_) => {
                let due = write.filter(|_| now >= next_write && !open.is_empty());
                let Some((every, data)) = due else { continue };
                next_write = now + every;
                turn = turn.wrapping_add(1);
                let (&shard, &i) = open.iter().nth(turn % open.len()).expect("not empty");
                let token = g.intervals[i].token;
                drop(g);
                if let Some(w) = fenced_write(map, shard, token, data) {
                    log.lock().writes.push(w);
                }
                continue;
            }
        };
        g.events.push((now, id.to_string(), event.clone()));
        match event {
            ShardEvent::Acquired { shard, token } => {
                g.intervals.push(Interval {
                    member: id.to_string(),
                    shard,
                    token,
                    from: now,
                    to: None,
                    lost: false,
                    trusted: Vec::new(),
                });
                let i = g.intervals.len() - 1;
                if let Some(old) = open.insert(shard, i) {
                    g.violations.push(format!(
                        "{id}: shard {shard} acquired while interval {old} is open"
                    ));
                }
            }
            ShardEvent::Release { shard, deadline } => {
                if let Some(i) = open.remove(&shard) {
                    // Drained at once: belief ends before the hand-back.
                    close(
                        &mut g,
                        i,
                        Instant::now().min(deadline),
                        trusted,
                        false,
                        &samples,
                    );
                }
                drop(g);
                if let Err(e) = map.release(shard) {
                    log.lock()
                        .violations
                        .push(format!("{id}: release({shard}): {e}"));
                }
            }
            ShardEvent::Lost { shard } => {
                if let Some(i) = open.remove(&shard) {
                    close(&mut g, i, now, trusted, true, &samples);
                }
            }
            other => g
                .violations
                .push(format!("{id}: unexpected event {other:?}")),
        }
    }
    let now = Instant::now();
    let mut g = log.lock();
    for (_, i) in open {
        close(&mut g, i, now, trusted, false, &samples);
    }
}

/// One fenced `put` of `token` to `<data><shard>` with a read-back; the
/// write and the revision it landed at when etcd applied it.
fn fenced_write(map: &ShardMap, shard: u32, token: i64, data: &str) -> Option<ShardWrite> {
    let key = format!("{data}{shard}");
    let ops = [TxnOp::put(key.clone(), token.to_string()), TxnOp::get(key)];
    match map.txn_if_owner(shard, ops) {
        Ok(Some(responses)) => match responses.get(1) {
            Some(TxnOpResponse::Get { kvs }) => kvs.first().map(|kv| ShardWrite {
                shard,
                token,
                revision: kv.mod_revision,
            }),
            _ => None,
        },
        _ => None,
    }
}

/// The placed member of every shard of `shards` among `live`.
pub fn placed(live: &BTreeSet<String>, shards: u32) -> Vec<String> {
    (0..shards)
        .map(|s| {
            let members = live.iter().map(|m| (m.as_bytes(), 1u32));
            placement::owner(members, s)
                .map(|m| String::from_utf8_lossy(m).into_owned())
                .unwrap_or_default()
        })
        .collect()
}

/// Whether `owners` (etcd's, in shard order) has every shard of `shards`
/// owned by its placed member among `live`.
pub fn as_placed(owners: &[ShardOwner], live: &BTreeSet<String>, shards: u32) -> bool {
    let want = placed(live, shards);
    owners.len() == shards as usize
        && owners
            .iter()
            .enumerate()
            .all(|(i, o)| o.shard as usize == i && o.member == want[i])
}

/// Whether `map` believes it owns exactly what `owners` (etcd's) shows
/// its member owning.
pub fn believes_as_etcd(map: &ShardMap, owners: &[ShardOwner]) -> bool {
    let etcd_says: Vec<(u32, i64)> = owners
        .iter()
        .filter(|o| o.member == map.member_id())
        .map(|o| (o.shard, o.token))
        .collect();
    map.owned() == etcd_says
}

/// Every event told between `from` (plus [`CONSUMER_LAG`]: events told
/// before may reach the consumer a little later) and `to`.
pub fn events_between(log: &Log, from: Instant, to: Instant) -> Vec<(Instant, String, ShardEvent)> {
    let from = from + CONSUMER_LAG;
    log.events
        .iter()
        .filter(|(t, _, _)| *t > from && *t < to)
        .cloned()
        .collect()
}

/// Per shard, every pair of beliefs that overlap (the older first), and
/// one line for every change of owner whose token did not rise.
pub fn check_intervals(intervals: &[Interval]) -> (Vec<(Interval, Interval)>, Vec<String>) {
    let mut by_shard: BTreeMap<u32, Vec<&Interval>> = BTreeMap::new();
    for iv in intervals {
        by_shard.entry(iv.shard).or_default().push(iv);
    }
    let mut overlaps = Vec::new();
    let mut tokens = Vec::new();
    for (shard, mut ivs) in by_shard {
        ivs.sort_by_key(|iv| iv.from);
        for (n, b) in ivs.iter().enumerate() {
            // Every earlier belief still open when this one began.
            for a in &ivs[..n] {
                if a.to.is_none_or(|end| end > b.from) {
                    overlaps.push(((*a).clone(), (*b).clone()));
                }
            }
            if let Some(a) = n.checked_sub(1).map(|p| ivs[p]) {
                if !(b.token > a.token || (b.token == a.token && a.member == b.member)) {
                    tokens.push(format!(
                        "shard {shard}: token {} of {} after {} of {}",
                        b.token, b.member, a.token, a.member
                    ));
                }
            }
        }
    }
    (overlaps, tokens)
}

/// Per shard, one line for every applied fenced write whose token is
/// older than one applied at an earlier revision: a stale owner's write
/// that etcd let through.
pub fn check_writes(writes: &[ShardWrite]) -> Vec<String> {
    let mut by_shard: BTreeMap<u32, Vec<&ShardWrite>> = BTreeMap::new();
    for w in writes {
        by_shard.entry(w.shard).or_default().push(w);
    }
    let mut stale = Vec::new();
    for (shard, mut ws) in by_shard {
        ws.sort_by_key(|w| w.revision);
        for pair in ws.windows(2) {
            if pair[1].token < pair[0].token {
                stale.push(format!(
                    "shard {shard}: a write fenced on token {} applied at revision {} after one \
                     on token {} at revision {}",
                    pair[1].token, pair[1].revision, pair[0].token, pair[0].revision
                ));
            }
        }
    }
    stale
}
