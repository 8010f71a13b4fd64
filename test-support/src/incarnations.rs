//! The ground truth of host incarnations for the watch machine's tests:
//! which incarnation was written with each state of a host key (in one
//! transaction, on one lease, as `HostLiveness` writes them), checked
//! against the [`WatchNotice::Incarnation`]s the machine tells. The watch
//! simulation (`sm/tests/sim/watch.rs`) and the watch fuzz target
//! (`fuzz/fuzz_targets/watch.rs`) feed it every write and every notice.
//!
//! The rule it holds the machine to: an `Up` or `Updated` comes right
//! after the incarnation written with that state, or after none when none
//! was; a `Down` or `Left` after the one last told for its key. One
//! allowance: a snapshot cannot see past an incarnation key rewritten or
//! deleted on its own since the host key's write ([`Incarnations::touched`]),
//! so such a state may be told with none.

use fleetcoord_sm::watch::WatchNotice;
use fleetcoord_sm::{KeyValue, LeaseId, Revision};
use std::collections::BTreeMap;

/// What was written, and what the consumer was told, of host incarnations.
#[derive(Debug, Default)]
pub struct Incarnations {
    /// (host key, revision) of every write of a host key with its
    /// incarnation key: (lease, incarnation; 0 for a value that is none).
    written: BTreeMap<(Vec<u8>, Revision), (LeaseId, u64)>,
    /// Revisions that wrote or deleted each host's incarnation key.
    touched: BTreeMap<Vec<u8>, Vec<Revision>>,
    /// The incarnation last told for each host key up (0: none).
    told: BTreeMap<Vec<u8>, u64>,
    /// An `Incarnation` waiting for the notice it belongs to.
    pending: Option<u64>,
    /// Host notices told with an incarnation.
    joined: u64,
}

impl Incarnations {
    /// `host` was written at `revision` on `lease` together with its
    /// incarnation key holding `incarnation` (0 for a value that is not a
    /// positive number).
    pub fn written(&mut self, host: Vec<u8>, revision: Revision, lease: LeaseId, incarnation: u64) {
        self.touched(host.clone(), revision);
        self.written.insert((host, revision), (lease, incarnation));
    }

    /// `host`'s incarnation key was written or deleted at `revision`,
    /// with the host key or alone.
    pub fn touched(&mut self, host: Vec<u8>, revision: Revision) {
        self.touched.entry(host).or_default().push(revision);
    }

    /// How many host notices came with an incarnation.
    pub fn joined(&self) -> u64 {
        self.joined
    }

    /// Check the next notice (every notice, in order).
    pub fn check(&mut self, notice: &WatchNotice) -> Result<(), String> {
        match notice {
            WatchNotice::Incarnation(n) => {
                if *n == 0 {
                    return Err("incarnation 0 told".into());
                }
                if let Some(before) = self.pending.replace(*n) {
                    return Err(format!(
                        "incarnation {n} told after {before}, with no notice between"
                    ));
                }
                Ok(())
            }
            WatchNotice::Up(kv) | WatchNotice::Updated(kv) => self.fresh(kv),
            WatchNotice::Down(kv) | WatchNotice::Left(kv) => {
                let told = self.take();
                let last = self.told.remove(&kv.key).unwrap_or(0);
                if told != last {
                    return Err(format!(
                        "{kv:?} gone with incarnation {told}, last told {last}"
                    ));
                }
                Ok(())
            }
            other => match self.pending {
                Some(n) => Err(format!("incarnation {n} told before {other:?}")),
                None => Ok(()),
            },
        }
    }

    fn take(&mut self) -> u64 {
        let told = self.pending.take().unwrap_or(0);
        if told != 0 {
            self.joined += 1;
        }
        told
    }

    fn fresh(&mut self, kv: &KeyValue) -> Result<(), String> {
        let told = self.take();
        let written = self
            .written
            .get(&(kv.key.clone(), kv.mod_revision))
            .filter(|(lease, _)| *lease == kv.lease)
            .map_or(0, |(_, n)| *n);
        let overwritten = self
            .touched
            .get(&kv.key)
            .is_some_and(|at| at.iter().any(|r| *r > kv.mod_revision));
        if told != written && !(told == 0 && overwritten) {
            return Err(format!(
                "{kv:?} told incarnation {told}, written with {written}"
            ));
        }
        self.told.insert(kv.key.clone(), told);
        Ok(())
    }
}
