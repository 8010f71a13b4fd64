//! What an election and a semaphore cost etcd as their queue grows: the
//! same hand-over and try-campaign with 100 and with 10,000 waiting keys of
//! 1 KiB under the election's prefix. Each size's p50 is compared with the
//! smallest size's, and etcd's own count of bytes it sent to clients
//! (`/metrics`) is divided by the operations in the window.
//!
//! The waiting keys are written directly (`<prefix><16 hex digits>`, the
//! key a Go or `etcdctl elect` candidate writes) on one lease, younger than
//! the candidates measured, so they never lead: to etcd a queued key is a
//! queued key, whoever keeps its lease alive. Every sample rewrites them
//! after the next waiter has queued, so the two candidates measured are
//! always the oldest.

use crate::report::{Row, Side};
use crate::{Config, Res};
use fleetcoord::{Election, ElectionOptions, Etcd, EtcdOptions, Leadership};
use fleetcoord::{Semaphore, SemaphoreGuard};
use std::io::{Read as _, Write as _};
use std::time::{Duration, Instant};

const VALUE_BYTES: usize = 1024;
/// Keys a filler txn writes (etcd takes at most 128 operations per txn).
const TXN_OPS: usize = 128;
/// What every filler key starts with after the election's prefix: a lease
/// in hex that no etcd member here grants (member ids make the high bits).
const FILLER_MARK: &str = "f00000";

/// The waiting-queue sizes measured (`--quick`: small ones, numbers only).
fn sizes(cfg: &Config) -> Vec<usize> {
    if cfg.quick {
        vec![10, 100]
    } else {
        vec![100, 10_000]
    }
}

pub fn run(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(21, 3);
    let mut rows = Vec::new();
    let mut base: Option<[Vec<Duration>; 3]> = None;
    for waiters in sizes(cfg) {
        let e = election(cfg, waiters, n)?;
        let s = semaphore(cfg, waiters, n)?;
        let samples = [
            e.handover.clone(),
            e.try_campaign.clone(),
            s.handover.clone(),
        ];
        let labels = [
            "election: resign → next leads",
            "election: try_campaign (not elected)",
            "semaphore (2 permits): release → next holds",
        ];
        let base_samples = base.get_or_insert_with(|| samples.clone()).clone();
        for ((label, ours), anchor) in labels.iter().zip(&samples).zip(&base_samples) {
            let figure = format!("{label}, {waiters} waiters × 1 KiB");
            let ours_side = Side::latency(format!("at {waiters}"), ours)
                .ok_or_else(|| format!("{figure}: no samples"))?;
            let anchor_side = Side::latency(format!("at {}", sizes(cfg)[0]), anchor)
                .ok_or_else(|| format!("{figure}: no anchor samples"))?;
            rows.push(Row::new(figure, ours_side, Some(anchor_side)));
        }
        for (label, bytes) in [
            (
                "election: etcd bytes sent per resign → next",
                e.handover_bytes,
            ),
            ("election: etcd bytes sent per try_campaign", e.try_bytes),
            (
                "semaphore: etcd bytes sent per release → next",
                s.handover_bytes,
            ),
        ] {
            rows.push(Row::new(
                format!("{label}, {waiters} waiters"),
                Side::amount("etcd /metrics", bytes, "B"),
                None,
            ));
        }
    }
    Ok(rows)
}

struct Figures {
    handover: Vec<Duration>,
    handover_bytes: f64,
    try_campaign: Vec<Duration>,
    try_bytes: f64,
}

/// etcd's counter of bytes sent to gRPC clients, from its `/metrics`.
fn sent_bytes(endpoint: &str) -> Res<f64> {
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
    body.lines()
        .find_map(|l| l.strip_prefix("etcd_network_client_grpc_sent_bytes_total "))
        .ok_or("etcd's /metrics has no etcd_network_client_grpc_sent_bytes_total")?
        .trim()
        .parse::<f64>()
        .map_err(|e| format!("etcd_network_client_grpc_sent_bytes_total: {e}").into())
}

/// The filler keys: `waiters` keys of 1 KiB under `prefix`, on `lease`.
struct Fillers {
    raw: crate::raw::Raw,
    prefix: String,
    lease: i64,
    waiters: usize,
}

impl Fillers {
    fn new(cfg: &Config, prefix: &str, waiters: usize) -> Res<Fillers> {
        let raw = crate::raw::Raw::connect(&cfg.endpoint)?;
        let mut c = raw.client();
        let lease = raw.block_on(c.lease_grant(3600, None))?.id();
        Ok(Fillers {
            raw,
            prefix: prefix.to_string(),
            lease,
            waiters,
        })
    }

    fn clear(&self) -> Res<()> {
        self.raw
            .delete_prefix(&format!("{}{FILLER_MARK}", self.prefix))
    }

    /// Writes every filler key again: younger than every key already there.
    fn write(&self) -> Res<()> {
        let value = vec![b'w'; VALUE_BYTES];
        let keys: Vec<String> = (0..self.waiters)
            .map(|i| format!("{}{FILLER_MARK}{i:010x}", self.prefix))
            .collect();
        for chunk in keys.chunks(TXN_OPS) {
            let ops: Vec<etcd_client::TxnOp> = chunk
                .iter()
                .map(|k| {
                    etcd_client::TxnOp::put(
                        k.as_str(),
                        value.clone(),
                        Some(etcd_client::PutOptions::new().with_lease(self.lease)),
                    )
                })
                .collect();
            let mut c = self.raw.client();
            self.raw
                .block_on(c.txn(etcd_client::Txn::new().and_then(ops)))?;
        }
        Ok(())
    }

