//! Elections: an uncontested campaign, handover on resign and on
//! `hand_over` (in process, and `fleetcoord elect` vs `etcdctl elect` as
//! processes), and a crashed leader's successor; the semaphore's acquire
//! and hand-over beside them.

use crate::process::{self, Spawned};
use crate::raw::{self, Raw};
use crate::report::{latency_row, Row, Side};
use crate::stats::interleave;
use crate::{Config, Res};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};
use etcd_client::{LeaderKey, ResignOptions};
use fleetcoord::{
    Election, ElectionOptions, Etcd, EtcdOptions, LockOptions, RateLimit, RateLimitOptions, RwLock,
    Semaphore,
};
use std::io::{Read as _, Write as _};
use std::process::Command;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);
/// A waiting candidate watches its predecessor's key from a past revision;
/// etcd serves such a watch from its unsynced set, caught up every 100 ms,
/// so a resign within 100 ms of the candidate's put can wait for that loop
/// (seen here: v3election handover p50 68 ms over 5 samples without this
/// pause, 1.4 ms over 100 with it). A real successor has usually waited
/// far longer.
const SETTLE: Duration = Duration::from_millis(150);

/// Polls until `want` keys exist under `prefix`, then lets [`SETTLE`]
/// pass: the next candidate is queued and waiting, so what follows
/// measures the handover alone.
pub(crate) fn wait_candidates(raw: &Raw, prefix: &str, want: i64) -> Res<()> {
    let deadline = Instant::now() + WAIT;
    while raw.count_prefix(prefix)? != want {
        if Instant::now() > deadline {
            return Err(format!("{want} candidates never appeared under {prefix}").into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(SETTLE);
    Ok(())
}

/// A raw session: a lease kept alive by a task for the life of the row.
pub(crate) fn raw_session(raw: &Raw, ttl: i64) -> Res<(i64, tokio::task::JoinHandle<Res<()>>)> {
    let mut c = raw.client();
    let lease = raw.block_on(c.lease_grant(ttl, None))?.id();
    let task = raw.spawn(raw::keep_alive(raw.client(), lease, ttl));
    Ok((lease, task))
}

pub(crate) fn raw_campaign(raw: &Raw, name: &str, value: &str, lease: i64) -> Res<LeaderKey> {
    let mut c = raw.client();
    let mut resp = raw.block_on(c.campaign(name, value, lease))?;
    resp.take_leader()
        .ok_or_else(|| "campaign answered without a leader key".into())
}

pub(crate) fn raw_resign(raw: &Raw, leader: LeaderKey) -> Res<()> {
    let mut c = raw.client();
    raw.block_on(c.resign(Some(ResignOptions::new().with_leader(leader))))?;
    Ok(())
}

/// The anchor of a handover: A (on `ra`) leads `name`, B (on `rb`) waits
/// in v3election `campaign`; from A's resign to B's campaign returning.
fn raw_handover(
    ra: &Raw,
    rb: &Raw,
    name: &'static str,
    (lease_a, lease_b): (i64, i64),
) -> Res<Duration> {
    let la = raw_campaign(ra, name, "a", lease_a)?;
    let mut cb = rb.client();
    let waiter = rb.spawn(async move {
        let r = cb.campaign(name, "b", lease_b).await;
        (Instant::now(), r)
    });
    wait_candidates(ra, &format!("{name}/"), 2)?;
    let t = Instant::now();
    raw_resign(ra, la)?;
    let (elected, r) = rb.block_on(waiter)?;
    let d = elected.duration_since(t);
    let lb = r?
        .take_leader()
        .ok_or("campaign answered without a leader key")?;
    raw_resign(rb, lb)?;
    Ok(d)
}

/// An uncontested campaign: from the call to its return, on a name nobody
/// else campaigns on, with the session lease already granted on both
/// sides. fleetcoord `Election::campaign` vs etcd-client's v3election
/// `campaign`; each sample resigns afterwards, outside the timed part.
pub fn campaign(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(200, 5);
    let options = ElectionOptions::default().with_ttl(Duration::from_secs(10));
    let etcd = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let election = Election::with_options(&etcd, "bench-campaign", options)?;
    let raw = Raw::connect(&cfg.endpoint)?;
    let (lease, keeper) = raw_session(&raw, 10)?;
    let raw_name = "/bench/raw-campaign";
    // Not timed: the first campaign waits for the session's lease grant,
    // which the raw side did in `raw_session`.
    election.campaign(b"warm-up")?.resign()?;
    let (ours, anchor) = interleave(
        n,
        |_| {
            let t = Instant::now();
            let leadership = election.campaign(b"me")?;
            let d = t.elapsed();
            leadership.resign()?;
            Ok(d)
        },
        |_| {
            let t = Instant::now();
            let leader = raw_campaign(&raw, raw_name, "me", lease)?;
            let d = t.elapsed();
            raw_resign(&raw, leader)?;
            Ok(d)
        },
    )?;
    keeper.abort();
    election.close()?;
    Ok(vec![latency_row(
        "uncontested campaign (in process)",
        "Election::campaign returns",
        &ours,
        "v3election campaign returns",
        &anchor,
    )?])
}

/// Leader A resigns while B waits in `campaign`: from A's resign call to
/// B's campaign returning. fleetcoord `Election` on two `Etcd` handles vs
/// etcd-client's v3election `campaign`/`resign` on two clients.
pub fn handover(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(100, 5);
    let options = ElectionOptions::default().with_ttl(Duration::from_secs(10));
    let ea = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let eb = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let a = Election::with_options(&ea, "bench-handover", options.clone())?;
    let b = Election::with_options(&eb, "bench-handover", options)?;
    let prefix = a.key_prefix().to_string();
    let ra = Raw::connect(&cfg.endpoint)?;
    let rb = Raw::connect(&cfg.endpoint)?;
    let (lease_a, ka) = raw_session(&ra, 10)?;
    let (lease_b, kb) = raw_session(&rb, 10)?;
    let raw_name = "/bench/raw-handover";
    let (ours, anchor) = interleave(
        n,
        |_| {
            let la = a.campaign(b"a")?;
            std::thread::scope(|s| {
                let waiter = s.spawn(|| b.campaign(b"b").map(|l| (Instant::now(), l)));
                wait_candidates(&ra, &prefix, 2)?;
                let t = Instant::now();
                la.resign()?;
                let (elected, lb) = waiter.join().map_err(|_| "campaign thread panicked")??;
                let d = elected.duration_since(t);
                lb.resign()?;
                Ok(d)
            })
        },
        |_| raw_handover(&ra, &rb, raw_name, (lease_a, lease_b)),
    )?;
    ka.abort();
    kb.abort();
    a.close()?;
    b.close()?;
    let handed = hand_over_samples(cfg, n)?;
    Ok(vec![
        latency_row(
            "handover on resign (in process)",
            "Leadership::resign → Election::campaign returns",
            &ours,
            "v3election resign → campaign returns",
            &anchor,
        )?,
        // v3election has no hand-over: its resign is the nearest figure.
        latency_row(
            "hand_over past a waiter (in process)",
            "Leadership::hand_over → the target's campaign returns",
            &handed,
            "v3election resign → campaign returns",
            &anchor,
        )?,
    ])
}

/// Leader A hands over to C while B waits ahead of C: from A's
/// `hand_over` call to C's campaign returning (one read, one txn, C's
/// watch event and read). All three are ranked at priority 0.
fn hand_over_samples(cfg: &Config, n: usize) -> Res<Vec<Duration>> {
    let options = ElectionOptions::default()
        .with_ttl(Duration::from_secs(10))
        .with_priority(0);
    let connect = || Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default());
    let (ea, eb, ec) = (connect()?, connect()?, connect()?);
    let a = Election::with_options(&ea, "bench-hand-over", options.clone())?;
    let b = Election::with_options(&eb, "bench-hand-over", options.clone())?;
    let c = Election::with_options(&ec, "bench-hand-over", options)?;
    let raw = Raw::connect(&cfg.endpoint)?;
    let prefix = a.key_prefix().to_string();
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let la = a.campaign(b"a")?;
        let d = std::thread::scope(|s| -> Res<Duration> {
            let wb = s.spawn(|| b.campaign(b"b"));
            wait_candidates(&raw, &prefix, 2)?;
            let wc = s.spawn(|| c.campaign(b"c").map(|l| (Instant::now(), l)));
            wait_candidates(&raw, &prefix, 3)?;
            let t = Instant::now();
            la.hand_over("c")?;
            let (elected, lc) = wc.join().map_err(|_| "campaign thread panicked")??;
            let d = elected.duration_since(t);
            lc.resign()?;
            wb.join()
                .map_err(|_| "campaign thread panicked")??
                .resign()?;
            Ok(d)
        })?;
        samples.push(d);
    }
    a.close()?;
    b.close()?;
    c.close()?;
    Ok(samples)
}

/// The semaphore beside the election rows: an uncontested acquire of one
/// of 2 permits (one permit already held by another handle, so the
/// acquire is the second holder's), and the hand-over when one of two
/// holders releases while a third waits, from the release call to the
/// waiter's `acquire` returning. etcd has no semaphore of its own: the
/// anchors are the same v3election campaign and resign → campaign
/// hand-over as the election rows, the nearest operation etcd serves.
pub fn semaphore(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(100, 5);
    let options = fleetcoord::LockOptions::default().with_ttl(Duration::from_secs(10));
    let connect = || Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default());
    let (ea, eb, ec) = (connect()?, connect()?, connect()?);
    let a = Semaphore::with_options(&ea, "bench-semaphore", 2, options.clone())?;
    let b = Semaphore::with_options(&eb, "bench-semaphore", 2, options.clone())?;
    let c = Semaphore::with_options(&ec, "bench-semaphore", 2, options)?;
    let prefix = a.key_prefix().to_string();
    let ra = Raw::connect(&cfg.endpoint)?;
    let rb = Raw::connect(&cfg.endpoint)?;
    let (lease_a, ka) = raw_session(&ra, 10)?;
    let (lease_b, kb) = raw_session(&rb, 10)?;
    // Not timed: the first acquires wait for their sessions' grants.
    a.acquire()?.release()?;
    b.acquire()?.release()?;
    c.acquire()?.release()?;
    let held = a.acquire()?;
    let raw_name = "/bench/raw-semaphore-campaign";
    let (acquire, acquire_anchor) = interleave(
        n,
        |_| {
            let t = Instant::now();
            let guard = b.acquire()?;
            let d = t.elapsed();
            guard.release()?;
            Ok(d)
        },
        |_| {
            let t = Instant::now();
            let leader = raw_campaign(&ra, raw_name, "me", lease_a)?;
            let d = t.elapsed();
            raw_resign(&ra, leader)?;
            Ok(d)
        },
    )?;
    let raw_name = "/bench/raw-semaphore-handover";
    let (handover, handover_anchor) = interleave(
        n,
        |_| {
            let gb = b.acquire()?;
            std::thread::scope(|s| {
                let waiter = s.spawn(|| c.acquire().map(|g| (Instant::now(), g)));
                wait_candidates(&ra, &prefix, 3)?;
                let t = Instant::now();
                gb.release()?;
                let (held_at, gc) = waiter.join().map_err(|_| "acquire thread panicked")??;
                let d = held_at.duration_since(t);
                gc.release()?;
                Ok(d)
            })
        },
        |_| raw_handover(&ra, &rb, raw_name, (lease_a, lease_b)),
    )?;
    ka.abort();
    kb.abort();
    held.release()?;
    a.close()?;
    b.close()?;
    c.close()?;
    Ok(vec![
        latency_row(
            "semaphore acquire, 2nd of 2 permits (in process)",
            "Semaphore::acquire returns",
            &acquire,
            "v3election campaign returns (etcd has no semaphore)",
            &acquire_anchor,
        )?,
        latency_row(
            "semaphore hand-over on release, 2 permits (in process)",
            "SemaphoreGuard::release → waiter's Semaphore::acquire returns",
            &handover,
            "v3election resign → campaign returns",
            &handover_anchor,
        )?,
    ])
}

