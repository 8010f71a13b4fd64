//! Shard maps: how long after a member's join, graceful leave or crash
//! the map settles, and how many etcd writes the change costs, for a
//! `ShardMap` beside what a user would write without it: one
//! `ElectionPool` per member campaigning on every shard's name (the leader
//! of shard i owns it).
//!
//! N members share M shards (the oldest member leaves, crashes, and comes
//! back as the newest, in turn; each member behind its own proxy so a
//! crash can cut it off: its lease is left to expire, TTL 2 s both).
//! Settled means, as etcd shows it: for the map, exactly the live members
//! registered and every shard owned by its placed member; for the pools,
//! every shard's election has exactly the live members as candidates and
//! a live leader. Writes are etcd's revision delta from the change to the
//! settle (lease grants and revokes without keys are not counted). Both
//! sides hand a released shard back at once (the map with a drain of 0).
//! The sides alternate, one change at a time.

use crate::raw::Raw;
use crate::report::{latency_row, Row, Side};
use crate::{Config, Res};
use etcd_client::GetOptions;
use fleetcoord::testing::{FaultProxy, Mode};
use fleetcoord::{
    ElectionOptions, ElectionPool, Etcd, EtcdOptions, Leadership, Pending, ShardMap, ShardOptions,
};
use fleetcoord_sm::shard::placement;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(10);
const LIMIT: Duration = Duration::from_secs(30);

/// One change's cost: how long to settle and how many revisions.
#[derive(Default)]
struct Costs {
    join: Vec<Duration>,
    leave: Vec<Duration>,
    crash: Vec<Duration>,
    join_writes: Vec<i64>,
    leave_writes: Vec<i64>,
    crash_writes: Vec<i64>,
}

/// What both sides do; `Member` is one process's membership.
trait Approach {
    type Member;
    fn join(&mut self, id: &str) -> Res<Self::Member>;
    fn leave(&mut self, member: Self::Member) -> Res<()>;
    fn crash(&mut self, member: Self::Member);
    /// Whether etcd shows the map settled on `live`.
    fn settled(&self, live: &BTreeSet<String>) -> Res<bool>;
    /// Shards per live member as etcd shows them.
    fn spread(&self) -> Res<BTreeMap<String, usize>>;
}

struct Map<'a> {
    endpoint: &'a str,
    name: String,
    shards: u32,
    observer: Etcd,
}

struct MapMember {
    map: ShardMap,
    etcd: Etcd,
    proxy: FaultProxy,
}

impl Approach for Map<'_> {
    type Member = MapMember;

    fn join(&mut self, id: &str) -> Res<MapMember> {
        let proxy = FaultProxy::start(self.endpoint)?;
        let etcd = Etcd::with_options(&[proxy.endpoint()], EtcdOptions::default())?;
        let options = ShardOptions::default()
            .with_member(id)
            .with_ttl(TTL)
            .with_drain(Duration::ZERO);
        let map = ShardMap::join(&etcd, &self.name, self.shards, options)?;
        Ok(MapMember { map, etcd, proxy })
    }

    fn leave(&mut self, member: MapMember) -> Res<()> {
        member.map.leave()?;
        Ok(())
    }

    fn crash(&mut self, member: MapMember) {
        member.proxy.set_mode(Mode::Blackhole);
        // The handle waits out a grace for the leave that cannot get
        // through: not on the measuring thread.
        std::thread::spawn(move || drop((member.map, member.etcd, member.proxy)));
    }

    fn settled(&self, live: &BTreeSet<String>) -> Res<bool> {
        let options = ShardOptions::default();
        let members: BTreeSet<String> = ShardMap::members_of(&self.observer, &self.name, &options)?
            .into_iter()
            .map(|m| m.member)
            .collect();
        if members != *live {
            return Ok(false);
        }
        let owners = ShardMap::owners_of(&self.observer, &self.name, self.shards, &options)?;
        let placed = placed(live, self.shards);
        Ok(owners.len() == self.shards as usize
            && owners
                .iter()
                .enumerate()
                .all(|(i, o)| o.shard as usize == i && o.member == placed[i]))
    }

    fn spread(&self) -> Res<BTreeMap<String, usize>> {
        let owners = ShardMap::owners_of(
            &self.observer,
            &self.name,
            self.shards,
            &ShardOptions::default(),
        )?;
        let mut spread = BTreeMap::new();
        for o in owners {
            *spread.entry(o.member).or_default() += 1;
        }
        Ok(spread)
    }
}