    fn close(self) -> Res<()> {
        let mut c = self.raw.client();
        self.raw.block_on(c.lease_revoke(self.lease))?;
        Ok(())
    }
}

/// Waits until `want` keys not written by [`Fillers`] are under `prefix`.
fn wait_real(raw: &crate::raw::Raw, prefix: &str, want: i64) -> Res<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let all = raw.count_prefix(prefix)?;
        let fillers = raw.count_prefix(&format!("{prefix}{FILLER_MARK}"))?;
        if all - fillers == want {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("{want} candidates never queued under {prefix}").into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // See `election::SETTLE`: the waiter's watch is caught up by etcd's
    // 100 ms loop; a real successor has waited far longer.
    std::thread::sleep(Duration::from_millis(150));
    Ok(())
}

fn median_share(total: f64, ops: usize) -> f64 {
    total / ops.max(1) as f64
}

fn election(cfg: &Config, waiters: usize, n: usize) -> Res<Figures> {
    let name = format!("bench-waiters-{waiters}");
    let options = ElectionOptions::default().with_ttl(Duration::from_secs(30));
    let etcd = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let a = Election::with_options(&etcd, &name, options.clone())?;
    let b = Election::with_options(&etcd, &name, options.clone())?;
    let c = Election::with_options(&etcd, &name, options)?;
    let prefix = a.key_prefix().to_string();
    let fillers = Fillers::new(cfg, &prefix, waiters)?;
    let mut handover = Vec::new();
    let mut handover_bytes = 0.0;
    let mut try_campaign = Vec::new();
    let mut try_bytes = 0.0;
    let value = vec![b'v'; VALUE_BYTES];
    // `leader` leads; `next` is the one that waits in each sample.
    let (mut leader, mut next) = (&a, &b);
    let mut held: Option<Leadership> = Some(leader.campaign(&value)?);
    for _ in 0..n {
        fillers.clear()?;
        std::thread::scope(|s| -> Res<()> {
            let waiter = s.spawn(|| next.campaign(&value).map(|l| (Instant::now(), l)));
            wait_real(&fillers.raw, &prefix, 2)?;
            fillers.write()?;
            std::thread::sleep(Duration::from_millis(150));
            // A try_campaign that finds a leader and the whole queue.
            let before = sent_bytes(&cfg.endpoint)?;
            let t = Instant::now();
            let r = c.try_campaign(&value)?;
            try_campaign.push(t.elapsed());
            try_bytes += sent_bytes(&cfg.endpoint)? - before;
            if !matches!(r, fleetcoord::TryCampaign::NotElected(_)) {
                return Err("try_campaign was elected past a leader".into());
            }
            let before = sent_bytes(&cfg.endpoint)?;
            let t = Instant::now();
            held.take().ok_or("no leader")?.resign()?;
            let (elected, l) = waiter.join().map_err(|_| "campaign thread panicked")??;
            handover.push(elected.duration_since(t));
            handover_bytes += sent_bytes(&cfg.endpoint)? - before;
            held = Some(l);
            Ok(())
        })?;
        std::mem::swap(&mut leader, &mut next);
    }
    if let Some(l) = held {
        l.resign()?;
    }
    fillers.close()?;
    a.close()?;
    b.close()?;
    c.close()?;
    Ok(Figures {
        handover,
        handover_bytes: median_share(handover_bytes, n),
        try_campaign,
        try_bytes: median_share(try_bytes, n),
    })
}

struct SemFigures {
    handover: Vec<Duration>,
    handover_bytes: f64,
}

fn semaphore(cfg: &Config, waiters: usize, n: usize) -> Res<SemFigures> {
    let name = format!("bench-waiters-sem-{waiters}");
    let etcd = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let sems: Vec<Semaphore> = (0..3)
        .map(|_| Semaphore::new(&etcd, &name, 2))
        .collect::<fleetcoord::Result<_>>()?;
    let prefix = sems[0].key_prefix().to_string();
    let fillers = Fillers::new(cfg, &prefix, waiters)?;
    let mut handover = Vec::new();
    let mut bytes = 0.0;
    // Holders oldest first, then the one that waits.
    let mut holders: std::collections::VecDeque<(usize, SemaphoreGuard)> =
        std::collections::VecDeque::new();
    holders.push_back((0, sems[0].acquire()?));
    holders.push_back((1, sems[1].acquire()?));
    let mut waiting = 2;
    for _ in 0..n {
        fillers.clear()?;
        let (released, guard) = holders.pop_front().ok_or("no holder")?;
        std::thread::scope(|s| -> Res<()> {
            let sem = &sems[waiting];
            let w = s.spawn(|| sem.acquire().map(|g| (Instant::now(), g)));
            wait_real(&fillers.raw, &prefix, 3)?;
            fillers.write()?;
            std::thread::sleep(Duration::from_millis(150));
            let before = sent_bytes(&cfg.endpoint)?;
            let t = Instant::now();
            guard.release()?;
            let (acquired, g) = w.join().map_err(|_| "acquire thread panicked")??;
            handover.push(acquired.duration_since(t));
            bytes += sent_bytes(&cfg.endpoint)? - before;
            holders.push_back((waiting, g));
            Ok(())
        })?;
        waiting = released;
    }
    for (_, g) in holders {
        g.release()?;
    }
    fillers.close()?;
    for s in sems {
        s.close()?;
    }
    Ok(SemFigures {
        handover,
        handover_bytes: median_share(bytes, n),
    })
}
