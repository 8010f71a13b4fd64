//! HostWatcher → Synced over a populated prefix vs a raw paginated range
//! read at one revision, each sample in a fresh child process so that its
//! peak RSS (VmHWM) is that side's alone.

use crate::process;
use crate::raw::Raw;
use crate::report::{latency_row, Row, Side};
use crate::stats;
use crate::{Config, Res};
use etcd_client::{GetOptions, Txn, TxnOp};
use fleetcoord::{Etcd, EtcdOptions, HostEvent, HostWatcher, WatcherOptions};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// fleetcoord's page size (`DEFAULT_PAGE_SIZE` of the watch machine); the
/// raw read uses the same.
const PAGE: i64 = 1000;
/// Puts per population txn (etcd's default limit is 128 ops per txn).
const BATCH: usize = 128;

struct Case {
    hosts: usize,
    value: usize,
    samples: usize,
    /// Each host key with its incarnation key, as `HostLiveness` writes
    /// them: twice the keys for both sides to read.
    incarnations: bool,
}

pub fn run(cfg: &Config) -> Res<Vec<Row>> {
    // Quick mode keeps every row but divides the fleet by 100.
    let scale = if cfg.quick { 100 } else { 1 };
    let cases = [
        Case {
            hosts: 1_000,
            value: 32,
            samples: cfg.samples(20, 2),
            incarnations: false,
        },
        Case {
            hosts: 10_000,
            value: 32,
            samples: cfg.samples(10, 2),
            incarnations: false,
        },
        Case {
            hosts: 10_000,
            value: 32,
            samples: cfg.samples(10, 2),
            incarnations: true,
        },
        Case {
            hosts: 100_000,
            value: 32,
            samples: cfg.samples(3, 1),
            incarnations: false,
        },
        Case {
            hosts: 10_000,
            value: 1024,
            samples: cfg.samples(5, 1),
            incarnations: false,
        },
    ];
    let raw = Raw::connect(&cfg.endpoint)?;
    let mut rows = Vec::new();
    for case in cases {
        let hosts = case.hosts / scale;
        let mut label = format!("{} × {}", count_label(hosts), size_label(case.value));
        let mut prefix = format!("/bench/watch/{hosts}x{}/", case.value);
        if case.incarnations {
            label.push_str(" + incarnation keys");
            prefix = format!("/bench/watch/{hosts}x{}i/", case.value);
        }
        populate(&raw, &prefix, hosts, case.value, case.incarnations)?;
        let mut times = [Vec::new(), Vec::new(), Vec::new()];
        let mut peak = [0.0f64; 3];
        for i in 0..case.samples {
            let order: [usize; 3] = if i % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
            for side in order {
                let r = process::run_child(&[
                    "child-watch".into(),
                    cfg.endpoint.clone(),
                    ["fleetcoord", "raw", "raw-bounded"][side].into(),
                    prefix.clone(),
                    hosts.to_string(),
                ])?;
                times[side].push(Duration::from_secs_f64(process::field(&r, "ms")? / 1000.0));
                peak[side] = peak[side].max(process::field(&r, "hwm")? / 1048576.0);
            }
        }
        raw.delete_prefix(&prefix)?;
        rows.push(latency_row(
            &format!("HostWatcher → Synced, {label}"),
            "HostWatcher::watch → Synced",
            &times[0],
            "paginated range read (1,000/page, one revision)",
            &times[1],
        )?);
        rows.push(latency_row(
            &format!("HostWatcher → Synced vs the cheapest raw read, {label}"),
            "HostWatcher::watch → Synced",
            &times[0],
            "paginated range read, each page's range bounded too",
            &times[2],
        )?);
        rows.push(Row::new(
            format!("peak RSS of the reading process, {label}"),
            Side::amount("HostWatcher (events kept)", peak[0], "MiB"),
            Some(Side::amount("raw range read (kvs kept)", peak[1], "MiB")),
        ));
    }
    Ok(rows)
}

fn count_label(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k hosts", n / 1000)
    } else {
        format!("{n} hosts")
    }
}

fn size_label(bytes: usize) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