/// Every message etcd's gRPC server received, over all methods (a unary
/// call is one, a keepalive or watch request on a stream one each), from
/// its `/metrics` on the client port: what a block of operations cost
/// etcd in requests, taken before and after it.
pub(crate) fn etcd_requests(endpoint: &str) -> Res<u64> {
    let host = endpoint
        .split(',')
        .next()
        .unwrap_or(endpoint)
        .trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(host)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET /metrics HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    let mut total = 0u64;
    let mut seen = false;
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("grpc_server_msg_received_total{") else {
            continue;
        };
        let value = rest.rsplit(' ').next().unwrap_or("");
        let n = value
            .parse::<f64>()
            .map_err(|e| format!("grpc_server_msg_received_total {value:?}: {e}"))?;
        total = total.saturating_add(n as u64);
        seen = true;
    }
    if !seen {
        return Err("etcd's /metrics has no grpc_server_msg_received_total".into());
    }
    Ok(total)
}

/// etcd requests per operation: `ops` run `k` times alone, counted by
/// etcd (a session renewal falling inside adds a little: k is large
/// enough that it stays in the second decimal).
fn requests_per_op(cfg: &Config, k: usize, mut op: impl FnMut(usize) -> Res<()>) -> Res<f64> {
    let before = etcd_requests(&cfg.endpoint)?;
    for i in 0..k {
        op(i)?;
    }
    let after = etcd_requests(&cfg.endpoint)?;
    Ok(after.saturating_sub(before) as f64 / k as f64)
}

