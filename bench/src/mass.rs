//! Mass failure: 5,000 hosts stop renewing at once (their leases granted
//! together, TTL 5 s, never kept alive — what a rack losing power looks
//! like to etcd), and a synced HostWatcher has to report every `Down`.
//! The anchor is etcd's own pace, read by a raw etcd-client watch on the
//! same prefix in the same process: etcd expires at most ~1,000 leases a
//! second, so the last DELETE comes at least 5 s after the first. The
//! figure is the time from the last grant to the last event each side
//! saw, and how far the watcher lagged the raw watch at the end.

use crate::raw::{Raw, RawEvent};
use crate::report::{Row, Side};
use crate::{Config, Res};
use etcd_client::{Txn, TxnOp};
use fleetcoord::{Etcd, EtcdOptions, HostEvent, HostWatcher, WatcherOptions};
use std::time::{Duration, Instant};
use uuid::Uuid;

const TTL_SECS: i64 = 5;
/// Puts per population txn (etcd's default limit is 128 ops per txn).
const BATCH: usize = 128;

pub fn run(cfg: &Config) -> Res<Vec<Row>> {
    let hosts = if cfg.quick { 50 } else { 5_000 };
    let prefix = format!("/bench/mass/{}/", std::process::id());
    let raw = Raw::connect_workers(&cfg.endpoint, 2)?;
    let raw_events = raw.watch_prefix(&prefix)?;
    let etcd = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let watcher = HostWatcher::with_options(
        &etcd,
        WatcherOptions::default().with_prefix(prefix.as_str()),
    )?;
    wait_synced(&watcher)?;

    // Grant every lease first, then bind the keys: expiry starts with the
    // grants, so the keys go in before the first lease can expire.
    let mut client = raw.client();
    let grants: Vec<i64> = raw.block_on(async {
        let mut leases = Vec::with_capacity(hosts);
        for _ in 0..hosts {
            leases.push(client.lease_grant(TTL_SECS, None).await?.id());
        }
        Ok::<_, etcd_client::Error>(leases)
    })?;
    let granted = Instant::now();
    for chunk in grants.chunks(BATCH) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|lease| {
                // Host keys are `<prefix><uuid>`.
                TxnOp::put(
                    format!("{prefix}{}", Uuid::new_v4()),
                    "meta",
                    Some(etcd_client::PutOptions::new().with_lease(*lease)),
                )
            })
            .collect();
        raw.block_on(client.txn(Txn::new().and_then(ops)))?;
    }

    let limit = Duration::from_secs(120);
    let (mut ups, mut downs, mut raw_deletes) = (0usize, 0usize, 0usize);
    let (mut watcher_done, mut raw_done) = (None, None);
    while (watcher_done.is_none() || raw_done.is_none()) && granted.elapsed() < limit {
        while let Ok(event) = raw_events.try_recv() {
            if matches!(event, RawEvent::Delete(_)) {
                raw_deletes += 1;
                if raw_deletes == hosts {
                    raw_done = Some(granted.elapsed());
                }
            }
        }
        match watcher.events().recv_timeout(Duration::from_millis(5)) {
            Ok(HostEvent::Up(_)) => ups += 1,
            Ok(HostEvent::Down(..)) => {
                downs += 1;
                if downs == hosts {
                    watcher_done = Some(granted.elapsed());
                }
            }
            Ok(_) | Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (Some(watcher_done), Some(raw_done)) = (watcher_done, raw_done) else {
        return Err(format!(
            "after {limit:?}: watcher saw {ups} Up, {downs} Down; the raw watch {raw_deletes} deletes, of {hosts}"
        )
        .into());
    };
    eprintln!(
        "mass-failure: {hosts} hosts, last Down {watcher_done:.2?} after the last grant, last raw DELETE {raw_done:.2?}"
    );
    let label =
        format!("{hosts} hosts die at once (TTL {TTL_SECS} s): last event after the grants");
    Ok(vec![Row::new(
        label,
        Side::amount("HostWatcher, last Down", watcher_done.as_secs_f64(), "s"),
        Some(Side::amount(
            "etcd-client watch, last DELETE",
            raw_done.as_secs_f64(),
            "s",
        )),
    )])
}

fn wait_synced(watcher: &HostWatcher) -> Res<()> {
    loop {
        if let HostEvent::Synced = watcher.events().recv_timeout(Duration::from_secs(30))? {
            return Ok(());
        }
    }
}
