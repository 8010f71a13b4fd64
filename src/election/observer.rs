//! [`LeaderObserver`]: the leader of an election as a stream.

use super::LeaderInfo;
use crate::driver::{rand_seed, FeedItem, FeedSink, MachineHandle};
use crate::error::Result;
use crate::etcd::Etcd;
use fleetcoord_sm::observe::{Observe, ObserveConfig, ObserveNotice};
use fleetcoord_sm::BackoffConfig;
use std::time::Instant;

/// Leader changes kept for a reader that does not keep up; past it the
/// observer pauses and, once read, reports the leader of that moment (the
/// one backpressure policy of watch-fed receivers).
const CAPACITY: usize = 1024;

/// Streams an election's leader: the current one first (`None` if nobody
/// campaigns), then every change — a new leader, a proclaimed value, or
/// `None` when the last candidate left. Consecutive duplicates are never
/// sent. After a dropped connection or compaction it re-reads the election
/// and reports the leader if it changed meanwhile. The channel holds 1,024
/// changes; a reader further behind sees the intermediate leaders coalesced
/// into the current one, never a missed final state. An error retrying
/// cannot fix (the etcd user may not read the election's keys) is logged
/// with `log::warn` and ends the channel.
#[must_use = "dropping a LeaderObserver stops observing"]
pub struct LeaderObserver {
    leaders: crossbeam_channel::Receiver<Option<LeaderInfo>>,
    /// Dropping it stops observing.
    _machine: MachineHandle<Observe>,
    _etcd: Etcd,
}

impl std::fmt::Debug for LeaderObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderObserver").finish_non_exhaustive()
    }
}

impl LeaderObserver {
    pub(crate) fn start(etcd: &Etcd, prefix: &str) -> Result<LeaderObserver> {
        let config = ObserveConfig {
            prefix: prefix.as_bytes().to_vec(),
            backoff: BackoffConfig::default(),
        };
        let machine = Observe::new(config, Instant::now(), rand_seed());
        let (feed, leaders) = FeedSink::new(CAPACITY, |notice| match notice {
            ObserveNotice::Leader(kv) => FeedItem::Item(kv.as_ref().map(LeaderInfo::from_kv)),
            ObserveNotice::Failed(e) => {
                log::warn!("leader observer gave up, its changes end here: {e}");
                FeedItem::End
            }
            #[allow(unreachable_patterns)]
            _ => FeedItem::Skip,
        });
        let machine = etcd.run(machine, feed)?;
        Ok(LeaderObserver {
            leaders,
            _machine: machine,
            _etcd: etcd.clone(),
        })
    }

    /// The leader changes, in order.
    pub fn leaders(&self) -> &crossbeam_channel::Receiver<Option<LeaderInfo>> {
        &self.leaders
    }
}