/// The placed member of every shard among `live`, as the map places them
/// (weighted rendezvous hashing, every weight 1).
fn placed(live: &BTreeSet<String>, shards: u32) -> Vec<String> {
    (0..shards)
        .map(|s| {
            let members = live.iter().map(|m| (m.as_bytes(), 1u32));
            placement::owner(members, s)
                .map(|m| String::from_utf8_lossy(m).into_owned())
                .unwrap_or_default()
        })
        .collect()
}

struct Pools<'a> {
    endpoint: &'a str,
    /// `<election prefix><map name>-`: every shard's election name follows.
    prefix: String,
    map: String,
    shards: u32,
    raw: &'a Raw,
}

struct PoolMember {
    pool: ElectionPool,
    /// Every shard's campaign, kept so that none is cancelled.
    campaigns: Vec<Pending<Leadership>>,
    etcd: Etcd,
    proxy: FaultProxy,
}

impl Pools<'_> {
    /// Per shard name: its candidates' values, oldest first.
    fn candidates(&self) -> Res<BTreeMap<String, Vec<(i64, String)>>> {
        let mut client = self.raw.client();
        let resp = self
            .raw
            .block_on(client.get(self.prefix.as_str(), Some(GetOptions::new().with_prefix())))?;
        let mut by_shard: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
        for kv in resp.kvs() {
            let key = kv.key_str()?;
            let Some(rest) = key.strip_prefix(self.prefix.as_str()) else {
                continue;
            };
            let Some((name, _lease)) = rest.split_once('/') else {
                continue;
            };
            by_shard
                .entry(name.to_string())
                .or_default()
                .push((kv.create_revision(), kv.value_str()?.to_string()));
        }
        for c in by_shard.values_mut() {
            c.sort();
        }
        Ok(by_shard)
    }
}

impl Approach for Pools<'_> {
    type Member = PoolMember;

    fn join(&mut self, id: &str) -> Res<PoolMember> {
        let proxy = FaultProxy::start(self.endpoint)?;
        let etcd = Etcd::with_options(&[proxy.endpoint()], EtcdOptions::default())?;
        let pool = ElectionPool::with_options(&etcd, ElectionOptions::default().with_ttl(TTL));
        let campaigns = (0..self.shards)
            .map(|s| pool.start_campaign(&format!("{}-{s}", self.map), id.as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PoolMember {
            pool,
            campaigns,
            etcd,
            proxy,
        })
    }

    fn leave(&mut self, member: PoolMember) -> Res<()> {
        drop(member.campaigns);
        member.pool.close()?;
        Ok(())
    }

    fn crash(&mut self, member: PoolMember) {
        member.proxy.set_mode(Mode::Blackhole);
        std::thread::spawn(move || {
            drop((member.campaigns, member.pool, member.etcd, member.proxy))
        });
    }

    fn settled(&self, live: &BTreeSet<String>) -> Res<bool> {
        let candidates = self.candidates()?;
        Ok(candidates.len() == self.shards as usize
            && candidates.values().all(|c| {
                let ids: BTreeSet<String> = c.iter().map(|(_, v)| v.clone()).collect();
                c.len() == live.len() && ids == *live
            }))
    }

    fn spread(&self) -> Res<BTreeMap<String, usize>> {
        let mut spread = BTreeMap::new();
        for c in self.candidates()?.values() {
            if let Some((_, leader)) = c.first() {
                *spread.entry(leader.clone()).or_default() += 1;
            }
        }
        Ok(spread)
    }
}

fn revision(raw: &Raw) -> Res<i64> {
    let mut client = raw.client();
    let resp = raw.block_on(client.get("/bench/shards/revision", None))?;
    Ok(resp.header().ok_or("a get without a header")?.revision())
}

/// Waits for `side` to settle on `live`; the time from `since`, and the
/// revisions written since `rev`.
fn settle<S: Approach>(
    side: &S,
    raw: &Raw,
    live: &BTreeSet<String>,
    since: Instant,
    rev: i64,
    what: &str,
) -> Res<(Duration, i64)> {
    loop {
        if side.settled(live)? {
            let took = since.elapsed();
            return Ok((took, revision(raw)? - rev));
        }
        if since.elapsed() > LIMIT {
            return Err(format!("{what}: not settled after {LIMIT:?}").into());
        }
        std::thread::sleep(POLL);
    }
}

/// N members of one side, oldest first.
struct Fleet<S: Approach> {
    side: S,
    members: VecDeque<(String, S::Member)>,
    next: usize,
    costs: Costs,
}

impl<S: Approach> Fleet<S> {
    fn live(&self) -> BTreeSet<String> {
        self.members.iter().map(|(id, _)| id.clone()).collect()
    }