/// `hosts` keys `<prefix><uuid>` (no lease: a watcher reads them the same)
/// in txns of [`BATCH`] puts; with `incarnations`, each with its
/// `<prefix><uuid>/incarnation` in the same txn, as `HostLiveness` writes
/// them (so the watcher joins them).
fn populate(raw: &Raw, prefix: &str, hosts: usize, value: usize, incarnations: bool) -> Res<()> {
    raw.delete_prefix(prefix)?;
    let payload = vec![b'm'; value];
    let mut c = raw.client();
    let mut left = hosts;
    let per_host = if incarnations { 2 } else { 1 };
    while left > 0 {
        let take = left.min(BATCH / per_host);
        let ops: Vec<TxnOp> = (0..take)
            .flat_map(|_| {
                let key = format!("{prefix}{}", Uuid::new_v4());
                let incarnation =
                    incarnations.then(|| TxnOp::put(format!("{key}/incarnation"), "1", None));
                incarnation
                    .into_iter()
                    .chain([TxnOp::put(key, payload.clone(), None)])
            })
            .collect();
        raw.block_on(c.txn(Txn::new().and_then(ops)))?;
        left -= take;
    }
    Ok(())
}

/// `child-watch ENDPOINT SIDE PREFIX HOSTS` (SIDE: fleetcoord, raw or
/// raw-bounded, see [`read_bounded`]): reads the prefix once and
/// reports the time (from a connection that has answered a request, on
/// both sides) and the process's peak RSS.
pub fn child_watch(args: &[String]) -> Res<()> {
    let [endpoint, side, prefix, hosts] = args else {
        return Err("usage: child-watch ENDPOINT fleetcoord|raw|raw-bounded PREFIX HOSTS".into());
    };
    let hosts: usize = hosts.parse()?;
    let (elapsed, got) = match side.as_str() {
        "fleetcoord" => {
            let etcd = Etcd::with_options(&[endpoint.as_str()], EtcdOptions::default())?;
            let t = Instant::now();
            let watcher = HostWatcher::with_options(
                &etcd,
                WatcherOptions::default().with_prefix(prefix.as_str()),
            )?;
            let mut up = Vec::with_capacity(hosts);
            loop {
                match watcher.events().recv_timeout(Duration::from_secs(60))? {
                    HostEvent::Up(h) => up.push(h),
                    HostEvent::Synced => break,
                    _ => {}
                }
            }
            let elapsed = t.elapsed();
            (elapsed, up.len())
        }
        "raw" | "raw-bounded" => {
            let raw = Raw::connect(endpoint)?;
            // etcd-client connects lazily; `Etcd::connect` returns only once
            // a request was answered. Both sides start the clock on a
            // connection that has answered one, so the raw side's time is
            // not its TCP and HTTP/2 handshake.
            raw.block_on(raw.client().status())?;
            let t = Instant::now();
            let kvs = if side == "raw" {
                raw.block_on(read_paged(raw.client(), prefix.as_bytes()))?
            } else {
                raw.block_on(read_bounded(raw.client(), prefix.as_bytes()))?
            };
            // The hosts are the keys one segment under the prefix.
            let hosts = kvs
                .iter()
                .filter(|(key, _)| !key.get(prefix.len()..).unwrap_or_default().contains(&b'/'))
                .count();
            (t.elapsed(), hosts)
        }
        other => return Err(format!("unknown side {other:?}").into()),
    };
    if got != hosts {
        return Err(format!("read {got} hosts, expected {hosts}").into());
    }
    process::print_result(&[
        ("ms", elapsed.as_secs_f64() * 1000.0),
        ("hwm", stats::status_bytes("VmHWM")? as f64),
    ]);
    Ok(())
}

/// Every key under `prefix` in pages of [`PAGE`], all at the first page's
/// revision, kept as (key, value) pairs.
async fn read_paged(
    mut client: etcd_client::Client,
    prefix: &[u8],
) -> Res<Vec<(Vec<u8>, Vec<u8>)>> {
    let end = prefix_end(prefix);
    let mut from = prefix.to_vec();
    let mut revision = 0;
    let mut out = Vec::new();
    loop {
        let mut options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let resp = client.get(from.clone(), Some(options)).await?;
        if revision == 0 {
            revision = resp.header().ok_or("range without a header")?.revision();
        }
        for kv in resp.kvs() {
            out.push((kv.key().to_vec(), kv.value().to_vec()));
        }
        match (resp.more(), resp.kvs().last()) {
            (true, Some(last)) => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok(out),
        }
    }
}

