//! Round trips: every operation through `testing::FaultProxy` holding each
//! byte [`ONE_WAY`] in each direction (a round trip of [`RTT`]), fleetcoord
//! beside the cheapest raw etcd-client code for the same guarantee, both
//! on connections through the same proxy, samples interleaved. Each row
//! is the p50 of [`SAMPLES`] divided by the round trip: how many round
//! trips the operation costs, so that a request added on the path shows
//! as a whole number more, whatever the machine.
//!
//! The proxy delays bytes, not the TCP handshake (the kernel completes it
//! with the proxy at once): a new connection costs the round trips its
//! HTTP/2 and gRPC exchanges wait for, on both sides alike.

use crate::election::{raw_campaign, raw_resign, raw_session, wait_candidates};
use crate::raw::Raw;
use crate::report::{Row, Side};
use crate::stats::{interleave, Summary};
use crate::{Config, Res};
use etcd_client::{Client, GetOptions, LockOptions, WatchOptions};
use fleetcoord::coordinator::{Coordinator, EtcdCoordinator};
use fleetcoord::testing::{FaultProxy, Mode};
use fleetcoord::{
    Election, ElectionOptions, Etcd, EtcdOptions, HostEvent, HostLiveness, HostWatcher, Mutex,
};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The delay the proxy adds in each direction.
pub const ONE_WAY: Duration = Duration::from_millis(5);
/// The round trip that makes.
pub const RTT: Duration = Duration::from_millis(10);
/// Samples per side and row.
const SAMPLES: usize = 12;
const TTL: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(30);

type Samples = Vec<Duration>;

/// A row of round trips (p50 over [`RTT`]) from both sides' samples.
fn row(
    figure: &str,
    ours: &str,
    ours_s: &[Duration],
    anchor: &str,
    raw_s: &[Duration],
) -> Res<Row> {
    let side = |label: &str, samples: &[Duration]| -> Res<Side> {
        let s = Summary::of(samples).ok_or_else(|| format!("{figure}: no samples"))?;
        let rtts = s.p50.as_secs_f64() / RTT.as_secs_f64();
        let label = format!("{label} (p50 {:.1} ms)", s.p50.as_secs_f64() * 1000.0);
        Ok(Side::amount(label, rtts, "RTT"))
    };
    Ok(Row::new(
        format!("round trips at RTT 10 ms: {figure}"),
        side(ours, ours_s)?,
        Some(side(anchor, raw_s)?),
    ))
}

pub fn run(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(SAMPLES, 2);
    let proxy = FaultProxy::start(&cfg.endpoint)?;
    proxy.set_mode(Mode::Delay(ONE_WAY));
    let far = proxy.endpoint();
    // Waiting for queued candidates reads etcd directly, off the path.
    let near = Raw::connect(&cfg.endpoint)?;
    let raw = Raw::connect(&far)?;
    let etcd = Etcd::with_options(&[far.as_str()], EtcdOptions::default())?;
    let mut rows = vec![connect(n, &far, &raw)?];
    rows.extend(kv(n, &etcd, &raw)?);
    rows.extend(liveness(n, &etcd, &raw)?);
    rows.extend(elections(n, &far, &etcd, &raw, &near)?);
    rows.push(mutex(n, &etcd, &raw)?);
    rows.push(watcher(n, &etcd, &raw)?);
    etcd.close()?;
    Ok(rows)
}

/// `Etcd::connect` until it returns vs etcd-client `connect` + `status`
/// (a connection proven by one answer), each closed outside the timing.
fn connect(n: usize, far: &str, raw: &Raw) -> Res<Row> {
    let (ours, anchor) = interleave(
        n,
        |_| {
            let t = Instant::now();
            let etcd = Etcd::with_options(&[far], EtcdOptions::default())?;
            let d = t.elapsed();
            etcd.close()?;
            Ok(d)
        },
        |_| {
            let t = Instant::now();
            raw.block_on(async {
                let mut c = Client::connect([far], None).await?;
                c.status().await
            })?;
            Ok(t.elapsed())
        },
    )?;
    row(
        "connect",
        "Etcd::connect",
        &ours,
        "etcd-client connect + status",
        &anchor,
    )
}

fn kv(n: usize, etcd: &Etcd, raw: &Raw) -> Res<Vec<Row>> {
    let coord = EtcdCoordinator::on_etcd(etcd)?;
    let value = vec![b'v'; 100];
    let (ours_put, raw_put) = interleave(
        n,
        |_| {
            let t = Instant::now();
            coord.kv_set("bench-rtt", "k", &value)?;
            Ok(t.elapsed())
        },
        |_| {
            let mut c = raw.client();
            let t = Instant::now();
            raw.block_on(c.put("/bench/rtt/k", value.clone(), None))?;
            Ok(t.elapsed())
        },
    )?;
    let (ours_get, raw_get) = interleave(
        n,
        |_| {
            let t = Instant::now();
            coord.kv_get("bench-rtt", "k")?;
            Ok(t.elapsed())
        },
        |_| {
            let mut c = raw.client();
            let t = Instant::now();
            raw.block_on(c.get("/bench/rtt/k", None))?;
            Ok(t.elapsed())
        },
    )?;
    coord.close()?;
    Ok(vec![
        row("put", "kv_set", &ours_put, "etcd-client put", &raw_put)?,
        row("get", "kv_get", &ours_get, "etcd-client get", &raw_get)?,
    ])
}

