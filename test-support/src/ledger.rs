//! The ground truth of a stream test: every entry ever written to one
//! stream on a [`ModelEtcd`], read from the model's history (so a
//! compaction never hides one, as long as it is read before each
//! compaction). The stream simulation (`sm/tests/sim/stream.rs`) and the
//! stream fuzz target (`fuzz/fuzz_targets/stream.rs`) check the machines'
//! answers against it.
//!
//! While every reply the machines got was truthful, the ledger also checks
//! as it reads that entries are written in turn (`1, 2, 3…`) and that no
//! entry is deleted twice or before it was written. Once a reply was
//! arbitrary ([`StreamLedger::taint`], a fuzz target's garbage), entries
//! may be written out of turn and only "no payload twice" still holds.

use crate::ModelEtcd;
use fleetcoord_sm::stream::StreamKeys;
use fleetcoord_sm::{EventKind, KeyRange, Revision};
use std::collections::{BTreeMap, BTreeSet};

/// One ledger line: an entry as etcd wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// What was appended.
    pub payload: Vec<u8>,
    /// The revision that wrote it.
    pub revision: Revision,
    /// The revision that deleted (trimmed) it, if one did.
    pub trimmed: Option<Revision>,
}

/// Every entry ever written to one stream, by sequence number.
pub struct StreamLedger {
    keys: StreamKeys,
    entries: BTreeMap<u64, Written>,
    payloads: BTreeSet<Vec<u8>>,
    /// History is read from this revision on.
    next_revision: Revision,
    tainted: bool,
}

impl StreamLedger {
    /// A ledger of the stream under `keys` on `etcd`, reading its history
    /// from the model's next revision on (what was written before is not
    /// the stream's).
    pub fn new(keys: StreamKeys, etcd: &ModelEtcd) -> Self {
        StreamLedger {
            keys,
            entries: BTreeMap::new(),
            payloads: BTreeSet::new(),
            next_revision: etcd.revision() + 1,
            tainted: false,
        }
    }

    /// The stream's keys.
    pub fn keys(&self) -> &StreamKeys {
        &self.keys
    }

    /// The key range of the stream's entries.
    pub fn entry_range(&self) -> KeyRange {
        KeyRange::Prefix(self.keys.entry_prefix().to_vec())
    }

    /// A reply was arbitrary: from now on entries may be written out of
    /// turn, and the in-turn checks are off.
    pub fn taint(&mut self) {
        self.tainted = true;
    }

    /// Whether a reply was arbitrary ([`StreamLedger::taint`]).
    pub fn is_tainted(&self) -> bool {
        self.tainted
    }

    /// Whether `etcd` has revisions this ledger has not read yet.
    pub fn is_behind(&self, etcd: &ModelEtcd) -> bool {
        self.next_revision <= etcd.revision()
    }

    /// Reads every entry written or deleted since the last call. Panics if
    /// a payload is written twice, and, while untainted, if an entry is
    /// written out of turn or deleted twice or before it was written.
    pub fn ingest(&mut self, etcd: &ModelEtcd) {
        let events = etcd
            .watch_history(&self.entry_range(), self.next_revision.max(1))
            .expect("the ledger reads every write before any compaction");
        self.next_revision = etcd.revision() + 1;
        for event in events {
            let Some(seq) = self.keys.entry_seq(&event.kv.key) else {
                continue;
            };
            let revision = event.kv.mod_revision;
            match event.kind {
                EventKind::Put => {
                    let payload = event.kv.value;
                    assert!(
                        self.payloads.insert(payload.clone()),
                        "payload {:?} written twice",
                        String::from_utf8_lossy(&payload)
                    );
                    if !self.tainted {
                        assert_eq!(seq, self.head() + 1, "entry {seq} written out of turn");
                    }
                    self.entries.insert(
                        seq,
                        Written {
                            payload,
                            revision,
                            trimmed: None,
                        },
                    );
                }
                EventKind::Delete => match self.entries.get_mut(&seq) {
                    Some(w) => {
                        assert!(
                            self.tainted || w.trimmed.is_none(),
                            "entry {seq} deleted twice"
                        );
                        w.trimmed = Some(revision);
                    }
                    None => assert!(self.tainted, "entry {seq} deleted before written"),
                },
            }
        }
    }

    /// The highest sequence number written (0 for none).
    pub fn head(&self) -> u64 {
        self.entries.keys().next_back().copied().unwrap_or(0)
    }

    /// The newest entry written at or before `revision` (0 for none).
    pub fn head_at(&self, revision: Revision) -> u64 {
        self.entries
            .iter()
            .rev()
            .find(|(_, w)| w.revision <= revision)
            .map_or(0, |(seq, _)| *seq)
    }