/// A read acquire and release of a read-write lock nobody writes: from
/// the call of `RwLock::read` to the return of `RwLockGuard::unlock`,
/// sessions granted beforehand on both sides. The anchor is what a user
/// writes with etcd-client for the same work, Go's `RWMutex.RLock` and
/// `RUnlock`: put the own key under `<root>read/` on the lease, range
/// `<root>write/` for the newest writer created before it (the filter
/// Go's `waitOnLastRev` uses; none here, so no wait), delete the key.
/// Both sides' etcd requests per acquire + release are counted too.
pub fn rwlock(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(500, 20);
    let k = cfg.samples(200, 20);
    let etcd = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let options = LockOptions::default().with_ttl(Duration::from_secs(10));
    let lock = RwLock::with_options(&etcd, "bench-rwlock", options)?;
    let raw = Raw::connect(&cfg.endpoint)?;
    let (lease, keeper) = raw_session(&raw, 10)?;
    let root = "/bench/raw-rwlock/";
    let own = format!("{root}read/{lease:x}");
    let writers = format!("{root}write/");
    // Not timed: the first read waits for the session's lease grant,
    // which the raw side did in `raw_session`.
    lock.read()?.unlock()?;
    let ours = || -> Res<()> {
        lock.read()?.unlock()?;
        Ok(())
    };
    let anchor = || -> Res<()> {
        let mut c = raw.client();
        raw.block_on(async {
            let put = c
                .put(own.as_str(), "", Some(PutOptions::new().with_lease(lease)))
                .await?;
            let created = put.header().map_or(0, |h| h.revision());
            let newest_writer = c
                .get(
                    writers.as_str(),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Create, SortOrder::Descend)
                            .with_limit(1)
                            .with_max_create_revision(created - 1),
                    ),
                )
                .await?;
            if !newest_writer.kvs().is_empty() {
                return Err::<(), crate::BoxError>("a writer in the raw anchor's lock".into());
            }
            c.delete(own.as_str(), None).await?;
            Ok(())
        })
    };
    let (read, read_anchor) = interleave(
        n,
        |_| {
            let t = Instant::now();
            ours()?;
            Ok(t.elapsed())
        },
        |_| {
            let t = Instant::now();
            anchor()?;
            Ok(t.elapsed())
        },
    )?;
    let ours_requests = requests_per_op(cfg, k, |_| ours())?;
    let anchor_requests = requests_per_op(cfg, k, |_| anchor())?;
    keeper.abort();
    lock.close()?;
    Ok(vec![
        latency_row(
            "RwLock read acquire + release, uncontended (in process)",
            "RwLock::read → RwLockGuard::unlock returns",
            &read,
            "etcd-client put own key on lease, range older writers, delete (Go's RLock/RUnlock)",
            &read_anchor,
        )?,
        Row::new(
            "RwLock read acquire + release: etcd requests per pair",
            Side::amount("RwLock read + unlock", ours_requests, "req"),
            Some(Side::amount("put + range + delete", anchor_requests, "req")),
        ),
    ])
}