/// A raw registration: a lease and a key on it.
fn raw_register(raw: &Raw, key: &str) -> Res<i64> {
    let mut c = raw.client();
    raw.block_on(async {
        let lease = c.lease_grant(TTL.as_secs() as i64, None).await?.id();
        let put = etcd_client::PutOptions::new().with_lease(lease);
        c.put(key, "m", Some(put)).await?;
        Ok::<_, etcd_client::Error>(lease)
    })
    .map_err(Into::into)
}

fn raw_revoke(raw: &Raw, lease: i64) -> Res<()> {
    let mut c = raw.client();
    raw.block_on(c.lease_revoke(lease))?;
    Ok(())
}

/// `HostLiveness::register` (grant, put) and `close` (the leave) vs the
/// same raw: grant + put, and the revoke.
fn liveness(n: usize, etcd: &Etcd, raw: &Raw) -> Res<Vec<Row>> {
    let (ours_reg, raw_reg) = interleave(
        n,
        |_| {
            let t = Instant::now();
            let host = HostLiveness::register(etcd, Uuid::new_v4(), b"m", TTL)?;
            let d = t.elapsed();
            host.close()?;
            Ok(d)
        },
        |i| {
            let t = Instant::now();
            let lease = raw_register(raw, &format!("/bench/rtt/host/{i}"))?;
            let d = t.elapsed();
            raw_revoke(raw, lease)?;
            Ok(d)
        },
    )?;
    let (ours_close, raw_close) = interleave(
        n,
        |_| {
            let host = HostLiveness::register(etcd, Uuid::new_v4(), b"m", TTL)?;
            let t = Instant::now();
            host.close()?;
            Ok(t.elapsed())
        },
        |i| {
            let lease = raw_register(raw, &format!("/bench/rtt/host/{i}"))?;
            let t = Instant::now();
            raw_revoke(raw, lease)?;
            Ok(t.elapsed())
        },
    )?;
    Ok(vec![
        row(
            "register",
            "HostLiveness::register",
            &ours_reg,
            "etcd-client grant + put",
            &raw_reg,
        )?,
        row(
            "leave",
            "HostLiveness::close",
            &ours_close,
            "etcd-client revoke",
            &raw_close,
        )?,
    ])
}

/// A campaign on a new election (its session granted on the way), a
/// resign, and a resign until the waiting candidate leads.
fn elections(n: usize, far: &str, etcd: &Etcd, raw: &Raw, near: &Raw) -> Res<Vec<Row>> {
    let options = ElectionOptions::default().with_ttl(TTL);
    let (ours_new, raw_new) = interleave(
        n,
        |i| {
            let t = Instant::now();
            let election = Election::with_options(etcd, &format!("rtt-new-{i}"), options.clone())?;
            let leadership = election.campaign(b"me")?;
            let d = t.elapsed();
            leadership.resign()?;
            election.close()?;
            Ok(d)
        },
        |i| {
            let mut c = raw.client();
            let t = Instant::now();
            let (lease, leader) = raw.block_on(async {
                let lease = c.lease_grant(TTL.as_secs() as i64, None).await?.id();
                let mut r = c
                    .campaign(format!("/bench/rtt/new-{i}"), "me", lease)
                    .await?;
                Ok::<_, etcd_client::Error>((lease, r.take_leader()))
            })?;
            let d = t.elapsed();
            raw_resign(raw, leader.ok_or("campaign answered without a leader key")?)?;
            raw_revoke(raw, lease)?;
            Ok(d)
        },
    )?;

    let election = Election::with_options(etcd, "rtt-resign", options.clone())?;
    let (lease, keeper) = raw_session(raw, TTL.as_secs() as i64)?;
    // Not timed: the first campaign waits for the session's grant.
    election.campaign(b"warm-up")?.resign()?;
    let (ours_resign, raw_resign_s) = interleave(
        n,
        |_| {
            let leadership = election.campaign(b"me")?;
            let t = Instant::now();
            leadership.resign()?;
            Ok(t.elapsed())
        },
        |_| {
            let leader = raw_campaign(raw, "/bench/rtt/resign", "me", lease)?;
            let t = Instant::now();
            raw_resign(raw, leader)?;
            Ok(t.elapsed())
        },
    )?;
    election.close()?;

    let (ours_hand, raw_hand) = handover(n, far, near, options, lease)?;
    keeper.abort();
    Ok(vec![
        row(
            "campaign on a new election",
            "Election::with_options + campaign",
            &ours_new,
            "etcd-client grant + campaign",
            &raw_new,
        )?,
        row(
            "resign",
            "Leadership::resign",
            &ours_resign,
            "etcd-client resign",
            &raw_resign_s,
        )?,
        row(
            "resign → the waiter leads",
            "resign → Election::campaign returns",
            &ours_hand,
            "resign → v3election campaign returns",
            &raw_hand,
        )?,
    ])
}