    /// The entry written at `seq`, if one was.
    pub fn get(&self, seq: u64) -> Option<&Written> {
        self.entries.get(&seq)
    }

    /// The sequence number `payload` was written at, if it was.
    pub fn seq_of(&self, payload: &[u8]) -> Option<u64> {
        self.entries
            .iter()
            .find(|(_, w)| w.payload == payload)
            .map(|(seq, _)| *seq)
    }

    /// Whether `payload` was ever written.
    pub fn contains(&self, payload: &[u8]) -> bool {
        self.payloads.contains(payload)
    }

    /// Whether entry `seq` had been deleted (trimmed) at `revision`: the
    /// only reason a reader reading at `revision` may skip it.
    pub fn trimmed_by(&self, seq: u64, revision: Revision) -> bool {
        self.get(seq)
            .and_then(|w| w.trimmed)
            .is_some_and(|t| t <= revision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetcoord_sm::{Request, Txn, TxnOp};
    use std::time::Instant;

    fn put(etcd: &mut ModelEtcd, key: &[u8], value: &[u8]) -> Revision {
        let txn = Txn {
            compare: Vec::new(),
            success: vec![TxnOp::Put {
                key: key.to_vec(),
                value: value.to_vec(),
                lease: 0,
            }],
            failure: Vec::new(),
        };
        etcd.execute(Instant::now(), &Request::Txn(txn))
            .expect("the model takes a put");
        etcd.revision()
    }

    fn delete(etcd: &mut ModelEtcd, key: &[u8]) -> Revision {
        let txn = Txn {
            compare: Vec::new(),
            success: vec![TxnOp::Delete(KeyRange::Key(key.to_vec()))],
            failure: Vec::new(),
        };
        etcd.execute(Instant::now(), &Request::Txn(txn))
            .expect("the model takes a delete");
        etcd.revision()
    }

    fn keys() -> StreamKeys {
        StreamKeys::new("/coord", "jobs")
    }

    #[test]
    fn reads_writes_and_trims_from_the_history() {
        let k = keys();
        let mut etcd = ModelEtcd::new();
        put(&mut etcd, b"/elsewhere", b"not the stream's");
        let mut ledger = StreamLedger::new(k.clone(), &etcd);
        let r1 = put(&mut etcd, &k.entry_key(1), b"a");
        let r2 = put(&mut etcd, &k.entry_key(2), b"b");
        assert!(ledger.is_behind(&etcd));
        ledger.ingest(&etcd);
        assert!(!ledger.is_behind(&etcd));
        assert_eq!(
            (ledger.head(), ledger.head_at(r1), ledger.head_at(r1 - 1)),
            (2, 1, 0)
        );
        assert_eq!(ledger.seq_of(b"b"), Some(2));
        assert!(ledger.contains(b"a") && !ledger.contains(b"not the stream's"));
        let gone = delete(&mut etcd, &k.entry_key(1));
        ledger.ingest(&etcd);
        assert!(ledger.trimmed_by(1, gone));
        assert!(!ledger.trimmed_by(1, r2), "not yet at {r2}");
        assert!(!ledger.trimmed_by(2, gone));
        assert_eq!(ledger.get(2).map(|w| w.revision), Some(r2));
    }

    #[test]
    #[should_panic(expected = "written out of turn")]
    fn an_entry_out_of_turn_is_caught() {
        let k = keys();
        let mut etcd = ModelEtcd::new();
        let mut ledger = StreamLedger::new(k.clone(), &etcd);
        put(&mut etcd, &k.entry_key(2), b"b");
        ledger.ingest(&etcd);
    }

    #[test]
    #[should_panic(expected = "written twice")]
    fn a_payload_written_twice_is_caught_even_when_tainted() {
        let k = keys();
        let mut etcd = ModelEtcd::new();
        let mut ledger = StreamLedger::new(k.clone(), &etcd);
        ledger.taint();
        put(&mut etcd, &k.entry_key(3), b"x");
        put(&mut etcd, &k.entry_key(1), b"x");
        ledger.ingest(&etcd);
    }

    #[test]
    fn a_tainted_ledger_takes_entries_out_of_turn() {
        let k = keys();
        let mut etcd = ModelEtcd::new();
        let mut ledger = StreamLedger::new(k.clone(), &etcd);
        ledger.taint();
        put(&mut etcd, &k.entry_key(3), b"c");
        put(&mut etcd, &k.entry_key(1), b"a");
        ledger.ingest(&etcd);
        assert_eq!(ledger.head(), 3);
        assert!(ledger.is_tainted());
    }
}