/// What one permit of a fleet-wide rate limit costs the caller: a
/// `RateLimit` grants from its share without asking etcd. The anchor is
/// the equal-work limiter that does ask etcd per permit, a shared
/// counter of permits left, decremented under a guard: read the counter,
/// then a txn that writes the count less one if the counter's
/// mod-revision is still the one read (2 requests per permit,
/// uncontended; a real one also refills it). etcd's requests per permit
/// are counted on both sides: a `RateLimit`'s traffic is its membership
/// (a lease renewal every TTL/3 and a watch), not its permits.
pub fn ratelimit(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(1000, 100);
    let k = cfg.samples(1000, 100);
    let etcd = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let options = RateLimitOptions::default()
        .with_window(Duration::from_millis(100))
        .with_lag(Duration::ZERO)
        .with_ttl(Duration::from_secs(10));
    // A share no sample can exhaust: the row is the grant's cost, not a wait.
    let limit = RateLimit::with_options(&etcd, "bench-ratelimit", 1_000_000, options)?;
    // Not timed: the first acquire waits for the join (a window).
    limit.acquire()?;
    let raw = Raw::connect(&cfg.endpoint)?;
    let counter = "/bench/raw-ratelimit";
    {
        let mut c = raw.client();
        raw.block_on(c.put(counter, u64::MAX.to_string(), None))?;
    }
    let anchor = || -> Res<()> {
        let mut c = raw.client();
        raw.block_on(async {
            let got = c.get(counter, None).await?;
            let kv = got.kvs().first().ok_or("the raw counter is gone")?;
            let left: u64 = kv.value_str()?.parse()?;
            let next = left.checked_sub(1).ok_or("the raw counter ran out")?;
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    counter,
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([TxnOp::put(counter, next.to_string(), None)]);
            if !c.txn(txn).await?.succeeded() {
                return Err::<(), crate::BoxError>(
                    "the raw counter changed under the bench".into(),
                );
            }
            Ok(())
        })
    };
    let (grant, grant_anchor) = interleave(
        n,
        |_| {
            let t = Instant::now();
            limit.acquire()?;
            Ok(t.elapsed())
        },
        |_| {
            let t = Instant::now();
            anchor()?;
            Ok(t.elapsed())
        },
    )?;
    let ours_requests = requests_per_op(cfg, k, |_| {
        limit.acquire()?;
        Ok(())
    })?;
    let anchor_requests = requests_per_op(cfg, k, |_| anchor())?;
    limit.close()?;
    Ok(vec![
        latency_row(
            "RateLimit grant cost per permit (in process)",
            "RateLimit::acquire returns (share of 1,000,000 per 100 ms)",
            &grant,
            "etcd-client guarded counter decrement per permit (get + txn on mod revision)",
            &grant_anchor,
        )?,
        Row::new(
            "RateLimit: etcd requests per permit",
            Side::amount("RateLimit::acquire", ours_requests, "req"),
            Some(Side::amount("get + guarded txn", anchor_requests, "req")),
        ),
    ])
}

