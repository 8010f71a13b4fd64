//! [`LeaderObserver`]: the leader of an election as a stream.

use crate::driver::rand_seed;
use crate::election::LeaderInfo;
use crate::error::Result;
use crate::etcd::Etcd;
use fleetcoord_sm::observe::{Observe, ObserveConfig, ObserveInput, ObserveNotice};
use fleetcoord_sm::BackoffConfig;
use std::time::Instant;
use tokio::sync::mpsc;

/// Streams an election's leader: the current one first (`None` if nobody
/// campaigns), then every change — a new leader, a proclaimed value, or
/// `None` when the last candidate left. Consecutive duplicates are never
/// sent. After a dropped connection or compaction it re-reads the election
/// and reports the leader if it changed meanwhile.
#[must_use = "dropping a LeaderObserver stops observing"]
pub struct LeaderObserver {
    leaders: crossbeam_channel::Receiver<Option<LeaderInfo>>,
    input: mpsc::UnboundedSender<ObserveInput>,
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
        let (tx, leaders) = crossbeam_channel::unbounded();
        let input = etcd.run_machine(machine, move |notice| match notice {
            ObserveNotice::Leader(kv) => tx.send(kv.as_ref().map(LeaderInfo::from_kv)).is_ok(),
            #[allow(unreachable_patterns)]
            _ => true,
        })?;
        Ok(LeaderObserver {
            leaders,
            input,
            _etcd: etcd.clone(),
        })
    }

    /// The leader changes, in order.
    pub fn leaders(&self) -> &crossbeam_channel::Receiver<Option<LeaderInfo>> {
        &self.leaders
    }
}

impl Drop for LeaderObserver {
    fn drop(&mut self) {
        let _ = self.input.send(ObserveInput::Stop);
    }
}