/// Leader A resigns while B waits: from A's resign to B's campaign
/// returning, both on their own connections through the proxy.
fn handover(
    n: usize,
    far: &str,
    near: &Raw,
    options: ElectionOptions,
    lease_a: i64,
) -> Res<(Samples, Samples)> {
    let ea = Etcd::with_options(&[far], EtcdOptions::default())?;
    let eb = Etcd::with_options(&[far], EtcdOptions::default())?;
    let a = Election::with_options(&ea, "rtt-handover", options.clone())?;
    let b = Election::with_options(&eb, "rtt-handover", options)?;
    let prefix = a.key_prefix().to_string();
    let ra = Raw::connect(far)?;
    let rb = Raw::connect(far)?;
    let (lease_b, kb) = raw_session(&rb, TTL.as_secs() as i64)?;
    let raw_name = "/bench/rtt/handover";
    let result = interleave(
        n,
        |_| {
            let la = a.campaign(b"a")?;
            std::thread::scope(|s| {
                let waiter = s.spawn(|| b.campaign(b"b").map(|l| (Instant::now(), l)));
                wait_candidates(near, &prefix, 2)?;
                let t = Instant::now();
                la.resign()?;
                let (elected, lb) = waiter.join().map_err(|_| "campaign thread panicked")??;
                let d = elected.duration_since(t);
                lb.resign()?;
                Ok(d)
            })
        },
        |_| {
            let la = raw_campaign(&ra, raw_name, "a", lease_a)?;
            let mut cb = rb.client();
            let waiter = rb.spawn(async move {
                let r = cb.campaign(raw_name, "b", lease_b).await;
                (Instant::now(), r)
            });
            wait_candidates(near, &format!("{raw_name}/"), 2)?;
            let t = Instant::now();
            raw_resign(&ra, la)?;
            let (elected, r) = rb.block_on(waiter)?;
            let d = elected.duration_since(t);
            let lb = r?
                .take_leader()
                .ok_or("campaign answered without a leader key")?;
            raw_resign(&rb, lb)?;
            Ok(d)
        },
    );
    kb.abort();
    a.close()?;
    b.close()?;
    result
}

/// `Mutex::lock` on a mutex whose session is granted vs etcd-client's
/// v3lock `lock` with a lease granted beforehand; each unlocks afterwards,
/// outside the timing.
fn mutex(n: usize, etcd: &Etcd, raw: &Raw) -> Res<Row> {
    let mutex = Mutex::new(etcd, "rtt-mutex")?;
    mutex.lock()?.unlock()?;
    let (lease, keeper) = raw_session(raw, TTL.as_secs() as i64)?;
    let (ours, anchor) = interleave(
        n,
        |_| {
            let t = Instant::now();
            let guard = mutex.lock()?;
            let d = t.elapsed();
            guard.unlock()?;
            Ok(d)
        },
        |_| {
            let mut c = raw.client();
            let t = Instant::now();
            let key = raw.block_on(c.lock(
                "/bench/rtt/mutex",
                Some(LockOptions::new().with_lease(lease)),
            ))?;
            let d = t.elapsed();
            raw.block_on(c.unlock(key.key().to_vec()))?;
            Ok(d)
        },
    )?;
    keeper.abort();
    row(
        "mutex lock",
        "Mutex::lock",
        &ours,
        "etcd-client v3lock lock",
        &anchor,
    )
}

/// `HostWatcher::watch` until `Synced` vs etcd-client reading the prefix
/// and opening a watch from the revision after it (created).
fn watcher(n: usize, etcd: &Etcd, raw: &Raw) -> Res<Row> {
    let prefix = fleetcoord::DEFAULT_HOSTS_PREFIX;
    let (ours, anchor) = interleave(
        n,
        |_| {
            let t = Instant::now();
            let watcher = HostWatcher::watch(etcd)?;
            loop {
                match watcher.events().recv_timeout(WAIT)? {
                    HostEvent::Synced => break,
                    _ => continue,
                }
            }
            let d = t.elapsed();
            watcher.close()?;
            Ok(d)
        },
        |_| {
            let mut c = raw.client();
            let t = Instant::now();
            raw.block_on(async {
                let read = c.get(prefix, Some(GetOptions::new().with_prefix())).await?;
                let from = read.header().map_or(0, |h| h.revision()) + 1;
                let options = WatchOptions::new().with_prefix().with_start_revision(from);
                let mut stream = c.watch(prefix, Some(options)).await?;
                match stream.message().await? {
                    Some(r) if r.created() => Ok(()),
                    _ => Err(etcd_client::Error::WatchError("watch not created".into())),
                }
            })?;
            Ok(t.elapsed())
        },
    )?;
    row(
        "HostWatcher → Synced",
        "HostWatcher::watch → Synced",
        &ours,
        "etcd-client get + watch created",
        &anchor,
    )
}