/// Process level: leader process gets SIGINT (both resign on it) while a
/// second process of the same kind waits; from the signal to the second
/// one printing that it leads. `fleetcoord elect` vs `etcdctl elect`.
pub fn elect_cli(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(20, 2);
    let bin = process::fleetcoord_bin()?;
    let raw = Raw::connect(&cfg.endpoint)?;
    let ours_prefix = "/coord/election/bench-cli/";
    let etcdctl_name = "/bench/etcdctl-elect";
    let etcdctl_prefix = format!("{etcdctl_name}/");
    let ours_cmd = |i: usize| {
        let mut c = Command::new(&bin);
        c.args([
            "--endpoints",
            &cfg.endpoint,
            "elect",
            "bench-cli",
            "--value",
        ])
        .arg(format!("cand-{i}"));
        c
    };
    let etcdctl_cmd = |i: usize| {
        let mut c = Command::new("etcdctl");
        c.env("ETCDCTL_API", "3")
            .args(["--endpoints", &cfg.endpoint, "elect", etcdctl_name])
            .arg(format!("cand-{i}"));
        c
    };
    let ours_elected = |p: &Spawned| p.wait_line("leading as", WAIT);
    let etcdctl_elected = |p: &Spawned, i: usize| p.wait_line(&format!("cand-{i}"), WAIT);
    let mut ours_leader = Spawned::start(ours_cmd(0))?;
    ours_elected(&ours_leader)?;
    let mut etcdctl_leader = Spawned::start(etcdctl_cmd(0))?;
    etcdctl_elected(&etcdctl_leader, 0)?;
    let (ours, anchor) = interleave(
        n,
        |i| {
            let next = Spawned::start(ours_cmd(i + 1))?;
            wait_candidates(&raw, ours_prefix, 2)?;
            let t = Instant::now();
            process::send_signal(ours_leader.pid(), "INT")?;
            ours_elected(&next)?;
            let d = t.elapsed();
            ours_leader.wait_exit(WAIT)?;
            ours_leader = next;
            Ok(d)
        },
        |i| {
            let next = Spawned::start(etcdctl_cmd(i + 1))?;
            wait_candidates(&raw, &etcdctl_prefix, 2)?;
            let t = Instant::now();
            process::send_signal(etcdctl_leader.pid(), "INT")?;
            etcdctl_elected(&next, i + 1)?;
            let d = t.elapsed();
            etcdctl_leader.wait_exit(WAIT)?;
            etcdctl_leader = next;
            Ok(d)
        },
    )?;
    ours_leader.signal_and_wait("INT", WAIT)?;
    etcdctl_leader.signal_and_wait("INT", WAIT)?;
    Ok(vec![latency_row(
        "handover on SIGINT (processes)",
        "`fleetcoord elect` → next prints leading",
        &ours,
        "`etcdctl elect` → next prints its proposal",
        &anchor,
    )?])
}