/// The first key after every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Where a key lies in the key space past `prefix`: its first 8 bytes
/// after the prefix as a number, so that a page's range end can be placed
/// by how densely the keys read so far lay.
fn position(prefix: &[u8], key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    for (b, k) in bytes
        .iter_mut()
        .zip(key.get(prefix.len()..).unwrap_or_default())
    {
        *b = *k;
    }
    u64::from_be_bytes(bytes)
}

/// The raw read with each page's range bounded, not only its limit: etcd
/// counts the rest of a page's range on every page, so a range end placed
/// about [`PAGE`] keys ahead (estimated from the keys read so far) keeps
/// that count near the page's own size, and the whole read linear.
pub(crate) async fn read_bounded(
    mut client: etcd_client::Client,
    prefix: &[u8],
) -> Res<Vec<(Vec<u8>, Vec<u8>)>> {
    let end = prefix_end(prefix);
    let mut from = prefix.to_vec();
    let mut at: u64 = 0;
    // A 64th of the key space first; every answer corrects it.
    let mut width: u64 = 1 << 58;
    let mut revision = 0;
    let mut out = Vec::new();
    loop {
        let (to, to_at) = match at.checked_add(width) {
            Some(p) => {
                let mut k = prefix.to_vec();
                k.extend_from_slice(&p.to_be_bytes());
                (k, Some(p))
            }
            None => (end.clone(), None),
        };
        let mut options = GetOptions::new().with_range(to.clone()).with_limit(PAGE);
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let resp = client.get(from.clone(), Some(options)).await?;
        if revision == 0 {
            revision = resp.header().ok_or("range without a header")?.revision();
        }
        let n = resp.kvs().len() as u64;
        for kv in resp.kvs() {
            out.push((kv.key().to_vec(), kv.value().to_vec()));
        }
        match (resp.more(), resp.kvs().last()) {
            (true, Some(last)) => {
                // PAGE keys lay between `at` and the last one.
                let last_at = position(prefix, last.key());
                width = last_at.saturating_sub(at).max(1);
                at = last_at;
                from = last.key().to_vec();
                from.push(0);
            }
            _ => {
                let Some(to_at) = to_at else {
                    return Ok(out);
                };
                // The whole range held `n` keys: aim for PAGE next time,
                // growing at most 16-fold.
                width = match n {
                    0 => width.saturating_mul(16),
                    n => (width / n)
                        .saturating_mul(PAGE as u64 * 9 / 10)
                        .min(width.saturating_mul(16)),
                }
                .max(1);
                at = to_at;
                from = to;
            }
        }
    }
}

/// The two raw reads of one prefix at 10,000 and 100,000 hosts: pages
/// running to the prefix end (etcd counts the rest of the prefix on each:
/// quadratic) against pages whose range is bounded too ([`read_bounded`]).
/// Which is the cheaper read for a watcher's snapshot to copy, in the same
/// process and run, interleaved; `--quick` uses 1,000 and 2,000 hosts.
pub fn compare_reads(cfg: &Config) -> Res<Vec<Row>> {
    let raw = Raw::connect(&cfg.endpoint)?;
    let mut rows = Vec::new();
    let sizes: [usize; 2] = if cfg.quick {
        [1_000, 2_000]
    } else {
        [10_000, 100_000]
    };
    for hosts in sizes {
        let prefix = format!("/bench/ranges-{hosts}/");
        populate(&raw, &prefix, hosts, 32, false)?;
        let (mut plain, mut bounded) = (Vec::new(), Vec::new());
        for _ in 0..cfg.samples(5, 1) {
            let t = Instant::now();
            let a = raw.block_on(read_paged(raw.client(), prefix.as_bytes()))?;
            plain.push(t.elapsed());
            let t = Instant::now();
            let b = raw.block_on(read_bounded(raw.client(), prefix.as_bytes()))?;
            bounded.push(t.elapsed());
            if a != b || a.len() != hosts {
                return Err(format!("reads differ: {} vs {}", a.len(), b.len()).into());
            }
        }
        rows.push(latency_row(
            &format!("raw read of {hosts} hosts"),
            "pages with bounded ranges",
            &bounded,
            "pages of 1000 to the prefix end",
            &plain,
        )?);
        raw.delete_prefix(&prefix)?;
    }
    Ok(rows)
}