    fn join(&mut self, raw: &Raw, record: bool) -> Res<()> {
        let id = format!("member-{}", self.next);
        self.next += 1;
        let (rev, at) = (revision(raw)?, Instant::now());
        let member = self.side.join(&id)?;
        self.members.push_back((id.clone(), member));
        let (took, writes) = settle(&self.side, raw, &self.live(), at, rev, "join")?;
        if record {
            self.costs.join.push(took);
            self.costs.join_writes.push(writes);
        }
        Ok(())
    }

    fn leave_oldest(&mut self, raw: &Raw) -> Res<()> {
        let (_, member) = self.members.pop_front().ok_or("no member")?;
        let (rev, at) = (revision(raw)?, Instant::now());
        self.side.leave(member)?;
        let (took, writes) = settle(&self.side, raw, &self.live(), at, rev, "leave")?;
        self.costs.leave.push(took);
        self.costs.leave_writes.push(writes);
        Ok(())
    }

    fn crash_oldest(&mut self, raw: &Raw) -> Res<()> {
        let (_, member) = self.members.pop_front().ok_or("no member")?;
        let (rev, at) = (revision(raw)?, Instant::now());
        self.side.crash(member);
        let (took, writes) = settle(&self.side, raw, &self.live(), at, rev, "crash")?;
        self.costs.crash.push(took);
        self.costs.crash_writes.push(writes);
        Ok(())
    }
}

fn mean(v: &[i64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.iter().sum::<i64>() as f64 / v.len() as f64
}

pub fn run(cfg: &Config) -> Res<Vec<Row>> {
    let (n, m, cycles) = if cfg.quick { (3, 16, 1) } else { (5, 64, 4) };
    let raw = Raw::connect(&cfg.endpoint)?;
    let observer = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let name = format!("bench-{}", std::process::id());
    let mut map = Fleet {
        side: Map {
            endpoint: &cfg.endpoint,
            name: name.clone(),
            shards: m,
            observer,
        },
        members: VecDeque::new(),
        next: 0,
        costs: Costs::default(),
    };
    let mut pools = Fleet {
        side: Pools {
            endpoint: &cfg.endpoint,
            prefix: format!("{}{name}-", ElectionOptions::default().prefix),
            map: name.clone(),
            shards: m,
            raw: &raw,
        },
        members: VecDeque::new(),
        next: 0,
        costs: Costs::default(),
    };
    for _ in 0..n {
        map.join(&raw, false)?;
        pools.join(&raw, false)?;
    }
    let busiest = |spread: BTreeMap<String, usize>| spread.into_values().max().unwrap_or(0);
    let map_busiest = busiest(map.side.spread()?);
    let pools_busiest = busiest(pools.side.spread()?);
    for _ in 0..cycles {
        map.leave_oldest(&raw)?;
        pools.leave_oldest(&raw)?;
        map.join(&raw, true)?;
        pools.join(&raw, true)?;
        map.crash_oldest(&raw)?;
        pools.crash_oldest(&raw)?;
        map.join(&raw, true)?;
        pools.join(&raw, true)?;
    }
    for (_, member) in map.members.drain(..) {
        let _ = map.side.leave(member);
    }
    for (_, member) in pools.members.drain(..) {
        let _ = pools.side.leave(member);
    }

    let ours = "ShardMap";
    let naive = format!("ElectionPool per member, a campaign on each of the {m} shards");
    let (mc, pc) = (&map.costs, &pools.costs);
    let figure = |what: &str| format!("{n} members, {m} shards: {what} → map settled");
    let mut rows = vec![
        latency_row(&figure("join"), ours, &mc.join, &naive, &pc.join)?,
        latency_row(
            &figure("graceful leave of the oldest"),
            ours,
            &mc.leave,
            &naive,
            &pc.leave,
        )?,
        latency_row(
            &figure("crash of the oldest, TTL 2 s"),
            ours,
            &mc.crash,
            &naive,
            &pc.crash,
        )?,
    ];
    for (what, ours_w, naive_w) in [
        ("join", &mc.join_writes, &pc.join_writes),
        ("graceful leave", &mc.leave_writes, &pc.leave_writes),
        ("crash", &mc.crash_writes, &pc.crash_writes),
    ] {
        rows.push(Row::new(
            format!("{n} members, {m} shards: etcd writes (revisions) per {what}"),
            Side::amount(ours, mean(ours_w), "writes"),
            Some(Side::amount(naive.clone(), mean(naive_w), "writes")),
        ));
    }
    rows.push(Row::new(
        format!("{n} members, {m} shards: shards on the busiest member, joined one by one"),
        Side::amount(ours, map_busiest as f64, "shards"),
        Some(Side::amount(naive, pools_busiest as f64, "shards")),
    ));
    Ok(rows)
}