/// A leader process SIGKILLed (TTL 2 s) while a candidate waits in this
/// process: from the kill to the candidate's campaign returning.
/// `fleetcoord elect` + `Election` vs a raw child + raw `campaign`.
/// (`etcdctl elect` cannot anchor this: its session TTL is fixed at 60 s.)
pub fn failover(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(6, 1);
    let ttl = 2u64;
    let bin = process::fleetcoord_bin()?;
    let me = process::self_bin()?;
    let etcd = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let candidate = Election::with_options(
        &etcd,
        "bench-failover",
        ElectionOptions::default().with_ttl(Duration::from_secs(ttl)),
    )?;
    let prefix = candidate.key_prefix().to_string();
    let raw = Raw::connect(&cfg.endpoint)?;
    let (lease, keeper) = raw_session(&raw, ttl as i64)?;
    let raw_name = "/bench/raw-failover";
    let raw_prefix = format!("{raw_name}/");
    let phase = |i: usize| Duration::from_millis(ttl * 1000 / 3 * ((i * 7) % 10) as u64 / 10);
    let (ours, anchor) = interleave(
        n,
        |i| {
            let mut cmd = Command::new(&bin);
            cmd.args(["--endpoints", &cfg.endpoint, "elect", "bench-failover"])
                .args(["--ttl", &format!("{ttl}s")]);
            let mut leader = Spawned::start(cmd)?;
            leader.wait_line("leading as", WAIT)?;
            std::thread::scope(|s| {
                let waiter = s.spawn(|| candidate.campaign(b"me").map(|l| (Instant::now(), l)));
                wait_candidates(&raw, &prefix, 2)?;
                std::thread::sleep(Duration::from_millis(700) + phase(i));
                let t = Instant::now();
                leader.kill()?;
                let (elected, l) = waiter.join().map_err(|_| "campaign thread panicked")??;
                let d = elected.duration_since(t);
                l.resign()?;
                Ok(d)
            })
        },
        |i| {
            let mut cmd = Command::new(&me);
            cmd.args([
                "child-raw-leader",
                &cfg.endpoint,
                raw_name,
                &ttl.to_string(),
            ]);
            let mut leader = Spawned::start(cmd)?;
            leader.wait_line("elected", WAIT)?;
            let mut c = raw.client();
            let waiter = raw.spawn(async move {
                let r = c.campaign(raw_name, "me", lease).await;
                (Instant::now(), r)
            });
            wait_candidates(&raw, &raw_prefix, 2)?;
            std::thread::sleep(Duration::from_millis(700) + phase(i));
            let t = Instant::now();
            leader.kill()?;
            let (elected, r) = raw.block_on(waiter)?;
            let d = elected.duration_since(t);
            let key = r?
                .take_leader()
                .ok_or("campaign answered without a leader key")?;
            raw_resign(&raw, key)?;
            Ok(d)
        },
    )?;
    keeper.abort();
    candidate.close()?;
    Ok(vec![latency_row(
        "crashed leader (SIGKILL) → new leader, TTL 2 s",
        "`fleetcoord elect` killed → Election::campaign returns",
        &ours,
        "raw child killed → v3election campaign returns",
        &anchor,
    )?])
}

/// `child-raw-leader ENDPOINT NAME TTL`: campaigns with a kept-alive lease,
/// prints `elected`, then holds until killed.
pub fn child_raw_leader(args: &[String]) -> Res<()> {
    let [endpoint, name, ttl] = args else {
        return Err("usage: child-raw-leader ENDPOINT NAME TTL_SECS".into());
    };
    let ttl: i64 = ttl.parse()?;
    let raw = Raw::connect(endpoint)?;
    let (lease, keeper) = raw_session(&raw, ttl)?;
    raw_campaign(&raw, name, "raw-leader", lease)?;
    println!("elected");
    raw.block_on(keeper)??;
    Ok(())
}
