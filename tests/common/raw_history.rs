//! An independent history of key changes, for checkers that must not
//! trust fleetcoord's own view: raw etcd-client watches, one per member
//! and prefix, each on its own thread and connection, from revision 1 (the
//! test's cluster is fresh and never compacted). A watch whose stream
//! breaks (its member killed, or paused: HTTP/2 pings every second find
//! it) is opened again from the revision after the last one it delivered.
//! Changes are merged by (revision, key), keeping the earliest arrival at
//! any member: the time a change is said to have happened is then at most
//! a few ms after etcd applied it on the first member that did. For a
//! DELETE of a leased key, each watch asks its member at once whether the
//! lease still exists (a lease revocation, or a delete by the key's owner).
//!
//! Shared by the soak and the leader-pause test. Not every test that
//! includes it uses every part.
#![allow(dead_code)]

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// One PUT or DELETE, as the watches saw it first.
#[derive(Clone, Debug)]
pub struct Change {
    pub revision: i64,
    pub key: String,
    pub delete: bool,
    /// The key's create revision (for a DELETE, from the previous value;
    /// 0 if etcd did not send it).
    pub create_revision: i64,
    pub lease: i64,
    /// The earliest arrival at any member's watch.
    pub arrived: Instant,
    /// The member whose watch delivered it first.
    pub member: usize,
    /// For a DELETE of a key bound to a lease: whether that lease was gone
    /// right after (etcd answered TTL -1 or "not found" when asked at once
    /// on the member that delivered it): a revoked or expired lease rather
    /// than a delete of the key by its owner (a resign, a withdraw), after
    /// which the lease lives on. `None` when no member could be asked.
    pub lease_gone: Option<bool>,
}

/// The running watches; [`RawHistory::finish`] stops them and returns the
/// history.
pub struct RawHistory {
    stop: Arc<AtomicBool>,
    changes: Arc<Mutex<BTreeMap<(i64, String), Change>>>,
    threads: Vec<JoinHandle<()>>,
}

impl RawHistory {
    /// Watches every prefix in `prefixes` on every member in `endpoints`.
    pub fn start(endpoints: &[String], prefixes: &[&str]) -> RawHistory {
        let stop = Arc::new(AtomicBool::new(false));
        let changes = Arc::new(Mutex::new(BTreeMap::new()));
        let mut threads = Vec::new();
        for (member, endpoint) in endpoints.iter().enumerate() {
            for prefix in prefixes {
                let (endpoint, prefix) = (endpoint.clone(), prefix.to_string());
                let (stop, changes) = (stop.clone(), changes.clone());
                threads.push(thread::spawn(move || {
                    watch(member, &endpoint, &prefix, &stop, &changes)
                }));
            }
        }
        RawHistory {
            stop,
            changes,
            threads,
        }
    }

    /// Every change so far, in revision order (for a report while running).
    pub fn snapshot(&self) -> Vec<Change> {
        self.changes.lock().values().cloned().collect()
    }

    /// Waits `settle` for the last changes to arrive, stops the watches and
    /// returns every change in revision order.
    pub fn finish(self, settle: Duration) -> Vec<Change> {
        thread::sleep(settle);
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
        let changes = self.changes.lock().values().cloned().collect();
        changes
    }
}

/// The DELETE that ended the key `key` created at `create_revision`.
pub fn deletion<'a>(changes: &'a [Change], key: &str, create_revision: i64) -> Option<&'a Change> {
    changes
        .iter()
        .filter(|c| c.delete && c.key == key && c.revision > create_revision)
        .find(|c| c.create_revision == create_revision || c.create_revision == 0)
}

fn watch(
    member: usize,
    endpoint: &str,
    prefix: &str,
    stop: &AtomicBool,
    changes: &Mutex<BTreeMap<(i64, String), Change>>,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let ping = Duration::from_secs(1);
    runtime.block_on(async {
        let mut next = 1i64;
        while !stop.load(Ordering::SeqCst) {
            let options = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(1))
                .with_keep_alive(ping, ping);
            let Ok(Ok(mut client)) = tokio::time::timeout(
                Duration::from_secs(2),
                etcd_client::Client::connect([endpoint], Some(options)),
            )
            .await
            else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let from = etcd_client::WatchOptions::new()
                .with_prefix()
                .with_prev_key()
                .with_start_revision(next);
            let Ok(Ok(mut stream)) =
                tokio::time::timeout(Duration::from_secs(2), client.watch(prefix, Some(from)))
                    .await
            else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            while !stop.load(Ordering::SeqCst) {
                let message = match tokio::time::timeout(
                    Duration::from_millis(200),
                    stream.message(),
                )
                .await
                {
                    Err(_) => continue,
                    Ok(Ok(Some(m))) => m,
                    Ok(_) => break,
                };
                let arrived = Instant::now();
                if message.canceled() {
                    break;
                }
                let mut newest = next - 1;
                let mut found = Vec::new();
                for event in message.events() {
                    let Some(kv) = event.kv() else { continue };
                    let delete = event.event_type() == etcd_client::EventType::Delete;
                    let (create_revision, lease) = if delete {
                        event
                            .prev_kv()
                            .map_or((0, 0), |p| (p.create_revision(), p.lease()))
                    } else {
                        (kv.create_revision(), kv.lease())
                    };
                    found.push(Change {
                        revision: kv.mod_revision(),
                        key: String::from_utf8_lossy(kv.key()).into_owned(),
                        delete,
                        create_revision,
                        lease,
                        arrived,
                        member,
                        lease_gone: None,
                    });
                }
                for change in found.iter_mut().filter(|c| c.delete && c.lease != 0) {
                    let asked = tokio::time::timeout(
                        Duration::from_millis(500),
                        client.lease_time_to_live(change.lease, None),
                    )
                    .await;
                    change.lease_gone = match asked {
                        Ok(Ok(answer)) => Some(answer.ttl() < 0),
                        Ok(Err(e)) if e.to_string().contains("not found") => Some(true),
                        _ => None,
                    };
                }
                let mut changes = changes.lock();
                for change in found {
                    newest = newest.max(change.revision);
                    changes
                        .entry((change.revision, change.key.clone()))
                        .and_modify(|c| {
                            let gone = c.lease_gone.or(change.lease_gone);
                            if change.arrived < c.arrived {
                                *c = change.clone();
                            }
                            c.lease_gone = c.lease_gone.or(gone);
                        })
                        .or_insert(change);
                }
                next = newest + 1;
            }
        }
    });
}
